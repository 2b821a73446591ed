//! Who ingests a document, and where its raw bytes live (cluster mode).
//!
//! An upload's raw bytes are stored durably with the replicas of its shard before the upload
//! is acknowledged ([`store_with_replicas`]); the document's ingestion worker is one of those
//! replicas, chosen by ingestion queue depth, and is recorded in Raft with the document (the
//! pending-work index). Every node queues the pending documents assigned to it
//! ([`queue_assigned`]), so a lost notification or a restart only delays work. The leader's
//! reconciler (`crate::reconcile`) hands the documents of a worker that stopped answering to
//! another replica of the shard ([`notify_workers`] tells the new one); a worker without the
//! bytes fetches them from a node that has them ([`fetch_raw`]).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use sift_storage::meta::{DocumentRecord, KbRecord, ReplicaState};
use tracing::{info, warn};

use super::queue::{IngestJob, IngestQueue};
use super::raw_store::RawStore;
use crate::context::NodeContext;
use crate::error::{Result, SiftError};
use crate::shards::access::unexpected;
use crate::shards::rpc::RawDocument;
use crate::shards::{ShardError, ShardReply, ShardRpc};

/// Documents per ingestion job when work is split.
pub const JOB_DOCUMENTS: usize = 256;
/// Raw bytes per request when raw documents are sent to a replica.
const RAW_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// How long an `Ingest` or `GetRaw` request may take.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// Stores the raw bytes of `records` (already stored on this node) with the replicas of their
/// shards and returns each document's ingestion worker. A shard is acknowledged when at least
/// `write_quorum` of its live replicas hold the bytes (this node counts when it is one of
/// them); otherwise the whole request fails with `shard_unavailable` and nothing is
/// registered. The worker is the replica holding the bytes with the shortest ingestion queue
/// (active replicas first, this node first on ties). A KB without placement (a single node)
/// is ingested here.
pub async fn store_with_replicas(
    context: &NodeContext,
    queue: &IngestQueue,
    kb: &KbRecord,
    records: &[DocumentRecord],
) -> Result<Vec<u64>> {
    let access = &context.access;
    let local = access.local_id();
    if kb.placement.is_empty() || !context.meta.is_replicated() {
        return Ok(vec![local; records.len()]);
    }
    let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (position, record) in records.iter().enumerate() {
        by_shard.entry(record.shard).or_default().push(position);
    }
    let local_depth = queue.depth();
    let shards = by_shard.into_iter().map(|(shard, positions)| async move {
        let replicas: Vec<_> = kb
            .replicas(shard)
            .iter()
            .filter(|r| r.state != ReplicaState::Dead)
            .cloned()
            .collect();
        let batch: Vec<DocumentRecord> = positions.iter().map(|&p| records[p].clone()).collect();
        let documents = context.raw.blocking(move |raw| -> Result<Vec<RawDocument>> {
            batch
                .iter()
                .map(|record| {
                    let upload = RawStore::is_upload(record);
                    let bytes = raw.get(&record.id, upload)?.ok_or_else(|| {
                        SiftError::Internal(format!("raw bytes of {} vanished", record.id))
                    })?;
                    Ok(RawDocument {
                        document_id: record.id.clone(),
                        upload,
                        bytes,
                    })
                })
                .collect()
        })
        .await?;
        let sends = replicas.iter().filter(|r| r.node != local).map(|replica| {
            let documents = &documents;
            async move {
                let outcome = put_raw(context, replica.node, &kb.id, shard, documents).await;
                (replica.node, replica.state, outcome)
            }
        });
        // (node, queue depth, active)
        let mut holders: Vec<(u64, usize, bool)> = Vec::new();
        if let Some(own) = replicas.iter().find(|r| r.node == local) {
            holders.push((local, local_depth, own.state == ReplicaState::Active));
        }
        let mut reasons = Vec::new();
        for (node, state, outcome) in join_all(sends).await {
            match outcome {
                Ok(depth) => holders.push((node, depth, state == ReplicaState::Active)),
                Err(reason) => {
                    warn!(kb_id = %kb.id, shard, node, %reason, "storing raw documents with a replica failed");
                    reasons.push(reason.to_string());
                }
            }
        }
        let required = (access.options().write_quorum as usize).clamp(1, replicas.len().max(1));
        if holders.len() < required {
            metrics::counter!("sift_raw_store_quorum_failures_total").increment(1);
            return Err(SiftError::ShardUnavailable {
                kb_id: kb.id.clone(),
                shard,
                reason: format!(
                    "the raw documents reached {} of the {required} replicas required ({})",
                    holders.len(),
                    if reasons.is_empty() {
                        "no live replica".to_string()
                    } else {
                        reasons.join("; ")
                    }
                ),
            });
        }
        let worker = holders
            .iter()
            .min_by_key(|(node, depth, active)| (!active, *depth, *node != local, *node))
            .map(|(node, _, _)| *node)
            .unwrap_or(local);
        Ok((positions, worker))
    });
    let mut workers = vec![local; records.len()];
    for outcome in join_all(shards).await {
        let (positions, worker) = outcome?;
        for position in positions {
            workers[position] = worker;
        }
    }
    Ok(workers)
}

/// Sends raw documents to `node` in batches; returns its ingestion queue depth.
async fn put_raw(
    context: &NodeContext,
    node: u64,
    kb_id: &str,
    shard: u32,
    documents: &[RawDocument],
) -> std::result::Result<usize, ShardError> {
    let timeout = context.access.options().remote_write_timeout;
    let mut depth = 0;
    let mut start = 0;
    while start < documents.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < documents.len()
            && (end == start || bytes + documents[end].bytes.len() <= RAW_BATCH_BYTES)
        {
            bytes += documents[end].bytes.len();
            end += 1;
        }
        let rpc = ShardRpc::PutRaw {
            kb_id: kb_id.to_string(),
            shard,
            documents: documents[start..end].to_vec(),
        };
        match context.access.remote_call(node, &rpc, timeout).await? {
            ShardReply::RawStored { queue_depth } => depth = queue_depth,
            other => return Err(unexpected(other)),
        }
        metrics::counter!("sift_raw_transfer_bytes_total").increment(bytes as u64);
        start = end;
    }
    Ok(depth)
}

/// Tells remote workers about documents just assigned to them (best effort: each node also
/// finds its work in the pending-work index).
pub fn notify_workers(
    context: &std::sync::Arc<NodeContext>,
    kb_id: &str,
    assignments: BTreeMap<(u64, u32), Vec<String>>,
) {
    let local = context.access.local_id();
    for ((worker, shard), document_ids) in assignments {
        if worker == local {
            continue;
        }
        let context = context.clone();
        let kb_id = kb_id.to_string();
        tokio::spawn(async move {
            let rpc = ShardRpc::Ingest {
                kb_id,
                shard,
                document_ids,
            };
            if let Err(reason) = context
                .access
                .remote_call(worker, &rpc, NOTIFY_TIMEOUT)
                .await
            {
                warn!(worker, %reason, "notifying an ingestion worker failed; it will find the work itself");
            }
        });
    }
}

/// Queues `document_ids` of `kb_id` here, skipping those already queued or in progress. With
/// `wait`, waits for room (start-up); otherwise queues only while the queue has room to spare
/// and leaves the rest for a later round. Returns how many documents were queued.
pub async fn queue_documents(
    queue: &IngestQueue,
    kb_id: &str,
    document_ids: &[String],
    wait: bool,
) -> usize {
    let claimed = queue.claim(document_ids);
    let mut queued = 0;
    let mut batches = claimed.chunks(JOB_DOCUMENTS);
    for batch in batches.by_ref() {
        let job = IngestJob {
            kb_id: kb_id.to_string(),
            document_ids: batch.to_vec(),
            retries: 0,
        };
        if wait {
            let queue = queue.clone();
            tokio::spawn(async move {
                let ids = job.document_ids.clone();
                if let Err(error) = queue.submit(job).await {
                    warn!(%error, "could not resume ingestion");
                    queue.release(&ids);
                }
            });
        } else if !queue.has_room(1) || queue.try_submit(job).is_err() {
            queue.release(batch);
            break;
        }
        queued += batch.len();
    }
    for rest in batches {
        queue.release(rest);
    }
    queued
}

/// Queues the unfinished documents this node ingests and has not queued yet: those assigned
/// to it, and those registered before workers were recorded whose raw bytes are here.
pub async fn queue_assigned(context: &NodeContext, queue: &IngestQueue, wait: bool) -> usize {
    let store = context.meta.store();
    let Ok(pending) = store.pending_documents() else {
        return 0;
    };
    let local = context.access.local_id();
    let mut by_kb: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in pending {
        let mine = match entry.work.worker {
            0 => store
                .get_document(&entry.kb_id, &entry.document_id)
                .ok()
                .flatten()
                .is_some_and(|record| context.raw.has(&record)),
            worker => worker == local,
        };
        if mine {
            by_kb
                .entry(entry.kb_id)
                .or_default()
                .push(entry.document_id);
        }
    }
    let mut queued = 0;
    for (kb_id, ids) in by_kb {
        let count = queue_documents(queue, &kb_id, &ids, wait).await;
        if count > 0 {
            info!(kb_id, documents = count, "queued pending ingestion work");
        }
        queued += count;
    }
    queued
}

/// Where a worker's missing raw bytes came from.
pub enum Fetched {
    Stored,
    /// Some node that might hold them did not answer: try again later.
    Unreachable(String),
    /// Every node answered and none holds them.
    Lost,
}

/// Fetches a document's raw bytes from the nodes that may hold them (its shard's replicas
/// first, then every other member) and stores them here.
pub async fn fetch_raw(context: &NodeContext, kb: &KbRecord, record: &DocumentRecord) -> Fetched {
    let access = &context.access;
    let local = access.local_id();
    let mut candidates: Vec<u64> = kb.replicas(record.shard).iter().map(|r| r.node).collect();
    for member in access.peers().members() {
        if !candidates.contains(&member) {
            candidates.push(member);
        }
    }
    candidates.retain(|node| *node != local);
    let upload = RawStore::is_upload(record);
    let mut unreachable = Vec::new();
    for node in candidates {
        let rpc = ShardRpc::GetRaw {
            kb_id: kb.id.clone(),
            shard: record.shard,
            document_id: record.id.clone(),
            upload,
        };
        match access.remote_call(node, &rpc, NOTIFY_TIMEOUT).await {
            Ok(ShardReply::Raw(Some(bytes))) => {
                let document = RawDocument {
                    document_id: record.id.clone(),
                    upload,
                    bytes,
                };
                return match context
                    .raw
                    .blocking(move |raw| raw.put_many(&[document]))
                    .await
                {
                    Ok(()) => Fetched::Stored,
                    Err(error) => Fetched::Unreachable(error.to_string()),
                };
            }
            Ok(_) => {}
            Err(reason) => unreachable.push((node, reason)),
        }
    }
    if unreachable.is_empty() {
        Fetched::Lost
    } else {
        Fetched::Unreachable(ShardError::Replicas(unreachable).to_string())
    }
}
