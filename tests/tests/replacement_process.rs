//! Replacement of an absent node's replicas with the real `sift serve` binary (ADR 0012): three
//! processes on loopback, a KB with 3 shards and replication factor 2. A node killed and left
//! down for longer than `replace_after` has its replicas re-created on the other two (the KB
//! back at its replication factor, every document found, the same top 10), without being
//! removed from the cluster; when it returns it drops its stale copies and rebalancing gives
//! it replicas again. (A file of its own: `scripts/test.sh` runs one file's tests at a time, so
//! these processes do not share the machine with the other replication test's.)

use std::collections::BTreeSet;

use serde_json::json;
use sift_tests::{
    ApiClient, NodeProcess, assert_complete, balanced_with, bulk_documents, chunk_ids, eventually,
    free_port, ingest_deadline, short_documents, temp_dir, wait_for_voters,
};

const SECRET: &str = "replacement-process-test-secret";

/// A member that stays away for `replace_after` has its replicas re-created on the other
/// nodes, without being removed from the cluster: the KB is back at its replication factor
/// with every replica active, and answers complete. When the node comes back it drops its
/// stale copies and receives replicas again by rebalancing, with the same top 10.
#[tokio::test]
async fn replicas_of_a_node_away_too_long_are_re_created_elsewhere() {
    let dir = temp_dir();
    let internal: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let data: Vec<_> = (0..3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let env = [
        ("SIFT_REPAIR_INTERVAL_MS", "300"),
        ("SIFT_HEDGE_AFTER_MS", "50"),
        ("SIFT_REPLACE_AFTER_MS", "3000"),
    ];
    let start = |index: usize, join: Option<&str>| {
        NodeProcess::start_member(&data[index], SECRET, &internal[index], join, &env)
    };
    let first = start(0, None);
    first.require_embedded_model().await;
    let joined = first.url.clone();
    let mut nodes = [
        Some(first),
        Some(start(1, Some(&joined))),
        Some(start(2, Some(&joined))),
    ];
    let clients: Vec<ApiClient> = nodes.iter().map(|n| n.as_ref().unwrap().client()).collect();
    let (ids, leader) = wait_for_voters(&clients).await;
    clients[0]
        .create_kb(json!({ "name": "away", "shards": 3, "replication_factor": 2 }))
        .await;
    let documents = short_documents(18);
    clients[0]
        .bulk_add("away", &bulk_documents(&documents))
        .await;
    clients[0].wait_ready("away", 18, ingest_deadline(18)).await;
    let queries: Vec<String> = documents.iter().take(3).map(|d| d.title.clone()).collect();
    let mut before = Vec::new();
    for query in &queries {
        let answer = clients[0]
            .search("away", json!({ "query": query, "top_k": 10 }))
            .await;
        assert_complete(&answer);
        before.push(chunk_ids(&answer));
    }

    // Kill a follower that holds the last shard and leave it down: after replace_after its
    // replicas live elsewhere. (Rebalancing later gives it the first shards back, so its old
    // copy of the last one must leave its disk.)
    let placed = clients[0].placement("away").await;
    let last = *placed.keys().max().unwrap();
    let victim = (0..3)
        .find(|i| ids[*i] != leader && placed[&last].iter().any(|(node, _, _)| *node == ids[*i]))
        .expect("two nodes hold each shard, one of them a follower");
    let victim_id = ids[victim];
    let held_before = placed
        .values()
        .flatten()
        .filter(|(node, _, _)| *node == victim_id)
        .count();
    assert_eq!(held_before, 2, "3 shards x 2 replicas over 3 nodes");
    nodes[victim].as_mut().unwrap().kill9();
    let live: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    let replaced = eventually("the away node's replicas re-created elsewhere", || async {
        let placed = clients[live[0]].placement("away").await;
        placed
            .values()
            .all(|replicas| {
                replicas.len() == 2
                    && replicas
                        .iter()
                        .all(|(node, state, _)| *node != victim_id && state == "active")
            })
            .then_some(placed)
    })
    .await;
    // The node was not removed from the cluster.
    let view = clients[live[0]].get("/v1/cluster").await.expect(200);
    assert!(
        view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == victim_id),
        "{view}"
    );
    // Every replica holds every document of its shard, and every document is found.
    for replicas in replaced.values() {
        assert_eq!(replicas[0].2, replicas[1].2, "{replaced:?}");
    }
    let total: u64 = replaced.values().map(|r| r[0].2.unwrap_or(0)).sum();
    assert_eq!(total, 18, "{replaced:?}");
    for index in &live {
        assert_same_top10(&clients[*index], &queries, &before, "after the replacement").await;
    }

    // The node returns: it holds no replica of its own any more, so rebalancing gives it
    // some (copied, then the busier node's copy dropped); queries answer the same top 10.
    let restarted = start(victim, None);
    let restarted_client = restarted.client();
    nodes[victim] = Some(restarted);
    let settled = eventually("replicas moved back to the returned node", || async {
        let placed = restarted_client.placement("away").await;
        balanced_with(&placed, &ids, 2, victim_id).then_some(placed)
    })
    .await;
    // On disk it keeps exactly the replicas placed on it: the stale copies went.
    let kb_id = restarted_client.get_kb("away").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let placed_here: BTreeSet<String> = settled
        .iter()
        .filter(|(_, replicas)| replicas.iter().any(|(node, _, _)| *node == victim_id))
        .map(|(shard, _)| shard.to_string())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(data[victim].join("shards").join(&kb_id))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        on_disk, placed_here,
        "shard directories of the returned node"
    );
    assert_same_top10(&restarted_client, &queries, &before, "on the returned node").await;
}

/// Each query's top 10 from `client` is complete and the same set of chunks as `before`.
async fn assert_same_top10(
    client: &ApiClient,
    queries: &[String],
    before: &[Vec<String>],
    when: &str,
) {
    for (query, expected) in queries.iter().zip(before) {
        let answer = client
            .search("away", json!({ "query": query, "top_k": 10 }))
            .await;
        assert_complete(&answer);
        assert_eq!(
            chunk_ids(&answer).iter().collect::<BTreeSet<_>>(),
            expected.iter().collect::<BTreeSet<_>>(),
            "top 10 changed {when} for {query:?}"
        );
    }
}
