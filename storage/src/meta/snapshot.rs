//! The whole state as bytes: exported for Raft snapshots, imported by a node that installs
//! one. The export is deterministic (key order), so equal states export equal bytes.

use std::collections::BTreeMap;

use super::SledMetaStore;
use super::keys::APPLIED_KEY;
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
