//! Runs agent runs under supervision, behind admission control.
//!
//! Each run is a supervised task: the run itself ([`run_agent`]) is spawned on its own task and
//! its supervisor awaits it, so a panic ends the stream with `error` {code: "internal"} and
//! `done` instead of hanging it. A stop that the run does not honour within
//! [`STOP_GRACE`] (and a run overrunning its deadline) aborts the task.
//!
//! Admission: at most `max_concurrent_runs` runs at once; up to `max_queued_runs` more wait,
//! each at most `queue_timeout`; anything beyond gets `error` {code: "overloaded"}, `done`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tracing::{error, warn};

use super::run_log::{RunEventKind, RunLog};
use crate::agent::{
    AgentDeps, AgentEvent, AgentOutcome, AnswerMode, RunFinish, RunInput, run_agent,
};

/// How long a stopped run may take to end on its own before it is aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Extra time past a run's own deadline before it is aborted.
const DEADLINE_GRACE: Duration = Duration::from_secs(30);

/// Limits of the session layer, from the node config.
#[derive(Clone, Debug)]
pub struct RunLimits {
    pub max_concurrent_runs: usize,
    pub max_queued_runs: usize,
    pub queue_timeout: Duration,
    /// How long a finished run's events stay available for `Last-Event-ID` resumption.
    pub retention: Duration,
    /// Longest accepted question, in characters.
    pub max_question_chars: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_concurrent_runs: 64,
            max_queued_runs: 256,
            queue_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(600),
            max_question_chars: MAX_QUESTION_CHARS,
        }
    }
}

/// With `debug_faults` on, a run asked exactly this panics (tests of supervision).
pub const DEBUG_PANIC_QUESTION: &str = "__sift_debug_panic__";

/// Default limit on a question's length, in characters (longer ones are refused with 413).
pub const MAX_QUESTION_CHARS: usize = 8192;

/// The concurrency cap and the bounded wait queue in front of it.
pub struct Admission {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
    timeout: Duration,
}

/// Why a run was not admitted.
#[derive(Debug)]
pub enum Rejected {
    QueueFull,
    TimedOut,
    Cancelled,
}

impl Admission {
    pub fn new(limits: &RunLimits) -> Admission {
        Admission {
            permits: Arc::new(Semaphore::new(limits.max_concurrent_runs.max(1))),
            waiting: AtomicUsize::new(0),
            max_waiting: limits.max_queued_runs,
            timeout: limits.queue_timeout,
        }
    }

    pub async fn admit(
        &self,
        cancel: &crate::agent::RunCancel,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Rejected> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        // Reserve a queue place before waiting, so a burst cannot overfill the queue.
        let reserved = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_waiting).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(Rejected::QueueFull);
        }
        metrics::gauge!("sift_agent_runs_queued").increment(1.0);
        let outcome = tokio::select! {
            permit = tokio::time::timeout(self.timeout, self.permits.clone().acquire_owned()) => match permit {
                Ok(Ok(permit)) => Ok(permit),
                _ => Err(Rejected::TimedOut),
            },
            _ = cancel.cancelled() => Err(Rejected::Cancelled),
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        metrics::gauge!("sift_agent_runs_queued").decrement(1.0);
        outcome
    }
}

/// What the supervisor reports when a run ends.
pub struct RunEnd {
    /// `None` when the run never ran (rejected) or produced nothing to store.
    pub outcome: Option<AgentOutcome>,
    pub finish_reason: RunFinish,
}

/// Admits and runs one run, forwarding its events into `log`. Writes every event but `done`:
/// the caller stores the turn and then writes `done` with the message id.
pub async fn supervise_run(
    admission: &Admission,
    deps: AgentDeps,
    input: RunInput,
    log: Arc<RunLog>,
) -> RunEnd {
    let started = Instant::now();
    let permit = match admission.admit(&log.cancel).await {
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
    metrics::gauge!("sift_agent_runs_active").increment(1.0);
    metrics::histogram!("sift_agent_run_queue_seconds").record(started.elapsed().as_secs_f64());
    let deadline = Duration::from_secs(input.budget.deadline_secs) + DEADLINE_GRACE;
    let (events, mut receiver) = mpsc::unbounded_channel::<AgentEvent>();
    let cancel = log.cancel.clone();
    // Fault injection (debug_faults only): a run that panics, to exercise supervision.
    let inject_panic =
        deps.node.context().options.debug_faults && input.question == DEBUG_PANIC_QUESTION;
    let run = run_agent(deps, input, events, cancel.clone());
    let mut task = tokio::spawn(async move {
        if inject_panic {
            panic!("injected agent run panic");
        }
        run.await
    });
    let forwarder = {
        let log = log.clone();
        tokio::spawn(async move {
            while let Some(event) = receiver.recv().await {
                if !matches!(event, AgentEvent::Done { .. }) {
                    log.push(RunEventKind::Agent(event));
                }
            }
        })
    };
    let stop_deadline = async {
        cancel.cancelled().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    let joined = tokio::select! {
        joined = &mut task => Some(joined),
        _ = stop_deadline => None,
        _ = tokio::time::sleep(deadline) => None,
    };
    let end = match joined {
        Some(Ok(outcome)) => {
            // The run's sender is dropped with it: the forwarder drains what is left (bounded,
            // in case a task the run spawned still holds a sender).
            drain(forwarder).await;
            let finish_reason = outcome.finish_reason;
            RunEnd {
                outcome: Some(outcome),
                finish_reason,
            }
        }
        Some(Err(join_error)) => {
            drain(forwarder).await;
            let message = if join_error.is_panic() {
                let panic = join_error.into_panic();
                let text = crate::error::panic_message(panic.as_ref())
                    .unwrap_or_else(|| "unknown panic".into());
                error!(run_id = %log.run_id, panic = %text, "agent run panicked");
                "the run failed unexpectedly".to_string()
            } else {
                "the run was cancelled".to_string()
            };
            log.push(RunEventKind::Agent(AgentEvent::Error {
                code: "internal".into(),
                message,
            }));
            RunEnd {
                outcome: None,
                finish_reason: RunFinish::Error,
            }
        }
        None => {
            task.abort();
            forwarder.abort();
            if cancel.is_cancelled() {
                warn!(run_id = %log.run_id, "run did not end after stop; aborted");
                RunEnd {
                    outcome: None,
                    finish_reason: RunFinish::Stopped,
                }
            } else {
                warn!(run_id = %log.run_id, "run overran its deadline; aborted");
                log.push(RunEventKind::Agent(AgentEvent::Error {
                    code: "deadline".into(),
                    message: "the run overran its deadline".into(),
                }));
                RunEnd {
                    outcome: None,
                    finish_reason: RunFinish::Budget,
                }
            }
        }
    };
    drop(permit);
    metrics::gauge!("sift_agent_runs_active").decrement(1.0);
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

async fn drain(forwarder: tokio::task::JoinHandle<()>) {
    let abort = forwarder.abort_handle();
    if tokio::time::timeout(Duration::from_secs(2), forwarder)
        .await
        .is_err()
    {
        abort.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::RunCancel;

    fn admission(concurrent: usize, queued: usize, timeout: Duration) -> Arc<Admission> {
        Arc::new(Admission::new(&RunLimits {
            max_concurrent_runs: concurrent,
            max_queued_runs: queued,
            queue_timeout: timeout,
            ..RunLimits::default()
        }))
    }

    fn wait_in_queue(
        admission: &Arc<Admission>,
        cancel: &RunCancel,
    ) -> tokio::task::JoinHandle<Result<(), Rejected>> {
        let admission = admission.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move { admission.admit(&cancel).await.map(|_| ()) })
    }

    #[tokio::test]
    async fn a_full_queue_rejects_and_a_waiter_times_out() {
        let admission = admission(1, 1, Duration::from_millis(50));
        let cancel = RunCancel::new();
        let _running = admission.admit(&cancel).await.expect("a free slot");
        let waiting = wait_in_queue(&admission, &cancel);
        tokio::task::yield_now().await;
        assert!(matches!(
            admission.admit(&cancel).await,
            Err(Rejected::QueueFull)
        ));
        // Nobody frees the slot.
        assert!(matches!(waiting.await.unwrap(), Err(Rejected::TimedOut)));
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_a_waiter_and_a_stopped_waiter_leaves() {
        let admission = admission(1, 4, Duration::from_secs(600));
        let cancel = RunCancel::new();
        let running = admission.admit(&cancel).await.expect("a free slot");
        let next = wait_in_queue(&admission, &cancel);
        tokio::task::yield_now().await;
        drop(running);
        assert!(next.await.unwrap().is_ok());
        let _held = admission
            .admit(&cancel)
            .await
            .expect("the slot is free again");
        let stopped = RunCancel::new();
        let queued = wait_in_queue(&admission, &stopped);
        tokio::task::yield_now().await;
        stopped.cancel();
        assert!(matches!(queued.await.unwrap(), Err(Rejected::Cancelled)));
    }
}
