//! Text recognition (OCR) of images, by one of two engines:
//!
//! - **vision**: an OpenAI-compatible chat model that reads images (olmOCR, Qwen2.5-VL,
//!   dots.ocr behind vLLM or Ollama). `POST {base_url}/chat/completions` with one user message
//!   holding the instruction and the image as a `data:` URI (`image_url` content part),
//!   `temperature` 0; the answer's `choices[0].message.content` is the text.
//!   A TIFF is sent as PNG (converted here): most servers take only PNG, JPEG and WebP.
//! - **tesseract**: the `tesseract` CLI (Debian `tesseract-ocr`, plus `tesseract-ocr-chi-sim`
//!   for Chinese), run as `tesseract stdin stdout -l LANGS` with `OMP_THREAD_LIMIT=1`, the
//!   image on its stdin, killed at the timeout. A KB whose language is `zh` reads with
//!   `chi_sim` first when it is installed ([`Ocr::recognize`]).
//!
//! [`Ocr`] holds the engines a node has, picks one for a KB's `ocr` setting
//! ([`Ocr::engine_for`]), bounds the images in flight on the node (`max_in_flight`), and
//! retries transient failures (connection errors, timeouts, 408, 429, 5xx) with exponential
//! backoff (`backon`). It also renders a PDF page to an image for them with the `pdftoppm`
//! CLI (Debian `poppler-utils`) when installed ([`Ocr::render_page`]): a scanned page that no
//! one image holds (a tiled scan, text drawn as shapes).

use std::path::{Path, PathBuf};
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
/// Resolution a page is rendered at, in dots per inch, unless that passes the pixel cap.
const RENDER_DPI: u64 = 150;
/// Most pixels of a rendered page: its resolution is lowered to stay under it.
const MAX_RENDER_PIXELS: u64 = 40_000_000;
/// Most pixels a side of a rendered page (`pdftoppm -W -H`), whatever its size is said to be.
const MAX_RENDER_SIDE: u64 = 10_000;
/// Most bytes of a rendered page's PNG read from `pdftoppm`.
const MAX_RENDER_BYTES: u64 = 256 << 20;
/// Most pixels of a TIFF converted to PNG for the vision model (as an image upload's cap).
const MAX_CONVERTED_PIXELS: u64 = 100_000_000;
/// Most memory the conversion of one TIFF may take.
const MAX_CONVERSION_BYTES: u64 = 1 << 30;

/// A node's OCR settings (`[ocr]` in the node config).
#[derive(Clone, Debug)]
pub struct OcrConfig {
    /// The vision model, if one is configured.
    pub vision: Option<VisionConfig>,
    /// The tesseract command (`tesseract` on the PATH by default); `None` turns it off.
    pub tesseract: Option<TesseractConfig>,
    /// The `pdftoppm` command that renders a scanned PDF page no one image holds (`pdftoppm`
    /// on the PATH by default, used when `pdftoppm -v` runs); `None` turns it off.
    pub pdftoppm: Option<PathBuf>,
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
            pdftoppm: Some(PathBuf::from("pdftoppm")),
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
    #[error("the image cannot be converted for the vision model: {0}")]
    Conversion(String),
    #[error("the page could not be rendered: {0}")]
    Render(String),
}

impl OcrError {
    /// Whether trying again later may succeed (the service is away or overloaded).
    pub fn is_transient(&self) -> bool {
        match self {
            OcrError::Timeout(_) | OcrError::Unreachable(_) => true,
            OcrError::Status { status, .. } => {
                matches!(status, 408 | 429) || (500..600).contains(status)
            }
            // A page that pdftoppm cannot render in time will not render later either.
            OcrError::Unavailable(_)
            | OcrError::BadResponse(_)
            | OcrError::Tesseract(_)
            | OcrError::Conversion(_)
            | OcrError::Render(_) => false,
        }
    }
}

/// The OCR engines of a node.
pub struct Ocr {
    vision: Option<VisionConfig>,
    tesseract: Option<TesseractConfig>,
    /// The languages tesseract has installed (`--list-langs`), when probed.
    tesseract_installed: Vec<String>,
    pdftoppm: Option<PathBuf>,
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
            .field("tesseract_installed", &self.tesseract_installed)
            .field("pdftoppm", &self.pdftoppm)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

impl Ocr {
    /// The engines of `config` that are usable here: the vision model as configured (it is
    /// reached only when used), tesseract when `command --version` runs (with the languages
    /// it lists), pdftoppm when `pdftoppm -v` runs.
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
        let tesseract_installed = match &tesseract {
            Some(tesseract) => installed_languages(&tesseract.command).await,
            None => Vec::new(),
        };
        let pdftoppm = match config.pdftoppm {
            Some(command) if runs_with(&command, "-v").await => Some(command),
            Some(command) => {
                tracing::info!(
                    command = %command.display(),
                    "pdftoppm is not installed: scanned PDF pages are not rendered"
                );
                None
            }
            None => None,
        };
        Ocr {
            tesseract_installed,
            ..Ocr::new(OcrConfig {
                tesseract,
                pdftoppm,
                ..config
            })
        }
    }

    /// The engines of `config`, taken as they are (tesseract and pdftoppm are not probed).
    pub fn new(config: OcrConfig) -> Ocr {
        Ocr {
            vision: config.vision,
            tesseract: config.tesseract,
            tesseract_installed: Vec::new(),
            pdftoppm: config.pdftoppm,
            http: reqwest::Client::new(),
            timeout: config.timeout,
            retries: config.retries,
            permits: Semaphore::new(config.max_in_flight.max(1)),
        }
    }

    /// No engine at all, and no renderer.
    pub fn none() -> Ocr {
        Ocr::new(OcrConfig {
            tesseract: None,
            pdftoppm: None,
            ..OcrConfig::default()
        })
    }

    /// Whether this node renders PDF pages ([`Ocr::render_page`]).
    pub fn renders_pages(&self) -> bool {
        self.pdftoppm.is_some()
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
    /// bound on images in flight; transient failures are retried. `language` is the KB's
    /// language hint (`auto`, `en`, `zh`): `zh` puts `chi_sim` before tesseract's languages
    /// when it is installed.
    pub async fn recognize(
        &self,
        engine: OcrEngine,
        image: &[u8],
        media_type: &str,
        language: &str,
    ) -> Result<String, OcrError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| OcrError::Unavailable("the node is shutting down".into()))?;
        let started = Instant::now();
        // The vision model gets PNG for a TIFF (converted once, before any attempt).
        let converted = match engine {
            OcrEngine::Vision if media_type == "image/tiff" => Some(tiff_to_png(image).await?),
            _ => None,
        };
        let (image, media_type) = match &converted {
            Some(png) => (png.as_slice(), "image/png"),
            None => (image, media_type),
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(10))
            .with_max_times(self.retries as usize)
            .with_jitter();
        let outcome = (|| async {
            match engine {
                OcrEngine::Vision => self.vision_once(image, media_type).await,
                OcrEngine::Tesseract => self.tesseract_once(image, language).await,
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

    /// tesseract's `-l` for a KB of `language`: the configured languages, after `chi_sim`
    /// for `zh` when it is installed and not among them.
    fn tesseract_languages(&self, tesseract: &TesseractConfig, language: &str) -> String {
        let configured = &tesseract.languages;
        let chinese = language == "zh"
            && self
                .tesseract_installed
                .iter()
                .any(|name| name == "chi_sim")
            && !configured.split('+').any(|name| name == "chi_sim");
        if chinese {
            format!("chi_sim+{configured}")
        } else {
            configured.clone()
        }
    }

    async fn tesseract_once(&self, image: &[u8], language: &str) -> Result<String, OcrError> {
        let tesseract = self
            .tesseract
            .as_ref()
            .ok_or_else(|| OcrError::Unavailable("tesseract is not installed".into()))?;
        let languages = self.tesseract_languages(tesseract, language);
        let mut child = tokio::process::Command::new(&tesseract.command)
            .args(["stdin", "stdout", "-l", &languages])
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

impl Ocr {
    /// Page `page` (1-based) of the PDF at `pdf` as a PNG, rendered by `pdftoppm` at 150 dpi,
    /// lower when `size_points` (the page's size) says that passes 40 megapixels, and never
    /// more than 10,000 pixels a side. Within the node's bound on images in flight; the
    /// process is killed at the timeout. Nothing is retried: a page that fails to render
    /// will fail again.
    pub async fn render_page(
        &self,
        pdf: &Path,
        page: u32,
        size_points: Option<(u32, u32)>,
    ) -> Result<Vec<u8>, OcrError> {
        let command = self
            .pdftoppm
            .as_ref()
            .ok_or_else(|| OcrError::Unavailable("pdftoppm is not installed".into()))?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| OcrError::Unavailable("the node is shutting down".into()))?;
        let started = Instant::now();
        let page = page.to_string();
        let dpi = render_dpi(size_points).to_string();
        let side = MAX_RENDER_SIDE.to_string();
        // Without an output root, pdftoppm -singlefile writes the image to its stdout.
        let mut child = tokio::process::Command::new(command)
            .args([
                "-f", &page, "-l", &page, "-r", &dpi, "-W", &side, "-H", &side,
            ])
            .args(["-gray", "-png", "-singlefile"])
            .arg(pdf)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| OcrError::Render(format!("cannot start pdftoppm: {error}")))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(OcrError::Render("pdftoppm's pipes did not open".into()));
        };
        let run = async {
            let mut image = Vec::new();
            let mut errors = Vec::new();
            let mut stdout = stdout.take(MAX_RENDER_BYTES + 1);
            let mut stderr = stderr.take(64 << 10);
            let (read, _) = tokio::join!(
                stdout.read_to_end(&mut image),
                stderr.read_to_end(&mut errors)
            );
            read.map_err(|error| OcrError::Render(format!("reading pdftoppm: {error}")))?;
            if image.len() as u64 > MAX_RENDER_BYTES {
                return Err(OcrError::Render(format!(
                    "the image is larger than {MAX_RENDER_BYTES} bytes"
                )));
            }
            let status = child
                .wait()
                .await
                .map_err(|error| OcrError::Render(error.to_string()))?;
            if !status.success() || image.is_empty() {
                let errors = String::from_utf8_lossy(&errors);
                let last = errors.lines().rev().find(|line| !line.trim().is_empty());
                return Err(OcrError::Render(format!(
                    "pdftoppm {status}: {}",
                    last.unwrap_or("no image")
                )));
            }
            Ok(image)
        };
        // On timeout the future is dropped with the child, which kill_on_drop kills.
        let outcome = tokio::time::timeout(self.timeout, run)
            .await
            .unwrap_or_else(|_| {
                Err(OcrError::Render(format!(
                    "pdftoppm did not finish within {:?}",
                    self.timeout
                )))
            });
        let label = if outcome.is_ok() { "ok" } else { "error" };
        metrics::counter!("sift_ocr_rendered_pages_total", "outcome" => label).increment(1);
        metrics::histogram!("sift_ocr_render_seconds").record(started.elapsed().as_secs_f64());
        outcome
    }
}

/// The resolution a page of `size_points` is rendered at: [`RENDER_DPI`], lowered so that
/// the page stays under [`MAX_RENDER_PIXELS`], at least 1.
fn render_dpi(size_points: Option<(u32, u32)>) -> u64 {
    let Some((width, height)) = size_points else {
        return RENDER_DPI;
    };
    let square_inches = (f64::from(width) / 72.0) * (f64::from(height) / 72.0);
    if square_inches <= 0.0 {
        return RENDER_DPI;
    }
    let fitting = (MAX_RENDER_PIXELS as f64 / square_inches).sqrt().floor() as u64;
    fitting.clamp(1, RENDER_DPI)
}

/// A TIFF as PNG, decoded under the pixel and memory caps, off the async runtime.
async fn tiff_to_png(tiff: &[u8]) -> Result<Vec<u8>, OcrError> {
    let tiff = tiff.to_vec();
    tokio::task::spawn_blocking(move || {
        // A reader under the memory cap (one reads the header, a second decodes).
        let reader = || {
            let mut reader = image::ImageReader::with_format(
                std::io::Cursor::new(tiff.as_slice()),
                image::ImageFormat::Tiff,
            );
            let mut limits = image::Limits::default();
            limits.max_alloc = Some(MAX_CONVERSION_BYTES);
            reader.limits(limits);
            reader
        };
        let (width, height) = reader()
            .into_dimensions()
            .map_err(|error| OcrError::Conversion(error.to_string()))?;
        if u64::from(width) * u64::from(height) > MAX_CONVERTED_PIXELS {
            return Err(OcrError::Conversion(format!(
                "{width} × {height} pixels is more than {MAX_CONVERTED_PIXELS}"
            )));
        }
        let decoded = reader()
            .decode()
            .map_err(|error| OcrError::Conversion(error.to_string()))?;
        let mut png = Vec::new();
        decoded
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|error| OcrError::Conversion(error.to_string()))?;
        Ok(png)
    })
    .await
    .map_err(|error| OcrError::Conversion(format!("the conversion failed: {error}")))?
}

/// The languages tesseract lists as installed (`--list-langs`: a header line, then one a
/// line); none when it does not answer.
async fn installed_languages(command: &Path) -> Vec<String> {
    let probe = tokio::process::Command::new(command)
        .arg("--list-langs")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), probe).await {
        Ok(Ok(output)) if output.status.success() => String::from_utf8_lossy(&output.stdout)
            .lines()
            .skip(1)
            .map(|line| line.trim().to_string())
            .filter(|line| !line.is_empty())
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `command --version` runs and succeeds.
async fn runs(command: &Path) -> bool {
    runs_with(command, "--version").await
}

/// Whether `command probe` runs and succeeds.
async fn runs_with(command: &Path, probe: &str) -> bool {
    let probe = tokio::process::Command::new(command)
        .arg(probe)
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
    metrics::describe_counter!(
        "sift_ocr_rendered_pages_total",
        "PDF pages rendered by pdftoppm for OCR, by outcome (ok, error)."
    );
    metrics::describe_histogram!(
        "sift_ocr_render_seconds",
        metrics::Unit::Seconds,
        "Time to render one PDF page for OCR, the wait for a slot included."
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
    fn a_chinese_kb_reads_with_chi_sim_first_when_it_is_installed() {
        let mut ocr = Ocr::new(OcrConfig::default());
        let tesseract = TesseractConfig::default();
        assert_eq!(
            ocr.tesseract_languages(&tesseract, "zh"),
            "eng",
            "not installed"
        );
        ocr.tesseract_installed = vec!["chi_sim".into(), "eng".into(), "osd".into()];
        assert_eq!(ocr.tesseract_languages(&tesseract, "zh"), "chi_sim+eng");
        assert_eq!(ocr.tesseract_languages(&tesseract, "auto"), "eng");
        let both = TesseractConfig {
            languages: "eng+chi_sim".into(),
            ..TesseractConfig::default()
        };
        assert_eq!(ocr.tesseract_languages(&both, "zh"), "eng+chi_sim");
    }

    #[test]
    fn pages_render_at_150_dpi_unless_that_passes_the_pixel_cap() {
        assert_eq!(render_dpi(None), 150);
        assert_eq!(render_dpi(Some((612, 792))), 150);
        // A 200 × 200 inch poster: sqrt(40e6 / 40,000) = 31 dpi.
        assert_eq!(render_dpi(Some((14_400, 14_400))), 31);
        assert_eq!(render_dpi(Some((200_000, 200_000))), 2);
        let (width, height) = (14_400u64, 14_400u64);
        let dpi = render_dpi(Some((14_400, 14_400)));
        assert!(width * dpi / 72 * (height * dpi / 72) <= MAX_RENDER_PIXELS);
    }

    #[tokio::test]
    async fn a_tiff_becomes_a_png_and_a_broken_one_is_refused() {
        let mut tiff = Vec::new();
        image::DynamicImage::new_luma8(64, 32)
            .write_to(
                &mut std::io::Cursor::new(&mut tiff),
                image::ImageFormat::Tiff,
            )
            .unwrap();
        let png = tiff_to_png(&tiff).await.unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
        let decoded = image::load_from_memory(&png).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (64, 32));
        let error = tiff_to_png(&tiff[..20]).await.unwrap_err();
        assert!(matches!(error, OcrError::Conversion(_)), "{error}");
        assert!(!error.is_transient());
    }

    /// The scanned page of `tests/fixtures/pdf/mixed-scan.pdf` rendered by pdftoppm when it
    /// is installed (`.ci/run` installs poppler-utils).
    #[tokio::test]
    async fn pdftoppm_renders_one_page_as_a_png_when_it_is_installed() {
        let ocr = Ocr::start(OcrConfig {
            tesseract: None,
            ..OcrConfig::default()
        })
        .await;
        let pdf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/pdf/mixed-scan.pdf");
        if !ocr.renders_pages() {
            eprintln!("pdftoppm is not installed: checking that pages are not rendered");
            let error = ocr.render_page(&pdf, 2, None).await.unwrap_err();
            assert!(matches!(error, OcrError::Unavailable(_)), "{error}");
            return;
        }
        let png = ocr.render_page(&pdf, 2, Some((612, 792))).await.unwrap();
        let decoded = image::load_from_memory(&png).unwrap();
        // 8.5 × 11 inches at 150 dpi
        assert_eq!((decoded.width(), decoded.height()), (1275, 1650));
        let error = ocr.render_page(&pdf, 9, None).await.unwrap_err();
        assert!(matches!(error, OcrError::Render(_)), "{error}");
        assert!(!error.is_transient());
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
