//! The search root: plans one leaf request per shard, gathers with a deadline, merges.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use ractor::rpc::CallResult;
use serde::Serialize;
use sift_storage::chunk::{ChunkView, ScoredChunk, SearchFilter};
use sift_storage::meta::SledMetaStore;
use tracing::{instrument, warn};

use super::fusion::{Channel, ChannelHitInfo, FusionMethod, dbsf_fuse, rrf_fuse};
use crate::shards::{LeafRequest, LeafResponse, ShardMessage, ShardRegistry};

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
}

#[derive(Clone, Debug, Serialize)]
pub struct SearchHit {
    #[serde(flatten)]
    pub chunk: ChunkView,
    /// The fused (RRF) score.
    pub score: f64,
    /// Rank, score and RRF contribution of the hit in each channel that found it.
    pub channels: HashMap<Channel, ChannelHitInfo>,
    /// With `explain`: why the hit is here, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explain: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedShard {
    pub shard: u32,
    pub reason: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SearchTimings {
    pub embed_ms: f64,
    /// Slowest shard's dense / BM25 time.
    pub dense_ms: f64,
    pub bm25_ms: f64,
    pub search_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SearchResponse {
    pub hits: Vec<SearchHit>,
    pub failed_shards: Vec<FailedShard>,
    pub timings: SearchTimings,
}

/// Scatter-gather over the shard replicas of this node.
#[derive(Clone)]
pub struct RootSearch {
    registry: ShardRegistry,
    meta: Arc<SledMetaStore>,
    shard_deadline: Duration,
}

impl RootSearch {
    pub fn new(
        registry: ShardRegistry,
        meta: Arc<SledMetaStore>,
        shard_deadline: Duration,
    ) -> Self {
        RootSearch {
            registry,
            meta,
            shard_deadline,
        }
    }

    #[instrument(skip_all, fields(kb_id = %request.kb_id, shards = request.shards))]
    pub async fn search(&self, request: &SearchRequest) -> SearchResponse {
        let started = Instant::now();
        let leaf = Arc::new(LeafRequest {
            query: request.query.clone(),
            vector: request.vector.clone(),
            exact: request.exact,
            bm25: request.bm25,
            k: request.candidates,
            filter: request.filter.clone(),
        });
        let leaves = (0..request.shards).map(|shard| {
            let actor = self.registry.actor(&request.kb_id, shard);
            let leaf = leaf.clone();
            let deadline = self.shard_deadline;
            async move {
                let Some(actor) = actor else {
                    return (shard, Err("shard replica is not running".to_string()));
                };
                let call = actor
                    .call(
                        |reply| ShardMessage::Search {
                            request: leaf,
                            reply,
                        },
                        Some(deadline),
                    )
                    .await;
                let outcome = match call {
                    Ok(CallResult::Success(Ok(response))) => Ok(response),
                    Ok(CallResult::Success(Err(error))) => Err(error.to_string()),
                    Ok(CallResult::Timeout) => {
                        Err(format!("no answer within {} ms", deadline.as_millis()))
                    }
                    Ok(CallResult::SenderError) => {
                        Err("shard replica stopped before answering".to_string())
                    }
                    Err(error) => Err(format!("shard replica unreachable: {error}")),
                };
                (shard, outcome)
            }
        });
        // join_all, not try_join_all: one failed shard must not cancel its siblings.
        let outcomes = join_all(leaves).await;
        let mut failed_shards = Vec::new();
        let mut responses: Vec<LeafResponse> = Vec::new();
        for (shard, outcome) in outcomes {
            match outcome {
                Ok(response) => {
                    metrics::counter!("sift_search_leaf_total", "outcome" => "ok").increment(1);
                    responses.push(response);
                }
                Err(reason) => {
                    metrics::counter!("sift_search_leaf_total", "outcome" => "failed").increment(1);
                    warn!(shard, %reason, "leaf search failed");
                    failed_shards.push(FailedShard { shard, reason });
                }
            }
        }
        let mut timings = SearchTimings::default();
        for response in &responses {
            timings.dense_ms = timings.dense_ms.max(response.dense_seconds * 1e3);
            timings.bm25_ms = timings.bm25_ms.max(response.bm25_seconds * 1e3);
        }
        if request.vector.is_some() {
            metrics::histogram!("sift_search_channel_seconds", "channel" => "dense")
                .record(timings.dense_ms / 1e3);
        }
        if request.bm25 {
            metrics::histogram!("sift_search_channel_seconds", "channel" => "bm25")
                .record(timings.bm25_ms / 1e3);
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
        let mut chunks: HashMap<String, ChunkView> = HashMap::new();
        let mut lists = Vec::new();
        for (channel, weight, hits, enabled) in [
            (
                Channel::Dense,
                request.dense_weight,
                dense,
                request.vector.is_some(),
            ),
            (Channel::Bm25, request.bm25_weight, bm25, request.bm25),
        ] {
            if !enabled {
                continue;
            }
            let ranked = hits
                .into_iter()
                .map(|hit| {
                    let key = hit.chunk.chunk_id.clone();
                    let score = hit.score;
                    chunks.entry(key.clone()).or_insert(hit.chunk);
                    (key, score)
                })
                .collect();
            lists.push((channel, weight, ranked));
        }
        let fused = match request.fusion {
            FusionMethod::Rrf => rrf_fuse(&lists, request.rrf_k),
            FusionMethod::Dbsf => dbsf_fuse(&lists),
        };
        let hits = fused
            .into_iter()
            .filter(|hit| hit.score > 0.0)
            .take(request.top_k)
            .filter_map(|hit| {
                let chunk = chunks.remove(&hit.key)?;
                let explain = request
                    .explain
                    .then(|| explain_hit(&hit.channels, hit.score, request));
                Some(SearchHit {
                    chunk,
                    score: hit.score,
                    channels: hit.channels.into_iter().collect(),
                    explain,
                })
            })
            .collect();
        timings.search_ms = started.elapsed().as_secs_f64() * 1e3;
        SearchResponse {
            hits,
            failed_shards,
            timings,
        }
    }
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
