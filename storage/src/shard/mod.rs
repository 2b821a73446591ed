//! One shard replica's indexes, in one directory: a dense HNSW index ([`vector`], in memory,
//! snapshots in `hnsw/`), a BM25 index ([`text`], tantivy in `text/`) and a chunk store
//! ([`chunk_store`], sled in `chunks/`). [`ShardIndex`] is the only public type; it is `Send + Sync` and every method
//! takes `&self`: searches run concurrently, writes are serialised by one writer lock.
//!
//! # Durability protocol
//!
//! The chunk store is the write-ahead record; both indexes are derived from it.
//!
//! A write (`write_documents`) happens in three steps:
//! 1. The whole batch (entries, chunks, vectors, parents, the removal of any previous version
//!    or tombstone of the same document ids, the next internal id and a new *write sequence*)
//!    goes into sled in one transaction across all trees, followed by `flush()` (fsync). From
//!    here the write survives a crash.
//! 2. The vectors are inserted into the HNSW graph (memory only) and the documents become
//!    live in the in-memory filter map (old versions' chunks are hidden at the same moment).
//! 3. For each document, tantivy deletes its `document_id` term and adds its chunks; the
//!    commit carries the write sequence as payload (`prepare_commit`, `set_payload`,
//!    `commit`), then the reader reloads. When `write_documents` returns, both channels see
//!    the batch.
//!
//! A document too large to hold at once is written in slices (`write_slice`), then
//! committed (`commit_slices`). Each slice is one flushed sled transaction: its chunks,
//! vectors and parents go into their trees, and the `slices` tree notes which positions were
//! written (a position written again keeps its internal id). No live document points at them,
//! so no search, listing or export sees them, and the indexes never hold them. The commit
//! checks that every position below its counts was written, then writes the document record
//! (removing the slice notes and any earlier version or tombstone) in one flushed transaction
//! with a new write sequence, and feeds HNSW and tantivy from the store block by block; replay
//! after a crash is the same as for a whole write. A delete also removes slices never
//! committed.
//!
//! A delete (`delete_document`) writes a tombstone (and removes the document entry) in one
//! flushed sled transaction with a new write sequence, hides the chunks in memory (so the HNSW
//! filter and the BM25 result check drop them at once), then deletes the `document_id` term in
//! tantivy and commits with the sequence as payload. Chunk records stay until
//! [`ShardIndex::purge_deleted`], which removes them and rebuilds the HNSW graph without them
//! when dead points exceed a share of the graph. Re-writing a deleted document id is a new
//! version: the write clears the tombstone.
//!
//! On `open`: the live-document map is read from the chunk store; the HNSW graph is loaded
//! from its latest snapshot (`hnsw/`, saved every time the graph has grown by a quarter, at
//! least 2000 points) and given the live chunks it lacks, or, without a usable snapshot,
//! rebuilt from the stored vectors of live chunks (`parallel_insert`). Snapshots are only a
//! shortcut: any snapshot, however old, plus the catch-up gives the same live set. Tantivy is
//! opened (the analyzer registered again) and its last commit payload read. Every document whose write sequence is
//! newer than the payload is deleted from tantivy by `document_id` and re-added from the chunk
//! store, and every tombstone newer than the payload is deleted again; then a commit records
//! the store's sequence. Replay works from the store's current state, so it is idempotent and a
//! deleted document is never resurrected by a replay. If the payload is ahead of the store
//! (which an fsync'd store makes impossible short of tampering), the text index is rebuilt
//! from scratch. A `kill -9` at any point therefore leaves a shard that `open` makes
//! consistent: before the flush of step 1 the operation never happened; after it, the
//! operation is completed by the replay.
//!
//! If the tantivy step fails at run time, its uncommitted operations are rolled back and the
//! same replay runs before the next write; a failed sled flush makes the shard refuse writes
//! until it is reopened.

mod chunk_store;
mod graph;
mod live_documents;
mod text;
mod text_stats;
mod vector;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::instrument;

use self::chunk_store::{ChunkStore, Counters, StoreBatch, StoredChunk, StoredDocument, Tombstone};
pub use self::graph::{
    ChunkGraph, EntityNeighbourhood, GraphDocumentState, GraphEntity, GraphEvent, GraphMention,
    GraphPut, GraphStats, NeighbourChunk, PendingChunk, PendingGraphDocument,
};
use self::graph::{GraphCache, GraphChanges};
use self::live_documents::{CompiledFilter, LiveDocument, LiveDocuments};
use self::text::{TextChunk, TextIndex, TextWriterSlot};
use self::vector::{HnswParams, VectorIndex};
use crate::chunk::{
    ChunkRecord, ChunkView, DocumentCommit, DocumentEntry, DocumentSlice, DocumentWrite,
    ScoredChunk, SearchFilter, ShardWrite, chunk_id,
};
use crate::error::{Result, StorageError};

/// A dense search scores candidates exactly (reading their vectors from the chunk store)
/// when its filter passes at most this many chunks, or, unfiltered, when the shard holds at
/// most this many; otherwise it searches the HNSW graph (filtered inside the search).
const EXACT_SEARCH_MAX_CANDIDATES: usize = 1024;
/// Subdirectory of the HNSW snapshot.
const HNSW_DIR: &str = "hnsw";
/// Most BM25 hits fetched to see the whole of a tie at the k-th hit (past it, a tie is cut
/// where the segments put it).
const MAX_TIE_FETCH: usize = 4096;
/// `purge_deleted` rebuilds the graph when at least this share of its points is dead.
const REBUILD_DEAD_SHARE: f64 = 0.2;
/// A write saves a new HNSW snapshot once the graph has grown by this many points, or by a
/// quarter of its size at the last snapshot if that is more.
const SNAPSHOT_MIN_NEW_POINTS: usize = 2000;
/// Vectors inserted into a graph being rebuilt, per block.
const REBUILD_BLOCK: usize = 8192;

/// Parameters of one shard replica.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Dimension of every vector; fixed when the shard is created.
    pub dimension: usize,
    /// HNSW links per node (at most 256).
    pub hnsw_m: usize,
    /// HNSW candidate list size while building.
    pub hnsw_ef_construction: usize,
    /// HNSW candidate list size while searching; the effective value is `max(this, k)`.
    pub hnsw_ef_search: usize,
    /// tantivy indexing memory budget (one indexing thread, at least 15 MB).
    pub writer_memory_bytes: usize,
}

impl ShardConfig {
    pub fn new(dimension: usize) -> Self {
        ShardConfig {
            dimension,
            hnsw_m: 16,
            hnsw_ef_construction: 200,
            hnsw_ef_search: 64,
            writer_memory_bytes: 32 * 1024 * 1024,
        }
    }

    fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(StorageError::Invalid(message));
        if self.dimension == 0 {
            return invalid("shard dimension must be positive".to_owned());
        }
        if !(2..=vector::MAX_M).contains(&self.hnsw_m) {
            return invalid(format!(
                "hnsw_m must be in 2..={}, not {}",
                vector::MAX_M,
                self.hnsw_m
            ));
        }
        if self.hnsw_ef_construction == 0 || self.hnsw_ef_search == 0 {
            return invalid("hnsw ef values must be positive".to_owned());
        }
        if !(text::MIN_WRITER_MEMORY_BYTES..=text::MAX_WRITER_MEMORY_BYTES)
            .contains(&self.writer_memory_bytes)
        {
            return invalid(format!(
                "writer_memory_bytes must be in {}..={}, not {}",
                text::MIN_WRITER_MEMORY_BYTES,
                text::MAX_WRITER_MEMORY_BYTES,
                self.writer_memory_bytes
            ));
        }
        Ok(())
    }
}

/// Counts describing a shard replica.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    /// Live documents.
    pub documents: u64,
    /// Live chunks.
    pub chunks: u64,
    /// Deleted documents whose tombstone has not been purged.
    pub tombstones: u64,
    /// Points in the HNSW graph, including dead ones awaiting a rebuild.
    pub indexed_vectors: u64,
    /// Approximate size of the shard directory.
    pub disk_bytes: u64,
}

/// One shard replica: HNSW dense index + tantivy BM25 index + sled chunk store.
pub struct ShardIndex {
    dir: PathBuf,
    config: ShardConfig,
    store: ChunkStore,
    vectors: VectorIndex,
    text: TextIndex,
    live: RwLock<LiveDocuments>,
    writer: Mutex<Writer>,
    tombstones: AtomicU64,
    /// The graph partition's counts (see [`graph`]).
    graph: RwLock<GraphCache>,
}

/// State owned by the single writer.
struct Writer {
    text_writer: TextWriterSlot,
    counters: Counters,
    /// Payload of the last tantivy commit.
    text_sequence: u64,
    /// A tantivy step failed: replay the chunk store into tantivy before the next operation.
    text_stale: bool,
    /// A sled flush failed: the in-memory state may be ahead of the disk; refuse writes.
    broken: Option<String>,
    /// Points in the graph at the last HNSW snapshot (saved or loaded).
    snapshot_points: usize,
}

/// A document that passed step 1, on its way into the indexes.
struct StagedDocument {
    entry: DocumentEntry,
    chunks: Vec<(u64, ChunkRecord)>,
    vectors: Vec<(Vec<f32>, u64)>,
}

struct StagedWrite {
    sequence: u64,
    documents: Vec<StagedDocument>,
}

impl ShardIndex {
    /// Opens the shard in `dir`, creating it if needed, and recovers from any crash (see the
    /// module docs).
    #[instrument(skip_all, fields(dir = %dir.display(), dimension = config.dimension))]
    pub fn open(dir: &Path, config: ShardConfig) -> Result<ShardIndex> {
        config.validate()?;
        let started = Instant::now();
        std::fs::create_dir_all(dir)?;
        let store = ChunkStore::open(&dir.join("chunks"))?;
        store.check_dimension(config.dimension)?;
        let counters = store.counters()?;
        let text = TextIndex::open(&dir.join("text"))?;
        let text_writer = TextWriterSlot::new(config.writer_memory_bytes);
        let text_sequence = text.committed_sequence()?;

        let mut live = LiveDocuments::default();
        store.for_each_document(|document_id, stored| {
            live.insert(live_document(document_id, &stored));
            Ok(())
        })?;
        let mut tombstones = 0u64;
        store.for_each_tombstone(|_, _| {
            tombstones += 1;
            Ok(())
        })?;

        let params = HnswParams {
            dimension: config.dimension,
            m: config.hnsw_m,
            ef_construction: config.hnsw_ef_construction,
        };
        let vectors = VectorIndex::new(params, live.chunk_count());
        let graph_started = Instant::now();
        let (graph, snapshot_points) = match vector::load_snapshot(params, &dir.join(HNSW_DIR)) {
            Some(graph) => {
                let snapshot_points = graph.get_nb_point();
                catch_up_graph(&store, &live, &graph)?;
                (graph, snapshot_points)
            }
            None => (load_graph(&store, &live, &vectors)?, 0),
        };
        vectors.replace(graph);
        let graph_seconds = graph_started.elapsed().as_secs_f64();
        let graph_cache = GraphCache::load(store.graph())?;

        let shard = ShardIndex {
            dir: dir.to_path_buf(),
            config,
            store,
            vectors,
            text,
            live: RwLock::new(live),
            writer: Mutex::new(Writer {
                text_writer,
                counters,
                text_sequence,
                text_stale: text_sequence != counters.write_sequence,
                broken: None,
                snapshot_points,
            }),
            tombstones: AtomicU64::new(tombstones),
            graph: RwLock::new(graph_cache),
        };
        shard.graph_backfill()?;
        {
            let mut writer = shard.lock_writer()?;
            shard.ensure_text_current(&mut writer)?;
            shard.maybe_snapshot(&mut writer);
        }
        let stats = shard.stats();
        tracing::info!(
            documents = stats.documents,
            chunks = stats.chunks,
            tombstones = stats.tombstones,
            graph_seconds,
            from_snapshot = snapshot_points > 0,
            seconds = started.elapsed().as_secs_f64(),
            "shard opened"
        );
        Ok(shard)
    }

    /// Stores `documents` durably and makes them searchable in both channels before
    /// returning. A document whose id exists already is replaced (its old chunks are removed);
    /// one that was deleted comes back as a new version. Within the batch, the last of several
    /// documents with the same id wins.
    #[instrument(skip_all, fields(documents = documents.len()))]
    pub fn write_documents(&self, documents: Vec<DocumentWrite>) -> Result<()> {
        if documents.is_empty() {
            return Ok(());
        }
        let documents = self.prepare(documents)?;
        let mut writer = self.lock_writer()?;
        self.ensure_text_current(&mut writer)?;
        let staged = self.stage_write(&mut writer, documents)?;
        self.index_write(&mut writer, staged)?;
        self.maybe_snapshot(&mut writer);
        Ok(())
    }

    /// Applies one [`ShardWrite`]: whole documents, a slice, or the commit of a document's
    /// slices.
    pub fn write(&self, write: ShardWrite) -> Result<()> {
        match write {
            ShardWrite::Documents(documents) => self.write_documents(documents),
            ShardWrite::Slice(slice) => self.write_slice(slice),
            ShardWrite::Commit(commit) => self.commit_slices(commit),
        }
    }

    /// Stores a slice of a document too large to write at once, durably, out of search,
    /// listings and exports until [`Self::commit_slices`]. A chunk position written again
    /// keeps its internal id and gets the new record.
    #[instrument(skip_all, fields(document_id = %slice.document_id, chunks = slice.chunks.len()))]
    pub fn write_slice(&self, slice: DocumentSlice) -> Result<()> {
        let DocumentSlice {
            document_id,
            parents,
            mut chunks,
        } = slice;
        if document_id.is_empty() {
            return Err(StorageError::Invalid("empty document id".to_owned()));
        }
        self.check_positions(&document_id, &chunks, &parents)?;
        for chunk in &mut chunks {
            chunk.vector = vector::normalised(&chunk.vector, self.config.dimension)?;
        }
        let mut writer = self.lock_writer()?;
        check_not_broken(&writer)?;
        let mut next_internal_id = writer.counters.next_internal_id;
        let mut batch = StoreBatch::default();
        for mut record in chunks {
            let id = match self.store.slice_chunk(&document_id, record.position)? {
                Some(id) => id,
                None => {
                    next_internal_id += 1;
                    next_internal_id - 1
                }
            };
            let vector = std::mem::take(&mut record.vector);
            batch.put_slice_chunk(&document_id, record.position, id);
            let stored = StoredChunk {
                document_id: document_id.clone(),
                record,
            };
            batch.put_chunk(id, &stored, &vector)?;
        }
        for parent in &parents {
            batch.put_parent(&document_id, parent)?;
            batch.put_slice_parent(&document_id, parent.position);
        }
        let counters = Counters {
            next_internal_id,
            ..writer.counters
        };
        batch.set_counters(counters);
        self.apply_to_store(&mut writer, &batch)?;
        writer.counters = counters;
        Ok(())
    }

    /// Makes the slices written for a document its live version (replacing any earlier one),
    /// searchable in both channels when this returns. The indexes are fed from the chunk
    /// store in blocks, so the memory it takes does not grow with the document. Refused when
    /// a chunk or parent position below the commit's counts was never written.
    #[instrument(skip_all, fields(document_id = %commit.entry.document_id, chunks = commit.chunk_count))]
    pub fn commit_slices(&self, commit: DocumentCommit) -> Result<()> {
        let DocumentCommit {
            entry,
            chunk_count,
            parent_count,
        } = commit;
        let document_id = entry.document_id.clone();
        let mut writer = self.lock_writer()?;
        self.ensure_text_current(&mut writer)?;
        let slices = self.store.slice_index(&document_id)?;
        let chunk_ids: Vec<u64> = slices
            .chunks
            .iter()
            .filter(|(position, _)| *position < chunk_count)
            .map(|(_, id)| *id)
            .collect();
        let parents_written = slices
            .parents
            .iter()
            .filter(|&&position| position < parent_count)
            .count();
        if chunk_count == 0
            || chunk_ids.len() != chunk_count as usize
            || parents_written != parent_count as usize
        {
            return Err(StorageError::Invalid(format!(
                "document {document_id}: its slices hold {} of its {chunk_count} chunks and \
                 {parents_written} of its {parent_count} parents; a slice is missing",
                chunk_ids.len()
            )));
        }

        // Step 1: the document record, the slice index gone, any earlier version or
        // tombstone removed, in one flushed transaction.
        let sequence = writer.counters.write_sequence + 1;
        let mut batch = StoreBatch::default();
        let mut cleared_tombstones = 0u64;
        let mut earlier_chunks = Vec::new();
        let mut earlier_parents = Vec::new();
        let mut graph = GraphChanges::default();
        if let Some(stored) = self.store.document(&document_id)? {
            self.graph_remove_version(&mut graph, &mut batch, &document_id, &stored)?;
            earlier_chunks.extend(stored.chunk_ids);
            earlier_parents.extend(stored.parent_positions);
        }
        if let Some(tombstone) = self.store.tombstone(&document_id)? {
            earlier_chunks.extend(tombstone.internal_ids);
            earlier_parents.extend(tombstone.parent_positions);
            batch.remove_tombstone(&document_id);
            cleared_tombstones = 1;
        }
        for id in earlier_chunks {
            batch.remove_chunk(id);
        }
        // Parent keys are positions: the slices rewrote those below `parent_count`.
        for position in earlier_parents {
            if position >= parent_count {
                batch.remove_parent(&document_id, position);
            }
        }
        for &(position, id) in &slices.chunks {
            batch.remove_slice_chunk(&document_id, position);
            if position >= chunk_count {
                batch.remove_chunk(id);
            }
        }
        for &position in &slices.parents {
            batch.remove_slice_parent(&document_id, position);
            if position >= parent_count {
                batch.remove_parent(&document_id, position);
            }
        }
        batch.put_document(
            &document_id,
            &StoredDocument {
                entry: entry.clone(),
                chunk_ids: chunk_ids.clone(),
                parent_positions: (0..parent_count).collect(),
                write_sequence: sequence,
            },
        )?;
        Self::graph_mark_pending(&mut graph, &mut batch, sequence, &document_id);
        let graph_counts = self.graph_finish(&mut graph, &mut batch)?;
        let counters = Counters {
            write_sequence: sequence,
            ..writer.counters
        };
        batch.set_counters(counters);
        self.apply_to_store(&mut writer, &batch)?;
        self.graph_applied(graph, graph_counts);
        writer.counters = counters;
        self.tombstones
            .fetch_sub(cleared_tombstones, Ordering::Relaxed);

        // Steps 2 and 3, block by block from the store: HNSW, the live map, then tantivy.
        for block in chunk_ids.chunks(REBUILD_BLOCK) {
            let mut points = Vec::with_capacity(block.len());
            for &id in block {
                let vector = self.store.vector(id)?.ok_or_else(|| {
                    StorageError::Corrupt(format!("chunk {id} of {document_id} has no vector"))
                })?;
                points.push((vector, id));
            }
            self.vectors.insert(&points)?;
        }
        self.live_write().insert(LiveDocument::new(
            document_id.clone(),
            entry.metadata.clone(),
            chunk_ids.clone(),
        ));
        let added = (|| -> Result<()> {
            let text_writer = self.text.writer(&mut writer.text_writer)?;
            self.text.delete_document(text_writer, &document_id);
            for &id in &chunk_ids {
                let chunk = self.store.chunk(id)?.ok_or_else(|| {
                    StorageError::Corrupt(format!("chunk {id} of {document_id} is missing"))
                })?;
                self.text
                    .add_chunk(text_writer, &text_chunk(id, &entry, &chunk.record))?;
            }
            Ok(())
        })();
        if let Err(error) = added {
            self.text.rollback(&mut writer.text_writer);
            writer.text_stale = true;
            return Err(error);
        }
        self.commit_text(&mut writer, sequence)?;
        self.maybe_snapshot(&mut writer);
        Ok(())
    }

    /// Removes what slices of `document_id` stored without a commit (a document given up or
    /// deleted while it was written in slices). Returns whether there was any.
    fn drop_slices(&self, writer: &mut Writer, document_id: &str) -> Result<bool> {
        let slices = self.store.slice_index(document_id)?;
        if slices.chunks.is_empty() && slices.parents.is_empty() {
            return Ok(false);
        }
        let live_parents: HashSet<u32> = self
            .store
            .document(document_id)?
            .map(|stored| stored.parent_positions.into_iter().collect())
            .unwrap_or_default();
        let mut batch = StoreBatch::default();
        for &(position, id) in &slices.chunks {
            batch.remove_slice_chunk(document_id, position);
            batch.remove_chunk(id);
        }
        for &position in &slices.parents {
            batch.remove_slice_parent(document_id, position);
            // A live version's parent under the same key stays until that version goes.
            if !live_parents.contains(&position) {
                batch.remove_parent(document_id, position);
            }
        }
        self.apply_to_store(writer, &batch)?;
        Ok(true)
    }

    /// Closes the tantivy writer if no write or delete used it for `idle`, so that an idle
    /// shard holds no writer threads or lock file; the next write opens it again. Returns
    /// whether it closed one.
    pub fn release_idle_writer(&self, idle: Duration) -> Result<bool> {
        let mut writer = self.lock_writer()?;
        self.text.release_idle_writer(&mut writer.text_writer, idle)
    }

    /// Whether the tantivy writer is open (see [`Self::release_idle_writer`]).
    #[cfg(test)]
    pub(crate) fn writer_is_open(&self) -> bool {
        self.lock_writer()
            .map(|writer| writer.text_writer.is_open())
            .unwrap_or(false)
    }

    /// Deletes a document; no search returns it once this returns. Returns whether it existed.
    /// Slices written for it without a commit are removed too. Once the tombstone is durable
    /// the delete has happened: a failure of the later tantivy commit is logged and repaired
    /// by replay, not returned.
    #[instrument(skip_all, fields(document_id = %document_id))]
    pub fn delete_document(&self, document_id: &str) -> Result<bool> {
        let mut writer = self.lock_writer()?;
        self.ensure_text_current(&mut writer)?;
        self.drop_slices(&mut writer, document_id)?;
        let Some(sequence) = self.stage_delete(&mut writer, document_id)? else {
            return Ok(false);
        };
        self.live_write().remove(document_id);
        let deleted = self
            .text
            .writer(&mut writer.text_writer)
            .map(|text_writer| self.text.delete_document(text_writer, document_id))
            .and_then(|()| self.commit_text(&mut writer, sequence));
        if let Err(error) = deleted {
            writer.text_stale = true;
            // The delete is durable and hidden from both channels; tantivy catches up by
            // replay before the next operation or on open.
            tracing::warn!(%error, "text index commit of a delete failed; will replay");
        }
        Ok(true)
    }

    /// The `k` chunks nearest to `vector` (cosine similarity, best first) among those
    /// passing `filter`.
    #[instrument(level = "debug", skip_all, fields(k = k))]
    pub fn search_dense(
        &self,
        vector: &[f32],
        k: usize,
        filter: &SearchFilter,
    ) -> Result<Vec<ScoredChunk>> {
        let query = vector::normalised(vector, self.config.dimension)?;
        if k == 0 || filter.document_ids.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let live = self.live_read();
        let compiled = CompiledFilter::new(filter).for_documents_of(&live);
        let candidates = if compiled.is_empty() {
            // A small shard is scored exactly: about as cheap as the graph, and alike on every
            // replica, whatever order built each one's graph (ADR 0028).
            (live.chunk_count() <= EXACT_SEARCH_MAX_CANDIDATES)
                .then(|| live.all_matching_chunks(&compiled))
        } else {
            live.matching_chunks(&compiled, EXACT_SEARCH_MAX_CANDIDATES)
        };
        let hits = match candidates {
            Some(candidates) => {
                drop(live);
                self.exact_dense(&query, k, candidates)?
            }
            None => {
                let ef = self.config.hnsw_ef_search.max(k);
                // Always filtered, even with nothing to hide: hnsw_rs then explores until its
                // candidate list is exhausted instead of stopping early, which costs about
                // twice the time and buys recall (0.998 against 0.93 at ef 64 on the clustered
                // test data).
                let keep = |id: u64| live.chunk(id).is_some_and(|doc| compiled.matches(doc));
                self.vectors.search(&query, k, ef, Some(&keep))
            }
        };
        self.hydrate(hits, k)
    }

    /// The `k` best chunks for `vector` by exact cosine similarity over every live chunk
    /// passing `filter`: a brute-force scan, the ground truth for measuring HNSW recall.
    pub fn search_dense_exact(
        &self,
        vector: &[f32],
        k: usize,
        filter: &SearchFilter,
    ) -> Result<Vec<ScoredChunk>> {
        let query = vector::normalised(vector, self.config.dimension)?;
        if k == 0 {
            return Ok(Vec::new());
        }
        let compiled = CompiledFilter::new(filter);
        let candidates = self.live_read().all_matching_chunks(&compiled);
        let hits = self.exact_dense(&query, k, candidates)?;
        self.hydrate(hits, k)
    }

    /// The `k` best chunks for `query` by BM25 (best first) among those passing `filter`.
    /// A query with no words left after analysis matches nothing.
    #[instrument(level = "debug", skip_all, fields(k = k))]
    pub fn search_bm25(
        &self,
        query: &str,
        k: usize,
        filter: &SearchFilter,
    ) -> Result<Vec<ScoredChunk>> {
        if k == 0 || filter.document_ids.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        let tokens = self.text.analyze(query);
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        // Groups that hide nothing in this shard stay out of the tantivy query; the hits are
        // checked against them below all the same, in case a restricted document arrived
        // meanwhile.
        let unrestricted;
        let text_filter = if filter.groups.is_some() && !self.live_read().has_restricted() {
            unrestricted = SearchFilter {
                groups: None,
                ..filter.clone()
            };
            &unrestricted
        } else {
            filter
        };
        let readable = CompiledFilter::groups_of(filter);
        let mut limit = k;
        loop {
            let found = self.text.search(&tokens, text_filter, limit)?;
            let exhausted = found.len() < limit;
            let lowest = found.last().map(|(_, score)| *score);
            let hits: Vec<(u64, f32)> = {
                let live = self.live_read();
                found
                    .into_iter()
                    .filter(|(id, _)| live.chunk(*id).is_some_and(|doc| readable.matches(doc)))
                    .collect()
            };
            // Hits can be dead only while a write or delete is between its steps.
            if hits.len() < k && !exhausted {
                limit = limit.saturating_mul(2);
                continue;
            }
            // Chunks tied with the k-th hit may lie past what was fetched: tantivy breaks ties
            // by where a chunk sits in its segments, which differs between replicas. Fetch the
            // whole tie (within MAX_TIE_FETCH) so that `best_by_chunk_id` can break it alike
            // on every replica.
            let tie_goes_on = hits
                .get(k - 1)
                .zip(lowest)
                .is_some_and(|((_, cut), lowest)| lowest >= *cut);
            if tie_goes_on && !exhausted && limit < MAX_TIE_FETCH.max(k) {
                limit = limit.saturating_mul(2);
                continue;
            }
            return self.best_by_chunk_id(hits, k);
        }
    }

    /// The `k` best of `hits` (best first), hydrated; hits tied on score are ordered by chunk
    /// id, so that replicas holding the same chunks in other segments answer alike.
    fn best_by_chunk_id(&self, hits: Vec<(u64, f32)>, k: usize) -> Result<Vec<ScoredChunk>> {
        let tied_with_kth = match hits.get(k - 1) {
            Some((_, cut)) => hits.iter().take_while(|(_, score)| score >= cut).count(),
            None => hits.len(),
        };
        let mut best = self.hydrate(hits, tied_with_kth)?;
        best.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.chunk.chunk_id.cmp(&b.chunk.chunk_id))
        });
        best.truncate(k);
        Ok(best)
    }

    /// Every chunk of a live document, in position order.
    pub fn get_chunks(&self, document_id: &str) -> Result<Vec<ChunkView>> {
        let stored = self
            .store
            .document(document_id)?
            .ok_or_else(|| StorageError::NotFound(format!("document {document_id}")))?;
        let mut views = Vec::with_capacity(stored.chunk_ids.len());
        for &id in &stored.chunk_ids {
            if let Some(chunk) = self.store.chunk(id)? {
                views.push(self.view(&stored.entry, chunk)?);
            }
        }
        views.sort_by_key(|view| view.position);
        Ok(views)
    }

    /// The ids of every live document, in id order.
    pub fn document_ids(&self) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        self.store.for_each_document(|id, _| {
            ids.push(id);
            Ok(())
        })?;
        Ok(ids)
    }

    /// A live document as it was written (entry, parents, chunks with their vectors), to copy
    /// it to another replica; `None` when it is not here (never written, or deleted).
    pub fn export_document(&self, document_id: &str) -> Result<Option<DocumentWrite>> {
        let Some(stored) = self.store.document(document_id)? else {
            return Ok(None);
        };
        let mut parents = Vec::with_capacity(stored.parent_positions.len());
        for &position in &stored.parent_positions {
            if let Some(parent) = self.store.parent(document_id, position)? {
                parents.push(parent);
            }
        }
        let mut chunks = Vec::with_capacity(stored.chunk_ids.len());
        for &id in &stored.chunk_ids {
            let Some(chunk) = self.store.chunk(id)? else {
                continue;
            };
            let mut record = chunk.record;
            record.vector = self.store.vector(id)?.ok_or_else(|| {
                StorageError::Corrupt(format!("chunk {id} of {document_id} has no vector"))
            })?;
            chunks.push(record);
        }
        Ok(Some(DocumentWrite {
            entry: stored.entry,
            parents,
            chunks,
        }))
    }

    /// Whether a live (written and not deleted) document has this id.
    pub fn contains_document(&self, document_id: &str) -> Result<bool> {
        Ok(self.store.document(document_id)?.is_some())
    }

    /// Live chunks (cheap: no disk walk, unlike [`Self::stats`]).
    pub fn live_chunks(&self) -> u64 {
        self.live_read().chunk_count() as u64
    }

    pub fn stats(&self) -> ShardStats {
        let (documents, chunks) = {
            let live = self.live_read();
            (live.document_count(), live.chunk_count())
        };
        ShardStats {
            documents: documents as u64,
            chunks: chunks as u64,
            tombstones: self.tombstones.load(Ordering::Relaxed),
            indexed_vectors: self.vectors.len() as u64,
            disk_bytes: directory_size(&self.dir),
        }
    }

    /// Removes deleted documents' chunks and parents from the chunk store and, when dead
    /// points make up at least a fifth of the HNSW graph, rebuilds the graph from the live
    /// vectors and swaps it in. Searches continue throughout (on the old graph until the
    /// swap; deleted chunks stay hidden by the filter); writes wait. Returns the number of
    /// chunk records removed.
    #[instrument(skip_all)]
    pub fn purge_deleted(&self) -> Result<usize> {
        let mut writer = self.lock_writer()?;
        self.ensure_text_current(&mut writer)?;
        let text_sequence = writer.text_sequence;
        let mut batch = StoreBatch::default();
        let mut purged_chunks = 0usize;
        let mut removed_tombstones = 0u64;
        self.store.for_each_tombstone(|document_id, tombstone| {
            purged_chunks += tombstone.internal_ids.len();
            for &id in &tombstone.internal_ids {
                batch.remove_chunk(id);
            }
            for &position in &tombstone.parent_positions {
                batch.remove_parent(&document_id, position);
            }
            if tombstone.sequence <= text_sequence {
                batch.remove_tombstone(&document_id);
                removed_tombstones += 1;
            } else {
                // The text index has not applied this delete yet: keep the tombstone so that
                // the replay deletes the document there.
                batch.put_tombstone(
                    &document_id,
                    &Tombstone {
                        internal_ids: Vec::new(),
                        parent_positions: Vec::new(),
                        sequence: tombstone.sequence,
                    },
                )?;
            }
            Ok(())
        })?;
        if purged_chunks > 0 || removed_tombstones > 0 {
            self.apply_to_store(&mut writer, &batch)?;
            self.tombstones
                .fetch_sub(removed_tombstones, Ordering::Relaxed);
        }

        let points = self.vectors.len();
        let live_chunks = self.live_read().chunk_count();
        let dead = points.saturating_sub(live_chunks);
        if dead > 0 && dead as f64 >= REBUILD_DEAD_SHARE * points as f64 {
            let started = Instant::now();
            let graph = load_graph(&self.store, &self.live_read(), &self.vectors)?;
            self.vectors.replace(graph);
            self.snapshot(&mut writer);
            tracing::info!(
                dead,
                live_chunks,
                seconds = started.elapsed().as_secs_f64(),
                "hnsw graph rebuilt"
            );
        }
        tracing::info!(
            purged_chunks,
            removed_tombstones,
            "deleted documents purged"
        );
        Ok(purged_chunks)
    }
}

// Write path.
impl ShardIndex {
    /// Validates and normalises a batch, keeping the last document of each id.
    fn prepare(&self, documents: Vec<DocumentWrite>) -> Result<Vec<DocumentWrite>> {
        let mut seen = HashSet::new();
        let mut kept = Vec::with_capacity(documents.len());
        for mut document in documents.into_iter().rev() {
            if !seen.insert(document.entry.document_id.clone()) {
                continue;
            }
            if document.entry.document_id.is_empty() {
                return Err(StorageError::Invalid("empty document id".to_owned()));
            }
            self.check_positions(
                &document.entry.document_id,
                &document.chunks,
                &document.parents,
            )?;
            for chunk in &mut document.chunks {
                chunk.vector = vector::normalised(&chunk.vector, self.config.dimension)?;
            }
            kept.push(document);
        }
        kept.reverse();
        Ok(kept)
    }

    /// Refuses two chunks, or two parents, at one position.
    fn check_positions(
        &self,
        document_id: &str,
        chunks: &[ChunkRecord],
        parents: &[crate::chunk::ParentRecord],
    ) -> Result<()> {
        let mut positions = HashSet::new();
        for chunk in chunks {
            if !positions.insert(chunk.position) {
                return Err(StorageError::Invalid(format!(
                    "document {document_id} has two chunks at position {}",
                    chunk.position
                )));
            }
        }
        positions.clear();
        for parent in parents {
            if !positions.insert(parent.position) {
                return Err(StorageError::Invalid(format!(
                    "document {document_id} has two parents at position {}",
                    parent.position
                )));
            }
        }
        Ok(())
    }

    /// Step 1: the batch goes into the chunk store in one flushed transaction.
    fn stage_write(
        &self,
        writer: &mut Writer,
        documents: Vec<DocumentWrite>,
    ) -> Result<StagedWrite> {
        let sequence = writer.counters.write_sequence + 1;
        let mut next_internal_id = writer.counters.next_internal_id;
        let mut batch = StoreBatch::default();
        let mut graph = GraphChanges::default();
        let mut cleared_tombstones = 0u64;
        // Removals first: a batch keeps only the last operation on a key, and a new version
        // may reuse its predecessor's parent keys.
        for document in &documents {
            let document_id = &document.entry.document_id;
            if let Some(previous) = self.store.document(document_id)? {
                self.graph_remove_version(&mut graph, &mut batch, document_id, &previous)?;
                for id in previous.chunk_ids {
                    batch.remove_chunk(id);
                }
                for position in previous.parent_positions {
                    batch.remove_parent(document_id, position);
                }
            }
            if let Some(tombstone) = self.store.tombstone(document_id)? {
                for id in tombstone.internal_ids {
                    batch.remove_chunk(id);
                }
                for position in tombstone.parent_positions {
                    batch.remove_parent(document_id, position);
                }
                batch.remove_tombstone(document_id);
                cleared_tombstones += 1;
            }
        }
        let mut staged = Vec::with_capacity(documents.len());
        for document in documents {
            let DocumentWrite {
                entry,
                parents,
                chunks,
            } = document;
            let document_id = entry.document_id.clone();
            let mut stored_chunks = Vec::with_capacity(chunks.len());
            let mut vectors = Vec::with_capacity(chunks.len());
            for mut record in chunks {
                let id = next_internal_id;
                next_internal_id += 1;
                let vector = std::mem::take(&mut record.vector);
                let stored = StoredChunk {
                    document_id: document_id.clone(),
                    record,
                };
                batch.put_chunk(id, &stored, &vector)?;
                vectors.push((vector, id));
                stored_chunks.push((id, stored.record));
            }
            for parent in &parents {
                batch.put_parent(&document_id, parent)?;
            }
            batch.put_document(
                &document_id,
                &StoredDocument {
                    entry: entry.clone(),
                    chunk_ids: stored_chunks.iter().map(|(id, _)| *id).collect(),
                    parent_positions: parents.iter().map(|parent| parent.position).collect(),
                    write_sequence: sequence,
                },
            )?;
            Self::graph_mark_pending(&mut graph, &mut batch, sequence, &document_id);
            staged.push(StagedDocument {
                entry,
                chunks: stored_chunks,
                vectors,
            });
        }
        let graph_counts = self.graph_finish(&mut graph, &mut batch)?;
        let counters = Counters {
            next_internal_id,
            write_sequence: sequence,
        };
        batch.set_counters(counters);
        self.apply_to_store(writer, &batch)?;
        self.graph_applied(graph, graph_counts);
        writer.counters = counters;
        self.tombstones
            .fetch_sub(cleared_tombstones, Ordering::Relaxed);
        Ok(StagedWrite {
            sequence,
            documents: staged,
        })
    }

    /// Steps 2 and 3: HNSW, the live map, then tantivy.
    fn index_write(&self, writer: &mut Writer, mut staged: StagedWrite) -> Result<()> {
        // One call for the whole batch, so that large batches are inserted in parallel.
        let points: Vec<(Vec<f32>, u64)> = staged
            .documents
            .iter_mut()
            .flat_map(|document| std::mem::take(&mut document.vectors))
            .collect();
        self.vectors.insert(&points)?;
        drop(points);
        {
            let mut live = self.live_write();
            for document in &staged.documents {
                live.insert(LiveDocument::new(
                    document.entry.document_id.clone(),
                    document.entry.metadata.clone(),
                    document.chunks.iter().map(|(id, _)| *id).collect(),
                ));
            }
        }
        let added = (|| -> Result<()> {
            let text_writer = self.text.writer(&mut writer.text_writer)?;
            for document in &staged.documents {
                let entry = &document.entry;
                self.text.delete_document(text_writer, &entry.document_id);
                for (id, record) in &document.chunks {
                    self.text
                        .add_chunk(text_writer, &text_chunk(*id, entry, record))?;
                }
            }
            Ok(())
        })();
        if let Err(error) = added {
            self.text.rollback(&mut writer.text_writer);
            writer.text_stale = true;
            return Err(error);
        }
        self.commit_text(writer, staged.sequence)
    }

    /// Step 1 of a delete. Returns the delete's sequence, or `None` if the document is not
    /// live.
    fn stage_delete(&self, writer: &mut Writer, document_id: &str) -> Result<Option<u64>> {
        let Some(stored) = self.store.document(document_id)? else {
            return Ok(None);
        };
        let sequence = writer.counters.write_sequence + 1;
        let counters = Counters {
            write_sequence: sequence,
            ..writer.counters
        };
        let mut batch = StoreBatch::default();
        let mut graph = GraphChanges::default();
        self.graph_remove_version(&mut graph, &mut batch, document_id, &stored)?;
        let graph_counts = self.graph_finish(&mut graph, &mut batch)?;
        batch.remove_document(document_id);
        batch.put_tombstone(
            document_id,
            &Tombstone {
                internal_ids: stored.chunk_ids,
                parent_positions: stored.parent_positions,
                sequence,
            },
        )?;
        batch.set_counters(counters);
        self.apply_to_store(writer, &batch)?;
        self.graph_applied(graph, graph_counts);
        writer.counters = counters;
        self.tombstones.fetch_add(1, Ordering::Relaxed);
        Ok(Some(sequence))
    }

    /// Saves an HNSW snapshot if the graph has grown enough since the last one.
    fn maybe_snapshot(&self, writer: &mut Writer) {
        let grown = self.vectors.len().saturating_sub(writer.snapshot_points);
        if grown >= SNAPSHOT_MIN_NEW_POINTS.max(writer.snapshot_points / 4) {
            self.snapshot(writer);
        }
    }

    /// Saves an HNSW snapshot (under the writer lock, so no insert runs). A failure only
    /// costs restart time: it is logged, and retried after the next threshold.
    fn snapshot(&self, writer: &mut Writer) {
        let started = Instant::now();
        let points = self.vectors.len();
        match self.vectors.save_snapshot(&self.dir.join(HNSW_DIR)) {
            Ok(points) => tracing::info!(
                points,
                seconds = started.elapsed().as_secs_f64(),
                "hnsw snapshot saved"
            ),
            Err(error) => tracing::warn!(%error, "hnsw snapshot failed"),
        }
        writer.snapshot_points = points;
    }

    /// Applies and flushes a store batch. A failed transaction changes nothing; a failed
    /// flush leaves memory ahead of the disk, so the shard stops taking writes.
    fn apply_to_store(&self, writer: &mut Writer, batch: &StoreBatch) -> Result<()> {
        self.store.apply(batch)?;
        if let Err(error) = self.store.flush() {
            tracing::error!(%error, "chunk store flush failed; the shard refuses writes until reopened");
            writer.broken = Some(error.to_string());
            return Err(error);
        }
        Ok(())
    }

    /// Commits tantivy with `sequence` as payload; on failure schedules a replay.
    fn commit_text(&self, writer: &mut Writer, sequence: u64) -> Result<()> {
        match self.text.commit(&mut writer.text_writer, sequence) {
            Ok(()) => {
                writer.text_sequence = sequence;
                writer.text_stale = false;
                if let Err(error) = self.store.record_text_sequence(sequence) {
                    tracing::warn!(%error, "could not record the text index sequence");
                }
                Ok(())
            }
            Err(error) => {
                writer.text_stale = true;
                Err(error)
            }
        }
    }

    /// Brings tantivy up to the chunk store if a commit is missing (crash or failure), and
    /// refuses to go on if the store itself is in doubt.
    fn ensure_text_current(&self, writer: &mut Writer) -> Result<()> {
        check_not_broken(writer)?;
        if !writer.text_stale {
            return Ok(());
        }
        let since = writer.text_sequence;
        let target = writer.counters.write_sequence;
        let rebuild = since > target;
        if rebuild {
            tracing::warn!(
                since,
                target,
                "text index is ahead of the chunk store; rebuilding it"
            );
        }
        let started = Instant::now();
        let mut replayed_documents = Vec::new();
        self.store.for_each_document(|document_id, stored| {
            if rebuild || stored.write_sequence > since {
                replayed_documents.push((document_id, stored));
            }
            Ok(())
        })?;
        let mut replayed_deletes = Vec::new();
        if !rebuild {
            self.store.for_each_tombstone(|document_id, tombstone| {
                if tombstone.sequence > since {
                    replayed_deletes.push(document_id);
                }
                Ok(())
            })?;
        }
        let replayed = (|| -> Result<()> {
            let text_writer = self.text.writer(&mut writer.text_writer)?;
            if rebuild {
                self.text.delete_all(text_writer)?;
            }
            for document_id in &replayed_deletes {
                self.text.delete_document(text_writer, document_id);
            }
            for (document_id, stored) in &replayed_documents {
                self.text.delete_document(text_writer, document_id);
                for &id in &stored.chunk_ids {
                    let chunk = self.store.chunk(id)?.ok_or_else(|| {
                        StorageError::Corrupt(format!("chunk {id} of {document_id} is missing"))
                    })?;
                    self.text
                        .add_chunk(text_writer, &text_chunk(id, &stored.entry, &chunk.record))?;
                }
            }
            Ok(())
        })();
        if let Err(error) = replayed {
            self.text.rollback(&mut writer.text_writer);
            return Err(error);
        }
        self.commit_text(writer, target)?;
        tracing::info!(
            since,
            target,
            documents = replayed_documents.len(),
            deletes = replayed_deletes.len(),
            seconds = started.elapsed().as_secs_f64(),
            "text index replayed from the chunk store"
        );
        Ok(())
    }
}

// Read path.
impl ShardIndex {
    /// Scores `candidates` exactly against `query`.
    fn exact_dense(
        &self,
        query: &[f32],
        k: usize,
        candidates: Vec<u64>,
    ) -> Result<Vec<(u64, f32)>> {
        let mut hits = Vec::with_capacity(candidates.len());
        for id in candidates {
            if let Some(vector) = self.store.vector(id)? {
                hits.push((id, vector::cosine(query, &vector)));
            }
        }
        // Equal scores (the same text twice) in id order, not the candidates' hash order.
        hits.sort_by(|left, right| right.1.total_cmp(&left.1).then(left.0.cmp(&right.0)));
        hits.truncate(k);
        Ok(hits)
    }

    /// Turns `(internal id, score)` hits into chunk views, skipping any that died meanwhile.
    fn hydrate(&self, hits: Vec<(u64, f32)>, k: usize) -> Result<Vec<ScoredChunk>> {
        let mut documents: HashMap<String, Option<StoredDocument>> = HashMap::new();
        let mut results = Vec::with_capacity(hits.len().min(k));
        for (id, score) in hits {
            if results.len() == k {
                break;
            }
            let Some(chunk) = self.store.chunk(id)? else {
                continue;
            };
            if !documents.contains_key(&chunk.document_id) {
                let stored = self.store.document(&chunk.document_id)?;
                documents.insert(chunk.document_id.clone(), stored);
            }
            let Some(Some(stored)) = documents.get(&chunk.document_id) else {
                continue;
            };
            if !stored.chunk_ids.contains(&id) {
                continue;
            }
            results.push(ScoredChunk {
                chunk: self.view(&stored.entry, chunk)?,
                score,
            });
        }
        Ok(results)
    }

    fn view(&self, entry: &DocumentEntry, chunk: StoredChunk) -> Result<ChunkView> {
        let record = chunk.record;
        let parent_text = self
            .store
            .parent(&entry.document_id, record.parent_position)?
            .map(|parent| parent.text);
        Ok(ChunkView {
            chunk_id: chunk_id(&entry.document_id, record.position),
            document_id: entry.document_id.clone(),
            external_id: entry.external_id.clone(),
            title: entry.title.clone(),
            position: record.position,
            text: record.text,
            parent_text,
            heading_path: record.heading_path,
            span: record.span,
            pages: record.pages,
            metadata: entry.metadata.clone(),
        })
    }
}

// Locks.
impl ShardIndex {
    fn lock_writer(&self) -> Result<MutexGuard<'_, Writer>> {
        self.writer.lock().map_err(|_| {
            StorageError::Corrupt("an earlier write panicked; reopen the shard".to_owned())
        })
    }

    fn live_read(&self) -> RwLockReadGuard<'_, LiveDocuments> {
        self.live.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn live_write(&self) -> RwLockWriteGuard<'_, LiveDocuments> {
        self.live.write().unwrap_or_else(PoisonError::into_inner)
    }
}

// Test hooks: stop an operation after step 1, as a crash would.
#[cfg(test)]
impl ShardIndex {
    pub(crate) fn write_chunk_store_only(&self, documents: Vec<DocumentWrite>) -> Result<()> {
        let documents = self.prepare(documents)?;
        let mut writer = self.lock_writer()?;
        self.stage_write(&mut writer, documents).map(drop)
    }

    pub(crate) fn delete_chunk_store_only(&self, document_id: &str) -> Result<bool> {
        let mut writer = self.lock_writer()?;
        Ok(self.stage_delete(&mut writer, document_id)?.is_some())
    }

    /// Internal ids the tantivy index returns for `query`, unfiltered by liveness.
    pub(crate) fn raw_bm25_ids(&self, query: &str) -> Result<Vec<u64>> {
        let tokens = self.text.analyze(query);
        Ok(self
            .text
            .search(&tokens, &SearchFilter::default(), 10_000)?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }

    pub(crate) fn analyze(&self, text: &str) -> Vec<String> {
        self.text.analyze(text)
    }
}

fn live_document(document_id: String, stored: &StoredDocument) -> LiveDocument {
    LiveDocument::new(
        document_id,
        stored.entry.metadata.clone(),
        stored.chunk_ids.clone(),
    )
}

/// Refuses to go on after a failed chunk store flush (see [`Writer::broken`]).
fn check_not_broken(writer: &Writer) -> Result<()> {
    match &writer.broken {
        Some(reason) => Err(StorageError::Corrupt(format!(
            "chunk store flush failed earlier ({reason}); reopen the shard"
        ))),
        None => Ok(()),
    }
}

fn text_chunk<'a>(id: u64, entry: &'a DocumentEntry, record: &'a ChunkRecord) -> TextChunk<'a> {
    TextChunk {
        internal_id: id,
        document_id: &entry.document_id,
        title: &entry.title,
        text: &record.text,
        metadata: &entry.metadata,
    }
}

/// Builds a graph from the stored vectors of the live chunks.
fn load_graph(
    store: &ChunkStore,
    live: &LiveDocuments,
    vectors: &VectorIndex,
) -> Result<vector::Graph> {
    let graph = vectors.empty_graph(live.chunk_count());
    let mut block = Vec::with_capacity(REBUILD_BLOCK.min(live.chunk_count()));
    store.for_each_vector(|id, vector| {
        if live.is_live(id) {
            block.push((vector, id));
            if block.len() == REBUILD_BLOCK {
                vector::insert_into(&graph, &block)?;
                block.clear();
            }
        }
        Ok(())
    })?;
    vector::insert_into(&graph, &block)?;
    Ok(graph)
}

/// Inserts into a graph loaded from a snapshot the live chunks it lacks.
fn catch_up_graph(store: &ChunkStore, live: &LiveDocuments, graph: &vector::Graph) -> Result<()> {
    let present = vector::point_ids(graph);
    let mut missing: Vec<u64> = live
        .chunk_ids()
        .filter(|id| !present.contains(id))
        .collect();
    missing.sort_unstable();
    let mut points = Vec::with_capacity(missing.len());
    for id in missing {
        let vector = store.vector(id)?.ok_or_else(|| {
            StorageError::Corrupt(format!("vector of live chunk {id} is missing"))
        })?;
        points.push((vector, id));
    }
    vector::insert_into(graph, &points)
}

/// Total size of the files under `dir` (errors count as zero).
fn directory_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => directory_size(&entry.path()),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}
