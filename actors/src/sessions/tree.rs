//! The session actors, a child of the node supervisor:
//!
//! ```text
//! NodeSupervisor
//! └── Sessions                       routes questions; restarted with backoff if it fails
//!     ├── Session{id} × conversations with a question in flight (one run at a time)
//!     │   └── AgentRun{run}          one per question (agent_run.rs)
//!     └── AgentRun{run} × runs outside any session (the OpenAI-compatible API)
//! ```
//!
//! All of them run on the run runtime of [`Sessions`] (low scheduling priority). A `Session`
//! exists while its conversation has a question in flight: it refuses a second question with
//! `run_in_progress`, and once its run has ended it tells `Sessions`, which stops it unless a
//! question is already on its way to it. A failed `AgentRun` ends its stream with `error` and
//! `done`; a failed `Session` is counted in `sift_actor_restarts_total{actor="session"}` and
//! started afresh by the next question of its conversation, which finds a run still in flight
//! in the run table of [`Sessions`].

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tracing::{error, warn};

use super::agent_run::end_failed_run;
use super::run_log::RunLog;
use super::{PreparedRun, Sessions};
use crate::error::{Result, SiftError};

/// The name of the `Sessions` child of the node supervisor (and its restart label).
pub(crate) const ACTOR_NAME: &str = "sessions";

pub(crate) enum SessionsMessage {
    /// A question of a stored session: handed to its `Session`.
    Ask {
        run: Box<PreparedRun>,
        reply: RpcReplyPort<Result<Arc<RunLog>>>,
    },
    /// A question outside any session: its `AgentRun` is a child of `Sessions`.
    AskEphemeral {
        run: Box<PreparedRun>,
        reply: RpcReplyPort<Result<Arc<RunLog>>>,
    },
    /// A `Session` whose run ended, with the questions it has received so far.
    Idle { session_id: String, received: u64 },
    /// Fault injection: `Sessions` panics.
    Crash,
    /// Fault injection: the `Session` of this conversation panics (started for it if needed).
    CrashSession { session_id: String },
}

pub(crate) struct SessionsActor;

pub(crate) struct SessionsArguments {
    pub sessions: Weak<Sessions>,
}

/// A running `Session`: its actor, and the questions handed to it so far.
struct SessionChild {
    actor: ActorRef<SessionMessage>,
    forwarded: u64,
}

pub(crate) struct SessionsState {
    sessions: Weak<Sessions>,
    by_session: HashMap<String, SessionChild>,
    /// What each child is: a session's actor, or a run outside any session.
    children: HashMap<ActorId, Child>,
}

enum Child {
    Session(String),
    Run(Arc<RunLog>),
}

impl SessionsState {
    fn facade(&self) -> Result<Arc<Sessions>> {
        self.sessions
            .upgrade()
            .ok_or_else(|| SiftError::Internal("the session layer is shut down".into()))
    }

    /// The `Session` of `session_id`, started if it has none.
    async fn session(
        &mut self,
        myself: &ActorRef<SessionsMessage>,
        session_id: &str,
    ) -> Result<ActorRef<SessionMessage>> {
        if let Some(child) = self.by_session.get(session_id) {
            return Ok(child.actor.clone());
        }
        let arguments = SessionArguments {
            session_id: session_id.to_string(),
            sessions: self.sessions.clone(),
            parent: myself.clone(),
        };
        let (actor, _) = Actor::spawn_linked(None, Session, arguments, myself.get_cell())
            .await
            .map_err(|e| SiftError::Internal(format!("starting a session actor: {e}")))?;
        self.children
            .insert(actor.get_id(), Child::Session(session_id.to_string()));
        self.by_session.insert(
            session_id.to_string(),
            SessionChild {
                actor: actor.clone(),
                forwarded: 0,
            },
        );
        Ok(actor)
    }

    /// Hands a message to the `Session` of `session_id`, counting the questions.
    async fn forward(
        &mut self,
        myself: &ActorRef<SessionsMessage>,
        session_id: &str,
        message: SessionMessage,
    ) {
        let actor = match self.session(myself, session_id).await {
            Ok(actor) => actor,
            Err(error) => return message.refuse(error),
        };
        let is_question = matches!(message, SessionMessage::Ask { .. });
        if let Err(ractor::MessagingErr::SendErr(message)) = actor.send_message(message) {
            // It stopped between its last event and now: start a fresh one.
            self.by_session.remove(session_id);
            match self.session(myself, session_id).await {
                Ok(actor) => {
                    if let Err(ractor::MessagingErr::SendErr(message)) = actor.send_message(message)
                    {
                        message.refuse(SiftError::Internal("the session actor is gone".into()));
                    }
                }
                Err(error) => message.refuse(error),
            }
        }
        if is_question && let Some(child) = self.by_session.get_mut(session_id) {
            child.forwarded += 1;
        }
    }
}

impl Actor for SessionsActor {
    type Msg = SessionsMessage;
    type State = SessionsState;
    type Arguments = SessionsArguments;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        arguments: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SessionsState {
            sessions: arguments.sessions,
            by_session: HashMap::new(),
            children: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SessionsMessage::Ask { run, reply } => {
                let session_id = run.input.session_id.clone();
                state
                    .forward(&myself, &session_id, SessionMessage::Ask { run, reply })
                    .await;
            }
            SessionsMessage::AskEphemeral { run, reply } => {
                let started = match state.facade() {
                    Ok(sessions) => sessions.start_run(*run, myself.get_cell()).await,
                    Err(error) => Err(error),
                };
                if let Ok((actor, log)) = &started
                    && let Some(actor) = actor
                {
                    state
                        .children
                        .insert(actor.get_id(), Child::Run(log.clone()));
                }
                let _ = reply.send(started.map(|(_, log)| log));
            }
            SessionsMessage::Idle {
                session_id,
                received,
            } => {
                let idle = state
                    .by_session
                    .get(&session_id)
                    .is_some_and(|child| child.forwarded == received);
                if idle && let Some(child) = state.by_session.remove(&session_id) {
                    child.actor.stop(None);
                }
            }
            SessionsMessage::Crash => panic!("injected sessions actor panic"),
            SessionsMessage::CrashSession { session_id } => {
                state
                    .forward(&myself, &session_id, SessionMessage::Crash)
                    .await;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((child, failure)) = ended_child(event) else {
            return Ok(());
        };
        match state.children.remove(&child) {
            Some(Child::Session(session_id)) => {
                if state
                    .by_session
                    .get(&session_id)
                    .is_some_and(|running| running.actor.get_id() == child)
                {
                    state.by_session.remove(&session_id);
                }
                if let Some(failure) = failure {
                    error!(%session_id, %failure, "session actor failed");
                    metrics::counter!("sift_actor_restarts_total", "actor" => "session")
                        .increment(1);
                }
            }
            Some(Child::Run(log)) => {
                if let (Some(failure), Ok(sessions)) = (failure, state.facade()) {
                    end_failed_run(&sessions, &log, &failure);
                }
            }
            None => {}
        }
        Ok(())
    }
}

/// The child a supervision event says has ended, and its failure if it failed.
fn ended_child(event: SupervisionEvent) -> Option<(ActorId, Option<String>)> {
    match event {
        SupervisionEvent::ActorFailed(cell, failure) => {
            Some((cell.get_id(), Some(failure.to_string())))
        }
        SupervisionEvent::ActorTerminated(cell, _, _) => Some((cell.get_id(), None)),
        _ => None,
    }
}

pub(crate) enum SessionMessage {
    Ask {
        run: Box<PreparedRun>,
        reply: RpcReplyPort<Result<Arc<RunLog>>>,
    },
    /// Fault injection: the session actor panics.
    Crash,
}

impl SessionMessage {
    /// Answers a question that cannot be handed on.
    fn refuse(self, error: SiftError) {
        match self {
            SessionMessage::Ask { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            SessionMessage::Crash => warn!(%error, "no session actor to crash"),
        }
    }
}

pub(crate) struct Session;

pub(crate) struct SessionArguments {
    session_id: String,
    sessions: Weak<Sessions>,
    parent: ActorRef<SessionsMessage>,
}

pub(crate) struct SessionState {
    session_id: String,
    sessions: Weak<Sessions>,
    parent: ActorRef<SessionsMessage>,
    /// Questions received (answered or refused).
    received: u64,
    /// The session's latest run: a new question waits for it to end.
    latest: Option<Arc<RunLog>>,
    /// The actor of the latest run while it lives.
    running: Option<ActorId>,
}

impl Actor for Session {
    type Msg = SessionMessage;
    type State = SessionState;
    type Arguments = SessionArguments;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        arguments: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // A run of this session may outlive a failed predecessor of this actor.
        let latest = arguments
            .sessions
            .upgrade()
            .and_then(|sessions| sessions.unfinished_run_of(&arguments.session_id));
        Ok(SessionState {
            session_id: arguments.session_id,
            sessions: arguments.sessions,
            parent: arguments.parent,
            received: 0,
            latest,
            running: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (run, reply) = match message {
            SessionMessage::Ask { run, reply } => (run, reply),
            SessionMessage::Crash => panic!("injected session actor panic"),
        };
        state.received += 1;
        if let Some(latest) = &state.latest
            && !latest.is_finished()
        {
            let _ = reply.send(Err(SiftError::Conflict {
                code: "run_in_progress",
                message: format!(
                    "run {} of this session is still running; stop it or wait for it",
                    latest.run_id
                ),
            }));
            return Ok(());
        }
        let Some(sessions) = state.sessions.upgrade() else {
            let _ = reply.send(Err(SiftError::Internal(
                "the session layer is shut down".into(),
            )));
            return Ok(());
        };
        let started = sessions.start_run(*run, myself.get_cell()).await;
        if let Ok((actor, log)) = &started {
            state.latest = Some(log.clone());
            state.running = actor.as_ref().map(|actor| actor.get_id());
        }
        let idle = matches!(&started, Ok((None, _)));
        let _ = reply.send(started.map(|(_, log)| log));
        if idle {
            state.tell_idle();
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some((child, failure)) = ended_child(event) else {
            return Ok(());
        };
        if state.running != Some(child) {
            return Ok(());
        }
        state.running = None;
        if let (Some(failure), Some(log), Some(sessions)) =
            (failure, &state.latest, state.sessions.upgrade())
        {
            end_failed_run(&sessions, log, &failure);
        }
        state.tell_idle();
        Ok(())
    }
}

impl SessionState {
    fn tell_idle(&self) {
        let _ = self.parent.send_message(SessionsMessage::Idle {
            session_id: self.session_id.clone(),
            received: self.received,
        });
    }
}
