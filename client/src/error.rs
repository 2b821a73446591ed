//! What a request to the node can end in besides an answer.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use sift_api::ErrorBody;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The `code` of an [`ApiError`] whose body was not the node's `{"error": {..}}` (a proxy's
/// page, an empty body).
pub const NO_CODE: &str = "-";

/// The node refused the request: a 4xx or 5xx status and the `{"error": {"code", "message"}}`
/// body every error of the API carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status} [{code}]: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// The machine-readable code (`kb_not_found`, ...); [`NO_CODE`] when the body had none.
    pub code: String,
    /// The human message; an excerpt of the body when it was not the node's error shape.
    pub message: String,
    /// The `Retry-After` header, in whole or fractional seconds, when the node sent one.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// Parses an error answer's body (`{"error": {"code", "message"}}`, or anything else).
    pub fn from_body(status: StatusCode, body: &[u8], retry_after: Option<Duration>) -> ApiError {
        let (code, message) = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(ErrorBody { error }) if !error.code.is_empty() => (error.code, error.message),
            _ => (NO_CODE.to_string(), body_excerpt(body)),
        };
        ApiError {
            status,
            code,
            message,
            retry_after,
        }
    }

    /// Whether the same request may succeed if sent again a little later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        )
    }
}

/// What went wrong with one request to the node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node answered with an error status.
    #[error("{method} {url} -> {error}")]
    Api {
        method: Method,
        url: String,
        error: ApiError,
    },
    /// No (whole) answer: the URL is invalid, the connection was refused or reset, or the
    /// request timed out. The cause is part of the message (not a `source`), so error chains
    /// do not print it twice.
    #[error("{method} {url} failed: {}", render_error(cause))]
    Transport {
        method: Method,
        url: String,
        cause: reqwest::Error,
    },
    /// A 2xx answer whose body does not match the type asked for.
    #[error("{method} {url}: unexpected response body: {cause}")]
    Decode {
        method: Method,
        url: String,
        cause: serde_json::Error,
    },
    /// An event stream that is not valid UTF-8 or not a valid `text/event-stream`.
    #[error("{method} {url}: invalid event stream: {message}")]
    Stream {
        method: Method,
        url: String,
        message: String,
    },
}

impl Error {
    /// The node's refusal, when it answered with an error status.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The HTTP status, when the node answered with an error.
    pub fn status(&self) -> Option<StatusCode> {
        self.api().map(|error| error.status)
    }

    /// How long the node asked us to wait before retrying, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.api().and_then(|error| error.retry_after)
    }

    /// Whether the same request may succeed if sent again a little later (a 429/502/503/504,
    /// or no answer at all).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api { error, .. } => error.is_transient(),
            Error::Transport { .. } => true,
            Error::Decode { .. } | Error::Stream { .. } => false,
        }
    }

    /// The transport error, when the node could not be reached or the answer broke off.
    pub fn transport(&self) -> Option<&reqwest::Error> {
        match self {
            Error::Transport { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

/// A reqwest error with its source chain. `reqwest`'s own message mostly repeats the URL
/// ("error sending request for url (...)"); the useful part ("tcp connect error: Connection
/// refused") is in the chain.
pub fn render_error(error: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    let text = if causes.is_empty() {
        error.to_string()
    } else {
        causes.join(": ")
    };
    if error.is_timeout() && !text.contains("timed out") {
        format!("timed out: {text}")
    } else {
        text
    }
}

/// `Retry-After` in seconds (`"2"` or `"0.5"`); the HTTP-date form is not supported.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(3600.0)))
}

fn body_excerpt(body: &[u8]) -> String {
    const LIMIT: usize = 300;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_parses_seconds() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn error_bodies_are_parsed_and_other_bodies_kept_as_an_excerpt() {
        let error = ApiError::from_body(
            StatusCode::NOT_FOUND,
            br#"{"error": {"code": "kb_not_found", "message": "no knowledge base x"}}"#,
            None,
        );
        assert_eq!(error.code, "kb_not_found");
        assert_eq!(error.message, "no knowledge base x");
        assert_eq!(
            error.to_string(),
            "HTTP 404 Not Found [kb_not_found]: no knowledge base x"
        );
        let error = ApiError::from_body(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>", None);
        assert_eq!(error.code, NO_CODE);
        assert_eq!(error.message, "<html>bad gateway</html>");
        assert!(error.is_transient());
        let error = ApiError::from_body(StatusCode::INTERNAL_SERVER_ERROR, b"", None);
        assert_eq!(error.message, "(empty body)");
        assert!(!error.is_transient());
    }
}
