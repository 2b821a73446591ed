//! The leader's rebalancing decisions, as a pure function of the placement (tested without a
//! cluster; the caretaker proposes the op it returns, one per round).
//!
//! In order of priority, for the first shard that needs it:
//! 1. A shard with more replicas than its factor (a move or a replacement in progress) whose
//!    replicas on placement members include enough active ones, none of them still filling,
//!    loses one: the one on a node that is not a placement member (removed or draining)
//!    first, then a dead one, else the active one on the most loaded node. So the old copy of
//!    a move goes only once the new one is active.
//! 2. A shard with too few replicas on placement members gets one on the least loaded member
//!    that holds none of it (`AddReplica`: `initializing`, filled by its node like a repair).
//! 3. When nothing is in progress and the busiest member holds 2 replicas more than the
//!    idlest, a fully active shard of the busiest that the idlest lacks gets a replica there;
//!    the busiest loses its copy by rule 1 once the new one is active.
//!
//! Load is (replica count, bytes of those replicas' shards): counts decide, bytes break ties.

use std::collections::BTreeMap;

use sift_cluster::placement::NodeLoad;
use sift_storage::meta::{KbRecord, MetaOp, Replica, ReplicaState};

/// Why a step was taken (for logs and metrics).
pub const REMOVE_EXTRA: &str = "remove_extra_replica";
pub const REPLACE: &str = "replace_missing_replica";
pub const MOVE: &str = "move_replica";

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub op: MetaOp,
    pub reason: &'static str,
}

/// The next rebalancing op, if any. `members` are the nodes that may hold replicas (members
/// not being drained); `load` has an entry for each of them.
pub fn next_step(
    kbs: &[KbRecord],
    members: &[u64],
    load: &BTreeMap<u64, NodeLoad>,
    at_ms: u64,
) -> Option<Step> {
    let least_loaded = |exclude: &[u64]| {
        load.iter()
            .filter(|(node, _)| !exclude.contains(node))
            .min_by_key(|(node, load)| (**load, **node))
            .map(|(node, _)| *node)
    };
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
            let filling = replicas.iter().any(|r| {
                matches!(
                    r.state,
                    ReplicaState::Initializing | ReplicaState::Recovering
                )
            });
            if replicas.len() <= factor && off_members == 0 {
                in_progress |= filling;
                continue;
            }
            in_progress = true;
            let members_filling = on_members.iter().any(|r| {
                matches!(
                    r.state,
                    ReplicaState::Initializing | ReplicaState::Recovering
                )
            });
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
                    .map(|r| r.node)?;
                return Some(Step {
                    op: MetaOp::RemoveReplica {
                        kb_id: kb.id.clone(),
                        shard,
                        node: victim,
                        at_ms,
                    },
                    reason: REMOVE_EXTRA,
                });
            }
            if on_members.len() < factor {
                let holders: Vec<u64> = replicas.iter().map(|r| r.node).collect();
                let Some(target) = least_loaded(&holders) else {
                    continue; // no node left to hold it
                };
                return Some(Step {
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
        return None;
    }
    let (&busiest, most) = load
        .iter()
        .max_by_key(|(node, load)| (**load, u64::MAX - **node))?;
    let idle = least_loaded(&[])?;
    if most.replicas < load[&idle].replicas + 2 {
        return None;
    }
    for kb in kbs.iter().filter(|kb| !kb.placement.is_empty()) {
        for shard in 0..kb.settings.shards {
            let replicas = kb.replicas(shard);
            if replicas.iter().any(|r| r.node == busiest)
                && !replicas.iter().any(|r| r.node == idle)
                && replicas.iter().all(|r| r.state == ReplicaState::Active)
            {
                return Some(Step {
                    op: MetaOp::AddReplica {
                        kb_id: kb.id.clone(),
                        shard,
                        node: idle,
                        at_ms,
                    },
                    reason: MOVE,
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use sift_storage::meta::{KbSettings, ShardPlacement};

    use super::*;

    fn kb(id: &str, factor: u32, shards: &[&[(u64, ReplicaState)]]) -> KbRecord {
        KbRecord {
            id: id.into(),
            name: id.into(),
            settings: KbSettings {
                shards: shards.len() as u32,
                replication_factor: factor,
                chunk_tokens: 256,
                chunk_overlap_tokens: 32,
                parent_tokens: 1024,
                embedding_model: "m".into(),
                dimension: 4,
                language: "auto".into(),
                json_text_field: "text".into(),
                json_title_field: "title".into(),
                retrieval: Default::default(),
            },
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

    use ReplicaState::{Active, Dead, Initializing};

    #[test]
    fn a_joining_node_receives_replicas_one_move_at_a_time() {
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
}
