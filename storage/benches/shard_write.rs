//! Write throughput, reopen time and search latency of one shard replica's indexes: 10k
//! chunks of 384-d in batches of 100 documents x 5 chunks.
//!
//! `cargo bench -p sift-storage --bench shard_write`
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it returns at once.

use std::time::Instant;

use sift_storage::chunk::{
    ChunkRecord, DocumentEntry, DocumentWrite, Metadata, ParentRecord, SearchFilter,
};
use sift_storage::shard::{ShardConfig, ShardIndex};

const DIMENSION: usize = 384;
const CHUNKS: usize = 10_000;
const CHUNKS_PER_DOCUMENT: usize = 5;
const CLUSTERS: usize = 100;
const NOISE: f32 = 0.08;
const WORDS: [&str; 10] = [
    "protein",
    "cell",
    "gene",
    "expression",
    "cancer",
    "immune",
    "receptor",
    "binding",
    "mouse",
    "clinical",
];

/// SplitMix64: deterministic data without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn normalise(vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    vector.into_iter().map(|v| v / norm).collect()
}

/// Unit vectors around `CLUSTERS` random centres, as real embeddings cluster by topic.
fn clustered_vectors(rng: &mut Rng) -> Vec<Vec<f32>> {
    let centres: Vec<Vec<f32>> = (0..CLUSTERS)
        .map(|_| normalise((0..DIMENSION).map(|_| rng.next_f32()).collect()))
        .collect();
    (0..CHUNKS)
        .map(|index| {
            let centre = &centres[index % CLUSTERS];
            normalise(
                centre
                    .iter()
                    .map(|value| value + NOISE * rng.next_f32())
                    .collect(),
            )
        })
        .collect()
}

fn documents(vectors: &[Vec<f32>]) -> Vec<DocumentWrite> {
    vectors
        .chunks(CHUNKS_PER_DOCUMENT)
        .enumerate()
        .map(|(index, vectors)| DocumentWrite {
            entry: DocumentEntry {
                document_id: format!("doc{index}"),
                external_id: None,
                title: format!("Title {index} {}", WORDS[index % WORDS.len()]),
                metadata: Metadata::from([("source".to_owned(), "bench".to_owned())]),
            },
            parents: vec![ParentRecord {
                position: 0,
                text: "parent ".repeat(200),
                span: (0, 1400),
                pages: None,
            }],
            chunks: vectors
                .iter()
                .enumerate()
                .map(|(position, vector)| ChunkRecord {
                    position: position as u32,
                    parent_position: 0,
                    text: (0..60)
                        .map(|w| WORDS[(index + position + w * 7) % WORDS.len()])
                        .collect::<Vec<_>>()
                        .join(" "),
                    heading_path: vec!["Abstract".to_owned()],
                    span: (0, 400),
                    pages: None,
                    vector: vector.clone(),
                })
                .collect(),
        })
        .collect()
}

fn main() {
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    let dir = tempfile::TempDir::new().expect("a temporary directory");
    let vectors = clustered_vectors(&mut Rng(7));
    let documents = documents(&vectors);
    let open = || ShardIndex::open(dir.path(), ShardConfig::new(DIMENSION)).expect("opening");
    {
        let shard = open();
        let started = Instant::now();
        for batch in documents.chunks(100) {
            shard.write_documents(batch.to_vec()).expect("writing");
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "write: {CHUNKS} chunks in {seconds:.2} s = {:.0} chunks/s (batches of 100 documents x {CHUNKS_PER_DOCUMENT} chunks)",
            CHUNKS as f64 / seconds
        );
    }
    let started = Instant::now();
    let shard = open();
    println!(
        "reopen with {} chunks: {:.2} s",
        shard.stats().chunks,
        started.elapsed().as_secs_f64()
    );
    let no_filter = SearchFilter::default();
    let started = Instant::now();
    for query in vectors.iter().take(200) {
        shard
            .search_dense(query, 10, &no_filter)
            .expect("searching");
    }
    println!(
        "dense search: {:.3} ms/query",
        started.elapsed().as_secs_f64() * 1000.0 / 200.0
    );
    let started = Instant::now();
    for index in 0..200 {
        let query = format!("{} {}", WORDS[index % 10], WORDS[(index * 3) % 10]);
        shard
            .search_bm25(&query, 10, &no_filter)
            .expect("searching");
    }
    println!(
        "bm25 search: {:.3} ms/query",
        started.elapsed().as_secs_f64() * 1000.0 / 200.0
    );
    drop(shard);
    std::fs::remove_dir_all(dir.path().join("hnsw")).expect("removing the HNSW snapshot");
    let started = Instant::now();
    let shard = open();
    println!(
        "reopen with {} chunks, no hnsw snapshot (rebuild): {:.2} s",
        shard.stats().chunks,
        started.elapsed().as_secs_f64()
    );
}
