//! External rerank services, configured as `[rerank.NAME]` in the node config:
//! - `api = "tei"`: text-embeddings-inference, `POST {base_url}/rerank` with `{query, texts}`,
//!   answering `[{index, score}]`;
//! - `api = "cohere"` (also Jina): `POST {base_url}/rerank` with `{model, query, documents,
//!   top_n}`, answering `{results: [{index, relevance_score}]}` (`base_url` includes `/v1`).
//!
//! A service that times out, fails, or answers with fewer scores than documents or with
//! indices out of range or repeated is not trusted: the caller keeps the fused order and
//! reports why ([`RerankReport`]). Scores in any order are fine: we sort them.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The name of the built-in feature re-scorer.
pub const EMBEDDED_RERANKER: &str = "embedded";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RerankApi {
    Tei,
    Cohere,
}

/// `[rerank.NAME]` of the node config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankServiceConfig {
    pub base_url: String,
    pub api: RerankApi,
    /// Sent as `model` (cohere shape).
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    /// Default 2000 ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// What the rerank stage did, in the response.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct RerankReport {
    pub applied: bool,
    pub model: String,
    /// Hits reranked (the head of the fused list).
    pub depth: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Clients of the configured services, by name.
#[derive(Clone, Default)]
pub struct RerankServices {
    client: reqwest::Client,
    services: HashMap<String, RerankServiceConfig>,
}

impl RerankServices {
    pub fn new(services: impl IntoIterator<Item = (String, RerankServiceConfig)>) -> Self {
        RerankServices {
            client: reqwest::Client::new(),
            services: services.into_iter().collect(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.services.contains_key(name)
    }

    /// Scores of `documents` against `query`, one per document in document order, or why not.
    pub async fn score(
        &self,
        name: &str,
        query: &str,
        documents: &[&str],
    ) -> Result<Vec<f64>, String> {
        let config = self
            .services
            .get(name)
            .ok_or_else(|| format!("no rerank service named {name:?}"))?;
        let timeout = Duration::from_millis(config.timeout_ms.unwrap_or(2000));
        let url = format!("{}/rerank", config.base_url.trim_end_matches('/'));
        let body = match config.api {
            RerankApi::Tei => serde_json::json!({ "query": query, "texts": documents }),
            RerankApi::Cohere => serde_json::json!({
                "model": config.model.clone().unwrap_or_default(),
                "query": query,
                "documents": documents,
                "top_n": documents.len(),
            }),
        };
        let mut request = self.client.post(&url).json(&body).timeout(timeout);
        if let Some(key) = &config.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|error| {
            if error.is_timeout() {
                format!("timed out after {} ms", timeout.as_millis())
            } else {
                format!("request failed: {error}")
            }
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("service answered HTTP {}", status.as_u16()));
        }
        let value: serde_json::Value = response.json().await.map_err(|error| {
            if error.is_timeout() {
                format!("timed out after {} ms", timeout.as_millis())
            } else {
                format!("unreadable answer: {error}")
            }
        })?;
        let pairs = parse_scores(config.api, &value)?;
        scores_in_document_order(pairs, documents.len())
    }
}

#[derive(Deserialize)]
struct TeiScore {
    index: i64,
    score: f64,
}

#[derive(Deserialize)]
struct CohereAnswer {
    results: Vec<CohereScore>,
}

#[derive(Deserialize)]
struct CohereScore {
    index: i64,
    relevance_score: f64,
}

fn parse_scores(api: RerankApi, value: &serde_json::Value) -> Result<Vec<(i64, f64)>, String> {
    let bad = |error: serde_json::Error| format!("answer is not the {api:?} rerank shape: {error}");
    Ok(match api {
        RerankApi::Tei => Vec::<TeiScore>::deserialize(value)
            .map_err(bad)?
            .into_iter()
            .map(|s| (s.index, s.score))
            .collect(),
        RerankApi::Cohere => CohereAnswer::deserialize(value)
            .map_err(bad)?
            .results
            .into_iter()
            .map(|s| (s.index, s.relevance_score))
            .collect(),
    })
}

/// Checks that every document got exactly one finite score, and lays them out by index.
pub fn scores_in_document_order(
    pairs: Vec<(i64, f64)>,
    documents: usize,
) -> Result<Vec<f64>, String> {
    if pairs.len() < documents {
        return Err(format!(
            "the service returned {} scores for {documents} documents",
            pairs.len()
        ));
    }
    let mut scores = vec![None; documents];
    for (index, score) in pairs {
        let slot = usize::try_from(index)
            .ok()
            .and_then(|i| scores.get_mut(i))
            .ok_or_else(|| {
                format!("the service returned index {index} for {documents} documents")
            })?;
        if slot.is_some() {
            return Err(format!("the service returned index {index} twice"));
        }
        if !score.is_finite() {
            return Err(format!(
                "the service returned a non-finite score for index {index}"
            ));
        }
        *slot = Some(score);
    }
    Ok(scores.into_iter().map(|s| s.unwrap_or(f64::MIN)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_checked_and_ordered_by_index() {
        assert_eq!(
            scores_in_document_order(vec![(2, 0.1), (0, 0.9), (1, 0.5)], 3).unwrap(),
            vec![0.9, 0.5, 0.1]
        );
        assert!(
            scores_in_document_order(vec![(0, 0.9)], 2)
                .unwrap_err()
                .contains("1 scores for 2")
        );
        assert!(
            scores_in_document_order(vec![(0, 0.9), (5, 0.1)], 2)
                .unwrap_err()
                .contains("index 5")
        );
        assert!(
            scores_in_document_order(vec![(0, 0.9), (0, 0.1)], 2)
                .unwrap_err()
                .contains("twice")
        );
        assert!(scores_in_document_order(vec![(-1, 0.9), (0, 0.1)], 2).is_err());
    }

    #[test]
    fn both_wire_shapes_parse() {
        let tei = serde_json::json!([{ "index": 1, "score": 0.5 }, { "index": 0, "score": 0.7 }]);
        assert_eq!(
            parse_scores(RerankApi::Tei, &tei).unwrap(),
            vec![(1, 0.5), (0, 0.7)]
        );
        let cohere = serde_json::json!({ "results": [{ "index": 0, "relevance_score": 0.2 }] });
        assert_eq!(
            parse_scores(RerankApi::Cohere, &cohere).unwrap(),
            vec![(0, 0.2)]
        );
        assert!(parse_scores(RerankApi::Cohere, &tei).is_err());
    }
}
