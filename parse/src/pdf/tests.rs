use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::parse::{ParseOptions, SourceFormat, parse_document};

/// A fixture of `tests/fixtures/pdf/` (made by its `make.py`).
fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../tests/fixtures/pdf/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn parse(name: &str) -> Result<ParsedDocument, ParseError> {
    parse_pdf(&fixture(name), &PdfLimits::default())
}

fn page_text(document: &ParsedDocument, number: u32) -> &str {
    let page = document
        .pages
        .iter()
        .find(|page| page.number == number)
        .unwrap_or_else(|| panic!("page {number} in {:?}", document.pages));
    &document.text[page.start..page.end]
}

#[test]
fn text_comes_page_by_page_with_the_outline_as_heading_path() {
    let document = parse("three-pages.pdf").unwrap();
    assert_eq!(document.pages.len(), 3, "{document:?}");
    assert!(!document.markdown);
    assert!(page_text(&document, 1).starts_with("Harbour Lights"));
    let second = page_text(&document, 2);
    assert!(
        second.contains("Fresnel lens of the Skerryvore"),
        "{second}"
    );
    // Hyphenation at the line end undone.
    assert!(second.contains("information plate"), "{second}");
    assert!(page_text(&document, 3).contains("Spring tides"));
    let paths: Vec<&[String]> = document
        .pages
        .iter()
        .map(|page| page.heading_path.as_slice())
        .collect();
    assert_eq!(
        paths,
        [
            &["Introduction".to_string()][..],
            &["Optics".to_string()][..],
            &["Tides and weather".to_string()][..]
        ]
    );
    // Pages are in order, do not overlap and are separated by a blank line.
    for pair in document.pages.windows(2) {
        assert_eq!(&document.text[pair[0].end..pair[1].start], "\n\n");
    }
}

#[test]
fn a_pdf_without_outline_has_pages_without_headings() {
    let document = parse("no-outline.pdf").unwrap();
    assert_eq!(document.pages.len(), 3);
    assert!(
        document
            .pages
            .iter()
            .all(|page| page.heading_path.is_empty())
    );
}

#[test]
fn parse_document_reads_pdf_from_its_bytes() {
    let document = parse_document(
        &fixture("three-pages.pdf"),
        SourceFormat::Pdf,
        &ParseOptions::default(),
    )
    .unwrap();
    assert_eq!(document.pages.len(), 3);
    assert_eq!(
        SourceFormat::from_file_name("Report.PDF"),
        Some(SourceFormat::Pdf)
    );
    assert_eq!(
        SourceFormat::from_media_type("application/pdf; name=x"),
        Some(SourceFormat::Pdf)
    );
    assert_eq!(SourceFormat::from_name("pdf"), Some(SourceFormat::Pdf));
}

#[test]
fn an_empty_user_password_opens_a_real_one_is_refused() {
    let document = parse("empty-password.pdf").unwrap();
    assert!(page_text(&document, 2).contains("Skerryvore"));
    let error = parse("encrypted.pdf").unwrap_err();
    assert_eq!(error.code(), "encrypted_pdf", "{error}");
}

#[test]
fn broken_files_are_invalid_pdf() {
    for name in ["corrupt.pdf", "truncated.pdf"] {
        let error = parse(name).unwrap_err();
        assert_eq!(error.code(), "invalid_pdf", "{name}: {error}");
    }
    for bytes in [
        &b""[..],
        b"%PDF-",
        b"not a pdf at all",
        b"%PDF-1.4\n1 0 obj\n<<",
    ] {
        let error = parse_pdf(bytes, &PdfLimits::default()).unwrap_err();
        assert_eq!(error.code(), "invalid_pdf", "{bytes:?}: {error}");
    }
}

#[test]
fn a_page_without_text_is_no_text_layer() {
    let error = parse("scanned.pdf").unwrap_err();
    assert_eq!(error.code(), "no_text_layer", "{error}");
}

#[test]
fn scanned_pages_are_listed_and_their_images_saved_when_asked() {
    // Refused by default when no page has text; listed when some page has.
    let error = parse("notice-scan.pdf").unwrap_err();
    assert_eq!(error.code(), "no_text_layer", "{error}");
    let mixed = parse("mixed-scan.pdf").unwrap();
    assert!(
        page_text(&mixed, 1).starts_with("Port handbook"),
        "{mixed:?}"
    );
    assert_eq!(mixed.pages.len(), 1);
    assert_eq!(mixed.scanned_pages.len(), 1);
    assert_eq!(mixed.scanned_pages[0].number, 2);
    assert_eq!(mixed.scanned_pages[0].image, None);

    // Accepted (an OCR engine will read it): empty text, every page scanned.
    let accept = PdfLimits {
        scanned: Scanned::Accept,
        ..PdfLimits::default()
    };
    let scan = parse_pdf(&fixture("notice-scan.pdf"), &accept).unwrap();
    assert!(scan.text.is_empty() && scan.pages.is_empty(), "{scan:?}");
    assert_eq!(scan.scanned_pages.len(), 1);

    // Saved: the page's one image, whole, in the folder given, with the page's size; it
    // covers a fifth of the page (the page is better rendered whole).
    let folder = tempfile::tempdir().unwrap();
    let save = PdfLimits {
        scanned: Scanned::SaveImages(folder.path().to_path_buf()),
        ..PdfLimits::default()
    };
    for (name, number) in [("notice-scan.pdf", 1), ("mixed-scan.pdf", 2)] {
        let parsed = parse_pdf(&fixture(name), &save).unwrap();
        let page = &parsed.scanned_pages[0];
        assert_eq!(page.number, number, "{name}");
        assert_eq!(page.size_points, Some((612, 792)), "{name}");
        assert!(!page.image_covers_page, "{name}");
        let image = page.image.as_deref().expect("an image saved");
        assert_eq!(image.parent(), Some(folder.path()), "{name}");
        let bytes = std::fs::read(image).unwrap();
        let info = crate::image::check_image(&bytes, &Default::default()).unwrap();
        assert_eq!((info.width, info.height), (1000, 360), "{name}");
    }
    // A page whose only image is 8 × 8 grey is still a scan with its image.
    let tiny = parse_pdf(&fixture("scanned.pdf"), &save).unwrap();
    assert!(tiny.scanned_pages[0].image.is_some(), "{tiny:?}");
    // An image drawn over the whole page covers it: reading the image reads the page.
    let whole = parse_pdf(&fixture("page-scan.pdf"), &save).unwrap();
    assert!(whole.scanned_pages[0].image.is_some(), "{whole:?}");
    assert!(whole.scanned_pages[0].image_covers_page, "{whole:?}");
}

#[test]
fn a_tiled_scan_or_a_page_of_shapes_has_no_one_image_and_a_blank_page_is_no_scan() {
    // Page 2: the notice in three image strips; page 3: an empty content stream; page 4: a
    // filled box (shapes only).
    let folder = tempfile::tempdir().unwrap();
    let save = PdfLimits {
        scanned: Scanned::SaveImages(folder.path().to_path_buf()),
        ..PdfLimits::default()
    };
    let parsed = parse_pdf(&fixture("tiled-scan.pdf"), &save).unwrap();
    assert!(page_text(&parsed, 1).starts_with("Port handbook"));
    let numbers: Vec<u32> = parsed
        .scanned_pages
        .iter()
        .map(|page| page.number)
        .collect();
    assert_eq!(numbers, [2, 4]);
    for page in &parsed.scanned_pages {
        assert_eq!(page.image, None, "{page:?}");
        assert!(!page.image_covers_page, "{page:?}");
        assert_eq!(page.size_points, Some((612, 792)), "{page:?}");
    }
    assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 0);
    // Without an engine the same pages are listed (the blank one is not).
    let plain = parse("tiled-scan.pdf").unwrap();
    let numbers: Vec<u32> = plain.scanned_pages.iter().map(|page| page.number).collect();
    assert_eq!(numbers, [2, 4]);
}

#[test]
fn pages_whose_text_layer_is_garbled_go_to_ocr_as_scans_do() {
    // Page 2's invisible layer maps to the Private Use Area, page 3's is glyph numbers read
    // as letters; both paint the notice as an image.
    let document = parse("garbled-scan.pdf").unwrap();
    assert_eq!(document.pages.len(), 1, "{document:?}");
    assert!(document.text.starts_with("Port handbook"), "{document:?}");
    let scanned: Vec<u32> = document
        .scanned_pages
        .iter()
        .map(|page| page.number)
        .collect();
    assert_eq!(scanned, [2, 3]);
    let folder = tempfile::tempdir().unwrap();
    let save = PdfLimits {
        scanned: Scanned::SaveImages(folder.path().to_path_buf()),
        ..PdfLimits::default()
    };
    let parsed = parse_pdf(&fixture("garbled-scan.pdf"), &save).unwrap();
    for page in &parsed.scanned_pages {
        let image = std::fs::read(page.image.as_deref().expect("its image saved")).unwrap();
        let info = crate::image::check_image(&image, &Default::default()).unwrap();
        assert_eq!((info.width, info.height), (1000, 360));
    }
    // The garbled text is nowhere in the document.
    assert!(!parsed.text.contains('\u{E04E}'), "{parsed:?}");
    assert!(!parsed.text.contains("1RWLFH"), "{parsed:?}");
}

#[test]
fn the_page_cap_refuses_before_reading_pages() {
    let limits = PdfLimits {
        max_pages: 2,
        ..PdfLimits::default()
    };
    let error = parse_pdf(&fixture("three-pages.pdf"), &limits).unwrap_err();
    assert_eq!(error.code(), "pdf_too_large");
    assert!(error.to_string().contains("pdf_max_pages"), "{error}");
}

#[test]
fn the_time_budget_stops_between_pages() {
    let limits = PdfLimits::default();
    let past = Instant::now() - Duration::from_millis(1);
    let error = extract_pdf(fixture("three-pages.pdf"), &limits, past).unwrap_err();
    assert_eq!(error.code(), "pdf_too_large");
    assert!(error.to_string().contains("budget"), "{error}");
}

#[test]
fn reasons_are_cut_to_a_bounded_length() {
    let long = "x".repeat(1_000);
    assert_eq!(reason(&long).chars().count(), MAX_REASON_CHARS + 1);
    assert_eq!(reason("short"), "short");
}

#[test]
fn a_pdf_that_hangs_the_parser_is_given_up_at_the_budget() {
    // Found by the parse_pdf fuzz target: pdf_oxide spins on it for more than 10 s. The
    // caller stops waiting at the budget (the thread is left to end on its own; ADR 0024).
    let limits = PdfLimits {
        time_budget: Duration::from_millis(500),
        ..PdfLimits::default()
    };
    let started = Instant::now();
    let error = parse_pdf(&fixture("hangs-parser.pdf"), &limits).unwrap_err();
    assert_eq!(error.code(), "pdf_too_large", "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// The pages `page_read` tells of for a PDF of `total` pages.
fn told(total: u32) -> Vec<u32> {
    let told = Arc::new(Mutex::new(Vec::new()));
    let report = {
        let told = Arc::clone(&told);
        PageReport::new(move |done, _| told.lock().unwrap().push(done))
    };
    for done in 1..=total {
        report.page_read(done, total);
    }
    told.lock().unwrap().clone()
}

#[test]
fn a_report_tells_of_every_page_or_of_steps_and_the_last() {
    assert_eq!(told(3), [1, 2, 3]);
    assert_eq!(told(50).len(), 50);
    for total in [51, 99, 100, 566, 2_000] {
        let pages = told(total);
        assert!(
            pages.len() <= REPORTED_STEPS as usize + 1,
            "{total}: {}",
            pages.len()
        );
        assert_eq!(pages.last(), Some(&total));
        assert!(pages.windows(2).all(|pair| pair[0] < pair[1]));
    }
    // Nothing is told without a report, and nothing breaks.
    PageReport::default().page_read(1, 1);
}

#[test]
fn a_table_is_kept_as_a_markdown_table_in_its_place() {
    let document = parse("table.pdf").unwrap();
    assert_eq!(document.pages.len(), 2, "{document:?}");
    // A page without a table stays plain text.
    let first = page_text(&document, 1);
    assert!(first.contains("Fresnel lens"), "{first}");
    assert!(!first.contains('|'), "{first}");
    let second = page_text(&document, 2);
    let rows = [
        "| Light | Range (nm) | Character |",
        "| Skerryvore | 23 | Fl W 10s |",
        "| Bell Rock | 18 | Fl W 5s |",
        "| Eddystone | 17 | Fl (2) W 10s |",
    ];
    let mut after = 0;
    for row in rows {
        let at = second[after..]
            .find(row)
            .unwrap_or_else(|| panic!("{row:?} after byte {after} of {second}"));
        after += at + row.len();
    }
    // In reading order: the sentence before the table, the one after it after.
    let before = second.find("ranges in nautical miles").expect(second);
    let table = second.find("| Light |").unwrap();
    let later = second.find("Keepers trimmed the wicks").expect(second);
    assert!(before < table && table < later, "{second}");
    // Chunked, the table stays whole in one chunk with its page.
    let config = crate::chunk::ChunkerConfig {
        chunk_tokens: 72,
        overlap_tokens: 0,
        parent_tokens: 200,
        min_tail_tokens: 18,
    };
    let chunked = crate::chunk::chunk_pages(&document.text, &document.pages, &config);
    let holding: Vec<_> = chunked
        .children
        .iter()
        .filter(|child| child.text.contains("| Bell Rock |"))
        .collect();
    assert_eq!(holding.len(), 1, "{:#?}", chunked.children);
    for row in rows {
        assert!(holding[0].text.contains(row), "{}", holding[0].text);
    }
    assert_eq!(holding[0].pages, Some((2, 2)));
    assert!(
        chunked.children.len() >= 3,
        "the pages do not fit one chunk: {:#?}",
        chunked.children
    );
}

#[test]
fn a_broken_xref_table_is_rebuilt_from_the_objects() {
    // Every offset of the xref table points into garbage; the objects are intact. pdf_oxide
    // rebuilds the table by scanning them, as pdftotext and mutool do: every page is read.
    let document = parse("broken-xref.pdf").unwrap();
    assert_eq!(document.pages.len(), 3, "{document:?}");
    assert!(page_text(&document, 1).starts_with("Harbour Lights"));
    assert!(page_text(&document, 3).contains("Spring tides"));
}

#[test]
fn a_page_tree_that_loops_is_invalid_pdf() {
    // The root's /Kids holds a page, the root itself and a node whose /Kids holds the root
    // and itself; /Count says 4. The loop is not followed: the page after the first is
    // missing, and a document with a missing page is refused.
    let error = parse("page-tree-loop.pdf").unwrap_err();
    assert_eq!(error.code(), "invalid_pdf", "{error}");
    assert!(error.to_string().contains("page 2 of 4"), "{error}");
}

#[test]
fn a_declared_2_gib_stream_is_read_to_its_endstream() {
    // /Length 2147483648 on a stream of a few hundred bytes: nothing of that size is
    // allocated; the stream ends at its `endstream` and the page is read.
    let document = parse("huge-length.pdf").unwrap();
    assert_eq!(document.pages.len(), 1, "{document:?}");
    assert!(page_text(&document, 1).contains("long winter nights"));
}

#[test]
fn a_content_stream_that_inflates_past_the_cap_is_pdf_too_large() {
    // 300 KB that inflate to 300 MiB: pdf_oxide stops at its 256 MiB cap, and the page is
    // refused rather than read as an empty (scanned) page.
    let error = parse("flate-bomb.pdf").unwrap_err();
    assert_eq!(error.code(), "pdf_too_large", "{error}");
    assert!(error.to_string().contains("page 1 of 1"), "{error}");
    let accepted = PdfLimits {
        scanned: Scanned::Accept,
        ..PdfLimits::default()
    };
    let error = parse_pdf(&fixture("flate-bomb.pdf"), &accepted).unwrap_err();
    assert_eq!(error.code(), "pdf_too_large", "{error}");
}

/// Asserts that each of `words` is found in `text` after the one before it.
fn assert_in_order(text: &str, words: &[&str]) {
    let mut after = 0;
    for word in words {
        let at = text[after..]
            .find(word)
            .unwrap_or_else(|| panic!("{word:?} after byte {after} of:\n{text}"));
        after += at + word.len();
    }
}

#[test]
fn two_columns_are_read_column_by_column_under_their_title() {
    // The columns' lines stand at the same heights (a sort by height then x would interleave
    // them) and the content stream draws the right column first and the title last.
    let document = parse("two-columns.pdf").unwrap();
    assert_eq!(document.pages.len(), 1, "{document:?}");
    let text = page_text(&document, 1);
    assert!(!text.contains('|'), "read as prose, not a table: {text}");
    assert!(
        text.starts_with("Tidal Harbours of the North Coast"),
        "{text}"
    );
    let left = [
        "breakwater",
        "granite",
        "hauled",
        "1881",
        "seaward",
        "parapet",
        "waves back to sea",
    ];
    let right = [
        "Harbour pilots",
        "outer buoy",
        "sandbar",
        "cutter",
        "lighthouse",
        "hut on the",
        "long nights",
    ];
    let all: Vec<&str> = ["Tidal Harbours"]
        .iter()
        .chain(&left)
        .chain(&right)
        .copied()
        .collect();
    assert_in_order(text, &all);
    // No line holds words of both columns.
    for line in text.lines() {
        let holds = |words: &[&str]| words.iter().any(|word| line.contains(word));
        assert!(!(holds(&left) && holds(&right)), "{line:?} in:\n{text}");
    }
}

#[test]
fn running_headers_and_footers_are_dropped_from_every_page() {
    // Six pages under the same header, each with "Page N of 6" at its foot; bookmarks
    // "Operations" on page 1 and "Finances" on page 4.
    let document = parse("running-headers.pdf").unwrap();
    assert_eq!(document.pages.len(), 6, "{document:?}");
    // clean.rs drops a running line on every page that has it, the first included.
    assert!(
        !document.text.contains("Annual Report"),
        "{}",
        document.text
    );
    for number in 1..=6 {
        assert!(
            !document.text.contains(&format!("Page {number} of 6")),
            "{}",
            document.text
        );
    }
    assert!(!document.text.contains(" of 6"), "{}", document.text);
    let bodies = [
        ("Operations", "inner basin."),
        ("Dredging of the channel", "a new lantern."),
        ("Pilotage kept its record", "within twenty minutes."),
        ("Finances", "start of the year."),
        ("Spending on the quays", "the fish market."),
        ("The reserves stand", "begins next spring."),
    ];
    for (number, (first, last)) in (1..).zip(bodies) {
        let text = page_text(&document, number);
        assert!(text.starts_with(first), "page {number}: {text}");
        assert!(text.ends_with(last), "page {number}: {text}");
    }
    // "light-" / "house" at a line end on page 2, joined (pdf_oxide's `extract_text` joins it
    // itself, line and all; `clean_page_text` would otherwise). The header and footer, though,
    // are in pdf_oxide's text: `strip_running_lines` drops them.
    let second = page_text(&document, 2);
    assert!(second.contains("old lighthouse"), "{second}");
    assert!(!second.contains("light-"), "{second}");
    let paths: Vec<&[String]> = document
        .pages
        .iter()
        .map(|page| page.heading_path.as_slice())
        .collect();
    let operations = ["Operations".to_string()];
    let finances = ["Finances".to_string()];
    assert_eq!(
        paths,
        [
            &operations[..],
            &operations[..],
            &operations[..],
            &finances[..],
            &finances[..],
            &finances[..]
        ]
    );
}
