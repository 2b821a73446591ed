//! Messages of a shard replica.

use std::sync::Arc;

use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};
use sift_storage::chunk::{ChunkView, DocumentWrite, ScoredChunk, SearchFilter, ShardWrite};
use sift_storage::shard::{
    EntityNeighbourhood, GraphDocumentState, GraphEntity, GraphEvent, ShardStats,
};

use crate::error::Result;

/// What a leaf search of one shard asks for (sent to other nodes as is).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LeafRequest {
    pub query: String,
    /// The query embedding; `None` skips the dense channel.
    pub vector: Option<Vec<f32>>,
    /// Dense by exact (brute-force) scan instead of HNSW: the ground truth for recall.
    pub exact: bool,
    /// Whether to run the BM25 channel.
    pub bm25: bool,
    /// Hits per channel.
    pub k: usize,
    pub filter: SearchFilter,
    /// A step of a graph search instead of (or besides) the two channels.
    pub graph: Option<GraphLeafRequest>,
}

impl LeafRequest {
    /// A graph step alone (neither dense nor BM25), under `filter`.
    pub fn graph(filter: &SearchFilter, k: usize, step: GraphLeafRequest) -> LeafRequest {
        LeafRequest {
            query: String::new(),
            vector: None,
            exact: false,
            bm25: false,
            k,
            filter: filter.clone(),
            graph: Some(step),
        }
    }
}

/// One step of a graph search on one shard (see [`crate::retrieval::graph`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum GraphLeafRequest {
    /// Which of these entities the shard knows, with their chunk counts.
    Counts { ids: Vec<u64> },
    /// The chunks (passing the filter) mentioning each entity, at most `per_entity` each.
    Neighbourhood {
        frontier: Vec<u64>,
        per_entity: usize,
    },
    /// These chunks' views, with the scores given.
    Chunks { hits: Vec<(String, f32)> },
    /// These entities' names and kinds.
    Entities { ids: Vec<u64> },
    /// Entities whose canonical name starts with `prefix`.
    ByPrefix { prefix: String, limit: usize },
    /// Where the graph of a document's live version here stands.
    Document { document_id: String },
    /// Up to `limit` events naming this entity.
    Events { entity: u64, limit: usize },
    /// The `limit` entities mentioned by the most chunks here, dates and quantities left out.
    Top { limit: usize },
}

/// A shard's answer to a [`GraphLeafRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum GraphLeafResponse {
    Counts {
        counts: Vec<(u64, u32)>,
        /// Live chunks of the shard.
        chunks: u64,
    },
    Neighbourhood(Vec<EntityNeighbourhood>),
    Chunks(Vec<ScoredChunk>),
    Entities(Vec<GraphEntity>),
    /// `None`: the replica does not hold the document.
    Document(Option<GraphDocumentState>),
    /// (chunk id, event), in chunk order.
    Events(Vec<(String, GraphEvent)>),
}

/// One shard's hits, per channel, each channel ranked by its own score.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LeafResponse {
    pub dense: Vec<ScoredChunk>,
    pub bm25: Vec<ScoredChunk>,
    pub dense_seconds: f64,
    pub bm25_seconds: f64,
    pub graph: Option<GraphLeafResponse>,
}

pub enum ShardMessage {
    /// Writes whole documents (durable and searchable when answered), a slice of a large
    /// one (durable, not searchable), or the commit of a document's slices.
    Write {
        write: ShardWrite,
        reply: RpcReplyPort<Result<()>>,
    },
    /// Deletes a document; never returned by a search of this shard once answered.
    Delete {
        document_id: String,
        reply: RpcReplyPort<Result<bool>>,
    },
    /// Searches the shard; answered from a blocking task so searches run concurrently.
    Search {
        request: Arc<LeafRequest>,
        reply: RpcReplyPort<Result<LeafResponse>>,
    },
    /// All chunks of a document, in order.
    Chunks {
        document_id: String,
        reply: RpcReplyPort<Result<Vec<ChunkView>>>,
    },
    Stats {
        reply: RpcReplyPort<ShardStats>,
    },
    /// The ids of the live documents (to compare replicas).
    DocumentIds {
        reply: RpcReplyPort<Result<Vec<String>>>,
    },
    /// Live documents as written, vectors included (to fill another replica).
    Export {
        document_ids: Vec<String>,
        reply: RpcReplyPort<Result<Vec<DocumentWrite>>>,
    },
    /// Background purge of deleted documents (sent by the replica's own timer).
    Purge,
    /// Fault injection: the handler panics (enabled only with `debug_faults`).
    Crash,
}
