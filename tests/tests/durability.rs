//! Durability across process restarts, with the real `sift serve` binary: a graceful restart
//! keeps everything, and a SIGKILL never loses an acknowledged document or a ready one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sift_tests::beir::CorpusDocument;
use sift_tests::{
    ApiClient, NodeProcess, WAIT, bulk_documents, chunk_ids, count, in_progress, ingest_deadline,
    short_documents, temp_dir,
};

const KB: &str = "durable";

/// Searches that must answer the same before and after a restart: (query, channels). The
/// queries are the first words of some of the documents' titles, so every channel finds hits.
fn probes(documents: &[CorpusDocument]) -> Vec<(String, Value)> {
    let mut probes = Vec::new();
    for doc in documents.iter().step_by(6) {
        let query: Vec<&str> = doc.title.split_whitespace().take(6).collect();
        for channels in [json!(["dense"]), json!(["bm25"]), Value::Null] {
            probes.push((query.join(" "), channels));
        }
    }
    probes
}

async fn run_probes(client: &ApiClient, probes: &[(String, Value)]) -> Vec<Vec<String>> {
    let mut results = Vec::new();
    for (query, channels) in probes {
        let mut body = json!({ "query": query, "top_k": 10 });
        if !channels.is_null() {
            body["channels"] = channels.clone();
        }
        let answer = client.search(KB, body).await;
        assert_eq!(answer["failed_shards"], json!([]), "{answer}");
        results.push(chunk_ids(&answer));
    }
    results
}

/// Document id -> status, over all pages.
async fn statuses(client: &ApiClient) -> BTreeMap<String, String> {
    client
        .list_all_documents(KB, 100)
        .await
        .into_iter()
        .map(|d| {
            (
                d["id"].as_str().unwrap().to_string(),
                d["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Checks that document `id` is found by a search on `title` restricted to it.
async fn assert_findable(client: &ApiClient, id: &str, title: &str, channel: &str) {
    let answer = client
        .search(
            KB,
            json!({
                "query": title,
                "top_k": 5,
                "channels": [channel],
                "filters": { "document_ids": [id] },
            }),
        )
        .await;
    assert_eq!(answer["failed_shards"], json!([]), "{answer}");
    let hits = answer["hits"].as_array().unwrap();
    assert!(
        !hits.is_empty(),
        "document {id} ({title:?}) is not found by {channel} search: {answer}"
    );
    assert!(
        hits.iter().all(|hit| hit["document_id"] == id),
        "the filter holds: {answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_keeps_documents_and_search_results() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let documents = short_documents(30);

    let mut node = NodeProcess::start(&data, &[]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    client.bulk_add(KB, &bulk_documents(&documents)).await;
    client.wait_ready(KB, 30, ingest_deadline(30)).await;
    let kb_before = client.get_kb(KB).await;
    let statuses_before = statuses(&client).await;
    let probes = probes(&documents);
    let results_before = run_probes(&client, &probes).await;
    assert!(
        results_before.iter().all(|ids| !ids.is_empty()),
        "every probe finds something"
    );

    let status = node.stop();
    assert!(
        status.success(),
        "SIGTERM ends the node cleanly: {status:?}\n{}",
        node.log_tail()
    );

    let node = NodeProcess::start(&data, &[]);
    let client = node.client();
    let kb_after = client.get_kb(KB).await;
    assert_eq!(
        kb_after, kb_before,
        "the KB and its counts survive a restart"
    );
    assert_eq!(count(&kb_after["documents"], "ready"), 30);
    assert_eq!(
        statuses(&client).await,
        statuses_before,
        "every document keeps its status"
    );
    let results_after = run_probes(&client, &probes).await;
    for ((query, channels), (before, after)) in
        probes.iter().zip(results_before.iter().zip(&results_after))
    {
        assert_eq!(
            before, after,
            "top-10 chunk ids of {query:?} on {channels} change across a restart"
        );
    }
}

/// Waits until the KB's counts satisfy `moment`, then SIGKILLs the node; checks that the kill
/// landed while documents were still in flight. Returns the last counts seen.
async fn kill_when(node: &mut NodeProcess, moment: &str, at: impl Fn(&Value) -> bool) -> Value {
    let client = node.client();
    let started = Instant::now();
    let counts = loop {
        let counts = client.counts(KB).await;
        if at(&counts) {
            break counts;
        }
        assert!(
            started.elapsed() < WAIT,
            "no {moment} within {WAIT:?}: {counts}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    node.kill9();
    assert!(
        in_progress(&counts) > 0,
        "the kill must land during ingestion, but everything was done: {counts}"
    );
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_ingestion_loses_no_acknowledged_document() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let documents = short_documents(150);

    let node = NodeProcess::start(&data, &[]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let mut acknowledged: Vec<(String, String)> = Vec::new(); // (id, title)
    for batch in documents.chunks(25) {
        let ids = client.bulk_add(KB, &bulk_documents(batch)).await;
        acknowledged.extend(ids.into_iter().zip(batch.iter().map(|d| d.title.clone())));
    }
    assert_eq!(acknowledged.len(), 150);

    // Kill as soon as ingestion has made progress, while most documents are still in flight;
    // then once more while the restarted node is re-processing the backlog.
    let mut node = node;
    let counts = kill_when(&mut node, "ready document", |c| count(c, "ready") >= 1).await;
    println!("first kill with counts {counts}");
    let mut node = NodeProcess::start(&data, &[]);
    let counts = kill_when(&mut node, "document being embedded", |c| {
        count(c, "embedding") >= 1
    })
    .await;
    println!("second kill with counts {counts}");
    let node = NodeProcess::start(&data, &[]);
    let client = node.client();
    let counts = client.wait_idle(KB, ingest_deadline(150)).await;
    let after = statuses(&client).await;
    assert_eq!(
        after.len(),
        150,
        "exactly the acknowledged documents exist: {counts}"
    );
    for (id, title) in &acknowledged {
        let status = after.get(id).map(String::as_str);
        if status != Some("ready") {
            let record = client.document_answer(KB, id).await;
            panic!(
                "acknowledged document {id} ({title:?}) is {status:?} after recovery: {}",
                record.body
            );
        }
    }
    // Re-running a job after a crash must not duplicate chunks.
    for (id, _) in &acknowledged {
        let record = client.document(KB, id).await;
        let chunks = client
            .get(&format!("/v1/kbs/{KB}/documents/{id}/chunks"))
            .await
            .expect(200);
        let positions: Vec<u64> = chunks["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["position"].as_u64().unwrap())
            .collect();
        let expected: Vec<u64> = (0..record["chunk_count"].as_u64().unwrap()).collect();
        assert!(!expected.is_empty(), "{record}");
        assert_eq!(
            positions, expected,
            "chunks of {id} after recovery: {chunks}"
        );
    }
    for (id, title) in acknowledged.iter().step_by(7).take(22) {
        assert_findable(&client, id, title, "bm25").await;
    }
    for (id, title) in acknowledged.iter().step_by(30) {
        assert_findable(&client, id, title, "dense").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_documents_are_searchable_right_after_kill_9() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let documents = short_documents(52);
    let (first, second) = documents.split_at(12);

    let mut node = NodeProcess::start(&data, &[]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let ready_ids = client.bulk_add(KB, &bulk_documents(first)).await;
    client.wait_ready(KB, 12, ingest_deadline(12)).await;
    // More work in flight when the process dies.
    client.bulk_add(KB, &bulk_documents(second)).await;
    node.kill9();

    let node = NodeProcess::start(&data, &[]);
    let client = node.client();
    // No waiting: what was ready before the kill is served at once.
    for (id, doc) in ready_ids.iter().zip(first) {
        assert_eq!(
            client.document(KB, id).await["status"],
            "ready",
            "{id} stays ready"
        );
        assert_findable(&client, id, &doc.title, "bm25").await;
        assert_findable(&client, id, &doc.title, "dense").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_deletes_survive_kill_9() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let documents = short_documents(10);

    let mut node = NodeProcess::start(&data, &[]);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    client
        .create_kb(json!({ "name": "doomed", "shards": 2 }))
        .await;
    let ids = client.bulk_add(KB, &bulk_documents(&documents)).await;
    client.bulk_add("doomed", &bulk_documents(&documents)).await;
    client.wait_ready(KB, 10, ingest_deadline(10)).await;
    client.wait_ready("doomed", 10, ingest_deadline(10)).await;
    let (victim, victim_title) = (&ids[4], &documents[4].title);
    assert_findable(&client, victim, victim_title, "bm25").await;

    client
        .delete(&format!("/v1/kbs/{KB}/documents/{victim}"))
        .await
        .expect(204);
    client.delete("/v1/kbs/doomed").await.expect(204);
    node.kill9();

    let node = NodeProcess::start(&data, &[]);
    let client = node.client();
    client
        .document_answer(KB, victim)
        .await
        .expect_error(404, "document_not_found");
    for channels in [json!(["dense"]), json!(["bm25"])] {
        let answer = client
            .search(
                KB,
                json!({ "query": victim_title, "top_k": 100, "channels": channels }),
            )
            .await;
        assert!(
            !sift_tests::document_ids(&answer).contains(victim),
            "deleted but returned: {answer}"
        );
    }
    assert_eq!(client.counts(KB).await["total"], 9);
    client
        .get("/v1/kbs/doomed")
        .await
        .expect_error(404, "kb_not_found");
    let kbs = client.get("/v1/kbs").await.expect(200);
    assert_eq!(kbs["kbs"].as_array().unwrap().len(), 1, "{kbs}");
    let fresh = client
        .create_kb(json!({ "name": "doomed", "shards": 2 }))
        .await;
    assert_eq!(fresh["documents"]["total"], 0, "{fresh}");
    let answer = client
        .search(
            "doomed",
            json!({ "query": victim_title, "channels": ["bm25"] }),
        )
        .await;
    assert_eq!(
        answer["hits"],
        json!([]),
        "nothing of the deleted KB comes back: {answer}"
    );
}
