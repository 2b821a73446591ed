//! What each op does to the state. Every function here reads and writes through the pending
//! overlay only, so an op sees the effects of the ops before it in the same batch, and a
//! refused op can be rolled back (see `log.rs`). Nothing here may depend on anything but the
//! op and the state before it: no clock, no randomness, no node-local facts.

use super::api_keys::DEFAULT_TENANT;
use super::keys::{
    DOC_PREFIX, doc_key, doc_prefix, drain_key, ext_key, ext_prefix, hash_key, hash_prefix, kb_key,
    kb_name_key, pending_key, pending_prefix, shard_bytes_key, shard_bytes_prefix, tomb_key,
    tomb_prefix,
};
use super::ops::{MetaOp, MetaOutcome, Registered};
use super::pending::Pending;
use super::records::{
    DocStatus, DocumentRecord, KbRecord, PendingWork, Replica, ReplicaState, Tombstone,
};
use super::sessions::SessionRecord;
use super::{SledMetaStore, decode};
use crate::error::{Result, StorageError};

impl SledMetaStore {
    /// Applies `op` to the overlay. An error is a refusal: the caller rolls the overlay back.
    pub(super) fn apply_op(&self, pending: &mut Pending<'_>, op: &MetaOp) -> Result<MetaOutcome> {
        match op {
            MetaOp::CreateKb(kb) => {
                if let Some(existing) = pending.get::<KbRecord>(&kb_key(&kb.id))? {
                    return Ok(MetaOutcome::Kb(existing)); // a retried create
                }
                if pending.get_raw(&kb_name_key(&kb.name))?.is_some() {
                    return Err(StorageError::Conflict(format!(
                        "a knowledge base named {:?} already exists",
                        kb.name
                    )));
                }
                pending.put(kb_key(&kb.id), kb)?;
                pending.put_str(kb_name_key(&kb.name), &kb.id);
                Ok(MetaOutcome::Kb(kb.clone()))
            }
            MetaOp::UpdateKb {
                kb_id,
                settings,
                at_ms,
            } => {
                let Some(mut kb) = pending.get::<KbRecord>(&kb_key(kb_id))? else {
                    return Err(StorageError::NotFound(format!("knowledge base {kb_id}")));
                };
                kb.settings = settings.clone();
                kb.updated_at_ms = *at_ms;
                pending.put(kb_key(kb_id), &kb)?;
                Ok(MetaOutcome::Kb(kb))
            }
            MetaOp::DeleteKb { kb_id } => {
                let Some(kb) = pending.get::<KbRecord>(&kb_key(kb_id))? else {
                    return Ok(MetaOutcome::Unchanged);
                };
                pending.remove(kb_key(kb_id));
                self.remove_kb_tenancy(pending, &kb)?;
                let mut documents = Vec::new();
                let prefixes = [
                    doc_prefix(kb_id),
                    ext_prefix(kb_id),
                    hash_prefix(kb_id),
                    tomb_prefix(kb_id),
                    pending_prefix(kb_id),
                    shard_bytes_prefix(kb_id),
                ];
                for prefix in prefixes {
                    for (key, value) in pending.scan_prefix(&prefix)? {
                        if prefix.starts_with(DOC_PREFIX) {
                            let doc: DocumentRecord = decode(&value)?;
                            documents.push(Tombstone {
                                document_id: doc.id,
                                shard: doc.shard,
                                deleted_at_ms: kb.updated_at_ms,
                            });
                        }
                        pending.remove(key);
                    }
                }
                Ok(MetaOutcome::KbDeleted { kb, documents })
            }
            MetaOp::RegisterDocuments { kb_id, documents } => {
                self.register(pending, kb_id, documents, &[])
            }
            MetaOp::RegisterDocumentsTo {
                kb_id,
                documents,
                workers,
            } => self.register(pending, kb_id, documents, workers),
            MetaOp::SetDocumentStatus {
                kb_id,
                updates,
                at_ms,
            } => {
                let mut records = Vec::with_capacity(updates.len());
                for update in updates {
                    let key = doc_key(kb_id, &update.document_id);
                    let Some(mut doc) = pending.get::<DocumentRecord>(&key)? else {
                        continue; // deleted meanwhile
                    };
                    if doc.status.is_terminal() {
                        continue; // finished already (by another worker): final
                    }
                    let started = doc.status != DocStatus::Queued;
                    doc.status = update.status;
                    doc.error = update.error.clone();
                    if let Some(count) = update.chunk_count {
                        doc.chunk_count = count;
                    }
                    if let Some(pages) = update.pages_needing_ocr {
                        doc.pages_needing_ocr = pages;
                    }
                    doc.updated_at_ms = *at_ms;
                    let work_key = pending_key(kb_id, &doc.id);
                    if doc.status.is_terminal() {
                        pending.remove(work_key);
                    } else if update.status == DocStatus::Parsing
                        && let Some(mut work) = pending.get::<PendingWork>(&work_key)?
                    {
                        // A durable mark that processing started, before any work is done.
                        work.attempts = work.attempts.saturating_add(1);
                        pending.put(work_key, &work)?;
                    } else if update.status == DocStatus::Queued
                        && started
                        && let Some(mut work) = pending.get::<PendingWork>(&work_key)?
                    {
                        // Sent back by a transient error: that attempt ended without a crash,
                        // so it does not count towards the crash limit.
                        work.attempts = work.attempts.saturating_sub(1);
                        pending.put(work_key, &work)?;
                    }
                    pending.put(key, &doc)?;
                    records.push(doc);
                }
                Ok(MetaOutcome::Statuses(records))
            }
            MetaOp::ReassignDocuments {
                kb_id,
                document_ids,
                from,
                to,
            } => {
                let mut moved = Vec::new();
                for document_id in document_ids {
                    let key = pending_key(kb_id, document_id);
                    let Some(mut work) = pending.get::<PendingWork>(&key)? else {
                        continue; // finished or deleted meanwhile
                    };
                    if work.worker == *from && from != to {
                        work.worker = *to;
                        pending.put(key, &work)?;
                        moved.push(document_id.clone());
                    }
                }
                Ok(MetaOutcome::Reassigned(moved))
            }
            MetaOp::SetNodeDraining { node, draining } => {
                let key = drain_key(*node);
                if *draining == pending.get_raw(&key)?.is_some() {
                    return Ok(MetaOutcome::Unchanged);
                }
                if *draining {
                    pending.put_str(key, "1");
                } else {
                    pending.remove(key);
                }
                Ok(MetaOutcome::Draining {
                    node: *node,
                    draining: *draining,
                })
            }
            MetaOp::DeleteDocument {
                kb_id,
                document_id,
                at_ms,
            } => {
                let Some(doc) = pending.get::<DocumentRecord>(&doc_key(kb_id, document_id))? else {
                    return Ok(MetaOutcome::Unchanged);
                };
                Ok(MetaOutcome::DocumentDeleted(
                    self.tombstone(pending, &doc, *at_ms)?,
                ))
            }
            MetaOp::SetReplicaState {
                kb_id,
                shard,
                node,
                state,
                expected,
                at_ms,
            } => {
                let Some(mut kb) = pending.get::<KbRecord>(&kb_key(kb_id))? else {
                    return Err(StorageError::NotFound(format!("knowledge base {kb_id}")));
                };
                let Some(replica) = kb
                    .placement
                    .get_mut(*shard as usize)
                    .and_then(|p| p.replicas.iter_mut().find(|r| r.node == *node))
                else {
                    // Removed meanwhile (moved elsewhere): nothing left to change.
                    return Ok(MetaOutcome::Unchanged);
                };
                if replica.state == *state
                    || expected.is_some_and(|expected| expected != replica.state)
                {
                    return Ok(MetaOutcome::Unchanged);
                }
                replica.state = *state;
                replica.since_ms = *at_ms;
                pending.put(kb_key(kb_id), &kb)?;
                Ok(MetaOutcome::Kb(kb))
            }
            MetaOp::AddReplica {
                kb_id,
                shard,
                node,
                at_ms,
            } => {
                let mut kb = placed_kb(pending, kb_id, *shard)?;
                let placement = &mut kb.placement[*shard as usize];
                if placement.replicas.iter().any(|r| r.node == *node) {
                    return Ok(MetaOutcome::Unchanged);
                }
                placement.replicas.push(Replica {
                    node: *node,
                    state: ReplicaState::Initializing,
                    since_ms: *at_ms,
                });
                kb.updated_at_ms = kb.updated_at_ms.max(*at_ms);
                pending.put(kb_key(kb_id), &kb)?;
                Ok(MetaOutcome::Kb(kb))
            }
            MetaOp::RemoveReplica {
                kb_id,
                shard,
                node,
                at_ms,
            } => {
                let mut kb = placed_kb(pending, kb_id, *shard)?;
                let placement = &mut kb.placement[*shard as usize];
                if !placement.replicas.iter().any(|r| r.node == *node) {
                    return Ok(MetaOutcome::Unchanged);
                }
                let others_active = placement
                    .replicas
                    .iter()
                    .any(|r| r.node != *node && r.state == ReplicaState::Active);
                if !others_active {
                    return Err(StorageError::Conflict(format!(
                        "shard {shard} has no other active replica than the one on node {node}"
                    )));
                }
                placement.replicas.retain(|r| r.node != *node);
                kb.updated_at_ms = kb.updated_at_ms.max(*at_ms);
                pending.put(kb_key(kb_id), &kb)?;
                Ok(MetaOutcome::Kb(kb))
            }
            MetaOp::ForgetTombstone { kb_id, document_id } => {
                pending.remove(tomb_key(kb_id, document_id));
                Ok(MetaOutcome::Unchanged)
            }
            MetaOp::CreateSession {
                id,
                kbs,
                agent,
                created_at_ms,
            } => Ok(MetaOutcome::Session(self.apply_create_session(
                pending,
                &SessionRecord::new(id, kbs, agent, *created_at_ms, None),
            )?)),
            MetaOp::CreateOwnedSession {
                id,
                kbs,
                agent,
                created_at_ms,
                owner,
            } => Ok(MetaOutcome::Session(self.apply_create_session(
                pending,
                &SessionRecord::new(id, kbs, agent, *created_at_ms, Some(owner.clone())),
            )?)),
            MetaOp::CreateApiKey(key) => Ok(MetaOutcome::ApiKey(
                self.apply_create_api_key(pending, &key.clone().into_record(DEFAULT_TENANT, &[]))?,
            )),
            MetaOp::CreateTenantApiKey {
                key,
                tenant,
                groups,
            } => Ok(MetaOutcome::ApiKey(self.apply_create_api_key(
                pending,
                &key.clone().into_record(tenant, groups),
            )?)),
            MetaOp::CreateTenant {
                name,
                created_at_ms,
            } => Ok(MetaOutcome::Tenant(self.apply_create_tenant(
                pending,
                name,
                *created_at_ms,
            )?)),
            MetaOp::DeleteTenant { name, at_ms } => {
                Ok(match self.apply_delete_tenant(pending, name, *at_ms)? {
                    Some(deleted) => MetaOutcome::TenantDeleted(deleted),
                    None => MetaOutcome::Unchanged,
                })
            }
            MetaOp::SetTenantLimits { name, limits } => Ok(MetaOutcome::Tenant(
                self.apply_set_tenant_limits(pending, name, limits)?,
            )),
            MetaOp::AppendAudit {
                entry,
                forget_before_ms,
            } => {
                self.apply_append_audit(pending, entry, *forget_before_ms)?;
                Ok(MetaOutcome::Unchanged)
            }
            MetaOp::CreateTenantKb { tenant, kb } => Ok(MetaOutcome::Kb(
                self.apply_create_tenant_kb(pending, tenant, kb)?,
            )),
            MetaOp::ShareKb {
                kb_id,
                tenant,
                shared,
            } => Ok(MetaOutcome::Shares {
                kb_id: kb_id.clone(),
                tenants: self.apply_share_kb(pending, kb_id, tenant, *shared)?,
            }),
            MetaOp::RevokeApiKey { id, at_ms } => Ok(MetaOutcome::ApiKey(
                self.apply_revoke_api_key(pending, id, *at_ms)?,
            )),
            MetaOp::DeleteSession { id } => Ok(match self.apply_delete_session(pending, id)? {
                Some(session) => MetaOutcome::SessionDeleted(session),
                None => MetaOutcome::Unchanged,
            }),
            MetaOp::AppendTurn { session_id, turn } => Ok(MetaOutcome::TurnAppended(
                self.apply_append_turn(pending, session_id, turn)?,
            )),
            MetaOp::SetHistorySummary {
                session_id,
                summary,
                summary_turns,
                at_ms,
            } => Ok(
                match self.apply_set_history_summary(
                    pending,
                    session_id,
                    summary,
                    *summary_turns,
                    *at_ms,
                )? {
                    Some(session) => MetaOutcome::Session(session),
                    None => MetaOutcome::Unchanged,
                },
            ),
        }
    }

    /// Registers documents (see [`MetaOp::RegisterDocuments`]); `workers[i]` ingests
    /// `documents[i]` (0 when not given).
    fn register(
        &self,
        pending: &mut Pending<'_>,
        kb_id: &str,
        documents: &[DocumentRecord],
        workers: &[u64],
    ) -> Result<MetaOutcome> {
        if pending.get_raw(&kb_key(kb_id))?.is_none() {
            return Err(StorageError::NotFound(format!("knowledge base {kb_id}")));
        }
        let mut outcomes = Vec::with_capacity(documents.len());
        for (position, doc) in documents.iter().enumerate() {
            if let Some(existing) = pending.get::<DocumentRecord>(&doc_key(kb_id, &doc.id))? {
                // A retried registration of the same id.
                outcomes.push(Registered {
                    record: existing,
                    duplicate: false,
                    replaced: None,
                });
                continue;
            }
            if let Some(existing_id) = pending.get_str(&hash_key(kb_id, &doc.content_hash))?
                && let Some(existing) =
                    pending.get::<DocumentRecord>(&doc_key(kb_id, &existing_id))?
            {
                outcomes.push(Registered {
                    record: existing,
                    duplicate: true,
                    replaced: None,
                });
                continue;
            }
            let mut replaced = None;
            if let Some(external_id) = &doc.external_id {
                if let Some(old_id) = pending.get_str(&ext_key(kb_id, external_id))?
                    && let Some(old) = pending.get::<DocumentRecord>(&doc_key(kb_id, &old_id))?
                {
                    replaced = Some(self.tombstone(pending, &old, doc.created_at_ms)?);
                }
                pending.put_str(ext_key(kb_id, external_id), &doc.id);
            }
            pending.put_str(hash_key(kb_id, &doc.content_hash), &doc.id);
            pending.put(doc_key(kb_id, &doc.id), doc)?;
            add_shard_bytes(pending, kb_id, doc.shard, doc.size_bytes as i128)?;
            if !doc.status.is_terminal() {
                let work = PendingWork {
                    worker: workers.get(position).copied().unwrap_or(0),
                    shard: doc.shard,
                    attempts: 0,
                };
                pending.put(pending_key(kb_id, &doc.id), &work)?;
            }
            outcomes.push(Registered {
                record: doc.clone(),
                duplicate: false,
                replaced,
            });
        }
        Ok(MetaOutcome::Registered(outcomes))
    }

    fn tombstone(
        &self,
        pending: &mut Pending<'_>,
        doc: &DocumentRecord,
        at_ms: u64,
    ) -> Result<Tombstone> {
        let kb_id = &doc.kb_id;
        pending.remove(doc_key(kb_id, &doc.id));
        pending.remove(pending_key(kb_id, &doc.id));
        add_shard_bytes(pending, kb_id, doc.shard, -(doc.size_bytes as i128))?;
        if let Some(external_id) = &doc.external_id
            && pending.get_str(&ext_key(kb_id, external_id))?.as_deref() == Some(doc.id.as_str())
        {
            pending.remove(ext_key(kb_id, external_id));
        }
        if pending
            .get_str(&hash_key(kb_id, &doc.content_hash))?
            .as_deref()
            == Some(doc.id.as_str())
        {
            pending.remove(hash_key(kb_id, &doc.content_hash));
        }
        let tomb = Tombstone {
            document_id: doc.id.clone(),
            shard: doc.shard,
            deleted_at_ms: at_ms,
        };
        pending.put(tomb_key(kb_id, &doc.id), &tomb)?;
        Ok(tomb)
    }
}

/// Adds `delta` to the byte count of a shard (never below zero).
fn add_shard_bytes(pending: &mut Pending<'_>, kb_id: &str, shard: u32, delta: i128) -> Result<()> {
    let key = shard_bytes_key(kb_id, shard);
    let current: u64 = pending.get(&key)?.unwrap_or(0);
    let next = (current as i128 + delta).clamp(0, u64::MAX as i128) as u64;
    pending.put(key, &next)
}

/// The KB of a placement op, checked to have a placement for `shard`.
fn placed_kb(pending: &Pending<'_>, kb_id: &str, shard: u32) -> Result<KbRecord> {
    let Some(kb) = pending.get::<KbRecord>(&kb_key(kb_id))? else {
        return Err(StorageError::NotFound(format!("knowledge base {kb_id}")));
    };
    if kb.placement.len() <= shard as usize {
        return Err(StorageError::NotFound(format!("shard {shard} of {kb_id}")));
    }
    Ok(kb)
}
