//! Search: the query resolved against the KB's settings ([`query::resolve`]), embedded, and
//! scattered over the shards by the root search.

use std::time::Instant;

use super::SiftNode;
use crate::error::Result;
use crate::error::SiftError;
use crate::retrieval::query::ResolvedSearch;
use crate::retrieval::query::{self, SearchQuery};
use crate::retrieval::{GraphQuery, SearchRequest, SearchResponse};
use crate::scope::{Need, Scope};
use sift_storage::meta::KbSettings;

impl SiftNode {
    pub async fn search(
        &self,
        scope: &Scope,
        kb: &str,
        query: SearchQuery,
    ) -> Result<SearchResponse> {
        let started = Instant::now();
        let kb = self.find_kb_for_data(scope, kb, Need::Read).await?;
        // Cluster mode: every delete that returned before this search is applied here before
        // the hits are checked against the tombstones, or the search fails (a member cut off
        // from the leader answers 503 rather than a document deleted elsewhere).
        self.context.meta.linearizable_barrier().await?;
        let mut search = query::resolve(&query, &kb.settings.retrieval, self.root.rerankers())?;
        // Document-level access: applied inside every shard, before ranking.
        search.filter.groups = scope.groups().map(<[String]>::to_vec);
        let embed_started = Instant::now();
        let mut vectors = if search.channels.dense {
            let embedder = self.context.embedders.get(&kb.settings.embedding_model)?;
            let mut texts = vec![search.query.clone()];
            texts.extend(search.extra_queries.iter().cloned());
            self.context
                .embed_cached(&embedder, texts)
                .await?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None; search.extra_queries.len() + 1]
        };
        let embed_ms = embed_started.elapsed().as_secs_f64() * 1e3;
        let vector = if vectors.is_empty() {
            None
        } else {
            vectors.remove(0)
        };
        let pipeline = search.pipeline();
        let graph = graph_query(&kb.settings, &search)?;
        let request = SearchRequest {
            kb_id: kb.id.clone(),
            shards: kb.settings.shards,
            vector,
            exact: search.exact,
            bm25: search.channels.bm25,
            top_k: search.top_k,
            candidates: search.candidates,
            dense_weight: search.settings.dense_weight,
            bm25_weight: search.settings.bm25_weight,
            rrf_k: search.settings.rrf_k,
            fusion: search.fusion,
            explain: search.explain,
            extra_queries: search.extra_queries.into_iter().zip(vectors).collect(),
            filter: search.filter,
            query: search.query,
            pipeline,
            graph,
        };
        let mut response = self.root.search(&request).await;
        response.timings.embed_ms = embed_ms;
        response.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
        metrics::histogram!("sift_search_seconds").record(started.elapsed().as_secs_f64());
        Ok(response)
    }
}

/// The graph channel of a search: in a KB with a graph, when the search asks for it (every
/// search does by default) with a weight above 0. A search asking for the graph alone in a KB
/// without one is refused.
fn graph_query(settings: &KbSettings, search: &ResolvedSearch) -> Result<Option<GraphQuery>> {
    let asked = search.channels.graph && search.settings.graph_weight > 0.0;
    if settings.graph == "off" {
        if asked && !search.channels.dense && !search.channels.bm25 {
            return Err(SiftError::invalid(
                "graph_unavailable",
                "this knowledge base has no graph (its graph setting is off)",
            ));
        }
        return Ok(None);
    }
    if !asked {
        return Ok(None);
    }
    let language = sift_graph::Language::from_setting(&settings.language);
    Ok(Some(GraphQuery {
        names: sift_graph::query_names(&search.query, language),
        hops: search.settings.graph_hops,
        weight: search.settings.graph_weight,
    }))
}
