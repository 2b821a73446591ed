//! Extractive answers: with no model configured (or none reachable), the best evidence
//! sentences, each cited, and labelled as extractive in the text.
//!
//! Sentences of the most relevant searched chunks are scored by query-term coverage and the
//! chunk's relevance; the best few (at most `max_sentences`, each at least 20 characters) are
//! quoted in score order. A citation's span is the sentence's own span in the document when
//! the sentence lies in the chunk's own text (chunk text may begin with a heading prefix or
//! overlap from the previous chunk), else the chunk's span.

use super::Citation;
use super::evidence::{Evidence, EvidenceChunk};
use super::terms::{coverage, sentences, terms};

/// Why the answer is extractive, as the label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtractiveReason {
    NoModel,
    ModelFailed,
    /// The run's budget (tokens or deadline) ran out before the model answered.
    Budget,
    /// The model answered, but no sentence of its answer matched the retrieved evidence.
    Ungrounded,
}

impl ExtractiveReason {
    fn label(self) -> &'static str {
        match self {
            ExtractiveReason::NoModel => {
                "Extractive answer (no language model is configured): the passages of the knowledge bases that best match the question."
            }
            ExtractiveReason::ModelFailed => {
                "Extractive answer (the language model was unavailable): the passages of the knowledge bases that best match the question."
            }
            ExtractiveReason::Ungrounded => {
                "Extractive answer (no sentence of the model's answer could be matched to the retrieved evidence): the passages of the knowledge bases that best match the question."
            }
            ExtractiveReason::Budget => {
                "Extractive answer (the run's budget ran out before the model answered): the passages of the knowledge bases that best match the question."
            }
        }
    }
}

pub const NO_EVIDENCE: &str =
    "No relevant evidence was found in the selected knowledge bases for this question.";

struct Scored<'a> {
    chunk: &'a EvidenceChunk,
    start: usize,
    end: usize,
    sentence: String,
    score: f64,
}

/// The extractive answer text and its citations.
pub fn extractive_answer(
    question: &str,
    evidence: &Evidence,
    max_sentences: usize,
    reason: ExtractiveReason,
) -> (String, Vec<Citation>) {
    let query_terms = terms(question);
    let mut scored: Vec<Scored<'_>> = Vec::new();
    for chunk in evidence.best(6) {
        let text_chars = chunk.chunk.text.chars().count();
        for (start, end, sentence) in sentences(&chunk.chunk.text) {
            let length = end - start;
            if !(20..=600).contains(&length) || !stands_alone(&sentence) {
                continue;
            }
            if end >= text_chars && !ends_a_sentence(&sentence) {
                continue; // cut at the chunk's end
            }
            let covered = coverage(&query_terms, &sentence);
            if covered == 0.0 && !query_terms.is_empty() {
                continue;
            }
            scored.push(Scored {
                chunk,
                start,
                end,
                score: 0.6 * covered + 0.4 * chunk.relevance,
                sentence,
            });
        }
    }
    scored.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut chosen: Vec<Scored<'_>> = Vec::new();
    for candidate in scored {
        if chosen.len() >= max_sentences {
            break;
        }
        if chosen.iter().any(|c| c.sentence == candidate.sentence) {
            continue;
        }
        chosen.push(candidate);
    }
    if chosen.is_empty() {
        return (format!("{}\n\n{NO_EVIDENCE}", reason.label()), Vec::new());
    }
    let mut text = String::from(reason.label());
    text.push('\n');
    let mut citations = Vec::new();
    for (index, pick) in chosen.iter().enumerate() {
        let n = index as u32 + 1;
        let quoted = pick
            .sentence
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        text.push_str(&format!("\n- {quoted} [{n}]"));
        let chunk = &pick.chunk.chunk;
        citations.push(Citation {
            n,
            chunk_id: chunk.chunk_id.clone(),
            kb_id: pick.chunk.kb_id.clone(),
            document_id: chunk.document_id.clone(),
            document_title: chunk.title.clone(),
            external_id: chunk.external_id.clone(),
            source_url: sift_storage::chunk::source_url(&chunk.metadata).map(str::to_string),
            span: sentence_span(&chunk.text, chunk.span, pick.start, pick.end),
            pages: chunk.pages,
            text: pick.sentence.clone(),
            heading_path: chunk.heading_path.clone(),
        });
    }
    (text, citations)
}

/// Whether a sentence can be quoted on its own: not the chunk's `[Context: …]` heading line,
/// and not the tail of a sentence cut at the chunk's start (Latin text starting in lower case).
fn stands_alone(sentence: &str) -> bool {
    let trimmed = sentence.trim_start();
    !trimmed.starts_with("[Context:")
        && !trimmed
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
}

fn ends_a_sentence(sentence: &str) -> bool {
    sentence
        .trim_end()
        .chars()
        .last()
        .is_some_and(|c| matches!(c, '.' | '!' | '?' | '。' | '！' | '？' | '"' | ')' | '”'))
}

/// The document span of the sentence at chars `[start, end)` of a chunk's text whose own
/// text (its tail) is the document's `span`.
pub(crate) fn sentence_span(text: &str, span: (u32, u32), start: usize, end: usize) -> (u32, u32) {
    let text_chars = text.chars().count();
    let own = span.1.saturating_sub(span.0) as usize;
    if own == 0 || own > text_chars {
        return span;
    }
    let own_start = text_chars - own;
    if start < own_start {
        return span;
    }
    (
        span.0 + (start - own_start) as u32,
        span.0 + (end - own_start) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heading_lines_and_cut_sentences_are_not_quoted() {
        assert!(!stands_alone("[Context: Raft Consensus > Leader Election]"));
        assert!(!stands_alone(
            "votes from a majority of the cluster becomes the leader"
        ));
        assert!(stands_alone(
            "A follower that hears nothing becomes a candidate."
        ));
        assert!(stands_alone("绿茶是不发酵茶。"));
        assert!(ends_a_sentence("绿茶是不发酵茶。") && ends_a_sentence("It ends here. "));
        assert!(!ends_a_sentence("holds every committed entry, so a"));
    }
    use crate::agent::evidence::tests::chunk;

    #[test]
    fn picks_covering_sentences_and_cites_each() {
        let mut evidence = Evidence::default();
        evidence.insert(chunk(
            "d1",
            0,
            "Water is common. The boiling point of water at sea level is 100 degrees Celsius. Ice floats on water.",
        ));
        evidence.insert(chunk(
            "d2",
            1,
            "Mountains are tall and nothing here is related to it.",
        ));
        let (text, citations) = extractive_answer(
            "What is the boiling point of water?",
            &evidence,
            2,
            ExtractiveReason::NoModel,
        );
        assert!(text.starts_with("Extractive answer"), "{text}");
        assert!(
            text.contains("The boiling point of water at sea level is 100 degrees Celsius. [1]"),
            "{text}"
        );
        assert_eq!(citations.len(), 2);
        assert_eq!(citations[0].chunk_id, "d1#0");
        assert_eq!(
            citations[0].text,
            "The boiling point of water at sea level is 100 degrees Celsius."
        );
        // d1#0's text is all its own: span is the sentence's, offset by the chunk's start.
        assert_eq!(citations[0].span, (17, 17 + 63));
        assert!(!text.contains("Mountains"));
    }

    #[test]
    fn no_evidence_says_so() {
        let (text, citations) = extractive_answer(
            "anything",
            &Evidence::default(),
            3,
            ExtractiveReason::ModelFailed,
        );
        assert!(text.contains("unavailable") && text.contains(NO_EVIDENCE));
        assert!(citations.is_empty());
    }

    #[test]
    fn sentence_in_prefix_falls_back_to_chunk_span() {
        // Text = 10 chars of prefix + 20 own chars at document offset 500.
        let text = "Heading: \n01234567890123456789";
        assert_eq!(sentence_span(text, (500, 520), 0, 8), (500, 520));
        assert_eq!(sentence_span(text, (500, 520), 12, 15), (502, 505));
    }
}
