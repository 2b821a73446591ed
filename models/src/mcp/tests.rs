//! Tests against a real HTTP server speaking MCP's streamable HTTP transport.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::*;

/// The session id of the first session.
const SESSION: &str = "session-1";

#[derive(Clone, Debug)]
struct Recorded {
    method: String,
    session: Option<String>,
    protocol_version: Option<String>,
    authorization: Option<String>,
    accept: Option<String>,
}

#[derive(Default)]
struct FakeMcp {
    requests: Mutex<Vec<Recorded>>,
    /// Sessions opened so far; only the last one is live (the `forget` tool ends it).
    sessions: Mutex<u32>,
    live: Mutex<Option<String>>,
}

async fn start() -> (SocketAddr, Arc<FakeMcp>) {
    let state = Arc::new(FakeMcp::default());
    let router = Router::new()
        .route("/mcp", post(handle))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (address, state)
}

fn config(address: SocketAddr) -> McpServerConfig {
    McpServerConfig {
        name: "docs".to_owned(),
        url: format!("http://{address}/mcp"),
        headers: BTreeMap::from([("authorization".to_owned(), "Bearer mcp-token".to_owned())]),
        timeout_ms: 2_000,
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

fn json_response(value: Value) -> Response {
    ([("content-type", "application/json")], value.to_string()).into_response()
}

/// Answers as an SSE stream: a log notification from the server first, then the answer.
fn sse_response(answer: Value) -> Response {
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/message",
                              "params": {"level": "info", "data": "listing"}});
    let body =
        format!("event: message\ndata: {notification}\n\nevent: message\ndata: {answer}\n\n");
    ([("content-type", "text/event-stream")], body).into_response()
}

async fn handle(State(state): State<Arc<FakeMcp>>, headers: HeaderMap, body: String) -> Response {
    let message: Value = serde_json::from_str(&body).unwrap();
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let session = header(&headers, "mcp-session-id");
    state.requests.lock().unwrap().push(Recorded {
        method: method.clone(),
        session: session.clone(),
        protocol_version: header(&headers, "mcp-protocol-version"),
        authorization: header(&headers, "authorization"),
        accept: header(&headers, "accept"),
    });
    if method == "initialize" {
        assert_eq!(message["params"]["protocolVersion"], "2025-03-26");
        let result = json!({"jsonrpc": "2.0", "id": id, "result": {
            "protocolVersion": "2025-03-26",
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "fake-docs-server", "version": "1.0.0"},
        }});
        let mut opened = state.sessions.lock().unwrap();
        *opened += 1;
        let id = format!("session-{opened}");
        *state.live.lock().unwrap() = Some(id.clone());
        let mut response = json_response(result);
        response
            .headers_mut()
            .insert("mcp-session-id", id.parse().unwrap());
        return response;
    }
    if session.is_none() {
        return (StatusCode::BAD_REQUEST, "missing session").into_response();
    }
    if session != *state.live.lock().unwrap() {
        return (StatusCode::NOT_FOUND, "unknown session").into_response();
    }
    let answer = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
    match method.as_str() {
        "notifications/initialized" => StatusCode::ACCEPTED.into_response(),
        "tools/list" => match message["params"]["cursor"].as_str() {
            None => sse_response(answer(json!({
                "tools": [{"name": "lookup", "description": "Looks a term up",
                           "inputSchema": {"type": "object", "properties": {"term": {"type": "string"}},
                                           "required": ["term"]}}],
                "nextCursor": "page-2",
            }))),
            Some("page-2") => sse_response(answer(json!({
                "tools": [{"name": "slow", "inputSchema": {"type": "object"}}],
            }))),
            Some(other) => json_response(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32602, "message": format!("bad cursor {other}")}})),
        },
        "tools/call" => {
            let arguments = &message["params"]["arguments"];
            match message["params"]["name"].as_str().unwrap_or_default() {
                "lookup" if arguments["term"] == "missing" => json_response(answer(json!({
                    "content": [{"type": "text", "text": "no entry for missing"}],
                    "isError": true,
                }))),
                "lookup" => json_response(answer(json!({
                    "content": [
                        {"type": "text", "text": format!("{}: a consensus protocol", arguments["term"].as_str().unwrap_or_default())},
                        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                        {"type": "text", "text": "see also: paxos"},
                    ],
                }))),
                "forget" => {
                    *state.live.lock().unwrap() = None;
                    json_response(answer(
                        json!({"content": [{"type": "text", "text": "forgotten"}]}),
                    ))
                }
                "slow" => {
                    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                    json_response(answer(json!({"content": []})))
                }
                other => json_response(json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32602, "message": format!("Unknown tool: {other}")}})),
            }
        }
        _ => json_response(json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32601, "message": "Method not found"}})),
    }
}

#[tokio::test]
async fn a_session_lists_tools_across_pages_and_calls_one() {
    let (address, state) = start().await;

    let client = McpClient::connect(&config(address)).await.unwrap();
    let tools = client.tools().await.unwrap();
    let result = client
        .call("lookup", json!({"term": "raft"}))
        .await
        .unwrap();

    assert_eq!(client.server_name(), "fake-docs-server");
    assert_eq!(client.qualified_name("lookup"), "docs__lookup");
    assert_eq!(
        tools,
        vec![
            ToolSpec {
                name: "lookup".to_owned(),
                description: "Looks a term up".to_owned(),
                parameters: json!({"type": "object", "properties": {"term": {"type": "string"}},
                                   "required": ["term"]}),
            },
            ToolSpec {
                name: "slow".to_owned(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            },
        ]
    );
    assert_eq!(
        result,
        McpToolResult {
            text: "raft: a consensus protocol\n[image content]\nsee also: paxos".to_owned(),
            is_error: false,
        }
    );
    let requests = state.requests.lock().unwrap().clone();
    let methods: Vec<&str> = requests
        .iter()
        .map(|request| request.method.as_str())
        .collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/list",
            "tools/call"
        ]
    );
    assert_eq!(requests[0].session, None);
    for request in &requests[1..] {
        assert_eq!(request.session.as_deref(), Some(SESSION));
        assert_eq!(request.protocol_version.as_deref(), Some("2025-03-26"));
    }
    for request in &requests {
        assert_eq!(request.authorization.as_deref(), Some("Bearer mcp-token"));
        assert_eq!(
            request.accept.as_deref(),
            Some("application/json, text/event-stream")
        );
    }
}

#[tokio::test]
async fn tool_errors_rpc_errors_and_timeouts_are_told_apart() {
    let (address, _state) = start().await;
    let client = McpClient::connect(&McpServerConfig {
        timeout_ms: 1_500,
        ..config(address)
    })
    .await
    .unwrap();

    let failed = client
        .call("lookup", json!({"term": "missing"}))
        .await
        .unwrap();
    assert_eq!(
        failed,
        McpToolResult {
            text: "no entry for missing".to_owned(),
            is_error: true,
        }
    );

    let error = client.call("delete_all", json!({})).await.unwrap_err();
    assert!(
        matches!(&error, McpError::Rpc { code: -32602, message, .. } if message == "Unknown tool: delete_all"),
        "{error:?}"
    );
    assert!(error.to_string().contains("tools/call"), "{error}");
    assert!(!error.is_transient());

    let error = client.call("slow", Value::Null).await.unwrap_err();
    assert_eq!(
        error,
        McpError::Timeout {
            server: "docs".to_owned(),
            method: "tools/call".to_owned(),
            timeout_ms: 1_500,
        }
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn an_endpoint_that_is_not_mcp_fails_to_connect_clearly() {
    let (address, _state) = start().await;

    let error = McpClient::connect(&McpServerConfig {
        url: format!("http://{address}/not-mcp"),
        ..config(address)
    })
    .await
    .unwrap_err();

    assert!(
        matches!(&error, McpError::Http { status: 404, method, .. } if method == "initialize"),
        "{error:?}"
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let error = McpClient::connect(&config(closed)).await.unwrap_err();
    assert!(matches!(error, McpError::Connect { .. }), "{error:?}");
}

#[tokio::test]
async fn a_forgotten_session_is_reopened_and_the_request_sent_again() {
    let (address, state) = start().await;
    let client = McpClient::connect(&config(address)).await.unwrap();
    client.call("forget", json!({})).await.unwrap();

    let result = client
        .call("lookup", json!({"term": "raft"}))
        .await
        .unwrap();

    assert!(result.text.starts_with("raft: "), "{result:?}");
    let requests = state.requests.lock().unwrap().clone();
    let trace: Vec<(String, Option<String>)> = requests
        .iter()
        .map(|request| (request.method.clone(), request.session.clone()))
        .collect();
    let session = |id: &str| Some(id.to_owned());
    assert_eq!(
        trace,
        vec![
            ("initialize".to_owned(), None),
            ("notifications/initialized".to_owned(), session("session-1")),
            ("tools/call".to_owned(), session("session-1")),
            ("tools/call".to_owned(), session("session-1")),
            ("initialize".to_owned(), None),
            ("notifications/initialized".to_owned(), session("session-2")),
            ("tools/call".to_owned(), session("session-2")),
        ]
    );
}
