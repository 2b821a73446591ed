//! PDF -> pages of text: no panic, hang or runaway memory in `pdf_oxide` or in our page
//! assembly, and a well-formed document (pages in order, inside the text, on char boundaries)
//! that the page chunker accepts when it succeeds. Runs the unguarded extraction, so that a
//! panic the production guard would catch is still a finding here.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sift_parse::chunk::{ChunkerConfig, chunk_pages};
use sift_parse::pdf::{PdfLimits, extract_pdf};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let limits = PdfLimits {
        max_pages: 64,
        time_budget: Duration::from_secs(5),
        ..PdfLimits::default()
    };
    let deadline = Instant::now() + limits.time_budget;
    let Ok(document) = extract_pdf(data.to_vec(), &limits, deadline) else {
        return;
    };
    common::assert_document_shape(&document);
    common::assert_clean_decoded(&document.text);
    assert!(!document.pages.is_empty(), "a PDF document without pages");
    let mut previous_end = 0;
    let mut previous_number = 0;
    for page in &document.pages {
        assert!(page.number > previous_number, "pages out of order");
        assert!(page.number as usize <= limits.max_pages, "page past the cap");
        assert!(page.start >= previous_end && page.start < page.end, "bad page range");
        let text = document
            .text
            .get(page.start..page.end)
            .expect("a page range on char boundaries");
        assert_eq!(text.trim(), text, "page text not trimmed");
        previous_end = page.end;
        previous_number = page.number;
    }
    assert_eq!(previous_end, document.text.len(), "text after the last page");
    let chunked = chunk_pages(&document.text, &document.pages, &ChunkerConfig::default());
    assert!(!chunked.children.is_empty(), "pages with text but no chunk");
    for child in &chunked.children {
        let (first, last) = child.pages.expect("a chunk of a page has pages");
        assert_eq!(first, last, "a chunk crosses a page");
    }
});
