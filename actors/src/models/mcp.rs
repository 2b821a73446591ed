//! Client for remote MCP servers over the streamable HTTP transport (JSON-RPC 2.0:
//! `initialize`, `notifications/initialized`, `tools/list`, `tools/call`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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
