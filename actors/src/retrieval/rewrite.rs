//! Rule-based query rewrites for multi-query retrieval (no LLM): the query's content words
//! alone, and each named span (a run of capitalised words, e.g. "Arthur's Magazine", "First
//! for Women") as its own sub-query, so that each entity of a multi-hop question gets its own
//! search. The agent's planner may hand in its own sub-queries instead (`queries`).

use super::text::is_stop_word;

/// Most rewrites added to one query.
pub const MAX_REWRITES: usize = 3;

/// Small words allowed inside a named span ("Bank of America", "First for Women").
const JOINERS: &[&str] = &["of", "for", "the", "and", "de", "von", "van", "la", "&"];
/// Capitalised words that start questions rather than names.
const QUESTION_WORDS: &[&str] = &[
    "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "are", "was",
    "were", "do", "does", "did", "in", "the", "a", "an", "and", "of", "on", "at", "for", "by",
    "to", "from", "with", "as", "between", "both", "name", "can", "could", "this", "that",
];

/// Rewrites of `query`, without the query itself, deduplicated, at most [`MAX_REWRITES`].
pub fn rewrites(query: &str) -> Vec<String> {
    let words: Vec<&str> = query.split_whitespace().collect();
    let clean = |word: &str| {
        word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '&')
            .to_string()
    };
    let mut out: Vec<String> = Vec::new();
    let push = |candidate: String, out: &mut Vec<String>| {
        let candidate = candidate.trim().to_string();
        if !candidate.is_empty()
            && candidate.to_lowercase() != query.trim().to_lowercase()
            && !out.iter().any(|o| o.eq_ignore_ascii_case(&candidate))
            && out.len() < MAX_REWRITES
        {
            out.push(candidate);
        }
    };
    // Named spans first: they are what a multi-hop question joins.
    let mut spans: Vec<String> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let close = |current: &mut Vec<String>, spans: &mut Vec<String>| {
        while current
            .last()
            .is_some_and(|w| JOINERS.contains(&w.to_lowercase().as_str()))
        {
            current.pop();
        }
        if !current.is_empty() {
            spans.push(current.join(" "));
        }
        current.clear();
    };
    for (position, raw) in words.iter().enumerate() {
        let word = clean(raw);
        let capital = word.chars().next().is_some_and(char::is_uppercase)
            || word.chars().next().is_some_and(|c| c.is_ascii_digit()) && !current.is_empty();
        let lower = word.to_lowercase();
        let question_start = position == 0 && QUESTION_WORDS.contains(&lower.as_str());
        let starts_or_extends = capital
            && !question_start
            && !(current.is_empty() && QUESTION_WORDS.contains(&lower.as_str()));
        let joins = !current.is_empty() && JOINERS.contains(&lower.as_str());
        if starts_or_extends || joins {
            current.push(word);
        } else {
            close(&mut current, &mut spans);
        }
        let ends_span = raw.ends_with([',', '?', ';', ':', '.', ')']);
        if ends_span {
            close(&mut current, &mut spans);
        }
    }
    close(&mut current, &mut spans);
    for span in spans {
        if span.chars().count() >= 3 {
            push(span, &mut out);
        }
    }
    // The content words alone.
    let content: Vec<String> = words
        .iter()
        .map(|w| clean(w))
        .filter(|w| !w.is_empty() && !is_stop_word(&w.to_lowercase()))
        .collect();
    if content.len() >= 2 && content.len() < words.len() {
        push(content.join(" "), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_spans_become_sub_queries() {
        let r = rewrites("Which magazine was started first, Arthur's Magazine or First for Women?");
        assert_eq!(r[0], "Arthur's Magazine");
        assert!(r.contains(&"First for Women".to_string()), "{r:?}");
        assert!(r.len() <= MAX_REWRITES);
    }

    #[test]
    fn plain_lowercase_query_gets_content_words_only() {
        let r = rewrites("what is the effect of vitamin d on bone density");
        assert_eq!(r, vec!["effect vitamin d bone density".to_string()]);
        assert!(rewrites("vitamin").is_empty());
    }
}
