//! JSON documents: no panic (deeply nested arrays stay within serde_json's recursion limit), and
//! the text of a successful parse is derived from the records' `text` fields: every line of it
//! is a line of one of those fields, and the title is the first record's `title`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sift_parse::parse::{ParseOptions, SourceFormat, decode_text, parse_document};

#[path = "common.rs"]
mod common;
#[path = "json_oracle.rs"]
mod json_oracle;

fuzz_target!(|data: &[u8]| {
    let Ok(document) = parse_document(data, SourceFormat::Json, &ParseOptions::default()) else {
        return;
    };
    common::assert_document_shape(&document);
    assert!(!document.markdown);
    let (decoded, _) = decode_text(data).expect("parsed input decodes");
    let records = match serde_json::from_str::<Value>(&decoded).expect("parsed input is JSON") {
        Value::Array(items) => items,
        object => vec![object],
    };
    json_oracle::check(&records, &document);
});
