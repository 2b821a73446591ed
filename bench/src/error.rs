//! Errors of talking to a Sift node over HTTP.

use std::error::Error as _;
use std::time::Duration;

use reqwest::StatusCode;

pub type Result<T> = std::result::Result<T, ClientError>;

/// What went wrong with one request to the node.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The node answered with a 4xx or 5xx status and (usually) an `{"error": {"code", "message"}}` body.
    #[error("{method} {url} -> HTTP {status} [{code}]: {message}")]
    Api {
        method: &'static str,
        url: String,
        status: StatusCode,
        code: String,
        message: String,
        /// The `Retry-After` header, in whole or fractional seconds, when the node sent one.
        retry_after: Option<Duration>,
    },
    /// No answer: connection refused or reset, or the request timed out. The cause is part of
    /// the message (not a `source`), so error chains do not print it twice.
    #[error("{method} {url} failed: {}", describe(cause))]
    Transport {
        method: &'static str,
        url: String,
        cause: reqwest::Error,
    },
    /// A 2xx answer whose body does not match the API contract.
    #[error("{method} {url}: unexpected response body: {cause}")]
    Decode {
        method: &'static str,
        url: String,
        cause: serde_json::Error,
    },
}

impl ClientError {
    /// Whether the same request may succeed if sent again a little later.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Api { status, .. } => matches!(
                *status,
                StatusCode::TOO_MANY_REQUESTS
                    | StatusCode::BAD_GATEWAY
                    | StatusCode::SERVICE_UNAVAILABLE
                    | StatusCode::GATEWAY_TIMEOUT
            ),
            ClientError::Transport { .. } => true,
            ClientError::Decode { .. } => false,
        }
    }

    /// The HTTP status, when the node answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::Transport { .. } | ClientError::Decode { .. } => None,
        }
    }

    /// A short label from a small fixed set, for counting errors by kind: the status code
    /// (`"429"`, `"503"`), `"timeout"`, `"connect"`, `"transport"` or `"decode"`.
    pub fn label(&self) -> String {
        match self {
            ClientError::Api { status, .. } => status.as_u16().to_string(),
            ClientError::Transport { cause, .. } if cause.is_timeout() => "timeout".to_owned(),
            ClientError::Transport { cause, .. } if cause.is_connect() => "connect".to_owned(),
            ClientError::Transport { .. } => "transport".to_owned(),
            ClientError::Decode { .. } => "decode".to_owned(),
        }
    }

    /// How long the node asked us to wait before retrying, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Api { retry_after, .. } => *retry_after,
            ClientError::Transport { .. } | ClientError::Decode { .. } => None,
        }
    }
}

/// `reqwest`'s own message only repeats the URL ("error sending request for url (...)"); the
/// useful part ("tcp connect error: Connection refused") is in its source chain.
fn describe(error: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source = error.source();
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
