//! Metadata consensus over the real internal transport: a 3-node cluster on loopback HTTP/2,
//! each node with its own sled directory. Prints proposals/s and latency at concurrency 1, 16
//! and 64 (proposals sent to the leader), then how fast a follower that fell behind catches up
//! by snapshot, and how long electing a new leader takes after the leader dies.
//!
//! `cargo bench -p sift-cluster --features testing --bench raft_http`
//!
//! `SIFT_BENCH_PROPOSALS` sets the proposals per concurrency level (default 2000).

use std::time::{Duration, Instant};

use sift_cluster::raft::RaftConfig;
use sift_cluster::testing::{HttpCluster, create_kb};

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    sorted[((sorted.len() as f64 * fraction) as usize).min(sorted.len() - 1)]
}

async fn run() {
    let total: usize = std::env::var("SIFT_BENCH_PROPOSALS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2000);
    let mut cluster = HttpCluster::start_with(&[1, 2, 3], 1024 * 1024, |id| RaftConfig {
        compact_threshold: 2_000,
        compact_keep: 100,
        ..RaftConfig::new(id)
    })
    .await;
    let leader = cluster.leader().await;
    let handle = cluster.nodes[&leader].raft.handle().clone();
    for concurrency in [1usize, 16, 64] {
        let started = Instant::now();
        let mut latencies = Vec::with_capacity(total);
        let mut next = 0;
        while next < total {
            let batch: Vec<_> = (next..(next + concurrency).min(total))
                .map(|i| {
                    let handle = handle.clone();
                    let proposal = create_kb(&format!("c{concurrency}-{i}"));
                    tokio::spawn(async move {
                        let at = Instant::now();
                        handle
                            .propose_proposal(proposal)
                            .await
                            .expect("a proposal to the leader");
                        at.elapsed()
                    })
                })
                .collect();
            next += batch.len();
            for task in batch {
                latencies.push(task.await.expect("a proposal task"));
            }
        }
        let elapsed = started.elapsed();
        latencies.sort();
        println!(
            "concurrency {concurrency}: {:.0} ops/s, p50 {:?}, p99 {:?}",
            total as f64 / elapsed.as_secs_f64(),
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99)
        );
    }
    let follower = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    cluster.kill(follower);
    for i in 0..2500 {
        cluster.write(&create_kb(&format!("more-{i}"))).await;
    }
    let snapshot_bytes = cluster.nodes[&leader]
        .store
        .export_state()
        .expect("the leader's state")
        .len();
    let started = Instant::now();
    cluster.restart(follower).await;
    cluster.converged().await;
    let caught_up = started.elapsed();
    println!(
        "follower caught up by snapshot ({snapshot_bytes} bytes of state) in {caught_up:?}: {:.1} MB/s",
        snapshot_bytes as f64 / 1e6 / caught_up.as_secs_f64()
    );
    let started = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    println!(
        "new leader {new_leader} {:?} after killing leader {leader} (tick 100 ms, election timeout 1-2 s)",
        started.elapsed()
    );
}

fn main() {
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run());
}
