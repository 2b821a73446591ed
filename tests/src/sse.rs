//! Reading server-sent event streams of the API (run events, OpenAI-compatible chunks).

use std::time::Duration;

use serde_json::Value;

use crate::{ApiClient, WAIT};

/// One server-sent event.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    pub id: Option<u64>,
    /// The `event:` name (`message` when absent).
    pub event: String,
    /// `data:` parsed as JSON (a JSON string when it is not JSON, e.g. `[DONE]`).
    pub data: Value,
}

/// An open event stream, read event by event.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
    ended: bool,
}

impl SseReader {
    /// Sends `request` and checks it answered 200 with `text/event-stream`.
    pub async fn open(request: reqwest::RequestBuilder) -> SseReader {
        let response = request.send().await.expect("opening an event stream");
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status != 200 || !content_type.starts_with("text/event-stream") {
            let body = response.text().await.unwrap_or_default();
            panic!("expected an event stream, got {status} {content_type:?}: {body}");
        }
        SseReader {
            response,
            buffer: String::new(),
            ended: false,
        }
    }

    /// The next event; `None` once the stream ended. A stream silent for [`WAIT`] fails the
    /// test (a hung stream is a bug).
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(at) = self.buffer.find("\n\n") {
                let block: String = self.buffer[..at].to_string();
                self.buffer.drain(..at + 2);
                if let Some(event) = parse_block(&block) {
                    return Some(event);
                }
                continue;
            }
            if self.ended {
                return None;
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("the event stream was silent for {WAIT:?}"));
            match chunk {
                Ok(Some(bytes)) => self
                    .buffer
                    .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
                Ok(None) => self.ended = true,
                Err(error) => panic!("the event stream broke: {error}"),
            }
        }
    }

    /// Every remaining event until the stream ends.
    pub async fn rest(mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }

    /// Events until (and including) the first named `name`.
    pub async fn until(&mut self, name: &str) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            let found = event.event == name;
            events.push(event);
            if found {
                return events;
            }
        }
        panic!("the stream ended without a {name:?} event: {events:#?}");
    }
}

fn parse_block(block: &str) -> Option<SseEvent> {
    let mut id = None;
    let mut event = None;
    let mut data: Vec<&str> = Vec::new();
    for line in block.lines() {
        if line.starts_with(':') {
            continue; // comment (keep-alive)
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = value.parse().ok(),
            "event" => event = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    if data.is_empty() && event.is_none() {
        return None;
    }
    let text = data.join("\n");
    Some(SseEvent {
        id,
        event: event.unwrap_or_else(|| "message".into()),
        data: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    })
}

/// `POST /v1/sessions/{id}/messages` as an open stream.
pub async fn ask(client: &ApiClient, session_id: &str, content: &str) -> SseReader {
    SseReader::open(
        client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session_id}/messages"),
            )
            .json(&serde_json::json!({ "content": content })),
    )
    .await
}

/// `GET /v1/runs/{id}/events`, resuming after `last_event_id` when given.
pub async fn follow_run(client: &ApiClient, run_id: &str, last_event_id: Option<u64>) -> SseReader {
    let mut request = client.request(reqwest::Method::GET, &format!("/v1/runs/{run_id}/events"));
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    SseReader::open(request).await
}

/// The events' names in order.
pub fn names(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

/// The concatenated `delta` texts.
pub fn answer_text(events: &[SseEvent]) -> String {
    events
        .iter()
        .filter(|e| e.event == "delta")
        .filter_map(|e| e.data["text"].as_str())
        .collect()
}

/// A short pause for polling loops.
pub const POLL: Duration = Duration::from_millis(50);
