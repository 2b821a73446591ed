//! Communities of a KB's entity graph, for global questions ("what are the main themes
//! across these documents?", issue 20 item 6, ADR 0039): the most mentioned entities of every
//! shard (hubs, dates and quantities left out), weighted by the chunks they share, partitioned
//! by Louvain ([`sift_graph::communities`]); each community shown with its most mentioned
//! members and the chunks that mention most of them. A summary of each, by the node's chat
//! model, is made only when asked (`summaries`), at query time, and cached on the node by the
//! text it was made from, so a community whose passages did not change is never summarised
//! twice. Everything is made at query time from the shards' partitions: nothing to keep in
//! step with writes and deletes, and a deleted document is never part of a community.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use sift_models::llm::{ChatMessage, SharedChatModel};
use sift_storage::chunk::ChunkView;
use sift_storage::shard::GraphEntity;

use super::SiftNode;
use super::graph::{EntityView, hex};
use crate::agent::model_io::{AuxError, complete_text};
use crate::error::Result;
use crate::retrieval::graph::is_hub;
use crate::scope::Scope;
use crate::shards::{GraphLeafRequest, GraphLeafResponse};

/// Most communities one answer lists.
pub const MAX_COMMUNITIES: usize = 20;
/// Entities the partition is made from: the most mentioned of the KB.
const CONSIDERED: usize = 300;
/// Chunks read per entity to weigh its ties.
const PER_ENTITY: usize = 32;
/// A community has at least this many members.
const MIN_MEMBERS: usize = 3;
/// Members and passages shown per community.
const MEMBERS_SHOWN: usize = 12;
const PASSAGES: usize = 3;
/// Part of the summary cache's key: a new prompt summarises again.
const SUMMARY_VERSION: &str = "community-v1";
/// A passage's text in the summary prompt at most (chars), and the summary's length.
const SUMMARY_PASSAGE_CHARS: usize = 1_500;
const SUMMARY_TOKENS: u32 = 256;

const SUMMARY_INSTRUCTIONS: &str = "You summarise what a group of passages from a \
knowledge base is about. Write two or three plain sentences in the passages' language: the \
theme they share and the main entities, using only what the passages say. No list, no \
preamble, no citation marks.";

/// A group of entities mentioned together more than chance has it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct CommunityView {
    /// 16 hexadecimal digits made from its members: the same members, the same id.
    pub id: String,
    /// Its members (of the entities considered).
    pub size: u32,
    /// Chunks (of those read) that mention two of its members or more.
    pub chunks: u32,
    /// Its most mentioned members, at most 12.
    pub members: Vec<EntityView>,
    /// The chunks that mention most of its members, at most 3: what it is about, citable.
    pub passages: Vec<ChunkView>,
    /// What its passages share, in a few sentences by the node's chat model: only when asked
    /// for (`summaries`) and a model answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Why a summary asked for is missing: no chat model is configured, or it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary_error: Option<String>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct CommunityList {
    /// Most chunks first.
    pub communities: Vec<CommunityView>,
    /// The entities the partition was made from: the KB's most mentioned, hubs, dates and
    /// quantities left out, that a chunk the caller reads mentions.
    pub entities_considered: u32,
}

/// A community before its members and passages are looked up.
struct Found {
    members: Vec<u64>,
    /// Chunk ids with the number of members each mentions (two or more), most first.
    chunks: Vec<(String, u32)>,
}

impl SiftNode {
    /// Up to `limit` communities of `kb`'s graph, each with a summary when `summaries` (see
    /// the module docs).
    pub async fn graph_communities(
        &self,
        scope: &Scope,
        kb: &str,
        limit: usize,
        summaries: bool,
    ) -> Result<CommunityList> {
        let (kb, filter) = self.graph_kb(scope, kb).await?;
        let limit = limit.clamp(1, MAX_COMMUNITIES);
        let chunks_total = self.graph_chunks_total(&kb, &filter).await;
        // The KB's most mentioned entities, their counts summed over the shards.
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for response in self
            .graph_round(&kb, &filter, GraphLeafRequest::Top { limit: CONSIDERED })
            .await
        {
            if let GraphLeafResponse::Entities(entities) = response {
                for GraphEntity { id, chunks, .. } in entities {
                    *counts.entry(id).or_default() += u64::from(chunks);
                }
            }
        }
        let mut considered: Vec<(u64, u64)> = counts
            .into_iter()
            .filter(|(_, chunks)| !is_hub(*chunks, chunks_total))
            .collect();
        considered.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        considered.truncate(CONSIDERED);
        let candidates: HashSet<u64> = considered.iter().map(|(id, _)| *id).collect();
        // Which candidates each chunk (that the caller reads) mentions.
        let mut members_of: HashMap<String, Vec<u64>> = HashMap::new();
        let frontier: Vec<u64> = considered.iter().map(|(id, _)| *id).collect();
        for neighbourhood in self
            .neighbourhoods(&kb, &filter, frontier, PER_ENTITY)
            .await
        {
            for chunk in neighbourhood.chunks {
                members_of.entry(chunk.chunk_id).or_insert_with(|| {
                    let mut members: Vec<u64> = chunk
                        .entities
                        .iter()
                        .map(|(id, _)| *id)
                        .filter(|id| candidates.contains(id))
                        .collect();
                    members.sort_unstable();
                    members.dedup();
                    members
                });
            }
        }
        let readable: HashSet<u64> = members_of.values().flatten().copied().collect();
        // Summed per pair here: at most CONSIDERED² / 2 pairs, however many chunks name them.
        let mut shared: HashMap<(u64, u64), f64> = HashMap::new();
        for members in members_of.values() {
            for (i, a) in members.iter().enumerate() {
                for b in &members[i + 1..] {
                    *shared.entry((*a, *b)).or_default() += 1.0;
                }
            }
        }
        let edges: Vec<(u64, u64, f64)> = shared
            .into_iter()
            .map(|((a, b), weight)| (a, b, weight))
            .collect();
        let partition = tokio::task::spawn_blocking(move || sift_graph::communities(&edges))
            .await
            .map_err(|error| crate::error::SiftError::Internal(format!("communities: {error}")))?;
        let mut found: Vec<Found> = partition
            .into_iter()
            .filter(|members| members.len() >= MIN_MEMBERS)
            .map(|members| {
                let set: HashSet<u64> = members.iter().copied().collect();
                let mut chunks: Vec<(String, u32)> = members_of
                    .iter()
                    .map(|(chunk, in_it)| {
                        let n = in_it.iter().filter(|id| set.contains(id)).count() as u32;
                        (chunk.clone(), n)
                    })
                    .filter(|(_, n)| *n >= 2)
                    .collect();
                chunks.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                Found { members, chunks }
            })
            .collect();
        found.sort_by(|a, b| {
            b.chunks
                .len()
                .cmp(&a.chunks.len())
                .then(b.members.len().cmp(&a.members.len()))
                .then(a.members[0].cmp(&b.members[0]))
        });
        found.truncate(limit);
        // Names of the members shown, and the passages' views, in one round each.
        let rank: HashMap<u64, u64> = considered.iter().copied().collect();
        let mut shown: Vec<Vec<u64>> = Vec::with_capacity(found.len());
        for community in &found {
            let mut members = community.members.clone();
            members.sort_by(|a, b| rank[b].cmp(&rank[a]).then(a.cmp(b)));
            members.truncate(MEMBERS_SHOWN);
            shown.push(members);
        }
        let views = self.entity_views(&kb, &filter, shown.concat()).await;
        let hits: Vec<(String, f32)> = found
            .iter()
            .flat_map(|c| c.chunks.iter().take(PASSAGES))
            .map(|(chunk, n)| (chunk.clone(), *n as f32))
            .collect();
        let mut passages: HashMap<String, ChunkView> = HashMap::new();
        for response in self
            .graph_round(&kb, &filter, GraphLeafRequest::Chunks { hits })
            .await
        {
            if let GraphLeafResponse::Chunks(chunks) = response {
                passages.extend(
                    chunks
                        .into_iter()
                        .map(|hit| (hit.chunk.chunk_id.clone(), hit.chunk)),
                );
            }
        }
        let mut communities: Vec<CommunityView> = found
            .iter()
            .zip(shown)
            .map(|(community, members)| CommunityView {
                id: hex(community_id(&community.members)),
                size: community.members.len() as u32,
                chunks: community.chunks.len() as u32,
                members: members
                    .iter()
                    .filter_map(|id| views.get(id).cloned())
                    .collect(),
                passages: community
                    .chunks
                    .iter()
                    .take(PASSAGES)
                    .filter_map(|(chunk, _)| passages.get(chunk).cloned())
                    .collect(),
                summary: None,
                summary_error: None,
            })
            .collect();
        if summaries {
            self.summarise(&mut communities).await;
        }
        Ok(CommunityList {
            communities,
            entities_considered: readable.len() as u32,
        })
    }

    /// Fills each community's summary from the cache or the node's chat model, one request
    /// at a time (a small local model serves one well, several slowly), all of them within
    /// `graph_llm_timeout_ms`.
    async fn summarise(&self, communities: &mut [CommunityView]) {
        let Some(model) = self.context.chat_model.get() else {
            for community in communities {
                community.summary_error = Some("no chat model is configured".into());
            }
            return;
        };
        // One deadline for the whole answer: a slow model leaves the later communities
        // without a summary rather than holding the request for each in turn.
        let deadline = tokio::time::Instant::now() + self.context.options.graph_llm_timeout;
        for community in communities {
            let prompt = summary_prompt(community);
            let cache = &self.context.extraction_cache;
            if let Ok(Some(bytes)) = cache.get(model.name(), SUMMARY_VERSION, &prompt)
                && let Ok(summary) = String::from_utf8(bytes)
            {
                metrics::counter!("sift_graph_community_summaries_total", "outcome" => "cache")
                    .increment(1);
                community.summary = Some(summary);
                continue;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                community.summary_error = Some(format!(
                    "not summarised: the summaries took graph_llm_timeout_ms ({} s) already",
                    self.context.options.graph_llm_timeout.as_secs()
                ));
                continue;
            }
            match summarise_one(model, &prompt, left).await {
                Ok(summary) => {
                    metrics::counter!("sift_graph_community_summaries_total", "outcome" => "model")
                        .increment(1);
                    let _ = cache.put(model.name(), SUMMARY_VERSION, &prompt, summary.as_bytes());
                    community.summary = Some(summary);
                }
                Err(error) => {
                    metrics::counter!("sift_graph_community_summaries_total", "outcome" => "failed")
                        .increment(1);
                    community.summary_error = Some(error);
                }
            }
        }
    }
}

/// A community's id: the first 8 bytes of the SHA-256 of its members' ids, in order.
fn community_id(members: &[u64]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for id in members {
        hasher.update(id.to_be_bytes());
    }
    let digest = hasher.finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// What the model reads: the members' names, then the passages (numbered).
fn summary_prompt(community: &CommunityView) -> String {
    let names: Vec<&str> = community.members.iter().map(|m| m.name.as_str()).collect();
    let mut prompt = format!("Entities: {}\n\nPassages:\n", names.join(", "));
    for (n, passage) in community.passages.iter().enumerate() {
        let text: String = passage
            .text
            .trim()
            .chars()
            .take(SUMMARY_PASSAGE_CHARS)
            .collect();
        prompt.push_str(&format!("[{}] {}\n", n + 1, text));
    }
    prompt
}

/// One summary: the model's text, trimmed; an error, an empty answer or the time left running
/// out is a reason.
async fn summarise_one(
    model: &SharedChatModel,
    prompt: &str,
    timeout: Duration,
) -> std::result::Result<String, String> {
    let messages = vec![
        ChatMessage::System {
            content: SUMMARY_INSTRUCTIONS.into(),
        },
        ChatMessage::User {
            content: prompt.to_string(),
        },
    ];
    // Nothing cancels a summary but its deadline.
    let never = crate::agent::RunCancel::new();
    let (answer, _) = complete_text(
        model.as_ref(),
        messages,
        Some(SUMMARY_TOKENS),
        timeout,
        &never,
    )
    .await
    .map_err(|error| match error {
        AuxError::Timeout(_) => "the model did not answer within graph_llm_timeout_ms".to_string(),
        other => format!("the model failed: {other}"),
    })?;
    let summary = answer.trim();
    if summary.is_empty() {
        return Err("the model answered with no text".into());
    }
    Ok(summary.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_community_id_depends_on_its_members_only() {
        assert_eq!(community_id(&[1, 2, 3]), community_id(&[1, 2, 3]));
        assert_ne!(community_id(&[1, 2, 3]), community_id(&[1, 2, 4]));
    }
}
