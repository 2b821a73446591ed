//! Tenant quotas on stored documents and bytes (`max_documents_per_tenant`,
//! `max_bytes_per_tenant`, or the tenant's own `max_documents` and `max_bytes` where its
//! limits set them). An addition checks what the tenant holds plus what this node has
//! already accepted but not yet registered, and reserves its own share until its metadata op
//! commits: concurrent additions through one node cannot pass a quota together. Additions
//! through different nodes see only each other's committed documents, so a quota can be passed
//! by what is in flight on the other nodes at that moment.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use sift_storage::meta::{DocumentRecord, KbAccess, KbRecord};

use super::SiftNode;
use crate::error::{Result, SiftError};

/// What one node's accepted, not yet registered additions will add, by tenant.
#[derive(Clone, Default)]
pub(crate) struct QuotaLedger {
    in_flight: Arc<Mutex<HashMap<String, Usage>>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Usage {
    bytes: u64,
    documents: u64,
}

/// The share of an addition, held in the ledger until this is dropped (after the addition's
/// registration succeeded or failed: either way the meta store then tells the truth).
pub(crate) struct QuotaReservation {
    ledger: QuotaLedger,
    tenant: String,
    usage: Usage,
}

impl Drop for QuotaReservation {
    fn drop(&mut self) {
        let mut in_flight = self
            .ledger
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = in_flight.get_mut(&self.tenant) {
            held.bytes = held.bytes.saturating_sub(self.usage.bytes);
            held.documents = held.documents.saturating_sub(self.usage.documents);
            if *held == Usage::default() {
                in_flight.remove(&self.tenant);
            }
        }
    }
}

impl SiftNode {
    /// Refuses `records` when the tenant of `kb` would pass its byte quota (the raw bytes of
    /// its KBs' live documents) or its document quota (their documents; one
    /// that replaces a document of the same external id adds none); else reserves their share
    /// until the returned reservation is dropped. `None` when no quota is set.
    pub(super) fn reserve_quota(
        &self,
        kb: &KbRecord,
        records: &[DocumentRecord],
    ) -> Result<Option<QuotaReservation>> {
        let options = &self.context.options;
        let store = self.store();
        let tenant = store.kb_tenant(&kb.id)?;
        let own = store.tenant_limits(&tenant)?;
        let (max_bytes, bytes_setting) = match own.max_bytes {
            Some(limit) => (Some(limit), "the tenant's max_bytes"),
            None => (options.max_bytes_per_tenant, "max_bytes_per_tenant"),
        };
        let (max_documents, documents_setting) = match own.max_documents {
            Some(limit) => (Some(limit), "the tenant's max_documents"),
            None => (options.max_documents_per_tenant, "max_documents_per_tenant"),
        };
        if max_bytes.is_none() && max_documents.is_none() {
            return Ok(None);
        }
        let adding = Usage {
            bytes: records.iter().map(|r| r.size_bytes).sum(),
            documents: {
                let mut adding = 0u64;
                let mut seen = HashSet::new();
                for record in records {
                    let replaces = match &record.external_id {
                        // A repeated external id within one request stores one document.
                        Some(external_id) => {
                            !seen.insert(external_id.as_str())
                                || store.has_external_id(&kb.id, external_id)?
                        }
                        None => false,
                    };
                    adding += u64::from(!replaces);
                }
                adding
            },
        };
        // The store is read under the lock: a reservation released meanwhile (its documents
        // committed) is then either still counted here or already in the store, never neither.
        let mut in_flight = self
            .quotas
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let pending = in_flight.get(&tenant).copied().unwrap_or_default();
        let owned: Vec<String> = store
            .list_kbs_in(&tenant)?
            .into_iter()
            .filter(|(_, access)| *access == KbAccess::Owner)
            .map(|(kb, _)| kb.id)
            .collect();
        if let Some(limit) = max_bytes {
            let owned: HashSet<&String> = owned.iter().collect();
            let stored: u64 = store
                .shard_bytes()?
                .into_iter()
                .filter(|((kb_id, _), _)| owned.contains(kb_id))
                .map(|(_, bytes)| bytes)
                .sum();
            let used = stored.saturating_add(pending.bytes);
            if used.saturating_add(adding.bytes) > limit {
                return Err(SiftError::Forbidden {
                    code: "storage_quota_exceeded",
                    message: format!(
                        "the tenant {tenant:?} holds {used} bytes of documents; {} more would pass its quota of {limit} ({bytes_setting})",
                        adding.bytes
                    ),
                });
            }
        }
        if let Some(limit) = max_documents {
            let mut stored = 0u64;
            for kb_id in &owned {
                stored += store.document_total(kb_id)?;
            }
            let used = stored.saturating_add(pending.documents);
            if adding.documents > 0 && used.saturating_add(adding.documents) > limit {
                return Err(SiftError::Forbidden {
                    code: "document_quota_exceeded",
                    message: format!(
                        "the tenant {tenant:?} holds {used} documents; {} more would pass its quota of {limit} ({documents_setting})",
                        adding.documents
                    ),
                });
            }
        }
        let held = in_flight.entry(tenant.clone()).or_default();
        held.bytes = held.bytes.saturating_add(adding.bytes);
        held.documents = held.documents.saturating_add(adding.documents);
        drop(in_flight);
        Ok(Some(QuotaReservation {
            ledger: self.quotas.clone(),
            tenant,
            usage: adding,
        }))
    }
}
