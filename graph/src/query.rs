//! The names a query may refer to. A query is short and often lower case ("who directed
//! doctor strange"), so capitalisation cannot find its names: besides the entities
//! [`extract`] finds, every run of 1 to 4 words is a candidate name, and the graph keeps
//! those that exist.

use std::collections::HashSet;

use crate::canonical::canonical;
use crate::tokens::{Token, TokenKind, tokenize};
use crate::{EntityId, Language, Limits, chinese, entity_id, extract, lexicon};

/// Names per query at most.
const MAX_QUERY_NAMES: usize = 64;

/// The canonical names a query may refer to, for seeding a graph search by name: every
/// extracted entity of the query plus every word n-gram (1..=4 words, none starting or ending
/// with a common word; Chinese: jieba words and adjacent pairs) canonicalised, deduplicated,
/// at most 64, each with its id. Extracted entities come first, then two-word, three-word,
/// one-word and four-word n-grams (in the order names are most often that long), then the
/// Chinese terms.
pub fn query_names(query: &str, language: Language) -> Vec<(String, EntityId)> {
    let limits = Limits {
        max_entities: MAX_QUERY_NAMES,
        ..Limits::default()
    };
    let mut names: Vec<String> = extract(query, None, language, &limits)
        .into_iter()
        .map(|mention| mention.canonical)
        .collect();
    let tokens = tokenize(query);
    let segments = word_segments(&tokens);
    names.extend(title_case_runs(query, &segments));
    for n in [2, 3, 1, 4] {
        for segment in &segments {
            for window in segment.windows(n) {
                let (first, last) = (window[0], window[n - 1]);
                let numbers_only = window.iter().all(|t| t.kind == TokenKind::Number);
                // a capitalised common word may open or close a longer name: "In Love and War"
                let weak_edge = |t: &Token<'_>| is_common(t) && (n == 1 || !is_capitalised(t));
                if numbers_only || weak_edge(first) || weak_edge(last) {
                    continue;
                }
                let start = first.start;
                let end = last.end;
                names.push(canonical(&query[start..end]));
            }
        }
    }
    if language != Language::English {
        names.extend(chinese::query_terms(query));
    }
    let mut seen = HashSet::new();
    names
        .into_iter()
        .filter(|name| !name.is_empty() && seen.insert(name.clone()))
        .take(MAX_QUERY_NAMES)
        .map(|name| {
            let id = entity_id(&name);
            (name, id)
        })
        .collect()
}

/// Longer names written in title case: capitalised words joined by short lower-case words,
/// "Vicious Lies and Dangerous Rumors", up to 8 words (the n-grams stop at 4).
fn title_case_runs(query: &str, segments: &[Vec<&Token<'_>>]) -> Vec<String> {
    let mut runs = vec![];
    for segment in segments {
        let mut index = 0;
        while index < segment.len() {
            if !is_capitalised(segment[index]) {
                index += 1;
                continue;
            }
            let (start, mut last) = (index, index);
            let mut next = index + 1;
            while next < segment.len() && next - start < 8 {
                let token = segment[next];
                if is_capitalised(token) || token.kind == TokenKind::Number {
                    last = next;
                } else if !(token.text.len() <= 3 && token.kind == TokenKind::Other) {
                    break;
                }
                next += 1;
            }
            if last - start >= 4 {
                runs.push(canonical(&query[segment[start].start..segment[last].end]));
            }
            index = last + 1;
        }
    }
    runs
}

fn is_capitalised(token: &Token<'_>) -> bool {
    matches!(
        token.kind,
        TokenKind::Capitalised | TokenKind::Acronym | TokenKind::Initial | TokenKind::Abbreviation
    )
}

/// Runs of words not broken by punctuation (a point, a comma, an apostrophe or an ampersand
/// inside a name does not break: "j. r. r. tolkien", "leland, north carolina", "at&t").
fn word_segments<'a, 't>(tokens: &'a [Token<'t>]) -> Vec<Vec<&'a Token<'t>>> {
    let mut segments = vec![];
    let mut current = vec![];
    for token in tokens {
        if token.is_word() {
            current.push(token);
        } else if token.is_punct('.')
            || token.is_punct(',')
            || token.is_punct('&')
            || current.is_empty()
        {
            continue;
        } else {
            segments.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        segments.push(current);
    }
    segments
}

fn is_common(token: &Token<'_>) -> bool {
    token.kind != TokenKind::Number && lexicon::is_common(&token.text.to_lowercase())
}
