//! The final answer streamed while the model writes it, without giving up attribution.
//!
//! ```text
//! ToolArgumentsDelta pieces of the turn's first final_answer call
//!   → AnswerTap: the `answer` string decoded as it grows
//!   → on each complete sentence (run.rs `stream_answer`): the complete sentences attributed
//!     with nothing cited and no comparison by meaning; the leading run of supported ones
//!     is settled, and what its rendering adds goes out (`citation`, then `delta` events)
//! the run's end: the whole answer attributed with the settled sentences pinned (judged as
//!   when they went out, see `AttributionInput::pinned`), so what went out is the start of
//!   the final answer, and `finish` sends only the rest
//! ```
//!
//! A sentence is complete once the next one has begun (or the string has closed). It is
//! settled only when it and every sentence before it are supported, so an unsupported
//! sentence holds back the rest until the run's end, where the usual attribution (with the
//! citation list and the comparison by meaning) decides. Under `grounding = off` the
//! sentences before the first citation marker are settled (markers need the citation list).

use sift_models::llm::tool_modes::{decode_json_string_prefix, find_string_value_start};

use super::tools::FINAL_ANSWER;

/// The `answer` field of the first `final_answer` call of a turn, decoded as its arguments
/// arrive.
#[derive(Debug, Default)]
pub(super) struct AnswerTap {
    /// The call read (the first `final_answer` whose pieces came).
    index: Option<u64>,
    arguments: String,
    /// Where the answer's string starts in `arguments`, once written.
    start: Option<usize>,
    /// How far the string is decoded.
    decoded_to: usize,
    /// The answer so far.
    pub answer: String,
    /// The answer's closing quote was reached.
    pub closed: bool,
}

impl AnswerTap {
    /// Feeds one piece of a call's arguments; whether the answer grew (or closed).
    pub fn push(&mut self, index: u64, name: &str, fragment: &str) -> bool {
        if name != FINAL_ANSWER || self.closed || *self.index.get_or_insert(index) != index {
            return false;
        }
        self.arguments.push_str(fragment);
        if self.start.is_none() {
            self.start = find_string_value_start(&self.arguments, "answer");
            let Some(start) = self.start else {
                return false;
            };
            self.decoded_to = start;
        }
        let (decoded, consumed, closed) =
            decode_json_string_prefix(&self.arguments[self.decoded_to..]);
        self.decoded_to += consumed;
        self.closed = closed;
        self.answer.push_str(&decoded);
        !decoded.is_empty() || closed
    }
}

/// What of the answer went out while the model wrote it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Streamed {
    /// The settled sentences as the model wrote them (scrubbed): the start of the answer
    /// that the final attribution pins.
    pub source: String,
    /// Their rendering (citation markers in place), as the `delta` events carried it.
    pub text: String,
    /// The citations sent: `[1]` to `[citations]`.
    pub citations: u32,
}

impl Streamed {
    /// Whether anything went out.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// The byte offset in `text` where the complete sentences end: all of `sentences` when the
/// answer has closed, else all but the last (it may still grow); 0 when none is complete.
pub(super) fn complete_end(sentences: &[(usize, usize)], closed: bool) -> usize {
    let complete = if closed {
        sentences.len()
    } else {
        sentences.len().saturating_sub(1)
    };
    complete
        .checked_sub(1)
        .and_then(|last| sentences.get(last))
        .map_or(0, |&(_, end)| end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `arguments` in pieces of `size` characters; the answer after each piece.
    fn tap_in_pieces(arguments: &str, size: usize) -> (AnswerTap, Vec<String>) {
        let mut tap = AnswerTap::default();
        let characters: Vec<char> = arguments.chars().collect();
        let mut seen = Vec::new();
        for piece in characters.chunks(size) {
            if tap.push(0, FINAL_ANSWER, &piece.iter().collect::<String>()) {
                seen.push(tap.answer.clone());
            }
        }
        (tap, seen)
    }

    #[test]
    fn the_answer_is_read_as_it_grows_in_any_chunking() {
        let answer = "Raft elects a leader.\nIt uses \"terms\" \\ é \u{1F600}.";
        let arguments = format!(
            r#"{{"answer": {}, "citations": ["a#1"]}}"#,
            serde_json::to_string(answer)
                .unwrap()
                .replace('\u{1F600}', "\\ud83d\\ude00")
        );
        for size in 1..=arguments.chars().count() {
            let (tap, seen) = tap_in_pieces(&arguments, size);
            assert_eq!(tap.answer, answer, "piece size {size}");
            assert!(tap.closed);
            // Each step is a prefix of the next: nothing read is taken back.
            for pair in seen.windows(2) {
                assert!(pair[1].starts_with(&pair[0]), "piece size {size}");
            }
        }
    }

    #[test]
    fn other_tools_and_other_calls_are_not_read() {
        let mut tap = AnswerTap::default();
        assert!(!tap.push(0, "knowledge_search", r#"{"answer": "no"}"#));
        assert!(tap.push(1, FINAL_ANSWER, r#"{"answer": "Yes"#));
        // A second final_answer call in the same turn is not mixed in.
        assert!(!tap.push(2, FINAL_ANSWER, r#"{"answer": "Other"#));
        assert!(tap.push(1, FINAL_ANSWER, r#" it is.""#));
        assert_eq!(tap.answer, "Yes it is.");
        assert!(tap.closed);
        // Nothing after the closing quote counts.
        assert!(!tap.push(1, FINAL_ANSWER, r#", "citations": []}"#));
        // No answer field yet: nothing read.
        let mut empty = AnswerTap::default();
        assert!(!empty.push(0, FINAL_ANSWER, r#"{"citations": ["a"], "#));
        assert_eq!(empty.answer, "");
    }

    #[test]
    fn only_sentences_followed_by_another_are_complete_until_the_answer_closes() {
        let sentences = [(0, 10), (11, 20), (21, 25)];
        assert_eq!(complete_end(&sentences, false), 20);
        assert_eq!(complete_end(&sentences, true), 25);
        assert_eq!(complete_end(&sentences[..1], false), 0);
        assert_eq!(complete_end(&[], true), 0);
    }
}
