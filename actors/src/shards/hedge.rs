//! One shard's leaf search over its replicas, as a pure timing policy: ask the first replica
//! of the read plan; after `hedge_after` without an answer ask the next one too; a failure is
//! retried once on the next replica; the first answer wins; past `deadline` the shard has
//! failed. Replicas are reached through [`LeafService`], so the policy is unit-tested with
//! paused time and scripted replicas.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::error::ShardError;
use super::messages::LeafResponse;

/// Asks one replica (by node id) for this shard's leaf search.
pub(crate) trait LeafService: Sync {
    fn ask(&self, node: u64) -> BoxFuture<'_, Result<LeafResponse, ShardError>>;
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct HedgeTimes {
    pub hedge_after: Duration,
    pub deadline: Duration,
}

/// What a hedged search came to.
pub(crate) struct Hedged {
    pub outcome: Result<LeafResponse, ShardError>,
    /// The first replica when a hedge outran it before it answered or failed: the caller
    /// reads it last for a while.
    pub outran: Option<u64>,
}

/// The leaf search of one shard over `plan` (node ids, best first; not empty).
pub(crate) async fn hedged_search(
    service: &impl LeafService,
    plan: &[u64],
    times: HedgeTimes,
) -> Hedged {
    let Some(&first) = plan.first() else {
        return Hedged {
            outcome: Err(ShardError::Replicas(Vec::new())),
            outran: None,
        };
    };
    let deadline = tokio::time::sleep(times.deadline);
    tokio::pin!(deadline);
    let hedge = tokio::time::sleep(times.hedge_after);
    tokio::pin!(hedge);
    let ask = |node: u64| async move { (node, service.ask(node).await) };
    let mut pending = FuturesUnordered::new();
    pending.push(ask(first));
    let mut next = 1;
    let mut hedged = false;
    let mut retried = false;
    let mut errors: Vec<(u64, ShardError)> = Vec::new();
    loop {
        tokio::select! {
            Some((node, outcome)) = pending.next() => match outcome {
                Ok(response) => {
                    metrics::counter!("sift_search_leaf_total", "outcome" => "ok").increment(1);
                    // A hedge outran the first replica, which has not answered (a failure
                    // is already in `errors`).
                    let outran = (hedged && node != first && errors.is_empty()).then_some(first);
                    return Hedged { outcome: Ok(response), outran };
                }
                Err(reason) => {
                    metrics::counter!("sift_search_leaf_total", "outcome" => "error").increment(1);
                    errors.push((node, reason));
                    if !retried && next < plan.len() {
                        retried = true;
                        metrics::counter!("sift_search_leaf_retries_total").increment(1);
                        pending.push(ask(plan[next]));
                        next += 1;
                    } else if pending.is_empty() {
                        return Hedged { outcome: Err(ShardError::Replicas(errors)), outran: None };
                    }
                }
            },
            () = &mut hedge, if !hedged && next < plan.len() => {
                hedged = true;
                metrics::counter!("sift_search_leaf_hedged_total").increment(1);
                pending.push(ask(plan[next]));
                next += 1;
            }
            () = &mut deadline => {
                metrics::counter!("sift_search_leaf_total", "outcome" => "timeout").increment(1);
                // The replicas asked that have not failed are the ones that ran out of time.
                for node in &plan[..next] {
                    if !errors.iter().any(|(failed, _)| failed == node) {
                        errors.push((*node, ShardError::Timeout(times.deadline)));
                    }
                }
                return Hedged { outcome: Err(ShardError::Replicas(errors)), outran: None };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    /// How a scripted replica answers: after `after`, with a response or a failure.
    #[derive(Clone, Copy)]
    enum Script {
        Answer { after: Duration },
        Fail { after: Duration },
    }

    /// Replicas that answer as scripted; records who was asked, when (since the start).
    struct Scripted {
        scripts: HashMap<u64, Script>,
        started: Instant,
        asked: Mutex<Vec<(u64, Duration)>>,
    }

    impl Scripted {
        fn new(scripts: &[(u64, Script)]) -> Scripted {
            Scripted {
                scripts: scripts.iter().copied().collect(),
                started: Instant::now(),
                asked: Mutex::new(Vec::new()),
            }
        }

        fn asked(&self) -> Vec<(u64, Duration)> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl LeafService for Scripted {
        fn ask(&self, node: u64) -> BoxFuture<'_, Result<LeafResponse, ShardError>> {
            self.asked
                .lock()
                .unwrap()
                .push((node, self.started.elapsed()));
            let script = self.scripts[&node];
            Box::pin(async move {
                match script {
                    Script::Answer { after } => {
                        tokio::time::sleep(after).await;
                        // Which replica answered, in a field the test can read.
                        Ok(LeafResponse {
                            dense_seconds: node as f64,
                            ..LeafResponse::default()
                        })
                    }
                    Script::Fail { after } => {
                        tokio::time::sleep(after).await;
                        Err(ShardError::Stopped)
                    }
                }
            })
        }
    }

    const TIMES: HedgeTimes = HedgeTimes {
        hedge_after: Duration::from_millis(100),
        deadline: Duration::from_secs(5),
    };

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    fn answered_by(hedged: &Hedged) -> u64 {
        hedged.outcome.as_ref().expect("an answer").dense_seconds as u64
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_first_replica_is_the_only_one_asked() {
        let replicas = Scripted::new(&[
            (1, Script::Answer { after: ms(20) }),
            (2, Script::Answer { after: ms(1) }),
        ]);
        let hedged = hedged_search(&replicas, &[1, 2], TIMES).await;
        assert_eq!(answered_by(&hedged), 1);
        assert_eq!(hedged.outran, None);
        assert_eq!(replicas.asked(), [(1, ms(0))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_first_replica_is_hedged_after_hedge_after_and_the_hedge_wins() {
        let replicas = Scripted::new(&[
            (1, Script::Answer { after: ms(3000) }),
            (2, Script::Answer { after: ms(30) }),
            (3, Script::Answer { after: ms(1) }),
        ]);
        let started = Instant::now();
        let hedged = hedged_search(&replicas, &[1, 2, 3], TIMES).await;
        assert_eq!(answered_by(&hedged), 2);
        assert_eq!(
            hedged.outran,
            Some(1),
            "the outrun first replica is reported"
        );
        assert_eq!(
            replicas.asked(),
            [(1, ms(0)), (2, ms(100))],
            "one hedge only"
        );
        assert_eq!(started.elapsed(), ms(130));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_retried_once_on_the_next_replica() {
        let replicas = Scripted::new(&[
            (1, Script::Fail { after: ms(10) }),
            (2, Script::Answer { after: ms(10) }),
        ]);
        let hedged = hedged_search(&replicas, &[1, 2], TIMES).await;
        assert_eq!(answered_by(&hedged), 2);
        assert_eq!(hedged.outran, None, "a failed replica is not 'outrun'");
        assert_eq!(replicas.asked(), [(1, ms(0)), (2, ms(10))]);

        // Two failures: the shard fails, naming both replicas; a third is never asked.
        let replicas = Scripted::new(&[
            (1, Script::Fail { after: ms(0) }),
            (2, Script::Fail { after: ms(0) }),
            (3, Script::Answer { after: ms(0) }),
        ]);
        let hedged = hedged_search(&replicas, &[1, 2, 3], TIMES).await;
        let Err(ShardError::Replicas(failures)) = hedged.outcome else {
            panic!("the shard fails");
        };
        let nodes: Vec<u64> = failures.iter().map(|(node, _)| *node).collect();
        assert_eq!(nodes, [1, 2]);
        assert!(failures.iter().all(|(_, e)| e.is_transient()));
        assert_eq!(replicas.asked().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_deadline_the_shard_fails_with_every_asked_replica_timed_out() {
        let replicas = Scripted::new(&[
            (1, Script::Answer { after: ms(60_000) }),
            (2, Script::Answer { after: ms(60_000) }),
        ]);
        let started = Instant::now();
        let hedged = hedged_search(&replicas, &[1, 2], TIMES).await;
        assert_eq!(
            started.elapsed(),
            TIMES.deadline,
            "it gives up at the deadline"
        );
        let error = hedged.outcome.expect_err("the shard fails");
        assert_eq!(
            error.to_string(),
            "replica on node 1: no answer within 5000 ms; replica on node 2: no answer within 5000 ms"
        );
        let ShardError::Replicas(failures) = error else {
            panic!("one failure per replica asked");
        };
        assert!(
            failures
                .iter()
                .all(|(_, e)| matches!(e, ShardError::Timeout(t) if *t == TIMES.deadline))
        );
    }
}
