//! Encoding detection: `decode_text` never panics, strips what it promises to, and decodes
//! valid UTF-8 as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sift_parse::parse::{ParseError, decode_text};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let result = decode_text(data);
    // Deterministic: the same bytes decode the same way.
    match (&result, decode_text(data)) {
        (Ok(first), Ok(second)) => assert_eq!(first, &second),
        (Err(first), Err(second)) => assert_eq!(first.code(), second.code()),
        _ => panic!("decode_text is not deterministic"),
    }
    if let Ok((text, _)) = &result {
        common::assert_clean_decoded(text);
    }
    if data.iter().all(u8::is_ascii_whitespace) {
        assert!(matches!(result, Err(ParseError::Empty)), "blank input not Empty");
        return;
    }
    // Valid UTF-8 without a NUL (and without a BOM or binary magic, which are checked first) is
    // UTF-8 or refused as binary-looking; text without stray control characters is kept as is.
    if let Ok(input) = std::str::from_utf8(data)
        && !data.contains(&0)
        && encoding_rs::Encoding::for_bom(data).is_none()
    {
        match &result {
            Ok((text, encoding)) => {
                assert_eq!(*encoding, "UTF-8", "valid UTF-8 decoded as {encoding}");
                let stray = input
                    .chars()
                    .any(|c| (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || c == '\u{feff}');
                if !stray {
                    assert_eq!(text, input, "clean UTF-8 changed by decoding");
                }
            }
            Err(ParseError::Binary) => {}
            Err(error) => panic!("valid UTF-8 refused: {error}"),
        }
    }
});
