//! [`SiftNode`]: boots the actor tree of one node and offers the operations the HTTP API
//! exposes. Handlers in the `node` crate stay thin: parse, call one method here, render.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sift_cluster::LocalMeta;
use sift_cluster::placement::shard_for_document;
use sift_storage::chunk::{ChunkView, Metadata, SearchFilter};
use sift_storage::embedding_cache::EmbeddingCache;
use sift_storage::meta::{
    DocSource, DocStatus, DocumentCounts, DocumentRecord, KbRecord, KbSettings, MetaOp,
    MetaOutcome, SledMetaStore,
};
use tokio::sync::broadcast;
use tracing::{info, warn};

use crate::context::{EMBEDDED_MODEL, Embedders, NodeContext, NodeOptions};
use crate::error::{Result, SiftError};
use crate::events::DocumentEvent;
use crate::ingest::parse::{SourceFormat, parse_document};
use crate::ingest::pipeline::{self, now_ms};
use crate::ingest::queue::{IngestJob, IngestQueue};
use crate::ingest::raw_store::RawStore;
use crate::ingest::worker::{IngestSupervisor, IngestSupervisorArguments};
use crate::meta::MetaHandle;
use crate::retrieval::settings as retrieval_settings;
use crate::retrieval::{
    FusionMethod, Pipeline, RerankServices, RootSearch, SearchRequest, SearchResponse, rewrite,
};
use crate::shards::supervisor::ShardsArguments;
use crate::shards::{ShardMessage, ShardRegistry, ShardsMessage, ShardsSupervisor};

/// Largest `top_k` a search may ask for.
pub const MAX_TOP_K: usize = 100;
/// Documents per ingestion job when a bulk request is split.
const JOB_DOCUMENTS: usize = 256;

/// `POST /v1/kbs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKb {
    pub name: String,
    pub shards: Option<u32>,
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

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchFilters {
    pub document_ids: Option<Vec<String>>,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelWeights {
    pub dense: Option<f64>,
    pub bm25: Option<f64>,
}

/// `POST /v1/kbs/{kb}/search`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    pub query: String,
    pub top_k: Option<usize>,
    pub channels: Option<Vec<String>>,
    pub filters: Option<SearchFilters>,
    pub weights: Option<ChannelWeights>,
    pub rrf_k: Option<f64>,
    /// `dbsf` (default) or `rrf`.
    pub fusion: Option<String>,
    /// Hits gathered per channel before fusion (default max(top_k, 50)).
    pub candidates: Option<usize>,
    pub explain: Option<bool>,
    /// Dense channel by exact scan instead of HNSW (slow; for measuring HNSW recall).
    pub exact: Option<bool>,
    // Overrides of the KB's retrieval settings (see `RetrievalSettings`).
    pub min_relative_score: Option<f64>,
    pub min_results: Option<u32>,
    pub rerank: Option<bool>,
    pub rerank_model: Option<String>,
    pub rerank_depth: Option<u32>,
    pub mmr: Option<bool>,
    pub mmr_lambda: Option<f64>,
    pub duplicate_similarity: Option<f64>,
    pub expand_parent: Option<bool>,
    pub expand_neighbours: Option<u32>,
    pub context_tokens: Option<u32>,
    /// Add rule-based rewrites of the query (multi-query retrieval).
    pub multi_query: Option<bool>,
    /// Sub-queries or rewrites (from a planner) searched alongside `query`, fused with RRF.
    pub queries: Option<Vec<String>>,
}

/// One running node: its actors and its shared context.
pub struct SiftNode {
    context: Arc<NodeContext>,
    queue: IngestQueue,
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
        let context = Arc::new(NodeContext {
            meta,
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
        let root = RootSearch::new(registry, store.clone(), options.shard_deadline)
            .with_rerankers(RerankServices::new(options.rerank.clone()));
        let node = SiftNode {
            context,
            queue,
            root,
            shards,
            ingest,
        };
        node.recover().await?;
        info!(seconds = started.elapsed().as_secs_f64(), "node started");
        Ok((node, extra))
    }

    /// Reopens shards, re-applies tombstones (a delete may have crashed half-way) and
    /// re-queues documents whose ingestion did not finish.
    async fn recover(&self) -> Result<()> {
        let store = self.context.meta.store().clone();
        for kb in store.list_kbs()? {
            self.open_shards(&kb).await?;
            for tombstone in store.tombstones(&kb.id)? {
                pipeline::delete_from_shard(
                    &self.context,
                    &kb.id,
                    tombstone.shard,
                    &tombstone.document_id,
                )
                .await;
                let _ = self.context.raw.remove(&tombstone.document_id);
            }
        }
        let mut unfinished: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let clustered = self.context.meta.is_replicated();
        for record in store.unfinished_documents()? {
            // In cluster mode the metadata holds every node's documents, but the bytes stay
            // on the node that received them: only that node resumes them.
            if clustered && !self.context.raw.has(&record) {
                continue;
            }
            unfinished.entry(record.kb_id).or_default().push(record.id);
        }
        for (kb_id, ids) in unfinished {
            info!(
                kb_id,
                documents = ids.len(),
                "resuming unfinished ingestion"
            );
            for batch in ids.chunks(JOB_DOCUMENTS) {
                let queue = self.queue.clone();
                let job = IngestJob {
                    kb_id: kb_id.clone(),
                    document_ids: batch.to_vec(),
                };
                // The queue may be smaller than the backlog: wait for room in the background.
                tokio::spawn(async move {
                    if let Err(error) = queue.submit(job).await {
                        warn!(%error, "could not resume ingestion");
                    }
                });
            }
        }
        Ok(())
    }

    async fn open_shards(&self, kb: &KbRecord) -> Result<()> {
        let kb_id = kb.id.clone();
        let shards = kb.settings.shards;
        let dimension = kb.settings.dimension as usize;
        let call = self
            .shards
            .call(
                |reply| ShardsMessage::Open {
                    kb_id,
                    shards,
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
        let mut settings = KbSettings {
            shards,
            chunk_tokens: 256,
            chunk_overlap_tokens: 32,
            parent_tokens: 1024,
            embedding_model,
            dimension: embedder.dimension() as u32,
            language: "auto".into(),
            json_text_field: "text".into(),
            json_title_field: "title".into(),
            retrieval: Default::default(),
        };
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
        let now = now_ms();
        let kb = KbRecord {
            id: uuid::Uuid::now_v7().to_string(),
            name: request.name,
            settings,
            created_at_ms: now,
            updated_at_ms: now,
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
    /// elsewhere may not be applied here yet (a linearizable read settles it) and its shards
    /// not open here yet (they are opened on first use: data stays on the node that ingests).
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
        let call = self
            .shards
            .call(|reply| ShardsMessage::DropKb { kb_id, reply }, None)
            .await;
        if !matches!(call, Ok(CallResult::Success(Ok(())))) {
            warn!(kb_id = %kb.id, "dropping the shards of a deleted knowledge base failed");
        }
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
                shard: shard_for_document(&id, kb.settings.shards),
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
            shard: shard_for_document(&id, kb.settings.shards),
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
        // Admission first: room for every job is reserved before anything is registered; if the
        // queue is full nothing is registered and the raw data goes.
        let jobs: Vec<IngestJob> = ids
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
        let proposed = self
            .context
            .meta
            .propose(MetaOp::RegisterDocuments {
                kb_id: kb.id.clone(),
                documents: records,
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
                pipeline::delete_from_shard(&self.context, &kb.id, old.shard, &old.document_id)
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
            permit.send(job);
        }
        self.queue.report_depth();
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
        pipeline::delete_from_shard(&self.context, &kb.id, record.shard, &record.id).await;
        let _ = self.context.raw.remove(&record.id);
        Ok(())
    }

    /// The chunks of a document, in order.
    pub async fn document_chunks(&self, kb: &str, document: &str) -> Result<Vec<ChunkView>> {
        let record = self.get_document(kb, document)?;
        let actor = self
            .context
            .registry
            .actor(&record.kb_id, record.shard)
            .ok_or_else(|| SiftError::ShardUnavailable {
                kb_id: record.kb_id.clone(),
                shard: record.shard,
                reason: "not running".into(),
            })?;
        let document_id = record.id.clone();
        match actor
            .call(
                |reply| ShardMessage::Chunks { document_id, reply },
                Some(self.context.options.shard_deadline),
            )
            .await
        {
            Ok(CallResult::Success(outcome)) => outcome,
            _ => Err(SiftError::ShardUnavailable {
                kb_id: record.kb_id,
                shard: record.shard,
                reason: "no answer".into(),
            }),
        }
    }

    // ---- search ----

    pub async fn search(&self, kb: &str, query: SearchQuery) -> Result<SearchResponse> {
        let started = Instant::now();
        let kb = self.find_kb_for_data(kb).await?;
        let text = query.query.trim().to_string();
        if text.is_empty() {
            return Err(SiftError::invalid("empty_query", "query is empty"));
        }
        if text.chars().count() > 8192 {
            return Err(SiftError::invalid(
                "query_too_long",
                "query is longer than 8192 characters",
            ));
        }
        let top_k = query.top_k.unwrap_or(10);
        if top_k == 0 || top_k > MAX_TOP_K {
            return Err(SiftError::invalid(
                "invalid_top_k",
                format!("top_k must be between 1 and {MAX_TOP_K}"),
            ));
        }
        let (mut dense, mut bm25) = (true, true);
        if let Some(channels) = &query.channels {
            if channels.is_empty() {
                return Err(SiftError::invalid("invalid_channels", "channels is empty"));
            }
            dense = false;
            bm25 = false;
            for channel in channels {
                match channel.as_str() {
                    "dense" => dense = true,
                    "bm25" => bm25 = true,
                    other => {
                        return Err(SiftError::invalid(
                            "invalid_channels",
                            format!("unknown channel {other:?}; channels are dense and bm25"),
                        ));
                    }
                }
            }
        }
        // The KB's retrieval settings, overridden by the request, checked as a whole.
        let mut settings = kb.settings.retrieval.clone();
        let weights = query.weights.clone().unwrap_or_default();
        if let Some(weight) = weights.dense {
            settings.dense_weight = weight;
        }
        if let Some(weight) = weights.bm25 {
            settings.bm25_weight = weight;
        }
        if let Some(value) = query.rrf_k {
            settings.rrf_k = value;
        }
        if let Some(value) = &query.fusion {
            settings.fusion = value.clone();
        }
        if let Some(value) = query.min_relative_score {
            settings.min_relative_score = value;
        }
        if let Some(value) = query.min_results {
            settings.min_results = value;
        }
        if let Some(value) = query.rerank {
            settings.rerank = value;
        }
        if let Some(value) = &query.rerank_model {
            settings.rerank_model = value.clone();
        }
        if let Some(value) = query.rerank_depth {
            settings.rerank_depth = value;
        }
        if let Some(value) = query.mmr {
            settings.mmr = value;
        }
        if let Some(value) = query.mmr_lambda {
            settings.mmr_lambda = value;
        }
        if let Some(value) = query.duplicate_similarity {
            settings.duplicate_similarity = value;
        }
        if let Some(value) = query.expand_parent {
            settings.expand_parent = value;
        }
        if let Some(value) = query.expand_neighbours {
            settings.expand_neighbours = value;
        }
        if let Some(value) = query.context_tokens {
            settings.context_tokens = value;
        }
        if let Some(value) = query.multi_query {
            settings.multi_query = value;
        }
        let (dense_weight, bm25_weight) = (settings.dense_weight, settings.bm25_weight);
        if !(dense_weight.is_finite() && bm25_weight.is_finite())
            || dense_weight < 0.0
            || bm25_weight < 0.0
        {
            return Err(SiftError::invalid(
                "invalid_weights",
                "channel weights must be finite and >= 0",
            ));
        }
        if !(dense && dense_weight > 0.0 || bm25 && bm25_weight > 0.0) {
            return Err(SiftError::invalid(
                "invalid_weights",
                "every requested channel has weight 0",
            ));
        }
        retrieval_settings::validate(&settings, self.root.rerankers())?;
        let rrf_k = settings.rrf_k;
        let fusion = FusionMethod::parse(&settings.fusion).unwrap_or_default();
        let candidates = query
            .candidates
            .unwrap_or(top_k.max(settings.candidates as usize));
        if candidates < top_k || candidates > 1000 {
            return Err(SiftError::invalid(
                "invalid_candidates",
                "candidates must be between top_k and 1000",
            ));
        }
        let filters = query.filters.clone().unwrap_or_default();
        let filter = SearchFilter {
            document_ids: filters.document_ids,
            metadata: metadata_from_json(filters.metadata.unwrap_or_default())?,
        };
        // Sub-queries: the caller's, then rule-based rewrites when asked for.
        let mut extra: Vec<String> = Vec::new();
        for sub in query.queries.iter().flatten() {
            let sub = sub.trim();
            if sub.is_empty() || sub.chars().count() > 8192 {
                return Err(SiftError::invalid(
                    "invalid_queries",
                    "each of queries must be 1 to 8192 characters",
                ));
            }
            if sub != text && !extra.iter().any(|e| e == sub) {
                extra.push(sub.to_string());
            }
        }
        if extra.len() > 8 {
            return Err(SiftError::invalid(
                "invalid_queries",
                "at most 8 queries besides the query",
            ));
        }
        if settings.multi_query {
            for rewrite in rewrite::rewrites(&text) {
                if !extra.contains(&rewrite) {
                    extra.push(rewrite);
                }
            }
        }
        let embed_started = Instant::now();
        let mut vectors = if dense {
            let embedder = self.context.embedders.get(&kb.settings.embedding_model)?;
            let mut texts = vec![text.clone()];
            texts.extend(extra.iter().cloned());
            self.context
                .embed_cached(&embedder, texts)
                .await?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None; extra.len() + 1]
        };
        let embed_ms = embed_started.elapsed().as_secs_f64() * 1e3;
        let vector = if vectors.is_empty() {
            None
        } else {
            vectors.remove(0)
        };
        let extra_queries = extra.into_iter().zip(vectors).collect();
        let pipeline = Pipeline {
            min_relative_score: settings.min_relative_score,
            min_results: settings.min_results as usize,
            rerank: settings.rerank.then(|| settings.rerank_model.clone()),
            rerank_depth: settings.rerank_depth as usize,
            mmr_lambda: settings.mmr.then_some(settings.mmr_lambda),
            duplicate_similarity: settings.duplicate_similarity,
            expand_parent: settings.expand_parent,
            expand_neighbours: settings.expand_neighbours,
            context_tokens: settings.context_tokens as usize,
        };
        let request = SearchRequest {
            kb_id: kb.id.clone(),
            shards: kb.settings.shards,
            query: text,
            vector,
            exact: query.exact.unwrap_or(false),
            bm25,
            top_k,
            candidates,
            filter,
            dense_weight,
            bm25_weight,
            rrf_k,
            fusion,
            explain: query.explain.unwrap_or(false),
            extra_queries,
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
        settings.parent_tokens = settings.chunk_tokens * 4;
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
    if settings.chunk_overlap_tokens * 2 > settings.chunk_tokens {
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
