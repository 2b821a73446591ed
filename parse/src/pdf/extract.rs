//! One PDF's pages and outline, read with `pdf_oxide`, unguarded (the caller guards).

use std::time::Instant;

use std::path::{Path, PathBuf};

use pdf_oxide::PdfDocument;
use pdf_oxide::converters::ConversionOptions;
use pdf_oxide::error::Error as PdfError;
use pdf_oxide::extractors::ImageData;
use pdf_oxide::outline::{Destination, OutlineItem};

use super::clean::{clean_page_text, strip_running_lines};
use super::garbled::is_garbled;
use super::{PdfLimits, Scanned, over_budget, reason};
use crate::parse::{Page, ParseError, ParsedDocument, ScannedPage};

/// Outline items read at most; the rest of a larger outline is ignored.
const MAX_OUTLINE_ITEMS: usize = 10_000;
/// Outline levels kept in a heading path; deeper items are ignored.
const MAX_OUTLINE_DEPTH: usize = 8;
/// Longest outline title kept, in chars.
const MAX_TITLE_CHARS: usize = 200;
/// Largest page image saved for OCR, in pixels (as an image upload's cap).
const MAX_PAGE_IMAGE_PIXELS: u64 = 100_000_000;
/// Share of a page's area its one image must cover for reading the image to read the page.
const COVERING_SHARE: f64 = 0.75;
/// Longest page side taken as a page's size, in points (PDF's own limit is 14,400).
const MAX_PAGE_SIDE_POINTS: f32 = 200_000.0;

/// Reads every page's text of the PDF in `bytes`, checking `limits` (page cap first, then
/// `deadline` between pages). Runs on the caller's thread with no guard: [`super::parse_pdf`]
/// is the guarded entry; this one is for it and for fuzzing, where a panic is a finding.
pub fn extract_pdf(
    bytes: Vec<u8>,
    limits: &PdfLimits,
    deadline: Instant,
) -> Result<ParsedDocument, ParseError> {
    let document = PdfDocument::from_bytes(bytes).map_err(classify)?;
    // An empty user password is tried on opening; a document still locked needs a real one.
    if document.is_encrypted() && !document.is_authenticated() {
        return Err(ParseError::EncryptedPdf);
    }
    let page_count = document.page_count().map_err(classify)?;
    if page_count == 0 {
        return Err(ParseError::InvalidPdf("it has no pages".into()));
    }
    if page_count > limits.max_pages {
        return Err(ParseError::PdfTooLarge(format!(
            "{page_count} pages; the limit is {} (pdf_max_pages)",
            limits.max_pages
        )));
    }
    let headings = page_headings(&document, page_count);
    let mut texts: Vec<(usize, String)> = Vec::with_capacity(page_count);
    for index in 0..page_count {
        if Instant::now() >= deadline {
            return Err(over_budget(limits));
        }
        check_content_stream(&document, index, page_count)?;
        // A page with a table (ruled, or text laid out as a grid) is read as Markdown, the
        // table as a Markdown table in its place; other pages as plain text.
        let raw = match page_with_tables(&document, index) {
            Some(markdown) => Ok(markdown),
            None => document.extract_text(index),
        };
        let raw = match raw {
            Ok(raw) => raw,
            Err(PdfError::EncryptedPdf) => return Err(ParseError::EncryptedPdf),
            Err(error) => {
                // A page that cannot be read (a truncated file, a broken page tree) fails the
                // document: a knowledge base silently missing pages would cite around them.
                return Err(ParseError::InvalidPdf(reason(&format!(
                    "page {} of {page_count} cannot be read: {error}",
                    index + 1
                ))));
            }
        };
        texts.push((index, clean_page_text(&raw)));
        limits.report.page_read(index as u32 + 1, page_count as u32);
    }
    // Running headers and footers are known only once every page is read.
    let mut page_texts: Vec<String> = texts.iter_mut().map(|(_, t)| std::mem::take(t)).collect();
    strip_running_lines(&mut page_texts);
    let mut text = String::new();
    let mut pages = Vec::new();
    let mut scanned_pages = Vec::new();
    for ((index, _), page_text) in texts.iter().zip(page_texts) {
        let index = *index;
        // A garbled text layer (fonts without a usable map to characters) is no text: the
        // page goes to OCR as a scan does, its text left out.
        if page_text.is_empty() || is_garbled(&page_text) {
            // A page that draws nothing is blank, not a scan.
            if draws_nothing(&document, index) {
                continue;
            }
            let heading_path = headings.get(index).cloned().unwrap_or_default();
            let number = (index + 1) as u32;
            match &limits.scanned {
                Scanned::SaveImages(folder) => {
                    if Instant::now() >= deadline {
                        return Err(over_budget(limits));
                    }
                    let size_points = page_size(&document, index);
                    let (image, image_covers_page) =
                        save_page_image(&document, index, size_points, folder)?;
                    scanned_pages.push(ScannedPage {
                        number,
                        heading_path,
                        image,
                        image_covers_page,
                        size_points,
                    });
                }
                Scanned::Refuse | Scanned::Accept => scanned_pages.push(ScannedPage {
                    number,
                    heading_path,
                    image: None,
                    image_covers_page: false,
                    size_points: None,
                }),
            }
            continue;
        }
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        let start = text.len();
        text.push_str(&page_text);
        pages.push(Page {
            number: (index + 1) as u32,
            start,
            end: text.len(),
            heading_path: headings.get(index).cloned().unwrap_or_default(),
        });
    }
    if pages.is_empty() && limits.scanned == Scanned::Refuse {
        return Err(ParseError::NoTextLayer);
    }
    Ok(ParsedDocument {
        title: None,
        text,
        markdown: false,
        encoding: "PDF",
        pages,
        scanned_pages,
        pictures: Vec::new(),
    })
}

/// Page `index` as Markdown when the parser finds a table on it (its cells in a Markdown table
/// where the table stands, headings left to the outline); `None` for a page without one, or
/// one the Markdown rendering fails on (read as plain text then).
fn page_with_tables(document: &PdfDocument, index: usize) -> Option<String> {
    let tables = document.extract_tables(index).ok()?;
    if tables.is_empty() {
        return None;
    }
    let options = ConversionOptions {
        detect_headings: false,
        extract_tables: true,
        ..ConversionOptions::default()
    };
    document.to_markdown(index, &options).ok()
}

/// Whether page `index` draws nothing at all (its content stream is empty): a blank page.
/// A page whose content cannot be read is taken as drawing something.
fn draws_nothing(document: &PdfDocument, index: usize) -> bool {
    document
        .get_page_content_data(index)
        .is_ok_and(|content| content.iter().all(u8::is_ascii_whitespace))
}

/// Width and height of page `index` in points, rounded up, from its `MediaBox`; `None` when
/// it has none the parser reads, or an empty or absurd one.
fn page_size(document: &PdfDocument, index: usize) -> Option<(u32, u32)> {
    let (x0, y0, x1, y1) = document.get_page_media_box(index).ok()?;
    let side = |from: f32, to: f32| {
        let length = (to - from).abs().ceil();
        // NaN and infinities are outside the range too.
        (1.0..=MAX_PAGE_SIDE_POINTS)
            .contains(&length)
            .then_some(length as u32)
    };
    Some((side(x0, x1)?, side(y0, y1)?))
}

/// Saves the image of page `index` in `folder` as `page-N.jpg` (a JPEG stream, as stored) or
/// `page-N.png` when the page has exactly one image the parser can read, and says whether it
/// covers the page (see [`ScannedPage::image_covers_page`]); `(None, false)` for a page
/// with none, or several (a tiled scan: no one image holds the page).
fn save_page_image(
    document: &PdfDocument,
    index: usize,
    size_points: Option<(u32, u32)>,
    folder: &Path,
) -> Result<(Option<PathBuf>, bool), ParseError> {
    let nothing = Ok((None, false));
    let Ok(mut images) = document.extract_images(index) else {
        return nothing;
    };
    if images.len() != 1 {
        return nothing;
    }
    let image = images.remove(0);
    if u64::from(image.width()) * u64::from(image.height()) > MAX_PAGE_IMAGE_PIXELS {
        return nothing;
    }
    let covers = match (image.bbox(), size_points) {
        (Some(bbox), Some((width, height))) => {
            let drawn = f64::from(bbox.width.abs()) * f64::from(bbox.height.abs());
            drawn >= COVERING_SHARE * f64::from(width) * f64::from(height)
        }
        // Where it is drawn, or the page's size, is unknown: taken as the page.
        _ => true,
    };
    let (bytes, extension) = match image.data() {
        ImageData::Jpeg(bytes) => (bytes.clone(), "jpg"),
        ImageData::Raw { .. } => match image.to_png_bytes() {
            Ok(bytes) => (bytes, "png"),
            Err(_) => return nothing,
        },
    };
    if bytes.is_empty() {
        return nothing;
    }
    let path = folder.join(format!("page-{}.{extension}", index + 1));
    std::fs::write(&path, bytes).map_err(|error| {
        ParseError::InvalidPdf(format!(
            "the image of page {} could not be saved for OCR: {error}",
            index + 1
        ))
    })?;
    Ok((Some(path), covers))
}

/// Refuses page `index` when its content stream decodes past pdf_oxide's cap on one
/// FlateDecode stream (256 MiB, `FlateDecoder`'s `DEFAULT_MAX_DECOMPRESSED_BYTES`): its text
/// extraction reads such a page as empty, which would make a flate bomb a "scanned" page (or a
/// `no_text_layer` document) instead of a refusal. pdf_oxide keeps the decoded bytes of a page
/// that passes, so the extraction after this does not decode them again. Other decoding errors
/// are left to the extraction, as before. A stream inside an array of content streams or in a
/// form XObject is skipped by pdf_oxide without an error and is not seen here.
fn check_content_stream(
    document: &PdfDocument,
    index: usize,
    page_count: usize,
) -> Result<(), ParseError> {
    match document.get_page_content_data(index) {
        // pdf_oxide's only sign of its cap is the message of a `Decode` error.
        Err(PdfError::Decode(message)) if message.contains("safety limit") => {
            Err(ParseError::PdfTooLarge(reason(&format!(
                "page {} of {page_count}: {message}",
                index + 1
            ))))
        }
        _ => Ok(()),
    }
}

/// The parser's error as ours: a locked document, or one we cannot read.
fn classify(error: PdfError) -> ParseError {
    match error {
        PdfError::EncryptedPdf => ParseError::EncryptedPdf,
        other => ParseError::InvalidPdf(reason(&other.to_string())),
    }
}

/// The heading path of every page (0-based index) from the outline: the path of the last
/// outline item (in page order, then outline order) that points at this page or an earlier
/// one. No outline, or one that cannot be read: no headings.
fn page_headings(document: &PdfDocument, page_count: usize) -> Vec<Vec<String>> {
    let mut headings = vec![Vec::new(); page_count];
    let Ok(Some(outline)) = document.get_outline() else {
        return headings;
    };
    // (page index, path) of every item with a page, in outline order. The outline is
    // untrusted: walked with an explicit stack and bounded in items and depth.
    let mut marks: Vec<(usize, Vec<String>)> = Vec::new();
    let mut stack: Vec<(&OutlineItem, Vec<String>)> = outline
        .iter()
        .rev()
        .map(|item| (item, Vec::new()))
        .collect();
    let mut seen = 0;
    while let Some((item, mut path)) = stack.pop() {
        seen += 1;
        if seen > MAX_OUTLINE_ITEMS {
            break;
        }
        let title = outline_title(&item.title);
        if title.is_empty() || path.len() >= MAX_OUTLINE_DEPTH {
            continue;
        }
        path.push(title);
        let page = match &item.dest {
            Some(Destination::PageIndex(index)) => Some(*index),
            Some(Destination::Named(name)) => {
                document.resolve_named_destination(name).ok().flatten()
            }
            None => None,
        };
        if let Some(page) = page.filter(|page| *page < page_count) {
            marks.push((page, path.clone()));
        }
        for child in item.children.iter().rev() {
            stack.push((child, path.clone()));
        }
    }
    marks.sort_by_key(|(page, _)| *page); // stable: outline order within a page
    let mut marks = marks.into_iter().peekable();
    let mut current = Vec::new();
    for (index, heading) in headings.iter_mut().enumerate() {
        while let Some((_, path)) = marks.next_if(|(page, _)| *page <= index) {
            current = path;
        }
        heading.clone_from(&current);
    }
    headings
}

/// An outline title on one line: control characters dropped, whitespace collapsed, at most
/// [`MAX_TITLE_CHARS`] chars.
fn outline_title(title: &str) -> String {
    let words: Vec<&str> = title.split_whitespace().collect();
    words
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_TITLE_CHARS)
        .collect()
}
