//! The graph of a KB for a browser and the agent (ADR 0037): entities by name, one entity
//! with its neighbours and the chunks that mention it, and a path between two entities.
//! Every answer is gathered from all the KB's shards (entity ids are global) and passes the
//! caller's document groups in every shard, so an entity only restricted documents mention is
//! not shown to a caller who may not read them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use sift_storage::chunk::{ChunkView, SearchFilter};
use sift_storage::meta::KbRecord;
use sift_storage::shard::{EntityNeighbourhood, GraphDocumentState};

use super::SiftNode;
use crate::error::{Result, SiftError};
use crate::retrieval::graph::{MAX_HOPS, is_hub};
use crate::scope::{Need, Scope};
use crate::shards::{GraphLeafRequest, GraphLeafResponse, LeafRequest};

/// Most entities one answer lists.
pub const MAX_ENTITIES: usize = 100;
/// Chunks read per entity for its neighbours and mentions.
const ENTITY_CHUNKS: usize = 64;
/// Events listed per entity.
pub const ENTITY_EVENTS: usize = 50;
/// Entities expanded per hop of a path search.
const PATH_FRONTIER: usize = 64;

/// An entity, with the chunks that mention it across the KB's shards.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EntityView {
    /// 16 hexadecimal digits: global, made from the canonical name.
    pub id: String,
    pub name: String,
    /// What the extractor took it for: the embedded extractor's `name`, `acronym`, `quoted`,
    /// `title`, `date`, `quantity`, `person`, `place`, `organisation` or `proper`; a model's
    /// `person`, `organisation`, `place`, `event`, `work`, `concept`, `date` or `other`.
    pub kind: String,
    pub chunks: u64,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct EntityList {
    pub entities: Vec<EntityView>,
}

/// An entity mentioned in the same chunks as another.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct EntityNeighbour {
    #[serde(flatten)]
    pub entity: EntityView,
    /// Chunks mentioning both (of those read).
    pub shared_chunks: u32,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct EntityDetail {
    pub entity: EntityView,
    /// Most shared chunks first.
    pub neighbours: Vec<EntityNeighbour>,
    /// The chunks that mention it, in chunk id order.
    pub mentions: Vec<ChunkView>,
    /// Events that name it (subject, object or place), found by an LLM extractor; empty in
    /// a KB whose graph is `embedded`.
    pub events: Vec<EventView>,
}

/// An event a model found in a chunk: who did what to whom, when and where.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EventView {
    pub subject: String,
    pub predicate: String,
    /// Empty when the event has none (likewise `time` and `place`).
    pub object: String,
    pub time: String,
    pub place: String,
    /// The chunk it was found in.
    pub chunk_id: String,
}

/// Where a ready document's graph stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentGraph {
    /// `pending`, `ready`, `failed` or `off`.
    pub state: &'static str,
    /// Why it failed.
    pub error: Option<String>,
}

/// One step of a path: an entity, then the chunk that leads to the next one.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct PathStep {
    pub entity: EntityView,
    /// The chunk mentioning this entity and the next; none on the last step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via_chunk: Option<String>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct GraphPath {
    /// Whether a path of at most `max_hops` chunks joins the two.
    pub found: bool,
    pub hops: u32,
    pub steps: Vec<PathStep>,
}

/// `0123456789abcdef` -> the id; anything else is a name.
fn entity_ref(reference: &str) -> Result<u64> {
    let reference = reference.trim();
    if reference.len() == 16
        && let Ok(id) = u64::from_str_radix(reference, 16)
    {
        return Ok(id);
    }
    let canonical = sift_graph::canonical(reference);
    if canonical.is_empty() {
        return Err(SiftError::invalid(
            "invalid_entity",
            "an entity is its 16-digit id or a name",
        ));
    }
    Ok(sift_graph::entity_id(&canonical))
}

pub(super) fn hex(id: u64) -> String {
    format!("{id:016x}")
}

impl SiftNode {
    /// Each local shard replica's graph counts: (KB id, shard, counts).
    pub fn graph_stats(&self) -> Vec<(String, u32, sift_storage::shard::GraphStats)> {
        let registry = &self.context.registry;
        registry
            .keys()
            .into_iter()
            .filter_map(|key| {
                let entry = registry.get(&key)?;
                Some((key.kb_id, key.shard, entry.index.graph_stats()))
            })
            .collect()
    }

    /// Where a ready document's graph stands: `pending` (its entities are being extracted),
    /// `ready`, `failed` (with why: the extractor gave up on it, and what the embedded
    /// extractor found is stored instead) or `off` (its KB has no graph); `None` before the
    /// document is ready or when no replica of its shard answers.
    pub async fn document_graph(
        &self,
        scope: &Scope,
        kb: &str,
        record: &sift_storage::meta::DocumentRecord,
    ) -> Option<DocumentGraph> {
        let kb = self.find_kb(scope, kb, Need::Read).ok()?;
        if kb.settings.graph == "off" {
            return Some(DocumentGraph {
                state: "off",
                error: None,
            });
        }
        if record.status != sift_storage::meta::DocStatus::Ready {
            return None;
        }
        let request = Arc::new(LeafRequest::graph(
            &SearchFilter::default(),
            0,
            GraphLeafRequest::Document {
                document_id: record.id.clone(),
            },
        ));
        let response = self.context.access.search(&kb, record.shard, request).await;
        let Ok(response) = response else {
            return None;
        };
        let Some(GraphLeafResponse::Document(Some(state))) = response.graph else {
            return None;
        };
        Some(match state {
            GraphDocumentState::Pending => DocumentGraph {
                state: "pending",
                error: None,
            },
            GraphDocumentState::Ready => DocumentGraph {
                state: "ready",
                error: None,
            },
            GraphDocumentState::Failed(reason) => DocumentGraph {
                state: "failed",
                error: Some(reason),
            },
        })
    }

    pub(super) async fn graph_kb(
        &self,
        scope: &Scope,
        kb: &str,
    ) -> Result<(KbRecord, SearchFilter)> {
        let kb = self.find_kb_for_data(scope, kb, Need::Read).await?;
        if kb.settings.graph == "off" {
            return Err(SiftError::invalid(
                "graph_unavailable",
                "this knowledge base has no graph (its graph setting is off)",
            ));
        }
        let filter = SearchFilter {
            groups: scope.groups().map(<[String]>::to_vec),
            ..SearchFilter::default()
        };
        Ok((kb, filter))
    }

    /// One graph step on every shard of `kb`; shards that fail are left out.
    pub(super) async fn graph_round(
        &self,
        kb: &KbRecord,
        filter: &SearchFilter,
        step: GraphLeafRequest,
    ) -> Vec<GraphLeafResponse> {
        let request = Arc::new(LeafRequest::graph(filter, 0, step));
        let (responses, _) = self.root.gather(&kb.id, kb.settings.shards, request).await;
        responses.into_iter().filter_map(|r| r.graph).collect()
    }

    pub(super) async fn neighbourhoods(
        &self,
        kb: &KbRecord,
        filter: &SearchFilter,
        frontier: Vec<u64>,
        per_entity: usize,
    ) -> Vec<EntityNeighbourhood> {
        let mut found = Vec::new();
        let step = GraphLeafRequest::Neighbourhood {
            frontier,
            per_entity,
        };
        for response in self.graph_round(kb, filter, step).await {
            if let GraphLeafResponse::Neighbourhood(list) = response {
                found.extend(list);
            }
        }
        found
    }

    /// Live chunks of the KB, over the shards that answer (what makes an entity a hub).
    pub(super) async fn graph_chunks_total(&self, kb: &KbRecord, filter: &SearchFilter) -> u64 {
        let mut total = 0;
        for response in self
            .graph_round(kb, filter, GraphLeafRequest::Counts { ids: vec![] })
            .await
        {
            if let GraphLeafResponse::Counts { chunks, .. } = response {
                total += chunks;
            }
        }
        total
    }

    /// Names, kinds and chunk counts (summed over shards) of `ids`.
    pub(super) async fn entity_views(
        &self,
        kb: &KbRecord,
        filter: &SearchFilter,
        ids: Vec<u64>,
    ) -> HashMap<u64, EntityView> {
        self.root
            .graph_entities(&kb.id, kb.settings.shards, filter, ids)
            .await
            .into_iter()
            .map(|(id, entity)| {
                let view = EntityView {
                    id: hex(id),
                    name: entity.name,
                    kind: entity.kind,
                    chunks: u64::from(entity.chunks),
                };
                (id, view)
            })
            .collect()
    }

    /// Entities whose name starts with `q` (case and punctuation folded), most mentioned first.
    pub async fn graph_entities(
        &self,
        scope: &Scope,
        kb: &str,
        q: &str,
        limit: usize,
    ) -> Result<EntityList> {
        let (kb, filter) = self.graph_kb(scope, kb).await?;
        let prefix = sift_graph::canonical(q);
        if prefix.is_empty() {
            return Err(SiftError::invalid(
                "invalid_query",
                "q must hold a name (letters or digits)",
            ));
        }
        let limit = limit.clamp(1, MAX_ENTITIES);
        let step = GraphLeafRequest::ByPrefix {
            prefix,
            limit: limit * 2,
        };
        let mut ids = Vec::new();
        for response in self.graph_round(&kb, &filter, step).await {
            if let GraphLeafResponse::Entities(entities) = response {
                ids.extend(entities.into_iter().map(|e| e.id));
            }
        }
        ids.sort_unstable();
        ids.dedup();
        // Only entities a chunk the caller reads mentions.
        let readable: HashSet<u64> = self
            .neighbourhoods(&kb, &filter, ids.clone(), 1)
            .await
            .into_iter()
            .filter(|n| !n.chunks.is_empty())
            .map(|n| n.entity)
            .collect();
        ids.retain(|id| readable.contains(id));
        let mut entities: Vec<EntityView> = self
            .entity_views(&kb, &filter, ids)
            .await
            .into_values()
            .collect();
        entities.sort_by(|a, b| b.chunks.cmp(&a.chunks).then_with(|| a.name.cmp(&b.name)));
        entities.truncate(limit);
        Ok(EntityList { entities })
    }

    /// One entity (its id or its name): its neighbours and the chunks that mention it.
    pub async fn graph_entity(
        &self,
        scope: &Scope,
        kb: &str,
        entity: &str,
    ) -> Result<EntityDetail> {
        let (kb, filter) = self.graph_kb(scope, kb).await?;
        let id = entity_ref(entity)?;
        let neighbourhoods = self
            .neighbourhoods(&kb, &filter, vec![id], ENTITY_CHUNKS)
            .await;
        let chunks: Vec<_> = neighbourhoods
            .iter()
            .flat_map(|n| n.chunks.iter())
            .collect();
        if chunks.is_empty() {
            return Err(SiftError::NotFound {
                code: "entity_not_found",
                what: format!("entity {entity:?}"),
            });
        }
        let mut shared: HashMap<u64, u32> = HashMap::new();
        for chunk in &chunks {
            for (other, _) in &chunk.entities {
                if *other != id {
                    *shared.entry(*other).or_default() += 1;
                }
            }
        }
        let mut ranked: Vec<(u64, u32)> = shared.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(MAX_ENTITIES);
        let mut ids: Vec<u64> = ranked.iter().map(|(id, _)| *id).collect();
        ids.push(id);
        let mut views = self.entity_views(&kb, &filter, ids).await;
        let entity_view = views.remove(&id).ok_or_else(|| SiftError::NotFound {
            code: "entity_not_found",
            what: format!("entity {entity:?}"),
        })?;
        let neighbours = ranked
            .into_iter()
            .filter_map(|(other, count)| {
                views.remove(&other).map(|entity| EntityNeighbour {
                    entity,
                    shared_chunks: count,
                })
            })
            .collect();
        let hits: Vec<(String, f32)> = chunks
            .iter()
            .map(|chunk| (chunk.chunk_id.clone(), chunk.count as f32))
            .collect();
        let mut mentions = Vec::new();
        for response in self
            .graph_round(&kb, &filter, GraphLeafRequest::Chunks { hits })
            .await
        {
            if let GraphLeafResponse::Chunks(found) = response {
                mentions.extend(found.into_iter().map(|hit| hit.chunk));
            }
        }
        mentions.sort_by(|a, b| a.chunk_id.cmp(&b.chunk_id));
        let events = self.entity_events(&kb, &filter, id).await;
        Ok(EntityDetail {
            entity: entity_view,
            neighbours,
            mentions,
            events,
        })
    }

    /// Up to [`ENTITY_EVENTS`] events naming `entity`, from every shard, in chunk id order.
    async fn entity_events(
        &self,
        kb: &KbRecord,
        filter: &SearchFilter,
        entity: u64,
    ) -> Vec<EventView> {
        let step = GraphLeafRequest::Events {
            entity,
            limit: ENTITY_EVENTS,
        };
        let mut events = Vec::new();
        for response in self.graph_round(kb, filter, step).await {
            if let GraphLeafResponse::Events(found) = response {
                events.extend(found.into_iter().map(|(chunk_id, event)| EventView {
                    subject: event.subject,
                    predicate: event.predicate,
                    object: event.object,
                    time: event.time,
                    place: event.place,
                    chunk_id,
                }));
            }
        }
        events.sort_by(|a, b| a.chunk_id.cmp(&b.chunk_id));
        events.truncate(ENTITY_EVENTS);
        events
    }

    /// The shortest chain of chunks (at most `max_hops`) from one entity to another, each
    /// chunk mentioning the entity before and after it; hubs are not walked through.
    pub async fn graph_path(
        &self,
        scope: &Scope,
        kb: &str,
        from: &str,
        to: &str,
        max_hops: u32,
    ) -> Result<GraphPath> {
        let (kb, filter) = self.graph_kb(scope, kb).await?;
        if !(1..=MAX_HOPS).contains(&max_hops) {
            return Err(SiftError::invalid(
                "invalid_graph_hops",
                format!("max_hops must be between 1 and {MAX_HOPS}, not {max_hops}"),
            ));
        }
        let (from, to) = (entity_ref(from)?, entity_ref(to)?);
        let mut parent: HashMap<u64, (u64, String)> = HashMap::new();
        let mut seen: HashSet<u64> = HashSet::from([from]);
        let mut frontier = vec![from];
        let mut found = from == to;
        let mut hops = 0;
        let chunks_total = self.graph_chunks_total(&kb, &filter).await;
        while !found && hops < max_hops && !frontier.is_empty() {
            hops += 1;
            let mut next = Vec::new();
            for n in self
                .neighbourhoods(&kb, &filter, frontier.clone(), ENTITY_CHUNKS)
                .await
            {
                for chunk in &n.chunks {
                    for (other, local) in &chunk.entities {
                        if seen.contains(other) {
                            continue;
                        }
                        seen.insert(*other);
                        parent.insert(*other, (n.entity, chunk.chunk_id.clone()));
                        if *other == to {
                            found = true;
                        } else if !is_hub(u64::from(*local), chunks_total) {
                            next.push(*other);
                        }
                    }
                }
            }
            next.truncate(PATH_FRONTIER);
            frontier = next;
        }
        if !found {
            return Ok(GraphPath {
                found: false,
                hops: 0,
                steps: Vec::new(),
            });
        }
        let mut chain = vec![(to, None)];
        let mut at = to;
        while let Some((before, chunk)) = parent.get(&at) {
            chain.push((*before, Some(chunk.clone())));
            at = *before;
        }
        chain.reverse();
        let views = self
            .entity_views(&kb, &filter, chain.iter().map(|(id, _)| *id).collect())
            .await;
        let steps = chain
            .into_iter()
            .map(|(id, via_chunk)| PathStep {
                entity: views.get(&id).cloned().unwrap_or_else(|| EntityView {
                    id: hex(id),
                    name: String::new(),
                    kind: String::new(),
                    chunks: 0,
                }),
                via_chunk,
            })
            .collect::<Vec<_>>();
        Ok(GraphPath {
            found: true,
            hops: (steps.len() as u32).saturating_sub(1),
            steps,
        })
    }
}
