//! OpenAI-compatible chat completions (OpenAI, vLLM, Ollama, llama.cpp server, DeepSeek, Qwen).
//!
//! Wire format: `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options: {include_usage: true}`, answered by SSE `data:` lines each holding a chunk
//! `{"choices": [{"delta": {"content" | "reasoning_content" | "tool_calls"}, "finish_reason"}]}`,
//! a last chunk with `usage` and no choices, then `data: [DONE]`. [`StreamAggregator`] rebuilds
//! each tool call from its `delta.tool_calls[i]` fragments by `index` (id and name in the first
//! fragment, the arguments split across any number of chunks, several calls interleaved).
//! Providers whose `tool_mode` is `text` or `json_schema` go through
//! [`super::tool_modes`] instead of `tools`.

use std::collections::{BTreeMap, VecDeque};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tracing::debug;

use super::config::{ProviderConfig, ToolMode};
use super::http::{SseBody, build_client, send};
use super::tool_modes::{
    ToolModeDecoder, call_id_prefix, rewrite_for_text_tools, step_response_format,
};
use super::{
    ChatEvent, ChatMessage, ChatModel, ChatRequest, ChatStream, FinishReason, LlmError, ToolCall,
    ToolSpec, Usage,
};

/// One OpenAI-compatible endpoint.
pub struct OpenAiProvider {
    config: ProviderConfig,
    client: reqwest::Client,
    endpoint: String,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OpenAiProvider")
            .field("name", &self.config.name)
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    pub fn new(config: ProviderConfig) -> Result<Self, LlmError> {
        let client = build_client(&config)?;
        let endpoint = config.endpoint("chat/completions");
        Ok(OpenAiProvider {
            config,
            client,
            endpoint,
        })
    }

    /// The JSON body for `request`, shaped by the provider's tool mode.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        let mode = self.config.tool_mode;
        let rewritten;
        let effective = if mode != ToolMode::Native && !request.tools.is_empty() {
            rewritten = rewrite_for_text_tools(request, mode);
            &rewritten
        } else {
            request
        };
        let mut body = json!({
            "model": self.config.model,
            "messages": effective.messages.iter().map(wire_message).collect::<Vec<_>>(),
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": request.max_tokens.unwrap_or(self.config.max_tokens),
        });
        if let Some(temperature) = request.temperature {
            body["temperature"] = json!(temperature);
        }
        if !request.tools.is_empty() {
            match mode {
                ToolMode::Native => {
                    body["tools"] = request.tools.iter().map(wire_tool).collect();
                    body["tool_choice"] = json!("auto");
                }
                ToolMode::JsonSchema => {
                    body["response_format"] = step_response_format(&request.tools);
                }
                ToolMode::Text => {}
            }
        }
        body
    }

    async fn start(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        let body = self.request_body(&request);
        let mut http_request = self.client.post(&self.endpoint).json(&body);
        if let Some(api_key) = &self.config.api_key {
            http_request = http_request.bearer_auth(api_key);
        }
        let response = send(&self.config.name, http_request).await?;
        debug!(provider = %self.config.name, "chat completion stream accepted");
        let state = OpenAiStream {
            provider: self.config.name.clone(),
            body: SseBody::new(&self.config.name, response),
            aggregator: StreamAggregator::default(),
            decoder: ToolModeDecoder::new(self.config.tool_mode, &request.tools),
            pending: VecDeque::new(),
            finished: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            state,
            |mut state| async move { state.next().await.map(|item| (item, state)) },
        )))
    }
}

impl ChatModel for OpenAiProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn context_window(&self) -> u32 {
        self.config.context_window
    }

    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>> {
        Box::pin(self.start(request))
    }
}

/// A message in the chat completions format.
fn wire_message(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { content } => json!({"role": "system", "content": content}),
        ChatMessage::User { content } => json!({"role": "user", "content": content}),
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            if tool_calls.is_empty() {
                return json!({"role": "assistant", "content": content});
            }
            let calls: Vec<Value> = tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    })
                })
                .collect();
            let content = if content.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        ChatMessage::Tool {
            call_id, content, ..
        } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
    }
}

fn wire_tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

/// The state of one streamed answer, pulled event by event.
struct OpenAiStream {
    provider: String,
    body: SseBody,
    aggregator: StreamAggregator,
    decoder: ToolModeDecoder,
    pending: VecDeque<ChatEvent>,
    finished: bool,
}

impl OpenAiStream {
    async fn next(&mut self) -> Option<Result<ChatEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            let outcome = match self.body.next().await {
                Some(Err(error)) => Err(error),
                Some(Ok(event)) if event.data.trim() == "[DONE]" => {
                    self.finished = true;
                    Ok(self.aggregator.finish())
                }
                Some(Ok(event)) => serde_json::from_str::<Value>(&event.data)
                    .map_err(|error| format!("chunk is not JSON ({error}): {:.200}", event.data))
                    .and_then(|chunk| self.aggregator.push(&chunk))
                    .map_err(|message| self.protocol_error(message)),
                None if self.aggregator.finish_reason.is_some() => {
                    // The server closed without `[DONE]` after the answer finished: accept it.
                    self.finished = true;
                    Ok(self.aggregator.finish())
                }
                None => {
                    Err(self.protocol_error("stream ended before the answer finished".to_owned()))
                }
            };
            match outcome {
                Ok(events) => {
                    for event in events {
                        self.pending.extend(self.decoder.map(event));
                    }
                }
                Err(error) => {
                    self.finished = true;
                    self.pending.clear();
                    return Some(Err(error));
                }
            }
        }
    }

    fn protocol_error(&self, message: String) -> LlmError {
        LlmError::Protocol {
            provider: self.provider.clone(),
            message,
        }
    }
}

/// How an error event inside a stream starts its message.
pub(crate) const IN_STREAM_ERROR: &str = "error in stream: ";

/// Rebuilds complete events from chat completion chunks.
#[derive(Debug, Default)]
pub struct StreamAggregator {
    /// Tool calls being assembled, by their `index`.
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<FinishReason>,
    usage: Option<Usage>,
    /// Some tool call was released already.
    released_calls: bool,
    /// Server index -> call index, for servers that reuse an index for a new call.
    renumbered: BTreeMap<u64, u64>,
    /// For calls the server gave no id (made once, unique per answer).
    id_prefix: Option<String>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl StreamAggregator {
    /// One chunk in, the events it completes out. Text and reasoning are released at once;
    /// tool calls when the choice finishes (fragments of several calls may interleave).
    pub fn push(&mut self, chunk: &Value) -> Result<Vec<ChatEvent>, String> {
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_owned);
            return Err(format!(
                "{IN_STREAM_ERROR}{message}{}",
                super::http::error_labels(error)
            ));
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| usage.is_object()) {
            let count = |field: &str| {
                usage
                    .get(field)
                    .and_then(Value::as_u64)
                    .map_or(0, |count| u32::try_from(count).unwrap_or(u32::MAX))
            };
            self.usage = Some(Usage {
                prompt_tokens: count("prompt_tokens"),
                completion_tokens: count("completion_tokens"),
            });
        }
        let mut events = Vec::new();
        let choices = chunk.get("choices").and_then(Value::as_array);
        // One answer is requested (n = 1): only the first choice counts.
        if let Some(choice) = choices.and_then(|choices| choices.first()) {
            self.push_choice(choice, &mut events)?;
        }
        Ok(events)
    }

    fn push_choice(&mut self, choice: &Value, events: &mut Vec<ChatEvent>) -> Result<(), String> {
        if let Some(delta) = choice.get("delta") {
            let text = |field: &str| {
                delta
                    .get(field)
                    .and_then(Value::as_str)
                    .filter(|text| !text.is_empty())
            };
            if let Some(reasoning) = text("reasoning_content").or_else(|| text("reasoning")) {
                events.push(ChatEvent::ReasoningDelta(reasoning.to_owned()));
            }
            if let Some(content) = text("content") {
                events.push(ChatEvent::TextDelta(content.to_owned()));
            }
            if let Some(fragments) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, fragment) in fragments.iter().enumerate() {
                    self.push_fragment(position, fragment, events)?;
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(finish_reason(reason));
            events.extend(self.take_calls());
        }
        Ok(())
    }

    fn push_fragment(
        &mut self,
        position: usize,
        fragment: &Value,
        events: &mut Vec<ChatEvent>,
    ) -> Result<(), String> {
        let index = self.fragment_index(position, fragment)?;
        let call = self.calls.entry(index).or_default();
        if let Some(id) = fragment.get("id").and_then(Value::as_str)
            && call.id.is_empty()
        {
            call.id = id.to_owned();
        }
        let function = fragment.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str)
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
        let added = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(arguments)) => arguments.clone(),
            // Some servers send the arguments as an object in one piece.
            Some(Value::Null) | None => String::new(),
            Some(arguments) => arguments.to_string(),
        };
        call.arguments.push_str(&added);
        if !added.is_empty() && !call.name.is_empty() {
            events.push(ChatEvent::ToolArgumentsDelta {
                index,
                name: call.name.clone(),
                fragment: added,
            });
        }
        Ok(())
    }

    /// Which call a fragment continues. Normally its `index`; but servers that omit the index
    /// (one complete call per fragment) or number every call 0 are recognised by a new `id`.
    fn fragment_index(&mut self, position: usize, fragment: &Value) -> Result<u64, String> {
        let id = fragment
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let next_free = self.calls.keys().next_back().map_or(0, |last| last + 1);
        let index_of_id = |calls: &BTreeMap<u64, PartialCall>, id: &str| {
            calls
                .iter()
                .find(|(_, call)| call.id == id)
                .map(|(index, _)| *index)
        };
        let Some(index) = fragment.get("index") else {
            return Ok(match id {
                Some(id) => index_of_id(&self.calls, id).unwrap_or(next_free),
                // No index and no id: a continuation of the latest call.
                None => self
                    .calls
                    .keys()
                    .next_back()
                    .copied()
                    .unwrap_or(position as u64),
            });
        };
        let index = index
            .as_u64()
            .ok_or_else(|| format!("tool call index is not a number: {index}"))?;
        let mut target = self.renumbered.get(&index).copied().unwrap_or(index);
        if let (Some(id), Some(call)) = (id, self.calls.get(&target))
            && !call.id.is_empty()
            && call.id != id
        {
            target = index_of_id(&self.calls, id).unwrap_or(next_free);
            self.renumbered.insert(index, target);
        }
        Ok(target)
    }

    fn id_prefix(&mut self) -> String {
        self.id_prefix.get_or_insert_with(call_id_prefix).clone()
    }

    /// The assembled tool calls, in index order.
    fn take_calls(&mut self) -> Vec<ChatEvent> {
        self.released_calls |= !self.calls.is_empty();
        self.renumbered.clear();
        std::mem::take(&mut self.calls)
            .into_iter()
            .map(|(index, call)| {
                ChatEvent::ToolCall(ToolCall {
                    id: if call.id.is_empty() {
                        format!("{}_{index}", self.id_prefix())
                    } else {
                        call.id
                    },
                    name: call.name,
                    arguments: if call.arguments.trim().is_empty() {
                        "{}".to_owned()
                    } else {
                        call.arguments
                    },
                })
            })
            .collect()
    }

    /// The end of the stream: calls not yet released, usage, and `Finished`.
    pub fn finish(&mut self) -> Vec<ChatEvent> {
        let mut events = self.take_calls();
        let called = self.released_calls;
        events.extend(self.usage.take().map(ChatEvent::Usage));
        let reason = match self.finish_reason.take() {
            // Some servers say `stop` after tool calls.
            Some(FinishReason::Stop) | None if called => FinishReason::ToolCalls,
            Some(reason) => reason,
            None => FinishReason::Stop,
        };
        events.push(ChatEvent::Finished(reason));
        events
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" | "eos" | "end_turn" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

#[cfg(test)]
mod tests;
