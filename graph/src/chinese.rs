//! The Chinese rules: jieba's part-of-speech tags on each run of Han characters. Words tagged
//! `nr*` are people, `ns*` places, `nt*` organisations, `nz` other proper nouns; dates
//! (1998年3月12日) and Latin runs are the English rules' (`english.rs`).
//!
//! One `Jieba` (its dictionary loaded once, about 100 ms) for the process.

use std::sync::OnceLock;

use jieba_rs::Jieba;

use crate::canonical::{canonical, is_han};
use crate::mentions::Candidate;
use crate::{EntityKind, Limits, lexicon};

fn jieba() -> &'static Jieba {
    static JIEBA: OnceLock<Jieba> = OnceLock::new();
    JIEBA.get_or_init(Jieba::new)
}

/// Each maximal run of Han characters in `text` with its char offset.
fn han_runs(text: &str) -> impl Iterator<Item = (&str, u32)> {
    let mut chars = text.char_indices().peekable();
    let mut char_pos: u32 = 0;
    std::iter::from_fn(move || {
        loop {
            let (start, c) = chars.next()?;
            char_pos += 1;
            if !is_han(c) {
                continue;
            }
            let start_char = char_pos - 1;
            let mut end = start + c.len_utf8();
            while let Some(&(at, c)) = chars.peek().filter(|(_, c)| is_han(*c)) {
                end = at + c.len_utf8();
                chars.next();
                char_pos += 1;
            }
            return Some((&text[start..end], start_char));
        }
    })
}

fn kind_of_tag(tag: &str) -> Option<EntityKind> {
    if tag.starts_with("nr") {
        Some(EntityKind::Person)
    } else if tag.starts_with("ns") {
        Some(EntityKind::Place)
    } else if tag.starts_with("nt") {
        Some(EntityKind::Organisation)
    } else if tag == "nz" {
        Some(EntityKind::Proper)
    } else {
        None
    }
}

/// Candidates of the Chinese rules: tagged proper nouns of two characters or more.
pub(crate) fn candidates(text: &str, limits: &Limits, out: &mut Vec<Candidate>) {
    if !text.chars().any(is_han) {
        return;
    }
    let jieba = jieba();
    for (run, run_start) in han_runs(text) {
        let tags = jieba.tag(run, true);
        let mut index = 0;
        while index < tags.len() {
            let tag = &tags[index];
            index += 1;
            let Some(kind) = kind_of_tag(tag.tag) else {
                continue;
            };
            // the HMM cuts an unknown transliterated name into pieces, each tagged a person:
            // "托帕" + "洛夫" is 托帕洛夫
            let mut end = tag.byte_end;
            let mut end_char = tag.end;
            while kind == EntityKind::Person
                && let Some(next) = tags.get(index).filter(|next| next.tag.starts_with("nr"))
            {
                end = next.byte_end;
                end_char = next.end;
                index += 1;
            }
            let word = &run[tag.byte_start..end];
            let length = end_char - tag.start;
            if length < 2 || length > limits.max_name_chars {
                continue;
            }
            let name = canonical(word);
            if name.is_empty() {
                continue;
            }
            out.push(Candidate {
                words: 1,
                canonical: name,
                surface: word.to_string(),
                kind,
                first_char: run_start.saturating_add(u32::try_from(tag.start).unwrap_or(u32::MAX)),
                weak: false,
            });
        }
    }
}

/// The occurrences of a title written in Han characters ("尤金袋鼠"), which jieba may cut
/// into several words ("尤金" + "袋鼠"): found as they are written.
pub(crate) fn title_occurrences(text: &str, title: &str, out: &mut Vec<Candidate>) {
    let title = title.trim();
    if title.is_empty() || !title.chars().any(is_han) {
        return;
    }
    let name = canonical(title);
    let mut char_pos = 0u32;
    let mut counted_to = 0;
    for (at, _) in text.match_indices(title) {
        char_pos += u32::try_from(text[counted_to..at].chars().count()).unwrap_or(u32::MAX);
        counted_to = at;
        out.push(Candidate {
            words: name.split(' ').count(),
            canonical: name.clone(),
            surface: title.to_string(),
            kind: EntityKind::Title,
            first_char: char_pos,
            weak: false,
        });
    }
}

/// Query terms of the Han runs of `query`: each word of two characters or more that is no
/// function word, and each pair of adjacent words ("北京" + "大学"), canonicalised.
pub(crate) fn query_terms(query: &str) -> Vec<String> {
    let mut terms = Vec::new();
    if !query.chars().any(is_han) {
        return terms;
    }
    let jieba = jieba();
    let mut pairs = Vec::new();
    for (run, _) in han_runs(query) {
        // search mode gives the short words inside long ones too: 韩国 and 公司 of 韩国公司
        for token in jieba.cut_for_search(run, true) {
            let word = token.word;
            if word.chars().count() >= 2 && !lexicon::is_chinese_common(word) {
                terms.push(canonical(word));
            }
        }
        let words: Vec<&str> = jieba
            .cut(run, true)
            .into_iter()
            .map(|token| token.word)
            .collect();
        for pair in words.windows(2) {
            let joinable =
                |word: &str| word.chars().count() >= 2 && !lexicon::is_chinese_common(word);
            if joinable(pair[0]) && joinable(pair[1]) {
                pairs.push(canonical(&format!("{}{}", pair[0], pair[1])));
            }
        }
    }
    terms.extend(pairs);
    terms
}
