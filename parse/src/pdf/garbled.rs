//! Telling a garbled text layer from text, so that its page goes to OCR like a scan.
//!
//! A PDF's text is only as good as its fonts' maps from glyphs to characters. A subset font
//! without a usable `ToUnicode` map gives characters of the Private Use Area or U+FFFD, or the
//! glyph numbers read as character codes: letters shifted by a constant ("3LORWV" for
//! "Pilots"), often without the spaces. Such a page is worth nothing to search, and an OCR
//! engine reads it from its image. [`is_garbled`] judges a page by three signs, each set far
//! from any real text of its kind, so that real pages (other scripts, code, tables, formulas)
//! keep their text:
//!
//! - more than half of its characters unreadable (Private Use Area, U+FFFD, C1 controls);
//! - mostly ASCII, and more than half of it in runs of letters without spaces (words over 25
//!   characters, nine in ten of them letters) whose letters are capitals or short of vowels;
//! - mostly ASCII and mostly letters, and under 15% of the letters vowels, or under 25% with
//!   nine in ten letters capitals (English, French, German, Spanish and Italian text has
//!   35-45%, in capitals too; glyph numbers read as codes turn small letters into capitals
//!   and shift the vowels onto consonants).
//!
//! Of the 15,531 pages of the 726 PDFs of Debian's texlive, gnuplot and asymptote
//! documentation (code listings, tables, formulas, Japanese among them) none is judged garbled
//! (`docs/benchmarks.md`, PDF text, run P3). Pages with fewer than 40 characters are too short to
//! judge and keep their text.

/// Fewer non-blank characters than this: too little to judge.
const MIN_JUDGED_CHARS: usize = 40;
/// Past this share of unreadable characters, the page is garbled.
const MAX_UNREADABLE_SHARE: f64 = 0.5;
/// The share of ASCII characters from which the other signs apply.
const MIN_ASCII_SHARE: f64 = 0.8;
/// A word longer than this, nearly all letters, is a run of words without spaces.
const MIN_RUN_CHARS: usize = 26;
/// The share of letters in a run.
const MIN_RUN_LETTER_SHARE: f64 = 0.9;
/// Past this share of the page's characters in runs, the runs are judged.
const MAX_RUN_SHARE: f64 = 0.5;
/// ASCII letters needed to judge the vowel share.
const MIN_JUDGED_LETTERS: usize = 100;
/// The share of letters among the page's characters for the vowel signs to apply.
const MIN_LETTER_SHARE: f64 = 0.6;
/// Under this share of vowels among ASCII letters, the page is garbled.
const MIN_VOWEL_SHARE: f64 = 0.15;
/// Under this share of vowels, with [`MIN_CAPITALS_SHARE`] capitals, the page (or its runs)
/// is garbled.
const MIN_CAPITALS_VOWEL_SHARE: f64 = 0.25;
/// The share of capitals among ASCII letters of a page all in capitals.
const MIN_CAPITALS_SHARE: f64 = 0.9;

/// Letters, vowels among them, capitals among them.
#[derive(Default)]
struct Letters {
    letters: usize,
    vowels: usize,
    capitals: usize,
}

impl Letters {
    fn add(&mut self, c: char) {
        if c.is_ascii_alphabetic() {
            self.letters += 1;
            self.capitals += usize::from(c.is_ascii_uppercase());
            self.vowels += usize::from(matches!(
                c.to_ascii_lowercase(),
                'a' | 'e' | 'i' | 'o' | 'u' | 'y'
            ));
        }
    }

    /// Capitals, or few vowels: not the letters of a European language's words.
    fn look_shifted(&self) -> bool {
        let letters = self.letters.max(1) as f64;
        let vowels = self.vowels as f64 / letters;
        self.capitals as f64 / letters >= MIN_CAPITALS_SHARE || vowels < MIN_CAPITALS_VOWEL_SHARE
    }
}

/// Whether a page's cleaned text is a garbled text layer (see the module docs).
pub(super) fn is_garbled(text: &str) -> bool {
    let mut judged = 0usize;
    let mut unreadable = 0usize;
    let mut ascii = 0usize;
    let mut letters = Letters::default();
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        judged += 1;
        unreadable += usize::from(is_unreadable(c));
        if c.is_ascii() {
            ascii += 1;
            letters.add(c);
        }
    }
    if judged < MIN_JUDGED_CHARS {
        return false;
    }
    if unreadable as f64 > MAX_UNREADABLE_SHARE * judged as f64 {
        return true;
    }
    if (ascii as f64) < MIN_ASCII_SHARE * judged as f64 {
        return false;
    }
    let mut run_chars = 0usize;
    let mut run_letters = Letters::default();
    for word in text.split_whitespace() {
        let letter_count = word.chars().filter(char::is_ascii_alphabetic).count();
        if word.len() >= MIN_RUN_CHARS
            && word.is_ascii()
            && letter_count as f64 >= MIN_RUN_LETTER_SHARE * word.len() as f64
        {
            run_chars += word.len();
            word.chars().for_each(|c| run_letters.add(c));
        }
    }
    if run_chars as f64 > MAX_RUN_SHARE * judged as f64 && run_letters.look_shifted() {
        return true;
    }
    if letters.letters < MIN_JUDGED_LETTERS
        || (letters.letters as f64) < MIN_LETTER_SHARE * judged as f64
    {
        return false;
    }
    let vowel_share = letters.vowels as f64 / letters.letters as f64;
    let capitals_share = letters.capitals as f64 / letters.letters as f64;
    vowel_share < MIN_VOWEL_SHARE
        || (capitals_share >= MIN_CAPITALS_SHARE && vowel_share < MIN_CAPITALS_VOWEL_SHARE)
}

/// A character no font maps to text: the Private Use Areas, the replacement character, C1
/// controls and noncharacters.
fn is_unreadable(c: char) -> bool {
    matches!(c,
        '\u{E000}'..='\u{F8FF}'
        | '\u{F0000}'..='\u{10FFFF}'
        | '\u{FFFD}'
        | '\u{FFFE}'..='\u{FFFF}'
        | '\u{80}'..='\u{9F}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENGLISH: &str = "The Fresnel lens of the Skerryvore lighthouse focuses the lamp \
        into a narrow beam that sailors see twenty nautical miles away. Its information plate \
        names the glassworks that ground each prism.";

    /// `text` as a subset font's glyph numbers read as characters: shifted by `shift`,
    /// spaces lost below '!'.
    fn shifted(text: &str, shift: u32) -> String {
        text.chars()
            .filter_map(|c| char::from_u32(c as u32 - shift))
            .filter(|c| !c.is_control())
            .collect()
    }

    #[test]
    fn text_in_the_private_use_area_or_replacement_characters_is_garbled() {
        let pua: String = ENGLISH
            .chars()
            .map(|c| char::from_u32(0xE000 + c as u32).unwrap())
            .collect();
        assert!(is_garbled(&pua));
        let replaced: String = ENGLISH
            .chars()
            .map(|c| if c.is_alphabetic() { '\u{FFFD}' } else { c })
            .collect();
        assert!(is_garbled(&replaced));
    }

    #[test]
    fn glyph_numbers_read_as_letters_are_garbled() {
        // Without spaces: words run together.
        assert!(is_garbled(&shifted(ENGLISH, 29)));
        // With spaces kept, the vowels moved onto other letters.
        let spaced: String = ENGLISH
            .split(' ')
            .map(|word| shifted(word, 29))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(is_garbled(&spaced), "{spaced}");
    }

    #[test]
    fn real_text_of_many_kinds_is_not_garbled() {
        let pages = [
            ENGLISH,
            "Die Fresnel-Linse des Leuchtturms bündelt das Licht der Lampe zu einem schmalen \
             Strahl, den Seeleute zwanzig Seemeilen weit sehen.",
            "La lentille de Fresnel du phare concentre la lumière de la lampe en un faisceau \
             étroit que les marins voient à vingt milles.",
            "灯塔的菲涅耳透镜把灯光聚成一道窄窄的光束，水手在二十海里外就能看见。守塔人每天记录潮位。",
            "Линза Френеля маяка собирает свет лампы в узкий луч, который моряки видят за \
             двадцать морских миль.",
            "fn main() { let x: Vec<u8> = vec![0x1f, 0x8b]; println!(\"{:?}\", x.len()); } \
             // returns 2; see src/lib.rs:42",
            "| 2019 | 1,204 | 3.5% |\n| 2020 | 1,317 | 9.4% |\n| 2021 | 1,352 | 2.7% |\n\
             | 2022 | 1,498 | 10.8% |",
            "∫₀¹ f(x) dx = F(1) − F(0), where F′ = f; ∑ᵢ aᵢ bᵢ ≤ ‖a‖ ‖b‖ for all a, b ∈ ℝⁿ.",
            "https://example.org/a/very/long/path/to/a/resource?with=query&and=more see also \
             the appendix for the full list of addresses used in this report",
            "short",
            "\\let\\@tracklang@test@if@file@exists@next\\@tracklang@test@if@file@exists@noop \\
             \\Umathordinnerspacing\\crampedscriptstyle\\IS@skip 203 \\IS@skip\\Umathordordspacing\\
             \\crampedscriptscriptstyle 204 \\Umathordinnerspacing\\crampedtextstyle",
            "< m-t|bch|cmr|ebg|pmn|ppl> L = { ,50}, < blg> L = { ,100}, < cmr> Q = {150,-30}, \\
             < ebg> Q = {100, }, < ugm> Q = {70,50}, < cmr> R = {75, 15}, < pmn|ugm> v = {50, }",
            "The next example illustrates everything we have covered so far: \u{F8F1}\u{F8F4}\\
             \u{F8F4} Deo \u{F8F4}\u{F8F4}\u{F8F4} gratias \u{F8F3}\u{F8F4}\u{F8F4} amen",
            "NOTICE TO MARINERS: THE PIER HEAD LIGHT IS OUT OF SERVICE UNTIL FURTHER NOTICE. \
             PILOTS BOARD VESSELS AT THE OUTER ANCHORAGE FROM DAWN TO DUSK EVERY DAY OF THE \
             WEEK.",
        ];
        for page in pages {
            assert!(!is_garbled(page), "{page}");
        }
    }
}
