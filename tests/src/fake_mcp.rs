//! A fake remote MCP server for the integration tests: a real HTTP server (axum, port 0)
//! speaking the streamable HTTP transport with JSON responses: JSON-RPC 2.0 `initialize`
//! (assigning an `Mcp-Session-Id`), `notifications/initialized` (202), `tools/list` and
//! `tools/call`. It offers one tool, `lookup_price` {item}, answering from a fixed price list.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

const SESSION: &str = "fake-mcp-session-1";

#[derive(Default)]
struct McpState {
    /// Every JSON-RPC message received, with the session header it carried.
    received: Mutex<Vec<(Option<String>, Value)>>,
}

pub struct FakeMcp {
    address: SocketAddr,
    state: Arc<McpState>,
}

impl FakeMcp {
    pub async fn start() -> FakeMcp {
        let state = Arc::new(McpState::default());
        let router = Router::new()
            .route("/mcp", post(handle))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the fake MCP server");
        let address = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        FakeMcp { address, state }
    }

    /// The MCP endpoint URL.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.address)
    }

    /// The `params` of every `tools/call` received.
    pub fn tool_calls(&self) -> Vec<Value> {
        self.state
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, message)| message["method"] == "tools/call")
            .map(|(_, message)| message["params"].clone())
            .collect()
    }

    /// Whether every request after `initialize` carried the assigned session id.
    pub fn sessions_kept(&self) -> bool {
        self.state
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, message)| message["method"] != "initialize")
            .all(|(session, _)| session.as_deref() == Some(SESSION))
    }
}

/// The price of an item, in euros.
pub fn price_of(item: &str) -> u32 {
    match item.to_lowercase().as_str() {
        "widget" => 4711,
        "gadget" => 99,
        _ => 0,
    }
}

async fn handle(
    State(state): State<Arc<McpState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "jsonrpc": "2.0", "id": null,
                "error": { "code": -32700, "message": "parse error" } })),
        )
            .into_response();
    };
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    state
        .received
        .lock()
        .unwrap()
        .push((session, message.clone()));
    let id = message["id"].clone();
    let method = message["method"].as_str().unwrap_or("");
    if id.is_null() {
        return StatusCode::ACCEPTED.into_response(); // a notification
    }
    let result = match method {
        "initialize" => json!({
            "protocolVersion": message["params"]["protocolVersion"].as_str().unwrap_or("2025-03-26"),
            "capabilities": { "tools": { "listChanged": false } },
            "serverInfo": { "name": "fake-prices", "version": "1.0.0" },
        }),
        "tools/list" => json!({ "tools": [{
            "name": "lookup_price",
            "description": "The current price of an item, in euros.",
            "inputSchema": {
                "type": "object",
                "properties": { "item": { "type": "string" } },
                "required": ["item"],
            },
        }]}),
        "tools/call" => {
            let item = message["params"]["arguments"]["item"]
                .as_str()
                .unwrap_or("");
            let price = price_of(item);
            if price == 0 {
                json!({ "content": [{ "type": "text", "text": format!("no price for {item:?}") }],
                        "isError": true })
            } else {
                json!({ "content": [{ "type": "text",
                                      "text": format!("The price of {item} is {price} euros.") }],
                        "isError": false })
            }
        }
        other => {
            return axum::Json(json!({ "jsonrpc": "2.0", "id": id,
                "error": { "code": -32601, "message": format!("method not found: {other}") } }))
            .into_response();
        }
    };
    let mut response =
        axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response();
    if method == "initialize" {
        response
            .headers_mut()
            .insert("mcp-session-id", SESSION.parse().unwrap());
    }
    response
}
