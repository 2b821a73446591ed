//! Client for remote MCP servers over the streamable HTTP transport (JSON-RPC 2.0:
//! `initialize`, `notifications/initialized`, `tools/list`, `tools/call`).
//!
//! Every message is a `POST` to the server's endpoint with
//! `Accept: application/json, text/event-stream`; the server answers a request with a JSON body
//! or with an SSE stream carrying the JSON-RPC response (possibly after notifications of its
//! own), and a notification with `202 Accepted`. The `Mcp-Session-Id` the server assigns at
//! `initialize` is sent with every later message. Each exchange has the configured timeout.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{debug, instrument};

use super::llm::ToolSpec;
use super::llm::sse::SseParser;
use crate::error_chain;

/// One MCP server of an agent preset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of its tools' names as the model sees them (`{name}__{tool}`).
    pub name: String,
    /// The server's MCP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
    pub url: String,
    /// Extra headers (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_mcp_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_mcp_timeout_ms() -> u64 {
    30_000
}

/// The protocol revision this client speaks.
pub const PROTOCOL_VERSION: &str = "2025-03-26";

/// Header carrying the server-assigned session id.
const SESSION_HEADER: &str = "mcp-session-id";

/// Response bodies are cut to this many characters in error messages.
const MAX_ERROR_BODY_CHARS: usize = 300;

/// Why talking to an MCP server failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum McpError {
    #[error("mcp server {server}: could not connect: {message}")]
    Connect { server: String, message: String },
    #[error("mcp server {server}: {method} timed out after {timeout_ms} ms")]
    Timeout {
        server: String,
        method: String,
        timeout_ms: u64,
    },
    #[error("mcp server {server}: HTTP {status} for {method}: {message}")]
    Http {
        server: String,
        method: String,
        status: u16,
        message: String,
    },
    /// A JSON-RPC error answer.
    #[error("mcp server {server}: {method} failed with JSON-RPC error {code}: {message}")]
    Rpc {
        server: String,
        method: String,
        code: i64,
        message: String,
    },
    /// The server answered something that is not MCP.
    #[error("mcp server {server}: bad response to {method}: {message}")]
    Protocol {
        server: String,
        method: String,
        message: String,
    },
}

impl McpError {
    /// Worth trying again later: connection failures, timeouts, 429 and 5xx.
    pub fn is_transient(&self) -> bool {
        match self {
            McpError::Connect { .. } | McpError::Timeout { .. } => true,
            McpError::Http { status, .. } => *status == 429 || *status >= 500,
            McpError::Rpc { .. } | McpError::Protocol { .. } => false,
        }
    }
}

/// What a tool call returned: its text content items joined, and whether the tool reported
/// an error (`isError`; the model sees it as a failed observation, not a broken server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpToolResult {
    pub text: String,
    pub is_error: bool,
}

/// A connected MCP server (after `initialize` and `notifications/initialized`).
pub struct McpClient {
    config: McpServerConfig,
    client: reqwest::Client,
    /// Replaced when the server forgets the session and the client opens a new one.
    session: Mutex<Session>,
    next_id: AtomicU64,
}

#[derive(Clone, Debug, Default)]
struct Session {
    id: Option<String>,
    /// The protocol version the server agreed to.
    protocol_version: String,
    server_name: String,
}

impl std::fmt::Debug for McpClient {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("McpClient")
            .field("name", &self.config.name)
            .field("url", &self.config.url)
            .field("session", &self.session())
            .finish_non_exhaustive()
    }
}

impl McpClient {
    /// Opens a session: `initialize`, remembering the `Mcp-Session-Id` the server assigns,
    /// then `notifications/initialized`.
    #[instrument(skip_all, fields(server = %config.name, url = %config.url))]
    pub async fn connect(config: &McpServerConfig) -> Result<McpClient, McpError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.timeout_ms.clamp(1, 10_000)))
            .build()
            .map_err(|error| McpError::Connect {
                server: config.name.clone(),
                message: format!("http client: {error}"),
            })?;
        let mcp = McpClient {
            config: config.clone(),
            client,
            session: Mutex::new(Session::default()),
            next_id: AtomicU64::new(1),
        };
        mcp.initialize().await?;
        Ok(mcp)
    }

    /// `initialize` without a session id, then `notifications/initialized` in the new session.
    async fn initialize(&self) -> Result<(), McpError> {
        *self.lock_session() = Session::default();
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "sift", "version": env!("CARGO_PKG_VERSION")},
        });
        let (result, session_id) = self.exchange("initialize", &params).await?;
        let session = Session {
            id: session_id,
            protocol_version: result
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or(PROTOCOL_VERSION)
                .to_owned(),
            server_name: result
                .pointer("/serverInfo/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        debug!(server_name = %session.server_name, session = session.id.is_some(), "mcp session opened");
        *self.lock_session() = session;
        self.notify("notifications/initialized").await
    }

    fn lock_session(&self) -> std::sync::MutexGuard<'_, Session> {
        self.session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn session(&self) -> Session {
        self.lock_session().clone()
    }

    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// The server's own name from `serverInfo`.
    pub fn server_name(&self) -> String {
        self.session().server_name
    }

    /// The name the model sees for one of this server's tools: `{config.name}__{tool}`.
    pub fn qualified_name(&self, tool: &str) -> String {
        format!("{}__{tool}", self.config.name)
    }

    /// Every tool the server offers (`tools/list`, following `nextCursor`), with the server's
    /// own names; `inputSchema` becomes the spec's `parameters`.
    #[instrument(skip_all, fields(server = %self.config.name))]
    pub async fn tools(&self) -> Result<Vec<ToolSpec>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        // A server repeating a cursor would loop for ever: cap the pages.
        for _page in 0..MAX_TOOL_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({"cursor": cursor}),
                None => json!({}),
            };
            let (result, _) = self.request("tools/list", params).await?;
            let listed = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| self.protocol_error("tools/list", "result has no tools array"))?;
            for tool in listed {
                tools.push(self.tool_spec(tool)?);
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .filter(|cursor| !cursor.is_empty())
                .map(str::to_owned);
            if cursor.is_none() {
                return Ok(tools);
            }
        }
        Err(self.protocol_error(
            "tools/list",
            &format!("more than {MAX_TOOL_PAGES} pages of tools"),
        ))
    }

    /// Calls one tool (by the server's name for it) with `arguments` (a JSON object).
    #[instrument(skip_all, fields(server = %self.config.name, tool = name))]
    pub async fn call(&self, name: &str, arguments: Value) -> Result<McpToolResult, McpError> {
        let arguments = if arguments.is_null() {
            json!({})
        } else {
            arguments
        };
        let (result, _) = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        let is_error = result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let content = result
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| self.protocol_error("tools/call", "result has no content array"))?;
        let mut parts: Vec<String> = content.iter().filter_map(content_text).collect();
        if parts.is_empty()
            && let Some(structured) = result.get("structuredContent")
        {
            parts.push(structured.to_string());
        }
        Ok(McpToolResult {
            text: parts.join("\n"),
            is_error,
        })
    }

    fn tool_spec(&self, tool: &Value) -> Result<ToolSpec, McpError> {
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .ok_or_else(|| self.protocol_error("tools/list", "a tool has no name"))?;
        Ok(ToolSpec {
            name: name.to_owned(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            parameters: tool
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"})),
        })
    }

    /// One JSON-RPC request: its `result`. A server that answers 404 to a request carrying a
    /// session id has forgotten the session: a new one is opened and the request sent again,
    /// once (as the transport specification asks).
    async fn request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Option<String>), McpError> {
        let had_session = self.session().id.is_some();
        match self.exchange(method, &params).await {
            Err(McpError::Http { status: 404, .. }) if had_session => {
                debug!(method, "mcp session expired, opening a new one");
                self.initialize().await?;
                self.exchange(method, &params).await
            }
            outcome => outcome,
        }
    }

    /// One request within the configured timeout: its `result` and the session id header of
    /// the answer, if any.
    async fn exchange(
        &self,
        method: &str,
        params: &Value,
    ) -> Result<(Value, Option<String>), McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let exchange = async {
            let response = self.post(method, &message).await?;
            let session_id = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            let answer = self.read_answer(method, id, response).await?;
            Ok((self.result_of(method, answer)?, session_id))
        };
        tokio::time::timeout(Duration::from_millis(self.config.timeout_ms), exchange)
            .await
            .unwrap_or_else(|_elapsed| Err(self.timeout_error(method)))
    }

    /// A notification (no id, no answer expected beyond 202 Accepted).
    async fn notify(&self, method: &str) -> Result<(), McpError> {
        let message = json!({"jsonrpc": "2.0", "method": method});
        tokio::time::timeout(
            Duration::from_millis(self.config.timeout_ms),
            self.post(method, &message),
        )
        .await
        .unwrap_or_else(|_elapsed| Err(self.timeout_error(method)))
        .map(drop)
    }

    async fn post(&self, method: &str, message: &Value) -> Result<reqwest::Response, McpError> {
        let mut request = self
            .client
            .post(&self.config.url)
            .header("accept", "application/json, text/event-stream")
            .json(message);
        for (name, value) in &self.config.headers {
            request = request.header(name, value);
        }
        let session = self.session();
        if let Some(session_id) = &session.id {
            request = request
                .header(SESSION_HEADER, session_id)
                .header("mcp-protocol-version", &session.protocol_version);
        }
        let response = request.send().await.map_err(|error| McpError::Connect {
            server: self.config.name.clone(),
            message: error_chain(&error),
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(McpError::Http {
            server: self.config.name.clone(),
            method: method.to_owned(),
            status: status.as_u16(),
            message: body_message(&body),
        })
    }

    /// The JSON-RPC answer with `id`, from a JSON body or an SSE stream (which may carry
    /// notifications and requests from the server before it).
    async fn read_answer(
        &self,
        method: &str,
        id: u64,
        mut response: reqwest::Response,
    ) -> Result<Value, McpError> {
        let is_stream = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        if !is_stream {
            let body = response.bytes().await.map_err(|error| {
                self.protocol_error(
                    method,
                    &format!("reading the body: {}", error_chain(&error)),
                )
            })?;
            let value: Value = serde_json::from_slice(&body).map_err(|error| {
                self.protocol_error(
                    method,
                    &format!("not JSON ({error}): {}", body_message(&body)),
                )
            })?;
            return find_answer(value, id)
                .ok_or_else(|| self.protocol_error(method, "no answer with the request's id"));
        }
        let mut parser = SseParser::new();
        loop {
            let chunk = response.chunk().await.map_err(|error| {
                self.protocol_error(method, &format!("stream broken: {}", error_chain(&error)))
            })?;
            let ended = chunk.is_none();
            let events = match chunk {
                Some(bytes) => parser.push(&bytes),
                None => parser.finish().into_iter().collect(),
            };
            if parser.buffered_bytes() > MAX_EVENT_BYTES {
                return Err(self
                    .protocol_error(method, &format!("an event exceeds {MAX_EVENT_BYTES} bytes")));
            }
            for event in events {
                let Ok(value) = serde_json::from_str::<Value>(&event.data) else {
                    continue;
                };
                if let Some(answer) = find_answer(value, id) {
                    return Ok(answer);
                }
            }
            if ended {
                return Err(self.protocol_error(method, "stream ended without an answer"));
            }
        }
    }

    fn result_of(&self, method: &str, answer: Value) -> Result<Value, McpError> {
        if let Some(error) = answer.get("error") {
            return Err(McpError::Rpc {
                server: self.config.name.clone(),
                method: method.to_owned(),
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("no message")
                    .to_owned(),
            });
        }
        answer
            .get("result")
            .cloned()
            .ok_or_else(|| self.protocol_error(method, "answer has neither result nor error"))
    }

    fn protocol_error(&self, method: &str, message: &str) -> McpError {
        McpError::Protocol {
            server: self.config.name.clone(),
            method: method.to_owned(),
            message: message.to_owned(),
        }
    }

    fn timeout_error(&self, method: &str) -> McpError {
        McpError::Timeout {
            server: self.config.name.clone(),
            method: method.to_owned(),
            timeout_ms: self.config.timeout_ms,
        }
    }
}

/// Largest single SSE event accepted.
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Pages of `tools/list` followed at most.
const MAX_TOOL_PAGES: usize = 100;

/// The JSON-RPC response with `id` in a message or a batch of messages.
fn find_answer(value: Value, id: u64) -> Option<Value> {
    let is_answer = |message: &Value| {
        message.get("id").and_then(Value::as_u64) == Some(id)
            && (message.get("result").is_some() || message.get("error").is_some())
    };
    match value {
        Value::Array(messages) => messages.into_iter().find(is_answer),
        message if is_answer(&message) => Some(message),
        _ => None,
    }
}

/// The text of one content item: `text` items, and the text of embedded resources; other kinds
/// (images, audio) are named so the model knows something was there.
fn content_text(item: &Value) -> Option<String> {
    match item.get("type").and_then(Value::as_str)? {
        "text" => item.get("text").and_then(Value::as_str).map(str::to_owned),
        "resource" => item
            .pointer("/resource/text")
            .and_then(Value::as_str)
            .map(str::to_owned),
        other => Some(format!("[{other} content]")),
    }
}

/// A JSON-RPC error message in the body, or the start of the body.
fn body_message(body: &[u8]) -> String {
    let from_json = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| {
            value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
    let text = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text: String = text.trim().chars().take(MAX_ERROR_BODY_CHARS).collect();
    if text.is_empty() {
        "empty body".to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests;
