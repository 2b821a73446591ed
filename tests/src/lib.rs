//! The harness of Sift's integration tests (the tests themselves are in `tests/tests/`).
//!
//! - [`NodeProcess`]: the real `sift serve` in its own process (the `sift-under-test` binary of
//!   this crate), for tests that stop it with SIGTERM or kill it with SIGKILL.
//! - [`InProcessNode`]: a node started inside the test process with
//!   [`sift_node::server::start`], for tests that need no separate process.
//! - [`ApiClient`]: a thin HTTP client of the public API with bounded waits
//!   ([`ApiClient::wait_ready`], [`ApiClient::wait_idle`], [`ApiClient::wait_document`]).
//! - [`fake_mcp`]: a fake remote MCP server (streamable HTTP, JSON-RPC). The fake chat-model
//!   server is `sift_models::fake_server` (feature `fake-server`), shared with the unit tests
//!   and `sift-bench`.
//! - [`sse`]: reading server-sent event streams of the API.
//! - [`chaos`]: the checker of the chaos soak (`scripts/chaos.sh`).
//! - [`beir`]: loaders of the BEIR slices in `tests/fixtures/` and the quality measures
//!   (hit@k, nDCG@k).
//!
//! Every node gets its own data directory and listens on port 0. Tests need the embedded
//! model (`scripts/fetch-model.sh`); without it they fail with a message saying so.

pub mod beir;
pub mod chaos;
mod client;
pub mod fake_mcp;
mod in_process;
mod process;
pub mod sse;

use std::path::PathBuf;
use std::time::Duration;

pub use client::{
    Answer, ApiClient, NON_TERMINAL, assert_complete, balanced_with, chunk_ids, count,
    document_ids, hits, in_progress,
};
pub use in_process::InProcessNode;
pub use process::{NodeProcess, binary as node_binary};

/// The generous bound on every wait for the node (ingestion, restarts, recoveries). Waits end
/// as soon as their condition holds; this only turns a hang into a clear failure.
pub const WAIT: Duration = Duration::from_secs(180);

/// The repository root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives inside the repository")
        .to_path_buf()
}

/// Folder of the embedded model: `SIFT_MODEL_DIR`, else `<repo>/.models/all-MiniLM-L6-v2`.
pub fn model_dir() -> PathBuf {
    match std::env::var_os("SIFT_MODEL_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => repo_root().join(".models").join("all-MiniLM-L6-v2"),
    }
}

/// The embedded model's folder, or a panic that says how to get it. Tests never skip for a
/// missing model: a skipped quality test would pass without testing anything.
pub fn require_model() -> PathBuf {
    let dir = model_dir();
    let missing: Vec<&str> = ["model.safetensors", "tokenizer.json", "config.json"]
        .into_iter()
        .filter(|file| !dir.join(file).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "the embedded model is missing at {} (no {}): run scripts/fetch-model.sh or set SIFT_MODEL_DIR",
        dir.display(),
        missing.join(", ")
    );
    dir
}

/// A bound on ingesting `documents` documents: generous (the machine may be shared and the
/// build is a debug build), it only turns a hang into a clear failure.
pub fn ingest_deadline(documents: usize) -> Duration {
    WAIT + Duration::from_secs(3 * documents as u64)
}

/// The first `n` documents of the SciFact slice with their text cut to about 400 characters
/// (at a word boundary): real text that embeds quickly. Titles are distinct.
pub fn short_documents(n: usize) -> Vec<beir::CorpusDocument> {
    let corpus = beir::scifact_slice().corpus;
    assert!(
        n <= corpus.len(),
        "the SciFact slice has {} documents",
        corpus.len()
    );
    corpus
        .into_iter()
        .take(n)
        .map(|mut doc| {
            if doc.text.len() > 400 {
                let mut end = 400;
                while !doc.text.is_char_boundary(end) {
                    end -= 1;
                }
                let cut = doc.text[..end].rfind(' ').unwrap_or(end);
                doc.text.truncate(cut);
            }
            doc
        })
        .collect()
}

/// The bulk-API documents of `documents`, with the corpus id as `external_id`.
pub fn bulk_documents(documents: &[beir::CorpusDocument]) -> Vec<serde_json::Value> {
    documents
        .iter()
        .map(|doc| text_document(&doc.id, &doc.title, &doc.text))
        .collect()
}

/// A fresh temporary directory for one test (kept after the test when `SIFT_TEST_KEEP` is
/// set, to read the nodes' logs).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sift-test-")
        .disable_cleanup(std::env::var_os("SIFT_TEST_KEEP").is_some())
        .tempdir()
        .expect("creating a temp dir")
}

/// A free TCP port on loopback (for a node's internal address, which must be known before it
/// starts so that others can join through it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("binding a loopback port")
        .port()
}

/// Polls `check` until it gives a value; panics with `what` after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every client's node sees `clients.len()` voters; returns each node's id (in the
/// clients' order) and the leader's.
pub async fn wait_for_voters(clients: &[ApiClient]) -> (Vec<u64>, u64) {
    let ids = eventually("every node a voter", || async {
        let mut ids = Vec::new();
        for client in clients {
            let view = client.get("/v1/cluster").await.expect(200);
            let voters = view["nodes"]
                .as_array()?
                .iter()
                .filter(|n| matches!(n["role"].as_str(), Some("leader" | "follower")))
                .count();
            if voters != clients.len() {
                return None;
            }
            ids.push(view["id"].as_u64()?);
        }
        Some(ids)
    })
    .await;
    let leader = clients[0].get("/v1/cluster").await.expect(200)["leader"]
        .as_u64()
        .expect("a leader once every node is a voter");
    (ids, leader)
}

/// The ids of the sessions in a `GET /v1/sessions` page, in order.
pub fn session_ids(page: &serde_json::Value) -> Vec<String> {
    page["sessions"]
        .as_array()
        .expect("a page of sessions")
        .iter()
        .map(|session| session["id"].as_str().expect("a session id").to_string())
        .collect()
}

/// A bulk-API document.
pub fn text_document(external_id: &str, title: &str, text: &str) -> serde_json::Value {
    serde_json::json!({ "external_id": external_id, "title": title, "text": text })
}
