//! Why a shard operation failed, typed so that callers can tell a failure worth retrying
//! (a replica restarting, a peer slow or away, a quorum short for now) from one that will not
//! change (the KB is gone, a replica refused the request, a reply that makes no sense).

use std::time::Duration;

use thiserror::Error;

use crate::error::SiftError;

#[derive(Clone, Debug, Error)]
pub enum ShardError {
    /// No replica of the shard can take the request now (none active, none placed).
    #[error("no active replica of shard {shard}")]
    NoReplica { shard: u32 },
    /// This node's replica is not open (not placed here, or being restarted).
    #[error("shard {shard} is not running on this node")]
    NotRunning { shard: u32 },
    /// The replica stopped before it answered (it failed; its supervisor restarts it).
    #[error("the shard replica stopped before answering")]
    Stopped,
    /// No answer within the time allowed.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The request did not reach the peer, or its answer did not come back.
    #[error("node {node}: {reason}")]
    Unreachable { node: u64, reason: String },
    /// The peer answered with an HTTP error status (a wrong secret, an overloaded port).
    #[error("node {node} answered {status}: {body}")]
    Status {
        node: u64,
        status: u16,
        body: String,
    },
    /// The replica ran the request and refused it; `code` is its error code.
    #[error("{code}: {message}")]
    Replica {
        code: String,
        message: String,
        transient: bool,
    },
    /// A reply that does not fit the request, or one that cannot be decoded.
    #[error("{0}")]
    Protocol(String),
    /// The knowledge base was deleted while the operation ran.
    #[error("the knowledge base was deleted")]
    KbDeleted,
    /// The metadata could not be read or changed (a dead mark, a re-read of the placement).
    #[error("metadata: {message}")]
    Metadata { message: String, transient: bool },
    /// Too few replicas stored a write.
    #[error("{0}")]
    Quorum(String),
    /// Every replica tried failed: each one's node and reason.
    #[error("{}", describe_each(.0))]
    Replicas(Vec<(u64, ShardError)>),
}

/// Replica error codes that say "try again later".
const TRANSIENT_CODES: [&str; 5] = [
    "shard_unavailable",
    "unavailable",
    "not_leader",
    "queue_full",
    "not_running",
];

impl ShardError {
    /// Whether the same operation may succeed later, without anyone changing the request.
    pub fn is_transient(&self) -> bool {
        match self {
            ShardError::NoReplica { .. }
            | ShardError::NotRunning { .. }
            | ShardError::Stopped
            | ShardError::Timeout(_)
            | ShardError::Unreachable { .. }
            | ShardError::Quorum(_) => true,
            ShardError::Status { status, .. } => *status == 429 || *status >= 500,
            ShardError::Replica { transient, .. } | ShardError::Metadata { transient, .. } => {
                *transient
            }
            ShardError::Protocol(_) | ShardError::KbDeleted => false,
            ShardError::Replicas(failures) => {
                failures.iter().any(|(_, failure)| failure.is_transient())
            }
        }
    }

    /// The replica's refusal of a request, from the error it returned.
    pub fn from_replica(error: &SiftError) -> ShardError {
        ShardError::Replica {
            code: error.code().to_string(),
            message: error.to_string(),
            transient: error.is_transient(),
        }
    }

    /// A remote replica's refusal (`ShardReply::Failed`).
    pub fn refused(code: String, message: String) -> ShardError {
        let transient = TRANSIENT_CODES.contains(&code.as_str());
        ShardError::Replica {
            code,
            message,
            transient,
        }
    }

    /// The replica does not hold what was asked for.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ShardError::Replica { code, .. } if code == "not_found" || code == "document_not_found")
    }

    /// The metadata failure behind a dead mark or a placement re-read.
    pub fn metadata(error: &SiftError) -> ShardError {
        ShardError::Metadata {
            message: error.to_string(),
            transient: error.is_transient(),
        }
    }
}

fn describe_each(failures: &[(u64, ShardError)]) -> String {
    failures
        .iter()
        .map(|(node, failure)| format!("replica on node {node}: {failure}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_failures_are_the_ones_a_retry_can_fix() {
        let transient = [
            ShardError::NoReplica { shard: 0 },
            ShardError::NotRunning { shard: 1 },
            ShardError::Stopped,
            ShardError::Timeout(Duration::from_millis(5)),
            ShardError::Unreachable {
                node: 2,
                reason: "refused".into(),
            },
            ShardError::Status {
                node: 2,
                status: 503,
                body: String::new(),
            },
            ShardError::refused("shard_unavailable".into(), "restarting".into()),
            ShardError::Quorum("1 of 2".into()),
            ShardError::Replicas(vec![
                (2, ShardError::KbDeleted),
                (3, ShardError::Timeout(Duration::from_secs(1))),
            ]),
        ];
        for error in transient {
            assert!(error.is_transient(), "{error}");
        }
        let permanent = [
            ShardError::KbDeleted,
            ShardError::Protocol("unexpected reply".into()),
            ShardError::Status {
                node: 2,
                status: 401,
                body: "wrong secret".into(),
            },
            ShardError::refused("not_found".into(), "document x".into()),
            ShardError::from_replica(&SiftError::invalid("bad", "no")),
            ShardError::Replicas(vec![(2, ShardError::KbDeleted)]),
        ];
        for error in permanent {
            assert!(!error.is_transient(), "{error}");
        }
    }

    #[test]
    fn several_failures_name_each_replica() {
        let error = ShardError::Replicas(vec![
            (2, ShardError::Stopped),
            (3, ShardError::Timeout(Duration::from_millis(40))),
        ]);
        assert_eq!(
            error.to_string(),
            "replica on node 2: the shard replica stopped before answering; \
             replica on node 3: no answer within 40 ms"
        );
        assert!(
            ShardError::from_replica(&SiftError::Storage(sift_storage::StorageError::NotFound(
                "document d".into()
            )))
            .is_not_found()
        );
    }
}
