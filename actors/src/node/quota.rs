//! Tenant quotas on stored documents and bytes (`max_documents_per_tenant`,
//! `max_bytes_per_tenant`, or the tenant's own `max_documents` and `max_bytes` where its
//! limits set them). An addition checks what the tenant holds plus what this node has
//! already accepted but not yet registered (each reserved document counts until the store
//! holds it), and reserves its own documents until its metadata op has committed or failed:
//! concurrent additions through one node cannot pass a quota together, nor refuse each other
//! below it. Additions
//! through different nodes see only each other's committed documents, so a quota can be passed
//! by what is in flight on the other nodes at that moment.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use sift_storage::meta::{DocumentRecord, KbAccess, KbRecord};

use super::SiftNode;
use crate::error::{Result, SiftError};

/// One node's accepted, not yet registered additions, by reservation.
#[derive(Clone, Default)]
pub(crate) struct QuotaLedger {
    in_flight: Arc<Mutex<Pending>>,
}

#[derive(Default)]
struct Pending {
    next: u64,
    reservations: HashMap<u64, Reserved>,
}

/// The documents of one addition, as they will count once registered.
struct Reserved {
    tenant: String,
    documents: Vec<PendingDocument>,
}

struct PendingDocument {
    kb_id: String,
    id: String,
    bytes: u64,
    /// False for one that replaces a document of the same external id (it adds none).
    counts: bool,
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
    id: u64,
}

impl Drop for QuotaReservation {
    fn drop(&mut self) {
        self.ledger
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reservations
            .remove(&self.id);
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
        let mut documents = Vec::with_capacity(records.len());
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
            documents.push(PendingDocument {
                kb_id: record.kb_id.clone(),
                id: record.id.clone(),
                bytes: record.size_bytes,
                counts: !replaces,
            });
        }
        let adding = usage(&documents);
        let owned: Vec<String> = store
            .list_kbs_in(&tenant)?
            .into_iter()
            .filter(|(_, access)| *access == KbAccess::Owner)
            .map(|(kb, _)| kb.id)
            .collect();
        // Under the lock, so that no addition is reserved meanwhile.
        let mut in_flight = self
            .quotas
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // What the tenant uses: the store's counts, plus the reserved documents the store does
        // not hold yet. Those are looked up first: one registered between the two reads is
        // then counted twice (a refusal a retry gets past), never missed. A refusal is
        // measured once more, so that a registration in that moment does not refuse alone.
        let mut used = self.tenant_usage(&tenant, &owned, &in_flight, max_bytes.is_some())?;
        let over = |used: Usage| {
            max_bytes.is_some_and(|limit| used.bytes.saturating_add(adding.bytes) > limit)
                || max_documents.is_some_and(|limit| {
                    adding.documents > 0 && used.documents.saturating_add(adding.documents) > limit
                })
        };
        if over(used) {
            let again = self.tenant_usage(&tenant, &owned, &in_flight, max_bytes.is_some())?;
            used = Usage {
                bytes: used.bytes.min(again.bytes),
                documents: used.documents.min(again.documents),
            };
        }
        if let Some(limit) = max_bytes {
            let used = used.bytes;
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
            let used = used.documents;
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
        let id = in_flight.next;
        in_flight.next += 1;
        in_flight
            .reservations
            .insert(id, Reserved { tenant, documents });
        drop(in_flight);
        Ok(Some(QuotaReservation {
            ledger: self.quotas.clone(),
            id,
        }))
    }

    /// The tenant's stored documents and bytes (bytes only when `bytes` is asked for: they
    /// cost a scan of every shard's total) plus its reserved, not yet registered ones.
    fn tenant_usage(
        &self,
        tenant: &str,
        owned: &[String],
        in_flight: &Pending,
        bytes: bool,
    ) -> Result<Usage> {
        let store = self.store();
        let mut pending = Vec::new();
        for reserved in in_flight.reservations.values() {
            if reserved.tenant != tenant {
                continue;
            }
            for document in &reserved.documents {
                if store.get_document(&document.kb_id, &document.id)?.is_none() {
                    pending.push(document);
                }
            }
        }
        let mut used = Usage::default();
        for document in pending {
            used.bytes = used.bytes.saturating_add(document.bytes);
            used.documents += u64::from(document.counts);
        }
        for kb_id in owned {
            used.documents = used.documents.saturating_add(store.document_total(kb_id)?);
        }
        if bytes {
            let owned: HashSet<&String> = owned.iter().collect();
            let stored: u64 = store
                .shard_bytes()?
                .into_iter()
                .filter(|((kb_id, _), _)| owned.contains(kb_id))
                .map(|(_, bytes)| bytes)
                .sum();
            used.bytes = used.bytes.saturating_add(stored);
        }
        Ok(used)
    }
}

fn usage(documents: &[PendingDocument]) -> Usage {
    Usage {
        bytes: documents.iter().map(|document| document.bytes).sum(),
        documents: documents.iter().map(|d| u64::from(d.counts)).sum(),
    }
}
