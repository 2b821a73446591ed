//! Markdown parsing and structure-aware chunking. The first two bytes choose the chunk sizes;
//! the rest is the upload. Checks the chunker's documented invariants: spans in order and
//! covering all non-whitespace text, bodies verbatim slices of the input, exact token counts,
//! parents covering their children, and the size bound for every chunk without an atomic block
//! (code fence or table) or an oversized heading path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sift_parse::chunk::{ChunkerConfig, Chunked, chunk_document, count_tokens};
use sift_parse::parse::{ParseOptions, SourceFormat, parse_document};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let chunk_tokens = 8 + data[0] as usize; // 8..=263
    let config = ChunkerConfig {
        chunk_tokens,
        overlap_tokens: (data[1] & 0x3f) as usize, // 0..=63
        parent_tokens: chunk_tokens * (1 + (data[1] >> 6) as usize) + 16,
        min_tail_tokens: chunk_tokens / 4,
    };
    let Ok(document) = parse_document(&data[2..], SourceFormat::Markdown, &ParseOptions::default())
    else {
        return;
    };
    common::assert_document_shape(&document);
    common::assert_clean_decoded(&document.text);
    assert!(document.markdown);
    let chunked = chunk_document(&document.text, true, &config);
    check(&document.text, &chunked, &config);
    // Plain-text chunking of the same text keeps the same invariants.
    let plain = chunk_document(&document.text, false, &config);
    check(&document.text, &plain, &config);
});

fn context_prefix(path: &[String]) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("[Context: {}]\n", path.join(" > "))
    }
}

/// Byte offset of char `index` (or the end).
fn byte_of(text: &str, index: usize) -> usize {
    text.char_indices().nth(index).map_or(text.len(), |(byte, _)| byte)
}

fn char_slice(text: &str, (start, end): (u32, u32)) -> &str {
    &text[byte_of(text, start as usize)..byte_of(text, end as usize)]
}

fn non_whitespace(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

/// A line that makes a block atomic (never split, so allowed to exceed the budget).
fn atomic_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed.starts_with("```") || trimmed.starts_with("~~~") || trimmed.starts_with('|')
}

fn check(text: &str, chunked: &Chunked, config: &ChunkerConfig) {
    assert_eq!(chunked.children.is_empty(), text.trim().is_empty(), "no chunks for a text");
    let mut previous_end = 0;
    let mut covered = String::new();
    for (index, child) in chunked.children.iter().enumerate() {
        assert_eq!(child.position as usize, index);
        assert!(child.span.0 < child.span.1, "empty child {child:?}");
        assert!(child.span.0 >= previous_end, "spans out of order at {index}");
        let between = char_slice(text, (previous_end, child.span.0));
        assert!(between.trim().is_empty(), "uncovered text {between:?}");
        previous_end = child.span.1;
        let own = char_slice(text, child.span);
        covered.push_str(own);
        assert!(child.body.ends_with(own), "body does not end with its own text");
        let body_chars = child.body.chars().count() as u32;
        assert!(body_chars <= child.span.1);
        assert_eq!(
            char_slice(text, (child.span.1 - body_chars, child.span.1)),
            child.body,
            "body is not a verbatim slice of the input"
        );
        let prefix = context_prefix(&child.heading_path);
        assert_eq!(child.text, format!("{prefix}{}", child.body));
        assert_eq!(child.token_count, count_tokens(&child.text), "inexact token count");
        assert!(!child.body.trim().is_empty(), "blank child");
        assert!((child.parent_position as usize) < chunked.parents.len());

        let bound = config.chunk_tokens + config.min_tail_tokens + config.overlap_tokens;
        let prefix_tokens = count_tokens(&prefix);
        let exempt = prefix_tokens > config.chunk_tokens / 2 || child.body.lines().any(atomic_line);
        assert!(
            exempt || child.token_count <= bound,
            "child of {} tokens exceeds {bound} ({config:?}): {:?}",
            child.token_count,
            child.text
        );
    }
    assert!(char_slice(text, (previous_end, text.chars().count() as u32)).trim().is_empty());
    assert_eq!(non_whitespace(&covered), non_whitespace(text), "spans do not cover the text");

    let mut previous_parent_end = 0;
    for (index, parent) in chunked.parents.iter().enumerate() {
        assert_eq!(parent.position as usize, index);
        assert!(parent.span.0 >= previous_parent_end);
        previous_parent_end = parent.span.1;
        assert!(parent.text.ends_with(char_slice(text, parent.span)));
        let children: Vec<_> = chunked
            .children
            .iter()
            .filter(|child| child.parent_position == parent.position)
            .collect();
        assert!(!children.is_empty(), "parent {index} has no children");
        assert_eq!(parent.span.0, children[0].span.0);
        assert_eq!(parent.span.1, children.last().unwrap().span.1);
    }
}
