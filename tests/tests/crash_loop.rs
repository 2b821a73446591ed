//! No document can crash-loop a node (issue 14, item 1), with the real `sift serve` binary.
//!
//! A document is durable before it is processed, so one that kills the process would kill it
//! again after every restart. The node counts each start of processing in Raft before the
//! work begins; a document interrupted `ingest_max_attempts` times is failed with
//! `crashed_processing` and the node serves everything else. The poison document here uses the
//! `debug_faults` marker that aborts the process while parsing (a stand-in for a parser bug);
//! the deep-HTML poison that used to do this for real is parsed in `ingestion.rs`.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sift_actors::ingest::pipeline::{CRASHED_PROCESSING, DEBUG_ABORT_MARKER};
use sift_tests::{
    ApiClient, NodeProcess, WAIT, bulk_documents, count, ingest_deadline, short_documents,
    temp_dir, text_document,
};

const KB: &str = "poisoned";
const FAULTS: [(&str, &str); 1] = [("SIFT_DEBUG_FAULTS", "1")];
/// SIGABRT on Linux: what `std::process::abort` raises.
const SIGABRT: i32 = 6;
/// The default `ingest_max_attempts`.
const MAX_ATTEMPTS: usize = 3;

/// A document's record, or None when the node did not answer (it may be dying).
async fn try_document(client: &ApiClient, id: &str) -> Option<Value> {
    let request = client.request(
        reqwest::Method::GET,
        &format!("/v1/kbs/{KB}/documents/{id}"),
    );
    let response = request.send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

async fn statuses(client: &ApiClient, ids: &[String]) -> Option<Vec<Value>> {
    let mut records = Vec::new();
    for id in ids {
        records.push(try_document(client, id).await?);
    }
    Some(records)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_that_kills_the_node_fails_after_its_attempts_and_the_rest_is_served() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let documents = short_documents(9);

    let mut node = NodeProcess::start(&data, &FAULTS);
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
    let earlier = client.bulk_add(KB, &bulk_documents(&documents[..6])).await;
    client.wait_ready(KB, 6, ingest_deadline(6)).await;

    // One job: three good documents around a poison one.
    let mut job = bulk_documents(&documents[6..]);
    job.insert(
        1,
        text_document(
            "poison",
            "Poison",
            &format!("This document kills the process that parses it. {DEBUG_ABORT_MARKER}"),
        ),
    );
    let ids = client.bulk_add(KB, &job).await;
    assert_eq!(ids.len(), 4);
    let poison = ids[1].clone();
    let innocent: Vec<String> = ids.iter().filter(|id| **id != poison).cloned().collect();

    // Restart the node whenever it dies, until the poison document is failed and the others
    // are ready. Every crash is the abort of the fault, and there are no more than the limit.
    // A restarted node resumes the poison document at once, so it may die before it even
    // says it listens: that is a crash too.
    let mut crashes = 0;
    let mut crashed = |status: ExitStatus, node: &NodeProcess| {
        assert_eq!(
            status.signal(),
            Some(SIGABRT),
            "the node died, but not of the injected abort: {status:?}\n{}",
            node.log_tail()
        );
        crashes += 1;
        assert!(
            crashes <= MAX_ATTEMPTS,
            "the node crashed {crashes} times: the poison document is retried without bound\n{}",
            node.log_tail()
        );
    };
    let final_records = 'restarts: loop {
        let started = Instant::now();
        loop {
            if let Some(status) = node.exited() {
                crashed(status, &node);
                node = loop {
                    match NodeProcess::try_start(&data, &FAULTS) {
                        Ok(restarted) => break restarted,
                        Err(status) => crashed(status, &node),
                    }
                };
                continue 'restarts;
            }
            let client = node.client();
            if let (Some(poisoned), Some(others)) = (
                try_document(&client, &poison).await,
                statuses(&client, &innocent).await,
            ) && poisoned["status"] == "failed"
                && others.iter().all(|record| record["status"] == "ready")
            {
                break 'restarts (poisoned, others);
            }
            assert!(
                started.elapsed() < WAIT,
                "the node neither crashed nor finished within {WAIT:?}\n{}",
                node.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(
        crashes, MAX_ATTEMPTS,
        "each of the allowed attempts crashed the node, then it gave up on the document"
    );
    let (poisoned, _) = final_records;
    let reason = poisoned["error"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(CRASHED_PROCESSING),
        "the poison document says why it failed: {poisoned}"
    );

    // The node is stable now: it stays up through a kill -9 and restart, and every other
    // document, old and new, is searchable.
    node.kill9();
    let mut node = NodeProcess::start(&data, &FAULTS);
    let client = node.client();
    let kb = client.get_kb(KB).await;
    assert_eq!(count(&kb["documents"], "ready"), 9, "{kb}");
    assert_eq!(count(&kb["documents"], "failed"), 1, "{kb}");
    for (id, doc) in earlier
        .iter()
        .chain(innocent.iter())
        .zip(documents.iter().take(6).chain(documents[6..].iter()))
    {
        let answer = client
            .search(
                KB,
                json!({
                    "query": doc.title,
                    "top_k": 3,
                    "channels": ["bm25"],
                    "filters": { "document_ids": [id] },
                }),
            )
            .await;
        assert!(
            !answer["hits"].as_array().unwrap().is_empty(),
            "document {id} ({:?}) is searchable: {answer}",
            doc.title
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        node.exited().is_none(),
        "the node keeps running: {}",
        node.log_tail()
    );
    client.get("/healthz").await.expect(200);
}
