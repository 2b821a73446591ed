//! The leader's hand-over of work from workers that stopped answering: a worker that has not
//! been heard from for `reassign_after` (or left the cluster) loses its unfinished documents
//! to a live active replica of their shard (the one with the least pending work), which
//! [`handoff::notify_workers`] tells. The same record of unhealthy peers tells rebalancing
//! which members are away for longer than `replace_after`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sift_storage::meta::{KbRecord, MetaOp, MetaOutcome, ReplicaState};
use tokio::time::Instant;
use tracing::{info, warn};

use super::Reconciliation;
use crate::ingest::handoff;

/// Since when each peer has looked unhealthy to this (leader) node. A new leader, and a
/// restarted reconciler, start counting afresh.
#[derive(Debug, Default)]
pub(super) struct Suspects {
    since: HashMap<u64, Instant>,
}

impl Suspects {
    /// Records this round's view: `healthy` peers are cleared, `unhealthy` ones are suspects
    /// from now unless they already were.
    pub fn observe(&mut self, healthy: &[u64], unhealthy: impl IntoIterator<Item = u64>) {
        self.since.retain(|node, _| !healthy.contains(node));
        for node in unhealthy {
            self.since.entry(node).or_insert_with(Instant::now);
        }
    }

    /// The peers that have looked unhealthy for at least `at_least`, as of the last
    /// [`Suspects::observe`].
    pub fn away_for(&self, at_least: Duration) -> Vec<u64> {
        let mut away: Vec<u64> = self
            .since
            .iter()
            .filter(|(_, since)| since.elapsed() >= at_least)
            .map(|(node, _)| *node)
            .collect();
        away.sort_unstable();
        away
    }
}

impl Reconciliation {
    pub(super) async fn reassign(&mut self, kbs: &[KbRecord]) {
        let Some(raft) = self.context.meta.raft() else {
            return;
        };
        let status = raft.status();
        let local = self.context.access.local_id();
        let members = self.context.access.peers().members();
        let healthy: Vec<u64> = std::iter::once(local)
            .chain(status.peers.iter().filter(|p| p.healthy).map(|p| p.id))
            .collect();
        self.suspects.observe(
            &healthy,
            status.peers.iter().filter(|p| !p.healthy).map(|p| p.id),
        );
        let dead = self.suspects.away_for(self.context.options.reassign_after);
        let Ok(pending) = self.context.meta.store().pending_documents() else {
            return;
        };
        let mut load: HashMap<u64, usize> = HashMap::new();
        let mut stranded: BTreeMap<(String, u32, u64), Vec<String>> = BTreeMap::new();
        for entry in pending {
            let worker = entry.work.worker;
            *load.entry(worker).or_default() += 1;
            let gone = worker != 0 && worker != local && !members.contains(&worker);
            if gone || dead.contains(&worker) {
                stranded
                    .entry((entry.kb_id, entry.work.shard, worker))
                    .or_default()
                    .push(entry.document_id);
            }
        }
        for ((kb_id, shard, from), document_ids) in stranded {
            let Some(kb) = kbs.iter().find(|kb| kb.id == kb_id) else {
                continue;
            };
            let live = |node: &u64| *node != from && healthy.contains(node);
            let target = kb
                .replicas(shard)
                .iter()
                .filter(|r| r.state == ReplicaState::Active && live(&r.node))
                .map(|r| r.node)
                .min_by_key(|node| (load.get(node).copied().unwrap_or(0), *node != local, *node))
                .or_else(|| healthy.iter().copied().find(|node| live(node)));
            let Some(to) = target else {
                continue;
            };
            let count = document_ids.len();
            let outcome = self
                .context
                .meta
                .propose(MetaOp::ReassignDocuments {
                    kb_id: kb_id.clone(),
                    document_ids,
                    from,
                    to,
                })
                .await;
            match outcome {
                Ok(MetaOutcome::Reassigned(moved)) if !moved.is_empty() => {
                    info!(
                        kb_id,
                        shard,
                        from,
                        to,
                        documents = moved.len(),
                        "reassigned the unfinished documents of an unresponsive worker"
                    );
                    metrics::counter!("sift_ingest_reassigned_total").increment(moved.len() as u64);
                    *load.entry(to).or_default() += moved.len();
                    let mut assignments = BTreeMap::new();
                    assignments.insert((to, shard), moved);
                    handoff::notify_workers(&self.context, &kb_id, assignments);
                }
                Ok(_) => {}
                Err(error) => {
                    warn!(kb_id, shard, from, to, count, %error, "reassigning documents failed; will retry")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_peer_is_away_once_it_has_looked_unhealthy_long_enough_and_healthy_clears_it() {
        let mut suspects = Suspects::default();
        suspects.observe(&[1], [2, 3]);
        assert!(suspects.away_for(Duration::from_secs(10)).is_empty());
        tokio::time::advance(Duration::from_secs(6)).await;
        // Still unhealthy: the first sighting counts, not this one.
        suspects.observe(&[1], [2, 3, 4]);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(suspects.away_for(Duration::from_secs(10)), [2, 3]);
        assert_eq!(suspects.away_for(Duration::from_secs(5)), [2, 3, 4]);
        suspects.observe(&[1, 2], [3, 4]);
        assert_eq!(suspects.away_for(Duration::from_secs(10)), [3]);
    }
}
