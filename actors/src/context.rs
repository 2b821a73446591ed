//! What every part of a node shares: metadata, shard registry, model clients, raw store.

use std::collections::HashMap;
use std::time::Duration;

use sift_storage::embedding_cache::EmbeddingCache;

use crate::error::{Result, SiftError};
use crate::ingest::raw_store::RawStore;
use crate::meta::MetaHandle;
use crate::shards::{ShardAccess, ShardRegistry};
use sift_models::embedding::{Embedder, EmbeddingError};

/// The name of the embedded model, usable in KB settings.
pub const EMBEDDED_MODEL: &str = "all-MiniLM-L6-v2";

/// Tunables of a node's actors, built from the node's checked config.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Deadline of one leaf search.
    pub shard_deadline: Duration,
    /// Concurrent searches per shard replica.
    pub search_permits_per_shard: usize,
    /// Ingestion jobs that may wait in the queue.
    pub ingest_queue_capacity: usize,
    /// Ingestion workers.
    pub ingest_workers: usize,
    /// Starts of processing a document may have that never finish (the process died meanwhile)
    /// before it is failed with `crashed_processing` instead of being tried again.
    pub ingest_max_attempts: u32,
    /// A document of more chunks is embedded and written in slices of this many, so that
    /// the node never holds all of its vectors, nor a shard write of all of it, at once.
    pub ingest_slice_chunks: usize,
    /// A spreadsheet or CSV file of at least this many bytes is read, chunked, embedded and
    /// written a run of rows at a time, never parsed whole.
    pub ingest_stream_bytes: u64,
    /// Caps of one Office, EPUB or spreadsheet file (`office_max_unpacked_bytes`,
    /// `sheet_max_rows`, `sheet_max_cells`).
    pub office_limits: sift_parse::office::OfficeLimits,
    /// Page cap and parse-time budget of one PDF (`pdf_max_pages`, `pdf_parse_timeout_ms`).
    /// The OCR engines of this node, for image documents (KB setting `ocr`).
    pub ocr: std::sync::Arc<sift_models::ocr::Ocr>,
    pub pdf_limits: sift_parse::pdf::PdfLimits,
    /// Knowledge bases the cluster may hold.
    pub max_kbs: usize,
    /// Shard replicas one node may hold; a KB create that would pass it is refused.
    pub max_shards_per_node: usize,
    /// Raw bytes of live documents one tenant may hold (none: no quota).
    pub max_bytes_per_tenant: Option<u64>,
    /// Documents one tenant's KBs may hold (none: no quota).
    pub max_documents_per_tenant: Option<u64>,
    /// Longest a shard write may take before the documents fail.
    pub shard_write_timeout: Duration,
    /// Enables fault injection endpoints (tests only).
    pub debug_faults: bool,
    /// External rerank services (`[rerank.NAME]`), by name.
    pub rerank: std::collections::BTreeMap<String, crate::retrieval::RerankServiceConfig>,
    /// A leaf search not answered after this is sent to a second replica too.
    pub hedge_after: Duration,
    /// Longest a write to another node's replica may take before that replica is marked dead.
    pub remote_write_timeout: Duration,
    /// Active replicas that must store a write before it is acknowledged.
    pub write_quorum: u32,
    /// How often this node looks for replicas of its own to repair (dead ones) and for
    /// replicas of deleted KBs to drop.
    pub repair_interval: Duration,
    /// How long the leader waits for an unresponsive ingestion worker before handing its
    /// unfinished documents to another replica.
    pub reassign_after: Duration,
    /// How long the leader waits for a member that stopped answering before re-creating its
    /// replicas on other nodes (as if it were drained); it drops them if it comes back.
    pub replace_after: Duration,
    /// The cluster secret (cluster mode), for shard requests to other nodes.
    pub cluster_secret: Option<String>,
    /// Plain HTTP or HTTPS to other nodes' internal ports (the node's `[tls]`).
    pub peer_tls: sift_cluster::tls::PeerTls,
    /// Longest one request of the LLM graph extractor may take (a batch of chunks); past it
    /// the document is retried later.
    pub graph_llm_timeout: Duration,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            shard_deadline: Duration::from_secs(5),
            search_permits_per_shard: 4,
            ingest_queue_capacity: 256,
            ingest_workers: 2,
            ingest_max_attempts: 3,
            ingest_slice_chunks: 1024,
            ingest_stream_bytes: 4 << 20,
            office_limits: sift_parse::office::OfficeLimits::default(),
            ocr: std::sync::Arc::new(sift_models::ocr::Ocr::none()),
            pdf_limits: sift_parse::pdf::PdfLimits::default(),
            max_kbs: 1000,
            max_shards_per_node: 512,
            max_bytes_per_tenant: None,
            max_documents_per_tenant: None,
            shard_write_timeout: Duration::from_secs(300),
            debug_faults: false,
            rerank: Default::default(),
            hedge_after: Duration::from_millis(100),
            remote_write_timeout: Duration::from_secs(30),
            write_quorum: 1,
            repair_interval: Duration::from_secs(5),
            reassign_after: Duration::from_secs(15),
            replace_after: Duration::from_secs(300),
            cluster_secret: None,
            peer_tls: sift_cluster::tls::PeerTls::plain(),
            graph_llm_timeout: Duration::from_secs(120),
        }
    }
}

/// The embedding models this node can use, by name.
#[derive(Clone, Default)]
pub struct Embedders {
    /// The embedded model, when its files were found.
    pub local: Option<Embedder>,
    /// Why the embedded model is not available.
    pub local_error: Option<String>,
    /// Remote (OpenAI-compatible) models by configured name.
    pub remote: HashMap<String, Embedder>,
}

impl Embedders {
    pub fn get(&self, name: &str) -> Result<Embedder> {
        if let Some(embedder) = self.remote.get(name) {
            return Ok(embedder.clone());
        }
        if name == EMBEDDED_MODEL {
            return self.local.clone().ok_or_else(|| {
                SiftError::invalid(
                    "embedding_model_unavailable",
                    format!(
                        "the embedded model {EMBEDDED_MODEL} is not loaded: {}",
                        self.local_error
                            .as_deref()
                            .unwrap_or("no model directory configured")
                    ),
                )
            });
        }
        let mut known: Vec<&str> = self.remote.keys().map(String::as_str).collect();
        known.push(EMBEDDED_MODEL);
        Err(SiftError::invalid(
            "unknown_embedding_model",
            format!(
                "unknown embedding model {name:?}; known: {}",
                known.join(", ")
            ),
        ))
    }
}

pub struct NodeContext {
    pub meta: MetaHandle,
    pub registry: ShardRegistry,
    /// This node's way to every shard replica, local or on another node.
    pub access: ShardAccess,
    pub embedders: Embedders,
    pub embedding_cache: EmbeddingCache,
    /// The LLM graph extractor's results by chunk text (ADR 0038).
    pub extraction_cache: sift_storage::extraction_cache::ExtractionCache,
    /// The node's chat model, set once the server has built it (`[llm]`); the LLM graph
    /// extractor uses it. Empty: no model is configured.
    pub chat_model: std::sync::OnceLock<sift_models::llm::SharedChatModel>,
    pub raw: RawStore,
    pub options: NodeOptions,
    /// Scratch files of the ingestion pipeline (scanned pages' images for OCR):
    /// `DATA_DIR/tmp`, which `sift serve` empties at start.
    pub scratch: std::path::PathBuf,
}

impl NodeContext {
    /// Embeds `texts` with `embedder`, reusing cached vectors and caching new ones.
    pub async fn embed_cached(
        &self,
        embedder: &Embedder,
        texts: Vec<String>,
    ) -> Result<Vec<Vec<f32>>> {
        let model = embedder.model_name().to_string();
        let dimension = embedder.dimension();
        let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
        let mut missing_positions = Vec::new();
        let mut missing_texts = Vec::new();
        for (position, text) in texts.iter().enumerate() {
            let cached = self
                .embedding_cache
                .get(&model, text, dimension)
                .unwrap_or(None);
            if cached.is_none() {
                missing_positions.push(position);
                missing_texts.push(text.clone());
            }
            vectors.push(cached);
        }
        metrics::counter!("sift_embedding_cache_hits_total")
            .increment((texts.len() - missing_texts.len()) as u64);
        if !missing_texts.is_empty() {
            let computed = embedder.embed(missing_texts.clone()).await?;
            if computed.len() != missing_texts.len() {
                return Err(EmbeddingError::BadResponse(format!(
                    "{} vectors for {} texts",
                    computed.len(),
                    missing_texts.len()
                ))
                .into());
            }
            for ((position, text), vector) in missing_positions
                .into_iter()
                .zip(&missing_texts)
                .zip(computed)
            {
                if vector.len() != dimension {
                    return Err(EmbeddingError::DimensionMismatch {
                        expected: dimension,
                        actual: vector.len(),
                    }
                    .into());
                }
                let _ = self.embedding_cache.put(&model, text, &vector);
                vectors[position] = Some(vector);
            }
        }
        Ok(vectors.into_iter().map(|v| v.unwrap_or_default()).collect())
    }
}
