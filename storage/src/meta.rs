//! The metadata state machine.
//!
//! Every metadata change is a [`MetaOp`]: a plain serialisable value. [`SledMetaStore`] applies
//! ops deterministically — the outcome depends only on the op and the state before it — so the
//! same log of ops yields the same state on every node. Today the log is local (see
//! `sift_cluster::LocalMeta`); the Raft issue puts consensus under the same ops unchanged.
//!
//! Layout: one sled tree, keys prefixed by kind, values JSON. Each op is applied as one atomic
//! sled batch, with the log index of the op, and flushed before the outcome is returned.
//!
//! | key | value |
//! |---|---|
//! | `kb/{kb_id}` | [`KbRecord`] |
//! | `kbname/{name}` | kb id |
//! | `doc/{kb_id}/{doc_id}` | [`DocumentRecord`] |
//! | `docext/{kb_id}/{external_id}` | doc id |
//! | `dochash/{kb_id}/{content_hash}` | doc id |
//! | `tomb/{kb_id}/{doc_id}` | [`Tombstone`] |
//! | `applied` | last applied log index (u64 big-endian) |
//! | `sess/…`, `turn/…`, `turnmsg/…` | chat sessions and turns (see `sessions.rs`) |

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::chunk::Metadata;
use crate::error::{Result, StorageError};

/// Settings of a knowledge base. Validated by the layer that proposes the op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}

fn one() -> u32 {
    1
}

impl KbSettings {
    /// The settings of a new KB before the request's own: 256-token chunks overlapping by 32,
    /// 1,024-token parents, language `auto`, JSON fields `text` and `title`, default retrieval.
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
        }
    }
}

/// Per-KB retrieval pipeline settings (each overridable per request). Validated by the
/// layer that proposes the op (`sift_actors::retrieval::settings`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardPlacement {
    pub replicas: Vec<Replica>,
}

/// One replica of a shard: the node holding it and whether it may serve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Replica {
    pub node: u64,
    pub state: ReplicaState,
    /// When the state last changed.
    pub since_ms: u64,
}

/// The life of a replica. Only `Active` replicas serve reads; writes go to every replica
/// that is not `Dead` (so a replica being filled misses nothing written meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocSource {
    /// A file upload stored under the node's raw directory.
    Upload { file_name: String, format: String },
    /// Text given in a JSON request body, stored in the node's raw text store.
    Text { format: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    pub metadata: Metadata,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

/// A deleted document: searches never return it; shards purge it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tombstone {
    pub document_id: String,
    pub shard: u32,
    pub deleted_at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusUpdate {
    pub document_id: String,
    pub status: DocStatus,
    pub error: Option<String>,
    pub chunk_count: Option<u32>,
}

/// A metadata change. Ops carry every id and timestamp they need, so applying one is
/// deterministic and a retried op is recognised (idempotent) instead of applied twice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaOp {
    CreateKb(KbRecord),
    UpdateKb {
        kb_id: String,
        settings: KbSettings,
        at_ms: u64,
    },
    DeleteKb {
        kb_id: String,
    },
    /// Registers documents; one with the same content hash as a live document of the KB is a
    /// duplicate (the existing document is returned); one whose external id names a live
    /// document with other content replaces it (the old one is tombstoned).
    RegisterDocuments {
        kb_id: String,
        documents: Vec<DocumentRecord>,
    },
    /// Moves documents through the ingestion stages. A document that is already ready or
    /// failed is left alone (a second worker that processed it too cannot undo the result).
    SetDocumentStatus {
        kb_id: String,
        updates: Vec<StatusUpdate>,
        at_ms: u64,
    },
    DeleteDocument {
        kb_id: String,
        document_id: String,
        at_ms: u64,
    },
    /// Changes the state of one replica of a shard. `expected`, when given, must be the
    /// replica's current state (a compare-and-set: a stale writer cannot mark dead a replica
    /// that was repaired meanwhile); otherwise the op changes nothing.
    SetReplicaState {
        kb_id: String,
        shard: u32,
        node: u64,
        state: ReplicaState,
        expected: Option<ReplicaState>,
        at_ms: u64,
    },
    /// Places a new replica of a shard on `node` (state `initializing`: its node fills it
    /// from an active replica). Nothing changes when the node already holds one.
    AddReplica {
        kb_id: String,
        shard: u32,
        node: u64,
        at_ms: u64,
    },
    /// Removes the replica of a shard on `node`; refused when no other active replica of the
    /// shard would be left.
    RemoveReplica {
        kb_id: String,
        shard: u32,
        node: u64,
        at_ms: u64,
    },
    /// Forgets a tombstone once every replica has purged the document.
    ForgetTombstone {
        kb_id: String,
        document_id: String,
    },
    /// Creates a chat session (a retried create returns the existing one).
    CreateSession {
        id: String,
        kbs: Vec<String>,
        agent: String,
        created_at_ms: u64,
    },
    /// Deletes a session and its turns.
    DeleteSession {
        id: String,
    },
    /// Stores a finished turn; idempotent by `turn.message_id`.
    AppendTurn {
        session_id: String,
        turn: StoredTurn,
    },
    /// Stores the summary of the oldest `summary_turns` turns of a session.
    SetHistorySummary {
        session_id: String,
        summary: Option<String>,
        summary_turns: u32,
        at_ms: u64,
    },
    /// [`MetaOp::RegisterDocuments`] with the node that ingests each document (`workers[i]`
    /// for `documents[i]`): the pending-work index records it until the document is ready,
    /// failed or deleted, so the leader can hand the work of a dead node to another one.
    RegisterDocumentsTo {
        kb_id: String,
        documents: Vec<DocumentRecord>,
        workers: Vec<u64>,
    },
    /// Hands the unfinished documents of `kb_id` assigned to `from` to `to` (a compare-and-set
    /// per document: ones finished or reassigned meanwhile are left alone).
    ReassignDocuments {
        kb_id: String,
        document_ids: Vec<String>,
        from: u64,
        to: u64,
    },
    /// Marks a node as draining (its replicas are re-created elsewhere, then the leader
    /// removes it from the cluster), or clears the mark.
    SetNodeDraining {
        node: u64,
        draining: bool,
    },
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

/// One entry of the pending-work index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingDocument {
    pub kb_id: String,
    pub document_id: String,
    pub work: PendingWork,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registered {
    pub record: DocumentRecord,
    /// True when the same bytes were already in the KB: `record` is the existing document.
    pub duplicate: bool,
    /// The document this one replaced (same external id, other content).
    pub replaced: Option<Tombstone>,
}

/// What applying an op produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaOutcome {
    Kb(KbRecord),
    KbDeleted {
        kb: KbRecord,
        documents: Vec<Tombstone>,
    },
    Registered(Vec<Registered>),
    /// Status updates: the records as they now are; ids no longer present are skipped.
    Statuses(Vec<DocumentRecord>),
    DocumentDeleted(Tombstone),
    /// The op changed nothing (e.g. a repeated delete).
    Unchanged,
    Session(SessionRecord),
    SessionDeleted(SessionRecord),
    TurnAppended(StoredTurn),
    /// The documents a [`MetaOp::ReassignDocuments`] moved.
    Reassigned(Vec<String>),
    /// A node's draining mark changed.
    Draining {
        node: u64,
        draining: bool,
    },
}

/// Applies committed ops; implemented by the sled store and driven by tests directly.
pub trait MetaStateMachine: Send + Sync {
    /// Applies the op at log `index`. An index at or below [`Self::applied_index`] is skipped
    /// (returns `Unchanged`): replays after a restart do not apply twice.
    fn apply(&self, index: u64, op: &MetaOp) -> Result<MetaOutcome>;
    fn applied_index(&self) -> u64;
}

/// Document counts of a KB by status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DocumentCounts {
    pub total: u64,
    #[serde(flatten)]
    pub by_status: BTreeMap<DocStatus, u64>,
}

/// The metadata state machine over one sled tree.
pub struct SledMetaStore {
    db: sled::Db,
    tree: sled::Tree,
    /// Serialises appliers: apply is read-modify-write over several keys.
    apply_lock: Mutex<()>,
}

const APPLIED_KEY: &[u8] = b"applied";

fn kb_key(kb_id: &str) -> Vec<u8> {
    format!("kb/{kb_id}").into_bytes()
}
fn kb_name_key(name: &str) -> Vec<u8> {
    format!("kbname/{name}").into_bytes()
}
fn doc_prefix(kb_id: &str) -> Vec<u8> {
    format!("doc/{kb_id}/").into_bytes()
}
fn doc_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("doc/{kb_id}/{doc_id}").into_bytes()
}
fn ext_key(kb_id: &str, external_id: &str) -> Vec<u8> {
    format!("docext/{kb_id}/{external_id}").into_bytes()
}
fn hash_key(kb_id: &str, hash: &str) -> Vec<u8> {
    format!("dochash/{kb_id}/{hash}").into_bytes()
}
fn tomb_prefix(kb_id: &str) -> Vec<u8> {
    format!("tomb/{kb_id}/").into_bytes()
}
fn tomb_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("tomb/{kb_id}/{doc_id}").into_bytes()
}
fn pending_prefix(kb_id: &str) -> Vec<u8> {
    format!("pend/{kb_id}/").into_bytes()
}
fn pending_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("pend/{kb_id}/{doc_id}").into_bytes()
}
fn shard_bytes_prefix(kb_id: &str) -> Vec<u8> {
    format!("shardbytes/{kb_id}/").into_bytes()
}
fn shard_bytes_key(kb_id: &str, shard: u32) -> Vec<u8> {
    format!("shardbytes/{kb_id}/{shard:010}").into_bytes()
}
/// Set once the derived indexes (pending work, bytes per shard) cover every document: stores
/// written before they existed build them when opened.
const PENDING_INDEX_KEY: &[u8] = b"index/derived/v1";
fn drain_key(node: u64) -> Vec<u8> {
    format!("drain/{node:020}").into_bytes()
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|error| StorageError::Corrupt(error.to_string()))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|error| StorageError::Corrupt(error.to_string()))
}

/// Pending writes of the ops of one batch: reads and scans see them before they reach sled,
/// then one atomic sled batch. An op that fails is rolled back to the mark taken before it.
struct Pending<'a> {
    tree: &'a sled::Tree,
    writes: BTreeMap<Vec<u8>, Write>,
    /// Each write's key and the overlay's value before it, in write order.
    undo: Vec<(Vec<u8>, Option<Write>)>,
}

/// A pending write: a value, or `None` for a removal.
type Write = Option<Vec<u8>>;

impl<'a> Pending<'a> {
    fn new(tree: &'a sled::Tree) -> Self {
        Pending {
            tree,
            writes: BTreeMap::new(),
            undo: Vec::new(),
        }
    }
    /// A point to roll back to.
    fn mark(&self) -> usize {
        self.undo.len()
    }
    /// Forgets every write made since `mark`.
    fn rollback(&mut self, mark: usize) {
        for (key, before) in self.undo.drain(mark..).rev() {
            match before {
                Some(value) => self.writes.insert(key, value),
                None => self.writes.remove(&key),
            };
        }
    }
    fn write(&mut self, key: Vec<u8>, value: Write) {
        let before = self.writes.insert(key.clone(), value);
        self.undo.push((key, before));
    }
    /// The entries whose keys start with `prefix`, the overlay's writes included.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self
            .writes
            .range(prefix.to_vec()..)
            .take_while(|(key, _)| key.starts_with(prefix));
        Self::merge(self.tree.scan_prefix(prefix), overlay)
    }
    /// The entries with keys in `start..=end`, the overlay's writes included.
    fn scan_range(&self, start: Vec<u8>, end: Vec<u8>) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let overlay = self.writes.range(start.clone()..=end.clone());
        Self::merge(self.tree.range(start..=end), overlay)
    }
    fn merge<'w>(
        stored: sled::Iter,
        overlay: impl Iterator<Item = (&'w Vec<u8>, &'w Write)>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = BTreeMap::new();
        for item in stored {
            let (key, value) = item?;
            entries.insert(key.to_vec(), value.to_vec());
        }
        for (key, value) in overlay {
            match value {
                Some(value) => entries.insert(key.clone(), value.clone()),
                None => entries.remove(key),
            };
        }
        Ok(entries.into_iter().collect())
    }
    fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(value) = self.writes.get(key) {
            return Ok(value.clone());
        }
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }
    fn get<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        self.get_raw(key)?.map(|bytes| decode(&bytes)).transpose()
    }
    fn get_str(&self, key: &[u8]) -> Result<Option<String>> {
        Ok(self
            .get_raw(key)?
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }
    fn put<T: Serialize>(&mut self, key: Vec<u8>, value: &T) -> Result<()> {
        self.write(key, Some(encode(value)?));
        Ok(())
    }
    fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.write(key, Some(value));
    }
    fn put_str(&mut self, key: Vec<u8>, value: &str) {
        self.write(key, Some(value.as_bytes().to_vec()));
    }
    fn remove(&mut self, key: Vec<u8>) {
        self.write(key, None);
    }
    fn into_batch(self) -> sled::Batch {
        let mut batch = sled::Batch::default();
        for (key, value) in self.writes {
            match value {
                Some(value) => batch.insert(key, value),
                None => batch.remove(key),
            }
        }
        batch
    }
}

impl SledMetaStore {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let db = sled::Config::new().path(dir).open()?;
        let tree = db.open_tree("meta")?;
        let store = SledMetaStore {
            db,
            tree,
            apply_lock: Mutex::new(()),
        };
        store.build_pending_index()?;
        Ok(store)
    }

    /// Builds the derived indexes of a store written before they existed: the pending-work
    /// index (every unfinished document, worker 0) and the bytes of every shard.
    /// Deterministic, so every node of a cluster builds the same keys.
    fn build_pending_index(&self) -> Result<()> {
        if self.tree.contains_key(PENDING_INDEX_KEY)? {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        let mut bytes: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for item in self.tree.scan_prefix(b"doc/") {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            *bytes
                .entry(shard_bytes_key(&doc.kb_id, doc.shard))
                .or_default() += doc.size_bytes;
            if !doc.status.is_terminal() {
                let work = PendingWork {
                    worker: 0,
                    shard: doc.shard,
                    attempts: 0,
                };
                batch.insert(pending_key(&doc.kb_id, &doc.id), encode(&work)?);
            }
        }
        for (key, total) in bytes {
            batch.insert(key, encode(&total)?);
        }
        batch.insert(PENDING_INDEX_KEY, b"1".as_slice());
        self.tree.apply_batch(batch)?;
        self.tree.flush()?;
        Ok(())
    }

    /// The pending-work entry of one document (none once it is ready, failed or deleted).
    pub fn pending_work(&self, kb_id: &str, doc_id: &str) -> Result<Option<PendingWork>> {
        self.tree
            .get(pending_key(kb_id, doc_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// The raw bytes of the live documents of every shard of every KB: `(kb_id, shard)` ->
    /// bytes (placement balances nodes by replica count, then by bytes).
    pub fn shard_bytes(&self) -> Result<BTreeMap<(String, u32), u64>> {
        let mut bytes = BTreeMap::new();
        for item in self.tree.scan_prefix(b"shardbytes/") {
            let (key, value) = item?;
            let key = String::from_utf8_lossy(&key[b"shardbytes/".len()..]).into_owned();
            if let Some((kb_id, shard)) = key.split_once('/')
                && let Ok(shard) = shard.parse()
            {
                bytes.insert((kb_id.to_string(), shard), decode(&value)?);
            }
        }
        Ok(bytes)
    }

    /// Nodes being drained before their removal, in id order.
    pub fn draining_nodes(&self) -> Result<Vec<u64>> {
        let mut nodes = Vec::new();
        for item in self.tree.scan_prefix(b"drain/") {
            let (key, _) = item?;
            if let Ok(node) = String::from_utf8_lossy(&key[b"drain/".len()..]).parse() {
                nodes.push(node);
            }
        }
        Ok(nodes)
    }

    /// Every unfinished document with the node that ingests it, in key order.
    pub fn pending_documents(&self) -> Result<Vec<PendingDocument>> {
        let mut pending = Vec::new();
        for item in self.tree.scan_prefix(b"pend/") {
            let (key, value) = item?;
            let key = String::from_utf8_lossy(&key[b"pend/".len()..]).into_owned();
            let Some((kb_id, document_id)) = key.split_once('/') else {
                continue;
            };
            pending.push(PendingDocument {
                kb_id: kb_id.to_string(),
                document_id: document_id.to_string(),
                work: decode(&value)?,
            });
        }
        Ok(pending)
    }

    /// The underlying database, for node-local trees that are not metadata (raw texts, caches).
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    pub fn get_kb(&self, kb_id: &str) -> Result<Option<KbRecord>> {
        self.tree
            .get(kb_key(kb_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Looks a KB up by id, then by name.
    pub fn find_kb(&self, id_or_name: &str) -> Result<Option<KbRecord>> {
        if let Some(kb) = self.get_kb(id_or_name)? {
            return Ok(Some(kb));
        }
        match self.tree.get(kb_name_key(id_or_name))? {
            Some(id) => self.get_kb(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub fn list_kbs(&self) -> Result<Vec<KbRecord>> {
        let mut kbs = Vec::new();
        for item in self.tree.scan_prefix(b"kb/") {
            let (_, value) = item?;
            kbs.push(decode::<KbRecord>(&value)?);
        }
        kbs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(kbs)
    }

    pub fn get_document(&self, kb_id: &str, doc_id: &str) -> Result<Option<DocumentRecord>> {
        self.tree
            .get(doc_key(kb_id, doc_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Looks a document up by id, then by external id.
    pub fn find_document(
        &self,
        kb_id: &str,
        id_or_external: &str,
    ) -> Result<Option<DocumentRecord>> {
        if let Some(doc) = self.get_document(kb_id, id_or_external)? {
            return Ok(Some(doc));
        }
        match self.tree.get(ext_key(kb_id, id_or_external))? {
            Some(id) => self.get_document(kb_id, &String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// Documents of a KB in id order (ids are time-ordered), starting after `after`.
    pub fn list_documents(
        &self,
        kb_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DocumentRecord>> {
        let prefix = doc_prefix(kb_id);
        let start = match after {
            Some(after) => {
                let mut key = doc_key(kb_id, after);
                key.push(0);
                key
            }
            None => prefix.clone(),
        };
        let mut docs = Vec::new();
        for item in self.tree.range(start..) {
            let (key, value) = item?;
            if !key.starts_with(&prefix) || docs.len() >= limit {
                break;
            }
            docs.push(decode::<DocumentRecord>(&value)?);
        }
        Ok(docs)
    }

    /// Every live document of every KB that is not in a terminal state: work to resume.
    pub fn unfinished_documents(&self) -> Result<Vec<DocumentRecord>> {
        let mut docs = Vec::new();
        for item in self.tree.scan_prefix(b"doc/") {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            if !doc.status.is_terminal() {
                docs.push(doc);
            }
        }
        Ok(docs)
    }

    pub fn document_counts(&self, kb_id: &str) -> Result<DocumentCounts> {
        let mut counts = DocumentCounts::default();
        for status in DocStatus::ALL {
            counts.by_status.insert(status, 0);
        }
        for item in self.tree.scan_prefix(doc_prefix(kb_id)) {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            counts.total += 1;
            *counts.by_status.entry(doc.status).or_default() += 1;
        }
        Ok(counts)
    }

    pub fn is_tombstoned(&self, kb_id: &str, doc_id: &str) -> Result<bool> {
        Ok(self.tree.contains_key(tomb_key(kb_id, doc_id))?)
    }

    pub fn tombstones(&self, kb_id: &str) -> Result<Vec<Tombstone>> {
        let mut tombs = Vec::new();
        for item in self.tree.scan_prefix(tomb_prefix(kb_id)) {
            let (_, value) = item?;
            tombs.push(decode(&value)?);
        }
        Ok(tombs)
    }

    fn apply_op(&self, pending: &mut Pending<'_>, op: &MetaOp) -> Result<MetaOutcome> {
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
                pending.remove(kb_name_key(&kb.name));
                let mut documents = Vec::new();
                let prefixes = [
                    doc_prefix(kb_id),
                    format!("docext/{kb_id}/").into_bytes(),
                    format!("dochash/{kb_id}/").into_bytes(),
                    tomb_prefix(kb_id),
                    pending_prefix(kb_id),
                    shard_bytes_prefix(kb_id),
                ];
                for prefix in prefixes {
                    for (key, value) in pending.scan_prefix(&prefix)? {
                        if prefix.starts_with(b"doc/") {
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
                    doc.status = update.status;
                    doc.error = update.error.clone();
                    if let Some(count) = update.chunk_count {
                        doc.chunk_count = count;
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
            } => {
                let record = SessionRecord {
                    id: id.clone(),
                    kbs: kbs.clone(),
                    agent: agent.clone(),
                    created_at_ms: *created_at_ms,
                    updated_at_ms: *created_at_ms,
                    turns: 0,
                    history_summary: None,
                    summary_turns: 0,
                };
                Ok(MetaOutcome::Session(
                    self.apply_create_session(pending, &record)?,
                ))
            }
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

/// How many log entries the id of an applied op is remembered for (see
/// [`SledMetaStore::apply_with_id`]).
pub const OP_ID_WINDOW: u64 = 100_000;

const EXPORT_MAGIC: &[u8] = b"SIFTMETA1";

fn op_id_key(op_id: &str) -> Vec<u8> {
    format!("opid/{op_id}").into_bytes()
}
fn op_index_key(index: u64) -> Vec<u8> {
    format!("opindex/{index:020}").into_bytes()
}

/// A committed op with its log index and, for replicated logs, the proposer's op id (see
/// [`SledMetaStore::apply_with_id`]).
#[derive(Clone, Copy, Debug)]
pub struct LoggedOp<'a> {
    pub index: u64,
    pub op_id: Option<&'a str>,
    pub op: &'a MetaOp,
}

impl SledMetaStore {
    /// Like [`MetaStateMachine::apply`], for replicated logs where a client may propose the same
    /// op twice (a retry after its leader died). The first application of `op_id` records its
    /// outcome; a later op with the same id within [`OP_ID_WINDOW`] entries returns that outcome
    /// and changes nothing. Ids older than the window are forgotten at a point fixed by the log
    /// index, so every node forgets alike. An op that is refused records nothing: a retry is
    /// judged again.
    ///
    /// Not flushed (unlike [`MetaStateMachine::apply`]): the replicated log is the durable
    /// record, and the op's effects and its applied index are one atomic batch, so after a
    /// crash the store is at some earlier index and the log replays the rest. See
    /// [`Self::flush`].
    pub fn apply_with_id(&self, index: u64, op_id: &str, op: &MetaOp) -> Result<MetaOutcome> {
        self.apply_at(index, Some(op_id), op, false)
    }

    /// Makes every applied op durable.
    pub fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// Applies committed ops in log order as one atomic sled batch: each op sees the effects
    /// of those before it, and the batch's last index is the store's applied index. Each op
    /// gets its own outcome; an op that is refused changes nothing but consumes its index. A
    /// storage error in an op ends the batch there: the ops before it are written, the error
    /// is its outcome, and the ops after it are not applied (nor in the result).
    pub fn apply_batch_with_ids(
        &self,
        ops: &[LoggedOp<'_>],
        flush: bool,
    ) -> Result<Vec<Result<MetaOutcome>>> {
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut applied = self.applied_index();
        let mut pending = Pending::new(&self.tree);
        let mut outcomes = Vec::with_capacity(ops.len());
        for logged in ops {
            let index = logged.index;
            if index <= applied {
                outcomes.push(Ok(MetaOutcome::Unchanged));
                continue;
            }
            let outcome = self.apply_one(&mut pending, logged);
            if let Err(error) = &outcome
                && error.is_transient()
            {
                outcomes.push(outcome);
                break;
            }
            applied = index;
            outcomes.push(outcome);
        }
        if applied > self.applied_index() {
            pending.put_raw(APPLIED_KEY.to_vec(), applied.to_be_bytes().to_vec());
            self.tree.apply_batch(pending.into_batch())?;
            if flush {
                self.db.flush()?;
            }
        }
        Ok(outcomes)
    }

    /// One op of a batch (see [`Self::apply_batch_with_ids`]).
    fn apply_one(&self, pending: &mut Pending<'_>, logged: &LoggedOp<'_>) -> Result<MetaOutcome> {
        let LoggedOp { index, op_id, op } = *logged;
        if let Some(op_id) = op_id
            && let Some((_, outcome)) = pending.get::<(u64, MetaOutcome)>(&op_id_key(op_id))?
        {
            return Ok(outcome);
        }
        let mark = pending.mark();
        // A failed op still consumes its index: it is in the log and every node fails it alike.
        let outcome = self.apply_op(pending, op);
        if let (Some(op_id), Ok(outcome)) = (op_id, &outcome) {
            pending.put(op_id_key(op_id), &(index, outcome))?;
            pending.put_str(op_index_key(index), op_id);
        }
        if op_id.is_some() && index > OP_ID_WINDOW {
            let end = op_index_key(index - OP_ID_WINDOW);
            for (key, old_id) in pending.scan_range(op_index_key(0), end)? {
                pending.remove(op_id_key(&String::from_utf8_lossy(&old_id)));
                pending.remove(key);
            }
        }
        if outcome.is_err() {
            pending.rollback(mark);
        }
        outcome
    }

    fn apply_at(
        &self,
        index: u64,
        op_id: Option<&str>,
        op: &MetaOp,
        flush: bool,
    ) -> Result<MetaOutcome> {
        let logged = LoggedOp { index, op_id, op };
        match self.apply_batch_with_ids(&[logged], flush)?.pop() {
            Some(outcome) => outcome,
            None => Ok(MetaOutcome::Unchanged),
        }
    }

    /// The whole metadata state (every key but the applied index) as bytes, in key order:
    /// two stores that applied the same ops export identical bytes. Used for Raft snapshots.
    pub fn export_state(&self) -> Result<Vec<u8>> {
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut out = EXPORT_MAGIC.to_vec();
        for item in self.tree.iter() {
            let (key, value) = item?;
            if key.as_ref() == APPLIED_KEY {
                continue;
            }
            for part in [key.as_ref(), value.as_ref()] {
                out.extend_from_slice(&(part.len() as u32).to_be_bytes());
                out.extend_from_slice(part);
            }
        }
        Ok(out)
    }

    /// Replaces the whole metadata state with `bytes` from [`Self::export_state`], applied up to
    /// `index`, in one atomic batch. Malformed bytes are refused and change nothing.
    pub fn import_state(&self, index: u64, bytes: &[u8]) -> Result<()> {
        let corrupt = || StorageError::Corrupt("metadata state export is malformed".into());
        let mut rest = bytes.strip_prefix(EXPORT_MAGIC).ok_or_else(corrupt)?;
        let mut entries = BTreeMap::new();
        let take = |rest: &mut &[u8]| -> Result<Vec<u8>> {
            let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(corrupt)?;
            let len = u32::from_be_bytes(*len) as usize;
            if tail.len() < len {
                return Err(corrupt());
            }
            let (part, tail) = tail.split_at(len);
            *rest = tail;
            Ok(part.to_vec())
        };
        while !rest.is_empty() {
            let key = take(&mut rest)?;
            let value = take(&mut rest)?;
            entries.insert(key, value);
        }
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut batch = sled::Batch::default();
        for item in self.tree.iter() {
            let (key, _) = item?;
            if !entries.contains_key(key.as_ref()) {
                batch.remove(key);
            }
        }
        for (key, value) in entries {
            batch.insert(key, value);
        }
        batch.insert(APPLIED_KEY, &index.to_be_bytes());
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        // An export from a store without the pending-work index: build it here too.
        self.build_pending_index()
    }
}

impl MetaStateMachine for SledMetaStore {
    fn apply(&self, index: u64, op: &MetaOp) -> Result<MetaOutcome> {
        self.apply_at(index, None, op, true)
    }

    fn applied_index(&self) -> u64 {
        match self.tree.get(APPLIED_KEY) {
            Ok(Some(bytes)) if bytes.len() == 8 => {
                let mut array = [0u8; 8];
                array.copy_from_slice(&bytes);
                u64::from_be_bytes(array)
            }
            _ => 0,
        }
    }
}

mod sessions;
pub use sessions::{SessionRecord, StoredTurn, TurnCitation, TurnTraceStep, TurnUsage};

#[cfg(test)]
mod tests;
