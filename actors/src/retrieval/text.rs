//! A small, language-light analyzer shared by the re-scorer, MMR and the query rewriter:
//! lower-cased Latin words and digits (English stop words dropped, cut to a 6-character stem)
//! and single CJK characters.

use std::collections::HashSet;

const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with", "what", "which", "who", "whom", "why", "how",
    "when", "where", "does", "do", "did", "has", "have", "had", "can", "could", "should", "would",
    "may", "might", "than", "from", "its", "we", "our", "you", "your", "i", "he", "she", "his",
    "her", "them", "also", "been", "being", "were", "more", "most", "other", "some", "any", "all",
    "each", "both", "few", "only", "own", "same", "so", "too", "very", "s", "t", "just", "over",
    "under", "about", "between", "after", "before", "during", "through",
];

pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.contains(&word)
}

fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

/// The analysed terms of `text`, in order (with repeats).
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if word.is_empty() {
            return;
        }
        let keep = (word.chars().count() > 1 || word.chars().all(|c| c.is_ascii_digit()))
            && !is_stop_word(word);
        if keep {
            out.push(word.chars().take(6).collect());
        }
        word.clear();
    };
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            if is_cjk(c) {
                out.push(c.to_string());
            }
        }
    }
    flush(&mut word, &mut out);
    out
}

pub fn term_set(text: &str) -> HashSet<String> {
    terms(text).into_iter().collect()
}

/// Jaccard similarity of two term sets (1 when both are empty).
pub fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let shared = small.iter().filter(|t| large.contains(*t)).count();
    shared as f64 / (a.len() + b.len() - shared) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analyses_latin_and_cjk() {
        assert_eq!(
            terms("The Vaccinations of 2 children, in 1990!"),
            ["vaccin", "2", "childr", "1990"]
        );
        assert_eq!(terms("北京大学 is old"), ["北", "京", "大", "学", "old"]);
        let a = term_set("red apples and green pears");
        let b = term_set("green pears and red apples");
        assert!((jaccard(&a, &b) - 1.0).abs() < 1e-12);
        let c = term_set("blue cars");
        assert!(jaccard(&a, &c).abs() < 1e-12);
    }
}
