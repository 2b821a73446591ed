//! The replicas on this node's disk against the placement: replicas of deleted KBs and
//! replicas moved to other nodes go, the ones placed here are opened (and filled by
//! [`super::repair`] when they are new or dead), stale directories go.

use std::collections::{BTreeMap, HashSet};

use sift_storage::meta::{KbRecord, ReplicaState};
use tracing::{error, info, warn};

use super::Reconciliation;
use crate::shards::supervisor::{drop_kb_shards, drop_shard, open_local_shards};

impl Reconciliation {
    /// Drops the open replicas of KBs that no longer exist, and the open replicas that are no
    /// longer placed on this node.
    pub(super) async fn drop_deleted_and_moved(&self, kbs: &[KbRecord]) {
        let known: HashSet<&str> = kbs.iter().map(|kb| kb.id.as_str()).collect();
        let mut opened: Vec<String> = self
            .context
            .registry
            .keys()
            .into_iter()
            .map(|key| key.kb_id)
            .collect();
        opened.sort();
        opened.dedup();
        for kb_id in opened {
            if !known.contains(kb_id.as_str()) {
                info!(kb_id, "dropping the replicas of a deleted knowledge base");
                drop_kb_shards(&self.shards, kb_id).await;
            }
        }
        let local = self.context.access.local_id();
        for key in self.context.registry.keys() {
            let moved = kbs.iter().find(|kb| kb.id == key.kb_id).is_some_and(|kb| {
                !kb.placement.is_empty() && !kb.replicas(key.shard).iter().any(|r| r.node == local)
            });
            if moved {
                info!(kb_id = %key.kb_id, shard = key.shard, "dropping a replica moved to another node");
                if !drop_shard(&self.shards, &key.kb_id, key.shard).await {
                    warn!(kb_id = %key.kb_id, shard = key.shard, "dropping a moved replica failed");
                }
            }
        }
    }

    /// Opens this node's replicas of every KB and fills the new and dead ones. Returns how
    /// many of this node's replicas are in each state.
    pub(super) async fn open_and_fill(&self, kbs: &[KbRecord]) -> BTreeMap<&'static str, u64> {
        let local = self.context.access.local_id();
        let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
        for kb in kbs {
            if let Err(error) = open_local_shards(&self.shards, &self.context.access, kb).await {
                warn!(kb_id = %kb.id, %error, "opening this node's replicas failed");
                continue;
            }
            for shard in 0..kb.settings.shards {
                let Some(own) = kb.replicas(shard).iter().find(|r| r.node == local).cloned() else {
                    continue;
                };
                *states.entry(own.state.as_str()).or_default() += 1;
                let to_fill = matches!(own.state, ReplicaState::Dead | ReplicaState::Initializing);
                if !to_fill {
                    continue;
                }
                match self.repair(&kb.id, shard, own.state).await {
                    Ok(()) => {}
                    Err(reason) if reason.is_transient() => {
                        warn!(kb_id = %kb.id, shard, %reason, "filling this node's replica failed; will retry");
                    }
                    Err(reason) => {
                        error!(kb_id = %kb.id, shard, %reason, "filling this node's replica failed, and a retry alone will not fix it; will retry");
                    }
                }
            }
        }
        states
    }

    /// Removes replica directories left on disk that are neither placed here nor open (a node
    /// that stopped between a `RemoveReplica` and dropping its copy, or that caught up with
    /// the placement before opening its replicas). Replicas opened and then found moved are
    /// dropped by [`Reconciliation::drop_deleted_and_moved`].
    pub(super) async fn drop_unplaced_shard_dirs(&self, kbs: &[KbRecord]) {
        let local = self.context.access.local_id();
        let store = self.context.meta.store();
        for kb in kbs.iter().filter(|kb| !kb.placement.is_empty()) {
            let Ok(entries) = std::fs::read_dir(self.shards_dir.join(&kb.id)) else {
                continue;
            };
            for entry in entries.flatten() {
                let Some(shard) = entry
                    .file_name()
                    .to_str()
                    .and_then(|name| name.parse::<u32>().ok())
                else {
                    continue;
                };
                let placed_here =
                    |kb: &KbRecord| kb.replicas(shard).iter().any(|r| r.node == local);
                if placed_here(kb) || self.context.registry.actor(&kb.id, shard).is_some() {
                    continue;
                }
                // The placement as of now, not of the round's start.
                let still_unplaced = store
                    .get_kb(&kb.id)
                    .ok()
                    .flatten()
                    .is_some_and(|kb| !placed_here(&kb));
                if !still_unplaced {
                    continue;
                }
                info!(kb_id = %kb.id, shard, "dropping a stale copy of a replica placed elsewhere");
                if !drop_shard(&self.shards, &kb.id, shard).await {
                    warn!(kb_id = %kb.id, shard, "dropping a stale replica copy failed");
                }
            }
        }
    }
}
