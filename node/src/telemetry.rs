//! Logs (and the trace exporter's layer beside them) and Prometheus metrics: the recorder, the description of every metric, the HTTP
//! request metrics (layers of the public router), the process metrics and the per-KB gauges.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sift_storage::meta::{KbUsage, SledMetaStore};
use sift_storage::shard::GraphStats;
use tracing::warn;

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
            metrics::gauge!(
                "sift_build_info",
                "version" => env!("CARGO_PKG_VERSION"),
                "commit" => env!("SIFT_BUILD_COMMIT")
            )
            .set(1.0);
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "sift_build_info",
        "always 1; the labels name the running build (version, commit)"
    );
    describe_histogram!(
        "sift_http_request_duration_seconds",
        "public API requests from arrival to the response head, by route template (unmatched for no route), method and status class"
    );
    describe_counter!("sift_http_requests_total", "HTTP requests by status class");
    describe_counter!(
        "sift_http_connections_refused_total",
        "connections closed at once because a connection cap was reached, by server and cap"
    );
    describe_counter!(
        "sift_http_connections_timed_out_total",
        "connections closed because nothing was sent before the header-read timeout, by server"
    );
    describe_counter!(
        "sift_url_fetch_outside_loopback_total",
        "URL fetches that tried to reach past loopback with url_fetch_loopback_only on (a test setting), by kind (connect, lookup); a test fails on any"
    );
    describe_counter!(
        "sift_rate_limited_total",
        "requests refused by a rate limit, by scope (key, tenant)"
    );
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
    describe_counter!(
        "sift_ingest_panics_total",
        "ingestion stages (parse, chunk) that panicked; the document fails, the worker goes on"
    );
    describe_counter!(
        "sift_ingest_reassigned_total",
        "unfinished documents the leader handed from an unresponsive worker to another replica"
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
    describe_counter!(
        "sift_raw_store_quorum_failures_total",
        "uploads refused because too few replicas stored their raw bytes"
    );
    describe_counter!(
        "sift_raw_transfer_bytes_total",
        "raw document bytes sent to other members' replicas"
    );
    describe_counter!(
        "sift_raw_collected_total",
        "raw document files removed once no replica needs them"
    );
    describe_histogram!(
        "sift_search_seconds",
        "search latency at the node, embedding included"
    );
    describe_histogram!(
        "sift_search_channel_seconds",
        "slowest shard's time per retrieval channel"
    );
    describe_counter!("sift_search_leaf_total", "leaf searches by outcome");
    describe_counter!(
        "sift_search_leaf_retries_total",
        "leaf searches retried once on another replica after an error"
    );
    describe_counter!(
        "sift_search_leaf_hedged_total",
        "leaf searches also sent to a second replica because the first was slow"
    );
    describe_histogram!(
        "sift_graph_search_seconds",
        "time of a search's graph channel, all its rounds"
    );
    describe_counter!(
        "sift_graph_search_hops_total",
        "hops the graph channel walked, over all searches (divide by sift_graph_search_seconds_count for the mean)"
    );
    describe_gauge!(
        "sift_graph_queue_documents",
        "documents of this node's shard replicas awaiting graph extraction (KBs whose graph is off left out)"
    );
    describe_counter!(
        "sift_graph_extracted_chunks_total",
        "chunks whose entities the graph extractor stored"
    );
    describe_histogram!(
        "sift_graph_extraction_seconds",
        "time to extract and store one document's entities"
    );
    describe_counter!(
        "sift_graph_extraction_failures_total",
        "graph extractions of a document that failed (retried; after 3, its graph is failed and the embedded extractor's entities stand in)"
    );
    describe_counter!(
        "sift_graph_llm_requests_total",
        "requests of the LLM graph extractor by outcome (ok, invalid_json, schema, timeout, model)"
    );
    describe_histogram!(
        "sift_graph_llm_request_seconds",
        "time of one request of the LLM graph extractor (a batch of chunks)"
    );
    describe_counter!(
        "sift_graph_community_summaries_total",
        "community summaries asked for, by where they came from (cache, model) or failed"
    );
    describe_counter!(
        "sift_graph_llm_tokens_total",
        "tokens the LLM graph extractor spent (prompt and completion, as the provider reported them)"
    );
    describe_counter!(
        "sift_graph_llm_cache_hits_total",
        "chunks whose LLM extraction came from the node's extraction cache instead of the model"
    );
    describe_counter!(
        "sift_search_failed_shards_total",
        "shards a search reported as failed (the answer is partial)"
    );
    describe_counter!(
        "sift_search_links_followed_total",
        "hits moved up the ranking by following document links"
    );
    describe_counter!(
        "sift_rerank_total",
        "searches that asked for reranking, by outcome (applied, skipped)"
    );
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
        "sift_shard_write_quorum_failures_total",
        "shard writes that no replica stored"
    );
    describe_histogram!(
        "sift_shard_rpc_seconds",
        "shard calls to another member, by kind and outcome"
    );
    describe_counter!(
        "sift_peer_suspected_total",
        "times a member stopped answering shard calls and was suspected"
    );
    describe_gauge!(
        "sift_replicas",
        "shard replicas this node holds, by state (initializing, active, recovering, dead)"
    );
    describe_counter!(
        "sift_replica_marked_dead_total",
        "replicas marked dead after a failed or slow write"
    );
    describe_counter!(
        "sift_replica_repairs_total",
        "repairs of a dead or new replica, by outcome"
    );
    describe_histogram!(
        "sift_replica_repair_seconds",
        "time to copy a replica back into service"
    );
    describe_counter!(
        "sift_replica_copied_documents_total",
        "documents copied into replicas under repair"
    );
    describe_counter!(
        "sift_replica_transfer_bytes_total",
        "chunk text and vector bytes copied into replicas under repair"
    );
    describe_counter!(
        "sift_rebalance_moves_total",
        "replica moves the leader planned to even out load"
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
        "sift_raft_transport_rejected_total",
        "internal transport requests refused, by reason"
    );
    describe_counter!(
        "sift_embedding_cache_hits_total",
        "embeddings served from the cache"
    );
    describe_counter!("sift_snapshots_total", "snapshots written");
    describe_counter!(
        "sift_snapshot_bytes_total",
        "bytes of the snapshots written"
    );
    sift_models::embedding::describe_metrics();
    sift_models::ocr::describe_metrics();
    sift_actors::sessions::describe_metrics();
    sift_models::llm::describe_metrics();
    sift_actors::agent::describe_metrics();
    sift_cluster::raft::driver::describe_metrics();
    process_collector().describe();
}

/// The `process_*` metrics (CPU seconds, resident and virtual memory, open and maximum file
/// descriptors, threads, start time), read from /proc at each scrape.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// The text of `/metrics`: the process metrics read now, then every recorded metric.
pub fn render(handle: &PrometheusHandle) -> String {
    process_collector().collect();
    handle.render()
}

// ---- HTTP request metrics ----

/// The `route` label of a request that matched no route (a 404 from the fallback): one
/// fixed value, so that scanners cannot grow the label set.
const UNMATCHED_ROUTE: &str = "unmatched";

/// The route template a request matched, handed from [`tag_route`] (inside routing) to
/// [`observe_requests`] (outside it) in the response's extensions.
#[derive(Clone)]
struct MatchedRoute(MatchedPath);

/// The route template `response` answered (`/v1/kbs/{kb}/search`), `unmatched` when none did.
pub(crate) fn route_of(response: &Response) -> String {
    response
        .extensions()
        .get::<MatchedRoute>()
        .map(|route| route.0.as_str().to_string())
        .unwrap_or_else(|| UNMATCHED_ROUTE.to_string())
}

/// Route layer: copies the matched route template (`/v1/kbs/{kb}/search`, never the path
/// itself) to the response, where [`observe_requests`] and the access log read it, and
/// names it in the request's span ([`crate::requests`]).
pub async fn tag_route(request: Request, next: Next) -> Response {
    let matched = request.extensions().get::<MatchedPath>().cloned();
    if let Some(matched) = &matched {
        tracing::Span::current().record("route", matched.as_str());
    }
    let mut response = next.run(request).await;
    if let Some(matched) = matched {
        response.extensions_mut().insert(MatchedRoute(matched));
    }
    response
}

/// Outer layer: `sift_http_request_duration_seconds{route,method,status_class}` and
/// `sift_http_requests_total{status}` for every request, matched or not. Every label comes
/// from a fixed set: route templates, [`method_label`] and [`status_class`]. A streamed body
/// (SSE) is timed to its response head, not to its end.
pub async fn observe_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    let response = next.run(request).await;
    let route = route_of(&response);
    let class = status_class(response.status());
    metrics::histogram!(
        "sift_http_request_duration_seconds",
        "route" => route,
        "method" => method,
        "status_class" => class
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!("sift_http_requests_total", "status" => class).increment(1);
    response
}

/// The `method` label: the standard methods by name, any other as `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

// ---- per-KB gauges ----

/// Label value of the KBs past the cap, summed together.
pub const OTHER_KBS: &str = "_other";

/// How long a computed set of per-KB gauges is served before it is computed again: the
/// computation reads every document record, so frequent scrapes must not repeat it.
const KB_GAUGES_TTL: Duration = Duration::from_secs(10);

/// `sift_knowledge_base_documents`, `sift_knowledge_base_chunks` and `sift_knowledge_base_bytes` by `{tenant, kb}`. At most
/// `max_kbs` KBs (the first by tenant, then name) get their own series; the rest are summed
/// under `tenant="_other", kb="_other"`, so the series stay bounded however many KBs there
/// are. Rendered as text at scrape time rather than recorded as gauges: the recorder cannot
/// forget a series, and a deleted KB's would stay forever.
pub struct KbGauges {
    max_kbs: usize,
    cached: Mutex<Option<(Instant, Arc<str>)>>,
}

impl KbGauges {
    pub fn new(max_kbs: usize) -> KbGauges {
        KbGauges {
            max_kbs,
            cached: Mutex::new(None),
        }
    }

    /// The gauges' exposition text (empty when there is no KB), at most [`KB_GAUGES_TTL`] old.
    pub async fn render(&self, store: Arc<SledMetaStore>) -> Arc<str> {
        if let Some((at, text)) = &*self.cached.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < KB_GAUGES_TTL
        {
            return text.clone();
        }
        let max_kbs = self.max_kbs;
        let computed = tokio::task::spawn_blocking(move || kb_gauges_text(&store, max_kbs)).await;
        let text: Arc<str> = match computed {
            Ok(Ok(text)) => text.into(),
            Ok(Err(error)) => {
                warn!(%error, "per-KB gauges could not be read");
                return "".into();
            }
            Err(error) => {
                warn!(%error, "per-KB gauges could not be read");
                return "".into();
            }
        };
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), text.clone()));
        text
    }
}

/// One per-KB gauge: its name, its help text and what it reads of a [`KbUsage`].
struct KbFamily {
    name: &'static str,
    help: &'static str,
    value: fn(&KbUsage) -> u64,
}

const KB_FAMILIES: [KbFamily; 3] = [
    KbFamily {
        name: "sift_knowledge_base_documents",
        help: "documents per KB (any status); KBs past metrics_max_kbs are summed under kb=\"_other\"",
        value: |usage| usage.documents,
    },
    KbFamily {
        name: "sift_knowledge_base_chunks",
        help: "chunks of the documents per KB; KBs past metrics_max_kbs are summed under kb=\"_other\"",
        value: |usage| usage.chunks,
    },
    KbFamily {
        name: "sift_knowledge_base_bytes",
        help: "raw bytes of the documents per KB; KBs past metrics_max_kbs are summed under kb=\"_other\"",
        value: |usage| usage.bytes,
    },
];

fn kb_gauges_text(store: &SledMetaStore, max_kbs: usize) -> sift_storage::Result<String> {
    let mut kbs = Vec::new();
    for kb in store.list_kbs()? {
        kbs.push((store.kb_tenant(&kb.id)?, kb.name, kb.id));
    }
    kbs.sort();
    let mut rows: Vec<(String, String, KbUsage)> = Vec::new();
    let mut other: Option<KbUsage> = None;
    for (index, (tenant, name, id)) in kbs.into_iter().enumerate() {
        let usage = store.kb_usage(&id)?;
        if index < max_kbs {
            rows.push((tenant, name, usage));
        } else {
            let sum = other.get_or_insert_with(KbUsage::default);
            sum.documents += usage.documents;
            sum.chunks += usage.chunks;
            sum.bytes += usage.bytes;
        }
    }
    if let Some(sum) = other {
        rows.push((OTHER_KBS.to_string(), OTHER_KBS.to_string(), sum));
    }
    let mut text = String::new();
    if rows.is_empty() {
        return Ok(text);
    }
    for KbFamily { name, help, value } in KB_FAMILIES {
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} gauge");
        for (tenant, kb, usage) in &rows {
            let _ = writeln!(
                text,
                "{name}{{tenant=\"{}\",kb=\"{}\"}} {}",
                label_value(tenant),
                label_value(kb),
                value(usage)
            );
        }
        text.push('\n');
    }
    Ok(text)
}

impl KbGauges {
    pub fn max_kbs(&self) -> usize {
        self.max_kbs
    }
}

/// One count of a replica's graph.
type GraphValue = fn(&GraphStats) -> u64;

/// `sift_graph_entities`, `sift_graph_mentions` and `sift_graph_edges` of this node's shard
/// replicas by `{tenant, kb, shard}` (ADR 0037): counts kept in memory by each replica, so
/// computed at every scrape. KBs past `max_kbs` (by tenant, then name) are summed under
/// `kb="_other"`, `shard="_other"`.
pub fn graph_gauges_text(
    store: &SledMetaStore,
    replicas: &[(String, u32, GraphStats)],
    max_kbs: usize,
) -> String {
    let mut rows: Vec<((String, String), String, GraphStats)> = Vec::new();
    for (kb_id, shard, stats) in replicas {
        let Ok(Some(kb)) = store.get_kb(kb_id) else {
            continue;
        };
        let tenant = store.kb_tenant(kb_id).unwrap_or_default();
        rows.push(((tenant, kb.name), shard.to_string(), *stats));
    }
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut kbs: Vec<&(String, String)> = rows.iter().map(|(kb, _, _)| kb).collect();
    kbs.dedup();
    let kept: std::collections::HashSet<(String, String)> =
        kbs.into_iter().take(max_kbs).cloned().collect();
    let mut shown: Vec<((String, String), String, GraphStats)> = Vec::new();
    let mut other: Option<GraphStats> = None;
    for (kb, shard, stats) in rows {
        if kept.contains(&kb) {
            shown.push((kb, shard, stats));
        } else {
            let sum = other.get_or_insert_with(Default::default);
            sum.entities += stats.entities;
            sum.mentions += stats.mentions;
            sum.edges += stats.edges;
        }
    }
    if let Some(sum) = other {
        let other_kb = (OTHER_KBS.to_string(), OTHER_KBS.to_string());
        shown.push((other_kb, OTHER_KBS.to_string(), sum));
    }
    let families: [(&str, &str, GraphValue); 3] = [
        (
            "sift_graph_entities",
            "entities of a shard replica's graph on this node",
            |s| s.entities,
        ),
        (
            "sift_graph_mentions",
            "(entity, chunk) mentions of a shard replica's graph on this node",
            |s| s.mentions,
        ),
        (
            "sift_graph_edges",
            "co-occurring entity pairs (counted per chunk) of a shard replica's graph on this node",
            |s| s.edges,
        ),
    ];
    let mut text = String::new();
    for (name, help, value) in families {
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} gauge");
        for ((tenant, kb), shard, stats) in &shown {
            let _ = writeln!(
                text,
                "{name}{{tenant=\"{}\",kb=\"{}\",shard=\"{}\"}} {}",
                label_value(tenant),
                label_value(kb),
                label_value(shard),
                value(stats)
            );
        }
        text.push('\n');
    }
    text
}

/// A label value escaped for the text exposition format.
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Logs to stderr; `SIFT_LOG` (or `RUST_LOG`) overrides the default `info` level, and
/// `SIFT_LOG_FORMAT=json` writes one JSON object per line (with the request's span, so its
/// `id`) instead of text. With `traces`, the spans the filter lets through are also exported
/// over OTLP when the environment names an endpoint ([`crate::traces`]). An unknown format
/// or a bad endpoint is an error for the caller to report.
pub fn init_logging(traces: bool) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = std::env::var("SIFT_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,tantivy=warn,sled=warn,hnsw_rs=warn".to_string());
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let format = std::env::var("SIFT_LOG_FORMAT").unwrap_or_default();
    let export = if traces {
        crate::traces::layer()?
    } else {
        None
    };
    let registry = tracing_subscriber::registry().with(filter).with(export);
    let _ = match format.as_str() {
        "" | "text" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        "json" => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .json()
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .try_init(),
        other => {
            return Err(format!(
                "SIFT_LOG_FORMAT must be text or json, not {other:?}"
            ));
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_labels_come_from_fixed_sets() {
        assert_eq!(method_label(&Method::POST), "POST");
        let odd = Method::from_bytes(b"PROPFIND").unwrap();
        assert_eq!(method_label(&odd), "other");
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::NOT_FOUND), "4xx");
        assert_eq!(status_class(StatusCode::SERVICE_UNAVAILABLE), "5xx");
        assert_eq!(status_class(StatusCode::SWITCHING_PROTOCOLS), "1xx");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("papers"), "papers");
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
