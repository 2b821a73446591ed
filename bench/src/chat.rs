//! `sift-bench chat`: concurrent agent sessions against a running node, with a fake model.
//!
//! The bench starts the fake OpenAI-compatible model server of the tests
//! ([`sift_models::fake_server`], a real HTTP server speaking the streaming wire format) on
//! `--llm-listen`, paced at `--tokens-per-sec` (one streamed chunk = one token). The node under
//! test must use it as its model: start it with
//! `SIFT_LLM_BASE_URL=http://127.0.0.1:7701/v1 SIFT_LLM_MODEL=fake-model sift serve`.
//!
//! Every turn runs the real agent loop: the model first calls `knowledge_search` with the
//! question (the node retrieves from the KB), then calls `final_answer` citing the first two
//! chunks the agent showed it. Each of `--concurrency` tasks creates a session over `--kb` and
//! posts `--turns` messages one after the other, reading each SSE stream to `done`. All
//! sessions are created first; then every task posts its first message at the same moment,
//! so the node holds about `--concurrency` streams at once.
//!
//! Every question carries a tag (`[bench S.T]`) the fake model reads back, so it can add up
//! the streaming time it spent on that turn: `pieces x (1 / tokens-per-sec)` per model call,
//! paced against the start of each stream. The agent overhead of a turn is its wall time
//! (message posted to `done` read) minus that model time.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use serde_json::{Value, json};
use sift_models::fake_server::{
    FakeLlm, FakeOptions, FakeReply, FakeRequest, final_answer_citing, text_reply, tool_call_reply,
};

use crate::client::{DEFAULT_NODE, NewDocument, SiftClient};

/// Highest latency the histograms track exactly (microseconds); slower turns saturate to it.
const HISTOGRAM_MAX_MICROS: u64 = 30 * 60 * 1_000_000;

/// Sample documents ingested when `--kb` does not exist yet (from `--samples`).
const SAMPLE_FILES: [&str; 3] = [
    "chunking-guide.txt",
    "hybrid-retrieval.md",
    "raft-consensus.md",
];

/// Questions the sessions ask, in turn (about the sample documents).
const QUESTIONS: [&str; 6] = [
    "How does Raft elect a leader?",
    "Why combine BM25 with dense retrieval?",
    "How large should a retrieval chunk be?",
    "What happens when a Raft leader crashes?",
    "How are lexical and dense rankings fused?",
    "Why should a chunker respect headings?",
];

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// Base URL of a Sift node (loopback only) whose model is the fake server of this bench.
    #[arg(long, visible_alias = "url", value_name = "URL", env = "SIFT_BENCH_NODE", default_value = DEFAULT_NODE)]
    pub node: String,
    /// Knowledge base the sessions search. Created from `--samples` when it does not exist.
    #[arg(long, value_name = "KB", default_value = "chatbench")]
    pub kb: String,
    /// Folder of the sample documents ingested into a new `--kb`.
    #[arg(long, value_name = "DIR", default_value = "samples")]
    pub samples: PathBuf,
    /// Sessions running at once (each holds one SSE stream open at a time).
    #[arg(long, visible_alias = "sessions", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Messages posted per session, one after the other.
    #[arg(long, value_name = "T", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub turns: u32,
    /// Where the fake model server listens.
    #[arg(
        long,
        visible_alias = "fake-model",
        value_name = "ADDR",
        default_value = "127.0.0.1:7701"
    )]
    pub llm_listen: SocketAddr,
    /// Streaming rate of the fake model, in tokens (streamed chunks) per second per stream.
    #[arg(long, value_name = "R", default_value_t = 100.0, value_parser = parse_rate)]
    pub tokens_per_sec: f64,
    /// Fragments of the `knowledge_search` call's arguments, at most (the call streams them
    /// plus four chunks: the opening chunk, the finish, the usage and `[DONE]`).
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub search_tokens: usize,
    /// Fragments of the `final_answer` call's arguments, at most (plus four chunks, as above).
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub answer_tokens: usize,
    /// Longest wait for one turn's `done`, in seconds; a slower turn counts as an error.
    #[arg(long, value_name = "S", default_value_t = 300)]
    pub turn_timeout: u64,
}

fn parse_rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text
        .parse()
        .map_err(|_| format!("not a number: {text:?}"))?;
    if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
        return Err("the token rate must be in (0, 1000000]".into());
    }
    Ok(rate)
}

// ---- the fake model ----

/// Model time spent per turn tag, written by the fake model's handler.
#[derive(Default)]
pub(crate) struct ModelLedger {
    turns: Mutex<HashMap<String, TurnModel>>,
    /// Calls whose question carried no bench tag (e.g. the node's own probes, or every call of
    /// `sift-bench answers`, whose questions go untagged).
    pub(crate) untagged_calls: AtomicU64,
}

#[derive(Clone, Copy, Debug, Default)]
struct TurnModel {
    calls: u32,
    pieces: u64,
}

impl ModelLedger {
    fn take(&self, tag: &str) -> TurnModel {
        self.turns.lock().unwrap().remove(tag).unwrap_or_default()
    }
}

fn tag_of(session: usize, turn: u32) -> String {
    format!("[bench {session}.{turn}]")
}

/// The last tag in a text, and the text before it (prompts that quote earlier turns hold
/// their tags too; the current question comes last).
fn split_tag(text: &str) -> (Option<&str>, &str) {
    match text.rfind("[bench ") {
        Some(at) => match text[at..].find(']') {
            Some(end) => (Some(&text[at..at + end + 1]), text[..at].trim_end()),
            None => (None, text),
        },
        None => (None, text),
    }
}

/// The scripted model: search for the question, then answer citing two retrieved chunks.
/// Requests without tools get what a well-behaved model answers: a JSON plan to the
/// planner, the question itself to a follow-up rewrite (tag kept, so the planner's call is
/// attributed too), a short text otherwise.
pub(crate) fn scripted_model(
    ledger: Arc<ModelLedger>,
    search_tokens: usize,
    answer_tokens: usize,
) -> impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static {
    move |request| {
        let question = request.last_user_text();
        let (tag, query) = split_tag(&question);
        let query = query.strip_prefix("Question: ").unwrap_or(query);
        let reply = if !request.offers_tool("final_answer") {
            let prompt = request.text();
            let text = if prompt.contains("You plan retrieval") {
                json!({ "intent": "general", "sub_queries": [], "rewrites": [query] }).to_string()
            } else if let Some(at) = question.rfind("Last question: ") {
                question[at + "Last question: ".len()..].trim().to_string()
            } else {
                query.to_string()
            };
            text_reply(request, &text, 3)
        } else if request.tool_results() == 0 || request.chunk_ids_shown().is_empty() {
            tool_call_reply(
                request,
                &format!("call_search_{}", request.index),
                "knowledge_search",
                &json!({ "query": query }),
                search_tokens,
            )
        } else {
            tool_call_reply(
                request,
                &format!("call_answer_{}", request.index),
                "final_answer",
                &final_answer_citing(request, 2),
                answer_tokens,
            )
        };
        let pieces = match &reply {
            FakeReply::Stream(pieces) => pieces.len() as u64,
            _ => 0,
        };
        match tag {
            Some(tag) => {
                let mut turns = ledger.turns.lock().unwrap();
                let turn = turns.entry(tag.to_string()).or_default();
                turn.calls += 1;
                turn.pieces += pieces;
            }
            None => {
                ledger.untagged_calls.fetch_add(1, Ordering::Relaxed);
            }
        }
        reply
    }
}

// ---- one turn ----

/// How one turn went.
#[derive(Debug)]
struct TurnOutcome {
    /// The node answered 200 with an event stream.
    opened: bool,
    /// Message posted to the first SSE event read.
    first_event: Option<Duration>,
    /// Message posted to the first answer `delta`.
    first_delta: Option<Duration>,
    /// Message posted to `done` read (only for turns that reached `done`).
    done: Option<Duration>,
    /// The error kind, when the turn failed.
    error: Option<String>,
    citations: usize,
}

/// The kind of a failed request at `stage`, for the error tally: `stage: HTTP 404 code`,
/// `stage: connect failed`, `stage: timed out`, ...
fn error_kind(stage: &str, error: &sift_client::Error) -> String {
    match error {
        sift_client::Error::Api { error, .. } => {
            format!("{stage}: HTTP {} {}", error.status.as_u16(), error.code)
        }
        sift_client::Error::Transport { cause, .. } => transport_kind(stage, cause),
        sift_client::Error::Decode { .. } => format!("{stage}: unexpected body"),
        sift_client::Error::Stream { .. } => format!("{stage}: invalid event stream"),
    }
}

fn transport_kind(stage: &str, error: &reqwest::Error) -> String {
    let what = if error.is_connect() {
        "connect failed"
    } else if error.is_timeout() {
        "timed out"
    } else if error.is_body() || error.is_decode() {
        "body broken"
    } else {
        "transport error"
    };
    format!("{stage}: {what}")
}

async fn run_turn(
    api: &sift_client::Client,
    session: &str,
    question: &str,
    timeout: Duration,
    open_streams: &Gauge,
) -> TurnOutcome {
    let mut outcome = TurnOutcome {
        opened: false,
        first_event: None,
        first_delta: None,
        done: None,
        error: None,
        citations: 0,
    };
    let started = Instant::now();
    let work = async {
        let mut events = api
            .ask(session, question)
            .await
            .map_err(|e| error_kind("post message", &e))?;
        outcome.opened = true;
        let _open = open_streams.enter();
        let mut last_error: Option<String> = None;
        loop {
            let Some(event) = events.next_event().await else {
                return Err("stream: ended before done".to_string());
            };
            let event = event.map_err(|e| error_kind("stream", &e))?;
            let (name, data) = (event.event, event.data);
            if outcome.first_event.is_none() {
                outcome.first_event = Some(started.elapsed());
            }
            match name.as_str() {
                "citation" => outcome.citations += 1,
                "delta" if outcome.first_delta.is_none() => {
                    outcome.first_delta = Some(started.elapsed());
                }
                "error" => {
                    let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                    last_error = data["code"].as_str().map(str::to_string);
                }
                "done" => {
                    outcome.done = Some(started.elapsed());
                    let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                    let finish = data["finish_reason"].as_str().unwrap_or("?");
                    if finish != "stop" {
                        return Err(match &last_error {
                            Some(code) => format!("done: finish_reason {finish} ({code})"),
                            None => format!("done: finish_reason {finish}"),
                        });
                    }
                    return Ok(());
                }
                _ => {}
            }
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(Ok(())) => {}
        Ok(Err(kind)) => outcome.error = Some(kind),
        Err(_) => outcome.error = Some("turn timed out".into()),
    }
    outcome
}

/// Counts streams open now and the most open at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
}

struct GaugeGuard<'a>(&'a Gauge);

impl Gauge {
    fn enter(&self) -> GaugeGuard<'_> {
        let now = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        GaugeGuard(self)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---- the run ----

/// Everything the tasks record.
struct Tally {
    first_event: Histogram<u64>,
    first_delta: Histogram<u64>,
    done: Histogram<u64>,
    model: Histogram<u64>,
    overhead: Histogram<u64>,
    session_create: Histogram<u64>,
    errors: BTreeMap<String, u64>,
    streams_opened: u64,
    turns_completed: u64,
    uncited: u64,
    model_calls: u64,
    /// Completed turns the fake model never saw (the node did not use it).
    no_model_call: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROS, 3).expect("valid histogram bounds")
}

fn micros(duration: Duration) -> u64 {
    (duration.as_micros() as u64).clamp(1, HISTOGRAM_MAX_MICROS)
}

impl Tally {
    fn new() -> Tally {
        Tally {
            first_event: histogram(),
            first_delta: histogram(),
            done: histogram(),
            model: histogram(),
            overhead: histogram(),
            session_create: histogram(),
            errors: BTreeMap::new(),
            streams_opened: 0,
            turns_completed: 0,
            uncited: 0,
            model_calls: 0,
            no_model_call: 0,
        }
    }

    fn error(&mut self, kind: String) {
        *self.errors.entry(kind).or_default() += 1;
    }

    fn merge(&mut self, other: Tally) {
        for (mine, theirs) in [
            (&mut self.first_event, &other.first_event),
            (&mut self.first_delta, &other.first_delta),
            (&mut self.done, &other.done),
            (&mut self.model, &other.model),
            (&mut self.overhead, &other.overhead),
            (&mut self.session_create, &other.session_create),
        ] {
            mine.add(theirs).expect("same bounds");
        }
        for (kind, count) in other.errors {
            *self.errors.entry(kind).or_default() += count;
        }
        self.streams_opened += other.streams_opened;
        self.turns_completed += other.turns_completed;
        self.uncited += other.uncited;
        self.model_calls += other.model_calls;
        self.no_model_call += other.no_model_call;
    }
}

struct Shared {
    api: sift_client::Client,
    kb: String,
    turns: u32,
    turn_timeout: Duration,
    piece: Duration,
    ledger: Arc<ModelLedger>,
    open_streams: Gauge,
    /// All tasks start creating their session together...
    start: tokio::sync::Barrier,
    /// ...and start their turns together once every session exists.
    ready: tokio::sync::Barrier,
}

async fn create_session(shared: &Shared) -> Result<String, String> {
    let request = shared
        .api
        .request(reqwest::Method::POST, "/v1/sessions")
        .json(&json!({ "kbs": [shared.kb] }))
        .timeout(shared.turn_timeout);
    let session: Value = shared.api.json(request).await.map_err(|e| match e {
        sift_client::Error::Decode { .. } => "create session: no id in the answer".to_string(),
        e => error_kind("create session", &e),
    })?;
    session["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "create session: no id in the answer".to_string())
}

async fn session_task(shared: Arc<Shared>, index: usize) -> Tally {
    let mut tally = Tally::new();
    shared.start.wait().await;
    let created = Instant::now();
    let session = create_session(&shared).await;
    if session.is_ok() {
        tally.session_create.record(micros(created.elapsed())).ok();
    }
    // Every task waits here, failed or not: turns start together once all sessions exist.
    shared.ready.wait().await;
    let session = match session {
        Ok(id) => id,
        Err(kind) => {
            tally.error(kind);
            return tally;
        }
    };
    for turn in 0..shared.turns {
        let tag = tag_of(index, turn);
        let question = format!(
            "{} {tag}",
            QUESTIONS[(index + turn as usize) % QUESTIONS.len()]
        );
        let outcome = run_turn(
            &shared.api,
            &session,
            &question,
            shared.turn_timeout,
            &shared.open_streams,
        )
        .await;
        let model = shared.ledger.take(&tag);
        tally.model_calls += u64::from(model.calls);
        if outcome.opened {
            tally.streams_opened += 1;
        }
        if let Some(first) = outcome.first_event {
            tally.first_event.record(micros(first)).ok();
        }
        if let Some(kind) = outcome.error {
            tally.error(kind);
            continue;
        }
        let Some(done) = outcome.done else { continue };
        if outcome.citations == 0 {
            // The run degraded (e.g. retrieval timed out and the agent fell back to an
            // extractive answer): not a completed agent turn.
            tally.uncited += 1;
            tally.error("done: stop without citation (degraded answer)".into());
            continue;
        }
        tally.turns_completed += 1;
        tally.done.record(micros(done)).ok();
        if let Some(delta) = outcome.first_delta {
            tally.first_delta.record(micros(delta)).ok();
        }
        if model.calls == 0 {
            tally.no_model_call += 1;
            continue;
        }
        let model_time = shared.piece * model.pieces as u32;
        tally.model.record(micros(model_time)).ok();
        tally
            .overhead
            .record(micros(done.saturating_sub(model_time)))
            .ok();
    }
    tally
}

// ---- KB ----

async fn prepare_kb(client: &SiftClient, args: &ChatArgs) -> Result<()> {
    if let Some(info) = client.get_kb(&args.kb).await? {
        let counts = info.documents;
        if counts.ready == 0 {
            bail!(
                "knowledge base {:?} holds no ready document ({} in flight): wait for ingestion or pick another --kb",
                args.kb,
                counts.in_flight()
            );
        }
        eprintln!(
            "kb {:?}: {} ready documents (existing)",
            args.kb, counts.ready
        );
        return Ok(());
    }
    let mut texts = Vec::new();
    for file in SAMPLE_FILES {
        let path = args.samples.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (run from the repository root, or pass --samples)",
                path.display()
            )
        })?;
        texts.push((file, text));
    }
    client.create_kb(&args.kb, Some(1), None).await?;
    let documents: Vec<NewDocument<'_>> = texts
        .iter()
        .map(|(file, text)| NewDocument {
            external_id: file,
            title: file,
            text,
            metadata: serde_json::Map::new(),
        })
        .collect();
    client.add_documents(&args.kb, &documents).await?;
    let wanted = documents.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let counts = client
            .get_kb(&args.kb)
            .await?
            .context("the knowledge base vanished")?
            .documents;
        if counts.finished() >= wanted && counts.in_flight() == 0 {
            if counts.ready == 0 {
                bail!(
                    "no sample document could be ingested ({} failed)",
                    counts.failed
                );
            }
            eprintln!(
                "kb {:?}: created with {} ready sample documents",
                args.kb, counts.ready
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the sample documents were not ingested within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---- report ----

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn percentiles(histogram: &Histogram<u64>) -> String {
    if histogram.is_empty() {
        return "n/a".into();
    }
    format!(
        "p50 {:.1} ms | p95 {:.1} ms | p99 {:.1} ms | max {:.1} ms",
        ms(histogram.value_at_quantile(0.50)),
        ms(histogram.value_at_quantile(0.95)),
        ms(histogram.value_at_quantile(0.99)),
        ms(histogram.max()),
    )
}

/// Starts the fake model, prepares the KB, checks the path with one turn, then runs the
/// sessions.
pub async fn measure(args: &ChatArgs) -> Result<ChatReport> {
    let client = SiftClient::new(&args.node, Duration::from_secs(60))?;
    let base = client.base_url().as_str().trim_end_matches('/').to_string();

    let ledger = Arc::new(ModelLedger::default());
    let piece = Duration::from_secs_f64(1.0 / args.tokens_per_sec);
    let options = FakeOptions {
        address: args.llm_listen,
        piece_delay: piece,
        record_requests: false,
    };
    let fake = FakeLlm::start_with_options(
        scripted_model(ledger.clone(), args.search_tokens, args.answer_tokens),
        options,
    )
    .await
    .with_context(|| format!("starting the fake model server on {}", args.llm_listen))?;
    eprintln!(
        "fake model: {} at {} tokens/s per stream (the node needs SIFT_LLM_BASE_URL={} SIFT_LLM_MODEL=fake-model)",
        fake.base_url(),
        args.tokens_per_sec,
        fake.base_url()
    );

    prepare_kb(&client, args).await?;

    // Sessions keep one connection each; no pool limit, no overall request timeout (turns
    // have their own).
    let http = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let shared = Arc::new(Shared {
        api: sift_client::Client::with_http(&base, None, http),
        kb: args.kb.clone(),
        turns: args.turns,
        turn_timeout: Duration::from_secs(args.turn_timeout),
        piece,
        ledger: ledger.clone(),
        open_streams: Gauge::default(),
        start: tokio::sync::Barrier::new(args.concurrency as usize + 1),
        ready: tokio::sync::Barrier::new(args.concurrency as usize + 1),
    });

    // One unmeasured turn checks the whole path: the node must answer through this fake model.
    let mut probe_tally = Tally::new();
    {
        let warm = Arc::new(Shared {
            api: shared.api.clone(),
            kb: shared.kb.clone(),
            turns: 1,
            turn_timeout: shared.turn_timeout,
            piece,
            ledger: ledger.clone(),
            open_streams: Gauge::default(),
            start: tokio::sync::Barrier::new(1),
            ready: tokio::sync::Barrier::new(1),
        });
        probe_tally.merge(session_task(warm, usize::MAX).await);
    }
    if probe_tally.turns_completed != 1 || probe_tally.model_calls == 0 {
        bail!(
            "the warm-up turn did not run through the fake model (completed {}, model calls {}, errors {:?}): start the node with SIFT_LLM_BASE_URL={} SIFT_LLM_MODEL=fake-model",
            probe_tally.turns_completed,
            probe_tally.model_calls,
            probe_tally.errors,
            fake.base_url()
        );
    }
    if probe_tally.uncited != 0 {
        bail!("the warm-up turn answered without a citation: is the knowledge base empty?");
    }

    let tasks: Vec<_> = (0..args.concurrency as usize)
        .map(|index| tokio::spawn(session_task(shared.clone(), index)))
        .collect();
    shared.start.wait().await;
    let creating = Instant::now();
    shared.ready.wait().await;
    let sessions_created_in = creating.elapsed();
    let started = Instant::now();
    let mut tally = Tally::new();
    for task in tasks {
        tally.merge(task.await.context("a session task panicked")?);
    }
    Ok(ChatReport {
        sessions_created_in,
        elapsed: started.elapsed(),
        peak_streams: shared.open_streams.peak.load(Ordering::Relaxed),
        untagged_calls: ledger.untagged_calls.load(Ordering::Relaxed),
        piece,
        tally,
    })
}

/// What one `chat` run measured.
pub struct ChatReport {
    /// From the start to the last session created (all at once).
    sessions_created_in: Duration,
    /// From the first turn posted to the last turn ended.
    elapsed: Duration,
    peak_streams: usize,
    untagged_calls: u64,
    piece: Duration,
    tally: Tally,
}

impl ChatReport {
    fn print(&self, args: &ChatArgs) {
        let tally = &self.tally;
        let expected = u64::from(args.concurrency) * u64::from(args.turns);
        let errors: u64 = tally.errors.values().sum();
        println!(
            "chat: {} sessions x {} turns against {} (kb {:?}); fake model at {} tokens/s, {} + {} argument fragments per turn",
            args.concurrency,
            args.turns,
            args.node,
            args.kb,
            args.tokens_per_sec,
            args.search_tokens,
            args.answer_tokens
        );
        println!(
            "turns: {expected} planned, {} streams opened, {} completed (done, finish_reason stop, cited), {errors} errors; peak {} streams open at once; {:.1} s wall, {:.1} turns/s",
            tally.streams_opened,
            tally.turns_completed,
            self.peak_streams,
            self.elapsed.as_secs_f64(),
            tally.turns_completed as f64 / self.elapsed.as_secs_f64().max(1e-9)
        );
        for (kind, count) in &tally.errors {
            println!("  error {count:>6} x {kind}");
        }
        println!(
            "session create        {}  (all {} sessions created in {:.1} s, before any turn)",
            percentiles(&tally.session_create),
            tally.session_create.len(),
            self.sessions_created_in.as_secs_f64()
        );
        println!("time to first event   {}", percentiles(&tally.first_event));
        println!("time to first delta   {}", percentiles(&tally.first_delta));
        println!("time to done          {}", percentiles(&tally.done));
        println!(
            "model streaming time  {}  ({} model calls, {:.2} per turn posted; nominal: pieces x {:.2} ms)",
            percentiles(&tally.model),
            tally.model_calls,
            tally.model_calls as f64 / expected.max(1) as f64,
            self.piece.as_secs_f64() * 1000.0
        );
        println!("agent overhead/turn   {}", percentiles(&tally.overhead));
        if !tally.overhead.is_empty() {
            println!(
                "mean per turn: wall {:.1} ms = model {:.1} ms + overhead {:.1} ms",
                tally.done.mean() / 1000.0,
                tally.model.mean() / 1000.0,
                tally.overhead.mean() / 1000.0
            );
        }
        if tally.no_model_call > 0 {
            println!(
                "warning: {} completed turns never reached the fake model",
                tally.no_model_call
            );
        }
        if self.untagged_calls > 0 {
            println!(
                "note: {} model calls carried no bench tag (not attributed to a turn)",
                self.untagged_calls
            );
        }
    }
}

pub async fn run(args: ChatArgs) -> Result<()> {
    let report = measure(&args).await?;
    report.print(&args);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        let question = format!("How does Raft elect a leader? {}", tag_of(12, 3));
        assert_eq!(
            split_tag(&question),
            (Some("[bench 12.3]"), "How does Raft elect a leader?")
        );
        assert_eq!(split_tag("no tag here"), (None, "no tag here"));
        assert_eq!(split_tag("broken [bench 1.2"), (None, "broken [bench 1.2"));
    }

    #[test]
    fn rates_are_checked() {
        assert_eq!(parse_rate("50").unwrap(), 50.0);
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("-3").is_err());
        assert!(parse_rate("fast").is_err());
    }

    /// The whole bench against a real node in this process (embedded model, sample KB): every
    /// turn goes through the fake model (search, then a cited final answer) and is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_run_through_the_fake_model_and_are_counted() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let llm_listen = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = sift_tests::temp_dir();
        let mut config = sift_node::config::Config::for_test(&dir.path().join("node"));
        config.embedding.model_dir = Some(sift_tests::require_model());
        // The bench sends the key of SIFT_API_KEY, which a test cannot set: a loopback node
        // without keys (auth has its own tests).
        config.auth = sift_node::auth::AuthMode::Off;
        config.llm.providers = vec![sift_models::llm::config::ProviderConfig::openai(
            format!("http://{llm_listen}/v1"),
            "fake-model",
            None,
        )];
        let node = sift_tests::InProcessNode::start_with(config).await;
        let args = ChatArgs {
            node: node.url.clone(),
            kb: "chatbench".into(),
            samples: sift_tests::repo_root().join("samples"),
            concurrency: 4,
            turns: 2,
            llm_listen,
            tokens_per_sec: 1000.0,
            search_tokens: 5,
            answer_tokens: 8,
            turn_timeout: 300,
        };
        let report = measure(&args).await.expect("the bench runs");
        let tally = &report.tally;
        assert!(tally.errors.is_empty(), "errors: {:?}", tally.errors);
        assert_eq!(tally.streams_opened, 8);
        assert_eq!(tally.turns_completed, 8);
        assert_eq!(tally.first_event.len(), 8);
        assert_eq!(tally.done.len(), 8);
        assert_eq!(tally.overhead.len(), 8);
        assert_eq!(report.untagged_calls, 0);
        // At least a search and a final answer per turn.
        assert!(tally.model_calls >= 16, "{} model calls", tally.model_calls);
        // Each turn streamed at least the search (5 + 4 chunks) and the answer (8 + 4) at 1 ms.
        let nominal = tally.model.lowest_equivalent(21_000);
        assert!(tally.model.min() >= nominal, "{} us", tally.model.min());
        assert!((1..=4).contains(&report.peak_streams));
        node.shutdown().await;
    }
}
