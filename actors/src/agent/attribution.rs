//! Attribution after the fact: every sentence of an answer is matched against the evidence
//! this run retrieved, and only sentences the evidence supports keep a place (and get
//! citations) in the answer.
//!
//! ```text
//! answer ─ split_sentences ─┬─ markers resolved ([n], [chunk_id], the cited list) → hints
//!                           ├─ content stems (stopwords out, light stemming, 43.8 one term)
//!                           └─ per evidence chunk: the stems it shares
//! verdict: supported   a chunk shares ≥ 50% of the sentence's stems (35% for a chunk the
//!                      model cited), at least two of them (one for a one-stem sentence),
//!                      one at least not in the question; else two chunks together (multi-hop)
//!          echo        every stem of the sentence is in the question
//!          fragment    under four words, not a yes/no, not an entity wholly in one chunk
//!          refusal     "the knowledge base does not say …": kept when nothing relevant was
//!                      retrieved or beside supported sentences
//!          duplicate   the same sentence again (small models loop)
//!          unsupported anything else
//! ```
//!
//! A citation is only ever made to a chunk that shares the sentence's content, so precision is
//! by construction; a model's marker to a chunk that does not support its sentence is removed.
//! What happens to unsupported sentences is the preset's [`Grounding`]: `strict` removes them,
//! `flag` keeps them marked `[unsupported]`; the per-sentence verdicts go to the answer's
//! metadata either way ([`GroundingReport`]). The functions here are pure; the run decides the
//! fallback when no sentence is left (see `run.rs`).

use std::collections::BTreeSet;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::Citation;
use super::evidence::{
    Evidence, EvidenceChunk, citation_for, clean_cited, number_of, resolve_cited, rewrite_markers,
};
use super::extractive::sentence_span;
use super::terms::{is_cjk, sentences, terms};

/// Share of a sentence's content stems one chunk must hold to support it.
pub const SUPPORT_SHARE: f64 = 0.5;
/// The share when the model cited that chunk for the sentence (its marker or citation list):
/// the model's own pointer counts as half the evidence, never as all of it.
pub const HINTED_SUPPORT_SHARE: f64 = 0.35;
/// Sentences with fewer words are fragments (unless a yes/no or an entity in the evidence).
pub const MIN_SENTENCE_WORDS: usize = 4;
/// The same for CJK text, counted in CJK characters.
pub const MIN_SENTENCE_CJK_CHARS: usize = 6;
/// Most chunks one sentence cites.
pub const MAX_CITATIONS_PER_SENTENCE: usize = 3;
/// A sentence the words alone do not support is compared by meaning with the chunks that
/// hold at least this share of its stems (and one not in the question)…
pub const SEMANTIC_MIN_SHARE: f64 = 0.25;
/// …and supported by one whose closest sentence has at least this cosine similarity to it.
pub const SEMANTIC_SUPPORT: f32 = 0.7;
/// Chunks compared by meaning per sentence.
pub const SEMANTIC_CANDIDATES: usize = 3;
/// The marker an unsupported sentence gets under `flag`.
pub const UNSUPPORTED_MARK: &str = "[unsupported]";

/// What a preset does with sentences the evidence does not support.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grounding {
    /// Unsupported sentences are removed (an answer left empty becomes the extractive one).
    #[default]
    Strict,
    /// Unsupported sentences stay, marked `[unsupported]`.
    Flag,
    /// No attribution: the model's own citations, filtered to this run's chunks.
    Off,
}

/// Why a sentence was judged as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Supported,
    /// A yes/no backed by a chunk that covers the question.
    SupportedYesNo,
    /// A short answer (a name, a number) found whole in a chunk.
    SupportedEntity,
    /// Supported by the output of a service tool (web search, MCP), which has no chunk to
    /// cite; the verdict names the tool.
    SupportedByTool,
    /// Says the knowledge base does not answer; legitimate when nothing relevant was found.
    Refusal,
    Echo,
    Fragment,
    Duplicate,
    Unsupported,
}

impl Verdict {
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            Verdict::Supported
                | Verdict::SupportedYesNo
                | Verdict::SupportedEntity
                | Verdict::SupportedByTool
        )
    }
}

/// Where a supporting chunk holds the sentence's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SupportRef {
    pub chunk_id: String,
    /// The citation number in the answer.
    pub n: u32,
    /// Character offsets `[start, end)` in the document of the chunk sentence that shares
    /// most of the answer sentence's content (the chunk's span when it lies outside the
    /// chunk's own text).
    pub span: (u32, u32),
    /// Share of the sentence's content stems this chunk holds.
    pub overlap: f64,
    /// The cosine similarity that supported the sentence when the words alone did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f32>,
}

/// One sentence of the answer and its verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SentenceVerdict {
    /// The sentence without citation markers.
    pub text: String,
    pub verdict: Verdict,
    /// Whether the sentence is in the shown answer.
    pub kept: bool,
    /// The best share of its content stems one chunk holds.
    pub overlap: f64,
    pub support: Vec<SupportRef>,
    /// The service tool whose output supports the sentence ([`Verdict::SupportedByTool`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Chunks the model's markers pointed at that do not support the sentence (their markers
    /// were removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_markers: Vec<String>,
}

/// The per-sentence verdicts of an answer, as its metadata carries them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroundingReport {
    pub policy: Grounding,
    pub sentences: Vec<SentenceVerdict>,
    pub supported: u32,
    pub unsupported: u32,
    pub removed: u32,
    /// Set when the model's answer was replaced: `extractive` (no sentence supported) or
    /// `not_found` (nothing relevant retrieved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Why, in words (the note the answer carries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl GroundingReport {
    /// Whether the answer keeps something of the model's (a supported sentence, or a
    /// legitimate refusal).
    pub fn has_answer(&self) -> bool {
        self.sentences
            .iter()
            .any(|s| s.kept && (s.verdict.is_supported() || s.verdict == Verdict::Refusal))
    }

    /// Whether the kept answer is only a refusal.
    pub fn only_refusal(&self) -> bool {
        self.has_answer()
            && self
                .sentences
                .iter()
                .filter(|s| s.kept)
                .all(|s| s.verdict == Verdict::Refusal)
    }
}

/// The answer after attribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Attributed {
    pub text: String,
    pub citations: Vec<Citation>,
    /// Cited ids no tool returned in this run.
    pub dropped: Vec<String>,
    pub report: GroundingReport,
    /// Sentences the words alone do not support but that share some content with a chunk:
    /// the run may compare them by meaning and attribute again with [`SemanticMatches`].
    pub borderline: Vec<Borderline>,
    /// Where each sentence of the report ends in the answer (a byte offset).
    pub ends: Vec<usize>,
}

/// A sentence to compare by meaning with the closest sentence of a few chunks.
#[derive(Clone, Debug, PartialEq)]
pub struct Borderline {
    /// The sentence's place among the answer's judged sentences.
    pub index: usize,
    pub sentence: String,
    /// (chunk id, the chunk's sentence sharing most of its stems).
    pub candidates: Vec<(String, String)>,
}

/// Sentence index → (chunk id, cosine similarity) pairs that passed [`SEMANTIC_SUPPORT`].
pub type SemanticMatches = std::collections::HashMap<usize, Vec<(String, f32)>>;

/// What attribution reads.
pub struct AttributionInput<'a> {
    /// The answer, already scrubbed of protocol text.
    pub answer: &'a str,
    /// The ids the model cited besides its markers.
    pub cited: &'a [String],
    pub question: &'a str,
    pub evidence: &'a Evidence,
    pub policy: Grounding,
    /// Whether retrieval found nothing relevant (a refusal is then legitimate).
    pub nothing_relevant: bool,
    /// Outputs of service tools (web search, MCP) as (tool name, text): they can support a
    /// sentence, but give no citation.
    pub tool_outputs: &'a [(String, String)],
    /// Support found by meaning for borderline sentences of an earlier pass (empty at first).
    pub semantic: &'a SemanticMatches,
    /// Byte offset in `answer`: the sentences ending at or before it were streamed while the
    /// model wrote them, and are judged as they were then: without `cited` (a call's citation
    /// list comes after its answer) and without `semantic` (0: none was streamed).
    pub pinned: usize,
}

/// Splits an answer into sentences, as byte ranges `[start, end)` of `text` (trimmed).
/// Ends at `.`/`!`/`?` before whitespace (not after an abbreviation or an initial, not before a
/// lower-case word, so `e.g. this` and `J. R. R. Tolkien` stay whole; `3.5` has no space), at
/// `。！？` and at line breaks. Markers and closing quotes after the end belong to the sentence.
pub fn split_sentences(text: &str) -> Vec<(usize, usize)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let byte_at = |i: usize| chars.get(i).map_or(text.len(), |(b, _)| *b);
    let mut ranges = Vec::new();
    let mut start = 0usize; // char index
    let mut i = 0usize;
    let push = |from: usize, to: usize, ranges: &mut Vec<(usize, usize)>| {
        let (a, b) = (byte_at(from), byte_at(to));
        let piece = &text[a..b];
        let lead = piece.len() - piece.trim_start().len();
        let trail = piece.len() - piece.trim_end().len();
        if a + lead < b - trail {
            ranges.push((a + lead, b - trail));
        }
    };
    while i < chars.len() {
        let c = chars[i].1;
        let end_here = match c {
            '\n' => {
                push(start, i, &mut ranges);
                start = i + 1;
                i += 1;
                continue;
            }
            '。' | '！' | '？' => true,
            '.' | '!' | '?' => {
                let next = chars.get(i + 1).map(|(_, c)| *c);
                let closes = next.is_none_or(|n| {
                    n.is_whitespace() || matches!(n, '"' | '”' | '’' | ')' | '[' | '【')
                });
                closes && !(c == '.' && (is_abbreviation(&chars, i) || next_is_lower(&chars, i)))
            }
            _ => false,
        };
        if !end_here {
            i += 1;
            continue;
        }
        // Closing quotes, then markers, belong to the sentence that ends here.
        let mut end = i + 1;
        while end < chars.len() && matches!(chars[end].1, '"' | '”' | '’' | ')' | '」' | '』')
        {
            end += 1;
        }
        loop {
            let mut probe = end;
            while probe < chars.len() && chars[probe].1 == ' ' {
                probe += 1;
            }
            if probe < chars.len() && matches!(chars[probe].1, '[' | '【') {
                let close = chars[probe..]
                    .iter()
                    .take(600)
                    .position(|(_, c)| matches!(c, ']' | '】'));
                let line_break = chars[probe..]
                    .iter()
                    .take(600)
                    .position(|(_, c)| *c == '\n');
                match close {
                    Some(at) if line_break.is_none_or(|nl| nl > at) => {
                        end = probe + at + 1;
                        continue;
                    }
                    _ => {}
                }
            }
            break;
        }
        push(start, end, &mut ranges);
        start = end;
        i = end;
    }
    push(start, chars.len(), &mut ranges);
    ranges
}

const ABBREVIATIONS: &[&str] = &[
    "e.g", "i.e", "mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "inc", "ltd", "jr", "sr",
    "no", "fig", "approx", "cf", "al", "co", "corp", "gen", "gov", "mt", "ft", "u.s", "u.k",
];

/// Whether the `.` at char `i` ends an abbreviation or an initial.
fn is_abbreviation(chars: &[(usize, char)], i: usize) -> bool {
    let word: String = chars[..i]
        .iter()
        .rev()
        .take_while(|(_, c)| !c.is_whitespace() && !matches!(c, '(' | '"' | '“'))
        .map(|(_, c)| *c)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let lower = word.to_lowercase();
    // A single capital letter is an initial (`J.`); letters joined by dots an acronym (`U.S`).
    (word.chars().count() == 1 && word.chars().all(|c| c.is_uppercase()))
        || ABBREVIATIONS.contains(&lower.as_str())
        || (lower.contains('.') && lower.split('.').all(|part| part.chars().count() == 1))
}

fn next_is_lower(chars: &[(usize, char)], i: usize) -> bool {
    chars[i + 1..]
        .iter()
        .find(|(_, c)| !c.is_whitespace())
        .is_some_and(|(_, c)| c.is_lowercase())
}

/// Content stems of `text`: [`terms`] after joining numbers (`43.8`, `1,890` are one term),
/// without yes/no, each lightly stemmed.
pub fn stems(text: &str) -> Vec<String> {
    let joined = join_numbers(text);
    let mut out: Vec<String> = Vec::new();
    for term in terms(&joined) {
        if matches!(term.as_str(), "yes" | "no") || FRAMING.contains(&term.as_str()) {
            continue;
        }
        let stem = stem(&term);
        if !out.contains(&stem) {
            out.push(stem);
        }
    }
    out
}

/// Words that frame a claim rather than make it ("according to the evidence provided").
const FRAMING: &[&str] = &[
    "according",
    "based",
    "evidence",
    "provided",
    "source",
    "sources",
    "document",
    "documents",
    "knowledge",
    "context",
    "passage",
    "passages",
    "information",
    "answer",
    "question",
    "mentioned",
    "states",
    "stated",
    "says",
    "retrieved",
    "chunk",
    "chunks",
];

/// Removes `.` and `,` between digits, so a number stays one term.
fn join_numbers(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            !(matches!(c, '.' | ',')
                && *i > 0
                && chars[i - 1].is_ascii_digit()
                && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit()))
        })
        .map(|(_, c)| *c)
        .collect()
}

/// A light English stemmer: common inflection suffixes off (`boils`, `boiling` → `boil`).
fn stem(term: &str) -> String {
    if !term.chars().all(|c| c.is_ascii_alphabetic()) || term.len() <= 4 {
        return term.to_string();
    }
    for suffix in ["ing", "edly", "ed", "ies", "es", "s", "ly"] {
        if let Some(base) = term.strip_suffix(suffix)
            && base.len() >= 3
            && !(suffix == "s" && base.ends_with('s'))
        {
            return if suffix == "ies" {
                format!("{base}y")
            } else {
                base.to_string()
            };
        }
    }
    term.to_string()
}

/// Whether `stem` matches a stem of `set`: equal, or one a prefix of the other by at most
/// three characters (`elect` / `election`), the shorter at least four long.
fn stem_in(stem: &str, set: &BTreeSet<String>) -> bool {
    if set.contains(stem) {
        return true;
    }
    if stem.chars().count() < 4 || !stem.is_ascii() {
        return false;
    }
    let longer = set
        .range(stem.to_string()..)
        .take_while(|candidate| candidate.starts_with(stem))
        .any(|candidate| candidate.len() <= stem.len() + 3);
    longer
        || (4..stem.len())
            .filter(|len| stem.len() - len <= 3)
            .any(|len| set.contains(&stem[..len]))
}

fn refusal_regex() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?i)\b(does not|doesn't|do not|don't|did not|didn't|cannot|can't|could not|couldn't|unable to)\s+(say|mention|contain|include|provide|find|answer|specify|state|cover|know)\b|\bno (relevant )?(information|evidence|mention|answer)\b|\bnot (found|mentioned|specified|stated|covered)\b|\binsufficient (evidence|information)\b|没有(相关)?(信息|提及|说明)|未(提及|说明)",
        )
        .expect("valid regex")
    })
}

/// Whether a sentence says the knowledge base does not answer.
pub fn is_refusal(sentence: &str) -> bool {
    refusal_regex().is_match(sentence)
}

/// Whether a question asks for yes or no.
pub fn is_yes_no_question(question: &str) -> bool {
    let first = question
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_lowercase();
    matches!(
        first.as_str(),
        "is" | "are"
            | "was"
            | "were"
            | "do"
            | "does"
            | "did"
            | "can"
            | "could"
            | "has"
            | "have"
            | "had"
            | "will"
            | "would"
            | "should"
            | "shall"
            | "may"
            | "might"
            | "must"
    ) || question.contains('吗')
        || question.contains("是否")
}

fn is_yes_no(sentence: &str) -> bool {
    let first: String = sentence
        .trim()
        .chars()
        .take_while(|c| c.is_alphabetic())
        .collect::<String>()
        .to_lowercase();
    matches!(first.as_str(), "yes" | "no")
        || sentence.trim_start().starts_with(['是', '否', '对', '不'])
}

/// Whether a sentence negates (`not`, `n't`, `never`, `no`).
fn negates(sentence: &str) -> bool {
    sentence
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .any(|word| {
            let word = word.to_lowercase();
            matches!(
                word.as_str(),
                "not" | "no" | "never" | "neither" | "nor" | "cannot"
            ) || word.ends_with("n't")
        })
}

fn is_fragment(sentence: &str) -> bool {
    let words = sentence
        .split_whitespace()
        .filter(|w| w.chars().any(|c| c.is_alphanumeric() && !is_cjk(c)))
        .count();
    let cjk = sentence.chars().filter(|c| is_cjk(*c)).count();
    words < MIN_SENTENCE_WORDS && cjk < MIN_SENTENCE_CJK_CHARS
}

/// One evidence chunk's stems and numbers.
struct Indexed<'a> {
    chunk: &'a EvidenceChunk,
    stems: BTreeSet<String>,
    numbers: BTreeSet<String>,
}

/// The numbers of `text` (digit runs, `43.8` and `1,890` joined): a chunk supports a sentence
/// only if it holds every number the sentence states.
fn numbers(text: &str) -> BTreeSet<String> {
    join_numbers(text)
        .split(|c: char| !c.is_ascii_digit())
        .filter(|run| !run.is_empty())
        .map(str::to_string)
        .collect()
}

/// Attributes each sentence of the answer (see the module docs).
pub fn attribute(input: &AttributionInput<'_>) -> Attributed {
    let cited = resolve_cited(clean_cited(input.cited), input.evidence);
    let indexed: Vec<Indexed<'_>> = input
        .evidence
        .in_order()
        .map(|chunk| Indexed {
            chunk,
            stems: stems(&chunk.chunk.text).into_iter().collect(),
            numbers: numbers(&chunk.chunk.text),
        })
        .collect();
    let question: BTreeSet<String> = stems(input.question).into_iter().collect();
    let listed: BTreeSet<&str> = cited
        .iter()
        .filter(|id| input.evidence.contains(id))
        .map(String::as_str)
        .collect();
    let mut numbering: Vec<String> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    // First the verdicts, then the rendering (a refusal's fate depends on the others).
    struct Judged {
        range: (usize, usize),
        pinned: bool,
        verdict: Verdict,
        plain: String,
        support: Vec<(String, f64)>,
        overlap: f64,
        rejected: Vec<String>,
        tool: Option<String>,
        similarity: Option<f32>,
    }
    let mut borderline: Vec<Borderline> = Vec::new();
    let tools: Vec<(&str, BTreeSet<String>)> = input
        .tool_outputs
        .iter()
        .map(|(name, text)| {
            // The tool's name counts as its content (`atlas__capital`: "according to atlas").
            let named = format!("{} {text}", name.replace("__", " "));
            (name.as_str(), stems(&named).into_iter().collect())
        })
        .collect();
    let mut judged: Vec<Judged> = Vec::new();
    let no_cited: Vec<String> = Vec::new();
    for range in split_sentences(input.answer) {
        let raw = &input.answer[range.0..range.1];
        let pinned = range.1 <= input.pinned;
        let cited = if pinned { &no_cited } else { &cited };
        let mut scratch = Vec::new();
        let (plain, marked) = rewrite_markers(
            raw,
            cited,
            input.evidence,
            &mut scratch,
            &mut dropped,
            &|_| false,
        );
        let plain = plain.split_whitespace().collect::<Vec<_>>().join(" ");
        if plain.chars().all(|c| !c.is_alphanumeric()) {
            continue; // markers or punctuation alone
        }
        let hinted: BTreeSet<&str> = marked
            .iter()
            .map(String::as_str)
            .chain(listed.iter().copied().filter(|_| !pinned))
            .collect();
        let key = plain.to_lowercase();
        let (mut verdict, support, overlap) = if !seen.insert(key) {
            (Verdict::Duplicate, Vec::new(), 0.0)
        } else {
            judge(&plain, &question, input.question, &indexed, &hinted)
        };
        let index = judged.len();
        let mut support = support;
        let mut similarity = None;
        if verdict == Verdict::Unsupported {
            let candidates = lexical_candidates(&plain, &question, &indexed);
            let matched = input
                .semantic
                .get(&index)
                .filter(|_| !pinned)
                .and_then(|matches| {
                    matches
                        .iter()
                        .filter(|(id, cosine)| {
                            *cosine >= SEMANTIC_SUPPORT && candidates.iter().any(|(c, _)| c == id)
                        })
                        .max_by(|a, b| a.1.total_cmp(&b.1))
                });
            match matched {
                Some((id, cosine)) => {
                    let share = candidates
                        .iter()
                        .find(|(c, _)| c == id)
                        .map_or(0.0, |(_, share)| *share);
                    verdict = Verdict::Supported;
                    support = vec![(id.clone(), share)];
                    similarity = Some(*cosine);
                }
                None if !candidates.is_empty() => borderline.push(Borderline {
                    index,
                    sentence: plain.clone(),
                    candidates: candidates
                        .iter()
                        .filter_map(|(id, _)| {
                            let chunk = input.evidence.get(id)?;
                            Some((id.clone(), closest_sentence(chunk, &plain)))
                        })
                        .collect(),
                }),
                None => {}
            }
        }
        let mut tool = None;
        if matches!(verdict, Verdict::Unsupported | Verdict::Fragment) {
            tool = supporting_tool(&plain, &question, &tools).map(str::to_string);
            if tool.is_some() {
                verdict = Verdict::SupportedByTool;
            }
        }
        let rejected = marked
            .iter()
            .filter(|id| !support.iter().any(|(s, _)| s == *id))
            .cloned()
            .collect();
        judged.push(Judged {
            range,
            pinned,
            verdict,
            plain,
            support,
            overlap,
            rejected,
            tool,
            similarity,
        });
    }
    let any_supported = judged.iter().any(|j| j.verdict.is_supported());
    let mut report = GroundingReport {
        policy: input.policy,
        ..Default::default()
    };
    let mut text = String::with_capacity(input.answer.len());
    let mut last = 0;
    let mut ends = Vec::with_capacity(judged.len());
    for item in judged {
        ends.push(item.range.1);
        let refusal_kept =
            item.verdict == Verdict::Refusal && (input.nothing_relevant || any_supported);
        let supported = item.verdict.is_supported();
        let kept = supported || refusal_kept || input.policy != Grounding::Strict;
        let raw = &input.answer[item.range.0..item.range.1];
        // The text between sentences (spaces, line breaks) stays with the kept ones.
        let between = &input.answer[last..item.range.0];
        last = item.range.1;
        let mut support_refs = Vec::new();
        if kept {
            let ids: Vec<&str> = item.support.iter().map(|(id, _)| id.as_str()).collect();
            let (mut rendered, _) = rewrite_markers(
                raw,
                if item.pinned { &no_cited } else { &cited },
                input.evidence,
                &mut numbering,
                &mut Vec::new(),
                &|id| ids.contains(&id),
            );
            let missing: Vec<u32> = ids
                .iter()
                .map(|id| number_of(id, &mut numbering))
                .filter(|n| !rendered.contains(&format!("[{n}]")))
                .collect();
            let mut append = String::new();
            for n in missing {
                append.push_str(&format!("[{n}]"));
            }
            if !supported && !refusal_kept {
                append.push_str(UNSUPPORTED_MARK);
            }
            if !append.is_empty() {
                rendered = insert_before_end(&rendered, &append);
            }
            // Only the layout of what lay between is kept (a line of stray markers is not).
            if !text.is_empty() {
                text.push_str(if between.contains("\n\n") {
                    "\n\n"
                } else if between.contains('\n') {
                    "\n"
                } else {
                    " "
                });
            }
            text.push_str(&rendered);
            for (id, overlap) in &item.support {
                if let Some(found) = input.evidence.get(id) {
                    let n = number_of(id, &mut numbering);
                    support_refs.push(SupportRef {
                        chunk_id: id.clone(),
                        n,
                        span: best_span(found, &item.plain),
                        overlap: round(*overlap),
                        similarity: item.similarity,
                    });
                }
            }
        } else {
            report.removed += 1;
        }
        if supported {
            report.supported += 1;
        } else if item.verdict != Verdict::Refusal || !refusal_kept {
            report.unsupported += 1;
        }
        report.sentences.push(SentenceVerdict {
            text: item.plain,
            verdict: item.verdict,
            kept,
            overlap: round(item.overlap),
            support: support_refs,
            tool: item.tool,
            rejected_markers: item.rejected,
        });
    }
    let citations = numbering
        .iter()
        .enumerate()
        .filter_map(|(index, id)| {
            input
                .evidence
                .get(id)
                .map(|chunk| citation_for(index as u32 + 1, chunk))
        })
        .collect();
    for id in &cited {
        if !input.evidence.contains(id) && !dropped.contains(id) {
            dropped.push(id.clone());
        }
    }
    Attributed {
        text: text.trim().to_string(),
        citations,
        dropped,
        report,
        borderline,
        ends,
    }
}

/// Chunks holding at least [`SEMANTIC_MIN_SHARE`] of the sentence's stems, one of them not in
/// the question: (chunk id, share), best first, at most [`SEMANTIC_CANDIDATES`].
fn lexical_candidates(
    plain: &str,
    question: &BTreeSet<String>,
    indexed: &[Indexed<'_>],
) -> Vec<(String, f64)> {
    let sentence = stems(plain);
    if sentence.is_empty() {
        return Vec::new();
    }
    let stated = numbers(plain);
    let mut out: Vec<(String, f64)> = indexed
        .iter()
        .filter(|c| stated.is_subset(&c.numbers))
        .filter_map(|c| {
            let matched: Vec<&String> = sentence.iter().filter(|s| stem_in(s, &c.stems)).collect();
            let share = matched.len() as f64 / sentence.len() as f64;
            let novel = matched.iter().any(|s| !stem_in(s, question));
            (share >= SEMANTIC_MIN_SHARE && novel).then(|| (c.chunk.chunk.chunk_id.clone(), share))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out.truncate(SEMANTIC_CANDIDATES);
    out
}

/// The sentence of `chunk` sharing most of `sentence`'s stems (the chunk's text when none).
fn closest_sentence(chunk: &EvidenceChunk, sentence: &str) -> String {
    let wanted = stems(sentence);
    sentences(&chunk.chunk.text)
        .into_iter()
        .map(|(_, _, text)| {
            let set: BTreeSet<String> = stems(&text).into_iter().collect();
            (wanted.iter().filter(|s| stem_in(s, &set)).count(), text)
        })
        .filter(|(count, _)| *count > 0)
        .max_by_key(|(count, _)| *count)
        .map(|(_, text)| text)
        .unwrap_or_else(|| chunk.chunk.text.clone())
}

/// Cosine similarity of two vectors (0 for empty or zero vectors).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let denominator = norm(a) * norm(b);
    if denominator == 0.0 {
        0.0
    } else {
        dot / denominator
    }
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Judges one sentence (markers removed): the verdict, the supporting chunks with their
/// overlap, and the best overlap of one chunk.
fn judge(
    plain: &str,
    question: &BTreeSet<String>,
    question_text: &str,
    indexed: &[Indexed<'_>],
    hinted: &BTreeSet<&str>,
) -> (Verdict, Vec<(String, f64)>, f64) {
    if is_refusal(plain) {
        return (Verdict::Refusal, Vec::new(), 0.0);
    }
    let sentence = stems(plain);
    if sentence.is_empty() {
        if is_yes_no(plain) && is_yes_no_question(question_text) {
            // A bare yes/no stands on the chunk that best covers the question.
            let best = indexed
                .iter()
                .map(|c| (c, share(question.iter(), &c.stems, question.len())))
                .filter(|(_, s)| *s >= SUPPORT_SHARE)
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((chunk, s)) = best {
                return (
                    Verdict::SupportedYesNo,
                    vec![(chunk.chunk.chunk.chunk_id.clone(), s)],
                    s,
                );
            }
        }
        return (Verdict::Fragment, Vec::new(), 0.0);
    }
    let novel: Vec<&String> = sentence.iter().filter(|s| !stem_in(s, question)).collect();
    if novel.is_empty() {
        // Restating a yes/no question affirms it: that stands when a chunk holds all of it
        // (and the sentence does not negate it, which words alone cannot check).
        if is_yes_no_question(question_text) && !negates(plain) {
            let whole = indexed
                .iter()
                .filter(|c| sentence.iter().all(|s| stem_in(s, &c.stems)))
                .max_by(|a, b| a.chunk.relevance.total_cmp(&b.chunk.relevance));
            if let Some(chunk) = whole {
                return (
                    Verdict::SupportedYesNo,
                    vec![(chunk.chunk.chunk.chunk_id.clone(), 1.0)],
                    1.0,
                );
            }
        }
        return (Verdict::Echo, Vec::new(), 0.0);
    }
    let stated = numbers(plain);
    struct Scored<'b> {
        id: &'b str,
        chunk_numbers: &'b BTreeSet<String>,
        matched: Vec<&'b String>,
        novel: usize,
        share: f64,
        hinted: bool,
        relevance: f64,
    }
    let scored: Vec<Scored<'_>> = indexed
        .iter()
        .map(|c| {
            let matched: Vec<&String> = sentence.iter().filter(|s| stem_in(s, &c.stems)).collect();
            let novel = novel.iter().filter(|s| stem_in(s, &c.stems)).count();
            let id = c.chunk.chunk.chunk_id.as_str();
            Scored {
                id,
                chunk_numbers: &c.numbers,
                share: matched.len() as f64 / sentence.len() as f64,
                matched,
                novel,
                hinted: hinted.contains(id),
                relevance: c.chunk.relevance,
            }
        })
        .collect();
    let best_share = scored.iter().map(|s| s.share).fold(0.0, f64::max);
    if is_fragment(plain) && !is_yes_no(plain) {
        // A short answer stands only as an entity found whole in a chunk.
        let best = scored
            .iter()
            .filter(|s| {
                s.matched.len() == sentence.len()
                    && s.novel > 0
                    && stated.is_subset(s.chunk_numbers)
            })
            .max_by(|a, b| {
                (a.hinted, a.relevance)
                    .partial_cmp(&(b.hinted, b.relevance))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
        return match best {
            Some(best) => (
                Verdict::SupportedEntity,
                vec![(best.id.to_string(), best.share)],
                best_share,
            ),
            None => (Verdict::Fragment, Vec::new(), best_share),
        };
    }
    let min_matched = sentence.len().min(2);
    let passes = |s: &Scored<'_>| {
        let needed = if s.hinted {
            HINTED_SUPPORT_SHARE
        } else {
            SUPPORT_SHARE
        };
        s.share >= needed
            && s.novel > 0
            && s.matched.len() >= min_matched
            && stated.is_subset(s.chunk_numbers)
    };
    let mut ranked: Vec<&Scored<'_>> = scored.iter().filter(|s| s.novel > 0).collect();
    ranked.sort_by(|a, b| {
        (passes(b), b.hinted, b.share, b.relevance)
            .partial_cmp(&(passes(a), a.hinted, a.share, a.relevance))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let Some(first) = ranked.first() else {
        return (Verdict::Unsupported, Vec::new(), best_share);
    };
    // The best chunk, then chunks that add content of the sentence it lacks (two stems, or
    // one for a chunk the model cited): a sentence joining two facts cites both.
    let mut covered: BTreeSet<&String> = first.matched.iter().copied().collect();
    let mut support: Vec<&Scored<'_>> = vec![first];
    while support.len() < MAX_CITATIONS_PER_SENTENCE {
        let next = ranked
            .iter()
            .filter(|s| !support.iter().any(|chosen| chosen.id == s.id))
            .map(|s| {
                let adds = s
                    .matched
                    .iter()
                    .filter(|m| !covered.contains(*m) && novel.contains(m))
                    .count();
                (s, adds)
            })
            .filter(|(s, adds)| *adds >= 2 || (*adds >= 1 && s.hinted) || (s.hinted && passes(s)))
            .max_by(|a, b| (a.1, a.0.hinted).cmp(&(b.1, b.0.hinted)));
        let Some((next, _)) = next else { break };
        covered.extend(next.matched.iter().copied());
        support.push(next);
    }
    let union_share = covered.len() as f64 / sentence.len() as f64;
    let union_numbers: BTreeSet<String> = support
        .iter()
        .flat_map(|s| s.chunk_numbers.iter().cloned())
        .collect();
    if stated.is_subset(&union_numbers)
        && (passes(first) || (support.len() > 1 && union_share >= SUPPORT_SHARE))
    {
        return (
            Verdict::Supported,
            support
                .iter()
                .map(|s| (s.id.to_string(), s.share))
                .collect(),
            best_share,
        );
    }
    (Verdict::Unsupported, Vec::new(), best_share)
}

/// The service tool whose output holds the sentence (the same share as a chunk needs).
fn supporting_tool<'t>(
    plain: &str,
    question: &BTreeSet<String>,
    tools: &'t [(&'t str, BTreeSet<String>)],
) -> Option<&'t str> {
    let sentence = stems(plain);
    if sentence.is_empty() {
        return None;
    }
    tools
        .iter()
        .map(|(name, set)| {
            let matched: Vec<&String> = sentence.iter().filter(|s| stem_in(s, set)).collect();
            let novel = matched.iter().any(|s| !stem_in(s, question));
            (name, matched.len() as f64 / sentence.len() as f64, novel)
        })
        .filter(|(_, share, novel)| *share >= SUPPORT_SHARE && *novel)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _, _)| *name)
}

fn share<'s>(stems: impl Iterator<Item = &'s String>, set: &BTreeSet<String>, len: usize) -> f64 {
    if len == 0 {
        return 0.0;
    }
    stems.filter(|s| stem_in(s, set)).count() as f64 / len as f64
}

/// The document span of the chunk sentence sharing most of `sentence`'s stems.
fn best_span(chunk: &EvidenceChunk, sentence: &str) -> (u32, u32) {
    let wanted = stems(sentence);
    sentences(&chunk.chunk.text)
        .into_iter()
        .map(|(start, end, text)| {
            let set: BTreeSet<String> = stems(&text).into_iter().collect();
            (
                wanted.iter().filter(|s| stem_in(s, &set)).count(),
                start,
                end,
            )
        })
        .filter(|(count, _, _)| *count > 0)
        .max_by_key(|(count, start, _)| (*count, std::cmp::Reverse(*start)))
        .map(|(_, start, end)| sentence_span(&chunk.chunk.text, chunk.chunk.span, start, end))
        .unwrap_or(chunk.chunk.span)
}

/// `text` with `insert` placed before its closing punctuation (`… Celsius[1].`), with a space
/// before it in Latin text.
fn insert_before_end(text: &str, insert: &str) -> String {
    let trimmed = text.trim_end();
    let cut = trimmed
        .char_indices()
        .rev()
        .take_while(|(_, c)| {
            matches!(
                c,
                '.' | '!' | '?' | '。' | '！' | '？' | '"' | '”' | ':' | ';'
            )
        })
        .last()
        .map_or(trimmed.len(), |(at, _)| at);
    let (body, end) = trimmed.split_at(cut);
    let space = if body.chars().last().is_some_and(|c| is_cjk(c) || c == ']') {
        ""
    } else {
        " "
    };
    format!("{body}{space}{insert}{end}")
}

#[cfg(test)]
mod tests;
