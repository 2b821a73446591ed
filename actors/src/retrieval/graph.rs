//! The graph channel (GraphRAG, ADR 0037): chunks reached from the query's entities over the
//! entity graph, scored by the mass that reaches them.
//!
//! Each shard replica holds the graph partition of its chunks (which entities each chunk
//! mentions, `sift_storage::shard::graph`); entity ids are global, so the root bridges an
//! entity across shards. A search runs in rounds, each a scatter-gather of one
//! [`GraphLeafRequest`] over every shard:
//! 1. *Seeds.* The names the query may refer to (`sift_graph::query_names`) are looked up;
//!    those the KB holds, not hubs, and not a shorter part of another found name, seed the
//!    walk, each with mass `ln(1 + N / df)` (N chunks, df the chunks mentioning it),
//!    normalised to 1. No seed: the channel is empty, and no further round runs.
//! 2. *Hops* (at most `hops`, [`MAX_HOPS`]). The frontier (the [`FRONTIER`] heaviest entities
//!    not yet expanded) asks every shard for the chunks mentioning each entity
//!    ([`PER_ENTITY`] each, most occurrences first). An entity's mass spreads over its
//!    chunks by `1 + ln(occurrences)`; a chunk gains `DAMPING^hop` times what reaches it, and
//!    passes what reached it on to its other entities, in proportion to their specificity
//!    (`ln(1 + N / df)`). An entity mentioned by more than [`HUB_SHARE`] of the chunks (and
//!    at least [`HUB_MIN_CHUNKS`]) is a hub: never expanded, so one name every document
//!    carries does not flood the walk.
//! 3. *Hits.* The best `k` chunks by mass are fetched from their shards (filters and access
//!    groups apply in every round), with the path that brought the most mass to each.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use sift_storage::chunk::{ScoredChunk, SearchFilter};
use sift_storage::shard::GraphEntity;

use super::root::{FailedShard, RootSearch};
use crate::shards::{GraphLeafRequest, GraphLeafResponse, LeafRequest};

/// Most hops a graph search may take.
pub const MAX_HOPS: u32 = 3;
/// Entities expanded per hop.
pub const FRONTIER: usize = 16;
/// Chunks read per expanded entity (per shard).
pub const PER_ENTITY: usize = 32;
/// Share of a hop's mass a chunk keeps at each further hop.
const DAMPING: f64 = 0.5;
/// An entity in more than this share of the chunks (and in at least `HUB_MIN_CHUNKS`) is a
/// hub.
pub const HUB_SHARE: f64 = 0.05;
pub const HUB_MIN_CHUNKS: u64 = 16;

/// A graph search's input: the query's candidate names (canonical, id).
#[derive(Clone, Debug, PartialEq)]
pub struct GraphQuery {
    pub names: Vec<(String, u64)>,
    pub hops: u32,
    pub weight: f64,
}

/// What the channel found.
#[derive(Debug, Default)]
pub struct GraphRun {
    /// Best first; score = mass.
    pub hits: Vec<ScoredChunk>,
    /// Per chunk id: the path that brought it the most mass, in words.
    pub paths: HashMap<String, String>,
    pub failed_shards: Vec<FailedShard>,
    /// Seeds found, hops taken.
    pub seeds: usize,
    pub hops: u32,
    pub seconds: f64,
}

/// How an entity or a chunk was reached: from which entity, through which chunk.
#[derive(Clone, Debug)]
struct Step {
    from_entity: u64,
    via_chunk: Option<String>,
    hop: u32,
}

pub(crate) fn is_hub(df: u64, chunks: u64) -> bool {
    df >= HUB_MIN_CHUNKS && df as f64 > HUB_SHARE * chunks as f64
}

fn specificity(df: u64, chunks: u64) -> f64 {
    (1.0 + chunks as f64 / df.max(1) as f64).ln()
}

impl RootSearch {
    /// Runs the graph channel of `query` over the KB's shards (see the module docs).
    pub(crate) async fn graph_channel(
        &self,
        kb_id: &str,
        shards: u32,
        filter: &SearchFilter,
        query: &GraphQuery,
        k: usize,
        explain: bool,
    ) -> GraphRun {
        let started = Instant::now();
        let mut run = GraphRun::default();
        let round = |step: GraphLeafRequest| Arc::new(LeafRequest::graph(filter, k, step));

        // 1. Seeds.
        let ids: Vec<u64> = query.names.iter().map(|(_, id)| *id).collect();
        let (responses, failed) = self
            .gather(kb_id, shards, round(GraphLeafRequest::Counts { ids }))
            .await;
        run.failed_shards.extend(failed);
        let mut df: HashMap<u64, u64> = HashMap::new();
        let mut chunks = 0u64;
        let answered = responses.len().max(1) as u64;
        for response in responses {
            if let Some(GraphLeafResponse::Counts { counts, chunks: n }) = response.graph {
                chunks += n;
                for (id, count) in counts {
                    *df.entry(id).or_default() += u64::from(count);
                }
            }
        }
        let found: Vec<&(String, u64)> = query
            .names
            .iter()
            .filter(|(_, id)| df.get(id).is_some_and(|&d| !is_hub(d, chunks)))
            .collect();
        // A found name inside another found name ("strange" in "doctor strange") is not a seed.
        let seeds: Vec<u64> = found
            .iter()
            .filter(|(name, _)| {
                !found
                    .iter()
                    .any(|(other, _)| other.len() > name.len() && contains_words(other, name))
            })
            .map(|(_, id)| *id)
            .collect();
        run.seeds = seeds.len();
        if seeds.is_empty() {
            run.seconds = started.elapsed().as_secs_f64();
            return run;
        }
        let mut mass: HashMap<u64, f64> = seeds
            .iter()
            .map(|id| (*id, specificity(df[id], chunks)))
            .collect();
        let total: f64 = mass.values().sum();
        mass.values_mut().for_each(|m| *m /= total);

        // 2. Hops.
        let mut reached_by: HashMap<u64, Step> = HashMap::new();
        let mut best_share: HashMap<u64, f64> = HashMap::new();
        let mut expanded: HashSet<u64> = HashSet::new();
        let mut chunk_mass: HashMap<String, f64> = HashMap::new();
        let mut chunk_best: HashMap<String, (f64, Step)> = HashMap::new();
        for hop in 0..query.hops {
            let mut frontier: Vec<(u64, f64)> = mass
                .iter()
                .filter(|(id, _)| !expanded.contains(id))
                .map(|(id, m)| (*id, *m))
                .collect();
            frontier.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            frontier.truncate(FRONTIER);
            if frontier.is_empty() {
                break;
            }
            expanded.extend(frontier.iter().map(|(id, _)| *id));
            run.hops = hop + 1;
            let (responses, failed) = self
                .gather(
                    kb_id,
                    shards,
                    round(GraphLeafRequest::Neighbourhood {
                        frontier: frontier.iter().map(|(id, _)| *id).collect(),
                        per_entity: PER_ENTITY,
                    }),
                )
                .await;
            for failure in failed {
                if !run.failed_shards.iter().any(|f| f.shard == failure.shard) {
                    run.failed_shards.push(failure);
                }
            }
            let mut neighbourhoods = Vec::new();
            for response in responses {
                if let Some(GraphLeafResponse::Neighbourhood(found)) = response.graph {
                    neighbourhoods.extend(found);
                }
            }
            // Each entity's weight over all its chunks, across shards.
            let mut weight_of: HashMap<u64, f64> = HashMap::new();
            for n in &neighbourhoods {
                *weight_of.entry(n.entity).or_default() += n
                    .chunks
                    .iter()
                    .map(|c| 1.0 + f64::from(c.count).ln())
                    .sum::<f64>();
            }
            let frontier_mass: HashMap<u64, f64> = frontier.into_iter().collect();
            let damping = DAMPING.powi(hop as i32);
            let mut next: HashMap<u64, f64> = HashMap::new();
            for n in &neighbourhoods {
                let (Some(m), Some(&w)) = (frontier_mass.get(&n.entity), weight_of.get(&n.entity))
                else {
                    continue;
                };
                if w <= 0.0 {
                    continue;
                }
                for chunk in &n.chunks {
                    let reached = m * (1.0 + f64::from(chunk.count).ln()) / w;
                    *chunk_mass.entry(chunk.chunk_id.clone()).or_default() += damping * reached;
                    let step = Step {
                        from_entity: n.entity,
                        via_chunk: None,
                        hop,
                    };
                    match chunk_best.get_mut(&chunk.chunk_id) {
                        Some(best) if best.0 >= damping * reached => {}
                        _ => {
                            chunk_best.insert(chunk.chunk_id.clone(), (damping * reached, step));
                        }
                    }
                    // Passed on to the chunk's other entities, the specific ones first.
                    let others: Vec<(u64, f64)> = chunk
                        .entities
                        .iter()
                        .filter(|(id, _)| *id != n.entity && !expanded.contains(id))
                        .map(|(id, local_df)| (*id, u64::from(*local_df) * answered))
                        .filter(|(_, df)| !is_hub(*df, chunks))
                        .map(|(id, df)| (id, specificity(df, chunks)))
                        .collect();
                    let spread: f64 = others.iter().map(|(_, s)| s).sum();
                    if spread <= 0.0 {
                        continue;
                    }
                    for (id, s) in others {
                        let share = reached * s / spread;
                        *next.entry(id).or_default() += share;
                        let best = best_share.entry(id).or_insert(0.0);
                        if share > *best {
                            *best = share;
                            reached_by.insert(
                                id,
                                Step {
                                    from_entity: n.entity,
                                    via_chunk: Some(chunk.chunk_id.clone()),
                                    hop,
                                },
                            );
                        }
                    }
                }
            }
            mass = next;
        }

        // 3. The best chunks, fetched.
        let mut ranked: Vec<(String, f64)> = chunk_mass.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ranked.truncate(k);
        if ranked.is_empty() {
            run.seconds = started.elapsed().as_secs_f64();
            return run;
        }
        let hits: Vec<(String, f32)> = ranked
            .iter()
            .map(|(id, mass)| (id.clone(), *mass as f32))
            .collect();
        let (responses, failed) = self
            .gather(kb_id, shards, round(GraphLeafRequest::Chunks { hits }))
            .await;
        for failure in failed {
            if !run.failed_shards.iter().any(|f| f.shard == failure.shard) {
                run.failed_shards.push(failure);
            }
        }
        let mut found: HashMap<String, ScoredChunk> = HashMap::new();
        for response in responses {
            if let Some(GraphLeafResponse::Chunks(chunks)) = response.graph {
                for hit in chunks {
                    found.entry(hit.chunk.chunk_id.clone()).or_insert(hit);
                }
            }
        }
        run.hits = ranked
            .iter()
            .filter_map(|(id, _)| found.remove(id))
            .collect();

        if explain && !run.hits.is_empty() {
            let mut paths: HashMap<String, Vec<Step>> = HashMap::new();
            let mut named: HashSet<u64> = HashSet::new();
            for hit in &run.hits {
                let Some((_, step)) = chunk_best.get(&hit.chunk.chunk_id) else {
                    continue;
                };
                // Back from the chunk to its seed.
                let mut path = vec![step.clone()];
                let mut entity = step.from_entity;
                while let Some(before) = reached_by.get(&entity) {
                    if path.len() > MAX_HOPS as usize + 1 || before.hop >= path[path.len() - 1].hop
                    {
                        break;
                    }
                    path.push(before.clone());
                    entity = before.from_entity;
                }
                path.reverse();
                named.extend(path.iter().map(|s| s.from_entity));
                paths.insert(hit.chunk.chunk_id.clone(), path);
            }
            let names = self
                .graph_names(kb_id, shards, filter, named.into_iter().collect())
                .await;
            let name = |id: u64| {
                names
                    .get(&id)
                    .cloned()
                    .unwrap_or_else(|| format!("entity {id:016x}"))
            };
            for (chunk_id, path) in paths {
                let mut words = Vec::new();
                // Each step: an entity, then the chunk that led from it to the next one.
                for step in &path {
                    words.push(format!("{:?}", name(step.from_entity)));
                    if let Some(via) = &step.via_chunk {
                        words.push(format!("chunk {via}"));
                    }
                }
                words.push("this chunk".to_string());
                let hop = path.last().map_or(0, |s| s.hop) + 1;
                run.paths.insert(
                    chunk_id,
                    format!("graph path (hop {hop}): {}", words.join(" -> ")),
                );
            }
        }
        run.seconds = started.elapsed().as_secs_f64();
        metrics::histogram!("sift_graph_search_seconds").record(run.seconds);
        metrics::counter!("sift_graph_search_hops_total").increment(u64::from(run.hops));
        run
    }

    /// Names of entities, from whichever shard knows them.
    async fn graph_names(
        &self,
        kb_id: &str,
        shards: u32,
        filter: &SearchFilter,
        ids: Vec<u64>,
    ) -> HashMap<u64, String> {
        self.graph_entities(kb_id, shards, filter, ids)
            .await
            .into_iter()
            .map(|(id, entity)| (id, entity.name))
            .collect()
    }

    /// The entities of `ids` the KB's shards know: name and kind from the first shard that
    /// answers, chunk counts summed over them all.
    pub(crate) async fn graph_entities(
        &self,
        kb_id: &str,
        shards: u32,
        filter: &SearchFilter,
        ids: Vec<u64>,
    ) -> HashMap<u64, GraphEntity> {
        let request = Arc::new(LeafRequest::graph(
            filter,
            0,
            GraphLeafRequest::Entities { ids },
        ));
        let (responses, _) = self.gather(kb_id, shards, request).await;
        let mut found: HashMap<u64, GraphEntity> = HashMap::new();
        for response in responses {
            if let Some(GraphLeafResponse::Entities(entities)) = response.graph {
                for entity in entities {
                    match found.get_mut(&entity.id) {
                        Some(known) => known.chunks = known.chunks.saturating_add(entity.chunks),
                        None => {
                            found.insert(entity.id, entity);
                        }
                    }
                }
            }
        }
        found
    }
}

/// Whether `words` occurs in `name` as whole words.
fn contains_words(name: &str, words: &str) -> bool {
    let name: Vec<&str> = name.split(' ').collect();
    let words: Vec<&str> = words.split(' ').collect();
    !words.is_empty()
        && name
            .windows(words.len())
            .any(|window| window == words.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_is_many_chunks_and_a_large_share() {
        assert!(!is_hub(15, 100));
        assert!(is_hub(16, 100));
        assert!(!is_hub(40, 1000));
        assert!(is_hub(60, 1000));
    }

    #[test]
    fn names_inside_names_are_whole_words() {
        assert!(contains_words("doctor strange", "strange"));
        assert!(!contains_words("doctor strangelove", "strange"));
        assert!(contains_words("new york city", "new york"));
    }
}
