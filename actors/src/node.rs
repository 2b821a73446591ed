//! [`SiftNode`]: boots the actor tree of one node and offers the operations the HTTP API
//! exposes. Handlers in the `node` crate stay thin: parse, call one method here, render.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sift_cluster::LocalMeta;
use sift_cluster::placement::{NodeLoad, place_replicas, shard_for_document};
use sift_storage::chunk::{ChunkView, Metadata};
use sift_storage::embedding_cache::EmbeddingCache;
use sift_storage::meta::{
    DocSource, DocStatus, DocumentCounts, DocumentRecord, KbRecord, KbSettings, MetaOp,
    MetaOutcome, Replica, ReplicaState, ShardPlacement, SledMetaStore,
};
use tokio::sync::broadcast;
use tracing::{debug, info, warn};

use crate::context::{EMBEDDED_MODEL, Embedders, NodeContext, NodeOptions};
use crate::error::{Result, SiftError};
use crate::events::DocumentEvent;
use crate::ingest::handoff::{self, JOB_DOCUMENTS, Reconciler};
use crate::ingest::parse::{SourceFormat, parse_document};
use crate::ingest::pipeline::{self, now_ms};
use crate::ingest::queue::{IngestJob, IngestQueue};
use crate::ingest::raw_store::{self, RawStore};
use crate::ingest::worker::{IngestSupervisor, IngestSupervisorArguments};
use crate::meta::MetaHandle;
use crate::rebalance;
use crate::retrieval::settings as retrieval_settings;
use crate::retrieval::{RerankServices, RootSearch, SearchRequest, SearchResponse, query};
use crate::shards::supervisor::ShardsArguments;
use crate::shards::{
    AccessOptions, Peers, ShardAccess, ShardMessage, ShardRegistry, ShardReply, ShardRpc,
    ShardsMessage, ShardsSupervisor,
};

/// Largest `top_k` a search may ask for.
pub use crate::retrieval::query::{ChannelWeights, MAX_TOP_K, SearchFilters, SearchQuery};

/// `POST /v1/kbs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKb {
    pub name: String,
    pub shards: Option<u32>,
    /// Copies of each shard on distinct nodes (default: min(3, nodes)).
    pub replication_factor: Option<u32>,
    pub chunk_tokens: Option<u32>,
    pub chunk_overlap_tokens: Option<u32>,
    pub parent_tokens: Option<u32>,
    pub embedding_model: Option<String>,
    pub language: Option<String>,
    pub json_text_field: Option<String>,
    pub json_title_field: Option<String>,
    /// Retrieval settings (fields of `RetrievalSettings`; the others keep their defaults).
    pub retrieval: Option<serde_json::Value>,
}

/// `PATCH /v1/kbs/{kb}`: settings that can change without re-indexing.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateKb {
    pub chunk_tokens: Option<u32>,
    pub chunk_overlap_tokens: Option<u32>,
    pub parent_tokens: Option<u32>,
    pub language: Option<String>,
    pub json_text_field: Option<String>,
    pub json_title_field: Option<String>,
    /// Refused: fixed at creation.
    pub shards: Option<u32>,
    /// Refused: fixed at creation.
    pub replication_factor: Option<u32>,
    /// Refused: fixed at creation.
    pub embedding_model: Option<String>,
    /// Retrieval settings to change (the others are kept).
    pub retrieval: Option<serde_json::Value>,
}

/// One document of a bulk text request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTextDocument {
    pub external_id: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    pub text: String,
    /// `text` (default), `markdown` or `html`.
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// An upload already streamed to a temp file by the HTTP layer.
#[derive(Clone, Debug)]
pub struct Upload {
    pub temp_path: PathBuf,
    pub file_name: String,
    pub external_id: Option<String>,
    pub size_bytes: u64,
    /// sha256 of the bytes, hex.
    pub content_hash: String,
    pub metadata: Metadata,
}

#[derive(Clone, Debug, Serialize)]
pub struct AddedDocument {
    pub id: String,
    pub external_id: Option<String>,
    pub status: DocStatus,
    /// The same bytes were already in the KB: `id` is the existing document.
    pub duplicate: bool,
    /// The older version this document replaced (same external id).
    pub replaced: Option<String>,
}

/// A KB with its document counts, as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct KbView {
    #[serde(flatten)]
    pub kb: KbRecord,
    pub documents: DocumentCounts,
}

/// One running node: its actors and its shared context.
pub struct SiftNode {
    data_dir: PathBuf,
    pub(crate) context: Arc<NodeContext>,
    pub(crate) queue: IngestQueue,
    root: RootSearch,
    shards: ActorRef<ShardsMessage>,
    ingest: ActorRef<()>,
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
        std::fs::create_dir_all(data_dir).map_err(|e| SiftError::Storage(e.into()))?;
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
            (Some(raft), Some(secret)) => Peers::clustered(raft.clone(), secret),
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
            raw,
            options: options.clone(),
        });
        let (queue, receiver) = IngestQueue::new(options.ingest_queue_capacity);
        let (ingest, _) = Actor::spawn(
            None,
            IngestSupervisor,
            IngestSupervisorArguments {
                context: context.clone(),
                receiver,
                queue: queue.clone(),
                workers: options.ingest_workers,
            },
        )
        .await
        .map_err(|e| SiftError::Internal(format!("starting ingestion: {e}")))?;
        let root = RootSearch::new(access, store.clone())
            .with_rerankers(RerankServices::new(options.rerank.clone()));
        let node = SiftNode {
            data_dir: data_dir.to_path_buf(),
            context,
            queue,
            root,
            shards,
            ingest,
        };
        node.recover().await?;
        if node.context.meta.is_replicated() {
            node.spawn_caretaker();
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
            self.open_shards(&kb).await?;
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
        // Unfinished ingestion assigned to this node (the caretaker keeps looking later).
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

    /// The background care of this node's replicas (cluster mode): opens the replicas placed
    /// here, repairs the ones marked dead, drops those of deleted KBs.
    fn spawn_caretaker(&self) {
        let caretaker = Caretaker {
            context: self.context.clone(),
            shards: self.shards.clone(),
            queue: self.queue.clone(),
            reconciler: Reconciler::default(),
            shards_dir: self.data_dir.join("shards"),
            last_raw_collection: std::sync::Mutex::new(None),
        };
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(caretaker.context.options.repair_interval);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if caretaker.shards.get_status() != ractor::ActorStatus::Running {
                    return; // the node is shutting down
                }
                caretaker.round().await;
            }
        });
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

    /// `GET /v1/kbs/{kb}/shards`: every shard's replicas, their states and (when their node
    /// answers within a second) their document and chunk counts.
    pub async fn kb_shards(&self, kb: &str) -> Result<Vec<ShardView>> {
        let kb = self.find_kb_for_data(kb).await?;
        let access = &self.context.access;
        let mut views = Vec::with_capacity(kb.settings.shards as usize);
        for shard in 0..kb.settings.shards {
            let replicas = access.replicas(&kb, shard);
            let stats = join_all(replicas.iter().map(|replica| {
                let kb_id = kb.id.clone();
                async move {
                    if replica.node == access.local_id() {
                        return self
                            .context
                            .registry
                            .get(&crate::shards::ShardKey { kb_id, shard })
                            .map(|entry| entry.index.stats());
                    }
                    let rpc = ShardRpc::Stats { kb_id, shard };
                    match access
                        .remote_call(replica.node, &rpc, Duration::from_secs(1))
                        .await
                    {
                        Ok(ShardReply::Stats(stats)) => Some(stats),
                        _ => None,
                    }
                }
            }))
            .await;
            views.push(ShardView {
                shard,
                replicas: replicas
                    .into_iter()
                    .zip(stats)
                    .map(|(replica, stats)| ReplicaView {
                        local: replica.node == access.local_id(),
                        node: replica.node,
                        state: replica.state.as_str(),
                        since_ms: replica.since_ms,
                        documents: stats.as_ref().map(|s| s.documents),
                        chunks: stats.as_ref().map(|s| s.chunks),
                        reachable: stats.is_some(),
                    })
                    .collect(),
            });
        }
        Ok(views)
    }

    /// Replicas placed on `node`, over every KB.
    pub fn replicas_on(&self, node: u64) -> Result<usize> {
        Ok(replicas_on(&self.store().list_kbs()?, node))
    }

    /// Starts draining `node` before its removal: the leader re-creates its replicas on the
    /// other nodes (each filled, then the drained copy dropped) and then removes it.
    /// Refused (409 `cannot_drain`) when a KB with a replica there would have fewer nodes
    /// left than its replication factor.
    pub async fn drain_node(&self, node: u64) -> Result<()> {
        let mut others = self.context.access.placement_members();
        others.retain(|member| *member != node);
        for kb in self.store().list_kbs()? {
            let holds = kb
                .placement
                .iter()
                .any(|p| p.replicas.iter().any(|r| r.node == node));
            if holds && kb.settings.replication_factor as usize > others.len() {
                return Err(SiftError::Conflict {
                    code: "cannot_drain",
                    message: format!(
                        "knowledge base {} has replication factor {} and only {} other nodes would be left; add a node first or remove with force=true (its replicas there are lost)",
                        kb.name,
                        kb.settings.replication_factor,
                        others.len()
                    ),
                });
            }
        }
        self.context
            .meta
            .propose(MetaOp::SetNodeDraining {
                node,
                draining: true,
            })
            .await?;
        Ok(())
    }

    /// Stops the actors. Everything acknowledged is already durable.
    pub async fn shutdown(&self) {
        self.ingest.stop(None);
        self.shards.stop(None);
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

    // ---- knowledge bases ----

    pub async fn create_kb(&self, request: CreateKb) -> Result<KbView> {
        validate_kb_name(&request.name)?;
        if self.store().find_kb(&request.name)?.is_some() {
            return Err(SiftError::Conflict {
                code: "kb_exists",
                message: format!("a knowledge base named {:?} already exists", request.name),
            });
        }
        let embedding_model = request
            .embedding_model
            .clone()
            .unwrap_or_else(|| EMBEDDED_MODEL.to_string());
        let embedder = self.context.embedders.get(&embedding_model)?;
        let shards = request.shards.unwrap_or(2);
        if !(1..=64).contains(&shards) {
            return Err(SiftError::invalid(
                "invalid_settings",
                "shards must be between 1 and 64",
            ));
        }
        let members = self.context.access.placement_members();
        let replication_factor = request
            .replication_factor
            .unwrap_or_else(|| (members.len() as u32).min(3));
        if replication_factor == 0 || replication_factor as usize > members.len() {
            return Err(SiftError::invalid(
                "invalid_settings",
                format!(
                    "replication_factor must be between 1 and the number of nodes ({})",
                    members.len()
                ),
            ));
        }
        let mut settings = KbSettings::new(
            shards,
            replication_factor,
            embedding_model,
            embedder.dimension() as u32,
        );
        apply_settings(
            &mut settings,
            request.chunk_tokens,
            request.chunk_overlap_tokens,
            request.parent_tokens,
            request.language,
            request.json_text_field,
            request.json_title_field,
        )?;
        if let Some(patch) = &request.retrieval {
            settings.retrieval =
                retrieval_settings::merge_patch(&settings.retrieval, patch, self.root.rerankers())?;
        }
        let kbs = self.store().list_kbs()?;
        let limits = &self.context.options;
        if kbs.len() >= limits.max_kbs {
            return Err(SiftError::Conflict {
                code: "too_many_kbs",
                message: format!(
                    "the cluster holds {} knowledge bases, the limit (max_kbs); delete one first",
                    limits.max_kbs
                ),
            });
        }
        let now = now_ms();
        let load = node_loads(self.store(), &kbs, &members);
        let placed = place_replicas(shards, replication_factor, &members, &load);
        // Every shard replica costs its node memory, threads and files: none goes over its cap.
        for &node in &members {
            let new = placed.iter().filter(|nodes| nodes.contains(&node)).count();
            let held = replicas_on(&kbs, node);
            if new > 0 && held + new > limits.max_shards_per_node {
                return Err(SiftError::Conflict {
                    code: "too_many_shards",
                    message: format!(
                        "node {node} holds {held} shard replicas; {new} more would pass the \
                         limit of {} (max_shards_per_node)",
                        limits.max_shards_per_node
                    ),
                });
            }
        }
        let placement = placed
            .into_iter()
            .map(|nodes| ShardPlacement {
                replicas: nodes
                    .into_iter()
                    .map(|node| Replica {
                        node,
                        // Nothing to fill: a new KB's replicas serve at once.
                        state: ReplicaState::Active,
                        since_ms: now,
                    })
                    .collect(),
            })
            .collect();
        let kb = KbRecord {
            id: uuid::Uuid::now_v7().to_string(),
            name: request.name,
            settings,
            created_at_ms: now,
            updated_at_ms: now,
            placement,
        };
        let outcome = self
            .context
            .meta
            .propose(MetaOp::CreateKb(kb))
            .await
            .map_err(conflict_as_kb_exists)?;
        let MetaOutcome::Kb(kb) = outcome else {
            return Err(SiftError::Internal(format!(
                "unexpected outcome {outcome:?}"
            )));
        };
        self.open_shards(&kb).await?;
        self.kb_view(kb)
    }

    pub fn find_kb(&self, kb: &str) -> Result<KbRecord> {
        self.store()
            .find_kb(kb)?
            .ok_or_else(|| SiftError::kb_not_found(kb))
    }

    /// The KB about to take documents or queries on this node. In cluster mode a KB created
    /// elsewhere may not be applied here yet (a linearizable read settles it) and this node's
    /// replicas of it not open yet (the caretaker opens them within a round; so does this).
    async fn find_kb_for_data(&self, kb: &str) -> Result<KbRecord> {
        if !self.context.meta.is_replicated() {
            return self.find_kb(kb);
        }
        let record = match self.store().find_kb(kb)? {
            Some(record) => record,
            None => {
                self.context.meta.linearizable_barrier().await?;
                self.find_kb(kb)?
            }
        };
        self.open_shards(&record).await?;
        Ok(record)
    }

    pub fn get_kb(&self, kb: &str) -> Result<KbView> {
        let kb = self.find_kb(kb)?;
        self.kb_view(kb)
    }

    fn kb_view(&self, kb: KbRecord) -> Result<KbView> {
        let documents = self.store().document_counts(&kb.id)?;
        Ok(KbView { kb, documents })
    }

    pub fn list_kbs(&self) -> Result<Vec<KbView>> {
        self.store()
            .list_kbs()?
            .into_iter()
            .map(|kb| self.kb_view(kb))
            .collect()
    }

    pub async fn update_kb(&self, kb: &str, request: UpdateKb) -> Result<KbView> {
        let kb = self.find_kb(kb)?;
        if request.shards.is_some_and(|s| s != kb.settings.shards) {
            return Err(SiftError::invalid(
                "immutable_setting",
                "shards is fixed when the knowledge base is created",
            ));
        }
        if request
            .replication_factor
            .is_some_and(|r| r != kb.settings.replication_factor)
        {
            return Err(SiftError::invalid(
                "immutable_setting",
                "replication_factor is fixed when the knowledge base is created",
            ));
        }
        if request
            .embedding_model
            .as_ref()
            .is_some_and(|m| *m != kb.settings.embedding_model)
        {
            return Err(SiftError::invalid(
                "immutable_setting",
                "embedding_model is fixed when the knowledge base is created",
            ));
        }
        let mut settings = kb.settings.clone();
        apply_settings(
            &mut settings,
            request.chunk_tokens,
            request.chunk_overlap_tokens,
            request.parent_tokens,
            request.language,
            request.json_text_field,
            request.json_title_field,
        )?;
        if let Some(patch) = &request.retrieval {
            settings.retrieval =
                retrieval_settings::merge_patch(&settings.retrieval, patch, self.root.rerankers())?;
        }
        let outcome = self
            .context
            .meta
            .propose(MetaOp::UpdateKb {
                kb_id: kb.id.clone(),
                settings,
                at_ms: now_ms(),
            })
            .await?;
        let MetaOutcome::Kb(kb) = outcome else {
            return Err(SiftError::kb_not_found(&kb.id));
        };
        self.kb_view(kb)
    }

    pub async fn delete_kb(&self, kb: &str) -> Result<()> {
        let kb = self.find_kb(kb)?;
        let outcome = self
            .context
            .meta
            .propose(MetaOp::DeleteKb {
                kb_id: kb.id.clone(),
            })
            .await?;
        let kb_id = kb.id.clone();
        drop_kb_shards(&self.shards, kb_id).await;
        if let MetaOutcome::KbDeleted { documents, .. } = outcome {
            for tombstone in documents {
                let _ = self.context.raw.remove(&tombstone.document_id);
            }
        }
        Ok(())
    }

    // ---- documents ----

    /// Registers bulk texts and queues them. All-or-nothing validation: one bad document
    /// rejects the request and stores nothing.
    pub async fn add_texts(
        &self,
        kb: &str,
        documents: Vec<NewTextDocument>,
    ) -> Result<Vec<AddedDocument>> {
        let kb = self.find_kb_for_data(kb).await?;
        if documents.is_empty() {
            return Err(SiftError::invalid("empty_request", "documents is empty"));
        }
        let mut records = Vec::with_capacity(documents.len());
        let mut texts = Vec::with_capacity(documents.len());
        let now = now_ms();
        for (position, document) in documents.into_iter().enumerate() {
            if document.text.trim().is_empty() {
                return Err(SiftError::Unprocessable {
                    code: "empty_document",
                    message: format!("documents[{position}] has no text"),
                });
            }
            let format = document.format.unwrap_or_else(|| "text".into());
            if !matches!(format.as_str(), "text" | "markdown" | "md" | "html") {
                return Err(SiftError::invalid(
                    "unsupported_type",
                    format!("documents[{position}].format must be text, markdown or html"),
                ));
            }
            validate_external_id(document.external_id.as_deref())?;
            let metadata = metadata_from_json(document.metadata.unwrap_or_default())?;
            let id = uuid::Uuid::now_v7().to_string();
            let mut hasher = Sha256::new();
            hasher.update(format.as_bytes());
            hasher.update([0]);
            hasher.update(document.title.as_deref().unwrap_or("").as_bytes());
            hasher.update([0]);
            hasher.update(document.text.as_bytes());
            records.push(DocumentRecord {
                shard: shard_for_document(
                    routing_key(document.external_id.as_deref(), &id),
                    kb.settings.shards,
                ),
                id,
                kb_id: kb.id.clone(),
                title: document
                    .title
                    .or_else(|| document.external_id.clone())
                    .unwrap_or_default(),
                external_id: document.external_id,
                source: DocSource::Text { format },
                content_hash: hex::encode(hasher.finalize()),
                size_bytes: document.text.len() as u64,
                status: DocStatus::Queued,
                error: None,
                chunk_count: 0,
                metadata,
                created_at_ms: now,
                updated_at_ms: now,
            });
            texts.push(document.text);
        }
        // Raw texts first (durable), then the metadata op that makes them documents.
        let raw = self.context.raw.clone();
        let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        tokio::task::spawn_blocking(move || -> Result<()> {
            for (id, text) in ids.iter().zip(&texts) {
                raw.put_text(id, text)?;
            }
            raw.flush()
        })
        .await
        .map_err(|e| SiftError::Internal(e.to_string()))??;
        self.register(&kb, records).await
    }

    /// Validates an uploaded file (type, size, decodable text), then registers and queues it.
    /// Invalid files are refused before anything is stored.
    pub async fn add_upload(&self, kb: &str, upload: Upload) -> Result<AddedDocument> {
        let kb = self.find_kb_for_data(kb).await?;
        let format = SourceFormat::from_file_name(&upload.file_name).ok_or_else(|| {
            crate::ingest::parse::ParseError::UnsupportedType(format!(
                "{:?}: supported types are .txt, .md, .html, .json, .jsonl",
                upload.file_name
            ))
        })?;
        validate_external_id(upload.external_id.as_deref())?;
        let options = pipeline::parse_options(&kb);
        let temp = upload.temp_path.clone();
        let parsed = tokio::task::spawn_blocking(move || -> Result<Option<String>> {
            let bytes = std::fs::read(&temp).map_err(|e| SiftError::Storage(e.into()))?;
            let parsed = parse_document(&bytes, format, &options)?;
            Ok(parsed.title)
        })
        .await
        .map_err(|e| SiftError::Internal(e.to_string()))??;
        let id = uuid::Uuid::now_v7().to_string();
        let now = now_ms();
        let record = DocumentRecord {
            shard: shard_for_document(
                routing_key(upload.external_id.as_deref(), &id),
                kb.settings.shards,
            ),
            id: id.clone(),
            kb_id: kb.id.clone(),
            external_id: upload.external_id.clone(),
            title: parsed.unwrap_or_else(|| upload.file_name.clone()),
            source: DocSource::Upload {
                file_name: upload.file_name.clone(),
                format: format!("{format:?}").to_lowercase(),
            },
            content_hash: upload.content_hash.clone(),
            size_bytes: upload.size_bytes,
            status: DocStatus::Queued,
            error: None,
            chunk_count: 0,
            metadata: upload.metadata.clone(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        // Bytes in place (durable) before the metadata op that makes them a document.
        let raw = self.context.raw.clone();
        let temp = upload.temp_path.clone();
        let adopt_id = id.clone();
        tokio::task::spawn_blocking(move || raw.adopt_file(&temp, &adopt_id))
            .await
            .map_err(|e| SiftError::Internal(e.to_string()))??;
        let mut added = self.register(&kb, vec![record]).await?;
        added
            .pop()
            .ok_or_else(|| SiftError::Internal("registration returned nothing".into()))
    }

    async fn register(
        &self,
        kb: &KbRecord,
        records: Vec<DocumentRecord>,
    ) -> Result<Vec<AddedDocument>> {
        let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        let local = self.context.access.local_id();
        // The raw bytes with the shards' replicas (cluster mode), and a worker per document.
        let workers =
            match handoff::store_with_replicas(&self.context, &self.queue, kb, &records).await {
                Ok(workers) => workers,
                Err(error) => {
                    for id in &ids {
                        let _ = self.context.raw.remove(id);
                    }
                    return Err(error);
                }
            };
        // Admission: room for every local job is reserved before anything is registered; if
        // the queue is full nothing is registered and the raw data goes.
        let local_ids: Vec<String> = ids
            .iter()
            .zip(&workers)
            .filter(|(_, worker)| **worker == local)
            .map(|(id, _)| id.clone())
            .collect();
        let jobs: Vec<IngestJob> = local_ids
            .chunks(JOB_DOCUMENTS)
            .map(|batch| IngestJob {
                kb_id: kb.id.clone(),
                document_ids: batch.to_vec(),
            })
            .collect();
        let permits = match self.queue.try_reserve(jobs.len()) {
            Ok(permits) => permits,
            Err(error) => {
                for id in &ids {
                    let _ = self.context.raw.remove(id);
                }
                return Err(error);
            }
        };
        let assignments: Vec<(u64, u32, String)> = records
            .iter()
            .zip(&workers)
            .map(|(record, worker)| (*worker, record.shard, record.id.clone()))
            .collect();
        let proposed = self
            .context
            .meta
            .propose(MetaOp::RegisterDocumentsTo {
                kb_id: kb.id.clone(),
                documents: records,
                workers,
            })
            .await;
        let outcome = match proposed {
            Ok(outcome) => outcome,
            Err(error) => {
                for id in &ids {
                    let _ = self.context.raw.remove(id);
                }
                return Err(error);
            }
        };
        let MetaOutcome::Registered(registered) = outcome else {
            return Err(SiftError::Internal(format!(
                "unexpected outcome {outcome:?}"
            )));
        };
        let mut added = Vec::with_capacity(registered.len());
        for (entry, submitted_id) in registered.into_iter().zip(&ids) {
            if entry.duplicate {
                let _ = self.context.raw.remove(submitted_id);
            }
            if let Some(old) = &entry.replaced {
                self.context
                    .access
                    .delete(kb, old.shard, &old.document_id)
                    .await;
                let _ = self.context.raw.remove(&old.document_id);
            }
            added.push(AddedDocument {
                id: entry.record.id.clone(),
                external_id: entry.record.external_id.clone(),
                status: entry.record.status,
                duplicate: entry.duplicate,
                replaced: entry.replaced.map(|t| t.document_id),
            });
        }
        for (permit, job) in permits.zip(jobs) {
            self.queue.claim(&job.document_ids);
            permit.send(job);
        }
        self.queue.report_depth();
        // Remote workers are told now; a node that is not a replica of a shard keeps no copy
        // of its raw bytes once the replicas hold them.
        let mut remote: BTreeMap<(u64, u32), Vec<String>> = BTreeMap::new();
        for (worker, shard, id) in assignments {
            let placed_here = kb.replicas(shard).iter().any(|r| r.node == local);
            if !kb.placement.is_empty() && !placed_here {
                let _ = self.context.raw.remove(&id);
            }
            if worker != local {
                remote.entry((worker, shard)).or_default().push(id);
            }
        }
        handoff::notify_workers(&self.context, &kb.id, remote);
        Ok(added)
    }

    pub fn get_document(&self, kb: &str, document: &str) -> Result<DocumentRecord> {
        let kb = self.find_kb(kb)?;
        self.store()
            .find_document(&kb.id, document)?
            .ok_or_else(|| SiftError::document_not_found(document))
    }

    pub fn list_documents(
        &self,
        kb: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DocumentRecord>> {
        let kb = self.find_kb(kb)?;
        Ok(self
            .store()
            .list_documents(&kb.id, after, limit.clamp(1, 1000))?)
    }

    /// Deletes a document: a tombstone in metadata first (from then on no search returns it),
    /// then the shard delete, then the raw bytes.
    pub async fn delete_document(&self, kb: &str, document: &str) -> Result<()> {
        let kb = self.find_kb(kb)?;
        let record = self
            .store()
            .find_document(&kb.id, document)?
            .ok_or_else(|| SiftError::document_not_found(document))?;
        self.context
            .meta
            .propose(MetaOp::DeleteDocument {
                kb_id: kb.id.clone(),
                document_id: record.id.clone(),
                at_ms: now_ms(),
            })
            .await?;
        self.context
            .access
            .delete(&kb, record.shard, &record.id)
            .await;
        let _ = self.context.raw.remove(&record.id);
        Ok(())
    }

    /// The chunks of a document, in order (from an active replica of its shard).
    pub async fn document_chunks(&self, kb: &str, document: &str) -> Result<Vec<ChunkView>> {
        let kb = self.find_kb_for_data(kb).await?;
        let record = self
            .store()
            .find_document(&kb.id, document)?
            .ok_or_else(|| SiftError::document_not_found(document))?;
        match self
            .context
            .access
            .chunks(&kb, record.shard, &record.id)
            .await
        {
            Ok(Some(chunks)) => Ok(chunks),
            Ok(None) => Err(SiftError::Storage(sift_storage::StorageError::NotFound(
                format!("document {}", record.id),
            ))),
            Err(reason) => Err(SiftError::ShardUnavailable {
                kb_id: record.kb_id.clone(),
                shard: record.shard,
                reason,
            }),
        }
    }

    // ---- search ----

    pub async fn search(&self, kb: &str, query: SearchQuery) -> Result<SearchResponse> {
        let started = Instant::now();
        let kb = self.find_kb_for_data(kb).await?;
        let search = query::resolve(&query, &kb.settings.retrieval, self.root.rerankers())?;
        let embed_started = Instant::now();
        let mut vectors = if search.channels.dense {
            let embedder = self.context.embedders.get(&kb.settings.embedding_model)?;
            let mut texts = vec![search.query.clone()];
            texts.extend(search.extra_queries.iter().cloned());
            self.context
                .embed_cached(&embedder, texts)
                .await?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None; search.extra_queries.len() + 1]
        };
        let embed_ms = embed_started.elapsed().as_secs_f64() * 1e3;
        let vector = if vectors.is_empty() {
            None
        } else {
            vectors.remove(0)
        };
        let pipeline = search.pipeline();
        let request = SearchRequest {
            kb_id: kb.id.clone(),
            shards: kb.settings.shards,
            vector,
            exact: search.exact,
            bm25: search.channels.bm25,
            top_k: search.top_k,
            candidates: search.candidates,
            dense_weight: search.settings.dense_weight,
            bm25_weight: search.settings.bm25_weight,
            rrf_k: search.settings.rrf_k,
            fusion: search.fusion,
            explain: search.explain,
            extra_queries: search.extra_queries.into_iter().zip(vectors).collect(),
            filter: search.filter,
            query: search.query,
            pipeline,
        };
        let mut response = self.root.search(&request).await;
        response.timings.embed_ms = embed_ms;
        response.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        metrics::histogram!("sift_search_seconds").record(started.elapsed().as_secs_f64());
        Ok(response)
    }

    /// Fault injection: makes a shard replica panic (only with `debug_faults`).
    pub fn crash_shard(&self, kb: &str, shard: u32) -> Result<()> {
        if !self.context.options.debug_faults {
            return Err(SiftError::NotFound {
                code: "not_found",
                what: "fault injection".into(),
            });
        }
        let kb = self.find_kb(kb)?;
        let actor = self
            .context
            .registry
            .actor(&kb.id, shard)
            .ok_or_else(|| SiftError::invalid("invalid_shard", format!("no shard {shard}")))?;
        actor
            .cast(ShardMessage::Crash)
            .map_err(|e| SiftError::Internal(e.to_string()))
    }
}

/// What places a document on a shard: its external id when it has one (so the same corpus
/// loaded twice, or on two clusters, shards alike and ranks alike: BM25 statistics are per
/// shard), else its id.
fn routing_key<'a>(external_id: Option<&'a str>, id: &'a str) -> &'a str {
    external_id.unwrap_or(id)
}

/// What each of `members` holds: replicas, and the bytes of their shards' documents.
fn node_loads(store: &SledMetaStore, kbs: &[KbRecord], members: &[u64]) -> BTreeMap<u64, NodeLoad> {
    let bytes = store.shard_bytes().unwrap_or_default();
    let mut load: BTreeMap<u64, NodeLoad> =
        members.iter().map(|m| (*m, NodeLoad::default())).collect();
    for kb in kbs {
        for (shard, placement) in kb.placement.iter().enumerate() {
            let shard_bytes = bytes
                .get(&(kb.id.clone(), shard as u32))
                .copied()
                .unwrap_or(0);
            for replica in &placement.replicas {
                if let Some(node) = load.get_mut(&replica.node) {
                    node.replicas += 1;
                    node.bytes += shard_bytes;
                }
            }
        }
    }
    load
}

/// Replicas placed on `node`, over every KB.
fn replicas_on(kbs: &[KbRecord], node: u64) -> usize {
    kbs.iter()
        .flat_map(|kb| &kb.placement)
        .flat_map(|placement| &placement.replicas)
        .filter(|replica| replica.node == node)
        .count()
}

fn sled_error(error: sled::Error) -> SiftError {
    SiftError::Storage(error.into())
}

fn conflict_as_kb_exists(error: SiftError) -> SiftError {
    if error.code() == "conflict" {
        SiftError::Conflict {
            code: "kb_exists",
            message: error.to_string(),
        }
    } else {
        error
    }
}

fn validate_kb_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
        && uuid::Uuid::parse_str(name).is_err();
    if valid {
        Ok(())
    } else {
        Err(SiftError::invalid(
            "invalid_name",
            "a knowledge base name is 1 to 64 characters of letters, digits, '-', '_' or '.', not starting with '.'",
        ))
    }
}

fn validate_external_id(external_id: Option<&str>) -> Result<()> {
    match external_id {
        Some(id) if id.is_empty() || id.len() > 512 || id.contains('/') => Err(SiftError::invalid(
            "invalid_external_id",
            "external_id must be 1 to 512 characters and contain no '/'",
        )),
        _ => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_settings(
    settings: &mut KbSettings,
    chunk_tokens: Option<u32>,
    chunk_overlap_tokens: Option<u32>,
    parent_tokens: Option<u32>,
    language: Option<String>,
    json_text_field: Option<String>,
    json_title_field: Option<String>,
) -> Result<()> {
    if let Some(value) = chunk_tokens {
        settings.chunk_tokens = value;
    }
    if let Some(value) = chunk_overlap_tokens {
        settings.chunk_overlap_tokens = value;
    }
    if let Some(value) = parent_tokens {
        settings.parent_tokens = value;
    } else if settings.parent_tokens < settings.chunk_tokens {
        settings.parent_tokens = settings.chunk_tokens.saturating_mul(4);
    }
    if let Some(value) = language {
        settings.language = value;
    }
    if let Some(value) = json_text_field {
        settings.json_text_field = value;
    }
    if let Some(value) = json_title_field {
        settings.json_title_field = value;
    }
    let invalid = |message: &str| Err(SiftError::invalid("invalid_settings", message));
    if !(16..=8192).contains(&settings.chunk_tokens) {
        return invalid("chunk_tokens must be between 16 and 8192");
    }
    if u64::from(settings.chunk_overlap_tokens) * 2 > u64::from(settings.chunk_tokens) {
        return invalid("chunk_overlap_tokens must be at most half of chunk_tokens");
    }
    if settings.parent_tokens < settings.chunk_tokens || settings.parent_tokens > 32768 {
        return invalid("parent_tokens must be between chunk_tokens and 32768");
    }
    if !matches!(settings.language.as_str(), "auto" | "en" | "zh") {
        return invalid("language must be auto, en or zh");
    }
    if settings.json_text_field.is_empty() || settings.json_title_field.is_empty() {
        return invalid("json_text_field and json_title_field must not be empty");
    }
    Ok(())
}

/// JSON metadata values become strings (scalars only) so filters are plain equality.
pub fn metadata_from_json(map: serde_json::Map<String, serde_json::Value>) -> Result<Metadata> {
    let mut metadata = Metadata::new();
    for (key, value) in map {
        let value = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(SiftError::invalid(
                    "invalid_metadata",
                    format!("metadata value of {key:?} must be a string, number or boolean"),
                ));
            }
        };
        if key.is_empty() || key.contains('=') {
            return Err(SiftError::invalid(
                "invalid_metadata",
                "metadata keys must be non-empty without '='",
            ));
        }
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// One shard of a KB as `GET /v1/kbs/{kb}/shards` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ShardView {
    pub shard: u32,
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplicaView {
    pub node: u64,
    pub state: &'static str,
    pub since_ms: u64,
    /// The replica is on the node that answered.
    pub local: bool,
    /// Its node answered the stats request.
    pub reachable: bool,
    pub documents: Option<u64>,
    pub chunks: Option<u64>,
}

async fn open_local_shards(
    shards: &ActorRef<ShardsMessage>,
    access: &ShardAccess,
    kb: &KbRecord,
) -> Result<()> {
    let kb_id = kb.id.clone();
    let list = access.local_shards(kb);
    if list.is_empty() {
        return Ok(());
    }
    let dimension = kb.settings.dimension as usize;
    let call = shards
        .call(
            |reply| ShardsMessage::Open {
                kb_id,
                shards: list,
                dimension,
                reply,
            },
            None,
        )
        .await;
    match call {
        Ok(CallResult::Success(outcome)) => outcome,
        _ => Err(SiftError::Internal(
            "the shard supervisor did not answer".into(),
        )),
    }
}

async fn drop_kb_shards(shards: &ActorRef<ShardsMessage>, kb_id: String) {
    let call = shards
        .call(
            |reply| ShardsMessage::DropKb {
                kb_id: kb_id.clone(),
                reply,
            },
            None,
        )
        .await;
    if !matches!(call, Ok(CallResult::Success(Ok(())))) {
        warn!(
            kb_id,
            "dropping the shards of a deleted knowledge base failed"
        );
    }
}

/// Background care of a cluster member's replicas.
struct Caretaker {
    context: Arc<NodeContext>,
    shards: ActorRef<ShardsMessage>,
    queue: IngestQueue,
    reconciler: Reconciler,
    /// Where the shard supervisor keeps replicas (`{kb_id}/{shard}`).
    shards_dir: PathBuf,
    /// When raw bytes were last collected.
    last_raw_collection: std::sync::Mutex<Option<Instant>>,
}

/// How often a node looks for raw bytes it no longer needs.
const RAW_COLLECTION_INTERVAL: Duration = Duration::from_secs(60);
/// Raw bytes younger than this are never collected (their registration may be in flight).
const RAW_GRACE: Duration = Duration::from_secs(600);

impl Caretaker {
    async fn round(&self) {
        let store = self.context.meta.store().clone();
        let Ok(kbs) = store.list_kbs() else {
            return;
        };
        let known: std::collections::HashSet<&str> = kbs.iter().map(|kb| kb.id.as_str()).collect();
        let mut opened: Vec<String> = self
            .context
            .registry
            .keys()
            .into_iter()
            .map(|key| key.kb_id)
            .collect();
        opened.sort();
        opened.dedup();
        for kb_id in opened {
            if !known.contains(kb_id.as_str()) {
                info!(kb_id, "dropping the replicas of a deleted knowledge base");
                drop_kb_shards(&self.shards, kb_id).await;
            }
        }
        let local = self.context.access.local_id();
        // Replicas moved to other nodes: opened here, no longer placed here.
        for key in self.context.registry.keys() {
            let moved = kbs.iter().find(|kb| kb.id == key.kb_id).is_some_and(|kb| {
                !kb.placement.is_empty() && !kb.replicas(key.shard).iter().any(|r| r.node == local)
            });
            if moved {
                info!(kb_id = %key.kb_id, shard = key.shard, "dropping a replica moved to another node");
                let call = self
                    .shards
                    .call(
                        |reply| ShardsMessage::DropShard {
                            kb_id: key.kb_id.clone(),
                            shard: key.shard,
                            reply,
                        },
                        None,
                    )
                    .await;
                if !matches!(call, Ok(CallResult::Success(Ok(())))) {
                    warn!(kb_id = %key.kb_id, shard = key.shard, "dropping a moved replica failed");
                }
            }
        }
        let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
        for kb in &kbs {
            if let Err(error) = open_local_shards(&self.shards, &self.context.access, kb).await {
                warn!(kb_id = %kb.id, %error, "opening this node's replicas failed");
                continue;
            }
            for shard in 0..kb.settings.shards {
                let Some(own) = kb.replicas(shard).iter().find(|r| r.node == local).cloned() else {
                    continue;
                };
                *states.entry(own.state.as_str()).or_default() += 1;
                let to_fill = matches!(own.state, ReplicaState::Dead | ReplicaState::Initializing);
                if to_fill && let Err(reason) = self.repair(&kb.id, shard, own.state).await {
                    warn!(kb_id = %kb.id, shard, %reason, "filling this node's replica failed; will retry");
                }
            }
        }
        for state in ["initializing", "active", "recovering", "dead"] {
            metrics::gauge!("sift_replicas", "state" => state)
                .set(states.get(state).copied().unwrap_or(0) as f64);
        }
        let leader = self
            .context
            .meta
            .raft()
            .is_some_and(|raft| raft.status().leader == Some(raft.id()));
        if leader {
            // The reconciler's round also updates which peers look away, for rebalancing.
            self.reconciler.round(&self.context, &kbs).await;
            if let Err(reason) = self.rebalance(&kbs).await {
                warn!(%reason, "rebalancing failed; will retry");
            }
            self.finish_drains(&kbs).await;
        }
        handoff::queue_assigned(&self.context, &self.queue, false).await;
        self.drop_unplaced_shard_dirs(&kbs).await;
        self.collect_raw_garbage().await;
    }

    /// Removes replica directories left on disk that are neither placed here nor open (a node
    /// that stopped between a `RemoveReplica` and dropping its copy, or that caught up with
    /// the placement before opening its replicas). Replicas opened and then found moved are
    /// dropped by [`Caretaker::round`].
    async fn drop_unplaced_shard_dirs(&self, kbs: &[KbRecord]) {
        let local = self.context.access.local_id();
        let store = self.context.meta.store();
        for kb in kbs.iter().filter(|kb| !kb.placement.is_empty()) {
            let Ok(entries) = std::fs::read_dir(self.shards_dir.join(&kb.id)) else {
                continue;
            };
            for entry in entries.flatten() {
                let Some(shard) = entry
                    .file_name()
                    .to_str()
                    .and_then(|name| name.parse::<u32>().ok())
                else {
                    continue;
                };
                let placed_here =
                    |kb: &KbRecord| kb.replicas(shard).iter().any(|r| r.node == local);
                if placed_here(kb) || self.context.registry.actor(&kb.id, shard).is_some() {
                    continue;
                }
                // The placement as of now, not of the round's start.
                let still_unplaced = store
                    .get_kb(&kb.id)
                    .ok()
                    .flatten()
                    .is_some_and(|kb| !placed_here(&kb));
                if !still_unplaced {
                    continue;
                }
                info!(kb_id = %kb.id, shard, "dropping a stale copy of a replica placed elsewhere");
                let call = self
                    .shards
                    .call(
                        |reply| ShardsMessage::DropShard {
                            kb_id: kb.id.clone(),
                            shard,
                            reply,
                        },
                        None,
                    )
                    .await;
                if !matches!(call, Ok(CallResult::Success(Ok(())))) {
                    warn!(kb_id = %kb.id, shard, "dropping a stale replica copy failed");
                }
            }
        }
    }

    /// Every [`RAW_COLLECTION_INTERVAL`], once this node's metadata has caught up with the
    /// leader: removes raw bytes older than [`RAW_GRACE`] that no document here needs
    /// ([`raw_store::raw_unneeded`]).
    async fn collect_raw_garbage(&self) {
        {
            let mut last = self
                .last_raw_collection
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| at.elapsed() < RAW_COLLECTION_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        if self.context.meta.linearizable_barrier().await.is_err() {
            return;
        }
        let store = self.context.meta.store().clone();
        let local = self.context.access.local_id();
        let collected = self
            .context
            .raw
            .blocking(move |raw| {
                let kbs = store.list_kbs()?;
                let mut removed = raw.remove_stale_parts(RAW_GRACE)?;
                for id in raw.ids()? {
                    if raw_store::id_age(&id).is_none_or(|age| age < RAW_GRACE) {
                        continue;
                    }
                    let mut found = None;
                    for kb in &kbs {
                        if let Some(record) = store.get_document(&kb.id, &id)? {
                            found = Some((kb, record));
                            break;
                        }
                    }
                    if raw_store::raw_unneeded(found.as_ref().map(|(kb, r)| (*kb, r)), local) {
                        raw.remove(&id)?;
                        removed += 1;
                    }
                }
                Ok(removed)
            })
            .await;
        match collected {
            Ok(0) => {}
            Ok(removed) => {
                info!(removed, "raw bytes no longer needed removed");
                metrics::counter!("sift_raw_collected_total").increment(removed as u64);
            }
            Err(error) => warn!(%error, "collecting unneeded raw bytes failed; will retry"),
        }
    }

    /// This round's rebalancing ops (the leader's caretaker); see [`rebalance::plan`].
    async fn rebalance(&self, kbs: &[KbRecord]) -> std::result::Result<(), String> {
        // Draining nodes, and members away for longer than `replace_after`, count as gone:
        // their replicas are re-created elsewhere first.
        let away = self.reconciler.away_for(self.context.options.replace_after);
        if !away.is_empty() {
            debug!(nodes = ?away, "members away too long: their replicas are replaced");
        }
        let mut members = self.context.access.placement_members();
        members.retain(|node| !away.contains(node));
        let load = node_loads(self.context.meta.store(), kbs, &members);
        let mut failure = None;
        for step in rebalance::plan(kbs, &members, &load, now_ms()) {
            info!(step = step.reason, op = ?step.op, "rebalance");
            if step.reason == rebalance::MOVE {
                metrics::counter!("sift_rebalance_moves_total").increment(1);
            }
            if let Err(reason) = self.propose(step.op).await {
                failure.get_or_insert(reason);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Removes from the cluster the draining nodes that no longer hold a replica, and clears
    /// the mark of nodes that are gone.
    async fn finish_drains(&self, kbs: &[KbRecord]) {
        let Some(raft) = self.context.meta.raft() else {
            return;
        };
        let Ok(draining) = self.context.meta.store().draining_nodes() else {
            return;
        };
        let status = raft.status();
        for node in draining {
            let member = status.voters.contains(&node) || status.learners.contains(&node);
            if member && replicas_on(kbs, node) > 0 {
                continue;
            }
            if member {
                info!(node, "node drained: removing it from the cluster");
                if let Err(error) = raft.remove_node(node).await {
                    warn!(node, %error, "removing a drained node failed; will retry");
                    continue;
                }
            }
            if let Err(reason) = self
                .propose(MetaOp::SetNodeDraining {
                    node,
                    draining: false,
                })
                .await
            {
                warn!(node, %reason, "clearing the draining mark failed; will retry");
            }
        }
    }

    async fn propose(&self, op: MetaOp) -> std::result::Result<(), String> {
        self.context
            .meta
            .propose(op)
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    }

    async fn set_state(
        &self,
        kb_id: &str,
        shard: u32,
        state: ReplicaState,
        expected: ReplicaState,
    ) -> std::result::Result<bool, String> {
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
            .map_err(|error| error.to_string())?;
        Ok(matches!(outcome, MetaOutcome::Kb(_)))
    }

    /// Fills this node's dead (or new) replica of `shard` from an active one: recovering (from
    /// then on every write reaches it too), copy the documents it lacks, apply the
    /// tombstones, active.
    async fn repair(
        &self,
        kb_id: &str,
        shard: u32,
        from: ReplicaState,
    ) -> std::result::Result<(), String> {
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
                let _ = self
                    .set_state(kb_id, shard, ReplicaState::Dead, ReplicaState::Recovering)
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the documents an active replica has and this one lacks; then removes the
    /// tombstoned ones. Returns how many documents were copied.
    async fn copy_missing(
        &self,
        kb_id: &str,
        shard: u32,
        local: u64,
    ) -> std::result::Result<usize, String> {
        let access = &self.context.access;
        let store = self.context.meta.store();
        // The placement as the cluster has it now (this replica is recovering).
        self.context
            .meta
            .linearizable_barrier()
            .await
            .map_err(|error| error.to_string())?;
        let kb = store
            .get_kb(kb_id)
            .map_err(|error| error.to_string())?
            .ok_or("the knowledge base was deleted")?;
        open_local_shards(&self.shards, access, &kb)
            .await
            .map_err(|error| error.to_string())?;
        let Some(source) = access
            .read_plan(&kb, shard)
            .into_iter()
            .find(|node| *node != local)
        else {
            return Err("no active replica to copy from".into());
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
            other => return Err(format!("unexpected reply {other:?}")),
        };
        let local_ids: std::collections::HashSet<String> = access
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
                other => return Err(format!("unexpected reply {other:?}")),
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
                access.write_local(kb_id, shard, documents).await?;
            }
        }
        for tombstone in store.tombstones(kb_id).map_err(|error| error.to_string())? {
            if tombstone.shard == shard {
                access
                    .delete_local(kb_id, shard, &tombstone.document_id)
                    .await;
            }
        }
        Ok(copied)
    }
}

/// Documents per export request while repairing a replica.
const REPAIR_BATCH_DOCUMENTS: usize = 64;
