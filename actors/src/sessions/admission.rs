//! Admission control in front of agent runs, and the limits of the session layer.
//!
//! At most `max_concurrent_runs` runs at once; up to `max_queued_runs` more wait, each at most
//! `queue_timeout`; anything beyond gets `error` {code: "overloaded"}, `done`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

/// Limits of the session layer, from the node config.
#[derive(Clone, Debug)]
pub struct RunLimits {
    pub max_concurrent_runs: usize,
    pub max_queued_runs: usize,
    pub queue_timeout: Duration,
    /// How long a finished run's events stay available for `Last-Event-ID` resumption.
    pub retention: Duration,
    /// Most finished runs kept for resumption; past it the oldest is forgotten early.
    pub max_retained: usize,
    /// Longest accepted question, in characters.
    pub max_question_chars: usize,
    /// Runs one API key may have in flight on this node (none: no cap but the node's).
    pub max_runs_per_key: Option<usize>,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_concurrent_runs: 64,
            max_queued_runs: 256,
            queue_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(600),
            max_retained: 10_000,
            max_question_chars: MAX_QUESTION_CHARS,
            max_runs_per_key: None,
        }
    }
}

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
