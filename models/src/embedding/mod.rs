//! Embedding clients: text in, L2-normalised vectors out.
//!
//! Two backends sit behind one [`Embedder`] handle:
//! - [`MiniLmEmbedder`] runs a local sentence-transformers BERT model (all-MiniLM-L6-v2 by
//!   default) with candle, on the blocking pool, bounded by a semaphore.
//! - [`OpenAiEmbedder`] calls any OpenAI-compatible `POST {base_url}/embeddings` endpoint, in
//!   batches, with timeouts and retries with backoff on transient failures.
//!
//! Every vector returned is L2-normalised, one per input text, in input order, so a dot product
//! is a cosine similarity whatever the backend.
//!
//! Metrics (label `backend` = `local` | `openai`): `sift_embedding_batch_seconds` (histogram,
//! one observation per batch), `sift_embedding_texts_total` (texts embedded) and
//! `sift_embedding_errors_total` (failed batches). [`describe_metrics`] describes them.

mod minilm;
mod openai;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use minilm::{LocalEmbedderOptions, MiniLmEmbedder};
pub use openai::{OpenAiEmbedder, OpenAiEmbedderConfig};

/// Folder name of the default embedded model, under `.models/` or the user cache.
pub const DEFAULT_LOCAL_MODEL: &str = "all-MiniLM-L6-v2";

/// Environment variable naming a model folder; see [`resolve_model_dir`].
pub const MODEL_DIR_ENV: &str = "SIFT_MODEL_DIR";

/// Files a model folder must hold to be loadable by [`MiniLmEmbedder::load`].
const REQUIRED_MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// Why an embedding call failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddingError {
    /// The local model folder is missing, incomplete or not a BERT model.
    #[error("embedding model could not be loaded: {0}")]
    ModelLoad(String),
    /// Tokenisation or the forward pass of the local model failed.
    #[error("embedding inference failed: {0}")]
    Inference(String),
    /// The remote endpoint answered with an error status (`status`), or could not be reached
    /// at all (`status: None`).
    #[error("embedding endpoint error (status {status:?}): {message}")]
    Http {
        status: Option<u16>,
        message: String,
    },
    /// The remote endpoint did not answer within the configured timeout.
    #[error("embedding request timed out")]
    Timeout,
    /// A vector had a different length than the embedder's dimension.
    #[error("embedding dimension mismatch: expected {expected}, got {actual}")]
    DimensionMismatch { expected: usize, actual: usize },
    /// The remote endpoint answered 2xx with a body that does not fit the wire format (not
    /// JSON, fewer vectors than inputs, duplicate indices, non-finite numbers).
    #[error("bad embedding response: {0}")]
    BadResponse(String),
    /// The backend refuses work for now: the remote endpoint kept answering 429 or 503 after
    /// every retry, or the local embedder is shutting down.
    #[error("embedding backend overloaded")]
    Overloaded,
}

impl EmbeddingError {
    /// Whether the same request may succeed if tried again later.
    pub fn is_transient(&self) -> bool {
        match self {
            EmbeddingError::ModelLoad(_) => false,
            EmbeddingError::Inference(_) => false,
            EmbeddingError::Http { status: None, .. } => true,
            EmbeddingError::Http {
                status: Some(status),
                ..
            } => is_transient_status(*status),
            EmbeddingError::Timeout => true,
            EmbeddingError::DimensionMismatch { .. } => false,
            EmbeddingError::BadResponse(_) => false,
            EmbeddingError::Overloaded => true,
        }
    }
}

/// HTTP statuses worth retrying: request timeout, rate limiting and server-side errors.
pub(crate) fn is_transient_status(status: u16) -> bool {
    status == 408 || status == 429 || status >= 500
}

/// A cheap, cloneable handle to one embedding backend.
#[derive(Clone)]
pub enum Embedder {
    /// The in-process candle model.
    Local(Arc<MiniLmEmbedder>),
    /// An OpenAI-compatible HTTP endpoint.
    OpenAi(Arc<OpenAiEmbedder>),
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self {
            Embedder::Local(_) => "local",
            Embedder::OpenAi(_) => "openai",
        };
        formatter
            .debug_struct("Embedder")
            .field("backend", &backend)
            .field("model", &self.model_name())
            .field("dimension", &self.dimension())
            .finish()
    }
}

impl Embedder {
    /// The model's name: the local model folder's name (e.g. `all-MiniLM-L6-v2`) or the
    /// configured remote model.
    pub fn model_name(&self) -> &str {
        match self {
            Embedder::Local(local) => local.model_name(),
            Embedder::OpenAi(remote) => remote.model_name(),
        }
    }

    /// Length of every vector this embedder returns.
    pub fn dimension(&self) -> usize {
        match self {
            Embedder::Local(local) => local.dimension(),
            Embedder::OpenAi(remote) => remote.dimension(),
        }
    }

    /// Embeds `texts`: one L2-normalised vector per text, in the same order. An empty input
    /// returns an empty output without touching the backend.
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        match self {
            Embedder::Local(local) => local.embed(texts).await,
            Embedder::OpenAi(remote) => remote.embed(texts).await,
        }
    }
}

/// Finds the local embedding model folder, first match wins:
/// 1. `configured`, if it holds the model files;
/// 2. `$SIFT_MODEL_DIR`, if it holds them;
/// 3. `.models/all-MiniLM-L6-v2` in the current directory or any ancestor, then in the
///    executable's directory or any ancestor (so tests and `cargo run` find `<repo>/.models`);
/// 4. `~/.cache/sift/models/all-MiniLM-L6-v2`.
///
/// Returns `None` when none holds `config.json`, `tokenizer.json` and `model.safetensors`;
/// `scripts/fetch-model.sh` fetches them.
pub fn resolve_model_dir(configured: Option<&Path>) -> Option<PathBuf> {
    let from_env = std::env::var_os(MODEL_DIR_ENV)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    let mut search_roots = Vec::new();
    if let Ok(current_dir) = std::env::current_dir() {
        search_roots.push(current_dir);
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
    {
        search_roots.push(exe_dir);
    }
    let home = std::env::var_os("HOME")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from);
    resolve_model_dir_from(
        configured,
        from_env.as_deref(),
        &search_roots,
        home.as_deref(),
    )
}

/// [`resolve_model_dir`] with its environment passed in, so tests need not mutate the process.
fn resolve_model_dir_from(
    configured: Option<&Path>,
    from_env: Option<&Path>,
    search_roots: &[PathBuf],
    home: Option<&Path>,
) -> Option<PathBuf> {
    let explicit = configured
        .into_iter()
        .chain(from_env)
        .map(Path::to_path_buf);
    let walked = search_roots.iter().flat_map(|root| {
        root.ancestors()
            .map(|ancestor| ancestor.join(".models").join(DEFAULT_LOCAL_MODEL))
    });
    let cached = home.map(|home| {
        home.join(".cache")
            .join("sift")
            .join("models")
            .join(DEFAULT_LOCAL_MODEL)
    });
    explicit
        .chain(walked)
        .chain(cached)
        .find(|candidate| has_model_files(candidate))
}

/// Whether `dir` holds the files [`MiniLmEmbedder::load`] needs.
pub fn has_model_files(dir: &Path) -> bool {
    REQUIRED_MODEL_FILES
        .iter()
        .all(|file| dir.join(file).is_file())
}

/// Describes the embedding metrics to the installed recorder; call once at startup.
pub fn describe_metrics() {
    metrics::describe_histogram!(
        "sift_embedding_batch_seconds",
        metrics::Unit::Seconds,
        "time to embed one batch of texts, retries included"
    );
    metrics::describe_counter!(
        "sift_embedding_texts_total",
        metrics::Unit::Count,
        "texts embedded successfully"
    );
    metrics::describe_counter!(
        "sift_embedding_errors_total",
        metrics::Unit::Count,
        "embedding batches that failed"
    );
}

/// The `backend` label of the embedding metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Local,
    OpenAi,
}

impl Backend {
    fn as_label(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::OpenAi => "openai",
        }
    }
}

/// Records one finished batch in the embedding metrics.
pub(crate) fn record_batch<T>(
    backend: Backend,
    texts: usize,
    elapsed: Duration,
    outcome: &Result<T, EmbeddingError>,
) {
    let label = backend.as_label();
    metrics::histogram!("sift_embedding_batch_seconds", "backend" => label)
        .record(elapsed.as_secs_f64());
    match outcome {
        Ok(_) => metrics::counter!("sift_embedding_texts_total", "backend" => label)
            .increment(texts as u64),
        Err(_) => metrics::counter!("sift_embedding_errors_total", "backend" => label).increment(1),
    }
}

/// Scales `vector` to unit length in place; an all-zero vector is left as it is.
pub(crate) fn l2_normalize(vector: &mut [f32]) {
    let norm = vector
        .iter()
        .map(|value| f64::from(*value) * f64::from(*value))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for value in vector.iter_mut() {
            *value = (f64::from(*value) / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_model_files(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for file in REQUIRED_MODEL_FILES {
            std::fs::write(dir.join(file), b"{}").unwrap();
        }
    }

    #[test]
    fn transient_errors_are_the_retryable_ones() {
        let http = |status| EmbeddingError::Http {
            status,
            message: String::new(),
        };
        assert!(http(None).is_transient());
        assert!(http(Some(500)).is_transient());
        assert!(http(Some(503)).is_transient());
        assert!(http(Some(429)).is_transient());
        assert!(http(Some(408)).is_transient());
        assert!(!http(Some(400)).is_transient());
        assert!(!http(Some(401)).is_transient());
        assert!(!http(Some(404)).is_transient());
        assert!(EmbeddingError::Timeout.is_transient());
        assert!(EmbeddingError::Overloaded.is_transient());
        assert!(!EmbeddingError::ModelLoad(String::new()).is_transient());
        assert!(!EmbeddingError::Inference(String::new()).is_transient());
        assert!(!EmbeddingError::BadResponse(String::new()).is_transient());
        assert!(
            !EmbeddingError::DimensionMismatch {
                expected: 1,
                actual: 2
            }
            .is_transient()
        );
    }

    #[test]
    fn l2_normalize_makes_unit_vectors_and_keeps_zero() {
        let mut vector = vec![3.0, 4.0];
        l2_normalize(&mut vector);
        assert!((vector[0] - 0.6).abs() < 1e-6 && (vector[1] - 0.8).abs() < 1e-6);
        let mut zero = vec![0.0; 4];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 4]);
    }

    #[test]
    fn resolve_prefers_configured_then_env_then_walk_then_cache() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path();
        let configured = root.join("configured");
        let from_env = root.join("env");
        let repo = root.join("repo");
        let walked = repo.join(".models").join(DEFAULT_LOCAL_MODEL);
        let deep = repo.join("a").join("b");
        let home = root.join("home");
        let cached = home
            .join(".cache")
            .join("sift")
            .join("models")
            .join(DEFAULT_LOCAL_MODEL);
        std::fs::create_dir_all(&deep).unwrap();
        let roots = vec![deep.clone()];

        // Nothing exists yet: configured and env paths without files are skipped.
        assert_eq!(
            resolve_model_dir_from(Some(&configured), Some(&from_env), &roots, Some(&home)),
            None
        );
        write_model_files(&cached);
        assert_eq!(
            resolve_model_dir_from(Some(&configured), Some(&from_env), &roots, Some(&home)),
            Some(cached.clone())
        );
        write_model_files(&walked);
        assert_eq!(
            resolve_model_dir_from(Some(&configured), Some(&from_env), &roots, Some(&home)),
            Some(walked.clone())
        );
        write_model_files(&from_env);
        assert_eq!(
            resolve_model_dir_from(Some(&configured), Some(&from_env), &roots, Some(&home)),
            Some(from_env.clone())
        );
        write_model_files(&configured);
        assert_eq!(
            resolve_model_dir_from(Some(&configured), Some(&from_env), &roots, Some(&home)),
            Some(configured.clone())
        );
    }

    #[test]
    fn incomplete_model_folder_is_not_a_match() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join("config.json"), b"{}").unwrap();
        std::fs::write(temp.path().join("tokenizer.json"), b"{}").unwrap();
        assert!(!has_model_files(temp.path()));
        assert_eq!(
            resolve_model_dir_from(Some(temp.path()), None, &[], None),
            None
        );
    }
}
