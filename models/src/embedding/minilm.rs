//! The embedded embedder: a sentence-transformers BERT model (all-MiniLM-L6-v2 by default) run
//! in-process with candle on the CPU.
//!
//! Texts are tokenised (truncated to `max_seq_len`, padded to the longest text of the batch),
//! run through [`BertModel`], pooled over the attention mask (mean, or CLS if the model folder's
//! `1_Pooling/config.json` says so) and L2-normalised. Texts are grouped into batches of
//! similar length so short texts do not pay for a long neighbour's padding.
//!
//! Inference is CPU-bound: [`MiniLmEmbedder::embed`] runs every batch on tokio's blocking pool
//! and a semaphore lets at most `max_concurrent_batches` batches run at once, node-wide.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};
use tokio::sync::Semaphore;
use tracing::{debug, instrument};

use super::{Backend, EmbeddingError, has_model_files, l2_normalize, record_batch};

/// Tuning of the embedded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalEmbedderOptions {
    /// Tokens per text, special tokens included; longer texts are truncated. Capped by the
    /// model's `max_position_embeddings`. sentence-transformers uses 256 for all-MiniLM-L6-v2.
    pub max_seq_len: usize,
    /// Texts per forward pass.
    pub batch_size: usize,
    /// At most this many batches run at once on the blocking pool. candle spreads only its
    /// matrix products over the cores; the rest of a forward pass (softmax, layer norm, GELU,
    /// pooling) runs on one thread, so a second batch fills the gaps.
    pub max_concurrent_batches: usize,
}

impl Default for LocalEmbedderOptions {
    fn default() -> Self {
        // Measured on 2 cores, 400 SciFact abstracts (600 chunks), release: batch 32 one at a
        // time 169 s; batch 8 one at a time 141 s; batch 8 two at a time 88 s (4: 90 s, 16:
        // 100 s). Smaller batches pad less, and their tensors stay below glibc's mmap
        // threshold. docs/benchmarks-history.md, "Embedded model throughput".
        LocalEmbedderOptions {
            max_seq_len: 256,
            batch_size: 8,
            max_concurrent_batches: 2,
        }
    }
}

/// How token vectors become one text vector, from `1_Pooling/config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    /// Average of the token vectors under the attention mask.
    Mean,
    /// The first (`[CLS]`) token's vector.
    Cls,
}

/// An in-process BERT sentence embedder.
pub struct MiniLmEmbedder {
    model: BertModel,
    tokenizer: Tokenizer,
    pooling: Pooling,
    device: Device,
    dimension: usize,
    model_name: String,
    options: LocalEmbedderOptions,
    /// Bounds the batches running on the blocking pool.
    batch_permits: Arc<Semaphore>,
}

impl std::fmt::Debug for MiniLmEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MiniLmEmbedder")
            .field("model_name", &self.model_name)
            .field("dimension", &self.dimension)
            .field("pooling", &self.pooling)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl MiniLmEmbedder {
    /// Loads a sentence-transformers folder of a BERT model: `config.json` (its `hidden_size`
    /// is the dimension), `tokenizer.json`, `model.safetensors` and, if present,
    /// `1_Pooling/config.json`. Blocking: reads about 90 MB for all-MiniLM-L6-v2.
    #[instrument(skip_all, fields(model_dir = %model_dir.display()))]
    pub fn load(model_dir: &Path, options: LocalEmbedderOptions) -> Result<Self, EmbeddingError> {
        let started = Instant::now();
        validate_options(&options)?;
        if !has_model_files(model_dir) {
            return Err(EmbeddingError::ModelLoad(format!(
                "{} lacks config.json, tokenizer.json or model.safetensors \
                 (run scripts/fetch-model.sh or set SIFT_MODEL_DIR)",
                model_dir.display()
            )));
        }
        let config: BertConfig = read_json(&model_dir.join("config.json"))?;
        let pooling = read_pooling(model_dir)?;
        let max_seq_len = options.max_seq_len.min(config.max_position_embeddings);
        let tokenizer = load_tokenizer(&model_dir.join("tokenizer.json"), max_seq_len)?;

        let weights_path = model_dir.join("model.safetensors");
        // Read into memory rather than mmap: mmap needs `unsafe`, which the workspace forbids.
        let weights = std::fs::read(&weights_path).map_err(|error| {
            EmbeddingError::ModelLoad(format!("reading {}: {error}", weights_path.display()))
        })?;
        let device = Device::Cpu;
        let var_builder = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
            .map_err(|error| {
                EmbeddingError::ModelLoad(format!("parsing {}: {error}", weights_path.display()))
            })?;
        let model = BertModel::load(var_builder, &config).map_err(|error| {
            EmbeddingError::ModelLoad(format!("building the BERT model: {error}"))
        })?;

        let model_name = model_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| super::DEFAULT_LOCAL_MODEL.to_owned());
        debug!(
            model = %model_name,
            dimension = config.hidden_size,
            max_seq_len,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedding model loaded"
        );
        Ok(MiniLmEmbedder {
            model,
            tokenizer,
            pooling,
            device,
            dimension: config.hidden_size,
            model_name,
            batch_permits: Arc::new(Semaphore::new(options.max_concurrent_batches)),
            options: LocalEmbedderOptions {
                max_seq_len,
                ..options
            },
        })
    }

    /// The model folder's name, e.g. `all-MiniLM-L6-v2`.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Vector length (`hidden_size` of the model).
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The options in force (`max_seq_len` already capped by the model).
    pub fn options(&self) -> &LocalEmbedderOptions {
        &self.options
    }

    /// Embeds `texts` on the calling thread, batch after batch, without taking a permit. For
    /// callers that are already off the async runtime (tools, benchmarks); async code uses
    /// [`MiniLmEmbedder::embed`].
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        let batches = plan_batches(texts, self.options.batch_size);
        let mut vectors = vec![Vec::new(); texts.len()];
        for batch in batches {
            let batch_texts: Vec<&str> = batch.iter().map(|&index| texts[index].as_str()).collect();
            let batch_vectors = self.embed_batch_recorded(&batch_texts)?;
            for (index, vector) in batch.into_iter().zip(batch_vectors) {
                vectors[index] = vector;
            }
        }
        Ok(vectors)
    }

    /// Embeds `texts` on the blocking pool; at most `max_concurrent_batches` batches run at
    /// once across all callers. Batches queue fairly (first come, first served).
    #[instrument(skip_all, fields(texts = texts.len()))]
    pub async fn embed(
        self: &Arc<Self>,
        texts: Vec<String>,
    ) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let batches = plan_batches(&texts, self.options.batch_size);
        let texts = Arc::new(texts);
        let runs = batches.into_iter().map(|batch| {
            let embedder = Arc::clone(self);
            let texts = Arc::clone(&texts);
            async move {
                let permit = Arc::clone(&embedder.batch_permits)
                    .acquire_owned()
                    .await
                    .map_err(|_closed| EmbeddingError::Overloaded)?;
                let vectors = tokio::task::spawn_blocking(move || {
                    // The permit lives as long as the computation, even if the caller is gone.
                    let _permit = permit;
                    let batch_texts: Vec<&str> =
                        batch.iter().map(|&index| texts[index].as_str()).collect();
                    embedder
                        .embed_batch_recorded(&batch_texts)
                        .map(|vectors| (batch, vectors))
                })
                .await
                .map_err(|join_error| {
                    EmbeddingError::Inference(format!("embedding task failed: {join_error}"))
                })??;
                Ok::<_, EmbeddingError>(vectors)
            }
        });
        // try_join_all: one failed batch fails the call, so the others need not finish; a batch
        // already on the blocking pool still completes and then releases its permit.
        let finished = futures::future::try_join_all(runs).await?;
        let mut vectors = vec![Vec::new(); texts.len()];
        for (batch, batch_vectors) in finished {
            for (index, vector) in batch.into_iter().zip(batch_vectors) {
                vectors[index] = vector;
            }
        }
        Ok(vectors)
    }

    /// [`Self::embed_batch`] plus metrics.
    fn embed_batch_recorded(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        let started = Instant::now();
        let outcome = self.embed_batch(texts);
        record_batch(Backend::Local, texts.len(), started.elapsed(), &outcome);
        outcome
    }

    /// One forward pass over `texts`.
    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|error| EmbeddingError::Inference(format!("tokenising: {error}")))?;
        let rows = encodings.len();
        let columns = encodings
            .first()
            .map(|encoding| encoding.len())
            .unwrap_or_default();
        let mut input_ids = Vec::with_capacity(rows * columns);
        let mut type_ids = Vec::with_capacity(rows * columns);
        let mut attention_mask = Vec::with_capacity(rows * columns);
        for encoding in &encodings {
            if encoding.len() != columns {
                return Err(EmbeddingError::Inference(
                    "tokenizer returned a ragged batch".to_owned(),
                ));
            }
            input_ids.extend_from_slice(encoding.get_ids());
            type_ids.extend_from_slice(encoding.get_type_ids());
            attention_mask.extend_from_slice(encoding.get_attention_mask());
        }
        let vectors = self
            .forward(input_ids, type_ids, attention_mask, (rows, columns))
            .map_err(|error| EmbeddingError::Inference(format!("forward pass: {error}")))?;
        let mut vectors = vectors;
        for vector in &mut vectors {
            if vector.len() != self.dimension {
                return Err(EmbeddingError::DimensionMismatch {
                    expected: self.dimension,
                    actual: vector.len(),
                });
            }
            l2_normalize(vector);
        }
        Ok(vectors)
    }

    /// Runs the model and pools token vectors into one (unnormalised) vector per row.
    fn forward(
        &self,
        input_ids: Vec<u32>,
        type_ids: Vec<u32>,
        attention_mask: Vec<u32>,
        shape: (usize, usize),
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let input_ids = Tensor::from_vec(input_ids, shape, &self.device)?;
        let type_ids = Tensor::from_vec(type_ids, shape, &self.device)?;
        let attention_mask = Tensor::from_vec(attention_mask, shape, &self.device)?;
        // (batch, tokens, hidden)
        let hidden = self
            .model
            .forward(&input_ids, &type_ids, Some(&attention_mask))?;
        let pooled = match self.pooling {
            Pooling::Cls => hidden.i((.., 0))?,
            Pooling::Mean => {
                let mask = attention_mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
                // sentence-transformers clamps the token count the same way.
                let counts = mask.sum(1)?.clamp(1e-9f32, f32::MAX)?;
                summed.broadcast_div(&counts)?
            }
        };
        pooled.to_vec2::<f32>()
    }
}

/// Splits `texts` into batches of at most `batch_size` indices, longest texts first, so each
/// batch holds texts of similar length and pads little. Length in bytes stands in for tokens.
fn plan_batches(texts: &[String], batch_size: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&index| std::cmp::Reverse(texts[index].len()));
    order
        .chunks(batch_size.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

fn validate_options(options: &LocalEmbedderOptions) -> Result<(), EmbeddingError> {
    let invalid = |what: &str| EmbeddingError::ModelLoad(format!("invalid option: {what}"));
    if options.batch_size == 0 {
        return Err(invalid("batch_size must be at least 1"));
    }
    if options.max_concurrent_batches == 0 {
        return Err(invalid("max_concurrent_batches must be at least 1"));
    }
    // Room for [CLS], [SEP] and at least one token of text.
    if options.max_seq_len < 3 {
        return Err(invalid("max_seq_len must be at least 3"));
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EmbeddingError> {
    let bytes = std::fs::read(path).map_err(|error| {
        EmbeddingError::ModelLoad(format!("reading {}: {error}", path.display()))
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|error| EmbeddingError::ModelLoad(format!("parsing {}: {error}", path.display())))
}

/// Reads `1_Pooling/config.json`; mean pooling when it is absent (the sentence-transformers
/// default).
fn read_pooling(model_dir: &Path) -> Result<Pooling, EmbeddingError> {
    let path = model_dir.join("1_Pooling").join("config.json");
    if !path.is_file() {
        return Ok(Pooling::Mean);
    }
    let config: serde_json::Value = read_json(&path)?;
    let enabled = |key: &str| config.get(key).and_then(serde_json::Value::as_bool) == Some(true);
    let unsupported = [
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
        "pooling_mode_lasttoken",
    ];
    if let Some(mode) = unsupported.into_iter().find(|mode| enabled(mode)) {
        return Err(EmbeddingError::ModelLoad(format!(
            "{}: {mode} is not supported (mean or cls pooling only)",
            path.display()
        )));
    }
    match (
        enabled("pooling_mode_mean_tokens"),
        enabled("pooling_mode_cls_token"),
    ) {
        (true, false) => Ok(Pooling::Mean),
        (false, true) => Ok(Pooling::Cls),
        (mean, cls) => Err(EmbeddingError::ModelLoad(format!(
            "{}: exactly one of mean and cls pooling must be enabled (mean {mean}, cls {cls})",
            path.display()
        ))),
    }
}

/// Loads `tokenizer.json` and overrides its truncation and padding: the packaged MiniLM file
/// truncates and pads to 128 tokens while the model was trained for 256.
fn load_tokenizer(path: &Path, max_seq_len: usize) -> Result<Tokenizer, EmbeddingError> {
    let mut tokenizer = Tokenizer::from_file(path).map_err(|error| {
        EmbeddingError::ModelLoad(format!("loading {}: {error}", path.display()))
    })?;
    let truncation = TruncationParams {
        max_length: max_seq_len,
        ..tokenizer.get_truncation().cloned().unwrap_or_default()
    };
    tokenizer
        .with_truncation(Some(truncation))
        .map_err(|error| EmbeddingError::ModelLoad(format!("setting truncation: {error}")))?;
    let padding = PaddingParams {
        strategy: PaddingStrategy::BatchLongest,
        ..tokenizer.get_padding().cloned().unwrap_or_default()
    };
    tokenizer.with_padding(Some(padding));
    Ok(tokenizer)
}

#[cfg(test)]
mod tests;
