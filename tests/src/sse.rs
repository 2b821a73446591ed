//! Reading server-sent event streams of the API (run events, OpenAI-compatible chunks).

use std::time::Duration;

use serde_json::Value;

use crate::{ApiClient, WAIT};

/// One server-sent event, as the tests read it.
#[derive(Clone, Debug, PartialEq)]
pub struct SseEvent {
    /// The stream's last event id (it carries over to events without an `id:` line).
    pub id: Option<u64>,
    /// The `event:` name (`message` when absent).
    pub event: String,
    /// `data:` parsed as JSON (a JSON string when it is not JSON, e.g. `[DONE]`).
    pub data: Value,
}

/// An open event stream, read event by event (parsed by [`sift_client::sse`]).
pub struct SseReader {
    events: sift_client::Events,
}

impl SseReader {
    /// Sends `request` and checks it answered 200 with `text/event-stream`.
    pub async fn open(request: reqwest::RequestBuilder) -> SseReader {
        let (http, request) = request.build_split();
        let request = request.expect("building the event stream request");
        let method = request.method().clone();
        let response = http.execute(request).await.unwrap_or_else(|error| {
            panic!(
                "opening an event stream: {}",
                sift_client::render_error(&error)
            )
        });
        let status = response.status();
        if status != 200 || !sift_client::is_event_stream(response.headers()) {
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = response.text().await.unwrap_or_default();
            panic!("expected an event stream, got {status} {content_type:?}: {body}");
        }
        SseReader {
            events: sift_client::Events::new(method, response),
        }
    }

    /// The next event; `None` once the stream ended. A stream silent for [`WAIT`] fails the
    /// test (a hung stream is a bug).
    pub async fn next(&mut self) -> Option<SseEvent> {
        let event = tokio::time::timeout(WAIT, self.events.next_event())
            .await
            .unwrap_or_else(|_| panic!("the event stream was silent for {WAIT:?}"))?;
        let event = event.unwrap_or_else(|error| panic!("the event stream broke: {error}"));
        Some(SseEvent {
            id: event.id.as_deref().and_then(|id| id.parse().ok()),
            data: event.json(),
            event: event.event,
        })
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

/// `POST /v1/sessions/{id}/messages` as an open stream.
pub async fn ask(client: &ApiClient, session_id: &str, content: &str) -> SseReader {
    SseReader::open(client.api().ask_request(session_id, content)).await
}

/// `GET /v1/runs/{id}/events`, resuming after `last_event_id` when given.
pub async fn follow_run(client: &ApiClient, run_id: &str, last_event_id: Option<u64>) -> SseReader {
    let last_event_id = last_event_id.map(|id| id.to_string());
    SseReader::open(
        client
            .api()
            .follow_run_request(run_id, last_event_id.as_deref()),
    )
    .await
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
