//! HTML -> Markdown: no panic, no stack overflow or quadratic blow-up on deep nesting (the
//! depth limit), and a well-formed document when it succeeds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sift_parse::parse::{ParseOptions, SourceFormat, parse_document};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(document) = parse_document(data, SourceFormat::Html, &ParseOptions::default()) else {
        return;
    };
    common::assert_document_shape(&document);
    assert!(document.markdown, "HTML must come out as Markdown");
    common::assert_clean_decoded(&document.text);
    if let Some(title) = &document.title {
        // Titles are collapsed to one line.
        assert!(!title.contains('\n'), "multi-line title {title:?}");
    }
});
