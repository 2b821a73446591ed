//! The English rules: capitalised names, acronyms, quoted terms, dates and quantities, found
//! in one walk over the tokens (plus one over the quotes and one that settles the
//! sentence-initial single words).

use std::collections::HashMap;

use crate::EntityKind;
use crate::Limits;
use crate::canonical::canonical;
use crate::lexicon;
use crate::mentions::Candidate;
use crate::tokens::{Token, TokenKind, tokenize};

/// Candidates of the English rules in `text`, in order of occurrence.
pub(crate) fn candidates(text: &str, limits: &Limits, out: &mut Vec<Candidate>) {
    let tokens = tokenize(text);
    let mut walk = Walk {
        text,
        tokens: &tokens,
        limits,
        out,
        sentence_initial: HashMap::new(),
    };
    walk.run();
    walk.settle_sentence_initial();
    quoted(text, &tokens, limits, walk.out);
}

struct Walk<'a, 't> {
    text: &'t str,
    tokens: &'a [Token<'t>],
    limits: &'a Limits,
    out: &'a mut Vec<Candidate>,
    /// Single capitalised words that start a sentence, by their lower case: the indexes of
    /// their candidates in `out`, decided once the whole text is seen.
    sentence_initial: HashMap<String, Vec<usize>>,
}

impl<'a, 't> Walk<'a, 't> {
    fn run(&mut self) {
        let mut index = 0;
        while index < self.tokens.len() {
            index = self
                .date(index)
                .or_else(|| self.quantity(index))
                .or_else(|| self.year(index))
                .or_else(|| self.name(index))
                .unwrap_or(index + 1);
        }
    }

    fn token(&self, index: usize) -> Option<&'a Token<'t>> {
        self.tokens.get(index)
    }

    fn push(
        &mut self,
        kind: EntityKind,
        canonical: String,
        first: usize,
        last: usize,
    ) -> Option<usize> {
        let end = self.tokens[last].end;
        self.push_span(kind, canonical, first, end)
    }

    /// A candidate from token `first` to byte `end`; its index in `out`, unless its surface
    /// is longer than the limit.
    fn push_span(
        &mut self,
        kind: EntityKind,
        canonical: String,
        first: usize,
        end: usize,
    ) -> Option<usize> {
        let surface = collapse_spaces(&self.text[self.tokens[first].start..end]);
        if surface.chars().count() > self.limits.max_name_chars || canonical.is_empty() {
            return None;
        }
        self.out.push(Candidate {
            words: canonical.split(' ').count(),
            canonical,
            surface,
            kind,
            first_char: self.tokens[first].char_start,
            weak: false,
        });
        Some(self.out.len() - 1)
    }

    /// "12 March 1998", "March 12, 1998", "March 1998", "1998-03-12", "1998年3月12日":
    /// canonical ISO 8601 ("1998-03-12", "1998-03", "1998").
    fn date(&mut self, index: usize) -> Option<usize> {
        let tokens = self.tokens;
        let token = self.token(index)?;
        let number = |i: usize, range: std::ops::RangeInclusive<u32>| -> Option<u32> {
            let t = tokens.get(i)?;
            let value = (t.kind == TokenKind::Number && t.text.len() <= 4)
                .then(|| t.text.parse::<u32>().ok())
                .flatten()?;
            range.contains(&value).then_some(value)
        };
        let spaced = |i: usize| tokens.get(i).is_some_and(|t| t.spaced);
        let month = |i: usize| {
            tokens
                .get(i)
                .filter(|t| matches!(t.kind, TokenKind::Capitalised | TokenKind::Other))
                .and_then(|t| lexicon::month(t.text))
        };
        let cjk = |i: usize, c: &str| {
            tokens
                .get(i)
                .is_some_and(|t| t.kind == TokenKind::Cjk && t.text.starts_with(c))
        };
        let cjk_exactly = |i: usize, c: &str| {
            tokens
                .get(i)
                .is_some_and(|t| t.kind == TokenKind::Cjk && t.text == c)
        };
        const YEARS: std::ops::RangeInclusive<u32> = 1000..=2099;
        // a Chinese date ends inside a run of Han characters: after its 年, 月 or 日
        let mut cjk_end = false;
        let (canonical, last) = if let (Some(day), Some(m), Some(year)) = (
            number(index, 1..=31),
            month(index + 1),
            number(index + 2, YEARS),
        ) && spaced(index + 1)
            && spaced(index + 2)
        {
            (format!("{year:04}-{m:02}-{day:02}"), index + 2)
        } else if let Some(m) = month(index) {
            let comma = usize::from(self.token(index + 2).is_some_and(|t| t.is_punct(',')));
            if let (Some(day), Some(year)) =
                (number(index + 1, 1..=31), number(index + 2 + comma, YEARS))
                && spaced(index + 1)
            {
                (format!("{year:04}-{m:02}-{day:02}"), index + 2 + comma)
            } else if let Some(year) = number(index + 1, YEARS)
                && spaced(index + 1)
            {
                (format!("{year:04}-{m:02}"), index + 1)
            } else {
                return None;
            }
        } else if let Some(year) = number(index, YEARS)
            && cjk(index + 1, "年")
        {
            // 1998年, 1998年3月, 1998年3月12日 (digits may be full width)
            cjk_end = true;
            match (number(index + 2, 1..=12), number(index + 4, 1..=31)) {
                (Some(m), Some(day))
                    if cjk_exactly(index + 1, "年")
                        && cjk_exactly(index + 3, "月")
                        && (cjk(index + 5, "日") || cjk(index + 5, "号")) =>
                {
                    (format!("{year:04}-{m:02}-{day:02}"), index + 5)
                }
                (Some(m), _) if cjk_exactly(index + 1, "年") && cjk(index + 3, "月") => {
                    (format!("{year:04}-{m:02}"), index + 3)
                }
                _ => (format!("{year:04}"), index + 1),
            }
        } else if token.kind == TokenKind::Other {
            let (year, m, day) = iso_date(token.text)?;
            (format!("{year:04}-{m:02}-{day:02}"), index)
        } else {
            return None;
        };
        let end = if cjk_end {
            let tail = tokens[last];
            tail.start + tail.text.chars().next().map_or(0, char::len_utf8)
        } else {
            tokens[last].end
        };
        self.push_span(EntityKind::Date, canonical, index, end);
        Some(last + 1)
    }

    /// "5 mg", "3.5 km", "20%", "$4 million", "37 °C", "5mg".
    fn quantity(&mut self, index: usize) -> Option<usize> {
        let token = self.token(index)?;
        let currency = match token.kind {
            TokenKind::Punct(c @ ('$' | '€' | '£' | '¥')) => Some(c),
            _ => None,
        };
        let number_index = if currency.is_some() { index + 1 } else { index };
        let number = self.token(number_index)?;
        if number_index != index && number.spaced {
            return None;
        }
        if number.kind == TokenKind::Other && currency.is_none() {
            // "5mg": digits then a unit, written together
            let split = number
                .text
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))?;
            let (digits, unit) = number.text.split_at(split);
            if digits.is_empty() || !lexicon::is_unit(unit) {
                return None;
            }
            let canonical = format!("{} {}", canonical(digits), unit.to_lowercase());
            self.push(EntityKind::Quantity, canonical, index, index);
            return Some(index + 1);
        }
        if number.kind != TokenKind::Number {
            return None;
        }
        let amount = canonical(number.text);
        let next = self.token(number_index + 1);
        let (unit, last) = match next {
            Some(t) if t.is_punct('%') => ("%".to_string(), number_index + 1),
            Some(t) if t.is_punct('°') => match self.token(number_index + 2) {
                Some(scale) if !scale.spaced && matches!(scale.text, "C" | "F") => {
                    (format!("°{}", scale.text.to_lowercase()), number_index + 2)
                }
                _ => ("°".to_string(), number_index + 1),
            },
            Some(t)
                if t.spaced
                    && matches!(
                        t.kind,
                        TokenKind::Other | TokenKind::Capitalised | TokenKind::Acronym
                    )
                    && lexicon::is_unit(t.text) =>
            {
                (t.text.to_lowercase(), number_index + 1)
            }
            // "60 W." at the end of a sentence: the point is no part of the unit
            Some(t)
                if t.spaced
                    && t.kind == TokenKind::Initial
                    && lexicon::is_unit(&t.text[..t.text.len() - 1]) =>
            {
                let unit = t.text[..t.text.len() - 1].to_lowercase();
                let canonical = format!(
                    "{}{amount} {unit}",
                    currency.map(String::from).unwrap_or_default()
                );
                self.push_span(EntityKind::Quantity, canonical, index, t.end - 1);
                return Some(number_index + 2);
            }
            _ if currency.is_some() => (String::new(), number_index),
            _ => return None,
        };
        let prefix = currency.map(String::from).unwrap_or_default();
        let canonical = match unit.as_str() {
            "" => format!("{prefix}{amount}"),
            "%" => format!("{prefix}{amount}%"),
            _ => format!("{prefix}{amount} {unit}"),
        };
        self.push(EntityKind::Quantity, canonical, index, last);
        Some(last + 1)
    }

    /// A year on its own: a number from 1000 to 2099 without a unit.
    fn year(&mut self, index: usize) -> Option<usize> {
        let token = self.token(index)?;
        if token.kind != TokenKind::Number || token.text.len() != 4 {
            return None;
        }
        let year: u32 = token.text.parse().ok()?;
        if !(1000..=2099).contains(&year) {
            return None;
        }
        self.push(EntityKind::Date, year.to_string(), index, index);
        Some(index + 1)
    }

    /// A run of capitalised words with connectors inside, or the acronyms of a run without
    /// any capitalised word.
    fn name(&mut self, index: usize) -> Option<usize> {
        let first = *self.token(index)?;
        if !starts_name(&first) {
            return None;
        }
        let mut last = index;
        let mut joins_and = false;
        while !self.tokens[last].possessive {
            let next = last + 1;
            match self.tokens.get(next) {
                Some(t) if continues_name(t) => last = next,
                Some(t) if is_joiner(t, joins_and) => {
                    // up to two connectors ("of the", "van der"), then a name word
                    let mut after = next + 1;
                    if self
                        .tokens
                        .get(after)
                        .is_some_and(|t| is_joiner(t, joins_and))
                    {
                        after += 1;
                    }
                    match self.tokens.get(after) {
                        Some(t) if t.spaced && starts_name(t) => {
                            joins_and |= self.tokens[next..after]
                                .iter()
                                .any(|t| matches!(t.text, "of" | "for"));
                            last = after;
                        }
                        _ => break,
                    }
                }
                _ => break,
            }
        }
        let run = &self.tokens[index..=last];
        let capitalised = run
            .iter()
            .filter(|t| t.kind == TokenKind::Capitalised)
            .count();
        if capitalised == 0 {
            self.acronyms(index, last);
            return Some(last + 1);
        }
        let surface = &self.text[first.start..self.tokens[last].end];
        let name = canonical(surface);
        let single = index == last;
        if single && name.chars().count() < 2 {
            return Some(last + 1);
        }
        let position = self.push(EntityKind::Name, name, index, last);
        if let Some(position) = position
            && single
            && first.sentence_start
        {
            let lower = first.text.to_lowercase();
            self.sentence_initial
                .entry(lower)
                .or_default()
                .push(position);
        }
        Some(last + 1)
    }

    /// The acronyms of a run without capitalised words ("NASA ESA" is two), consecutive
    /// initials as one ("U.S.").
    fn acronyms(&mut self, first: usize, last: usize) {
        let mut index = first;
        while index <= last {
            let token = self.tokens[index];
            match token.kind {
                TokenKind::Acronym => {
                    let name = canonical(token.text);
                    let weak = lexicon::is_common(&name);
                    let position = self.push(EntityKind::Acronym, name, index, index);
                    if let Some(candidate) = position.and_then(|p| self.out.get_mut(p)) {
                        candidate.weak = weak;
                    }
                    index += 1;
                }
                TokenKind::Initial => {
                    let mut end = index;
                    while end < last && self.tokens[end + 1].kind == TokenKind::Initial {
                        end += 1;
                    }
                    if end > index {
                        let surface = &self.text[token.start..self.tokens[end].end];
                        self.push(EntityKind::Acronym, canonical(surface), index, end);
                    }
                    index = end + 1;
                }
                _ => index += 1,
            }
        }
    }

    /// A single capitalised word that starts a sentence is a name when the same word is
    /// capitalised elsewhere in the text, or when it is no common word: not in the stop list
    /// and not written in lower case elsewhere in the text.
    fn settle_sentence_initial(&mut self) {
        if self.sentence_initial.is_empty() {
            return;
        }
        let mut seen: HashMap<&str, (bool, bool)> = HashMap::new();
        let mut lower = String::new();
        for token in self.tokens {
            if !matches!(token.kind, TokenKind::Capitalised | TokenKind::Other) {
                continue;
            }
            lower.clear();
            lower.extend(token.text.chars().flat_map(char::to_lowercase));
            if let Some((key, _)) = self.sentence_initial.get_key_value(lower.as_str()) {
                let entry = seen.entry(key.as_str()).or_default();
                if token.kind == TokenKind::Capitalised && !token.sentence_start {
                    entry.0 = true;
                } else if token.kind == TokenKind::Other {
                    entry.1 = true;
                }
            }
        }
        let mut dropped = vec![];
        for (word, positions) in &self.sentence_initial {
            let (capitalised_elsewhere, lower_elsewhere) =
                seen.get(word.as_str()).copied().unwrap_or_default();
            let keep = capitalised_elsewhere || !(lower_elsewhere || lexicon::is_common(word));
            if !keep {
                dropped.extend(positions.iter().copied());
            }
        }
        if dropped.is_empty() {
            return;
        }
        dropped.sort_unstable();
        let mut next_dropped = dropped.into_iter().peekable();
        let mut position = 0;
        self.out.retain(|_| {
            let drop = next_dropped.next_if_eq(&position).is_some();
            position += 1;
            !drop
        });
    }
}

/// A word that may start a name: a capitalised word that is not a common one ("The", "He"),
/// an acronym, an initial or an honorific.
fn starts_name(token: &Token<'_>) -> bool {
    match token.kind {
        TokenKind::Capitalised => !is_common_word(token.text),
        TokenKind::Acronym | TokenKind::Initial | TokenKind::Abbreviation => true,
        _ => false,
    }
}

/// A word that may continue a name: any that may start one, and a capitalised common word
/// inside a sentence ("Theresa May", "Gone With The Wind"), but never "I".
fn continues_name(token: &Token<'_>) -> bool {
    if !token.spaced && token.kind != TokenKind::Initial {
        // "U.S." is written without spaces; other words stand apart
        return false;
    }
    starts_name(token)
        || (token.kind == TokenKind::Capitalised && !token.sentence_start && token.text != "I")
}

fn is_joiner(token: &Token<'_>, and_allowed: bool) -> bool {
    token.spaced
        && ((token.kind == TokenKind::Other
            && (lexicon::is_connector(token.text) || (and_allowed && token.text == "and")))
            || token.is_punct('&'))
}

fn is_common_word(word: &str) -> bool {
    word.len() <= 12 && lexicon::is_common(&word.to_lowercase())
}

/// "1998-03-12" -> (1998, 3, 12)
fn iso_date(word: &str) -> Option<(u32, u32, u32)> {
    let bytes = word.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let year: u32 = word[..4].parse().ok()?;
    let month: u32 = word[5..7].parse().ok()?;
    let day: u32 = word[8..].parse().ok()?;
    ((1000..=2099).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day))
        .then_some((year, month, day))
}

/// Quoted terms of 1 to 6 words: "…", “…”, ‘…’, '…', «…», 「…」, 『…』, 《…》. Straight
/// double quotes pair in order within a line.
fn quoted(text: &str, tokens: &[Token<'_>], limits: &Limits, out: &mut Vec<Candidate>) {
    let mut straight_open: Option<usize> = None;
    let mut open: Option<(usize, char)> = None;
    for (index, token) in tokens.iter().enumerate() {
        let TokenKind::Punct(c) = token.kind else {
            continue;
        };
        match c {
            '\n' => {
                straight_open = None;
                open = None;
            }
            '"' => match straight_open.take() {
                Some(opening) => push_quoted(text, tokens, opening, index, limits, out),
                None => straight_open = Some(index),
            },
            '“' | '‘' | '«' | '「' | '『' | '《' => open = Some((index, c)),
            '\'' if tokens
                .get(index + 1)
                .is_some_and(|t| t.is_word() && !t.spaced)
                && (token.spaced || index == 0) =>
            {
                open = Some((index, c))
            }
            '”' | '’' | '»' | '」' | '』' | '》' | '\'' => {
                let expected = match c {
                    '”' => '“',
                    '’' => '‘',
                    '»' => '«',
                    '」' => '「',
                    '』' => '『',
                    '》' => '《',
                    _ => '\'',
                };
                if let Some((opening, opener)) = open
                    && opener == expected
                {
                    push_quoted(text, tokens, opening, index, limits, out);
                    open = None;
                }
            }
            _ => {}
        }
    }
}

fn push_quoted(
    text: &str,
    tokens: &[Token<'_>],
    opening: usize,
    closing: usize,
    limits: &Limits,
    out: &mut Vec<Candidate>,
) {
    let inside = &tokens[opening + 1..closing];
    let words = inside.iter().filter(|t| t.is_word()).count();
    let cjk_chars: usize = inside
        .iter()
        .filter(|t| t.kind == TokenKind::Cjk)
        .map(|t| t.text.chars().count())
        .sum();
    if inside.is_empty() || words > 6 || (words == 0 && cjk_chars == 0) {
        return;
    }
    let surface = text[tokens[opening].end..tokens[closing].start].trim();
    if surface.chars().count() > limits.max_name_chars {
        return;
    }
    let name = canonical(surface);
    if name.is_empty() || (words == 1 && cjk_chars == 0 && lexicon::is_common(&name)) {
        return;
    }
    out.push(Candidate {
        words: name.split(' ').count(),
        canonical: name,
        surface: collapse_spaces(surface),
        kind: EntityKind::Quoted,
        first_char: tokens[opening + 1].char_start,
        weak: false,
    });
}

fn collapse_spaces(surface: &str) -> String {
    let mut out = String::with_capacity(surface.len());
    for (i, part) in surface.split_whitespace().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(part);
    }
    out
}
