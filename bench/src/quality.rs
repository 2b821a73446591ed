//! `sift-bench quality`: ingest a BEIR collection through the API, then score dense, BM25 and
//! fused retrieval on its judged queries.
//!
//! Flow: [`Dataset::load`] cuts the slice, [`prepare_kb`] creates or reuses the knowledge base,
//! [`ingest`] posts batches while [`watch_pipeline`] polls the document counts until nothing is
//! in flight, then [`evaluate`] runs every query once per configuration, one at a time.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use reqwest::StatusCode;
use serde::Serialize;

use crate::client::{
    Channel, DEFAULT_NODE, DocumentCounts, Hit, NewDocument, SearchRequest, SiftClient,
};
use crate::dataset::{Dataset, Document, SliceLimits};
use crate::error::ClientError;
use crate::metrics::{QueryScores, dedup_ranking, percentile};
use crate::progress::ProgressLine;

const POLL_INTERVAL: Duration = Duration::from_millis(500);
const SEARCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Transient errors (503, connection reset) tolerated in a row before giving up.
const MAX_TRANSIENT_RETRIES: u32 = 5;
/// Polls with nothing in flight but fewer documents finished than accepted, before we stop
/// waiting (the node may count duplicates we could not see).
const MAX_IDLE_POLLS: u32 = 10;

/// One row of the table: channels, fusion and the pipeline stages after fusion.
#[derive(Clone, Copy, Debug)]
struct Configuration {
    name: &'static str,
    channels: &'static [Channel],
    fusion: Option<&'static str>,
    rerank: bool,
    mmr: bool,
    multi_query: bool,
    follow_links: bool,
    /// Pack a context of this many tokens with one neighbour each side (measures expansion).
    context_tokens: u32,
}

const BOTH: &[Channel] = &[Channel::Dense, Channel::Bm25];
const ALL: &[Channel] = &[Channel::Dense, Channel::Bm25, Channel::Graph];

const fn row(
    name: &'static str,
    channels: &'static [Channel],
    fusion: Option<&'static str>,
) -> Configuration {
    Configuration {
        name,
        channels,
        fusion,
        rerank: false,
        mmr: false,
        multi_query: false,
        follow_links: false,
        context_tokens: 0,
    }
}

/// The configurations compared, in table order; each later row adds a stage.
const CONFIGURATIONS: [Configuration; 13] = [
    row("dense", &[Channel::Dense], None),
    row("bm25", &[Channel::Bm25], None),
    row("graph", &[Channel::Graph], None),
    row("fused-rrf", BOTH, Some("rrf")),
    row("fused", BOTH, Some("dbsf")),
    Configuration {
        rerank: true,
        ..row("+rerank", BOTH, Some("dbsf"))
    },
    Configuration {
        rerank: true,
        mmr: true,
        ..row("+mmr", BOTH, Some("dbsf"))
    },
    Configuration {
        rerank: true,
        multi_query: true,
        ..row("+multiq", BOTH, Some("dbsf"))
    },
    Configuration {
        rerank: true,
        follow_links: true,
        ..row("+links", BOTH, Some("dbsf"))
    },
    Configuration {
        rerank: true,
        context_tokens: 2000,
        ..row("+context", BOTH, Some("dbsf"))
    },
    // The graph channel fused with the two others: alone, with rerank, then with link
    // following too (the default pipeline of a KB with a graph).
    row("fused+graph", ALL, Some("dbsf")),
    Configuration {
        rerank: true,
        ..row("+graph", ALL, Some("dbsf"))
    },
    Configuration {
        rerank: true,
        follow_links: true,
        ..row("+graph+links", ALL, Some("dbsf"))
    },
];

#[derive(Debug, clap::Args)]
pub struct QualityArgs {
    /// BEIR folder: corpus.jsonl, queries.jsonl and qrels/test.tsv.
    #[arg(long, value_name = "DIR")]
    pub dataset: PathBuf,
    /// Base URL of a Sift node (loopback only).
    #[arg(long, value_name = "URL", env = "SIFT_BENCH_NODE", default_value = DEFAULT_NODE)]
    pub node: String,
    /// Knowledge base name [default: the dataset folder name].
    #[arg(long, value_name = "NAME")]
    pub kb: Option<String>,
    /// Shards of a newly created knowledge base [default: the node's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: Option<u32>,
    /// Chunk size of a newly created KB, in tokens (the node's default when absent).
    #[arg(long)]
    pub chunk_tokens: Option<u32>,
    /// Evaluate only the first N queries (file order) that have judgements.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queries: Option<u64>,
    /// Ingest the judged documents of the selected queries, then other documents in file
    /// order, up to N documents in all (judged documents are always kept).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_docs: Option<u64>,
    /// Documents per ingestion request (halved automatically on HTTP 413).
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    /// Use an existing knowledge base as is when it already holds at least as many ready
    /// documents as the slice; otherwise ingest into it.
    #[arg(long, conflicts_with = "recreate")]
    pub reuse: bool,
    /// Delete an existing knowledge base of that name first, then ingest afresh.
    #[arg(long)]
    pub recreate: bool,
    /// Hits requested per search (the node caps it at 100).
    #[arg(long, value_name = "K", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub top_k: u64,
    /// Also write the results, per query included, as JSON to this file.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
    /// Only these configurations (comma separated: dense, bm25, graph, fused-rrf, fused,
    /// +rerank, +mmr, +multiq, +links, +context, fused+graph, +graph, +graph+links)
    /// [default: all].
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<String>>,
    /// Skip the HNSW recall measurement.
    #[arg(long)]
    pub no_hnsw_recall: bool,
    /// Give up when ingestion has not finished after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    pub ingest_timeout: u64,
}

pub async fn run(args: QualityArgs) -> Result<()> {
    let client = SiftClient::new(&args.node, SEARCH_TIMEOUT)?;
    let limits = SliceLimits {
        max_queries: args.max_queries.map(to_usize),
        max_docs: args.max_docs.map(to_usize),
    };
    let dataset = Dataset::load(&args.dataset, limits)
        .with_context(|| format!("cannot load dataset {}", args.dataset.display()))?;
    let dataset_name = dataset.name();
    let kb = args.kb.clone().unwrap_or_else(|| dataset_name.clone());
    eprintln!(
        "dataset {dataset_name}: {} documents, {} judged queries ({} queries without judgements skipped, {} judged documents missing from the corpus)",
        dataset.documents.len(),
        dataset.queries.len(),
        dataset.unjudged_queries,
        dataset.missing_judged_documents,
    );
    if dataset.queries.is_empty() {
        bail!("no query of {} has a judgement", args.dataset.display());
    }

    let plan = KbPlan {
        shards: args.shards,
        chunk_tokens: args.chunk_tokens,
        batch: to_usize(args.batch),
        reuse: args.reuse,
        recreate: args.recreate,
        ingest_timeout: Duration::from_secs(args.ingest_timeout),
    };
    let ingest_report = prepare_kb(&client, &kb, &dataset, &plan).await?;
    wait_for_graph(&client).await?;
    let info = client
        .get_kb(&kb)
        .await?
        .with_context(|| format!("knowledge base {kb:?} disappeared"))?;

    let mut results = Vec::new();
    for configuration in CONFIGURATIONS {
        if args
            .configs
            .as_ref()
            .is_some_and(|wanted| !wanted.iter().any(|w| w == configuration.name))
        {
            continue;
        }
        results.push(evaluate(&client, &kb, &dataset, configuration, to_usize(args.top_k)).await?);
    }

    let recall = if args.no_hnsw_recall {
        None
    } else {
        hnsw_recall_at_10(&client, &kb, &dataset).await?
    };

    println!();
    println!(
        "sift-bench quality: {dataset_name} on {} (kb {} / {}), {} documents, {} queries, top_k {}",
        client.base_url(),
        info.name,
        info.id,
        dataset.documents.len(),
        dataset.queries.len(),
        args.top_k,
    );
    println!("kb settings: {}", info.settings);
    println!("{}", ingest_report.summary());
    println!();
    print!("{}", render_table(&results));
    if let Some(recall) = recall {
        println!(
            "HNSW recall@10 against an exact scan of the same vectors: {recall:.4} ({} queries)",
            dataset.queries.len()
        );
    }

    if let Some(path) = &args.json {
        let report = QualityReport {
            dataset: dataset_name,
            dataset_dir: args.dataset.display().to_string(),
            node: client.base_url().to_string(),
            kb: info.name,
            kb_id: info.id,
            kb_settings: info.settings,
            top_k: to_usize(args.top_k),
            slice: SliceReport {
                max_queries: args.max_queries,
                max_docs: args.max_docs,
                queries: dataset.queries.len(),
                documents: dataset.documents.len(),
                unjudged_queries_skipped: dataset.unjudged_queries,
                judged_documents_missing: dataset.missing_judged_documents,
            },
            ingest: ingest_report,
            configurations: results,
            hnsw_recall_at_10: recall,
        };
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}

/// Mean over the queries of |HNSW top 10 ∩ exact top 10| / 10, by chunk id, dense channel
/// only. `None` when the node does not return chunk ids.
async fn hnsw_recall_at_10(
    client: &SiftClient,
    kb: &str,
    dataset: &Dataset,
) -> Result<Option<f64>> {
    let mut found = 0usize;
    let mut expected = 0usize;
    let mut line = ProgressLine::new();
    for (index, query) in dataset.queries.iter().enumerate() {
        let mut ids = Vec::with_capacity(2);
        for exact in [false, true] {
            let request = SearchRequest {
                query: &query.text,
                top_k: 10,
                channels: &[Channel::Dense],
                exact,
                fusion: None,
                ..Default::default()
            };
            let Ok((response, _)) = search_with_retries(client, kb, &request).await else {
                break; // a query the node refuses (e.g. empty) counts in neither side
            };
            let chunk_ids: Vec<String> = response
                .hits
                .iter()
                .filter_map(|hit| hit.chunk_id.clone())
                .collect();
            if chunk_ids.len() != response.hits.len() {
                return Ok(None);
            }
            ids.push(chunk_ids);
        }
        if ids.len() < 2 {
            continue;
        }
        let truth: std::collections::HashSet<&String> = ids[1].iter().collect();
        expected += truth.len();
        found += ids[0].iter().filter(|id| truth.contains(id)).count();
        line.update(&format!(
            "hnsw recall: {}/{} queries",
            index + 1,
            dataset.queries.len()
        ));
    }
    let recall = if expected == 0 {
        1.0
    } else {
        found as f64 / expected as f64
    };
    line.finish(&format!("hnsw recall@10 {recall:.4}"));
    Ok(Some(recall))
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[derive(Serialize)]
struct QualityReport {
    dataset: String,
    dataset_dir: String,
    node: String,
    kb: String,
    kb_id: String,
    kb_settings: serde_json::Value,
    top_k: usize,
    slice: SliceReport,
    ingest: IngestReport,
    configurations: Vec<ConfigurationResult>,
    hnsw_recall_at_10: Option<f64>,
}

#[derive(Serialize)]
struct SliceReport {
    max_queries: Option<u64>,
    max_docs: Option<u64>,
    queries: usize,
    documents: usize,
    unjudged_queries_skipped: usize,
    judged_documents_missing: usize,
}

/// What ingestion did, end to end.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IngestReport {
    /// True when `--reuse` found the knowledge base already loaded.
    pub skipped: bool,
    /// Documents in the slice.
    pub documents: usize,
    /// Documents posted and accepted (202).
    pub sent: u64,
    /// Accepted documents the node flagged as duplicates.
    pub duplicates: u64,
    /// 429 answers waited out.
    pub throttled: u64,
    /// Final counts of the knowledge base.
    pub ready: u64,
    pub failed: u64,
    /// From the first POST until nothing was in flight (to the 500 ms poll).
    pub seconds: f64,
    /// Non-duplicate documents per second, end to end.
    pub docs_per_second: Option<f64>,
}

impl IngestReport {
    pub fn summary(&self) -> String {
        if self.skipped {
            return format!(
                "ingest: skipped (--reuse): the knowledge base holds {} ready and {} failed documents",
                self.ready, self.failed
            );
        }
        let rate = self
            .docs_per_second
            .map_or_else(|| "n/a".to_owned(), |rate| format!("{rate:.2}"));
        format!(
            "ingest: {} documents sent ({} duplicates) in {:.1} s = {rate} docs/s end to end; kb now {} ready, {} failed; {} throttled (429) requests",
            self.sent, self.duplicates, self.seconds, self.ready, self.failed, self.throttled
        )
    }
}

/// How [`prepare_kb`] treats the knowledge base (from `quality`'s flags; `answers` reuses a
/// loaded KB).
#[derive(Clone, Debug)]
pub struct KbPlan {
    /// Shards of a newly created KB (the node's default when `None`).
    pub shards: Option<u32>,
    /// Chunk size of a newly created KB, in tokens (the node's default when `None`).
    pub chunk_tokens: Option<u32>,
    /// Documents per ingestion request.
    pub batch: usize,
    /// Use an existing KB as is when it holds at least the slice's documents, ready.
    pub reuse: bool,
    /// Delete an existing KB first.
    pub recreate: bool,
    pub ingest_timeout: Duration,
}

/// Creates, reuses or recreates `kb`, and ingests the slice unless `reuse` finds it loaded.
pub async fn prepare_kb(
    client: &SiftClient,
    kb: &str,
    dataset: &Dataset,
    args: &KbPlan,
) -> Result<IngestReport> {
    let wanted = dataset.documents.len() as u64;
    match client.get_kb(kb).await? {
        Some(info) if args.reuse => {
            let counts = info.documents;
            if counts.ready >= wanted && counts.in_flight() == 0 {
                if counts.ready > wanted {
                    eprintln!(
                        "warning: knowledge base {kb:?} holds {} ready documents, more than the {wanted} of this slice; metrics are over all of them",
                        counts.ready
                    );
                }
                return Ok(IngestReport {
                    skipped: true,
                    documents: dataset.documents.len(),
                    ready: counts.ready,
                    failed: counts.failed,
                    ..IngestReport::default()
                });
            }
            eprintln!(
                "knowledge base {kb:?} holds {} ready of {wanted} documents ({} in flight): ingesting the slice into it",
                counts.ready,
                counts.in_flight()
            );
        }
        Some(_) if args.recreate => {
            eprintln!("deleting knowledge base {kb:?} (--recreate)");
            client.delete_kb(kb).await?;
            create_kb(client, kb, args.shards, args.chunk_tokens).await?;
        }
        Some(_) => bail!(
            "knowledge base {kb:?} already exists on {}: pass --reuse to evaluate it as is, --recreate to delete and re-ingest it, or --kb to pick another name",
            client.base_url()
        ),
        None => create_kb(client, kb, args.shards, args.chunk_tokens).await?,
    }
    ingest(
        client,
        kb,
        &dataset.documents,
        args.batch,
        args.ingest_timeout,
    )
    .await
}

/// Creates `kb`. Right after a delete the name can still be taken for a moment (the delete
/// goes through consensus), so a 409 is retried for a few seconds.
async fn create_kb(
    client: &SiftClient,
    kb: &str,
    shards: Option<u32>,
    chunk_tokens: Option<u32>,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.create_kb(kb, shards, chunk_tokens).await {
            Ok(info) => {
                eprintln!(
                    "created knowledge base {} ({}), settings {}",
                    info.name, info.id, info.settings
                );
                return Ok(());
            }
            Err(error)
                if error.status() == Some(StatusCode::CONFLICT) && Instant::now() < deadline =>
            {
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot create knowledge base {kb:?}"));
            }
        }
    }
}

/// Counters shared by the posting and the polling halves of [`ingest`].
#[derive(Default)]
struct IngestProgress {
    sent: AtomicU64,
    duplicates: AtomicU64,
    throttled: AtomicU64,
    posting_done: AtomicBool,
}

/// Posts `documents` in batches and waits until the node has nothing of them in flight.
/// Waits until the node's graph extractor has no pending document (the graph is filled after
/// the documents are ready), so that the graph channel sees every document.
async fn wait_for_graph(client: &SiftClient) -> Result<()> {
    let started = Instant::now();
    let mut idle = 0;
    while started.elapsed() < Duration::from_secs(600) {
        match client.graph_queue().await? {
            Some(queued) if queued <= 0.0 => idle += 1,
            _ => idle = 0,
        }
        if idle >= 3 {
            eprintln!(
                "graph extraction done ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bail!("the graph extractor still had pending documents after 600 s")
}

async fn ingest(
    client: &SiftClient,
    kb: &str,
    documents: &[Document],
    batch: usize,
    timeout: Duration,
) -> Result<IngestReport> {
    let baseline = client
        .get_kb(kb)
        .await?
        .with_context(|| format!("knowledge base {kb:?} not found after creating it"))?
        .documents;
    let progress = IngestProgress::default();
    let started = Instant::now();
    let deadline = started + timeout;
    // try_join: a failed POST must stop the poller, and a timed-out poller must stop posting.
    let ((), (counts, seconds)) = tokio::try_join!(
        async {
            let posted = post_documents(client, kb, documents, batch, deadline, &progress).await;
            progress.posting_done.store(true, Ordering::Release);
            posted
        },
        watch_pipeline(
            client,
            kb,
            documents.len(),
            baseline,
            started,
            deadline,
            &progress
        ),
    )?;
    let sent = progress.sent.load(Ordering::Acquire);
    let duplicates = progress.duplicates.load(Ordering::Acquire);
    let new = sent.saturating_sub(duplicates);
    Ok(IngestReport {
        skipped: false,
        documents: documents.len(),
        sent,
        duplicates,
        throttled: progress.throttled.load(Ordering::Acquire),
        ready: counts.ready,
        failed: counts.failed,
        seconds,
        docs_per_second: (new > 0 && seconds > 0.0).then(|| new as f64 / seconds),
    })
}

/// Sends the batches one after another: waits out 429 (`Retry-After`), halves a batch on
/// 413, retries other transient errors with backoff, fails on anything else.
async fn post_documents(
    client: &SiftClient,
    kb: &str,
    documents: &[Document],
    batch: usize,
    deadline: Instant,
    progress: &IngestProgress,
) -> Result<()> {
    let mut pending: VecDeque<&[Document]> = documents.chunks(batch.max(1)).collect();
    let mut transient_failures = 0u32;
    while let Some(slice) = pending.pop_front() {
        if Instant::now() >= deadline {
            bail!("ingestion timed out while posting documents");
        }
        let body: Vec<NewDocument<'_>> = slice
            .iter()
            .map(|document| NewDocument {
                external_id: &document.id,
                title: &document.title,
                text: &document.text,
                metadata: serde_json::Map::new(),
            })
            .collect();
        match client.add_documents(kb, &body).await {
            Ok(added) => {
                transient_failures = 0;
                if added.len() != slice.len() {
                    eprintln!(
                        "\nwarning: posted {} documents, the node answered for {}",
                        slice.len(),
                        added.len()
                    );
                }
                let duplicates = added.iter().filter(|document| document.duplicate).count();
                progress
                    .sent
                    .fetch_add(slice.len() as u64, Ordering::AcqRel);
                progress
                    .duplicates
                    .fetch_add(duplicates as u64, Ordering::AcqRel);
            }
            Err(error)
                if error.status() == Some(StatusCode::PAYLOAD_TOO_LARGE) && slice.len() > 1 =>
            {
                let (first, second) = slice.split_at(slice.len() / 2);
                pending.push_front(second);
                pending.push_front(first);
            }
            Err(error) if error.status() == Some(StatusCode::TOO_MANY_REQUESTS) => {
                progress.throttled.fetch_add(1, Ordering::AcqRel);
                let wait = error.retry_after().unwrap_or(Duration::from_secs(1));
                tokio::time::sleep(wait.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
                pending.push_front(slice);
            }
            Err(error) if error.is_transient() && transient_failures < MAX_TRANSIENT_RETRIES => {
                transient_failures += 1;
                let wait = error
                    .retry_after()
                    .unwrap_or(Duration::from_millis(250 << transient_failures));
                eprintln!("\nwarning: {error}; retrying in {wait:?}");
                tokio::time::sleep(wait).await;
                pending.push_front(slice);
            }
            Err(error) => {
                let first = slice.first().map_or("", |document| document.id.as_str());
                return Err(error).with_context(|| {
                    format!(
                        "cannot add a batch of {} documents starting at external id {first:?}",
                        slice.len()
                    )
                });
            }
        }
    }
    Ok(())
}

/// Polls `GET /v1/kbs/{kb}` every 500 ms, drawing a progress line, until posting is done and
/// nothing is in flight. Returns the final counts and the seconds since `started`.
async fn watch_pipeline(
    client: &SiftClient,
    kb: &str,
    total: usize,
    baseline: DocumentCounts,
    started: Instant,
    deadline: Instant,
    progress: &IngestProgress,
) -> Result<(DocumentCounts, f64)> {
    let mut interval = tokio::time::interval(POLL_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut line = ProgressLine::new();
    let mut idle_polls = 0u32;
    let mut poll_failures = 0u32;
    loop {
        interval.tick().await;
        // Read the flag before the counts: counts fetched after posting ended include every batch.
        let posting_done = progress.posting_done.load(Ordering::Acquire);
        let counts = match client.get_kb(kb).await {
            Ok(Some(info)) => {
                poll_failures = 0;
                info.documents
            }
            Ok(None) => bail!("knowledge base {kb:?} disappeared during ingestion"),
            Err(error) if error.is_transient() && poll_failures < 20 => {
                poll_failures += 1;
                continue;
            }
            Err(error) => return Err(error).context("cannot poll ingestion progress"),
        };
        let elapsed = started.elapsed().as_secs_f64();
        let sent = progress.sent.load(Ordering::Acquire);
        let new = sent.saturating_sub(progress.duplicates.load(Ordering::Acquire));
        let finished = counts.finished().saturating_sub(baseline.finished());
        let status = format!(
            "ingest {kb}: posted {sent}/{total} | queued {} parsing {} chunking {} embedding {} indexing {} | ready {} failed {} | {elapsed:.1} s, {:.1} docs/s",
            counts.queued,
            counts.parsing,
            counts.chunking,
            counts.embedding,
            counts.indexing,
            counts.ready,
            counts.failed,
            finished as f64 / elapsed.max(1e-3),
        );
        if posting_done && counts.in_flight() == 0 {
            if finished >= new {
                line.finish(&status);
                return Ok((counts, elapsed));
            }
            idle_polls += 1;
            if idle_polls >= MAX_IDLE_POLLS {
                line.finish(&status);
                eprintln!(
                    "warning: nothing in flight, but only {finished} of {new} accepted documents reached ready or failed"
                );
                return Ok((counts, elapsed));
            }
        } else {
            idle_polls = 0;
        }
        line.update(&status);
        if Instant::now() >= deadline {
            line.finish(&status);
            bail!("ingestion did not finish within the --ingest-timeout");
        }
    }
}

/// Results of one retrieval configuration.
#[derive(Debug, Serialize)]
struct ConfigurationResult {
    name: &'static str,
    channels: Vec<&'static str>,
    /// Queries answered and scored.
    queries: usize,
    /// Queries whose search failed (not scored).
    errors: usize,
    /// Answers that listed failed shards.
    partial_responses: usize,
    #[serde(flatten)]
    scores: QueryScores,
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
    /// p50 of the server-reported `timings.embed_ms`, over answers that reported it.
    embed_p50_ms: Option<f64>,
    /// p50 and p99 of the server-reported time of each stage after fusion:
    /// `[rerank, mmr (with duplicate collapse), expand (with packing)]`.
    #[serde(default)]
    stage_p50_ms: [Option<f64>; 4],
    #[serde(default)]
    stage_p99_ms: [Option<f64>; 4],
    per_query: Vec<QueryResult>,
}

#[derive(Debug, Serialize)]
struct QueryResult {
    query_id: String,
    #[serde(flatten)]
    scores: QueryScores,
    latency_ms: f64,
    embed_ms: Option<f64>,
    stage_ms: [Option<f64>; 4],
    hits: usize,
}

/// Runs every query once against one configuration, sequentially (concurrency 1).
async fn evaluate(
    client: &SiftClient,
    kb: &str,
    dataset: &Dataset,
    configuration: Configuration,
    top_k: usize,
) -> Result<ConfigurationResult> {
    let Configuration {
        name,
        channels,
        fusion,
        ..
    } = configuration;
    fn with_stages(
        configuration: Configuration,
        mut request: SearchRequest<'_>,
    ) -> SearchRequest<'_> {
        request.rerank = Some(configuration.rerank);
        request.mmr = Some(configuration.mmr);
        request.multi_query = Some(configuration.multi_query);
        request.follow_links = Some(configuration.follow_links);
        if configuration.context_tokens > 0 {
            request.context_tokens = Some(configuration.context_tokens);
            request.expand_neighbours = Some(1);
        }
        request
    }
    // One unrecorded request opens the connection and warms caches.
    if let Some(query) = dataset.queries.first() {
        let request = with_stages(
            configuration,
            SearchRequest {
                query: &query.text,
                top_k,
                channels,
                exact: false,
                fusion,
                ..Default::default()
            },
        );
        let _ = client.search(kb, &request).await;
    }

    let mut line = ProgressLine::new();
    let mut per_query = Vec::with_capacity(dataset.queries.len());
    let mut errors = 0;
    let mut partial_responses = 0;
    let mut first_error: Option<ClientError> = None;
    for (index, query) in dataset.queries.iter().enumerate() {
        let Some(judgements) = dataset.qrels.get(&query.id) else {
            continue;
        };
        let request = with_stages(
            configuration,
            SearchRequest {
                query: &query.text,
                top_k,
                channels,
                exact: false,
                fusion,
                ..Default::default()
            },
        );
        match search_with_retries(client, kb, &request).await {
            Ok((response, latency)) => {
                if !response.failed_shards.is_empty() {
                    partial_responses += 1;
                }
                let ranking = dedup_ranking(response.hits.iter().map(Hit::ranking_id));
                per_query.push(QueryResult {
                    query_id: query.id.clone(),
                    scores: QueryScores::compute(&ranking, judgements),
                    latency_ms: latency.as_secs_f64() * 1000.0,
                    embed_ms: response.timings.embed_ms,
                    stage_ms: [
                        response.timings.rerank_ms,
                        response.timings.links_ms,
                        response.timings.mmr_ms,
                        response.timings.expand_ms,
                    ],
                    hits: response.hits.len(),
                });
            }
            Err(error) => {
                errors += 1;
                if first_error.is_none() {
                    line.finish(&format!("{name}: query {:?} failed: {error}", query.id));
                    first_error = Some(error);
                }
            }
        }
        let so_far = QueryScores::mean(per_query.iter().map(|result| &result.scores));
        line.update(&format!(
            "{name}: {}/{} queries, {errors} errors, nDCG@10 so far {:.4}",
            index + 1,
            dataset.queries.len(),
            so_far.ndcg_at_10
        ));
    }
    let scores = QueryScores::mean(per_query.iter().map(|result| &result.scores));
    line.finish(&format!(
        "{name}: {} queries scored, {errors} errors, nDCG@10 {:.4}",
        per_query.len(),
        scores.ndcg_at_10
    ));
    if per_query.is_empty()
        && let Some(error) = first_error
    {
        eprintln!("warning: every {name} query failed; first cause: {error}");
    }
    let latencies: Vec<f64> = per_query.iter().map(|result| result.latency_ms).collect();
    let embeds: Vec<f64> = per_query
        .iter()
        .filter_map(|result| result.embed_ms)
        .collect();
    Ok(ConfigurationResult {
        name,
        channels: channels.iter().map(|channel| channel.as_str()).collect(),
        queries: per_query.len(),
        errors,
        partial_responses,
        scores,
        latency_p50_ms: percentile(&latencies, 50.0),
        latency_p99_ms: percentile(&latencies, 99.0),
        embed_p50_ms: percentile(&embeds, 50.0),
        stage_p50_ms: std::array::from_fn(|stage| {
            let values: Vec<f64> = per_query.iter().filter_map(|r| r.stage_ms[stage]).collect();
            percentile(&values, 50.0)
        }),
        stage_p99_ms: std::array::from_fn(|stage| {
            let values: Vec<f64> = per_query.iter().filter_map(|r| r.stage_ms[stage]).collect();
            percentile(&values, 99.0)
        }),
        per_query,
    })
}

/// One search, retried a few times on transient errors; the latency is that of the
/// attempt that succeeded, measured around send and JSON decoding.
async fn search_with_retries(
    client: &SiftClient,
    kb: &str,
    request: &SearchRequest<'_>,
) -> Result<(crate::client::SearchResponse, Duration), ClientError> {
    let mut attempt = 0;
    loop {
        let started = Instant::now();
        match client.search(kb, request).await {
            Ok(response) => return Ok((response, started.elapsed())),
            Err(error) if error.is_transient() && attempt < 3 => {
                attempt += 1;
                let wait = error
                    .retry_after()
                    .unwrap_or(Duration::from_millis(200 << attempt))
                    .min(Duration::from_secs(10));
                tokio::time::sleep(wait).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// The results table, fixed-width columns, one row per configuration.
fn render_table(results: &[ConfigurationResult]) -> String {
    let mut table = format!(
        "{:<8} {:>7} {:>6} {:>8} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}\n",
        "config",
        "queries",
        "errors",
        "nDCG@10",
        "Recall@5",
        "Recall@10",
        "Recall@100",
        "MRR@10",
        "p50 ms",
        "p99 ms",
        "embed p50 ms",
    );
    for result in results {
        table.push_str(&format!(
            "{:<8} {:>7} {:>6} {:>8.4} {:>9.4} {:>9.4} {:>10.4} {:>8.4} {:>9} {:>9} {:>12}\n",
            result.name,
            result.queries,
            result.errors,
            result.scores.ndcg_at_10,
            result.scores.recall_at_5,
            result.scores.recall_at_10,
            result.scores.recall_at_100,
            result.scores.mrr_at_10,
            milliseconds(result.latency_p50_ms),
            milliseconds(result.latency_p99_ms),
            milliseconds(result.embed_p50_ms),
        ));
    }
    table.push_str(&format!(
        "\nserver time per stage after fusion, p50 / p99 ms:\n{:<8} {:>15} {:>15} {:>15} {:>15}\n",
        "config", "rerank", "links", "mmr+collapse", "expand+pack"
    ));
    for result in results {
        let cell = |stage: usize| {
            format!(
                "{} / {}",
                milliseconds(result.stage_p50_ms[stage]),
                milliseconds(result.stage_p99_ms[stage])
            )
        };
        table.push_str(&format!(
            "{:<8} {:>15} {:>15} {:>15} {:>15}\n",
            result.name,
            cell(0),
            cell(1),
            cell(2),
            cell(3)
        ));
    }
    let partial: usize = results.iter().map(|result| result.partial_responses).sum();
    if partial > 0 {
        table.push_str(&format!(
            "warning: {partial} answers were partial (failed_shards not empty)\n"
        ));
    }
    table
}

fn milliseconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &'static str, embed: Option<f64>) -> ConfigurationResult {
        ConfigurationResult {
            name,
            channels: vec![name],
            queries: 300,
            errors: 0,
            partial_responses: 0,
            scores: QueryScores {
                ndcg_at_10: 0.6451,
                recall_at_5: 0.7,
                recall_at_10: 0.8,
                recall_at_100: 0.95,
                mrr_at_10: 0.61,
            },
            latency_p50_ms: Some(12.34),
            latency_p99_ms: Some(1234.5),
            embed_p50_ms: embed,
            stage_p50_ms: [None; 4],
            stage_p99_ms: [None; 4],
            per_query: Vec::new(),
        }
    }

    #[test]
    fn table_columns_line_up() {
        let table = render_table(&[result("dense", Some(9.9)), result("bm25", None)]);
        let lines: Vec<&str> = table.lines().collect();
        let lines: Vec<&str> = lines.into_iter().take(3).collect();
        assert!(
            lines.iter().all(|line| line.len() == lines[0].len()),
            "{table}"
        );
        assert!(lines[1].contains("0.6451") && lines[1].contains("1234.5"));
        assert!(lines[2].ends_with(" -"));
    }

    #[test]
    fn json_report_flattens_scores() {
        let value = serde_json::to_value(result("fused", Some(3.0))).unwrap();
        assert_eq!(value["ndcg_at_10"], 0.6451);
        assert_eq!(value["recall_at_100"], 0.95);
        assert_eq!(value["embed_p50_ms"], 3.0);
        assert_eq!(value["name"], "fused");
    }
}
