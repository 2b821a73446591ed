//! The leader's rebalancing decisions, as a pure function of the placement (tested without a
//! cluster; the leader's reconciler proposes the ops it returns, every round).
//!
//! Every shard gets at most one step per round, taken in this order of priority:
//! 1. A shard with more replicas than its factor (a move or a replacement in progress) whose
//!    replicas on placement members include enough active ones, none of them still filling,
//!    loses one: the one on a node that is not a placement member (removed, draining, or away
//!    for longer than `replace_after`) first, then a dead one, else the active one on the most
//!    loaded node. So the old copy of a move goes only once the new one is active.
//! 2. A shard with too few replicas on placement members gets one on the least loaded member
//!    that holds none of it (`AddReplica`: `initializing`, filled by its node like a repair).
//! 3. When no shard is in the middle of a change, replicas move from the busiest members to
//!    the idlest while the two differ by 2 or more: a fully active shard of the busiest that
//!    the idlest lacks gets a replica there, and the busiest loses its copy by rule 1 once the
//!    new one is active. Several moves are planned at once, each on the load the previous
//!    ones will leave.
//!
//! A node fills at most [`MAX_FILLS_PER_NODE`] replicas at a time (its reconciler fills them
//! one after another), so rules 2 and 3 skip nodes that already have that many filling.
//! Load is (replica count, bytes of those replicas' shards): counts decide, bytes break ties;
//! the steps of one round update the counts as they go.

use std::collections::{BTreeMap, BTreeSet};

use sift_cluster::placement::NodeLoad;
use sift_storage::meta::{KbRecord, MetaOp, Replica, ReplicaState, SledMetaStore};
use tracing::{debug, info, warn};

use super::Reconciliation;
use crate::ingest::pipeline::now_ms;

/// Why a step was taken (for logs and metrics).
pub const REMOVE_EXTRA: &str = "remove_extra_replica";
pub const REPLACE: &str = "replace_missing_replica";
pub const MOVE: &str = "move_replica";

/// Replicas one node may have initializing or recovering at once before it gets another.
pub const MAX_FILLS_PER_NODE: usize = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub op: MetaOp,
    pub reason: &'static str,
}

fn filling(replica: &Replica) -> bool {
    matches!(
        replica.state,
        ReplicaState::Initializing | ReplicaState::Recovering
    )
}

/// This round's rebalancing ops, at most one per shard. `members` are the nodes that may hold
/// replicas (members neither draining nor away for too long); `load` has an entry for each.
pub fn plan(
    kbs: &[KbRecord],
    members: &[u64],
    load: &BTreeMap<u64, NodeLoad>,
    at_ms: u64,
) -> Vec<Step> {
    let mut load = load.clone();
    let mut fills: BTreeMap<u64, usize> = BTreeMap::new();
    for replica in kbs
        .iter()
        .flat_map(|kb| &kb.placement)
        .flat_map(|placement| &placement.replicas)
        .filter(|replica| filling(replica))
    {
        *fills.entry(replica.node).or_default() += 1;
    }
    // The least loaded node outside `exclude` that may start one more fill.
    let least_loaded =
        |load: &BTreeMap<u64, NodeLoad>, fills: &BTreeMap<u64, usize>, exclude: &[u64]| {
            load.iter()
                .filter(|(node, _)| !exclude.contains(node))
                .filter(|(node, _)| fills.get(node).copied().unwrap_or(0) < MAX_FILLS_PER_NODE)
                .min_by_key(|(node, load)| (**load, **node))
                .map(|(node, _)| *node)
        };
    let mut steps = Vec::new();
    let mut in_progress = false;
    for kb in kbs.iter().filter(|kb| !kb.placement.is_empty()) {
        let factor = kb.settings.replication_factor.max(1) as usize;
        for shard in 0..kb.settings.shards {
            let replicas = kb.replicas(shard);
            let on_members: Vec<&Replica> = replicas
                .iter()
                .filter(|r| members.contains(&r.node))
                .collect();
            let active_on_members = on_members
                .iter()
                .filter(|r| r.state == ReplicaState::Active)
                .count();
            let off_members = replicas.len() - on_members.len();
            if replicas.len() <= factor && off_members == 0 {
                in_progress |= replicas.iter().any(filling);
                continue;
            }
            in_progress = true;
            let members_filling = on_members.iter().any(|r| filling(r));
            if active_on_members >= factor && !members_filling {
                let victim = replicas
                    .iter()
                    .find(|r| !members.contains(&r.node))
                    .or_else(|| replicas.iter().find(|r| r.state == ReplicaState::Dead))
                    .or_else(|| {
                        replicas
                            .iter()
                            .filter(|r| r.state == ReplicaState::Active)
                            .max_by_key(|r| {
                                (load.get(&r.node).copied().unwrap_or_default(), r.node)
                            })
                    })
                    .map(|r| r.node);
                let Some(victim) = victim else {
                    continue;
                };
                if let Some(held) = load.get_mut(&victim) {
                    held.replicas = held.replicas.saturating_sub(1);
                }
                steps.push(Step {
                    op: MetaOp::RemoveReplica {
                        kb_id: kb.id.clone(),
                        shard,
                        node: victim,
                        at_ms,
                    },
                    reason: REMOVE_EXTRA,
                });
                continue;
            }
            if on_members.len() < factor {
                let holders: Vec<u64> = replicas.iter().map(|r| r.node).collect();
                let Some(target) = least_loaded(&load, &fills, &holders) else {
                    continue; // no node left to hold it, or every candidate is busy filling
                };
                if let Some(held) = load.get_mut(&target) {
                    held.replicas += 1;
                }
                *fills.entry(target).or_default() += 1;
                steps.push(Step {
                    op: MetaOp::AddReplica {
                        kb_id: kb.id.clone(),
                        shard,
                        node: target,
                        at_ms,
                    },
                    reason: REPLACE,
                });
            }
        }
    }
    if in_progress {
        return steps;
    }
    let mut moved: BTreeSet<(&str, u32)> = BTreeSet::new();
    while let Some((&busiest, most)) = load
        .iter()
        .max_by_key(|(node, load)| (**load, u64::MAX - **node))
    {
        let Some(idle) = least_loaded(&load, &fills, &[]) else {
            break;
        };
        if most.replicas < load[&idle].replicas + 2 {
            break;
        }
        let candidate = kbs
            .iter()
            .filter(|kb| !kb.placement.is_empty())
            .flat_map(|kb| (0..kb.settings.shards).map(move |shard| (kb, shard)))
            .find(|(kb, shard)| {
                let replicas = kb.replicas(*shard);
                !moved.contains(&(kb.id.as_str(), *shard))
                    && replicas.iter().any(|r| r.node == busiest)
                    && !replicas.iter().any(|r| r.node == idle)
                    && replicas.iter().all(|r| r.state == ReplicaState::Active)
            });
        let Some((kb, shard)) = candidate else {
            break;
        };
        moved.insert((kb.id.as_str(), shard));
        if let Some(held) = load.get_mut(&idle) {
            held.replicas += 1;
        }
        if let Some(held) = load.get_mut(&busiest) {
            held.replicas = held.replicas.saturating_sub(1);
        }
        *fills.entry(idle).or_default() += 1;
        steps.push(Step {
            op: MetaOp::AddReplica {
                kb_id: kb.id.clone(),
                shard,
                node: idle,
                at_ms,
            },
            reason: MOVE,
        });
    }
    steps
}

/// What each of `members` holds: replicas, and the bytes of their shards' documents.
pub(crate) fn node_loads(
    store: &SledMetaStore,
    kbs: &[KbRecord],
    members: &[u64],
) -> BTreeMap<u64, NodeLoad> {
    let bytes = store.shard_bytes().unwrap_or_default();
    let mut load: BTreeMap<u64, NodeLoad> =
        members.iter().map(|m| (*m, NodeLoad::default())).collect();
    for kb in kbs {
        for (shard, placement) in kb.placement.iter().enumerate() {
            let shard_bytes = bytes
                .get(&(kb.id.clone(), shard as u32))
                .copied()
                .unwrap_or(0);
            for replica in &placement.replicas {
                if let Some(node) = load.get_mut(&replica.node) {
                    node.replicas += 1;
                    node.bytes += shard_bytes;
                }
            }
        }
    }
    load
}

/// Replicas placed on `node`, over every KB.
pub(crate) fn replicas_on(kbs: &[KbRecord], node: u64) -> usize {
    kbs.iter()
        .flat_map(|kb| &kb.placement)
        .flat_map(|placement| &placement.replicas)
        .filter(|replica| replica.node == node)
        .count()
}

impl Reconciliation {
    /// Proposes this round's rebalancing ops; see [`plan`].
    pub(super) async fn rebalance(&self, kbs: &[KbRecord]) -> Result<(), String> {
        // Draining nodes, and members away for longer than `replace_after`, count as gone:
        // their replicas are re-created elsewhere first.
        let away = self.suspects.away_for(self.context.options.replace_after);
        if !away.is_empty() {
            debug!(nodes = ?away, "members away too long: their replicas are replaced");
        }
        let mut members = self.context.access.placement_members();
        members.retain(|node| !away.contains(node));
        let load = node_loads(self.context.meta.store(), kbs, &members);
        let mut failure = None;
        for step in plan(kbs, &members, &load, now_ms()) {
            info!(step = step.reason, op = ?step.op, "rebalance");
            if step.reason == MOVE {
                metrics::counter!("sift_rebalance_moves_total").increment(1);
            }
            if let Err(reason) = self.propose(step.op).await {
                failure.get_or_insert(reason);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Removes from the cluster the draining nodes that no longer hold a replica, and clears
    /// the mark of nodes that are gone.
    pub(super) async fn finish_drains(&self, kbs: &[KbRecord]) {
        let Some(raft) = self.context.meta.raft() else {
            return;
        };
        let Ok(draining) = self.context.meta.store().draining_nodes() else {
            return;
        };
        let status = raft.status();
        for node in draining {
            let member = status.voters.contains(&node) || status.learners.contains(&node);
            if member && replicas_on(kbs, node) > 0 {
                continue;
            }
            if member {
                info!(node, "node drained: removing it from the cluster");
                if let Err(error) = raft.remove_node(node).await {
                    warn!(node, %error, "removing a drained node failed; will retry");
                    continue;
                }
            }
            if let Err(reason) = self
                .propose(MetaOp::SetNodeDraining {
                    node,
                    draining: false,
                })
                .await
            {
                warn!(node, %reason, "clearing the draining mark failed; will retry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use sift_storage::meta::{KbSettings, ShardPlacement};

    use super::*;

    fn kb(id: &str, factor: u32, shards: &[&[(u64, ReplicaState)]]) -> KbRecord {
        KbRecord {
            id: id.into(),
            name: id.into(),
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
                            since_ms: 1,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Replica counts of `kbs` on `members`, with the given bytes per node.
    fn loads(kbs: &[KbRecord], members: &[u64], bytes: &[(u64, u64)]) -> BTreeMap<u64, NodeLoad> {
        let mut load: BTreeMap<u64, NodeLoad> =
            members.iter().map(|m| (*m, NodeLoad::default())).collect();
        for kb in kbs {
            for replica in kb.placement.iter().flat_map(|p| &p.replicas) {
                if let Some(node) = load.get_mut(&replica.node) {
                    node.replicas += 1;
                }
            }
        }
        for (node, b) in bytes {
            if let Some(node) = load.get_mut(node) {
                node.bytes = *b;
            }
        }
        load
    }

    use ReplicaState::{Active, Dead, Initializing, Recovering};

    /// The single step of a round in which at most one is expected.
    fn next_step(
        kbs: &[KbRecord],
        members: &[u64],
        load: &BTreeMap<u64, NodeLoad>,
        at_ms: u64,
    ) -> Option<Step> {
        let steps = plan(kbs, members, load, at_ms);
        assert!(steps.len() <= 1, "one step expected: {steps:?}");
        steps.into_iter().next()
    }

    fn adds(steps: &[Step]) -> Vec<(u32, u64)> {
        steps
            .iter()
            .filter_map(|step| match step.op {
                MetaOp::AddReplica { shard, node, .. } => Some((shard, node)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_joining_node_receives_a_replica_and_the_old_copy_goes_once_it_is_active() {
        // 3 shards x 2 replicas on nodes 1-3; node 4 joins empty.
        let kbs = [kb(
            "k",
            2,
            &[
                &[(1, Active), (2, Active)],
                &[(2, Active), (3, Active)],
                &[(3, Active), (1, Active)],
            ],
        )];
        let members = [1, 2, 3, 4];
        let step = next_step(&kbs, &members, &loads(&kbs, &members, &[]), 7).unwrap();
        assert_eq!(step.reason, MOVE);
        let MetaOp::AddReplica { node, shard, .. } = step.op else {
            panic!("{step:?}")
        };
        assert_eq!(
            (node, shard),
            (4, 0),
            "the idlest node gets a shard of the busiest (node 1)"
        );

        // While the new replica fills, nothing else moves.
        let filling = [kb(
            "k",
            2,
            &[
                &[(1, Active), (2, Active), (4, Initializing)],
                &[(2, Active), (3, Active)],
                &[(3, Active), (1, Active)],
            ],
        )];
        assert_eq!(
            next_step(&filling, &members, &loads(&filling, &members, &[]), 7),
            None
        );

        // Once it is active, the busiest node's copy goes.
        let filled = [kb(
            "k",
            2,
            &[
                &[(1, Active), (2, Active), (4, Active)],
                &[(2, Active), (3, Active)],
                &[(3, Active), (1, Active)],
            ],
        )];
        let step = next_step(&filled, &members, &loads(&filled, &members, &[]), 7).unwrap();
        assert_eq!(step.reason, REMOVE_EXTRA);
        let MetaOp::RemoveReplica { node, shard, .. } = step.op else {
            panic!("{step:?}")
        };
        assert_eq!(shard, 0);
        assert!(
            node == 1 || node == 2,
            "a copy on a node holding 2 replicas: {node}"
        );

        // Balanced (counts differ by at most 1): nothing to do.
        let balanced = [kb(
            "k",
            2,
            &[
                &[(4, Active), (2, Active)],
                &[(2, Active), (3, Active)],
                &[(3, Active), (1, Active)],
            ],
        )];
        assert_eq!(
            next_step(&balanced, &members, &loads(&balanced, &members, &[]), 7),
            None
        );
    }

    #[test]
    fn replicas_off_the_members_are_replaced_before_they_are_dropped() {
        // Node 3 is draining (not a placement member): its replica of shard 1 is re-created
        // first, on the least loaded member, and dropped only once the new one is active.
        let kbs = [kb("k", 1, &[&[(1, Active)], &[(3, Active)]])];
        let members = [1, 2];
        let step = next_step(&kbs, &members, &loads(&kbs, &members, &[]), 7).unwrap();
        assert_eq!(step.reason, REPLACE);
        assert!(
            matches!(
                step.op,
                MetaOp::AddReplica {
                    shard: 1,
                    node: 2,
                    ..
                }
            ),
            "{step:?}"
        );
        let filling = [kb(
            "k",
            1,
            &[&[(1, Active)], &[(3, Active), (2, Initializing)]],
        )];
        assert_eq!(
            next_step(&filling, &members, &loads(&filling, &members, &[]), 7),
            None
        );
        let filled = [kb("k", 1, &[&[(1, Active)], &[(3, Active), (2, Active)]])];
        let step = next_step(&filled, &members, &loads(&filled, &members, &[]), 7).unwrap();
        assert!(
            matches!(
                step.op,
                MetaOp::RemoveReplica {
                    shard: 1,
                    node: 3,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn an_extra_dead_replica_goes_before_an_active_one() {
        // A move finished while the old copy's node was down: the dead copy goes.
        let kbs = [kb("k", 2, &[&[(1, Active), (2, Dead), (3, Active)]])];
        let members = [1, 2, 3];
        let step = next_step(&kbs, &members, &loads(&kbs, &members, &[(1, 9), (3, 9)]), 7).unwrap();
        assert!(
            matches!(step.op, MetaOp::RemoveReplica { node: 2, .. }),
            "{step:?}"
        );
    }

    #[test]
    fn a_dead_replica_is_left_to_its_repair_and_no_node_means_no_step() {
        // A dead replica on a member is repaired by its node, not moved.
        let kbs = [kb("k", 2, &[&[(1, Active), (2, Dead)]])];
        let members = [1, 2];
        assert_eq!(
            next_step(&kbs, &members, &loads(&kbs, &members, &[]), 7),
            None
        );
        // Replication factor 2 with one member left: nowhere to put the replacement.
        let kbs = [kb("k", 2, &[&[(1, Active), (2, Active)]])];
        assert_eq!(next_step(&kbs, &[1], &loads(&kbs, &[1], &[]), 7), None);
    }

    #[test]
    fn equal_counts_send_a_replacement_to_the_node_with_fewer_bytes() {
        let kbs = [
            kb("a", 1, &[&[(1, Active)], &[(2, Active)]]),
            kb("b", 1, &[&[(9, Active)]]),
        ];
        let members = [1, 2];
        let load = loads(&kbs, &members, &[(1, 5_000_000), (2, 100)]);
        let step = next_step(&kbs, &members, &load, 7).unwrap();
        assert!(
            matches!(step.op, MetaOp::AddReplica { node: 2, .. }),
            "{step:?}"
        );
        let load = loads(&kbs, &members, &[(1, 100), (2, 5_000_000)]);
        let step = next_step(&kbs, &members, &load, 7).unwrap();
        assert!(
            matches!(step.op, MetaOp::AddReplica { node: 1, .. }),
            "{step:?}"
        );
    }

    #[test]
    fn several_moves_are_planned_at_once_each_on_the_load_the_previous_leave() {
        // 6 shards x 1 replica, all on node 1; nodes 2 and 3 join empty.
        let six: Vec<&[(u64, ReplicaState)]> = vec![&[(1, Active)]; 6];
        let kbs = [kb("k", 1, &six)];
        let members = [1, 2, 3];
        let steps = plan(&kbs, &members, &loads(&kbs, &members, &[]), 7);
        assert!(steps.iter().all(|step| step.reason == MOVE), "{steps:?}");
        let targets = adds(&steps);
        // Node 1 would keep 2 of 6 with 2 each elsewhere: 4 moves, 2 per new node.
        assert_eq!(targets.len(), 4, "{steps:?}");
        for node in [2, 3] {
            assert_eq!(targets.iter().filter(|(_, n)| *n == node).count(), 2);
        }
        let mut shards: Vec<u32> = targets.iter().map(|(shard, _)| *shard).collect();
        shards.dedup();
        assert_eq!(shards.len(), 4, "each shard moves once: {targets:?}");

        // Once all four are active, their four old copies go in one round.
        let filled: Vec<Vec<(u64, ReplicaState)>> = (0..6)
            .map(|shard| {
                let mut replicas = vec![(1, Active)];
                if let Some((_, node)) = targets.iter().find(|(s, _)| *s == shard) {
                    replicas.push((*node, Active));
                }
                replicas
            })
            .collect();
        let filled_refs: Vec<&[(u64, ReplicaState)]> = filled.iter().map(Vec::as_slice).collect();
        let kbs = [kb("k", 1, &filled_refs)];
        let steps = plan(&kbs, &members, &loads(&kbs, &members, &[]), 7);
        let removed: Vec<(u32, u64)> = steps
            .iter()
            .filter_map(|step| match step.op {
                MetaOp::RemoveReplica { shard, node, .. } => Some((shard, node)),
                _ => None,
            })
            .collect();
        assert_eq!(removed.len(), 4, "{steps:?}");
        assert!(removed.iter().all(|(_, node)| *node == 1), "{removed:?}");
    }

    #[test]
    fn a_node_fills_at_most_the_cap_at_once() {
        // Node 3 left (not a member) holding 4 single-replica shards: they are re-created
        // on nodes 1 and 2, at most MAX_FILLS_PER_NODE each per round.
        let kbs = [kb(
            "k",
            1,
            &[
                &[(3, Active)],
                &[(3, Active)],
                &[(3, Active)],
                &[(3, Active)],
                &[(3, Active)],
                &[(3, Active)],
            ],
        )];
        let members = [1, 2];
        let steps = plan(&kbs, &members, &loads(&kbs, &members, &[]), 7);
        let targets = adds(&steps);
        assert!(steps.iter().all(|step| step.reason == REPLACE), "{steps:?}");
        assert_eq!(targets.len(), 2 * MAX_FILLS_PER_NODE, "{targets:?}");
        for node in [1, 2] {
            assert_eq!(
                targets.iter().filter(|(_, n)| *n == node).count(),
                MAX_FILLS_PER_NODE
            );
        }
        // A node already filling its cap gets nothing more.
        let kbs = [kb(
            "k",
            1,
            &[
                &[(3, Active), (1, Recovering)],
                &[(3, Active), (1, Initializing)],
                &[(3, Active)],
            ],
        )];
        let steps = plan(&kbs, &members, &loads(&kbs, &members, &[]), 7);
        assert_eq!(adds(&steps), vec![(2, 2)], "{steps:?}");
    }

    #[test]
    fn replicas_of_a_node_away_too_long_are_replaced_like_a_drained_one() {
        // Node 3 is still a Raft member but has been away for longer than `replace_after`:
        // the caller leaves it out of `members`. Its replicas get new homes; its copies go
        // once the new ones are active (and the shard that still has a live active copy
        // keeps being read meanwhile).
        let kbs = [kb(
            "k",
            2,
            &[&[(1, Active), (3, Active)], &[(2, Active), (3, Dead)]],
        )];
        let members = [1, 2, 4];
        let steps = plan(&kbs, &members, &loads(&kbs, &members, &[]), 7);
        assert_eq!(adds(&steps), vec![(0, 4), (1, 1)], "{steps:?}");
        let filled = [kb(
            "k",
            2,
            &[
                &[(1, Active), (3, Active), (4, Active)],
                &[(2, Active), (3, Dead), (1, Active)],
            ],
        )];
        let steps = plan(&filled, &members, &loads(&filled, &members, &[]), 7);
        let removed: Vec<u64> = steps
            .iter()
            .filter_map(|step| match step.op {
                MetaOp::RemoveReplica { node, .. } => Some(node),
                _ => None,
            })
            .collect();
        assert_eq!(removed, vec![3, 3], "{steps:?}");
    }

    mod properties {
        use proptest::prelude::*;
        use sift_cluster::placement::place_replicas;

        use super::*;

        /// Applies one round's steps; a replica added in round `round` is active
        /// `fill_rounds` rounds later (its node filled it).
        fn apply(kbs: &mut [KbRecord], steps: &[Step], round: u64) {
            for step in steps {
                match &step.op {
                    MetaOp::AddReplica {
                        kb_id, shard, node, ..
                    } => {
                        let kb = kbs.iter_mut().find(|kb| &kb.id == kb_id).unwrap();
                        kb.placement[*shard as usize].replicas.push(Replica {
                            node: *node,
                            state: ReplicaState::Initializing,
                            since_ms: round,
                        });
                    }
                    MetaOp::RemoveReplica {
                        kb_id, shard, node, ..
                    } => {
                        let kb = kbs.iter_mut().find(|kb| &kb.id == kb_id).unwrap();
                        kb.placement[*shard as usize]
                            .replicas
                            .retain(|r| r.node != *node);
                    }
                    other => panic!("rebalancing proposes only adds and removes: {other:?}"),
                }
            }
        }

        fn filling_on(kbs: &[KbRecord], node: u64) -> usize {
            kbs.iter()
                .flat_map(|kb| &kb.placement)
                .flat_map(|p| &p.replicas)
                .filter(|r| r.node == node && filling(r))
                .count()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(96))]

            /// Whatever the cluster did (nodes joined, one left), rebalancing ends with every
            /// shard at its replication factor on distinct members, every replica active,
            /// never more than `MAX_FILLS_PER_NODE` filling on a node, and no step left.
            #[test]
            fn every_shard_keeps_its_factor_on_members_and_no_node_overfills(
                nodes in 1u64..=4,
                joined in 0u64..=3,
                leaves in proptest::option::of(1u64..=4),
                shapes in proptest::collection::vec((1u32..=4, 1u32..=3), 1..=3),
                fill_rounds in 1u64..=3,
            ) {
                let first: Vec<u64> = (1..=nodes).collect();
                let mut members: Vec<u64> = (1..=nodes + joined).collect();
                if let Some(gone) = leaves.filter(|gone| *gone <= nodes && nodes + joined > 1) {
                    members.retain(|node| *node != gone);
                }
                let mut kbs: Vec<KbRecord> = Vec::new();
                for (index, (shards, factor)) in shapes.iter().enumerate() {
                    let factor = (*factor).min(first.len() as u32).min(members.len() as u32);
                    let load = loads(&kbs, &first, &[]);
                    let placed = place_replicas(*shards, factor, &first, &load);
                    let shard_replicas: Vec<Vec<(u64, ReplicaState)>> = placed
                        .iter()
                        .map(|nodes| nodes.iter().map(|n| (*n, ReplicaState::Active)).collect())
                        .collect();
                    let views: Vec<&[(u64, ReplicaState)]> =
                        shard_replicas.iter().map(|r| r.as_slice()).collect();
                    kbs.push(kb(&format!("kb{index}"), factor, &views));
                }
                let mut converged = false;
                for round in 1..=400u64 {
                    for replica in kbs
                        .iter_mut()
                        .flat_map(|kb| kb.placement.iter_mut())
                        .flat_map(|p| p.replicas.iter_mut())
                    {
                        if replica.state == ReplicaState::Initializing
                            && round - replica.since_ms >= fill_rounds
                        {
                            replica.state = ReplicaState::Active;
                        }
                    }
                    let load = loads(&kbs, &members, &[]);
                    let steps = plan(&kbs, &members, &load, round);
                    let idle = steps.is_empty()
                        && kbs
                            .iter()
                            .flat_map(|kb| &kb.placement)
                            .flat_map(|p| &p.replicas)
                            .all(|r| r.state == ReplicaState::Active);
                    if idle {
                        converged = true;
                        break;
                    }
                    apply(&mut kbs, &steps, round);
                    for node in &members {
                        prop_assert!(
                            filling_on(&kbs, *node) <= MAX_FILLS_PER_NODE,
                            "node {node} fills more than the cap"
                        );
                    }
                }
                prop_assert!(converged, "rebalancing did not settle: {kbs:?}");
                for kb in &kbs {
                    for (shard, placement) in kb.placement.iter().enumerate() {
                        let mut nodes: Vec<u64> = placement.replicas.iter().map(|r| r.node).collect();
                        nodes.sort_unstable();
                        nodes.dedup();
                        prop_assert_eq!(
                            nodes.len(),
                            kb.settings.replication_factor as usize,
                            "shard {} of {} has {} distinct replicas",
                            shard, kb.id, nodes.len()
                        );
                        prop_assert_eq!(placement.replicas.len(), nodes.len());
                        prop_assert!(nodes.iter().all(|n| members.contains(n)), "a replica off the members");
                    }
                }
            }
        }
    }
}
