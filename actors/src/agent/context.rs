//! Context management of a run (the Artoo seed's three layers):
//!
//! 1. Counting: tiktoken (cl100k) counts of the messages, anchored on the prompt tokens the
//!    provider reported for the previous call when there is one (provider counts are exact
//!    for its own tokenizer; only the messages added since are estimated).
//! 2. Past 50% of the model's window: older session turns are summarised (by the model with a
//!    timeout, else by rules), keeping numbers, names and decisions verbatim; the two most
//!    recent turns stay as they were.
//! 3. Past 80%: whole tool-call groups (an assistant message with tool calls and all its tool
//!    results) are dropped oldest first, never the latest one, so no tool result is ever left
//!    without its call. A note lists the chunk ids the dropped groups had shown: they stay
//!    citable, since tools returned them in this run.
//! 4. When the provider still refuses the prompt as too long (a context-length error), the run
//!    takes the window as smaller ([`stated_window`] reads the provider's number), applies 2
//!    and 3 against it, then cuts the longest tool results ([`cut_tool_results`]) and retries
//!    the call once.
//!
//! Follow-up questions ("and what about its price?") are rewritten with the history into a
//! self-contained question before retrieval.

use std::time::Duration;

use super::model_io::complete_text;
use super::terms::{sentences, terms};
use super::{PastTurn, RunCancel};
use sift_models::llm::{ChatMessage, ChatModel, ToolSpec, Usage};

/// Turns kept verbatim when older ones are summarised.
pub const KEEP_RECENT_TURNS: usize = 2;
pub const SUMMARISE_AT: f64 = 0.5;
pub const DROP_GROUPS_AT: f64 = 0.8;

/// Tokens of `text` (cl100k_base).
pub fn count_tokens(text: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton()
        .encode_with_special_tokens(text)
        .len()
}

/// Tokens of one message, with the per-message overhead of the chat format.
pub fn message_tokens(message: &ChatMessage) -> usize {
    4 + match message {
        ChatMessage::System { content } | ChatMessage::User { content } => count_tokens(content),
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            count_tokens(content)
                + tool_calls
                    .iter()
                    .map(|call| 3 + count_tokens(&call.name) + count_tokens(&call.arguments))
                    .sum::<usize>()
        }
        ChatMessage::Tool { name, content, .. } => count_tokens(name) + count_tokens(content),
    }
}

pub fn tools_tokens(tools: &[ToolSpec]) -> usize {
    tools
        .iter()
        .map(|tool| {
            count_tokens(&tool.name)
                + count_tokens(&tool.description)
                + count_tokens(&tool.parameters.to_string())
        })
        .sum()
}

/// Estimates prompt tokens: the provider's last reported count plus estimates of the messages
/// added after that call. Our BPE counts are scaled by the ratio between the provider's last
/// count and ours for the same prompt (other tokenizers, hidden prompt overhead), so that
/// estimates stay comparable after messages are rewritten or dropped.
#[derive(Clone, Debug)]
pub struct TokenCounter {
    /// (prompt + completion tokens reported, messages the prompt then had + the answer).
    anchor: Option<(usize, usize)>,
    ratio: f64,
}

impl Default for TokenCounter {
    fn default() -> Self {
        TokenCounter {
            anchor: None,
            ratio: 1.0,
        }
    }
}

impl TokenCounter {
    /// Records the usage reported for a call whose prompt was `messages` (its answer becomes
    /// one more message).
    pub fn record(&mut self, usage: Usage, messages: &[ChatMessage], tools: &[ToolSpec]) {
        if usage.prompt_tokens == 0 {
            return;
        }
        let ours = raw_count(messages, tools);
        if ours > 0 {
            self.ratio = (usage.prompt_tokens as f64 / ours as f64).clamp(0.25, 8.0);
        }
        self.anchor = Some((
            usage.prompt_tokens as usize + usage.completion_tokens as usize,
            messages.len() + 1,
        ));
    }

    /// Forget the anchor (the messages were rewritten); the ratio stays.
    pub fn reset(&mut self) {
        self.anchor = None;
    }

    /// Our count of `messages` and `tools`, scaled to the provider's tokens.
    pub fn scaled(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> usize {
        (raw_count(messages, tools) as f64 * self.ratio) as usize
    }

    pub fn estimate(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> usize {
        match self.anchor {
            Some((tokens, count)) if count <= messages.len() => {
                let added = messages[count..].iter().map(message_tokens).sum::<usize>();
                tokens + (added as f64 * self.ratio) as usize
            }
            _ => self.scaled(messages, tools),
        }
    }
}

fn raw_count(messages: &[ChatMessage], tools: &[ToolSpec]) -> usize {
    messages.iter().map(message_tokens).sum::<usize>() + tools_tokens(tools)
}

/// The history as the model sees it: past turns as user/assistant pairs. Their citations are
/// not citable in this run (the chunks must be retrieved again), so the answers carry no ids.
pub fn history_messages(turns: &[PastTurn]) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(turns.len() * 2);
    for turn in turns {
        out.push(ChatMessage::User {
            content: turn.question.clone(),
        });
        let mut answer = turn.answer.clone();
        if !turn.citations.is_empty() {
            let sources: Vec<String> = turn
                .citations
                .iter()
                .map(|c| format!("[{}] {}", c.n, c.document_title))
                .collect();
            answer.push_str(&format!(
                "\n(Sources of that answer: {}. Retrieve them again to cite them now.)",
                sources.join("; ")
            ));
        }
        out.push(ChatMessage::Assistant {
            content: answer,
            tool_calls: Vec::new(),
        });
    }
    out
}

/// A rule-based summary of `turns`: each question, and the sentences of each answer that
/// carry numbers or names (kept verbatim), else its first sentence.
pub fn summarise_rules(turns: &[PastTurn]) -> String {
    let mut out = String::new();
    for turn in turns {
        out.push_str("- Q: ");
        out.push_str(turn.question.trim());
        out.push_str("\n  A: ");
        let answer_sentences = sentences(&turn.answer);
        let mut kept: Vec<&str> = answer_sentences
            .iter()
            .map(|(_, _, s)| s.as_str())
            .filter(|s| has_facts(s))
            .take(4)
            .collect();
        if kept.is_empty()
            && let Some((_, _, first)) = answer_sentences.first()
        {
            kept.push(first);
        }
        out.push_str(&kept.join(" "));
        out.push('\n');
    }
    out
}

/// A sentence with a digit or a capitalised word past its first word.
fn has_facts(sentence: &str) -> bool {
    sentence.chars().any(|c| c.is_ascii_digit())
        || sentence
            .split_whitespace()
            .skip(1)
            .any(|word| word.chars().next().is_some_and(char::is_uppercase))
        || sentence
            .chars()
            .any(|c| matches!(c as u32, 0x4E00..=0x9FFF))
}

const SUMMARY_PROMPT: &str = "Summarise the earlier conversation below for your own later use. \
Keep every number, name, identifier, date, decision and conclusion verbatim; list them, do not \
paraphrase them. Drop pleasantries. At most 200 words.";

/// Summarises `turns` with the model (within `timeout`), else by rules. Returns the summary,
/// whether the model made it, and the usage.
pub async fn summarise(
    turns: &[PastTurn],
    model: Option<&dyn ChatModel>,
    timeout: Duration,
    cancel: &RunCancel,
) -> (String, bool, Option<Usage>) {
    let rules = summarise_rules(turns);
    let Some(model) = model else {
        return (rules, false, None);
    };
    let messages = vec![
        ChatMessage::System {
            content: SUMMARY_PROMPT.into(),
        },
        ChatMessage::User {
            content: rules.clone() + "\n\nFull turns:\n" + &full_turns(turns),
        },
    ];
    match complete_text(model, messages, Some(500), timeout, cancel).await {
        // The model's summary must keep the numbers the rules found; else keep the rules'.
        Ok((text, usage)) if !text.trim().is_empty() && keeps_numbers(&rules, &text) => {
            (text.trim().to_string(), true, Some(usage))
        }
        Ok((_, usage)) => (rules, false, Some(usage)),
        Err(_) => (rules, false, None),
    }
}

fn full_turns(turns: &[PastTurn]) -> String {
    turns
        .iter()
        .map(|t| format!("User: {}\nAssistant: {}\n", t.question, t.answer))
        .collect()
}

fn numbers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() || (c == '.' && !current.is_empty()) {
            current.push(c);
        } else if !current.is_empty() {
            out.push(current.trim_end_matches('.').to_string());
            current.clear();
        }
    }
    if !current.is_empty() {
        out.push(current.trim_end_matches('.').to_string());
    }
    out
}

fn keeps_numbers(reference: &str, summary: &str) -> bool {
    numbers(reference)
        .iter()
        .all(|number| summary.contains(number.as_str()))
}

/// Drops whole tool-call groups from `messages[protect_before..]`, oldest first, never the
/// last group, until `estimate(messages) <= target`. Returns the chunk ids mentioned by the
/// dropped tool results (for the note) and how many groups were dropped.
pub fn drop_tool_groups(
    messages: &mut Vec<ChatMessage>,
    protect_before: usize,
    target: usize,
    estimate: impl Fn(&[ChatMessage]) -> usize,
    chunk_ids_in: impl Fn(&str) -> Vec<String>,
) -> (usize, Vec<String>) {
    let mut dropped = 0;
    let mut ids = Vec::new();
    loop {
        if estimate(messages) <= target {
            break;
        }
        let groups = tool_groups(messages, protect_before);
        if groups.len() <= 1 {
            break;
        }
        let (start, end) = groups[0];
        for message in &messages[start..end] {
            if let ChatMessage::Tool { content, .. } = message {
                for id in chunk_ids_in(content) {
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
            }
        }
        messages.drain(start..end);
        dropped += 1;
    }
    (dropped, ids)
}

/// The window a provider's overflow message states, in its tokens: OpenAI-compatible "maximum
/// context length is 4096 tokens", llama.cpp's `n_ctx 4096` (see the model clients' error
/// labels), Anthropic's "… tokens > 200000 maximum".
pub fn stated_window(message: &str) -> Option<usize> {
    let message = message.to_lowercase();
    let number_after = |marker: &str| -> Option<usize> {
        let at = message.find(marker)? + marker.len();
        let digits: String = message[at..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ',')
            .filter(char::is_ascii_digit)
            .collect();
        digits.parse().ok().filter(|&n| n > 0)
    };
    if let Some(window) = number_after("maximum context length is") {
        return Some(window);
    }
    if let Some(window) = number_after("n_ctx") {
        return Some(window);
    }
    let at = message.find(" maximum")?;
    let before = message[..at].trim_end();
    let start = before
        .rfind(|c: char| !(c.is_ascii_digit() || c == ','))
        .map_or(0, |i| i + 1);
    before[start..]
        .replace(',', "")
        .parse()
        .ok()
        .filter(|&n| n > 0)
}

/// What a cut tool result ends with.
pub const CUT_NOTE: &str = "\n[... cut to fit the context window]";

/// Halves the longest tool result in `messages[from..]` (keeping its beginning: the best hits
/// come first) until `estimate(messages) <= target` or every result is short. Returns how
/// many cuts were made. The last resort after an overflow, when no tool-call group is left
/// to drop.
pub fn cut_tool_results(
    messages: &mut [ChatMessage],
    from: usize,
    target: usize,
    estimate: impl Fn(&[ChatMessage]) -> usize,
) -> usize {
    const SHORTEST: usize = 400;
    let mut cuts = 0;
    while estimate(messages) > target {
        let longest = messages
            .iter()
            .enumerate()
            .skip(from)
            .filter_map(|(index, message)| match message {
                ChatMessage::Tool { content, .. } => Some((index, content.len())),
                _ => None,
            })
            .max_by_key(|&(_, len)| len);
        let Some((index, len)) = longest.filter(|&(_, len)| len > SHORTEST) else {
            break;
        };
        if let ChatMessage::Tool { content, .. } = &mut messages[index] {
            let kept = content.strip_suffix(CUT_NOTE).unwrap_or(content.as_str());
            let mut end = (len / 2).min(kept.len());
            while !kept.is_char_boundary(end) {
                end -= 1;
            }
            *content = format!("{}{CUT_NOTE}", &kept[..end]);
        }
        cuts += 1;
    }
    cuts
}

/// `[start, end)` of each tool-call group at or after `from`: an assistant message with tool
/// calls followed by its tool results (and any user notes right after them).
pub fn tool_groups(messages: &[ChatMessage], from: usize) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut index = from;
    while index < messages.len() {
        if let ChatMessage::Assistant { tool_calls, .. } = &messages[index]
            && !tool_calls.is_empty()
        {
            let start = index;
            index += 1;
            while index < messages.len() && matches!(messages[index], ChatMessage::Tool { .. }) {
                index += 1;
            }
            groups.push((start, index));
        } else {
            index += 1;
        }
    }
    groups
}

/// Words that make a question lean on the conversation before it.
const REFERRING: &[&str] = &[
    "it",
    "its",
    "they",
    "them",
    "their",
    "this",
    "that",
    "these",
    "those",
    "he",
    "she",
    "his",
    "her",
    "there",
    "the same",
    "also",
    "what about",
    "and",
    "how about",
    "它",
    "这",
    "那",
    "他",
    "她",
    "其",
];

/// Whether `question` reads as a follow-up that needs the history to be understood.
pub fn looks_like_follow_up(question: &str) -> bool {
    let lowered = format!(" {} ", question.to_lowercase());
    let words = question.split_whitespace().count();
    let referring = REFERRING.iter().any(|word| {
        if word.is_ascii() {
            lowered.contains(&format!(" {word} "))
                || lowered.contains(&format!(" {word}?"))
                || lowered.contains(&format!(" {word},"))
        } else {
            lowered.contains(word)
        }
    });
    referring || (words <= 3 && terms(question).len() <= 2)
}

/// The rule-based rewrite: the question followed by the topic words of the previous one.
pub fn rewrite_follow_up_rules(question: &str, history: &[PastTurn]) -> Option<String> {
    let last = history.last()?;
    if !looks_like_follow_up(question) {
        return None;
    }
    let own = terms(question);
    let context: Vec<String> = terms(&last.question)
        .into_iter()
        .filter(|t| !own.contains(t))
        .take(8)
        .collect();
    if context.is_empty() {
        return None;
    }
    Some(format!("{} ({})", question.trim(), context.join(" ")))
}

const REWRITE_PROMPT: &str = "Rewrite the user's last question into one self-contained \
question using the conversation: resolve pronouns and references, keep every name and number. \
Answer with the rewritten question only.";

/// Rewrites a follow-up question with the history: by the model within `timeout`, else by
/// rules. `None` when the question stands on its own.
pub async fn rewrite_follow_up(
    question: &str,
    history: &[PastTurn],
    summary: Option<&str>,
    model: Option<&dyn ChatModel>,
    timeout: Duration,
    cancel: &RunCancel,
) -> (Option<String>, Option<Usage>) {
    if history.is_empty() || !looks_like_follow_up(question) {
        return (None, None);
    }
    let rules = rewrite_follow_up_rules(question, history);
    let Some(model) = model else {
        return (rules, None);
    };
    let mut conversation = String::new();
    if let Some(summary) = summary {
        conversation.push_str(&format!("Earlier (summary): {summary}\n"));
    }
    for turn in history.iter().rev().take(3).rev() {
        conversation.push_str(&format!(
            "User: {}\nAssistant: {}\n",
            turn.question,
            super::terms::truncate_chars(&turn.answer, 600)
        ));
    }
    let messages = vec![
        ChatMessage::System {
            content: REWRITE_PROMPT.into(),
        },
        ChatMessage::User {
            content: format!("{conversation}\nLast question: {question}"),
        },
    ];
    match complete_text(model, messages, Some(120), timeout, cancel).await {
        Ok((text, usage)) => {
            let text = text.trim().trim_matches('"').trim();
            if text.is_empty() || text.chars().count() > 1000 {
                (rules, Some(usage))
            } else {
                (Some(text.to_string()), Some(usage))
            }
        }
        Err(_) => (rules, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sift_models::llm::ToolCall;

    fn turn(question: &str, answer: &str) -> PastTurn {
        PastTurn {
            question: question.into(),
            answer: answer.into(),
            citations: Vec::new(),
        }
    }

    #[test]
    fn rule_summary_keeps_numbers_and_names_verbatim() {
        let turns = vec![
            turn(
                "How big is the cluster?",
                "It is a nice setup. The cluster has 12 nodes in Frankfurt. We decided to use Raft.",
            ),
            turn("Thanks", "You are welcome."),
        ];
        let summary = summarise_rules(&turns);
        assert!(
            summary.contains("The cluster has 12 nodes in Frankfurt."),
            "{summary}"
        );
        assert!(summary.contains("We decided to use Raft."), "{summary}");
        assert!(!summary.contains("nice setup"), "{summary}");
        assert!(summary.contains("You are welcome."), "{summary}");
        assert!(keeps_numbers(&summary, "12 nodes"));
        assert!(!keeps_numbers(&summary, "a dozen nodes"));
    }

    fn group(id: &str, chunk: &str) -> Vec<ChatMessage> {
        vec![
            ChatMessage::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: id.into(),
                    name: "knowledge_search".into(),
                    arguments: "{}".into(),
                }],
            },
            ChatMessage::Tool {
                call_id: id.into(),
                name: "knowledge_search".into(),
                content: format!("chunk_id: {chunk} {}", "word ".repeat(200)),
            },
        ]
    }

    #[test]
    fn dropping_removes_whole_groups_oldest_first_and_keeps_the_last() {
        let mut messages = vec![
            ChatMessage::System {
                content: "system".into(),
            },
            ChatMessage::User {
                content: "question".into(),
            },
        ];
        for (id, chunk) in [("a", "d#1"), ("b", "d#2"), ("c", "d#3")] {
            messages.extend(group(id, chunk));
        }
        let counter = TokenCounter::default();
        let full = counter.estimate(&messages, &[]);
        let target = full - 150; // needs one group gone
        let (dropped, ids) = drop_tool_groups(
            &mut messages,
            2,
            target,
            |m| counter.estimate(m, &[]),
            |text| {
                text.split_whitespace()
                    .filter(|w| w.contains('#'))
                    .map(String::from)
                    .collect()
            },
        );
        assert_eq!(dropped, 1);
        assert_eq!(ids, vec!["d#1"]);
        assert_eq!(messages.len(), 6);
        // No orphans: every tool result follows its call.
        assert_eq!(tool_groups(&messages, 2), vec![(2, 4), (4, 6)]);
        // Even an impossible target keeps the latest group.
        let (dropped, _) = drop_tool_groups(
            &mut messages,
            2,
            0,
            |m| counter.estimate(m, &[]),
            |_| Vec::new(),
        );
        assert_eq!(dropped, 1);
        assert_eq!(tool_groups(&messages, 2).len(), 1);
        assert!(matches!(&messages[3], ChatMessage::Tool { call_id, .. } if call_id == "c"));
    }

    #[test]
    fn counter_anchors_on_reported_usage() {
        let messages = vec![
            ChatMessage::User {
                content: "hello there".into(),
            },
            ChatMessage::Assistant {
                content: "hi".into(),
                tool_calls: Vec::new(),
            },
            ChatMessage::User {
                content: "next".into(),
            },
        ];
        let mut counter = TokenCounter::default();
        let estimated = counter.estimate(&messages, &[]);
        assert!(estimated > 0);
        let first = message_tokens(&messages[0]);
        // The provider counts twice what we count for the first message.
        counter.record(
            Usage {
                prompt_tokens: 2 * first as u32,
                completion_tokens: 10,
            },
            &messages[..1],
            &[],
        );
        assert_eq!(
            counter.estimate(&messages, &[]),
            2 * first + 10 + 2 * message_tokens(&messages[2])
        );
        // Rewritten messages: scaled from scratch.
        counter.reset();
        let all: usize = messages.iter().map(message_tokens).sum();
        assert_eq!(counter.estimate(&messages, &[]), 2 * all);
    }

    #[test]
    fn overflow_messages_state_the_window() {
        assert_eq!(
            stated_window(
                "fake: HTTP 400: This model's maximum context length is 4,096 tokens. However, \
                 your messages resulted in 5000 tokens. (context_length_exceeded)"
            ),
            Some(4096)
        );
        assert_eq!(
            stated_window(
                "local: HTTP 400: the request exceeds the available context size, try \
                 increasing it (exceed_context_size_error, n_ctx 4096, n_prompt_tokens 5321)"
            ),
            Some(4096)
        );
        assert_eq!(
            stated_window(
                "invalid_request_error: prompt is too long: 210000 tokens > 200000 maximum"
            ),
            Some(200000)
        );
        assert_eq!(stated_window("too many tokens"), None);
    }

    #[test]
    fn cutting_tool_results_keeps_their_beginning_until_the_prompt_fits() {
        let long = "alpha beta gamma delta. ".repeat(200);
        let mut messages = vec![
            ChatMessage::User {
                content: "question".into(),
            },
            ChatMessage::Tool {
                call_id: "c1".into(),
                name: "knowledge_search".into(),
                content: long.clone(),
            },
        ];
        let estimate = |m: &[ChatMessage]| m.iter().map(message_tokens).sum::<usize>();
        let before = estimate(&messages);
        let cuts = cut_tool_results(&mut messages, 1, before / 3, estimate);
        assert!(cuts >= 2, "{cuts} cuts");
        assert!(estimate(&messages) <= before / 3);
        let ChatMessage::Tool { content, .. } = &messages[1] else {
            unreachable!()
        };
        assert!(content.ends_with(CUT_NOTE));
        assert!(long.starts_with(content.strip_suffix(CUT_NOTE).unwrap()));
        // An unreachable target: stops once every result is short instead of looping.
        cut_tool_results(&mut messages, 1, 0, estimate);
        let ChatMessage::Tool { content, .. } = &messages[1] else {
            unreachable!()
        };
        assert!(content.len() <= 400 + CUT_NOTE.len(), "{}", content.len());
    }

    #[test]
    fn follow_ups_are_detected_and_rewritten_by_rules() {
        let history = vec![turn("When was the Eiffel Tower built?", "1887 to 1889.")];
        assert!(looks_like_follow_up("How tall is it?"));
        assert!(!looks_like_follow_up(
            "When was the Colosseum built in Rome?"
        ));
        assert_eq!(
            rewrite_follow_up_rules("How tall is it?", &history).unwrap(),
            "How tall is it? (eiffel tower built)"
        );
        assert!(
            rewrite_follow_up_rules("When was the Colosseum built in Rome?", &history).is_none()
        );
    }
}
