//! The root of a node's actor tree: it starts the node's long-lived children and restarts the
//! ones that fail, with capped exponential backoff.
//!
//! ```text
//! NodeSupervisor
//! ├── ShardsSupervisor ── ShardReplica × replicas on this node  (restarts its replicas)
//! ├── IngestSupervisor ── IngestWorker × ingest_workers          (restarts its workers)
//! └── Reconciler                                                 (cluster mode)
//! ```
//!
//! The shard and ingestion supervisors restart their own children and never fail themselves
//! (their `handle_supervisor_evt` swallows child failures); they are spawned by
//! [`super::SiftNode::start_with_meta`] before the node supervisor because recovery needs
//! them. The node supervisor's children are the restartable ones, each built by a
//! [`ChildSpec`]: a child that panics or returns an error from a handler is started again
//! from its spec after [`RestartPolicy::backoff`], and counted in
//! `sift_actor_restarts_total{actor}`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SpawnErr, SupervisionEvent};
use tracing::{error, info, warn};

/// Starts one child, linked to the supervisor cell it is given.
pub(crate) type StartChild =
    Arc<dyn Fn(ActorCell) -> BoxFuture<'static, Result<ActorCell, SpawnErr>> + Send + Sync>;

/// A restartable child of the node supervisor.
#[derive(Clone)]
pub(crate) struct ChildSpec {
    /// Its name: the `actor` label of `sift_actor_restarts_total`, and how
    /// [`ChildHandles::get`] finds it.
    pub name: &'static str,
    pub start: StartChild,
    pub policy: RestartPolicy,
}

/// When a failed child is started again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestartPolicy {
    /// The wait before the first restart; it doubles with every failure in a row.
    pub initial_backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
    /// A child that ran this long before failing starts again from `initial_backoff`.
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl RestartPolicy {
    /// The wait before restart number `failures_in_a_row` (1 for the first).
    pub fn backoff(&self, failures_in_a_row: u32) -> Duration {
        let doublings = failures_in_a_row.saturating_sub(1).min(16);
        self.initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }
}

/// The running instance of each child by name, for the node to send it messages; a restart
/// replaces the entry.
#[derive(Clone, Default)]
pub(crate) struct ChildHandles(Arc<Mutex<HashMap<&'static str, ActorCell>>>);

impl ChildHandles {
    pub fn get(&self, name: &str) -> Option<ActorCell> {
        self.lock().get(name).cloned()
    }

    fn set(&self, name: &'static str, cell: ActorCell) {
        self.lock().insert(name, cell);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, ActorCell>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) enum NodeMessage {
    /// Adds a child and starts it.
    Start(ChildSpec),
    /// Starts child `index` of the specs again (sent to itself after a backoff).
    Restart { index: usize },
}

pub(crate) struct NodeSupervisor;

pub(crate) struct NodeSupervisorArguments {
    pub children: Vec<ChildSpec>,
    pub handles: ChildHandles,
}

pub(crate) struct NodeSupervisorState {
    specs: Vec<ChildSpec>,
    handles: ChildHandles,
    /// Running children: which spec each is.
    running: HashMap<ActorId, usize>,
    /// Per spec: failures in a row, and when the current instance started.
    history: Vec<(u32, Instant)>,
}

impl NodeSupervisorState {
    async fn start_child(&mut self, myself: &ActorRef<NodeMessage>, index: usize) {
        let spec = &self.specs[index];
        match (spec.start)(myself.get_cell()).await {
            Ok(cell) => {
                self.running.insert(cell.get_id(), index);
                self.handles.set(spec.name, cell);
                self.history[index].1 = Instant::now();
            }
            Err(spawn_error) => {
                // Starting failed (its `pre_start` returned an error): same as a failure.
                error!(actor = spec.name, %spawn_error, "starting an actor failed");
                self.schedule_restart(myself, index);
            }
        }
    }

    fn schedule_restart(&mut self, myself: &ActorRef<NodeMessage>, index: usize) {
        let spec = &self.specs[index];
        let (failures, started) = &mut self.history[index];
        if started.elapsed() >= spec.policy.reset_after {
            *failures = 0;
        }
        *failures += 1;
        let backoff = spec.policy.backoff(*failures);
        metrics::counter!("sift_actor_restarts_total", "actor" => spec.name).increment(1);
        warn!(
            actor = spec.name,
            failures_in_a_row = *failures,
            backoff_ms = backoff.as_millis() as u64,
            "restarting a failed actor"
        );
        myself.send_after(backoff, move || NodeMessage::Restart { index });
    }
}

impl Actor for NodeSupervisor {
    type Msg = NodeMessage;
    type State = NodeSupervisorState;
    type Arguments = NodeSupervisorArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let now = Instant::now();
        let mut state = NodeSupervisorState {
            history: vec![(0, now); args.children.len()],
            specs: args.children,
            handles: args.handles,
            running: HashMap::new(),
        };
        for index in 0..state.specs.len() {
            state.start_child(&myself, index).await;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            NodeMessage::Start(spec) => {
                state.specs.push(spec);
                state.history.push((0, Instant::now()));
                state.start_child(&myself, state.specs.len() - 1).await;
            }
            NodeMessage::Restart { index } => {
                info!(
                    actor = state.specs[index].name,
                    "starting a failed actor again"
                );
                state.start_child(&myself, index).await;
            }
        }
        Ok(())
    }

    /// A failed child (a panic and a handler's error both arrive as `ActorFailed`) is started
    /// again after its backoff; the supervisor itself never stops for it (ractor's default
    /// would).
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, failure) => {
                let Some(index) = state.running.remove(&cell.get_id()) else {
                    return Ok(());
                };
                error!(actor = state.specs[index].name, %failure, "actor failed");
                state.schedule_restart(&myself, index);
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                state.running.remove(&cell.get_id());
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for index in state.running.values() {
            if let Some(cell) = state.handles.get(state.specs[*index].name) {
                cell.stop(Some("the node is shutting down".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that fails on demand and counts its starts.
    struct Flaky;

    enum FlakyMessage {
        Panic,
        Fail,
    }

    impl Actor for Flaky {
        type Msg = FlakyMessage;
        type State = ();
        type Arguments = Arc<std::sync::atomic::AtomicUsize>;

        async fn pre_start(
            &self,
            _myself: ActorRef<Self::Msg>,
            starts: Self::Arguments,
        ) -> Result<(), ActorProcessingErr> {
            starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }

        async fn handle(
            &self,
            _myself: ActorRef<Self::Msg>,
            message: Self::Msg,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            match message {
                FlakyMessage::Panic => panic!("asked to panic"),
                FlakyMessage::Fail => Err("asked to fail".into()),
            }
        }
    }

    fn flaky_spec(starts: Arc<std::sync::atomic::AtomicUsize>) -> ChildSpec {
        ChildSpec {
            name: "flaky",
            start: Arc::new(move |supervisor| {
                let starts = starts.clone();
                Box::pin(async move {
                    let (actor, _) = Actor::spawn_linked(None, Flaky, starts, supervisor).await?;
                    Ok(actor.get_cell())
                })
            }),
            policy: RestartPolicy {
                initial_backoff: Duration::from_millis(10),
                max_backoff: Duration::from_millis(40),
                reset_after: Duration::from_secs(60),
            },
        }
    }

    async fn wait_for_starts(starts: &std::sync::atomic::AtomicUsize, at_least: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while starts.load(std::sync::atomic::Ordering::SeqCst) < at_least {
            assert!(Instant::now() < deadline, "the child was not restarted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RestartPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            reset_after: Duration::from_secs(60),
        };
        let waits: Vec<u128> = (1..=6).map(|n| policy.backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_child_that_panics_or_fails_is_started_again_and_the_supervisor_stays() {
        let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handles = ChildHandles::default();
        let (supervisor, join) = Actor::spawn(
            None,
            NodeSupervisor,
            NodeSupervisorArguments {
                children: vec![flaky_spec(starts.clone())],
                handles: handles.clone(),
            },
        )
        .await
        .unwrap();
        wait_for_starts(&starts, 1).await;
        for (round, message) in [FlakyMessage::Panic, FlakyMessage::Fail, FlakyMessage::Panic]
            .into_iter()
            .enumerate()
        {
            let child = handles.get("flaky").expect("the child runs");
            child.send_message(message).unwrap();
            wait_for_starts(&starts, round + 2).await;
            // The new instance is the one the handles give out.
            let deadline = Instant::now() + Duration::from_secs(10);
            while handles.get("flaky").unwrap().get_id() == child.get_id() {
                assert!(Instant::now() < deadline, "the handle was not replaced");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(supervisor.get_status(), ractor::ActorStatus::Running);
        let child = handles.get("flaky").unwrap();
        supervisor.stop(None);
        join.await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.get_status() != ractor::ActorStatus::Stopped {
            assert!(
                Instant::now() < deadline,
                "the child outlived its supervisor"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
