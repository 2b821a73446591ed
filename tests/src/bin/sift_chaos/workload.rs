//! The workload: concurrent clients ingesting, deleting, searching, asking agent sessions and
//! changing a KB's settings (the register), each against a random node, every operation
//! recorded with its invocation and return times.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sift_tests::chaos::OperationCounts;
use sift_tests::chaos::SearchRecord;
use sift_tests::chaos::linearizability::{Kind, Operation};

/// The KB the data operations use, and the one whose settings are the register.
pub const DATA_KB: &str = "chaos";
pub const REGISTER_KB: &str = "register";
/// The register: this setting of [`REGISTER_KB`].
pub const REGISTER_FIELD: &str = "json_title_field";
const TOPICS: usize = 16;

/// Everything the clients recorded.
#[derive(Default)]
pub struct History {
    pub acknowledged: Vec<String>,
    pub delete_sent: HashSet<String>,
    /// Acknowledged deletes: document id -> when the delete returned.
    pub deleted: HashMap<String, u64>,
    pub searches: Vec<SearchRecord>,
    pub register: Vec<Operation>,
    pub operations: BTreeMap<String, OperationCounts>,
}

/// The shared state of the clients.
#[derive(Clone)]
pub struct Workload {
    pub urls: Arc<Vec<String>>,
    pub http: reqwest::Client,
    pub history: Arc<Mutex<History>>,
    pub stop: Arc<AtomicBool>,
    pub origin: Instant,
}

enum Outcome {
    Ok(Value),
    /// A 4xx: refused, it did not take effect.
    Failed,
    /// A 5xx, a timeout, a connection error: it may or may not have taken effect.
    Unknown,
}

impl Workload {
    pub fn new(urls: Vec<String>, origin: Instant) -> Workload {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {}", sift_node::config::TEST_ADMIN_KEY)
                .parse()
                .expect("a header value"),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client");
        Workload {
            urls: Arc::new(urls),
            http,
            history: Arc::new(Mutex::new(History::default())),
            stop: Arc::new(AtomicBool::new(false)),
            origin,
        }
    }

    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn count(&self, kind: &str, outcome: &Outcome) {
        let mut history = self.history();
        let counts = history.operations.entry(kind.into()).or_default();
        match outcome {
            Outcome::Ok(_) => counts.ok += 1,
            Outcome::Failed => counts.failed += 1,
            Outcome::Unknown => counts.unknown += 1,
        }
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Outcome {
        match request.send().await {
            Ok(response) => {
                let status = response.status();
                let body = response.bytes().await;
                match body {
                    Ok(body) if status.is_success() => {
                        Outcome::Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
                    }
                    Ok(_) if status.is_client_error() => Outcome::Failed,
                    _ => Outcome::Unknown,
                }
            }
            Err(_) => Outcome::Unknown,
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Bulk JSON ingestion of a few short documents at a time.
    pub async fn ingest(self, client: usize, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0u64;
        while !self.stopped() {
            let node = rng.random_range(0..self.urls.len());
            let documents: Vec<Value> = (0..3)
                .map(|_| {
                    n += 1;
                    let topic = rng.random_range(0..TOPICS);
                    sift_tests::text_document(
                        &format!("c{client}-{n}"),
                        &format!("note {client}-{n}"),
                        &format!(
                            "Chaos note {client} {n} is about topic{topic}. Nodes fail, links \
                             slow down and disks fill, and topic{topic} notes stay findable."
                        ),
                    )
                })
                .collect();
            let request = self
                .http
                .post(format!("{}/v1/kbs/{DATA_KB}/documents", self.urls[node]))
                .json(&json!({ "documents": documents }));
            let outcome = self.call(request).await;
            if let Outcome::Ok(body) = &outcome {
                let ids: Vec<String> = body["documents"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["id"].as_str().map(String::from))
                    .collect();
                self.history().acknowledged.extend(ids);
            }
            self.count("ingest", &outcome);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Deletes acknowledged documents, one at a time.
    pub async fn delete(self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        while !self.stopped() {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let target = {
                let mut history = self.history();
                let candidates: Vec<&String> = history
                    .acknowledged
                    .iter()
                    .filter(|id| !history.delete_sent.contains(*id))
                    .collect();
                if candidates.len() < 10 {
                    continue;
                }
                let id = candidates[rng.random_range(0..candidates.len())].clone();
                history.delete_sent.insert(id.clone());
                id
            };
            let node = rng.random_range(0..self.urls.len());
            let request = self.http.delete(format!(
                "{}/v1/kbs/{DATA_KB}/documents/{target}",
                self.urls[node]
            ));
            let outcome = self.call(request).await;
            let returned = self.now();
            if let Outcome::Ok(_) = outcome {
                self.history().deleted.insert(target, returned);
            }
            self.count("delete", &outcome);
        }
    }

    /// Searches for a topic; records the documents found.
    pub async fn search(self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        while !self.stopped() {
            let node = rng.random_range(0..self.urls.len());
            let topic = rng.random_range(0..TOPICS);
            let invoke = self.now();
            let request = self
                .http
                .post(format!("{}/v1/kbs/{DATA_KB}/search", self.urls[node]))
                .json(&json!({ "query": format!("topic{topic} notes"), "top_k": 20 }));
            let outcome = self.call(request).await;
            if let Outcome::Ok(body) = &outcome {
                let documents = document_ids(body);
                self.history().searches.push(SearchRecord {
                    invoke,
                    node,
                    documents,
                });
            }
            self.count("search", &outcome);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Agent sessions over the data KB: a session, one question, the whole SSE answer.
    pub async fn ask(self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        while !self.stopped() {
            let node = rng.random_range(0..self.urls.len());
            let url = &self.urls[node];
            let created = self
                .call(
                    self.http
                        .post(format!("{url}/v1/sessions"))
                        .json(&json!({ "kbs": [DATA_KB] })),
                )
                .await;
            let outcome = match created {
                Outcome::Ok(session) => match session["id"].as_str() {
                    Some(id) => {
                        let topic = rng.random_range(0..TOPICS);
                        let answer = self
                            .http
                            .post(format!("{url}/v1/sessions/{id}/messages"))
                            .timeout(Duration::from_secs(60))
                            .json(&json!({ "content": format!("what do topic{topic} notes say") }))
                            .send()
                            .await;
                        match answer {
                            Ok(response) if response.status().is_success() => {
                                match response.text().await {
                                    Ok(text) if text.contains("event: done") => {
                                        Outcome::Ok(Value::Null)
                                    }
                                    _ => Outcome::Unknown,
                                }
                            }
                            Ok(response) if response.status().is_client_error() => Outcome::Failed,
                            _ => Outcome::Unknown,
                        }
                    }
                    None => Outcome::Unknown,
                },
                other => other,
            };
            self.count("agent_session", &outcome);
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
    }

    /// The register: writes a unique value to the KB setting or reads it back.
    pub async fn register(self, client: usize, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0u64;
        while !self.stopped() {
            let node = rng.random_range(0..self.urls.len());
            let url = format!("{}/v1/kbs/{REGISTER_KB}", self.urls[node]);
            let invoke = self.now();
            if rng.random_bool(0.5) {
                n += 1;
                let value = format!("w{client}-{n}");
                let request = self
                    .http
                    .patch(&url)
                    .timeout(Duration::from_secs(5))
                    .json(&json!({ REGISTER_FIELD: value }));
                let outcome = self.call(request).await;
                let complete = self.now();
                let complete = match outcome {
                    Outcome::Ok(_) => Some(Some(complete)),
                    Outcome::Unknown => Some(None),
                    Outcome::Failed => None,
                };
                if let Some(complete) = complete {
                    self.history().register.push(Operation {
                        client,
                        invoke,
                        complete,
                        kind: Kind::Write(value),
                    });
                }
                self.count("register_write", &outcome);
            } else {
                let request = self.http.get(&url).timeout(Duration::from_secs(5));
                let outcome = self.call(request).await;
                let complete = self.now();
                if let Outcome::Ok(body) = &outcome
                    && let Some(value) = body["settings"][REGISTER_FIELD].as_str()
                {
                    self.history().register.push(Operation {
                        client,
                        invoke,
                        complete: Some(complete),
                        kind: Kind::Read(value.to_string()),
                    });
                }
                self.count("register_read", &outcome);
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        }
    }
}

pub fn document_ids(answer: &Value) -> Vec<String> {
    answer["hits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|hit| hit["document_id"].as_str().map(String::from))
        .collect()
}
