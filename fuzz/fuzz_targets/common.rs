//! Checks shared by the parser targets (included with `#[path]`).

#![allow(dead_code)]

use sift_parse::parse::ParsedDocument;

/// What [`sift_parse::parse::decode_text`] promises to strip: control characters other than
/// `\n`, `\r` and `\t`, and the byte order mark.
pub fn assert_clean_decoded(text: &str) {
    for c in text.chars() {
        assert!(
            !c.is_control() || matches!(c, '\n' | '\r' | '\t'),
            "decoded text keeps control character {c:?}"
        );
        assert_ne!(c, '\u{feff}', "decoded text keeps a BOM");
    }
}

/// What every successful `parse_document` returns: LF line endings, no leading blank line or
/// trailing whitespace, not empty.
pub fn assert_document_shape(document: &ParsedDocument) {
    let text = &document.text;
    assert!(!text.trim().is_empty(), "empty document text returned as Ok");
    assert!(!text.contains('\r'), "CR left in document text");
    if let Some(title) = &document.title {
        assert!(!title.trim().is_empty(), "blank title");
        assert_eq!(title.trim(), title, "title not trimmed");
    }
}
