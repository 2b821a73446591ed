//! Placement of documents on shards, and of shard replicas on nodes.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The shard of a document: the first 8 bytes of `sha256(document_id)` modulo `shards`.
/// Stable across versions, platforms and restarts (std's hasher is not).
pub fn shard_for_document(document_id: &str, shards: u32) -> u32 {
    assert!(shards > 0, "a knowledge base has at least one shard");
    let digest = Sha256::digest(document_id.as_bytes());
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(prefix) % u64::from(shards)) as u32
}

/// What a node already holds, for placement: replicas first, then their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeLoad {
    pub replicas: u64,
    pub bytes: u64,
}

/// Chooses the nodes of every shard's replicas: `replication_factor` distinct nodes per
/// shard, each time the least loaded ones (by replicas already held, `load`, plus those placed
/// by this call; then by bytes held), ties broken by a rotation so that shards spread their
/// first replica. `nodes` must hold at least `replication_factor` distinct ids. Deterministic.
pub fn place_replicas(
    shards: u32,
    replication_factor: u32,
    nodes: &[u64],
    load: &BTreeMap<u64, NodeLoad>,
) -> Vec<Vec<u64>> {
    let mut nodes: Vec<u64> = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    assert!(
        replication_factor as usize <= nodes.len() && replication_factor > 0,
        "replication factor {replication_factor} needs as many nodes (have {})",
        nodes.len()
    );
    let mut counts: BTreeMap<u64, NodeLoad> = nodes
        .iter()
        .map(|node| (*node, load.get(node).copied().unwrap_or_default()))
        .collect();
    let mut placement = Vec::with_capacity(shards as usize);
    for shard in 0..shards {
        let rotation = shard as usize % nodes.len();
        let mut order: Vec<(NodeLoad, usize, u64)> = nodes
            .iter()
            .enumerate()
            .map(|(position, node)| {
                let turn = (position + nodes.len() - rotation) % nodes.len();
                (counts[node], turn, *node)
            })
            .collect();
        order.sort_unstable();
        let chosen: Vec<u64> = order
            .iter()
            .take(replication_factor as usize)
            .map(|(_, _, node)| *node)
            .collect();
        for node in &chosen {
            counts.get_mut(node).expect("a known node").replicas += 1;
        }
        placement.push(chosen);
    }
    placement
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn replicas_are_distinct_and_balanced() {
        let placement = place_replicas(6, 2, &[1, 2, 3], &BTreeMap::new());
        let mut per_node: BTreeMap<u64, u32> = BTreeMap::new();
        for replicas in &placement {
            assert_eq!(replicas.len(), 2);
            assert_ne!(
                replicas[0], replicas[1],
                "two replicas of a shard on one node"
            );
            for node in replicas {
                *per_node.entry(*node).or_default() += 1;
            }
        }
        assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
        // Deterministic: every node that computes it gets the same placement.
        assert_eq!(
            placement,
            place_replicas(6, 2, &[3, 1, 2], &BTreeMap::new())
        );
    }

    #[test]
    fn loaded_nodes_get_fewer_replicas() {
        let load = BTreeMap::from([(
            1,
            NodeLoad {
                replicas: 10,
                bytes: 0,
            },
        )]);
        let placement = place_replicas(4, 1, &[1, 2, 3], &load);
        assert!(placement.iter().all(|r| r[0] != 1), "{placement:?}");
        assert_eq!(
            place_replicas(3, 1, &[7], &BTreeMap::new()),
            vec![vec![7]; 3]
        );
    }

    #[test]
    fn equal_replica_counts_fall_back_to_bytes() {
        let load = BTreeMap::from([
            (
                1,
                NodeLoad {
                    replicas: 2,
                    bytes: 9_000_000,
                },
            ),
            (
                2,
                NodeLoad {
                    replicas: 2,
                    bytes: 10,
                },
            ),
            (
                3,
                NodeLoad {
                    replicas: 2,
                    bytes: 5_000,
                },
            ),
        ]);
        // One shard, one replica: the node with the fewest bytes among equal counts.
        assert_eq!(place_replicas(1, 1, &[1, 2, 3], &load), vec![vec![2]]);
        // Two: the two lightest.
        let two = place_replicas(1, 2, &[1, 2, 3], &load);
        assert_eq!(
            two[0].iter().copied().collect::<BTreeSet<_>>(),
            [2, 3].into()
        );
    }

    #[test]
    fn stable_and_balanced() {
        assert_eq!(
            shard_for_document("doc-1", 4),
            shard_for_document("doc-1", 4)
        );
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            counts[shard_for_document(&format!("doc-{i}"), 4) as usize] += 1;
        }
        for count in counts {
            assert!((800..1200).contains(&count), "unbalanced: {counts:?}");
        }
        assert_eq!(shard_for_document("anything", 1), 0);
    }
}
