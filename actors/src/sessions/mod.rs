//! Chat sessions and agent runs: the layer between the HTTP API and [`crate::agent::run_agent`].
//!
//! - Sessions and their turns live in the metadata state machine (`MetaOp::CreateSession`,
//!   `AppendTurn`, ...), proposed through the node's [`crate::meta::MetaHandle`], so they
//!   replicate with the rest of the metadata.
//! - Each question starts a run: a [`RunLog`] (events with monotonic ids: `meta` first, `done`
//!   last) that any number of clients follow and resume (`Last-Event-ID`), kept for
//!   [`RunLimits::retention`] after the run ends.
//! - Runs are actors ([`tree`]): `Sessions` (a child of the node supervisor) → a `Session` per
//!   conversation with a question in flight → an `AgentRun` per question ([`agent_run`]),
//!   behind admission control ([`admission`]). A panicking run ends its stream with `error`
//!   {code: "internal"}, `done`; its session keeps working.
//! - The finished turn (answer, citations, trace) is stored with `AppendTurn`; the next run of
//!   the session gets it back as history, with the stored summary of older turns.
//!
//! Contract with the agent on `AgentOutcome::history_summary`: a summary that differs from the
//! one the run was given covers every turn it was given but the most recent
//! [`KEEP_RECENT_TURNS`] (the next run gets the summary and only the turns after those).

pub mod admission;
pub mod agent_run;
pub mod run_log;
mod tree;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorRef, RpcReplyPort, SpawnErr};

use serde::Serialize;
use sift_api::sessions::NewSession;
use sift_storage::meta::{
    MetaOp, MetaOutcome, SessionRecord, StoredTurn, TurnCitation, TurnTraceStep, TurnUsage,
};
use tracing::warn;

pub use admission::{Admission, MAX_QUESTION_CHARS, RunLimits};
pub use run_log::{RunEvent, RunEventKind, RunLog, RunStatus};

use self::agent_run::{AgentRun, AgentRunArguments, AgentRunMessage};
use self::tree::{SessionsActor, SessionsArguments, SessionsMessage};
use crate::SiftNode;
use crate::agent::context::KEEP_RECENT_TURNS;
use crate::agent::{
    AgentOutcome, AgentPreset, AnswerMode, Citation, PastTurn, RunFinish, RunInput, TraceStep,
};
use crate::error::{Result, SiftError};
use crate::ingest::pipeline::now_ms;
use crate::node::supervisor::{ChildSpec, RestartPolicy};
use crate::scope::{Need, Scope};
use sift_models::llm::SharedChatModel;

/// A question checked and ready to run: what its `AgentRun` needs.
#[derive(Clone)]
pub(crate) struct PreparedRun {
    pub preset: Arc<AgentPreset>,
    pub input: RunInput,
    /// Who may follow and stop the run (see [`Caller`]).
    pub owner: Option<String>,
    /// Whose data the run reads: its caller's.
    pub scope: Scope,
    /// For a run stored in a session: how many of its turns a new history summary covers.
    pub stored_turns: Option<u32>,
}

fn sessions_unavailable() -> SiftError {
    SiftError::Internal("the session actors are not running".into())
}

/// The `Sessions` actor as a child of the node supervisor, on the run runtime.
fn sessions_actor_spec(sessions: std::sync::Weak<Sessions>) -> ChildSpec {
    ChildSpec {
        name: tree::ACTOR_NAME,
        start: Arc::new(move |supervisor| {
            let sessions = sessions.clone();
            Box::pin(async move {
                let shut_down = || SpawnErr::StartupFailed("the session layer is shut down".into());
                let runtime = sessions
                    .upgrade()
                    .and_then(|sessions| sessions.runtime_handle())
                    .ok_or_else(shut_down)?;
                let arguments = SessionsArguments { sessions };
                // Spawned from inside the run runtime, so the actor and its children live there.
                let spawned = runtime
                    .spawn(async move {
                        Actor::spawn_linked(None, SessionsActor, arguments, supervisor).await
                    })
                    .await;
                match spawned {
                    Ok(Ok((actor, _))) => Ok(actor.get_cell()),
                    Ok(Err(error)) => Err(error),
                    Err(join_error) => Err(SpawnErr::StartupFailed(join_error.to_string().into())),
                }
            })
        }),
        policy: RestartPolicy::default(),
    }
}

/// Who calls the session layer: the API key that will own what it creates, its tenant
/// (whose KBs its sessions may search), and whether it may see every session and run of its
/// tenant (its admins, and everyone with auth off). A session or run it may not see is
/// answered as if it did not exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub owner: Option<String>,
    pub scope: Scope,
    pub sees_tenant: bool,
}

impl Caller {
    /// The default tenant's admin that owns nothing (auth off, internal callers).
    pub fn anyone() -> Caller {
        Caller {
            owner: None,
            scope: Scope::default_tenant(),
            sees_tenant: true,
        }
    }
}

/// Most sessions one page of `GET /v1/sessions` lists.
pub const MAX_SESSIONS_PAGE: usize = 1000;

/// Most KBs one session may search.
pub const MAX_SESSION_KBS: usize = 16;

/// A stored turn as `GET /v1/sessions/{id}/messages` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct TurnView {
    pub message_id: String,
    pub run_id: String,
    pub seq: u32,
    pub question: String,
    pub answer: String,
    pub citations: Vec<Citation>,
    pub finish_reason: String,
    pub mode: String,
    pub usage: TurnUsage,
    pub trace: Vec<TraceStep>,
    /// The per-sentence verdicts of the answer's attribution (the trace's `grounding` step),
    /// `null` for extractive answers and with `grounding = "off"`.
    pub grounding: Option<serde_json::Value>,
    pub created_at_ms: u64,
}

/// What the session layer needs besides the node.
#[derive(Clone)]
pub struct SessionsConfig {
    /// `None`: no model configured; runs answer extractively.
    pub model: Option<SharedChatModel>,
    /// Agent presets from the config; `default` is added when missing.
    pub presets: Vec<AgentPreset>,
    pub limits: RunLimits,
}

/// A question to run outside any stored session (the OpenAI-compatible API).
#[derive(Clone, Debug)]
pub struct EphemeralRun {
    pub agent: Option<String>,
    pub kbs: Vec<String>,
    pub question: String,
    pub history: Vec<PastTurn>,
}

pub struct Sessions {
    node: Arc<SiftNode>,
    model: Option<SharedChatModel>,
    presets: BTreeMap<String, Arc<AgentPreset>>,
    limits: RunLimits,
    admission: Admission,
    /// Every run's log by run id, until [`RunLimits::retention`] after it ends.
    runs: Mutex<HashMap<String, Arc<RunLog>>>,
    /// Finished runs in the order they ended, at most [`RunLimits::max_retained`]: past it
    /// the oldest is forgotten before its retention time.
    finished: Mutex<VecDeque<String>>,
    /// Runs execute on their own runtime, so their CPU work (token counting, prompt building,
    /// parsing, query embeddings on its blocking pool) cannot delay the HTTP runtime: the first
    /// event of a new stream stays fast under load. Its threads run at a lower scheduling
    /// priority ([`RUN_THREAD_NICE`]): with every core busy with runs, the kernel still
    /// schedules the HTTP threads first. `None` once shut down.
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        if let Some(runtime) = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // The last reference may go away on one of the runtime's own threads (a run's
            // task): shut it down from a plain thread, never from inside itself.
            let _ = std::thread::Builder::new()
                .name("sift-run-shutdown".into())
                .spawn(move || runtime.shutdown_background());
        }
    }
}

/// Nice value of the run runtime's threads (workers and blocking pool), relative to the
/// node's other threads at 0: a CFS weight of about a tenth, so the HTTP threads (accepting
/// connections, writing `meta`) win the CPU when runs saturate it; runs still get every idle
/// cycle. See docs/adr/0010-run-thread-priority.md.
pub const RUN_THREAD_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to `nice` (Linux: `setpriority` on the
/// thread id, which affects only this thread). Failures are logged, never fatal: a thread
/// at normal priority only costs first-event latency under load.
fn lower_thread_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        if let Err(error) = rustix::process::setpriority_process(Some(tid), nice) {
            warn!(%error, nice, "could not lower the priority of a run thread");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

fn session_not_found(id: &str) -> SiftError {
    SiftError::NotFound {
        code: "session_not_found",
        what: format!("session {id:?}"),
    }
}

fn run_not_found(id: &str) -> SiftError {
    SiftError::NotFound {
        code: "run_not_found",
        what: format!("run {id:?} (finished runs are kept for a limited time)"),
    }
}

impl Sessions {
    pub fn new(node: Arc<SiftNode>, config: SessionsConfig) -> Result<Arc<Sessions>> {
        let mut presets: BTreeMap<String, Arc<AgentPreset>> = config
            .presets
            .into_iter()
            .map(|preset| (preset.name.clone(), Arc::new(preset)))
            .collect();
        presets
            .entry("default".into())
            .or_insert_with(|| Arc::new(AgentPreset::default_preset()));
        let admission = Admission::new(&config.limits);
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("sift-run")
            .on_thread_start(|| lower_thread_priority(RUN_THREAD_NICE))
            .enable_all()
            .build()
            .map_err(|error| SiftError::Internal(format!("starting the run runtime: {error}")))?;
        let sessions = Arc::new(Sessions {
            runtime: Mutex::new(Some(runtime)),
            node,
            model: config.model,
            presets,
            limits: config.limits,
            admission,
            runs: Mutex::new(HashMap::new()),
            finished: Mutex::new(VecDeque::new()),
        });
        sessions
            .node
            .start_child(sessions_actor_spec(Arc::downgrade(&sessions)))?;
        Ok(sessions)
    }

    pub fn node(&self) -> &Arc<SiftNode> {
        &self.node
    }

    pub fn limits(&self) -> &RunLimits {
        &self.limits
    }

    /// Whether a chat model is configured (otherwise answers are extractive).
    pub fn has_model(&self) -> bool {
        self.model.is_some()
    }

    pub(crate) fn model(&self) -> Option<SharedChatModel> {
        self.model.clone()
    }

    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    pub fn presets(&self) -> Vec<Arc<AgentPreset>> {
        self.presets.values().cloned().collect()
    }

    pub fn preset(&self, name: &str) -> Result<Arc<AgentPreset>> {
        self.presets
            .get(name)
            .cloned()
            .ok_or_else(|| SiftError::NotFound {
                code: "agent_not_found",
                what: format!(
                    "agent preset {name:?} (known: {})",
                    self.presets.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            })
    }

    fn store(&self) -> &Arc<sift_storage::meta::SledMetaStore> {
        self.node.context().meta.store()
    }

    /// Whether `caller` may see a session or run of the key `owner`: its own, or, for its
    /// tenant's admins, any of its tenant's.
    fn may_see(&self, caller: &Caller, owner: Option<&str>) -> bool {
        if caller.owner.is_some() && caller.owner.as_deref() == owner {
            return true;
        }
        caller.sees_tenant
            && matches!(
                self.store().owner_tenant(owner),
                Ok(Some(tenant)) if tenant == caller.scope.name()
            )
    }

    /// Resolves KB names or ids, in the caller's scope, to ids (deduplicated, in order).
    fn resolve_kbs(&self, kbs: &[String], scope: &Scope) -> Result<Vec<String>> {
        if kbs.is_empty() || kbs.len() > MAX_SESSION_KBS {
            return Err(SiftError::invalid(
                "invalid_kbs",
                format!("kbs must name 1 to {MAX_SESSION_KBS} knowledge bases"),
            ));
        }
        let mut ids: Vec<String> = Vec::new();
        for kb in kbs {
            let id = self.node.find_kb(scope, kb, Need::Read)?.id;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    // ---- sessions ----

    /// Creates a session owned by the caller's key.
    pub async fn create_session(
        &self,
        request: NewSession,
        caller: &Caller,
    ) -> Result<SessionRecord> {
        let agent = request.agent.unwrap_or_else(|| "default".into());
        self.preset(&agent)?;
        let kbs = self.resolve_kbs(&request.kbs, &caller.scope)?;
        let id = uuid::Uuid::now_v7().to_string();
        let created_at_ms = now_ms();
        let op = match &caller.owner {
            Some(owner) => MetaOp::CreateOwnedSession {
                id,
                kbs,
                agent,
                created_at_ms,
                owner: owner.clone(),
            },
            None => MetaOp::CreateSession {
                id,
                kbs,
                agent,
                created_at_ms,
            },
        };
        let outcome = self.node.context().meta.propose(op).await?;
        match outcome {
            MetaOutcome::Session(session) => Ok(session),
            other => Err(SiftError::Internal(format!("unexpected outcome {other:?}"))),
        }
    }

    /// A page of the sessions the caller may see, newest first (see
    /// `SledMetaStore::list_sessions`); `limit` is clamped to 1..=[`MAX_SESSIONS_PAGE`].
    pub fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
        caller: &Caller,
    ) -> Result<Vec<SessionRecord>> {
        let limit = limit.clamp(1, MAX_SESSIONS_PAGE);
        if caller.owner.is_none() && !caller.sees_tenant {
            return Ok(Vec::new());
        }
        Ok(self.store().list_sessions(after, limit, |session| {
            self.may_see(caller, session.owner.as_deref())
        })?)
    }

    /// The session, if the caller may see it; else `session_not_found`, as for none.
    pub fn get_session(&self, id: &str, caller: &Caller) -> Result<SessionRecord> {
        self.store()
            .get_session(id)?
            .filter(|session| self.may_see(caller, session.owner.as_deref()))
            .ok_or_else(|| session_not_found(id))
    }

    /// Deletes a session and its turns; a running run of it is stopped.
    pub async fn delete_session(&self, id: &str, caller: &Caller) -> Result<()> {
        self.get_session(id, caller)?;
        // Delete first, then stop the run: a stopped run stores its turn, and that store must
        // find the session gone (refused) rather than race the delete and outlive it.
        self.node
            .context()
            .meta
            .propose(MetaOp::DeleteSession { id: id.to_string() })
            .await?;
        if let Some(log) = self.unfinished_run_of(id) {
            log.cancel.cancel();
        }
        Ok(())
    }

    pub fn turns(&self, id: &str, caller: &Caller) -> Result<Vec<TurnView>> {
        self.get_session(id, caller)?;
        Ok(self
            .store()
            .session_turns(id)?
            .into_iter()
            .map(turn_view)
            .collect())
    }

    // ---- runs ----

    fn lock_runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RunLog>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The run of `session_id` still in flight, if any.
    pub(crate) fn unfinished_run_of(&self, session_id: &str) -> Option<Arc<RunLog>> {
        self.lock_runs()
            .values()
            .find(|log| log.session_id == session_id && !log.is_finished())
            .cloned()
    }

    fn check_question(&self, content: &str) -> Result<String> {
        let question = content.trim();
        if question.is_empty() {
            return Err(SiftError::invalid("empty_question", "content is empty"));
        }
        if question.chars().count() > self.limits.max_question_chars {
            return Err(SiftError::QuestionTooLong {
                max_chars: self.limits.max_question_chars,
            });
        }
        Ok(question.to_string())
    }

    /// Starts a run answering `content` in the session. Returns its log, which already holds
    /// the `meta` event; the run may still wait for admission.
    pub async fn ask(
        self: &Arc<Self>,
        session_id: &str,
        content: &str,
        caller: &Caller,
    ) -> Result<Arc<RunLog>> {
        let session = self.get_session(session_id, caller)?;
        let question = self.check_question(content)?;
        let preset = self.preset(&session.agent)?;
        // The KBs the caller still reaches (a share may have ended since).
        let kbs: Vec<String> = session
            .kbs
            .iter()
            .filter(|kb| self.node.find_kb(&caller.scope, kb, Need::Read).is_ok())
            .cloned()
            .collect();
        if kbs.is_empty() {
            return Err(SiftError::Conflict {
                code: "session_kbs_deleted",
                message: "every knowledge base of this session has been deleted".into(),
            });
        }
        let turns = self.store().session_turns(session_id)?;
        let given: Vec<&StoredTurn> = turns
            .iter()
            .skip(session.summary_turns as usize)
            .filter(|turn| matches!(turn.finish_reason.as_str(), "stop" | "budget"))
            .collect();
        let history = given
            .iter()
            .map(|turn| PastTurn {
                question: turn.question.clone(),
                answer: turn.answer.clone(),
                citations: turn.citations.iter().cloned().map(citation_from).collect(),
            })
            .collect();
        // If the run summarises, its summary covers all but the most recent
        // KEEP_RECENT_TURNS turns it was given: the next runs start after those.
        let summarised_through = given
            .len()
            .checked_sub(KEEP_RECENT_TURNS + 1)
            .map(|last| given[last].seq + 1)
            .unwrap_or(session.summary_turns);
        let run_id = uuid::Uuid::now_v7().to_string();
        let input = RunInput {
            run_id: run_id.clone(),
            session_id: session_id.to_string(),
            question,
            kbs,
            history,
            history_summary: session.history_summary.clone(),
            budget: preset.budget.clone(),
        };
        let run = PreparedRun {
            preset,
            input,
            owner: session.owner.clone(),
            scope: caller.scope.clone(),
            stored_turns: Some(summarised_through),
        };
        self.route(run, |run, reply| SessionsMessage::Ask {
            run: Box::new(run),
            reply,
        })
        .await
    }

    /// Starts a run that is not stored in any session.
    pub async fn ask_ephemeral(
        self: &Arc<Self>,
        request: EphemeralRun,
        caller: &Caller,
    ) -> Result<Arc<RunLog>> {
        let preset = self.preset(request.agent.as_deref().unwrap_or("default"))?;
        let kbs = self.resolve_kbs(&request.kbs, &caller.scope)?;
        let question = self.check_question(&request.question)?;
        let run_id = uuid::Uuid::now_v7().to_string();
        let input = RunInput {
            run_id,
            session_id: String::new(),
            question,
            kbs,
            history: request.history,
            history_summary: None,
            budget: preset.budget.clone(),
        };
        let run = PreparedRun {
            preset,
            input,
            owner: caller.owner.clone(),
            scope: caller.scope.clone(),
            stored_turns: None,
        };
        self.route(run, |run, reply| SessionsMessage::AskEphemeral {
            run: Box::new(run),
            reply,
        })
        .await
    }

    /// Hands a prepared run to the `Sessions` actor and waits for its log. While that actor
    /// is being restarted (or not yet started), tries again for a few seconds: a question it
    /// took but never answered (it failed meanwhile) is asked again, and a second run of a
    /// session is refused by its `Session` as `run_in_progress` as usual.
    async fn route(
        &self,
        run: PreparedRun,
        message: fn(PreparedRun, RpcReplyPort<Result<Arc<RunLog>>>) -> SessionsMessage,
    ) -> Result<Arc<RunLog>> {
        for _ in 0..100 {
            if let Some(actor) = self.node.child(tree::ACTOR_NAME) {
                let actor: ActorRef<SessionsMessage> = actor.into();
                match actor.call(|reply| message(run.clone(), reply), None).await {
                    Ok(CallResult::Success(answer)) => return answer,
                    Ok(CallResult::Timeout) => return Err(sessions_unavailable()),
                    Ok(CallResult::SenderError) | Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(sessions_unavailable())
    }

    /// Fault injection (`debug_faults` only): the `Sessions` actor panics; the node supervisor
    /// starts it again.
    pub fn crash_sessions_actor(&self) -> Result<()> {
        self.check_faults()?;
        let actor = self
            .node
            .child(tree::ACTOR_NAME)
            .ok_or_else(sessions_unavailable)?;
        actor
            .send_message(SessionsMessage::Crash)
            .map_err(|e| SiftError::Internal(e.to_string()))
    }

    /// Fault injection (`debug_faults` only): the `Session` actor of a session panics.
    pub fn crash_session_actor(&self, session_id: &str) -> Result<()> {
        self.check_faults()?;
        self.get_session(session_id, &Caller::anyone())?;
        let actor = self
            .node
            .child(tree::ACTOR_NAME)
            .ok_or_else(sessions_unavailable)?;
        actor
            .send_message(SessionsMessage::CrashSession {
                session_id: session_id.to_string(),
            })
            .map_err(|e| SiftError::Internal(e.to_string()))
    }

    fn check_faults(&self) -> Result<()> {
        if self.node.context().options.debug_faults {
            return Ok(());
        }
        Err(SiftError::NotFound {
            code: "not_found",
            what: "fault injection".into(),
        })
    }

    fn runtime_handle(&self) -> Option<tokio::runtime::Handle> {
        let runtime = self.runtime.lock().unwrap_or_else(|p| p.into_inner());
        runtime.as_ref().map(|runtime| runtime.handle().clone())
    }

    /// Registers the run's log, writes `meta`, and starts its `AgentRun` under `supervisor`.
    /// The actor is `None` when the node is shutting down: the log then already ended.
    pub(crate) async fn start_run(
        self: &Arc<Self>,
        run: PreparedRun,
        supervisor: ActorCell,
    ) -> Result<(Option<ActorRef<AgentRunMessage>>, Arc<RunLog>)> {
        let PreparedRun {
            preset,
            input,
            owner,
            scope,
            stored_turns,
        } = run;
        let log = Arc::new(RunLog::new(
            input.run_id.clone(),
            input.session_id.clone(),
            owner,
        ));
        log.push(RunEventKind::Meta {
            session_id: input.session_id.clone(),
            run_id: input.run_id.clone(),
        });
        if self.runtime_handle().is_none() {
            log.push(RunEventKind::Agent(crate::agent::AgentEvent::Error {
                code: "shutting_down".into(),
                message: "the node is shutting down".into(),
            }));
            log.push(RunEventKind::Done {
                message_id: None,
                finish_reason: RunFinish::Error,
            });
            return Ok((None, log));
        }
        // The tenant's own cap, else the node's.
        let max_runs_per_key = match self
            .node
            .context()
            .meta
            .store()
            .tenant_limits(scope.name())?
            .max_runs_per_key
        {
            Some(limit) => Some(limit as usize),
            None => self.limits.max_runs_per_key,
        };
        {
            let mut runs = self.lock_runs();
            if let (Some(limit), Some(owner)) = (max_runs_per_key, &log.owner) {
                let running = runs
                    .values()
                    .filter(|run| run.owner.as_ref() == Some(owner) && !run.is_finished())
                    .count();
                if running >= limit {
                    metrics::counter!("sift_rate_limited_total", "scope" => "runs").increment(1);
                    return Err(SiftError::TooManyRuns { limit });
                }
            }
            runs.insert(input.run_id.clone(), log.clone());
        }
        let arguments = AgentRunArguments {
            sessions: self.clone(),
            preset,
            input,
            scope,
            stored_turns,
            log: log.clone(),
            parent: tracing::Span::current(),
        };
        match Actor::spawn_linked(None, AgentRun, arguments, supervisor).await {
            Ok((actor, _)) => Ok((Some(actor), log)),
            Err(error) => {
                self.lock_runs().remove(&log.run_id);
                Err(SiftError::Internal(format!(
                    "starting an agent run: {error}"
                )))
            }
        }
    }

    pub(crate) async fn store_turn(
        &self,
        log: &RunLog,
        question: &str,
        outcome: &AgentOutcome,
        summary_turns: u32,
        given_summary: Option<String>,
    ) -> Option<String> {
        let message_id = uuid::Uuid::now_v7().to_string();
        let turn = StoredTurn {
            message_id: message_id.clone(),
            session_id: log.session_id.clone(),
            run_id: log.run_id.clone(),
            seq: 0,
            question: question.to_string(),
            answer: outcome.answer.clone(),
            citations: outcome.citations.iter().map(citation_to).collect(),
            finish_reason: finish_name(outcome.finish_reason).into(),
            mode: mode_name(outcome.mode).into(),
            usage: TurnUsage {
                prompt_tokens: outcome.prompt_tokens,
                completion_tokens: outcome.completion_tokens,
                iterations: outcome.iterations,
            },
            trace: outcome.trace.iter().map(trace_to).collect(),
            created_at_ms: now_ms(),
        };
        let meta = &self.node.context().meta;
        if let Err(error) = meta
            .propose(MetaOp::AppendTurn {
                session_id: log.session_id.clone(),
                turn,
            })
            .await
        {
            warn!(run_id = %log.run_id, %error, "could not store the turn");
            return None;
        }
        if outcome.history_summary.is_some() && outcome.history_summary != given_summary {
            let summary = MetaOp::SetHistorySummary {
                session_id: log.session_id.clone(),
                summary: outcome.history_summary.clone(),
                summary_turns,
                at_ms: now_ms(),
            };
            if let Err(error) = meta.propose(summary).await {
                warn!(run_id = %log.run_id, %error, "could not store the history summary");
            }
        }
        Some(message_id)
    }

    /// Forgets the log after the retention time, or sooner when more than
    /// [`RunLimits::max_retained`] finished runs are kept (the oldest go first).
    pub(crate) fn forget_later(self: &Arc<Self>, log: &Arc<RunLog>) {
        let evicted: Vec<String> = {
            let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
            finished.push_back(log.run_id.clone());
            let excess = finished.len().saturating_sub(self.limits.max_retained);
            finished.drain(..excess).collect()
        };
        if !evicted.is_empty() {
            let mut runs = self.lock_runs();
            for run_id in &evicted {
                runs.remove(run_id);
            }
        }
        let sessions = Arc::downgrade(self);
        let run_id = log.run_id.clone();
        let retention = self.limits.retention;
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            if let Some(sessions) = sessions.upgrade() {
                sessions.lock_runs().remove(&run_id);
            }
        });
    }

    /// The run's log, if the caller may see it; else `run_not_found`, as for none.
    pub fn run(&self, run_id: &str, caller: &Caller) -> Result<Arc<RunLog>> {
        self.lock_runs()
            .get(run_id)
            .filter(|log| self.may_see(caller, log.owner.as_deref()))
            .cloned()
            .ok_or_else(|| run_not_found(run_id))
    }

    /// Stops a running run: its stream ends with `done` {finish_reason: "stopped"}.
    pub fn stop(&self, run_id: &str, caller: &Caller) -> Result<RunStatus> {
        let log = self.run(run_id, caller)?;
        if log.is_finished() {
            return Err(SiftError::Conflict {
                code: "run_finished",
                message: format!("run {run_id} has already finished"),
            });
        }
        log.cancel.cancel();
        Ok(log.status())
    }

    /// Runs still running.
    pub fn active_runs(&self) -> usize {
        self.lock_runs()
            .values()
            .filter(|log| !log.is_finished())
            .count()
    }

    /// Stops every run (node shutdown): each ends its stream with `done` {stopped}.
    pub fn shutdown(&self) {
        for log in self.lock_runs().values() {
            log.cancel.cancel();
        }
    }
}

/// Describes the session layer's metrics (call once at startup).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sift_agent_runs_total",
        "agent runs by outcome: stop, budget, stopped, error, overloaded"
    );
    metrics::describe_counter!(
        "sift_agent_answers_total",
        "answers by mode: agent, fast_path, extractive"
    );
    metrics::describe_histogram!(
        "sift_agent_run_seconds",
        "wall time per run, queue included"
    );
    metrics::describe_histogram!(
        "sift_agent_run_queue_seconds",
        "time a run waited for admission"
    );
    metrics::describe_gauge!("sift_agent_runs_active", "runs executing on this node");
    metrics::describe_gauge!("sift_agent_runs_queued", "runs waiting for a slot");
    metrics::describe_counter!(
        "sift_agent_tokens_total",
        "model tokens of runs by direction (in, out)"
    );
}

pub fn finish_name(finish: RunFinish) -> &'static str {
    match finish {
        RunFinish::Stop => "stop",
        RunFinish::Budget => "budget",
        RunFinish::Stopped => "stopped",
        RunFinish::Error => "error",
    }
}

fn mode_name(mode: AnswerMode) -> &'static str {
    match mode {
        AnswerMode::Agent => "agent",
        AnswerMode::FastPath => "fast_path",
        AnswerMode::Extractive => "extractive",
    }
}

fn citation_to(citation: &Citation) -> TurnCitation {
    TurnCitation {
        n: citation.n,
        chunk_id: citation.chunk_id.clone(),
        kb_id: citation.kb_id.clone(),
        document_id: citation.document_id.clone(),
        document_title: citation.document_title.clone(),
        external_id: citation.external_id.clone(),
        span: citation.span,
        text: citation.text.clone(),
    }
}

fn citation_from(citation: TurnCitation) -> Citation {
    Citation {
        n: citation.n,
        chunk_id: citation.chunk_id,
        kb_id: citation.kb_id,
        document_id: citation.document_id,
        document_title: citation.document_title,
        external_id: citation.external_id,
        span: citation.span,
        // Stored turns keep no pages nor source URL (their record predates them; see ADR
        // 0024).
        pages: None,
        source_url: None,
        text: citation.text,
        heading_path: Vec::new(),
    }
}

fn trace_to(step: &TraceStep) -> TurnTraceStep {
    TurnTraceStep {
        kind: step.kind.clone(),
        name: step.name.clone(),
        started_ms: step.started_ms,
        duration_ms: step.duration_ms,
        detail_json: step.detail.to_string(),
    }
}

fn turn_view(turn: StoredTurn) -> TurnView {
    let trace: Vec<TraceStep> = turn
        .trace
        .into_iter()
        .map(|step| TraceStep {
            detail: serde_json::from_str(&step.detail_json)
                .unwrap_or(serde_json::Value::String(step.detail_json)),
            kind: step.kind,
            name: step.name,
            started_ms: step.started_ms,
            duration_ms: step.duration_ms,
        })
        .collect();
    let grounding = trace
        .iter()
        .rev()
        .find(|step| step.kind == "grounding")
        .map(|step| step.detail.clone());
    TurnView {
        message_id: turn.message_id,
        run_id: turn.run_id,
        seq: turn.seq,
        question: turn.question,
        answer: turn.answer,
        citations: turn.citations.into_iter().map(citation_from).collect(),
        finish_reason: turn.finish_reason,
        mode: turn.mode,
        usage: turn.usage,
        trace,
        grounding,
        created_at_ms: turn.created_at_ms,
    }
}
