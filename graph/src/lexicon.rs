//! The small word lists the rules need: common English words, name connectors, months,
//! abbreviations whose point ends no sentence, units of quantities, Chinese function words.
//!
//! Lists are sorted so that a binary search looks a word up; a test keeps them sorted.

/// Common English words, lower case: a capitalised one starts no name (it is capitalised
/// because it starts a sentence), a sentence-initial single word from this list is no entity,
/// and a query n-gram neither is one alone nor starts or ends with one. Months and weekdays
/// are here too: alone they are not entities (a date rule takes "March 1998").
const COMMON: &[&str] = &[
    "a",
    "about",
    "above",
    "according",
    "across",
    "after",
    "afterwards",
    "again",
    "against",
    "ago",
    "all",
    "almost",
    "along",
    "already",
    "also",
    "although",
    "always",
    "am",
    "among",
    "an",
    "and",
    "another",
    "any",
    "anyone",
    "anything",
    "april",
    "are",
    "around",
    "as",
    "at",
    "august",
    "based",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "beside",
    "besides",
    "between",
    "beyond",
    "both",
    "but",
    "by",
    "can",
    "cannot",
    "could",
    "despite",
    "did",
    "do",
    "does",
    "done",
    "down",
    "due",
    "during",
    "each",
    "early",
    "eight",
    "either",
    "else",
    "even",
    "ever",
    "every",
    "everyone",
    "everything",
    "few",
    "finally",
    "five",
    "following",
    "for",
    "four",
    "friday",
    "from",
    "further",
    "furthermore",
    "had",
    "has",
    "have",
    "having",
    "he",
    "hence",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "however",
    "i",
    "if",
    "in",
    "including",
    "indeed",
    "instead",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "january",
    "july",
    "june",
    "just",
    "later",
    "least",
    "less",
    "like",
    "many",
    "march",
    "may",
    "maybe",
    "me",
    "meanwhile",
    "might",
    "mine",
    "monday",
    "more",
    "moreover",
    "most",
    "much",
    "must",
    "my",
    "neither",
    "never",
    "nevertheless",
    "nine",
    "no",
    "nobody",
    "none",
    "nor",
    "not",
    "nothing",
    "november",
    "now",
    "october",
    "of",
    "off",
    "often",
    "on",
    "once",
    "one",
    "only",
    "onto",
    "or",
    "other",
    "others",
    "otherwise",
    "our",
    "ours",
    "out",
    "over",
    "per",
    "perhaps",
    "please",
    "rather",
    "same",
    "saturday",
    "september",
    "seven",
    "several",
    "shall",
    "she",
    "should",
    "since",
    "six",
    "so",
    "some",
    "someone",
    "something",
    "sometimes",
    "soon",
    "still",
    "such",
    "sunday",
    "ten",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "therefore",
    "these",
    "they",
    "this",
    "those",
    "though",
    "three",
    "through",
    "throughout",
    "thursday",
    "thus",
    "to",
    "today",
    "together",
    "too",
    "toward",
    "towards",
    "tuesday",
    "two",
    "under",
    "unless",
    "unlike",
    "until",
    "up",
    "upon",
    "us",
    "usually",
    "very",
    "via",
    "was",
    "we",
    "wednesday",
    "were",
    "what",
    "whatever",
    "when",
    "whenever",
    "where",
    "whereas",
    "whether",
    "which",
    "while",
    "who",
    "whom",
    "whose",
    "why",
    "will",
    "with",
    "within",
    "without",
    "would",
    "yes",
    "yet",
    "you",
    "your",
    "yours",
    "yourself",
];

/// Lower-case words that may stand inside a multi-word name between capitalised words:
/// "Bank of England", "Alexander the Great", "Vincent van Gogh". ("and" is handled apart: it
/// joins only after an "of" or "for", "Department of Health and Human Services", so that
/// "Nolan and Kalathil" stay two people.)
const CONNECTORS: &[&str] = &[
    "al", "bin", "da", "de", "del", "della", "der", "des", "di", "do", "dos", "du", "el", "for",
    "ibn", "la", "le", "of", "the", "upon", "van", "von", "y", "zu",
];

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// Words that end with a point that ends no sentence: honorifics and the like stand inside a
/// name ("Dr. Strange", "St. Louis"), the rest just do not start a new sentence.
const ABBREVIATIONS: &[&str] = &[
    "capt", "co", "col", "corp", "dr", "fig", "ft", "gen", "gov", "inc", "jr", "lt", "ltd", "mr",
    "mrs", "ms", "mt", "no", "prof", "rep", "rev", "sen", "sgt", "sr", "st", "vs",
];

/// Units after a number ("5 mg", "3.5 km", "4 million"), compared in lower case; the
/// one-letter units are in [`SINGLE_LETTER_UNITS`] and compared as written.
const UNITS: &[&str] = &[
    "acres", "bar", "billion", "bn", "cm", "cm2", "cm3", "db", "degrees", "dollars", "euros",
    "feet", "ft", "gb", "ghz", "gw", "gwh", "ha", "hectares", "hours", "hr", "hrs", "hz", "inches",
    "iu", "kb", "kcal", "kg", "kgs", "khz", "km", "km2", "kmh", "kph", "kv", "kw", "kwh", "lb",
    "lbs", "mb", "mcg", "meq", "meters", "metres", "mg", "mhz", "mi", "miles", "million", "min",
    "mins", "minutes", "ml", "mm", "mmhg", "mmol", "mol", "mph", "ms", "mv", "mw", "mwh", "ng",
    "nm", "nmol", "ounces", "oz", "pa", "percent", "pmol", "pounds", "ppm", "sec", "seconds", "tb",
    "thousand", "tonnes", "tons", "trillion", "ug", "ul", "um", "yards", "yd", "µg", "µl", "µm",
    "µmol",
];

/// One-letter units, case-sensitive: "5 m", "5 g", "2 L", "220 V", "60 W", "300 K".
const SINGLE_LETTER_UNITS: [char; 9] = ['m', 'g', 'l', 'L', 's', 'h', 'V', 'W', 'K'];

/// Chinese function and question words: never a query term alone.
const CHINESE_COMMON: &[&str] = &[
    "一个",
    "不是",
    "为什么",
    "么",
    "什么",
    "他们",
    "以及",
    "们",
    "其",
    "几",
    "利用",
    "可以",
    "吗",
    "呢",
    "哪",
    "哪个",
    "哪些",
    "哪里",
    "因为",
    "多少",
    "如何",
    "已经",
    "并",
    "我们",
    "所以",
    "是",
    "是什么",
    "有",
    "的",
    "被",
    "谁",
    "还",
    "这",
    "这个",
    "那",
    "那个",
    "都",
];

fn sorted_contains(list: &[&str], word: &str) -> bool {
    list.binary_search(&word).is_ok()
}

pub(crate) fn is_common(lower: &str) -> bool {
    sorted_contains(COMMON, lower)
}

pub(crate) fn is_connector(word: &str) -> bool {
    sorted_contains(CONNECTORS, word)
}

/// The month number (1..=12) of a month name or its three-letter abbreviation, any case.
pub(crate) fn month(word: &str) -> Option<u32> {
    if !(3..=9).contains(&word.len()) || !word.is_ascii() {
        return None;
    }
    let lower = word.to_ascii_lowercase();
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    MONTHS
        .iter()
        .position(|m| *m == lower || (lower.len() == 3 && m.starts_with(lower)))
        .map(|i| i as u32 + 1)
}

pub(crate) fn is_abbreviation(word: &str) -> bool {
    word.len() <= 4 && word.is_ascii() && sorted_contains(ABBREVIATIONS, &word.to_ascii_lowercase())
}

pub(crate) fn is_unit(word: &str) -> bool {
    let mut chars = word.chars();
    if let (Some(only), None) = (chars.next(), chars.next()) {
        return SINGLE_LETTER_UNITS.contains(&only);
    }
    word.len() <= 8 && sorted_contains(UNITS, &word.to_lowercase())
}

pub(crate) fn is_chinese_common(word: &str) -> bool {
    sorted_contains(CHINESE_COMMON, word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_sorted_for_binary_search() {
        for list in [COMMON, CONNECTORS, ABBREVIATIONS, UNITS, CHINESE_COMMON] {
            for pair in list.windows(2) {
                assert!(pair[0] < pair[1], "{} before {}", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn lookups() {
        assert!(is_common("however"));
        assert!(!is_common("new"));
        assert!(is_connector("van"));
        assert_eq!(month("March"), Some(3));
        assert_eq!(month("sep"), Some(9));
        assert_eq!(month("Mar."), Some(3));
        assert_eq!(month("Marching"), None);
        assert!(is_abbreviation("Dr"));
        assert!(is_unit("km") && is_unit("MG") && is_unit("m") && !is_unit("M"));
        assert!(!is_unit("people"));
        assert!(is_chinese_common("什么"));
    }
}
