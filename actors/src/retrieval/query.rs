//! A search as a client asks for it ([`SearchQuery`] of `sift-api`, the body of
//! `POST /v1/kbs/{kb}/search` and the agent's search tool) and its resolution against a KB:
//! [`resolve`] applies the request's overrides to the KB's retrieval settings
//! ([`apply_overrides`]), checks every
//! value with one error code per mistake, and gathers the sub-queries. It is a pure function:
//! embedding the query texts and searching the shards come after, in `SiftNode::search`.

pub use sift_api::search::{ChannelWeights, SearchFilters, SearchQuery};
use sift_storage::chunk::SearchFilter;
use sift_storage::meta::RetrievalSettings;

use super::fusion::FusionMethod;
use super::rerank::RerankServices;
use super::root::Pipeline;
use super::{rewrite, settings};
use crate::error::{Result, SiftError};

/// Most hits one search returns.
pub const MAX_TOP_K: usize = 100;
/// Longest query (and sub-query), in characters.
pub const MAX_QUERY_CHARS: usize = 8192;
/// Most sub-queries besides the query.
pub const MAX_SUB_QUERIES: usize = 8;

/// Copies each field of the request that is set onto the setting of the same name.
macro_rules! override_settings {
    ($query:expr, $settings:expr, [$($field:ident),* $(,)?]) => {
        $(
            if let Some(value) = &$query.$field {
                $settings.$field = value.clone();
            }
        )*
    };
}

/// Overrides `settings` (a KB's) with the values `query` sets; checks nothing.
pub fn apply_overrides(query: &SearchQuery, settings: &mut RetrievalSettings) {
    if let Some(weights) = &query.weights {
        if let Some(weight) = weights.dense {
            settings.dense_weight = weight;
        }
        if let Some(weight) = weights.bm25 {
            settings.bm25_weight = weight;
        }
        if let Some(weight) = weights.graph {
            settings.graph_weight = weight;
        }
    }
    override_settings!(
        query,
        settings,
        [
            rrf_k,
            fusion,
            min_relative_score,
            min_results,
            rerank,
            rerank_model,
            rerank_depth,
            mmr,
            mmr_lambda,
            duplicate_similarity,
            expand_parent,
            expand_neighbours,
            context_tokens,
            multi_query,
            follow_links,
            link_from,
            links_per_hit,
            graph_hops,
        ]
    );
}

/// The channels a search asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Channels {
    pub dense: bool,
    pub bm25: bool,
    /// Runs only in a KB with a graph, and with a weight above 0.
    pub graph: bool,
}

/// A search resolved against its KB: every value checked and defaulted, ready to embed
/// (`query` and `extra_queries` when the dense channel is on) and run.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedSearch {
    /// The query, trimmed.
    pub query: String,
    /// Sub-queries: the caller's (deduplicated), then rule-based rewrites with `multi_query`.
    pub extra_queries: Vec<String>,
    pub channels: Channels,
    pub top_k: usize,
    pub candidates: usize,
    pub filter: SearchFilter,
    /// The KB's retrieval settings with the request's overrides, checked.
    pub settings: RetrievalSettings,
    pub fusion: FusionMethod,
    pub exact: bool,
    pub explain: bool,
}

impl ResolvedSearch {
    /// The stages after fusion, from the resolved settings.
    pub fn pipeline(&self) -> Pipeline {
        let settings = &self.settings;
        Pipeline {
            min_relative_score: settings.min_relative_score,
            min_results: settings.min_results as usize,
            rerank: settings.rerank.then(|| settings.rerank_model.clone()),
            rerank_depth: settings.rerank_depth as usize,
            mmr_lambda: settings.mmr.then_some(settings.mmr_lambda),
            duplicate_similarity: settings.duplicate_similarity,
            expand_parent: settings.expand_parent,
            expand_neighbours: settings.expand_neighbours,
            context_tokens: settings.context_tokens as usize,
            links: settings
                .follow_links
                .then_some((settings.link_from as usize, settings.links_per_hit as usize)),
        }
    }
}

/// Resolves `query` against a KB's retrieval settings. `rerankers` are the configured
/// external rerank services (a request may name one in `rerank_model`).
pub fn resolve(
    query: &SearchQuery,
    kb_settings: &RetrievalSettings,
    rerankers: &RerankServices,
) -> Result<ResolvedSearch> {
    let text = query.query.trim().to_string();
    if text.is_empty() {
        return Err(SiftError::invalid("empty_query", "query is empty"));
    }
    if text.chars().count() > MAX_QUERY_CHARS {
        return Err(SiftError::invalid(
            "query_too_long",
            format!("query is longer than {MAX_QUERY_CHARS} characters"),
        ));
    }
    let top_k = query.top_k.unwrap_or(10);
    if top_k == 0 || top_k > MAX_TOP_K {
        return Err(SiftError::invalid(
            "invalid_top_k",
            format!("top_k must be between 1 and {MAX_TOP_K}"),
        ));
    }
    let channels = channels(query.channels.as_deref())?;

    // The KB's retrieval settings, overridden by the request, checked as a whole.
    let mut settings = kb_settings.clone();
    apply_overrides(query, &mut settings);
    let (dense_weight, bm25_weight) = (settings.dense_weight, settings.bm25_weight);
    if !(dense_weight.is_finite() && bm25_weight.is_finite())
        || dense_weight < 0.0
        || bm25_weight < 0.0
    {
        return Err(SiftError::invalid(
            "invalid_weights",
            "channel weights must be finite and >= 0",
        ));
    }
    if !(channels.dense && dense_weight > 0.0
        || channels.bm25 && bm25_weight > 0.0
        || channels.graph && settings.graph_weight > 0.0)
    {
        return Err(SiftError::invalid(
            "invalid_weights",
            "every requested channel has weight 0",
        ));
    }
    settings::validate(&settings, rerankers)?;
    let fusion = FusionMethod::parse(&settings.fusion).unwrap_or_default();
    let candidates = query
        .candidates
        .unwrap_or(top_k.max(settings.candidates as usize));
    if candidates < top_k || candidates > settings::MAX_CANDIDATES as usize {
        return Err(SiftError::invalid(
            "invalid_candidates",
            format!(
                "candidates must be between top_k and {}",
                settings::MAX_CANDIDATES
            ),
        ));
    }
    let filters = query.filters.clone().unwrap_or_default();
    let filter = SearchFilter {
        document_ids: filters.document_ids,
        metadata: crate::node::metadata_from_json(filters.metadata.unwrap_or_default())?,
        ..SearchFilter::default()
    };
    let extra_queries = extra_queries(&text, query.queries.as_deref(), settings.multi_query)?;
    Ok(ResolvedSearch {
        query: text,
        extra_queries,
        channels,
        top_k,
        candidates,
        filter,
        settings,
        fusion,
        exact: query.exact.unwrap_or(false),
        explain: query.explain.unwrap_or(false),
    })
}

/// The requested channels; both when the request names none.
fn channels(requested: Option<&[String]>) -> Result<Channels> {
    let Some(requested) = requested else {
        return Ok(Channels {
            dense: true,
            bm25: true,
            graph: true,
        });
    };
    if requested.is_empty() {
        return Err(SiftError::invalid("invalid_channels", "channels is empty"));
    }
    let mut channels = Channels {
        dense: false,
        bm25: false,
        graph: false,
    };
    for channel in requested {
        match channel.as_str() {
            "dense" => channels.dense = true,
            "bm25" => channels.bm25 = true,
            "graph" => channels.graph = true,
            other => {
                return Err(SiftError::invalid(
                    "invalid_channels",
                    format!("unknown channel {other:?}; channels are dense, bm25 and graph"),
                ));
            }
        }
    }
    Ok(channels)
}

/// Sub-queries: the caller's (each checked, duplicates and copies of `text` dropped), then
/// rule-based rewrites of `text` when `multi_query` is on.
fn extra_queries(
    text: &str,
    requested: Option<&[String]>,
    multi_query: bool,
) -> Result<Vec<String>> {
    let mut extra: Vec<String> = Vec::new();
    for sub in requested.into_iter().flatten() {
        let sub = sub.trim();
        if sub.is_empty() || sub.chars().count() > MAX_QUERY_CHARS {
            return Err(SiftError::invalid(
                "invalid_queries",
                format!("each of queries must be 1 to {MAX_QUERY_CHARS} characters"),
            ));
        }
        if sub != text && !extra.iter().any(|e| e == sub) {
            extra.push(sub.to_string());
        }
    }
    if extra.len() > MAX_SUB_QUERIES {
        return Err(SiftError::invalid(
            "invalid_queries",
            format!("at most {MAX_SUB_QUERIES} queries besides the query"),
        ));
    }
    if multi_query {
        for rewrite in rewrite::rewrites(text) {
            if !extra.contains(&rewrite) {
                extra.push(rewrite);
            }
        }
    }
    Ok(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(json: serde_json::Value) -> SearchQuery {
        serde_json::from_value(json).expect("a valid request body")
    }

    fn resolved(json: serde_json::Value) -> Result<ResolvedSearch> {
        resolve(
            &query(json),
            &RetrievalSettings::default(),
            &RerankServices::default(),
        )
    }

    fn code(json: serde_json::Value) -> &'static str {
        resolved(json).expect_err("refused").code()
    }

    #[test]
    fn defaults_come_from_the_kb_settings() {
        let kb = RetrievalSettings {
            mmr: true,
            context_tokens: 1234,
            ..Default::default()
        };
        let search = resolve(
            &query(serde_json::json!({ "query": "  tea  " })),
            &kb,
            &RerankServices::default(),
        )
        .unwrap();
        assert_eq!(search.query, "tea");
        assert_eq!(search.top_k, 10);
        assert_eq!(
            search.channels,
            Channels {
                dense: true,
                bm25: true,
                graph: true,
            }
        );
        assert_eq!(search.settings, kb);
        assert_eq!(search.candidates, 10usize.max(kb.candidates as usize));
        assert_eq!(search.pipeline().context_tokens, 1234);
        assert!(search.pipeline().mmr_lambda.is_some());
        assert!(!search.exact && !search.explain);
    }

    #[test]
    fn every_override_reaches_its_setting() {
        let request = query(serde_json::json!({
            "query": "q",
            "weights": { "dense": 0.25, "bm25": 2.0 },
            "rrf_k": 7.0,
            "fusion": "rrf",
            "min_relative_score": 0.5,
            "min_results": 2,
            "rerank": false,
            "rerank_model": "embedded",
            "rerank_depth": 12,
            "mmr": true,
            "mmr_lambda": 0.3,
            "duplicate_similarity": 0.9,
            "expand_parent": false,
            "expand_neighbours": 2,
            "context_tokens": 777,
            "multi_query": true,
            "follow_links": false,
            "link_from": 4,
            "links_per_hit": 3,
        }));
        let mut settings = RetrievalSettings::default();
        apply_overrides(&request, &mut settings);
        let expected = RetrievalSettings {
            dense_weight: 0.25,
            bm25_weight: 2.0,
            rrf_k: 7.0,
            fusion: "rrf".into(),
            min_relative_score: 0.5,
            min_results: 2,
            rerank: false,
            rerank_model: "embedded".into(),
            rerank_depth: 12,
            mmr: true,
            mmr_lambda: 0.3,
            duplicate_similarity: 0.9,
            expand_parent: false,
            expand_neighbours: 2,
            context_tokens: 777,
            multi_query: true,
            follow_links: false,
            link_from: 4,
            links_per_hit: 3,
            ..Default::default()
        };
        assert_eq!(settings, expected);
        // Unset fields keep the KB's values.
        let mut kb = expected.clone();
        apply_overrides(&query(serde_json::json!({ "query": "q" })), &mut kb);
        assert_eq!(kb, expected);
    }

    #[test]
    fn bad_values_get_their_own_codes() {
        use serde_json::json;
        assert_eq!(code(json!({ "query": " " })), "empty_query");
        assert_eq!(
            code(json!({ "query": "x".repeat(MAX_QUERY_CHARS + 1) })),
            "query_too_long"
        );
        assert_eq!(code(json!({ "query": "q", "top_k": 0 })), "invalid_top_k");
        assert_eq!(
            code(json!({ "query": "q", "top_k": MAX_TOP_K + 1 })),
            "invalid_top_k"
        );
        assert_eq!(
            code(json!({ "query": "q", "channels": [] })),
            "invalid_channels"
        );
        assert_eq!(
            code(json!({ "query": "q", "channels": ["sparse"] })),
            "invalid_channels"
        );
        assert_eq!(
            code(json!({ "query": "q", "weights": { "dense": -1.0 } })),
            "invalid_weights"
        );
        assert_eq!(
            code(json!({ "query": "q", "channels": ["bm25"], "weights": { "bm25": 0.0 } })),
            "invalid_weights"
        );
        assert_eq!(
            code(json!({ "query": "q", "fusion": "max" })),
            "invalid_fusion"
        );
        assert_eq!(
            code(json!({ "query": "q", "top_k": 20, "candidates": 10 })),
            "invalid_candidates"
        );
        assert_eq!(
            code(json!({ "query": "q", "queries": ["  "] })),
            "invalid_queries"
        );
        let nine: Vec<String> = (0..=MAX_SUB_QUERIES).map(|i| format!("sub {i}")).collect();
        assert_eq!(
            code(json!({ "query": "q", "queries": nine })),
            "invalid_queries"
        );
        assert_eq!(
            code(json!({ "query": "q", "rerank_model": "nowhere" })),
            "unknown_rerank_model"
        );
    }

    #[test]
    fn one_channel_and_sub_queries() {
        use serde_json::json;
        let search = resolved(json!({
            "query": "green tea",
            "channels": ["bm25"],
            "weights": { "dense": 0.0 },
            "queries": ["green tea", " steeping ", "steeping", "storage"],
            "filters": { "document_ids": ["d1"], "metadata": { "lang": "en" } },
            "exact": true,
            "explain": true,
        }))
        .unwrap();
        assert_eq!(
            search.channels,
            Channels {
                dense: false,
                bm25: true,
                graph: false,
            }
        );
        assert_eq!(search.extra_queries, ["steeping", "storage"]);
        assert_eq!(search.filter.document_ids, Some(vec!["d1".to_string()]));
        assert_eq!(search.filter.metadata.len(), 1);
        assert!(search.exact && search.explain);
    }

    #[test]
    fn multi_query_adds_rewrites_after_the_callers_queries() {
        let text = "What is the boiling point of water?";
        let search = resolved(serde_json::json!({
            "query": text, "multi_query": true, "queries": ["water boiling"],
        }))
        .unwrap();
        assert_eq!(search.extra_queries[0], "water boiling");
        let rewrites = rewrite::rewrites(text);
        for rewrite in &rewrites {
            assert!(search.extra_queries.contains(rewrite), "{rewrite}");
        }
        assert!(search.extra_queries.len() <= 1 + rewrites.len());
    }
}
