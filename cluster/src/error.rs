//! Errors of the cluster crate.

use sift_storage::StorageError;
use thiserror::Error;

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum ClusterError {
    /// The op was applied and refused by the state machine (not found, conflict, ...), or the
    /// local store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The proposal could not be committed, or its fate is unknown (leadership changed while it
    /// was in flight); retrying with the same op id is safe and may succeed.
    #[error("proposal dropped: {0}")]
    Dropped(String),
    /// This node is not the leader; `leader` is the one it knows of, if any.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    /// The Raft thread of this node has stopped.
    #[error("raft stopped")]
    Stopped,
    /// A request that can never succeed as given (bad conf change, bad snapshot, ...).
    #[error("invalid: {0}")]
    Invalid(String),
    /// Sending to or receiving from a peer failed.
    #[error("transport: {0}")]
    Transport(String),
    /// A peer request without the right cluster secret.
    #[error("unauthorized peer request")]
    Unauthorized,
}

impl ClusterError {
    pub fn is_transient(&self) -> bool {
        match self {
            ClusterError::Storage(error) => error.is_transient(),
            ClusterError::Dropped(_)
            | ClusterError::NotLeader { .. }
            | ClusterError::Stopped
            | ClusterError::Transport(_) => true,
            ClusterError::Invalid(_) | ClusterError::Unauthorized => false,
        }
    }
}
