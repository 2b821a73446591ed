//! `sift-chaos`: the chaos soak's driver (`scripts/chaos.sh` makes the network namespaces and
//! tmpfs mounts, then runs this as root).
//!
//! Five `sift serve` nodes in cluster mode, each in its own network namespace; a seeded
//! nemesis injects one fault at a time (kill -9, SIGSTOP pauses, restarts, minority, majority
//! and bridge partitions, slow links, a full disk) while concurrent clients ingest, delete,
//! search, ask agent sessions and change a KB's settings. Once the faults heal, the checker of
//! `sift_tests::chaos` looks for lost and resurrected documents, non-linearizable metadata,
//! crash loops and replicas that do not converge. It prints and writes a JSON summary and
//! exits 1 on any anomaly.

mod cluster;
mod nemesis;
mod workload;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use sift_tests::chaos::linearizability::{Verdict, check_register};
use sift_tests::chaos::{self, Anomaly, Summary};

use crate::cluster::{Cluster, Layout};
use crate::nemesis::Nemesis;
use crate::workload::{DATA_KB, REGISTER_FIELD, REGISTER_KB, Workload};

/// How long the cluster may take to form, heal or settle before the run says so.
const SETTLE: Duration = Duration::from_secs(180);
/// The configurations the linearizability search may explore.
const CHECK_BUDGET: usize = 5_000_000;

#[derive(Parser)]
#[command(about = "The chaos soak's driver; run it through scripts/chaos.sh")]
struct Args {
    /// How long the nemesis and the workload run.
    #[arg(long)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the JSON summary goes.
    #[arg(long)]
    out: PathBuf,
    /// The `sift` binary the nodes run.
    #[arg(long)]
    binary: PathBuf,
    #[arg(long, default_value = "siftchaos")]
    netns_prefix: String,
    #[arg(long, default_value = "10.77.0")]
    net: String,
    #[arg(long)]
    work: PathBuf,
    #[arg(long, default_value_t = 5)]
    nodes: usize,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let started = Instant::now();
    let layout = Layout {
        binary: args.binary.clone(),
        netns_prefix: args.netns_prefix.clone(),
        net: args.net.clone(),
        work: args.work.clone(),
        nodes: args.nodes,
        model_dir: sift_tests::require_model(),
    };
    let cluster = Cluster::new(layout.clone(), started);
    let urls: Vec<String> = (0..args.nodes).map(|i| layout.url(i)).collect();
    let workload = Workload::new(urls.clone(), started);
    let probe = workload.http.clone();

    // The cluster: node 1 bootstraps, the others join one at a time.
    for (node, url) in urls.iter().enumerate() {
        cluster.start(node);
        if !wait_until(SETTLE, || ready(&probe, url)).await {
            eprintln!("node {} did not become ready", node + 1);
            cluster.stop_all();
            return std::process::ExitCode::from(2);
        }
    }
    if !wait_until(SETTLE, || formed(&probe, &urls)).await {
        eprintln!("the cluster did not form");
        cluster.stop_all();
        return std::process::ExitCode::from(2);
    }
    eprintln!(
        "cluster of {} formed in {:?}",
        args.nodes,
        started.elapsed()
    );
    for body in [
        json!({ "name": DATA_KB, "shards": 2, "replication_factor": 3 }),
        json!({ "name": REGISTER_KB, "shards": 1 }),
    ] {
        let created = wait_until(SETTLE, || async {
            let answer = probe
                .post(format!("{}/v1/kbs", urls[0]))
                .json(&body)
                .send()
                .await;
            answer.is_ok_and(|a| a.status().as_u16() == 201 || a.status().as_u16() == 409)
        })
        .await;
        assert!(created, "creating {body}");
    }
    let initial = probe
        .get(format!("{}/v1/kbs/{REGISTER_KB}", urls[0]))
        .send()
        .await
        .expect("reading the register KB")
        .json::<Value>()
        .await
        .expect("a KB")["settings"][REGISTER_FIELD]
        .as_str()
        .expect("the register's setting")
        .to_string();

    // The supervisor, the workload, the nemesis.
    let supervising = Arc::new(AtomicBool::new(false));
    let supervisor = {
        let cluster = cluster.clone();
        let stop = supervising.clone();
        std::thread::spawn(move || cluster.supervise(&stop))
    };
    let mut clients = Vec::new();
    for client in 0..2 {
        clients.push(tokio::spawn(
            workload
                .clone()
                .ingest(client, args.seed * 100 + client as u64),
        ));
    }
    clients.push(tokio::spawn(workload.clone().delete(args.seed * 100 + 10)));
    for client in 0..2 {
        clients.push(tokio::spawn(
            workload.clone().search(args.seed * 100 + 20 + client),
        ));
    }
    clients.push(tokio::spawn(workload.clone().ask(args.seed * 100 + 30)));
    for client in 0..3 {
        clients.push(tokio::spawn(
            workload
                .clone()
                .register(client, args.seed * 100 + 40 + client as u64),
        ));
    }
    let mut nemesis = Nemesis::new(cluster.clone(), StdRng::seed_from_u64(args.seed));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    while Instant::now() < deadline {
        let quiet = nemesis.quiet();
        tokio::time::sleep(quiet.min(deadline.saturating_duration_since(Instant::now()))).await;
        if Instant::now() >= deadline {
            break;
        }
        let leader = leader_index(&probe, &urls, &layout).await;
        let (_, hold) = tokio::task::block_in_place(|| nemesis.inject(leader));
        tokio::time::sleep(hold.min(deadline.saturating_duration_since(Instant::now()))).await;
        tokio::task::block_in_place(|| nemesis.heal());
    }

    // Heal everything, stop the clients, let the cluster settle.
    tokio::task::block_in_place(|| {
        nemesis.heal();
        cluster.heal();
    });
    workload.stop.store(true, Ordering::Release);
    for client in clients {
        if tokio::time::timeout(Duration::from_secs(15), &mut Box::pin(client))
            .await
            .is_err()
        {
            eprintln!("a client did not stop within 15 s");
        }
    }
    let healed = started.elapsed().as_nanos() as u64;
    eprintln!("faults healed at {:?}; checking", started.elapsed());
    let mut anomalies: Vec<Anomaly> = Vec::new();
    let all_ready = wait_until(SETTLE, || async {
        for url in urls.iter() {
            if !ready(&probe, url).await {
                return false;
            }
        }
        formed(&probe, &urls).await
    })
    .await;
    if !all_ready {
        anomalies.push(Anomaly {
            kind: "not_converged",
            detail: "the cluster did not come back to every node ready and a voter".into(),
        });
    }
    let settled = wait_until(SETTLE, || async {
        let Ok(answer) = probe
            .get(format!("{}/v1/kbs/{DATA_KB}", urls[0]))
            .send()
            .await
        else {
            return false;
        };
        let Ok(kb) = answer.json::<Value>().await else {
            return false;
        };
        sift_tests::in_progress(&kb["documents"]) == 0
    })
    .await;
    if !settled {
        eprintln!("ingestion did not settle within {SETTLE:?}");
    }

    let history = std::mem::take(
        &mut *workload
            .history
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()),
    );
    // Lost and resurrected: every node's list of documents.
    let mut present = HashSet::new();
    let mut failed_documents = 0u64;
    for url in urls.iter() {
        match list_documents(&probe, url).await {
            Some(documents) => {
                for document in documents {
                    if let Some(id) = document["id"].as_str() {
                        if document["status"] == "failed" && !present.contains(id) {
                            failed_documents += 1;
                            let error = document["error"].as_str().unwrap_or_default();
                            // The poison-pill guard fails a document whose processing was cut
                            // by a crash (here, a kill) too often: that is its promise. Any
                            // other reason loses an acknowledged document.
                            if !error.starts_with("crashed_processing") {
                                anomalies.push(Anomaly {
                                    kind: "failed",
                                    detail: format!("acknowledged document {id} failed: {error}"),
                                });
                            }
                        }
                        present.insert(id.to_string());
                    }
                }
            }
            None => anomalies.push(Anomaly {
                kind: "not_converged",
                detail: format!("{url} did not list the documents"),
            }),
        }
    }
    anomalies.extend(chaos::lost(
        &history.acknowledged,
        &history.delete_sent,
        &present,
    ));
    anomalies.extend(chaos::resurrected(&history.deleted, &history.searches));
    for id in history.deleted.keys() {
        if present.contains(id) {
            anomalies.push(Anomaly {
                kind: "resurrected",
                detail: format!("deleted document {id} is listed after the faults healed"),
            });
        }
    }
    // Linearizability of the register.
    let checked = Instant::now();
    let verdict = check_register(&initial, &history.register, CHECK_BUDGET);
    eprintln!(
        "register history of {} operations checked in {:?}: {verdict:?}",
        history.register.len(),
        checked.elapsed()
    );
    let mut undecided = 0;
    match verdict {
        Verdict::Linearizable => {}
        Verdict::Unknown => undecided += 1,
        Verdict::NotLinearizable { stuck_at, ordered } => anomalies.push(Anomaly {
            kind: "linearizability",
            detail: format!(
                "no linearization of the {REGISTER_FIELD} register: {ordered} operations ordered, stuck at {:?}",
                history.register[stuck_at]
            ),
        }),
    }
    // Crash loops.
    anomalies.extend(chaos::crash_loops(
        &cluster.exits(),
        3,
        60_000_000_000,
        healed,
    ));
    // Convergence: the same top-k from every node.
    for query in ["topic1 notes", "topic7 notes", "nodes fail and disks fill"] {
        let last = std::sync::Mutex::new(Vec::new());
        let converged = wait_until(Duration::from_secs(60), || async {
            let mut answers = Vec::new();
            for url in urls.iter() {
                let answer = probe
                    .post(format!("{url}/v1/kbs/{DATA_KB}/search"))
                    .json(&json!({ "query": query, "top_k": 10 }))
                    .send()
                    .await;
                let Ok(answer) = answer else { return false };
                if !answer.status().is_success() {
                    return false;
                }
                let Ok(body) = answer.json::<Value>().await else {
                    return false;
                };
                // A partial answer (a shard failed) says nothing about convergence.
                if body["failed_shards"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
                {
                    return false;
                }
                answers.push(workload::document_ids(&body));
            }
            let same = answers.windows(2).all(|w| w[0] == w[1]);
            *last.lock().unwrap_or_else(|poison| poison.into_inner()) = answers;
            same
        })
        .await;
        if !converged {
            let answers = last
                .into_inner()
                .unwrap_or_else(|poison| poison.into_inner());
            anomalies.push(Anomaly {
                kind: "not_converged",
                detail: format!("the nodes answer {query:?} with different top-10s: {answers:?}"),
            });
        }
    }

    let mut summary = Summary {
        seed: args.seed,
        seconds: args.seconds,
        faults: nemesis.counts.clone(),
        operations: history.operations.clone(),
        undecided_registers: undecided,
        netem: nemesis.netem(),
        ..Summary::default()
    };
    summary.faults.insert(
        "node_starts".into(),
        cluster.starts().saturating_sub(args.nodes as u64),
    );
    summary.record_anomalies(&anomalies);
    summary.elapsed_seconds = started.elapsed().as_secs_f64();
    let mut text = serde_json::to_value(&summary).expect("a summary");
    text["documents"] = json!({
        "acknowledged": history.acknowledged.len(),
        "deleted": history.deleted.len(),
        "failed": failed_documents,
        "searches_checked": history.searches.len(),
        "register_operations": history.register.len(),
    });
    let text = serde_json::to_string_pretty(&text).expect("a summary");
    println!("{text}");
    if let Err(error) = std::fs::write(&args.out, &text) {
        eprintln!("writing {}: {error}", args.out.display());
    }
    supervising.store(true, Ordering::Release);
    let _ = supervisor.join();
    cluster.stop_all();
    if summary.anomaly_total() > 0 {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// Polls `check` every 500 ms until it holds or `limit` passes.
async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn ready(http: &reqwest::Client, url: &str) -> bool {
    http.get(format!("{url}/readyz"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .is_ok_and(|answer| answer.status().is_success())
}

async fn cluster_view(http: &reqwest::Client, url: &str) -> Option<Value> {
    let answer = http
        .get(format!("{url}/v1/cluster"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    answer.json().await.ok()
}

/// Every node sees every node as a voter and the same leader.
async fn formed(http: &reqwest::Client, urls: &[String]) -> bool {
    let mut leaders = HashSet::new();
    for url in urls {
        let Some(view) = cluster_view(http, url).await else {
            return false;
        };
        let voters = view["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| matches!(n["role"].as_str(), Some("leader" | "follower")))
            .count();
        if voters != urls.len() {
            return false;
        }
        match view["leader"].as_u64() {
            Some(leader) => leaders.insert(leader),
            None => return false,
        };
    }
    leaders.len() == 1
}

/// The index of the node some node names leader, if one answers.
async fn leader_index(http: &reqwest::Client, urls: &[String], layout: &Layout) -> Option<usize> {
    for url in urls {
        let Some(view) = cluster_view(http, url).await else {
            continue;
        };
        let leader = view["leader"].as_u64()?;
        let node = view["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["id"].as_u64() == Some(leader))?;
        let listen = node["listen"].as_str()?;
        return (0..layout.nodes).find(|i| listen.starts_with(&format!("{}:", layout.ip(*i))));
    }
    None
}

/// Every document of the data KB on the node at `url`, page by page.
async fn list_documents(http: &reqwest::Client, url: &str) -> Option<Vec<Value>> {
    let mut documents = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("{url}/v1/kbs/{DATA_KB}/documents?limit=1000");
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let mut page = None;
        for _ in 0..20 {
            if let Ok(answer) = http.get(&path).send().await
                && answer.status().is_success()
                && let Ok(body) = answer.json::<Value>().await
            {
                page = Some(body);
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let page = page?;
        documents.extend(page["documents"].as_array().cloned().unwrap_or_default());
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return Some(documents),
        }
    }
}
