//! Chat model clients behind one neutral format.
//!
//! Every provider (OpenAI-compatible chat completions, Anthropic Messages) and the router over
//! them implement [`ChatModel`]: a [`ChatRequest`] in, a stream of [`ChatEvent`]s out. The
//! stream is already aggregated: a tool call arrives as one [`ChatEvent::ToolCall`] with its
//! complete argument text however many chunks carried it, and providers whose models cannot
//! call tools natively turn calls written as JSON in the text (or JSON steps constrained by
//! `response_format`) into the same events. The agent never sees a wire format.
//!
//! Dropping a [`ChatStream`] cancels the request (the HTTP connection is closed).
//!
//! Modules: [`config`] (providers and routing settings; [`build_router`] builds from it), [`openai`] and [`anthropic`] (the two
//! wire formats), [`tool_modes`] (tool calls for models without native tool calling),
//! [`router`] (priority, retries, failover, circuit breakers, first-token probing) and [`sse`].
//!
//! Metrics (recorded by the router, label `provider` = the provider's configured name):
//! `sift_llm_requests_total{provider, outcome}` (one per attempt; `ok`, `error`, `timeout`,
//! `circuit_open`, `cancelled`), `sift_llm_request_seconds`, `sift_llm_first_token_seconds`,
//! `sift_llm_tokens_total{provider, direction = in | out}`, `sift_llm_failovers_total` and
//! `sift_llm_circuit_state` (0 closed, 1 open, 2 half-open). [`describe_metrics`] describes them.

pub mod anthropic;
mod build;
pub mod config;
mod http;

pub(crate) use http::error_detail;
pub mod openai;
pub mod router;
pub mod sse;
pub mod tool_modes;

pub use anthropic::AnthropicProvider;
pub use build::{build_provider, build_router};
pub use config::{LlmConfig, ProviderConfig, ProviderKind, ToolMode};
pub use openai::OpenAiProvider;
pub use router::{CircuitState, LlmRouter, RouteSettings};

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// One message of a conversation in the neutral format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    System {
        content: String,
    },
    User {
        content: String,
    },
    /// What the model said: text and/or tool calls.
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, answered to the model.
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

/// A complete tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-given id (or one made up for calls parsed from text).
    pub id: String,
    pub name: String,
    /// The argument object as the model wrote it (JSON text, possibly malformed: the agent
    /// answers malformed arguments with a tool-error observation).
    pub arguments: String,
}

/// A tool offered to the model: a name, what it does, and a JSON Schema for its arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
}

/// Token counts as the provider reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn (with or without tool calls).
    Stop,
    /// The model stopped to call tools.
    ToolCalls,
    /// `max_tokens` reached.
    Length,
    /// Refused by the provider's content filter.
    ContentFilter,
    Other,
}

/// One event of a model's streamed answer, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatEvent {
    /// Visible answer text.
    TextDelta(String),
    /// Reasoning text (`reasoning_content`, Anthropic `thinking` blocks).
    ReasoningDelta(String),
    /// A piece of a tool call's arguments (JSON text) as the model writes it, once the call's
    /// name is known: the agent streams a `final_answer` from these. The whole call still
    /// comes as [`ChatEvent::ToolCall`]; `index` tells the calls of one answer apart.
    ToolArgumentsDelta {
        index: u64,
        name: String,
        fragment: String,
    },
    /// A complete tool call (arguments aggregated across chunks).
    ToolCall(ToolCall),
    Usage(Usage),
    /// Last event of a successful stream.
    Finished(FinishReason),
}

/// Why a model call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LlmError {
    #[error("{provider}: could not connect: {message}")]
    Connect { provider: String, message: String },
    #[error("{provider}: timed out ({what})")]
    Timeout { provider: String, what: String },
    #[error("{provider}: HTTP {status}: {message}")]
    Status {
        provider: String,
        status: u16,
        message: String,
    },
    /// The provider answered something that does not fit its wire format.
    #[error("{provider}: bad response: {message}")]
    Protocol { provider: String, message: String },
    /// The provider's circuit breaker is open.
    #[error("{provider}: circuit open")]
    CircuitOpen { provider: String },
    /// Every provider failed (the router's error); each provider's last error in order.
    #[error("all model providers failed: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    AllFailed(Vec<LlmError>),
    #[error("model configuration: {0}")]
    Config(String),
}

impl LlmError {
    /// Worth another attempt (same or next provider): connect errors, timeouts, 408/429/5xx,
    /// broken streams.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Connect { .. } | LlmError::Timeout { .. } => true,
            LlmError::Status { status, .. } => matches!(status, 408 | 409 | 425 | 429 | 500..=599),
            // The same prompt overflows the same model again.
            LlmError::Protocol { message, .. } => !is_overflow_in_stream(message),
            LlmError::CircuitOpen { .. } => true,
            LlmError::AllFailed(_) | LlmError::Config(_) => false,
        }
    }

    /// The provider refused the prompt as longer than its context window: an
    /// OpenAI-compatible 400 ("maximum context length", `context_length_exceeded`), llama.cpp's
    /// "exceeds the available context size", Anthropic's "prompt is too long", or the same
    /// said as an error event inside the stream. For the router's error: any provider's. A
    /// shorter prompt can succeed where a retry of the same one cannot.
    pub fn is_context_overflow(&self) -> bool {
        match self {
            LlmError::Status {
                status, message, ..
            } => matches!(status, 400 | 413 | 422) && is_overflow_message(message),
            LlmError::Protocol { message, .. } => is_overflow_in_stream(message),
            LlmError::AllFailed(errors) => errors.iter().any(LlmError::is_context_overflow),
            LlmError::Connect { .. }
            | LlmError::Timeout { .. }
            | LlmError::CircuitOpen { .. }
            | LlmError::Config(_) => false,
        }
    }
}

/// How providers word a prompt longer than the context window (lowercase).
const OVERFLOW_PHRASES: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "exceed_context_size",
    "exceeds the available context size",
    "too many tokens",
    "prompt is too long",
    "input is too long",
    "reduce the length of the messages",
];

/// An error event inside a stream (OpenAI-compatible `{"error": ...}` chunks, Anthropic
/// `invalid_request_error` events) that says the prompt overflowed; other protocol errors
/// (broken chunks that may quote model text) never count.
fn is_overflow_in_stream(message: &str) -> bool {
    (message.starts_with(openai::IN_STREAM_ERROR) || message.starts_with("invalid_request_error"))
        && is_overflow_message(message)
}

fn is_overflow_message(message: &str) -> bool {
    let message = message.to_lowercase();
    OVERFLOW_PHRASES
        .iter()
        .any(|phrase| message.contains(phrase))
}

pub type ChatStream = Pin<Box<dyn Stream<Item = Result<ChatEvent, LlmError>> + Send>>;

/// A chat model: one provider, or a router over several.
pub trait ChatModel: Send + Sync {
    /// Name for logs, metrics and traces.
    fn name(&self) -> &str;
    /// The model's context window in tokens (what context management budgets against).
    fn context_window(&self) -> u32;
    /// Starts a streamed completion. Resolves once the request is accepted; for the router,
    /// once the first event arrived (first-token probing), so a provider failing before its
    /// first token is failed over without any output reaching the caller.
    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>>;
}

pub type SharedChatModel = Arc<dyn ChatModel>;

/// Describes the model metrics (call once at startup, after installing the recorder).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sift_llm_requests_total",
        metrics::Unit::Count,
        "Model request attempts by provider and outcome (ok, error, timeout, circuit_open, cancelled)"
    );
    metrics::describe_histogram!(
        "sift_llm_request_seconds",
        metrics::Unit::Seconds,
        "Model request attempts from sending to the end of the stream (or the failure)"
    );
    metrics::describe_histogram!(
        "sift_llm_first_token_seconds",
        metrics::Unit::Seconds,
        "Time from sending a model request to its first streamed event"
    );
    metrics::describe_counter!(
        "sift_llm_tokens_total",
        metrics::Unit::Count,
        "Tokens reported by the providers, by direction (in = prompt, out = completion)"
    );
    metrics::describe_counter!(
        "sift_llm_failovers_total",
        metrics::Unit::Count,
        "Requests moved to the next provider after one failed before its first token"
    );
    metrics::describe_gauge!(
        "sift_llm_circuit_state",
        metrics::Unit::Count,
        "Circuit breaker state per provider: 0 closed, 1 open, 2 half-open"
    );
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(status: u16, body: serde_json::Value) -> LlmError {
        LlmError::Status {
            provider: "p".into(),
            status,
            message: http::error_message(body.to_string().as_bytes()),
        }
    }

    #[test]
    fn context_overflows_are_recognised_and_not_retried() {
        let openai = refused(
            400,
            json!({"error": {"message": "Please shorten your prompt.", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
        );
        let vllm = refused(
            400,
            json!({"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."}}),
        );
        let llama_cpp = refused(
            400,
            json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}}),
        );
        let anthropic = refused(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
        );
        for error in [&openai, &vllm, &llama_cpp, &anthropic] {
            assert!(error.is_context_overflow(), "{error}");
            assert!(!error.is_retryable(), "{error}");
        }
        assert!(llama_cpp.to_string().contains("n_ctx 4096"), "{llama_cpp}");
        assert!(openai.to_string().contains("context_length_exceeded"));
        let routed = LlmError::AllFailed(vec![
            LlmError::Timeout {
                provider: "a".into(),
                what: "first token".into(),
            },
            llama_cpp.clone(),
        ]);
        assert!(routed.is_context_overflow());
        // Said inside the stream: an error event, never a broken chunk quoting model text.
        let in_stream = LlmError::Protocol {
            provider: "p".into(),
            message: format!("{}maximum context length exceeded", openai::IN_STREAM_ERROR),
        };
        assert!(in_stream.is_context_overflow() && !in_stream.is_retryable());
        let broken = LlmError::Protocol {
            provider: "p".into(),
            message: "chunk is not JSON: the context window of".into(),
        };
        assert!(!broken.is_context_overflow() && broken.is_retryable());
        // Other refusals are not overflows.
        for other in [
            refused(400, json!({"error": {"message": "unknown model fake"}})),
            refused(
                401,
                json!({"error": {"message": "maximum context length is 4096 tokens"}}),
            ),
            refused(503, json!({"error": {"message": "overloaded"}})),
        ] {
            assert!(!other.is_context_overflow(), "{other}");
        }
    }
}
