//! Uploaded bytes -> plain or Markdown text.
//!
//! [`decode_text`] finds the encoding (BOMs, UTF-8, UTF-16 by its NUL-byte pattern, then a
//! [`chardetng`] guess checked against GBK and Big5) and refuses what it cannot decode
//! cleanly instead of storing replacement characters. [`parse_document`] turns the decoded
//! text of one [`SourceFormat`] into a [`ParsedDocument`]: HTML becomes Markdown (headings,
//! fenced code, tables, list items) so the chunker's structure awareness works for it too;
//! JSON and JSON Lines contribute one configured text field per record.

use ego_tree::NodeId;
use ego_tree::iter::Edge;
use encoding_rs::{BIG5, Encoding, GBK, UTF_8, UTF_16BE, UTF_16LE};
use html5ever::tendril::{StrTendril, TendrilSink};
use scraper::{ElementRef, Html, HtmlTreeSink, Node, Selector};
use serde_json::Value;

use crate::image::ImageLimits;
use crate::office::OfficeLimits;
use crate::pdf::PdfLimits;

/// The kinds of uploaded files we can turn into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    Text,
    Markdown,
    Html,
    Json,
    Jsonl,
    Pdf,
    /// Word (Office Open XML).
    Docx,
    /// PowerPoint (Office Open XML).
    Pptx,
    /// Excel (Office Open XML).
    Xlsx,
    /// Excel 97-2003 (BIFF in an OLE compound file).
    Xls,
    /// OpenDocument spreadsheet.
    Ods,
    /// Comma-, semicolon- or tab-separated values.
    Csv,
    Epub,
    /// A PNG, JPEG, TIFF or WebP image, read by OCR (see [`crate::image`]).
    Image,
}

/// The extensions [`SourceFormat::from_file_name`] knows, for messages and folder walks.
pub const SUPPORTED_EXTENSIONS: &[&str] = &[
    "txt", "text", "md", "markdown", "html", "htm", "json", "jsonl", "ndjson", "pdf", "docx",
    "pptx", "xlsx", "xlsm", "xls", "ods", "csv", "tsv", "epub", "png", "jpg", "jpeg", "tif",
    "tiff", "webp",
];

impl SourceFormat {
    /// The format implied by a file name's extension (case-insensitive), if we support it.
    pub fn from_file_name(name: &str) -> Option<SourceFormat> {
        let (_, extension) = name.rsplit_once('.')?;
        match extension.to_ascii_lowercase().as_str() {
            "txt" | "text" => Some(SourceFormat::Text),
            "md" | "markdown" => Some(SourceFormat::Markdown),
            "html" | "htm" => Some(SourceFormat::Html),
            "json" => Some(SourceFormat::Json),
            "jsonl" | "ndjson" => Some(SourceFormat::Jsonl),
            "pdf" => Some(SourceFormat::Pdf),
            "docx" => Some(SourceFormat::Docx),
            "pptx" => Some(SourceFormat::Pptx),
            "xlsx" | "xlsm" => Some(SourceFormat::Xlsx),
            "xls" => Some(SourceFormat::Xls),
            "ods" => Some(SourceFormat::Ods),
            "csv" | "tsv" => Some(SourceFormat::Csv),
            "epub" => Some(SourceFormat::Epub),
            "png" | "jpg" | "jpeg" | "tif" | "tiff" | "webp" => Some(SourceFormat::Image),
            _ => None,
        }
    }

    /// The format of a media type (`application/pdf`; parameters ignored), if we support it.
    pub fn from_media_type(media_type: &str) -> Option<SourceFormat> {
        let essence = media_type.split(';').next().unwrap_or("").trim();
        match essence.to_ascii_lowercase().as_str() {
            "text/plain" => Some(SourceFormat::Text),
            "text/markdown" => Some(SourceFormat::Markdown),
            "text/html" => Some(SourceFormat::Html),
            "application/json" => Some(SourceFormat::Json),
            "application/jsonl" | "application/x-ndjson" => Some(SourceFormat::Jsonl),
            "application/pdf" => Some(SourceFormat::Pdf),
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => {
                Some(SourceFormat::Docx)
            }
            "application/vnd.openxmlformats-officedocument.presentationml.presentation" => {
                Some(SourceFormat::Pptx)
            }
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
            | "application/vnd.ms-excel.sheet.macroenabled.12" => Some(SourceFormat::Xlsx),
            "application/vnd.ms-excel" => Some(SourceFormat::Xls),
            "application/vnd.oasis.opendocument.spreadsheet" => Some(SourceFormat::Ods),
            "text/csv" | "text/tab-separated-values" => Some(SourceFormat::Csv),
            "application/epub+zip" => Some(SourceFormat::Epub),
            "image/png" | "image/jpeg" | "image/tiff" | "image/webp" => Some(SourceFormat::Image),
            _ => None,
        }
    }

    /// The format named by [`SourceFormat::as_str`].
    pub fn from_name(name: &str) -> Option<SourceFormat> {
        [
            SourceFormat::Text,
            SourceFormat::Markdown,
            SourceFormat::Html,
            SourceFormat::Json,
            SourceFormat::Jsonl,
            SourceFormat::Pdf,
            SourceFormat::Docx,
            SourceFormat::Pptx,
            SourceFormat::Xlsx,
            SourceFormat::Xls,
            SourceFormat::Ods,
            SourceFormat::Csv,
            SourceFormat::Epub,
            SourceFormat::Image,
        ]
        .into_iter()
        .find(|format| format.as_str() == name)
    }

    /// The serde name of the format (`"text"`, `"markdown"`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            SourceFormat::Text => "text",
            SourceFormat::Markdown => "markdown",
            SourceFormat::Html => "html",
            SourceFormat::Json => "json",
            SourceFormat::Jsonl => "jsonl",
            SourceFormat::Pdf => "pdf",
            SourceFormat::Docx => "docx",
            SourceFormat::Pptx => "pptx",
            SourceFormat::Xlsx => "xlsx",
            SourceFormat::Xls => "xls",
            SourceFormat::Ods => "ods",
            SourceFormat::Csv => "csv",
            SourceFormat::Epub => "epub",
            SourceFormat::Image => "image",
        }
    }
}

/// Per-upload parsing knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseOptions {
    /// The field of each JSON / JSON Lines record that holds the text to index.
    pub json_text_field: String,
    /// The field of the first JSON record that holds the document title.
    pub json_title_field: String,
    /// Page cap and time budget of a PDF.
    pub pdf: PdfLimits,
    /// Unpacked-size, entry, row and cell caps of Office, spreadsheet and EPUB files.
    pub office: OfficeLimits,
    /// The pixel cap of an image.
    pub image: ImageLimits,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            json_text_field: "text".to_string(),
            json_title_field: "title".to_string(),
            pdf: PdfLimits::default(),
            office: OfficeLimits::default(),
            image: ImageLimits::default(),
        }
    }
}

/// The text extracted from one uploaded file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedDocument {
    pub title: Option<String>,
    /// LF line endings, paragraphs separated by blank lines; no control characters but LF and
    /// tab, whatever the format (HTML character references and JSON escapes included).
    pub text: String,
    /// Whether the chunker should treat `text` as Markdown.
    pub markdown: bool,
    /// The detected source encoding, as named by `encoding_rs` ("UTF-8", "GBK", "Big5", ...);
    /// `"PDF"` for a PDF.
    pub encoding: &'static str,
    /// Where each page's text lies in `text` (a PDF's pages; a PowerPoint deck's slides, a
    /// page a slide); empty for formats without pages. Chunks never cross a page boundary
    /// when it is given.
    pub pages: Vec<Page>,
    /// The PDF's pages without a text layer (scans): their text needs OCR. Empty for other
    /// formats.
    pub scanned_pages: Vec<ScannedPage>,
    /// Pictures of a Word or PowerPoint file, for OCR: each sits in `text` as a paragraph of
    /// its own holding its marker, which the caller replaces with the picture's text (or
    /// removes). Empty for other formats.
    pub pictures: Vec<Picture>,
}

impl ParsedDocument {
    /// Puts `replacement` where `marker` (a picture's marker paragraph, see
    /// [`ParsedDocument::pictures`]) stands in `text`, and moves the page ranges after it by
    /// the difference, so that they still hold their pages' text. Nothing happens when the
    /// marker is not in the text.
    pub fn replace_marker(&mut self, marker: &str, replacement: &str) {
        let Some(start) = self.text.find(marker) else {
            return;
        };
        let end = start + marker.len();
        self.text.replace_range(start..end, replacement);
        let moved = |offset: usize| {
            if offset >= end {
                offset - marker.len() + replacement.len()
            } else {
                offset
            }
        };
        for page in &mut self.pages {
            page.start = moved(page.start);
            page.end = moved(page.end);
        }
    }
}

/// A picture in a document's text (see [`ParsedDocument::pictures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    /// The paragraph's text in [`ParsedDocument::text`]: `[sift-picture-N]`.
    pub marker: String,
    /// `image/png`, `image/jpeg`, `image/tiff` or `image/webp`.
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
}

/// A PDF page without a text layer (see [`crate::pdf::Scanned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannedPage {
    /// 1-based page number.
    pub number: u32,
    /// The outline's headings that hold this page, as for [`Page::heading_path`].
    pub heading_path: Vec<String>,
    /// Its image, saved for OCR when the parse was asked to
    /// ([`crate::pdf::Scanned::SaveImages`]) and the page has exactly one image the parser
    /// can read. `None`: no image, or several (a tiled scan), so no one image holds the page.
    pub image: Option<std::path::PathBuf>,
    /// Whether `image` covers the page (three quarters of its area or more, or where it is
    /// drawn is unknown), so that reading it reads the page. When not, the page is better
    /// rendered whole (`pdftoppm`), and its image read only when it cannot be.
    pub image_covers_page: bool,
    /// Width and height of the page in points (1/72 inch, rounded up), from its `MediaBox`,
    /// when known: to render it within a pixel cap.
    pub size_points: Option<(u32, u32)>,
}

/// One page's text in [`ParsedDocument::text`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// 1-based page number, as a reader counts pages.
    pub number: u32,
    /// Byte range `[start, end)` of the page's text.
    pub start: usize,
    pub end: usize,
    /// The document outline's headings that hold this page (outermost first); empty without an
    /// outline.
    pub heading_path: Vec<String>,
}

/// Why an upload could not be turned into text. Messages are shown to users.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("the document is empty")]
    Empty,
    #[error("the file is binary (an image, archive, PDF or executable?), not text")]
    Binary,
    #[error("the text could not be decoded: {0}")]
    Undecodable(String),
    #[error("unsupported file type: {0}")]
    UnsupportedType(String),
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    #[error("no JSON record has a string field \"{0}\"")]
    MissingField(String),
    #[error("the HTML nests elements more than {MAX_HTML_DEPTH} deep")]
    TooDeep,
    #[error("the PDF is encrypted and needs a password")]
    EncryptedPdf,
    #[error("the file is not a readable PDF: {0}")]
    InvalidPdf(String),
    #[error("the PDF is too large: {0}")]
    PdfTooLarge(String),
    #[error(
        "the PDF has no usable text layer (scanned pages, or fonts whose text does not map to \
         characters), and no OCR engine reads it for this knowledge base (configure [ocr] on \
         the node, or the KB's `ocr` setting)"
    )]
    NoTextLayer,
    /// A damaged Office, spreadsheet or EPUB file (a bad zip, malformed XML, a missing part).
    #[error("the file is not a readable document: {0}")]
    InvalidDocument(String),
    /// Past a cap of [`OfficeLimits`] (a zip bomb, a million-row sheet).
    #[error("the document is too large: {0}")]
    DocumentTooLarge(String),
    /// The content is not what the file name or media type says (a `.docx` that is a PDF).
    #[error("the file is named as {named} but its content is {actual}")]
    ContentMismatch { named: String, actual: String },
    /// An image whose header cannot be read.
    #[error("the file is not a readable image: {0}")]
    InvalidImage(String),
    /// An image past [`ImageLimits::max_pixels`].
    #[error("the image is too large: {0}")]
    ImageTooLarge(String),
    /// An image: its text needs an OCR engine, which this function does not run.
    #[error(
        "the document is an image: its text needs OCR, and no OCR engine is set for this \
         knowledge base (configure [ocr] on the node, or the KB's `ocr` setting)"
    )]
    OcrUnavailable,
}

impl ParseError {
    /// A stable snake_case code for API error bodies and metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            ParseError::Empty => "empty_document",
            ParseError::Binary => "binary_content",
            ParseError::Undecodable(_) => "undecodable_text",
            ParseError::UnsupportedType(_) => "unsupported_type",
            ParseError::InvalidJson(_) => "invalid_json",
            ParseError::MissingField(_) => "missing_field",
            ParseError::TooDeep => "nesting_too_deep",
            ParseError::EncryptedPdf => "encrypted_pdf",
            ParseError::InvalidPdf(_) => "invalid_pdf",
            ParseError::PdfTooLarge(_) => "pdf_too_large",
            ParseError::NoTextLayer => "no_text_layer",
            ParseError::InvalidDocument(_) => "invalid_document",
            ParseError::DocumentTooLarge(_) => "document_too_large",
            ParseError::ContentMismatch { .. } => "content_mismatch",
            ParseError::InvalidImage(_) => "invalid_image",
            ParseError::ImageTooLarge(_) => "image_too_large",
            ParseError::OcrUnavailable => "ocr_unavailable",
        }
    }

    /// Parsing is deterministic: retrying the same bytes never helps.
    pub fn is_transient(&self) -> bool {
        match self {
            ParseError::Empty
            | ParseError::Binary
            | ParseError::Undecodable(_)
            | ParseError::UnsupportedType(_)
            | ParseError::InvalidJson(_)
            | ParseError::MissingField(_)
            | ParseError::TooDeep
            | ParseError::EncryptedPdf
            | ParseError::InvalidPdf(_)
            | ParseError::PdfTooLarge(_)
            | ParseError::NoTextLayer
            | ParseError::InvalidDocument(_)
            | ParseError::DocumentTooLarge(_)
            | ParseError::ContentMismatch { .. }
            | ParseError::InvalidImage(_)
            | ParseError::ImageTooLarge(_)
            | ParseError::OcrUnavailable => false,
        }
    }
}

/// Magic numbers of binary formats people upload by mistake.
const BINARY_MAGIC: &[&[u8]] = &[
    b"\x89PNG\r\n\x1a\n",
    b"PK\x03\x04", // zip, docx, xlsx, epub, jar
    b"PK\x05\x06",
    b"%PDF-",
    b"\x7fELF",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff", // JPEG
    b"\x1f\x8b",     // gzip
    b"7z\xbc\xaf\x27\x1c",
    b"Rar!\x1a\x07",
    b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", // OLE: doc, xls, msg
    b"\0asm",
    b"SQLite format 3\0",
    b"RIFF",
    b"\xcf\xfa\xed\xfe", // Mach-O
];

/// Share of control characters (other than whitespace) above which text counts as binary.
const MAX_CONTROL_SHARE: f64 = 0.10;

/// Decodes uploaded bytes, returning the text (without BOM or other U+FEFF) and the
/// encoding's name.
///
/// Order: binary magic numbers, BOMs, UTF-16 without BOM (NUL bytes concentrated in every
/// other position), valid UTF-8, then [`chardetng`]'s guess. A guess is only accepted when it
/// decodes without malformed sequences; GBK and Big5 are tried after it because short or
/// mixed samples are easy to misjudge. Single-byte guesses are accepted only when chardetng is
/// confident and the result has no C1 control characters, so garbage is refused rather than
/// turned into mojibake. Any other NUL byte, or a high share of control characters, means the
/// file is binary.
pub fn decode_text(bytes: &[u8]) -> Result<(String, &'static str), ParseError> {
    if bytes.iter().all(|byte| byte.is_ascii_whitespace()) {
        return Err(ParseError::Empty);
    }
    if BINARY_MAGIC.iter().any(|magic| bytes.starts_with(magic)) {
        return Err(ParseError::Binary);
    }
    let (text, encoding) = if let Some((encoding, bom_length)) = Encoding::for_bom(bytes) {
        (decode_strict(encoding, &bytes[bom_length..])?, encoding)
    } else if let Some(encoding) = utf16_by_nul_pattern(bytes) {
        (decode_strict(encoding, bytes)?, encoding)
    } else if bytes.contains(&0) {
        return Err(ParseError::Binary);
    } else if let Ok(text) = std::str::from_utf8(bytes) {
        (text.to_string(), UTF_8)
    } else {
        decode_legacy(bytes)?
    };
    let text = strip_control_characters(&text)?;
    Ok((text, encoding.name()))
}

/// [`decode_text`] without a copy for the common case: UTF-8 (no BOM) with no control
/// characters to drop is borrowed as it is; anything else is decoded as `decode_text` does.
pub(crate) fn decode_text_borrowed(
    bytes: &[u8],
) -> Result<(std::borrow::Cow<'_, str>, &'static str), ParseError> {
    let plain = !bytes.iter().all(|byte| byte.is_ascii_whitespace())
        && !BINARY_MAGIC.iter().any(|magic| bytes.starts_with(magic))
        && Encoding::for_bom(bytes).is_none()
        && utf16_by_nul_pattern(bytes).is_none();
    if plain && let Ok(text) = std::str::from_utf8(bytes) {
        // Control characters (NUL included) and U+FEFF are what `decode_text` drops or refuses.
        if !text.chars().any(|c| is_stray(c) || c == '\u{feff}') {
            return Ok((std::borrow::Cow::Borrowed(text), UTF_8.name()));
        }
    }
    let (text, encoding) = decode_text(bytes)?;
    Ok((std::borrow::Cow::Owned(text), encoding))
}

fn decode_strict(encoding: &'static Encoding, bytes: &[u8]) -> Result<String, ParseError> {
    encoding
        .decode_without_bom_handling_and_without_replacement(bytes)
        .map(|text| text.into_owned())
        .ok_or_else(|| {
            ParseError::Undecodable(format!("malformed {} byte sequences", encoding.name()))
        })
}

/// UTF-16 without a BOM: mostly-ASCII text has a NUL in (nearly) every other byte.
fn utf16_by_nul_pattern(bytes: &[u8]) -> Option<&'static Encoding> {
    let pairs = bytes.len() / 2;
    if pairs == 0 {
        return None;
    }
    let even_nuls = bytes.iter().step_by(2).filter(|&&byte| byte == 0).count();
    let odd_nuls = bytes
        .iter()
        .skip(1)
        .step_by(2)
        .filter(|&&byte| byte == 0)
        .count();
    let many = pairs * 3 / 10;
    let few = pairs / 20;
    if odd_nuls > 0 && odd_nuls >= many && even_nuls <= few {
        Some(UTF_16LE)
    } else if even_nuls > 0 && even_nuls >= many && odd_nuls <= few {
        Some(UTF_16BE)
    } else {
        None
    }
}

/// Legacy (non-Unicode) encodings: chardetng's guess first, then GBK and Big5.
fn decode_legacy(bytes: &[u8]) -> Result<(String, &'static Encoding), ParseError> {
    let mut detector = chardetng::EncodingDetector::new();
    detector.feed(bytes, true);
    let (guess, confident) = detector.guess_assess(None, false);
    let mut candidates = vec![guess];
    for fallback in [GBK, BIG5] {
        if !candidates.contains(&fallback) {
            candidates.push(fallback);
        }
    }
    let mut tried = Vec::new();
    for encoding in candidates {
        tried.push(encoding.name());
        let Some(text) = encoding.decode_without_bom_handling_and_without_replacement(bytes) else {
            continue;
        };
        // Every byte is "valid" in a single-byte encoding; demand confidence and no C1 controls.
        let single_byte = encoding.is_single_byte();
        if single_byte && (!confident || text.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c))) {
            continue;
        }
        return Ok((text.into_owned(), encoding));
    }
    Err(ParseError::Undecodable(format!(
        "not valid UTF-8, UTF-16 or {}",
        tried.join(", ")
    )))
}

/// A control character that text does not keep (everything but LF, CR and tab).
fn is_stray(c: char) -> bool {
    c.is_control() && !matches!(c, '\n' | '\r' | '\t')
}

/// Drops stray control characters (form feeds, `^Z`, ...) and every U+FEFF (a BOM, also one
/// left inside by concatenated files), or refuses binary-looking text.
fn strip_control_characters(text: &str) -> Result<String, ParseError> {
    let total = text.chars().count();
    let stray = text.chars().filter(|&c| is_stray(c)).count();
    if stray as f64 > total as f64 * MAX_CONTROL_SHARE {
        return Err(ParseError::Binary);
    }
    Ok(drop_control_characters(text))
}

/// Form feeds become LF; other stray control characters and U+FEFF are dropped.
fn drop_control_characters(text: &str) -> String {
    if !text.chars().any(|c| is_stray(c) || c == '\u{feff}') {
        return text.to_string();
    }
    text.chars()
        .map(|c| if c == '\u{0c}' { '\n' } else { c })
        .filter(|&c| !is_stray(c) && c != '\u{feff}')
        .collect()
}

/// Text that came out of HTML character references (`&#4;`) or JSON escapes (`"\u0004"`),
/// which [`decode_text`] never saw: newlines normalised and control characters dropped as for
/// decoded bytes, so every [`ParsedDocument`] is as clean as decoded text.
pub(crate) fn clean_extracted(text: &str) -> String {
    drop_control_characters(&normalize_newlines(text))
}

/// CRLF and lone CR become LF.
fn normalize_newlines(text: &str) -> String {
    if !text.contains('\r') {
        return text.to_string();
    }
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Decodes `bytes` and extracts the text of a `format` document.
pub fn parse_document(
    bytes: &[u8],
    format: SourceFormat,
    options: &ParseOptions,
) -> Result<ParsedDocument, ParseError> {
    match format {
        SourceFormat::Pdf => return crate::pdf::parse_pdf(bytes, &options.pdf),
        SourceFormat::Xls => return crate::office::parse_xls(bytes, &options.office, &options.pdf),
        SourceFormat::Docx
        | SourceFormat::Pptx
        | SourceFormat::Xlsx
        | SourceFormat::Ods
        | SourceFormat::Csv
        | SourceFormat::Epub => {
            return crate::office::parse_office(bytes, format, &options.office);
        }
        // The image is checked; its text is the OCR engine's, run by the caller.
        SourceFormat::Image => {
            crate::image::check_image(bytes, &options.image)?;
            return Err(ParseError::OcrUnavailable);
        }
        SourceFormat::Text
        | SourceFormat::Markdown
        | SourceFormat::Html
        | SourceFormat::Json
        | SourceFormat::Jsonl => {}
    }
    let (decoded, encoding) = decode_text(bytes)?;
    let decoded = normalize_newlines(&decoded);
    let (title, text, markdown) = match format {
        SourceFormat::Text => (None, trim_blank_lines(&decoded), false),
        SourceFormat::Markdown => (markdown_title(&decoded), trim_blank_lines(&decoded), true),
        SourceFormat::Html => {
            let (title, text) = html_to_markdown(&decoded)?;
            let title = title
                .map(|title| clean_extracted(&title).trim().to_string())
                .filter(|title| !title.is_empty());
            (title, trim_blank_lines(&clean_extracted(&text)), true)
        }
        SourceFormat::Json => {
            let value: Value = serde_json::from_str(&decoded)
                .map_err(|error| ParseError::InvalidJson(error.to_string()))?;
            let records = match value {
                Value::Array(items) => items,
                object @ Value::Object(_) => vec![object],
                _ => {
                    return Err(ParseError::InvalidJson(
                        "expected an object or an array of objects".to_string(),
                    ));
                }
            };
            if let Some(index) = records.iter().position(|record| !record.is_object()) {
                return Err(ParseError::InvalidJson(format!(
                    "array element {index} is not an object"
                )));
            }
            let (title, text) = json_records_text(&records, options)?;
            (title, text, false)
        }
        // Parsed above, from their bytes: never decoded as text here.
        SourceFormat::Pdf
        | SourceFormat::Docx
        | SourceFormat::Pptx
        | SourceFormat::Xlsx
        | SourceFormat::Xls
        | SourceFormat::Ods
        | SourceFormat::Csv
        | SourceFormat::Epub
        | SourceFormat::Image => {
            return Err(ParseError::UnsupportedType(format!(
                "{} is not parsed as text",
                format.as_str()
            )));
        }
        SourceFormat::Jsonl => {
            let mut records = Vec::new();
            for (index, line) in decoded.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let record: Value = serde_json::from_str(line).map_err(|error| {
                    ParseError::InvalidJson(format!("line {}: {error}", index + 1))
                })?;
                if !record.is_object() {
                    return Err(ParseError::InvalidJson(format!(
                        "line {}: expected an object",
                        index + 1
                    )));
                }
                records.push(record);
            }
            let (title, text) = json_records_text(&records, options)?;
            (title, text, false)
        }
    };
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    Ok(ParsedDocument {
        title,
        text,
        markdown,
        encoding,
        pages: Vec::new(),
        scanned_pages: Vec::new(),
        pictures: Vec::new(),
    })
}

/// Drops leading and trailing blank lines and trailing whitespace, keeping inner structure.
pub(crate) fn trim_blank_lines(text: &str) -> String {
    let start = text
        .char_indices()
        .find(|&(_, c)| !c.is_whitespace())
        .map(|(index, _)| text[..index].rfind('\n').map_or(0, |newline| newline + 1))
        .unwrap_or(text.len());
    text[start..].trim_end().to_string()
}

/// The text of the first ATX level-1 heading outside fenced code.
fn markdown_title(text: &str) -> Option<String> {
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") {
            fence = Some("```");
            continue;
        }
        if trimmed.starts_with("~~~") {
            fence = Some("~~~");
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("# ") {
            let title = rest.trim().trim_end_matches('#').trim();
            if !title.is_empty() {
                return Some(title.to_string());
            }
        }
    }
    None
}

fn json_records_text(
    records: &[Value],
    options: &ParseOptions,
) -> Result<(Option<String>, String), ParseError> {
    let title = records
        .first()
        .and_then(|record| record.get(&options.json_title_field))
        .and_then(Value::as_str)
        .map(|title| clean_extracted(title).trim().to_string())
        .filter(|title| !title.is_empty());
    let texts: Vec<&str> = records
        .iter()
        .filter_map(|record| record.get(&options.json_text_field)?.as_str())
        .collect();
    if texts.is_empty() {
        return Err(ParseError::MissingField(options.json_text_field.clone()));
    }
    let paragraphs: Vec<String> = texts
        .iter()
        .map(|text| trim_blank_lines(&clean_extracted(text)))
        .filter(|text| !text.is_empty())
        .collect();
    Ok((title, paragraphs.join("\n\n")))
}

/// Elements whose content is never main text.
const SKIPPED_ELEMENTS: &[&str] = &[
    "script", "style", "nav", "header", "footer", "aside", "noscript", "template", "svg", "form",
    "head", "iframe", "object", "canvas", "button", "select", "textarea", "dialog",
];

/// ARIA roles of page chrome rather than content (a `<div role="navigation">` is a `<nav>`).
const SKIPPED_ROLES: &[&str] = &[
    "navigation",
    "banner",
    "contentinfo",
    "complementary",
    "search",
    "menu",
    "menubar",
    "dialog",
    "alertdialog",
];

/// Whether `element` holds a footnote or endnote (EPUB's `<aside epub:type="footnote">`,
/// DPUB-ARIA's `role="doc-footnote"`): text of the document, though an `aside`.
fn is_note(element: ElementRef) -> bool {
    let marks = |value: Option<&str>| {
        value.is_some_and(|value| {
            value.split_whitespace().any(|word| {
                matches!(
                    word,
                    "footnote" | "endnote" | "rearnote" | "doc-footnote" | "doc-endnote"
                )
            })
        })
    };
    marks(element.value().attr("epub:type")) || marks(element.value().attr("role"))
}

/// Elements that start a new paragraph.
const BLOCK_ELEMENTS: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "main",
    "body",
    "html",
    "blockquote",
    "figure",
    "figcaption",
    "address",
    "details",
    "summary",
    "dl",
    "dt",
    "dd",
    "hr",
    "center",
    "fieldset",
    "caption",
];

/// Deepest element nesting accepted in HTML. Real pages stay far below it (tens of levels);
/// the HTML tree builder scans its stack of open elements for most start tags, so parsing costs
/// time proportional to the depth for every tag, and deep nesting is a way to make one small
/// upload cost minutes of CPU.
pub const MAX_HTML_DEPTH: usize = 256;

/// Input fed to the HTML parser between two depth checks.
const HTML_FEED_BYTES: usize = 1024;

/// Parses an HTML document, refusing it once an element is nested deeper than
/// [`MAX_HTML_DEPTH`]. The input is fed in small pieces and the nodes each piece created are
/// checked, so the parser never works on much more than the limit's depth.
fn parse_html(html: &str) -> Result<Html, ParseError> {
    let sink = HtmlTreeSink::new(Html::new_document());
    let mut parser = html5ever::driver::parse_document(sink, Default::default());
    let mut checked = 0;
    let mut rest = html;
    while !rest.is_empty() {
        let mut cut = HTML_FEED_BYTES.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (piece, tail) = rest.split_at(cut);
        parser.process(StrTendril::from_slice(piece));
        rest = tail;
        let document = parser.tokenizer.sink.sink.0.borrow();
        let nodes = document.tree.nodes();
        let total = nodes.len();
        let too_deep = nodes.rev().take(total - checked).any(|node| {
            node.value().is_element()
                && node.ancestors().take(MAX_HTML_DEPTH + 1).count() > MAX_HTML_DEPTH
        });
        if too_deep {
            return Err(ParseError::TooDeep);
        }
        checked = total;
    }
    Ok(parser.finish())
}

/// HTML -> (title, Markdown of the main content).
pub(crate) fn html_to_markdown(html: &str) -> Result<(Option<String>, String), ParseError> {
    let document = parse_html(html)?;
    let selector = |css: &str| Selector::parse(css).expect("static selector is valid");
    let title = document
        .select(&selector("title"))
        .next()
        .map(|title| collapse_whitespace(&title.text().collect::<String>()))
        .filter(|title| !title.is_empty())
        .or_else(|| {
            // pages that leave <title> empty (WeChat articles) name themselves here
            document
                .select(&selector(r#"meta[property="og:title"]"#))
                .next()
                .and_then(|meta| meta.value().attr("content"))
                .map(collapse_whitespace)
                .filter(|title| !title.is_empty())
        })
        .or_else(|| {
            document
                .select(&selector("h1"))
                .next()
                .map(|h1| collapse_whitespace(&h1.text().collect::<String>()))
                .filter(|h1| !h1.is_empty())
        });

    // Prefer a WeChat article's content element (`mp.weixin.qq.com`: `#js_content`), then
    // <main>, then the outermost <article>s, then <body>. Inside a chosen main or article,
    // <header> and <footer> belong to the content (article titles live there).
    let mut writer = MarkdownWriter::default();
    if let Some(content) = document.select(&selector("#js_content")).next() {
        writer.keep_headers = true;
        writer.element(content);
    } else if let Some(main) = document.select(&selector("main")).next() {
        writer.keep_headers = true;
        writer.element(main);
    } else {
        let articles = outermost(document.root_element(), "article");
        if articles.is_empty() {
            let root = document
                .select(&selector("body"))
                .next()
                .unwrap_or_else(|| document.root_element());
            writer.element(root);
        } else {
            writer.keep_headers = true;
            for article in articles {
                writer.element(article);
            }
        }
    }
    Ok((title, writer.finish()))
}

/// Collects Markdown blocks while walking the DOM.
#[derive(Default)]
struct MarkdownWriter {
    blocks: Vec<String>,
    /// Inline text of the paragraph being built; whitespace already collapsed.
    inline: String,
    keep_headers: bool,
}

impl MarkdownWriter {
    /// Writes the Markdown of `root` and everything under it.
    ///
    /// The walk is iterative (open and close edges of a pre-order traversal), never recursive:
    /// nesting depth is chosen by whoever wrote the HTML, and a recursive walk of ten thousand
    /// nested `<div>`s overflows the stack and aborts the process.
    fn element(&mut self, root: ElementRef) {
        // The element whose subtree is skipped (not content, or already written whole).
        let mut skipping: Option<NodeId> = None;
        for edge in root.traverse() {
            match edge {
                Edge::Open(node) => {
                    if skipping.is_some() {
                        continue;
                    }
                    match node.value() {
                        Node::Text(text) => push_collapsed(&mut self.inline, text),
                        Node::Element(_) => {
                            let Some(element) = ElementRef::wrap(node) else {
                                continue;
                            };
                            if self.open(element) == Descend::Skip {
                                skipping = Some(node.id());
                            }
                        }
                        _ => {}
                    }
                }
                Edge::Close(node) => {
                    if skipping == Some(node.id()) {
                        skipping = None;
                        continue;
                    }
                    if skipping.is_none()
                        && let Some(element) = ElementRef::wrap(node)
                    {
                        let name = element.value().name();
                        if BLOCK_ELEMENTS.contains(&name) || name == "li" {
                            self.flush();
                        }
                    }
                }
            }
        }
    }

    /// Handles the opening of `element`: blocks written whole (headings, code, tables, lists)
    /// and non-content elements are not descended into.
    fn open(&mut self, element: ElementRef) -> Descend {
        let name = element.value().name();
        if (SKIPPED_ELEMENTS.contains(&name)
            && !(self.keep_headers && matches!(name, "header" | "footer"))
            && !is_note(element))
            || element
                .value()
                .attr("role")
                .is_some_and(|role| SKIPPED_ROLES.contains(&role.trim()))
            || element.value().attr("aria-hidden") == Some("true")
        {
            return Descend::Skip;
        }
        match name {
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                self.flush();
                let level = usize::from(name.as_bytes()[1] - b'0');
                let text = inline_text(element);
                if !text.is_empty() {
                    self.blocks.push(format!("{} {text}", "#".repeat(level)));
                }
                Descend::Skip
            }
            "pre" => {
                self.flush();
                self.code_block(element);
                Descend::Skip
            }
            "table" => {
                self.flush();
                self.table(element);
                Descend::Skip
            }
            "ul" | "ol" => {
                self.flush();
                let items = list_items(element);
                if !items.is_empty() {
                    self.blocks.push(items.join("\n"));
                }
                Descend::Skip
            }
            "br" => {
                let kept = self.inline.trim_end_matches(' ').len();
                self.inline.truncate(kept);
                self.inline.push('\n');
                Descend::Into
            }
            _ if BLOCK_ELEMENTS.contains(&name) || name == "li" => {
                self.flush();
                Descend::Into
            }
            _ => Descend::Into,
        }
    }

    fn code_block(&mut self, pre: ElementRef) {
        let code = pre.text().collect::<String>();
        let code = code.trim_matches('\n').trim_end();
        if code.trim().is_empty() {
            return;
        }
        let language = pre
            .descendent_elements()
            .find(|element| element.value().name() == "code")
            .and_then(|code| {
                code.value()
                    .classes()
                    .find_map(|class| class.strip_prefix("language-").map(str::to_string))
            })
            .unwrap_or_default();
        let mut fence = "```".to_string();
        while code.contains(fence.as_str()) {
            fence.push('`');
        }
        self.blocks
            .push(format!("{fence}{language}\n{code}\n{fence}"));
    }

    fn table(&mut self, table: ElementRef) {
        let mut rows = Vec::new();
        let mut header_done = false;
        // Rows of this table; a nested table is read as part of its cell's text.
        let rows_of_table = table
            .child_elements()
            .flat_map(|child| match child.value().name() {
                "tr" => vec![child],
                "table" => Vec::new(),
                _ => outermost_skipping(child, "tr", "table"),
            });
        for row in rows_of_table {
            let cells: Vec<String> = row
                .child_elements()
                .filter(|cell| matches!(cell.value().name(), "td" | "th"))
                .map(|cell| inline_text(cell).replace('|', "\\|"))
                .collect();
            if cells.is_empty() {
                continue;
            }
            rows.push(format!("| {} |", cells.join(" | ")));
            if !header_done {
                header_done = true;
                rows.push(format!("|{}", " --- |".repeat(cells.len())));
            }
        }
        if !rows.is_empty() {
            self.blocks.push(rows.join("\n"));
        }
    }

    /// Ends the current paragraph.
    fn flush(&mut self) {
        let paragraph: Vec<&str> = self
            .inline
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect();
        if !paragraph.is_empty() {
            self.blocks.push(paragraph.join("\n"));
        }
        self.inline.clear();
    }

    fn finish(mut self) -> String {
        self.flush();
        self.blocks.join("\n\n")
    }
}

/// The outermost elements named `name` in `root`'s subtree (`root` included).
fn outermost<'a>(root: ElementRef<'a>, name: &str) -> Vec<ElementRef<'a>> {
    outermost_skipping(root, name, name)
}

/// The outermost elements named `name` in `root`'s subtree (`root` included), not looking
/// into elements named `barrier`. Iterative, linear in the subtree's size.
fn outermost_skipping<'a>(root: ElementRef<'a>, name: &str, barrier: &str) -> Vec<ElementRef<'a>> {
    let mut found = Vec::new();
    let mut skipping: Option<NodeId> = None;
    for edge in root.traverse() {
        match edge {
            Edge::Open(node) if skipping.is_none() => {
                let Some(element) = ElementRef::wrap(node) else {
                    continue;
                };
                let element_name = element.value().name();
                if element_name == name {
                    found.push(element);
                    skipping = Some(node.id());
                } else if element_name == barrier {
                    skipping = Some(node.id());
                }
            }
            Edge::Close(node) if skipping == Some(node.id()) => skipping = None,
            _ => {}
        }
    }
    found
}

/// Whether a walk goes on into an element's children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Descend {
    Into,
    Skip,
}

/// Indentation stops growing past this list depth, so that the output of deeply nested lists
/// stays linear in the input.
const MAX_LIST_INDENT: usize = 8;

/// `- item` lines of a list, nested lists indented by two spaces per level (at most
/// [`MAX_LIST_INDENT`] levels). Iterative, like every walk here: a stack of the lists being
/// read, each with its depth.
fn list_items(list: ElementRef) -> Vec<String> {
    let mut items = Vec::new();
    let mut stack = vec![(list.child_elements(), 0usize)];
    while let Some((children, depth)) = stack.last_mut() {
        let depth = *depth;
        let Some(item) = children.next() else {
            stack.pop();
            continue;
        };
        if item.value().name() != "li" {
            continue;
        }
        let mut text = String::new();
        let mut nested = Vec::new();
        collect_inline(item, &mut text, &mut nested);
        let text = collapse_whitespace(&text);
        if !text.is_empty() {
            items.push(format!(
                "{}- {text}",
                "  ".repeat(depth.min(MAX_LIST_INDENT))
            ));
        }
        // The item's sublists come before its next sibling, the first one first.
        for sublist in nested.into_iter().rev() {
            stack.push((sublist.child_elements(), depth + 1));
        }
    }
    items
}

/// Inline text of an element, skipping non-content elements; nested lists are set aside.
/// Iterative (see [`MarkdownWriter::element`]).
fn collect_inline<'a>(element: ElementRef<'a>, out: &mut String, lists: &mut Vec<ElementRef<'a>>) {
    let mut skipping: Option<NodeId> = None;
    for edge in element.traverse() {
        let Edge::Open(node) = edge else {
            if let Edge::Close(node) = edge
                && skipping == Some(node.id())
            {
                skipping = None;
            }
            continue;
        };
        if skipping.is_some() || node.id() == element.id() {
            continue;
        }
        match node.value() {
            Node::Text(text) => push_collapsed(out, text),
            Node::Element(child) => {
                let name = child.name();
                if matches!(name, "ul" | "ol") {
                    if let Some(list) = ElementRef::wrap(node) {
                        lists.push(list);
                    }
                    skipping = Some(node.id());
                } else if SKIPPED_ELEMENTS.contains(&name) {
                    skipping = Some(node.id());
                } else if name == "br" || BLOCK_ELEMENTS.contains(&name) {
                    out.push(' ');
                }
            }
            _ => {}
        }
    }
}

fn inline_text(element: ElementRef) -> String {
    let mut text = String::new();
    let mut lists = Vec::new();
    collect_inline(element, &mut text, &mut lists);
    collapse_whitespace(&text)
}

/// Appends `text` with runs of whitespace collapsed to one space.
fn push_collapsed(out: &mut String, text: &str) {
    for c in text.chars() {
        if c.is_whitespace() {
            if !out.is_empty() && !out.ends_with([' ', '\n']) {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHINESE: &str = "检索增强生成系统会先把上传的文档切分成较小的片段，然后为每个片段计算向量。\
        当用户提出问题时，系统从向量库中找出最相关的片段，并把它们交给大模型生成答案。\
        为了保持上下文的完整性，代码块和表格不会被拆开，标题路径也会注入到每个片段的开头。\
        我们在多台机器上复制这些数据，以便在某个节点故障时仍然可以继续回答问题。";

    const TRADITIONAL: &str = "檢索增強生成系統會先把上傳的文件切分成較小的片段，然後為每個片段計算向量。\
        當使用者提出問題時，系統從向量資料庫中找出最相關的片段，並把它們交給大型語言模型生成答案。\
        為了保持上下文的完整性，程式碼區塊和表格不會被拆開，標題路徑也會注入到每個片段的開頭。\
        我們在多台機器上複製這些資料，以便在某個節點故障時仍然可以繼續回答問題。";

    fn parse(bytes: &[u8], format: SourceFormat) -> Result<ParsedDocument, ParseError> {
        parse_document(bytes, format, &ParseOptions::default())
    }

    fn encode(encoding: &'static Encoding, text: &str) -> Vec<u8> {
        let (bytes, _, had_errors) = encoding.encode(text);
        assert!(
            !had_errors,
            "test text must be encodable in {}",
            encoding.name()
        );
        bytes.into_owned()
    }

    fn utf16le(text: &str, bom: bool) -> Vec<u8> {
        let mut bytes = if bom { vec![0xff, 0xfe] } else { Vec::new() };
        bytes.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        bytes
    }

    #[test]
    fn formats_from_file_names() {
        assert_eq!(
            SourceFormat::from_file_name("a.TXT"),
            Some(SourceFormat::Text)
        );
        assert_eq!(
            SourceFormat::from_file_name("notes.text"),
            Some(SourceFormat::Text)
        );
        assert_eq!(
            SourceFormat::from_file_name("README.md"),
            Some(SourceFormat::Markdown)
        );
        assert_eq!(
            SourceFormat::from_file_name("x.Markdown"),
            Some(SourceFormat::Markdown)
        );
        assert_eq!(
            SourceFormat::from_file_name("index.htm"),
            Some(SourceFormat::Html)
        );
        assert_eq!(
            SourceFormat::from_file_name("page.HTML"),
            Some(SourceFormat::Html)
        );
        assert_eq!(
            SourceFormat::from_file_name("data.json"),
            Some(SourceFormat::Json)
        );
        assert_eq!(
            SourceFormat::from_file_name("data.jsonl"),
            Some(SourceFormat::Jsonl)
        );
        assert_eq!(
            SourceFormat::from_file_name("data.ndjson"),
            Some(SourceFormat::Jsonl)
        );
        assert_eq!(
            SourceFormat::from_file_name("report.pdf"),
            Some(SourceFormat::Pdf)
        );
        assert_eq!(SourceFormat::from_file_name("slides.ppt"), None);
        for extension in SUPPORTED_EXTENSIONS {
            assert!(
                SourceFormat::from_file_name(&format!("a.{extension}")).is_some(),
                "{extension}"
            );
        }
        assert_eq!(SourceFormat::from_file_name("Makefile"), None);
        assert_eq!(
            serde_json::to_string(&SourceFormat::Jsonl).unwrap(),
            "\"jsonl\""
        );
    }

    #[test]
    fn empty_and_whitespace_only_are_empty() {
        for bytes in [&b""[..], b"   \n\r\n\t  ", b"\xef\xbb\xbf  \n"] {
            let error = parse(bytes, SourceFormat::Text).unwrap_err();
            assert!(matches!(error, ParseError::Empty), "{bytes:?}: {error}");
            assert_eq!(error.code(), "empty_document");
        }
        let error = parse(
            b"<html><body><script>x()</script></body></html>",
            SourceFormat::Html,
        )
        .unwrap_err();
        assert!(matches!(error, ParseError::Empty));
    }

    #[test]
    fn binary_content_is_refused() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10";
        let pdf = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj";
        let zip = b"PK\x03\x04\x14\0\0\0\x08\0";
        let elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0";
        let nul_in_text = b"hello world, this has a \0 NUL byte in the middle of text";
        let controls: Vec<u8> = (0..200u8)
            .map(|i| if i % 3 == 0 { 0x01 } else { b'a' })
            .collect();
        for bytes in [&png[..], pdf, zip, elf, nul_in_text, &controls] {
            let error = decode_text(bytes).unwrap_err();
            assert!(matches!(error, ParseError::Binary), "{bytes:?}: {error}");
            assert_eq!(error.code(), "binary_content");
        }
    }

    #[test]
    fn utf8_with_and_without_bom() {
        let (text, encoding) = decode_text("héllo wörld 你好".as_bytes()).unwrap();
        assert_eq!((text.as_str(), encoding), ("héllo wörld 你好", "UTF-8"));
        let (text, encoding) = decode_text(b"\xef\xbb\xbfplain").unwrap();
        assert_eq!((text.as_str(), encoding), ("plain", "UTF-8"));
    }

    #[test]
    fn gbk_is_detected_and_decoded() {
        let (text, encoding) = decode_text(&encode(GBK, CHINESE)).unwrap();
        assert_eq!(encoding, "GBK");
        assert_eq!(text, CHINESE);
    }

    #[test]
    fn big5_is_detected_and_decoded() {
        let (text, encoding) = decode_text(&encode(BIG5, TRADITIONAL)).unwrap();
        assert_eq!(encoding, "Big5");
        assert_eq!(text, TRADITIONAL);
    }

    #[test]
    fn latin1_is_detected_and_decoded() {
        let french = "Le café crème coûte déjà trop cher à Paris. Où est la bibliothèque, s'il \
            vous plaît ? Les élèves étudient la géométrie et l'économie.";
        let (text, encoding) = decode_text(&encode(encoding_rs::WINDOWS_1252, french)).unwrap();
        assert_eq!((text.as_str(), encoding), (french, "windows-1252"));
    }

    #[test]
    fn utf16_with_bom_and_by_nul_pattern() {
        let sample = "Hello, UTF-16 world.\nSecond line with 中文 too.";
        let (text, encoding) = decode_text(&utf16le(sample, true)).unwrap();
        assert_eq!((text.as_str(), encoding), (sample, "UTF-16LE"));
        let (text, encoding) = decode_text(&utf16le(sample, false)).unwrap();
        assert_eq!((text.as_str(), encoding), (sample, "UTF-16LE"));

        let mut big_endian = vec![0xfe, 0xff];
        big_endian.extend(sample.encode_utf16().flat_map(u16::to_be_bytes));
        let (text, encoding) = decode_text(&big_endian).unwrap();
        assert_eq!((text.as_str(), encoding), (sample, "UTF-16BE"));
        let (text, encoding) = decode_text(&big_endian[2..]).unwrap();
        assert_eq!((text.as_str(), encoding), (sample, "UTF-16BE"));
    }

    #[test]
    fn malformed_utf16_is_undecodable() {
        // An unpaired high surrogate after a BOM.
        let mut bytes = utf16le("abc", true);
        bytes.extend([0x00, 0xd8, b'x', 0x00]);
        let error = decode_text(&bytes).unwrap_err();
        assert!(matches!(error, ParseError::Undecodable(_)), "{error}");
    }

    #[test]
    fn bytes_invalid_in_every_encoding_are_undecodable() {
        // 0xFF is never a lead byte in GBK or Big5 and 0x81 0x7F is no valid pair; single-byte
        // encodings leave 0x81 (windows-1252) or 0x98 (windows-1251) undefined: C1 controls.
        let bytes = b"abc \xff\x81\x7f\x98\x90\x8d\x9d\xff def \xff\x81\x98\x8d\x9d ghi ".repeat(4);
        let error = decode_text(&bytes).unwrap_err();
        assert!(matches!(error, ParseError::Undecodable(_)), "{error}");
        assert_eq!(error.code(), "undecodable_text");
    }

    #[test]
    fn text_normalises_newlines_and_keeps_paragraphs() {
        let doc = parse(
            b"\r\n\r\nFirst line\r\nsecond line\r\n\r\nNext paragraph\r\n",
            SourceFormat::Text,
        )
        .unwrap();
        assert_eq!(doc.text, "First line\nsecond line\n\nNext paragraph");
        assert!(!doc.markdown);
        assert_eq!(doc.title, None);
        assert_eq!(doc.encoding, "UTF-8");
    }

    #[test]
    fn markdown_is_kept_and_titled_by_first_h1() {
        let source =
            "Intro line\n\n```sh\n# not a title\n```\n\n## Sub\n\n# Real Title #\n\nBody\r\n";
        let doc = parse(source.as_bytes(), SourceFormat::Markdown).unwrap();
        assert!(doc.markdown);
        assert_eq!(doc.title.as_deref(), Some("Real Title"));
        assert_eq!(doc.text, source.replace("\r\n", "\n").trim_end());
        let untitled = parse(b"no heading here", SourceFormat::Markdown).unwrap();
        assert_eq!(untitled.title, None);
    }

    #[test]
    fn html_main_content_becomes_markdown() {
        let html = r#"<!doctype html><html><head><title> The  Page </title>
            <style>body { color: red }</style><script>var x = "script text";</script></head>
            <body>
              <nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
              <header>Site banner</header>
              <h1>Outside main</h1>
              <main>
                <h1>Guide</h1>
                <p>Some   <b>bold</b>
                   text &amp; more.</p>
                <h2>Code</h2>
                <pre><code class="language-rust">fn main() {
    println!("hi");
}</code></pre>
                <ul><li>first <em>item</em></li><li>second<ul><li>nested</li></ul></li></ul>
                <table><tr><th>Name</th><th>Value</th></tr><tr><td>a|b</td><td>1</td></tr></table>
                <aside>Related links</aside>
                <form><input name="q"><button>Search</button></form>
                <div>Line one<br>Line two</div>
              </main>
              <footer>Copyright</footer>
            </body></html>"#;
        let doc = parse(html.as_bytes(), SourceFormat::Html).unwrap();
        assert!(doc.markdown);
        assert_eq!(doc.title.as_deref(), Some("The Page"));
        let expected = "# Guide\n\n\
            Some bold text & more.\n\n\
            ## Code\n\n\
            ```rust\nfn main() {\n    println!(\"hi\");\n}\n```\n\n\
            - first item\n- second\n  - nested\n\n\
            | Name | Value |\n| --- | --- |\n| a\\|b | 1 |\n\n\
            Line one\nLine two";
        assert_eq!(doc.text, expected);
        for dropped in [
            "script text",
            "color: red",
            "Home",
            "Site banner",
            "Related",
            "Search",
            "Copyright",
            "Outside",
        ] {
            assert!(
                !doc.text.contains(dropped),
                "{dropped} leaked into {}",
                doc.text
            );
        }
    }

    #[test]
    fn page_chrome_by_role_is_dropped_and_wechat_articles_keep_their_content() {
        let html = r#"<html><head><title></title>
            <meta property="og:title" content="  Quarterly  report "></head><body>
              <div role="navigation">Menu Home About</div>
              <div class="rich_media">
                <h1 id="activity-name">Quarterly report</h1>
                <div id="js_content"><p>Revenue grew by 12 percent.</p>
                  <section><p>Costs fell.</p></section>
                  <span aria-hidden="true">decorative</span></div>
                <div role="contentinfo">Scan the QR code</div>
              </div></body></html>"#;
        let doc = parse(html.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.title.as_deref(), Some("Quarterly report"));
        assert_eq!(doc.text, "Revenue grew by 12 percent.\n\nCosts fell.");
        let plain = r#"<html><body><div role="navigation">Menu</div><div role="banner">Logo</div>
            <p>Body text.</p><div role="complementary">Ads</div></body></html>"#;
        let doc = parse(plain.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "Body text.");
    }

    #[test]
    fn html_without_main_uses_article_or_body() {
        let article = "<html><body><nav>menu</nav><article><header><h1>Post</h1></header>\
            <p>Post body.</p></article><aside>ads</aside></body></html>";
        let doc = parse(article.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "# Post\n\nPost body.");
        assert_eq!(doc.title.as_deref(), Some("Post"));

        let body =
            "<html><body><header>banner</header><p>Hello\n   world</p><p>Again</p></body></html>";
        let doc = parse(body.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "Hello world\n\nAgain");
        assert_eq!(doc.title, None);
    }

    /// `depth` levels of `open`/`close` around `center`.
    fn nested(open: &str, close: &str, center: &str, depth: usize) -> String {
        let mut html = String::with_capacity((open.len() + close.len()) * depth + center.len());
        for _ in 0..depth {
            html.push_str(open);
        }
        html.push_str(center);
        for _ in 0..depth {
            html.push_str(close);
        }
        html
    }

    #[test]
    fn nesting_within_the_limit_is_walked_without_recursion() {
        // Every kind of element the walk treats differently, nested as deep as allowed
        // (<html> and <body> take two levels): blocks, inline elements, the content roots
        // (<main>, <article>), headings (inline text) and skipped elements.
        let depth = MAX_HTML_DEPTH - 4;
        for (open, close) in [
            ("<div>", "</div>"),
            ("<span>", "</span>"),
            ("<blockquote>", "</blockquote>"),
            ("<main>", "</main>"),
            ("<article>", "</article>"),
        ] {
            let html = nested(open, close, "deep text", depth);
            let doc = parse(html.as_bytes(), SourceFormat::Html).unwrap();
            assert_eq!(doc.text, "deep text", "{open}");
        }
        let heading = nested("<h2><em>", "</em></h2>", "deep title", depth / 2);
        let doc = parse(heading.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "## deep title");
        let skipped = format!(
            "<p>kept</p>{}",
            nested("<nav><div>", "</div></nav>", "menu", depth / 2)
        );
        let doc = parse(skipped.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "kept");
    }

    #[test]
    fn nesting_beyond_the_limit_is_refused_early() {
        // The poison document of issue 14: 10,000 nested <div>s in a 107 KB bulk request
        // overflowed the stack of a recursive walk and aborted the process on every restart.
        let poison = nested("<div>", "</div>", "x", 10_000);
        let error = parse(poison.as_bytes(), SourceFormat::Html).unwrap_err();
        assert_eq!(error.code(), "nesting_too_deep");
        // A million levels (11 MB) cost no more: parsing stops a piece after the limit.
        for (open, close) in [
            ("<div>", "</div>"),
            ("<span>", "</span>"),
            ("<ul><li>", "</li></ul>"),
        ] {
            let html = nested(open, close, "x", 1_000_000);
            let error = parse(html.as_bytes(), SourceFormat::Html).unwrap_err();
            assert!(matches!(error, ParseError::TooDeep), "{open}: {error}");
        }
        // Many siblings are not depth.
        let wide = "<div>side by side</div>".repeat(50_000);
        let doc = parse(wide.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(
            doc.text.lines().filter(|line| !line.is_empty()).count(),
            50_000
        );
    }

    #[test]
    fn deeply_nested_lists_and_tables_stay_linear() {
        let depth = MAX_HTML_DEPTH / 2 - 4;
        let lists = nested("<ul><li>item", "</li></ul>", "", depth);
        let doc = parse(lists.as_bytes(), SourceFormat::Html).unwrap();
        let lines: Vec<&str> = doc.text.lines().collect();
        assert_eq!(lines.len(), depth, "one line per nested item");
        assert_eq!(lines[0], "- item");
        assert_eq!(lines[1], "  - item");
        let deepest_indent = "  ".repeat(MAX_LIST_INDENT);
        assert_eq!(lines[depth - 1], format!("{deepest_indent}- item"));

        // A nested table is read as its cell's text, not once more per enclosing table.
        let depth = MAX_HTML_DEPTH / 4 - 4;
        let tables = nested("<table><tr><td>cell ", "</td></tr></table>", "end", depth);
        let doc = parse(tables.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text.matches("cell").count(), depth, "{}", doc.text);
        assert!(doc.text.starts_with("| cell cell"), "{}", doc.text);
        assert!(doc.text.contains("end |"));
    }

    #[test]
    fn nested_lists_keep_document_order() {
        let html = "<ul><li>a<ul><li>a1<ol><li>a1x</li></ol></li><li>a2</li></ul></li>\
            <li>b</li></ul><p>after</p>";
        let doc = parse(html.as_bytes(), SourceFormat::Html).unwrap();
        assert_eq!(doc.text, "- a\n  - a1\n    - a1x\n  - a2\n- b\n\nafter");
    }

    #[test]
    fn json_object_and_array() {
        let doc = parse(
            br#"{"title": "One", "text": "Only record"}"#,
            SourceFormat::Json,
        )
        .unwrap();
        assert_eq!(doc.title.as_deref(), Some("One"));
        assert_eq!(doc.text, "Only record");
        assert!(!doc.markdown);

        let array =
            br#"[{"title": "First", "text": "alpha\r\nbeta"}, {"id": 2}, {"text": "gamma"}]"#;
        let doc = parse(array, SourceFormat::Json).unwrap();
        assert_eq!(doc.title.as_deref(), Some("First"));
        assert_eq!(doc.text, "alpha\nbeta\n\ngamma");

        let options = ParseOptions {
            json_text_field: "body".to_string(),
            json_title_field: "name".to_string(),
            ..ParseOptions::default()
        };
        let doc = parse_document(
            br#"[{"name": "N", "body": "B"}]"#,
            SourceFormat::Json,
            &options,
        )
        .unwrap();
        assert_eq!((doc.title.as_deref(), doc.text.as_str()), (Some("N"), "B"));
    }

    #[test]
    fn json_errors() {
        let error = parse(br#"{"text": "unterminated"#, SourceFormat::Json).unwrap_err();
        assert!(matches!(error, ParseError::InvalidJson(_)), "{error}");
        assert_eq!(error.code(), "invalid_json");
        let error = parse(br#"[1, 2]"#, SourceFormat::Json).unwrap_err();
        assert!(matches!(error, ParseError::InvalidJson(_)), "{error}");
        let error = parse(br#"[{"body": "x"}, {"text": 3}]"#, SourceFormat::Json).unwrap_err();
        assert!(
            matches!(&error, ParseError::MissingField(field) if field == "text"),
            "{error}"
        );
        assert_eq!(error.code(), "missing_field");
        assert!(error.to_string().contains("\"text\""));
    }

    #[test]
    fn jsonl_records_and_line_numbers() {
        let lines =
            b"{\"title\": \"T\", \"text\": \"one\"}\n\n{\"text\": \"two\"}\r\n{\"other\": 1}\n";
        let doc = parse(lines, SourceFormat::Jsonl).unwrap();
        assert_eq!(doc.title.as_deref(), Some("T"));
        assert_eq!(doc.text, "one\n\ntwo");

        let broken = b"{\"text\": \"one\"}\n\n{\"text\": oops}\n";
        let error = parse(broken, SourceFormat::Jsonl).unwrap_err();
        let ParseError::InvalidJson(message) = &error else {
            panic!("expected InvalidJson, got {error}");
        };
        assert!(message.starts_with("line 3:"), "{message}");

        let error = parse(b"{\"body\": \"x\"}\n", SourceFormat::Jsonl).unwrap_err();
        assert!(matches!(error, ParseError::MissingField(_)));
    }

    #[test]
    fn encodings_flow_through_parse_document() {
        let doc = parse(&encode(GBK, CHINESE), SourceFormat::Text).unwrap();
        assert_eq!((doc.text.as_str(), doc.encoding), (CHINESE, "GBK"));
        let doc = parse(
            &utf16le("# Title\r\n\r\nbody", true),
            SourceFormat::Markdown,
        )
        .unwrap();
        assert_eq!(doc.text, "# Title\n\nbody");
        assert_eq!(doc.title.as_deref(), Some("Title"));
        assert_eq!(doc.encoding, "UTF-16LE");
    }

    /// Found by the `decode_text` fuzz target: a U+FEFF inside the text was kept when the
    /// text had no other control character and dropped when it had one.
    #[test]
    fn byte_order_marks_inside_the_text_are_dropped() {
        let (text, encoding) = decode_text(b"\xef\xbb\xbfline one\xef\xbb\xbf line two").unwrap();
        assert_eq!((text.as_str(), encoding), ("line one line two", "UTF-8"));
        let (text, _) = decode_text(b"line one\xef\xbb\xbf\x1a line two").unwrap();
        assert_eq!(text, "line one line two");
    }

    /// Found by the `parse_html` fuzz target: character references to control characters
    /// (`&#x4;`) put them in the text, which decoding had cleaned of them.
    #[test]
    fn html_character_references_to_control_characters_are_dropped() {
        let doc = parse(
            b"<title>T&#7;itle</title><p>a&#x4;b &#1;c</p><pre>x&#12;y&#13;z&#13;&#10;w</pre>",
            SourceFormat::Html,
        )
        .unwrap();
        assert_eq!(doc.title.as_deref(), Some("Title"));
        assert!(doc.text.starts_with("ab c\n"), "{:?}", doc.text);
        assert!(doc.text.contains("x\ny\nz\nw"), "{:?}", doc.text);
        assert!(!doc.text.chars().any(|c| c.is_control() && c != '\n'));
    }

    /// The same for JSON escapes (`"\u0000"`), found by reading the code the fuzz target
    /// pointed at.
    #[test]
    fn json_escapes_of_control_characters_are_dropped() {
        let doc = parse(
            br#"{"title": "T\u0007", "text": "a\u0000b\r\nc\u000cd\ufeff"}"#,
            SourceFormat::Json,
        )
        .unwrap();
        assert_eq!(doc.title.as_deref(), Some("T"));
        assert_eq!(doc.text, "ab\nc\nd");
        let doc = parse(b"{\"text\": \"x\\u0001\"}\n", SourceFormat::Jsonl).unwrap();
        assert_eq!(doc.text, "x");
    }

    #[test]
    fn stray_form_feeds_are_dropped() {
        let (text, _) =
            decode_text(b"page one of the report\x0cpage two of the report\x1a").unwrap();
        assert_eq!(text, "page one of the report\npage two of the report");
    }

    #[test]
    fn replacing_a_marker_keeps_the_page_ranges_on_their_pages() {
        let text = "# Slide 1\n\n[sift-picture-1]\n\n# Slide 2\n\n[sift-picture-2]\n";
        let second = text.find("# Slide 2").unwrap();
        let page = |number, start, end| Page {
            number,
            start,
            end,
            heading_path: Vec::new(),
        };
        let mut parsed = ParsedDocument {
            title: None,
            text: text.to_string(),
            markdown: true,
            encoding: "PPTX",
            pages: vec![page(1, 0, second), page(2, second, text.len())],
            scanned_pages: Vec::new(),
            pictures: Vec::new(),
        };
        parsed.replace_marker("[sift-picture-1]", "HARBOUR NOTICE: the pier is closed");
        parsed.replace_marker("[sift-picture-2]", "");
        parsed.replace_marker("[sift-picture-3]", "never placed");
        let slides: Vec<&str> = parsed
            .pages
            .iter()
            .map(|page| &parsed.text[page.start..page.end])
            .collect();
        assert_eq!(
            slides,
            [
                "# Slide 1\n\nHARBOUR NOTICE: the pier is closed\n\n",
                "# Slide 2\n\n\n"
            ]
        );
    }
}
