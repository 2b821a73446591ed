//! Errors of talking to a Sift node over HTTP: those of [`sift_client`], plus the labels the
//! load report counts them by.

pub use sift_client::Error as ClientError;

pub type Result<T> = std::result::Result<T, ClientError>;

/// A short label from a small fixed set, for counting errors by kind: the status code
/// (`"429"`, `"503"`), `"timeout"`, `"connect"`, `"transport"` or `"decode"`.
pub fn label(error: &ClientError) -> String {
    match error {
        ClientError::Api { error, .. } => error.status.as_u16().to_string(),
        ClientError::Transport { cause, .. } if cause.is_timeout() => "timeout".to_owned(),
        ClientError::Transport { cause, .. } if cause.is_connect() => "connect".to_owned(),
        ClientError::Transport { .. } => "transport".to_owned(),
        ClientError::Decode { .. } | ClientError::Stream { .. } => "decode".to_owned(),
    }
}
