//! Ingestion workers under their supervisor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::pipeline;
use super::queue::{IngestJob, IngestQueue};
use crate::context::NodeContext;

type InFlight = Arc<std::sync::Mutex<HashMap<ActorId, IngestJob>>>;

/// Pulls jobs from the shared queue one at a time and runs the pipeline on each.
pub struct IngestWorker;

pub enum WorkerMessage {
    /// Take the next job from the queue.
    Next,
}

pub struct WorkerArguments {
    pub context: Arc<NodeContext>,
    pub receiver: Arc<Mutex<mpsc::Receiver<IngestJob>>>,
    pub queue: IngestQueue,
    pub in_flight: InFlight,
    /// Cancelled when the node shuts down: an idle worker stops waiting for a job.
    pub stopping: CancellationToken,
}

impl Actor for IngestWorker {
    type Msg = WorkerMessage;
    type State = WorkerArguments;
    type Arguments = WorkerArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(WorkerMessage::Next)?;
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let WorkerMessage::Next = message;
        // A worker waits for its next job inside a message, where ractor does not see a stop
        // request: the node's shutdown wakes it with `stopping`.
        let job = tokio::select! {
            job = async { state.receiver.lock().await.recv().await } => job,
            () = state.stopping.cancelled() => None,
        };
        let Some(job) = job else {
            myself.stop(Some("ingestion queue closed or node stopping".into()));
            return Ok(());
        };
        state.queue.report_depth();
        lock(&state.in_flight).insert(myself.get_id(), job.clone());
        let document_ids = job.document_ids.clone();
        let deferred = pipeline::process(&state.context, job.clone()).await;
        state.queue.release(&document_ids);
        lock(&state.in_flight).remove(&myself.get_id());
        if !deferred.document_ids.is_empty() {
            retry_later(state, &job, deferred).await;
        }
        myself.cast(WorkerMessage::Next)?;
        Ok(())
    }
}

/// How many times documents that transient errors send back are queued again before they
/// fail: with [`retry_delay`], about ten minutes of outage.
const TRANSIENT_RETRIES: u32 = 25;

/// The wait before retry `retries` (0-based): 0.5 s, doubling, at most 30 s.
fn retry_delay(retries: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << retries.min(16))).min(MAX_RETRY_DELAY)
}

const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

/// Queues documents that a transient error left pending again after a backoff, or fails
/// them once [`TRANSIENT_RETRIES`] retries have not got them through.
async fn retry_later(state: &WorkerArguments, job: &IngestJob, deferred: pipeline::Deferred) {
    let retry = IngestJob {
        kb_id: job.kb_id.clone(),
        document_ids: deferred.document_ids,
        retries: job.retries + 1,
    };
    if job.retries >= TRANSIENT_RETRIES {
        let reason = format!(
            "ingestion_unavailable: {} attempts met transient errors, the last: {}",
            job.retries + 1,
            deferred.reason
        );
        pipeline::fail_unfinished(&state.context, &retry, &reason).await;
        return;
    }
    let delay = retry_delay(job.retries);
    debug!(kb_id = %retry.kb_id, documents = retry.document_ids.len(), ?delay, "retrying documents later");
    let queue = state.queue.clone();
    let stopping = state.stopping.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopping.cancelled() => return, // queued again at the next start
        }
        // Whatever another path (the reconciler) queued meanwhile is left to it.
        let claimed = queue.claim(&retry.document_ids);
        if claimed.is_empty() {
            return;
        }
        let job = IngestJob {
            document_ids: claimed,
            ..retry
        };
        let ids = job.document_ids.clone();
        if let Err(error) = queue.submit(job).await {
            warn!(%error, "could not queue documents again");
            queue.release(&ids);
        }
    });
}

fn lock(in_flight: &InFlight) -> std::sync::MutexGuard<'_, HashMap<ActorId, IngestJob>> {
    in_flight
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

/// Starts and restarts the workers. A worker that crashes fails the documents of the job it
/// held (so they never hang in a non-terminal state) and is replaced.
pub struct IngestSupervisor;

pub struct IngestSupervisorArguments {
    pub context: Arc<NodeContext>,
    pub receiver: mpsc::Receiver<IngestJob>,
    pub queue: IngestQueue,
    pub workers: usize,
    /// Cancelled by [`crate::node::SiftNode::shutdown`]; the workers stop at the next job.
    pub stopping: CancellationToken,
}

pub struct IngestSupervisorState {
    context: Arc<NodeContext>,
    receiver: Arc<Mutex<mpsc::Receiver<IngestJob>>>,
    queue: IngestQueue,
    in_flight: InFlight,
    stopping: CancellationToken,
}

impl IngestSupervisorState {
    async fn spawn_worker(&self, myself: &ActorRef<()>) -> Result<(), ActorProcessingErr> {
        let arguments = WorkerArguments {
            context: self.context.clone(),
            receiver: self.receiver.clone(),
            queue: self.queue.clone(),
            in_flight: self.in_flight.clone(),
            stopping: self.stopping.clone(),
        };
        Actor::spawn_linked(None, IngestWorker, arguments, myself.get_cell()).await?;
        Ok(())
    }
}

impl Actor for IngestSupervisor {
    type Msg = ();
    type State = IngestSupervisorState;
    type Arguments = IngestSupervisorArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let state = IngestSupervisorState {
            context: args.context,
            receiver: Arc::new(Mutex::new(args.receiver)),
            queue: args.queue,
            in_flight: Arc::default(),
            stopping: args.stopping,
        };
        for _ in 0..args.workers.max(1) {
            state.spawn_worker(&myself).await?;
        }
        Ok(state)
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, failure) => {
                metrics::counter!("sift_actor_restarts_total", "actor" => "ingest_worker")
                    .increment(1);
                let job = lock(&state.in_flight).remove(&cell.get_id());
                warn!(%failure, "ingestion worker failed; restarting it");
                if let Some(job) = job {
                    state.queue.release(&job.document_ids);
                    pipeline::fail_unfinished(
                        &state.context,
                        &job,
                        &format!("ingestion worker crashed: {failure}"),
                    )
                    .await;
                }
                if let Err(error) = state.spawn_worker(&myself).await {
                    error!(%error, "restarting ingestion worker failed");
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                lock(&state.in_flight).remove(&cell.get_id());
            }
            _ => {}
        }
        Ok(())
    }
}
