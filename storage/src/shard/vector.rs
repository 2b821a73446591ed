//! The dense channel: an in-memory HNSW graph (hnsw_rs) over L2-normalised vectors.
//!
//! Vectors are normalised on the way in, so `DistDot` (`1 - dot`) is the cosine distance and
//! a hit's cosine similarity is `1 - distance`. hnsw_rs cannot delete points: deleted and
//! replaced chunks stay in the graph, hidden by the search filter, until
//! [`crate::shard::ShardIndex::purge_deleted`] swaps in a rebuilt graph. The graph lives
//! behind `RwLock<Arc<_>>` only for that swap: searches and inserts share it (`Hnsw` is `Sync`
//! for both), and a search that started on the old graph finishes on it.
//!
//! Rebuilding the graph from the chunk store costs about 1 ms per point (ef_construction 200,
//! 2 cores), so the graph is also saved as a *snapshot* (`file_dump`) now and then. A snapshot
//! need not be current: after loading one, the shard inserts whatever live chunks it lacks
//! (dead points in it stay hidden by the filter). It is written into `next/`, completed by a
//! `snapshot.json` written last, and then renamed to `current/`; anything that fails to load
//! (including a panic inside hnsw_rs) falls back to a rebuild.

use std::collections::HashSet;
use std::fs::{self, File};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};

use hnsw_rs::api::AnnT;
use hnsw_rs::prelude::{DistDot, FilterT, Hnsw, HnswIo};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, StorageError};

/// hnsw_rs stops growing layers at 16 anyway.
const MAX_LAYERS: usize = 16;
/// Below this many points a batch is inserted on the calling thread; rayon costs more.
const PARALLEL_INSERT_MIN: usize = 64;
/// Points inserted one by one before parallel insertion starts.
const SERIAL_GRAPH_SIZE: usize = 1000;
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

    /// Saves the current graph as the snapshot under `dir`; returns its number of points.
    /// Call only while no insert runs.
    pub fn save_snapshot(&self, dir: &Path) -> Result<usize> {
        let graph = self.current();
        save_snapshot(&graph, self.params, dir)?;
        Ok(graph.get_nb_point())
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
    // Concurrent inserts into a small graph miss each other's links and hurt recall: grow the
    // graph serially first.
    let serial = SERIAL_GRAPH_SIZE
        .saturating_sub(graph.get_nb_point())
        .min(points.len());
    let (serial, parallel) = points.split_at(serial);
    for (vector, id) in serial {
        graph.insert((vector.as_slice(), *id));
    }
    if parallel.len() >= PARALLEL_INSERT_MIN {
        graph.parallel_insert(parallel);
    } else {
        for (vector, id) in parallel {
            graph.insert((vector.as_slice(), *id));
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

/// Internal ids of every point in `graph`. Call only while no insert runs (the iterator takes
/// a lock twice).
pub(crate) fn point_ids(graph: &Graph) -> HashSet<u64> {
    if graph.get_nb_point() == 0 {
        return HashSet::new();
    }
    graph
        .get_point_indexation()
        .into_iter()
        .map(|point| point.get_origin_id() as u64)
        .collect()
}

const SNAPSHOT_FILE: &str = "snapshot.json";
const SNAPSHOT_BASENAME: &str = "graph";
const SNAPSHOT_FORMAT: u32 = 1;
const GRAPH_SUFFIX: &str = ".hnsw.graph";
const DATA_SUFFIX: &str = ".hnsw.data";

/// Written last into a snapshot directory: its presence means the dump is complete.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct SnapshotDescription {
    format: u32,
    dimension: usize,
    m: usize,
    ef_construction: usize,
    basename: String,
    points: usize,
    /// SHA-256 of the graph and data files, checked before hnsw_rs reads them (it trusts
    /// its input: garbage can panic or abort).
    graph_sha256: String,
    data_sha256: String,
}

/// Saves `graph` under `dir` (`dir/current`), replacing the previous snapshot atomically.
/// Call only while no insert runs.
pub(crate) fn save_snapshot(graph: &Graph, params: HnswParams, dir: &Path) -> Result<()> {
    let next = dir.join("next");
    let current = dir.join("current");
    if next.exists() {
        fs::remove_dir_all(&next)?;
    }
    fs::create_dir_all(&next)?;
    // hnsw_rs panics instead of returning some I/O errors.
    let basename = catch_unwind(AssertUnwindSafe(|| {
        graph.file_dump(&next, SNAPSHOT_BASENAME)
    }))
    .map_err(|_| snapshot_error("hnsw file_dump panicked".to_owned()))?
    .map_err(|error| snapshot_error(format!("hnsw file_dump: {error}")))?;
    for suffix in [GRAPH_SUFFIX, DATA_SUFFIX] {
        File::open(next.join(format!("{basename}{suffix}")))?.sync_all()?;
    }
    let graph_sha256 = file_sha256(&next.join(format!("{basename}{GRAPH_SUFFIX}")))?;
    let data_sha256 = file_sha256(&next.join(format!("{basename}{DATA_SUFFIX}")))?;
    let description = SnapshotDescription {
        format: SNAPSHOT_FORMAT,
        dimension: params.dimension,
        m: params.m,
        ef_construction: params.ef_construction,
        basename,
        points: graph.get_nb_point(),
        graph_sha256,
        data_sha256,
    };
    let json = serde_json::to_vec(&description)
        .map_err(|error| snapshot_error(format!("snapshot description: {error}")))?;
    fs::write(next.join(SNAPSHOT_FILE), json)?;
    File::open(next.join(SNAPSHOT_FILE))?.sync_all()?;
    File::open(&next)?.sync_all()?;
    if current.exists() {
        fs::remove_dir_all(&current)?;
    }
    fs::rename(&next, &current)?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Loads the newest complete snapshot under `dir` built with `params`, if any.
pub(crate) fn load_snapshot(params: HnswParams, dir: &Path) -> Option<Graph> {
    // `next` is complete only if a crash came between removing `current` and the rename.
    for candidate in [dir.join("current"), dir.join("next")] {
        let Ok(json) = fs::read(candidate.join(SNAPSHOT_FILE)) else {
            continue;
        };
        let description: SnapshotDescription = match serde_json::from_slice(&json) {
            Ok(description) => description,
            Err(error) => {
                tracing::warn!(%error, "unreadable hnsw snapshot description");
                continue;
            }
        };
        let expected = (
            SNAPSHOT_FORMAT,
            params.dimension,
            params.m,
            params.ef_construction,
        );
        let found = (
            description.format,
            description.dimension,
            description.m,
            description.ef_construction,
        );
        if expected != found {
            tracing::info!(
                ?expected,
                ?found,
                "hnsw snapshot built with other parameters"
            );
            continue;
        }
        let intact = [
            (GRAPH_SUFFIX, &description.graph_sha256),
            (DATA_SUFFIX, &description.data_sha256),
        ]
        .iter()
        .all(|(suffix, expected)| {
            file_sha256(&candidate.join(format!("{}{suffix}", description.basename)))
                .is_ok_and(|actual| actual == **expected)
        });
        if !intact {
            tracing::warn!(dir = %candidate.display(), "hnsw snapshot files are damaged");
            continue;
        }
        // The loaded graph borrows its loader for its whole life (`'a: 'b`); leaking the small
        // loader gives a `'static` graph. One leak per shard open.
        let loader: &'static mut HnswIo =
            Box::leak(Box::new(HnswIo::new(&candidate, &description.basename)));
        let loaded = catch_unwind(AssertUnwindSafe(move || {
            let loader = loader; // moved in, so the graph may borrow it for 'static
            loader.load_hnsw::<f32, DistDot>()
        }));
        match loaded {
            Ok(Ok(mut graph)) if graph.get_nb_point() == description.points => {
                // The loader turns candidate extension on; fresh graphs have it off.
                graph.set_extend_candidates(false);
                return Some(graph);
            }
            Ok(Ok(graph)) => tracing::warn!(
                expected = description.points,
                loaded = graph.get_nb_point(),
                "hnsw snapshot has the wrong number of points"
            ),
            Ok(Err(error)) => tracing::warn!(%error, "hnsw snapshot did not load"),
            Err(_) => tracing::warn!("hnsw snapshot load panicked"),
        }
    }
    None
}

fn file_sha256(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut File::open(path)?, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

fn snapshot_error(message: String) -> StorageError {
    StorageError::Io(std::io::Error::other(message))
}
