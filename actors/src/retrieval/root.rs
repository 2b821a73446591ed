//! The search root: plans one leaf request per shard, gathers with a deadline, merges.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use serde::Serialize;
use sift_storage::chunk::{ChunkView, ScoredChunk, SearchFilter};
use sift_storage::meta::SledMetaStore;
use tracing::{instrument, warn};

use super::fusion::{Channel, ChannelHitInfo, FusionMethod, RankedList, dbsf_fuse, rrf_fuse};
use super::links::{self, LinkView};
use super::mmr::{AlsoIn, collapse_duplicates, mmr};
use super::packing::{Neighbour, PackedContext, pack};
use super::rerank::{EMBEDDED_RERANKER, RerankReport, RerankServices};
use super::rescore::{Features, rescore};
use crate::shards::{LeafRequest, LeafResponse, ShardAccess};

#[derive(Clone, Debug)]
pub struct SearchRequest {
    pub kb_id: String,
    pub shards: u32,
    pub query: String,
    /// The query embedding; `None` leaves the dense channel out.
    pub vector: Option<Vec<f32>>,
    /// Dense by exact scan instead of HNSW.
    pub exact: bool,
    pub bm25: bool,
    pub top_k: usize,
    /// Hits per channel gathered before fusion (per shard, and after the global merge).
    pub candidates: usize,
    pub filter: SearchFilter,
    pub dense_weight: f64,
    pub bm25_weight: f64,
    pub rrf_k: f64,
    pub fusion: FusionMethod,
    /// Attach a plain-words explanation to each hit.
    pub explain: bool,
    /// Rewrites and sub-queries searched alongside `query`, with their embeddings; fused with
    /// RRF (k = `rrf_k`).
    pub extra_queries: Vec<(String, Option<Vec<f32>>)>,
    /// The stages after fusion.
    pub pipeline: Pipeline,
    /// The graph channel, when the KB has a graph and the search asks for it.
    pub graph: Option<super::graph::GraphQuery>,
}

/// The stages after fusion, resolved from the KB's settings and the request.
#[derive(Clone, Debug)]
pub struct Pipeline {
    /// Keep a channel hit only at or above this share of the channel's best score (0: off).
    pub min_relative_score: f64,
    /// Fewer fused hits than this after filtering: use the unfiltered lists.
    pub min_results: usize,
    /// `Some(model)`: rerank the head of the fused list with it.
    pub rerank: Option<String>,
    pub rerank_depth: usize,
    /// `Some(λ)`: MMR over the reranked head.
    pub mmr_lambda: Option<f64>,
    /// Jaccard similarity at which hits collapse into one (> 1: never).
    pub duplicate_similarity: f64,
    pub expand_parent: bool,
    pub expand_neighbours: u32,
    /// 0: no packed context.
    pub context_tokens: usize,
    /// `Some((from, per_hit))`: follow links (see [`super::links`]).
    pub links: Option<(usize, usize)>,
}

impl Default for Pipeline {
    fn default() -> Self {
        Pipeline {
            min_relative_score: 0.0,
            min_results: 0,
            rerank: None,
            rerank_depth: 0,
            mmr_lambda: None,
            duplicate_similarity: 2.0,
            expand_parent: false,
            expand_neighbours: 0,
            context_tokens: 0,
            links: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SearchHit {
    #[serde(flatten)]
    pub chunk: ChunkView,
    /// The final score: the rerank score when the hit was reranked, else the fused score
    /// (the multi-query RRF score when several queries ran).
    pub score: f64,
    /// The fused score (of the original query's fusion).
    pub fused_score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_score: Option<f64>,
    /// Rank, score and fusion contribution of the hit in each channel that found it.
    #[schema(value_type = HashMap<String, ChannelHitInfo>)]
    pub channels: HashMap<Channel, ChannelHitInfo>,
    /// Near-identical chunks (other documents or places) collapsed into this hit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_in: Vec<AlsoIn>,
    /// Previous/next chunks, with `expand_neighbours`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<Neighbour>,
    /// The hit's number in the packed `context`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub citation: Option<usize>,
    /// With `explain`: why the hit is here, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<String>,
    /// With `explain`: the hit's path through the pipeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<HitPath>,
    #[serde(skip)]
    pub trace: Vec<String>,
    #[serde(skip)]
    pub mmr: Option<String>,
    #[serde(skip)]
    pub features: Option<Features>,
    #[serde(skip)]
    pub fused_rank: usize,
    #[serde(skip)]
    pub rerank_rank: Option<usize>,
    /// Indices of the queries (0: the original) that found the hit.
    #[serde(skip)]
    pub queries: Vec<usize>,
}

/// Each ranking decision about one hit.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct HitPath {
    pub fused_rank: usize,
    pub fused_score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_score: Option<f64>,
    /// The re-scorer's features of the hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub rerank_features: Option<Features>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmr: Option<String>,
    /// The queries (original first) that found the hit.
    pub queries: Vec<String>,
    /// Every step, in order.
    pub steps: Vec<String>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct FailedShard {
    pub shard: u32,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct SearchTimings {
    pub embed_ms: f64,
    /// Slowest shard's dense / BM25 time.
    pub dense_ms: f64,
    pub bm25_ms: f64,
    /// The graph channel, all its rounds.
    pub graph_ms: f64,
    /// Gather and fusion of every query (the leaf searches included).
    pub retrieve_ms: f64,
    pub rerank_ms: f64,
    /// Link following.
    pub links_ms: f64,
    /// Duplicate collapse and MMR.
    pub mmr_ms: f64,
    /// Neighbour fetches and context packing.
    pub expand_ms: f64,
    pub search_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SearchResponse {
    pub hits: Vec<SearchHit>,
    pub failed_shards: Vec<FailedShard>,
    pub timings: SearchTimings,
    /// Present when a rerank was asked for: whether it was applied, and if not, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank: Option<RerankReport>,
    /// The queries searched (original first), when there was more than one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<String>,
    /// The packed context, with `context_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<PackedContext>,
    /// Things the pipeline changed on its own (fallbacks, trims).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Scatter-gather over one active replica of every shard, wherever it lives.
#[derive(Clone)]
pub struct RootSearch {
    access: ShardAccess,
    meta: Arc<SledMetaStore>,
    rerankers: RerankServices,
}

impl RootSearch {
    pub fn new(access: ShardAccess, meta: Arc<SledMetaStore>) -> Self {
        RootSearch {
            access,
            meta,
            rerankers: RerankServices::default(),
        }
    }

    /// The external rerank services this root may call.
    pub fn with_rerankers(mut self, rerankers: RerankServices) -> Self {
        self.rerankers = rerankers;
        self
    }

    pub fn rerankers(&self) -> &RerankServices {
        &self.rerankers
    }

    #[instrument(skip_all, fields(kb_id = %request.kb_id, shards = request.shards))]
    pub async fn search(&self, request: &SearchRequest) -> SearchResponse {
        let started = Instant::now();
        let mut queries = vec![(request.query.clone(), request.vector.clone())];
        queries.extend(request.extra_queries.iter().cloned());
        // One retrieval (gather, filter, fuse, rerank) per query, all at once.
        let mut runs = join_all(
            queries
                .iter()
                .map(|(text, vector)| self.retrieve_one(request, text, vector.clone())),
        )
        .await;
        let mut timings = SearchTimings::default();
        let mut failed_shards: Vec<FailedShard> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for run in &mut runs {
            timings.dense_ms = timings.dense_ms.max(run.dense_ms);
            timings.bm25_ms = timings.bm25_ms.max(run.bm25_ms);
            timings.graph_ms = timings.graph_ms.max(run.graph_ms);
            timings.retrieve_ms = timings.retrieve_ms.max(run.retrieve_ms);
            timings.rerank_ms = timings.rerank_ms.max(run.rerank_ms);
            for failed in run.failed_shards.drain(..) {
                if !failed_shards.iter().any(|f| f.shard == failed.shard) {
                    failed_shards.push(failed);
                }
            }
            for note in run.notes.drain(..) {
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
        }
        if request.vector.is_some() {
            metrics::histogram!("sift_search_channel_seconds", "channel" => "dense")
                .record(timings.dense_ms / 1e3);
        }
        if request.bm25 {
            metrics::histogram!("sift_search_channel_seconds", "channel" => "bm25")
                .record(timings.bm25_ms / 1e3);
        }
        let rerank = runs.first().and_then(|run| run.rerank.clone());
        let query_texts: Vec<String> = queries.iter().map(|(text, _)| text.clone()).collect();
        let mut hits = if runs.len() == 1 {
            runs.pop().map(|run| run.hits).unwrap_or_default()
        } else {
            fuse_queries(runs, request.rrf_k, &query_texts)
        };

        let pipeline = &request.pipeline;
        let links_started = Instant::now();
        if let Some((from, per_hit)) = pipeline.links {
            follow_links(&mut hits, from, per_hit);
        }
        timings.links_ms = links_started.elapsed().as_secs_f64() * 1e3;

        let mmr_started = Instant::now();
        let head = if pipeline.mmr_lambda.is_some() {
            pipeline.rerank_depth.max(request.top_k)
        } else {
            request.top_k
        };
        let sets = collapse_duplicates(&mut hits, pipeline.duplicate_similarity, head);
        if let Some(lambda) = pipeline.mmr_lambda {
            let head = head.min(hits.len()).min(sets.len());
            let tail = hits.split_off(head);
            mmr(&mut hits, &sets[..head], lambda, request.top_k);
            hits.extend(tail);
        }
        hits.truncate(request.top_k);
        timings.mmr_ms = mmr_started.elapsed().as_secs_f64() * 1e3;

        let expand_started = Instant::now();
        if pipeline.expand_neighbours > 0 {
            self.attach_neighbours(request, &mut hits).await;
        }
        let context = (pipeline.context_tokens > 0).then(|| {
            let packed = pack(&mut hits, pipeline.expand_parent, pipeline.context_tokens);
            notes.extend(packed.notes.iter().cloned());
            packed
        });
        timings.expand_ms = expand_started.elapsed().as_secs_f64() * 1e3;

        if request.explain {
            for hit in &mut hits {
                hit.explain = Some(hit.trace.join("; "));
                hit.path = Some(HitPath {
                    fused_rank: hit.fused_rank,
                    fused_score: hit.fused_score,
                    rerank_rank: hit.rerank_rank,
                    rerank_score: hit.rerank_score,
                    rerank_features: hit.features,
                    mmr: hit.mmr.clone(),
                    queries: hit
                        .queries
                        .iter()
                        .filter_map(|i| query_texts.get(*i).cloned())
                        .collect(),
                    steps: hit.trace.clone(),
                });
            }
        }
        timings.search_ms = started.elapsed().as_secs_f64() * 1e3;
        SearchResponse {
            hits,
            failed_shards,
            timings,
            rerank,
            queries: if query_texts.len() > 1 {
                query_texts
            } else {
                Vec::new()
            },
            context,
            notes,
        }
    }

    /// Leaf searches on every shard (one replica each, hedged), with the deadline; failed
    /// shards are reported, not fatal.
    pub(crate) async fn gather(
        &self,
        kb_id: &str,
        shards: u32,
        leaf: Arc<LeafRequest>,
    ) -> (Vec<LeafResponse>, Vec<FailedShard>) {
        let kb = match self.meta.get_kb(kb_id) {
            Ok(Some(kb)) => kb,
            outcome => {
                let reason = match outcome {
                    Err(error) => error.to_string(),
                    _ => "the knowledge base is gone".to_string(),
                };
                let failed = (0..shards)
                    .map(|shard| FailedShard {
                        shard,
                        reason: reason.clone(),
                    })
                    .collect();
                return (Vec::new(), failed);
            }
        };
        let kb = &kb;
        let leaves = (0..shards).map(|shard| {
            let leaf = leaf.clone();
            async move { (shard, self.access.search(kb, shard, leaf).await) }
        });
        // join_all, not try_join_all: one failed shard must not cancel its siblings.
        let outcomes = join_all(leaves).await;
        let mut failed_shards = Vec::new();
        let mut responses: Vec<LeafResponse> = Vec::new();
        for (shard, outcome) in outcomes {
            match outcome {
                Ok(response) => responses.push(response),
                Err(reason) => {
                    metrics::counter!("sift_search_failed_shards_total").increment(1);
                    warn!(shard, %reason, "leaf search failed");
                    failed_shards.push(FailedShard {
                        shard,
                        reason: reason.to_string(),
                    });
                }
            }
        }
        (responses, failed_shards)
    }

    /// Gather, per-channel relative filtering, fusion and rerank of one query.
    async fn retrieve_one(
        &self,
        request: &SearchRequest,
        text: &str,
        vector: Option<Vec<f32>>,
    ) -> QueryRun {
        let started = Instant::now();
        let dense_enabled = vector.is_some();
        let leaf = Arc::new(LeafRequest {
            query: text.to_string(),
            vector,
            exact: request.exact,
            bm25: request.bm25,
            k: request.candidates,
            filter: request.filter.clone(),
            graph: None,
        });
        let graph_query = request.graph.as_ref().filter(|_| text == request.query);
        let graph = async {
            match graph_query {
                Some(query) => Some(
                    self.graph_channel(
                        &request.kb_id,
                        request.shards,
                        &request.filter,
                        query,
                        request.candidates,
                        request.explain,
                    )
                    .await,
                ),
                None => None,
            }
        };
        let gather = async {
            if dense_enabled || request.bm25 {
                self.gather(&request.kb_id, request.shards, leaf).await
            } else {
                (Vec::new(), Vec::new())
            }
        };
        let ((responses, failed_shards), graph) = futures::join!(gather, graph);
        let mut run = QueryRun {
            failed_shards,
            ..QueryRun::default()
        };
        let mut graph_paths = HashMap::new();
        let mut graph_hits = None;
        if let Some(graph) = graph {
            run.graph_ms = graph.seconds * 1e3;
            for failed in graph.failed_shards {
                if !run.failed_shards.iter().any(|f| f.shard == failed.shard) {
                    run.failed_shards.push(failed);
                }
            }
            graph_paths = graph.paths;
            graph_hits = Some(graph.hits);
        }
        for response in &responses {
            run.dense_ms = run.dense_ms.max(response.dense_seconds * 1e3);
            run.bm25_ms = run.bm25_ms.max(response.bm25_seconds * 1e3);
        }
        let mut live = LiveDocuments::new(&self.meta, &request.kb_id);
        let dense = merge_channel(
            responses.iter().flat_map(|r| r.dense.iter()),
            request.candidates,
            &mut live,
        );
        let bm25 = merge_channel(
            responses.iter().flat_map(|r| r.bm25.iter()),
            request.candidates,
            &mut live,
        );
        let mut lists = Vec::new();
        if dense_enabled {
            lists.push((Channel::Dense, request.dense_weight, dense));
        }
        if request.bm25 {
            lists.push((Channel::Bm25, request.bm25_weight, bm25));
        }
        if let (Some(hits), Some(query)) = (graph_hits, &request.graph) {
            let hits = merge_channel(hits.iter(), request.candidates, &mut live);
            lists.push((Channel::Graph, query.weight, hits));
        }
        let pipeline = &request.pipeline;
        run.hits = if pipeline.min_relative_score > 0.0 {
            let filtered: Vec<_> = lists
                .iter()
                .map(|(channel, weight, hits)| {
                    (
                        *channel,
                        *weight,
                        relative_filter(hits, pipeline.min_relative_score),
                    )
                })
                .collect();
            let hits = fuse_lists(&filtered, request);
            if hits.len() < pipeline.min_results {
                run.notes.push(format!(
                    "relative score filter ({}) left {} hits, fewer than min_results {}: unfiltered lists used",
                    pipeline.min_relative_score,
                    hits.len(),
                    pipeline.min_results
                ));
                fuse_lists(&lists, request)
            } else {
                hits
            }
        } else {
            fuse_lists(&lists, request)
        };
        for hit in &mut run.hits {
            if let Some(path) = graph_paths.remove(&hit.chunk.chunk_id) {
                hit.trace.push(path);
            }
        }
        run.retrieve_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(model) = &pipeline.rerank {
            let rerank_started = Instant::now();
            let report = self
                .rerank(model, text, &mut run.hits, pipeline.rerank_depth, request)
                .await;
            if let Some(reason) = &report.reason {
                run.notes.push(format!(
                    "rerank ({model}) skipped: {reason}; fused order kept"
                ));
            }
            run.rerank = Some(report);
            run.rerank_ms = rerank_started.elapsed().as_secs_f64() * 1e3;
        }
        run
    }

    /// Reorders the head (`depth`) of `hits` by the reranker's scores; on failure leaves them.
    async fn rerank(
        &self,
        model: &str,
        query: &str,
        hits: &mut [SearchHit],
        depth: usize,
        request: &SearchRequest,
    ) -> RerankReport {
        let depth = depth.min(hits.len());
        let mut report = RerankReport {
            applied: false,
            model: model.to_string(),
            depth,
            reason: None,
        };
        if depth == 0 {
            report.reason = Some("no hits to rerank".to_string());
            return report;
        }
        let scores: Vec<(Option<Features>, f64)> = if model == EMBEDDED_RERANKER {
            rescore(
                query,
                hits,
                request.dense_weight,
                request.bm25_weight,
                request.graph.as_ref().map_or(0.0, |graph| graph.weight),
            )
            .into_iter()
            .take(depth)
            .map(|(features, score)| (Some(features), score))
            .collect()
        } else {
            let documents: Vec<&str> = hits[..depth]
                .iter()
                .map(|hit| hit.chunk.text.as_str())
                .collect();
            match self.rerankers.score(model, query, &documents).await {
                Ok(scores) => scores.into_iter().map(|score| (None, score)).collect(),
                Err(reason) => {
                    metrics::counter!("sift_rerank_total", "outcome" => "skipped").increment(1);
                    report.reason = Some(reason);
                    return report;
                }
            }
        };
        metrics::counter!("sift_rerank_total", "outcome" => "applied").increment(1);
        for (hit, (features, score)) in hits.iter_mut().zip(scores) {
            hit.rerank_score = Some(score);
            hit.features = features;
            hit.score = score;
        }
        let head = &mut hits[..depth];
        head.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.fused_rank.cmp(&b.fused_rank))
        });
        for (position, hit) in head.iter_mut().enumerate() {
            hit.rerank_rank = Some(position + 1);
            let features = hit
                .features
                .map(|f| {
                    let graph = if f.graph > 0.0 {
                        format!(", graph {:.3}", f.graph)
                    } else {
                        String::new()
                    };
                    format!(
                        " (dense {:.3}, bm25 {:.3}, coverage {:.3}, title {:.3}{graph})",
                        f.dense, f.bm25, f.coverage, f.title
                    )
                })
                .unwrap_or_default();
            hit.trace.push(format!(
                "rerank ({model}) #{} -> #{} score {:.4}{features}",
                hit.fused_rank,
                position + 1,
                hit.score
            ));
        }
        report.applied = true;
        report
    }

    /// Fetches the documents of `hits` from their shards, all at once, and attaches the
    /// chunks within `expand_neighbours` positions of each hit.
    async fn attach_neighbours(&self, request: &SearchRequest, hits: &mut [SearchHit]) {
        let reach = request.pipeline.expand_neighbours;
        let mut documents: Vec<String> = hits.iter().map(|h| h.chunk.document_id.clone()).collect();
        documents.sort();
        documents.dedup();
        let kb = self.meta.get_kb(&request.kb_id).ok().flatten();
        let kb = kb.as_ref();
        let fetches = documents.into_iter().map(|document_id| async move {
            let shard = self
                .meta
                .get_document(&request.kb_id, &document_id)
                .ok()
                .flatten()
                .map(|record| record.shard);
            let (Some(kb), Some(shard)) = (kb, shard) else {
                return (document_id, None);
            };
            let chunks = self
                .access
                .chunks(kb, shard, &document_id)
                .await
                .ok()
                .flatten();
            (document_id, chunks)
        });
        let fetched: HashMap<String, Option<Vec<ChunkView>>> =
            join_all(fetches).await.into_iter().collect();
        for hit in hits {
            let Some(Some(chunks)) = fetched.get(&hit.chunk.document_id) else {
                hit.trace
                    .push("expansion: neighbours unavailable (shard did not answer)".into());
                continue;
            };
            let position = hit.chunk.position;
            hit.neighbours = chunks
                .iter()
                .filter(|c| {
                    c.position != position
                        && c.position + reach >= position
                        && c.position <= position + reach
                })
                .map(|c| Neighbour {
                    chunk_id: c.chunk_id.clone(),
                    position: c.position,
                    text: c.text.clone(),
                })
                .collect();
            hit.trace.push(format!(
                "expansion: {} neighbour chunks (within {reach})",
                hit.neighbours.len()
            ));
        }
    }
}

/// What one query's retrieval produced.
#[derive(Default)]
struct QueryRun {
    hits: Vec<SearchHit>,
    failed_shards: Vec<FailedShard>,
    rerank: Option<RerankReport>,
    notes: Vec<String>,
    dense_ms: f64,
    bm25_ms: f64,
    graph_ms: f64,
    retrieve_ms: f64,
    rerank_ms: f64,
}

/// Moves candidates named in the top hits up behind the hits naming them (see
/// [`super::links`]), and says so in their traces.
fn follow_links(hits: &mut Vec<SearchHit>, from: usize, per_hit: usize) {
    let views: Vec<LinkView<'_>> = hits
        .iter()
        .map(|hit| LinkView {
            document_id: &hit.chunk.document_id,
            title: &hit.chunk.title,
            text: &hit.chunk.text,
        })
        .collect();
    let (order, moves) = links::follow(&views, from, per_hit);
    if moves.is_empty() {
        return;
    }
    let notes: Vec<(usize, String)> = moves
        .iter()
        .map(|link| {
            let new_rank = order.iter().position(|i| *i == link.moved).unwrap_or(0) + 1;
            let relation = if link.backlink { "names" } else { "named in" };
            (
                link.moved,
                format!(
                    "link: {relation} {:?} (rank {}), moved from rank {} to {new_rank}",
                    hits[link.linker].chunk.title,
                    link.linker + 1,
                    link.moved + 1
                ),
            )
        })
        .collect();
    let mut slots: Vec<Option<SearchHit>> = std::mem::take(hits).into_iter().map(Some).collect();
    for (index, note) in notes {
        if let Some(hit) = slots[index].as_mut() {
            hit.trace.push(note);
        }
    }
    *hits = order.into_iter().filter_map(|i| slots[i].take()).collect();
    metrics::counter!("sift_search_links_followed_total").increment(moves.len() as u64);
}

/// A channel's hits scoring at least `share` of its best (when the best is positive).
fn relative_filter(hits: &[ScoredChunk], share: f64) -> Vec<ScoredChunk> {
    let Some(best) = hits.first().map(|h| f64::from(h.score)) else {
        return Vec::new();
    };
    if best <= 0.0 {
        return hits.to_vec();
    }
    hits.iter()
        .filter(|h| f64::from(h.score) >= share * best)
        .cloned()
        .collect()
}

/// Fuses the channel lists of one query into hits, best first (zero-score hits dropped).
fn fuse_lists(
    lists: &[(Channel, f64, Vec<ScoredChunk>)],
    request: &SearchRequest,
) -> Vec<SearchHit> {
    let mut chunks: HashMap<String, ChunkView> = HashMap::new();
    let ranked: Vec<RankedList<String>> = lists
        .iter()
        .map(|(channel, weight, hits)| {
            let ranked = hits
                .iter()
                .map(|hit| {
                    let key = hit.chunk.chunk_id.clone();
                    chunks
                        .entry(key.clone())
                        .or_insert_with(|| hit.chunk.clone());
                    (key, hit.score)
                })
                .collect();
            (*channel, *weight, ranked)
        })
        .collect();
    let fused = match request.fusion {
        FusionMethod::Rrf => rrf_fuse(&ranked, request.rrf_k),
        FusionMethod::Dbsf => dbsf_fuse(&ranked),
    };
    fused
        .into_iter()
        .filter(|hit| hit.score > 0.0)
        .enumerate()
        .filter_map(|(position, hit)| {
            let chunk = chunks.remove(&hit.key)?;
            let line = explain_hit(&hit.channels, hit.score, request);
            Some(SearchHit {
                chunk,
                score: hit.score,
                fused_score: hit.score,
                rerank_score: None,
                channels: hit.channels.into_iter().collect(),
                also_in: Vec::new(),
                neighbours: Vec::new(),
                citation: None,
                explain: None,
                path: None,
                trace: vec![format!("{line} (fused #{})", position + 1)],
                mmr: None,
                features: None,
                fused_rank: position + 1,
                rerank_rank: None,
                queries: vec![0],
            })
        })
        .collect()
}

/// Reciprocal rank fusion of several queries' final lists (by chunk id).
fn fuse_queries(runs: Vec<QueryRun>, k: f64, texts: &[String]) -> Vec<SearchHit> {
    let mut fused: HashMap<String, (f64, usize, SearchHit, Vec<String>)> = HashMap::new();
    for (query, run) in runs.into_iter().enumerate() {
        for (position, mut hit) in run.hits.into_iter().enumerate() {
            let contribution = 1.0 / (k + (position + 1) as f64);
            let line = format!("query {query} #{}", position + 1);
            match fused.get_mut(&hit.chunk.chunk_id) {
                Some(entry) => {
                    entry.0 += contribution;
                    entry.1 = entry.1.min(position + 1);
                    entry.2.queries.push(query);
                    entry.3.push(line);
                }
                None => {
                    hit.queries = vec![query];
                    fused.insert(
                        hit.chunk.chunk_id.clone(),
                        (contribution, position + 1, hit, vec![line]),
                    );
                }
            }
        }
    }
    let mut hits: Vec<(f64, usize, SearchHit, Vec<String>)> = fused.into_values().collect();
    hits.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| a.2.chunk.chunk_id.cmp(&b.2.chunk.chunk_id))
    });
    hits.into_iter()
        .map(|(score, _, mut hit, lines)| {
            hit.score = score;
            hit.trace.push(format!(
                "multi-query ({} queries): {} -> rrf {score:.4}",
                texts.len(),
                lines.join(", ")
            ));
            hit
        })
        .collect()
}

/// `"dense #3 (score 0.6120) -> 0.0159; bm25 #1 (score 12.3000) -> 0.0164; fused (rrf, k 60) 0.0323"`.
fn explain_hit(
    channels: &[(Channel, ChannelHitInfo)],
    fused: f64,
    request: &SearchRequest,
) -> String {
    let mut parts: Vec<String> = channels
        .iter()
        .map(|(channel, info)| {
            format!(
                "{} #{} (score {:.4}) -> {:.4}",
                channel.as_str(),
                info.rank,
                info.score,
                info.contribution
            )
        })
        .collect();
    if channels.len() == 1 {
        parts.push("found by one channel only".to_string());
    }
    match request.fusion {
        FusionMethod::Rrf => parts.push(format!("fused (rrf, k {}) {fused:.4}", request.rrf_k)),
        FusionMethod::Dbsf => parts.push(format!("fused (dbsf) {fused:.4}")),
    }
    parts.join("; ")
}

/// Merges one channel's hits from all shards by the channel's own score; drops documents that
/// were deleted after the shard answered (the metadata tombstone is the authority).
fn merge_channel<'a>(
    hits: impl Iterator<Item = &'a ScoredChunk>,
    limit: usize,
    live: &mut LiveDocuments<'_>,
) -> Vec<ScoredChunk> {
    let mut merged: Vec<&ScoredChunk> = hits.collect();
    merged.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.chunk.chunk_id.cmp(&b.chunk.chunk_id))
    });
    merged
        .into_iter()
        .filter(|hit| live.is_live(&hit.chunk.document_id))
        .take(limit)
        .cloned()
        .collect()
}

/// Memoised "is this document still live" checks against the metadata store.
struct LiveDocuments<'a> {
    meta: &'a SledMetaStore,
    kb_id: &'a str,
    known: HashMap<String, bool>,
}

impl<'a> LiveDocuments<'a> {
    fn new(meta: &'a SledMetaStore, kb_id: &'a str) -> Self {
        LiveDocuments {
            meta,
            kb_id,
            known: HashMap::new(),
        }
    }

    fn is_live(&mut self, document_id: &str) -> bool {
        if let Some(live) = self.known.get(document_id) {
            return *live;
        }
        // On a metadata read error keep the hit: the shard already filters its tombstones.
        let live = !self
            .meta
            .is_tombstoned(self.kb_id, document_id)
            .unwrap_or(false);
        self.known.insert(document_id.to_string(), live);
        live
    }
}
