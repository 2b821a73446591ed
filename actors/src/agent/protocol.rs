//! Never protocol text: tolerant reading of the model's steps, and the scrub every answer
//! passes before it is shown.
//!
//! Small models write their ReAct step as JSON in the text (`{"thought": …, "tool":
//! "final_answer", "tool_input": {"answer": …}}`) and are often cut off mid-way by a token
//! limit. [`repair_json`] closes what a truncated object left open (an unterminated string,
//! open arrays and objects; a dangling key or a half-written literal is dropped), so the
//! fields written before the cut are kept. [`recover_step`] reads a step (complete or
//! repaired) in the spellings models use. [`scrub`] removes what must never reach a reader:
//! chat-template tokens (`<|im_start|>`, `</s>`, `[INST]`), tool-call tags, and step JSON
//! (replaced by its `answer` when it has one).
//!
//! The repair is a small single-pass scanner rather than a crate: no maintained Rust crate for
//! partial JSON was at hand, and the job is narrow (close a prefix, never guess content).

use regex::Regex;
use serde_json::Value;

/// Longest text the repair looks at (a step is far shorter; a runaway model is cut).
const MAX_REPAIR_CHARS: usize = 200_000;
/// Deepest nesting the repair closes (deeper input is not a step).
const MAX_DEPTH: usize = 64;

/// The JSON value of `text` starting at its first `{`, closing whatever a cut left open.
/// `None` when nothing object-like can be recovered.
pub fn repair_json(text: &str) -> Option<Value> {
    let start = text.find('{')?;
    let body: String = text[start..].chars().take(MAX_REPAIR_CHARS).collect();
    if let Ok(value) = serde_json::from_str::<Value>(&body) {
        return value.is_object().then_some(value);
    }
    // One pass: `stack` holds the open containers; `safe` is the longest prefix that ends
    // at a point where closing the containers gives valid JSON (after a complete value,
    // or right after an opening bracket).
    let mut stack: Vec<char> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut safe: Option<(usize, Vec<char>)> = None;
    // Inside a string: whether it is a value (a key cut off is dropped, not closed).
    let mut string_is_value = false;
    let mut expecting_key = false;
    for (index, c) in body.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    in_string = false;
                    if string_is_value {
                        safe = Some((index + 1, stack.clone()));
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                string_is_value = !(stack.last() == Some(&'{') && expecting_key);
            }
            '{' | '[' => {
                if stack.len() >= MAX_DEPTH {
                    return None;
                }
                stack.push(c);
                expecting_key = c == '{';
                safe = Some((index + 1, stack.clone()));
            }
            '}' | ']' => {
                let open = if c == '}' { '{' } else { '[' };
                if stack.pop() != Some(open) {
                    return None;
                }
                expecting_key = false;
                if stack.is_empty() {
                    return serde_json::from_str::<Value>(&body[..index + 1])
                        .ok()
                        .filter(Value::is_object);
                }
                safe = Some((index + 1, stack.clone()));
            }
            ':' => expecting_key = false,
            ',' => {
                // A comma follows a complete value: the prefix before it is safe.
                safe = Some((index, stack.clone()));
                expecting_key = stack.last() == Some(&'{');
            }
            _ => {}
        }
    }
    // The whole text closed as it is: cut mid-string (a value's text is kept, a dangling
    // escape dropped) or right after a complete number or literal.
    let whole = if in_string && string_is_value {
        let mut cut = body.clone();
        if escaped {
            cut.pop();
        }
        cut.push('"');
        Some(cut)
    } else if !in_string {
        Some(body.clone())
    } else {
        None
    };
    let mut repaired = match whole
        .map(|mut trial| {
            close(&mut trial, &stack);
            trial
        })
        .filter(|trial| serde_json::from_str::<Value>(trial).is_ok())
    {
        Some(trial) => trial,
        None => {
            let (end, open) = safe?;
            let mut trial = body[..end].to_string();
            close(&mut trial, &open);
            trial
        }
    };
    // A trailing comma before a closing bracket (`[1,` cut after the comma) is dropped by
    // taking the safe prefix, which never ends in one; check once more anyway.
    if serde_json::from_str::<Value>(&repaired).is_err() {
        repaired = repaired.replace(",}", "}").replace(",]", "]");
    }
    serde_json::from_str::<Value>(&repaired)
        .ok()
        .filter(Value::is_object)
}

fn close(text: &mut String, stack: &[char]) {
    let trimmed = text.trim_end().trim_end_matches(',').len();
    text.truncate(trimmed);
    for open in stack.iter().rev() {
        text.push(if *open == '{' { '}' } else { ']' });
    }
}

/// A tool call read from a step the model wrote as text.
#[derive(Clone, Debug, PartialEq)]
pub struct RecoveredStep {
    pub tool: String,
    pub arguments: Value,
    /// The step was cut off and closed by [`repair_json`].
    pub repaired: bool,
}

/// The tool call of a step written as JSON text (`tool`/`name`/`action` with
/// `tool_input`/`arguments`/`parameters`/`args`/`input`), complete or cut off. A bare
/// `{"answer": …}` counts as `final_answer`.
pub fn recover_step(text: &str) -> Option<RecoveredStep> {
    let complete = super::model_io::extract_json_object(text);
    let repaired = complete.is_none();
    let value = match complete {
        Some(value) => value,
        None => repair_json(text)?,
    };
    let object = value.as_object()?;
    let tool = ["tool", "name", "action", "function"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_str))
        .map(str::to_string);
    let arguments = ["tool_input", "arguments", "parameters", "args", "input"]
        .iter()
        .find_map(|key| object.get(*key))
        .cloned();
    let arguments = match arguments {
        Some(Value::String(inner)) => serde_json::from_str::<Value>(&inner)
            .ok()
            .or_else(|| repair_json(&inner))
            .unwrap_or(Value::String(inner)),
        Some(other) => other,
        None => Value::Null,
    };
    match (tool, arguments) {
        (Some(tool), arguments) if !tool.trim().is_empty() => Some(RecoveredStep {
            tool,
            arguments: if arguments.is_null() {
                Value::Object(Default::default())
            } else {
                arguments
            },
            repaired,
        }),
        (None, _) if object.get("answer").is_some_and(Value::is_string) => Some(RecoveredStep {
            tool: super::tools::FINAL_ANSWER.to_string(),
            arguments: value.clone(),
            repaired,
        }),
        _ => None,
    }
}

/// Whether `text` looks like a step or tool call written as JSON (so it must not be taken
/// as an answer, even when it cannot be read).
pub fn looks_like_step(text: &str) -> bool {
    let without_tokens = role_after_token_regex().replace_all(text, " ");
    let without_tokens = template_regex().replace_all(&without_tokens, " ");
    let trimmed = without_tokens
        .trim_start()
        .trim_start_matches("```json")
        .trim_start_matches("```")
        .trim_start();
    (trimmed.starts_with('{') && step_key_regex().is_match(trimmed)) || text.contains("<tool_call>")
}

fn step_key_regex() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r#"\{\s*"(thought|tool|tool_input|name|arguments|action|action_input|function|parameters|answer|citations)"\s*:"#,
        )
        .expect("valid regex")
    })
}

fn template_regex() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?i)<\|[a-z_ ]{1,40}\|>|</?(tool_call|tool_response|function_call|functions|tool_output|think|s)>|\[/?INST\]|<<\s*/?SYS\s*>>|<\|[a-z_ ]{1,40}\|>",
        )
        .expect("valid regex")
    })
}

/// A role name a chat template leaves after its start token (`<|im_start|>assistant`).
fn role_after_token_regex() -> &'static Regex {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)<\|(im_start|start_header_id)\|>\s*(system|user|assistant|tool)?\s*(<\|end_header_id\|>)?")
            .expect("valid regex")
    })
}

/// The answer text with every piece of protocol removed: template tokens and tool tags go;
/// step JSON (complete or cut off) is replaced by its `answer` when it has one, else removed;
/// code fences left empty go. The result is trimmed; it may be empty.
pub fn scrub(text: &str) -> String {
    let mut out = role_after_token_regex().replace_all(text, " ").into_owned();
    out = template_regex().replace_all(&out, " ").into_owned();
    // Step JSON, from each `{"key":` that opens one.
    let mut guard = 0;
    while let Some(found) = step_key_regex().find(&out) {
        guard += 1;
        if guard > 100 {
            out.truncate(found.start());
            break;
        }
        let start = found.start();
        let tail = &out[start..];
        let (replacement, consumed) = match super::model_io::find_json_object(tail) {
            Some((value, 0, end)) => (answer_of(&value).unwrap_or_default(), end),
            _ => {
                // Cut off (or broken): the rest of the text is the step.
                let answer = repair_json(tail)
                    .and_then(|value| answer_of(&value))
                    .unwrap_or_default();
                (answer, tail.len())
            }
        };
        out.replace_range(start..start + consumed, &replacement);
    }
    let out = out.replace("```json", "").replace("```", "");
    // Whitespace runs left by removals collapse (newlines kept).
    let mut cleaned = String::with_capacity(out.len());
    for line in out.lines() {
        let collapsed = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if !cleaned.is_empty() {
            cleaned.push('\n');
        }
        let lead: String = line.chars().take_while(|c| *c == ' ').collect();
        if !collapsed.is_empty() && (lead.len() >= 2) {
            cleaned.push_str(&lead);
        }
        cleaned.push_str(&collapsed);
    }
    let mut cleaned = cleaned.trim().to_string();
    while cleaned.contains("\n\n\n") {
        cleaned = cleaned.replace("\n\n\n", "\n\n");
    }
    cleaned
}

/// The `answer` a step value carries (at the top, or in its tool input).
fn answer_of(value: &Value) -> Option<String> {
    let direct = value.get("answer").and_then(Value::as_str);
    let nested = ["tool_input", "arguments", "parameters", "args", "input"]
        .iter()
        .filter_map(|key| value.get(*key))
        .find_map(|inner| match inner {
            Value::String(s) => serde_json::from_str::<Value>(s)
                .ok()
                .or_else(|| repair_json(s))
                .and_then(|v| v.get("answer").and_then(Value::as_str).map(str::to_string)),
            other => other
                .get("answer")
                .and_then(Value::as_str)
                .map(str::to_string),
        });
    direct
        .map(str::to_string)
        .or(nested)
        .map(|answer| scrub(&answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_step_cut_mid_string_keeps_its_answer() {
        let cut = r#"{"thought":"","tool":"final_answer","tool_input":{"answer":"Aschenbrödel ("#;
        let value = repair_json(cut).unwrap();
        assert_eq!(value["tool_input"]["answer"], "Aschenbrödel (");
        let step = recover_step(cut).unwrap();
        assert_eq!(step.tool, "final_answer");
        assert!(step.repaired);
        assert_eq!(step.arguments["answer"], "Aschenbrödel (");
    }

    #[test]
    fn a_step_cut_inside_the_citation_list_keeps_answer_and_whole_ids() {
        let cut = r#"{"thought":"","tool":"final_answer","tool_input":{"answer":"It is 43.8 inches.", "citations": ["a#1", "b#"#;
        let value = repair_json(cut).unwrap();
        assert_eq!(value["tool_input"]["answer"], "It is 43.8 inches.");
        assert_eq!(value["tool_input"]["citations"], json!(["a#1", "b#"]));
        let cut = r#"{"tool":"final_answer","tool_input":{"answer":"x", "citations": ["#;
        assert_eq!(
            repair_json(cut).unwrap()["tool_input"]["citations"],
            json!([])
        );
        // A key cut off is dropped, not closed into a value.
        let cut = r#"{"answer":"y", "cita"#;
        assert_eq!(repair_json(cut).unwrap(), json!({"answer": "y"}));
        let cut = r#"{"answer":"y", "n": 12"#;
        assert_eq!(repair_json(cut).unwrap(), json!({"answer": "y", "n": 12}));
        let cut = r#"{"answer":"ends in an escape \"#;
        assert_eq!(repair_json(cut).unwrap()["answer"], "ends in an escape ");
    }

    #[test]
    fn nothing_object_like_is_not_invented() {
        assert!(repair_json("no braces here").is_none());
        assert!(repair_json("{").unwrap().as_object().unwrap().is_empty());
        assert!(repair_json("{]").is_none());
        let deep = "[".repeat(10_000);
        assert!(repair_json(&format!("{{\"a\": {deep}")).is_none());
        assert!(recover_step("{\"foo\": 1}").is_none());
    }

    #[test]
    fn steps_in_other_spellings_are_recovered() {
        let step = recover_step(
            "```json\n{\"name\": \"knowledge_search\", \"arguments\": \"{\\\"query\\\": \\\"raft\\\"}\"}\n```",
        )
        .unwrap();
        assert_eq!(step.tool, "knowledge_search");
        assert_eq!(step.arguments, json!({"query": "raft"}));
        assert!(!step.repaired);
        let step = recover_step("{\"answer\": \"Yes.\", \"citations\": [\"a#0\"]}").unwrap();
        assert_eq!(step.tool, "final_answer");
    }

    #[test]
    fn scrub_removes_templates_tags_and_step_json() {
        assert_eq!(
            scrub("<|im_start|>assistant\nWater boils at 100 °C.<|im_end|></s>"),
            "Water boils at 100 °C."
        );
        assert_eq!(
            scrub(
                "<tool_call>{\"name\": \"knowledge_search\", \"arguments\": {\"query\": \"x\"}}</tool_call>"
            ),
            ""
        );
        assert_eq!(
            scrub(
                r#"{"thought":"","tool":"final_answer","tool_input":{"answer":"Aschenbrödel (", "citations": ["#
            ),
            "Aschenbrödel ("
        );
        assert_eq!(
            scrub("Sure. {\"answer\": \"Raft elects a leader.\", \"citations\": []} [INST]"),
            "Sure. Raft elects a leader."
        );
        // Ordinary braces and brackets stay.
        assert_eq!(scrub("Use {x} and [1] here."), "Use {x} and [1] here.");
        assert!(looks_like_step("  {\"tool\": \"final_answer\""));
        assert!(looks_like_step("<|im_start|>assistant\n{\"tool\": \"x\"}"));
        assert!(looks_like_step(
            "Let me search. <tool_call>{\"name\": \"x\"}"
        ));
        assert!(!looks_like_step(
            "<|im_start|>assistant\nWater boils.<|im_end|>"
        ));
        assert!(!looks_like_step("Water boils at 100 °C."));
    }
}
