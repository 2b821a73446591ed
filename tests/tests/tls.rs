//! A three-node cluster of real `sift serve` processes with TLS on both listeners (issue 16,
//! item 8): members join and replicate over HTTPS, the CLI talks to an https:// node with
//! `--tls-ca`, plain HTTP gets no answer, SIGHUP reloads the certificate, and no log line of
//! the whole run holds key material (item 9).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sift_node::config::TEST_ADMIN_KEY;
use sift_tests::{ApiClient, document_ids, eventually, free_port, temp_dir, wait_for_voters};
use sift_tests::{NodeProcess, node_binary as binary};

const CLUSTER_SECRET: &str = "tls-test-cluster-secret-0f3a9c";

fn fixture(name: &str) -> PathBuf {
    sift_tests::repo_root()
        .join("tests/fixtures/tls")
        .join(name)
}

/// A client trusting only the test CA, with the server's certificate in each answer.
fn https_client(url: &str, key: Option<&str>) -> ApiClient {
    let roots =
        reqwest::Certificate::from_pem_bundle(&std::fs::read(fixture("ca.crt")).unwrap()).unwrap();
    let http = reqwest::Client::builder()
        .tls_certs_only(roots)
        .tls_info(true)
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .unwrap();
    ApiClient::with_http(url, key, http)
}

/// The DER certificate a fresh connection to `url` is shown.
async fn served_certificate(url: &str) -> Vec<u8> {
    let client = https_client(url, None);
    let response = client
        .http()
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect("an https answer");
    response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("the server's certificate")
        .to_vec()
}

fn der_of(pem_file: &Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_file(pem_file)
        .expect("a PEM certificate")
        .to_vec()
}

/// Copies node-a's certificate and key (and the CA) into `dir`; the env that points at them.
fn tls_files(dir: &Path) -> Vec<(&'static str, String)> {
    std::fs::create_dir_all(dir).unwrap();
    for name in ["node-a.crt", "node-a.key", "ca.crt"] {
        std::fs::copy(fixture(name), dir.join(name)).unwrap();
    }
    let path = |name: &str| dir.join(name).display().to_string();
    vec![
        ("SIFT_TLS_CERT", path("node-a.crt")),
        ("SIFT_TLS_KEY", path("node-a.key")),
        ("SIFT_TLS_CA", path("ca.crt")),
        // Debug logs of Sift's own crates, so the grep below sees the most.
        (
            "RUST_LOG",
            "info,sift_node=debug,sift_actors=debug,sift_cluster=debug".to_string(),
        ),
    ]
}

fn start_member(dir: &Path, internal: &str, join: Option<&str>) -> NodeProcess {
    let env = tls_files(&dir.join("tls"));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    NodeProcess::start_member(&dir.join("data"), CLUSTER_SECRET, internal, join, &env)
}

/// `sift` as a client of `url`, with `extra` arguments first; its exit and output.
fn cli(url: &str, key: &str, extra: &[&str], args: &[&str]) -> (bool, String) {
    let output = Command::new(binary())
        .args(["--node", url, "--api-key", key])
        .args(extra)
        .args(args)
        .env_remove("SIFT_TLS_CA")
        .env_remove("SIFT_NODE")
        .env_remove("SIFT_API_KEY")
        .output()
        .expect("running the CLI");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_joins_replicates_reloads_and_logs_no_secret() {
    let dir = temp_dir();
    let internal: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let first = start_member(&dir.path().join("n0"), &internal[0], None);
    assert!(first.url.starts_with("https://"), "{}", first.url);
    let second = start_member(&dir.path().join("n1"), &internal[1], Some(&first.url));
    let third = start_member(&dir.path().join("n2"), &internal[2], Some(&first.url));
    let mut nodes = [first, second, third];
    let clients: Vec<ApiClient> = nodes
        .iter()
        .map(|node| https_client(&node.url, Some(TEST_ADMIN_KEY)))
        .collect();
    let (ids, leader) = wait_for_voters(&clients).await;
    let leader_index = ids.iter().position(|id| *id == leader).unwrap();
    let follower = (leader_index + 1) % 3;

    // A tenant key, a KB replicated on every node, a document: written through the leader,
    // found through a follower (Raft and shard requests between members go over TLS).
    let operator = &clients[leader_index];
    operator.create_tenant("acme").await;
    let editor_key = operator.create_key("acme", "editor").await;
    let editor = https_client(&nodes[leader_index].url, Some(&editor_key));
    editor
        .create_kb(json!({ "name": "docs", "shards": 2, "replication_factor": 3 }))
        .await;
    let ids = editor
        .bulk_add(
            "docs",
            &[json!({ "external_id": "tls-1", "title": "Tern migration",
                      "text": "The arctic tern migrates from pole to pole every year." })],
        )
        .await;
    let on_follower = https_client(&nodes[follower].url, Some(&editor_key));
    found_first(&on_follower, "arctic tern", &ids[0]).await;

    // Plain HTTP to either port gets no HTTP answer.
    let plain_public = nodes[0].url.replacen("https://", "http://", 1);
    assert!(
        reqwest::get(format!("{plain_public}/healthz"))
            .await
            .is_err()
    );
    assert!(
        reqwest::get(format!("http://{}/internal/v1/health", internal[0]))
            .await
            .is_err()
    );

    // The CLI: with --tls-ca it lists the KB; without, the system roots refuse the
    // certificate and it exits non-zero.
    let url = nodes[follower].url.clone();
    let ca = fixture("ca.crt").display().to_string();
    let (ok, text) = cli(&url, &editor_key, &["--tls-ca", &ca], &["kb", "list"]);
    assert!(ok && text.contains("docs"), "{text}");
    let (ok, text) = cli(&url, &editor_key, &[], &["kb", "list"]);
    assert!(!ok, "{text}");

    // SIGHUP: node 0 serves node-b's certificate to new connections once its files change.
    let tls_dir = dir.path().join("n0/tls");
    assert_eq!(
        served_certificate(&nodes[0].url).await,
        der_of(&fixture("node-a.crt"))
    );
    // A broken key first: the reload fails and the certificate in use stays.
    std::fs::write(tls_dir.join("node-a.key"), "not a key").unwrap();
    hangup(&nodes[0]);
    eventually("the failed reload logged", || async {
        std::fs::read_to_string(&nodes[0].log_path)
            .unwrap()
            .contains("TLS certificate not reloaded")
            .then_some(())
    })
    .await;
    assert_eq!(
        served_certificate(&nodes[0].url).await,
        der_of(&fixture("node-a.crt"))
    );
    std::fs::copy(fixture("node-b.crt"), tls_dir.join("node-a.crt")).unwrap();
    std::fs::copy(fixture("node-b.key"), tls_dir.join("node-a.key")).unwrap();
    hangup(&nodes[0]);
    let renewed = der_of(&fixture("node-b.crt"));
    let node0 = nodes[0].url.clone();
    eventually("the renewed certificate served", || async {
        (served_certificate(&node0).await == renewed).then_some(())
    })
    .await;
    // The cluster still replicates through node 0 after the reload.
    let through_renewed = https_client(&node0, Some(&editor_key));
    let more = through_renewed
        .bulk_add(
            "docs",
            &[json!({ "external_id": "tls-2", "title": "Swift flight",
                      "text": "The common swift stays airborne for ten months." })],
        )
        .await;
    found_first(&on_follower, "common swift airborne", &more[0]).await;

    // No log line of the run holds a key, the cluster secret or a private key.
    for node in &mut nodes {
        node.stop();
    }
    let admin_secret = TEST_ADMIN_KEY.rsplit('-').next().unwrap();
    let editor_secret = editor_key.rsplit('-').next().unwrap();
    let private_key_lines: Vec<String> = ["node-a.key", "node-b.key"]
        .iter()
        .flat_map(|name| {
            std::fs::read_to_string(fixture(name))
                .unwrap()
                .lines()
                .filter(|line| !line.starts_with("-----"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut lines = 0;
    for node in &nodes {
        let log = std::fs::read_to_string(&node.log_path).unwrap();
        lines += log.lines().count();
        for secret in [admin_secret, editor_secret, CLUSTER_SECRET]
            .into_iter()
            .chain(private_key_lines.iter().map(String::as_str))
        {
            assert!(
                !log.contains(secret),
                "{} holds key material",
                node.log_path.display()
            );
        }
    }
    assert!(
        lines > 50,
        "the logs are too short to mean anything: {lines} lines"
    );
}

/// Waits until a BM25 search for `query` through `client` ranks `document` first.
async fn found_first(client: &ApiClient, query: &str, document: &str) {
    eventually("the document searchable through a follower", || async {
        let answer = client
            .search_answer(
                "docs",
                json!({ "query": query, "channels": ["bm25"], "top_k": 3 }),
            )
            .await;
        let first = document_ids(&answer.body).into_iter().next();
        (answer.status == 200 && first.as_deref() == Some(document)).then_some(())
    })
    .await;
}

fn hangup(node: &NodeProcess) {
    let sent = Command::new("kill")
        .args(["-HUP", &node.pid().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success());
}
