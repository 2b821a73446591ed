//! A small, language-light analyzer shared by the re-scorer, MMR and the query rewriter:
//! lower-cased Latin words and digits (English stop words dropped, cut to a 6-character stem)
//! and single CJK characters.

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

/// A set of terms as sorted, distinct 64-bit hashes: cheap to build, to look up (binary
/// search) and to intersect (merge).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TermSet(Vec<u64>);

impl TermSet {
    pub fn contains(&self, term: u64) -> bool {
        self.0.binary_search(&term).is_ok()
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.0.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The union of two sets.
    pub fn union(&self, other: &TermSet) -> TermSet {
        let mut all: Vec<u64> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        all.dedup();
        TermSet(all)
    }
}

/// FNV-1a of a term.
pub fn term_hash(term: &str) -> u64 {
    term.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn term_set(text: &str) -> TermSet {
    let mut hashes: Vec<u64> = terms(text).iter().map(|t| term_hash(t)).collect();
    hashes.sort_unstable();
    hashes.dedup();
    TermSet(hashes)
}

/// Jaccard similarity of two term sets (1 when both are empty).
pub fn jaccard(a: &TermSet, b: &TermSet) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let (mut i, mut j, mut shared) = (0, 0, 0usize);
    while i < a.0.len() && j < b.0.len() {
        match a.0[i].cmp(&b.0[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                shared += 1;
                i += 1;
                j += 1;
            }
        }
    }
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
