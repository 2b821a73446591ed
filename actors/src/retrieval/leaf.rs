//! The leaf search: one shard replica's channels (dense HNSW or exact scan, BM25) for one
//! request, each timed. The shard actor runs it on the blocking pool; the root search
//! ([`super::root`]) gathers the leaves of every shard and fuses them.

use std::time::Instant;

use sift_storage::shard::ShardIndex;

use crate::error::Result;
use crate::shards::messages::{GraphLeafRequest, GraphLeafResponse, LeafRequest, LeafResponse};

/// Searches `index` in the channels `request` asks for.
pub(crate) fn search(index: &ShardIndex, request: &LeafRequest) -> Result<LeafResponse> {
    let mut response = LeafResponse::default();
    if let Some(vector) = &request.vector {
        let started = Instant::now();
        response.dense = if request.exact {
            index.search_dense_exact(vector, request.k, &request.filter)?
        } else {
            index.search_dense(vector, request.k, &request.filter)?
        };
        response.dense_seconds = started.elapsed().as_secs_f64();
    }
    if request.bm25 {
        let started = Instant::now();
        response.bm25 = index.search_bm25(&request.query, request.k, &request.filter)?;
        response.bm25_seconds = started.elapsed().as_secs_f64();
    }
    if let Some(graph) = &request.graph {
        response.graph = Some(graph_step(index, graph, &request.filter)?);
    }
    Ok(response)
}

fn graph_step(
    index: &ShardIndex,
    request: &GraphLeafRequest,
    filter: &sift_storage::chunk::SearchFilter,
) -> Result<GraphLeafResponse> {
    Ok(match request {
        GraphLeafRequest::Counts { ids } => GraphLeafResponse::Counts {
            counts: index.graph_chunk_counts(ids),
            chunks: index.live_chunks(),
        },
        GraphLeafRequest::Neighbourhood {
            frontier,
            per_entity,
        } => GraphLeafResponse::Neighbourhood(index.graph_neighbourhood(
            frontier,
            *per_entity,
            filter,
        )?),
        GraphLeafRequest::Chunks { hits } => {
            GraphLeafResponse::Chunks(index.graph_chunks(hits, filter)?)
        }
        GraphLeafRequest::Entities { ids } => {
            GraphLeafResponse::Entities(index.graph_entities(ids)?)
        }
        GraphLeafRequest::ByPrefix { prefix, limit } => {
            GraphLeafResponse::Entities(index.graph_entities_by_prefix(prefix, *limit)?)
        }
        GraphLeafRequest::Document { document_id } => {
            GraphLeafResponse::Document(index.graph_document_state(document_id)?)
        }
        GraphLeafRequest::Events { entity, limit } => {
            GraphLeafResponse::Events(index.graph_events(*entity, *limit, filter)?)
        }
        GraphLeafRequest::Top { limit } => {
            GraphLeafResponse::Entities(index.graph_top_entities(*limit, &["date", "quantity"])?)
        }
    })
}
