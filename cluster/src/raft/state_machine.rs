//! What committed Raft entries are applied to.

use serde::{Deserialize, Serialize};
use sift_storage::meta::{MetaOp, MetaOutcome, MetaStateMachine, SledMetaStore};

use crate::error::{ClusterError, Result};

/// A metadata op as it travels in a Raft entry: with an id chosen by the proposer, so a client
/// that retries after an unknown outcome (its leader died) cannot apply the op twice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub op_id: String,
    pub op: MetaOp,
}

impl Proposal {
    /// A proposal with a fresh, unique op id.
    pub fn new(op: MetaOp) -> Self {
        Proposal {
            op_id: uuid::Uuid::now_v7().to_string(),
            op,
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .map_err(|error| ClusterError::Invalid(format!("encode proposal: {error}")))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let (proposal, _) =
            bincode::serde::decode_from_slice(bytes, bincode::config::standard())
                .map_err(|error| ClusterError::Invalid(format!("decode proposal: {error}")))?;
        Ok(proposal)
    }
}

/// The replicated state machine: applies committed proposals in log order and moves as a whole
/// in snapshots. Implemented by the metadata store; tests drive the same implementation.
pub trait RaftStateMachine: Send + Sync + 'static {
    /// Applies `proposal` committed at `index`; at or below [`Self::applied_index`] it is a
    /// replay and changes nothing. Need not be durable on return, but the effects and the
    /// applied index must persist atomically and in order with the Raft storage's writes (the
    /// metadata store shares the Raft storage's sled database, so any flush covers both).
    fn apply(&self, index: u64, proposal: &Proposal) -> sift_storage::Result<MetaOutcome>;
    /// Makes everything applied durable (before the log is compacted past it).
    fn flush(&self) -> sift_storage::Result<()>;
    /// The last index applied (only entries carrying proposals move it).
    fn applied_index(&self) -> u64;
    /// The whole state, deterministic: equal states export equal bytes.
    fn export(&self) -> sift_storage::Result<Vec<u8>>;
    /// Replaces the whole state with an export, applied up to `index`.
    fn import(&self, index: u64, bytes: &[u8]) -> sift_storage::Result<()>;
}

impl RaftStateMachine for SledMetaStore {
    fn apply(&self, index: u64, proposal: &Proposal) -> sift_storage::Result<MetaOutcome> {
        self.apply_with_id(index, &proposal.op_id, &proposal.op)
    }

    fn flush(&self) -> sift_storage::Result<()> {
        SledMetaStore::flush(self)
    }

    fn applied_index(&self) -> u64 {
        MetaStateMachine::applied_index(self)
    }

    fn export(&self) -> sift_storage::Result<Vec<u8>> {
        self.export_state()
    }

    fn import(&self, index: u64, bytes: &[u8]) -> sift_storage::Result<()> {
        self.import_state(index, bytes)
    }
}
