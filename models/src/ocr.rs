//! Text recognition (OCR) of images, by one of two engines:
//!
//! - **vision**: an OpenAI-compatible chat model that reads images (olmOCR, Qwen2.5-VL,
//!   dots.ocr behind vLLM or Ollama). `POST {base_url}/chat/completions` with one user message
//!   holding the instruction and the image as a `data:` URI (`image_url` content part),
//!   `temperature` 0; the answer's `choices[0].message.content` is the text.
//! - **tesseract**: the `tesseract` CLI (Debian `tesseract-ocr`, plus `tesseract-ocr-chi-sim`
//!   for Chinese), run as `tesseract stdin stdout -l LANGS` with `OMP_THREAD_LIMIT=1`, the
//!   image on its stdin, killed at the timeout.
//!
//! [`Ocr`] holds the engines a node has, picks one for a KB's `ocr` setting
//! ([`Ocr::engine_for`]), bounds the images in flight on the node (`max_in_flight`), and
//! retries transient failures (connection errors, timeouts, 408, 429, 5xx) with exponential
//! backoff (`backon`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tracing::warn;

/// What the vision model is asked.
const VISION_PROMPT: &str = "Transcribe all of the text in this image, exactly as written, \
in reading order. Keep headings, lists and tables (as Markdown tables). Output only the text, \
with no comment; output nothing if the image has no text.";
/// Most bytes of recognised text kept from one image.
const MAX_TEXT_BYTES: usize = 4 << 20;

/// A node's OCR settings (`[ocr]` in the node config).
#[derive(Clone, Debug)]
pub struct OcrConfig {
    /// The vision model, if one is configured.
    pub vision: Option<VisionConfig>,
    /// The tesseract command (`tesseract` on the PATH by default); `None` turns it off.
    pub tesseract: Option<TesseractConfig>,
    /// Per image and attempt: the request or the process, start to end.
    pub timeout: Duration,
    /// Retries of a transient failure after the first attempt.
    pub retries: u32,
    /// Images being recognised at once on this node, all KBs together.
    pub max_in_flight: usize,
}

impl Default for OcrConfig {
    fn default() -> Self {
        OcrConfig {
            vision: None,
            tesseract: Some(TesseractConfig::default()),
            timeout: Duration::from_secs(120),
            retries: 2,
            max_in_flight: 2,
        }
    }
}

/// An OpenAI-compatible vision model.
#[derive(Clone)]
pub struct VisionConfig {
    /// API root including the version, e.g. `http://localhost:8000/v1`.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer <api_key>` when set.
    pub api_key: Option<String>,
    /// `max_tokens` of one image's answer.
    pub max_tokens: u32,
}

impl std::fmt::Debug for VisionConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("VisionConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

/// The tesseract CLI.
#[derive(Clone, Debug)]
pub struct TesseractConfig {
    /// The program: a name looked up on the PATH, or a path.
    pub command: PathBuf,
    /// `-l` of tesseract: `eng`, `chi_sim`, `eng+chi_sim`, ...
    pub languages: String,
}

impl Default for TesseractConfig {
    fn default() -> Self {
        TesseractConfig {
            command: PathBuf::from("tesseract"),
            languages: "eng".to_string(),
        }
    }
}

/// An OCR engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OcrEngine {
    Vision,
    Tesseract,
}

impl OcrEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            OcrEngine::Vision => "vision",
            OcrEngine::Tesseract => "tesseract",
        }
    }
}

/// The values of a KB's `ocr` setting.
pub const OCR_SETTINGS: &[&str] = &["auto", "off", "vision", "tesseract"];

/// Why an image was not recognised.
#[derive(Debug, thiserror::Error)]
pub enum OcrError {
    #[error("no OCR engine: {0}")]
    Unavailable(String),
    #[error("the OCR engine did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the vision model's server answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the vision model could not be reached: {0}")]
    Unreachable(String),
    #[error("the vision model's answer is not usable: {0}")]
    BadResponse(String),
    #[error("tesseract failed: {0}")]
    Tesseract(String),
}

impl OcrError {
    /// Whether trying again later may succeed (the service is away or overloaded).
    pub fn is_transient(&self) -> bool {
        match self {
            OcrError::Timeout(_) | OcrError::Unreachable(_) => true,
            OcrError::Status { status, .. } => {
                matches!(status, 408 | 429) || (500..600).contains(status)
            }
            OcrError::Unavailable(_) | OcrError::BadResponse(_) | OcrError::Tesseract(_) => false,
        }
    }
}

/// The OCR engines of a node.
pub struct Ocr {
    vision: Option<VisionConfig>,
    tesseract: Option<TesseractConfig>,
    http: reqwest::Client,
    timeout: Duration,
    retries: u32,
    permits: Semaphore,
}

impl std::fmt::Debug for Ocr {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Ocr")
            .field("vision", &self.vision)
            .field("tesseract", &self.tesseract)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl Ocr {
    /// The engines of `config` that are usable here: the vision model as configured (it is
    /// reached only when used), tesseract when `command --version` runs.
    pub async fn start(config: OcrConfig) -> Ocr {
        let tesseract = match config.tesseract {
            Some(tesseract) if runs(&tesseract.command).await => Some(tesseract),
            Some(tesseract) => {
                tracing::info!(
                    command = %tesseract.command.display(),
                    "tesseract is not installed: OCR by tesseract is off"
                );
                None
            }
            None => None,
        };
        Ocr::new(OcrConfig {
            tesseract,
            ..config
        })
    }

    /// The engines of `config`, taken as they are (tesseract is not probed).
    pub fn new(config: OcrConfig) -> Ocr {
        Ocr {
            vision: config.vision,
            tesseract: config.tesseract,
            http: reqwest::Client::new(),
            timeout: config.timeout,
            retries: config.retries,
            permits: Semaphore::new(config.max_in_flight.max(1)),
        }
    }

    /// No engine at all.
    pub fn none() -> Ocr {
        Ocr::new(OcrConfig {
            tesseract: None,
            ..OcrConfig::default()
        })
    }

    /// The engine a KB's `ocr` setting selects on this node: `auto` takes the vision model if
    /// one is configured, else tesseract; `off` none; a named engine only if this node has it.
    pub fn engine_for(&self, setting: &str) -> Result<OcrEngine, OcrError> {
        let vision = self.vision.is_some().then_some(OcrEngine::Vision);
        let tesseract = self.tesseract.is_some().then_some(OcrEngine::Tesseract);
        match setting {
            "off" => Err(OcrError::Unavailable(
                "the knowledge base's `ocr` setting is off".into(),
            )),
            "vision" => vision.ok_or_else(|| {
                OcrError::Unavailable("no vision model is configured ([ocr] vision_url)".into())
            }),
            "tesseract" => tesseract.ok_or_else(|| {
                OcrError::Unavailable("tesseract is not installed on this node".into())
            }),
            _ => vision.or(tesseract).ok_or_else(|| {
                OcrError::Unavailable(
                    "neither a vision model ([ocr] vision_url) nor tesseract is available".into(),
                )
            }),
        }
    }

    /// The text of one image (`media_type` `image/png`, ...), by `engine`, within the node's
    /// bound on images in flight; transient failures are retried.
    pub async fn recognize(
        &self,
        engine: OcrEngine,
        image: &[u8],
        media_type: &str,
    ) -> Result<String, OcrError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| OcrError::Unavailable("the node is shutting down".into()))?;
        let started = Instant::now();
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(self.retries as usize)
            .with_jitter();
        let outcome = (|| async {
            match engine {
                OcrEngine::Vision => self.vision_once(image, media_type).await,
                OcrEngine::Tesseract => self.tesseract_once(image).await,
            }
        })
        .retry(backoff)
        .when(OcrError::is_transient)
        .notify(|error, wait| warn!(%error, ?wait, engine = engine.as_str(), "OCR retried"))
        .await;
        let label = if outcome.is_ok() { "ok" } else { "error" };
        metrics::counter!("sift_ocr_images_total", "engine" => engine.as_str(), "outcome" => label)
            .increment(1);
        metrics::histogram!("sift_ocr_seconds", "engine" => engine.as_str())
            .record(started.elapsed().as_secs_f64());
        outcome.map(|text| clean(&text))
    }

    async fn vision_once(&self, image: &[u8], media_type: &str) -> Result<String, OcrError> {
        let vision = self
            .vision
            .as_ref()
            .ok_or_else(|| OcrError::Unavailable("no vision model is configured".into()))?;
        let data = base64::engine::general_purpose::STANDARD.encode(image);
        let body = json!({
            "model": vision.model,
            "temperature": 0,
            "max_tokens": vision.max_tokens,
            "messages": [{
                "role": "user",
                "content": [
                    { "type": "text", "text": VISION_PROMPT },
                    { "type": "image_url", "image_url": { "url": format!("data:{media_type};base64,{data}") } },
                ],
            }],
        });
        let url = format!("{}/chat/completions", vision.base_url.trim_end_matches('/'));
        let mut request = self.http.post(url).timeout(self.timeout).json(&body);
        if let Some(key) = &vision.api_key {
            request = request.bearer_auth(key);
        }
        let response = request
            .send()
            .await
            .map_err(|error| self.transport(&error))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.transport(&error))?;
        if !status.is_success() {
            return Err(OcrError::Status {
                status: status.as_u16(),
                message: crate::llm::error_detail(&bytes)
                    .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string()),
            });
        }
        let answer: ChatAnswer = serde_json::from_slice(&bytes)
            .map_err(|error| OcrError::BadResponse(format!("not a chat completion: {error}")))?;
        let choice = answer
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| OcrError::BadResponse("no choices".into()))?;
        Ok(choice.message.content.unwrap_or_default())
    }

    fn transport(&self, error: &reqwest::Error) -> OcrError {
        if error.is_timeout() {
            OcrError::Timeout(self.timeout)
        } else {
            OcrError::Unreachable(crate::error_chain(error))
        }
    }

    async fn tesseract_once(&self, image: &[u8]) -> Result<String, OcrError> {
        let tesseract = self
            .tesseract
            .as_ref()
            .ok_or_else(|| OcrError::Unavailable("tesseract is not installed".into()))?;
        let mut child = tokio::process::Command::new(&tesseract.command)
            .args(["stdin", "stdout", "-l", &tesseract.languages])
            // One thread per run: pages run side by side (`max_in_flight`), and tesseract's
            // OpenMP threads on top of that oversubscribe the cores (tesseract's own advice
            // for parallel runs).
            .env("OMP_THREAD_LIMIT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| OcrError::Tesseract(format!("cannot start it: {error}")))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(OcrError::Tesseract("its pipes did not open".into()));
        };
        let run = async {
            let feed = async {
                // tesseract may stop reading early (an image it refuses): not our error.
                let _ = stdin.write_all(image).await;
                drop(stdin);
            };
            let mut text = Vec::new();
            let mut errors = Vec::new();
            let mut stdout = stdout.take(MAX_TEXT_BYTES as u64);
            let mut stderr = stderr.take(64 << 10);
            let read = stdout.read_to_end(&mut text);
            let read_errors = stderr.read_to_end(&mut errors);
            let ((), read, _) = tokio::join!(feed, read, read_errors);
            read.map_err(|error| OcrError::Tesseract(format!("reading its output: {error}")))?;
            let status = child
                .wait()
                .await
                .map_err(|error| OcrError::Tesseract(error.to_string()))?;
            if !status.success() {
                let errors = String::from_utf8_lossy(&errors);
                let last = errors.lines().rev().find(|line| !line.trim().is_empty());
                return Err(OcrError::Tesseract(format!(
                    "{status}: {}",
                    last.unwrap_or("no message")
                )));
            }
            Ok(String::from_utf8_lossy(&text).into_owned())
        };
        // On timeout the future is dropped with the child, which kill_on_drop kills.
        tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| OcrError::Timeout(self.timeout))?
    }
}

/// Whether `command --version` runs and succeeds.
async fn runs(command: &std::path::Path) -> bool {
    let probe = tokio::process::Command::new(command)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), probe).await,
        Ok(Ok(status)) if status.success()
    )
}

/// Recognised text as we index it: a Markdown fence around the whole answer removed (vision
/// models add one), form feeds (tesseract's page ends) as blank lines, at most
/// [`MAX_TEXT_BYTES`], trimmed.
fn clean(text: &str) -> String {
    let mut text = text.trim();
    if let Some(inner) = text.strip_prefix("```") {
        let inner = inner.split_once('\n').map_or("", |(_, rest)| rest);
        text = inner.trim_end().strip_suffix("```").unwrap_or(inner).trim();
    }
    let mut text = text.replace('\u{c}', "\n\n");
    if text.len() > MAX_TEXT_BYTES {
        let mut cut = MAX_TEXT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text.trim().to_string()
}

/// Describes the OCR metrics to the recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sift_ocr_images_total",
        "Images recognised by OCR, by engine and outcome (ok, error)."
    );
    metrics::describe_histogram!(
        "sift_ocr_seconds",
        metrics::Unit::Seconds,
        "Time to recognise one image, retries and the wait for a slot included, by engine."
    );
}

#[derive(Deserialize)]
struct ChatAnswer {
    choices: Vec<ChatChoice>,
}

#[derive(Deserialize)]
struct ChatChoice {
    message: ChatMessage,
}

#[derive(Deserialize)]
struct ChatMessage {
    content: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_picks_an_engine_this_node_has() {
        let both = Ocr::new(OcrConfig {
            vision: Some(VisionConfig {
                base_url: "http://127.0.0.1:9/v1".into(),
                model: "m".into(),
                api_key: None,
                max_tokens: 100,
            }),
            ..OcrConfig::default()
        });
        assert_eq!(both.engine_for("auto").unwrap(), OcrEngine::Vision);
        assert_eq!(both.engine_for("tesseract").unwrap(), OcrEngine::Tesseract);
        assert!(matches!(
            both.engine_for("off"),
            Err(OcrError::Unavailable(_))
        ));
        let none = Ocr::none();
        let error = none.engine_for("auto").unwrap_err();
        assert!(error.to_string().contains("neither"), "{error}");
        assert!(none.engine_for("vision").is_err());
    }

    #[test]
    fn answers_lose_their_fence_and_page_breaks() {
        assert_eq!(
            clean("```markdown\n# Title\n\ntext\n```\n"),
            "# Title\n\ntext"
        );
        assert_eq!(clean("page one\u{c}page two\n"), "page one\n\npage two");
        assert_eq!(clean("  \n"), "");
    }

    #[test]
    fn only_service_trouble_is_transient() {
        assert!(OcrError::Timeout(Duration::from_secs(1)).is_transient());
        assert!(
            OcrError::Status {
                status: 503,
                message: String::new()
            }
            .is_transient()
        );
        assert!(
            !OcrError::Status {
                status: 400,
                message: String::new()
            }
            .is_transient()
        );
        assert!(!OcrError::Tesseract("bad image".into()).is_transient());
    }
}
