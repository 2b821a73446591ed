//! Word, PowerPoint, spreadsheets (Excel, OpenDocument, CSV) and EPUB -> Markdown.
//!
//! Every format here becomes Markdown text ([`ParsedDocument::markdown`]) so that the chunker's
//! structure awareness does the rest, as it does for HTML (ADR 0026): headings become the
//! heading path, a Markdown table is never split, list items stay together.
//!
//! | format | headings | also kept |
//! |---|---|---|
//! | `.docx` ([`docx`]) | paragraph styles `Title`, `Heading 1`-`9` (or an outline level) | lists, tables, comments, footnotes and endnotes after the paragraph they mark; headers and footers once, at the end |
//! | `.pptx` ([`pptx`]) | `# Slide N: title` per slide | bullets, tables, speaker notes and comments under their slide |
//! | `.xlsx` `.xls` `.ods` `.csv` ([`sheet`]) | `# sheet name` | one record per row: `Row N: Header: value; ...` (a large `.csv`, `.xlsx` or `.ods` file read a run of rows at a time: [`stream_records`]) |
//! | `.epub` ([`epub`]) | the chapters' own HTML headings | lists, tables (through the HTML converter) |
//!
//! Zip containers are untrusted: [`container::Container`] refuses more than
//! [`OfficeLimits::max_entries`] entries and stops inflating at
//! [`OfficeLimits::max_unpacked_bytes`] in total, measured while reading (never from the sizes
//! the archive declares), so a zip bomb fails with `document_too_large`. Spreadsheets stop at
//! [`OfficeLimits::max_rows`] rows and [`OfficeLimits::max_cells`] cells.
//!
//! The content must be what the name says ([`sniff`]): an old binary `.doc`/`.ppt` (an OLE
//! compound file) is `unsupported_type` naming the format; a `.docx` that is really a PDF, plain
//! text or a spreadsheet is refused with `content_mismatch` naming what it is, rather than
//! parsed as something else (the document's recorded format and its file name would disagree).
//!
//! An Excel 97-2003 workbook (`.xls`) is read by calamine's OLE reader, which loops without
//! end on a crafted sector chain (found by fuzzing): [`parse_xls`] runs it in a parse worker
//! process killed at the time budget ([`crate::worker`], ADR 0030), or on a guarded thread
//! abandoned at the budget when there is no worker program.

mod container;
mod docx;
mod epub;
mod markdown;
mod pptx;
mod sheet;
mod xml;

#[cfg(test)]
mod tests;

use self::container::Container;
use self::markdown::MarkdownOut;
use crate::image::{ImageLimits, check_image};
use crate::parse::{
    ParseError, ParsedDocument, Picture, SourceFormat, clean_extracted, trim_blank_lines,
};
use crate::pdf::{PdfLimits, budget_detail};
use crate::worker::{Abandoned, on_guarded_thread};

/// Bounds on the work one Office or EPUB file may cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfficeLimits {
    /// Bytes inflated from a zip container, all entries together (`document_too_large` past it).
    pub max_unpacked_bytes: u64,
    /// Entries a zip container may list (`document_too_large` past it).
    pub max_entries: usize,
    /// Spreadsheet rows, all sheets together (`document_too_large` past it).
    pub max_rows: usize,
    /// Spreadsheet cells with a value, all sheets together (`document_too_large` past it).
    pub max_cells: usize,
}

impl Default for OfficeLimits {
    fn default() -> Self {
        OfficeLimits {
            max_unpacked_bytes: 256 * 1024 * 1024,
            max_entries: 10_000,
            max_rows: 200_000,
            max_cells: 2_000_000,
        }
    }
}

/// What the first bytes of a file say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// A zip archive (docx, pptx, xlsx, ods, epub, or any other zip).
    Zip,
    /// An OLE compound file (doc, ppt, xls, msg).
    Ole,
    Pdf,
    /// Anything else: text, or a binary format we do not name.
    Other,
}

const OLE_MAGIC: &[u8] = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1";

pub(crate) fn sniff(bytes: &[u8]) -> Sniffed {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        Sniffed::Zip
    } else if bytes.starts_with(OLE_MAGIC) {
        Sniffed::Ole
    } else if bytes.starts_with(b"%PDF-") {
        Sniffed::Pdf
    } else {
        Sniffed::Other
    }
}

/// The name of an old binary Office format for a file name, e.g. `"x.doc"` ->
/// `"a Word 97-2003 document (.doc)"`: formats we know and refuse with `unsupported_type`.
pub fn legacy_office_format(file_name: &str) -> Option<&'static str> {
    let (_, extension) = file_name.rsplit_once('.')?;
    match extension.to_ascii_lowercase().as_str() {
        "doc" | "dot" => Some("a Word 97-2003 document (.doc)"),
        "ppt" | "pps" | "pot" => Some("a PowerPoint 97-2003 presentation (.ppt)"),
        _ => None,
    }
}

/// The newer format to save an old binary one (as [`legacy_office_format`] names it) as.
pub fn legacy_save_as(format_name: &str) -> &'static str {
    if format_name.contains("Word") {
        ".docx"
    } else {
        ".pptx"
    }
}

/// The `unsupported_type` message for an old binary Office format.
pub fn legacy_office_message(format_name: &str, save_as: &str) -> String {
    format!("{format_name} is an old binary format that is not supported: save it as {save_as}")
}

/// Parses an Office, spreadsheet or EPUB file of `format` under `limits` (an `.xls`
/// workbook: see [`parse_xls`]).
pub(crate) fn parse_office(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
) -> Result<ParsedDocument, ParseError> {
    check_content(bytes, format)?;
    parse_checked(bytes, format, limits)
}

pub use self::sheet::{RecordRun, RecordSink};

/// Whether a file of `format` can be read a run of rows at a time ([`stream_records`]).
pub fn streams_records(format: SourceFormat) -> bool {
    matches!(
        format,
        SourceFormat::Csv | SourceFormat::Xlsx | SourceFormat::Ods
    )
}

/// Reads a CSV, XLSX or ODS file row by row, handing its records to `sink` in runs of about
/// `run_bytes` of Markdown (each within one sheet), under the limits of the whole-file
/// parse, whose Markdown the runs make together. For files too large to hold parsed whole:
/// memory stays at the file and one run (an XLSX file's shared strings, an ODS file's
/// largest sheet). An error from `sink` stops the reading and is returned.
pub fn stream_records(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
    run_bytes: usize,
    sink: &mut RecordSink<'_>,
) -> Result<(), ParseError> {
    if !streams_records(format) {
        return Err(ParseError::UnsupportedType(format!(
            "{} is not read row by row",
            format.as_str()
        )));
    }
    check_content(bytes, format)?;
    let mut runs = 0usize;
    let mut counted = |run: RecordRun<'_>| {
        runs += 1;
        sink(run)
    };
    // calamine and zip are large parsers of hostile input: a panic in one fails this
    // document, not the caller's thread (as in `parse_checked`).
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sheet::stream_records(bytes, format, limits, run_bytes, &mut counted)
    }))
    .map_err(|_| {
        ParseError::InvalidDocument(format!(
            "the {} parser failed on this file",
            format_label(format)
        ))
    })??;
    if runs == 0 {
        return Err(ParseError::Empty);
    }
    Ok(())
}

/// Parses an Excel 97-2003 workbook under `limits`, in the worker process of `process` when
/// it names one (killed past its budget, its memory capped), else on a guarded thread
/// abandoned at the budget.
pub(crate) fn parse_xls(
    bytes: &[u8],
    limits: &OfficeLimits,
    process: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    check_content(bytes, SourceFormat::Xls)?;
    if let Some(program) = &process.worker {
        return crate::worker::parse_xls_in_child(program, bytes, limits, process);
    }
    let owned = bytes.to_vec();
    let thread_limits = limits.clone();
    let parsed = on_guarded_thread(
        "sift-xls",
        XLS_STACK_BYTES,
        process.time_budget,
        move || parse_checked(&owned, SourceFormat::Xls, &thread_limits),
    );
    match parsed {
        Ok(result) => result,
        Err(Abandoned::OverBudget) => Err(ParseError::DocumentTooLarge(budget_detail(process))),
        Err(Abandoned::Panicked(_)) => Err(ParseError::InvalidDocument(
            "the XLS parser failed on this file".into(),
        )),
        Err(Abandoned::Lost(detail)) => Err(ParseError::InvalidDocument(detail)),
    }
}

/// What a parse worker runs for an `.xls` job: the parse itself, in this process.
pub(crate) fn parse_xls_here(
    bytes: &[u8],
    limits: &OfficeLimits,
) -> Result<ParsedDocument, ParseError> {
    parse_office(bytes, SourceFormat::Xls, limits)
}

/// Stack of the thread an `.xls` workbook is parsed on without a worker.
const XLS_STACK_BYTES: usize = 8 * 1024 * 1024;

/// Parses a file whose content [`check_content`] accepted.
fn parse_checked(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
) -> Result<ParsedDocument, ParseError> {
    // The walks here are ours, but calamine and zip are large parsers of hostile input: a panic
    // in one fails this document, not the caller's thread.
    let Converted {
        title,
        markdown,
        encoding,
        pictures,
    } = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        convert(bytes, format, limits)
    }))
    .map_err(|_| {
        ParseError::InvalidDocument(format!(
            "the {} parser failed on this file",
            format_label(format)
        ))
    })??;
    let text = trim_blank_lines(&clean_extracted(&markdown));
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let title = title
        .map(|title| clean_extracted(&title).trim().to_string())
        .filter(|title| !title.is_empty());
    // Markers whose picture was not kept are gone from `text` already.
    let pictures = pictures
        .into_iter()
        .filter(|picture| text.contains(&picture.marker))
        .collect();
    let pages = match format {
        SourceFormat::Pptx => pptx::slide_pages(&text),
        _ => Vec::new(),
    };
    Ok(ParsedDocument {
        title,
        text,
        markdown: true,
        encoding,
        pages,
        scanned_pages: Vec::new(),
        pictures,
    })
}

/// Most pictures of one document kept for OCR; the rest are left out.
const MAX_PICTURES: usize = 200;
/// Pictures smaller than this on either side (icons, bullets, rules) are left out.
const MIN_PICTURE_SIDE: u32 = 48;

/// The pictures of a Word or PowerPoint file, collected as its Markdown is written: each
/// placed gets a marker paragraph, and [`Pictures::resolve`] keeps those whose bytes are an
/// image OCR can read, removing the other markers.
#[derive(Debug, Default)]
pub(crate) struct Pictures {
    /// (marker, zip path of the picture) in document order.
    placed: Vec<(String, String)>,
}

impl Pictures {
    /// Writes the marker of the picture at zip path `target` into `out`.
    pub(crate) fn place(&mut self, out: &mut MarkdownOut, target: String) {
        if self.placed.len() >= MAX_PICTURES {
            return;
        }
        let marker = format!("[sift-picture-{}]", self.placed.len() + 1);
        out.picture(&marker);
        self.placed.push((marker, target));
    }

    /// Reads each placed picture; keeps PNG, JPEG, TIFF and WebP images of a readable size
    /// (EMF, WMF, SVG and tiny images are left out) and removes the markers of the others from
    /// `markdown`.
    pub(crate) fn resolve(
        self,
        container: &mut Container<'_>,
        markdown: &mut String,
    ) -> Result<Vec<Picture>, ParseError> {
        let mut kept = Vec::new();
        for (marker, target) in self.placed {
            let picture = container.read(&target)?.and_then(|bytes| {
                let info = check_image(&bytes, &ImageLimits::default()).ok()?;
                (info.width >= MIN_PICTURE_SIDE && info.height >= MIN_PICTURE_SIDE).then_some(
                    Picture {
                        marker: marker.clone(),
                        media_type: info.media_type,
                        bytes,
                    },
                )
            });
            match picture {
                Some(picture) => kept.push(picture),
                None => *markdown = markdown.replace(&marker, ""),
            }
        }
        Ok(kept)
    }
}

/// What a converter made of a file.
struct Converted {
    title: Option<String>,
    markdown: String,
    /// The encoding label of [`ParsedDocument::encoding`].
    encoding: &'static str,
    pictures: Vec<Picture>,
}

/// The title, Markdown, encoding label and pictures of a file whose content matched its
/// format.
fn convert(
    bytes: &[u8],
    format: SourceFormat,
    limits: &OfficeLimits,
) -> Result<Converted, ParseError> {
    let (title, markdown, encoding, pictures) = match format {
        SourceFormat::Docx => {
            let (title, text, pictures) = docx::docx_to_markdown(bytes, limits)?;
            (title, text, "DOCX", pictures)
        }
        SourceFormat::Pptx => {
            let (title, text, pictures) = pptx::pptx_to_markdown(bytes, limits)?;
            (title, text, "PPTX", pictures)
        }
        SourceFormat::Xlsx | SourceFormat::Xls | SourceFormat::Ods => {
            let (title, text) = sheet::workbook_to_markdown(bytes, format, limits)?;
            (title, text, format_label(format), Vec::new())
        }
        SourceFormat::Csv => {
            let (text, encoding) = sheet::csv_to_markdown(bytes, limits)?;
            (None, text, encoding, Vec::new())
        }
        SourceFormat::Epub => {
            let (title, text) = epub::epub_to_markdown(bytes, limits)?;
            (title, text, "EPUB", Vec::new())
        }
        other => {
            return Err(ParseError::UnsupportedType(format!(
                "{} is not an Office or EPUB format",
                other.as_str()
            )));
        }
    };
    Ok(Converted {
        title,
        markdown,
        encoding,
        pictures,
    })
}

fn format_label(format: SourceFormat) -> &'static str {
    match format {
        SourceFormat::Docx => "DOCX",
        SourceFormat::Pptx => "PPTX",
        SourceFormat::Xlsx => "XLSX",
        SourceFormat::Xls => "XLS",
        SourceFormat::Ods => "ODS",
        SourceFormat::Csv => "CSV",
        SourceFormat::Epub => "EPUB",
        SourceFormat::Text => "text",
        SourceFormat::Markdown => "Markdown",
        SourceFormat::Html => "HTML",
        SourceFormat::Json => "JSON",
        SourceFormat::Jsonl => "JSON Lines",
        SourceFormat::Pdf => "PDF",
        SourceFormat::Image => "image",
    }
}

/// Refuses content that is not what `format` names (see the module docs).
fn check_content(bytes: &[u8], format: SourceFormat) -> Result<(), ParseError> {
    let sniffed = sniff(bytes);
    let expected = match format {
        SourceFormat::Docx
        | SourceFormat::Pptx
        | SourceFormat::Xlsx
        | SourceFormat::Ods
        | SourceFormat::Epub => Sniffed::Zip,
        SourceFormat::Xls => Sniffed::Ole,
        // Text: decoded by the CSV reader, which refuses binary content itself.
        _ => return Ok(()),
    };
    if sniffed == expected {
        return Ok(());
    }
    if sniffed == Sniffed::Ole {
        // An old binary Word or PowerPoint file renamed to the new extension.
        let legacy = match format {
            SourceFormat::Docx => Some(("a Word 97-2003 document (.doc)", ".docx")),
            SourceFormat::Pptx => Some(("a PowerPoint 97-2003 presentation (.ppt)", ".pptx")),
            _ => None,
        };
        if let Some((name, save_as)) = legacy {
            return Err(ParseError::UnsupportedType(legacy_office_message(
                name, save_as,
            )));
        }
    }
    let actual = match sniffed {
        Sniffed::Zip => "a zip archive (an Office Open XML, OpenDocument or EPUB file?)",
        Sniffed::Ole => "an old binary Office file (OLE compound document)",
        Sniffed::Pdf => "a PDF",
        Sniffed::Other if crate::parse::decode_text(bytes).is_ok() => "plain text",
        Sniffed::Other => "not a file of this type",
    };
    Err(ParseError::ContentMismatch {
        named: format_label(format).to_string(),
        actual: actual.to_string(),
    })
}

/// A zip container holds the parts of another format than the one named: say which.
pub(crate) fn zip_kind_mismatch(
    container: &container::Container<'_>,
    named: SourceFormat,
) -> ParseError {
    let actual = if container.has("word/document.xml") {
        "a Word document (.docx)"
    } else if container.has("ppt/presentation.xml") {
        "a PowerPoint presentation (.pptx)"
    } else if container.has("xl/workbook.xml") {
        "an Excel workbook (.xlsx)"
    } else if container.has("META-INF/container.xml") {
        "an EPUB book or OpenDocument file"
    } else if container.has("content.xml") {
        "an OpenDocument file"
    } else {
        return ParseError::InvalidDocument(format!(
            "the zip archive holds no {} parts",
            format_label(named)
        ));
    };
    ParseError::ContentMismatch {
        named: format_label(named).to_string(),
        actual: actual.to_string(),
    }
}
