//! Logs and Prometheus metrics.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-global Prometheus recorder once (several in-process nodes in a test
/// share it) and returns its handle.
pub fn prometheus() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let seconds = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ];
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &seconds)
                .expect("buckets are non-empty")
                .set_buckets_for_metric(
                    Matcher::Full("sift_agent_iterations".into()),
                    &[
                        1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0,
                    ],
                )
                .expect("buckets are non-empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                })
                .expect("spawning the metrics upkeep thread");
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "sift_ingest_documents_total",
        "documents ingested, by final status"
    );
    describe_counter!("sift_ingest_chunks_total", "chunks written to shards");
    describe_counter!(
        "sift_tls_reloads_total",
        "TLS certificate reloads on SIGHUP, by outcome (ok, failed)"
    );
    describe_counter!(
        "sift_tls_handshake_failures_total",
        "TLS handshakes that failed, by server (public, internal)"
    );
    describe_counter!(
        "sift_auth_failures_total",
        "requests refused by API-key checks, by reason (missing, invalid, revoked, expired, forbidden)"
    );
    describe_counter!(
        "sift_ingest_chunks_embedded_total",
        "chunks embedded (cache hits included)"
    );
    describe_counter!(
        "sift_ingest_deferred_total",
        "documents sent back to the queue by a transient error (no leader, a shard or the embedder unreachable)"
    );
    describe_counter!(
        "sift_ingest_rejected_total",
        "ingestion requests refused because the queue was full"
    );
    describe_gauge!(
        "sift_ingest_queue_depth",
        "ingestion jobs waiting in the queue"
    );
    describe_histogram!(
        "sift_ingest_stage_seconds",
        "time per ingestion stage, by stage"
    );
    describe_histogram!("sift_ingest_job_seconds", "time per ingestion job");
    describe_histogram!(
        "sift_search_seconds",
        "search latency at the node, embedding included"
    );
    describe_histogram!(
        "sift_search_channel_seconds",
        "slowest shard's time per retrieval channel"
    );
    describe_counter!("sift_search_leaf_total", "leaf searches by outcome");
    describe_gauge!("sift_shards", "shard replicas open on this node");
    describe_counter!(
        "sift_shard_open_failures_total",
        "shard replicas that failed to open (a damaged index); the node serves without them"
    );
    describe_histogram!(
        "sift_shard_write_seconds",
        "time to write a batch into a shard replica"
    );
    describe_counter!(
        "sift_actor_restarts_total",
        "actors restarted by their supervisor, by actor (shard, ingest_worker, reconciler)"
    );
    describe_counter!(
        "sift_reconcile_rounds_total",
        "rounds of this node's reconciler (cluster mode)"
    );
    describe_counter!("sift_meta_proposals_total", "metadata ops by outcome");
    describe_histogram!(
        "sift_meta_apply_seconds",
        "time to commit and apply a metadata op"
    );
    describe_counter!(
        "sift_embedding_cache_hits_total",
        "embeddings served from the cache"
    );
    describe_counter!("sift_http_requests_total", "HTTP requests by status class");
    sift_models::embedding::describe_metrics();
    sift_actors::sessions::describe_metrics();
    sift_models::llm::describe_metrics();
    sift_actors::agent::describe_metrics();
}

/// Logs to stderr; `RUST_LOG` (or `SIFT_LOG`) overrides the default `info` level.
pub fn init_logging() {
    let filter = std::env::var("SIFT_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,tantivy=warn,sled=warn,hnsw_rs=warn".to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
