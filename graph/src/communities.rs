//! Communities of the entity graph (issue 20, item 6): groups of entities mentioned together
//! more often than chance, found by Louvain modularity (graphrs) over entities weighted by the
//! chunks they share. Seeded, so the same graph always gives the same communities (a summary
//! cached for a community finds it again).

use std::collections::BTreeMap;

use crate::EntityId;

/// Louvain's seed: any fixed value makes the partition reproducible.
const SEED: u64 = 20;

/// The communities of the graph `edges` (entity, entity, weight; an undirected pair may
/// appear more than once, its weights add up; self-loops and weights ≤ 0 are ignored). Each
/// community lists its members in id order; communities come largest first (ties by their
/// first member). Entities without an edge are in none.
pub fn communities(edges: &[(EntityId, EntityId, f64)]) -> Vec<Vec<EntityId>> {
    let mut weights: BTreeMap<(EntityId, EntityId), f64> = BTreeMap::new();
    for &(a, b, weight) in edges {
        if a == b || weight.is_nan() || weight <= 0.0 {
            continue;
        }
        *weights.entry((a.min(b), a.max(b))).or_default() += weight;
    }
    if weights.is_empty() {
        return Vec::new();
    }
    let mut graph =
        graphrs::Graph::<EntityId, ()>::new(graphrs::GraphSpecs::undirected_create_missing());
    let edges = weights
        .into_iter()
        .map(|((a, b), weight)| graphrs::Edge::with_weight(a, b, weight))
        .collect();
    let found = graph.add_edges(edges).and_then(|()| {
        graphrs::algorithms::community::louvain::louvain_communities(
            &graph,
            true,
            None,
            None,
            Some(SEED),
        )
    });
    let Ok(found) = found else {
        // Only an empty graph has no partition, and that returned above.
        return Vec::new();
    };
    let mut out: Vec<Vec<EntityId>> = found
        .into_iter()
        .map(|members| {
            let mut members: Vec<EntityId> = members.into_iter().collect();
            members.sort_unstable();
            members
        })
        .filter(|members| !members.is_empty())
        .collect();
    out.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a[0].cmp(&b[0])));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two cliques of four joined by one light edge.
    fn two_cliques() -> Vec<(EntityId, EntityId, f64)> {
        let mut edges = Vec::new();
        for group in [[1u64, 2, 3, 4], [11, 12, 13, 14]] {
            for (i, a) in group.iter().enumerate() {
                for b in &group[i + 1..] {
                    edges.push((*a, *b, 3.0));
                }
            }
        }
        edges.push((4, 11, 1.0));
        edges
    }

    #[test]
    fn two_cliques_joined_by_one_edge_are_two_communities() {
        let found = communities(&two_cliques());
        assert_eq!(found, vec![vec![1, 2, 3, 4], vec![11, 12, 13, 14]]);
    }

    #[test]
    fn the_partition_is_the_same_every_time_and_in_any_edge_order() {
        let mut edges = two_cliques();
        let first = communities(&edges);
        edges.reverse();
        for _ in 0..5 {
            assert_eq!(communities(&edges), first);
        }
    }

    #[test]
    fn repeated_pairs_add_up_and_loops_and_empty_weights_are_ignored() {
        assert!(communities(&[]).is_empty());
        assert!(communities(&[(1, 1, 5.0), (2, 3, 0.0), (4, 5, f64::NAN)]).is_empty());
        // 1-2 drawn three times outweighs 2-3 once: still one component, one community or two,
        // but every member is placed once.
        let found = communities(&[(1, 2, 1.0), (2, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0)]);
        let mut all: Vec<u64> = found.concat();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2, 3]);
    }
}
