//! The bench's view of the node's HTTP API (`/v1/kbs/...`), loopback only, over
//! [`sift_client::Client`].
//!
//! Only the fields the benchmark reads are modelled; unknown fields are ignored so the node
//! may add more without breaking the bench.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};

use sift_api::{AddedDocument, CreateKb, SearchQuery};

use crate::error::Result;

/// Default address of a node started with its default config.
pub const DEFAULT_NODE: &str = "http://127.0.0.1:7700";

/// Bulk ingestion requests can carry thousands of documents: give them time.
const INGEST_TIMEOUT: Duration = Duration::from_secs(300);

/// A retrieval channel of the search API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Dense,
    Bm25,
    Graph,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Dense => "dense",
            Channel::Bm25 => "bm25",
            Channel::Graph => "graph",
        }
    }
}

/// `GET /v1/kbs/{kb}` and `POST /v1/kbs`.
#[derive(Debug, Clone, Deserialize)]
pub struct KbInfo {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub settings: serde_json::Value,
    #[serde(default)]
    pub documents: DocumentCounts,
}

/// Documents of a knowledge base by pipeline stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DocumentCounts {
    pub total: u64,
    pub queued: u64,
    pub parsing: u64,
    pub chunking: u64,
    pub embedding: u64,
    pub indexing: u64,
    pub ready: u64,
    pub failed: u64,
}

impl DocumentCounts {
    /// Documents that reached a final state.
    pub fn finished(&self) -> u64 {
        self.ready + self.failed
    }

    /// Documents still in the pipeline. Takes the larger of the named stages and
    /// `total - finished`, so a stage the node adds later still counts as in flight.
    pub fn in_flight(&self) -> u64 {
        let stages = self.queued + self.parsing + self.chunking + self.embedding + self.indexing;
        stages.max(self.total.saturating_sub(self.finished()))
    }
}

/// One document of a bulk `POST /v1/kbs/{kb}/documents`.
#[derive(Debug, Serialize)]
pub struct NewDocument<'a> {
    pub external_id: &'a str,
    pub title: &'a str,
    pub text: &'a str,
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize)]
struct AddDocumentsRequest<'a> {
    documents: &'a [NewDocument<'a>],
}

#[derive(Deserialize)]
struct AddDocumentsResponse {
    documents: Vec<AddedDocument>,
}

/// What a bench search asks, borrowed; sent as the API's [`SearchQuery`].
#[derive(Debug, Clone, Default)]
pub struct SearchRequest<'a> {
    pub query: &'a str,
    pub top_k: usize,
    pub channels: &'a [Channel],
    /// Dense by exact scan instead of HNSW (the ground truth for HNSW recall).
    pub exact: bool,
    /// `rrf` or `dbsf`; the node's default when absent.
    pub fusion: Option<&'a str>,
    /// Pipeline stages on or off; the KB's settings when absent.
    pub rerank: Option<bool>,
    pub mmr: Option<bool>,
    pub multi_query: Option<bool>,
    pub follow_links: Option<bool>,
    /// Tokens of packed context (0: none).
    pub context_tokens: Option<u32>,
    pub expand_neighbours: Option<u32>,
}

impl SearchRequest<'_> {
    pub fn to_query(&self) -> SearchQuery {
        SearchQuery {
            top_k: Some(self.top_k),
            channels: Some(
                self.channels
                    .iter()
                    .map(|c| c.as_str().to_string())
                    .collect(),
            ),
            exact: self.exact.then_some(true),
            fusion: self.fusion.map(str::to_string),
            rerank: self.rerank,
            mmr: self.mmr,
            multi_query: self.multi_query,
            follow_links: self.follow_links,
            context_tokens: self.context_tokens,
            expand_neighbours: self.expand_neighbours,
            ..SearchQuery::new(self.query)
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct SearchResponse {
    pub hits: Vec<Hit>,
    /// Shards that failed or timed out: a non-empty list means the answer is partial.
    #[serde(default)]
    pub failed_shards: Vec<serde_json::Value>,
    #[serde(default)]
    pub timings: Timings,
}

/// One hit (a chunk); only the ids are read, text and score are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct Hit {
    #[serde(default)]
    pub chunk_id: Option<String>,
    #[serde(default)]
    pub document_id: Option<String>,
    #[serde(default)]
    pub external_id: Option<String>,
}

impl Hit {
    /// The id qrels refer to: the external id, or the node's document id when it has none.
    pub fn ranking_id(&self) -> &str {
        self.external_id
            .as_deref()
            .or(self.document_id.as_deref())
            .unwrap_or("")
    }
}

/// Server-side timings, in milliseconds. Fields the node leaves out are `None`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub struct Timings {
    pub embed_ms: Option<f64>,
    #[serde(default)]
    pub rerank_ms: Option<f64>,
    #[serde(default)]
    pub links_ms: Option<f64>,
    #[serde(default)]
    pub mmr_ms: Option<f64>,
    #[serde(default)]
    pub expand_ms: Option<f64>,
    pub search_ms: Option<f64>,
    pub total_ms: Option<f64>,
}

/// Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct SiftClient {
    api: sift_client::Client,
    base: Url,
}

impl SiftClient {
    /// Builds a client for the node at `node`, which must be a loopback address
    /// (`127.0.0.0/8`, `::1` or `localhost`): the bench never sends traffic anywhere else.
    pub fn new(node: &str, request_timeout: Duration) -> anyhow::Result<Self> {
        let base = Url::parse(node).with_context(|| format!("invalid node URL {node:?}"))?;
        if !matches!(base.scheme(), "http" | "https") {
            bail!("node URL {node:?} must be http or https");
        }
        if !is_loopback(&base) {
            bail!(
                "node URL {node:?} is not a loopback address; sift-bench only targets local nodes"
            );
        }
        let http = reqwest::Client::builder()
            // A proxy from the environment must never carry benchmark traffic off this machine.
            .no_proxy()
            .timeout(request_timeout)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("failed to build the HTTP client")?;
        // The node's key, when it checks keys (it does unless started with `auth = "off"`).
        let api_key = std::env::var("SIFT_API_KEY")
            .ok()
            .filter(|key| !key.is_empty());
        let api = sift_client::Client::with_http(base.as_str(), api_key, http);
        Ok(Self { api, base })
    }

    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `POST /v1/kbs`. `shards: None` leaves the choice to the node.
    pub async fn create_kb(
        &self,
        name: &str,
        shards: Option<u32>,
        chunk_tokens: Option<u32>,
    ) -> Result<KbInfo> {
        let body = CreateKb {
            name: name.to_string(),
            shards,
            chunk_tokens,
            ..CreateKb::default()
        };
        self.api.create_kb(&body).await
    }

    /// `GET /v1/kbs/{kb}`; `None` when the node answers 404.
    pub async fn get_kb(&self, kb: &str) -> Result<Option<KbInfo>> {
        match self.api.get_kb(kb).await {
            Ok(info) => Ok(Some(info)),
            Err(error) if error.status() == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `DELETE /v1/kbs/{kb}`.
    pub async fn delete_kb(&self, kb: &str) -> Result<()> {
        self.api.delete_kb(kb).await
    }

    /// `POST /v1/kbs/{kb}/documents` with a batch of documents.
    pub async fn add_documents(
        &self,
        kb: &str,
        documents: &[NewDocument<'_>],
    ) -> Result<Vec<AddedDocument>> {
        let request = self
            .api
            .request_to(Method::POST, &["v1", "kbs", kb, "documents"])
            .json(&AddDocumentsRequest { documents })
            .timeout(INGEST_TIMEOUT);
        let response: AddDocumentsResponse = self.api.json(request).await?;
        Ok(response.documents)
    }

    /// `POST /v1/chat/completions` (not streamed), waiting up to `timeout` for the answer.
    pub async fn chat_completion(
        &self,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value> {
        let request = self
            .api
            .request_to(Method::POST, &["v1", "chat", "completions"])
            .json(body)
            .timeout(timeout);
        self.api.json(request).await
    }

    /// `POST /v1/kbs/{kb}/search`.
    /// Documents of this node's shard replicas still awaiting graph extraction (the
    /// `sift_graph_queue_documents` gauge); `None` before the node reports it.
    pub async fn graph_queue(&self) -> Result<Option<f64>> {
        let text = self.api.metrics().await?;
        Ok(text
            .lines()
            .find_map(|line| line.strip_prefix("sift_graph_queue_documents "))
            .and_then(|value| value.trim().parse().ok()))
    }

    pub async fn search(&self, kb: &str, request: &SearchRequest<'_>) -> Result<SearchResponse> {
        self.api.search(kb, &request.to_query()).await
    }
}

fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_nodes_are_accepted() {
        let timeout = Duration::from_secs(1);
        assert!(SiftClient::new("http://127.0.0.1:7700", timeout).is_ok());
        assert!(SiftClient::new("http://127.8.0.2:7700/", timeout).is_ok());
        assert!(SiftClient::new("http://localhost:7700", timeout).is_ok());
        assert!(SiftClient::new("http://[::1]:7700", timeout).is_ok());
        assert!(SiftClient::new("http://10.0.0.1:7700", timeout).is_err());
        assert!(SiftClient::new("http://example.com", timeout).is_err());
        assert!(SiftClient::new("ftp://127.0.0.1", timeout).is_err());
    }

    #[test]
    fn document_counts_in_flight_covers_unknown_stages() {
        let counts: DocumentCounts = serde_json::from_str(
            r#"{"total": 10, "queued": 1, "embedding": 2, "ready": 5, "failed": 1, "ocr": 1}"#,
        )
        .unwrap();
        assert_eq!(counts.finished(), 6);
        assert_eq!(counts.in_flight(), 4);
    }

    #[test]
    fn search_response_tolerates_missing_optional_fields() {
        let response: SearchResponse = serde_json::from_str(
            r#"{"hits": [{"chunk_id": "c1", "document_id": "d1", "external_id": "42", "title": "t", "text": "x", "score": 0.5},
                         {"chunk_id": "c2", "document_id": "d2", "score": 0.4}],
                "timings": {"search_ms": 1.5, "total_ms": 2.0}}"#,
        )
        .unwrap();
        assert_eq!(response.hits[0].ranking_id(), "42");
        assert_eq!(response.hits[1].ranking_id(), "d2");
        assert!(response.failed_shards.is_empty());
        assert_eq!(response.timings.embed_ms, None);
        assert_eq!(response.timings.search_ms, Some(1.5));
    }
}
