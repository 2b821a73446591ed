//! A client for any OpenAI-compatible embeddings endpoint (OpenAI, vLLM, Ollama, TEI, ...).
//!
//! Wire format: `POST {base_url}/embeddings` with `{"model", "input": [texts]}`, answered by
//! `{"data": [{"index", "embedding": [floats]}], ...}`. Inputs are sent in batches of
//! `batch_size`, one batch at a time. Each request has the configured timeout; transient
//! failures (connection errors, timeouts, 408, 429, 5xx) are retried up to `max_retries` times
//! with jittered exponential backoff (backon), honouring `Retry-After` (seconds or an HTTP-date,
//! at most 10 s) when the server sends it.

use std::time::{Duration, Instant, SystemTime};

use backon::Retryable;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use tracing::{debug, instrument, warn};

use super::{Backend, EmbeddingError, is_transient_status, l2_normalize, record_batch};

/// First retry waits about this long; each further retry doubles it.
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// No single wait between retries is longer, whatever the server's `Retry-After` says.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The text sent to discover the dimension when it is not configured.
const PROBE_TEXT: &str = "dimension probe";

/// Where and how to reach the remote embedder.
#[derive(Clone)]
pub struct OpenAiEmbedderConfig {
    /// API root including the version, e.g. `http://localhost:8000/v1`; requests go to
    /// `{base_url}/embeddings`.
    pub base_url: String,
    /// Sent as `model` in every request, and reported as the embedder's model name.
    pub model: String,
    /// Sent as `Authorization: Bearer <api_key>` when set.
    pub api_key: Option<String>,
    /// Expected vector length; when `None` (or 0), [`OpenAiEmbedder::connect`] asks the
    /// endpoint.
    pub dimension: Option<usize>,
    /// Per request, from connecting to the last byte of the body.
    pub timeout: Duration,
    /// Retries of one batch after its first attempt, for transient failures only.
    pub max_retries: u32,
    /// Texts per request (0 counts as 1).
    pub batch_size: usize,
}

impl OpenAiEmbedderConfig {
    /// A config with laptop-friendly defaults: no key, probed dimension, 30 s timeout,
    /// 3 retries, 64 texts per request.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiEmbedderConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            dimension: None,
            timeout: Duration::from_secs(30),
            max_retries: 3,
            batch_size: 64,
        }
    }
}

impl std::fmt::Debug for OpenAiEmbedderConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OpenAiEmbedderConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("dimension", &self.dimension)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

/// A connected remote embedder.
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    endpoint: String,
    config: OpenAiEmbedderConfig,
    dimension: usize,
}

impl std::fmt::Debug for OpenAiEmbedder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OpenAiEmbedder")
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .field("dimension", &self.dimension)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [String],
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    /// Position of the input this vector belongs to; servers may answer out of order.
    index: Option<usize>,
    embedding: Vec<f32>,
}

/// One failed attempt, with the server's hint on when to retry.
struct AttemptFailure {
    error: EmbeddingError,
    retry_after: Option<Duration>,
}

impl From<EmbeddingError> for AttemptFailure {
    fn from(error: EmbeddingError) -> Self {
        AttemptFailure {
            error,
            retry_after: None,
        }
    }
}

impl OpenAiEmbedder {
    /// Builds the client and, when `config.dimension` is `None`, sends one probe request to
    /// learn the dimension (so an unreachable or misconfigured endpoint fails here).
    #[instrument(skip_all, fields(base_url = %config.base_url, model = %config.model))]
    pub async fn connect(config: OpenAiEmbedderConfig) -> Result<Self, EmbeddingError> {
        let config = OpenAiEmbedderConfig {
            batch_size: config.batch_size.max(1),
            dimension: config.dimension.filter(|&dimension| dimension > 0),
            ..config
        };
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|error| EmbeddingError::Http {
                status: None,
                message: format!("building the http client: {error}"),
            })?;
        let endpoint = format!("{}/embeddings", config.base_url.trim_end_matches('/'));
        let mut embedder = OpenAiEmbedder {
            client,
            endpoint,
            dimension: config.dimension.unwrap_or_default(),
            config,
        };
        if embedder.config.dimension.is_none() {
            let probe = [PROBE_TEXT.to_owned()];
            let vectors = embedder.post_with_retries(&probe, None).await?;
            embedder.dimension = vectors.first().map(Vec::len).unwrap_or_default();
            debug!(dimension = embedder.dimension, "embedding dimension probed");
        }
        Ok(embedder)
    }

    /// The configured remote model name.
    pub fn model_name(&self) -> &str {
        &self.config.model
    }

    /// Vector length: configured, or probed at [`OpenAiEmbedder::connect`].
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Embeds `texts` in batches of `batch_size`, one request at a time; the first batch that
    /// still fails after its retries fails the call.
    #[instrument(skip_all, fields(texts = texts.len(), model = %self.config.model))]
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        let mut vectors = Vec::with_capacity(texts.len());
        for batch in texts.chunks(self.config.batch_size) {
            let started = Instant::now();
            let outcome = self.post_with_retries(batch, Some(self.dimension)).await;
            record_batch(Backend::OpenAi, batch.len(), started.elapsed(), &outcome);
            vectors.extend(outcome?);
        }
        Ok(vectors)
    }

    /// One batch, retried while the failure is transient and retries remain. A batch that
    /// keeps getting 429 or 503 ends as [`EmbeddingError::Overloaded`].
    async fn post_with_retries(
        &self,
        texts: &[String],
        expected_dimension: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, EmbeddingError> {
        let mut retry = 0;
        let outcome = (|| self.post_once(texts, expected_dimension))
            .retry(crate::jittered_backoff(
                INITIAL_BACKOFF,
                MAX_BACKOFF,
                self.config.max_retries,
            ))
            .when(|failure| failure.error.is_transient())
            // The server's Retry-After replaces our wait, capped like it.
            .adjust(|failure, delay| {
                delay.map(|delay| failure.retry_after.unwrap_or(delay).min(MAX_BACKOFF))
            })
            .notify(|failure, delay| {
                retry += 1;
                warn!(
                    retry,
                    max_retries = self.config.max_retries,
                    delay_ms = delay.as_millis() as u64,
                    error = %failure.error,
                    "embedding request failed, retrying"
                );
            })
            .await;
        outcome.map_err(|failure| match failure.error {
            EmbeddingError::Http {
                status: Some(429 | 503),
                ..
            } => EmbeddingError::Overloaded,
            error => error,
        })
    }

    /// One HTTP request for one batch, with the response checked against the wire format.
    async fn post_once(
        &self,
        texts: &[String],
        expected_dimension: Option<usize>,
    ) -> Result<Vec<Vec<f32>>, AttemptFailure> {
        let mut request = self.client.post(&self.endpoint).json(&EmbeddingsRequest {
            model: &self.config.model,
            input: texts,
        });
        if let Some(api_key) = &self.config.api_key {
            request = request.bearer_auth(api_key);
        }
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status();
        let retry_after = parse_retry_after(response.headers(), SystemTime::now());
        let body = response.bytes().await.map_err(transport_error)?;
        if !status.is_success() {
            return Err(AttemptFailure {
                error: EmbeddingError::Http {
                    status: Some(status.as_u16()),
                    message: error_message(status, &body),
                },
                retry_after: retry_after.filter(|_| is_transient_status(status.as_u16())),
            });
        }
        let response: EmbeddingsResponse = serde_json::from_slice(&body).map_err(|error| {
            EmbeddingError::BadResponse(format!("not an embeddings response: {error}"))
        })?;
        Ok(order_and_check(
            response.data,
            texts.len(),
            expected_dimension,
        )?)
    }
}

/// Puts the vectors in input order, checks there is exactly one per input, all of one
/// (expected) length and finite, and L2-normalises them.
fn order_and_check(
    data: Vec<EmbeddingItem>,
    inputs: usize,
    expected_dimension: Option<usize>,
) -> Result<Vec<Vec<f32>>, EmbeddingError> {
    if data.len() != inputs {
        return Err(EmbeddingError::BadResponse(format!(
            "{} embeddings for {inputs} inputs",
            data.len()
        )));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for (position, item) in data.into_iter().enumerate() {
        let index = item.index.unwrap_or(position);
        let slot = slots.get_mut(index).ok_or_else(|| {
            EmbeddingError::BadResponse(format!("index {index} out of range for {inputs} inputs"))
        })?;
        if slot.is_some() {
            return Err(EmbeddingError::BadResponse(format!(
                "index {index} appears twice"
            )));
        }
        *slot = Some(item.embedding);
    }
    let expected = match expected_dimension {
        Some(expected) => expected,
        None => slots.first().and_then(Option::as_ref).map_or(0, Vec::len),
    };
    if expected == 0 {
        return Err(EmbeddingError::BadResponse("empty embedding".to_owned()));
    }
    slots
        .into_iter()
        .map(|slot| {
            // Every slot is filled: as many items as slots, and no index twice.
            let mut vector = slot.unwrap_or_default();
            if vector.len() != expected {
                return Err(EmbeddingError::DimensionMismatch {
                    expected,
                    actual: vector.len(),
                });
            }
            if vector.iter().any(|value| !value.is_finite()) {
                return Err(EmbeddingError::BadResponse(
                    "embedding holds a non-finite number".to_owned(),
                ));
            }
            l2_normalize(&mut vector);
            Ok(vector)
        })
        .collect()
}

fn transport_error(error: reqwest::Error) -> AttemptFailure {
    if error.is_timeout() {
        return EmbeddingError::Timeout.into();
    }
    EmbeddingError::Http {
        status: error.status().map(|status| status.as_u16()),
        message: crate::error_chain(&error),
    }
    .into()
}

/// The server's explanation: OpenAI's `{"error": {"message"}}`, a bare `{"error": "..."}`, or
/// the start of the body, after the status.
fn error_message(status: StatusCode, body: &[u8]) -> String {
    match crate::llm::error_detail(body) {
        Some(detail) => format!("{status}: {detail}"),
        None => status.to_string(),
    }
}

/// `Retry-After` as a wait from `now`: delta-seconds or an HTTP-date (RFC 9110 10.2.3). A date
/// already past, or a value of neither form, gives none (our own backoff applies).
fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    match value.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .ok(),
    }
}

#[cfg(test)]
mod tests;
