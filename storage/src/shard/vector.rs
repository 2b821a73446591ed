//! The dense channel: an in-memory HNSW graph (hnsw_rs) over L2-normalised vectors.
//!
//! Vectors are normalised on the way in, so `DistDot` (`1 - dot`) is the cosine distance and
//! a hit's cosine similarity is `1 - distance`. hnsw_rs cannot delete points: deleted and
//! replaced chunks stay in the graph, hidden by the search filter, until
//! [`crate::shard::ShardIndex::purge_deleted`] swaps in a rebuilt graph. The graph lives
//! behind `RwLock<Arc<_>>` only for that swap: searches and inserts share it (`Hnsw` is `Sync`
//! for both), and a search that started on the old graph finishes on it.

use std::sync::{Arc, PoisonError, RwLock};

use hnsw_rs::prelude::{DistDot, FilterT, Hnsw};

use crate::error::{Result, StorageError};

/// hnsw_rs stops growing layers at 16 anyway.
const MAX_LAYERS: usize = 16;
/// Below this many points a batch is inserted on the calling thread; rayon costs more.
const PARALLEL_INSERT_MIN: usize = 64;
/// `Hnsw::new` exits the process above this.
pub(crate) const MAX_M: usize = 256;

pub(crate) type Graph = Hnsw<'static, f32, DistDot>;

/// Construction parameters of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HnswParams {
    pub dimension: usize,
    pub m: usize,
    pub ef_construction: usize,
}

/// The shard's HNSW graph. Data ids are the shard's internal chunk ids.
pub(crate) struct VectorIndex {
    params: HnswParams,
    graph: RwLock<Arc<Graph>>,
}

impl VectorIndex {
    pub fn new(params: HnswParams, capacity: usize) -> VectorIndex {
        VectorIndex {
            params,
            graph: RwLock::new(Arc::new(new_graph(params, capacity))),
        }
    }

    /// A fresh, empty graph with this index's parameters, to fill and then [`Self::replace`].
    pub fn empty_graph(&self, capacity: usize) -> Graph {
        new_graph(self.params, capacity)
    }

    /// Inserts already-normalised vectors under their internal ids into the current graph.
    pub fn insert(&self, points: &[(Vec<f32>, u64)]) -> Result<()> {
        insert_into(&self.current(), points)
    }

    /// Swaps in a rebuilt graph; searches already running finish on the old one.
    pub fn replace(&self, graph: Graph) {
        *self.graph.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(graph);
    }

    /// Number of points in the graph, hidden ones included.
    pub fn len(&self) -> usize {
        self.current().get_nb_point()
    }

    /// The `k` nearest points that pass `keep`, as `(internal id, cosine similarity)`, best
    /// first. `query` must be normalised. The filter runs inside the graph search, so hidden
    /// points do not take places in the result.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        keep: Option<&dyn Fn(u64) -> bool>,
    ) -> Vec<(u64, f32)> {
        if k == 0 {
            return Vec::new();
        }
        let graph = self.current();
        let adapter = keep.map(|keep| move |id: &usize| keep(*id as u64));
        let filter = adapter.as_ref().map(|adapter| adapter as &dyn FilterT);
        graph
            .search_filter(query, k, ef.max(k), filter)
            .into_iter()
            .map(|neighbour| (neighbour.d_id as u64, 1.0 - neighbour.distance))
            .collect()
    }

    fn current(&self) -> Arc<Graph> {
        Arc::clone(&self.graph.read().unwrap_or_else(PoisonError::into_inner))
    }
}

fn new_graph(params: HnswParams, capacity: usize) -> Graph {
    Hnsw::new(
        params.m,
        capacity.max(1024),
        MAX_LAYERS,
        params.ef_construction,
        DistDot,
    )
}

/// Inserts normalised vectors into `graph` (in parallel for large batches).
pub(crate) fn insert_into(graph: &Graph, points: &[(Vec<f32>, u64)]) -> Result<()> {
    let points = points
        .iter()
        .map(|(vector, id)| {
            usize::try_from(*id)
                .map(|id| (vector, id))
                .map_err(|_| StorageError::Invalid(format!("internal id {id} exceeds usize")))
        })
        .collect::<Result<Vec<_>>>()?;
    if points.len() >= PARALLEL_INSERT_MIN {
        graph.parallel_insert(&points);
    } else {
        for (vector, id) in points {
            graph.insert((vector.as_slice(), id));
        }
    }
    Ok(())
}

/// Checks the dimension and that the vector is finite and non-zero, and returns it scaled to
/// unit length. Always rescales: `DistDot` asserts `dot <= 1.000002`, which vectors that are
/// "almost" normalised (say to 1e-4) would break.
pub(crate) fn normalised(vector: &[f32], dimension: usize) -> Result<Vec<f32>> {
    if vector.len() != dimension {
        return Err(StorageError::DimensionMismatch {
            expected: dimension,
            actual: vector.len(),
        });
    }
    if vector.iter().any(|value| !value.is_finite()) {
        return Err(StorageError::Invalid(
            "vector has a non-finite component".to_owned(),
        ));
    }
    let norm = vector
        .iter()
        .map(|&value| f64::from(value) * f64::from(value))
        .sum::<f64>()
        .sqrt();
    if norm < 1e-12 {
        return Err(StorageError::Invalid("vector has zero length".to_owned()));
    }
    if (norm - 1.0).abs() > 1e-3 {
        tracing::debug!(norm, "renormalising a vector that was not unit length");
    }
    Ok(vector
        .iter()
        .map(|&value| (f64::from(value) / norm) as f32)
        .collect())
}

/// Cosine similarity of two normalised vectors.
pub(crate) fn cosine(left: &[f32], right: &[f32]) -> f32 {
    left.iter().zip(right).map(|(a, b)| a * b).sum()
}
