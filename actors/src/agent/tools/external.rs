//! Tools of services configured per preset (web search, remote MCP servers): a name, a spec
//! and a call. Their output is data like any other observation; it holds no chunks, so it
//! cannot be cited as knowledge-base evidence.

use futures::future::BoxFuture;

use super::{ToolError, ToolOutput};
use crate::models::llm::ToolSpec;

pub trait ExternalTool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    /// The `tool` label of `sift_agent_tool_calls_total` (`web_search`, `mcp`).
    fn label(&self) -> &'static str;
    fn call(&self, arguments: serde_json::Value) -> BoxFuture<'_, Result<ToolOutput, ToolError>>;
}
