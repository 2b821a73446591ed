//! The audit log in the metadata state machine: who changed what, when, from where, and how
//! it ended. Entries are appended through the log like every other change (so every node
//! holds the same audit), keyed `audit/{id}` by a UUIDv7 id (time order is key order), and
//! forgotten past the retention time the appending node gives each op. No entry holds key
//! material: the key's public id only.
//!
//! Every type here is bincode-safe: ops travel between nodes as bincode.

use serde::{Deserialize, Serialize};

use super::keys::{AUDIT_PREFIX, audit_key};
use super::pending::Pending;
use super::{SledMetaStore, decode};
use crate::error::Result;

/// Most expired entries one append forgets (the rest go with the next appends).
const FORGET_PER_APPEND: usize = 256;

/// One audited request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// UUIDv7: ordered by time.
    pub id: String,
    pub at_ms: u64,
    /// The public id of the caller's key (none with auth off).
    pub key_id: Option<String>,
    pub tenant: String,
    /// The caller's role (`admin`, `editor`, `reader`).
    pub role: String,
    pub method: String,
    /// The route as declared (`/v1/kbs/{kb}`).
    pub route: String,
    /// The path as called (`/v1/kbs/docs`): what the request acted on.
    pub target: String,
    /// The HTTP status of the answer.
    pub status: u16,
    /// The client's IP address, when known.
    pub address: Option<String>,
}

impl SledMetaStore {
    /// A page of at most `limit` entries, oldest first, after the entry `after` when given;
    /// only those `keep` accepts.
    pub fn list_audit(
        &self,
        after: Option<&str>,
        limit: usize,
        mut keep: impl FnMut(&AuditEntry) -> bool,
    ) -> Result<Vec<AuditEntry>> {
        let start = match after {
            // Just past `after`: its key followed by a zero byte.
            Some(id) => [audit_key(id).as_slice(), &[0]].concat(),
            None => AUDIT_PREFIX.to_vec(),
        };
        let end = [AUDIT_PREFIX, &[0xff]].concat();
        let mut entries = Vec::new();
        for item in self.tree.range(start..end) {
            if entries.len() == limit {
                break;
            }
            let (_, value) = item?;
            let entry: AuditEntry = decode(&value)?;
            if keep(&entry) {
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    /// Appends an entry (a retried append is the same entry) and forgets up to
    /// [`FORGET_PER_APPEND`] of the oldest entries made before `forget_before_ms`.
    pub(super) fn apply_append_audit(
        &self,
        pending: &mut Pending<'_>,
        entry: &AuditEntry,
        forget_before_ms: u64,
    ) -> Result<()> {
        let mut expired = Vec::new();
        for (key, value) in pending.scan_prefix_head(AUDIT_PREFIX, FORGET_PER_APPEND)? {
            let old: AuditEntry = decode(&value)?;
            if old.at_ms >= forget_before_ms {
                break;
            }
            expired.push(key);
        }
        for key in expired {
            pending.remove(key);
        }
        pending.put(audit_key(&entry.id), entry)
    }
}
