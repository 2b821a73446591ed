//! The leaf search: one shard replica's channels (dense HNSW or exact scan, BM25) for one
//! request, each timed. The shard actor runs it on the blocking pool; the root search
//! ([`super::root`]) gathers the leaves of every shard and fuses them.

use std::time::Instant;

use sift_storage::shard::ShardIndex;

use crate::error::Result;
use crate::shards::messages::{LeafRequest, LeafResponse};

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
    Ok(response)
}
