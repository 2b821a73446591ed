//! `AgentRun`: the actor of one question. It waits for admission, runs the agent loop
//! ([`run_agent`]) with its events written into the run's [`RunLog`] as they come, stores the
//! finished turn in its session, and writes `done`. It runs once, then stops.
//!
//! A stop that the run does not honour within [`STOP_GRACE`], and a run overrunning its
//! deadline, end the run where it stands (its future is dropped). However the run ends, its
//! stream ends with `done`: a panic anywhere in it, or its actor killed with a failed
//! supervisor (ractor stops every child of an actor that stops), ends the stream with `error`
//! {code: "internal"} and `done` ([`StreamEnd`]); its supervisor (its `Session`, or `Sessions`
//! for a run outside any session) learns of it as `ActorFailed`, and the session keeps
//! working.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;
use tracing::{Instrument as _, error, warn};

use super::Sessions;
use super::admission::Rejected;
use super::run_log::{RunEventKind, RunLog};
use crate::agent::{
    AgentDeps, AgentEvent, AgentOutcome, AgentPreset, AnswerMode, RunFinish, RunInput, run_agent,
};

/// How long a stopped run may take to end on its own before it is ended where it stands.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Extra time past a run's own deadline before it is ended where it stands.
const DEADLINE_GRACE: Duration = Duration::from_secs(30);

/// With `debug_faults` on, a run asked exactly this panics (tests of supervision).
pub const DEBUG_PANIC_QUESTION: &str = "__sift_debug_panic__";

pub(crate) struct AgentRun;

pub(crate) struct AgentRunArguments {
    pub sessions: Arc<Sessions>,
    pub preset: Arc<AgentPreset>,
    pub input: RunInput,
    /// Whose data the run reads.
    pub scope: crate::scope::Scope,
    /// For a run stored in a session: how many of its turns a new history summary covers.
    pub stored_turns: Option<u32>,
    pub log: Arc<RunLog>,
    /// The span of the request that started the run: the run's span is its child, so the
    /// run is part of the request's trace though an actor of its own runs it.
    pub parent: tracing::Span,
}

pub(crate) enum AgentRunMessage {
    /// Sent to itself once started: the whole run is this one message.
    Run,
}

impl Actor for AgentRun {
    type Msg = AgentRunMessage;
    /// The run's inputs until it runs.
    type State = Option<AgentRunArguments>;
    type Arguments = AgentRunArguments;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        arguments: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Some(arguments))
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_message(AgentRunMessage::Run)?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        AgentRunMessage::Run: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(arguments) = state.take() {
            let span = tracing::info_span!(
                parent: &arguments.parent,
                "agent_run",
                run_id = %arguments.log.run_id,
            );
            execute(arguments).instrument(span).await;
        }
        myself.stop(None);
        Ok(())
    }
}

/// Ends the stream of a run whose actor failed, unless it already ended.
pub(crate) fn end_failed_run(sessions: &Arc<Sessions>, log: &Arc<RunLog>, failure: &str) {
    if log.is_finished() {
        return;
    }
    error!(run_id = %log.run_id, %failure, "agent run failed");
    log.push(RunEventKind::Agent(AgentEvent::Error {
        code: "internal".into(),
        message: "the run failed unexpectedly".into(),
    }));
    log.push(RunEventKind::Done {
        message_id: None,
        finish_reason: RunFinish::Error,
    });
    metrics::counter!("sift_agent_runs_total", "outcome" => "error").increment(1);
    sessions.forget_later(log);
}

/// Ends the stream of a run that did not reach `done` itself: dropped while a panic unwinds
/// it, or killed with its supervisor.
struct StreamEnd {
    sessions: Arc<Sessions>,
    log: Arc<RunLog>,
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        if self.log.is_finished() {
            return;
        }
        let failure = if std::thread::panicking() {
            "the run panicked"
        } else {
            "the run was ended with its failed supervisor"
        };
        // forget_later needs a runtime; a runtime shutting down forgets everything anyway.
        if tokio::runtime::Handle::try_current().is_ok() {
            end_failed_run(&self.sessions, &self.log, failure);
        }
    }
}

/// The run from admission to `done`.
async fn execute(arguments: AgentRunArguments) {
    let AgentRunArguments {
        sessions,
        preset,
        input,
        scope,
        stored_turns,
        log,
        parent: _,
    } = arguments;
    let _stream_end = StreamEnd {
        sessions: sessions.clone(),
        log: log.clone(),
    };
    let question = input.question.clone();
    let given_summary = input.history_summary.clone();
    let end = run(&sessions, preset, input, scope, &log).await;
    let mut message_id = None;
    if let (Some(summary_turns), Some(outcome)) = (stored_turns, &end.outcome) {
        message_id = sessions
            .store_turn(&log, &question, outcome, summary_turns, given_summary)
            .await;
    }
    // Counted among the finished runs before `done`: a client that saw `done` finds the
    // retained runs as they will stay.
    sessions.forget_later(&log);
    // `done` frees the session: a client that saw it may ask again at once.
    log.push(RunEventKind::Done {
        message_id,
        finish_reason: end.finish_reason,
    });
}

/// How a run ended.
struct RunEnd {
    /// `None` when the run never ran (rejected) or produced nothing to store.
    outcome: Option<AgentOutcome>,
    finish_reason: RunFinish,
}

/// `sift_agent_runs_active` while it lives, also when a panic unwinds the run.
struct ActiveRun;

impl ActiveRun {
    fn new() -> ActiveRun {
        metrics::gauge!("sift_agent_runs_active").increment(1.0);
        ActiveRun
    }
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        metrics::gauge!("sift_agent_runs_active").decrement(1.0);
    }
}

/// Admits the run and runs the agent, writing every event but `done` into `log`.
async fn run(
    sessions: &Sessions,
    preset: Arc<AgentPreset>,
    input: RunInput,
    scope: crate::scope::Scope,
    log: &RunLog,
) -> RunEnd {
    let started = Instant::now();
    let permit = match sessions.admission().admit(&log.cancel).await {
        Ok(permit) => permit,
        Err(Rejected::Cancelled) => {
            metrics::counter!("sift_agent_runs_total", "outcome" => "stopped").increment(1);
            return RunEnd {
                outcome: None,
                finish_reason: RunFinish::Stopped,
            };
        }
        Err(reason) => {
            warn!(run_id = %log.run_id, ?reason, "run rejected by admission control");
            metrics::counter!("sift_agent_runs_total", "outcome" => "overloaded").increment(1);
            log.push(RunEventKind::Agent(AgentEvent::Error {
                code: "overloaded".into(),
                message: match reason {
                    Rejected::QueueFull => "too many runs on this node; retry later".into(),
                    _ => "waited too long for a free run slot; retry later".into(),
                },
            }));
            return RunEnd {
                outcome: None,
                finish_reason: RunFinish::Error,
            };
        }
    };
    let active = ActiveRun::new();
    metrics::histogram!("sift_agent_run_queue_seconds").record(started.elapsed().as_secs_f64());
    let deadline = Duration::from_secs(input.budget.deadline_secs) + DEADLINE_GRACE;
    // Fault injection (debug_faults only): a run that panics, to exercise supervision.
    if sessions.node().context().options.debug_faults && input.question == DEBUG_PANIC_QUESTION {
        panic!("injected agent run panic");
    }
    let deps = AgentDeps {
        corpus: Arc::new(crate::scope::ScopedCorpus {
            node: sessions.node().clone(),
            scope,
        }),
        model: sessions.model(),
        preset,
    };
    let cancel = log.cancel.clone();
    let (events, mut receiver) = mpsc::unbounded_channel::<AgentEvent>();
    let agent = run_agent(deps, input, events, cancel.clone());
    tokio::pin!(agent);
    let stop_deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::pin!(stop_deadline);
    let overrun = tokio::time::sleep(deadline);
    tokio::pin!(overrun);
    let forward = |event: AgentEvent| {
        if !matches!(event, AgentEvent::Done { .. }) {
            log.push(RunEventKind::Agent(event));
        }
    };
    let finished = loop {
        tokio::select! {
            biased;
            Some(event) = receiver.recv() => forward(event),
            outcome = &mut agent => break Some(outcome),
            _ = &mut stop_deadline => break None,
            _ = &mut overrun => break None,
        }
    };
    // What the run sent before it ended (a task it spawned may still hold a sender).
    while let Ok(event) = receiver.try_recv() {
        forward(event);
    }
    let end = match finished {
        Some(outcome) => RunEnd {
            finish_reason: outcome.finish_reason,
            outcome: Some(outcome),
        },
        None if cancel.is_cancelled() => {
            warn!(run_id = %log.run_id, "run did not end after stop; ended where it stood");
            RunEnd {
                outcome: None,
                finish_reason: RunFinish::Stopped,
            }
        }
        None => {
            warn!(run_id = %log.run_id, "run overran its deadline; ended where it stood");
            log.push(RunEventKind::Agent(AgentEvent::Error {
                code: "deadline".into(),
                message: "the run overran its deadline".into(),
            }));
            RunEnd {
                outcome: None,
                finish_reason: RunFinish::Budget,
            }
        }
    };
    drop(permit);
    drop(active);
    let outcome_label = match end.finish_reason {
        RunFinish::Stop => "stop",
        RunFinish::Budget => "budget",
        RunFinish::Stopped => "stopped",
        RunFinish::Error => "error",
    };
    metrics::counter!("sift_agent_runs_total", "outcome" => outcome_label).increment(1);
    metrics::histogram!("sift_agent_run_seconds").record(started.elapsed().as_secs_f64());
    if let Some(outcome) = &end.outcome {
        metrics::counter!("sift_agent_tokens_total", "direction" => "in")
            .increment(outcome.prompt_tokens);
        metrics::counter!("sift_agent_tokens_total", "direction" => "out")
            .increment(outcome.completion_tokens);
        let mode = match outcome.mode {
            AnswerMode::Agent => "agent",
            AnswerMode::FastPath => "fast_path",
            AnswerMode::Extractive => "extractive",
        };
        metrics::counter!("sift_agent_answers_total", "mode" => mode).increment(1);
    }
    end
}
