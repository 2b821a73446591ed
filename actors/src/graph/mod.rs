//! Graph extraction (GraphRAG, ADR 0037 and 0038): the `GraphExtractor` actor, a child of the
//! node supervisor, fills the graph partition of every shard replica on this node.
//!
//! Its queue is durable and bounded by the shards themselves: every write marks its documents
//! pending in the replica's graph tree (`ShardIndex::graph_pending`), in the same transaction
//! as the chunks, so a crash or restart loses nothing and the extractor resumes where it was.
//! On each tick it takes a few pending documents of each replica whose KB has a graph and
//! stores what an extractor found in them (`ShardIndex::graph_put`). Ingestion never waits for
//! it: a document is `ready` (searchable by dense and BM25) before its graph is, and a
//! replaced or deleted document's late extraction is refused by the shard.
//!
//! Two extractors, chosen by the KB's `graph` setting:
//! - `embedded`: [`sift_graph::extract`] on the blocking pool, in the tick.
//! - `llm` ([`llm`]): the node's chat model, in tasks of their own (at most
//!   [`LLM_DOCUMENTS`] documents at once), which report back to the actor; a slow or failing
//!   model holds up no other document. A failed request (invalid JSON, the wrong schema, a
//!   model error, a timeout) is retried after a back-off. Without a chat model, or once the
//!   KB's `graph_token_budget` is spent on this node, documents get the embedded extractor's
//!   graph and the state `failed` saying why.
//!
//! A document whose extraction fails [`MAX_FAILURES`] times gets the embedded extractor's
//! graph (none, when that is what failed) and the state `failed` with the last error; each
//! failure counts in `sift_graph_extraction_failures_total`.

pub mod llm;

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use sift_graph::{Language, Limits};
use sift_storage::meta::KbRecord;
use sift_storage::shard::{ChunkGraph, GraphMention, GraphPut, PendingGraphDocument, ShardIndex};
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
/// Failed extractions of one document before its graph is `failed`.
pub const MAX_FAILURES: u32 = 3;
/// Documents the LLM extractor reads at once on this node.
pub const LLM_DOCUMENTS: usize = 2;
/// The wait before the first retry of a failed LLM extraction; it doubles each time.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// A document's failures are forgotten once it has not been retried for this long.
const FORGET_FAILURES_AFTER: Duration = Duration::from_secs(600);

pub struct GraphExtractor;

pub struct GraphArguments {
    pub context: Arc<NodeContext>,
}

/// A document version of one replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DocumentKey {
    pub kb_id: String,
    pub shard: u32,
    pub document_id: String,
    pub sequence: u64,
}

pub enum GraphMessage {
    Tick,
    /// An LLM extraction ended (its task reports back).
    LlmDone {
        key: DocumentKey,
        document: PendingGraphDocument,
        language: Language,
        tokens: u64,
        outcome: Result<Vec<ChunkGraph>, llm::ExtractError>,
    },
}

/// Failures of one document version so far.
struct Failures {
    count: u32,
    /// Not retried before then.
    retry_at: Instant,
    /// Tokens the failed attempts spent (stored with the final outcome).
    tokens: u64,
}

pub struct GraphState {
    context: Arc<NodeContext>,
    myself: ActorRef<GraphMessage>,
    failures: HashMap<DocumentKey, Failures>,
    /// LLM extractions running now.
    in_flight: HashSet<DocumentKey>,
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
            myself,
            failures: HashMap::new(),
            in_flight: HashSet::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let result = match message {
            // Ticks that queued while a long round ran find little left to do.
            GraphMessage::Tick => extract_pending(state).await,
            GraphMessage::LlmDone {
                key,
                document,
                language,
                tokens,
                outcome,
            } => llm_done(state, key, document, language, tokens, outcome).await,
        };
        if let Err(error) = result {
            warn!(%error, "graph extraction round failed; retried on the next tick");
        }
        Ok(())
    }
}

/// How one KB's documents are extracted on this node now.
#[derive(Clone)]
enum Mode {
    Embedded(Language),
    Llm {
        language: Language,
        model: sift_models::llm::SharedChatModel,
    },
    /// `llm`, but the model cannot be asked: the embedded graph, and the state `failed`.
    Fallback {
        language: Language,
        reason: String,
    },
    /// The KB has no graph: its documents wait (a later `graph` setting extracts them).
    Off,
}

fn mode_of(context: &NodeContext, kb: Option<KbRecord>) -> Mode {
    let Some(kb) = kb else { return Mode::Off };
    let language = Language::from_setting(&kb.settings.language);
    match kb.settings.graph.as_str() {
        "embedded" => Mode::Embedded(language),
        "llm" => {
            let Some(model) = context.chat_model.get() else {
                return Mode::Fallback {
                    language,
                    reason: "no chat model is configured on this node ([llm] in the config)".into(),
                };
            };
            let budget = kb.settings.graph_token_budget;
            if budget > 0 {
                let spent: u64 = context
                    .registry
                    .keys_of(&kb.id)
                    .iter()
                    .filter_map(|key| context.registry.get(key))
                    .filter_map(|entry| entry.index.graph_tokens().ok())
                    .sum();
                if spent >= budget {
                    return Mode::Fallback {
                        language,
                        reason: format!(
                            "the knowledge base's graph_token_budget ({budget} tokens) is spent on this node ({spent} tokens)"
                        ),
                    };
                }
            }
            Mode::Llm {
                language,
                model: model.clone(),
            }
        }
        _ => Mode::Off,
    }
}

/// One round over every local replica with pending documents.
async fn extract_pending(state: &mut GraphState) -> crate::error::Result<()> {
    // A failure not retried for this long is of a document no longer pending (deleted,
    // replaced, or its KB's graph changed): forget it.
    let now = Instant::now();
    state
        .failures
        .retain(|_, failures| failures.retry_at + FORGET_FAILURES_AFTER > now);
    let registry = state.context.registry.clone();
    let mut queued = 0u64;
    let mut modes: HashMap<String, Mode> = HashMap::new();
    for key in registry.keys() {
        let Some(entry) = registry.get(&key) else {
            continue;
        };
        let stats = entry.index.graph_stats();
        if stats.pending == 0 {
            continue;
        }
        let mode = match modes.get(&key.kb_id) {
            Some(mode) => mode.clone(),
            None => {
                let kb = state.context.meta.store().get_kb(&key.kb_id)?;
                let mode = mode_of(&state.context, kb);
                modes.insert(key.kb_id.clone(), mode.clone());
                mode
            }
        };
        match mode {
            // Kept pending in case the KB's graph is turned on; not a queue anyone waits on.
            Mode::Off => continue,
            Mode::Llm { language, model } => {
                start_llm(state, &key, &entry.index, language, model).await?;
            }
            Mode::Embedded(language) => {
                embedded_rounds(state, &key, &entry.index, language, None).await?;
            }
            Mode::Fallback { language, reason } => {
                embedded_rounds(state, &key, &entry.index, language, Some(reason)).await?;
            }
        }
        queued += entry.index.graph_stats().pending;
    }
    metrics::gauge!("sift_graph_queue_documents").set(queued as f64);
    Ok(())
}

/// Pending documents of one replica, leaving out those being extracted by the model and
/// those waiting for a retry.
async fn pending_of(
    state: &GraphState,
    key: &crate::shards::ShardKey,
    index: &Arc<ShardIndex>,
    limit: usize,
) -> crate::error::Result<Vec<PendingGraphDocument>> {
    let now = Instant::now();
    let skip: HashSet<(String, u64)> = state
        .failures
        .iter()
        .filter(|(_, failures)| failures.retry_at > now)
        .map(|(key, _)| key)
        .chain(state.in_flight.iter())
        .filter(|document| document.kb_id == key.kb_id && document.shard == key.shard)
        .map(|document| (document.document_id.clone(), document.sequence))
        .collect();
    let index = index.clone();
    let pending = tokio::task::spawn_blocking(move || {
        index.graph_pending(limit, |document_id, sequence| {
            skip.contains(&(document_id.to_string(), sequence))
        })
    })
    .await
    .map_err(|e| crate::error::SiftError::Internal(e.to_string()))??;
    Ok(pending)
}

fn document_key(key: &crate::shards::ShardKey, document: &PendingGraphDocument) -> DocumentKey {
    DocumentKey {
        kb_id: key.kb_id.clone(),
        shard: key.shard,
        document_id: document.document_id.clone(),
        sequence: document.sequence,
    }
}

/// The embedded extractor over one replica's pending documents, a few rounds; `failure`
/// set: the KB asked for the model, which cannot be asked (stored as the documents' state).
async fn embedded_rounds(
    state: &mut GraphState,
    key: &crate::shards::ShardKey,
    index: &Arc<ShardIndex>,
    language: Language,
    failure: Option<String>,
) -> crate::error::Result<()> {
    for _ in 0..ROUNDS_PER_TICK {
        let pending = pending_of(state, key, index, BATCH).await?;
        if pending.is_empty() {
            break;
        }
        for document in pending {
            let document_key = document_key(key, &document);
            extract_one(
                state,
                document_key,
                index,
                document,
                language,
                failure.clone(),
            )
            .await?;
        }
    }
    Ok(())
}

/// Starts LLM extractions of one replica's pending documents while fewer than
/// [`LLM_DOCUMENTS`] run.
async fn start_llm(
    state: &mut GraphState,
    key: &crate::shards::ShardKey,
    index: &Arc<ShardIndex>,
    language: Language,
    model: sift_models::llm::SharedChatModel,
) -> crate::error::Result<()> {
    let free = LLM_DOCUMENTS.saturating_sub(state.in_flight.len());
    if free == 0 {
        return Ok(());
    }
    for document in pending_of(state, key, index, free).await? {
        let document_key = document_key(key, &document);
        state.in_flight.insert(document_key.clone());
        let (model, cache) = (model.clone(), state.context.extraction_cache.clone());
        let timeout = state.context.options.graph_llm_timeout;
        let myself = state.myself.clone();
        tokio::spawn(async move {
            let texts = llm::texts_of(&document);
            // A panic is a failed attempt like any other: the document must leave `in_flight`.
            let extraction = AssertUnwindSafe(llm::extract(&model, &cache, &texts, timeout))
                .catch_unwind()
                .await;
            let (tokens, outcome) = extraction.unwrap_or_else(|_| {
                let panicked = llm::ExtractError::Model("the extraction panicked".into());
                (0, Err(panicked))
            });
            let outcome = outcome.map(|extraction| extraction.chunks);
            // A stopped extractor drops the result; the document is still pending.
            let _ = myself.cast(GraphMessage::LlmDone {
                key: document_key,
                document,
                language,
                tokens,
                outcome,
            });
        });
    }
    Ok(())
}

/// Stores an LLM extraction, or counts its failure: retried after a back-off, and after
/// [`MAX_FAILURES`] the embedded graph with the state `failed`.
async fn llm_done(
    state: &mut GraphState,
    key: DocumentKey,
    document: PendingGraphDocument,
    language: Language,
    tokens: u64,
    outcome: Result<Vec<ChunkGraph>, llm::ExtractError>,
) -> crate::error::Result<()> {
    state.in_flight.remove(&key);
    let Some(entry) = state.context.registry.get(&crate::shards::ShardKey {
        kb_id: key.kb_id.clone(),
        shard: key.shard,
    }) else {
        return Ok(());
    };
    let earlier = state.failures.get(&key).map_or(0, |f| f.tokens);
    let chunks = document.chunks.len() as u64;
    let put = match outcome {
        Ok(graph) => {
            state.failures.remove(&key);
            metrics::counter!("sift_graph_extracted_chunks_total").increment(chunks);
            GraphPut {
                chunks: graph,
                failure: None,
                tokens: tokens + earlier,
            }
        }
        Err(error) => {
            metrics::counter!("sift_graph_extraction_failures_total").increment(1);
            let failures = state.failures.entry(key.clone()).or_insert(Failures {
                count: 0,
                retry_at: Instant::now(),
                tokens: 0,
            });
            failures.count += 1;
            failures.tokens += tokens;
            if failures.count < MAX_FAILURES {
                let wait = RETRY_AFTER * 2u32.pow(failures.count - 1);
                failures.retry_at = Instant::now() + wait;
                info!(kb_id = %key.kb_id, document_id = %key.document_id, %error, ?wait, "LLM graph extraction failed; retried");
                return Ok(());
            }
            let count = failures.count;
            let tokens = failures.tokens;
            state.failures.remove(&key);
            warn!(kb_id = %key.kb_id, document_id = %key.document_id, %error, "LLM graph extraction failed {count} times; the embedded extractor's graph stands in");
            GraphPut {
                chunks: entities_of(&document, language),
                failure: Some(format!("{error} ({count} attempts)")),
                tokens,
            }
        }
    };
    let index = entry.index.clone();
    tokio::task::spawn_blocking(move || index.graph_put(&key.document_id, key.sequence, put))
        .await
        .map_err(|e| crate::error::SiftError::Internal(e.to_string()))??;
    Ok(())
}

/// The embedded extractor over one document, on the blocking pool; `failure`: the state to
/// store with it.
async fn extract_one(
    state: &mut GraphState,
    key: DocumentKey,
    index: &Arc<ShardIndex>,
    document: PendingGraphDocument,
    language: Language,
    failure: Option<String>,
) -> crate::error::Result<()> {
    let started = Instant::now();
    let chunks = document.chunks.len();
    let failures = state.failures.get(&key).map_or(0, |f| f.count);
    let (document_id, sequence) = (document.document_id.clone(), document.sequence);
    let index = index.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let put = if failures >= MAX_FAILURES {
            GraphPut {
                failure: Some("the embedded extractor failed 3 times".into()),
                ..GraphPut::default()
            }
        } else {
            GraphPut {
                chunks: entities_of(&document, language),
                failure,
                tokens: 0,
            }
        };
        index.graph_put(&document.document_id, document.sequence, put)
    })
    .await;
    match outcome {
        Ok(Ok(_stored)) => {
            state.failures.remove(&key);
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
                warn!(kb_id = %key.kb_id, %document_id, sequence, error = %panic, "graph extraction failed {failures} times; the document is stored without entities");
            } else {
                info!(kb_id = %key.kb_id, %document_id, error = %panic, "graph extraction failed; retried");
            }
            state.failures.insert(
                key,
                Failures {
                    count: failures,
                    retry_at: Instant::now(),
                    tokens: 0,
                },
            );
            Ok(())
        }
    }
}

/// The entities of each chunk of `document`, as the shard stores them.
pub fn entities_of(document: &PendingGraphDocument, language: Language) -> Vec<ChunkGraph> {
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
            ChunkGraph {
                position: chunk.position,
                mentions,
                events: Vec::new(),
            }
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
        let mentions = &entities_of(&document, Language::English)[0].mentions;
        let names: Vec<&str> = mentions.iter().map(|m| m.name.as_str()).collect();
        assert!(!names.contains(&"Context"), "{names:?}");
        assert!(names.contains(&"Grace Darling"), "{names:?}");
        assert!(names.contains(&"Farne Islands"), "{names:?}");
        assert_eq!(body("no prefix"), "no prefix");
        assert_eq!(body("[Context: broken"), "[Context: broken");
    }
}
