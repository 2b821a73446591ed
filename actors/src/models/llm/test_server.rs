//! A scripted fake model server for tests: a real HTTP server (axum, port 0) answering
//! `POST /v1/chat/completions` and `POST /v1/messages` with whatever each test scripts, as
//! Server-Sent Events written in pieces, error statuses, broken connections or silence.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::{StreamExt, stream};
use serde_json::{Value, json};

use super::config::{ProviderConfig, ProviderKind};
use super::{ChatEvent, ChatStream, LlmError};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with an SSE body written as these pieces, one write each.
    Stream(Vec<String>),
    /// 200, these pieces, then the connection breaks.
    StreamThenBreak(Vec<String>),
    /// 200, these pieces, then nothing more, ever.
    StreamThenHang(Vec<String>),
    /// An error status with this JSON body.
    Status(u16, Value),
    /// Never answers (not even headers).
    Hang,
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

struct FakeState {
    /// Consumed one per request; `fallback` once empty.
    script: Mutex<VecDeque<Reply>>,
    fallback: Reply,
    requests: Mutex<Vec<Recorded>>,
}

pub struct FakeModelServer {
    address: SocketAddr,
    state: Arc<FakeState>,
}

impl FakeModelServer {
    /// A server answering the scripted replies in order, then `fallback` for ever.
    pub async fn start(script: Vec<Reply>, fallback: Reply) -> Self {
        let state = Arc::new(FakeState {
            script: Mutex::new(script.into()),
            fallback,
            requests: Mutex::new(Vec::new()),
        });
        let router = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        FakeModelServer { address, state }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// A provider config pointing here, with no retries (and timeouts only a hang reaches).
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

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}

async fn answer(
    State(state): State<Arc<FakeState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.requests.lock().unwrap().push(Recorded {
        path: uri.path().to_owned(),
        headers,
        body,
    });
    let reply = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| state.fallback.clone());
    match reply {
        Reply::Stream(pieces) => sse_response(Body::from_stream(pieces_stream(pieces))),
        Reply::StreamThenBreak(pieces) => {
            // The pause lets hyper flush the pieces before it drops the connection.
            let broken = stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "scripted break",
                ))
            });
            sse_response(Body::from_stream(pieces_stream(pieces).chain(broken)))
        }
        Reply::StreamThenHang(pieces) => sse_response(Body::from_stream(
            pieces_stream(pieces).chain(stream::pending()),
        )),
        Reply::Status(status, body) => (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response(),
        Reply::Hang => std::future::pending().await,
    }
}

/// The pieces as separate body frames, with a pause between them so that they leave as
/// separate writes.
fn pieces_stream(
    pieces: Vec<String>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    stream::iter(pieces).then(|piece| async move {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok::<_, std::io::Error>(Bytes::from(piece))
    })
}

fn sse_response(body: Body) -> Response {
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `data: {chunk}` events, then `data: [DONE]`.
pub fn openai_sse(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
        .collect()
}

/// A chat completion chunk with one choice.
pub fn openai_chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

/// The usage chunk sent last with `stream_options.include_usage`.
pub fn openai_usage(prompt_tokens: u32, completion_tokens: u32) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
}

/// A complete OpenAI answer streaming `pieces` of text.
pub fn openai_text_answer(pieces: &[&str]) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    chunks.extend(
        pieces
            .iter()
            .map(|piece| openai_chunk(json!({"content": piece}), None)),
    );
    chunks.push(openai_chunk(json!({}), Some("stop")));
    chunks.push(openai_usage(11, pieces.len() as u32));
    openai_sse(&chunks)
}

/// Anthropic SSE events (`event:` line plus `data:` with its `type`).
pub fn anthropic_sse(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|event| {
            let name = event["type"].as_str().unwrap_or("message");
            format!("event: {name}\ndata: {event}\n\n")
        })
        .collect()
}

/// Cuts every piece in two at odd places, so events straddle writes.
pub fn split_pieces(pieces: Vec<String>) -> Vec<String> {
    let joined: String = pieces.concat();
    let characters: Vec<char> = joined.chars().collect();
    characters
        .chunks(7)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

/// Every event of a stream, and the error that ended it, if any.
pub async fn collect(mut stream: ChatStream) -> (Vec<ChatEvent>, Option<LlmError>) {
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => events.push(event),
            Err(error) => return (events, Some(error)),
        }
    }
    (events, None)
}

/// The concatenated text deltas.
pub fn text_of(events: &[ChatEvent]) -> String {
    events
        .iter()
        .filter_map(|event| match event {
            ChatEvent::TextDelta(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}
