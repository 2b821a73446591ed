//! The Raft log and Raft state of one node, in one sled tree.
//!
//! [`SledRaftStorage`] implements [`raft::Storage`] (the reads raft-rs makes) and the writes the
//! driver makes while handling a `Ready`: [`append`](SledRaftStorage::append) (conflicting tail
//! truncated and new entries inserted in one atomic batch, then flushed),
//! [`set_hard_state`](SledRaftStorage::set_hard_state), [`set_commit`](SledRaftStorage::set_commit),
//! [`apply_snapshot`](SledRaftStorage::apply_snapshot),
//! [`compact_log`](SledRaftStorage::compact_log) (what the driver compacts with: no snapshot
//! stored, the state machine is the snapshot) and
//! [`compact_to_snapshot`](SledRaftStorage::compact_to_snapshot). Snapshots for followers are
//! built on demand and served from memory ([`offer_snapshot`](SledRaftStorage::offer_snapshot)).
//!
//! Everything lives in one tree so every change is one atomic sled batch:
//!
//! | key | value |
//! |---|---|
//! | `e` + index (u64 big-endian) | [`Entry`] (protobuf) |
//! | `s/hard_state` | [`HardState`] (protobuf) |
//! | `s/conf_state` | [`ConfState`] (protobuf) |
//! | `s/truncated` | index and term (2 x u64 BE) of the last entry removed from the log |
//! | `s/snapshot_meta` | [`SnapshotMetadata`] (protobuf) of the latest stored snapshot (bootstrap or received) |
//! | `s/snapshot_data` | the state machine's bytes at that snapshot |
//! | `s/applied` | the last log index applied (u64 BE); conf changes flush it |
//! | `s/node_id` | this node's Raft id (u64 BE) |
//! | `s/peers` | JSON map id -> [`PeerAddress`] |
//!
//! Only bytes this node wrote itself are decoded here: protobuf bytes from peers are decoded by
//! the transport after authentication.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage};
use serde::{Deserialize, Serialize};

use crate::error::{ClusterError, Result};

const HARD_STATE: &[u8] = b"s/hard_state";
const CONF_STATE: &[u8] = b"s/conf_state";
const TRUNCATED: &[u8] = b"s/truncated";
const SNAPSHOT_META: &[u8] = b"s/snapshot_meta";
const SNAPSHOT_DATA: &[u8] = b"s/snapshot_data";
const APPLIED: &[u8] = b"s/applied";
const NODE_ID: &[u8] = b"s/node_id";
const PEERS: &[u8] = b"s/peers";

/// Where a member of the cluster listens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerAddress {
    /// The internal (Raft transport) address, `host:port`.
    pub internal: String,
    /// The public API address, `host:port`.
    pub public: String,
    /// The node was removed from the cluster; its id is never given out again.
    #[serde(default)]
    pub removed: bool,
}

fn entry_key(index: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = b'e';
    key[1..].copy_from_slice(&index.to_be_bytes());
    key
}

fn index_of(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&key[1..9]);
    u64::from_be_bytes(bytes)
}

fn u64_of(bytes: &[u8]) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(array)
}

fn other(error: impl std::error::Error + Send + Sync + 'static) -> raft::Error {
    raft::Error::Store(raft::StorageError::Other(Box::new(error)))
}

fn corrupt(what: &str, error: impl std::fmt::Display) -> ClusterError {
    ClusterError::Storage(sift_storage::StorageError::Corrupt(format!(
        "raft {what}: {error}"
    )))
}

/// The Raft log and state over one sled tree. Cheap to clone (sled trees are shared handles):
/// the driver owns one inside its `RawNode`, status readers may hold another.
#[derive(Clone)]
pub struct SledRaftStorage {
    db: sled::Db,
    tree: sled::Tree,
    /// Set when raft-rs asked for a snapshot newer than the stored one.
    snapshot_wanted: Arc<AtomicBool>,
    /// A snapshot built on demand for a follower ([`Self::offer_snapshot`]), kept in memory:
    /// it is served before the stored one and never written to the tree.
    offered: Arc<Mutex<Option<Snapshot>>>,
}

impl SledRaftStorage {
    /// Opens (or creates) the Raft tree `raft` in `db`. The metadata store's database may be
    /// shared: the trees are independent.
    pub fn open(db: &sled::Db) -> Result<Self> {
        let tree = db
            .open_tree("raft")
            .map_err(sift_storage::StorageError::from)?;
        Ok(SledRaftStorage {
            db: db.clone(),
            tree,
            snapshot_wanted: Arc::new(AtomicBool::new(false)),
            offered: Arc::new(Mutex::new(None)),
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>> {
        Ok(self
            .tree
            .get(key)
            .map_err(sift_storage::StorageError::from)?)
    }

    fn write(&self, batch: sled::Batch, flush: bool) -> Result<()> {
        self.tree
            .apply_batch(batch)
            .map_err(sift_storage::StorageError::from)?;
        if flush {
            self.db.flush().map_err(sift_storage::StorageError::from)?;
        }
        Ok(())
    }

    fn get_proto<M: protobuf::Message>(&self, key: &[u8]) -> Result<Option<M>> {
        match self.get(key)? {
            Some(bytes) => Ok(Some(
                M::parse_from_bytes(&bytes).map_err(|error| corrupt("record", error))?,
            )),
            None => Ok(None),
        }
    }

    fn encode<M: protobuf::Message>(message: &M) -> Result<Vec<u8>> {
        message
            .write_to_bytes()
            .map_err(|error| corrupt("encode", error))
    }

    /// Whether this storage holds a cluster membership (it was bootstrapped, joined or restored).
    pub fn is_initialized(&self) -> Result<bool> {
        let conf_state = self.conf_state()?;
        Ok(!conf_state.voters.is_empty() || !conf_state.learners.is_empty())
    }

    /// Makes a brand new storage the start of a cluster whose members are `conf_state`, with the
    /// state machine already at `index` (0 for a new one; an existing single-node store keeps
    /// its state: it becomes the first snapshot). Refused if the storage is not empty.
    pub fn bootstrap(&self, conf_state: ConfState, index: u64, state: Vec<u8>) -> Result<()> {
        if self.is_initialized()? || self.last_index_inner()? > 0 {
            return Err(ClusterError::Invalid(
                "raft storage is already initialised".into(),
            ));
        }
        let term = if index > 0 { 1 } else { 0 };
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(conf_state.clone());
        let hard_state = HardState {
            term,
            commit: index,
            ..Default::default()
        };
        let mut batch = sled::Batch::default();
        batch.insert(CONF_STATE, Self::encode(&conf_state)?);
        batch.insert(HARD_STATE, Self::encode(&hard_state)?);
        batch.insert(SNAPSHOT_META, Self::encode(&meta)?);
        batch.insert(SNAPSHOT_DATA, state);
        batch.insert(TRUNCATED, truncated_bytes(index, term).to_vec());
        batch.insert(APPLIED, &index.to_be_bytes());
        self.write(batch, true)
    }

    pub fn hard_state(&self) -> Result<HardState> {
        Ok(self.get_proto(HARD_STATE)?.unwrap_or_default())
    }

    pub fn conf_state(&self) -> Result<ConfState> {
        Ok(self.get_proto(CONF_STATE)?.unwrap_or_default())
    }

    /// Index and term of the last entry removed from the log (0, 0 when none was).
    fn truncated(&self) -> Result<(u64, u64)> {
        Ok(match self.get(TRUNCATED)? {
            Some(bytes) if bytes.len() == 16 => (u64_of(&bytes[..8]), u64_of(&bytes[8..])),
            _ => (0, 0),
        })
    }

    fn last_index_inner(&self) -> Result<u64> {
        let last = self
            .tree
            .range(entry_key(0)..=entry_key(u64::MAX))
            .next_back()
            .transpose()
            .map_err(sift_storage::StorageError::from)?;
        match last {
            Some((key, _)) => Ok(index_of(&key)),
            None => Ok(self.truncated()?.0),
        }
    }

    fn entry(&self, index: u64) -> Result<Option<Entry>> {
        self.get_proto(&entry_key(index))
    }

    /// Appends `entries` (consecutive indexes): entries at and after the first new index are
    /// replaced (a new leader overwrote our uncommitted tail), all in one atomic batch, then
    /// flushed.
    ///
    /// # Panics
    /// If the first entry is below the first index (it would overwrite compacted entries) or
    /// leaves a gap after the last index: raft-rs never asks for either.
    pub fn append(&self, entries: &[Entry]) -> Result<()> {
        self.persist(entries, None)
    }

    /// [`Self::append`] and [`Self::set_hard_state`] in one atomic batch and one flush (what a
    /// `Ready` persists). Nothing to write, nothing flushed. A hard state whose term and vote
    /// are unchanged (only the commit index moved) with no entries is written but not flushed,
    /// as etcd's raft does: a commit index lost in a crash is learned again from the leader,
    /// and one behind the applied index is repaired at start.
    pub fn persist(&self, entries: &[Entry], hard_state: Option<&HardState>) -> Result<()> {
        let mut batch = sled::Batch::default();
        let mut must_sync = !entries.is_empty();
        if let Some(hard_state) = hard_state {
            let stored = self.hard_state()?;
            must_sync |= stored.term != hard_state.term || stored.vote != hard_state.vote;
            batch.insert(HARD_STATE, Self::encode(hard_state)?);
        }
        let Some(first) = entries.first() else {
            if hard_state.is_none() {
                return Ok(());
            }
            return self.write(batch, must_sync);
        };
        let (truncated, _) = self.truncated()?;
        let last = self.last_index_inner()?;
        assert!(
            first.index > truncated,
            "overwrite compacted raft logs, compacted: {truncated}, append: {}",
            first.index
        );
        assert!(
            first.index <= last + 1,
            "raft logs should be continuous, last index: {last}, new appended: {}",
            first.index
        );
        for item in self
            .tree
            .range(entry_key(first.index)..=entry_key(u64::MAX))
        {
            let (key, _) = item.map_err(sift_storage::StorageError::from)?;
            batch.remove(key);
        }
        for (offset, entry) in entries.iter().enumerate() {
            assert_eq!(
                entry.index,
                first.index + offset as u64,
                "entries not consecutive"
            );
            batch.insert(&entry_key(entry.index), Self::encode(entry)?);
        }
        self.write(batch, true)
    }

    /// Persists the hard state (term, vote, commit), flushed.
    pub fn set_hard_state(&self, hard_state: &HardState) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.insert(HARD_STATE, Self::encode(hard_state)?);
        self.write(batch, true)
    }

    /// Records a new commit index (from a `LightReady`). Not flushed (see [`Self::persist`]):
    /// the next flush makes it durable.
    pub fn set_commit(&self, commit: u64) -> Result<()> {
        let mut hard_state = self.hard_state()?;
        if hard_state.commit == commit {
            return Ok(());
        }
        hard_state.commit = commit;
        let mut batch = sled::Batch::default();
        batch.insert(HARD_STATE, Self::encode(&hard_state)?);
        self.write(batch, false)
    }

    /// The last applied index this storage knows of (see [`Self::set_applied`]).
    pub fn applied(&self) -> Result<u64> {
        Ok(self.get(APPLIED)?.map(|bytes| u64_of(&bytes)).unwrap_or(0))
    }

    /// Records that entries up to `index` are applied. Not flushed: after a crash a smaller
    /// value is read back and the entries after it are delivered again, which the state
    /// machine skips by its own applied index. Conf changes go through
    /// [`Self::set_conf_state`], which flushes.
    pub fn set_applied(&self, index: u64) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.insert(APPLIED, &index.to_be_bytes());
        self.write(batch, false)
    }

    /// Persists the membership after a conf change entry at `applied` was applied, flushed with
    /// the applied index so the change is never applied twice.
    pub fn set_conf_state(&self, conf_state: &ConfState, applied: u64) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.insert(CONF_STATE, Self::encode(conf_state)?);
        batch.insert(APPLIED, &applied.to_be_bytes());
        self.write(batch, true)
    }

    /// This node's persisted Raft id, if it has one.
    pub fn node_id(&self) -> Result<Option<u64>> {
        Ok(self.get(NODE_ID)?.map(|bytes| u64_of(&bytes)))
    }

    pub fn set_node_id(&self, id: u64) -> Result<()> {
        let mut batch = sled::Batch::default();
        batch.insert(NODE_ID, &id.to_be_bytes());
        self.write(batch, true)
    }

    /// Addresses of the members, as of the last applied conf change or snapshot.
    pub fn peers(&self) -> Result<BTreeMap<u64, PeerAddress>> {
        match self.get(PEERS)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|error| corrupt("peers", error)),
            None => Ok(BTreeMap::new()),
        }
    }

    pub fn set_peers(&self, peers: &BTreeMap<u64, PeerAddress>) -> Result<()> {
        let mut batch = sled::Batch::default();
        let bytes = serde_json::to_vec(peers).map_err(|error| corrupt("peers", error))?;
        batch.insert(PEERS, bytes);
        self.write(batch, true)
    }

    /// The latest stored snapshot (metadata and state machine bytes).
    pub fn stored_snapshot(&self) -> Result<Snapshot> {
        let mut snapshot = Snapshot::default();
        if let Some(meta) = self.get_proto::<SnapshotMetadata>(SNAPSHOT_META)? {
            snapshot.set_metadata(meta);
        }
        if let Some(data) = self.get(SNAPSHOT_DATA)? {
            snapshot.data = data.to_vec().into();
        }
        Ok(snapshot)
    }

    /// Whether raft-rs asked for a newer snapshot than the stored one since the last call.
    pub fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.swap(false, Ordering::AcqRel)
    }

    /// Stores a snapshot of the state machine taken at applied index `index` (`data` is the
    /// state machine's export), then removes log entries so that at most `keep` entries at or
    /// below `index` remain (slow followers may still catch up from the log). One batch, flushed.
    pub fn compact_to_snapshot(&self, index: u64, data: Vec<u8>, keep: u64) -> Result<()> {
        let (truncated, _) = self.truncated()?;
        let last = self.last_index_inner()?;
        if index <= truncated || index > last {
            return Err(ClusterError::Invalid(format!(
                "cannot snapshot at {index}: log holds {}..={last}",
                truncated + 1
            )));
        }
        let term = self.term_inner(index)?;
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.conf_state()?);
        let compact_to = index.saturating_sub(keep).max(truncated);
        let mut batch = sled::Batch::default();
        batch.insert(SNAPSHOT_META, Self::encode(&meta)?);
        batch.insert(SNAPSHOT_DATA, data);
        if compact_to > truncated {
            let compact_term = self.term_inner(compact_to)?;
            for item in self.tree.range(entry_key(0)..=entry_key(compact_to)) {
                let (key, _) = item.map_err(sift_storage::StorageError::from)?;
                batch.remove(key);
            }
            batch.insert(
                TRUNCATED,
                truncated_bytes(compact_to, compact_term).to_vec(),
            );
        }
        self.write(batch, true)
    }

    /// Removes the log entries up to `to`, at most `max_entries` of them (the oldest), without
    /// storing a snapshot: the state machine must already be durable up to `to` (it is the
    /// snapshot; one is exported only when a follower needs it, see [`Self::offer_snapshot`]).
    /// Returns the new truncation point. One batch, not flushed: a removal lost in a crash
    /// leaves entries that are removed again later. Called a step at a time, so compaction
    /// never holds the Raft thread for long whatever the log's length.
    pub fn compact_log(&self, to: u64, max_entries: u64) -> Result<u64> {
        let (truncated, _) = self.truncated()?;
        let to = to.min(truncated.saturating_add(max_entries.max(1)));
        if to <= truncated {
            return Ok(truncated);
        }
        let last = self.last_index_inner()?;
        if to > last {
            return Err(ClusterError::Invalid(format!(
                "cannot compact to {to}: log holds {}..={last}",
                truncated + 1
            )));
        }
        let term = self.term_inner(to)?;
        let mut batch = sled::Batch::default();
        for item in self.tree.range(entry_key(0)..=entry_key(to)) {
            let (key, _) = item.map_err(sift_storage::StorageError::from)?;
            batch.remove(key);
        }
        batch.insert(TRUNCATED, truncated_bytes(to, term).to_vec());
        self.write(batch, false)?;
        Ok(to)
    }

    /// Keeps `data` (the state machine's export at applied index `index`, with membership
    /// `conf_state`) in memory as the snapshot served to followers that need one. Not stored:
    /// the state machine itself is durable, and the log below `index` may be compacted anyway.
    pub fn offer_snapshot(&self, index: u64, conf_state: ConfState, data: Vec<u8>) -> Result<()> {
        let term = self.term_inner(index)?;
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(conf_state);
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(meta);
        snapshot.data = data.into();
        *self
            .offered
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(snapshot);
        Ok(())
    }

    /// Index and membership of the snapshot kept by [`Self::offer_snapshot`], if any.
    pub fn offered_snapshot(&self) -> Option<(u64, ConfState)> {
        self.offered
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .as_ref()
            .map(|snapshot| {
                let meta = snapshot.get_metadata();
                (meta.index, meta.get_conf_state().clone())
            })
    }

    /// Installs a snapshot received from the leader: the log is emptied, membership, commit and
    /// the snapshot are replaced, in one batch, flushed. The caller then imports the state
    /// machine bytes; if it crashes first, [`Self::stored_snapshot`] still has them.
    pub fn apply_snapshot(&self, snapshot: &Snapshot) -> Result<()> {
        let meta = snapshot.get_metadata();
        let (truncated, _) = self.truncated()?;
        if meta.index < truncated {
            return Err(ClusterError::Invalid(format!(
                "snapshot at {} is older than the log start {truncated}",
                meta.index
            )));
        }
        let mut hard_state = self.hard_state()?;
        hard_state.term = hard_state.term.max(meta.term);
        hard_state.commit = meta.index;
        let mut batch = sled::Batch::default();
        for item in self.tree.range(entry_key(0)..=entry_key(u64::MAX)) {
            let (key, _) = item.map_err(sift_storage::StorageError::from)?;
            batch.remove(key);
        }
        batch.insert(HARD_STATE, Self::encode(&hard_state)?);
        batch.insert(CONF_STATE, Self::encode(meta.get_conf_state())?);
        batch.insert(SNAPSHOT_META, Self::encode(meta)?);
        batch.insert(SNAPSHOT_DATA, snapshot.data.to_vec());
        batch.insert(TRUNCATED, truncated_bytes(meta.index, meta.term).to_vec());
        self.write(batch, true)
    }

    fn term_inner(&self, index: u64) -> Result<u64> {
        let (truncated, truncated_term) = self.truncated()?;
        if index == truncated {
            return Ok(truncated_term);
        }
        match self.entry(index)? {
            Some(entry) => Ok(entry.term),
            None => Err(ClusterError::Invalid(format!("no log entry at {index}"))),
        }
    }
}

fn truncated_bytes(index: u64, term: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&index.to_be_bytes());
    bytes[8..].copy_from_slice(&term.to_be_bytes());
    bytes
}

fn to_raft(error: ClusterError) -> raft::Error {
    other(error)
}

impl Storage for SledRaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state().map_err(to_raft)?,
            self.conf_state().map_err(to_raft)?,
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        let first = self.first_index()?;
        let last = self.last_index()?;
        if low < first {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        assert!(
            high <= last + 1,
            "index out of bound (last: {last}, high: {high})"
        );
        let mut entries = Vec::new();
        if low >= high {
            return Ok(entries);
        }
        let mut size = 0u64;
        for item in self.tree.range(entry_key(low)..entry_key(high)) {
            let (key, value) = item.map_err(other)?;
            let entry = Entry::parse_from_bytes(&value).map_err(other)?;
            debug_assert_eq!(entry.index, index_of(&key));
            size += u64::from(entry.compute_size());
            if let Some(max) = max_size
                && !entries.is_empty()
                && size > max
            {
                break;
            }
            entries.push(entry);
        }
        if entries.len() as u64 != high - low && max_size.is_none_or(|max| size <= max) {
            // A hole in the log between first and last index: never written that way.
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        let (truncated, truncated_term) = self.truncated().map_err(to_raft)?;
        if index == truncated {
            return Ok(truncated_term);
        }
        if index < truncated {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        match self.entry(index).map_err(to_raft)? {
            Some(entry) => Ok(entry.term),
            None => Err(raft::Error::Store(raft::StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.truncated().map_err(to_raft)?.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.last_index_inner().map_err(to_raft)
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let (truncated, _) = self.truncated().map_err(to_raft)?;
        // raft-rs refuses a snapshot whose membership does not include the receiver (a learner
        // added after the snapshot was taken): it needs a newer one.
        let usable = |snapshot: &Snapshot| {
            let index = snapshot.get_metadata().index;
            let conf_state = snapshot.get_metadata().get_conf_state();
            let includes_receiver = conf_state
                .voters
                .iter()
                .chain(&conf_state.learners)
                .chain(&conf_state.voters_outgoing)
                .chain(&conf_state.learners_next)
                .any(|id| *id == to);
            index >= request_index && index >= truncated && includes_receiver
        };
        let offered = self
            .offered
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone();
        if let Some(snapshot) = offered
            && usable(&snapshot)
        {
            return Ok(snapshot);
        }
        let stored = self.stored_snapshot().map_err(to_raft)?;
        if !stored.data.is_empty() && usable(&stored) {
            return Ok(stored);
        }
        // The driver builds a fresh one after this Ready; raft-rs asks again later.
        self.snapshot_wanted.store(true, Ordering::Release);
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

#[cfg(test)]
mod tests;
