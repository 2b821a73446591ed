//! Web search through an HTTP provider speaking the SearxNG JSON format
//! (`GET {base_url}/search?q=...&format=json` -> `{"results": [{"url", "title", "content"}]}`).
//!
//! [`WebSearchClient::search`] returns at most `max_results` results in the provider's order,
//! skipping results without a URL; each request has the configured timeout.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::instrument;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSearchConfig {
    /// The SearxNG root, e.g. `http://127.0.0.1:8888`.
    pub base_url: String,
    #[serde(default = "default_web_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_max_results")]
    pub max_results: usize,
}

fn default_web_timeout_ms() -> u64 {
    10_000
}

fn default_max_results() -> usize {
    5
}

/// Result text is cut to this many characters in error messages.
const MAX_ERROR_BODY_CHARS: usize = 300;

/// One search result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebResult {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// Why a web search failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WebSearchError {
    #[error("web search query is empty")]
    EmptyQuery,
    #[error("web search provider unreachable: {0}")]
    Connect(String),
    #[error("web search timed out after {0} ms")]
    Timeout(u64),
    #[error("web search provider answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    /// A 2xx answer that is not SearxNG JSON (e.g. the JSON format is not enabled).
    #[error("web search provider answered something else than SearxNG JSON: {0}")]
    BadResponse(String),
}

impl WebSearchError {
    /// Worth trying again later.
    pub fn is_transient(&self) -> bool {
        match self {
            WebSearchError::Connect(_) | WebSearchError::Timeout(_) => true,
            WebSearchError::Http { status, .. } => *status == 429 || *status >= 500,
            WebSearchError::EmptyQuery | WebSearchError::BadResponse(_) => false,
        }
    }
}

/// A client for one SearxNG-compatible provider.
#[derive(Clone, Debug)]
pub struct WebSearchClient {
    config: WebSearchConfig,
    client: reqwest::Client,
    endpoint: String,
}

#[derive(Deserialize)]
struct SearxResponse {
    #[serde(default)]
    results: Vec<SearxResult>,
}

#[derive(Deserialize)]
struct SearxResult {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    content: Option<String>,
}

impl WebSearchClient {
    pub fn new(config: WebSearchConfig) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .build()
            .unwrap_or_default();
        let endpoint = format!("{}/search", config.base_url.trim_end_matches('/'));
        WebSearchClient {
            config,
            client,
            endpoint,
        }
    }

    pub fn config(&self) -> &WebSearchConfig {
        &self.config
    }

    /// Searches the web for `query`: at most `max_results` results, in the provider's order.
    #[instrument(skip_all, fields(base_url = %self.config.base_url))]
    pub async fn search(&self, query: &str) -> Result<Vec<WebResult>, WebSearchError> {
        let query = query.trim();
        if query.is_empty() {
            return Err(WebSearchError::EmptyQuery);
        }
        let url =
            reqwest::Url::parse_with_params(&self.endpoint, [("q", query), ("format", "json")])
                .map_err(|error| {
                    WebSearchError::Connect(format!(
                        "bad base_url {:?}: {error}",
                        self.config.base_url
                    ))
                })?;
        let response = self
            .client
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|error| self.transport_error(&error))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|error| self.transport_error(&error))?;
        if !status.is_success() {
            return Err(WebSearchError::Http {
                status: status.as_u16(),
                message: excerpt(&body),
            });
        }
        let parsed: SearxResponse = serde_json::from_slice(&body)
            .map_err(|error| WebSearchError::BadResponse(format!("{error}: {}", excerpt(&body))))?;
        Ok(parsed
            .results
            .into_iter()
            .filter_map(|result| {
                let url = result.url.filter(|url| !url.trim().is_empty())?;
                Some(WebResult {
                    title: result
                        .title
                        .filter(|title| !title.trim().is_empty())
                        .unwrap_or_else(|| url.clone()),
                    snippet: result.content.unwrap_or_default(),
                    url,
                })
            })
            .take(self.config.max_results)
            .collect())
    }

    fn transport_error(&self, error: &reqwest::Error) -> WebSearchError {
        if error.is_timeout() {
            return WebSearchError::Timeout(self.config.timeout_ms);
        }
        WebSearchError::Connect(crate::error_chain(error))
    }
}

fn excerpt(body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(body)
        .trim()
        .chars()
        .take(MAX_ERROR_BODY_CHARS)
        .collect();
    if text.is_empty() {
        "empty body".to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests;
