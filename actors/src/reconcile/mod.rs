//! The reconciler: one actor per cluster member that brings what the node holds in line with
//! what the metadata says, one round every `repair_interval`.
//!
//! ```text
//!            every round (every node)                   only while this node leads
//!  ┌───────────────────────────────────────────┐  ┌──────────────────────────────────┐
//!  │ replicas: drop deleted and moved replicas, │  │ reassign: hand the unfinished     │
//!  │   open the placed ones                     │  │   work of silent workers over     │
//!  │ repair: fill own dead / new replicas       │  │ rebalance: replace, move, drop    │
//!  │ queue the ingestion assigned here          │  │   replicas; finish drains         │
//!  │ replicas: drop stale replica directories   │  └──────────────────────────────────┘
//!  │ raw_gc: remove raw bytes nobody needs      │
//!  └───────────────────────────────────────────┘
//! ```
//!
//! Every step reads the metadata afresh and proposes ops whose effect does not depend on
//! being proposed once: a round cut short (an error, a panic, a restart, a new leader) is
//! finished by a later one. The actor is a child of the node supervisor
//! ([`crate::node::supervisor`]); a restarted reconciler starts with fresh timers, as a new
//! leader does.

mod raw_gc;
mod reassign;
pub mod rebalance;
mod repair;
mod replicas;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::warn;

use crate::context::NodeContext;
use crate::ingest::handoff;
use crate::ingest::queue::IngestQueue;
use crate::shards::ShardsMessage;

/// The name of the reconciler among the node supervisor's children (and its restart metric).
pub(crate) const ACTOR_NAME: &str = "reconciler";

pub enum ReconcileMessage {
    /// Runs one round, then schedules the next.
    Round,
    /// Fault injection (`debug_faults` only): the handler panics.
    Crash,
}

/// The reconciler actor; its state is [`Reconciliation`].
pub struct Reconciler;

pub struct ReconcilerArguments {
    pub context: Arc<NodeContext>,
    pub shards: ActorRef<ShardsMessage>,
    pub queue: IngestQueue,
    /// Where the shard supervisor keeps replicas (`{kb_id}/{shard}`).
    pub shards_dir: PathBuf,
}

/// What the reconciler keeps between rounds.
pub struct Reconciliation {
    context: Arc<NodeContext>,
    shards: ActorRef<ShardsMessage>,
    queue: IngestQueue,
    shards_dir: PathBuf,
    /// Which peers have looked unhealthy to this leader, and since when.
    suspects: reassign::Suspects,
    /// When raw bytes were last collected.
    last_raw_collection: Option<Instant>,
}

impl Actor for Reconciler {
    type Msg = ReconcileMessage;
    type State = Reconciliation;
    type Arguments = ReconcilerArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_message(ReconcileMessage::Round)?;
        Ok(Reconciliation {
            context: args.context,
            shards: args.shards,
            queue: args.queue,
            shards_dir: args.shards_dir,
            suspects: reassign::Suspects::default(),
            last_raw_collection: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReconcileMessage::Round => {
                if state.shards.get_status() != ractor::ActorStatus::Running {
                    return Ok(()); // the node is shutting down
                }
                state.round().await;
                let interval = state.context.options.repair_interval;
                myself.send_after(interval, || ReconcileMessage::Round);
            }
            ReconcileMessage::Crash => panic!("fault injection: the reconciler was asked to crash"),
        }
        Ok(())
    }
}

impl Reconciliation {
    async fn round(&mut self) {
        let store = self.context.meta.store().clone();
        let kbs = match store.list_kbs() {
            Ok(kbs) => kbs,
            Err(error) => {
                warn!(%error, "reading the knowledge bases failed; the round is skipped");
                return;
            }
        };
        self.drop_deleted_and_moved(&kbs).await;
        let states = self.open_and_fill(&kbs).await;
        for state in ["initializing", "active", "recovering", "dead"] {
            metrics::gauge!("sift_replicas", "state" => state)
                .set(states.get(state).copied().unwrap_or(0) as f64);
        }
        if self.leads() {
            // Reassignment also updates which peers look away, for rebalancing.
            self.reassign(&kbs).await;
            if let Err(reason) = self.rebalance(&kbs).await {
                warn!(%reason, "rebalancing failed; will retry");
            }
            self.finish_drains(&kbs).await;
        }
        handoff::queue_assigned(&self.context, &self.queue, false).await;
        self.drop_unplaced_shard_dirs(&kbs).await;
        self.collect_raw_garbage().await;
        metrics::counter!("sift_reconcile_rounds_total").increment(1);
    }

    /// This node is the Raft leader now.
    fn leads(&self) -> bool {
        self.context
            .meta
            .raft()
            .is_some_and(|raft| raft.status().leader == Some(raft.id()))
    }

    async fn propose(&self, op: sift_storage::meta::MetaOp) -> Result<(), String> {
        self.context
            .meta
            .propose(op)
            .await
            .map(|_| ())
            .map_err(|error| error.to_string())
    }
}
