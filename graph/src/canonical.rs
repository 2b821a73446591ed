//! The canonical form of an entity name and the id made from it.
//!
//! Two surface forms that name the same thing in different spellings ("The Beatles",
//! "Beatles", "BEATLES'") share one canonical form, hence one [`EntityId`]: that is what lets
//! a query ("who directed doctor strange") meet the entity a document introduced
//! ("Doctor Strange") in the graph.

use sha2::{Digest, Sha256};

use crate::EntityId;

/// The first 8 bytes (big-endian) of the SHA-256 of `canonical`.
pub fn entity_id(canonical: &str) -> EntityId {
    let digest = Sha256::digest(canonical.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The canonical form of a name: full-width forms folded to ASCII, a trailing parenthetical
/// removed ("Mercury (planet)" -> "mercury"), possessive 's removed, Unicode lower case,
/// punctuation and spacing collapsed to single spaces, a leading "the " removed.
///
/// Kept as they are: letters, digits and combining marks of any script, the symbols that
/// change a name's meaning (`% $ € £ ¥ ° + # &`) and a point between two digits ("3.5").
/// A comma between digits is dropped ("1,000" -> "1000").
pub fn canonical(name: &str) -> String {
    let folded: Vec<char> = name.chars().map(fold_width).collect();
    let folded = strip_trailing_parenthetical(&folded);
    let mut out = String::with_capacity(name.len());
    let mut pending_space = false;
    let mut index = 0;
    while index < folded.len() {
        let c = folded[index];
        let before = index.checked_sub(1).map(|i| folded[i]);
        let after = folded.get(index + 1).copied();
        if is_apostrophe(c) && before.is_some_and(is_word_char) {
            // possessive: "Nolan's", "Jones'"; otherwise the apostrophe separates ("O'Brien")
            let s_then_end = matches!(after, Some('s' | 'S'))
                && !folded.get(index + 2).copied().is_some_and(is_word_char);
            if s_then_end {
                index += 2;
                continue;
            }
            if !after.is_some_and(is_word_char) {
                index += 1;
                pending_space = true;
                continue;
            }
        }
        let digit_between = |x: Option<char>| x.is_some_and(|x| x.is_ascii_digit());
        if c == ',' && digit_between(before) && digit_between(after) {
            index += 1;
            continue;
        }
        let keep = is_word_char(c)
            || KEPT_SYMBOLS.contains(&c)
            || (c == '.' && digit_between(before) && digit_between(after));
        if keep {
            if pending_space && !out.is_empty() {
                out.push(' ');
            }
            pending_space = false;
            out.extend(c.to_lowercase());
        } else {
            pending_space = true;
        }
        index += 1;
    }
    match out.strip_prefix("the ") {
        Some(rest) if !rest.is_empty() => rest.to_string(),
        _ => out,
    }
}

/// Symbols that stay in a canonical form: without them "20%" and "20", "C++" and "C" meet.
const KEPT_SYMBOLS: [char; 9] = ['%', '$', '€', '£', '¥', '°', '+', '#', '&'];

/// Full-width ASCII forms (U+FF01..U+FF5E) and the ideographic space folded to ASCII; every
/// other character is itself. One character in, one out: offsets do not move.
pub(crate) fn fold_width(c: char) -> char {
    match c {
        '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFEE0).unwrap_or(c),
        '\u{3000}' => ' ',
        _ => c,
    }
}

/// A letter, digit or combining mark of any script.
pub(crate) fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || is_combining_mark(c)
}

pub(crate) fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}')
}

/// The combining-mark blocks (decomposed accents): they belong to the letter before them.
fn is_combining_mark(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE20}'..='\u{FE2F}')
}

/// Han ideographs (the unified blocks, their extensions and the compatibility block).
pub(crate) fn is_han(c: char) -> bool {
    matches!(c,
        '\u{3007}'
        | '\u{3400}'..='\u{4DBF}'
        | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}'
        | '\u{20000}'..='\u{2A6DF}'
        | '\u{2A700}'..='\u{2EBEF}'
        | '\u{30000}'..='\u{3134F}')
}

/// Scripts written without capitals or spaces between words (Han, kana, Hangul): the English
/// rules see them as separators.
pub(crate) fn is_cjk(c: char) -> bool {
    is_han(c)
        || matches!(c,
            '\u{3040}'..='\u{30FF}'
            | '\u{31F0}'..='\u{31FF}'
            | '\u{AC00}'..='\u{D7AF}'
            | '\u{1100}'..='\u{11FF}')
}

/// "Mercury (planet)" -> "Mercury": a bracketed part at the very end, with something before
/// it, is a disambiguation and not part of the name.
fn strip_trailing_parenthetical(chars: &[char]) -> &[char] {
    let mut end = chars.len();
    while end > 0 && chars[end - 1].is_whitespace() {
        end -= 1;
    }
    if end == 0 || chars[end - 1] != ')' {
        return chars;
    }
    let mut depth = 0usize;
    for open in (0..end).rev() {
        match chars[open] {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    let rest = &chars[..open];
                    return if rest.iter().any(|&c| is_word_char(c)) {
                        rest
                    } else {
                        chars
                    };
                }
            }
            _ => {}
        }
    }
    chars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_folds_case_spacing_and_punctuation() {
        assert_eq!(canonical("Doctor  Strange"), "doctor strange");
        assert_eq!(canonical("  New-York\tCity "), "new york city");
        assert_eq!(canonical("U.S. Army"), "u s army");
        assert_eq!(canonical("\"Demon Dice\""), "demon dice");
        assert_eq!(
            canonical("ÉCOLE Normale Supérieure"),
            "école normale supérieure"
        );
    }

    #[test]
    fn canonical_removes_a_trailing_parenthetical_articles_and_possessives() {
        assert_eq!(canonical("Mercury (planet)"), "mercury");
        assert_eq!(canonical("Mercury (planet) "), "mercury");
        assert_eq!(canonical("(planet)"), "planet");
        assert_eq!(canonical("The Beatles"), "beatles");
        assert_eq!(canonical("the"), "the");
        assert_eq!(canonical("Theodore"), "theodore");
        assert_eq!(canonical("Nolan's"), "nolan");
        assert_eq!(canonical("Nolan’s films"), "nolan films");
        assert_eq!(canonical("Jones'"), "jones");
        assert_eq!(canonical("O'Brien"), "o brien");
    }

    #[test]
    fn canonical_keeps_meaningful_symbols_and_decimal_points() {
        assert_eq!(canonical("20%"), "20%");
        assert_eq!(canonical("$4 million"), "$4 million");
        assert_eq!(canonical("3.5 km"), "3.5 km");
        assert_eq!(canonical("1,000 km."), "1000 km");
        assert_eq!(canonical("C++"), "c++");
        assert_eq!(canonical("AT&T"), "at&t");
    }

    #[test]
    fn canonical_folds_full_width_forms() {
        assert_eq!(canonical("ＮＡＳＡ"), "nasa");
        assert_eq!(canonical("Ｎｅｘｏｎ（游戏）"), "nexon");
        assert_eq!(canonical("北京\u{3000}大学"), "北京 大学");
        assert_eq!(canonical("２０２０"), "2020");
        assert_eq!(canonical("威廉·莎士比亚"), "威廉 莎士比亚");
    }

    #[test]
    fn canonical_is_idempotent_on_examples() {
        for name in [
            "The The",
            "Mercury (planet)",
            "Nolan's",
            "U.S.",
            "3.5 km",
            "ＡＢＣ",
        ] {
            let once = canonical(name);
            assert_eq!(canonical(&once), once, "{name}");
        }
    }

    #[test]
    fn entity_id_is_the_first_eight_bytes_of_the_sha256() {
        // SHA-256("abc") = ba7816bf8f01cfea 414140de...
        assert_eq!(entity_id("abc"), 0xba78_16bf_8f01_cfea);
        assert_eq!(
            entity_id("doctor strange"),
            entity_id(&canonical("Doctor Strange"))
        );
        assert_ne!(entity_id("a"), entity_id("b"));
    }
}
