//! `knowledge_search`: hybrid search over the run's KBs, every (KB, query) pair in parallel.
//! The first search of the question also runs the plan's sub-queries and rewrites. Hits are
//! merged by chunk id (best relevance kept) and summarised for the model with their chunk ids.

use futures::future::join_all;
use serde::Deserialize;

use super::{ToolContext, ToolError, ToolOutput, select_kbs};
use crate::agent::evidence::EvidenceChunk;
use crate::agent::terms::truncate_chars;
use crate::agent::{FailedShardRef, HitRef};
use crate::retrieval::{Channel, SearchHit};
use sift_api::search::SearchQuery;

pub const DEFAULT_TOP_K: usize = 8;
pub const MAX_TOP_K: usize = 20;
/// Queries one search may run (the query plus planned ones).
pub const MAX_QUERIES: usize = 4;
/// Characters of a hit's text shown to the model.
const HIT_CHARS: usize = 700;

#[derive(Debug, Deserialize)]
pub struct SearchArgs {
    pub query: String,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub kb: Option<String>,
}

/// A hit's relevance in [0, 1]: the dense cosine when the dense channel found it, else the
/// fused score over the two channels' maximum (distribution-based fusion maps each channel to
/// [0, 1]), whichever is higher.
pub fn relevance(hit: &SearchHit) -> f64 {
    let dense = hit
        .channels
        .get(&Channel::Dense)
        .map(|info| info.score as f64)
        .unwrap_or(0.0);
    let fused = (hit.score / 2.0).clamp(0.0, 1.0);
    dense.max(fused).clamp(0.0, 1.0)
}

pub async fn knowledge_search(
    context: &ToolContext<'_>,
    args: SearchArgs,
) -> Result<ToolOutput, ToolError> {
    let query = args.query.trim();
    if query.is_empty() {
        return Err(ToolError::BadArguments {
            tool: super::KNOWLEDGE_SEARCH.into(),
            message: "query is empty".into(),
        });
    }
    let query: String = query.chars().take(2000).collect();
    let top_k = args
        .top_k
        .unwrap_or(context.plan.top_k.max(DEFAULT_TOP_K))
        .clamp(1, MAX_TOP_K);
    let kbs = select_kbs(context, args.kb.as_deref())?;
    let queries = if context.first_search {
        context.plan.search_queries(&query, MAX_QUERIES)
    } else {
        vec![query.clone()]
    };
    let (merged, failed, errors) = search_all(context.corpus, &kbs, &queries, top_k).await;
    if merged.is_empty() && !errors.is_empty() && errors.len() == kbs.len() * queries.len() {
        return Err(ToolError::Failed(format!("search failed: {}", errors[0])));
    }
    let mut content = String::new();
    if queries.len() > 1 {
        content.push_str(&format!(
            "Searched {:?} and the planned queries {:?}.\n",
            query,
            &queries[1..]
        ));
    }
    if !failed.is_empty() {
        content.push_str(&format!(
            "Partial results: {} shard(s) did not answer.\n",
            failed.len()
        ));
    }
    if merged.is_empty() {
        content.push_str("No hits.");
    }
    for (index, hit) in merged.iter().enumerate() {
        content.push_str(&render_hit(index + 1, hit));
    }
    let hits = merged
        .iter()
        .map(|hit| HitRef {
            chunk_id: hit.chunk.chunk_id.clone(),
            document_id: hit.chunk.document_id.clone(),
            title: hit.chunk.title.clone(),
            score: hit.score,
        })
        .collect();
    Ok(ToolOutput {
        summary: format!(
            "{} hit(s) for {:?}{}",
            merged.len(),
            truncate_chars(&query, 120),
            if queries.len() > 1 {
                format!(" (+{} planned queries)", queries.len() - 1)
            } else {
                String::new()
            }
        ),
        content,
        hits,
        chunks: merged,
        failed_shards: failed,
        queries,
    })
}

/// Runs every query on every KB in parallel and merges the hits by chunk id, best first.
/// `join_all`: one failing KB or query must not cancel the others.
pub async fn search_all(
    corpus: &dyn crate::agent::Corpus,
    kbs: &[String],
    queries: &[String],
    top_k: usize,
) -> (Vec<EvidenceChunk>, Vec<FailedShardRef>, Vec<String>) {
    let searches = kbs.iter().flat_map(|kb| {
        queries.iter().map(move |query| async move {
            let outcome = corpus
                .search(
                    kb,
                    SearchQuery {
                        query: query.clone(),
                        top_k: Some(top_k),
                        ..Default::default()
                    },
                )
                .await;
            (kb.clone(), outcome)
        })
    });
    let mut merged: Vec<EvidenceChunk> = Vec::new();
    let mut failed: Vec<FailedShardRef> = Vec::new();
    let mut errors = Vec::new();
    for (kb_id, outcome) in join_all(searches).await {
        match outcome {
            Ok(response) => {
                for shard in response.failed_shards {
                    if !failed
                        .iter()
                        .any(|f| f.kb_id == kb_id && f.shard == shard.shard)
                    {
                        failed.push(FailedShardRef {
                            kb_id: kb_id.clone(),
                            shard: shard.shard,
                            reason: shard.reason,
                        });
                    }
                }
                for hit in response.hits {
                    let relevance = relevance(&hit);
                    match merged
                        .iter_mut()
                        .find(|known| known.chunk.chunk_id == hit.chunk.chunk_id)
                    {
                        Some(known) => {
                            if relevance > known.relevance {
                                known.relevance = relevance;
                                known.score = hit.score;
                            }
                        }
                        None => merged.push(EvidenceChunk {
                            kb_id: kb_id.clone(),
                            relevance,
                            score: hit.score,
                            chunk: hit.chunk,
                            searched: true,
                        }),
                    }
                }
            }
            Err(error) => errors.push(format!("{kb_id}: {error}")),
        }
    }
    merged.sort_by(|a, b| {
        b.relevance
            .total_cmp(&a.relevance)
            .then(b.score.total_cmp(&a.score))
    });
    merged.truncate(top_k);
    (merged, failed, errors)
}

/// One hit as the model reads it.
pub fn render_hit(index: usize, hit: &EvidenceChunk) -> String {
    let chunk = &hit.chunk;
    let section = if chunk.heading_path.is_empty() {
        String::new()
    } else {
        format!(" | section: {}", chunk.heading_path.join(" › "))
    };
    format!(
        "\nHit {index}: chunk_id: {} | document: {:?} (document_id {}, position {}){section} | relevance {:.2}\n{}\n",
        chunk.chunk_id,
        chunk.title,
        chunk.document_id,
        chunk.position,
        hit.relevance,
        truncate_chars(chunk.text.trim(), HIT_CHARS)
    )
}
