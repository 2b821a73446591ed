//! `sift-graph`: the embedded entity extractor of GraphRAG (no model, no I/O, no runtime).
//! Text in, entities out.
//!
//! - [`extract`]: the entities of one chunk ([`Mention`]s with counts and first offsets):
//!   capitalised names with their connectors ("Bank of England"), acronyms, quoted terms,
//!   dates (canonical ISO 8601), quantities, the document's title, and for Chinese the people,
//!   places, organisations and proper nouns jieba tags. Aliases within the text fold into the
//!   full name ("Derrickson" into "Scott Derrickson", "WHO" into "World Health Organization");
//!   at most [`Limits::max_entities`] per text, in time linear in the text.
//! - [`query_names`]: the canonical names a query may refer to, for seeding a graph search
//!   by name, lower-case queries included.
//! - [`canonical`] and [`entity_id`]: the folded form of a name and the global id made from it,
//!   the key that joins mentions across documents and queries.
//! - [`communities`]: groups of entities that share chunks (Louvain), for global questions.
//!
//! Modules: `tokens` (text to tokens), `english` and `chinese` (the rules, giving candidates),
//! `mentions` (candidates to mentions: grouping, alias folding, the cap), `query`, `canonical`,
//! `communities`,
//! `lexicon` (the word lists).

mod canonical;
mod chinese;
mod communities;
mod english;
mod lexicon;
mod mentions;
mod query;
mod tokens;

#[cfg(test)]
mod tests;

pub use canonical::{canonical, entity_id};
pub use communities::communities;
pub use query::query_names;

/// Global id of an entity: the first 8 bytes (big-endian u64) of the SHA-256 of its canonical
/// name.
pub type EntityId = u64;

/// What an entity is, as far as the rules can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    /// Capitalised words: "Scott Derrickson", "Bank of England".
    Name,
    /// "NASA", "COVID-19", "U.S.".
    Acronym,
    /// A term in quotes: "Demon Creation Specialists", 《泡泡堂》.
    Quoted,
    /// The document's title.
    Title,
    /// "1998", "1998-03", "1998-03-12" (the canonical form is ISO 8601).
    Date,
    /// A number with a unit: "5 mg", "20%", "$4 million".
    Quantity,
    /// Chinese: jieba tag `nr*`.
    Person,
    /// Chinese: jieba tag `ns*`.
    Place,
    /// Chinese: jieba tag `nt*`.
    Organisation,
    /// Chinese: jieba tag `nz`.
    Proper,
}

impl EntityKind {
    pub const ALL: [EntityKind; 10] = [
        EntityKind::Name,
        EntityKind::Acronym,
        EntityKind::Quoted,
        EntityKind::Title,
        EntityKind::Date,
        EntityKind::Quantity,
        EntityKind::Person,
        EntityKind::Place,
        EntityKind::Organisation,
        EntityKind::Proper,
    ];

    /// The snake-case name, as serde writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Name => "name",
            EntityKind::Acronym => "acronym",
            EntityKind::Quoted => "quoted",
            EntityKind::Title => "title",
            EntityKind::Date => "date",
            EntityKind::Quantity => "quantity",
            EntityKind::Person => "person",
            EntityKind::Place => "place",
            EntityKind::Organisation => "organisation",
            EntityKind::Proper => "proper",
        }
    }
}

/// Which rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// English rules only; Han characters are separators.
    English,
    /// Chinese rules (jieba) for runs of Han characters, English rules for the Latin text
    /// between them. The same as `Auto` for [`extract`].
    Chinese,
    /// Chinese rules for runs of Han characters, English rules elsewhere.
    Auto,
}

impl Language {
    /// A KB's language setting: "zh", "zh-CN", "zh_Hans"… are Chinese, "en" and "en-GB"…
    /// English, anything else (none, "auto", "fr") Auto.
    pub fn from_setting(setting: &str) -> Language {
        let setting = setting.trim().to_ascii_lowercase();
        let primary = setting.split(['-', '_']).next().unwrap_or("");
        match primary {
            "zh" => Language::Chinese,
            "en" => Language::English,
            _ if setting.starts_with("zh") => Language::Chinese,
            _ => Language::Auto,
        }
    }

    fn uses_jieba(self) -> bool {
        self != Language::English
    }
}

/// One entity of a text.
#[derive(Clone, Debug, PartialEq)]
pub struct Mention {
    pub id: EntityId,
    /// The folded form the id is made from ([`canonical`]; ISO 8601 for dates).
    pub canonical: String,
    /// The display form: the first full surface form seen (the title as given for the title).
    pub name: String,
    pub kind: EntityKind,
    /// Occurrences in this text, aliases folded in; at least 1 for the title even when the
    /// text never names it.
    pub count: u32,
    /// Char offset of the first occurrence (aliases included); 0 for a title the text never
    /// names.
    pub first_char: u32,
}

/// Bounds of one extraction.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Entities kept per text: the title, then the most frequent, ties by first occurrence.
    pub max_entities: usize,
    /// Names longer than this (in chars) are dropped; the title is kept whatever its length.
    pub max_name_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entities: 48,
            max_name_chars: 80,
        }
    }
}

/// Entities of one chunk. `title` is the document's title (or None); it is itself an entity
/// (kind Title) whenever given and non-empty, and always kept under the cap. Sorted as kept:
/// the title first, then by count (descending) and first occurrence.
pub fn extract(
    text: &str,
    title: Option<&str>,
    language: Language,
    limits: &Limits,
) -> Vec<Mention> {
    let mut candidates = Vec::new();
    english::candidates(text, limits, &mut candidates);
    if language.uses_jieba() {
        chinese::candidates(text, limits, &mut candidates);
        if let Some(title) = title {
            let name = canonical(title);
            if !candidates
                .iter()
                .any(|candidate| candidate.canonical == name)
            {
                chinese::title_occurrences(text, title, &mut candidates);
            }
        }
    }
    mentions::fold(candidates, title, limits)
}
