//! The whole state as bytes: exported for Raft snapshots, imported by a node that installs
//! one. The export is deterministic (key order), so equal states export equal bytes.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::keys::{
    APPLIED_KEY, DOC_PREFIX, DRAIN_PREFIX, KB_PREFIX, PENDING_PREFIX, doc_key, pending_key,
};
use super::ops::MetaOp;
use super::pending::Pending;
use super::records::{DocStatus, DocumentRecord, KbRecord, PendingWork, Replica, ReplicaState};
use super::{SledMetaStore, decode};
use crate::error::{Result, StorageError};

/// The first bytes of an export; then `(len u32 BE, key, len u32 BE, value)` per entry.
pub(super) const EXPORT_MAGIC: &[u8] = b"SIFTMETA1";

impl SledMetaStore {
    /// The whole metadata state (every key but the applied index) as bytes, in key order:
    /// two stores that applied the same ops export identical bytes. Used for Raft snapshots.
    pub fn export_state(&self) -> Result<Vec<u8>> {
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut out = EXPORT_MAGIC.to_vec();
        for item in self.tree.iter() {
            let (key, value) = item?;
            if key.as_ref() == APPLIED_KEY {
                continue;
            }
            for part in [key.as_ref(), value.as_ref()] {
                out.extend_from_slice(&(part.len() as u32).to_be_bytes());
                out.extend_from_slice(part);
            }
        }
        Ok(out)
    }

    /// Replaces the whole metadata state with `bytes` from [`Self::export_state`], applied up to
    /// `index`, in one atomic batch. Malformed bytes are refused and change nothing.
    pub fn import_state(&self, index: u64, bytes: &[u8]) -> Result<()> {
        let corrupt = || StorageError::Corrupt("metadata state export is malformed".into());
        let mut rest = bytes.strip_prefix(EXPORT_MAGIC).ok_or_else(corrupt)?;
        let mut entries = BTreeMap::new();
        let take = |rest: &mut &[u8]| -> Result<Vec<u8>> {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
            let len = u32::from_be_bytes(*len) as usize;
            if tail.len() < len {
                return Err(corrupt());
            }
            let (part, tail) = tail.split_at(len);
            *rest = tail;
            Ok(part.to_vec())
        };
        while !rest.is_empty() {
            let key = take(&mut rest)?;
            let value = take(&mut rest)?;
            entries.insert(key, value);
        }
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut batch = sled::Batch::default();
        for item in self.tree.iter() {
            let (key, _) = item?;
            if !entries.contains_key(key.as_ref()) {
                batch.remove(key);
            }
        }
        for (key, value) in entries {
            batch.insert(key, value);
        }
        batch.insert(APPLIED_KEY, &index.to_be_bytes());
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        // An export from a store without the pending-work index: build it here too.
        self.build_pending_index()
    }
}

/// What a restore found of each document of the metadata it imported
/// ([`SledMetaStore::adopt_restored`]).
#[derive(Clone, Debug, Default)]
pub struct RestorePlan {
    /// The KBs the snapshot holds; every other KB is removed.
    pub kbs: HashSet<String>,
    /// The node that holds every replica from now on.
    pub node: u64,
    /// Documents whose chunks the restore wrote into their shards, with their chunk counts.
    pub chunked: HashMap<String, u32>,
    /// Documents whose raw bytes the restore stored: they are ingested again.
    pub raw: HashSet<String>,
    pub at_ms: u64,
}

/// What [`SledMetaStore::adopt_restored`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    pub ready: u64,
    pub requeued: u64,
    pub failed: u64,
}

/// The reason a document that a snapshot could not carry is `failed` with after a restore.
pub const NOT_IN_SNAPSHOT: &str = "not_in_snapshot";

impl SledMetaStore {
    /// Turns freshly imported metadata into that of a new single-node cluster holding the
    /// snapshot: KBs outside `plan.kbs` are removed; every replica is on `plan.node`, active;
    /// a document whose chunks were restored is ready (a shard write is whole per document);
    /// else one with restored raw bytes is queued again on `plan.node`; any other unfinished or
    /// ready document is `failed` with [`NOT_IN_SNAPSHOT`]. One atomic batch, flushed.
    pub fn adopt_restored(&self, plan: &RestorePlan) -> Result<RestoreSummary> {
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut pending = Pending::new(&self.tree);
        let mut summary = RestoreSummary::default();
        for (key, value) in pending.scan_prefix(KB_PREFIX)? {
            let mut kb: KbRecord = decode(&value)?;
            if !plan.kbs.contains(&kb.id) {
                self.apply_op(&mut pending, &MetaOp::DeleteKb { kb_id: kb.id })?;
                continue;
            }
            for placement in &mut kb.placement {
                placement.replicas = vec![Replica {
                    node: plan.node,
                    state: ReplicaState::Active,
                    since_ms: plan.at_ms,
                }];
            }
            pending.put(key, &kb)?;
        }
        for (key, _) in pending.scan_prefix(DRAIN_PREFIX)? {
            pending.remove(key);
        }
        for (key, _) in pending.scan_prefix(PENDING_PREFIX)? {
            pending.remove(key);
        }
        for (_, value) in pending.scan_prefix(DOC_PREFIX)? {
            let mut doc: DocumentRecord = decode(&value)?;
            if doc.status == DocStatus::Failed {
                continue;
            }
            if let Some(chunks) = plan.chunked.get(&doc.id) {
                summary.ready += 1;
                if doc.status == DocStatus::Ready {
                    continue;
                }
                doc.status = DocStatus::Ready;
                doc.error = None;
                doc.chunk_count = *chunks;
            } else if plan.raw.contains(&doc.id) {
                doc.status = DocStatus::Queued;
                doc.error = None;
                doc.chunk_count = 0;
                let work = PendingWork {
                    worker: plan.node,
                    shard: doc.shard,
                    attempts: 0,
                };
                pending.put(pending_key(&doc.kb_id, &doc.id), &work)?;
                summary.requeued += 1;
            } else {
                doc.status = DocStatus::Failed;
                doc.error = Some(format!(
                    "{NOT_IN_SNAPSHOT}: the snapshot holds neither the document's chunks nor its raw bytes"
                ));
                summary.failed += 1;
            }
            doc.updated_at_ms = plan.at_ms;
            pending.put(doc_key(&doc.kb_id, &doc.id), &doc)?;
        }
        self.tree.apply_batch(pending.into_batch())?;
        self.db.flush()?;
        Ok(summary)
    }
}
