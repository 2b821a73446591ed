//! HTTP plumbing shared by the providers: the client, sending a streaming request and turning
//! failures into [`LlmError`]s, and reading the response body as Server-Sent Events.

use std::collections::VecDeque;

use super::LlmError;
use super::config::ProviderConfig;
use super::sse::{SseEvent, SseParser};
use crate::error_chain;

/// Error bodies are cut to this many characters in error messages.
const MAX_ERROR_BODY_CHARS: usize = 300;

/// Largest single SSE event accepted; a server sending more without an event end is broken.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// A client with the provider's connect timeout. There is no overall timeout: streams last as
/// long as the model writes; the router bounds the first token and the gaps between events.
pub(crate) fn build_client(config: &ProviderConfig) -> Result<reqwest::Client, LlmError> {
    reqwest::Client::builder()
        .connect_timeout(config.connect_timeout())
        .build()
        .map_err(|error| {
            LlmError::Config(format!("provider {}: http client: {error}", config.name))
        })
}

/// Sends `request`; a non-2xx answer becomes [`LlmError::Status`] with the server's message.
pub(crate) async fn send(
    provider: &str,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::Response, LlmError> {
    let response = request
        .send()
        .await
        .map_err(|error| transport_error(provider, &error))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(LlmError::Status {
        provider: provider.to_owned(),
        status: status.as_u16(),
        message: error_message(&body),
    })
}

/// A transport failure: a connect error or timeout, or a broken body (a protocol error: the
/// server accepted the request and then failed it).
pub(crate) fn transport_error(provider: &str, error: &reqwest::Error) -> LlmError {
    let provider = provider.to_owned();
    let message = error_chain(error);
    if error.is_timeout() {
        LlmError::Timeout {
            provider,
            what: if error.is_connect() {
                "connect".to_owned()
            } else {
                "request".to_owned()
            },
        }
    } else if error.is_connect() || error.is_request() && !error.is_body() {
        LlmError::Connect { provider, message }
    } else {
        LlmError::Protocol { provider, message }
    }
}

/// The server's explanation: `{"error": {"message"}}` (OpenAI, Anthropic), a bare
/// `{"error": "..."}`, or the start of the body; for a context-window error with its labels
/// (see [`error_labels`]), which say what the message may not (`context_length_exceeded`).
pub(crate) fn error_message(body: &[u8]) -> String {
    let message = error_detail(body).unwrap_or_else(|| "no error message".to_owned());
    let labels = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| value.get("error").map(error_labels))
        .unwrap_or_default();
    format!("{message}{labels}")
}

/// ` (code, n_ctx N, n_prompt_tokens N)` of an error object when it is about the context
/// window: a string `code` or `type` naming the context (OpenAI `context_length_exceeded`,
/// llama.cpp `exceed_context_size_error`) and llama.cpp's token counts; empty otherwise, so
/// other errors read as the server wrote them.
pub(crate) fn error_labels(error: &serde_json::Value) -> String {
    let mut labels: Vec<String> = ["code", "type"]
        .iter()
        .filter_map(|field| error.get(field).and_then(serde_json::Value::as_str))
        .filter(|label| label.contains("context"))
        .map(str::to_owned)
        .collect();
    for field in ["n_ctx", "n_prompt_tokens"] {
        if let Some(count) = error.get(field).and_then(serde_json::Value::as_u64) {
            labels.push(format!("{field} {count}"));
        }
    }
    labels.dedup();
    if labels.is_empty() {
        String::new()
    } else {
        format!(" ({})", labels.join(", "))
    }
}

/// The explanation in an error body (see [`error_message`]), trimmed and cut to
/// `MAX_ERROR_BODY_CHARS`; `None` when the body says nothing. Shared with the embedding client.
pub(crate) fn error_detail(body: &[u8]) -> Option<String> {
    let from_json = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|value| {
            let error = value.get("error")?;
            error
                .get("message")
                .and_then(serde_json::Value::as_str)
                .or_else(|| error.as_str())
                .map(str::to_owned)
        });
    let detail = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let detail: String = detail.trim().chars().take(MAX_ERROR_BODY_CHARS).collect();
    (!detail.is_empty()).then_some(detail)
}

/// The SSE events of a streaming response body, pulled one at a time (dropping it closes the
/// connection).
pub(crate) struct SseBody {
    provider: String,
    response: reqwest::Response,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    ended: bool,
}

impl SseBody {
    pub(crate) fn new(provider: &str, response: reqwest::Response) -> Self {
        SseBody {
            provider: provider.to_owned(),
            response,
            parser: SseParser::new(),
            pending: VecDeque::new(),
            ended: false,
        }
    }

    /// The next event; `None` once the body ended; a broken body is a protocol error.
    pub(crate) async fn next(&mut self) -> Option<Result<SseEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.ended {
                return None;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => {
                    self.pending.extend(self.parser.push(&bytes));
                    if self.parser.buffered_bytes() > MAX_EVENT_BYTES {
                        self.ended = true;
                        return Some(Err(LlmError::Protocol {
                            provider: self.provider.clone(),
                            message: format!("an event exceeds {MAX_EVENT_BYTES} bytes"),
                        }));
                    }
                }
                Ok(None) => {
                    self.ended = true;
                    self.pending.extend(self.parser.finish());
                }
                Err(error) => {
                    self.ended = true;
                    return Some(Err(LlmError::Protocol {
                        provider: self.provider.clone(),
                        message: format!("stream broken: {}", error_chain(&error)),
                    }));
                }
            }
        }
    }
}
