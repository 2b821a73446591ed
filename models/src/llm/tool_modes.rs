//! Tool calling for models without native tool calls.
//!
//! Two per-provider modes ([`ToolMode`]) rewrite the request and read the answer back into the
//! neutral [`ChatEvent`]s, so the agent never knows which one a provider uses:
//! - `text`: the tools are described in the system prompt and the model writes a call as a
//!   fenced ```` ```json {"name": ..., "arguments": {...}} ``` ```` block, a bare JSON object of
//!   that shape (also `{"tool": ..., "arguments" | "args": ...}`), or inside
//!   `<tool_call>...</tool_call>` tags (Qwen's template). [`TextToolParser`] turns those into
//!   [`ChatEvent::ToolCall`]s while the text around them stays [`ChatEvent::TextDelta`].
//! - `json_schema`: every step is requested as JSON `{thought, tool, tool_input}` constrained by
//!   `response_format` (see [`step_response_format`]); [`JsonStepParser`] streams the thought as
//!   [`ChatEvent::ReasoningDelta`] while it is generated and ends with one tool call.
//!
//! In both modes the history's tool calls and results are rewritten as plain assistant and user
//! messages ([`rewrite_for_text_tools`]), since such models' chat templates know no tool roles.

use serde_json::{Map, Value, json};

use super::config::ToolMode;
use super::{ChatEvent, ChatMessage, ChatRequest, FinishReason, ToolCall, ToolSpec, Usage};

/// A candidate call that grows past this many bytes without closing is released as text.
const MAX_CANDIDATE_BYTES: usize = 64 * 1024;

/// Name of the `response_format` schema in `json_schema` mode.
const STEP_SCHEMA_NAME: &str = "agent_step";

/// The key of a `json_schema` step's arguments. Not `arguments`: grammar-constrained decoders
/// (llama.cpp) emit an object's properties in the order the schema lists them, and serde_json
/// writes object keys sorted, so `arguments` came first and a model chose its arguments
/// before it wrote its thought or named the tool (seen with a real 0.5B model). `thought` <
/// `tool` < `tool_input` sorts in the order a step should be written.
pub const STEP_ARGUMENTS_KEY: &str = "tool_input";

/// The request as a `text` or `json_schema` provider sends it: no `tools`, the tools described
/// in the system prompt, and the history's tool calls and results as plain messages.
pub fn rewrite_for_text_tools(request: &ChatRequest, mode: ToolMode) -> ChatRequest {
    let instructions = tool_instructions(&request.tools, mode);
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    let mut instructed = false;
    for message in &request.messages {
        match message {
            ChatMessage::System { content } if !instructed => {
                messages.push(ChatMessage::System {
                    content: format!("{content}\n\n{instructions}"),
                });
                instructed = true;
            }
            ChatMessage::Assistant {
                content,
                tool_calls,
            } if !tool_calls.is_empty() => messages.push(ChatMessage::Assistant {
                content: render_assistant_calls(content, tool_calls, mode),
                tool_calls: Vec::new(),
            }),
            ChatMessage::Tool {
                call_id,
                name,
                content,
            } => {
                let result = format!("Result of tool `{name}` (call {call_id}):\n{content}");
                // Consecutive results go into one user message: templates want turns to alternate.
                if let Some(ChatMessage::User { content }) = messages.last_mut()
                    && content.starts_with("Result of tool `")
                {
                    content.push_str("\n\n");
                    content.push_str(&result);
                } else {
                    messages.push(ChatMessage::User { content: result });
                }
            }
            other => messages.push(other.clone()),
        }
    }
    if !instructed {
        messages.insert(
            0,
            ChatMessage::System {
                content: instructions,
            },
        );
    }
    ChatRequest {
        messages,
        tools: Vec::new(),
        ..request.clone()
    }
}

/// The system prompt part that lists the tools and how to call them.
fn tool_instructions(tools: &[ToolSpec], mode: ToolMode) -> String {
    let mut text = match mode {
        ToolMode::JsonSchema => String::from(
            "Answer every step with exactly one JSON object: \
             {\"thought\": \"<your reasoning>\", \"tool\": \"<tool name>\", \
             \"tool_input\": {<the tool's arguments>}}.\n\nTools:\n",
        ),
        _ => String::from(
            "You can call tools. To call one, write a fenced JSON block and stop:\n\
             ```json\n{\"name\": \"<tool name>\", \"arguments\": {<the tool's arguments>}}\n```\n\
             The result will be sent back to you.\n\nTools:\n",
        ),
    };
    for tool in tools {
        text.push_str(&format!(
            "- {}: {}\n  arguments (JSON Schema): {}\n",
            tool.name, tool.description, tool.parameters
        ));
    }
    text
}

fn render_assistant_calls(content: &str, calls: &[ToolCall], mode: ToolMode) -> String {
    let mut rendered: Vec<String> = Vec::new();
    for call in calls {
        let arguments = serde_json::from_str::<Value>(&call.arguments)
            .unwrap_or_else(|_| Value::String(call.arguments.clone()));
        rendered.push(match mode {
            ToolMode::JsonSchema => {
                json!({"thought": content, "tool": call.name, STEP_ARGUMENTS_KEY: arguments})
                    .to_string()
            }
            _ => format!(
                "```json\n{}\n```",
                json!({"name": call.name, "arguments": arguments})
            ),
        });
    }
    if mode != ToolMode::JsonSchema && !content.trim().is_empty() {
        rendered.insert(0, content.to_owned());
    }
    rendered.join("\n")
}

/// Longest `thought` a `json_schema` step may write (characters).
const THOUGHT_MAX_CHARS: usize = 600;

/// `response_format` of a `json_schema` step: one alternative per tool, `{thought: string,
/// tool: that tool's name, arguments: that tool's parameters}`, so a constrained decoder
/// (llama.cpp, vLLM) cannot leave out a required argument (a small model asked for a free-form
/// `arguments` object wrote `final_answer` without its `answer` five times in a row).
pub fn step_response_format(tools: &[ToolSpec]) -> Value {
    let alternatives: Vec<Value> = tools
        .iter()
        .map(|tool| {
            json!({
                "type": "object",
                "properties": {
                    // Bounded: unconstrained, the same model once wrote a 2,048-token thought
                    // and no call.
                    "thought": {"type": "string", "maxLength": THOUGHT_MAX_CHARS},
                    "tool": {"type": "string", "enum": [tool.name]},
                    STEP_ARGUMENTS_KEY: constrainable(&tool.parameters),
                },
                "required": ["thought", "tool", STEP_ARGUMENTS_KEY],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({
        "type": "json_schema",
        "json_schema": {
            "name": STEP_SCHEMA_NAME,
            // Not strict: OpenAI's strict mode wants every property required; local servers
            // (llama.cpp, vLLM) constrain decoding to the schema either way.
            "strict": false,
            "schema": {"anyOf": alternatives},
        },
    })
}

/// The part of a tool's parameter schema that grammar-constrained decoders support: types,
/// properties, required, items, enum, const and the length bounds of strings and arrays,
/// recursively (a tool of an MCP server may use anything JSON Schema allows). What is dropped
/// only loosens the constraint.
fn constrainable(schema: &Value) -> Value {
    let Some(object) = schema.as_object() else {
        return json!({"type": "object"});
    };
    let mut kept = serde_json::Map::new();
    for key in [
        "type",
        "enum",
        "const",
        "required",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
    ] {
        if let Some(value) = object.get(key) {
            kept.insert(key.to_owned(), value.clone());
        }
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        let properties: serde_json::Map<String, Value> = properties
            .iter()
            .map(|(name, property)| (name.clone(), constrainable(property)))
            .collect();
        kept.insert("properties".into(), Value::Object(properties));
    }
    if let Some(items) = object.get("items") {
        kept.insert("items".into(), constrainable(items));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alternatives) = object.get(key).and_then(Value::as_array) {
            kept.insert(
                key.to_owned(),
                Value::Array(alternatives.iter().map(constrainable).collect()),
            );
        }
    }
    if kept.is_empty() {
        kept.insert("type".into(), json!("object"));
    }
    Value::Object(kept)
}

/// Post-processing of a provider's aggregated events according to its tool mode.
#[derive(Debug)]
pub struct ToolModeDecoder {
    parser: StepParser,
    /// Usage waits for `Finished` so that calls flushed at the end still come before it.
    usage: Option<Usage>,
}

#[derive(Debug)]
enum StepParser {
    /// Events pass through unchanged.
    Native,
    Text(TextToolParser),
    JsonStep(JsonStepParser),
}

impl ToolModeDecoder {
    /// The decoder for `mode`; a request without tools needs none.
    pub fn new(mode: ToolMode, tools: &[ToolSpec]) -> Self {
        let names = tools.iter().map(|tool| tool.name.clone()).collect();
        let parser = match mode {
            _ if tools.is_empty() => StepParser::Native,
            ToolMode::Native => StepParser::Native,
            ToolMode::Text => StepParser::Text(TextToolParser::new(names)),
            ToolMode::JsonSchema => StepParser::JsonStep(JsonStepParser::new(names)),
        };
        ToolModeDecoder {
            parser,
            usage: None,
        }
    }

    /// Maps one aggregated event to what the caller sees.
    pub fn map(&mut self, event: ChatEvent) -> Vec<ChatEvent> {
        if matches!(self.parser, StepParser::Native) {
            return vec![event];
        }
        match event {
            ChatEvent::TextDelta(text) => match &mut self.parser {
                StepParser::Text(parser) => parser.push(&text),
                StepParser::JsonStep(parser) => parser.push(&text),
                StepParser::Native => vec![ChatEvent::TextDelta(text)],
            },
            ChatEvent::Usage(usage) => {
                self.usage = Some(usage);
                Vec::new()
            }
            ChatEvent::Finished(reason) => {
                let (mut events, called) = match &mut self.parser {
                    StepParser::Text(parser) => {
                        let events = parser.finish();
                        (events, parser.calls > 0)
                    }
                    StepParser::JsonStep(parser) => {
                        let events = parser.finish();
                        let called = events
                            .iter()
                            .any(|event| matches!(event, ChatEvent::ToolCall(_)));
                        (events, called)
                    }
                    StepParser::Native => (Vec::new(), false),
                };
                events.extend(self.usage.take().map(ChatEvent::Usage));
                events.push(ChatEvent::Finished(if called {
                    FinishReason::ToolCalls
                } else {
                    reason
                }));
                events
            }
            other => vec![other],
        }
    }
}

/// Where a candidate tool call begins in the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opener {
    Fence,
    Tag,
    Brace,
}

impl Opener {
    const ALL: [(Opener, &'static str); 3] = [
        (Opener::Fence, "```"),
        (Opener::Tag, "<tool_call>"),
        (Opener::Brace, "{"),
    ];
}

/// Streams text, turning tool calls written as JSON into [`ChatEvent::ToolCall`]s.
#[derive(Debug)]
pub struct TextToolParser {
    /// Text not yet released: a possible call that has not closed, or a suffix that may begin
    /// an opener.
    buffer: String,
    /// Names of the offered tools: a JSON object without `arguments` is a call only if its name
    /// is one of them.
    tool_names: Vec<String>,
    /// Calls parsed so far (also numbers the made-up call ids).
    calls: usize,
    /// Start of the made-up call ids, unique per answer: ids stay unique across a run's steps.
    id_prefix: String,
}

/// A prefix for made-up call ids, e.g. `call_3f2a9c01b7de`.
pub fn call_id_prefix() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &random[..12])
}

impl TextToolParser {
    pub fn new(tool_names: Vec<String>) -> Self {
        TextToolParser {
            buffer: String::new(),
            tool_names,
            calls: 0,
            id_prefix: call_id_prefix(),
        }
    }

    /// Feeds streamed text; returns the text and calls it released.
    pub fn push(&mut self, text: &str) -> Vec<ChatEvent> {
        self.buffer.push_str(text);
        let mut events = Vec::new();
        self.drain(&mut events, false);
        events
    }

    /// The end of the text: releases everything still held.
    pub fn finish(&mut self) -> Vec<ChatEvent> {
        let mut events = Vec::new();
        self.drain(&mut events, true);
        let rest = std::mem::take(&mut self.buffer);
        push_text(&mut events, rest);
        events
    }

    fn drain(&mut self, events: &mut Vec<ChatEvent>, at_end: bool) {
        loop {
            let Some((start, opener)) = earliest_opener(&self.buffer) else {
                // Hold back a suffix that may be the start of an opener split across chunks.
                let keep = if at_end {
                    0
                } else {
                    partial_opener_suffix(&self.buffer)
                };
                let released = self.buffer.len() - keep;
                let text: String = self.buffer.drain(..released).collect();
                push_text(events, text);
                return;
            };
            let before: String = self.buffer.drain(..start).collect();
            push_text(events, before);
            match self.take_candidate(opener, at_end) {
                Some(candidate) => self.release_candidate(candidate, events),
                None if self.buffer.len() > MAX_CANDIDATE_BYTES || at_end => {
                    // Never closed: plain text after all (but an unclosed fence may still hold a
                    // complete call, as when the model stops before the closing fence).
                    let text = std::mem::take(&mut self.buffer);
                    self.release_candidate(Candidate { text, opener }, events);
                    return;
                }
                None => return,
            }
        }
    }

    /// Removes the complete candidate at the start of the buffer, if it has closed.
    fn take_candidate(&mut self, opener: Opener, at_end: bool) -> Option<Candidate> {
        let end = match opener {
            Opener::Fence => self.buffer[3..].find("```").map(|end| end + 6),
            Opener::Tag => self
                .buffer
                .find("</tool_call>")
                .map(|end| end + "</tool_call>".len()),
            Opener::Brace => balanced_object_end(&self.buffer),
        };
        let end = end.or(if at_end {
            Some(self.buffer.len())
        } else {
            None
        })?;
        Some(Candidate {
            text: self.buffer.drain(..end).collect(),
            opener,
        })
    }

    fn release_candidate(&mut self, candidate: Candidate, events: &mut Vec<ChatEvent>) {
        match calls_in_candidate(&candidate, &self.tool_names) {
            Some(calls) => {
                for (name, arguments) in calls {
                    self.calls += 1;
                    events.push(ChatEvent::ToolCall(ToolCall {
                        id: format!("{}_{}", self.id_prefix, self.calls),
                        name,
                        arguments,
                    }));
                }
            }
            None => push_text(events, candidate.text),
        }
    }
}

#[derive(Debug)]
struct Candidate {
    text: String,
    opener: Opener,
}

/// Appends text, merging with a preceding text delta so callers see fewer, larger deltas.
fn push_text(events: &mut Vec<ChatEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ChatEvent::TextDelta(previous)) = events.last_mut() {
        previous.push_str(&text);
    } else {
        events.push(ChatEvent::TextDelta(text));
    }
}

fn earliest_opener(text: &str) -> Option<(usize, Opener)> {
    Opener::ALL
        .iter()
        .filter_map(|(opener, marker)| text.find(marker).map(|start| (start, *opener)))
        .min_by_key(|(start, _)| *start)
}

/// Length of the longest suffix of `text` that is a proper prefix of a multi-character opener.
fn partial_opener_suffix(text: &str) -> usize {
    let mut longest = 0;
    for (_, marker) in Opener::ALL {
        for length in 1..marker.len() {
            if text.ends_with(&marker[..length]) {
                longest = longest.max(length);
            }
        }
    }
    longest
}

/// Byte index just past the `}` closing the object that starts `text` (strings and escapes
/// respected), if it has closed.
fn balanced_object_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (index, character) in text.char_indices() {
        if in_string {
            match character {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match character {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(index + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The calls a closed candidate holds, or `None` when it is just text.
fn calls_in_candidate(
    candidate: &Candidate,
    tool_names: &[String],
) -> Option<Vec<(String, String)>> {
    let inner = match candidate.opener {
        Opener::Fence => {
            let body = candidate.text.strip_prefix("```")?;
            let body = body.strip_suffix("```").unwrap_or(body);
            // Skip the info string (`json`) on the opening line.
            match body.split_once('\n') {
                Some((info, rest)) if !info.trim_start().starts_with('{') => rest,
                _ => body,
            }
        }
        Opener::Tag => {
            let body = candidate.text.strip_prefix("<tool_call>")?;
            body.strip_suffix("</tool_call>").unwrap_or(body)
        }
        Opener::Brace => candidate.text.as_str(),
    };
    calls_from_json(inner.trim(), tool_names)
}

/// Parses a call object or an array of call objects.
pub fn calls_from_json(text: &str, tool_names: &[String]) -> Option<Vec<(String, String)>> {
    let value: Value = serde_json::from_str(text).ok()?;
    match value {
        Value::Object(object) => call_from_object(&object, tool_names).map(|call| vec![call]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| call_from_object(item.as_object()?, tool_names))
            .collect(),
        _ => None,
    }
}

/// `{"name" | "tool": ..., "arguments" | "args" | "parameters": ...}` or OpenAI's
/// `{"function": {"name", "arguments"}}`. Without an argument field, the name must be one of
/// the offered tools (so an answer like `{"name": "Ada"}` stays text).
fn call_from_object(
    object: &Map<String, Value>,
    tool_names: &[String],
) -> Option<(String, String)> {
    if let Some(Value::Object(function)) = object.get("function") {
        return call_from_object(function, tool_names);
    }
    let name = ["name", "tool"]
        .iter()
        .find_map(|key| object.get(*key)?.as_str())?
        .trim()
        .to_owned();
    if name.is_empty() {
        return None;
    }
    let arguments = ["arguments", "args", "parameters", STEP_ARGUMENTS_KEY]
        .iter()
        .find_map(|key| object.get(*key));
    match arguments {
        Some(Value::String(text)) => Some((name, text.clone())),
        Some(value) => Some((name, value.to_string())),
        None if tool_names.contains(&name) => Some((name, "{}".to_owned())),
        None => None,
    }
}

/// Reads a `json_schema` step: streams the `thought` string as it is generated, and ends with
/// the call to `tool` with `arguments`.
#[derive(Debug, Default)]
pub struct JsonStepParser {
    /// Offered tool names, for the text fallback.
    tool_names: Vec<String>,
    buffer: String,
    /// Byte offset in `buffer` where the thought's string content starts, once found.
    thought_start: Option<usize>,
    /// Byte offset up to which the thought has been decoded and released.
    thought_released: usize,
    /// The thought's closing quote was reached.
    thought_done: bool,
    /// Some of the thought was released as reasoning.
    streamed_thought: bool,
    /// The step's tool, once its name has closed.
    tool: Option<String>,
    /// Byte offset in `buffer` up to which the step's arguments were released as
    /// [`ChatEvent::ToolArgumentsDelta`], once they have started.
    arguments_released: Option<usize>,
}

impl JsonStepParser {
    pub fn new(tool_names: Vec<String>) -> Self {
        JsonStepParser {
            tool_names,
            ..JsonStepParser::default()
        }
    }

    /// Feeds streamed JSON text; returns newly complete thought text, and the arguments
    /// written so far once the tool is named.
    pub fn push(&mut self, text: &str) -> Vec<ChatEvent> {
        self.buffer.push_str(text);
        let mut events = Vec::new();
        self.push_thought(&mut events);
        self.push_arguments(&mut events);
        events
    }

    fn push_thought(&mut self, events: &mut Vec<ChatEvent>) {
        if self.thought_start.is_none() {
            self.thought_start = find_string_value_start(&self.buffer, "thought");
            self.thought_released = self.thought_start.unwrap_or(0);
        }
        if self.thought_start.is_none() || self.thought_done {
            return;
        }
        let (decoded, consumed, closed) =
            decode_json_string_prefix(&self.buffer[self.thought_released..]);
        self.thought_released += consumed;
        self.thought_done = closed;
        if !decoded.is_empty() {
            self.streamed_thought = true;
            events.push(ChatEvent::ReasoningDelta(decoded));
        }
    }

    /// The `tool_input` text written since the last call, once the tool's name has closed
    /// (the schema orders `tool` before `tool_input`). The step's closing brace goes out
    /// with it: the pieces are for reading a field as it grows, not for parsing whole.
    fn push_arguments(&mut self, events: &mut Vec<ChatEvent>) {
        if self.tool.is_none() {
            let Some(start) = find_string_value_start(&self.buffer, "tool") else {
                return;
            };
            let (name, _, closed) = decode_json_string_prefix(&self.buffer[start..]);
            if !closed {
                return;
            }
            self.tool = Some(name.trim().to_owned());
        }
        if self.arguments_released.is_none() {
            self.arguments_released = find_value_start(&self.buffer, STEP_ARGUMENTS_KEY);
        }
        let (Some(tool), Some(released)) = (&self.tool, self.arguments_released) else {
            return;
        };
        if released < self.buffer.len() && !tool.is_empty() {
            events.push(ChatEvent::ToolArgumentsDelta {
                index: 0,
                name: tool.clone(),
                fragment: self.buffer[released..].to_owned(),
            });
            self.arguments_released = Some(self.buffer.len());
        }
    }

    /// The end of the step: the call, or the text itself when it is not a valid step.
    pub fn finish(&mut self) -> Vec<ChatEvent> {
        let buffer = std::mem::take(&mut self.buffer);
        let step = serde_json::from_str::<Value>(buffer.trim()).ok();
        let step = step.as_ref().and_then(Value::as_object);
        let tool = step
            .and_then(|step| step.get("tool"))
            .and_then(Value::as_str)
            .filter(|tool| !tool.trim().is_empty());
        let Some((step, tool)) = step.zip(tool) else {
            // Not a step (a server ignoring response_format, or a cut-off answer): the text
            // parser may still find a call in it.
            if self.streamed_thought {
                return Vec::new();
            }
            let mut parser = TextToolParser::new(std::mem::take(&mut self.tool_names));
            let mut events = parser.push(&buffer);
            events.extend(parser.finish());
            return events;
        };
        let mut events = Vec::new();
        if !self.streamed_thought
            && let Some(thought) = step.get("thought").and_then(Value::as_str)
            && !thought.is_empty()
        {
            events.push(ChatEvent::ReasoningDelta(thought.to_owned()));
        }
        let arguments = match step
            .get(STEP_ARGUMENTS_KEY)
            .or_else(|| step.get("arguments"))
        {
            Some(Value::String(text)) => text.clone(),
            Some(value) => value.to_string(),
            None => "{}".to_owned(),
        };
        events.push(ChatEvent::ToolCall(ToolCall {
            id: format!("{}_1", call_id_prefix()),
            name: tool.trim().to_owned(),
            arguments,
        }));
        events
    }
}

/// Byte offset of the value of the first `"key":` in a JSON text being written, once the
/// buffer holds its first character. (A key inside a string value is escaped, `\"key\"`, so
/// it is not found.)
pub fn find_value_start(buffer: &str, key: &str) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    let at = buffer.find(&quoted)?;
    let rest = &buffer[at + quoted.len()..];
    let after_colon = rest.trim_start().strip_prefix(':')?;
    let value = after_colon.trim_start();
    (!value.is_empty()).then(|| buffer.len() - value.len())
}

/// Byte offset just after the opening quote of the string value of the first `"key":` in a
/// JSON text being written, once the buffer holds it.
pub fn find_string_value_start(buffer: &str, key: &str) -> Option<usize> {
    let start = find_value_start(buffer, key)?;
    buffer[start..].starts_with('"').then_some(start + 1)
}

/// Decodes the longest complete prefix of a JSON string body: the decoded text, the bytes
/// consumed and whether the closing quote was reached. An escape cut by the chunk boundary is
/// left for the next call.
pub fn decode_json_string_prefix(text: &str) -> (String, usize, bool) {
    let bytes = text.as_bytes();
    let mut decoded = String::new();
    let mut position = 0;
    while let Some(&byte) = bytes.get(position) {
        match byte {
            b'"' => return (decoded, position + 1, true),
            b'\\' => {
                let Some(&escape) = bytes.get(position + 1) else {
                    break;
                };
                if escape != b'u' {
                    decoded.push(match escape {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        other => char::from(other),
                    });
                    position += 2;
                    continue;
                }
                let Some(unit) = hex_unit(text, position + 2) else {
                    break;
                };
                if (0xD800..0xDC00).contains(&unit) {
                    // A surrogate pair: the low half follows as another `\uXXXX`.
                    if text.get(position + 6..position + 8) != Some("\\u") {
                        break;
                    }
                    let Some(low) = hex_unit(text, position + 8) else {
                        break;
                    };
                    let combined =
                        0x10000 + ((unit - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF);
                    decoded.push(char::from_u32(combined).unwrap_or('\u{FFFD}'));
                    position += 12;
                } else {
                    decoded.push(char::from_u32(unit).unwrap_or('\u{FFFD}'));
                    position += 6;
                }
            }
            _ => {
                // `position` is always on a character boundary: escapes are ASCII.
                let Some(character) = text[position..].chars().next() else {
                    break;
                };
                decoded.push(character);
                position += character.len_utf8();
            }
        }
    }
    (decoded, position, false)
}

/// The four hex digits at `start`, once they have all arrived.
fn hex_unit(text: &str, start: usize) -> Option<u32> {
    u32::from_str_radix(text.get(start..start + 4)?, 16).ok()
}

#[cfg(test)]
mod tests;
