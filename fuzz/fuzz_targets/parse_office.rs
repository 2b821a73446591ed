//! Word, PowerPoint, spreadsheets, CSV and EPUB -> Markdown: no stack overflow, no runaway
//! memory or time (the zip, row and cell caps), no panic in our own walks, and a well-formed
//! document when it succeeds. The first byte picks the format; the rest is the file.
//!
//! `parse_office` catches a panic of the parsers under it (calamine, zip, quick-xml) and fails
//! the document, as uploads see it; such a panic is no finding here. A panic raised in
//! sift-parse's own code still aborts, as it does in every other target.
#![no_main]

use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use sift_parse::office::OfficeLimits;
use sift_parse::parse::{ParseOptions, SourceFormat, parse_document};

#[path = "common.rs"]
mod common;

// Not `.xls`: calamine's OLE reader loops on crafted input, and the parse worker process
// (killed at the budget, ADR 0030) is what stops it, not a finding here.
const FORMATS: [SourceFormat; 6] = [
    SourceFormat::Docx,
    SourceFormat::Pptx,
    SourceFormat::Xlsx,
    SourceFormat::Ods,
    SourceFormat::Csv,
    SourceFormat::Epub,
];

static HOOK: Once = Once::new();

/// Replaces libfuzzer-sys's abort-on-every-panic hook: abort only for a panic located in
/// sift-parse (an index out of bounds in our walk reports our line), let the others unwind to
/// the parser's own `catch_unwind`.
fn install_hook() {
    HOOK.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = info
                .location()
                .is_some_and(|location| location.file().contains("parse/src/"));
            if ours {
                default_hook(info);
                std::process::abort();
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    install_hook();
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    let format = FORMATS[usize::from(selector) % FORMATS.len()];
    // Small caps: the fuzzer's inputs are small, and a bomb should stop early and cheaply.
    let options = ParseOptions {
        office: OfficeLimits {
            max_unpacked_bytes: 16 << 20,
            max_entries: 1_000,
            max_rows: 20_000,
            max_cells: 200_000,
        },
        ..ParseOptions::default()
    };
    let Ok(document) = parse_document(file, format, &options) else {
        return;
    };
    common::assert_document_shape(&document);
    assert!(document.markdown, "an Office document must come out as Markdown");
    common::assert_clean_decoded(&document.text);
});
