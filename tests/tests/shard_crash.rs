//! A shard replica that panics is restarted by its supervisor; meanwhile searches keep
//! answering and say which shard is missing, and afterwards the answers are complete again.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use serde_json::{Value, json};
use sift_tests::{
    ApiClient, NodeProcess, WAIT, bulk_documents, ingest_deadline, short_documents, temp_dir,
};

const KB: &str = "crashy";

/// `sift_actor_restarts_total{actor="shard"}` from the Prometheus text (0 before the first).
async fn shard_restarts(client: &ApiClient) -> f64 {
    let text = client.metrics_text().await;
    text.lines()
        .filter(|line| {
            line.starts_with("sift_actor_restarts_total{") && line.contains("actor=\"shard\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn search_body(query: &str) -> Value {
    json!({ "query": query, "top_k": 20 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_shard_restarts_and_searches_keep_answering() {
    let dir = temp_dir();
    let node = NodeProcess::start(&dir.path().join("data"), &[("SIFT_DEBUG_FAULTS", "1")]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let documents = short_documents(24);
    client.bulk_add(KB, &bulk_documents(&documents)).await;
    client.wait_ready(KB, 24, ingest_deadline(24)).await;

    // Which shard holds which document.
    let shard_of: HashMap<String, u64> = client
        .list_all_documents(KB, 100)
        .await
        .iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap().to_string(),
                d["shard"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        shard_of.values().any(|s| *s == 0) && shard_of.values().any(|s| *s == 1),
        "both shards hold documents"
    );

    let queries: Vec<String> = documents
        .iter()
        .step_by(5)
        .map(|d| {
            d.title
                .split_whitespace()
                .take(5)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let mut baseline = Vec::new();
    let mut shards_hit = HashSet::new();
    for query in &queries {
        let answer = client.search(KB, search_body(query)).await;
        assert_eq!(answer["failed_shards"], json!([]), "{answer}");
        let ids = sift_tests::chunk_ids(&answer);
        assert!(!ids.is_empty(), "{query:?} finds something");
        shards_hit.extend(
            sift_tests::document_ids(&answer)
                .iter()
                .map(|id| shard_of[id]),
        );
        baseline.push(ids);
    }
    assert!(
        shards_hit.contains(&0),
        "the probes find documents of shard 0"
    );

    let restarts_before = shard_restarts(&client).await;
    client
        .post_json(&format!("/v1/debug/kbs/{KB}/shards/0/crash"), &json!({}))
        .await
        .expect(202);

    // Searches keep answering: complete, or partial with shard 0 reported missing, until the
    // replica is back and every probe gives its baseline again.
    let started = Instant::now();
    let mut partial_answers = 0;
    loop {
        let mut complete = true;
        for (query, expected) in queries.iter().zip(&baseline) {
            let answer = client.search(KB, search_body(query)).await;
            let failed = answer["failed_shards"].as_array().unwrap();
            if failed.is_empty() {
                assert_eq!(
                    &sift_tests::chunk_ids(&answer),
                    expected,
                    "a complete answer equals the baseline"
                );
                continue;
            }
            complete = false;
            partial_answers += 1;
            assert_eq!(failed.len(), 1, "only shard 0 fails: {answer}");
            assert_eq!(failed[0]["shard"], 0, "only shard 0 fails: {answer}");
            assert!(
                failed[0]["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "a failed shard says why: {answer}"
            );
            for id in sift_tests::document_ids(&answer) {
                assert_eq!(
                    shard_of[&id], 1,
                    "a partial answer holds only shard 1's documents: {answer}"
                );
            }
        }
        if complete {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "shard 0 did not come back within {WAIT:?}; log:\n{}",
            node.log_tail()
        );
    }
    println!("{partial_answers} partial answers while shard 0 restarted");

    let restarts_after = shard_restarts(&client).await;
    assert!(
        restarts_after >= restarts_before + 1.0,
        "sift_actor_restarts_total{{actor=\"shard\"}} went from {restarts_before} to {restarts_after}"
    );
    // The restarted replica also takes writes.
    let extra = short_documents(25).pop().unwrap();
    let id = client
        .bulk_add(KB, &bulk_documents(&[extra]))
        .await
        .remove(0);
    assert_eq!(client.wait_document(KB, &id, WAIT).await["status"], "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_is_off_by_default() {
    let dir = temp_dir();
    let node = NodeProcess::start(&dir.path().join("data"), &[]);
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let answer = client
        .post_json(&format!("/v1/debug/kbs/{KB}/shards/0/crash"), &json!({}))
        .await;
    answer.expect_error(404, "not_found");
    let restarts = shard_restarts(&client).await;
    assert_eq!(restarts, 0.0, "nothing crashed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_ingested_while_a_shard_restarts_still_end_ready() {
    let dir = temp_dir();
    let node = NodeProcess::start(&dir.path().join("data"), &[("SIFT_DEBUG_FAULTS", "1")]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    // Many small jobs, so that shard writes happen all the time ...
    let documents: Vec<Value> = short_documents(120)
        .iter()
        .map(|d| {
            let text: String = d.text.chars().take(150).collect();
            sift_tests::text_document(&d.id, &d.title, &text)
        })
        .collect();
    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for document in documents {
                ids.extend(client.bulk_add(KB, &[document]).await);
            }
            ids
        })
    };
    // ... while shard 0 crashes four times (under the supervisor's restart limit), each time
    // restarted by its supervisor.
    for _ in 0..4 {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        client
            .post_json(&format!("/v1/debug/kbs/{KB}/shards/0/crash"), &json!({}))
            .await
            .expect(202);
    }
    let ids = writer.await.expect("the writer task");
    client.wait_idle(KB, ingest_deadline(ids.len())).await;
    let failed: Vec<String> = client
        .list_all_documents(KB, 200)
        .await
        .into_iter()
        .filter(|d| d["status"] != "ready")
        .map(|d| format!("{} {}: {}", d["id"], d["status"], d["error"]))
        .collect();
    assert!(
        failed.is_empty(),
        "{} documents did not end ready: {failed:#?}",
        failed.len()
    );
}

/// A replica whose index cannot be opened (its tantivy metadata overwritten) no longer stops
/// the node from starting: the node serves its other KBs and the KB's other shard, says
/// which shard is missing, refuses nothing it stored, and counts the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_shard_does_not_stop_the_node_from_starting() {
    use sift_tests::InProcessNode;
    let dir = temp_dir();
    let data = dir.path().join("data");
    let node = InProcessNode::start(&data).await;
    let client = node.client();
    let damaged = client
        .create_kb(json!({ "name": "damaged", "shards": 2 }))
        .await;
    client.create_kb(json!({ "name": "intact" })).await;
    let documents = short_documents(12);
    client
        .bulk_add("damaged", &bulk_documents(&documents))
        .await;
    client.bulk_add("intact", &bulk_documents(&documents)).await;
    client.wait_ready("damaged", 12, ingest_deadline(12)).await;
    client.wait_ready("intact", 12, ingest_deadline(12)).await;
    let query = documents[0].text.clone();
    let before = client.search("damaged", search_body(&query)).await;
    let total = sift_tests::chunk_ids(&before).len();
    node.shutdown().await;

    let kb_id = damaged["id"].as_str().expect("a KB id");
    let meta = data
        .join("shards")
        .join(kb_id)
        .join("0")
        .join("text")
        .join("meta.json");
    assert!(meta.is_file(), "{} exists", meta.display());
    std::fs::write(&meta, b"{ not tantivy metadata").unwrap();

    let node = InProcessNode::start(&data).await;
    let client = node.client();
    let intact = client.search("intact", search_body(&query)).await;
    assert!(!sift_tests::chunk_ids(&intact).is_empty(), "{intact}");
    let partial = client.search("damaged", search_body(&query)).await;
    let failed = partial["failed_shards"].as_array().expect("failed shards");
    assert_eq!(failed.len(), 1, "{partial}");
    assert_eq!(failed[0]["shard"], 0, "{partial}");
    let results = sift_tests::chunk_ids(&partial);
    assert!(results.len() < total, "shard 1 answers alone: {partial}");
    // The metadata of every document is still there.
    assert_eq!(
        sift_tests::count(&client.counts("damaged").await, "ready"),
        12
    );
    assert!(
        client
            .metrics_text()
            .await
            .lines()
            .any(|line| line.starts_with("sift_shard_open_failures_total ")),
        "the failure is counted"
    );
    // Not ready while a replica it holds cannot be opened: 503, the check and the shard named.
    let ready = client.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert_eq!(ready.body["error"]["code"], "not_ready", "{}", ready.body);
    let message = ready.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("shards: 1 of 4 replicas not open"),
        "{message}"
    );
    assert!(message.contains("damaged/0"), "{message}");
    let shards = ready.body["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|check| check["name"] == "shards"))
        .expect("a shards check");
    assert_eq!(shards["ok"], false, "{}", ready.body);
    node.shutdown().await;
}
