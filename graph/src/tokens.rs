//! Text to tokens for the English rules: words with their shape, numbers, initials,
//! punctuation, line breaks and runs of CJK characters, each with its byte span, its char
//! offset and whether it starts a sentence. One pass, one token per step: linear time.

use crate::canonical::{fold_width, is_cjk, is_word_char};
use crate::lexicon;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenKind {
    /// Letters (and digits) starting with an upper-case letter and holding a lower-case one:
    /// "Scott", "McDonald", "Jean-Luc".
    Capitalised,
    /// Upper-case letters and digits, 2 to 10 of them, at least one letter first: "NASA",
    /// "COVID-19", "IL-6", "AT&T".
    Acronym,
    /// Any other word: lower case, digits mixed with letters ("5mg", "1998-03-12").
    Other,
    /// Digits with points or commas inside: "1998", "3.5", "1,000".
    Number,
    /// An upper-case letter and its point: "F." of "John F. Kennedy".
    Initial,
    /// A word of [`lexicon::is_abbreviation`] with its point: "Dr.", "St.", "vs.".
    Abbreviation,
    /// One character that is no part of a word; line breaks are `'\n'`.
    Punct(char),
    /// A run of Han, kana or Hangul characters.
    Cjk,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Token<'t> {
    pub kind: TokenKind,
    /// The token as written, possessive "'s" left out.
    pub text: &'t str,
    /// Byte span in the text (the possessive left out).
    pub start: usize,
    pub end: usize,
    pub char_start: u32,
    /// Whitespace (not a line break) stands between this token and the one before.
    pub spaced: bool,
    /// The word had a possessive "'s" after it: the name it belongs to ends here.
    pub possessive: bool,
    /// The first word of a sentence, a line or the text.
    pub sentence_start: bool,
}

impl Token<'_> {
    pub fn is_word(&self) -> bool {
        matches!(
            self.kind,
            TokenKind::Capitalised
                | TokenKind::Acronym
                | TokenKind::Other
                | TokenKind::Number
                | TokenKind::Initial
                | TokenKind::Abbreviation
        )
    }

    pub fn is_punct(&self, c: char) -> bool {
        self.kind == TokenKind::Punct(c)
    }
}

fn is_latin_word_char(c: char) -> bool {
    is_word_char(c) && !is_cjk(c)
}

/// The character at byte `at`, width-folded, and its length in bytes.
fn char_at(text: &str, at: usize) -> Option<(char, usize)> {
    text.get(at..)?
        .chars()
        .next()
        .map(|c| (fold_width(c), c.len_utf8()))
}

fn ends_sentence(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '\n' | '。' | '…' | '｡')
}

/// Opening brackets, quotes and dashes: a sentence that starts after them still starts.
fn keeps_sentence_start(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | '('
            | '['
            | '{'
            | '“'
            | '‘'
            | '«'
            | '「'
            | '『'
            | '《'
            | '—'
            | '–'
            | '-'
            | '*'
            | '•'
            | '#'
            | '>'
            | '|'
    )
}

pub(crate) fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::with_capacity(text.len() / 5);
    let mut at = 0;
    let mut char_pos: u32 = 0;
    let mut spaced = false;
    let mut sentence_start = true;
    while let Some((c, len)) = char_at(text, at) {
        if c.is_whitespace() {
            if matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}') {
                push_punct(&mut tokens, text, at, len, char_pos, '\n', spaced);
                sentence_start = true;
                spaced = false;
            } else {
                spaced = true;
            }
            at += len;
            char_pos += 1;
            continue;
        }
        if is_cjk(c) {
            let (start, start_char) = (at, char_pos);
            while let Some((c, len)) = char_at(text, at).filter(|(c, _)| is_cjk(*c)) {
                let _ = c;
                at += len;
                char_pos += 1;
            }
            tokens.push(Token {
                kind: TokenKind::Cjk,
                text: &text[start..at],
                start,
                end: at,
                char_start: start_char,
                spaced,
                possessive: false,
                sentence_start: false,
            });
            spaced = false;
            sentence_start = false;
            continue;
        }
        if !is_latin_word_char(c) {
            push_punct(&mut tokens, text, at, len, char_pos, c, spaced);
            if ends_sentence(c) {
                sentence_start = true;
            } else if !keeps_sentence_start(c) {
                sentence_start = false;
            }
            spaced = false;
            at += len;
            char_pos += 1;
            continue;
        }
        // a word: letters and digits, joined by - ' ’ & inside, . and , between digits
        let (start, start_char) = (at, char_pos);
        let mut previous = c;
        at += len;
        char_pos += 1;
        while let Some((c, len)) = char_at(text, at) {
            if is_latin_word_char(c) {
                previous = c;
                at += len;
                char_pos += 1;
                continue;
            }
            let joins = match c {
                '-' | '&' | '\'' | '’' => true,
                '.' | ',' => previous.is_ascii_digit(),
                _ => false,
            };
            let next = char_at(text, at + len);
            let next_ok = match c {
                '.' | ',' => next.is_some_and(|(n, _)| n.is_ascii_digit()),
                _ => next.is_some_and(|(n, _)| is_latin_word_char(n)),
            };
            if !(joins && next_ok) {
                break;
            }
            at += len;
            char_pos += 1;
        }
        let mut end = at;
        let mut word = &text[start..end];
        let mut possessive = false;
        for suffix in ["'s", "’s", "'S", "’S"] {
            if let Some(stem) = word.strip_suffix(suffix).filter(|stem| !stem.is_empty()) {
                possessive = true;
                end = start + stem.len();
                word = stem;
                break;
            }
        }
        let mut kind = shape(word);
        // "F." and "Dr.": the point belongs to the word and ends no sentence
        if !possessive && let Some(('.', dot)) = char_at(text, at) {
            let single_upper = {
                let mut chars = word.chars();
                matches!((chars.next(), chars.next()), (Some(u), None) if u.is_uppercase())
            };
            if single_upper || lexicon::is_abbreviation(word) {
                kind = if single_upper {
                    TokenKind::Initial
                } else if word.starts_with(char::is_uppercase) {
                    TokenKind::Abbreviation
                } else {
                    TokenKind::Other
                };
                at += dot;
                char_pos += 1;
                end = at;
                word = &text[start..end];
            }
        }
        tokens.push(Token {
            kind,
            text: word,
            start,
            end,
            char_start: start_char,
            spaced,
            possessive,
            sentence_start,
        });
        sentence_start = false;
        spaced = false;
    }
    tokens
}

fn push_punct<'t>(
    tokens: &mut Vec<Token<'t>>,
    text: &'t str,
    at: usize,
    len: usize,
    char_pos: u32,
    c: char,
    spaced: bool,
) {
    tokens.push(Token {
        kind: TokenKind::Punct(c),
        text: &text[at..at + len],
        start: at,
        end: at + len,
        char_start: char_pos,
        spaced,
        possessive: false,
        sentence_start: false,
    });
}

/// The shape of a word (full-width letters count as their ASCII forms).
fn shape(word: &str) -> TokenKind {
    let mut upper = 0usize;
    let mut lower = 0usize;
    let mut digits = 0usize;
    let mut alphanumerics = 0usize;
    let mut all_digits_or_points = true;
    for c in word.chars().map(fold_width) {
        if c.is_uppercase() {
            upper += 1;
        } else if c.is_lowercase() {
            lower += 1;
        }
        if c.is_numeric() {
            digits += 1;
        }
        if c.is_alphanumeric() {
            alphanumerics += 1;
        }
        if !(c.is_ascii_digit() || c == '.' || c == ',') {
            all_digits_or_points = false;
        }
    }
    let first = word.chars().next().map(fold_width);
    if all_digits_or_points && digits > 0 {
        return TokenKind::Number;
    }
    let starts_upper = first.is_some_and(char::is_uppercase);
    if starts_upper && lower == 0 && upper >= 1 && (2..=10).contains(&alphanumerics) {
        // two letters, or a letter and digits: "IL-6", "B12"; not "A"
        if upper >= 2 || digits >= 1 {
            return TokenKind::Acronym;
        }
    }
    if starts_upper && lower > 0 {
        return TokenKind::Capitalised;
    }
    if starts_upper && alphanumerics == 1 {
        // a lone capital letter: "Plan B", "Vitamin C"
        return TokenKind::Capitalised;
    }
    TokenKind::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(TokenKind, &str)> {
        tokenize(text)
            .into_iter()
            .map(|t| (t.kind, t.text))
            .collect()
    }

    #[test]
    fn words_numbers_and_punctuation() {
        use TokenKind::*;
        assert_eq!(
            kinds("Nolan's IL-6 at 3.5 km, 1,000 and 5mg (NASA)."),
            vec![
                (Capitalised, "Nolan"),
                (Acronym, "IL-6"),
                (Other, "at"),
                (Number, "3.5"),
                (Other, "km"),
                (Punct(','), ","),
                (Number, "1,000"),
                (Other, "and"),
                (Other, "5mg"),
                (Punct('('), "("),
                (Acronym, "NASA"),
                (Punct(')'), ")"),
                (Punct('.'), "."),
            ]
        );
    }

    #[test]
    fn initials_and_abbreviations_keep_their_point() {
        use TokenKind::*;
        assert_eq!(
            kinds("John F. Kennedy met Dr. Who"),
            vec![
                (Capitalised, "John"),
                (Initial, "F."),
                (Capitalised, "Kennedy"),
                (Other, "met"),
                (Abbreviation, "Dr."),
                (Capitalised, "Who"),
            ]
        );
        let tokens = tokenize("John F. Kennedy met Dr. Who");
        assert!(!tokens[2].sentence_start && !tokens[5].sentence_start);
    }

    #[test]
    fn sentence_starts_and_offsets() {
        let tokens = tokenize("It rained. \"Paris\" was wet\nLondon 北京 Nexon");
        let starts: Vec<_> = tokens
            .iter()
            .filter(|t| t.is_word())
            .map(|t| (t.text, t.sentence_start))
            .collect();
        assert_eq!(
            starts,
            vec![
                ("It", true),
                ("rained", false),
                ("Paris", true),
                ("was", false),
                ("wet", false),
                ("London", true),
                ("Nexon", false),
            ]
        );
        let london = tokens.iter().find(|t| t.text == "London").unwrap();
        assert_eq!(london.char_start, 27);
        let cjk = tokens.iter().find(|t| t.kind == TokenKind::Cjk).unwrap();
        assert_eq!((cjk.text, cjk.char_start), ("北京", 34));
    }

    #[test]
    fn full_width_letters_have_their_ascii_shape() {
        assert_eq!(kinds("ＮＡＳＡ"), vec![(TokenKind::Acronym, "ＮＡＳＡ")]);
    }
}
