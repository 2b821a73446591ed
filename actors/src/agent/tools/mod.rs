//! The agent's tools. The set is fixed per preset when the run starts ([`Toolbox::for_preset`])
//! and checked on every call: a name outside it (say, `delete` written by a hostile document)
//! is an unknown-tool error observation, never an action.
//!
//! - `knowledge_search` ([`search`]): hybrid search over the run's KBs.
//! - `grep_chunks`, `list_chunks`, `read_chunk`, `read_document` ([`read`]): literal or regex
//!   matching, and deep reading by document and position.
//! - `graph_search` ([`graph`]): entities, neighbours, paths, events and communities of the
//!   KBs' entity graphs.
//! - `thinking`: a scratchpad; `final_answer`: handled by the run loop itself.
//! - `web_search` and MCP tools (`{server}__{tool}`) when the preset configures them
//!   ([`external`]).

pub mod external;
pub mod graph;
pub mod read;
pub mod search;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use external::ExternalTool;

use serde::de::DeserializeOwned;
use serde_json::json;

use super::Corpus;
use super::evidence::EvidenceChunk;
use super::planner::QueryPlan;
use super::{AgentPreset, FailedShardRef, HitRef};
use sift_models::llm::ToolSpec;

pub const KNOWLEDGE_SEARCH: &str = "knowledge_search";
pub const GREP_CHUNKS: &str = "grep_chunks";
pub const LIST_CHUNKS: &str = "list_chunks";
pub const READ_CHUNK: &str = "read_chunk";
pub const READ_DOCUMENT: &str = "read_document";
pub const GRAPH_SEARCH: &str = "graph_search";
pub const THINKING: &str = "thinking";
pub const FINAL_ANSWER: &str = "final_answer";

/// Most chunk ids `final_answer`'s schema lets a model list (a bound for constrained decoders:
/// a small model once listed ids `#2, #3, ...` until its token limit cut the answer off).
pub const MAX_CITATIONS: usize = 16;

/// Built-in tools in the order they are offered.
pub const BUILTIN_TOOLS: &[&str] = &[
    KNOWLEDGE_SEARCH,
    GREP_CHUNKS,
    LIST_CHUNKS,
    READ_CHUNK,
    READ_DOCUMENT,
    GRAPH_SEARCH,
    THINKING,
    FINAL_ANSWER,
];

/// What a tool call produced.
#[derive(Clone, Debug, Default)]
pub struct ToolOutput {
    /// The observation for the model (wrapped as data by the run loop).
    pub content: String,
    /// One line for the `tool_result` event and the trace.
    pub summary: String,
    pub hits: Vec<HitRef>,
    /// Chunks the tool returned: they become citable.
    pub chunks: Vec<EvidenceChunk>,
    pub failed_shards: Vec<FailedShardRef>,
    /// For `knowledge_search`: the queries it ran (for the verifier's terms).
    pub queries: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments for {tool}: {message}")]
    BadArguments { tool: String, message: String },
    #[error("unknown tool {name:?}; the available tools are: {available}")]
    Unknown { name: String, available: String },
    #[error("{0}")]
    Failed(String),
    #[error("the tool did not answer within {0} s")]
    Timeout(u64),
}

impl ToolError {
    /// The `status` label of `sift_agent_tool_calls_total`.
    pub fn status(&self) -> &'static str {
        match self {
            ToolError::BadArguments { .. } => "bad_arguments",
            ToolError::Unknown { .. } => "unknown_tool",
            ToolError::Failed(_) => "error",
            ToolError::Timeout(_) => "timeout",
        }
    }
}

/// What tools may touch in this run.
pub struct ToolContext<'a> {
    pub corpus: &'a dyn Corpus,
    /// KB ids of the run: no tool reads outside them.
    pub kbs: &'a [String],
    pub plan: &'a QueryPlan,
    /// The (rewritten) question: its first search also runs the plan's queries.
    pub question: &'a str,
    /// True until the first `knowledge_search` of the run.
    pub first_search: bool,
}

/// The fixed tool set of a run.
pub struct Toolbox {
    specs: Vec<ToolSpec>,
    names: BTreeSet<String>,
    external: BTreeMap<String, Arc<dyn ExternalTool>>,
}

impl Toolbox {
    /// The built-in tools `preset` allows (`final_answer` always: a run must be able to end).
    pub fn for_preset(preset: &AgentPreset) -> Toolbox {
        let allowed = |name: &str| {
            name == FINAL_ANSWER
                || preset
                    .tools
                    .as_ref()
                    .is_none_or(|list| list.iter().any(|n| n == name))
        };
        let specs: Vec<ToolSpec> = builtin_specs()
            .into_iter()
            .filter(|spec| allowed(&spec.name))
            .collect();
        let names = specs.iter().map(|s| s.name.clone()).collect();
        Toolbox {
            specs,
            names,
            external: BTreeMap::new(),
        }
    }

    /// Adds a tool of a configured service (web search, an MCP server's tool). Names that
    /// clash with a tool already present are skipped (a remote server cannot replace a
    /// built-in tool); returns whether it was added.
    pub fn add_external(&mut self, tool: Arc<dyn ExternalTool>) -> bool {
        let spec = tool.spec().clone();
        if self.names.contains(&spec.name) {
            return false;
        }
        // Keep final_answer last in the list the model reads.
        let at = self
            .specs
            .iter()
            .position(|s| s.name == FINAL_ANSWER)
            .unwrap_or(self.specs.len());
        self.names.insert(spec.name.clone());
        self.external.insert(spec.name.clone(), tool);
        self.specs.insert(at, spec);
        true
    }

    /// The metrics label of a tool of this run.
    pub fn label(&self, name: &str) -> &'static str {
        if let Some(tool) = self.external.get(name) {
            return tool.label();
        }
        BUILTIN_TOOLS
            .iter()
            .find(|builtin| **builtin == name)
            .copied()
            .unwrap_or("unknown")
    }

    pub fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.name.clone()).collect()
    }

    pub fn allows(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// Only `final_answer`: what a run offers when it must answer now.
    pub fn final_answer_only(&self) -> Vec<ToolSpec> {
        self.specs
            .iter()
            .filter(|s| s.name == FINAL_ANSWER)
            .cloned()
            .collect()
    }

    /// Runs one call of an allowed tool other than `final_answer`.
    pub async fn call(
        &self,
        context: &ToolContext<'_>,
        name: &str,
        arguments: serde_json::Value,
    ) -> Result<ToolOutput, ToolError> {
        if !self.allows(name) || name == FINAL_ANSWER {
            return Err(self.unknown(name));
        }
        match name {
            KNOWLEDGE_SEARCH => {
                search::knowledge_search(context, parse_args(name, arguments)?).await
            }
            GREP_CHUNKS => read::grep_chunks(context, parse_args(name, arguments)?).await,
            LIST_CHUNKS => read::list_chunks(context, parse_args(name, arguments)?).await,
            READ_CHUNK => read::read_chunk(context, parse_args(name, arguments)?).await,
            READ_DOCUMENT => read::read_document(context, parse_args(name, arguments)?).await,
            GRAPH_SEARCH => graph::graph_search(context, parse_args(name, arguments)?).await,
            _ if self.external.contains_key(name) => {
                let tool = self.external[name].clone();
                tool.call(arguments).await
            }
            THINKING => {
                let args: ThinkingArgs = parse_args(name, arguments)?;
                Ok(ToolOutput {
                    content: "Thought recorded. Continue: search, read, or call final_answer."
                        .into(),
                    summary: format!("thought ({} characters)", args.thought.chars().count()),
                    ..ToolOutput::default()
                })
            }
            _ => Err(self.unknown(name)),
        }
    }

    pub fn unknown(&self, name: &str) -> ToolError {
        ToolError::Unknown {
            name: name.chars().take(100).collect(),
            available: self.names().join(", "),
        }
    }
}

#[derive(serde::Deserialize)]
struct ThinkingArgs {
    thought: String,
}

/// Deserialises a tool's arguments, turning serde's message into a bad-arguments error.
pub fn parse_args<T: DeserializeOwned>(
    tool: &str,
    arguments: serde_json::Value,
) -> Result<T, ToolError> {
    serde_json::from_value(arguments).map_err(|error| ToolError::BadArguments {
        tool: tool.to_string(),
        message: error.to_string(),
    })
}

/// Parses the argument text a model wrote. Accepts what models actually produce: empty text
/// (no arguments), code fences, a JSON string holding the object (double encoding), and an
/// object followed by stray text. Anything else is an error naming the problem.
pub fn parse_arguments(raw: &str) -> Result<serde_json::Value, String> {
    let mut text = raw.trim();
    if text.is_empty() {
        return Ok(json!({}));
    }
    if let Some(inner) = text.strip_prefix("```") {
        let inner = inner.trim_start_matches(|c: char| c.is_ascii_alphabetic());
        text = inner.trim_end().trim_end_matches("```").trim();
    }
    let value = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => value,
        Err(error) => match super::model_io::extract_json_object(text) {
            Some(value) if text.starts_with('{') => value,
            _ => return Err(format!("arguments are not valid JSON ({error})")),
        },
    };
    let value = match value {
        serde_json::Value::String(inner) => serde_json::from_str::<serde_json::Value>(&inner)
            .map_err(|error| format!("arguments are not valid JSON ({error})"))?,
        serde_json::Value::Null => json!({}),
        other => other,
    };
    if value.is_object() {
        Ok(value)
    } else {
        Err(format!(
            "arguments must be a JSON object, got {}",
            match value {
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Bool(_) => "a boolean",
                _ => "a string",
            }
        ))
    }
}

/// The built-in tools' specs.
pub fn builtin_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: KNOWLEDGE_SEARCH.into(),
            description: "Hybrid (semantic + keyword) search over the selected knowledge bases. \
                Returns the best chunks with their chunk_id, document and section. Several calls \
                in one step run in parallel."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for: a question or keywords."},
                    "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Hits to return (default 8)."},
                    "kb": {"type": "string", "description": "Restrict to one of the run's knowledge bases (id or name)."}
                },
                "required": ["query"]
            }),
        },
        ToolSpec {
            name: GREP_CHUNKS.into(),
            description: "Find chunks whose text contains a literal string or matches a regular \
                expression (case-insensitive), in one document or across the knowledge bases. \
                Good for exact names, numbers and codes."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "regex": {"type": "boolean", "description": "Treat pattern as a regular expression (default false: literal)."},
                    "document_id": {"type": "string", "description": "Only this document."},
                    "kb": {"type": "string"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 20}
                },
                "required": ["pattern"]
            }),
        },
        ToolSpec {
            name: LIST_CHUNKS.into(),
            description:
                "List a document's chunks in order (position, chunk_id, section, first words)."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "document_id": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 30}
                },
                "required": ["document_id"]
            }),
        },
        ToolSpec {
            name: READ_CHUNK.into(),
            description: "Read a chunk in full with its neighbours, by chunk_id or by document_id \
                and position."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "chunk_id": {"type": "string"},
                    "document_id": {"type": "string"},
                    "position": {"type": "integer", "minimum": 0},
                    "neighbours": {"type": "integer", "minimum": 0, "maximum": 3, "description": "Chunks to include before and after (default 1)."}
                }
            }),
        },
        ToolSpec {
            name: READ_DOCUMENT.into(),
            description:
                "A document's outline: its sections (heading paths) with their chunk positions."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {"document_id": {"type": "string"}},
                "required": ["document_id"]
            }),
        },
        ToolSpec {
            name: GRAPH_SEARCH.into(),
            description: "The knowledge bases' entity graph (names of people, places, works, \
                organisations, dates). mode neighbours (default): what is mentioned with an \
                entity, and the chunks that mention it; mode entities: names starting with \
                name; mode path: the chain of chunks joining two entities (from, to); mode \
                events: what an entity did or underwent (subject, predicate, object, time, \
                place), where a model extracted events; mode community: the main groups of \
                entities across the whole collection, with summaries and passages. Good for \
                questions that go from one named thing to another, and (community) for \
                questions about a whole collection's themes."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "enum": ["neighbours", "entities", "path", "events", "community"]},
                    "name": {"type": "string", "description": "An entity's name (neighbours, entities, events)."},
                    "from": {"type": "string", "description": "First entity (path)."},
                    "to": {"type": "string", "description": "Last entity (path)."},
                    "kb": {"type": "string"}
                }
            }),
        },
        ToolSpec {
            name: THINKING.into(),
            description:
                "Write down your reasoning or plan. Has no effect outside this conversation.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"thought": {"type": "string"}},
                "required": ["thought"]
            }),
        },
        ToolSpec {
            name: FINAL_ANSWER.into(),
            description: "Give the final answer. Cite evidence as [chunk_id] in the text and list \
                the cited chunk ids; only chunks returned by tools in this turn can be cited."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "answer": {"type": "string"},
                    "citations": {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": MAX_CITATIONS,
                        "description": "chunk ids"
                    }
                },
                "required": ["answer", "citations"]
            }),
        },
    ]
}

/// Arguments of `final_answer`.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct FinalAnswerArgs {
    pub answer: String,
    #[serde(default, deserialize_with = "string_or_list")]
    pub citations: Vec<String>,
}

fn string_or_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Either {
        One(String),
        Many(Vec<serde_json::Value>),
        Nothing(()),
    }
    Ok(match Either::deserialize(d)? {
        Either::One(one) => split_ids(&one),
        Either::Many(items) => items
            .into_iter()
            .flat_map(|item| match item {
                // A real 0.5B model put every id in one string: "a#0, b#1, c#0".
                serde_json::Value::String(s) => split_ids(&s),
                serde_json::Value::Object(map) => map
                    .get("chunk_id")
                    .and_then(|v| v.as_str())
                    .map(split_ids)
                    .unwrap_or_default(),
                _ => Vec::new(),
            })
            .collect(),
        Either::Nothing(()) => Vec::new(),
    })
}

/// Chunk ids in a string that may hold several, separated by commas, semicolons or spaces,
/// and written `[id]` as in the answer text.
fn split_ids(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .map(|id| id.trim_matches(|c: char| matches!(c, '[' | ']' | '"' | '\'')))
        .filter(|id| !id.is_empty())
        .map(String::from)
        .collect()
}

use serde::Deserialize as _;

/// The run's KBs a `kb` argument selects: all of them, or the one it names (by id or name).
///
/// A name that is no knowledge base at all is treated as no filter: small models fill the
/// optional `kb` argument with words from the question (seen with a real 0.5B model, which then
/// repeated the failing call until the run was stuck). A name of an existing KB outside the run
/// is refused.
pub fn select_kbs(context: &ToolContext<'_>, kb: Option<&str>) -> Result<Vec<String>, ToolError> {
    match kb {
        None => Ok(context.kbs.to_vec()),
        Some(name) => {
            let Ok(record) = context.corpus.find_kb(name) else {
                return Ok(context.kbs.to_vec());
            };
            if context.kbs.contains(&record.id) {
                Ok(vec![record.id])
            } else {
                Err(ToolError::Failed(format!(
                    "knowledge base {name:?} is not one of this run's knowledge bases"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_in_the_forms_models_write() {
        assert_eq!(parse_arguments("").unwrap(), json!({}));
        assert_eq!(parse_arguments("null").unwrap(), json!({}));
        assert_eq!(
            parse_arguments("```json\n{\"query\": \"x\"}\n```").unwrap(),
            json!({"query": "x"})
        );
        assert_eq!(
            parse_arguments("\"{\\\"query\\\": \\\"x\\\"}\"").unwrap(),
            json!({"query": "x"})
        );
        assert_eq!(
            parse_arguments("{\"query\": \"x\"} trailing words").unwrap(),
            json!({"query": "x"})
        );
        assert!(
            parse_arguments("{\"query\": ")
                .unwrap_err()
                .contains("not valid JSON")
        );
        assert!(parse_arguments("[1, 2]").unwrap_err().contains("an array"));
        assert!(parse_arguments("query=x").is_err());
    }

    #[test]
    fn final_answer_citations_accept_strings_lists_and_objects() {
        let args: FinalAnswerArgs = parse_args(
            FINAL_ANSWER,
            json!({"answer": "a", "citations": "x#1, y#2"}),
        )
        .unwrap();
        assert_eq!(args.citations, vec!["x#1", "y#2"]);
        let args: FinalAnswerArgs = parse_args(
            FINAL_ANSWER,
            json!({"answer": "a", "citations": [{"chunk_id": "x#1"}, "y#2", 3]}),
        )
        .unwrap();
        assert_eq!(args.citations, vec!["x#1", "y#2"]);
        // Several ids in one list item, as a real small model wrote them, brackets included.
        let args: FinalAnswerArgs = parse_args(
            FINAL_ANSWER,
            json!({"answer": "a", "citations": ["x#0, x#1", "[y#2] z#3"]}),
        )
        .unwrap();
        assert_eq!(args.citations, vec!["x#0", "x#1", "y#2", "z#3"]);
        let args: FinalAnswerArgs = parse_args(FINAL_ANSWER, json!({"answer": "a"})).unwrap();
        assert!(args.citations.is_empty());
        let error =
            parse_args::<FinalAnswerArgs>(FINAL_ANSWER, json!({"citations": []})).unwrap_err();
        assert_eq!(error.status(), "bad_arguments");
        assert!(error.to_string().contains("answer"));
    }

    #[test]
    fn the_tool_set_is_fixed_by_the_preset() {
        let mut preset = AgentPreset::default_preset();
        preset.tools = Some(vec!["knowledge_search".into(), "delete".into()]);
        let toolbox = Toolbox::for_preset(&preset);
        assert_eq!(toolbox.names(), vec!["knowledge_search", "final_answer"]);
        assert!(
            !toolbox.allows("delete"),
            "an allow-list cannot invent tools"
        );
        assert!(!toolbox.allows("read_chunk"));
        let all = Toolbox::for_preset(&AgentPreset::default_preset());
        assert_eq!(all.names().len(), BUILTIN_TOOLS.len());
        assert!(matches!(all.unknown("delete"), ToolError::Unknown { .. }));
    }
}
