//! The actor of one shard replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use sift_storage::shard::ShardIndex;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::messages::ShardMessage;
use crate::error::{Result, SiftError};

/// A shard replica. Writes and deletes run one at a time, in mailbox order (so a delete is
/// never overtaken by an older write); searches run concurrently on the blocking pool, bounded
/// by a per-shard semaphore.
pub struct ShardReplica;

/// How often a replica purges the data of deleted documents (when it has any) and closes its
/// text index writer if it sat idle.
const PURGE_PERIOD: Duration = Duration::from_secs(30);
/// How long a text index writer may sit unused before the purge tick closes it (its threads
/// end; the next write opens it again).
const WRITER_IDLE: Duration = Duration::from_secs(30);

pub struct ReplicaArguments {
    pub kb_id: String,
    pub shard: u32,
    pub index: Arc<ShardIndex>,
    pub search_permits: Arc<Semaphore>,
    pub debug_faults: bool,
}

pub struct ReplicaState {
    kb_id: String,
    shard: u32,
    index: Arc<ShardIndex>,
    search_permits: Arc<Semaphore>,
    debug_faults: bool,
}

impl Actor for ShardReplica {
    type Msg = ShardMessage;
    type State = ReplicaState;
    type Arguments = ReplicaArguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // The timer task ends by itself once the actor is gone (the send fails).
        myself.send_interval(PURGE_PERIOD, || ShardMessage::Purge);
        Ok(ReplicaState {
            kb_id: args.kb_id,
            shard: args.shard,
            index: args.index,
            search_permits: args.search_permits,
            debug_faults: args.debug_faults,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ShardMessage::Write { write, reply } => {
                let index = state.index.clone();
                let started = Instant::now();
                let outcome = blocking(move || index.write(write).map_err(SiftError::from)).await;
                metrics::histogram!("sift_shard_write_seconds")
                    .record(started.elapsed().as_secs_f64());
                let _ = reply.send(outcome);
            }
            ShardMessage::Delete { document_id, reply } => {
                let index = state.index.clone();
                let outcome =
                    blocking(move || index.delete_document(&document_id).map_err(SiftError::from))
                        .await;
                let _ = reply.send(outcome);
            }
            ShardMessage::Search { request, reply } => {
                let index = state.index.clone();
                let permits = state.search_permits.clone();
                tokio::spawn(async move {
                    let Ok(_permit) = permits.acquire_owned().await else {
                        return;
                    };
                    let outcome =
                        blocking(move || crate::retrieval::leaf::search(&index, &request)).await;
                    let _ = reply.send(outcome);
                });
            }
            ShardMessage::Chunks { document_id, reply } => {
                let index = state.index.clone();
                let outcome =
                    blocking(move || index.get_chunks(&document_id).map_err(SiftError::from)).await;
                let _ = reply.send(outcome);
            }
            ShardMessage::Stats { reply } => {
                let _ = reply.send(state.index.stats());
            }
            ShardMessage::DocumentIds { reply } => {
                let index = state.index.clone();
                let outcome = blocking(move || index.document_ids().map_err(SiftError::from)).await;
                let _ = reply.send(outcome);
            }
            ShardMessage::Export {
                document_ids,
                reply,
            } => {
                let index = state.index.clone();
                let outcome = blocking(move || -> Result<Vec<_>> {
                    let mut documents = Vec::with_capacity(document_ids.len());
                    for id in &document_ids {
                        if let Some(document) = index.export_document(id)? {
                            documents.push(document);
                        }
                    }
                    Ok(documents)
                })
                .await;
                let _ = reply.send(outcome);
            }
            ShardMessage::Purge => {
                let index = state.index.clone();
                if let Err(error) = blocking(move || {
                    index
                        .release_idle_writer(WRITER_IDLE)
                        .map_err(SiftError::from)
                })
                .await
                {
                    warn!(kb_id = %state.kb_id, shard = state.shard, %error, "closing an idle text writer failed");
                }
                if state.index.stats().tombstones > 0 {
                    let index = state.index.clone();
                    match blocking(move || index.purge_deleted().map_err(SiftError::from)).await {
                        Ok(purged) if purged > 0 => {
                            info!(kb_id = %state.kb_id, shard = state.shard, purged, "purged deleted chunks");
                        }
                        Ok(_) => {}
                        Err(error) => {
                            warn!(kb_id = %state.kb_id, shard = state.shard, %error, "purge failed")
                        }
                    }
                }
            }
            ShardMessage::Crash => {
                if state.debug_faults {
                    panic!("injected fault in shard {} of {}", state.shard, state.kb_id);
                }
                warn!(kb_id = %state.kb_id, shard = state.shard, "ignored crash request: debug faults are off");
            }
        }
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| SiftError::Internal(format!("shard task failed: {error}")))?
}
