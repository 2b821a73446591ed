//! The node's view of the cluster for the API: every shard's replicas with their states and
//! counts, and drains.

use std::time::Duration;

use futures::future::join_all;
use serde::Serialize;
use sift_storage::meta::MetaOp;

use super::SiftNode;
use crate::error::{Result, SiftError};
use crate::reconcile::rebalance::replicas_on;
use crate::scope::{Need, Scope};
use crate::shards::{ShardKey, ShardReply, ShardRpc};

impl SiftNode {
    /// `GET /v1/kbs/{kb}/shards`: every shard's replicas, their states and (when their node
    /// answers within a second) their document and chunk counts. A caller restricted to
    /// groups gets no counts: they include documents it may not see.
    pub async fn kb_shards(&self, scope: &Scope, kb: &str) -> Result<Vec<ShardView>> {
        let kb = self.find_kb_for_data(scope, kb, Need::Read).await?;
        let access = &self.context.access;
        let mut views = Vec::with_capacity(kb.settings.shards as usize);
        for shard in 0..kb.settings.shards {
            let replicas = access.replicas(&kb, shard);
            let stats = join_all(replicas.iter().map(|replica| {
                let kb_id = kb.id.clone();
                async move {
                    if replica.node == access.local_id() {
                        return self
                            .context
                            .registry
                            .get(&ShardKey { kb_id, shard })
                            .map(|entry| entry.index.stats());
                    }
                    let rpc = ShardRpc::Stats { kb_id, shard };
                    match access
                        .remote_call(replica.node, &rpc, Duration::from_secs(1))
                        .await
                    {
                        Ok(ShardReply::Stats(stats)) => Some(stats),
                        _ => None,
                    }
                }
            }))
            .await;
            let counted = scope.groups().is_none();
            views.push(ShardView {
                shard,
                replicas: replicas
                    .into_iter()
                    .zip(stats)
                    .map(|(replica, stats)| ReplicaView {
                        local: replica.node == access.local_id(),
                        node: replica.node,
                        state: replica.state.as_str(),
                        since_ms: replica.since_ms,
                        documents: stats.as_ref().filter(|_| counted).map(|s| s.documents),
                        chunks: stats.as_ref().filter(|_| counted).map(|s| s.chunks),
                        reachable: stats.is_some(),
                    })
                    .collect(),
            });
        }
        Ok(views)
    }

    /// Replicas placed on `node`, over every KB.
    pub fn replicas_on(&self, node: u64) -> Result<usize> {
        Ok(replicas_on(&self.store().list_kbs()?, node))
    }

    /// Starts draining `node` before its removal: the leader re-creates its replicas on the
    /// other nodes (each filled, then the drained copy dropped) and then removes it.
    /// Refused (409 `cannot_drain`) when a KB with a replica there would have fewer nodes
    /// left than its replication factor.
    pub async fn drain_node(&self, node: u64) -> Result<()> {
        let mut others = self.context.access.placement_members();
        others.retain(|member| *member != node);
        for kb in self.store().list_kbs()? {
            let holds = kb
                .placement
                .iter()
                .any(|p| p.replicas.iter().any(|r| r.node == node));
            if holds && kb.settings.replication_factor as usize > others.len() {
                return Err(SiftError::Conflict {
                    code: "cannot_drain",
                    message: format!(
                        "knowledge base {} has replication factor {} and only {} other nodes would be left; add a node first or remove with force=true (its replicas there are lost)",
                        kb.name,
                        kb.settings.replication_factor,
                        others.len()
                    ),
                });
            }
        }
        self.context
            .meta
            .propose(MetaOp::SetNodeDraining {
                node,
                draining: true,
            })
            .await?;
        Ok(())
    }
}

/// One shard of a KB as `GET /v1/kbs/{kb}/shards` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ShardView {
    pub shard: u32,
    pub replicas: Vec<ReplicaView>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ReplicaView {
    pub node: u64,
    /// `initializing`, `active`, `dead` or `recovering`.
    #[schema(value_type = sift_storage::meta::ReplicaState)]
    pub state: &'static str,
    pub since_ms: u64,
    /// The replica is on the node that answered.
    pub local: bool,
    /// Its node answered the stats request.
    pub reachable: bool,
    pub documents: Option<u64>,
    pub chunks: Option<u64>,
}
