//! An independent check that a JSON document's text comes from its records (included with
//! `#[path]` by the JSON targets).

use serde_json::Value;
use sift_parse::parse::ParsedDocument;

pub fn check(records: &[Value], document: &ParsedDocument) {
    assert!(records.iter().all(Value::is_object), "a non-object record was accepted");
    let fields: Vec<String> = records
        .iter()
        .filter_map(|record| record.get("text")?.as_str())
        .map(cleaned)
        .collect();
    assert!(!fields.is_empty(), "text without any `text` field");
    for line in document.text.lines().filter(|line| !line.is_empty()) {
        assert!(
            fields.iter().any(|field| field.lines().any(|own| own == line || own.trim_end() == line)),
            "line {line:?} is in no record's text field"
        );
    }
    let title = records
        .first()
        .and_then(|record| record.get("title")?.as_str())
        .map(|title| cleaned(title).trim().to_string())
        .filter(|title| !title.is_empty());
    assert_eq!(document.title, title, "title is not the first record's");
}

/// A field as the parser promises to clean it: line ends and form feeds become LF, other
/// control characters (from escapes like `\u0004`) and U+FEFF are dropped.
fn cleaned(text: &str) -> String {
    text.replace("\r\n", "\n")
        .chars()
        .map(|c| if matches!(c, '\r' | '\u{0c}') { '\n' } else { c })
        .filter(|&c| !(c.is_control() && !matches!(c, '\n' | '\t')) && c != '\u{feff}')
        .collect()
}
