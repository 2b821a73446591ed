//! Agent runs: a ReAct loop over function calling that answers only from retrieved, cited
//! evidence.
//!
//! [`run_agent`] is one run: it streams [`AgentEvent`]s into a channel while it works and
//! returns the [`AgentOutcome`] the session layer stores. The session layer adds the `meta`
//! event before and the message id of `done`, keeps the event log for `Last-Event-ID`
//! resumption, and supervises the run (a panicking run ends its stream with `error`, `done`).

mod answer_stream;
pub mod attribution;
pub mod context;
pub mod corpus;
pub mod evidence;
pub mod extractive;
pub mod model_io;
pub mod planner;
pub mod prompt;
pub mod protocol;
pub mod reflector;
mod run;
pub mod terms;
#[cfg(test)]
mod tests;
pub mod tools;
pub mod verifier;

pub use attribution::{Grounding, GroundingReport};
pub use corpus::Corpus;
pub use planner::{QueryPlan, plan_rules};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One cited chunk. `n` is the citation number used as `[n]` in the answer text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Citation {
    pub n: u32,
    pub chunk_id: String,
    pub kb_id: String,
    pub document_id: String,
    pub document_title: String,
    pub external_id: Option<String>,
    /// The page the document was fetched from, after redirects (`sift.source_url`), for a
    /// document added by URL; else `null`.
    pub source_url: Option<String>,
    /// Character offsets `[start, end)` in the document's extracted text.
    #[schema(value_type = Vec<u32>, min_items = 2, max_items = 2)]
    pub span: (u32, u32),
    /// The pages of the cited chunk (PDF), else `null`.
    pub pages: Option<sift_storage::chunk::PageRange>,
    /// The cited text (the chunk, or the sentence used for an extractive answer).
    pub text: String,
    /// The cited chunk's heading path (a deck's `Slide N: title` first, so that its pages
    /// read as slides; a spreadsheet's sheet); empty in turns stored before it.
    #[serde(default)]
    pub heading_path: Vec<String>,
}

/// A hit as a `tool_result` event shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HitRef {
    pub chunk_id: String,
    pub document_id: String,
    pub title: String,
    pub score: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailedShardRef {
    pub kb_id: String,
    pub shard: u32,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunFinish {
    /// `final_answer` (or an extractive answer) was given.
    Stop,
    /// A budget ran out (iterations, tokens or deadline); the answer says so.
    Budget,
    /// `POST /v1/runs/{id}/stop`.
    Stopped,
    Error,
}

/// How the answer was produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerMode {
    /// The ReAct loop with a model.
    Agent,
    /// The model failed unrecoverably: retrieve, then one answer call (or extractive).
    FastPath,
    /// No model configured (or none reachable): the best evidence sentences, cited.
    Extractive,
}

/// Everything a run streams, in order. Maps one-to-one to the SSE events of
/// `POST /v1/sessions/{id}/messages` (the session layer adds `meta` and `done.message_id`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentEvent {
    Thought {
        delta: String,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: serde_json::Value,
    },
    ToolResult {
        id: String,
        summary: String,
        hits: Vec<HitRef>,
    },
    /// A citation, before the first `delta` whose text holds its marker.
    Citation(Citation),
    /// Answer text: the settled sentences of a `final_answer` while the model writes it, the
    /// rest once the run has attributed the whole answer.
    Delta {
        text: String,
    },
    Usage {
        prompt_tokens: u32,
        completion_tokens: u32,
        context_percent: f32,
    },
    Partial {
        failed_shards: Vec<FailedShardRef>,
    },
    Error {
        code: String,
        message: String,
    },
    /// The per-sentence verdicts of the answer's attribution (at the run's end, before the
    /// citations and text not sent while the model wrote).
    Grounding(GroundingReport),
    Done {
        finish_reason: RunFinish,
    },
}

/// One stored turn of the session, as the next run sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PastTurn {
    pub question: String,
    pub answer: String,
    pub citations: Vec<Citation>,
}

/// One step of a run's trace, stored with the turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TraceStep {
    /// `model`, `tool`, `planner`, `verifier`, `reflector`, `fallback`, ...
    pub kind: String,
    pub name: String,
    pub started_ms: u64,
    pub duration_ms: u64,
    pub detail: serde_json::Value,
}

/// What a run returns: the answer to store with its citations and trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentOutcome {
    pub answer: String,
    pub citations: Vec<Citation>,
    pub finish_reason: RunFinish,
    pub mode: AnswerMode,
    pub iterations: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub trace: Vec<TraceStep>,
    /// A summary of older turns made by context management, to be stored for the next run.
    pub history_summary: Option<String>,
    /// The attribution of the answer's sentences (`None` for extractive answers and with
    /// `grounding = "off"`).
    #[serde(default)]
    pub grounding: Option<GroundingReport>,
}

/// Limits of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunBudget {
    pub max_iterations: u32,
    pub max_tokens: u64,
    /// Wall-clock limit of the run, in seconds.
    pub deadline_secs: u64,
    /// Longest one tool call may take, in seconds (a slow tool becomes an error observation).
    pub tool_timeout_secs: u64,
}

impl Default for RunBudget {
    fn default() -> Self {
        RunBudget {
            max_iterations: 8,
            max_tokens: 200_000,
            deadline_secs: 300,
            tool_timeout_secs: 30,
        }
    }
}

/// Input of one run.
#[derive(Clone, Debug)]
pub struct RunInput {
    pub run_id: String,
    pub session_id: String,
    pub question: String,
    /// KB ids the run may search.
    pub kbs: Vec<String>,
    /// Earlier turns of the session, oldest first, and the stored summary of turns before them.
    pub history: Vec<PastTurn>,
    pub history_summary: Option<String>,
    pub budget: RunBudget,
}

/// Where a run sends its events. A closed receiver does not stop the run (the session layer
/// keeps the log); `cancel` does.
pub type EventSink = mpsc::UnboundedSender<AgentEvent>;

/// Cancels a run: the model stream and running tools stop promptly, and the run ends with
/// `Done { finish_reason: Stopped }`.
pub type RunCancel = CancellationToken;

/// An agent preset: what `model` names in the OpenAI-compatible API and `agent` in
/// `POST /v1/sessions`. Loaded from the config file (`[[agents]]`); `default` always exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentPreset {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Replaces the built-in evidence-first system prompt's preamble when set.
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub budget: RunBudget,
    /// Allow-list of built-in tool names; `None` = all.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub web_search: Option<sift_models::web_search::WebSearchConfig>,
    #[serde(default)]
    pub mcp_servers: Vec<sift_models::mcp::McpServerConfig>,
    /// What the answer's unsupported sentences become: `strict` (removed, the default),
    /// `flag` (kept, marked) or `off` (no attribution).
    #[serde(default)]
    pub grounding: Grounding,
    /// The KBs (names, ids or `tenant:name`) a request searches when it names none: the
    /// OpenAI-compatible endpoint needs no extension field for such a preset.
    #[serde(default)]
    pub kbs: Vec<String>,
}

impl AgentPreset {
    pub fn default_preset() -> Self {
        AgentPreset {
            name: "default".into(),
            description: "Evidence-first research agent over the selected knowledge bases".into(),
            system_prompt: None,
            budget: RunBudget::default(),
            tools: None,
            web_search: None,
            mcp_servers: Vec::new(),
            grounding: Grounding::Strict,
            kbs: Vec::new(),
        }
    }
}

/// What a run needs from the node.
#[derive(Clone)]
pub struct AgentDeps {
    /// What the run's tools search and read.
    pub corpus: std::sync::Arc<dyn Corpus>,
    /// `None`: no model configured, answers are extractive.
    pub model: Option<sift_models::llm::SharedChatModel>,
    pub preset: std::sync::Arc<AgentPreset>,
}

/// Describes the agent metrics (call once at startup, after installing the recorder).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sift_agent_runs_total",
        metrics::Unit::Count,
        "Agent runs by outcome (stop, budget, stopped, error) and mode (agent, fast_path, extractive)"
    );
    metrics::describe_histogram!(
        "sift_agent_iterations",
        metrics::Unit::Count,
        "Model iterations of the ReAct loop per run"
    );
    metrics::describe_counter!(
        "sift_agent_answer_sentences_total",
        metrics::Unit::Count,
        "Sentences of model answers by attribution verdict (supported, echo, fragment, unsupported, ...) and whether they were kept"
    );
    metrics::describe_counter!(
        "sift_agent_grounding_fallbacks_total",
        metrics::Unit::Count,
        "Model answers replaced because no sentence was supported, by kind (extractive, not_found)"
    );
    metrics::describe_counter!(
        "sift_agent_streamed_answer_chars_total",
        metrics::Unit::Count,
        "Characters of final answers sent while the model was still writing them (settled, supported sentences)"
    );
    metrics::describe_counter!(
        "sift_agent_answer_stream_mismatches_total",
        metrics::Unit::Count,
        "Runs whose final answer did not begin with the part of an answer already streamed (expected 0)"
    );
    metrics::describe_counter!(
        "sift_agent_tool_calls_total",
        metrics::Unit::Count,
        "Agent tool calls by tool and status (ok, bad_arguments, unknown_tool, error, timeout, repeated)"
    );
}

/// Runs one question to its end. Never panics on bad model output or tool failures (they
/// become observations or events); ends the stream with exactly one `Done`.
pub async fn run_agent(
    deps: AgentDeps,
    input: RunInput,
    events: EventSink,
    cancel: RunCancel,
) -> AgentOutcome {
    run::Run::new(deps, input, events, cancel).run().await
}
