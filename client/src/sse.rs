//! Server-sent event streams of the API (run events, OpenAI-compatible chat chunks), parsed
//! by `eventsource-stream`: bytes are decoded as UTF-8 only up to the last complete
//! character (a character split across two network reads arrives whole) and an event is
//! given out only once its blank line arrived.

use std::pin::Pin;
use std::task::{Context, Poll};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::Method;

use crate::error::Error;

/// One server-sent event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The last event id of the stream (per the spec it carries over to events without an
    /// `id:` line); `None` while the stream has sent none.
    pub id: Option<String>,
    /// The `event:` name (`message` when absent).
    pub event: String,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
}

impl SseEvent {
    /// `data` parsed as JSON, or a JSON string when it is not JSON (e.g. `[DONE]`).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|_| serde_json::Value::String(self.data.clone()))
    }
}

/// Why a stream of bytes did not give an event.
#[derive(Debug)]
pub enum SseError<E> {
    /// The underlying stream failed.
    Transport(E),
    /// The bytes are not valid UTF-8 or not a valid event stream.
    Invalid(String),
}

/// The events of a stream of byte chunks (such as `reqwest::Response::bytes_stream()`).
/// Comments (keep-alives) and events without data are not events.
pub fn parse<S, B, E>(bytes: S) -> impl Stream<Item = Result<SseEvent, SseError<E>>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    bytes.eventsource().map(|item| match item {
        Ok(event) => Ok(SseEvent {
            id: (!event.id.is_empty()).then_some(event.id),
            event: event.event,
            data: event.data,
        }),
        Err(EventStreamError::Transport(error)) => Err(SseError::Transport(error)),
        Err(EventStreamError::Utf8(error)) => Err(SseError::Invalid(error.to_string())),
        Err(EventStreamError::Parser(error)) => Err(SseError::Invalid(error.to_string())),
    })
}

/// An open event stream of the API, read event by event ([`Events::next_event`], or as a
/// [`Stream`]).
pub struct Events {
    status: reqwest::StatusCode,
    headers: reqwest::header::HeaderMap,
    inner: Pin<Box<dyn Stream<Item = Result<SseEvent, Error>> + Send>>,
}

impl Events {
    /// The events of `response` (the answer to a `method` request), whatever its status.
    pub fn new(method: Method, response: reqwest::Response) -> Events {
        let url = response.url().to_string();
        let status = response.status();
        let headers = response.headers().clone();
        let inner = parse(response.bytes_stream()).map(move |item| {
            item.map_err(|error| match error {
                SseError::Transport(cause) => Error::Transport {
                    method: method.clone(),
                    url: url.clone(),
                    cause,
                },
                SseError::Invalid(message) => Error::Stream {
                    method: method.clone(),
                    url: url.clone(),
                    message,
                },
            })
        });
        Events {
            status,
            headers,
            inner: Box::pin(inner),
        }
    }

    pub fn status(&self) -> reqwest::StatusCode {
        self.status
    }

    pub fn headers(&self) -> &reqwest::header::HeaderMap {
        &self.headers
    }

    /// The next event; `None` once the stream ended.
    pub async fn next_event(&mut self) -> Option<Result<SseEvent, Error>> {
        self.inner.next().await
    }
}

impl Stream for Events {
    type Item = Result<SseEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of `chunks`, each chunk one read of the network.
    async fn events_of(chunks: Vec<Vec<u8>>) -> Vec<SseEvent> {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        parse(stream)
            .map(|item| item.expect("a valid stream"))
            .collect()
            .await
    }

    fn event(id: Option<&str>, name: &str, data: &str) -> SseEvent {
        SseEvent {
            id: id.map(str::to_string),
            event: name.to_string(),
            data: data.to_string(),
        }
    }

    #[test]
    fn a_character_split_across_two_reads_arrives_whole() {
        let text = "event: delta\ndata: {\"text\":\"thé 中文\"}\n\n".as_bytes();
        // Cut inside "é" (2 bytes) and inside "中" (3 bytes): every read ends mid-character.
        let e_acute = text.windows(2).position(|w| w == "é".as_bytes()).unwrap();
        let zhong = text.windows(3).position(|w| w == "中".as_bytes()).unwrap();
        let chunks = vec![
            text[..e_acute + 1].to_vec(),
            text[e_acute + 1..zhong + 1].to_vec(),
            text[zhong + 1..zhong + 2].to_vec(),
            text[zhong + 2..].to_vec(),
        ];
        let events = futures::executor::block_on(events_of(chunks));
        assert_eq!(
            events,
            vec![event(None, "delta", "{\"text\":\"thé 中文\"}")]
        );
        assert_eq!(events[0].json()["text"], "thé 中文");
    }

    #[test]
    fn events_split_across_reads_with_ids_comments_and_crlf() {
        let chunks: Vec<Vec<u8>> = [
            "id: 1\nevent: meta\ndata: {\"a\"",
            ":1}\n",
            "\n: keep-alive\n\nid: 2\r\nevent: delta\r\ndata: line one\r\ndata: line two\r",
            "\n\r\n",
            "event: note\ndata: no id line\n\ndata: [DONE]\n\nid: 3\nevent: done\nda",
            "ta: {}\n\n",
            "data: never finished\n",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
        let events = futures::executor::block_on(events_of(chunks));
        assert_eq!(
            events,
            vec![
                event(Some("1"), "meta", "{\"a\":1}"),
                event(Some("2"), "delta", "line one\nline two"),
                // No `id:` line: the last event id carries over.
                event(Some("2"), "note", "no id line"),
                event(Some("2"), "message", "[DONE]"),
                event(Some("3"), "done", "{}"),
            ]
        );
        assert_eq!(events[3].json(), serde_json::json!("[DONE]"));
    }

    #[test]
    fn a_broken_transport_is_reported() {
        let chunks = vec![
            Ok(b"data: 1\n\n".to_vec()),
            Err(std::io::Error::other("reset")),
        ];
        let items: Vec<_> =
            futures::executor::block_on(parse(futures::stream::iter(chunks)).collect());
        assert!(matches!(&items[0], Ok(e) if e.data == "1"));
        assert!(matches!(&items[1], Err(SseError::Transport(e)) if e.to_string() == "reset"));
    }
}
