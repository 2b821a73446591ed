//! `sift-bench chat`: concurrent chat sessions against a fake model at a fixed token rate.
//!
//! The bench serves the fake model itself (an OpenAI-compatible streaming server on
//! `--fake-model`, loopback), so start the node with
//! `SIFT_LLM_BASE_URL=http://127.0.0.1:8089/v1 SIFT_LLM_MODEL=fake` (and enough
//! `SIFT_MAX_CONCURRENT_RUNS` for the concurrency measured). The fake plays a ReAct agent:
//! one `knowledge_search` call, then `final_answer` citing the first chunk it was shown,
//! every token paced at `--tokens-per-sec`.
//!
//! All `--sessions` sessions ask at once (one SSE stream each). Reported: time to the first
//! event (`meta`), to the first answer `delta`, and to `done`, as percentiles; outcomes; the
//! model's busy time per run (measured by the fake server) and the agent overhead per turn
//! (run time minus model time: retrieval, tools, bookkeeping, queueing).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::client::DEFAULT_NODE;

#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// Knowledge base (id or name) the sessions search; it must hold documents.
    #[arg(long, value_name = "KB")]
    pub kb: String,
    /// Base URL of a Sift node (loopback only).
    #[arg(long, value_name = "URL", env = "SIFT_BENCH_NODE", default_value = DEFAULT_NODE)]
    pub node: String,
    /// Concurrent sessions, each streaming one run.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub sessions: u32,
    /// Where to serve the fake model (the node's SIFT_LLM_BASE_URL points here).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8089")]
    pub fake_model: SocketAddr,
    /// Tokens per second of each model stream.
    #[arg(long, value_name = "R", default_value_t = 50)]
    pub tokens_per_sec: u32,
    /// Tokens of each final answer.
    #[arg(long, value_name = "T", default_value_t = 40)]
    pub answer_tokens: u32,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
}

/// What the fake model measured.
#[derive(Default)]
struct ModelStats {
    requests: AtomicU64,
    busy_micros: AtomicU64,
}

struct FakeModel {
    token_pause: Duration,
    answer_tokens: u32,
    stats: ModelStats,
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
        "model": "fake", "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    });
    format!("data: {chunk}\n\n")
}

fn usage(prompt: u32, completion: u32) -> String {
    let chunk = json!({
        "id": "chatcmpl-bench", "object": "chat.completion.chunk", "choices": [],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion },
    });
    format!("data: {chunk}\n\n")
}

/// Chunk ids shown to the model in tool results (`chunk_id: DOC#N`).
fn shown_chunk_ids(body: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (at, _) in body.match_indices("chunk_id: ") {
        let id: String = body[at + 10..]
            .chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, '|' | '\\' | '"'))
            .collect();
        if id.contains('#') && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The pieces of one answer: a tool call, or text, one token (word) per piece.
fn script(model: &FakeModel, request: &Value) -> Vec<String> {
    let text = request.to_string();
    let offers_tools = request["tools"].as_array().is_some_and(|t| !t.is_empty());
    let last_user = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("question")
        .to_string();
    let mut pieces = vec![chunk(json!({ "role": "assistant", "content": "" }), None)];
    let tool_call = |name: &str, arguments: String, pieces: &mut Vec<String>| {
        pieces.push(chunk(
            json!({ "tool_calls": [{ "index": 0, "id": format!("call_{name}"), "type": "function",
                                     "function": { "name": name, "arguments": "" } }] }),
            None,
        ));
        for word in arguments.split_inclusive(' ') {
            pieces.push(chunk(
                json!({ "tool_calls": [{ "index": 0, "function": { "arguments": word } }] }),
                None,
            ));
        }
        pieces.push(chunk(json!({}), Some("tool_calls")));
    };
    let ids = shown_chunk_ids(&text);
    if !offers_tools {
        for word in last_user
            .split_inclusive(' ')
            .take(model.answer_tokens as usize)
        {
            pieces.push(chunk(json!({ "content": word }), None));
        }
        pieces.push(chunk(json!({}), Some("stop")));
    } else if ids.is_empty() {
        let arguments = json!({ "query": last_user }).to_string();
        tool_call("knowledge_search", arguments, &mut pieces);
    } else {
        let words: Vec<&str> =
            std::iter::repeat_n("evidence", model.answer_tokens as usize).collect();
        let answer = format!("{} [{}].", words.join(" "), ids[0]);
        let arguments = json!({ "answer": answer, "citations": [ids[0]] }).to_string();
        tool_call("final_answer", arguments, &mut pieces);
    }
    pieces.push(usage(500, pieces.len() as u32));
    pieces.push("data: [DONE]\n\n".into());
    pieces
}

async fn serve_model(State(model): State<Arc<FakeModel>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let pieces = script(&model, &request);
    model.stats.requests.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let pause = model.token_pause;
    let stats_model = model.clone();
    let stream =
        futures::stream::iter(pieces.into_iter().enumerate()).then(move |(index, piece)| {
            let model = stats_model.clone();
            async move {
                if index > 0 {
                    tokio::time::sleep(pause).await;
                }
                if piece.starts_with("data: [DONE]") {
                    model
                        .stats
                        .busy_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                Ok::<_, std::io::Error>(Bytes::from(piece))
            }
        });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// One run as the client saw it.
struct RunTimes {
    first_event: Duration,
    first_delta: Option<Duration>,
    done: Duration,
    finish: String,
    error_code: Option<String>,
}

async fn one_run(
    http: &reqwest::Client,
    node: &str,
    session: &str,
    question: &str,
) -> Result<RunTimes> {
    let started = Instant::now();
    let response = http
        .post(format!("{node}/v1/sessions/{session}/messages"))
        .json(&json!({ "content": question }))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!(
            "HTTP {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut first_event = None;
    let mut first_delta = None;
    let mut error_code = None;
    while let Some(bytes) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&bytes?));
        while let Some(at) = buffer.find("\n\n") {
            let block: String = buffer[..at].to_string();
            buffer.drain(..at + 2);
            let name = block
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("");
            let data: Value = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Value::Null);
            if name.is_empty() {
                continue;
            }
            first_event.get_or_insert(started.elapsed());
            match name {
                "delta" => {
                    first_delta.get_or_insert(started.elapsed());
                }
                "error" => error_code = data["code"].as_str().map(String::from),
                "done" => {
                    return Ok(RunTimes {
                        first_event: first_event.unwrap_or_default(),
                        first_delta,
                        done: started.elapsed(),
                        finish: data["finish_reason"].as_str().unwrap_or("?").to_string(),
                        error_code,
                    });
                }
                _ => {}
            }
        }
    }
    bail!("the stream ended without done")
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn percentiles(histogram: &Histogram<u64>) -> Value {
    let ms = |micros: u64| micros as f64 / 1000.0;
    json!({
        "count": histogram.len(),
        "p50_ms": ms(histogram.value_at_quantile(0.5)),
        "p90_ms": ms(histogram.value_at_quantile(0.9)),
        "p99_ms": ms(histogram.value_at_quantile(0.99)),
        "max_ms": ms(histogram.max()),
    })
}

pub async fn run(args: ChatArgs) -> Result<()> {
    let node = args.node.trim_end_matches('/').to_string();
    let url = reqwest::Url::parse(&node).context("--node is not a URL")?;
    if !matches!(
        url.host_str(),
        Some("127.0.0.1" | "localhost" | "[::1]" | "::1")
    ) {
        bail!("--node must be a loopback address");
    }
    if !args.fake_model.ip().is_loopback() {
        bail!("--fake-model must be a loopback address");
    }
    let model = Arc::new(FakeModel {
        token_pause: Duration::from_secs_f64(1.0 / args.tokens_per_sec.max(1) as f64),
        answer_tokens: args.answer_tokens,
        stats: ModelStats::default(),
    });
    let listener = tokio::net::TcpListener::bind(args.fake_model)
        .await
        .with_context(|| format!("serving the fake model on {}", args.fake_model))?;
    let router = Router::new()
        .route("/v1/chat/completions", post(serve_model))
        .with_state(model.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.sessions as usize)
        .timeout(Duration::from_secs(900))
        .build()?;
    let mut sessions = Vec::with_capacity(args.sessions as usize);
    for _ in 0..args.sessions {
        let answer: Value = http
            .post(format!("{node}/v1/sessions"))
            .json(&json!({ "kbs": [args.kb] }))
            .send()
            .await?
            .error_for_status()
            .context("creating a session")?
            .json()
            .await?;
        sessions.push(answer["id"].as_str().unwrap_or_default().to_string());
    }
    eprintln!("{} sessions created; asking all at once", sessions.len());
    let questions = [
        "What does the evidence say about the main finding?",
        "Which methods were used?",
        "What are the limitations?",
    ];
    let started = Instant::now();
    let runs = futures::future::join_all(sessions.iter().enumerate().map(|(i, session)| {
        let http = http.clone();
        let node = node.clone();
        async move { one_run(&http, &node, session, questions[i % questions.len()]).await }
    }))
    .await;
    let wall = started.elapsed();

    let (mut first_event, mut first_delta, mut done) = (histogram(), histogram(), histogram());
    let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
    let mut failures = 0u64;
    let mut answered_done_micros = 0u64;
    let mut answered = 0u64;
    for run in &runs {
        match run {
            Ok(times) => {
                let _ = first_event.record(times.first_event.as_micros().max(1) as u64);
                if let Some(delta) = times.first_delta {
                    let _ = first_delta.record(delta.as_micros().max(1) as u64);
                }
                let _ = done.record(times.done.as_micros().max(1) as u64);
                let key = match &times.error_code {
                    Some(code) if times.finish == "error" => format!("error:{code}"),
                    _ => times.finish.clone(),
                };
                *outcomes.entry(key).or_default() += 1;
                if times.finish == "stop" {
                    answered += 1;
                    answered_done_micros += times.done.as_micros() as u64;
                }
            }
            Err(error) => {
                failures += 1;
                eprintln!("run failed: {error:#}");
            }
        }
    }
    let model_requests = model.stats.requests.load(Ordering::Relaxed);
    let model_busy_ms = model.stats.busy_micros.load(Ordering::Relaxed) as f64 / 1000.0;
    let runs_with_model = answered.max(1) as f64;
    let mean_run_ms = answered_done_micros as f64 / 1000.0 / runs_with_model;
    let mean_model_ms = model_busy_ms / runs_with_model;
    let report = json!({
        "sessions": args.sessions,
        "tokens_per_sec": args.tokens_per_sec,
        "answer_tokens": args.answer_tokens,
        "wall_seconds": wall.as_secs_f64(),
        "outcomes": outcomes,
        "client_failures": failures,
        "time_to_first_event": percentiles(&first_event),
        "time_to_first_delta": percentiles(&first_delta),
        "time_to_done": percentiles(&done),
        "model_requests_per_answered_run": model_requests as f64 / runs_with_model,
        "mean_run_ms": mean_run_ms,
        "mean_model_ms_per_run": mean_model_ms,
        "mean_agent_overhead_ms_per_turn": mean_run_ms - mean_model_ms,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
