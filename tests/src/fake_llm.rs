//! A fake chat model server for the integration tests: a real HTTP server (axum, port 0)
//! speaking the OpenAI chat-completions streaming format (`POST /v1/chat/completions`) and the
//! Anthropic Messages streaming format (`POST /v1/messages`). Each test scripts it with a
//! handler that sees every request and picks the reply: streamed chunks (written one network
//! write each, so tool-call arguments arrive split across many chunks), an error status, a
//! stream that breaks, or silence before the first token.
//!
//! `sift-bench chat` runs the same server at a fixed token rate ([`FakeLlm::start_with_options`]:
//! a fixed address, a pause per written piece, no request log).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};

/// One request the server received.
#[derive(Clone, Debug)]
pub struct FakeRequest {
    /// `/v1/chat/completions` or `/v1/messages`.
    pub path: String,
    pub body: Value,
    /// 0 for the first request this server got.
    pub index: usize,
}

impl FakeRequest {
    pub fn is_anthropic(&self) -> bool {
        self.path.ends_with("/messages")
    }

    /// Whether the request offers tools by name (native tool calling).
    pub fn offers_tool(&self, name: &str) -> bool {
        self.body["tools"].as_array().is_some_and(|tools| {
            tools
                .iter()
                .any(|tool| tool["function"]["name"] == name || tool["name"] == name)
        })
    }

    /// The request as text (for searching what the agent sent).
    pub fn text(&self) -> String {
        self.body.to_string()
    }

    /// Chunk ids the agent showed the model in tool results (`chunk_id: DOC#N`), in order,
    /// without repeats.
    pub fn chunk_ids_shown(&self) -> Vec<String> {
        let text = self.text();
        let mut ids: Vec<String> = Vec::new();
        for (at, _) in text.match_indices("chunk_id: ") {
            let rest = &text[at + "chunk_id: ".len()..];
            let id: String = rest
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '|' && *c != '\\' && *c != '"')
                .collect();
            if id.contains('#') && !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Tool results in the request (OpenAI `tool` messages, Anthropic `tool_result` blocks).
    pub fn tool_results(&self) -> usize {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .map(|message| {
                if message["role"] == "tool" {
                    1
                } else {
                    message["content"]
                        .as_array()
                        .map(|blocks| blocks.iter().filter(|b| b["type"] == "tool_result").count())
                        .unwrap_or(0)
                }
            })
            .sum()
    }

    /// The text of the last user message.
    pub fn last_user_text(&self) -> String {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(|m| match &m["content"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .unwrap_or_default()
    }
}

/// What the server answers to one request.
#[derive(Clone, Debug)]
pub enum FakeReply {
    /// 200, `text/event-stream`, these SSE pieces written one by one.
    Stream(Vec<String>),
    /// 200, these pieces, then the connection breaks mid-stream.
    StreamThenBreak(Vec<String>),
    /// 200, these pieces, then silence for ever.
    StreamThenHang(Vec<String>),
    /// An error status with a JSON body.
    Status(u16, Value),
    /// Never answers, not even headers.
    Hang,
}

pub type Handler = Arc<dyn Fn(&FakeRequest) -> FakeReply + Send + Sync>;

struct FakeState {
    handler: Handler,
    requests: Mutex<Vec<FakeRequest>>,
    /// Pause before each written piece (lets a test stop a run mid-stream; sets the token
    /// rate of a benchmark).
    piece_delay: Duration,
    /// Whether [`FakeLlm::requests`] keeps every request (off for long benchmark runs).
    record_requests: bool,
    /// Requests received so far (recorded or not).
    received: AtomicUsize,
}

/// How [`FakeLlm::start_with_options`] runs the server.
#[derive(Clone, Debug)]
pub struct FakeOptions {
    /// Where to listen; port 0 picks a free port.
    pub address: SocketAddr,
    /// Pause before each written piece. Pieces are paced against the stream's start
    /// (piece `i` is written at `start + i * piece_delay`), so timer overshoot does not add up.
    pub piece_delay: Duration,
    /// Keep every request for [`FakeLlm::requests`].
    pub record_requests: bool,
}

impl Default for FakeOptions {
    fn default() -> Self {
        FakeOptions {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            piece_delay: Duration::ZERO,
            record_requests: true,
        }
    }
}

/// The running server. It stops with the test's runtime.
pub struct FakeLlm {
    address: SocketAddr,
    state: Arc<FakeState>,
}

impl FakeLlm {
    pub async fn start(
        handler: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static,
    ) -> FakeLlm {
        FakeLlm::start_with_delay(handler, Duration::ZERO).await
    }

    /// A server that waits `piece_delay` between two written pieces of a stream.
    pub async fn start_with_delay(
        handler: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static,
        piece_delay: Duration,
    ) -> FakeLlm {
        let options = FakeOptions {
            piece_delay,
            ..FakeOptions::default()
        };
        FakeLlm::start_with_options(handler, options)
            .await
            .expect("binding the fake model server")
    }

    /// A server as `options` say; fails only when the address cannot be bound.
    pub async fn start_with_options(
        handler: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static,
        options: FakeOptions,
    ) -> std::io::Result<FakeLlm> {
        let state = Arc::new(FakeState {
            handler: Arc::new(handler),
            requests: Mutex::new(Vec::new()),
            piece_delay: options.piece_delay,
            record_requests: options.record_requests,
            received: AtomicUsize::new(0),
        });
        let router = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(options.address).await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(FakeLlm { address, state })
    }

    /// The address the server listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The API root, e.g. `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn answer(State(state): State<Arc<FakeState>>, uri: Uri, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = {
        let mut requests = state.requests.lock().unwrap();
        let request = FakeRequest {
            path: uri.path().to_string(),
            body,
            index: state.received.fetch_add(1, Ordering::Relaxed),
        };
        if state.record_requests {
            requests.push(request.clone());
        }
        request
    };
    let reply = (state.handler)(&request);
    let delay = state.piece_delay;
    let pieces_stream = |pieces: Vec<String>, end: End| {
        let start = tokio::time::Instant::now();
        let pieces = futures::stream::iter(pieces.into_iter().enumerate()).then(
            move |(at, piece)| async move {
                if !delay.is_zero() {
                    tokio::time::sleep_until(start + delay * (at as u32 + 1)).await;
                }
                Ok::<_, std::io::Error>(Bytes::from(piece))
            },
        );
        let end = futures::stream::once(async move {
            match end {
                End::Clean => None,
                End::Break => Some(Err(std::io::Error::other("connection broken by the test"))),
                End::Hang => {
                    std::future::pending::<()>().await;
                    None
                }
            }
        })
        .filter_map(|item| async move { item });
        Body::from_stream(pieces.chain(end))
    };
    let sse = |body: Body| {
        Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    };
    match reply {
        FakeReply::Stream(pieces) => sse(pieces_stream(pieces, End::Clean)),
        FakeReply::StreamThenBreak(pieces) => sse(pieces_stream(pieces, End::Break)),
        FakeReply::StreamThenHang(pieces) => sse(pieces_stream(pieces, End::Hang)),
        FakeReply::Status(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(body),
        )
            .into_response(),
        FakeReply::Hang => {
            std::future::pending::<()>().await;
            StatusCode::OK.into_response()
        }
    }
}

enum End {
    Clean,
    Break,
    Hang,
}

// ---- OpenAI wire format ----

fn openai_chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
    })
}

fn openai_events(chunks: Vec<Value>) -> Vec<String> {
    chunks
        .into_iter()
        .map(|chunk| format!("data: {chunk}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_string()))
        .collect()
}

fn openai_usage(prompt_tokens: u32, completion_tokens: u32) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
}

/// Splits `text` into `parts` pieces of about equal length (on char boundaries).
pub fn split_text(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(parts.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// An OpenAI streamed answer of plain text, in `parts` content deltas.
pub fn openai_text(text: &str, parts: usize) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({ "role": "assistant", "content": "" }),
        None,
    )];
    for piece in split_text(text, parts) {
        chunks.push(openai_chunk(json!({ "content": piece }), None));
    }
    chunks.push(openai_chunk(json!({}), Some("stop")));
    chunks.push(openai_usage(50, parts as u32));
    openai_events(chunks)
}

/// An OpenAI streamed tool call whose JSON arguments arrive in `parts` fragments.
pub fn openai_tool_call(id: &str, name: &str, arguments: &Value, parts: usize) -> Vec<String> {
    openai_tool_call_raw(id, name, &arguments.to_string(), parts)
}

/// [`openai_tool_call`] with the argument text as given (possibly malformed JSON).
pub fn openai_tool_call_raw(id: &str, name: &str, arguments: &str, parts: usize) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({ "role": "assistant", "content": null, "tool_calls": [{
            "index": 0, "id": id, "type": "function",
            "function": { "name": name, "arguments": "" },
        }]}),
        None,
    )];
    for piece in split_text(arguments, parts) {
        chunks.push(openai_chunk(
            json!({ "tool_calls": [{ "index": 0, "function": { "arguments": piece } }] }),
            None,
        ));
    }
    chunks.push(openai_chunk(json!({}), Some("tool_calls")));
    chunks.push(openai_usage(80, parts as u32));
    openai_events(chunks)
}

// ---- Anthropic wire format ----

fn anthropic_events(events: Vec<Value>) -> Vec<String> {
    events
        .into_iter()
        .map(|event| {
            let name = event["type"].as_str().unwrap_or("message").to_string();
            format!("event: {name}\ndata: {event}\n\n")
        })
        .collect()
}

fn anthropic_start() -> Value {
    json!({ "type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
        "content": [], "stop_reason": null, "usage": { "input_tokens": 60, "output_tokens": 1 },
    }})
}

fn anthropic_end(stop_reason: &str, output_tokens: u32) -> Vec<Value> {
    vec![
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason },
                "usage": { "output_tokens": output_tokens } }),
        json!({ "type": "message_stop" }),
    ]
}

/// An Anthropic streamed text answer in `parts` text deltas.
pub fn anthropic_text(text: &str, parts: usize) -> Vec<String> {
    let mut events = vec![
        anthropic_start(),
        json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "text", "text": "" } }),
    ];
    for piece in split_text(text, parts) {
        events.push(json!({ "type": "content_block_delta", "index": 0,
                            "delta": { "type": "text_delta", "text": piece } }));
    }
    events.push(json!({ "type": "content_block_stop", "index": 0 }));
    events.extend(anthropic_end("end_turn", parts as u32));
    anthropic_events(events)
}

/// An Anthropic streamed `tool_use` block whose input JSON arrives in `parts` fragments.
pub fn anthropic_tool_call(id: &str, name: &str, arguments: &Value, parts: usize) -> Vec<String> {
    let mut events = vec![
        anthropic_start(),
        json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } }),
    ];
    for piece in split_text(&arguments.to_string(), parts) {
        events.push(json!({ "type": "content_block_delta", "index": 0,
                            "delta": { "type": "input_json_delta", "partial_json": piece } }));
    }
    events.push(json!({ "type": "content_block_stop", "index": 0 }));
    events.extend(anthropic_end("tool_use", parts as u32));
    anthropic_events(events)
}

// ---- scripted agents ----

/// A text answer in the request's own wire format.
pub fn text_reply(request: &FakeRequest, text: &str, parts: usize) -> FakeReply {
    FakeReply::Stream(if request.is_anthropic() {
        anthropic_text(text, parts)
    } else {
        openai_text(text, parts)
    })
}

/// A tool call in the request's own wire format.
pub fn tool_call_reply(
    request: &FakeRequest,
    id: &str,
    name: &str,
    arguments: &Value,
    parts: usize,
) -> FakeReply {
    FakeReply::Stream(if request.is_anthropic() {
        anthropic_tool_call(id, name, arguments, parts)
    } else {
        openai_tool_call(id, name, arguments, parts)
    })
}

/// The `final_answer` arguments citing the first `n` chunk ids the agent showed the model.
pub fn final_answer_citing(request: &FakeRequest, n: usize) -> Value {
    let ids: Vec<String> = request.chunk_ids_shown().into_iter().take(n).collect();
    let answer = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("Finding {} is supported by the evidence [{id}].", i + 1))
        .collect::<Vec<_>>()
        .join(" ");
    json!({ "answer": answer, "citations": ids })
}

/// A well-behaved ReAct model: with no tool result yet it calls `knowledge_search` for
/// `query` (arguments split over many chunks); once it has results it calls `final_answer`
/// citing the first two chunks it was shown. Requests without tools (the planner, rewrites,
/// summaries) get a short text answer.
pub fn react_agent(query: impl Into<String>) -> impl Fn(&FakeRequest) -> FakeReply + Send + Sync {
    let query: String = query.into();
    move |request| {
        if !request.offers_tool("final_answer") {
            let question = request.last_user_text();
            return text_reply(request, &question, 3);
        }
        if request.tool_results() == 0 || request.chunk_ids_shown().is_empty() {
            return tool_call_reply(
                request,
                &format!("call_search_{}", request.index),
                "knowledge_search",
                &json!({ "query": query }),
                12,
            );
        }
        tool_call_reply(
            request,
            &format!("call_answer_{}", request.index),
            "final_answer",
            &final_answer_citing(request, 2),
            20,
        )
    }
}

/// An OpenAI (or vLLM) context-overflow answer: 400 with `context_length_exceeded`.
pub fn openai_context_overflow(window: u32, requested: u32) -> FakeReply {
    FakeReply::Status(
        400,
        json!({ "error": {
            "message": format!(
                "This model's maximum context length is {window} tokens. However, your messages \
                 resulted in {requested} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        } }),
    )
}

/// llama.cpp server's context-overflow answer: 400, `exceed_context_size_error`, with its
/// slot's `n_ctx` and the prompt's token count.
pub fn llama_cpp_context_overflow(n_ctx: u32, n_prompt_tokens: u32) -> FakeReply {
    FakeReply::Status(
        400,
        json!({ "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt_tokens,
            "n_ctx": n_ctx,
        } }),
    )
}
