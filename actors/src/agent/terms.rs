//! Query terms, coverage and sentence splitting shared by the planner, the evidence verifier,
//! the reflector and extractive answers.
//!
//! Terms are lowercase words of two or more characters that are not stopwords; CJK text
//! (which has no spaces) contributes character bigrams, so coverage works for Chinese too.

use std::collections::BTreeSet;

/// English stopwords and question words: they say nothing about what a chunk must contain.
pub(crate) const STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as",
    "at", "be", "because", "been", "before", "being", "between", "both", "but", "by", "can",
    "could", "did", "do", "does", "doing", "during", "each", "else", "few", "for", "from",
    "further", "had", "has", "have", "having", "he", "her", "here", "hers", "him", "his", "how",
    "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my", "no",
    "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "out", "over",
    "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "those", "through", "to", "too", "under", "until",
    "up", "very", "was", "we", "were", "what", "when", "where", "which", "while", "who", "whom",
    "why", "will", "with", "would", "you", "your", "yours", "tell", "please", "explain",
    "describe", "give", "list", "show", "know", "many", "much", "there", "s", "t", "way", "ways",
    "vs", "versus",
];

pub(crate) fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x3040..=0x30FF | 0xAC00..=0xD7AF)
}

/// The distinct content terms of `text`, in first-seen order.
pub fn terms(text: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut push = |term: String, out: &mut Vec<String>| {
        if seen.insert(term.clone()) {
            out.push(term);
        }
    };
    let mut word = String::new();
    let mut cjk_run: Vec<char> = Vec::new();
    let flush_word = |word: &mut String,
                      out: &mut Vec<String>,
                      push: &mut dyn FnMut(String, &mut Vec<String>)| {
        if word.chars().count() >= 2 && !STOPWORDS.contains(&word.as_str()) {
            push(std::mem::take(word), out);
        } else {
            word.clear();
        }
    };
    let flush_cjk = |run: &mut Vec<char>,
                     out: &mut Vec<String>,
                     push: &mut dyn FnMut(String, &mut Vec<String>)| {
        if run.len() == 1 {
            push(run[0].to_string(), out);
        }
        for pair in run.windows(2) {
            push(pair.iter().collect(), out);
        }
        run.clear();
    };
    for c in text.chars() {
        if is_cjk(c) {
            flush_word(&mut word, &mut out, &mut push);
            cjk_run.push(c);
        } else if c.is_alphanumeric() {
            flush_cjk(&mut cjk_run, &mut out, &mut push);
            word.extend(c.to_lowercase());
        } else {
            flush_word(&mut word, &mut out, &mut push);
            flush_cjk(&mut cjk_run, &mut out, &mut push);
        }
    }
    flush_word(&mut word, &mut out, &mut push);
    flush_cjk(&mut cjk_run, &mut out, &mut push);
    out
}

/// The share of `query_terms` that occur in `text` (1.0 when there are no query terms).
/// A term matches a word of the text that starts with it, so `index` matches `indexes`.
pub fn coverage(query_terms: &[String], text: &str) -> f64 {
    if query_terms.is_empty() {
        return 1.0;
    }
    let text_terms: BTreeSet<String> = terms(text).into_iter().collect();
    let hit = query_terms
        .iter()
        .filter(|term| term_in(term, &text_terms))
        .count();
    hit as f64 / query_terms.len() as f64
}

/// The query terms that `text` lacks.
pub fn missing_terms(query_terms: &[String], text: &str) -> Vec<String> {
    let text_terms: BTreeSet<String> = terms(text).into_iter().collect();
    query_terms
        .iter()
        .filter(|term| !term_in(term, &text_terms))
        .cloned()
        .collect()
}

fn term_in(term: &str, text_terms: &BTreeSet<String>) -> bool {
    if text_terms.contains(term) {
        return true;
    }
    // Cheap stemming: a plural or inflected form in the text matches the query's word.
    text_terms
        .range(term.to_string()..)
        .next()
        .is_some_and(|candidate| candidate.starts_with(term) && candidate.len() <= term.len() + 3)
}

/// Splits `text` into sentences with their character offsets `[start, end)` (trimmed).
/// Whether the newline at `index` ends a sentence: a blank line, a structural line (heading,
/// `[Context: …]`, list item, table row, quote) before or after it, or a line ending in
/// punctuation. A newline inside wrapped prose (the line ends mid-sentence) does not.
fn line_ends_here(chars: &[char], start: usize, index: usize) -> bool {
    let structural = |c: char| matches!(c, '#' | '[' | '-' | '*' | '|' | '>' | '\n');
    let Some(&next) = chars.get(index + 1) else {
        return true;
    };
    let line_start = chars[..index]
        .iter()
        .rposition(|&c| c == '\n')
        .map_or(0, |at| at + 1)
        .max(start);
    let first = chars[line_start..index]
        .iter()
        .find(|c| !c.is_whitespace())
        .copied();
    let last = chars[line_start..index]
        .iter()
        .rev()
        .find(|c| !c.is_whitespace())
        .copied();
    structural(next)
        || first.is_none_or(structural)
        || last.is_none_or(|c| !(c.is_alphanumeric() || matches!(c, ',' | '，' | '、')))
}

pub fn sentences(text: &str) -> Vec<(usize, usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut index = 0;
    let push = |start: usize, end: usize, out: &mut Vec<(usize, usize, String)>| {
        let piece: String = chars[start..end].iter().collect();
        let leading = piece.chars().take_while(|c| c.is_whitespace()).count();
        let trimmed = piece.trim();
        if !trimmed.is_empty() {
            let begin = start + leading;
            out.push((begin, begin + trimmed.chars().count(), trimmed.to_string()));
        }
    };
    while index < chars.len() {
        let c = chars[index];
        let boundary = match c {
            '。' | '！' | '？' | '；' => true,
            '\n' => line_ends_here(&chars, start, index),
            '.' | '!' | '?' => chars.get(index + 1).is_none_or(|next| next.is_whitespace()),
            _ => false,
        };
        if boundary {
            push(start, index + 1, &mut out);
            start = index + 1;
        }
        index += 1;
    }
    if start < chars.len() {
        push(start, chars.len(), &mut out);
    }
    out
}

/// Cuts `text` to at most `max_chars` characters, marking the cut.
pub fn truncate_chars(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max_chars).collect();
    out.push_str(" …");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_drop_stopwords_and_short_words() {
        assert_eq!(
            terms("What is the boiling point of Water?"),
            vec!["boiling", "point", "water"]
        );
    }

    #[test]
    fn cjk_text_gives_bigrams() {
        assert_eq!(terms("向量检索"), vec!["向量", "量检", "检索"]);
        assert_eq!(terms("HNSW 索引"), vec!["hnsw", "索引"]);
    }

    #[test]
    fn coverage_counts_prefix_matches() {
        let query = terms("rust borrow checker");
        assert!((coverage(&query, "The Rust borrow checker rejects this") - 1.0).abs() < 1e-9);
        assert!((coverage(&query, "Borrowing in Rust") - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(missing_terms(&query, "rust"), vec!["borrow", "checker"]);
    }

    #[test]
    fn wrapped_prose_is_one_sentence_but_structure_splits() {
        let text = "[Context: Raft > Election]\nA new leader holds every entry, so a\nfollower can trust it. Next one.\n# Heading\n- item";
        let split: Vec<String> = sentences(text).into_iter().map(|(_, _, s)| s).collect();
        assert_eq!(
            split,
            vec![
                "[Context: Raft > Election]",
                "A new leader holds every entry, so a\nfollower can trust it.",
                "Next one.",
                "# Heading",
                "- item"
            ]
        );
    }

    #[test]
    fn sentences_keep_offsets() {
        let text = "First one. Second 3.5 here!  Third";
        let split = sentences(text);
        assert_eq!(split.len(), 3);
        for (start, end, sentence) in &split {
            let slice: String = text.chars().skip(*start).take(end - start).collect();
            assert_eq!(&slice, sentence);
        }
        assert_eq!(split[1].2, "Second 3.5 here!");
    }
}
