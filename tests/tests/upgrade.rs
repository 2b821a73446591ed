//! Upgrades: every data directory a released format wrote opens with this build, and a data
//! directory of a newer format is refused and left as it is.
//!
//! The fixtures are `tests/fixtures/data-dir/v<N>.tar.gz`, made by
//! `scripts/make-data-dir-fixture.sh` with the build of format N.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use sift_node::config::Config;
use sift_storage::data_dir::{FORMAT_FILE, FORMAT_VERSION};
use sift_tests::{
    ApiClient, InProcessNode, NodeProcess, count, document_ids, repo_root, require_model,
};

/// Unpacks the fixture of format `version` into `into`.
fn unpack(version: u32, into: &Path) {
    let archive = repo_root().join(format!("tests/fixtures/data-dir/v{version}.tar.gz"));
    std::fs::create_dir_all(into).unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(into)
        .status()
        .expect("running tar");
    assert!(status.success(), "unpacking {}", archive.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_one_data_dir_opens_with_everything_it_held() {
    let dir = sift_tests::temp_dir();
    let data = dir.path().join("node");
    unpack(1, &data);
    let mut config = Config::for_test(&data);
    config.embedding.model_dir = Some(require_model());
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();

    // The KB "papers": six SciFact abstracts, the last deleted; every other one found by its
    // title, from both shards.
    let counts = operator.counts("papers").await;
    assert_eq!(count(&counts, "total"), 5, "{counts}");
    assert_eq!(count(&counts, "ready"), 5, "{counts}");
    let documents = operator.list_all_documents("papers", 10).await;
    let mut external: Vec<&str> = documents
        .iter()
        .map(|d| d["external_id"].as_str().expect("an external id"))
        .collect();
    external.sort();
    assert_eq!(external, ["118568", "581832", "654735", "87758", "888896"]);
    for document in &documents {
        let answer = operator
            .search(
                "papers",
                json!({ "query": document["title"], "top_k": 3, "channels": ["bm25"] }),
            )
            .await;
        let found = document_ids(&answer);
        assert_eq!(
            found.first(),
            document["id"].as_str().map(str::to_string).as_ref(),
            "{answer}"
        );
    }
    let deleted = operator
        .search(
            "papers",
            json!({ "query": "Neutrophil extracellular traps oxidized mitochondrial DNA", "top_k": 10 }),
        )
        .await;
    assert!(
        !deleted.to_string().contains("1049501"),
        "the deleted document is gone: {deleted}"
    );

    // The tenant "acme": its KB is its own, its document readable by the group "finance" only.
    operator
        .get("/v1/kbs/notes")
        .await
        .expect_error(404, "kb_not_found");
    let created = operator
        .post_json(
            "/v1/keys",
            &json!({ "name": "acme finance", "role": "reader", "tenant": "acme", "groups": ["finance"] }),
        )
        .await
        .expect(201);
    let finance = ApiClient::with_key(&node.url, created["key"].as_str());
    let answer = finance
        .search("notes", json!({ "query": "heron fund budget", "top_k": 3 }))
        .await;
    assert!(answer.to_string().contains("heron fund"), "{answer}");
    let reader = operator.tenant_client("acme", "reader").await;
    let hidden = reader
        .search("notes", json!({ "query": "heron fund budget", "top_k": 3 }))
        .await;
    assert!(!hidden.to_string().contains("heron"), "{hidden}");

    // It takes new documents, and is stamped with this build's format.
    operator
        .bulk_add(
            "papers",
            &[json!({ "external_id": "new", "text": "a document after the upgrade" })],
        )
        .await;
    operator
        .wait_ready("papers", 6, Duration::from_secs(60))
        .await;
    let format = std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap();
    assert_eq!(format, format!("sift-data-dir {FORMAT_VERSION}\n"));
}

#[test]
fn a_node_refuses_a_data_dir_of_a_newer_format_and_leaves_it_as_it_is() {
    let dir = sift_tests::temp_dir();
    let data = dir.path().join("node");
    unpack(1, &data);
    let newer = format!("sift-data-dir {}\n", FORMAT_VERSION + 1);
    std::fs::write(data.join(FORMAT_FILE), &newer).unwrap();
    let listing = |dir: &Path| {
        let mut names: Vec<String> = walk(dir);
        names.sort();
        names
    };
    let before = listing(&data);
    let Err(status) = NodeProcess::try_start(&data, &[]) else {
        panic!("the node must not start on a data dir of a newer format");
    };
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "format {}, newer than this build's {FORMAT_VERSION}",
            FORMAT_VERSION + 1
        )),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap(),
        newer
    );
    assert_eq!(listing(&data), before, "nothing written into the data dir");
}

/// Every path under `dir` with its size.
fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(format!(
                "{} {}",
                path.display(),
                entry.metadata().unwrap().len()
            ));
        }
    }
    found
}
