//! Dense search under document-level access on real embeddings: SciFact's 5,183 abstracts
//! and 300 test queries embedded by all-MiniLM-L6-v2, one chunk per abstract, in one shard.
//! A share of the documents carries the caller's group (`sift.groups = "visible"`), the rest
//! another group; for each share the caller's top-10 is compared with an exact scan over the
//! chunks it may read (recall@10), and every hit is checked to be readable. The unfiltered
//! search is measured beside it, in the same run, as the latency baseline.
//!
//! `SIFT_EMB_DIR` (default `../shared/data/emb` beside the workspace) holds
//! `scifact_minilm_corpus.npy`, `scifact_minilm_queries.npy` (little-endian f32, C order) and
//! `scifact_minilm_ids.json`.
//!
//! `cargo bench -p sift-storage --bench filtered_recall`
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it returns at once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sift_storage::chunk::{
    ACCESS_GROUPS_KEY, ChunkRecord, DocumentEntry, DocumentWrite, Metadata, ScoredChunk,
    SearchFilter, may_read,
};
use sift_storage::shard::{ShardConfig, ShardIndex};

const K: usize = 10;
/// Shares of the documents the caller may read, in percent.
const SHARES: [usize; 5] = [1, 5, 20, 50, 100];

/// A 2-D little-endian f32 array in C order from a `.npy` file (format 1.0 or 2.0). Only the
/// one layout these files have is accepted, so a small reader does and a crate is not needed.
fn read_npy(path: &Path) -> Vec<Vec<f32>> {
    let bytes =
        std::fs::read(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    assert!(
        bytes.starts_with(b"\x93NUMPY"),
        "{}: not a .npy file",
        path.display()
    );
    let (header_len, header_start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[header_start..header_start + header_len])
        .expect("an ASCII header");
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"),
        "{}: expected little-endian f32 in C order, found {header}",
        path.display()
    );
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("a shape");
    let dims: Vec<usize> = shape
        .split(',')
        .filter(|dim| !dim.trim().is_empty())
        .map(|dim| dim.trim().parse().expect("a dimension"))
        .collect();
    let [rows, columns] = dims[..] else {
        panic!("{}: expected a 2-D array, found {shape}", path.display());
    };
    let data = &bytes[header_start + header_len..];
    assert_eq!(
        data.len(),
        rows * columns * 4,
        "{}: truncated",
        path.display()
    );
    data.chunks_exact(columns * 4)
        .map(|row| {
            row.chunks_exact(4)
                .map(|value| f32::from_le_bytes([value[0], value[1], value[2], value[3]]))
                .collect()
        })
        .collect()
}

/// Whether document `index` is one the caller may read at `share` percent: spread evenly
/// over the corpus, so every share's readable set contains the smaller shares' sets.
fn readable(index: usize, share: usize) -> bool {
    index % 100 < share
}

fn document(id: &str, vector: Vec<f32>, metadata: Metadata) -> DocumentWrite {
    DocumentWrite {
        entry: DocumentEntry {
            document_id: id.to_owned(),
            external_id: None,
            title: String::new(),
            metadata,
        },
        parents: Vec::new(),
        chunks: vec![ChunkRecord {
            position: 0,
            parent_position: 0,
            text: format!("abstract {id}"),
            heading_path: Vec::new(),
            span: (0, 0),
            pages: None,
            vector,
        }],
    }
}

fn percentile(sorted: &[Duration], fraction: f64) -> f64 {
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1000.0
}

fn ids(hits: &[ScoredChunk]) -> HashSet<&str> {
    hits.iter()
        .map(|hit| hit.chunk.document_id.as_str())
        .collect()
}

fn main() {
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    // cargo runs a bench in its package's folder: the default is found from the workspace.
    let root = std::env::var("SIFT_EMB_DIR").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/emb"),
        PathBuf::from,
    );
    let corpus = read_npy(&root.join("scifact_minilm_corpus.npy"));
    let queries = read_npy(&root.join("scifact_minilm_queries.npy"));
    let dimension = corpus[0].len();
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    let shard = ShardIndex::open(dir.path(), ShardConfig::new(dimension)).expect("opening");
    // Each document is tagged with the smallest share that reads it, so one index serves
    // every share: a caller at share s holds the groups of every share up to s.
    let documents: Vec<DocumentWrite> = corpus
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let share = SHARES
                .iter()
                .find(|share| readable(index, **share))
                .expect("100% reads every document");
            let mut metadata = Metadata::new();
            metadata.insert(ACCESS_GROUPS_KEY.to_owned(), format!("share-{share}"));
            document(&format!("d{index}"), vector, metadata)
        })
        .collect();
    let started = Instant::now();
    for batch in documents.chunks(500) {
        shard.write_documents(batch.to_vec()).expect("writing");
    }
    println!(
        "indexed {} abstracts ({dimension} dimensions) in {:.1} s",
        documents.len(),
        started.elapsed().as_secs_f64()
    );
    // Each query runs unfiltered and at every share in turn, so a slow stretch of the machine
    // falls on every column alike.
    let filters: Vec<SearchFilter> = SHARES
        .iter()
        .map(|share| SearchFilter {
            groups: Some(
                SHARES
                    .iter()
                    .filter(|other| *other <= share)
                    .map(|other| format!("share-{other}"))
                    .collect(),
            ),
            ..SearchFilter::default()
        })
        .collect();
    let unfiltered = SearchFilter::default();
    let mut baseline = Vec::new();
    let mut latencies = vec![Vec::new(); SHARES.len()];
    let (mut found, mut expected, mut full) = (
        vec![0; SHARES.len()],
        vec![0; SHARES.len()],
        vec![0; SHARES.len()],
    );
    let permitted: Vec<usize> = filters
        .iter()
        .map(|filter| {
            documents
                .iter()
                .filter(|document| may_read(&document.entry.metadata, filter.groups.as_deref()))
                .count()
        })
        .collect();
    for query in &queries {
        let started = Instant::now();
        shard
            .search_dense(query, K, &unfiltered)
            .expect("searching");
        baseline.push(started.elapsed());
        for (column, filter) in filters.iter().enumerate() {
            let started = Instant::now();
            let hits = shard.search_dense(query, K, filter).expect("searching");
            latencies[column].push(started.elapsed());
            assert!(
                hits.iter()
                    .all(|hit| may_read(&hit.chunk.metadata, filter.groups.as_deref())),
                "a hit the caller may not read"
            );
            let truth = shard
                .search_dense_exact(query, K, filter)
                .expect("exact search");
            found[column] += ids(&hits).intersection(&ids(&truth)).count();
            expected[column] += truth.len();
            full[column] += usize::from(hits.len() == K.min(permitted[column]));
        }
    }
    baseline.sort();
    let baseline_p50 = percentile(&baseline, 0.5);
    println!(
        "unfiltered: p50 {baseline_p50:.2} ms, p99 {:.2} ms",
        percentile(&baseline, 0.99)
    );
    println!(
        "| readable | chunks | recall@10 | full top-10 | p50 ms | p99 ms | p50 / unfiltered |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (column, share) in SHARES.iter().enumerate() {
        latencies[column].sort();
        let p50 = percentile(&latencies[column], 0.5);
        println!(
            "| {share}% | {} | {:.4} | {}/{} | {p50:.2} | {:.2} | {:.2} |",
            permitted[column],
            found[column] as f64 / expected[column] as f64,
            full[column],
            queries.len(),
            percentile(&latencies[column], 0.99),
            p50 / baseline_p50,
        );
    }
}
