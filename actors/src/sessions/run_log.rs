//! The event log of one run: every event it streamed, with monotonic ids, followed by any
//! number of clients and resumable from any id (`Last-Event-ID`).

use std::sync::Mutex;
use std::time::Instant;

use futures::Stream;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::agent::{AgentEvent, RunCancel, RunFinish};

/// One event of a run as clients see it.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEventKind {
    /// First event of every run.
    Meta { session_id: String, run_id: String },
    /// What the agent streamed (never its `Done`: the log writes its own).
    Agent(AgentEvent),
    /// Last event of every run. `message_id` names the stored turn (none when nothing was
    /// stored, e.g. a rejected run or an ephemeral one).
    Done {
        message_id: Option<String>,
        finish_reason: RunFinish,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RunEvent {
    /// From 1, monotonic within the run.
    pub id: u64,
    pub kind: RunEventKind,
}

impl RunEvent {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match &self.kind {
            RunEventKind::Meta { .. } => "meta",
            RunEventKind::Done { .. } => "done",
            RunEventKind::Agent(event) => match event {
                AgentEvent::Thought { .. } => "thought",
                AgentEvent::ToolCall { .. } => "tool_call",
                AgentEvent::ToolResult { .. } => "tool_result",
                AgentEvent::Citation(_) => "citation",
                AgentEvent::Delta { .. } => "delta",
                AgentEvent::Usage { .. } => "usage",
                AgentEvent::Partial { .. } => "partial",
                AgentEvent::Error { .. } => "error",
                AgentEvent::Grounding(_) => "grounding",
                AgentEvent::Done { .. } => "done",
            },
        }
    }

    /// The SSE data: the event's fields as a JSON object.
    pub fn data(&self) -> Value {
        match &self.kind {
            RunEventKind::Meta { session_id, run_id } => {
                json!({ "session_id": session_id, "run_id": run_id })
            }
            RunEventKind::Done {
                message_id,
                finish_reason,
            } => json!({ "message_id": message_id, "finish_reason": finish_reason }),
            RunEventKind::Agent(event) => {
                let mut value = serde_json::to_value(event).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut value {
                    map.remove("event");
                }
                value
            }
        }
    }
}

#[derive(Default)]
struct LogState {
    events: Vec<RunEvent>,
    finished_at: Option<Instant>,
    finish: Option<RunFinish>,
}

/// The log of one run. Writers push; followers read from any id and wait for more.
pub struct RunLog {
    pub run_id: String,
    pub session_id: String,
    /// The API key whose run it is (the session's owner, or the caller of a run outside
    /// sessions): only it and admins may follow or stop it.
    pub owner: Option<String>,
    pub cancel: RunCancel,
    state: Mutex<LogState>,
    /// The id of the last event (0 before the first), for followers to wait on.
    last_id: watch::Sender<u64>,
}

impl RunLog {
    pub fn new(run_id: String, session_id: String, owner: Option<String>) -> RunLog {
        RunLog {
            run_id,
            session_id,
            owner,
            cancel: RunCancel::new(),
            state: Mutex::new(LogState::default()),
            last_id: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event (ignored once `done` was written) and wakes followers.
    pub fn push(&self, kind: RunEventKind) {
        let id = {
            let mut state = self.lock();
            if state.finished_at.is_some() {
                return;
            }
            let id = state.events.len() as u64 + 1;
            if let RunEventKind::Done { finish_reason, .. } = &kind {
                state.finished_at = Some(Instant::now());
                state.finish = Some(*finish_reason);
            }
            state.events.push(RunEvent { id, kind });
            id
        };
        self.last_id.send_replace(id);
    }

    pub fn is_finished(&self) -> bool {
        self.lock().finished_at.is_some()
    }

    pub fn finish_reason(&self) -> Option<RunFinish> {
        self.lock().finish
    }

    pub fn finished_at(&self) -> Option<Instant> {
        self.lock().finished_at
    }

    /// Events with an id above `after`, and whether the log is complete.
    pub fn events_after(&self, after: u64) -> (Vec<RunEvent>, bool) {
        let state = self.lock();
        let start = (after as usize).min(state.events.len());
        (state.events[start..].to_vec(), state.finished_at.is_some())
    }

    /// Every event after `after`, then every new one until `done`.
    pub fn follow(self: std::sync::Arc<Self>, after: u64) -> impl Stream<Item = RunEvent> + Send {
        let receiver = self.last_id.subscribe();
        futures::stream::unfold(
            (
                self,
                receiver,
                after,
                Vec::<RunEvent>::new().into_iter(),
                false,
            ),
            |(log, mut receiver, mut after, mut buffered, mut complete)| async move {
                loop {
                    if let Some(event) = buffered.next() {
                        after = event.id;
                        return Some((event, (log, receiver, after, buffered, complete)));
                    }
                    if complete {
                        return None;
                    }
                    // Mark the current id seen before reading, so no push falls in between.
                    receiver.borrow_and_update();
                    let (events, finished) = log.events_after(after);
                    if events.is_empty() {
                        if finished {
                            return None;
                        }
                        if receiver.changed().await.is_err() {
                            return None;
                        }
                        continue;
                    }
                    complete = finished;
                    buffered = events.into_iter();
                }
            },
        )
    }
}

/// A run as `GET /v1/runs/{id}` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RunStatus {
    pub run_id: String,
    pub session_id: String,
    pub finished: bool,
    pub finish_reason: Option<RunFinish>,
    pub events: u64,
}

impl RunLog {
    pub fn status(&self) -> RunStatus {
        let state = self.lock();
        RunStatus {
            run_id: self.run_id.clone(),
            session_id: self.session_id.clone(),
            finished: state.finished_at.is_some(),
            finish_reason: state.finish,
            events: state.events.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn followers_get_everything_and_resume_after_an_id() {
        let log = Arc::new(RunLog::new("r".into(), "s".into(), None));
        log.push(RunEventKind::Meta {
            session_id: "s".into(),
            run_id: "r".into(),
        });
        let early = tokio::spawn(log.clone().follow(0).collect::<Vec<_>>());
        let second = tokio::spawn(log.clone().follow(0).collect::<Vec<_>>());
        tokio::task::yield_now().await;
        for text in ["a", "b", "c"] {
            log.push(RunEventKind::Agent(AgentEvent::Delta { text: text.into() }));
        }
        log.push(RunEventKind::Done {
            message_id: Some("m".into()),
            finish_reason: RunFinish::Stop,
        });
        // Ignored: the log is complete.
        log.push(RunEventKind::Agent(AgentEvent::Delta { text: "x".into() }));
        let all = early.await.unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(
            all.iter().map(|e| e.id).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(all, second.await.unwrap());
        assert_eq!(all[0].name(), "meta");
        assert_eq!(all[4].name(), "done");
        assert_eq!(all[4].data()["message_id"], "m");
        assert_eq!(all[1].data(), json!({ "text": "a" }));
        let resumed: Vec<RunEvent> = log.clone().follow(3).collect().await;
        assert_eq!(resumed, all[3..].to_vec());
        assert!(log.clone().follow(5).collect::<Vec<_>>().await.is_empty());
        assert_eq!(log.finish_reason(), Some(RunFinish::Stop));
    }
}
