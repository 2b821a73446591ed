//! The LLM graph extractor (ADR 0038): a KB whose `graph` is `llm` has the node's chat model
//! read its chunks, a few per request, and fill a JSON schema (offered as the one tool
//! `record_graph`, so providers without native tool calling use the tool modes of
//! `sift_models::llm`) with typed entities and events (subject, predicate, object, time,
//! place). Each chunk's answer is cached by the model, the prompt's version and the chunk's
//! text ([`ExtractionCache`]), so the same text is never paid for twice on a node.
//!
//! A reply that is not JSON, JSON that does not fit the schema, a model error and a request
//! past its deadline are each an [`ExtractError`]: the extractor (`super`) counts it and
//! retries the document later; it never blocks the other documents.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sift_models::llm::{
    ChatEvent, ChatMessage, ChatRequest, FinishReason, SharedChatModel, ToolSpec,
};
use sift_storage::extraction_cache::ExtractionCache;
use sift_storage::shard::{ChunkGraph, GraphEvent, GraphMention, PendingGraphDocument};

/// Part of every cache key: a new prompt or schema asks again.
pub const PROMPT_VERSION: &str = "graph-v1";
/// The tool whose arguments are the extraction.
pub const TOOL: &str = "record_graph";
/// Chunks per request, and their text at most (a longer chunk goes alone).
const BATCH_CHUNKS: usize = 4;
const BATCH_CHARS: usize = 6_000;
/// A chunk's text shown to the model at most (chars).
const CHUNK_CHARS: usize = 16_000;
/// Kept per chunk: entities (as the embedded extractor's cap) and events.
const MAX_ENTITIES: usize = 48;
const MAX_EVENTS: usize = 32;
/// What the schema lets a model write per chunk: a constrained decoder stops a small model
/// that would list entities until `max_tokens` (the 0.5B model did, run G3).
const ASKED_ENTITIES: usize = 12;
const ASKED_EVENTS: usize = 6;
/// The longest name, subject or object the schema lets a model write (chars); a predicate,
/// time or place is shorter still.
const ASKED_NAME_CHARS: usize = 60;
const ASKED_SHORT_CHARS: usize = 40;
/// Completion tokens a request may use: a base and a share per chunk, enough for what the
/// schema allows.
const TOKENS_BASE: u32 = 256;
const TOKENS_PER_CHUNK: u32 = 1_024;
/// A name, predicate, time or place at most (chars); longer is cut.
const MAX_FIELD_CHARS: usize = 120;
/// The entity types the schema names; anything else is `other`.
pub const KINDS: &[&str] = &[
    "person",
    "organisation",
    "place",
    "event",
    "work",
    "concept",
    "date",
    "other",
];

const INSTRUCTIONS: &str = "You extract a knowledge graph from text. For each numbered chunk, \
list the named entities it mentions (people, organisations, places, events, works, concepts, \
dates) with their type, and the events it states: who (subject) did what (predicate, a short \
verb phrase) to whom or what (object), when (time) and where (place), each as written in the \
chunk. Use only what the chunk says. Answer by calling record_graph once, with one entry per \
chunk number.";

/// Why a request of the extractor failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExtractError {
    #[error("the model answered invalid JSON: {0}")]
    InvalidJson(String),
    #[error("the model's answer does not fit the schema: {0}")]
    Schema(String),
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the model failed: {0}")]
    Model(String),
}

impl ExtractError {
    /// The `outcome` label of `sift_graph_llm_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            ExtractError::InvalidJson(_) => "invalid_json",
            ExtractError::Schema(_) => "schema",
            ExtractError::Timeout(_) => "timeout",
            ExtractError::Model(_) => "model",
        }
    }
}

/// What the model found in one chunk (also the cache's JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkReply {
    #[serde(default)]
    pub entities: Vec<EntityReply>,
    #[serde(default)]
    pub events: Vec<EventReply>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntityReply {
    pub name: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventReply {
    pub subject: String,
    pub predicate: String,
    #[serde(default)]
    pub object: Option<String>,
    #[serde(default)]
    pub time: Option<String>,
    #[serde(default)]
    pub place: Option<String>,
}

#[derive(Deserialize)]
struct Reply {
    chunks: Vec<NumberedReply>,
}

#[derive(Deserialize)]
struct NumberedReply {
    chunk: usize,
    #[serde(flatten)]
    reply: ChunkReply,
}

/// A document's extraction.
#[derive(Debug, Default)]
pub struct Extraction {
    pub chunks: Vec<ChunkGraph>,
    /// Chunks answered from the cache.
    pub cached: usize,
}

/// The JSON Schema of `record_graph`'s arguments.
pub fn schema() -> Value {
    let text = json!({ "type": "string", "maxLength": ASKED_NAME_CHARS });
    let short = json!({ "type": "string", "maxLength": ASKED_SHORT_CHARS });
    json!({
        "type": "object",
        "properties": {
            "chunks": {
                "type": "array",
                "maxItems": BATCH_CHUNKS,
                "items": {
                    "type": "object",
                    "properties": {
                        "chunk": { "type": "integer", "description": "the chunk's number" },
                        "entities": {
                            "type": "array",
                            "maxItems": ASKED_ENTITIES,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": text,
                                    "type": { "type": "string", "enum": KINDS }
                                },
                                "required": ["name", "type"]
                            }
                        },
                        "events": {
                            "type": "array",
                            "maxItems": ASKED_EVENTS,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "subject": text,
                                    "predicate": short,
                                    "object": text,
                                    "time": short,
                                    "place": short
                                },
                                "required": ["subject", "predicate"]
                            }
                        }
                    },
                    "required": ["chunk", "entities", "events"]
                }
            }
        },
        "required": ["chunks"]
    })
}

fn tool() -> ToolSpec {
    ToolSpec {
        name: TOOL.into(),
        description: "Records the entities and events found in each numbered chunk.".into(),
        parameters: schema(),
    }
}

/// Extracts the entities and events of `document`'s chunks (`texts`: each chunk's position
/// and the text to read), asking `model` for the chunks the cache does not hold. Returns the
/// tokens spent (also on failure) and the extraction or the first request's error.
pub async fn extract(
    model: &SharedChatModel,
    cache: &ExtractionCache,
    texts: &[(u32, &str)],
    timeout: Duration,
) -> (u64, Result<Extraction, ExtractError>) {
    let mut replies: Vec<Option<ChunkReply>> = Vec::with_capacity(texts.len());
    for (_, text) in texts {
        let cached = cache
            .get(model.name(), PROMPT_VERSION, text)
            .ok()
            .flatten()
            .and_then(|bytes| serde_json::from_slice::<ChunkReply>(&bytes).ok());
        replies.push(cached);
    }
    let cached = replies.iter().filter(|reply| reply.is_some()).count();
    metrics::counter!("sift_graph_llm_cache_hits_total").increment(cached as u64);
    let missing: Vec<usize> = (0..texts.len()).filter(|&i| replies[i].is_none()).collect();
    let mut tokens = 0u64;
    for batch in batches(&missing, texts) {
        let started = Instant::now();
        let chunk_texts: Vec<&str> = batch.iter().map(|&i| texts[i].1).collect();
        let (spent, answer) = ask(model, &chunk_texts, timeout).await;
        tokens += spent;
        metrics::counter!("sift_graph_llm_tokens_total").increment(spent);
        metrics::histogram!("sift_graph_llm_request_seconds")
            .record(started.elapsed().as_secs_f64());
        let outcome = match &answer {
            Ok(_) => "ok",
            Err(error) => error.outcome(),
        };
        metrics::counter!("sift_graph_llm_requests_total", "outcome" => outcome).increment(1);
        let found = match answer {
            Ok(found) => found,
            Err(error) => return (tokens, Err(error)),
        };
        for (slot, reply) in batch.iter().zip(found) {
            if let Ok(bytes) = serde_json::to_vec(&reply) {
                let _ = cache.put(model.name(), PROMPT_VERSION, texts[*slot].1, &bytes);
            }
            replies[*slot] = Some(reply);
        }
    }
    let chunks = texts
        .iter()
        .zip(replies)
        .map(|((position, text), reply)| graph_of(*position, text, reply.unwrap_or_default()))
        .collect();
    (tokens, Ok(Extraction { chunks, cached }))
}

/// Groups the chunk indexes of `missing` into requests: at most [`BATCH_CHUNKS`] chunks and
/// [`BATCH_CHARS`] of text each (a longer chunk goes alone).
fn batches(missing: &[usize], texts: &[(u32, &str)]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut chars = 0;
    for &i in missing {
        let length = texts[i].1.chars().count().min(CHUNK_CHARS);
        let full = out
            .last()
            .is_none_or(|batch| batch.len() == BATCH_CHUNKS || chars + length > BATCH_CHARS);
        if full {
            out.push(Vec::new());
            chars = 0;
        }
        if let Some(batch) = out.last_mut() {
            batch.push(i);
        }
        chars += length;
    }
    out
}

/// One request: the chunks, numbered from 1; their replies in the same order.
async fn ask(
    model: &SharedChatModel,
    chunks: &[&str],
    timeout: Duration,
) -> (u64, Result<Vec<ChunkReply>, ExtractError>) {
    let mut prompt = String::new();
    for (n, text) in chunks.iter().enumerate() {
        let shown: String = text.chars().take(CHUNK_CHARS).collect();
        prompt.push_str(&format!("### Chunk {}\n{}\n\n", n + 1, shown.trim()));
    }
    let request = ChatRequest {
        messages: vec![
            ChatMessage::System {
                content: INSTRUCTIONS.into(),
            },
            ChatMessage::User { content: prompt },
        ],
        tools: vec![tool()],
        max_tokens: Some(TOKENS_BASE + TOKENS_PER_CHUNK * chunks.len() as u32),
        temperature: Some(0.0),
    };
    let mut tokens = 0u64;
    let answer = tokio::time::timeout(timeout, async {
        let mut stream = model
            .stream(request)
            .await
            .map_err(|error| ExtractError::Model(error.to_string()))?;
        let mut text = String::new();
        let mut arguments = None;
        let mut cut = false;
        while let Some(event) = stream.next().await {
            match event.map_err(|error| ExtractError::Model(error.to_string()))? {
                ChatEvent::TextDelta(delta) => text.push_str(&delta),
                ChatEvent::ToolCall(call) if call.name == TOOL && arguments.is_none() => {
                    arguments = Some(call.arguments);
                }
                ChatEvent::Usage(usage) => {
                    tokens += u64::from(usage.prompt_tokens) + u64::from(usage.completion_tokens);
                }
                ChatEvent::Finished(FinishReason::Length) => cut = true,
                _ => {}
            }
        }
        match arguments {
            Some(arguments) => Ok(arguments),
            None if cut => Err(ExtractError::InvalidJson(format!(
                "the answer was cut at max_tokens without a complete record_graph call: {:?}",
                preview(&text)
            ))),
            None => Ok(text),
        }
    })
    .await;
    let answer = match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(error)) => return (tokens, Err(error)),
        Err(_) => return (tokens, Err(ExtractError::Timeout(timeout))),
    };
    (tokens, parse(&answer, chunks.len()))
}

/// The replies of `n` chunks in a model's answer: the tool's arguments, or JSON written as
/// text (in a code fence or not). Chunks the answer leaves out found nothing.
pub fn parse(answer: &str, n: usize) -> Result<Vec<ChunkReply>, ExtractError> {
    let json = json_text(answer);
    let value: Value = serde_json::from_str(json)
        .map_err(|error| ExtractError::InvalidJson(format!("{error} in {:?}", preview(answer))))?;
    let reply: Reply = serde_json::from_value(value)
        .map_err(|error| ExtractError::Schema(format!("{error} in {:?}", preview(answer))))?;
    let mut out = vec![ChunkReply::default(); n];
    let listed = reply.chunks.len();
    let mut matched = 0;
    for numbered in reply.chunks {
        if let Some(slot) = numbered.chunk.checked_sub(1).and_then(|i| out.get_mut(i)) {
            *slot = numbered.reply;
            matched += 1;
        }
    }
    if matched == 0 && listed > 0 {
        return Err(ExtractError::Schema(format!(
            "no entry numbers one of the chunks 1 to {n} in {:?}",
            preview(answer)
        )));
    }
    Ok(out)
}

/// The JSON object in `answer`: from its first `{` to its last `}` (a model writing JSON as
/// text may fence it or say a word around it); the whole answer when there is none.
fn json_text(answer: &str) -> &str {
    match (answer.find('{'), answer.rfind('}')) {
        (Some(start), Some(end)) if start < end => &answer[start..=end],
        _ => answer.trim(),
    }
}

fn preview(answer: &str) -> String {
    let mut shown: String = answer.chars().take(80).collect();
    if shown.len() < answer.len() {
        shown.push('…');
    }
    shown
}

/// A chunk's graph from the model's reply: names canonicalised into global ids (as the
/// embedded extractor's), types checked, the subject, object and place of every event also
/// mentions of the chunk, fields and counts capped.
pub fn graph_of(position: u32, text: &str, reply: ChunkReply) -> ChunkGraph {
    let lowered = text.to_lowercase();
    let mut mentions: Vec<GraphMention> = Vec::new();
    let mention = |name: &str, kind: &str, mentions: &mut Vec<GraphMention>| -> Option<u64> {
        let name = field(name);
        let canonical = sift_graph::canonical(&name);
        if canonical.is_empty() {
            return None;
        }
        let id = sift_graph::entity_id(&canonical);
        if mentions.iter().any(|m| m.id == id) {
            return Some(id);
        }
        if mentions.len() == MAX_ENTITIES {
            return None;
        }
        let count = lowered.matches(&name.to_lowercase()).count().max(1);
        mentions.push(GraphMention {
            id,
            canonical,
            name,
            kind: kind.to_string(),
            count: u32::try_from(count).unwrap_or(u32::MAX),
        });
        Some(id)
    };
    for entity in &reply.entities {
        let kind = entity
            .kind
            .as_deref()
            .map(|kind| kind.trim().to_lowercase())
            .filter(|kind| KINDS.contains(&kind.as_str()))
            .unwrap_or_else(|| "other".into());
        mention(&entity.name, &kind, &mut mentions);
    }
    let mut events = Vec::new();
    for event in reply.events.iter().take(MAX_EVENTS) {
        let (subject, predicate) = (field(&event.subject), field(&event.predicate));
        if predicate.is_empty() {
            continue;
        }
        let Some(subject_id) = mention(&subject, "other", &mut mentions) else {
            continue;
        };
        let mut entities = vec![subject_id];
        let object = field(event.object.as_deref().unwrap_or_default());
        let place = field(event.place.as_deref().unwrap_or_default());
        if !object.is_empty()
            && let Some(id) = mention(&object, "other", &mut mentions)
        {
            entities.push(id);
        }
        if !place.is_empty()
            && let Some(id) = mention(&place, "place", &mut mentions)
        {
            entities.push(id);
        }
        entities.sort_unstable();
        entities.dedup();
        events.push(GraphEvent {
            subject,
            predicate,
            object,
            time: field(event.time.as_deref().unwrap_or_default()),
            place,
            entities,
        });
    }
    ChunkGraph {
        position,
        mentions,
        events,
    }
}

/// `value` trimmed, on one line, at most [`MAX_FIELD_CHARS`].
fn field(value: &str) -> String {
    value
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_FIELD_CHARS)
        .collect()
}

/// The texts a model reads of `document`'s chunks: without the chunker's context line.
pub fn texts_of(document: &PendingGraphDocument) -> Vec<(u32, &str)> {
    document
        .chunks
        .iter()
        .map(|chunk| (chunk.position, super::body(&chunk.text)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_fits_the_schema_or_says_why_not() {
        let good = r#"Sure: ```json
{"chunks": [{"chunk": 2, "entities": [{"name": "Scott Derrickson", "type": "person"}],
  "events": [{"subject": "Scott Derrickson", "predicate": "directed", "object": "Doctor Strange", "time": "2016"}]}]}
```"#;
        let replies = parse(good, 2).unwrap();
        assert_eq!(replies[0], ChunkReply::default());
        assert_eq!(replies[1].entities[0].name, "Scott Derrickson");
        assert_eq!(
            replies[1].events[0].object.as_deref(),
            Some("Doctor Strange")
        );
        assert!(matches!(
            parse("I cannot help with that.", 1),
            Err(ExtractError::InvalidJson(_))
        ));
        assert!(matches!(
            parse(r#"{"chunks": [{"chunk": 1, "entities": "Ada"}]}"#, 1),
            Err(ExtractError::Schema(_))
        ));
        assert!(matches!(
            parse(r#"{"entities": []}"#, 1),
            Err(ExtractError::Schema(_))
        ));
        assert!(matches!(
            parse(
                r#"{"chunks": [{"chunk": 7, "entities": [], "events": []}]}"#,
                2
            ),
            Err(ExtractError::Schema(_))
        ));
        // Nothing found is an answer.
        assert_eq!(
            parse(r#"{"chunks": []}"#, 1).unwrap(),
            vec![ChunkReply::default()]
        );
    }

    #[test]
    fn a_reply_becomes_mentions_and_events_with_global_ids() {
        let text =
            "Scott Derrickson directed Doctor Strange in 2016. Derrickson grew up in Denver.";
        let reply = ChunkReply {
            entities: vec![
                EntityReply {
                    name: "Scott  Derrickson".into(),
                    kind: Some("PERSON".into()),
                },
                EntityReply {
                    name: "Doctor Strange".into(),
                    kind: Some("film".into()),
                },
                EntityReply {
                    name: "  ".into(),
                    kind: None,
                },
            ],
            events: vec![
                EventReply {
                    subject: "Scott Derrickson".into(),
                    predicate: "directed".into(),
                    object: Some("Doctor Strange".into()),
                    time: Some("2016".into()),
                    place: None,
                },
                EventReply {
                    subject: "Derrickson".into(),
                    predicate: "grew up in".into(),
                    object: None,
                    time: None,
                    place: Some("Denver".into()),
                },
                EventReply {
                    subject: "Nobody".into(),
                    predicate: " ".into(),
                    object: None,
                    time: None,
                    place: None,
                },
            ],
        };
        let graph = graph_of(3, text, reply);
        assert_eq!(graph.position, 3);
        let names: Vec<(&str, &str)> = graph
            .mentions
            .iter()
            .map(|m| (m.name.as_str(), m.kind.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("Scott Derrickson", "person"),
                ("Doctor Strange", "other"),
                ("Derrickson", "other"),
                ("Denver", "place"),
            ]
        );
        let strange = sift_graph::entity_id(&sift_graph::canonical("Doctor Strange"));
        assert_eq!(
            graph.mentions[1].id, strange,
            "ids are the embedded extractor's"
        );
        assert_eq!(graph.events.len(), 2);
        assert_eq!(graph.events[0].entities.len(), 2);
        assert!(graph.events[0].entities.contains(&strange));
        assert_eq!(graph.events[0].time, "2016");
        assert_eq!(graph.events[1].place, "Denver");
    }

    #[test]
    fn requests_hold_a_few_chunks() {
        let long = "x".repeat(BATCH_CHARS);
        let texts: Vec<(u32, &str)> = vec![
            (0, "a"),
            (1, "b"),
            (2, long.as_str()),
            (3, "c"),
            (4, "d"),
            (5, "e"),
            (6, "f"),
            (7, "g"),
        ];
        let all: Vec<usize> = (0..texts.len()).collect();
        assert_eq!(
            batches(&all, &texts),
            vec![vec![0, 1], vec![2], vec![3, 4, 5, 6], vec![7]]
        );
    }
}
