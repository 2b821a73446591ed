//! The records the state machine stores (JSON in sled, and carried inside ops, which are
//! bincode in the Raft log). Field names and order, variant names and serde attributes are
//! the stored form: add fields with `#[serde(default)]`, never rename or reorder.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::chunk::Metadata;

/// Settings of a knowledge base. Validated by the layer that proposes the op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KbSettings {
    /// Number of shards; a document goes to `hash(external id, else id) % shards`. Fixed at creation.
    pub shards: u32,
    /// Copies of each shard, on distinct nodes. Fixed at creation.
    #[serde(default = "one")]
    pub replication_factor: u32,
    /// Target size of an indexed (child) chunk, in cl100k tokens.
    pub chunk_tokens: u32,
    /// Overlap between consecutive chunks of a section, in tokens.
    pub chunk_overlap_tokens: u32,
    /// Target size of a parent chunk (returned as context), in tokens.
    pub parent_tokens: u32,
    /// Name of the embedding model: `all-MiniLM-L6-v2` (embedded) or a configured remote one.
    pub embedding_model: String,
    /// Vector dimension of `embedding_model`, fixed at creation.
    pub dimension: u32,
    /// Language hint: `auto`, `en` or `zh`.
    pub language: String,
    /// For `.json`/`.jsonl` uploads: the field holding the text, and the one holding the title.
    pub json_text_field: String,
    pub json_title_field: String,
    /// How searches of this KB rank and pack results; absent in records written before it
    /// existed (then the defaults apply).
    #[serde(default)]
    pub retrieval: RetrievalSettings,
    /// OCR of images: `auto` (the node's vision model, else tesseract), `off`, `vision` or
    /// `tesseract`; absent in records written before it existed.
    #[serde(default = "auto")]
    pub ocr: String,
    /// Graph extraction: `embedded` (named entities and co-occurrence, no model; the default),
    /// `llm` (entities and events by the node's chat model) or `off`; absent in records
    /// written before it existed.
    #[serde(default = "embedded")]
    pub graph: String,
    /// Tokens the `llm` extractor may spend on this KB on each node (0: no limit); past it,
    /// documents get the embedded extractor's graph and the state `failed`.
    #[serde(default)]
    pub graph_token_budget: u64,
}

fn embedded() -> String {
    "embedded".into()
}

fn one() -> u32 {
    1
}

fn auto() -> String {
    "auto".into()
}

impl KbSettings {
    /// The settings of a new KB before the request's own: 256-token chunks overlapping by 32,
    /// 1,024-token parents, language `auto`, JSON fields `text` and `title`, OCR `auto`,
    /// the embedded graph extractor, default retrieval.
    pub fn new(
        shards: u32,
        replication_factor: u32,
        embedding_model: impl Into<String>,
        dimension: u32,
    ) -> Self {
        KbSettings {
            shards,
            replication_factor,
            chunk_tokens: 256,
            chunk_overlap_tokens: 32,
            parent_tokens: 1024,
            embedding_model: embedding_model.into(),
            dimension,
            language: "auto".into(),
            json_text_field: "text".into(),
            json_title_field: "title".into(),
            retrieval: RetrievalSettings::default(),
            ocr: auto(),
            graph: embedded(),
            graph_token_budget: 0,
        }
    }
}

/// Per-KB retrieval pipeline settings (each overridable per request). Validated by the
/// layer that proposes the op (`sift_actors::retrieval::settings`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetrievalSettings {
    /// Weight of the dense channel in fusion.
    pub dense_weight: f64,
    /// Weight of the BM25 channel in fusion.
    pub bm25_weight: f64,
    /// `dbsf` or `rrf`.
    pub fusion: String,
    /// The k of reciprocal rank fusion (also used to fuse multi-query results).
    pub rrf_k: f64,
    /// Per-channel hits kept before fusion (top-N truncation); at least `top_k`.
    pub candidates: u32,
    /// Keep a channel's hit only when its score is at least this share of the channel's best
    /// score (0 turns the filter off).
    pub min_relative_score: f64,
    /// When relative filtering leaves fewer fused hits than this, the unfiltered lists are used.
    pub min_results: u32,
    /// Rerank the head of the fused list.
    pub rerank: bool,
    /// `embedded` (the feature re-scorer) or the name of a configured `[rerank.NAME]` service.
    pub rerank_model: String,
    /// Fused hits handed to the reranker.
    pub rerank_depth: u32,
    /// Maximal marginal relevance over the reranked list.
    pub mmr: bool,
    /// MMR trade-off: 1 is pure relevance, 0 pure novelty.
    pub mmr_lambda: f64,
    /// Text similarity (0..1) at or above which two chunks count as near-identical and
    /// collapse into one hit.
    pub duplicate_similarity: f64,
    /// Return each hit's parent chunk as its context (small-to-big).
    pub expand_parent: bool,
    /// Chunks before and after each hit added to its context.
    pub expand_neighbours: u32,
    /// Token budget (cl100k) of the packed `context`; 0 packs no context.
    pub context_tokens: u32,
    /// Rule-based query rewrites searched alongside the query and fused with RRF.
    pub multi_query: bool,
    /// Link following (multi-hop): a candidate document named by title in one of the first
    /// `link_from` documents moves up behind the hit that names it.
    pub follow_links: bool,
    /// How many of the top documents are read for names of other candidates.
    pub link_from: u32,
    /// At most this many named documents move up behind each naming hit.
    pub links_per_hit: u32,
    /// Weight of the graph channel in fusion (0 leaves it out); it runs only in a KB whose
    /// `graph` is not `off`.
    pub graph_weight: f64,
    /// Hops of the graph channel's walk from the query's entities (1 to 3).
    pub graph_hops: u32,
}

impl Default for RetrievalSettings {
    fn default() -> Self {
        RetrievalSettings {
            dense_weight: 1.0,
            bm25_weight: 1.0,
            fusion: "dbsf".into(),
            rrf_k: 60.0,
            candidates: 50,
            min_relative_score: 0.0,
            min_results: 5,
            rerank: true,
            rerank_model: "embedded".into(),
            rerank_depth: 100,
            mmr: false,
            mmr_lambda: 0.7,
            duplicate_similarity: 0.9,
            expand_parent: true,
            expand_neighbours: 0,
            context_tokens: 0,
            multi_query: false,
            follow_links: true,
            link_from: 3,
            links_per_hit: 2,
            graph_weight: 0.5,
            graph_hops: 2,
        }
    }
}

/// A knowledge base: its settings and where its shards live.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KbRecord {
    pub id: String,
    pub name: String,
    pub settings: KbSettings,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Where each shard's replicas live, by shard number. Empty in records written before
    /// placement existed: then every shard lives on the node that holds it (a single node).
    #[serde(default)]
    pub placement: Vec<ShardPlacement>,
}

impl KbRecord {
    /// The replicas of `shard` (empty when the KB has no placement).
    pub fn replicas(&self, shard: u32) -> &[Replica] {
        self.placement
            .get(shard as usize)
            .map(|p| p.replicas.as_slice())
            .unwrap_or(&[])
    }
}

/// The replicas of one shard.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShardPlacement {
    pub replicas: Vec<Replica>,
}

/// One replica of a shard: the node holding it and whether it may serve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replica {
    pub node: u64,
    pub state: ReplicaState,
    /// When the state last changed.
    pub since_ms: u64,
}

/// The life of a replica. Only `Active` replicas serve reads; writes go to every replica
/// that is not `Dead` (so a replica being filled misses nothing written meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    /// Placed, not yet filled (a new KB's replicas start active: there is nothing to fill).
    Initializing,
    /// Complete: serves reads and counts towards the write quorum.
    Active,
    /// Missed a write (or its node left): neither read nor written until repaired.
    Dead,
    /// Being filled from an active replica; written, not read.
    Recovering,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Initializing => "initializing",
            ReplicaState::Active => "active",
            ReplicaState::Dead => "dead",
            ReplicaState::Recovering => "recovering",
        }
    }
}

/// Where a document is in ingestion. `Ready` and `Failed` are terminal.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DocStatus {
    Queued,
    Parsing,
    Chunking,
    Embedding,
    Indexing,
    Ready,
    Failed,
}

impl DocStatus {
    pub const ALL: [DocStatus; 7] = [
        DocStatus::Queued,
        DocStatus::Parsing,
        DocStatus::Chunking,
        DocStatus::Embedding,
        DocStatus::Indexing,
        DocStatus::Ready,
        DocStatus::Failed,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, DocStatus::Ready | DocStatus::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DocStatus::Queued => "queued",
            DocStatus::Parsing => "parsing",
            DocStatus::Chunking => "chunking",
            DocStatus::Embedding => "embedding",
            DocStatus::Indexing => "indexing",
            DocStatus::Ready => "ready",
            DocStatus::Failed => "failed",
        }
    }
}

/// Where the raw bytes of a document are kept until (and after) it is indexed.
/// Externally tagged (serde's default) so that bincode, which cannot decode internally tagged
/// enums, can carry ops between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocSource {
    /// A file upload stored under the node's raw directory.
    Upload { file_name: String, format: String },
    /// Text given in a JSON request body, stored in the node's raw text store.
    Text { format: String },
}

/// A document of a knowledge base (one per upload or text), with its ingestion status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DocumentRecord {
    pub id: String,
    pub kb_id: String,
    pub external_id: Option<String>,
    pub title: String,
    pub source: DocSource,
    /// sha256 of the raw bytes, hex.
    pub content_hash: String,
    pub size_bytes: u64,
    pub shard: u32,
    pub status: DocStatus,
    pub error: Option<String>,
    pub chunk_count: u32,
    #[schema(value_type = BTreeMap<String, String>)]
    pub metadata: Metadata,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Parts indexed without their text because it needs OCR and none read it: a PDF's
    /// scanned pages, a Word or PowerPoint file's pictures (no engine, one that could not
    /// read them, or a page with no image to read that could not be rendered); absent in
    /// records written before it existed.
    #[serde(default)]
    pub pages_needing_ocr: u32,
}

/// A deleted document: searches never return it; shards purge it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tombstone {
    pub document_id: String,
    pub shard: u32,
    pub deleted_at_ms: u64,
}

/// An unfinished document in the pending-work index: which node ingests it. Worker 0 is the
/// node holding its raw bytes (documents registered before workers were recorded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingWork {
    pub worker: u64,
    pub shard: u32,
    /// How often processing of the document started (a `parsing` status was committed). A
    /// document still pending after a start was interrupted: its node stopped or crashed
    /// while working on it. Workers fail a document that was interrupted too often instead of
    /// processing it again, so that a document that crashes the process cannot crash it on
    /// every restart. Absent in entries written before the count existed.
    #[serde(default)]
    pub attempts: u32,
}
