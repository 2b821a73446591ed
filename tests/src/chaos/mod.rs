//! The checker of the chaos soak (`scripts/chaos.sh`, driver `src/bin/sift_chaos/`): what the
//! workload recorded while the nemesis injected faults, and the checks of what users are
//! promised, run once the faults have healed.
//!
//! - [`linearizability`]: KB metadata changes are linearizable (a register checker).
//! - [`resurrected`]: no search that started after a delete returned finds the document.
//! - [`lost`]: every acknowledged document (not deleted) is present.
//! - [`crash_loops`]: no node exits on its own again and again outside a disk fault.
//! - [`Summary`]: faults, operations and anomalies by kind, the JSON the soak writes.

pub mod linearizability;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

/// A search the workload made: when it was invoked and the documents it returned.
#[derive(Clone, Debug)]
pub struct SearchRecord {
    pub invoke: u64,
    pub node: usize,
    pub documents: Vec<String>,
}

/// One anomaly the checker found.
#[derive(Clone, Debug, Serialize)]
pub struct Anomaly {
    /// `lost`, `resurrected`, `linearizability`, `crash_loop` or `not_converged`.
    pub kind: &'static str,
    pub detail: String,
}

/// Searches that returned a document invoked after the delete of that document had returned.
/// `deleted` maps a document id to when its acknowledged delete returned.
pub fn resurrected(deleted: &HashMap<String, u64>, searches: &[SearchRecord]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for search in searches {
        for document in &search.documents {
            if let Some(returned) = deleted.get(document)
                && search.invoke > *returned
            {
                anomalies.push(Anomaly {
                    kind: "resurrected",
                    detail: format!(
                        "document {document} found by a search on node {} invoked {} ms after its delete returned",
                        search.node + 1,
                        (search.invoke - returned) / 1_000_000
                    ),
                });
            }
        }
    }
    anomalies
}

/// Acknowledged documents missing at the end: `present` is every document found once the
/// faults healed; documents whose delete was sent (whatever its outcome) are not expected.
pub fn lost(
    acknowledged: &[String],
    delete_sent: &HashSet<String>,
    present: &HashSet<String>,
) -> Vec<Anomaly> {
    acknowledged
        .iter()
        .filter(|id| !delete_sent.contains(*id) && !present.contains(*id))
        .map(|id| Anomaly {
            kind: "lost",
            detail: format!("acknowledged document {id} is missing"),
        })
        .collect()
}

/// A node's exits that nobody asked for (not a kill of the nemesis), with when they happened
/// (nanoseconds) and whether a disk fault on the node explains them.
#[derive(Clone, Debug, Default)]
pub struct Exits {
    pub at: Vec<(u64, bool)>,
}

/// A crash loop: `threshold` or more unexplained exits of one node within `window`
/// nanoseconds, or any unexplained exit after `healed` (once every fault was healed).
pub fn crash_loops(
    exits: &BTreeMap<usize, Exits>,
    threshold: usize,
    window: u64,
    healed: u64,
) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    for (node, exits) in exits {
        let times: Vec<u64> = exits
            .at
            .iter()
            .filter(|(_, explained)| !explained)
            .map(|(at, _)| *at)
            .collect();
        let looped = times
            .windows(threshold.max(1))
            .any(|w| w.len() >= threshold && w[w.len() - 1] - w[0] <= window);
        let after_heal = times.iter().filter(|at| **at >= healed).count();
        if looped || after_heal > 0 {
            anomalies.push(Anomaly {
                kind: "crash_loop",
                detail: format!(
                    "node {} exited on its own {} times ({} after the faults healed)",
                    node + 1,
                    times.len(),
                    after_heal
                ),
            });
        }
    }
    anomalies
}

/// What the soak writes at the end.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub seed: u64,
    pub seconds: u64,
    pub faults: BTreeMap<String, u64>,
    pub operations: BTreeMap<String, OperationCounts>,
    pub anomalies: BTreeMap<String, u64>,
    /// The first anomalies of each kind, to read.
    pub examples: Vec<Anomaly>,
    /// Linearizability checks that ran out of their budget (undecided, not anomalies).
    pub undecided_registers: u64,
    pub netem: bool,
    pub elapsed_seconds: f64,
}

/// Operations of one kind by outcome.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct OperationCounts {
    pub ok: u64,
    pub failed: u64,
    /// Timed out or a 5xx: it may or may not have taken effect.
    pub unknown: u64,
}

impl Summary {
    /// Every anomaly kind listed (with 0 when none), the first few of each kept as examples.
    pub fn record_anomalies(&mut self, anomalies: &[Anomaly]) {
        for kind in [
            "lost",
            "resurrected",
            "linearizability",
            "crash_loop",
            "not_converged",
            "failed",
        ] {
            self.anomalies.entry(kind.into()).or_insert(0);
        }
        let mut shown: HashMap<&str, usize> = HashMap::new();
        for anomaly in anomalies {
            *self.anomalies.entry(anomaly.kind.into()).or_insert(0) += 1;
            let count = shown.entry(anomaly.kind).or_insert(0);
            if *count < 5 {
                self.examples.push(anomaly.clone());
            }
            *count += 1;
        }
    }

    pub fn anomaly_total(&self) -> u64 {
        self.anomalies.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_after_the_delete_returned_is_a_resurrection_one_before_is_not() {
        let deleted = HashMap::from([("d1".to_string(), 100)]);
        let searches = [
            SearchRecord {
                invoke: 90,
                node: 0,
                documents: vec!["d1".into()],
            },
            SearchRecord {
                invoke: 110,
                node: 1,
                documents: vec!["d2".into(), "d1".into()],
            },
        ];
        let found = resurrected(&deleted, &searches);
        assert_eq!(found.len(), 1);
        assert!(found[0].detail.contains("node 2"), "{found:?}");
    }

    #[test]
    fn a_missing_acknowledged_document_is_lost_unless_its_delete_was_sent() {
        let acknowledged = ["a".to_string(), "b".into(), "c".into()];
        let delete_sent = HashSet::from(["b".to_string()]);
        let present = HashSet::from(["a".to_string()]);
        let found = lost(&acknowledged, &delete_sent, &present);
        assert_eq!(found.len(), 1);
        assert!(found[0].detail.contains(" c "), "{found:?}");
    }

    #[test]
    fn repeated_unexplained_exits_are_a_crash_loop_disk_faults_are_not() {
        let second = 1_000_000_000;
        let exits = BTreeMap::from([
            (
                0,
                Exits {
                    at: vec![(second, false), (5 * second, false), (9 * second, false)],
                },
            ),
            (
                1,
                Exits {
                    at: vec![(second, true), (2 * second, true), (3 * second, true)],
                },
            ),
            (
                2,
                Exits {
                    at: vec![(second, false)],
                },
            ),
        ]);
        let found = crash_loops(&exits, 3, 60 * second, 100 * second);
        assert_eq!(found.len(), 1);
        assert!(found[0].detail.starts_with("node 1 "), "{found:?}");
        // One exit after the heal is enough.
        let found = crash_loops(&exits, 3, 60 * second, 0);
        assert_eq!(found.len(), 2, "{found:?}");
    }
}
