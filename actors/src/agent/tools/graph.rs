//! `graph_search`: the run's KBs' entity graphs (GraphRAG, ADR 0037) for questions that hop
//! from one named thing to another. Three modes: `entities` (names starting with `name`),
//! `neighbours` (an entity's co-mentioned entities and the chunks mentioning it, with their
//! chunk ids to read or cite), `path` (the shortest chain of chunks joining `from` and
//! `to`) and `events` (what an entity did or underwent, where an LLM extractor found events,
//! each with the chunk it came from, citable) and `community` (the largest groups of entities
//! mentioned together, each with a summary when the node has a chat model and the chunks that
//! mention most of its members, citable: for questions about a whole collection). A KB without
//! a graph is skipped with a note.

use serde::Deserialize;

use super::{ToolContext, ToolError, ToolOutput, select_kbs};
use crate::agent::evidence::EvidenceChunk;
use crate::agent::terms::truncate_chars;

/// Neighbours and mentions shown per entity.
const SHOWN: usize = 12;
/// Characters of a mentioning chunk shown.
const MENTION_CHARS: usize = 300;
/// Communities shown (and summarised) per KB.
pub const COMMUNITIES_SHOWN: usize = 5;

#[derive(Debug, Deserialize)]
pub struct GraphArgs {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub kb: Option<String>,
}

/// A chunk the tool showed with its id: evidence the answer may cite, as one read directly.
fn read_directly(kb: &str, chunk: sift_storage::chunk::ChunkView) -> EvidenceChunk {
    EvidenceChunk {
        kb_id: kb.to_string(),
        chunk,
        relevance: 0.0,
        score: 0.0,
        searched: false,
    }
}

/// A chunk as the model sees it: its id and document, then the start of its text.
fn chunk_lines(indent: &str, chunk: &sift_storage::chunk::ChunkView) -> String {
    format!(
        "{indent}- chunk_id: {} | document: {:?}\n{indent}  {}\n",
        chunk.chunk_id,
        chunk.title,
        truncate_chars(chunk.text.trim(), MENTION_CHARS)
    )
}

fn bad(message: &str) -> ToolError {
    ToolError::BadArguments {
        tool: super::GRAPH_SEARCH.into(),
        message: message.into(),
    }
}

pub async fn graph_search(
    context: &ToolContext<'_>,
    args: GraphArgs,
) -> Result<ToolOutput, ToolError> {
    let name = args
        .name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty());
    let mode = match args.mode.as_deref() {
        Some(mode) => mode,
        None if args.from.is_some() => "path",
        None => "neighbours",
    };
    let kbs = select_kbs(context, args.kb.as_deref())?;
    let mut content = String::new();
    let mut chunks: Vec<EvidenceChunk> = Vec::new();
    let mut found = 0usize;
    let mut errors = Vec::new();
    for kb in &kbs {
        let outcome = match mode {
            "entities" => {
                let name = name.ok_or_else(|| bad("entities needs name"))?;
                context.corpus.graph_entities(kb, name).await.map(|list| {
                    found += list.entities.len();
                    list.entities
                        .iter()
                        .map(|e| format!("- {} ({}, in {} chunks)\n", e.name, e.kind, e.chunks))
                        .collect::<String>()
                })
            }
            "neighbours" => {
                let name = name.ok_or_else(|| bad("neighbours needs name"))?;
                context.corpus.graph_entity(kb, name).await.map(|detail| {
                    found += 1;
                    let mut text = format!(
                        "Entity {} ({}), in {} chunks. Mentioned with: {}.\nChunks that mention it:\n",
                        detail.entity.name,
                        detail.entity.kind,
                        detail.entity.chunks,
                        detail
                            .neighbours
                            .iter()
                            .take(SHOWN)
                            .map(|n| format!("{} ({} shared)", n.entity.name, n.shared_chunks))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    for mention in detail.mentions.into_iter().take(SHOWN) {
                        text.push_str(&chunk_lines("", &mention));
                        // Shown with its id: citable, as a chunk read directly.
                        chunks.push(read_directly(kb, mention));
                    }
                    text
                })
            }
            "path" => {
                let (Some(from), Some(to)) = (args.from.as_deref(), args.to.as_deref()) else {
                    return Err(bad("path needs from and to"));
                };
                context.corpus.graph_path(kb, from, to).await.map(|path| {
                    if !path.found {
                        return format!("No path of at most 3 chunks joins {from:?} and {to:?}.\n");
                    }
                    found += 1;
                    let steps: Vec<String> = path
                        .steps
                        .iter()
                        .map(|step| match &step.via_chunk {
                            Some(chunk) => format!("{} -[chunk {chunk}]->", step.entity.name),
                            None => step.entity.name.clone(),
                        })
                        .collect();
                    format!("Path ({} hops): {}\n", path.hops, steps.join(" "))
                })
            }
            "events" => {
                let name = name.ok_or_else(|| bad("events needs name"))?;
                context.corpus.graph_entity(kb, name).await.map(|detail| {
                    if detail.events.is_empty() {
                        return format!(
                            "No events name {} in {kb} (events come from a KB whose graph is llm).\n",
                            detail.entity.name
                        );
                    }
                    found += detail.events.len().min(SHOWN);
                    let mut text = format!("Events of {}:\n", detail.entity.name);
                    for event in detail.events.iter().take(SHOWN) {
                        let mut line = format!("- {} {}", event.subject, event.predicate);
                        for (label, value) in [("", &event.object), (" | time: ", &event.time), (" | place: ", &event.place)] {
                            if !value.is_empty() {
                                line.push_str(if label.is_empty() { " " } else { label });
                                line.push_str(value);
                            }
                        }
                        text.push_str(&format!("{line} | chunk_id: {}\n", event.chunk_id));
                    }
                    // The chunks the events came from: citable, as chunks read directly.
                    for mention in detail.mentions {
                        if detail.events.iter().take(SHOWN).any(|e| e.chunk_id == mention.chunk_id) {
                            chunks.push(read_directly(kb, mention));
                        }
                    }
                    text
                })
            }
            "community" => context.corpus.graph_communities(kb).await.map(|list| {
                if list.communities.is_empty() {
                    return format!(
                        "No communities in {kb}: too few entities are mentioned together.\n"
                    );
                }
                found += list.communities.len();
                let mut text = format!("Communities of {kb} (largest first):\n");
                for (n, community) in list.communities.into_iter().enumerate() {
                    let names: Vec<&str> =
                        community.members.iter().map(|m| m.name.as_str()).collect();
                    text.push_str(&format!(
                        "{}. {} entities, {} chunks: {}\n",
                        n + 1,
                        community.size,
                        community.chunks,
                        names.join(", ")
                    ));
                    if let Some(summary) = &community.summary {
                        text.push_str(&format!("   Summary: {summary}\n"));
                    }
                    for passage in community.passages {
                        text.push_str(&chunk_lines("   ", &passage));
                        chunks.push(read_directly(kb, passage));
                    }
                }
                text
            }),
            other => {
                return Err(bad(&format!(
                    "unknown mode {other:?}; modes are entities, neighbours, path, events and community"
                )));
            }
        };
        match outcome {
            Ok(text) => content.push_str(&text),
            Err(error) => errors.push(format!("{kb}: {error}")),
        }
    }
    if found == 0 && !errors.is_empty() && errors.len() == kbs.len() {
        return Err(ToolError::Failed(format!(
            "graph search failed: {}",
            errors[0]
        )));
    }
    if content.is_empty() {
        content.push_str("Nothing found in the graph.");
    }
    Ok(ToolOutput {
        summary: format!("graph {mode}: {found} result(s)"),
        content,
        chunks,
        ..ToolOutput::default()
    })
}
