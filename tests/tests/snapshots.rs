//! Snapshots: `POST /v1/snapshots` under write load, then `sift restore` into a new data
//! directory, and a node on it gives the same answers.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sift_node::config::Config;
use sift_tests::beir::scifact_slice;
use sift_tests::{ApiClient, InProcessNode, chunk_ids, count, node_binary, require_model};

const WAIT: Duration = Duration::from_secs(180);

/// The documents of the static KB each query's top hits name, with their chunks, in order.
async fn answers(client: &ApiClient, kb: &str, queries: &[String]) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for query in queries {
        let answer = client
            .search(kb, json!({ "query": query, "top_k": 5 }))
            .await;
        all.push(chunk_ids(&answer));
    }
    all
}

async fn chunk_texts(client: &ApiClient, kb: &str, id: &str) -> Vec<String> {
    let answer = client
        .get(&format!("/v1/kbs/{kb}/documents/{id}/chunks"))
        .await
        .expect(200);
    answer["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .map(|chunk| chunk["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn restore_cli(snapshot: &std::path::Path, data_dir: &std::path::Path) -> std::process::Output {
    Command::new(node_binary())
        .arg("restore")
        .arg(snapshot)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("running sift restore")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_under_write_load_restores_with_the_same_answers() {
    let dir = sift_tests::temp_dir();
    let slice = scifact_slice();
    let documents = slice.bulk_documents();
    let queries: Vec<String> = slice
        .queries
        .iter()
        .take(8)
        .map(|q| q.text.clone())
        .collect();

    let node = InProcessNode::start(&dir.path().join("a")).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "static", "shards": 2 }))
        .await;
    client
        .create_kb(json!({ "name": "busy", "shards": 2 }))
        .await;
    client.create_kb(json!({ "name": "other" })).await;
    client.bulk_add("static", &documents[..60]).await;
    let initial = client.bulk_add("busy", &documents[60..90]).await;
    client.bulk_add("other", &documents[190..]).await;
    client.wait_ready("static", 60, WAIT).await;
    client.wait_ready("busy", 30, WAIT).await;
    let reader_key = client.create_key("default", "reader").await;

    // The write load: more documents and deletes of the first ones, acknowledged or not.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let client = client.clone();
        let stop = stop.clone();
        let more = documents[90..190].to_vec();
        let initial = initial.clone();
        tokio::spawn(async move {
            let mut added: Vec<(String, Instant)> = Vec::new();
            let mut deleted: Vec<(String, Instant)> = Vec::new();
            for (round, batch) in more.chunks(5).enumerate() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for id in client.bulk_add("busy", batch).await {
                    added.push((id, Instant::now()));
                }
                if let Some(victim) = initial.get(round) {
                    client
                        .delete(&format!("/v1/kbs/busy/documents/{victim}"))
                        .await
                        .expect(204);
                    deleted.push((victim.clone(), Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (added, deleted)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let snapshot = client
        .post_json("/v1/snapshots", &json!({ "kbs": ["static", "busy"] }))
        .await
        .expect(201);
    let finished = Instant::now();
    stop.store(true, Ordering::SeqCst);
    let (added, deleted) = writer.await.unwrap();
    let id = snapshot["id"].as_str().expect("a snapshot id").to_string();
    let path = std::path::PathBuf::from(snapshot["path"].as_str().expect("its path"));
    assert!(path.join("manifest.json").is_file(), "{snapshot}");
    assert_eq!(snapshot["manifest"]["kbs"].as_array().unwrap().len(), 2);

    // Listed and found by id.
    let listed = client.get("/v1/snapshots").await.expect(200);
    assert_eq!(listed["snapshots"][0]["id"], id.as_str(), "{listed}");
    let found = client.get(&format!("/v1/snapshots/{id}")).await.expect(200);
    assert_eq!(found["manifest"], snapshot["manifest"]);

    // What the original answers, once the load is over.
    let expected_static = answers(&client, "static", &queries).await;
    let mut expected_chunks = HashMap::new();
    for id in &initial[20..] {
        expected_chunks.insert(id.clone(), chunk_texts(&client, "busy", id).await);
    }
    let acknowledged: HashSet<String> = initial
        .iter()
        .cloned()
        .chain(added.iter().map(|(id, _)| id.clone()))
        .collect();
    node.shutdown().await;

    // Restore refuses a directory that is not empty, and a snapshot with a changed byte.
    let busy_dir = dir.path().join("busy-dir");
    std::fs::create_dir_all(&busy_dir).unwrap();
    std::fs::write(busy_dir.join("keep.txt"), b"mine").unwrap();
    let refused = restore_cli(&path, &busy_dir);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(std::fs::read(busy_dir.join("keep.txt")).unwrap(), b"mine");
    let tampered = dir.path().join("tampered");
    copy_dir(&path, &tampered);
    let meta = tampered.join("meta.bin");
    let mut bytes = std::fs::read(&meta).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&meta, bytes).unwrap();
    let refused = restore_cli(&tampered, &dir.path().join("never"));
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("SHA-256"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!dir.path().join("never").join("meta").exists());

    // Restore, then a node on the new directory.
    let restored_dir = dir.path().join("b");
    let output = restore_cli(&path, &restored_dir);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut config = Config::for_test(&restored_dir);
    config.embedding.model_dir = Some(require_model());
    let restored = InProcessNode::start_with(config).await;
    let client = restored.client();
    client.wait_idle("busy", WAIT).await;

    // The static KB answers alike.
    assert_eq!(answers(&client, "static", &queries).await, expected_static);
    let counts = client.counts("static").await;
    assert_eq!(count(&counts, "ready"), 60, "{counts}");

    // The busy KB holds a state between the snapshot's start and its end.
    let counts = client.counts("busy").await;
    assert_eq!(count(&counts, "failed"), 0, "{counts}");
    let present: HashSet<String> = client
        .list_all_documents("busy", 100)
        .await
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(count(&counts, "ready") as usize, present.len(), "{counts}");
    assert!(
        present.is_subset(&acknowledged),
        "only acknowledged documents"
    );
    let deleted_at: HashMap<&str, Instant> =
        deleted.iter().map(|(id, at)| (id.as_str(), *at)).collect();
    for id in &initial {
        match deleted_at.get(id.as_str()) {
            Some(at) if *at < started => assert!(!present.contains(id), "{id} was deleted"),
            Some(_) => {}
            None => assert!(present.contains(id), "{id} was never deleted"),
        }
    }
    for (id, at) in &added {
        if *at < started {
            assert!(
                present.contains(id),
                "{id} was acknowledged before the snapshot"
            );
        }
        if *at > finished {
            assert!(!present.contains(id), "{id} was added after the snapshot");
        }
    }
    for (id, texts) in &expected_chunks {
        if present.contains(id) {
            assert_eq!(&chunk_texts(&client, "busy", id).await, texts, "{id}");
        }
    }

    // The KB left out is not there; the snapshot's keys are.
    client
        .get("/v1/kbs/other")
        .await
        .expect_error(404, "kb_not_found");
    let reader = ApiClient::with_key(&restored.url, Some(&reader_key));
    reader.get("/v1/kbs/static").await.expect(200);
    restored.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_requests_are_checked() {
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start(&dir.path().join("a")).await;
    let client = node.client();
    client.create_kb(json!({ "name": "papers" })).await;
    client
        .post_json("/v1/snapshots", &json!({ "kbs": [] }))
        .await
        .expect_error(400, "invalid_request");
    client
        .post_json("/v1/snapshots", &json!({ "kbs": ["nope"] }))
        .await
        .expect_error(404, "kb_not_found");
    client
        .post_json("/v1/snapshots", &json!({ "kb": ["papers"] }))
        .await
        .expect_error(400, "invalid_json");
    client
        .get("/v1/snapshots/0190-nope")
        .await
        .expect_error(404, "snapshot_not_found");
    client
        .get("/v1/snapshots/..%2F..%2Fetc")
        .await
        .expect_error(404, "snapshot_not_found");
    // Operators only: an editor, and an admin of another tenant, are refused.
    let editor = ApiClient::with_key(
        &node.url,
        Some(&client.create_key("default", "editor").await),
    );
    editor
        .post_json("/v1/snapshots", &json!({ "kbs": ["papers"] }))
        .await
        .expect_error(403, "forbidden");
    client.create_tenant("acme").await;
    let tenant_admin = client.tenant_client("acme", "admin").await;
    tenant_admin
        .post_json("/v1/snapshots", &json!({ "kbs": ["papers"] }))
        .await
        .expect_error(403, "forbidden");
    // Nothing was written by the refused requests; a good one is, and a partial left by a
    // writer that died is removed at the next start.
    let snapshots = dir.path().join("a").join("snapshots");
    assert!(!snapshots.exists() || std::fs::read_dir(&snapshots).unwrap().count() == 0);
    client
        .post_json("/v1/snapshots", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201);
    node.shutdown().await;
    std::fs::create_dir_all(snapshots.join(".partial-dead")).unwrap();
    let node = InProcessNode::start(&dir.path().join("a")).await;
    assert!(!snapshots.join(".partial-dead").exists());
    let listed = node.client().get("/v1/snapshots").await.expect(200);
    assert_eq!(listed["snapshots"].as_array().unwrap().len(), 1, "{listed}");
    node.shutdown().await;
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
