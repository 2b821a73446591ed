//! The Anthropic Messages API.
//!
//! Wire format: `POST {base_url}/messages` with `x-api-key`, `anthropic-version: 2023-06-01` and
//! `stream: true`; the system prompt is the top-level `system`, tool calls are `tool_use`
//! content blocks of assistant messages and their results `tool_result` blocks of user messages
//! (consecutive results merged into one user message, as the API wants roles to alternate).
//! The answer streams as SSE events: `message_start` (input tokens), `content_block_start`
//! (`text` | `tool_use` with id and name | `thinking`), `content_block_delta` (`text_delta`,
//! `input_json_delta` with `partial_json`, `thinking_delta`), `content_block_stop`,
//! `message_delta` (`stop_reason`, output tokens), `message_stop`, `ping`, and `error`.

use std::collections::{BTreeMap, VecDeque};

use futures::future::BoxFuture;
use serde_json::{Value, json};
use tracing::debug;

use super::config::{ProviderConfig, ToolMode};
use super::http::{SseBody, build_client, send};
use super::tool_modes::{ToolModeDecoder, rewrite_for_text_tools};
use super::{
    ChatEvent, ChatMessage, ChatModel, ChatRequest, ChatStream, FinishReason, LlmError, ToolCall,
    Usage,
};

/// The API version every request names.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// One Anthropic Messages endpoint.
pub struct AnthropicProvider {
    config: ProviderConfig,
    client: reqwest::Client,
    endpoint: String,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AnthropicProvider")
            .field("name", &self.config.name)
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    pub fn new(config: ProviderConfig) -> Result<Self, LlmError> {
        let client = build_client(&config)?;
        let endpoint = config.endpoint("messages");
        Ok(AnthropicProvider {
            config,
            client,
            endpoint,
        })
    }

    /// The JSON body for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        let rewritten;
        let native_tools = self.config.tool_mode == ToolMode::Native;
        let effective = if !native_tools && !request.tools.is_empty() {
            rewritten = rewrite_for_text_tools(request, self.config.tool_mode);
            &rewritten
        } else {
            request
        };
        let (system, messages) = wire_messages(&effective.messages);
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": request.max_tokens.unwrap_or(self.config.max_tokens),
            "stream": true,
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = json!(system);
        }
        if let Some(temperature) = request.temperature {
            body["temperature"] = json!(temperature);
        }
        if native_tools && !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": tool.parameters,
                    })
                })
                .collect();
        }
        body
    }

    async fn start(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        let body = self.request_body(&request);
        let mut http_request = self
            .client
            .post(&self.endpoint)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .json(&body);
        if let Some(api_key) = &self.config.api_key {
            http_request = http_request.header("x-api-key", api_key);
        }
        let response = send(&self.config.name, http_request).await?;
        debug!(provider = %self.config.name, "messages stream accepted");
        let state = AnthropicStream {
            provider: self.config.name.clone(),
            body: SseBody::new(&self.config.name, response),
            blocks: BTreeMap::new(),
            usage: Usage::default(),
            stop_reason: None,
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

impl ChatModel for AnthropicProvider {
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

/// The system prompt (system messages joined) and the messages as content blocks, consecutive
/// messages of one role merged.
fn wire_messages(messages: &[ChatMessage]) -> (String, Vec<Value>) {
    let mut system: Vec<&str> = Vec::new();
    let mut wire: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message {
            ChatMessage::System { content } => {
                system.push(content);
                continue;
            }
            ChatMessage::User { content } => ("user", text_block(content)),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                let mut blocks = text_block(content);
                blocks.extend(tool_calls.iter().map(tool_use_block));
                ("assistant", blocks)
            }
            ChatMessage::Tool {
                call_id, content, ..
            } => (
                "user",
                vec![json!({"type": "tool_result", "tool_use_id": call_id, "content": content})],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match wire.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => last_blocks.extend(blocks),
            _ => wire.push((role, blocks)),
        }
    }
    let messages = wire
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    (system.join("\n\n"), messages)
}

/// A text block, none for empty text (the API rejects empty text blocks).
fn text_block(text: &str) -> Vec<Value> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": text})]
    }
}

/// `tool_use` wants the input as an object: malformed argument text is sent as `{}` (the
/// tool's error observation already told the model).
fn tool_use_block(call: &ToolCall) -> Value {
    let input = serde_json::from_str::<Value>(&call.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// A content block being streamed, by its `index`.
#[derive(Debug)]
enum Block {
    Text,
    Thinking,
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

struct AnthropicStream {
    provider: String,
    body: SseBody,
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    stop_reason: Option<FinishReason>,
    decoder: ToolModeDecoder,
    pending: VecDeque<ChatEvent>,
    finished: bool,
}

impl AnthropicStream {
    async fn next(&mut self) -> Option<Result<ChatEvent, LlmError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.finished {
                return None;
            }
            let outcome = match self.body.next().await {
                Some(Ok(event)) => serde_json::from_str::<Value>(&event.data)
                    .map_err(|error| {
                        self.protocol_error(format!(
                            "event is not JSON ({error}): {:.200}",
                            event.data
                        ))
                    })
                    .and_then(|data| self.handle(&data)),
                Some(Err(error)) => Err(error),
                None => Err(self.protocol_error("stream ended before message_stop".to_owned())),
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

    /// One event's data in, the neutral events it completes out.
    fn handle(&mut self, data: &Value) -> Result<Vec<ChatEvent>, LlmError> {
        let kind = data.get("type").and_then(Value::as_str).unwrap_or_default();
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut events = Vec::new();
        match kind {
            "message_start" => {
                let usage = data.pointer("/message/usage");
                self.usage.prompt_tokens = input_tokens(usage);
                self.usage.completion_tokens = count(usage, "output_tokens");
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let text =
                    |field: &str| block.get(field).and_then(Value::as_str).unwrap_or_default();
                let started = match text("type") {
                    "text" => {
                        push_nonempty(&mut events, ChatEvent::TextDelta, text("text"));
                        Block::Text
                    }
                    "thinking" => {
                        push_nonempty(&mut events, ChatEvent::ReasoningDelta, text("thinking"));
                        Block::Thinking
                    }
                    "tool_use" => Block::ToolUse {
                        id: text("id").to_owned(),
                        name: text("name").to_owned(),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, started);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let text =
                    |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or_default();
                match text("type") {
                    "text_delta" => push_nonempty(&mut events, ChatEvent::TextDelta, text("text")),
                    "thinking_delta" => {
                        push_nonempty(&mut events, ChatEvent::ReasoningDelta, text("thinking"))
                    }
                    "input_json_delta" => match self.blocks.get_mut(&index) {
                        Some(Block::ToolUse { json, name, .. }) => {
                            let fragment = text("partial_json");
                            json.push_str(fragment);
                            if !fragment.is_empty() && !name.is_empty() {
                                events.push(ChatEvent::ToolArgumentsDelta {
                                    index,
                                    name: name.clone(),
                                    fragment: fragment.to_owned(),
                                });
                            }
                        }
                        _ => {
                            return Err(self.protocol_error(format!(
                                "input_json_delta for block {index}, which is not a tool_use"
                            )));
                        }
                    },
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(Block::ToolUse { id, name, json }) = self.blocks.remove(&index) {
                    events.push(ChatEvent::ToolCall(ToolCall {
                        id,
                        name,
                        arguments: if json.trim().is_empty() {
                            "{}".to_owned()
                        } else {
                            json
                        },
                    }));
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(stop_reason(reason));
                }
                let usage = data.get("usage");
                if usage.and_then(|usage| usage.get("output_tokens")).is_some() {
                    self.usage.completion_tokens = count(usage, "output_tokens");
                }
                if usage.and_then(|usage| usage.get("input_tokens")).is_some() {
                    self.usage.prompt_tokens = input_tokens(usage);
                }
            }
            "message_stop" => {
                self.finished = true;
                events.push(ChatEvent::Usage(self.usage));
                events.push(ChatEvent::Finished(
                    self.stop_reason.unwrap_or(FinishReason::Stop),
                ));
            }
            "error" => return Err(self.stream_error(data)),
            // `ping` and event types added later.
            _ => {}
        }
        Ok(events)
    }

    /// An `error` event: overloaded and API errors are statuses worth retrying elsewhere.
    fn stream_error(&self, data: &Value) -> LlmError {
        let kind = data
            .pointer("/error/type")
            .and_then(Value::as_str)
            .unwrap_or("error");
        let message = data
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no message");
        let status = match kind {
            "overloaded_error" => Some(529),
            "api_error" => Some(500),
            "rate_limit_error" => Some(429),
            _ => None,
        };
        match status {
            Some(status) => LlmError::Status {
                provider: self.provider.clone(),
                status,
                message: format!("{kind}: {message}"),
            },
            None => self.protocol_error(format!("{kind}: {message}")),
        }
    }

    fn protocol_error(&self, message: String) -> LlmError {
        LlmError::Protocol {
            provider: self.provider.clone(),
            message,
        }
    }
}

fn push_nonempty(events: &mut Vec<ChatEvent>, event: fn(String) -> ChatEvent, text: &str) {
    if !text.is_empty() {
        events.push(event(text.to_owned()));
    }
}

fn count(usage: Option<&Value>, field: &str) -> u32 {
    usage
        .and_then(|usage| usage.get(field))
        .and_then(Value::as_u64)
        .map_or(0, |count| u32::try_from(count).unwrap_or(u32::MAX))
}

/// Prompt tokens including those read from or written to the prompt cache.
fn input_tokens(usage: Option<&Value>) -> u32 {
    [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .iter()
    .fold(0u32, |total, field| {
        total.saturating_add(count(usage, field))
    })
}

fn stop_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" | "stop_sequence" | "pause_turn" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

#[cfg(test)]
mod tests;
