//! JSON Lines documents: like `parse_json`, one record per non-blank line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sift_parse::parse::{ParseOptions, SourceFormat, decode_text, parse_document};

#[path = "common.rs"]
mod common;
#[path = "json_oracle.rs"]
mod json_oracle;

fuzz_target!(|data: &[u8]| {
    let Ok(document) = parse_document(data, SourceFormat::Jsonl, &ParseOptions::default()) else {
        return;
    };
    common::assert_document_shape(&document);
    assert!(!document.markdown);
    let (decoded, _) = decode_text(data).expect("parsed input decodes");
    let decoded = decoded.replace("\r\n", "\n").replace('\r', "\n");
    let records: Vec<Value> = decoded
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).expect("parsed line is JSON"))
        .collect();
    json_oracle::check(&records, &document);
});
