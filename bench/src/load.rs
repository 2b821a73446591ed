//! `sift-bench load`: closed-loop search load against one knowledge base.
//!
//! N tokio tasks each loop over the queries from their own offset, one request at a time,
//! until the warmup plus the duration have passed (the loop is bounded by time and stops by
//! itself). Latencies of successful requests started after the warmup go into a per-task HDR
//! histogram (microseconds, 3 significant figures); the histograms are merged at the end.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::{Channel, DEFAULT_NODE, SearchRequest, SiftClient};

/// Highest latency the histogram tracks exactly; slower requests saturate to it.
const HISTOGRAM_MAX_MICROS: u64 = 10 * 60 * 1_000_000;
/// Longest wait after an error before the task sends again (keeps a dead node from turning
/// the loop into a spin, and honours short `Retry-After`s).
const MAX_ERROR_PAUSE: Duration = Duration::from_secs(1);
const ERROR_PAUSE: Duration = Duration::from_millis(10);

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Knowledge base (id or name) to search.
    #[arg(long, value_name = "KB")]
    pub kb: String,
    /// Queries: a BEIR queries.jsonl, or plain text with one query per line.
    #[arg(long, value_name = "FILE")]
    pub queries: PathBuf,
    /// Base URL of a Sift node (loopback only).
    #[arg(long, value_name = "URL", env = "SIFT_BENCH_NODE", default_value = DEFAULT_NODE)]
    pub node: String,
    /// Concurrent request loops.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub concurrency: u32,
    /// Measured seconds, after the warmup (fractions allowed, at most a day).
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    pub duration: Duration,
    /// Retrieval channels of every search, comma separated.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "dense,bm25"
    )]
    pub channels: Vec<Channel>,
    /// Hits requested per search.
    #[arg(long, value_name = "K", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub top_k: u64,
    /// Seconds of unrecorded load before measuring.
    #[arg(long, value_name = "S", default_value = "2", value_parser = parse_seconds)]
    pub warmup: Duration,
    /// Per-request timeout in seconds.
    #[arg(long, value_name = "S", default_value = "30", value_parser = parse_seconds)]
    pub timeout: Duration,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
}

fn parse_seconds(text: &str) -> std::result::Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !seconds.is_finite() || !(0.0..=86_400.0).contains(&seconds) {
        return Err(format!("{text:?} must be between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

pub async fn run(args: LoadArgs) -> Result<()> {
    if args.duration.is_zero() {
        bail!("--duration must be more than 0 seconds");
    }
    if args.timeout.is_zero() {
        bail!("--timeout must be more than 0 seconds");
    }
    let mut channels: Vec<Channel> = Vec::new();
    for channel in &args.channels {
        if !channels.contains(channel) {
            channels.push(*channel);
        }
    }
    let queries = read_queries(&args.queries)?;
    if queries.is_empty() {
        bail!("{} holds no query", args.queries.display());
    }
    let client = SiftClient::new(&args.node, args.timeout)?;
    let info = client.get_kb(&args.kb).await?.with_context(|| {
        format!(
            "knowledge base {:?} not found on {}",
            args.kb,
            client.base_url()
        )
    })?;
    let top_k = usize::try_from(args.top_k).unwrap_or(100);
    // Fail fast on a request the node rejects outright (unknown channel, bad kb) rather than
    // counting thousands of identical errors.
    let probe = SearchRequest {
        query: &queries[0],
        top_k,
        channels: &channels,
        exact: false,
        fusion: None,
        ..Default::default()
    };
    if let Err(error) = client.search(&args.kb, &probe).await
        && !error.is_transient()
    {
        return Err(error).context("the probe search failed");
    }

    let channel_names: Vec<&'static str> =
        channels.iter().map(|channel| channel.as_str()).collect();
    eprintln!(
        "load: kb {} ({}, {} ready documents) on {}, channels {}, top_k {top_k}, concurrency {}, warmup {:.1} s, duration {:.1} s, {} queries",
        info.name,
        info.id,
        info.documents.ready,
        client.base_url(),
        channel_names.join("+"),
        args.concurrency,
        args.warmup.as_secs_f64(),
        args.duration.as_secs_f64(),
        queries.len(),
    );

    let plan = Arc::new(LoadPlan {
        client,
        kb: args.kb.clone(),
        queries,
        channels,
        top_k,
    });
    let started = Instant::now();
    let warmup_end = started + args.warmup;
    let end = warmup_end + args.duration;
    let concurrency = args.concurrency as usize;
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let plan = Arc::clone(&plan);
            let offset = worker * plan.queries.len() / concurrency;
            tokio::spawn(async move { plan.worker(offset, warmup_end, end).await })
        })
        .collect();
    let mut total = WorkerStats::new()?;
    // Every worker stops by itself at `end` (plus at most one request timeout).
    for outcome in futures::future::join_all(workers).await {
        total.merge(outcome.context("a load task panicked")??)?;
    }
    let measured = Instant::now().saturating_duration_since(warmup_end);

    let report = LoadReport::new(&args, &plan, channel_names, measured, &total);
    print!("{}", report.render());
    if let Some(path) = &args.json {
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}

/// Reads queries: a JSON line with a string `text` field counts as a BEIR query; any other
/// non-empty line is a query as is.
fn read_queries(path: &Path) -> Result<Vec<String>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut queries = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let beir_text = line
            .starts_with('{')
            .then(|| serde_json::from_str::<serde_json::Value>(line).ok())
            .flatten()
            .and_then(|value| value.get("text")?.as_str().map(str::to_owned));
        queries.push(beir_text.unwrap_or_else(|| line.to_owned()));
    }
    Ok(queries)
}

/// What every load task shares.
struct LoadPlan {
    client: SiftClient,
    kb: String,
    queries: Vec<String>,
    channels: Vec<Channel>,
    top_k: usize,
}

impl LoadPlan {
    /// Sends searches back to back, from query `offset` on, until `end`. Requests started
    /// before `warmup_end` are sent but not recorded.
    async fn worker(
        &self,
        offset: usize,
        warmup_end: Instant,
        end: Instant,
    ) -> Result<WorkerStats> {
        let mut stats = WorkerStats::new()?;
        let mut next = offset;
        loop {
            let started = Instant::now();
            if started >= end {
                break;
            }
            let request = SearchRequest {
                query: &self.queries[next % self.queries.len()],
                top_k: self.top_k,
                channels: &self.channels,
                exact: false,
                fusion: None,
                ..Default::default()
            };
            next += 1;
            let outcome = self.client.search(&self.kb, &request).await;
            let latency = started.elapsed();
            let recorded = started >= warmup_end;
            match outcome {
                Ok(response) => {
                    if recorded {
                        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                        stats.latencies.saturating_record(micros.max(1));
                        if !response.failed_shards.is_empty() {
                            stats.partial += 1;
                        }
                    }
                }
                Err(error) => {
                    if recorded {
                        *stats.errors.entry(crate::error::label(&error)).or_default() += 1;
                        stats.first_error.get_or_insert_with(|| error.to_string());
                    }
                    let pause = error
                        .retry_after()
                        .unwrap_or(ERROR_PAUSE)
                        .min(MAX_ERROR_PAUSE)
                        .min(end.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
            }
        }
        Ok(stats)
    }
}

/// What one task measured.
struct WorkerStats {
    /// Successful, recorded requests, in microseconds.
    latencies: Histogram<u64>,
    /// Failed recorded requests by [`crate::error::label`].
    errors: BTreeMap<String, u64>,
    /// Successful answers that listed failed shards.
    partial: u64,
    first_error: Option<String>,
}

impl WorkerStats {
    fn new() -> Result<Self> {
        Ok(Self {
            latencies: Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROS, 3)
                .context("cannot build the latency histogram")?,
            errors: BTreeMap::new(),
            partial: 0,
            first_error: None,
        })
    }

    fn merge(&mut self, other: WorkerStats) -> Result<()> {
        self.latencies
            .add(&other.latencies)
            .context("cannot merge latency histograms")?;
        for (label, count) in other.errors {
            *self.errors.entry(label).or_default() += count;
        }
        self.partial += other.partial;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize)]
struct LoadReport {
    node: String,
    kb: String,
    channels: Vec<&'static str>,
    top_k: usize,
    concurrency: u32,
    queries: usize,
    warmup_seconds: f64,
    duration_seconds: f64,
    /// From the end of the warmup until the last task stopped.
    measured_seconds: f64,
    /// Recorded requests: successes plus errors.
    requests: u64,
    successes: u64,
    errors: u64,
    errors_by_status: BTreeMap<String, u64>,
    first_error: Option<String>,
    partial_responses: u64,
    /// Successful requests per measured second.
    qps: f64,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
}

impl LoadReport {
    fn new(
        args: &LoadArgs,
        plan: &LoadPlan,
        channels: Vec<&'static str>,
        measured: Duration,
        stats: &WorkerStats,
    ) -> Self {
        let histogram = &stats.latencies;
        let successes = histogram.len();
        let errors: u64 = stats.errors.values().sum();
        let quantile_ms = |quantile: f64| {
            if successes == 0 {
                0.0
            } else {
                histogram.value_at_quantile(quantile) as f64 / 1000.0
            }
        };
        LoadReport {
            node: plan.client.base_url().to_string(),
            kb: plan.kb.clone(),
            channels,
            top_k: plan.top_k,
            concurrency: args.concurrency,
            queries: plan.queries.len(),
            warmup_seconds: args.warmup.as_secs_f64(),
            duration_seconds: args.duration.as_secs_f64(),
            measured_seconds: measured.as_secs_f64(),
            requests: successes + errors,
            successes,
            errors,
            errors_by_status: stats.errors.clone(),
            first_error: stats.first_error.clone(),
            partial_responses: stats.partial,
            qps: successes as f64 / measured.as_secs_f64().max(1e-9),
            p50_ms: quantile_ms(0.50),
            p95_ms: quantile_ms(0.95),
            p99_ms: quantile_ms(0.99),
            max_ms: if successes == 0 {
                0.0
            } else {
                histogram.max() as f64 / 1000.0
            },
            mean_ms: if successes == 0 {
                0.0
            } else {
                histogram.mean() / 1000.0
            },
        }
    }

    fn render(&self) -> String {
        let mut text = format!(
            "{:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "requests",
            "errors",
            "partial",
            "QPS",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "max ms",
            "mean ms"
        );
        text.push_str(&format!(
            "{:>9} {:>7} {:>7} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            self.requests,
            self.errors,
            self.partial_responses,
            self.qps,
            self.p50_ms,
            self.p95_ms,
            self.p99_ms,
            self.max_ms,
            self.mean_ms,
        ));
        if !self.errors_by_status.is_empty() {
            text.push_str("errors by status:\n");
            for (label, count) in &self.errors_by_status {
                text.push_str(&format!("{label:>9} {count:>7}\n"));
            }
        }
        if let Some(error) = &self.first_error {
            text.push_str(&format!("first error: {error}\n"));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn queries_come_from_beir_jsonl_or_plain_lines() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            file,
            r#"{{"_id": "1", "text": "beir query", "metadata": {{}}}}"#
        )
        .unwrap();
        writeln!(file).unwrap();
        writeln!(file, "  plain query  ").unwrap();
        writeln!(file, "{{not json").unwrap();
        let queries = read_queries(file.path()).unwrap();
        assert_eq!(queries, ["beir query", "plain query", "{not json"]);
    }

    #[test]
    fn seconds_parse_with_fractions_and_bounds() {
        assert_eq!(parse_seconds("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("1e9").is_err());
        assert!(parse_seconds("soon").is_err());
    }

    #[test]
    fn worker_stats_merge_adds_histograms_and_errors() {
        let mut first = WorkerStats::new().unwrap();
        first.latencies.record(1_000).unwrap();
        first.errors.insert("429".to_owned(), 2);
        let mut second = WorkerStats::new().unwrap();
        second.latencies.record(3_000).unwrap();
        second.errors.insert("429".to_owned(), 1);
        second.errors.insert("connect".to_owned(), 4);
        second.partial = 1;
        first.merge(second).unwrap();
        assert_eq!(first.latencies.len(), 2);
        assert_eq!(first.errors["429"], 3);
        assert_eq!(first.errors["connect"], 4);
        assert_eq!(first.partial, 1);
    }
}
