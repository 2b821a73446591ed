//! Graph extraction (GraphRAG, ADR 0037): the `GraphExtractor` actor, a child of the node
//! supervisor, fills the graph partition of every shard replica on this node.
//!
//! Its queue is durable and bounded by the shards themselves: every write marks its documents
//! pending in the replica's graph tree (`ShardIndex::graph_pending`), in the same transaction
//! as the chunks, so a crash or restart loses nothing and the extractor resumes where it was.
//! On each tick it takes a few pending documents of each replica whose KB has a graph,
//! extracts their chunks' entities on the blocking pool (`sift_graph::extract`, bounded by
//! one permit per extraction worker) and stores them (`ShardIndex::graph_put`). Ingestion
//! never waits for it: a document is `ready` (searchable by dense and BM25) before its graph
//! is, and a replaced or deleted document's late extraction is refused by the shard.
//!
//! A document whose extraction fails (a panic) [`MAX_FAILURES`] times is stored without
//! entities, counted in `sift_graph_extraction_failures_total`, and logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use sift_graph::{Language, Limits};
use sift_storage::shard::{GraphMention, PendingGraphDocument, ShardIndex};
use tracing::{info, warn};

use crate::context::NodeContext;
use crate::node::supervisor::{ChildSpec, RestartPolicy};

pub const ACTOR_NAME: &str = "graph_extractor";
/// How often the extractor looks for pending documents.
const TICK: Duration = Duration::from_millis(200);
/// Documents taken from one replica per round.
const BATCH: usize = 16;
/// Rounds over one replica per tick before the others get their turn.
const ROUNDS_PER_TICK: usize = 8;
/// Failed extractions of one document before it is stored without entities.
pub const MAX_FAILURES: u32 = 3;

pub struct GraphExtractor;

pub struct GraphArguments {
    pub context: Arc<NodeContext>,
}

pub enum GraphMessage {
    Tick,
}

pub struct GraphState {
    context: Arc<NodeContext>,
    /// Failures per (kb, document, version).
    failures: HashMap<(String, String, u64), u32>,
}

impl Actor for GraphExtractor {
    type Msg = GraphMessage;
    type State = GraphState;
    type Arguments = GraphArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(TICK, || GraphMessage::Tick);
        Ok(GraphState {
            context: args.context,
            failures: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            // Ticks that queued while a long round ran find little left to do.
            GraphMessage::Tick => {
                if let Err(error) = extract_pending(state).await {
                    warn!(%error, "graph extraction round failed; retried on the next tick");
                }
            }
        }
        Ok(())
    }
}

/// One round over every local replica with pending documents.
async fn extract_pending(state: &mut GraphState) -> crate::error::Result<()> {
    let registry = state.context.registry.clone();
    let mut queued = 0u64;
    let keys = registry.keys();
    let mut languages: HashMap<String, Option<Language>> = HashMap::new();
    for key in keys {
        let Some(entry) = registry.get(&key) else {
            continue;
        };
        let stats = entry.index.graph_stats();
        if stats.pending == 0 {
            continue;
        }
        let language = match languages.get(&key.kb_id) {
            Some(language) => *language,
            None => {
                let language = state
                    .context
                    .meta
                    .store()
                    .get_kb(&key.kb_id)?
                    .filter(|kb| kb.settings.graph != "off")
                    .map(|kb| Language::from_setting(&kb.settings.language));
                languages.insert(key.kb_id.clone(), language);
                language
            }
        };
        let Some(language) = language else {
            queued += stats.pending;
            continue;
        };
        for _ in 0..ROUNDS_PER_TICK {
            let index = entry.index.clone();
            let pending = tokio::task::spawn_blocking(move || index.graph_pending(BATCH))
                .await
                .map_err(|e| crate::error::SiftError::Internal(e.to_string()))??;
            if pending.is_empty() {
                break;
            }
            for document in pending {
                extract_one(state, &key.kb_id, &entry.index, document, language).await?;
            }
        }
        queued += entry.index.graph_stats().pending;
    }
    metrics::gauge!("sift_graph_queue_documents").set(queued as f64);
    Ok(())
}

async fn extract_one(
    state: &mut GraphState,
    kb_id: &str,
    index: &Arc<ShardIndex>,
    document: PendingGraphDocument,
    language: Language,
) -> crate::error::Result<()> {
    let started = Instant::now();
    let chunks = document.chunks.len();
    let failure_key = (
        kb_id.to_string(),
        document.document_id.clone(),
        document.sequence,
    );
    let failures = state.failures.get(&failure_key).copied().unwrap_or(0);
    let (document_id, sequence) = (document.document_id.clone(), document.sequence);
    let index = index.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let entities = if failures >= MAX_FAILURES {
            Vec::new()
        } else {
            entities_of(&document, language)
        };
        index.graph_put(&document.document_id, document.sequence, entities)
    })
    .await;
    match outcome {
        Ok(Ok(_stored)) => {
            state.failures.remove(&failure_key);
            metrics::counter!("sift_graph_extracted_chunks_total").increment(chunks as u64);
            metrics::histogram!("sift_graph_extraction_seconds")
                .record(started.elapsed().as_secs_f64());
            Ok(())
        }
        Ok(Err(error)) => Err(error.into()),
        Err(panic) => {
            let failures = failures + 1;
            metrics::counter!("sift_graph_extraction_failures_total").increment(1);
            if failures >= MAX_FAILURES {
                warn!(kb_id, %document_id, sequence, error = %panic, "graph extraction failed {failures} times; the document is stored without entities");
            } else {
                info!(kb_id, %document_id, error = %panic, "graph extraction failed; retried");
            }
            state.failures.insert(failure_key, failures);
            Ok(())
        }
    }
}

/// The entities of each chunk of `document`, as the shard stores them.
pub fn entities_of(
    document: &PendingGraphDocument,
    language: Language,
) -> Vec<(u32, Vec<GraphMention>)> {
    let limits = Limits::default();
    let title = (!document.title.trim().is_empty()).then_some(document.title.as_str());
    document
        .chunks
        .iter()
        .map(|chunk| {
            let mentions = sift_graph::extract(body(&chunk.text), title, language, &limits)
                .into_iter()
                .map(|mention| GraphMention {
                    id: mention.id,
                    canonical: mention.canonical,
                    name: mention.name,
                    kind: mention.kind.as_str().to_string(),
                    count: mention.count,
                })
                .collect();
            (chunk.position, mentions)
        })
        .collect()
}

/// A chunk's text without the `[Context: A > B]` line the chunker puts before it: the
/// word "Context" in every chunk would be an entity of every chunk.
fn body(text: &str) -> &str {
    text.strip_prefix("[Context: ")
        .and_then(|rest| rest.split_once("]\n"))
        .map_or(text, |(_, body)| body)
}

/// The extractor as a child of the node supervisor.
pub(crate) fn extractor_spec(context: Arc<NodeContext>) -> ChildSpec {
    ChildSpec {
        name: ACTOR_NAME,
        start: Arc::new(move |supervisor| {
            let arguments = GraphArguments {
                context: context.clone(),
            };
            Box::pin(async move {
                let (actor, _) =
                    Actor::spawn_linked(None, GraphExtractor, arguments, supervisor).await?;
                Ok(actor.get_cell())
            })
        }),
        policy: RestartPolicy::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sift_storage::shard::PendingChunk;

    #[test]
    fn the_chunkers_context_line_is_no_entity() {
        let document = PendingGraphDocument {
            document_id: "d".into(),
            sequence: 1,
            title: "Lighthouses".into(),
            chunks: vec![PendingChunk {
                position: 0,
                text: "[Context: Lighthouses > Keepers]\nGrace Darling rowed to the Farne Islands."
                    .into(),
                heading_path: vec!["Lighthouses".into(), "Keepers".into()],
            }],
        };
        let (_, mentions) = &entities_of(&document, Language::English)[0];
        let names: Vec<&str> = mentions.iter().map(|m| m.name.as_str()).collect();
        assert!(!names.contains(&"Context"), "{names:?}");
        assert!(names.contains(&"Grace Darling"), "{names:?}");
        assert!(names.contains(&"Farne Islands"), "{names:?}");
        assert_eq!(body("no prefix"), "no prefix");
        assert_eq!(body("[Context: broken"), "[Context: broken");
    }
}
