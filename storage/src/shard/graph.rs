//! The graph partition of one shard replica (GraphRAG, ADR 0037): which entities its chunks
//! mention. It is derived from the chunk store like the two indexes, but filled afterwards:
//! every write marks its documents *pending*, and the node's graph extractor reads pending
//! documents ([`ShardIndex::graph_pending`]), extracts their entities and hands them back
//! ([`ShardIndex::graph_put`]). Search works before a document's graph is ready.
//!
//! Everything lives in the chunk store's `graph` tree and changes in the same sled
//! transactions as the rest of the shard: a write's pending marks with its chunks, and a
//! delete's removal of the document's mentions (and of entities left without any) with its
//! tombstone, so a deleted document is never reached through the graph once the delete
//! returns, and a crash cannot leave one behind. A replica filled from another (repair, a
//! transfer) gets the documents as writes and rebuilds their graph the same way.
//!
//! Keys of the `graph` tree, each after a kind byte:
//!
//! | kind | key                                   | value                                   |
//! |------|---------------------------------------|-----------------------------------------|
//! | `P`  | write sequence (u64 BE), document id  | empty: the document awaits extraction   |
//! | `M`  | entity id (u64 BE), internal chunk id (u64 BE) | occurrences in the chunk (u32 BE) |
//! | `C`  | internal chunk id (u64 BE)            | [`ChunkEntities`]: its chunk id and entities |
//! | `E`  | entity id (u64 BE)                    | [`EntityRecord`]: name, kind, chunks     |
//! | `N`  | canonical name                        | entity id (u64 BE)                      |
//! | `V`  | internal chunk id (u64 BE)            | the chunk's events ([`GraphEvent`]s), from an LLM extractor |
//! | `F`  | document id                           | [`FailureRecord`]: the version whose extraction failed, and why |
//! | `U`  | (nothing more)                        | tokens a model spent extracting this replica's graph (u64 BE) |
//!
//! Entity ids are global (made from the canonical name by the extractor), so the search
//! root bridges an entity across shards. Each replica keeps every entity's chunk count (its
//! local document frequency) in memory for the expansion's weights.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLockReadGuard};

use serde::{Deserialize, Serialize};

use super::ShardIndex;
use super::chunk_store::{StoreBatch, StoredDocument, decode, encode};
use super::live_documents::CompiledFilter;
use crate::chunk::{ScoredChunk, SearchFilter, chunk_id};
use crate::error::{Result, StorageError};

const PENDING: u8 = b'P';
const MENTION: u8 = b'M';
const CHUNK: u8 = b'C';
const ENTITY: u8 = b'E';
const NAME: u8 = b'N';
const EVENTS: u8 = b'V';
const FAILED: u8 = b'F';
const TOKENS: &[u8] = b"U";
/// Meta key: the graph tree was created with every document already stored marked pending.
const BACKFILLED: &[u8] = b"graph_backfilled";

/// One entity as the extractor found it in one chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphMention {
    pub id: u64,
    /// The folded name the id was made from (for lookups by name).
    pub canonical: String,
    /// The name to show.
    pub name: String,
    /// The extractor's kind (`name`, `person`, `date`, ...).
    pub kind: String,
    /// Occurrences in the chunk.
    pub count: u32,
}

/// An event a model found in one chunk: who did what to whom, when and where (Artoo's
/// event-centric graph). `entities` are the ids of its subject, object and place, which the
/// chunk also mentions, so an entity's events are found through its mentions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphEvent {
    pub subject: String,
    pub predicate: String,
    pub object: String,
    pub time: String,
    pub place: String,
    pub entities: Vec<u64>,
}

/// What an extractor found in one chunk of a pending document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChunkGraph {
    /// The chunk's position (as in [`PendingChunk`]).
    pub position: u32,
    pub mentions: Vec<GraphMention>,
    pub events: Vec<GraphEvent>,
}

/// An extraction's result for one pending document, as [`ShardIndex::graph_put`] stores it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GraphPut {
    pub chunks: Vec<ChunkGraph>,
    /// Set when the extractor gave up on this version (its graph is `failed`; whatever
    /// `chunks` hold, e.g. a fallback extraction, is stored all the same).
    pub failure: Option<String>,
    /// Tokens a model spent on it (added to the replica's total).
    pub tokens: u64,
}

/// Where one document's graph stands in a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GraphDocumentState {
    Pending,
    Ready,
    /// The extractor gave up, for this reason.
    Failed(String),
}

/// A failed extraction: of which version, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FailureRecord {
    sequence: u64,
    reason: String,
}

/// A document awaiting extraction: its chunks' texts in position order.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingGraphDocument {
    pub document_id: String,
    /// The write that stored this version; [`ShardIndex::graph_put`] checks it still is.
    pub sequence: u64,
    pub title: String,
    pub chunks: Vec<PendingChunk>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PendingChunk {
    pub position: u32,
    pub text: String,
    pub heading_path: Vec<String>,
}

/// The entities of one stored chunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ChunkEntities {
    chunk_id: String,
    entities: Vec<(u64, u32)>,
}

/// An entity of this partition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct EntityRecord {
    name: String,
    kind: String,
    canonical: String,
    /// Live chunks of this replica that mention it.
    chunks: u32,
}

/// An entity as the graph API shows it: its counts are this replica's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphEntity {
    pub id: u64,
    pub name: String,
    pub kind: String,
    /// Chunks of this replica that mention it.
    pub chunks: u32,
}

/// The chunks that mention one frontier entity, each with the entities it mentions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EntityNeighbourhood {
    pub entity: u64,
    /// Chunks of this replica that mention it (all of them, readable or not).
    pub chunks_total: u32,
    pub chunks: Vec<NeighbourChunk>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NeighbourChunk {
    pub chunk_id: String,
    /// Occurrences of the frontier entity in it.
    pub count: u32,
    /// Every entity it mentions, with that entity's chunk count in this replica.
    pub entities: Vec<(u64, u32)>,
}

/// Counts of the partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphStats {
    pub entities: u64,
    /// (entity, chunk) mentions.
    pub mentions: u64,
    /// Co-occurring entity pairs, counted per chunk.
    pub edges: u64,
    /// Documents awaiting extraction.
    pub pending: u64,
}

/// The in-memory side of the partition: every entity's chunk count, and the totals.
#[derive(Debug, Default)]
pub(crate) struct GraphCache {
    chunks_of: HashMap<u64, u32>,
    stats: GraphStats,
}

impl GraphCache {
    /// Reads the partition's counts (at open).
    pub(crate) fn load(tree: &sled::Tree) -> Result<GraphCache> {
        let mut cache = GraphCache::default();
        for item in tree.scan_prefix([ENTITY]) {
            let (key, value) = item?;
            let record: EntityRecord = decode(&value)?;
            cache.chunks_of.insert(id_after_kind(&key)?, record.chunks);
        }
        cache.stats.entities = cache.chunks_of.len() as u64;
        for item in tree.scan_prefix([CHUNK]) {
            let (_, value) = item?;
            let chunk: ChunkEntities = decode(&value)?;
            cache.add_chunk(&chunk.entities, 1);
        }
        cache.stats.pending = tree.scan_prefix([PENDING]).count() as u64;
        Ok(cache)
    }

    fn add_chunk(&mut self, entities: &[(u64, u32)], sign: i64) {
        let n = entities.len() as u64;
        let (mentions, edges) = (n, n * n.saturating_sub(1) / 2);
        if sign > 0 {
            self.stats.mentions += mentions;
            self.stats.edges += edges;
        } else {
            self.stats.mentions = self.stats.mentions.saturating_sub(mentions);
            self.stats.edges = self.stats.edges.saturating_sub(edges);
        }
    }
}

/// Graph changes gathered for one store batch: mention and chunk records go straight into
/// the batch; entity counts are summed here and written by [`GraphChanges::finish`].
#[derive(Default)]
pub(crate) struct GraphChanges {
    deltas: HashMap<u64, i64>,
    names: HashMap<u64, (String, String, String)>,
    /// Per chunk added (+1) or removed (-1): its entities, for the cache's totals.
    chunks: Vec<(Vec<(u64, u32)>, i64)>,
    pending: i64,
}

impl GraphChanges {
    /// The counts as they will be once the batch is applied; entities that reach zero are
    /// removed with their name.
    fn finish(
        &mut self,
        tree: &sled::Tree,
        batch: &mut StoreBatch,
    ) -> Result<Vec<(u64, Option<u32>)>> {
        let mut counts = Vec::with_capacity(self.deltas.len());
        for (&id, &delta) in &self.deltas {
            if delta == 0 {
                continue;
            }
            let key = entity_key(id);
            let stored: Option<EntityRecord> =
                tree.get(key)?.map(|bytes| decode(&bytes)).transpose()?;
            let count = i64::from(stored.as_ref().map_or(0, |record| record.chunks)) + delta;
            if count <= 0 {
                if let Some(record) = stored {
                    batch.graph.remove(&key[..]);
                    batch.graph.remove(name_key(&record.canonical));
                }
                counts.push((id, None));
                continue;
            }
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            let record = match (stored, self.names.get(&id)) {
                (Some(record), _) => EntityRecord {
                    chunks: count,
                    ..record
                },
                (None, Some((name, kind, canonical))) => {
                    batch
                        .graph
                        .insert(name_key(canonical), &id.to_be_bytes()[..]);
                    EntityRecord {
                        name: name.clone(),
                        kind: kind.clone(),
                        canonical: canonical.clone(),
                        chunks: count,
                    }
                }
                (None, None) => continue,
            };
            batch.graph.insert(&key[..], encode(&record)?);
            counts.push((id, Some(count)));
        }
        Ok(counts)
    }
}

impl ShardIndex {
    /// Marks every stored document pending once, when the graph tree is new (a shard written
    /// before the graph existed). Called at open.
    pub(crate) fn graph_backfill(&self) -> Result<()> {
        if self.store.meta_u64(BACKFILLED)?.is_some() {
            return Ok(());
        }
        let mut batch = StoreBatch::default();
        let mut pending = 0u64;
        self.store.for_each_document(|document_id, stored| {
            batch
                .graph
                .insert(pending_key(stored.write_sequence, &document_id), &[][..]);
            pending += 1;
            Ok(())
        })?;
        batch.meta.insert(BACKFILLED, &1u64.to_be_bytes()[..]);
        self.store.apply(&batch)?;
        self.store.flush()?;
        self.graph_cache_write().stats.pending = self.count_pending();
        if pending > 0 {
            tracing::info!(
                pending,
                "documents stored before the graph marked for extraction"
            );
        }
        Ok(())
    }

    /// Adds to `batch` the pending mark of a document version just written.
    pub(crate) fn graph_mark_pending(
        changes: &mut GraphChanges,
        batch: &mut StoreBatch,
        sequence: u64,
        document_id: &str,
    ) {
        batch
            .graph
            .insert(pending_key(sequence, document_id), &[][..]);
        changes.pending += 1;
    }

    /// Adds to `batch` the removal of a stored version's graph: its pending mark and its
    /// chunks' mentions.
    pub(crate) fn graph_remove_version(
        &self,
        changes: &mut GraphChanges,
        batch: &mut StoreBatch,
        document_id: &str,
        stored: &StoredDocument,
    ) -> Result<()> {
        let key = pending_key(stored.write_sequence, document_id);
        if self.store.graph().contains_key(&key)? {
            batch.graph.remove(key);
            changes.pending -= 1;
        }
        batch.graph.remove(failed_key(document_id));
        self.graph_remove_chunks(changes, batch, &stored.chunk_ids)
    }

    /// Adds to `batch` the removal of these chunks' mentions.
    pub(crate) fn graph_remove_chunks(
        &self,
        changes: &mut GraphChanges,
        batch: &mut StoreBatch,
        internal_ids: &[u64],
    ) -> Result<()> {
        let tree = self.store.graph();
        for &internal_id in internal_ids {
            let key = chunk_key(internal_id);
            let Some(bytes) = tree.get(key)? else {
                continue;
            };
            let chunk: ChunkEntities = decode(&bytes)?;
            batch.graph.remove(&key[..]);
            batch.graph.remove(&events_key(internal_id)[..]);
            for &(entity, _) in &chunk.entities {
                batch.graph.remove(&mention_key(entity, internal_id)[..]);
                *changes.deltas.entry(entity).or_default() -= 1;
            }
            changes.chunks.push((chunk.entities, -1));
        }
        Ok(())
    }

    /// Completes a batch's graph changes: entity counts into the batch. Call before the
    /// batch is applied, then [`Self::graph_applied`] after.
    pub(crate) fn graph_finish(
        &self,
        changes: &mut GraphChanges,
        batch: &mut StoreBatch,
    ) -> Result<Vec<(u64, Option<u32>)>> {
        changes.finish(self.store.graph(), batch)
    }

    /// Brings the in-memory counts up to an applied batch.
    pub(crate) fn graph_applied(&self, changes: GraphChanges, counts: Vec<(u64, Option<u32>)>) {
        let mut cache = self.graph_cache_write();
        for (id, count) in counts {
            match count {
                Some(count) => {
                    cache.chunks_of.insert(id, count);
                }
                None => {
                    cache.chunks_of.remove(&id);
                }
            }
        }
        cache.stats.entities = cache.chunks_of.len() as u64;
        for (entities, sign) in &changes.chunks {
            cache.add_chunk(entities, *sign);
        }
        cache.stats.pending = cache.stats.pending.saturating_add_signed(changes.pending);
    }

    /// Up to `limit` documents awaiting extraction, oldest write first, with their chunks'
    /// texts, leaving out those `skip` names (document id, sequence: already being extracted,
    /// or waiting to be retried). A mark left by a version that is gone is removed on the way.
    pub fn graph_pending(
        &self,
        limit: usize,
        skip: impl Fn(&str, u64) -> bool,
    ) -> Result<Vec<PendingGraphDocument>> {
        let mut found = Vec::new();
        let mut stale = Vec::new();
        for item in self.store.graph().scan_prefix([PENDING]) {
            if found.len() == limit {
                break;
            }
            let (key, _) = item?;
            let (sequence, document_id) = parse_pending_key(&key)?;
            if skip(&document_id, sequence) {
                continue;
            }
            let stored = self.store.document(&document_id)?;
            let Some(stored) = stored.filter(|stored| stored.write_sequence == sequence) else {
                stale.push(key);
                continue;
            };
            let mut chunks = Vec::with_capacity(stored.chunk_ids.len());
            for &id in &stored.chunk_ids {
                if let Some(chunk) = self.store.chunk(id)? {
                    chunks.push(PendingChunk {
                        position: chunk.record.position,
                        text: chunk.record.text,
                        heading_path: chunk.record.heading_path,
                    });
                }
            }
            found.push(PendingGraphDocument {
                document_id,
                sequence,
                title: stored.entry.title,
                chunks,
            });
        }
        if !stale.is_empty() {
            let writer = self.lock_writer()?;
            let mut batch = StoreBatch::default();
            let mut removed = 0u64;
            for key in stale {
                // Checked again under the writer lock: only a mark whose version is gone.
                let (sequence, document_id) = parse_pending_key(&key)?;
                let current = self.store.document(&document_id)?;
                if current.is_none_or(|stored| stored.write_sequence != sequence) {
                    batch.graph.remove(key);
                    removed += 1;
                }
            }
            self.store.apply(&batch)?;
            drop(writer);
            let mut cache = self.graph_cache_write();
            cache.stats.pending = cache.stats.pending.saturating_sub(removed);
        }
        Ok(found)
    }

    /// Stores what the extractor found in a pending document's chunks (each [`ChunkGraph`]
    /// names its chunk by position), its failure if it gave up, and the tokens it spent, and
    /// clears the document's mark. Returns false, storing nothing, when that version is no
    /// longer the live one (replaced or deleted meanwhile). Not flushed: a crash before the
    /// next flush loses the entities and the cleared mark together, and the document is
    /// extracted again.
    pub fn graph_put(&self, document_id: &str, sequence: u64, put: GraphPut) -> Result<bool> {
        let writer = self.lock_writer()?;
        super::check_not_broken(&writer)?;
        let Some(stored) = self.store.document(document_id)? else {
            return Ok(false);
        };
        let pending = pending_key(sequence, document_id);
        if stored.write_sequence != sequence || !self.store.graph().contains_key(&pending)? {
            return Ok(false);
        }
        let mut by_position = HashMap::new();
        for &id in &stored.chunk_ids {
            if let Some(chunk) = self.store.chunk(id)? {
                by_position.insert(chunk.record.position, id);
            }
        }
        let mut batch = StoreBatch::default();
        let mut changes = GraphChanges::default();
        // Entities of a chunk written before (an interrupted put) are replaced.
        self.graph_remove_chunks(&mut changes, &mut batch, &stored.chunk_ids)?;
        for chunk in put.chunks {
            let Some(&internal_id) = by_position.get(&chunk.position) else {
                continue;
            };
            let mut listed: Vec<(u64, u32)> = Vec::with_capacity(chunk.mentions.len());
            for mention in chunk.mentions {
                if listed.iter().any(|(id, _)| *id == mention.id) {
                    continue;
                }
                listed.push((mention.id, mention.count.max(1)));
                batch.graph.insert(
                    &mention_key(mention.id, internal_id)[..],
                    &mention.count.max(1).to_be_bytes()[..],
                );
                *changes.deltas.entry(mention.id).or_default() += 1;
                changes.names.entry(mention.id).or_insert((
                    mention.name,
                    mention.kind,
                    mention.canonical,
                ));
            }
            if listed.is_empty() {
                continue;
            }
            // Events stand on mentions: an event is kept only with entities the chunk lists.
            let events: Vec<GraphEvent> = chunk
                .events
                .into_iter()
                .filter(|event| {
                    !event.entities.is_empty()
                        && event
                            .entities
                            .iter()
                            .all(|id| listed.iter().any(|(listed, _)| listed == id))
                })
                .collect();
            if !events.is_empty() {
                batch
                    .graph
                    .insert(&events_key(internal_id)[..], encode(&events)?);
            }
            let record = ChunkEntities {
                chunk_id: chunk_id(document_id, chunk.position),
                entities: listed.clone(),
            };
            batch
                .graph
                .insert(&chunk_key(internal_id)[..], encode(&record)?);
            changes.chunks.push((listed, 1));
        }
        match put.failure {
            Some(reason) => batch.graph.insert(
                failed_key(document_id),
                encode(&FailureRecord { sequence, reason })?,
            ),
            None => batch.graph.remove(failed_key(document_id)),
        }
        if put.tokens > 0 {
            let spent = self.graph_tokens()?.saturating_add(put.tokens);
            batch.graph.insert(TOKENS, &spent.to_be_bytes()[..]);
        }
        batch.graph.remove(pending);
        changes.pending -= 1;
        let counts = changes.finish(self.store.graph(), &mut batch)?;
        self.store.apply(&batch)?;
        // The counts are absolute: set them before another writer can compute newer ones.
        self.graph_applied(changes, counts);
        drop(writer);
        Ok(true)
    }

    /// Tokens a model has spent extracting this replica's graph.
    pub fn graph_tokens(&self) -> Result<u64> {
        match self.store.graph().get(TOKENS)? {
            Some(bytes) => u64_at(&bytes, 0),
            None => Ok(0),
        }
    }

    /// Where the live version of a document's graph stands; `None` when the document is not
    /// stored here.
    pub fn graph_document_state(&self, document_id: &str) -> Result<Option<GraphDocumentState>> {
        let Some(stored) = self.store.document(document_id)? else {
            return Ok(None);
        };
        let tree = self.store.graph();
        if tree.contains_key(pending_key(stored.write_sequence, document_id))? {
            return Ok(Some(GraphDocumentState::Pending));
        }
        if let Some(bytes) = tree.get(failed_key(document_id))? {
            let failure: FailureRecord = decode(&bytes)?;
            if failure.sequence == stored.write_sequence {
                return Ok(Some(GraphDocumentState::Failed(failure.reason)));
            }
        }
        Ok(Some(GraphDocumentState::Ready))
    }

    /// Up to `limit` events that name `entity` (as subject, object or place), from the live
    /// chunks passing `filter` that mention it, in chunk order: (chunk id, event).
    pub fn graph_events(
        &self,
        entity: u64,
        limit: usize,
        filter: &SearchFilter,
    ) -> Result<Vec<(String, GraphEvent)>> {
        let tree = self.store.graph();
        let live = self.live_read();
        let compiled = CompiledFilter::new(filter).for_documents_of(&live);
        let mut out = Vec::new();
        for item in tree.scan_prefix(mention_prefix(entity)) {
            if out.len() >= limit {
                break;
            }
            let (key, _) = item?;
            let internal_id = u64_at(&key, 9)?;
            if !live
                .chunk(internal_id)
                .is_some_and(|doc| compiled.matches(doc))
            {
                continue;
            }
            let Some(bytes) = tree.get(events_key(internal_id))? else {
                continue;
            };
            let events: Vec<GraphEvent> = decode(&bytes)?;
            let Some(record) = tree.get(chunk_key(internal_id))? else {
                continue;
            };
            let record: ChunkEntities = decode(&record)?;
            for event in events {
                if event.entities.contains(&entity) && out.len() < limit {
                    out.push((record.chunk_id.clone(), event));
                }
            }
        }
        Ok(out)
    }

    pub fn graph_stats(&self) -> GraphStats {
        self.graph_cache_read().stats
    }

    /// Each of `ids` this replica knows, with its chunk count here.
    pub fn graph_chunk_counts(&self, ids: &[u64]) -> Vec<(u64, u32)> {
        let cache = self.graph_cache_read();
        ids.iter()
            .filter_map(|id| cache.chunks_of.get(id).map(|count| (*id, *count)))
            .collect()
    }

    /// For each entity of `frontier`, up to `per_entity` live chunks passing `filter` that
    /// mention it (most occurrences first, then document and chunk order), each with every entity it
    /// mentions and their chunk counts here.
    pub fn graph_neighbourhood(
        &self,
        frontier: &[u64],
        per_entity: usize,
        filter: &SearchFilter,
    ) -> Result<Vec<EntityNeighbourhood>> {
        let tree = self.store.graph();
        let live = self.live_read();
        let compiled = CompiledFilter::new(filter).for_documents_of(&live);
        let cache = self.graph_cache_read();
        let mut out = Vec::with_capacity(frontier.len());
        let mut entities_of: HashMap<u64, Option<ChunkEntities>> = HashMap::new();
        for &entity in frontier {
            let Some(&total) = cache.chunks_of.get(&entity) else {
                continue;
            };
            let mut mentions: Vec<(u64, u32, &str)> = Vec::new();
            for item in tree.scan_prefix(mention_prefix(entity)) {
                let (key, value) = item?;
                let internal_id = u64_at(&key, 9)?;
                let Some(document) = live.chunk(internal_id).filter(|doc| compiled.matches(doc))
                else {
                    continue;
                };
                mentions.push((internal_id, u32_of(&value)?, document.document_id.as_str()));
            }
            // Most occurrences first; ties in document order, then chunk order (a document's
            // chunks get increasing internal ids on every replica), so that every replica
            // keeps the same chunks when it truncates.
            mentions.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(b.2)).then(a.0.cmp(&b.0)));
            mentions.truncate(per_entity);
            let mut chunks = Vec::with_capacity(mentions.len());
            for (internal_id, count, _) in mentions {
                let record = match entities_of.get(&internal_id) {
                    Some(record) => record.clone(),
                    None => {
                        let record: Option<ChunkEntities> = tree
                            .get(chunk_key(internal_id))?
                            .map(|bytes| decode(&bytes))
                            .transpose()?;
                        entities_of.insert(internal_id, record.clone());
                        record
                    }
                };
                let Some(record) = record else { continue };
                chunks.push(NeighbourChunk {
                    chunk_id: record.chunk_id,
                    count,
                    entities: record
                        .entities
                        .iter()
                        .map(|(id, _)| (*id, cache.chunks_of.get(id).copied().unwrap_or(0)))
                        .collect(),
                });
            }
            out.push(EntityNeighbourhood {
                entity,
                chunks_total: total,
                chunks,
            });
        }
        Ok(out)
    }

    /// The entities of `ids` this replica holds, with names.
    pub fn graph_entities(&self, ids: &[u64]) -> Result<Vec<GraphEntity>> {
        let tree = self.store.graph();
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            if let Some(bytes) = tree.get(entity_key(id))? {
                let record: EntityRecord = decode(&bytes)?;
                out.push(GraphEntity {
                    id,
                    name: record.name,
                    kind: record.kind,
                    chunks: record.chunks,
                });
            }
        }
        Ok(out)
    }

    /// Entities whose canonical name starts with `prefix` (canonical itself), at most
    /// `limit`, in name order.
    pub fn graph_entities_by_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<GraphEntity>> {
        let mut ids = Vec::new();
        for item in self.store.graph().scan_prefix(name_key(prefix)) {
            if ids.len() == limit {
                break;
            }
            let (_, value) = item?;
            ids.push(u64_at(&value, 0)?);
        }
        self.graph_entities(&ids)
    }

    /// Up to `limit` entities of this replica mentioned by the most chunks (ties by id),
    /// leaving out the kinds in `skip_kinds` (dates and quantities tie unrelated things).
    pub fn graph_top_entities(
        &self,
        limit: usize,
        skip_kinds: &[&str],
    ) -> Result<Vec<GraphEntity>> {
        let mut ranked: Vec<(u64, u32)> = {
            let cache = self.graph_cache_read();
            cache.chunks_of.iter().map(|(id, n)| (*id, *n)).collect()
        };
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out = Vec::with_capacity(limit.min(ranked.len()));
        for chunk in ranked.chunks(limit.max(1)) {
            let ids: Vec<u64> = chunk.iter().map(|(id, _)| *id).collect();
            for entity in self.graph_entities(&ids)? {
                if out.len() == limit {
                    return Ok(out);
                }
                if !skip_kinds.contains(&entity.kind.as_str()) {
                    out.push(entity);
                }
            }
        }
        Ok(out)
    }

    /// Chunk views of `hits` (`chunk_id`, score), in the order given, skipping any not live
    /// here or not passing `filter`.
    pub fn graph_chunks(
        &self,
        hits: &[(String, f32)],
        filter: &SearchFilter,
    ) -> Result<Vec<ScoredChunk>> {
        let mut internal = Vec::with_capacity(hits.len());
        {
            let live = self.live_read();
            let compiled = CompiledFilter::new(filter).for_documents_of(&live);
            let mut documents: HashMap<&str, Option<StoredDocument>> = HashMap::new();
            for (chunk_id, score) in hits {
                let Some((document_id, position)) = split_chunk_id(chunk_id) else {
                    continue;
                };
                if !documents.contains_key(document_id) {
                    documents.insert(document_id, self.store.document(document_id)?);
                }
                let Some(Some(stored)) = documents.get(document_id) else {
                    continue;
                };
                let Some(&id) = stored.chunk_ids.get(position as usize) else {
                    continue;
                };
                if live.chunk(id).is_some_and(|doc| compiled.matches(doc)) {
                    internal.push((id, *score));
                }
            }
        }
        let k = internal.len();
        let mut views = self.hydrate(internal, k)?;
        // `chunk_ids` are in position order; a stray one (never seen) is dropped here.
        views.retain(|hit| hits.iter().any(|(id, _)| *id == hit.chunk.chunk_id));
        Ok(views)
    }

    fn count_pending(&self) -> u64 {
        self.store.graph().scan_prefix([PENDING]).count() as u64
    }

    fn graph_cache_read(&self) -> RwLockReadGuard<'_, GraphCache> {
        self.graph.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn graph_cache_write(&self) -> std::sync::RwLockWriteGuard<'_, GraphCache> {
        self.graph.write().unwrap_or_else(PoisonError::into_inner)
    }
}

fn pending_key(sequence: u64, document_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(9 + document_id.len());
    key.push(PENDING);
    key.extend_from_slice(&sequence.to_be_bytes());
    key.extend_from_slice(document_id.as_bytes());
    key
}

fn parse_pending_key(key: &[u8]) -> Result<(u64, String)> {
    let sequence = u64_at(key, 1)?;
    let document_id = String::from_utf8(key[9..].to_vec())
        .map_err(|_| StorageError::Corrupt("a graph pending key is not utf-8".to_owned()))?;
    Ok((sequence, document_id))
}

fn mention_prefix(entity: u64) -> [u8; 9] {
    let mut key = [MENTION; 9];
    key[1..].copy_from_slice(&entity.to_be_bytes());
    key
}

fn mention_key(entity: u64, internal_id: u64) -> [u8; 17] {
    let mut key = [MENTION; 17];
    key[1..9].copy_from_slice(&entity.to_be_bytes());
    key[9..].copy_from_slice(&internal_id.to_be_bytes());
    key
}

fn chunk_key(internal_id: u64) -> [u8; 9] {
    let mut key = [CHUNK; 9];
    key[1..].copy_from_slice(&internal_id.to_be_bytes());
    key
}

fn events_key(internal_id: u64) -> [u8; 9] {
    let mut key = [EVENTS; 9];
    key[1..].copy_from_slice(&internal_id.to_be_bytes());
    key
}

fn failed_key(document_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + document_id.len());
    key.push(FAILED);
    key.extend_from_slice(document_id.as_bytes());
    key
}

fn entity_key(entity: u64) -> [u8; 9] {
    let mut key = [ENTITY; 9];
    key[1..].copy_from_slice(&entity.to_be_bytes());
    key
}

fn name_key(canonical: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + canonical.len());
    key.push(NAME);
    key.extend_from_slice(canonical.as_bytes());
    key
}

fn id_after_kind(key: &[u8]) -> Result<u64> {
    u64_at(key, 1)
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|slice| <[u8; 8]>::try_from(slice).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| StorageError::Corrupt("a graph key or value is too short".to_owned()))
}

fn u32_of(bytes: &[u8]) -> Result<u32> {
    <[u8; 4]>::try_from(bytes)
        .map(u32::from_be_bytes)
        .map_err(|_| StorageError::Corrupt("a graph mention count is malformed".to_owned()))
}

/// `doc#position` back into its parts.
fn split_chunk_id(chunk_id: &str) -> Option<(&str, u32)> {
    let (document_id, position) = chunk_id.rsplit_once('#')?;
    Some((document_id, position.parse().ok()?))
}
