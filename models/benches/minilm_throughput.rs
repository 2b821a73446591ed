//! Throughput of the embedded MiniLM embedder on 100 SciFact abstracts (title and text), after
//! a warm-up batch.
//!
//! `cargo bench -p sift-models --bench minilm_throughput` (the model from
//! `scripts/fetch-model.sh`; `SIFT_SCIFACT_CORPUS` names another `corpus.jsonl`,
//! `SIFT_EMBED_BATCH_SIZE` another batch size).
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it returns at once.

use std::path::PathBuf;
use std::time::Instant;

use sift_models::embedding::{LocalEmbedderOptions, MiniLmEmbedder, resolve_model_dir};

fn main() {
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    let corpus = std::env::var("SIFT_SCIFACT_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/scifact-slice/corpus.jsonl")
        });
    let texts: Vec<String> = std::fs::read_to_string(&corpus)
        .unwrap_or_else(|error| panic!("reading {}: {error}", corpus.display()))
        .lines()
        .take(100)
        .map(|line| {
            let document: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            format!(
                "{}\n{}",
                document["title"].as_str().unwrap_or_default(),
                document["text"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let batch_size = std::env::var("SIFT_EMBED_BATCH_SIZE")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(LocalEmbedderOptions::default().batch_size);
    let options = LocalEmbedderOptions {
        batch_size,
        ..LocalEmbedderOptions::default()
    };
    let model_dir = resolve_model_dir(None).expect("the model: run scripts/fetch-model.sh");
    let model = MiniLmEmbedder::load(&model_dir, options).expect("loading the model");
    model.embed_blocking(&texts[..4]).expect("warming up");
    let started = Instant::now();
    let vectors = model.embed_blocking(&texts).expect("embedding");
    let elapsed = started.elapsed();
    assert_eq!(vectors.len(), texts.len());
    println!(
        "embedded {} scifact abstracts (batch size {batch_size}) in {:.2} s: {:.1} texts/s",
        texts.len(),
        elapsed.as_secs_f64(),
        texts.len() as f64 / elapsed.as_secs_f64()
    );
}
