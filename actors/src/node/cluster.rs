//! The node's view of the cluster for the API: every shard's replicas with their states and
//! counts, drains, and the rebalancing in progress.

use std::time::Duration;

use futures::future::join_all;
use serde::Serialize;
use sift_storage::meta::{KbRecord, MetaOp, ReplicaState};

use super::SiftNode;
use crate::error::{Result, SiftError};
use crate::ingest::pipeline::now_ms;
use crate::reconcile::rebalance::{Step, node_loads, plan, replicas_on};
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

    /// What this node knows of rebalancing in progress, from its copy of the placement: the
    /// nodes being drained, the replicas not serving reads (filling or dead) with the active
    /// ones they fill from, and the steps the leader's next reconciler round would take as
    /// this node sees the members (the leader also counts as gone the members away for
    /// longer than `replace_after`, which only it tracks). Reads no document record.
    pub fn rebalancing(&self) -> Result<Rebalancing> {
        let store = self.store();
        let kbs = store.list_kbs()?;
        let draining = store.draining_nodes()?;
        let members = self.context.access.placement_members();
        let load = node_loads(store, &kbs, &members);
        let planned = plan(&kbs, &members, &load, now_ms());
        Ok(rebalancing(&kbs, &draining, &planned))
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

/// The rebalancing in progress as `GET /v1/cluster` shows it (`rebalancing`); every list is
/// empty when the placement is settled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Rebalancing {
    /// Nodes being drained before their removal, with the replicas each still holds.
    pub draining: Vec<DrainingNode>,
    /// Replicas that serve no reads yet: `initializing` or `recovering` (being filled from
    /// `sources`) or `dead` (waiting for a repair), in KB name and shard order.
    pub replicas: Vec<MovingReplica>,
    /// The steps of the next rebalancing round as this node sees the placement.
    pub planned: Vec<PlannedStep>,
}

#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DrainingNode {
    pub node: u64,
    /// Replicas still placed on it; the leader removes it at 0.
    pub replicas: usize,
}

/// A replica that is not `active`.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct MovingReplica {
    pub kb_id: String,
    /// The KB's name.
    pub kb: String,
    pub shard: u32,
    pub node: u64,
    /// `initializing`, `recovering` or `dead`.
    #[schema(value_type = sift_storage::meta::ReplicaState)]
    pub state: &'static str,
    /// When it entered that state.
    pub since_ms: u64,
    /// The nodes of the shard's active replicas: a filling replica copies from one of them.
    pub sources: Vec<u64>,
}

/// One step the leader's reconciler would propose.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PlannedStep {
    pub kb_id: String,
    /// The KB's name.
    pub kb: String,
    pub shard: u32,
    /// `add_replica` (a new replica on `node`, filled there) or `remove_replica` (the copy
    /// on `node` dropped, once enough others are active).
    #[schema(value_type = String)]
    pub action: &'static str,
    pub node: u64,
    /// `replace_missing_replica`, `move_replica` or `remove_extra_replica`.
    #[schema(value_type = String)]
    pub reason: &'static str,
}

/// The rebalancing view of `kbs`' placement, the `draining` nodes and a round's `planned`
/// steps.
fn rebalancing(kbs: &[KbRecord], draining: &[u64], planned: &[Step]) -> Rebalancing {
    let name = |kb_id: &str| {
        kbs.iter()
            .find(|kb| kb.id == kb_id)
            .map_or_else(|| kb_id.to_string(), |kb| kb.name.clone())
    };
    let mut replicas = Vec::new();
    for kb in kbs {
        for (shard, placement) in kb.placement.iter().enumerate() {
            let sources: Vec<u64> = placement
                .replicas
                .iter()
                .filter(|r| r.state == ReplicaState::Active)
                .map(|r| r.node)
                .collect();
            for replica in placement
                .replicas
                .iter()
                .filter(|r| r.state != ReplicaState::Active)
            {
                replicas.push(MovingReplica {
                    kb_id: kb.id.clone(),
                    kb: kb.name.clone(),
                    shard: shard as u32,
                    node: replica.node,
                    state: replica.state.as_str(),
                    since_ms: replica.since_ms,
                    sources: sources.clone(),
                });
            }
        }
    }
    let planned = planned
        .iter()
        .filter_map(|step| {
            let (action, kb_id, shard, node) = match &step.op {
                MetaOp::AddReplica {
                    kb_id, shard, node, ..
                } => ("add_replica", kb_id, *shard, *node),
                MetaOp::RemoveReplica {
                    kb_id, shard, node, ..
                } => ("remove_replica", kb_id, *shard, *node),
                _ => return None,
            };
            Some(PlannedStep {
                kb_id: kb_id.clone(),
                kb: name(kb_id),
                shard,
                action,
                node,
                reason: step.reason,
            })
        })
        .collect();
    Rebalancing {
        draining: draining
            .iter()
            .map(|node| DrainingNode {
                node: *node,
                replicas: replicas_on(kbs, *node),
            })
            .collect(),
        replicas,
        planned,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sift_cluster::placement::NodeLoad;
    use sift_storage::meta::{KbSettings, Replica, ShardPlacement};

    use super::*;
    use crate::reconcile::rebalance::{MOVE, REMOVE_EXTRA};

    fn kb(id: &str, factor: u32, shards: &[&[(u64, ReplicaState)]]) -> KbRecord {
        KbRecord {
            id: id.into(),
            name: format!("{id}-name"),
            settings: KbSettings::new(shards.len() as u32, factor, "m", 4),
            created_at_ms: 1,
            updated_at_ms: 1,
            placement: shards
                .iter()
                .map(|replicas| ShardPlacement {
                    replicas: replicas
                        .iter()
                        .map(|(node, state)| Replica {
                            node: *node,
                            state: *state,
                            since_ms: 7,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn loads(kbs: &[KbRecord], members: &[u64]) -> BTreeMap<u64, NodeLoad> {
        let mut load: BTreeMap<u64, NodeLoad> =
            members.iter().map(|m| (*m, NodeLoad::default())).collect();
        for replica in kbs
            .iter()
            .flat_map(|kb| &kb.placement)
            .flat_map(|p| &p.replicas)
        {
            if let Some(node) = load.get_mut(&replica.node) {
                node.replicas += 1;
            }
        }
        load
    }

    #[test]
    fn a_settled_placement_shows_nothing_in_progress() {
        use ReplicaState::Active;
        let kbs = [kb(
            "a",
            2,
            &[&[(1, Active), (2, Active)], &[(2, Active), (3, Active)]],
        )];
        let members = [1, 2, 3];
        let planned = plan(&kbs, &members, &loads(&kbs, &members), 9);
        assert_eq!(rebalancing(&kbs, &[], &planned), Rebalancing::default());
    }

    #[test]
    fn a_drain_shows_the_node_its_filling_replicas_and_the_next_steps() {
        use ReplicaState::{Active, Dead, Initializing};
        // Node 3 drains: shard 0's new copy on node 4 fills from 1 and 3; shard 1's is filled,
        // so its copy on 3 goes next; node 2's replica of shard 2 is dead.
        let kbs = [kb(
            "a",
            2,
            &[
                &[(1, Active), (3, Active), (4, Initializing)],
                &[(3, Active), (1, Active), (4, Active)],
                &[(1, Active), (2, Dead)],
            ],
        )];
        let members = [1, 2, 4];
        let planned = plan(&kbs, &members, &loads(&kbs, &members), 9);
        let view = rebalancing(&kbs, &[3], &planned);
        assert_eq!(
            view.draining,
            [DrainingNode {
                node: 3,
                replicas: 2
            }]
        );
        assert_eq!(
            view.replicas,
            [
                MovingReplica {
                    kb_id: "a".into(),
                    kb: "a-name".into(),
                    shard: 0,
                    node: 4,
                    state: "initializing",
                    since_ms: 7,
                    sources: vec![1, 3],
                },
                MovingReplica {
                    kb_id: "a".into(),
                    kb: "a-name".into(),
                    shard: 2,
                    node: 2,
                    state: "dead",
                    since_ms: 7,
                    sources: vec![1],
                },
            ]
        );
        assert!(
            view.planned.contains(&PlannedStep {
                kb_id: "a".into(),
                kb: "a-name".into(),
                shard: 1,
                action: "remove_replica",
                node: 3,
                reason: REMOVE_EXTRA,
            }),
            "{:?}",
            view.planned
        );
        assert!(view.planned.iter().all(|step| step.reason != MOVE));
    }
}
