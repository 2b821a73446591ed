//! Reaching a shard wherever its replicas live.
//!
//! A KB's placement (in the replicated metadata) names each shard's replicas and their
//! states. [`ShardAccess`] turns a shard operation into replica requests — the local actor
//! when the replica is on this node, a [`ShardRpc`] over the internal port otherwise:
//!
//! - **reads** (leaf searches, chunk fetches) go to one active replica, local first, then the
//!   least loaded; a search is hedged to a second replica after `hedge_after` and a failed
//!   one is retried once on another replica, all within the shard deadline;
//! - **writes** go to every replica that is not dead, in parallel; they are acknowledged when
//!   `write_quorum` active replicas stored them and every replica that failed was marked dead
//!   through Raft (so an active replica never misses an acknowledged write), after a
//!   linearizable re-read of the placement has found no replica that joined meanwhile;
//! - **deletes** go to every replica that is not dead; one that misses it applies the
//!   tombstone when it restarts or is repaired.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use ractor::rpc::CallResult;
use sift_storage::chunk::{ChunkView, DocumentWrite, ShardWrite};
use sift_storage::meta::{KbRecord, MetaOp, Replica, ReplicaState};
use tracing::{info, warn};

use super::error::ShardError;
use super::hedge::{HedgeTimes, LeafService, hedged_search};
use super::messages::{LeafRequest, LeafResponse, ShardMessage};
use super::registry::ShardRegistry;
use super::rpc::{Peers, ShardReply, ShardRpc};
use crate::meta::MetaHandle;

/// Tunables of replica access.
#[derive(Clone, Debug)]
pub struct AccessOptions {
    /// Deadline of one shard's leaf search, hedges and retries included.
    pub shard_deadline: Duration,
    /// Longest a write may take on this node's own replica.
    pub local_write_timeout: Duration,
    /// Longest a write may take on another node's replica before it is marked dead.
    pub remote_write_timeout: Duration,
    /// A leaf search not answered after this goes to a second replica as well.
    pub hedge_after: Duration,
    /// Active replicas that must store a write before it is acknowledged (at most the
    /// replication factor).
    pub write_quorum: u32,
}

impl Default for AccessOptions {
    fn default() -> Self {
        AccessOptions {
            shard_deadline: Duration::from_secs(5),
            local_write_timeout: Duration::from_secs(300),
            remote_write_timeout: Duration::from_secs(30),
            hedge_after: Duration::from_millis(100),
            write_quorum: 1,
        }
    }
}

/// How long a write waits for this node's replica while its supervisor restarts it.
const LOCAL_RESTART_PATIENCE: Duration = Duration::from_secs(15);
/// Encoded size above which a replica write is split into several requests.
const WRITE_BATCH_BYTES: usize = 16 * 1024 * 1024;

#[derive(Clone)]
pub struct ShardAccess {
    registry: ShardRegistry,
    meta: MetaHandle,
    peers: Arc<Peers>,
    options: AccessOptions,
}

/// The replicas of one shard as [`hedged_search`] asks them.
struct ReplicaLeaves<'a> {
    access: &'a ShardAccess,
    kb_id: &'a str,
    shard: u32,
    leaf: Arc<LeafRequest>,
}

impl LeafService for ReplicaLeaves<'_> {
    fn ask(&self, node: u64) -> BoxFuture<'_, Result<LeafResponse, ShardError>> {
        Box::pin(
            self.access
                .leaf_on(node, self.kb_id, self.shard, self.leaf.clone()),
        )
    }
}

impl ShardAccess {
    pub fn new(
        registry: ShardRegistry,
        meta: MetaHandle,
        peers: Arc<Peers>,
        options: AccessOptions,
    ) -> Self {
        ShardAccess {
            registry,
            meta,
            peers,
            options,
        }
    }

    pub fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }

    pub fn options(&self) -> &AccessOptions {
        &self.options
    }

    pub fn local_id(&self) -> u64 {
        self.peers.local_id()
    }

    /// The nodes that may receive new replicas: the members not being drained.
    pub fn placement_members(&self) -> Vec<u64> {
        let draining = self.meta.store().draining_nodes().unwrap_or_default();
        let mut members = self.peers.members();
        members.retain(|node| !draining.contains(node));
        members
    }

    /// The replicas of `shard`: the placement's, or this node alone for a KB without one.
    pub fn replicas(&self, kb: &KbRecord, shard: u32) -> Vec<Replica> {
        let replicas = kb.replicas(shard);
        if replicas.is_empty() {
            vec![Replica {
                node: self.local_id(),
                state: ReplicaState::Active,
                since_ms: kb.created_at_ms,
            }]
        } else {
            replicas.to_vec()
        }
    }

    /// The shards of `kb` with a replica on this node.
    pub fn local_shards(&self, kb: &KbRecord) -> Vec<u32> {
        let local = self.local_id();
        (0..kb.settings.shards)
            .filter(|shard| self.replicas(kb, *shard).iter().any(|r| r.node == local))
            .collect()
    }

    /// Active replicas of `shard` in the order to try them: nodes that recently failed to
    /// answer last, then this node, then the least loaded, then by node id (so equal nodes
    /// plan alike).
    pub fn read_plan(&self, kb: &KbRecord, shard: u32) -> Vec<u64> {
        let local = self.local_id();
        let mut active: Vec<u64> = self
            .replicas(kb, shard)
            .into_iter()
            .filter(|r| r.state == ReplicaState::Active)
            .map(|r| r.node)
            .collect();
        active.sort_by_key(|node| {
            (
                *node != local && self.peers.suspect(*node),
                *node != local,
                self.peers.inflight(*node),
                *node,
            )
        });
        active
    }

    // ---- reads ----

    /// One shard's leaf search: the first active replica, hedged to the next after
    /// `hedge_after`, a failure retried once on another replica, all within the deadline
    /// (the policy is [`hedged_search`]). Its span is the shard's leaf in the search's trace.
    #[tracing::instrument(name = "leaf", skip_all, fields(kb_id = %kb.id, shard = shard))]
    pub async fn search(
        &self,
        kb: &KbRecord,
        shard: u32,
        leaf: Arc<LeafRequest>,
    ) -> Result<LeafResponse, ShardError> {
        let plan = self.read_plan(kb, shard);
        if plan.is_empty() {
            return Err(ShardError::NoReplica { shard });
        }
        let replicas = ReplicaLeaves {
            access: self,
            kb_id: &kb.id,
            shard,
            leaf,
        };
        let times = HedgeTimes {
            hedge_after: self.options.hedge_after,
            deadline: self.options.shard_deadline,
        };
        let hedged = hedged_search(&replicas, &plan, times).await;
        if let Some(outran) = hedged.outran
            && outran != self.local_id()
        {
            self.peers.note_unresponsive(outran);
        }
        hedged.outcome
    }

    async fn leaf_on(
        &self,
        node: u64,
        kb_id: &str,
        shard: u32,
        leaf: Arc<LeafRequest>,
    ) -> Result<LeafResponse, ShardError> {
        let deadline = self.options.shard_deadline;
        if node == self.local_id() {
            return self
                .local_call(kb_id, shard, deadline, |reply| ShardMessage::Search {
                    request: leaf,
                    reply,
                })
                .await;
        }
        let rpc = ShardRpc::Search {
            kb_id: kb_id.to_string(),
            shard,
            request: (*leaf).clone(),
        };
        match self.peers.call(node, &rpc, deadline).await? {
            ShardReply::Search(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }

    /// Every chunk of a document, from the first active replica that answers; `None` when
    /// that replica does not hold the document (not indexed yet, or deleted).
    pub async fn chunks(
        &self,
        kb: &KbRecord,
        shard: u32,
        document_id: &str,
    ) -> Result<Option<Vec<ChunkView>>, ShardError> {
        let mut errors = Vec::new();
        for node in self.read_plan(kb, shard) {
            let outcome = if node == self.local_id() {
                let document_id = document_id.to_string();
                self.local_call(&kb.id, shard, self.options.shard_deadline, |reply| {
                    ShardMessage::Chunks { document_id, reply }
                })
                .await
                .map(Some)
            } else {
                let rpc = ShardRpc::Chunks {
                    kb_id: kb.id.clone(),
                    shard,
                    document_id: document_id.to_string(),
                };
                match self
                    .peers
                    .call(node, &rpc, self.options.shard_deadline)
                    .await
                {
                    Ok(ShardReply::Chunks(chunks)) => Ok(Some(chunks)),
                    Ok(other) => Err(unexpected(other)),
                    Err(error) => Err(error),
                }
            };
            match outcome {
                Ok(chunks) => return Ok(chunks),
                // The replica does not hold the document (not indexed yet, or deleted).
                Err(error) if error.is_not_found() => return Ok(None),
                Err(error) => errors.push((node, error)),
            }
        }
        if errors.is_empty() {
            return Err(ShardError::NoReplica { shard });
        }
        Err(ShardError::Replicas(errors))
    }

    // ---- writes ----

    /// Writes `documents` to every replica of `shard` that is not dead (see
    /// [`Self::apply`]).
    pub async fn write(
        &self,
        kb: &KbRecord,
        shard: u32,
        documents: Vec<DocumentWrite>,
    ) -> Result<(), ShardError> {
        self.apply(kb, shard, ShardWrite::Documents(documents))
            .await
    }

    /// Applies `write` to every replica of `shard` that is not dead. Ok once
    /// `write_quorum` active replicas applied it and every replica that failed is marked
    /// dead; otherwise the reason.
    pub async fn apply(
        &self,
        kb: &KbRecord,
        shard: u32,
        write: ShardWrite,
    ) -> Result<(), ShardError> {
        let mut written: BTreeSet<u64> = BTreeSet::new();
        let mut kb = kb.clone();
        loop {
            let targets: Vec<Replica> = self
                .replicas(&kb, shard)
                .into_iter()
                .filter(|r| r.state != ReplicaState::Dead && !written.contains(&r.node))
                .collect();
            let writes = targets.iter().map(|replica| {
                let write = write.clone();
                let kb_id = kb.id.clone();
                async move {
                    (
                        replica.clone(),
                        self.write_on(replica.node, &kb_id, shard, write).await,
                    )
                }
            });
            let mut failed = Vec::new();
            for (replica, outcome) in join_all(writes).await {
                match outcome {
                    Ok(()) => {
                        written.insert(replica.node);
                    }
                    Err(reason) => {
                        warn!(kb_id = %kb.id, shard, node = replica.node, %reason, "replica write failed");
                        failed.push((replica, reason));
                    }
                }
            }
            if written.is_empty() {
                metrics::counter!("sift_shard_write_quorum_failures_total").increment(1);
                if failed.is_empty() {
                    return Err(ShardError::NoReplica { shard });
                }
                return Err(ShardError::Replicas(
                    failed
                        .into_iter()
                        .map(|(replica, reason)| (replica.node, reason))
                        .collect(),
                ));
            }
            // A replica that missed the write must not serve reads: dead before the ack.
            for (replica, reason) in &failed {
                self.mark_dead(&kb.id, shard, replica, &reason.to_string())
                    .await?;
            }
            // Settle the placement cluster-wide: a replica that became writable after we read
            // it (a repair started) gets the write too, so its copy cannot miss it.
            if self.meta.is_replicated() {
                self.meta
                    .linearizable_barrier()
                    .await
                    .map_err(|error| ShardError::metadata(&error))?;
            }
            let current = match self.meta.store().get_kb(&kb.id) {
                Ok(Some(current)) => current,
                Ok(None) => return Err(ShardError::KbDeleted),
                Err(error) => return Err(ShardError::metadata(&error.into())),
            };
            let replicas = self.replicas(&current, shard);
            let missing = replicas
                .iter()
                .any(|r| r.state != ReplicaState::Dead && !written.contains(&r.node));
            if !missing {
                let active = replicas
                    .iter()
                    .filter(|r| r.state == ReplicaState::Active && written.contains(&r.node))
                    .count() as u32;
                let needed = self
                    .options
                    .write_quorum
                    .clamp(1, current.settings.replication_factor.max(1));
                if active < needed {
                    metrics::counter!("sift_shard_write_quorum_failures_total").increment(1);
                    return Err(ShardError::Quorum(format!(
                        "shard {shard}: {active} active replicas stored the write, {needed} needed"
                    )));
                }
                return Ok(());
            }
            kb = current;
        }
    }

    async fn mark_dead(
        &self,
        kb_id: &str,
        shard: u32,
        replica: &Replica,
        reason: &str,
    ) -> Result<(), ShardError> {
        info!(kb_id, shard, node = replica.node, %reason, "marking a replica dead");
        metrics::counter!("sift_replica_marked_dead_total").increment(1);
        self.meta
            .propose(MetaOp::SetReplicaState {
                kb_id: kb_id.to_string(),
                shard,
                node: replica.node,
                state: ReplicaState::Dead,
                expected: Some(replica.state),
                at_ms: crate::ingest::pipeline::now_ms(),
            })
            .await
            .map(|_| ())
            .map_err(|error| ShardError::Metadata {
                message: format!(
                    "the replica on node {} missed the write and could not be marked dead: {error}",
                    replica.node
                ),
                transient: error.is_transient(),
            })
    }

    async fn write_on(
        &self,
        node: u64,
        kb_id: &str,
        shard: u32,
        write: ShardWrite,
    ) -> Result<(), ShardError> {
        if node == self.local_id() {
            return self.write_local(kb_id, shard, write).await;
        }
        let requests = match write {
            ShardWrite::Documents(documents) => split_by_size(documents)
                .into_iter()
                .map(ShardWrite::Documents)
                .collect(),
            other => vec![other],
        };
        for write in requests {
            let timeout = write_timeout(self.options.remote_write_timeout, &write);
            let rpc = ShardRpc::Write {
                kb_id: kb_id.to_string(),
                shard,
                write,
            };
            match self.peers.call(node, &rpc, timeout).await? {
                ShardReply::Written => {}
                other => return Err(unexpected(other)),
            }
        }
        Ok(())
    }

    /// Writes to this node's replica; one that is restarting (its supervisor is on it) is
    /// retried with backoff: writes are idempotent (a document id rewritten replaces itself).
    pub async fn write_local(
        &self,
        kb_id: &str,
        shard: u32,
        write: ShardWrite,
    ) -> Result<(), ShardError> {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        let timeout = write_timeout(self.options.local_write_timeout, &write);
        loop {
            let write = write.clone();
            let unavailable = match self
                .local_call(kb_id, shard, timeout, |reply| ShardMessage::Write {
                    write,
                    reply,
                })
                .await
            {
                Ok(()) => return Ok(()),
                // Not running, or stopped during the write: its supervisor is restarting it.
                Err(error @ (ShardError::NotRunning { .. } | ShardError::Stopped)) => error,
                Err(error) => return Err(error),
            };
            if started.elapsed() >= LOCAL_RESTART_PATIENCE {
                return Err(unavailable);
            }
            warn!(kb_id, shard, reason = %unavailable, "shard write will be retried");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Deletes a document from every replica that is not dead (idempotent). A replica that
    /// misses it applies the tombstone when its node restarts or repairs it.
    pub async fn delete(&self, kb: &KbRecord, shard: u32, document_id: &str) {
        let deletes = self
            .replicas(kb, shard)
            .into_iter()
            .filter(|r| r.state != ReplicaState::Dead)
            .map(|replica| async move {
                let outcome = if replica.node == self.local_id() {
                    let document_id = document_id.to_string();
                    self.local_call(&kb.id, shard, self.options.local_write_timeout, |reply| {
                        ShardMessage::Delete { document_id, reply }
                    })
                    .await
                    .map(|_| ())
                } else {
                    let rpc = ShardRpc::Delete {
                        kb_id: kb.id.clone(),
                        shard,
                        document_id: document_id.to_string(),
                    };
                    match self
                        .peers
                        .call(replica.node, &rpc, self.options.remote_write_timeout)
                        .await
                    {
                        Ok(ShardReply::Deleted(_)) => Ok(()),
                        Ok(other) => Err(unexpected(other)),
                        Err(error) => Err(error),
                    }
                };
                if let Err(reason) = outcome {
                    warn!(kb_id = %kb.id, shard, node = replica.node, document_id, %reason,
                        "deleting a document from a replica failed; its tombstone stays");
                }
            });
        join_all(deletes).await;
    }

    /// Deletes a document from this node's replica only (tombstone replay).
    pub async fn delete_local(&self, kb_id: &str, shard: u32, document_id: &str) {
        let document_id = document_id.to_string();
        if let Err(reason) = self
            .local_call(kb_id, shard, self.options.local_write_timeout, |reply| {
                ShardMessage::Delete {
                    document_id: document_id.clone(),
                    reply,
                }
            })
            .await
        {
            warn!(kb_id, shard, %document_id, %reason, "deleting a document from its shard failed");
        }
    }

    /// A call to this node's replica of `shard`.
    pub async fn local_call<T: Send + 'static>(
        &self,
        kb_id: &str,
        shard: u32,
        timeout: Duration,
        message: impl FnOnce(ractor::RpcReplyPort<crate::error::Result<T>>) -> ShardMessage,
    ) -> Result<T, ShardError> {
        let Some(actor) = self.registry.actor(kb_id, shard) else {
            return Err(ShardError::NotRunning { shard });
        };
        match actor.call(message, Some(timeout)).await {
            Ok(CallResult::Success(Ok(value))) => Ok(value),
            Ok(CallResult::Success(Err(error))) => Err(ShardError::from_replica(&error)),
            Ok(CallResult::Timeout) => Err(ShardError::Timeout(timeout)),
            // The mailbox is gone or the replica dropped the reply: it stopped.
            Ok(CallResult::SenderError) | Err(_) => Err(ShardError::Stopped),
        }
    }

    /// A request to another node's replica.
    pub async fn remote_call(
        &self,
        node: u64,
        rpc: &ShardRpc,
        timeout: Duration,
    ) -> Result<ShardReply, ShardError> {
        match self.peers.call(node, rpc, timeout).await? {
            ShardReply::Failed { code, message } => Err(ShardError::refused(code, message)),
            reply => Ok(reply),
        }
    }
}

/// A reply that is not the one the request expects: the replica's refusal, or nonsense.
pub(crate) fn unexpected(reply: ShardReply) -> ShardError {
    match reply {
        ShardReply::Failed { code, message } => ShardError::refused(code, message),
        other => ShardError::Protocol(format!("unexpected reply {other:?}")),
    }
}

/// Time a write is allowed per chunk on top of its base timeout. A replica inserts a few
/// hundred chunks a second into its HNSW graph on a loaded 2-core machine (run I2); this
/// leaves ten times that. Without it, a document of 90,000 chunks (an 85 MB CSV) outlasted
/// the 300 s local timeout: the job re-queued it while its replica went on inserting, and
/// wrote it again, holding both copies in memory.
const WRITE_TIME_PER_CHUNK: Duration = Duration::from_millis(20);

/// The timeout of `write`: `base` plus [`WRITE_TIME_PER_CHUNK`] a chunk.
fn write_timeout(base: Duration, write: &ShardWrite) -> Duration {
    let chunks = write.chunk_count();
    base.saturating_add(WRITE_TIME_PER_CHUNK.saturating_mul(chunks.min(u32::MAX as usize) as u32))
}

/// Splits a write into requests of at most [`WRITE_BATCH_BYTES`] (one document may exceed it
/// alone: a document is never split).
fn split_by_size(documents: Vec<DocumentWrite>) -> Vec<Vec<DocumentWrite>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    for document in documents {
        let size: usize = document
            .chunks
            .iter()
            .map(|c| c.text.len() + c.vector.len() * 4 + 64)
            .sum::<usize>()
            + document.parents.iter().map(|p| p.text.len()).sum::<usize>()
            + 256;
        if !batch.is_empty() && bytes + size > WRITE_BATCH_BYTES {
            batches.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        bytes += size;
        batch.push(document);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use sift_storage::chunk::{ChunkRecord, DocumentEntry};

    fn document(chunks: usize) -> DocumentWrite {
        DocumentWrite {
            entry: DocumentEntry {
                document_id: "d".into(),
                external_id: None,
                title: "t".into(),
                metadata: Default::default(),
            },
            parents: Vec::new(),
            chunks: (0..chunks)
                .map(|position| ChunkRecord {
                    position: position as u32,
                    parent_position: 0,
                    text: String::new(),
                    heading_path: Vec::new(),
                    span: (0, 0),
                    vector: Vec::new(),
                    pages: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_write_has_time_for_each_of_its_chunks() {
        let base = Duration::from_secs(300);
        let documents = |documents: Vec<DocumentWrite>| ShardWrite::Documents(documents);
        assert_eq!(write_timeout(base, &documents(vec![])), base);
        assert_eq!(
            write_timeout(base, &documents(vec![document(10), document(40)])),
            base + Duration::from_secs(1)
        );
        // The 90,000 chunks of an 85 MB CSV: half an hour more, not five minutes in all.
        assert_eq!(
            write_timeout(base, &documents(vec![document(90_000)])),
            base + Duration::from_secs(1_800)
        );
        // Its commit reads them all back into the indexes: the same time.
        let commit = ShardWrite::Commit(sift_storage::chunk::DocumentCommit {
            entry: document(0).entry,
            chunk_count: 90_000,
            parent_count: 1,
        });
        assert_eq!(
            write_timeout(base, &commit),
            base + Duration::from_secs(1_800)
        );
    }
}
