//! A fake chat-model server: a real HTTP server (axum, port 0 on 127.0.0.1) speaking the
//! OpenAI chat-completions streaming format (`POST /v1/chat/completions`) and the Anthropic
//! Messages streaming format (`POST /v1/messages`). One server serves the unit tests of this
//! crate, the integration tests (`sift-tests`) and `sift-bench chat`.
//!
//! A test scripts it either with a handler that sees every request and picks the reply
//! ([`FakeLlm::start`]), or with a queue of replies and a fallback ([`FakeLlm::scripted`]).
//! A reply is streamed SSE pieces (one body frame each, so events and tool-call arguments
//! straddle network writes), an error status, a stream that breaks or hangs, or silence
//! before the first byte. [`wire`] builds the pieces of both formats.

pub mod wire;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::Value;

pub use self::wire::*;
use crate::llm::config::{ProviderConfig, ProviderKind};

/// One request the server received.
#[derive(Clone, Debug)]
pub struct FakeRequest {
    /// `/v1/chat/completions` or `/v1/messages`.
    pub path: String,
    pub headers: HeaderMap,
    /// The JSON body (`null` when it was not JSON).
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
        let Some(messages) = self.body["messages"].as_array() else {
            return 0;
        };
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
        let Some(messages) = self.body["messages"].as_array() else {
            return String::new();
        };
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

/// Picks the reply to each request.
pub type Handler = Arc<dyn Fn(&FakeRequest) -> FakeReply + Send + Sync>;

/// How [`FakeLlm::start_with_options`] runs the server.
#[derive(Clone, Debug)]
pub struct FakeOptions {
    /// Where to listen; port 0 picks a free port.
    pub address: SocketAddr,
    /// Pause before each written piece. Pieces are paced against the stream's start
    /// (piece `i` is written at `start + (i + 1) * piece_delay`), so timer overshoot does not
    /// add up.
    pub piece_delay: Duration,
    /// Keep every request for [`FakeLlm::requests`] (off for long benchmark runs).
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

struct FakeState {
    handler: Handler,
    requests: Mutex<Vec<FakeRequest>>,
    piece_delay: Duration,
    record_requests: bool,
    /// Requests received so far (recorded or not).
    received: AtomicUsize,
}

/// The running server. It stops with the runtime that started it.
pub struct FakeLlm {
    address: SocketAddr,
    state: Arc<FakeState>,
}

impl FakeLlm {
    /// A server whose `handler` picks every reply.
    pub async fn start(
        handler: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static,
    ) -> FakeLlm {
        FakeLlm::start_with_delay(handler, Duration::ZERO).await
    }

    /// A server answering the scripted replies in order, then `fallback` for ever. Pieces
    /// leave 1 ms apart, as separate writes.
    pub async fn scripted(script: Vec<FakeReply>, fallback: FakeReply) -> FakeLlm {
        let script = Mutex::new(VecDeque::from(script));
        let handler = move |_: &FakeRequest| {
            script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| fallback.clone())
        };
        FakeLlm::start_with_delay(handler, Duration::from_millis(1)).await
    }

    /// A server that waits `piece_delay` before each written piece of a stream.
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
            .with_state(Arc::clone(&state));
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

    /// A provider config pointing here, with no retries and timeouts only a hang reaches.
    pub fn provider(&self, name: &str, kind: ProviderKind) -> ProviderConfig {
        ProviderConfig {
            name: name.to_owned(),
            kind,
            first_token_timeout_ms: 10_000,
            idle_timeout_ms: 10_000,
            max_retries: 0,
            backoff_ms: 10,
            ..ProviderConfig::openai(self.base_url(), "fake-model", Some("test-key".to_owned()))
        }
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn answer(
    State(state): State<Arc<FakeState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = FakeRequest {
        path: uri.path().to_owned(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        index: state.received.fetch_add(1, Ordering::Relaxed),
    };
    if state.record_requests {
        state.requests.lock().unwrap().push(request.clone());
    }
    let reply = (state.handler)(&request);
    let delay = state.piece_delay;
    match reply {
        FakeReply::Stream(pieces) => sse(pieces_body(pieces, delay, End::Clean)),
        FakeReply::StreamThenBreak(pieces) => sse(pieces_body(pieces, delay, End::Break)),
        FakeReply::StreamThenHang(pieces) => sse(pieces_body(pieces, delay, End::Hang)),
        FakeReply::Status(status, body) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(body),
        )
            .into_response(),
        FakeReply::Hang => std::future::pending().await,
    }
}

/// How a streamed reply ends.
enum End {
    Clean,
    Break,
    Hang,
}

/// The pieces as separate body frames, paced by `delay`, then the scripted end.
fn pieces_body(pieces: Vec<String>, delay: Duration, end: End) -> Body {
    let start = tokio::time::Instant::now();
    let pieces =
        futures::stream::iter(pieces.into_iter().enumerate()).then(move |(at, piece)| async move {
            if !delay.is_zero() {
                tokio::time::sleep_until(start + delay * (at as u32 + 1)).await;
            }
            Ok::<_, std::io::Error>(Bytes::from(piece))
        });
    let end = futures::stream::once(async move {
        match end {
            End::Clean => None,
            End::Break => {
                // The pause lets hyper flush the pieces before the connection drops.
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "connection broken by the test",
                )))
            }
            End::Hang => std::future::pending().await,
        }
    })
    .filter_map(|item| async move { item });
    Body::from_stream(pieces.chain(end))
}

fn sse(body: Body) -> Response {
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        body,
    )
        .into_response()
}
