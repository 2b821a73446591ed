//! Supervises the shard replicas of this node.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use sift_storage::meta::KbRecord;
use sift_storage::shard::{ShardConfig, ShardIndex};
use tokio::sync::Semaphore;
use tracing::{error, info, warn};

use super::access::ShardAccess;
use super::registry::{ShardEntry, ShardKey, ShardRegistry};
use super::replica::{ReplicaArguments, ShardReplica};
use crate::error::{Result, SiftError};

/// Restarts within this window count towards [`MAX_RESTARTS_IN_WINDOW`].
const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// After this many failures in the window the replica is not restarted again: its shard is
/// reported in `failed_shards` until the node restarts.
const MAX_RESTARTS_IN_WINDOW: usize = 5;
/// A replica that failed to open (a damaged index) is tried again no sooner than this: every
/// request to its KB would otherwise reopen it.
const REOPEN_AFTER: Duration = Duration::from_secs(30);

pub enum ShardsMessage {
    /// Opens (creating if needed) this node's replicas of the listed shards of a KB.
    Open {
        kb_id: String,
        shards: Vec<u32>,
        dimension: usize,
        reply: RpcReplyPort<Result<()>>,
    },
    /// Stops a KB's replicas and deletes their data.
    DropKb {
        kb_id: String,
        reply: RpcReplyPort<Result<()>>,
    },
    /// Stops one replica of this node and deletes its data (it was moved to another node).
    DropShard {
        kb_id: String,
        shard: u32,
        reply: RpcReplyPort<Result<()>>,
    },
}

pub struct ShardsSupervisor;

pub struct ShardsArguments {
    pub data_dir: PathBuf,
    pub registry: ShardRegistry,
    pub search_permits_per_shard: usize,
    pub debug_faults: bool,
}

pub struct ShardsState {
    data_dir: PathBuf,
    registry: ShardRegistry,
    search_permits_per_shard: usize,
    debug_faults: bool,
    children: HashMap<ActorId, ShardKey>,
    failures: HashMap<ShardKey, Vec<Instant>>,
    /// Replicas that failed to open: when, and why.
    open_failures: HashMap<ShardKey, (Instant, String)>,
}

impl ShardsState {
    fn shard_dir(&self, key: &ShardKey) -> PathBuf {
        self.data_dir.join(&key.kb_id).join(key.shard.to_string())
    }

    async fn spawn_replica(
        &mut self,
        myself: &ActorRef<ShardsMessage>,
        key: ShardKey,
        index: Arc<ShardIndex>,
    ) -> Result<()> {
        let arguments = ReplicaArguments {
            kb_id: key.kb_id.clone(),
            shard: key.shard,
            index: index.clone(),
            search_permits: Arc::new(Semaphore::new(self.search_permits_per_shard)),
            debug_faults: self.debug_faults,
        };
        let (actor, _) = Actor::spawn_linked(None, ShardReplica, arguments, myself.get_cell())
            .await
            .map_err(|error| SiftError::Internal(format!("spawning shard replica: {error}")))?;
        self.children.insert(actor.get_id(), key.clone());
        self.registry.insert(key, ShardEntry { actor, index });
        metrics::gauge!("sift_shards").set(self.registry.len() as f64);
        Ok(())
    }
}

impl Actor for ShardsSupervisor {
    type Msg = ShardsMessage;
    type State = ShardsState;
    type Arguments = ShardsArguments;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(ShardsState {
            data_dir: args.data_dir,
            registry: args.registry,
            search_permits_per_shard: args.search_permits_per_shard,
            debug_faults: args.debug_faults,
            children: HashMap::new(),
            failures: HashMap::new(),
            open_failures: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ShardsMessage::Open {
                kb_id,
                shards,
                dimension,
                reply,
            } => {
                // Every listed replica is tried: one that fails to open (a damaged index)
                // leaves the others serving, and the first failure is the answer.
                let mut outcome = Ok(());
                for shard in shards {
                    let key = ShardKey {
                        kb_id: kb_id.clone(),
                        shard,
                    };
                    if state.registry.get(&key).is_some() {
                        continue;
                    }
                    let unavailable = |reason: &str| SiftError::ShardUnavailable {
                        kb_id: kb_id.clone(),
                        shard,
                        reason: format!("this node's replica could not be opened: {reason}"),
                    };
                    if let Some((at, reason)) = state.open_failures.get(&key)
                        && at.elapsed() < REOPEN_AFTER
                    {
                        if outcome.is_ok() {
                            outcome = Err(unavailable(reason));
                        }
                        continue;
                    }
                    let dir = state.shard_dir(&key);
                    let started = Instant::now();
                    let opened = tokio::task::spawn_blocking(move || {
                        ShardIndex::open(&dir, ShardConfig::new(dimension))
                    })
                    .await;
                    let index = match opened {
                        Ok(Ok(index)) => Arc::new(index),
                        Ok(Err(error)) => {
                            let reason = error.to_string();
                            error!(kb_id = %key.kb_id, shard, %reason, "a shard replica could not be opened; the node serves without it");
                            metrics::counter!("sift_shard_open_failures_total").increment(1);
                            if outcome.is_ok() {
                                outcome = Err(unavailable(&reason));
                            }
                            state.open_failures.insert(key, (Instant::now(), reason));
                            continue;
                        }
                        Err(error) => {
                            outcome = Err(SiftError::Internal(error.to_string()));
                            break;
                        }
                    };
                    state.open_failures.remove(&key);
                    info!(kb_id = %key.kb_id, shard, seconds = started.elapsed().as_secs_f64(), "shard opened");
                    if let Err(error) = state.spawn_replica(&myself, key, index).await {
                        outcome = Err(error);
                        break;
                    }
                }
                let _ = reply.send(outcome);
            }
            ShardsMessage::DropKb { kb_id, reply } => {
                for key in state.registry.keys_of(&kb_id) {
                    if let Some(entry) = state.registry.remove(&key) {
                        state.children.remove(&entry.actor.get_id());
                        entry.actor.stop(Some("knowledge base deleted".into()));
                    }
                    state.failures.remove(&key);
                }
                state.open_failures.retain(|key, _| key.kb_id != kb_id);
                metrics::gauge!("sift_shards").set(state.registry.len() as f64);
                let dir = state.data_dir.join(&kb_id);
                let _ = reply.send(remove_dir(dir).await);
            }
            ShardsMessage::DropShard {
                kb_id,
                shard,
                reply,
            } => {
                let key = ShardKey { kb_id, shard };
                if let Some(entry) = state.registry.remove(&key) {
                    state.children.remove(&entry.actor.get_id());
                    entry
                        .actor
                        .stop(Some("replica moved to another node".into()));
                }
                state.failures.remove(&key);
                state.open_failures.remove(&key);
                metrics::gauge!("sift_shards").set(state.registry.len() as f64);
                let dir = state.shard_dir(&key);
                let _ = reply.send(remove_dir(dir).await);
            }
        }
        Ok(())
    }

    /// Restarts a failed replica with its open index, with capped backoff; gives up after
    /// [`MAX_RESTARTS_IN_WINDOW`] failures in [`RESTART_WINDOW`]. Never stops the supervisor
    /// (ractor's default would).
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, failure) => {
                let Some(key) = state.children.remove(&cell.get_id()) else {
                    return Ok(());
                };
                metrics::counter!("sift_actor_restarts_total", "actor" => "shard").increment(1);
                let Some(entry) = state.registry.remove(&key) else {
                    return Ok(());
                };
                let now = Instant::now();
                let failures = state.failures.entry(key.clone()).or_default();
                failures.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
                failures.push(now);
                let attempt = failures.len();
                if attempt > MAX_RESTARTS_IN_WINDOW {
                    error!(kb_id = %key.kb_id, shard = key.shard, %failure, "shard replica keeps failing; not restarting it");
                    return Ok(());
                }
                warn!(kb_id = %key.kb_id, shard = key.shard, attempt, %failure, "shard replica failed; restarting");
                let backoff = Duration::from_millis(20 * (1 << attempt.min(6)) as u64);
                tokio::time::sleep(backoff).await;
                if let Err(error) = state.spawn_replica(&myself, key.clone(), entry.index).await {
                    error!(kb_id = %key.kb_id, shard = key.shard, %error, "restarting shard replica failed");
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                state.children.remove(&cell.get_id());
            }
            _ => {}
        }
        Ok(())
    }
}

/// Opens this node's replicas of `kb` (all its shards when it has no placement).
pub(crate) async fn open_local_shards(
    shards: &ActorRef<ShardsMessage>,
    access: &ShardAccess,
    kb: &KbRecord,
) -> Result<()> {
    let kb_id = kb.id.clone();
    let list = access.local_shards(kb);
    if list.is_empty() {
        return Ok(());
    }
    let dimension = kb.settings.dimension as usize;
    let call = shards
        .call(
            |reply| ShardsMessage::Open {
                kb_id,
                shards: list,
                dimension,
                reply,
            },
            None,
        )
        .await;
    match call {
        Ok(CallResult::Success(outcome)) => outcome,
        _ => Err(SiftError::Internal(
            "the shard supervisor did not answer".into(),
        )),
    }
}

/// Stops a KB's replicas on this node and deletes their data; a failure is logged.
pub(crate) async fn drop_kb_shards(shards: &ActorRef<ShardsMessage>, kb_id: String) {
    let call = shards
        .call(
            |reply| ShardsMessage::DropKb {
                kb_id: kb_id.clone(),
                reply,
            },
            None,
        )
        .await;
    if !matches!(call, Ok(CallResult::Success(Ok(())))) {
        warn!(
            kb_id,
            "dropping the shards of a deleted knowledge base failed"
        );
    }
}

/// Stops one replica on this node and deletes its data. Whether it went.
pub(crate) async fn drop_shard(shards: &ActorRef<ShardsMessage>, kb_id: &str, shard: u32) -> bool {
    let call = shards
        .call(
            |reply| ShardsMessage::DropShard {
                kb_id: kb_id.to_string(),
                shard,
                reply,
            },
            None,
        )
        .await;
    matches!(call, Ok(CallResult::Success(Ok(()))))
}

/// Deletes a replica's (or a KB's) directory off the runtime; one already gone is fine.
async fn remove_dir(dir: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(SiftError::from(sift_storage::StorageError::from(error))),
    })
    .await
    .unwrap_or_else(|error| Err(SiftError::Internal(error.to_string())))
}
