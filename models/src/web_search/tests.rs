//! Tests against a real HTTP server speaking the SearxNG JSON format.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::*;

#[derive(Default)]
struct FakeSearx {
    queries: Mutex<Vec<HashMap<String, String>>>,
}

async fn search(
    State(state): State<Arc<FakeSearx>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    state.queries.lock().unwrap().push(params.clone());
    if params.get("format").map(String::as_str) != Some("json") {
        return (StatusCode::FORBIDDEN, "format not allowed").into_response();
    }
    match params.get("q").map(String::as_str) {
        Some("broken") => (StatusCode::OK, "<html>not json</html>").into_response(),
        Some("overloaded") => (StatusCode::TOO_MANY_REQUESTS, "rate limited").into_response(),
        Some("slow") => {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            StatusCode::OK.into_response()
        }
        Some(query) => axum::Json(json!({
            "query": query,
            "number_of_results": 4,
            "results": [
                {"url": "https://raft.github.io/", "title": "Raft Consensus Algorithm",
                 "content": "Raft is a consensus algorithm", "engine": "duckduckgo", "score": 3.0},
                {"url": "", "title": "no url", "content": "skipped"},
                {"url": "https://en.wikipedia.org/wiki/Raft_(algorithm)", "content": "Wikipedia: Raft"},
                {"url": "https://example.org/third", "title": "Third", "content": "cut by max_results"},
            ],
            "answers": [], "suggestions": [],
        }))
        .into_response(),
        None => (StatusCode::BAD_REQUEST, "no query").into_response(),
    }
}

async fn start() -> (SocketAddr, Arc<FakeSearx>) {
    let state = Arc::new(FakeSearx::default());
    let router = Router::new()
        .route("/search", get(search))
        .with_state(Arc::clone(&state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (address, state)
}

fn client(address: SocketAddr) -> WebSearchClient {
    WebSearchClient::new(WebSearchConfig {
        base_url: format!("http://{address}/"),
        timeout_ms: 1_500,
        max_results: 2,
    })
}

#[tokio::test]
async fn results_come_back_in_order_capped_and_without_urlless_entries() {
    let (address, state) = start().await;

    let results = client(address)
        .search("  raft consensus & co  ")
        .await
        .unwrap();

    assert_eq!(
        results,
        vec![
            WebResult {
                title: "Raft Consensus Algorithm".to_owned(),
                url: "https://raft.github.io/".to_owned(),
                snippet: "Raft is a consensus algorithm".to_owned(),
            },
            WebResult {
                title: "https://en.wikipedia.org/wiki/Raft_(algorithm)".to_owned(),
                url: "https://en.wikipedia.org/wiki/Raft_(algorithm)".to_owned(),
                snippet: "Wikipedia: Raft".to_owned(),
            },
        ]
    );
    let queries = state.queries.lock().unwrap().clone();
    assert_eq!(queries[0]["q"], "raft consensus & co");
    assert_eq!(queries[0]["format"], "json");
}

#[tokio::test]
async fn provider_failures_are_clear_errors() {
    let (address, _state) = start().await;
    let client = client(address);

    assert_eq!(client.search("   ").await, Err(WebSearchError::EmptyQuery));
    let error = client.search("broken").await.unwrap_err();
    assert!(
        matches!(&error, WebSearchError::BadResponse(message) if message.contains("not json")),
        "{error:?}"
    );
    assert_eq!(
        client.search("overloaded").await,
        Err(WebSearchError::Http {
            status: 429,
            message: "rate limited".to_owned()
        })
    );
    let error = client.search("slow").await.unwrap_err();
    assert_eq!(error, WebSearchError::Timeout(1_500));
    assert!(error.is_transient());
}
