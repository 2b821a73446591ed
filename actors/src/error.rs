//! Errors of node operations, each with a stable machine-readable code and a neutral
//! [`ErrorKind`]. The actors know nothing of HTTP: the `node` crate maps the kind to a status
//! and renders `{ "error": { "code", "message" } }` in one place.

use sift_cluster::ClusterError;
use sift_storage::StorageError;
use thiserror::Error;

use crate::ingest::parse::ParseError;
use sift_models::embedding::EmbeddingError;
use sift_models::ocr::OcrError;

pub type Result<T, E = SiftError> = std::result::Result<T, E>;

/// What went wrong, as a caller can act on it; each transport maps it to its own answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The named thing does not exist.
    NotFound,
    /// The request is malformed or breaks a documented rule.
    Invalid,
    /// The request collides with the current state (a name taken, a change under way).
    Conflict,
    /// The caller may see the thing but not do this to it (a KB shared read-only).
    Forbidden,
    /// Well-formed but unusable content (an empty document, a file that does not parse).
    Unprocessable,
    /// The content is of a type the node cannot read.
    UnsupportedType,
    /// Over a documented size limit.
    TooLarge,
    /// The node is at capacity now; retry later ([`SiftError::retry_after_secs`]).
    Overloaded,
    /// A service the node depends on (a model server) failed.
    Upstream,
    /// Part of the cluster cannot serve now (no leader, a shard without a live replica).
    Unavailable,
    /// The node's disk cannot hold what the request writes (a snapshot).
    InsufficientStorage,
    /// A fault of the node itself.
    Internal,
}

#[derive(Debug, Error)]
pub enum SiftError {
    #[error("{what} not found")]
    NotFound { code: &'static str, what: String },
    #[error("{message}")]
    Invalid { code: &'static str, message: String },
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// The caller may see the thing but not change it (403).
    #[error("{message}")]
    Forbidden { code: &'static str, message: String },
    /// Well-formed but unusable content (an empty document, ...): 422 like a bad upload.
    #[error("{message}")]
    Unprocessable { code: &'static str, message: String },
    #[error("{message}")]
    TooLarge { message: String },
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("the ingestion queue is full; retry after {retry_after_secs} s")]
    QueueFull { retry_after_secs: u64 },
    #[error("embedding failed: {0}")]
    Embedding(#[from] EmbeddingError),
    #[error("text recognition (OCR) failed: {0}")]
    Ocr(#[from] OcrError),
    #[error("shard {shard} of knowledge base {kb_id} is unavailable: {reason}")]
    ShardUnavailable {
        kb_id: String,
        shard: u32,
        reason: String,
    },
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("metadata: {0}")]
    Meta(#[from] ClusterError),
    #[error("internal: {0}")]
    Internal(String),
    /// The caller's key has as many runs in flight as it may (429).
    #[error("this API key already has {limit} agent runs in flight; retry when one ends")]
    TooManyRuns { limit: usize },
    /// A question longer than the documented limit (413).
    #[error("the question is longer than {max_chars} characters")]
    QuestionTooLong { max_chars: usize },
    /// The disk is full for what the request writes (507).
    #[error("{message}")]
    InsufficientStorage { message: String },
}

impl SiftError {
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        SiftError::Invalid {
            code,
            message: message.into(),
        }
    }

    pub fn kb_not_found(kb: &str) -> Self {
        SiftError::NotFound {
            code: "kb_not_found",
            what: format!("knowledge base {kb:?}"),
        }
    }

    pub fn document_not_found(document: &str) -> Self {
        SiftError::NotFound {
            code: "document_not_found",
            what: format!("document {document:?}"),
        }
    }

    /// A stable snake_case code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            SiftError::NotFound { code, .. }
            | SiftError::Invalid { code, .. }
            | SiftError::Conflict { code, .. }
            | SiftError::Forbidden { code, .. }
            | SiftError::Unprocessable { code, .. } => code,
            SiftError::TooLarge { .. } => "payload_too_large",
            SiftError::Parse(error) => error.code(),
            SiftError::QueueFull { .. } => "queue_full",
            SiftError::TooManyRuns { .. } => "too_many_runs",
            SiftError::Embedding(EmbeddingError::DimensionMismatch { .. }) => "dimension_mismatch",
            SiftError::Embedding(_) => "embedding_failed",
            SiftError::Ocr(OcrError::Unavailable(_)) => "ocr_unavailable",
            SiftError::Ocr(_) => "ocr_failed",
            SiftError::ShardUnavailable { .. } => "shard_unavailable",
            SiftError::Storage(StorageError::NotFound(_)) => "not_found",
            SiftError::Storage(StorageError::Conflict(_)) => "conflict",
            SiftError::Storage(_) => "storage_error",
            SiftError::Meta(ClusterError::Storage(StorageError::NotFound(_))) => "not_found",
            SiftError::Meta(ClusterError::Storage(StorageError::Conflict(_))) => "conflict",
            SiftError::Meta(ClusterError::NotLeader { .. }) => "not_leader",
            SiftError::Meta(
                ClusterError::Dropped(_) | ClusterError::Stopped | ClusterError::Transport(_),
            ) => "unavailable",
            SiftError::Meta(_) => "metadata_error",
            SiftError::Internal(_) => "internal",
            SiftError::QuestionTooLong { .. } => "question_too_long",
            SiftError::InsufficientStorage { .. } => "insufficient_storage",
        }
    }

    /// The neutral kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SiftError::NotFound { .. } => ErrorKind::NotFound,
            SiftError::Invalid { .. } => ErrorKind::Invalid,
            SiftError::Conflict { .. } => ErrorKind::Conflict,
            SiftError::Forbidden { .. } => ErrorKind::Forbidden,
            SiftError::Unprocessable { .. } => ErrorKind::Unprocessable,
            SiftError::TooLarge { .. } | SiftError::QuestionTooLong { .. } => ErrorKind::TooLarge,
            SiftError::Parse(ParseError::UnsupportedType(_)) => ErrorKind::UnsupportedType,
            SiftError::Parse(_) => ErrorKind::Unprocessable,
            SiftError::QueueFull { .. } | SiftError::TooManyRuns { .. } => ErrorKind::Overloaded,
            SiftError::Embedding(_) => ErrorKind::Upstream,
            SiftError::Ocr(OcrError::Unavailable(_)) => ErrorKind::Unprocessable,
            SiftError::Ocr(_) => ErrorKind::Upstream,
            SiftError::ShardUnavailable { .. } => ErrorKind::Unavailable,
            SiftError::Storage(StorageError::NotFound(_))
            | SiftError::Meta(ClusterError::Storage(StorageError::NotFound(_))) => {
                ErrorKind::NotFound
            }
            SiftError::Storage(StorageError::Conflict(_))
            | SiftError::Meta(ClusterError::Storage(StorageError::Conflict(_))) => {
                ErrorKind::Conflict
            }
            // Retryable: no leader yet, leadership changed, the leader unreachable.
            SiftError::Meta(
                ClusterError::NotLeader { .. }
                | ClusterError::Dropped(_)
                | ClusterError::Stopped
                | ClusterError::Transport(_),
            ) => ErrorKind::Unavailable,
            SiftError::Meta(ClusterError::Invalid(_)) => ErrorKind::Invalid,
            SiftError::Storage(_) | SiftError::Meta(_) | SiftError::Internal(_) => {
                ErrorKind::Internal
            }
            SiftError::InsufficientStorage { .. } => ErrorKind::InsufficientStorage,
        }
    }

    /// How long a caller should wait before retrying, when the node knows.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            SiftError::QueueFull { retry_after_secs } => Some(*retry_after_secs),
            SiftError::TooManyRuns { .. } => Some(1),
            SiftError::Meta(cluster) if cluster.is_transient() => Some(1),
            _ => None,
        }
    }

    /// Whether the same request may succeed later.
    pub fn is_transient(&self) -> bool {
        match self {
            SiftError::QueueFull { .. }
            | SiftError::ShardUnavailable { .. }
            | SiftError::TooManyRuns { .. }
            | SiftError::InsufficientStorage { .. } => true,
            SiftError::Embedding(error) => error.is_transient(),
            SiftError::Ocr(error) => error.is_transient(),
            SiftError::Storage(error) => error.is_transient(),
            SiftError::Meta(error) => error.is_transient(),
            SiftError::NotFound { .. }
            | SiftError::Invalid { .. }
            | SiftError::Conflict { .. }
            | SiftError::Forbidden { .. }
            | SiftError::Unprocessable { .. }
            | SiftError::TooLarge { .. }
            | SiftError::Parse(_)
            | SiftError::QuestionTooLong { .. }
            | SiftError::Internal(_) => false,
        }
    }
}

/// The message of a caught panic's payload, when it carried one (`panic!` with a string).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_unavailability_is_retryable_and_unavailable() {
        let cases = [
            (ClusterError::NotLeader { leader: Some(2) }, "not_leader"),
            (ClusterError::NotLeader { leader: None }, "not_leader"),
            (
                ClusterError::Dropped("leader changed".into()),
                "unavailable",
            ),
            (ClusterError::Stopped, "unavailable"),
            (ClusterError::Transport("refused".into()), "unavailable"),
        ];
        for (error, code) in cases {
            let error = SiftError::Meta(error);
            assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
            assert_eq!(error.code(), code, "{error}");
            assert!(error.is_transient(), "{error}");
            assert_eq!(error.retry_after_secs(), Some(1), "{error}");
        }
        let refused = SiftError::Meta(ClusterError::Invalid("bad conf change".into()));
        assert_eq!(refused.kind(), ErrorKind::Invalid);
        assert!(!refused.is_transient());
        let unauthorized = SiftError::Meta(ClusterError::Unauthorized);
        assert_eq!(unauthorized.kind(), ErrorKind::Internal);
    }
}
