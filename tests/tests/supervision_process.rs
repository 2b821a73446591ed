//! The node supervisor restarts a reconciler that panics, and the node keeps serving
//! meanwhile: the real `sift serve` binary as a one-member cluster (so it runs a reconciler)
//! with fault injection on. After each crash `sift_actor_restarts_total{actor="reconciler"}`
//! goes up and the reconciler's rounds resume; searches and ingestion answer throughout.

use serde_json::json;
use sift_tests::{
    NodeProcess, bulk_documents, eventually, free_port, hits, ingest_deadline, short_documents,
    temp_dir,
};

const KB: &str = "supervised";

#[tokio::test]
async fn a_panicking_reconciler_is_restarted_and_resumes_while_the_node_serves() {
    let dir = temp_dir();
    let internal = format!("127.0.0.1:{}", free_port());
    let node = NodeProcess::start_member(
        &dir.path().join("data"),
        "supervision-process-test-secret",
        &internal,
        None,
        &[
            ("SIFT_DEBUG_FAULTS", "1"),
            ("SIFT_REPAIR_INTERVAL_MS", "200"),
        ],
    );
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let documents = short_documents(12);
    client.bulk_add(KB, &bulk_documents(&documents[..6])).await;
    client.wait_ready(KB, 6, ingest_deadline(6)).await;

    let rounds = || async { client.metric_sum("sift_reconcile_rounds_total", None).await };
    let restarts = || async {
        client
            .metric_sum("sift_actor_restarts_total", Some("actor=\"reconciler\""))
            .await
    };
    eventually("the reconciler's first rounds", || async {
        (rounds().await >= 2.0).then_some(())
    })
    .await;
    assert_eq!(restarts().await, 0.0, "no restart before the first crash");

    for crash in 1..=2 {
        client
            .post_json("/v1/debug/reconciler/crash", &json!({}))
            .await
            .expect(202);
        eventually("the reconciler's restart", || async {
            (restarts().await >= crash as f64).then_some(())
        })
        .await;
        // It resumes: rounds go on after the restart.
        let after_restart = rounds().await;
        eventually("rounds after the restart", || async {
            (rounds().await >= after_restart + 2.0).then_some(())
        })
        .await;
        // The node serves meanwhile.
        let answer = client
            .search(KB, json!({ "query": documents[0].text, "top_k": 5 }))
            .await;
        assert!(
            !hits(&answer).is_empty(),
            "search answers after crash {crash}: {answer}"
        );
        assert_eq!(answer["failed_shards"], json!([]), "{answer}");
    }
    // Ingestion works after the crashes too.
    client.bulk_add(KB, &bulk_documents(&documents[6..])).await;
    client.wait_ready(KB, 12, ingest_deadline(12)).await;
    assert_eq!(restarts().await, 2.0, "one restart per crash");
}

#[tokio::test]
async fn reconciler_fault_injection_is_refused_without_a_cluster_or_without_faults() {
    let dir = temp_dir();
    let single = NodeProcess::start(&dir.path().join("single"), &[("SIFT_DEBUG_FAULTS", "1")]);
    let answer = single
        .client()
        .post_json("/v1/debug/reconciler/crash", &json!({}))
        .await;
    answer.expect_error(400, "not_clustered");
    let internal = format!("127.0.0.1:{}", free_port());
    let member = NodeProcess::start_member(
        &dir.path().join("member"),
        "supervision-process-test-secret",
        &internal,
        None,
        &[],
    );
    let answer = member
        .client()
        .post_json("/v1/debug/reconciler/crash", &json!({}))
        .await;
    answer.expect_error(404, "not_found");
}
