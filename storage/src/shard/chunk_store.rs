//! The chunk store: one sled database per shard replica holding everything the two indexes
//! are derived from. It is the write-ahead record of the shard (see the module docs of
//! [`crate::shard`]): a write is durable once its sled transaction is flushed, and both
//! indexes can be rebuilt from it.
//!
//! Trees (keys are bytes, values bincode unless said otherwise):
//!
//! | tree         | key                                   | value                                   |
//! |--------------|---------------------------------------|-----------------------------------------|
//! | `documents`  | document id                           | [`StoredDocument`] (entry, chunk ids)    |
//! | `chunks`     | internal id (u64, big-endian)         | [`StoredChunk`] (chunk without vector)  |
//! | `vectors`    | internal id (u64, big-endian)         | normalised vector, f32 little-endian    |
//! | `parents`    | u32 BE id length, document id, u32 BE position | [`ParentRecord`]               |
//! | `tombstones` | document id                           | [`Tombstone`]                           |
//! | `slices`     | u32 BE id length, document id, `c` or `p`, u32 BE position | a chunk's internal id (u64 BE); empty for a parent |
//! | `meta`       | name                                  | u64 big-endian                          |
//! | `graph`      | a kind byte, then its key (see [`super::graph`]) | the graph partition of the shard's chunks |

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};

use crate::chunk::{ChunkRecord, DocumentEntry, ParentRecord};
use crate::error::{Result, StorageError};

/// sled's page cache per shard (its default, 1 GiB, is too much for many shards a node).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

const META_NEXT_INTERNAL_ID: &[u8] = b"next_internal_id";
const META_WRITE_SEQUENCE: &[u8] = b"write_sequence";
const META_TEXT_SEQUENCE: &[u8] = b"text_committed_sequence";
const META_DIMENSION: &[u8] = b"dimension";

/// A live document: its entry and where its chunks and parents are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredDocument {
    pub entry: DocumentEntry,
    /// Internal ids of the chunks, in the order they were given.
    pub chunk_ids: Vec<u64>,
    /// `ParentRecord::position` of every parent, to find and remove them.
    pub parent_positions: Vec<u32>,
    /// Sequence number of the write that stored this version.
    pub write_sequence: u64,
}

/// A chunk as stored: the [`ChunkRecord`] with its vector moved to the `vectors` tree (so an
/// index rebuild reads only vectors and a search result never decodes one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredChunk {
    pub document_id: String,
    /// `vector` is always empty here.
    pub record: ChunkRecord,
}

/// A deleted document whose chunk records may still be in the store (until a purge).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Tombstone {
    /// Internal ids of the deleted chunks not yet purged.
    pub internal_ids: Vec<u64>,
    /// Parent positions not yet purged.
    pub parent_positions: Vec<u32>,
    /// Sequence number of the delete.
    pub sequence: u64,
}

/// Persistent counters, read once at open and then owned by the shard's writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub next_internal_id: u64,
    pub write_sequence: u64,
}

/// The sled writes of one shard operation, applied in a single transaction.
#[derive(Default)]
pub(crate) struct StoreBatch {
    pub documents: sled::Batch,
    pub chunks: sled::Batch,
    pub vectors: sled::Batch,
    pub parents: sled::Batch,
    pub tombstones: sled::Batch,
    pub meta: sled::Batch,
    pub slices: sled::Batch,
    pub graph: sled::Batch,
}

/// What the slices written for one document hold so far (see [`crate::chunk::DocumentSlice`]):
/// their chunks (position, internal id) and parent positions, each in position order. The
/// records themselves are in the `chunks`, `vectors` and `parents` trees, where no live
/// document points at them until the commit.
#[derive(Debug, Default)]
pub(crate) struct SliceIndex {
    pub chunks: Vec<(u32, u64)>,
    pub parents: Vec<u32>,
}

impl StoreBatch {
    pub fn set_counters(&mut self, counters: Counters) {
        self.meta.insert(
            META_NEXT_INTERNAL_ID,
            &counters.next_internal_id.to_be_bytes()[..],
        );
        self.meta.insert(
            META_WRITE_SEQUENCE,
            &counters.write_sequence.to_be_bytes()[..],
        );
    }

    pub fn put_document(&mut self, document_id: &str, document: &StoredDocument) -> Result<()> {
        self.documents
            .insert(document_id.as_bytes(), encode(document)?);
        Ok(())
    }

    pub fn remove_document(&mut self, document_id: &str) {
        self.documents.remove(document_id.as_bytes());
    }

    pub fn put_chunk(
        &mut self,
        internal_id: u64,
        chunk: &StoredChunk,
        vector: &[f32],
    ) -> Result<()> {
        let key = internal_id.to_be_bytes();
        self.chunks.insert(&key[..], encode(chunk)?);
        self.vectors.insert(&key[..], encode_vector(vector));
        Ok(())
    }

    pub fn remove_chunk(&mut self, internal_id: u64) {
        let key = internal_id.to_be_bytes();
        self.chunks.remove(&key[..]);
        self.vectors.remove(&key[..]);
    }

    pub fn put_parent(&mut self, document_id: &str, parent: &ParentRecord) -> Result<()> {
        self.parents
            .insert(parent_key(document_id, parent.position), encode(parent)?);
        Ok(())
    }

    pub fn remove_parent(&mut self, document_id: &str, position: u32) {
        self.parents.remove(parent_key(document_id, position));
    }

    pub fn put_tombstone(&mut self, document_id: &str, tombstone: &Tombstone) -> Result<()> {
        self.tombstones
            .insert(document_id.as_bytes(), encode(tombstone)?);
        Ok(())
    }

    pub fn remove_tombstone(&mut self, document_id: &str) {
        self.tombstones.remove(document_id.as_bytes());
    }

    pub fn put_slice_chunk(&mut self, document_id: &str, position: u32, internal_id: u64) {
        self.slices.insert(
            slice_key(document_id, SLICE_CHUNK, position),
            &internal_id.to_be_bytes()[..],
        );
    }

    pub fn remove_slice_chunk(&mut self, document_id: &str, position: u32) {
        self.slices
            .remove(slice_key(document_id, SLICE_CHUNK, position));
    }

    pub fn put_slice_parent(&mut self, document_id: &str, position: u32) {
        self.slices
            .insert(slice_key(document_id, SLICE_PARENT, position), &[][..]);
    }

    pub fn remove_slice_parent(&mut self, document_id: &str, position: u32) {
        self.slices
            .remove(slice_key(document_id, SLICE_PARENT, position));
    }
}

/// Handle on the shard's sled database and its trees.
pub(crate) struct ChunkStore {
    db: sled::Db,
    documents: sled::Tree,
    chunks: sled::Tree,
    vectors: sled::Tree,
    parents: sled::Tree,
    tombstones: sled::Tree,
    meta: sled::Tree,
    slices: sled::Tree,
    graph: sled::Tree,
}

impl ChunkStore {
    pub fn open(path: &Path) -> Result<ChunkStore> {
        // No background flusher: every write is flushed before it is acknowledged (see
        // `flush`), and a flusher is a thread per shard replica.
        let db = crate::sled_db::open(
            &sled::Config::new()
                .path(path)
                .cache_capacity(CACHE_BYTES)
                .flush_every_ms(None),
        )?;
        Ok(ChunkStore {
            documents: db.open_tree("documents")?,
            chunks: db.open_tree("chunks")?,
            vectors: db.open_tree("vectors")?,
            parents: db.open_tree("parents")?,
            tombstones: db.open_tree("tombstones")?,
            meta: db.open_tree("meta")?,
            slices: db.open_tree("slices")?,
            graph: db.open_tree("graph")?,
            db,
        })
    }

    /// Records the vector dimension on first open and refuses a different one later.
    pub fn check_dimension(&self, dimension: usize) -> Result<()> {
        let expected = u64::try_from(dimension)
            .map_err(|_| StorageError::Invalid(format!("dimension {dimension} is too large")))?;
        match self.meta_u64(META_DIMENSION)? {
            Some(stored) if stored != expected => Err(StorageError::DimensionMismatch {
                expected: usize::try_from(stored).unwrap_or(usize::MAX),
                actual: dimension,
            }),
            Some(_) => Ok(()),
            None => {
                self.meta
                    .insert(META_DIMENSION, &expected.to_be_bytes()[..])?;
                self.db.flush()?;
                Ok(())
            }
        }
    }

    pub fn counters(&self) -> Result<Counters> {
        Ok(Counters {
            next_internal_id: self.meta_u64(META_NEXT_INTERNAL_ID)?.unwrap_or(0),
            write_sequence: self.meta_u64(META_WRITE_SEQUENCE)?.unwrap_or(0),
        })
    }

    /// Mirrors the text index's committed sequence (informational: the tantivy commit
    /// payload is authoritative). Not flushed.
    pub fn record_text_sequence(&self, sequence: u64) -> Result<()> {
        self.meta
            .insert(META_TEXT_SEQUENCE, &sequence.to_be_bytes()[..])?;
        Ok(())
    }

    pub fn document(&self, document_id: &str) -> Result<Option<StoredDocument>> {
        self.documents
            .get(document_id.as_bytes())?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    pub fn tombstone(&self, document_id: &str) -> Result<Option<Tombstone>> {
        self.tombstones
            .get(document_id.as_bytes())?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    pub fn chunk(&self, internal_id: u64) -> Result<Option<StoredChunk>> {
        self.chunks
            .get(internal_id.to_be_bytes())?
            .map(|bytes| decode_chunk(&bytes))
            .transpose()
    }

    pub fn vector(&self, internal_id: u64) -> Result<Option<Vec<f32>>> {
        self.vectors
            .get(internal_id.to_be_bytes())?
            .map(|bytes| decode_vector(&bytes))
            .transpose()
    }

    pub fn parent(&self, document_id: &str, position: u32) -> Result<Option<ParentRecord>> {
        self.parents
            .get(parent_key(document_id, position))?
            .map(|bytes| decode_parent(&bytes))
            .transpose()
    }

    /// The internal id a slice gave the chunk at `position` of `document_id`, if one did.
    pub fn slice_chunk(&self, document_id: &str, position: u32) -> Result<Option<u64>> {
        self.slices
            .get(slice_key(document_id, SLICE_CHUNK, position))?
            .map(|bytes| decode_u64_be(&bytes))
            .transpose()
    }

    /// What the slices of `document_id` written so far hold.
    pub fn slice_index(&self, document_id: &str) -> Result<SliceIndex> {
        let prefix = length_prefixed(document_id);
        let mut index = SliceIndex::default();
        for item in self.slices.scan_prefix(&prefix) {
            let (key, value) = item?;
            let rest = &key[prefix.len()..];
            let (kind, position) = match rest {
                [kind, a, b, c, d] => (*kind, u32::from_be_bytes([*a, *b, *c, *d])),
                _ => return Err(StorageError::Corrupt("a slice key is malformed".to_owned())),
            };
            match kind {
                SLICE_CHUNK => index.chunks.push((position, decode_u64_be(&value)?)),
                SLICE_PARENT => index.parents.push(position),
                _ => return Err(StorageError::Corrupt("a slice key is malformed".to_owned())),
            }
        }
        Ok(index)
    }

    /// Calls `visit` for every live document.
    pub fn for_each_document(
        &self,
        mut visit: impl FnMut(String, StoredDocument) -> Result<()>,
    ) -> Result<()> {
        for item in self.documents.iter() {
            let (key, value) = item?;
            visit(decode_string(&key)?, decode(&value)?)?;
        }
        Ok(())
    }

    /// Calls `visit` for every tombstone.
    pub fn for_each_tombstone(
        &self,
        mut visit: impl FnMut(String, Tombstone) -> Result<()>,
    ) -> Result<()> {
        for item in self.tombstones.iter() {
            let (key, value) = item?;
            visit(decode_string(&key)?, decode(&value)?)?;
        }
        Ok(())
    }

    /// Calls `visit` for every stored vector, in internal id order.
    pub fn for_each_vector(
        &self,
        mut visit: impl FnMut(u64, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        for item in self.vectors.iter() {
            let (key, value) = item?;
            visit(decode_u64_be(&key)?, decode_vector(&value)?)?;
        }
        Ok(())
    }

    /// Applies `batch` atomically across all trees: all of it or, on error, none of it.
    /// Durable only after [`Self::flush`].
    pub fn apply(&self, batch: &StoreBatch) -> Result<()> {
        let trees = (
            &self.documents,
            &self.chunks,
            &self.vectors,
            &self.parents,
            &self.tombstones,
            &self.meta,
            &self.slices,
            &self.graph,
        );
        trees
            .transaction(
                |(documents, chunks, vectors, parents, tombstones, meta, slices, graph)| {
                    documents.apply_batch(&batch.documents)?;
                    chunks.apply_batch(&batch.chunks)?;
                    vectors.apply_batch(&batch.vectors)?;
                    parents.apply_batch(&batch.parents)?;
                    tombstones.apply_batch(&batch.tombstones)?;
                    meta.apply_batch(&batch.meta)?;
                    slices.apply_batch(&batch.slices)?;
                    graph.apply_batch(&batch.graph)?;
                    Ok::<(), ConflictableTransactionError<StorageError>>(())
                },
            )
            .map_err(|error| match error {
                TransactionError::Abort(error) => error,
                TransactionError::Storage(error) => StorageError::Sled(error),
            })
    }

    /// The graph partition's tree (read directly by [`super::graph`]; written through
    /// [`StoreBatch::graph`]).
    pub fn graph(&self) -> &sled::Tree {
        &self.graph
    }

    /// Writes everything applied so far to disk and fsyncs.
    pub fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }
}

/// The id's length (u32 BE), then the id: keeps one document's keys from running into
/// another's.
fn length_prefixed(document_id: &str) -> Vec<u8> {
    let id = document_id.as_bytes();
    let mut key = Vec::with_capacity(id.len() + 9);
    key.extend_from_slice(&u32::try_from(id.len()).unwrap_or(u32::MAX).to_be_bytes());
    key.extend_from_slice(id);
    key
}

fn parent_key(document_id: &str, position: u32) -> Vec<u8> {
    let mut key = length_prefixed(document_id);
    key.extend_from_slice(&position.to_be_bytes());
    key
}

const SLICE_CHUNK: u8 = b'c';
const SLICE_PARENT: u8 = b'p';

fn slice_key(document_id: &str, kind: u8, position: u32) -> Vec<u8> {
    let mut key = length_prefixed(document_id);
    key.push(kind);
    key.extend_from_slice(&position.to_be_bytes());
    key
}

/// A [`StoredChunk`] as written before chunks had pages: the same fields less the last one.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct StoredChunkWithoutPages {
    document_id: String,
    position: u32,
    parent_position: u32,
    text: String,
    heading_path: Vec<String>,
    span: (u32, u32),
    vector: Vec<f32>,
}

/// A [`ParentRecord`] as written before parents had pages.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct ParentWithoutPages {
    position: u32,
    text: String,
    span: (u32, u32),
}

/// A stored chunk, of either layout. `pages` is the record's last field, so bincode runs out
/// of bytes exactly there on a record written before it existed; that one decodes without
/// it. (An older build reading a newer record stops before `pages` and ignores it.)
fn decode_chunk(bytes: &[u8]) -> Result<StoredChunk> {
    decode::<StoredChunk>(bytes).or_else(|error| {
        let old = decode::<StoredChunkWithoutPages>(bytes).map_err(|_| error)?;
        Ok(StoredChunk {
            document_id: old.document_id,
            record: ChunkRecord {
                position: old.position,
                parent_position: old.parent_position,
                text: old.text,
                heading_path: old.heading_path,
                span: old.span,
                vector: old.vector,
                pages: None,
            },
        })
    })
}

/// A stored parent, of either layout (see [`decode_chunk`]).
fn decode_parent(bytes: &[u8]) -> Result<ParentRecord> {
    decode::<ParentRecord>(bytes).or_else(|error| {
        let old = decode::<ParentWithoutPages>(bytes).map_err(|_| error)?;
        Ok(ParentRecord {
            position: old.position,
            text: old.text,
            span: old.span,
            pages: None,
        })
    })
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|error| StorageError::Corrupt(format!("encode: {error}")))
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(value, _)| value)
        .map_err(|error| StorageError::Corrupt(format!("decode: {error}")))
}

fn decode_string(bytes: &[u8]) -> Result<String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| StorageError::Corrupt("document id is not utf-8".to_owned()))
}

fn decode_u64_be(bytes: &[u8]) -> Result<u64> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StorageError::Corrupt(format!("u64 record of {} bytes", bytes.len())))?;
    Ok(u64::from_be_bytes(array))
}

fn encode_vector(vector: &[f32]) -> Vec<u8> {
    vector
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

fn decode_vector(bytes: &[u8]) -> Result<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(StorageError::Corrupt(format!(
            "vector record of {} bytes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|quad| f32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]))
        .collect())
}

impl ChunkStore {
    #[cfg(test)]
    pub(crate) fn meta_remove_for_test(&self, name: &[u8]) {
        self.meta.remove(name).unwrap();
        self.db.flush().unwrap();
    }

    pub(crate) fn meta_u64(&self, name: &[u8]) -> Result<Option<u64>> {
        self.meta
            .get(name)?
            .map(|bytes| decode_u64_be(&bytes))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::PageRange;

    fn old_chunk() -> StoredChunkWithoutPages {
        StoredChunkWithoutPages {
            document_id: "doc".into(),
            position: 3,
            parent_position: 1,
            text: "text".into(),
            heading_path: vec!["A".into()],
            span: (5, 9),
            vector: Vec::new(),
        }
    }

    #[test]
    fn records_written_before_pages_decode_without_them() {
        let chunk = decode_chunk(&encode(&old_chunk()).unwrap()).unwrap();
        assert_eq!(chunk.document_id, "doc");
        assert_eq!(chunk.record.span, (5, 9));
        assert_eq!(chunk.record.heading_path, ["A"]);
        assert_eq!(chunk.record.pages, None);
        let old_parent = ParentWithoutPages {
            position: 2,
            text: "parent".into(),
            span: (0, 6),
        };
        let parent = decode_parent(&encode(&old_parent).unwrap()).unwrap();
        assert_eq!(
            (parent.position, parent.span, parent.pages),
            (2, (0, 6), None)
        );
    }

    #[test]
    fn records_with_pages_round_trip_and_older_builds_still_read_them() {
        let old = old_chunk();
        let chunk = StoredChunk {
            document_id: old.document_id.clone(),
            record: ChunkRecord {
                position: old.position,
                parent_position: old.parent_position,
                text: old.text.clone(),
                heading_path: old.heading_path.clone(),
                span: old.span,
                vector: Vec::new(),
                pages: Some(PageRange { first: 2, last: 2 }),
            },
        };
        let bytes = encode(&chunk).unwrap();
        assert_eq!(decode_chunk(&bytes).unwrap(), chunk);
        // What a build without pages reads: every field it knows, the pages left over.
        let (seen, _) = bincode::serde::decode_from_slice::<StoredChunkWithoutPages, _>(
            &bytes,
            bincode::config::standard(),
        )
        .unwrap();
        assert_eq!(
            (seen.position, seen.text, seen.span),
            (3, "text".to_string(), (5, 9))
        );
        // Garbage is still an error, not an empty record.
        assert!(decode_chunk(&[0xff; 3]).is_err());
    }
}
