//! Tests against the real all-MiniLM-L6-v2 weights. They fail, not skip, when the model is
//! missing: CI runs `scripts/fetch-model.sh` first.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::*;
use crate::embedding::{Embedder, resolve_model_dir};

fn model_dir() -> PathBuf {
    resolve_model_dir(None).unwrap_or_else(|| {
        panic!(
            "all-MiniLM-L6-v2 not found (looked in $SIFT_MODEL_DIR, .models/ up from the current \
             and executable directories, ~/.cache/sift/models): run scripts/fetch-model.sh"
        )
    })
}

/// One model shared by the tests of this binary; loading it takes a few hundred ms.
fn shared_model() -> Arc<MiniLmEmbedder> {
    static MODEL: OnceLock<Arc<MiniLmEmbedder>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = model_dir();
            Arc::new(
                MiniLmEmbedder::load(&dir, LocalEmbedderOptions::default())
                    .unwrap_or_else(|error| panic!("loading {}: {error}", dir.display())),
            )
        })
        .clone()
}

#[derive(serde::Deserialize)]
struct Reference {
    sentences: Vec<String>,
    embeddings: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/minilm-reference.json");
    let bytes =
        std::fs::read(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

fn cosine(left: &[f32], right: &[f32]) -> f32 {
    assert_eq!(left.len(), right.len());
    let dot: f32 = left.iter().zip(right).map(|(a, b)| a * b).sum();
    let norm = |vector: &[f32]| vector.iter().map(|value| value * value).sum::<f32>().sqrt();
    dot / (norm(left) * norm(right))
}

fn assert_unit(vector: &[f32]) {
    let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    assert!(vector.iter().all(|value| value.is_finite()));
}

/// About `words` words of plain English, far beyond 256 tokens for large counts.
fn long_text(words: usize) -> String {
    let vocabulary = [
        "retrieval",
        "augmented",
        "generation",
        "combines",
        "search",
        "with",
        "language",
        "models",
        "over",
        "sharded",
        "indexes",
    ];
    (0..words)
        .map(|index| vocabulary[index % vocabulary.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn matches_sentence_transformers_reference() {
    let reference = reference();
    let embedder = Embedder::Local(shared_model());
    assert_eq!(embedder.model_name(), "all-MiniLM-L6-v2");
    assert_eq!(embedder.dimension(), 384);

    let vectors = embedder.embed(reference.sentences.clone()).await.unwrap();
    assert_eq!(vectors.len(), reference.sentences.len());
    for ((sentence, vector), expected) in reference
        .sentences
        .iter()
        .zip(&vectors)
        .zip(&reference.embeddings)
    {
        assert_eq!(vector.len(), 384);
        assert_unit(vector);
        let similarity = cosine(vector, expected);
        assert!(similarity >= 0.999, "cosine {similarity} for {sentence:?}");
    }
}

#[test]
fn batched_equals_one_by_one_and_keeps_order() {
    let model = shared_model();
    let mut texts = reference().sentences;
    texts.push(String::new());
    texts.push(long_text(40));
    texts.push("short".to_owned());

    let batched = model.embed_blocking(&texts).unwrap();
    assert_eq!(batched.len(), texts.len());
    for (text, vector) in texts.iter().zip(&batched) {
        let alone = model.embed_blocking(std::slice::from_ref(text)).unwrap();
        let similarity = cosine(vector, &alone[0]);
        assert!(similarity > 0.9999, "cosine {similarity} for {text:?}");
    }
}

#[test]
fn long_inputs_are_truncated_and_empty_input_works() {
    let model = shared_model();
    let long = long_text(600);
    let longer = format!("{long} {}", long_text(600));
    let texts = vec![long, longer, String::new()];
    let vectors = model.embed_blocking(&texts).unwrap();
    assert_eq!(vectors.len(), 3);
    for vector in &vectors {
        assert_eq!(vector.len(), 384);
        assert_unit(vector);
    }
    // Both long texts share their first 256 tokens, so truncation makes them identical.
    assert!(cosine(&vectors[0], &vectors[1]) > 0.99999);
    assert!(model.embed_blocking(&[]).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_embed_over_several_batches_keeps_input_order() {
    let dir = model_dir();
    let options = LocalEmbedderOptions {
        batch_size: 2,
        max_concurrent_batches: 2,
        ..LocalEmbedderOptions::default()
    };
    let small_batches = Arc::new(MiniLmEmbedder::load(&dir, options).unwrap());
    let texts: Vec<String> = (0..7)
        .map(|index| format!("sentence number {index}: {}", long_text(index * 3)))
        .collect();
    let expected = shared_model().embed_blocking(&texts).unwrap();

    // Two concurrent callers share the permits.
    let (first, second) = tokio::join!(
        small_batches.embed(texts.clone()),
        small_batches.embed(texts.clone())
    );
    for vectors in [first.unwrap(), second.unwrap()] {
        assert_eq!(vectors.len(), texts.len());
        for (vector, expected) in vectors.iter().zip(&expected) {
            assert!(cosine(vector, expected) > 0.9999);
        }
    }
    assert!(small_batches.embed(Vec::new()).await.unwrap().is_empty());
}

#[test]
fn missing_model_folder_is_a_load_error() {
    let temp = tempfile::tempdir().unwrap();
    let error = MiniLmEmbedder::load(temp.path(), LocalEmbedderOptions::default()).unwrap_err();
    assert!(matches!(error, EmbeddingError::ModelLoad(_)), "{error}");
    assert!(error.to_string().contains("fetch-model.sh"));
    assert!(!error.is_transient());
}

#[test]
fn invalid_options_are_rejected() {
    let dir = model_dir();
    let options = LocalEmbedderOptions {
        batch_size: 0,
        ..LocalEmbedderOptions::default()
    };
    assert!(matches!(
        MiniLmEmbedder::load(&dir, options),
        Err(EmbeddingError::ModelLoad(_))
    ));
}

#[test]
fn batches_group_texts_of_similar_length() {
    let texts: Vec<String> = ["a", "abcd", "ab", "abcde", "abc"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        plan_batches(&texts, 2),
        vec![vec![3, 1], vec![4, 2], vec![0]]
    );
    assert!(plan_batches(&[], 2).is_empty());
}
