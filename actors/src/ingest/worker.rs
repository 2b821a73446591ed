//! Ingestion workers under their supervisor.

use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::{Mutex, mpsc};
use tracing::{error, warn};

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
        let job = state.receiver.lock().await.recv().await;
        let Some(job) = job else {
            myself.stop(Some("ingestion queue closed".into()));
            return Ok(());
        };
        state.queue.report_depth();
        lock(&state.in_flight).insert(myself.get_id(), job.clone());
        let document_ids = job.document_ids.clone();
        pipeline::process(&state.context, job).await;
        state.queue.release(&document_ids);
        lock(&state.in_flight).remove(&myself.get_id());
        myself.cast(WorkerMessage::Next)?;
        Ok(())
    }
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
}

pub struct IngestSupervisorState {
    context: Arc<NodeContext>,
    receiver: Arc<Mutex<mpsc::Receiver<IngestJob>>>,
    queue: IngestQueue,
    in_flight: InFlight,
}

impl IngestSupervisorState {
    async fn spawn_worker(&self, myself: &ActorRef<()>) -> Result<(), ActorProcessingErr> {
        let arguments = WorkerArguments {
            context: self.context.clone(),
            receiver: self.receiver.clone(),
            queue: self.queue.clone(),
            in_flight: self.in_flight.clone(),
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
