//! The pieces of both streaming wire formats, replies for scripted agents, and helpers that
//! read a provider's stream back.

use futures::StreamExt;
use serde_json::{Value, json};

use super::{FakeReply, FakeRequest};
use crate::llm::{ChatEvent, ChatStream, LlmError};

// ---- OpenAI wire format ----

/// A chat completion chunk with one choice.
pub fn openai_chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
    })
}

/// `data: {chunk}` events, then `data: [DONE]`.
pub fn openai_sse(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_string()))
        .collect()
}

/// The usage chunk sent last with `stream_options.include_usage`.
pub fn openai_usage(prompt_tokens: u32, completion_tokens: u32) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
}

/// Splits `text` into `parts` pieces of about equal length (on char boundaries).
pub fn split_text(text: &str, parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(parts.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// An OpenAI streamed answer of plain text, in `parts` content deltas.
pub fn openai_text(text: &str, parts: usize) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({ "role": "assistant", "content": "" }),
        None,
    )];
    for piece in split_text(text, parts) {
        chunks.push(openai_chunk(json!({ "content": piece }), None));
    }
    chunks.push(openai_chunk(json!({}), Some("stop")));
    chunks.push(openai_usage(50, parts as u32));
    openai_sse(&chunks)
}

/// An OpenAI streamed tool call whose JSON arguments arrive in `parts` fragments.
pub fn openai_tool_call(id: &str, name: &str, arguments: &Value, parts: usize) -> Vec<String> {
    openai_tool_call_raw(id, name, &arguments.to_string(), parts)
}

/// [`openai_tool_call`] with the argument text as given (possibly malformed JSON).
pub fn openai_tool_call_raw(id: &str, name: &str, arguments: &str, parts: usize) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({ "role": "assistant", "content": null, "tool_calls": [{
            "index": 0, "id": id, "type": "function",
            "function": { "name": name, "arguments": "" },
        }]}),
        None,
    )];
    for piece in split_text(arguments, parts) {
        chunks.push(openai_chunk(
            json!({ "tool_calls": [{ "index": 0, "function": { "arguments": piece } }] }),
            None,
        ));
    }
    chunks.push(openai_chunk(json!({}), Some("tool_calls")));
    chunks.push(openai_usage(80, parts as u32));
    openai_sse(&chunks)
}

/// A complete OpenAI answer streaming `pieces` of text, one content delta each.
pub fn openai_text_answer(pieces: &[&str]) -> Vec<String> {
    let mut chunks = vec![openai_chunk(
        json!({ "role": "assistant", "content": "" }),
        None,
    )];
    chunks.extend(
        pieces
            .iter()
            .map(|piece| openai_chunk(json!({ "content": piece }), None)),
    );
    chunks.push(openai_chunk(json!({}), Some("stop")));
    chunks.push(openai_usage(11, pieces.len() as u32));
    openai_sse(&chunks)
}

/// Cuts the pieces anew every 7 characters, so events straddle writes at odd places.
pub fn split_pieces(pieces: Vec<String>) -> Vec<String> {
    let characters: Vec<char> = pieces.concat().chars().collect();
    characters
        .chunks(7)
        .map(|chunk| chunk.iter().collect())
        .collect()
}

// ---- Anthropic wire format ----

/// Anthropic SSE events (an `event:` line named by the `type`, then `data:`).
pub fn anthropic_sse(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|event| {
            let name = event["type"].as_str().unwrap_or("message").to_string();
            format!("event: {name}\ndata: {event}\n\n")
        })
        .collect()
}

fn anthropic_start() -> Value {
    json!({ "type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
        "content": [], "stop_reason": null, "usage": { "input_tokens": 60, "output_tokens": 1 },
    }})
}

fn anthropic_end(stop_reason: &str, output_tokens: u32) -> Vec<Value> {
    vec![
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason },
                "usage": { "output_tokens": output_tokens } }),
        json!({ "type": "message_stop" }),
    ]
}

/// An Anthropic streamed text answer in `parts` text deltas.
pub fn anthropic_text(text: &str, parts: usize) -> Vec<String> {
    let mut events = vec![
        anthropic_start(),
        json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "text", "text": "" } }),
    ];
    for piece in split_text(text, parts) {
        events.push(json!({ "type": "content_block_delta", "index": 0,
                            "delta": { "type": "text_delta", "text": piece } }));
    }
    events.push(json!({ "type": "content_block_stop", "index": 0 }));
    events.extend(anthropic_end("end_turn", parts as u32));
    anthropic_sse(&events)
}

/// An Anthropic streamed `tool_use` block whose input JSON arrives in `parts` fragments.
pub fn anthropic_tool_call(id: &str, name: &str, arguments: &Value, parts: usize) -> Vec<String> {
    let mut events = vec![
        anthropic_start(),
        json!({ "type": "content_block_start", "index": 0,
                "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } }),
    ];
    for piece in split_text(&arguments.to_string(), parts) {
        events.push(json!({ "type": "content_block_delta", "index": 0,
                            "delta": { "type": "input_json_delta", "partial_json": piece } }));
    }
    events.push(json!({ "type": "content_block_stop", "index": 0 }));
    events.extend(anthropic_end("tool_use", parts as u32));
    anthropic_sse(&events)
}

// ---- reading a provider's stream ----

/// Every event of a stream, and the error that ended it, if any.
pub async fn collect(mut stream: ChatStream) -> (Vec<ChatEvent>, Option<LlmError>) {
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => events.push(event),
            Err(error) => return (events, Some(error)),
        }
    }
    (events, None)
}

/// The [`ChatEvent::ToolArgumentsDelta`] pieces taken out of `events`: the other events in
/// order, and per call index its name and its pieces joined.
pub fn split_argument_pieces(
    events: Vec<ChatEvent>,
) -> (
    Vec<ChatEvent>,
    std::collections::BTreeMap<u64, (String, String)>,
) {
    let mut pieces = std::collections::BTreeMap::<u64, (String, String)>::new();
    let mut others = Vec::new();
    for event in events {
        match event {
            ChatEvent::ToolArgumentsDelta {
                index,
                name,
                fragment,
            } => {
                let entry = pieces.entry(index).or_insert_with(|| (name, String::new()));
                entry.1.push_str(&fragment);
            }
            other => others.push(other),
        }
    }
    (others, pieces)
}

/// The concatenated text deltas.
pub fn text_of(events: &[ChatEvent]) -> String {
    events
        .iter()
        .filter_map(|event| match event {
            ChatEvent::TextDelta(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

// ---- scripted agents ----

/// A text answer in the request's own wire format.
pub fn text_reply(request: &FakeRequest, text: &str, parts: usize) -> FakeReply {
    FakeReply::Stream(if request.is_anthropic() {
        anthropic_text(text, parts)
    } else {
        openai_text(text, parts)
    })
}

/// A tool call in the request's own wire format.
pub fn tool_call_reply(
    request: &FakeRequest,
    id: &str,
    name: &str,
    arguments: &Value,
    parts: usize,
) -> FakeReply {
    FakeReply::Stream(if request.is_anthropic() {
        anthropic_tool_call(id, name, arguments, parts)
    } else {
        openai_tool_call(id, name, arguments, parts)
    })
}

/// The `final_answer` arguments citing the first `n` chunk ids the agent showed the model.
pub fn final_answer_citing(request: &FakeRequest, n: usize) -> Value {
    let ids: Vec<String> = request.chunk_ids_shown().into_iter().take(n).collect();
    // A well-behaved model answers with what the chunks say: each cited chunk's opening
    // words, so the answer's sentences are supported by the chunks they cite.
    let answer = ids
        .iter()
        .enumerate()
        .map(|(i, id)| match shown_chunk_text(request, id) {
            Some(text) => {
                let opening: Vec<&str> = text.split_whitespace().take(24).collect();
                let opening = opening.join(" ");
                format!("{} [{id}].", opening.trim_end_matches(['.', ',', ';', ':']))
            }
            None => format!("Finding {} is supported by the evidence [{id}].", i + 1),
        })
        .collect::<Vec<_>>()
        .join(" ");
    json!({ "answer": answer, "citations": ids })
}

/// The text of chunk `id` as a tool result in the request showed it (the line after its
/// `chunk_id: {id}` header).
pub fn shown_chunk_text(request: &FakeRequest, id: &str) -> Option<String> {
    fn strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::String(s) => out.push(s),
            Value::Array(items) => items.iter().for_each(|item| strings(item, out)),
            Value::Object(map) => map.values().for_each(|item| strings(item, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(&request.body, &mut all);
    let header = format!("chunk_id: {id} ");
    all.iter().rev().find_map(|text| {
        let at = text.find(&header)?;
        let rest = &text[at..];
        let body = rest.split_once('\n')?.1;
        let line = body
            .lines()
            .find(|line| !line.trim().is_empty() && !line.trim_start().starts_with("[Context:"))?;
        Some(line.trim().to_string())
    })
}

/// A well-behaved ReAct model: with no tool result yet it calls `knowledge_search` for
/// `query` (arguments split over many chunks); once it has results it calls `final_answer`
/// citing the first two chunks it was shown. Requests without tools (the planner, rewrites,
/// summaries) get a short text answer.
pub fn react_agent(query: impl Into<String>) -> impl Fn(&FakeRequest) -> FakeReply + Send + Sync {
    let query: String = query.into();
    move |request| {
        if !request.offers_tool("final_answer") {
            let question = request.last_user_text();
            return text_reply(request, &question, 3);
        }
        if request.tool_results() == 0 || request.chunk_ids_shown().is_empty() {
            return tool_call_reply(
                request,
                &format!("call_search_{}", request.index),
                "knowledge_search",
                &json!({ "query": query }),
                12,
            );
        }
        tool_call_reply(
            request,
            &format!("call_answer_{}", request.index),
            "final_answer",
            &final_answer_citing(request, 2),
            20,
        )
    }
}

/// An OpenAI (or vLLM) context-overflow answer: 400 with `context_length_exceeded`.
pub fn openai_context_overflow(window: u32, requested: u32) -> FakeReply {
    FakeReply::Status(
        400,
        json!({ "error": {
            "message": format!(
                "This model's maximum context length is {window} tokens. However, your messages \
                 resulted in {requested} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        } }),
    )
}

/// llama.cpp server's context-overflow answer: 400, `exceed_context_size_error`, with its
/// slot's `n_ctx` and the prompt's token count.
pub fn llama_cpp_context_overflow(n_ctx: u32, n_prompt_tokens: u32) -> FakeReply {
    FakeReply::Status(
        400,
        json!({ "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt_tokens,
            "n_ctx": n_ctx,
        } }),
    )
}
