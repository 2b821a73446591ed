//! [`SiftNode`]: boots the actor tree of one node and offers the operations the HTTP API
//! exposes. Handlers in the `node` crate stay thin: parse, call one method here, render.
//!
//! The operations are split by concern: knowledge bases (`kbs.rs`), documents
//! (`documents.rs`), search (`search.rs`), shards and drains as the cluster sees them
//! (`cluster.rs`), readiness (`ready.rs`); the root of the actor tree is `supervisor.rs`.
//! This file holds the node itself: start, recovery after a crash, shutdown.

mod cluster;
pub mod communities;
mod documents;
pub mod graph;
mod kbs;
mod quota;
pub mod ready;
mod search;
pub mod snapshots;
pub(crate) mod supervisor;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorRef};
use sift_cluster::LocalMeta;
use sift_storage::embedding_cache::EmbeddingCache;
use sift_storage::meta::{KbRecord, SledMetaStore};
use tokio::sync::broadcast;
use tracing::info;

pub use self::cluster::{
    DrainingNode, MovingReplica, PlannedStep, Rebalancing, ReplicaView, ShardView,
};
pub use self::documents::{DocumentPage, Upload, metadata_from_json, scan_budget};
pub use self::kbs::KbState;
use self::supervisor::{
    ChildHandles, ChildSpec, NodeMessage, NodeSupervisor, NodeSupervisorArguments, RestartPolicy,
};
use crate::context::{Embedders, NodeContext, NodeOptions};
use crate::error::{Result, SiftError};
use crate::events::DocumentEvent;
use crate::ingest::handoff;
use crate::ingest::queue::IngestQueue;
use crate::ingest::raw_store::RawStore;
use crate::ingest::worker::{IngestSupervisor, IngestSupervisorArguments};
use crate::meta::MetaHandle;
use crate::reconcile::{self, ReconcileMessage, Reconciler, ReconcilerArguments};
use crate::retrieval::{RerankServices, RootSearch};
use crate::shards::supervisor::{ShardsArguments, drop_kb_shards, open_local_shards};
use crate::shards::{
    AccessOptions, Peers, ShardAccess, ShardMessage, ShardRegistry, ShardsMessage, ShardsSupervisor,
};

/// Largest `top_k` a search may ask for.
pub use crate::retrieval::query::MAX_TOP_K;

/// How long [`SiftNode::shutdown`] waits for each supervisor's children, then for it.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// One running node: its actors and its shared context.
pub struct SiftNode {
    data_dir: PathBuf,
    pub(crate) context: Arc<NodeContext>,
    pub(crate) queue: IngestQueue,
    root: RootSearch,
    shards: ActorRef<ShardsMessage>,
    ingest: ActorRef<()>,
    /// Wakes idle ingestion workers at shutdown.
    ingest_stopping: tokio_util::sync::CancellationToken,
    /// The root of the restartable children (the reconciler in cluster mode).
    supervisor: ActorRef<NodeMessage>,
    /// The running instance of each of the supervisor's children.
    children: ChildHandles,
    /// What this node has accepted against tenant quotas and not yet registered.
    quotas: quota::QuotaLedger,
    /// When this node started (ms since the epoch): replicas placed before it were opened at
    /// start (readiness, `ready.rs`).
    started_at_ms: u64,
}

impl SiftNode {
    /// Opens the data directory, starts the actor tree, reopens every shard and resumes
    /// unfinished ingestion.
    pub async fn start(
        data_dir: &Path,
        options: NodeOptions,
        embedders: Embedders,
    ) -> Result<SiftNode> {
        let (node, ()) = Self::start_with_meta(data_dir, options, embedders, |store| async move {
            Ok((MetaHandle::new(LocalMeta::new(store)), ()))
        })
        .await?;
        Ok(node)
    }

    /// [`Self::start`] with the metadata door built by `make_meta` from the opened metadata
    /// store (cluster mode starts Raft there); `make_meta`'s extra value is handed back.
    pub async fn start_with_meta<T, F, Fut>(
        data_dir: &Path,
        options: NodeOptions,
        embedders: Embedders,
        make_meta: F,
    ) -> Result<(SiftNode, T)>
    where
        F: FnOnce(Arc<SledMetaStore>) -> Fut,
        Fut: std::future::Future<Output = Result<(MetaHandle, T)>>,
    {
        let started = Instant::now();
        let started_at_ms = crate::ingest::pipeline::now_ms();
        std::fs::create_dir_all(data_dir).map_err(|e| SiftError::Storage(e.into()))?;
        match sift_storage::data_dir::open(data_dir)? {
            sift_storage::data_dir::Opened::Upgraded { from } => info!(
                from,
                to = sift_storage::data_dir::FORMAT_VERSION,
                "upgraded the data directory's format"
            ),
            sift_storage::data_dir::Opened::New | sift_storage::data_dir::Opened::Current => {}
        }
        let meta_dir = data_dir.join("meta");
        let store = tokio::task::spawn_blocking(move || SledMetaStore::open(&meta_dir))
            .await
            .map_err(|e| SiftError::Internal(e.to_string()))??;
        let store = Arc::new(store);
        let embedding_cache = EmbeddingCache::new(
            store
                .db()
                .open_tree("embedding_cache")
                .map_err(sled_error)?,
        );
        let extraction_cache = sift_storage::extraction_cache::ExtractionCache::new(
            store
                .db()
                .open_tree("graph_extraction_cache")
                .map_err(sled_error)?,
        );
        let raw = RawStore::open(
            data_dir.join("raw"),
            store.db().open_tree("raw_texts").map_err(sled_error)?,
        )?;
        let (meta, extra) = make_meta(store.clone()).await?;
        let registry = ShardRegistry::default();
        let (shards, _) = Actor::spawn(
            None,
            ShardsSupervisor,
            ShardsArguments {
                data_dir: data_dir.join("shards"),
                registry: registry.clone(),
                search_permits_per_shard: options.search_permits_per_shard,
                debug_faults: options.debug_faults,
            },
        )
        .await
        .map_err(|e| SiftError::Internal(format!("starting the shard supervisor: {e}")))?;
        let peers = Arc::new(match (meta.raft(), &options.cluster_secret) {
            (Some(raft), Some(secret)) => {
                Peers::clustered(raft.clone(), secret, options.peer_tls.clone())
            }
            _ => Peers::single(),
        });
        let access = ShardAccess::new(
            registry.clone(),
            meta.clone(),
            peers,
            AccessOptions {
                shard_deadline: options.shard_deadline,
                local_write_timeout: options.shard_write_timeout,
                remote_write_timeout: options.remote_write_timeout,
                hedge_after: options.hedge_after,
                write_quorum: options.write_quorum,
            },
        );
        let context = Arc::new(NodeContext {
            meta,
            access: access.clone(),
            registry: registry.clone(),
            embedders,
            embedding_cache,
            extraction_cache,
            chat_model: std::sync::OnceLock::new(),
            raw,
            options: options.clone(),
            scratch: data_dir.join("tmp"),
        });
        let (queue, receiver) = IngestQueue::new(options.ingest_queue_capacity);
        let ingest_stopping = tokio_util::sync::CancellationToken::new();
        let (ingest, _) = Actor::spawn(
            None,
            IngestSupervisor,
            IngestSupervisorArguments {
                context: context.clone(),
                receiver,
                queue: queue.clone(),
                workers: options.ingest_workers,
                stopping: ingest_stopping.clone(),
            },
        )
        .await
        .map_err(|e| SiftError::Internal(format!("starting ingestion: {e}")))?;
        let root = RootSearch::new(access, store.clone())
            .with_rerankers(RerankServices::new(options.rerank.clone()));
        let children = ChildHandles::default();
        let mut specs = vec![crate::graph::extractor_spec(context.clone())];
        if context.meta.is_replicated() {
            specs.push(reconciler_spec(
                context.clone(),
                shards.clone(),
                queue.clone(),
                data_dir.join("shards"),
            ));
        }
        // Recovery runs before the restartable children start: the reconciler's first round
        // finds the shards open and the local work queued.
        let (supervisor, _) = Actor::spawn(
            None,
            NodeSupervisor,
            NodeSupervisorArguments {
                children: Vec::new(),
                handles: children.clone(),
            },
        )
        .await
        .map_err(|e| SiftError::Internal(format!("starting the node supervisor: {e}")))?;
        let node = SiftNode {
            data_dir: data_dir.to_path_buf(),
            context,
            queue,
            root,
            shards,
            ingest,
            ingest_stopping,
            supervisor,
            children,
            quotas: quota::QuotaLedger::default(),
            started_at_ms,
        };
        node.recover().await?;
        for spec in specs {
            let name = spec.name;
            node.supervisor
                .cast(NodeMessage::Start(spec))
                .map_err(|e| SiftError::Internal(format!("starting the {name}: {e}")))?;
        }
        info!(seconds = started.elapsed().as_secs_f64(), "node started");
        Ok((node, extra))
    }

    /// Reopens shards, re-applies tombstones (a delete may have crashed half-way) and
    /// re-queues documents whose ingestion did not finish and that this node ingests.
    async fn recover(&self) -> Result<()> {
        let store = self.context.meta.store().clone();
        let kbs = store.list_kbs()?;
        self.drop_orphan_shards(&kbs).await;
        for kb in kbs {
            // A replica that cannot be opened (a damaged index) is logged and counted by the
            // shard supervisor; the node starts and serves everything else (searches of its
            // KB report the shard as failed).
            if let Err(error) = self.open_shards(&kb).await {
                tracing::warn!(kb_id = %kb.id, %error, "starting without a shard replica");
            }
            let local = self.context.access.local_shards(&kb);
            for tombstone in store.tombstones(&kb.id)? {
                if local.contains(&tombstone.shard) {
                    self.context
                        .access
                        .delete_local(&kb.id, tombstone.shard, &tombstone.document_id)
                        .await;
                }
                let _ = self.context.raw.remove(&tombstone.document_id);
            }
        }
        // Unfinished ingestion assigned to this node (the reconciler keeps looking later).
        handoff::queue_assigned(&self.context, &self.queue, true).await;
        Ok(())
    }

    /// Opens this node's replicas of `kb` (all its shards when it has no placement).
    pub(crate) async fn open_shards(&self, kb: &KbRecord) -> Result<()> {
        open_local_shards(&self.shards, &self.context.access, kb).await
    }

    /// Removes shard directories of KBs this node no longer knows (deleted while it was down).
    async fn drop_orphan_shards(&self, kbs: &[KbRecord]) {
        let dir = self.data_dir.join("shards");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let kb_id = entry.file_name().to_string_lossy().to_string();
            if kbs.iter().any(|kb| kb.id == kb_id) {
                continue;
            }
            info!(kb_id, "dropping the replicas of a deleted knowledge base");
            drop_kb_shards(&self.shards, kb_id).await;
        }
    }

    /// A KB by id for a request from another node; one created a moment ago there is found
    /// after settling this node's metadata (ReadIndex).
    pub(crate) async fn known_kb(&self, kb_id: &str) -> Result<KbRecord> {
        if let Some(kb) = self.store().get_kb(kb_id)? {
            return Ok(kb);
        }
        self.context.meta.linearizable_barrier().await?;
        self.store()
            .get_kb(kb_id)?
            .ok_or_else(|| SiftError::kb_not_found(kb_id))
    }

    /// Stops the actors. Everything acknowledged is already durable.
    /// Stops ingestion, then the shards, then the root, each waiting for its children to
    /// exit (up to [`STOP_GRACE`] each), and flushes the metadata store. Once it returns, no
    /// actor of this node holds its stores: the same data dir can be opened again.
    pub async fn shutdown(&self) {
        self.ingest_stopping.cancel();
        for actor in [
            self.ingest.get_cell(),
            self.shards.get_cell(),
            self.supervisor.get_cell(),
        ] {
            actor.stop_children_and_wait(None, Some(STOP_GRACE)).await;
            if let Err(error) = actor.stop_and_wait(None, Some(STOP_GRACE)).await {
                tracing::warn!(actor = ?actor.get_name(), %error, "an actor did not stop in time");
            }
        }
        // An actor's state (and the context in it) is dropped a moment after its stop is
        // reported: wait for that, so that the stores are closed once this returns.
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while Arc::strong_count(&self.context) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if Arc::strong_count(&self.context) > 1 {
            tracing::warn!("an actor still holds the node's context after shutdown");
        }
        let _ = self.context.meta.store().db().flush_async().await;
    }

    pub fn context(&self) -> &Arc<NodeContext> {
        &self.context
    }

    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    pub fn subscribe_events(&self) -> broadcast::Receiver<DocumentEvent> {
        self.context.meta.subscribe()
    }

    fn store(&self) -> &Arc<SledMetaStore> {
        self.context.meta.store()
    }

    /// Fault injection: makes a shard replica panic (only with `debug_faults`).
    pub fn crash_shard(&self, kb: &str, shard: u32) -> Result<()> {
        if !self.context.options.debug_faults {
            return Err(fault_injection_off());
        }
        // The operator's tool: any tenant's KB, by id (or a default-tenant name).
        let kb = self
            .store()
            .find_kb(kb)?
            .ok_or_else(|| SiftError::kb_not_found(kb))?;
        let actor = self
            .context
            .registry
            .actor(&kb.id, shard)
            .ok_or_else(|| SiftError::invalid("invalid_shard", format!("no shard {shard}")))?;
        actor
            .cast(ShardMessage::Crash)
            .map_err(|e| SiftError::Internal(e.to_string()))
    }

    /// Adds a restartable child to the node supervisor (the session layer adds its actor).
    pub(crate) fn start_child(&self, spec: ChildSpec) -> Result<()> {
        let name = spec.name;
        self.supervisor
            .cast(NodeMessage::Start(spec))
            .map_err(|e| SiftError::Internal(format!("starting the {name}: {e}")))
    }

    /// The running instance of a child of the node supervisor, by name.
    pub(crate) fn child(&self, name: &str) -> Option<ractor::ActorCell> {
        self.children.get(name)
    }

    /// Fault injection: makes the reconciler panic (only with `debug_faults`, in cluster
    /// mode). Its supervisor starts it again.
    pub fn crash_reconciler(&self) -> Result<()> {
        if !self.context.options.debug_faults {
            return Err(fault_injection_off());
        }
        let reconciler = self.children.get(reconcile::ACTOR_NAME).ok_or_else(|| {
            SiftError::invalid(
                "not_clustered",
                "this node runs no reconciler (single-node mode)",
            )
        })?;
        reconciler
            .send_message(ReconcileMessage::Crash)
            .map_err(|e| SiftError::Internal(e.to_string()))
    }
}

fn fault_injection_off() -> SiftError {
    SiftError::NotFound {
        code: "not_found",
        what: "fault injection".into(),
    }
}

/// The reconciler as a child of the node supervisor: restarted with backoff whenever it fails.
fn reconciler_spec(
    context: Arc<NodeContext>,
    shards: ActorRef<ShardsMessage>,
    queue: IngestQueue,
    shards_dir: PathBuf,
) -> ChildSpec {
    ChildSpec {
        name: reconcile::ACTOR_NAME,
        start: Arc::new(move |supervisor| {
            let arguments = ReconcilerArguments {
                context: context.clone(),
                shards: shards.clone(),
                queue: queue.clone(),
                shards_dir: shards_dir.clone(),
            };
            Box::pin(async move {
                let (actor, _) =
                    Actor::spawn_linked(None, Reconciler, arguments, supervisor).await?;
                Ok(actor.get_cell())
            })
        }),
        policy: RestartPolicy::default(),
    }
}

fn sled_error(error: sled::Error) -> SiftError {
    SiftError::Storage(error.into())
}
