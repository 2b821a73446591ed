//! Errors of the cluster crate.

use sift_storage::StorageError;
use thiserror::Error;

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum ClusterError {
    /// The op was applied and refused by the state machine (not found, conflict, ...).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The proposal could not be committed; retrying may succeed.
    #[error("proposal dropped: {0}")]
    Dropped(String),
}

impl ClusterError {
    pub fn is_transient(&self) -> bool {
        match self {
            ClusterError::Storage(error) => error.is_transient(),
            ClusterError::Dropped(_) => true,
        }
    }
}
