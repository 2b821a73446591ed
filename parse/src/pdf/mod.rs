//! PDF -> text page by page, with the outline (bookmarks) as the heading path.
//!
//! [`parse_pdf`] is what uploads and ingestion call. `pdf_oxide` (pure Rust, ADR 0024) reads
//! the file; we take each page's text in reading order ([`extract`]), undo hyphenation at line
//! ends ([`clean`]) and record where each page lies in the document text
//! ([`ParsedDocument::pages`]) so that chunks carry their page range.
//!
//! A PDF is untrusted input handed to a large parser, so it runs under [`PdfLimits`] and a
//! guard: on a thread of its own with a big stack (deeply nested objects recurse), inside
//! `catch_unwind` (a parser panic fails the document, not the node), with a page cap checked
//! before any page is read and a time budget checked between pages and enforced by the caller's
//! wait. A page that never finishes cannot be stopped from inside the process, so a node run
//! from the `sift` binary parses each PDF in a child process that is killed at the budget
//! ([`crate::worker`], [`PdfLimits::worker`]), with its address space capped
//! ([`PdfLimits::worker_memory_bytes`]) so that a decompression bomb ends the worker, not the
//! node's memory; without one (a node inside a test binary) the caller
//! gives up on the thread at the budget and leaves it to end on its own.
//!
//! Failures are [`ParseError`]s with their own codes: `encrypted_pdf` (a password is needed;
//! an empty user password opens by itself), `invalid_pdf`, `pdf_too_large` (page cap or time
//! budget) and `no_text_layer` (no page has text and [`PdfLimits::scanned`] refuses scans:
//! no OCR engine). Pages without text are listed with their saved images
//! ([`Scanned::SaveImages`]) for the OCR engine the ingestion pipeline calls, which renders
//! those that no one image covers.

// Without the `pdf` feature (the fuzz build of the other parsers) only the page cleaning and
// the scan check are left, unused.
#[cfg_attr(not(feature = "pdf"), allow(dead_code))]
mod clean;
#[cfg(feature = "pdf")]
mod extract;
#[cfg_attr(not(feature = "pdf"), allow(dead_code))]
mod garbled;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::parse::{ParseError, ParsedDocument};
use crate::worker::{Abandoned, on_guarded_thread};

#[cfg(feature = "pdf")]
pub use self::extract::extract_pdf;
pub use crate::worker::MIN_WORKER_MEMORY_BYTES;

/// Bounds on the work one PDF may cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdfLimits {
    /// A PDF with more pages is refused (`pdf_too_large`) before any page is read.
    pub max_pages: usize,
    /// Longest parsing may take, all pages together (`pdf_too_large` past it).
    pub time_budget: Duration,
    /// The program to parse in (the `sift` binary, run as `sift __parse pdf ...`): each PDF
    /// (and each `.xls` workbook, under the same budget and memory cap) is parsed in a child
    /// process killed at the budget. `None`: on a guarded thread here.
    pub worker: Option<PathBuf>,
    /// Memory a worker may take beyond what it holds when it starts (its address space is
    /// capped there, `RLIMIT_AS`); a PDF that needs more fails with `pdf_too_large`. Only a
    /// worker is held to it: a thread of the node cannot be.
    pub worker_memory_bytes: u64,
    /// What becomes of pages without a text layer.
    pub scanned: Scanned,
    /// Told of the pages as they are read.
    pub report: PageReport,
}

/// Told of a PDF's pages as they are read, `(pages read, pages in all)`: after every page of
/// a PDF of up to [`REPORTED_STEPS`] pages; of a longer one, after every `s`-th page, `s` the
/// smallest step that makes at most [`REPORTED_STEPS`] reports, and after the last. Called on the parsing thread (or, with a worker, on the
/// thread that reads its replies). It is no limit: two reports never make limits differ.
#[derive(Clone, Default)]
pub struct PageReport(Option<Arc<dyn Fn(u32, u32) + Send + Sync>>);

/// Most reports of one PDF's pages, the last one aside.
pub const REPORTED_STEPS: u32 = 50;

impl PageReport {
    pub fn new(report: impl Fn(u32, u32) + Send + Sync + 'static) -> Self {
        PageReport(Some(Arc::new(report)))
    }

    /// Page `done` of `total` is read: tells it when it is a step (see the type's docs).
    #[cfg_attr(not(feature = "pdf"), allow(dead_code))]
    pub(crate) fn page_read(&self, done: u32, total: u32) {
        if let Some(report) = &self.0 {
            let step = total.div_ceil(REPORTED_STEPS).max(1);
            if done == total || done.is_multiple_of(step) {
                report(done, total);
            }
        }
    }

    /// Tells `(done, total)` as it is (a worker's report, already a step).
    pub(crate) fn tell(&self, done: u32, total: u32) {
        if let Some(report) = &self.0 {
            report(done, total);
        }
    }
}

impl std::fmt::Debug for PageReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PageReport(set)"
        } else {
            "PageReport(none)"
        })
    }
}

impl PartialEq for PageReport {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PageReport {}

/// What a parse does with pages that have no text layer (scans). Each is listed in
/// [`ParsedDocument::scanned_pages`] whatever the choice; a page that draws nothing (an
/// empty content stream) is blank, not a scan, and is not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scanned {
    /// A PDF where no page has text is `no_text_layer` (no OCR engine to read it).
    #[default]
    Refuse,
    /// A PDF where no page has text is a document with empty text and every page scanned
    /// (an OCR engine will read them; used to check an upload).
    Accept,
    /// As `Accept`, and each scanned page's image, when it has exactly one the parser can
    /// read, is saved in this folder (`page-N.png` or `page-N.jpg`) for OCR, with whether it
    /// covers the page and the page's size (see [`ScannedPage`]); a page with no image, or
    /// several, is listed without one (to be rendered whole).
    ///
    /// [`ScannedPage`]: crate::parse::ScannedPage
    SaveImages(PathBuf),
}

impl Default for PdfLimits {
    fn default() -> Self {
        PdfLimits {
            max_pages: 2_000,
            time_budget: Duration::from_secs(120),
            worker: None,
            worker_memory_bytes: DEFAULT_WORKER_MEMORY_BYTES,
            scanned: Scanned::Refuse,
            report: PageReport::default(),
        }
    }
}

/// Default of [`PdfLimits::worker_memory_bytes`]: 1 GiB, several times what the largest PDFs
/// of the comparison in ADR 0024 needed.
pub const DEFAULT_WORKER_MEMORY_BYTES: u64 = 1 << 30;

/// Stack of the parsing thread. `pdf_oxide` recurses over nested objects and content streams
/// with depth limits of its own; this leaves them room on any input (the threads of a runtime
/// have 2 MiB).
const PARSER_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Extra wait past the budget for the parser to notice it at a page boundary.
pub(crate) const BUDGET_GRACE: Duration = Duration::from_secs(1);

/// Longest message of the parser kept in an `invalid_pdf` reason.
const MAX_REASON_CHARS: usize = 300;

/// Parses `bytes` as a PDF under `limits`, in the worker process when `limits` names one,
/// else on a guarded thread (see the module docs).
pub fn parse_pdf(bytes: &[u8], limits: &PdfLimits) -> Result<ParsedDocument, ParseError> {
    match &limits.worker {
        Some(program) => crate::worker::parse_pdf_in_child(program, bytes, limits),
        None => parse_on_thread(bytes, limits),
    }
}

/// Parses `bytes` on a thread with a big stack, inside `catch_unwind`, waiting at most the
/// budget (plus [`BUDGET_GRACE`]) for it.
pub(crate) fn parse_on_thread(
    bytes: &[u8],
    limits: &PdfLimits,
) -> Result<ParsedDocument, ParseError> {
    let owned = bytes.to_vec();
    let thread_limits = limits.clone();
    let deadline = Instant::now() + limits.time_budget;
    let parsed = on_guarded_thread(
        "sift-pdf",
        PARSER_STACK_BYTES,
        limits.time_budget + BUDGET_GRACE,
        move || extract_pdf(owned, &thread_limits, deadline),
    );
    match parsed {
        Ok(result) => result,
        Err(Abandoned::Panicked(detail)) => Err(ParseError::InvalidPdf(reason(&format!(
            "the parser failed on it ({detail})"
        )))),
        Err(Abandoned::OverBudget) => Err(over_budget(limits)),
        Err(Abandoned::Lost(detail)) => Err(ParseError::InvalidPdf(detail)),
    }
}

pub(crate) fn over_budget(limits: &PdfLimits) -> ParseError {
    ParseError::PdfTooLarge(budget_detail(limits))
}

/// Why a parse past the budget of `limits` failed (a PDF's, or an `.xls` workbook's).
pub(crate) fn budget_detail(limits: &PdfLimits) -> String {
    format!(
        "parsing it takes longer than the {} s budget (pdf_parse_timeout_ms)",
        limits.time_budget.as_secs_f64()
    )
}

/// `message` cut to [`MAX_REASON_CHARS`], for a reason shown to users.
pub(crate) fn reason(message: &str) -> String {
    match message.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message.to_string(),
    }
}

/// A build without the `pdf` feature (sift-parse's default) has no PDF reader: every PDF is
/// refused as `unsupported_type`. Only the fuzz build of the other parsers leaves it out.
#[cfg(not(feature = "pdf"))]
pub fn extract_pdf(
    _bytes: Vec<u8>,
    _limits: &PdfLimits,
    _deadline: Instant,
) -> Result<ParsedDocument, ParseError> {
    Err(ParseError::UnsupportedType(
        "PDF (this build has no PDF reader: sift-parse's `pdf` feature is off)".into(),
    ))
}

#[cfg(all(test, feature = "pdf"))]
mod tests;
