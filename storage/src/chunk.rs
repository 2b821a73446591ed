//! Records written into a shard by ingestion and read back by search.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use sift_api::PageRange;

/// Metadata attached to a document: string keys and string values. JSON scalars given by
/// users are stringified at the API boundary, so equality filters are plain string matches.
pub type Metadata = BTreeMap<String, String>;

/// The metadata key that holds a document's access groups, comma-separated: only callers
/// of one of them see the document (none: everyone). `sift.` keys are reserved: user
/// metadata may not set them.
pub const ACCESS_GROUPS_KEY: &str = "sift.groups";

/// The metadata key of a document fetched by URL: the URL its bytes came from, after
/// redirects. Citations link to it.
pub const SOURCE_URL_KEY: &str = "sift.source_url";

/// The page a document was fetched from ([`SOURCE_URL_KEY`]), when it is an http(s) URL.
pub fn source_url(metadata: &Metadata) -> Option<&str> {
    metadata
        .get(SOURCE_URL_KEY)
        .map(String::as_str)
        .filter(|url| url.starts_with("http://") || url.starts_with("https://"))
}

/// The access groups of a document (empty: open to everyone who reaches its KB).
pub fn access_groups(metadata: &Metadata) -> Vec<&str> {
    metadata
        .get(ACCESS_GROUPS_KEY)
        .map(|groups| groups.split(',').filter(|g| !g.is_empty()).collect())
        .unwrap_or_default()
}

/// Whether a caller of `groups` (`None`: one who sees every document) may read a document
/// with `metadata`: an open document, or one that shares a group with the caller.
pub fn may_read(metadata: &Metadata, groups: Option<&[String]>) -> bool {
    let Some(groups) = groups else {
        return true;
    };
    let required = access_groups(metadata);
    required.is_empty() || required.iter().any(|g| groups.iter().any(|c| c == g))
}

/// The public id of a chunk: `"{document_id}#{position}"`. Stable across restarts and rebuilds.
pub fn chunk_id(document_id: &str, position: u32) -> String {
    format!("{document_id}#{position}")
}

/// Per-document facts every chunk of the document shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentEntry {
    pub document_id: String,
    pub external_id: Option<String>,
    pub title: String,
    pub metadata: Metadata,
}

/// A parent chunk (small-to-big): not indexed, returned as context for its children.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParentRecord {
    pub position: u32,
    pub text: String,
    /// Character offsets `[start, end)` in the document's extracted text.
    pub span: (u32, u32),
    /// The pages of its children (PDF, PowerPoint slides); `None` for documents without pages. Last field: a
    /// record stored before pages existed decodes without it (see `chunk_store`).
    pub pages: Option<PageRange>,
}

/// A child chunk: indexed by both channels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChunkRecord {
    /// Order of the chunk within its document, from 0.
    pub position: u32,
    /// Position of this chunk's parent in [`DocumentWrite::parents`].
    pub parent_position: u32,
    /// The indexed text, starting with the `[Context: A > B]` heading line when there is one.
    pub text: String,
    pub heading_path: Vec<String>,
    /// Character offsets `[start, end)` in the document's extracted text.
    pub span: (u32, u32),
    /// L2-normalised embedding of the chunk.
    pub vector: Vec<f32>,
    /// The page it lies on (PDF, PowerPoint slide); `None` for documents without pages. Last field: a record
    /// stored before pages existed decodes without it (see `chunk_store`).
    pub pages: Option<PageRange>,
}

/// Everything a shard stores for one document, written atomically.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentWrite {
    pub entry: DocumentEntry,
    pub parents: Vec<ParentRecord>,
    pub chunks: Vec<ChunkRecord>,
}

/// A slice of a document too large to write at once: some of its chunks (vectors included)
/// and parents. A shard replica stores a slice durably but keeps it out of search, listings
/// and exports until a [`DocumentCommit`] makes the document's slices its live version.
/// Writing a slice again replaces what an earlier slice put at the same positions, so a retry
/// is harmless.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentSlice {
    pub document_id: String,
    pub parents: Vec<ParentRecord>,
    pub chunks: Vec<ChunkRecord>,
}

/// Makes the slices written for `entry.document_id` its live version, replacing any earlier
/// one: chunk positions `0..chunk_count` and parent positions `0..parent_count` must all have
/// been written (a replica that missed a slice refuses the commit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DocumentCommit {
    pub entry: DocumentEntry,
    pub chunk_count: u32,
    pub parent_count: u32,
}

/// One write to a shard replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ShardWrite {
    /// Whole documents, each replacing any earlier version of its id.
    Documents(Vec<DocumentWrite>),
    /// A slice of a large document, not searchable until its commit.
    Slice(DocumentSlice),
    /// The end of a document written in slices.
    Commit(DocumentCommit),
}

impl ShardWrite {
    /// The chunks the replica stores or indexes for this write (what its time grows with).
    pub fn chunk_count(&self) -> usize {
        match self {
            ShardWrite::Documents(documents) => documents.iter().map(|d| d.chunks.len()).sum(),
            ShardWrite::Slice(slice) => slice.chunks.len(),
            ShardWrite::Commit(commit) => commit.chunk_count as usize,
        }
    }
}

/// Restricts a search to some documents and/or metadata values, applied inside the shard
/// before ranking (so it still fills `k`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchFilter {
    /// When set, only chunks of these documents.
    pub document_ids: Option<Vec<String>>,
    /// Every pair must match the document's metadata exactly.
    pub metadata: Metadata,
    /// When set, only documents this caller's groups may read ([`may_read`]).
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

impl SearchFilter {
    pub fn is_empty(&self) -> bool {
        self.document_ids.is_none() && self.metadata.is_empty() && self.groups.is_none()
    }
}

/// A chunk as returned by a search: everything a caller needs to show and cite it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChunkView {
    pub chunk_id: String,
    pub document_id: String,
    pub external_id: Option<String>,
    pub title: String,
    pub position: u32,
    pub text: String,
    pub parent_text: Option<String>,
    pub heading_path: Vec<String>,
    /// Character offsets `[start, end)` in the document's extracted text.
    #[schema(value_type = Vec<u32>, min_items = 2, max_items = 2)]
    pub span: (u32, u32),
    /// `{"first", "last"}` for a document with pages (PDF, slides), else `null`.
    pub pages: Option<PageRange>,
    #[schema(value_type = BTreeMap<String, String>)]
    pub metadata: Metadata,
}

/// One hit of one retrieval channel inside one shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredChunk {
    pub chunk: ChunkView,
    /// The channel's own score: cosine similarity for dense, BM25 for text.
    pub score: f32,
}
