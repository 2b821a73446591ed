//! The search body: `POST /v1/kbs/{kb}/search`, also what the agent's search tool sends.
//! Every field but `query` is optional; the set ones override the KB's retrieval settings
//! of the same name for this search only.

use serde::{Deserialize, Serialize};

use crate::JsonMap;

/// The pages a chunk, hit or citation lies on (1-based, inclusive): `{"first": 2, "last": 3}`.
/// Documents with pages (PDF; a PowerPoint deck, a page a slide) have them; other formats
/// have `null` in their place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PageRange {
    pub first: u32,
    pub last: u32,
}

impl PageRange {
    pub fn new((first, last): (u32, u32)) -> Self {
        PageRange { first, last }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchFilters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonMap>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelWeights {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bm25: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<f64>,
}

/// `POST /v1/kbs/{kb}/search`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub top_k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<SearchFilters>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<ChannelWeights>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rrf_k: Option<f64>,
    /// `dbsf` (default) or `rrf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fusion: Option<String>,
    /// Hits gathered per channel before fusion (default max(top_k, 50)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub candidates: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explain: Option<bool>,
    /// Dense channel by exact scan instead of HNSW (slow; for measuring HNSW recall).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<bool>,
    // Overrides of the KB's retrieval settings (see `RetrievalSettings`), by the same names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_relative_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_results: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerank_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmr: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmr_lambda: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_similarity: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_parent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_neighbours: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u32>,
    /// Add rule-based rewrites of the query (multi-query retrieval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_query: Option<bool>,
    /// Move candidates named by title in the top hits up behind them (multi-hop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_links: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_from: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links_per_hit: Option<u32>,
    /// Hops of the graph channel (1 to 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_hops: Option<u32>,
    /// Sub-queries or rewrites (from a planner) searched alongside `query`, fused with RRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<Vec<String>>,
}

impl SearchQuery {
    pub fn new(query: impl Into<String>) -> SearchQuery {
        SearchQuery {
            query: query.into(),
            ..SearchQuery::default()
        }
    }
}
