//! Filling this node's new or dead replica from an active one: recovering (from then on every
//! write reaches it too), copy the documents it lacks in batches, apply the tombstones,
//! active. A fill that fails leaves the replica dead; the next round tries again.

use std::collections::HashSet;
use std::time::Instant;

use sift_storage::chunk::ShardWrite;
use sift_storage::meta::{MetaOp, MetaOutcome, ReplicaState};
use tracing::info;

use super::Reconciliation;
use crate::ingest::pipeline::now_ms;
use crate::shards::access::unexpected;
use crate::shards::supervisor::open_local_shards;
use crate::shards::{ShardError, ShardMessage, ShardReply, ShardRpc};

/// Documents per export request while repairing a replica.
const REPAIR_BATCH_DOCUMENTS: usize = 64;

impl Reconciliation {
    async fn set_state(
        &self,
        kb_id: &str,
        shard: u32,
        state: ReplicaState,
        expected: ReplicaState,
    ) -> Result<bool, ShardError> {
        let outcome = self
            .context
            .meta
            .propose(MetaOp::SetReplicaState {
                kb_id: kb_id.to_string(),
                shard,
                node: self.context.access.local_id(),
                state,
                expected: Some(expected),
                at_ms: now_ms(),
            })
            .await
            .map_err(|error| ShardError::metadata(&error))?;
        Ok(matches!(outcome, MetaOutcome::Kb(_)))
    }

    /// Fills this node's dead (or new) replica of `shard` from an active one: recovering (from
    /// then on every write reaches it too), copy the documents it lacks, apply the
    /// tombstones, active.
    pub(super) async fn repair(
        &self,
        kb_id: &str,
        shard: u32,
        from: ReplicaState,
    ) -> Result<(), ShardError> {
        let started = Instant::now();
        let access = &self.context.access;
        let local = access.local_id();
        if !self
            .set_state(kb_id, shard, ReplicaState::Recovering, from)
            .await?
        {
            return Ok(()); // someone else changed it
        }
        info!(kb_id, shard, "repairing this node's replica");
        let outcome = self.copy_missing(kb_id, shard, local).await;
        match outcome {
            Ok(copied) => {
                self.set_state(kb_id, shard, ReplicaState::Active, ReplicaState::Recovering)
                    .await?;
                metrics::counter!("sift_replica_repairs_total", "outcome" => "ok").increment(1);
                metrics::histogram!("sift_replica_repair_seconds")
                    .record(started.elapsed().as_secs_f64());
                info!(
                    kb_id,
                    shard,
                    copied,
                    seconds = started.elapsed().as_secs_f64(),
                    "replica repaired and active"
                );
                Ok(())
            }
            Err(reason) => {
                metrics::counter!("sift_replica_repairs_total", "outcome" => "failed").increment(1);
                // Dead again, so that reads keep skipping it and the next round fills it.
                if !matches!(reason, ShardError::KbDeleted) {
                    let _ = self
                        .set_state(kb_id, shard, ReplicaState::Dead, ReplicaState::Recovering)
                        .await;
                }
                Err(reason)
            }
        }
    }

    /// Copies the documents an active replica has and this one lacks; then removes the
    /// tombstoned ones. Returns how many documents were copied.
    async fn copy_missing(&self, kb_id: &str, shard: u32, local: u64) -> Result<usize, ShardError> {
        let access = &self.context.access;
        let store = self.context.meta.store();
        // The placement as the cluster has it now (this replica is recovering).
        self.context
            .meta
            .linearizable_barrier()
            .await
            .map_err(|error| ShardError::metadata(&error))?;
        let kb = store
            .get_kb(kb_id)
            .map_err(|error| ShardError::metadata(&error.into()))?
            .ok_or(ShardError::KbDeleted)?;
        open_local_shards(&self.shards, access, &kb)
            .await
            .map_err(|error| ShardError::from_replica(&error))?;
        let Some(source) = access
            .read_plan(&kb, shard)
            .into_iter()
            .find(|node| *node != local)
        else {
            return Err(ShardError::NoReplica { shard });
        };
        let timeout = access.options().remote_write_timeout;
        let source_ids = match access
            .remote_call(
                source,
                &ShardRpc::DocumentIds {
                    kb_id: kb_id.to_string(),
                    shard,
                },
                timeout,
            )
            .await?
        {
            ShardReply::DocumentIds(ids) => ids,
            other => return Err(unexpected(other)),
        };
        let local_ids: HashSet<String> = access
            .local_call(kb_id, shard, timeout, |reply| ShardMessage::DocumentIds {
                reply,
            })
            .await?
            .into_iter()
            .collect();
        let missing: Vec<String> = source_ids
            .into_iter()
            .filter(|id| !local_ids.contains(id))
            .collect();
        let mut copied = 0;
        for batch in missing.chunks(REPAIR_BATCH_DOCUMENTS) {
            let documents = match access
                .remote_call(
                    source,
                    &ShardRpc::Export {
                        kb_id: kb_id.to_string(),
                        shard,
                        document_ids: batch.to_vec(),
                    },
                    timeout,
                )
                .await?
            {
                ShardReply::Exported(documents) => documents,
                other => return Err(unexpected(other)),
            };
            let bytes: usize = documents
                .iter()
                .flat_map(|d| d.chunks.iter())
                .map(|c| c.text.len() + c.vector.len() * 4)
                .sum();
            metrics::counter!("sift_replica_transfer_bytes_total").increment(bytes as u64);
            metrics::counter!("sift_replica_copied_documents_total")
                .increment(documents.len() as u64);
            copied += documents.len();
            if !documents.is_empty() {
                access
                    .write_local(kb_id, shard, ShardWrite::Documents(documents))
                    .await?;
            }
        }
        let tombstones = store
            .tombstones(kb_id)
            .map_err(|error| ShardError::metadata(&error.into()))?;
        for tombstone in tombstones {
            if tombstone.shard == shard {
                access
                    .delete_local(kb_id, shard, &tombstone.document_id)
                    .await;
            }
        }
        Ok(copied)
    }
}
