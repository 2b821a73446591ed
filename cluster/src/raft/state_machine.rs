//! What committed Raft entries are applied to.

use serde::{Deserialize, Serialize};
use sift_storage::meta::{LoggedOp, MetaOp, MetaOutcome, MetaStateMachine, SledMetaStore};

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
    /// Applies proposals committed at consecutive indexes, in order, and returns one outcome
    /// each; an index at or below [`Self::applied_index`] is a replay and changes nothing.
    /// Need not be durable on return, but the effects and the applied index must persist
    /// atomically and in order with the Raft storage's writes (the metadata store shares the
    /// Raft storage's sled database, so any flush covers both). A transient storage error ends
    /// the batch: it is the last outcome returned, and that proposal and those after it are
    /// not applied.
    fn apply(
        &self,
        committed: &[(u64, &Proposal)],
    ) -> sift_storage::Result<Vec<sift_storage::Result<MetaOutcome>>>;
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
    fn apply(
        &self,
        committed: &[(u64, &Proposal)],
    ) -> sift_storage::Result<Vec<sift_storage::Result<MetaOutcome>>> {
        let ops: Vec<LoggedOp<'_>> = committed
            .iter()
            .map(|(index, proposal)| LoggedOp {
                index: *index,
                op_id: Some(&proposal.op_id),
                op: &proposal.op,
            })
            .collect();
        self.apply_batch_with_ids(&ops, false)
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
