//! The metadata state machine.
//!
//! Every metadata change is a [`MetaOp`]: a plain serialisable value. [`SledMetaStore`] applies
//! ops deterministically — the outcome depends only on the op and the state before it — so the
//! same log of ops yields the same state on every node. In a cluster the log is Raft's:
//! `sift_cluster::raft` commits each op on a quorum through raft-rs and applies the committed
//! entries here in log order, several at a time ([`SledMetaStore::apply_batch_with_ids`]). A
//! single node applies each op directly through `sift_cluster::LocalMeta`
//! ([`MetaStateMachine::apply`]).
//!
//! The contract of applying:
//! - An op is applied at a log index. An index at or below the applied index is a replay and
//!   changes nothing; an op that is refused (an error outcome) changes nothing but consumes its
//!   index, since every node refuses it alike.
//! - The effects of an op, or of a run of committed ops, and the new applied index are one
//!   atomic sled batch: after a crash the store is at some index, never between two.
//! - [`MetaStateMachine::apply`] flushes before it returns the outcome. The Raft path does not:
//!   the Raft log is the durable record, and the driver calls [`SledMetaStore::flush`] before
//!   it compacts the log.
//! - An op proposed with an op id is applied once: a retry of the id within
//!   [`OP_ID_WINDOW`] log entries returns the first outcome.
//!
//! One sled tree (`meta`) holds the state, keys prefixed by kind, values JSON; the layout is
//! the table in `keys.rs`. The code is split by concern: the stored records (`records.rs`),
//! ops and outcomes (`ops.rs`), keys (`keys.rs`), the in-memory overlay of a batch
//! (`pending.rs`), what each op does (`apply.rs`, `sessions.rs` for chat sessions, `api_keys.rs`, `tenants.rs`, `audit.rs`), applying
//! log entries and op ids (`log.rs`), snapshots (`snapshot.rs`) and read queries (`read.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Result, StorageError};

mod api_keys;
mod apply;
mod audit;
mod keys;
mod log;
mod ops;
mod pending;
mod read;
mod records;
mod sessions;
mod snapshot;
mod tenants;

pub use api_keys::{ApiKeyFields, ApiKeyRecord, DEFAULT_TENANT, Role};
pub use audit::AuditEntry;
pub use log::{LoggedOp, MetaStateMachine, OP_ID_WINDOW};
pub use ops::{MetaOp, MetaOutcome, Registered, StatusUpdate};
pub use read::{DocumentCounts, KbUsage, PendingDocument, ReadableDocuments};
pub use records::{
    DocSource, DocStatus, DocumentRecord, KbRecord, KbSettings, PendingWork, Replica, ReplicaState,
    RetrievalSettings, ShardPlacement, Tombstone,
};
pub use sessions::{SessionRecord, StoredTurn, TurnCitation, TurnTraceStep, TurnUsage};
pub use snapshot::{NOT_IN_SNAPSHOT, RestorePlan, RestoreSummary};
pub use tenants::{KbAccess, TenantDeleted, TenantRecord};

use keys::{DOC_PREFIX, PENDING_INDEX_KEY, pending_key, shard_bytes_key};

/// The metadata state machine over one sled tree.
pub struct SledMetaStore {
    db: sled::Db,
    tree: sled::Tree,
    /// Serialises appliers: apply is read-modify-write over several keys.
    apply_lock: Mutex<()>,
}

/// sled's page cache for the metadata database (its default is 1 GiB). The database also
/// holds the Raft log, the embedding cache and bulk documents' raw texts: a large ingestion
/// fills it with vectors and texts that are read again seldom.
const META_CACHE_BYTES: u64 = 128 * 1024 * 1024;

impl SledMetaStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let db = crate::sled_db::open(
            &sled::Config::new()
                .path(dir)
                .cache_capacity(META_CACHE_BYTES),
        )?;
        let tree = db.open_tree("meta")?;
        let store = SledMetaStore {
            db,
            tree,
            apply_lock: Mutex::new(()),
        };
        store.build_pending_index()?;
        Ok(store)
    }

    /// The underlying database, for node-local trees that are not metadata (raw texts, caches).
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Builds the derived indexes of a store written before they existed: the pending-work
    /// index (every unfinished document, worker 0) and the bytes of every shard.
    /// Deterministic, so every node of a cluster builds the same keys.
    fn build_pending_index(&self) -> Result<()> {
        if self.tree.contains_key(PENDING_INDEX_KEY)? {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        let mut bytes: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for item in self.tree.scan_prefix(DOC_PREFIX) {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            *bytes
                .entry(shard_bytes_key(&doc.kb_id, doc.shard))
                .or_default() += doc.size_bytes;
            if !doc.status.is_terminal() {
                let work = PendingWork {
                    worker: 0,
                    shard: doc.shard,
                    attempts: 0,
                };
                batch.insert(pending_key(&doc.kb_id, &doc.id), encode(&work)?);
            }
        }
        for (key, total) in bytes {
            batch.insert(key, encode(&total)?);
        }
        batch.insert(PENDING_INDEX_KEY, b"1".as_slice());
        self.tree.apply_batch(batch)?;
        self.tree.flush()?;
        Ok(())
    }
}

/// A stored value (JSON).
fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|error| StorageError::Corrupt(error.to_string()))
}

/// A stored value back; bytes that do not decode are a corrupt store.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|error| StorageError::Corrupt(error.to_string()))
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
