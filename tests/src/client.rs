//! The tests' layer over [`sift_client::Client`]: every request reads the whole answer
//! whatever its status ([`Answer`], with the assertions `expect` and `expect_error`); helpers
//! that expect success panic with the node's answer otherwise; `*_answer` variants return the
//! raw [`Answer`] for error tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Statuses a document passes through before `ready` or `failed`.
pub const NON_TERMINAL: [&str; 5] = ["queued", "parsing", "chunking", "embedding", "indexing"];

/// One HTTP answer: status, headers and the body as JSON (`Null` when empty, a JSON string
/// when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl From<sift_client::Answer> for Answer {
    fn from(answer: sift_client::Answer) -> Answer {
        Answer {
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
        }
    }
}

impl Answer {
    /// The body, after checking the status.
    #[track_caller]
    pub fn expect(self, status: u16) -> Value {
        self.assert_status(status);
        self.body
    }

    #[track_caller]
    fn assert_status(&self, status: u16) {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected answer: {} {}",
            self.status,
            self.body
        );
    }

    /// Checks a `{"error": {"code", "message"}}` answer with this status and code, and a
    /// non-empty human message. Returns the message.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> String {
        self.assert_status(status);
        let error = self.body["error"]
            .as_object()
            .unwrap_or_else(|| panic!("the body is not {{\"error\": {{..}}}}: {}", self.body));
        assert_eq!(
            error.get("code").and_then(Value::as_str),
            Some(code),
            "wrong error code: {}",
            self.body
        );
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        assert!(
            !message.trim().is_empty(),
            "the error has no message: {}",
            self.body
        );
        let content_type = self
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            content_type.starts_with("application/json"),
            "error content-type is {content_type:?}"
        );
        message.to_string()
    }
}

#[derive(Clone)]
pub struct ApiClient {
    api: sift_client::Client,
}

impl ApiClient {
    /// A client with the test nodes' admin key ([`sift_node::config::TEST_ADMIN_KEY`]).
    pub fn new(base: &str) -> ApiClient {
        ApiClient::with_key(base, Some(sift_node::config::TEST_ADMIN_KEY))
    }

    /// A client sending `key` as its bearer token, or no `Authorization` header at all.
    pub fn with_key(base: &str, key: Option<&str>) -> ApiClient {
        // A bound on every request, so a hung node fails the test instead of hanging it.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .expect("building the HTTP client");
        ApiClient {
            api: sift_client::Client::with_http(base, key.map(str::to_string), http),
        }
    }

    /// A client sending `key` through `http` (e.g. one trusting a test CA).
    pub fn with_http(base: &str, key: Option<&str>, http: reqwest::Client) -> ApiClient {
        ApiClient {
            api: sift_client::Client::with_http(base, key.map(str::to_string), http),
        }
    }

    /// The client of the API underneath (typed routes, event streams).
    pub fn api(&self) -> &sift_client::Client {
        &self.api
    }

    pub fn url(&self) -> &str {
        self.api.base_url()
    }

    /// The HTTP client underneath: requests built on it carry no API key (see `request`).
    pub fn http(&self) -> &reqwest::Client {
        self.api.http()
    }

    /// Sends a request built on `request()` (or `http()`) and reads the whole answer.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        self.api
            .answer(request)
            .await
            .unwrap_or_else(|error| panic!("request to {} failed: {error}", self.url()))
            .into()
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.api.request(method, path)
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.send(self.request(Method::DELETE, path)).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Answer {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Answer {
        self.send(self.request(Method::PUT, path).json(body)).await
    }

    pub async fn patch_json(&self, path: &str, body: &Value) -> Answer {
        self.send(self.request(Method::PATCH, path).json(body))
            .await
    }

    /// A POST with an arbitrary body and content type (for malformed bodies).
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        self.send(
            self.request(Method::POST, path)
                .header("content-type", content_type)
                .body(body),
        )
        .await
    }

    // ---- tenants and keys ----

    /// Creates the tenant `name` (an admin's client).
    pub async fn create_tenant(&self, name: &str) -> Value {
        self.post_json("/v1/tenants", &json!({ "name": name }))
            .await
            .expect(201)
    }

    /// Creates a key of `role` in `tenant`, named "{tenant} {role}", and returns its secret.
    pub async fn create_key(&self, tenant: &str, role: &str) -> String {
        let created = self
            .post_json(
                "/v1/keys",
                &json!({ "name": format!("{tenant} {role}"), "role": role, "tenant": tenant }),
            )
            .await
            .expect(201);
        created["key"]
            .as_str()
            .expect("the created key's secret")
            .to_string()
    }

    /// A client of the same node (and HTTP client) with a new key of `role` in `tenant`.
    pub async fn tenant_client(&self, tenant: &str, role: &str) -> ApiClient {
        let key = self.create_key(tenant, role).await;
        ApiClient::with_http(self.url(), Some(&key), self.http().clone())
    }

    // ---- knowledge bases ----

    /// Creates a KB (`body` holds `name` and settings) and returns it.
    pub async fn create_kb(&self, body: Value) -> Value {
        self.post_json("/v1/kbs", &body).await.expect(201)
    }

    pub async fn get_kb(&self, kb: &str) -> Value {
        self.get(&format!("/v1/kbs/{kb}")).await.expect(200)
    }

    /// The replicas of every shard of `kb`: shard -> [(node, state, documents)].
    pub async fn placement(&self, kb: &str) -> Placement {
        let answer = self.get(&format!("/v1/kbs/{kb}/shards")).await.expect(200);
        answer["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|shard| {
                let replicas = shard["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| {
                        (
                            r["node"].as_u64().unwrap(),
                            r["state"].as_str().unwrap().to_string(),
                            r["documents"].as_u64(),
                        )
                    })
                    .collect();
                (shard["shard"].as_u64().unwrap(), replicas)
            })
            .collect()
    }

    /// The KB's document counts: `total` and one entry per status.
    pub async fn counts(&self, kb: &str) -> Value {
        self.get_kb(kb).await["documents"].clone()
    }

    // ---- documents ----

    /// Adds documents through the bulk JSON API; returns their ids in order.
    pub async fn bulk_add(&self, kb: &str, documents: &[Value]) -> Vec<String> {
        let answer = self.bulk_add_answer(kb, documents).await.expect(202);
        let added = answer["documents"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            added.len(),
            documents.len(),
            "one entry per document: {answer}"
        );
        added
            .iter()
            .map(|d| {
                d["id"]
                    .as_str()
                    .expect("an id per added document")
                    .to_string()
            })
            .collect()
    }

    pub async fn bulk_add_answer(&self, kb: &str, documents: &[Value]) -> Answer {
        self.post_json(
            &format!("/v1/kbs/{kb}/documents"),
            &json!({ "documents": documents }),
        )
        .await
    }

    /// Uploads one file as multipart field `file`.
    pub async fn upload(&self, kb: &str, file_name: &str, bytes: Vec<u8>) -> Answer {
        self.send(self.api.upload_request(kb, file_name, bytes))
            .await
    }

    /// Uploads one file and returns its `documents[0]` entry (`id`, `duplicate`, ...).
    pub async fn upload_ok(&self, kb: &str, file_name: &str, bytes: Vec<u8>) -> Value {
        let answer = self.upload(kb, file_name, bytes).await.expect(202);
        answer["documents"][0].clone()
    }

    pub async fn document_answer(&self, kb: &str, id: &str) -> Answer {
        self.get(&format!("/v1/kbs/{kb}/documents/{id}")).await
    }

    pub async fn document(&self, kb: &str, id: &str) -> Value {
        self.document_answer(kb, id).await.expect(200)
    }

    /// Every document of the KB, following `next_after` pages of `page` documents.
    pub async fn list_all_documents(&self, kb: &str, page: usize) -> Vec<Value> {
        self.list_all_documents_where(kb, page, "").await
    }

    /// Every document of the KB the list's `query` (`&status=ready`) keeps, following
    /// `next_after` pages of at most `page` documents.
    pub async fn list_all_documents_where(&self, kb: &str, page: usize, query: &str) -> Vec<Value> {
        let mut documents = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut path = format!("/v1/kbs/{kb}/documents?limit={page}{query}");
            if let Some(after) = &after {
                path.push_str(&format!("&after={after}"));
            }
            let answer = self.get(&path).await.expect(200);
            let batch = answer["documents"].as_array().cloned().unwrap_or_default();
            assert!(
                batch.len() <= page,
                "a page holds at most `limit` documents: {}",
                batch.len()
            );
            documents.extend(batch);
            match answer["next_after"].as_str() {
                Some(next) => {
                    assert_ne!(
                        after.as_deref(),
                        Some(next),
                        "next_after does not advance: {answer}"
                    );
                    after = Some(next.to_string());
                }
                None => return documents,
            }
        }
    }

    // ---- search ----

    /// Searches; `body` is the full request (`query`, `top_k`, `channels`, `filters`, ...).
    pub async fn search(&self, kb: &str, body: Value) -> Value {
        self.search_answer(kb, body).await.expect(200)
    }

    pub async fn search_answer(&self, kb: &str, body: Value) -> Answer {
        self.post_json(&format!("/v1/kbs/{kb}/search"), &body).await
    }

    pub async fn metrics_text(&self) -> String {
        let answer = self.get("/metrics").await;
        assert_eq!(answer.status.as_u16(), 200, "GET /metrics: {}", answer.body);
        answer
            .body
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| answer.body.to_string())
    }

    /// The sum of the samples of metric `name` whose labels include `label` (such as
    /// `actor="shard"`; every sample when `None`); 0 when there is none yet.
    pub async fn metric_sum(&self, name: &str, label: Option<&str>) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .filter(|line| {
                let series = line.split(' ').next().unwrap_or("");
                let metric = series.split('{').next().unwrap_or("");
                metric == name && label.is_none_or(|label| series.contains(label))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    // ---- bounded waits ----

    /// Waits until at least `n` documents of the KB are `ready`; fails at once when nothing is
    /// left in progress and fewer are ready (with the failed documents' errors), or after
    /// `deadline`. Returns the counts.
    pub async fn wait_ready(&self, kb: &str, n: u64, deadline: Duration) -> Value {
        let started = Instant::now();
        loop {
            let counts = self.counts(kb).await;
            let ready = count(&counts, "ready");
            if ready >= n {
                return counts;
            }
            if in_progress(&counts) == 0 {
                let failed: Vec<String> = self
                    .list_all_documents(kb, 1000)
                    .await
                    .into_iter()
                    .filter(|d| d["status"] == "failed")
                    .map(|d| format!("{} ({}): {}", d["title"], d["id"], d["error"]))
                    .take(10)
                    .collect();
                panic!(
                    "waiting for {n} ready documents in {kb}: nothing in progress, counts {counts}; failed: {failed:#?}"
                );
            }
            assert!(
                started.elapsed() < deadline,
                "waited {deadline:?} for {n} ready documents in {kb}; counts {counts}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until no document of the KB is in a non-terminal state. Returns the counts.
    pub async fn wait_idle(&self, kb: &str, deadline: Duration) -> Value {
        let started = Instant::now();
        loop {
            let counts = self.counts(kb).await;
            if in_progress(&counts) == 0 {
                return counts;
            }
            assert!(
                started.elapsed() < deadline,
                "waited {deadline:?} for ingestion in {kb} to finish; counts {counts}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until one document is `ready` or `failed` and returns its record.
    pub async fn wait_document(&self, kb: &str, id: &str, deadline: Duration) -> Value {
        let started = Instant::now();
        loop {
            let record = self.document(kb, id).await;
            if matches!(record["status"].as_str(), Some("ready" | "failed")) {
                return record;
            }
            assert!(
                started.elapsed() < deadline,
                "waited {deadline:?} for document {id} to finish; it is {}",
                record["status"]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One status's count in a KB's `documents` counts (0 when absent).
pub fn count(counts: &Value, status: &str) -> u64 {
    counts[status].as_u64().unwrap_or(0)
}

/// Documents not yet `ready` or `failed`.
pub fn in_progress(counts: &Value) -> u64 {
    NON_TERMINAL
        .iter()
        .map(|status| count(counts, status))
        .sum()
}

/// The `chunk_id`s of a search answer's hits, in order.
/// Asserts that a search answer lacks no shard.
/// A KB's replicas by shard: (node, state, documents) each, as `GET /v1/kbs/{kb}/shards`
/// lists them.
pub type Placement = BTreeMap<u64, Vec<(u64, String, Option<u64>)>>;

/// Whether every shard of `placed` (as [`ApiClient::placement`] returns it) has `replicas`
/// active copies, spread over `nodes` within one of each other, with at least one on `node`.
pub fn balanced_with(placed: &Placement, nodes: &[u64], replicas: usize, node: u64) -> bool {
    let settled = placed
        .values()
        .all(|r| r.len() == replicas && r.iter().all(|(_, state, _)| state == "active"));
    let mut per_node: BTreeMap<u64, usize> = nodes.iter().map(|id| (*id, 0)).collect();
    for (holder, _, _) in placed.values().flatten() {
        match per_node.get_mut(holder) {
            Some(count) => *count += 1,
            None => return false,
        }
    }
    let (Some(most), Some(least)) = (per_node.values().max(), per_node.values().min()) else {
        return false;
    };
    settled && most - least <= 1 && per_node.get(&node).is_some_and(|count| *count >= 1)
}

pub fn assert_complete(answer: &Value) {
    let failed = answer["failed_shards"].as_array().map_or(0, Vec::len);
    assert_eq!(failed, 0, "failed shards: {answer}");
}

pub fn chunk_ids(answer: &Value) -> Vec<String> {
    hits(answer)
        .iter()
        .map(|hit| {
            hit["chunk_id"]
                .as_str()
                .expect("every hit has a chunk_id")
                .to_string()
        })
        .collect()
}

/// The `document_id`s of a search answer's hits, in order (with repeats).
pub fn document_ids(answer: &Value) -> Vec<String> {
    hits(answer)
        .iter()
        .map(|hit| {
            hit["document_id"]
                .as_str()
                .expect("every hit has a document_id")
                .to_string()
        })
        .collect()
}

pub fn hits(answer: &Value) -> Vec<Value> {
    answer["hits"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("a search answer has `hits`: {answer}"))
}
