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
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use ractor::rpc::CallResult;
use sift_storage::chunk::{ChunkView, DocumentWrite};
use sift_storage::meta::{KbRecord, MetaOp, Replica, ReplicaState};
use tracing::{info, warn};

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

type LeafFuture<'a> =
    Pin<Box<dyn std::future::Future<Output = (u64, Result<LeafResponse, String>)> + Send + 'a>>;

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
    /// `hedge_after`, a failure retried once on another replica, all within the deadline.
    pub async fn search(
        &self,
        kb: &KbRecord,
        shard: u32,
        leaf: Arc<LeafRequest>,
    ) -> Result<LeafResponse, String> {
        let plan = self.read_plan(kb, shard);
        if plan.is_empty() {
            return Err("no active replica".into());
        }
        let deadline = tokio::time::sleep(self.options.shard_deadline);
        tokio::pin!(deadline);
        let hedge = tokio::time::sleep(self.options.hedge_after);
        tokio::pin!(hedge);
        let mut pending: FuturesUnordered<LeafFuture<'_>> = FuturesUnordered::new();
        let mut next = 0;
        pending.push(self.leaf_future(&kb.id, shard, plan[next], leaf.clone()));
        next += 1;
        let mut hedged = false;
        let mut retried = false;
        let mut errors: Vec<String> = Vec::new();
        loop {
            tokio::select! {
                Some((node, outcome)) = pending.next() => match outcome {
                    Ok(response) => {
                        metrics::counter!("sift_search_leaf_total", "outcome" => "ok").increment(1);
                        // A hedge outran the first replica, which has not answered: read it
                        // last for a while (a failure was already noted by the call).
                        let first = plan[0];
                        if hedged && node != first && first != self.local_id() && errors.is_empty() {
                            self.peers.note_unresponsive(first);
                        }
                        return Ok(response);
                    }
                    Err(reason) => {
                        metrics::counter!("sift_search_leaf_total", "outcome" => "error").increment(1);
                        errors.push(format!("replica on node {node}: {reason}"));
                        if !retried && next < plan.len() {
                            retried = true;
                            metrics::counter!("sift_search_leaf_retries_total").increment(1);
                            pending.push(self.leaf_future(&kb.id, shard, plan[next], leaf.clone()));
                            next += 1;
                        } else if pending.is_empty() {
                            return Err(errors.join("; "));
                        }
                    }
                },
                () = &mut hedge, if !hedged && next < plan.len() => {
                    hedged = true;
                    metrics::counter!("sift_search_leaf_hedged_total").increment(1);
                    pending.push(self.leaf_future(&kb.id, shard, plan[next], leaf.clone()));
                    next += 1;
                }
                () = &mut deadline => {
                    metrics::counter!("sift_search_leaf_total", "outcome" => "timeout").increment(1);
                    errors.push(format!(
                        "no answer within {} ms",
                        self.options.shard_deadline.as_millis()
                    ));
                    return Err(errors.join("; "));
                }
            }
        }
    }

    fn leaf_future<'a>(
        &'a self,
        kb_id: &str,
        shard: u32,
        node: u64,
        leaf: Arc<LeafRequest>,
    ) -> LeafFuture<'a> {
        let kb_id = kb_id.to_string();
        Box::pin(async move { (node, self.leaf_on(node, &kb_id, shard, leaf).await) })
    }

    async fn leaf_on(
        &self,
        node: u64,
        kb_id: &str,
        shard: u32,
        leaf: Arc<LeafRequest>,
    ) -> Result<LeafResponse, String> {
        let deadline = self.options.shard_deadline;
        if node == self.local_id() {
            let Some(actor) = self.registry.actor(kb_id, shard) else {
                return Err("shard replica is not running".to_string());
            };
            return match actor
                .call(
                    |reply| ShardMessage::Search {
                        request: leaf,
                        reply,
                    },
                    Some(deadline),
                )
                .await
            {
                Ok(CallResult::Success(Ok(response))) => Ok(response),
                Ok(CallResult::Success(Err(error))) => Err(error.to_string()),
                Ok(CallResult::Timeout) => {
                    Err(format!("no answer within {} ms", deadline.as_millis()))
                }
                Ok(CallResult::SenderError) => {
                    Err("shard replica stopped before answering".to_string())
                }
                Err(error) => Err(format!("shard replica unreachable: {error}")),
            };
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
    ) -> Result<Option<Vec<ChunkView>>, String> {
        let mut errors = Vec::new();
        for node in self.read_plan(kb, shard) {
            let outcome = if node == self.local_id() {
                let Some(actor) = self.registry.actor(&kb.id, shard) else {
                    errors.push(format!("replica on node {node}: not running"));
                    continue;
                };
                let document_id = document_id.to_string();
                match actor
                    .call(
                        |reply| ShardMessage::Chunks { document_id, reply },
                        Some(self.options.shard_deadline),
                    )
                    .await
                {
                    Ok(CallResult::Success(Ok(chunks))) => Ok(Some(chunks)),
                    Ok(CallResult::Success(Err(crate::error::SiftError::Storage(
                        sift_storage::StorageError::NotFound(_),
                    )))) => Ok(None),
                    Ok(CallResult::Success(Err(error))) => Err(error.to_string()),
                    Ok(CallResult::Timeout) => Err("no answer in time".to_string()),
                    _ => Err("replica stopped before answering".to_string()),
                }
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
                    Ok(ShardReply::Failed { code, .. }) if code == "not_found" => Ok(None),
                    Ok(other) => Err(unexpected(other)),
                    Err(error) => Err(error),
                }
            };
            match outcome {
                Ok(chunks) => return Ok(chunks),
                Err(error) => errors.push(format!("replica on node {node}: {error}")),
            }
        }
        if errors.is_empty() {
            errors.push("no active replica".into());
        }
        Err(errors.join("; "))
    }

    // ---- writes ----

    /// Writes `documents` to every replica of `shard` that is not dead. Ok once
    /// `write_quorum` active replicas stored them and every replica that failed is marked
    /// dead; otherwise the reason.
    pub async fn write(
        &self,
        kb: &KbRecord,
        shard: u32,
        documents: Vec<DocumentWrite>,
    ) -> Result<(), String> {
        let mut written: BTreeSet<u64> = BTreeSet::new();
        let mut kb = kb.clone();
        loop {
            let targets: Vec<Replica> = self
                .replicas(&kb, shard)
                .into_iter()
                .filter(|r| r.state != ReplicaState::Dead && !written.contains(&r.node))
                .collect();
            let writes = targets.iter().map(|replica| {
                let documents = documents.clone();
                let kb_id = kb.id.clone();
                async move {
                    (
                        replica.clone(),
                        self.write_on(replica.node, &kb_id, shard, documents).await,
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
                let reasons: Vec<String> = failed
                    .iter()
                    .map(|(r, reason)| format!("node {}: {reason}", r.node))
                    .collect();
                metrics::counter!("sift_shard_write_quorum_failures_total").increment(1);
                return Err(format!(
                    "no replica of shard {shard} stored the write ({})",
                    reasons.join("; ")
                ));
            }
            // A replica that missed the write must not serve reads: dead before the ack.
            for (replica, reason) in &failed {
                self.mark_dead(&kb.id, shard, replica, reason).await?;
            }
            // Settle the placement cluster-wide: a replica that became writable after we read
            // it (a repair started) gets the write too, so its copy cannot miss it.
            if self.meta.is_replicated() {
                self.meta
                    .linearizable_barrier()
                    .await
                    .map_err(|error| format!("confirming the placement: {error}"))?;
            }
            let current = match self.meta.store().get_kb(&kb.id) {
                Ok(Some(current)) => current,
                Ok(None) => return Err("the knowledge base was deleted".into()),
                Err(error) => return Err(error.to_string()),
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
                    return Err(format!(
                        "shard {shard}: {active} active replicas stored the write, {needed} needed"
                    ));
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
    ) -> Result<(), String> {
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
            .map_err(|error| {
                format!(
                    "replica on node {} missed the write and could not be marked dead: {error}",
                    replica.node
                )
            })
    }

    async fn write_on(
        &self,
        node: u64,
        kb_id: &str,
        shard: u32,
        documents: Vec<DocumentWrite>,
    ) -> Result<(), String> {
        if node == self.local_id() {
            return self.write_local(kb_id, shard, documents).await;
        }
        for batch in split_by_size(documents) {
            let rpc = ShardRpc::Write {
                kb_id: kb_id.to_string(),
                shard,
                documents: batch,
            };
            match self
                .peers
                .call(node, &rpc, self.options.remote_write_timeout)
                .await?
            {
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
        documents: Vec<DocumentWrite>,
    ) -> Result<(), String> {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            let unavailable = match self.registry.actor(kb_id, shard) {
                None => format!("shard {shard} is not running on this node"),
                Some(actor) => {
                    let documents = documents.clone();
                    match actor
                        .call(
                            |reply| ShardMessage::Write { documents, reply },
                            Some(self.options.local_write_timeout),
                        )
                        .await
                    {
                        Ok(CallResult::Success(Ok(()))) => return Ok(()),
                        Ok(CallResult::Success(Err(error))) => return Err(error.to_string()),
                        Ok(CallResult::Timeout) => {
                            return Err(format!("shard {shard} write timed out"));
                        }
                        Ok(CallResult::SenderError) => {
                            format!("shard {shard} stopped during the write")
                        }
                        Err(error) => format!("shard {shard} unreachable: {error}"),
                    }
                }
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
    ) -> Result<T, String> {
        let Some(actor) = self.registry.actor(kb_id, shard) else {
            return Err(format!("shard {shard} is not running on this node"));
        };
        match actor.call(message, Some(timeout)).await {
            Ok(CallResult::Success(Ok(value))) => Ok(value),
            Ok(CallResult::Success(Err(error))) => Err(error.to_string()),
            Ok(CallResult::Timeout) => Err(format!("no answer within {} ms", timeout.as_millis())),
            Ok(CallResult::SenderError) => Err("shard replica stopped before answering".into()),
            Err(error) => Err(format!("shard replica unreachable: {error}")),
        }
    }

    /// A request to another node's replica.
    pub async fn remote_call(
        &self,
        node: u64,
        rpc: &ShardRpc,
        timeout: Duration,
    ) -> Result<ShardReply, String> {
        match self.peers.call(node, rpc, timeout).await? {
            ShardReply::Failed { code, message } => Err(format!("{code}: {message}")),
            reply => Ok(reply),
        }
    }
}

fn unexpected(reply: ShardReply) -> String {
    match reply {
        ShardReply::Failed { code, message } => format!("{code}: {message}"),
        other => format!("unexpected reply {other:?}"),
    }
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
