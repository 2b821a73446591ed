//! Errors of the storage crate.

use thiserror::Error;

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum StorageError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("tantivy: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("vector has dimension {actual}, the shard expects {expected}")]
    DimensionMismatch { expected: usize, actual: usize },
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// The data directory's format is not one this build reads (see [`crate::data_dir`]).
    #[error("data directory: {0}")]
    DataDir(String),
}

impl StorageError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::Sled(_) | StorageError::Io(_) | StorageError::Tantivy(_) => true,
            StorageError::Corrupt(_)
            | StorageError::DimensionMismatch { .. }
            | StorageError::NotFound(_)
            | StorageError::Conflict(_)
            | StorageError::Invalid(_)
            | StorageError::DataDir(_) => false,
        }
    }
}
