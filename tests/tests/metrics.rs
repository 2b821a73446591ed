//! `/metrics` as Prometheus and Grafana see it. After real traffic (ingestion, searches, an
//! agent run, a 404, a refused key), `promtool check metrics` finds nothing to lint on a single
//! node and on both members of a two-process cluster; the request latency has bounded labels;
//! the build, process and capped per-KB metrics are there; every metric the Grafana dashboard
//! (`deploy/grafana/sift.json`) queries exists.
//!
//! `promtool` comes with Debian's `prometheus` package (`.ci/run` installs it). Without it
//! these tests fail and say so, unless `SIFT_TEST_SKIP_PROMTOOL=1` skips only the promtool
//! step: a check that passes silently when its tool is missing would prove nothing.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use sift_models::fake_server::{FakeLlm, react_agent};
use sift_node::config::Config;
use sift_tests::sse::ask;
use sift_tests::{
    ApiClient, InProcessNode, NodeProcess, bulk_documents, free_port, ingest_deadline,
    require_model, short_documents, temp_dir, wait_for_voters,
};

const SEARCH_ROUTE: &str = "/v1/kbs/{kb}/search";

/// Runs `promtool check metrics` on `text` and fails the test with its findings.
fn assert_promtool_clean(what: &str, text: &str) {
    if std::env::var("SIFT_TEST_SKIP_PROMTOOL").is_ok_and(|v| v == "1") {
        eprintln!("SIFT_TEST_SKIP_PROMTOOL=1: not running promtool on {what}");
        return;
    }
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => panic!(
            "promtool could not be started ({error}): install it (Debian: apt-get install -y \
             prometheus, as .ci/run does), or set SIFT_TEST_SKIP_PROMTOOL=1 to skip this check"
        ),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && findings.trim().is_empty(),
        "promtool check metrics on {what}: {}\n{findings}",
        output.status
    );
}

/// The metric names of the samples (`name{labels} value`), `_bucket` and the like included.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// The value of the one sample of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let matches: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(matches.len() <= 1, "{name} {labels:?}: several samples");
    matches.first().copied()
}

/// Every `sift_*` and `process_*` name in the dashboard's queries.
fn dashboard_metrics() -> BTreeSet<String> {
    let path = sift_tests::repo_root().join("deploy/grafana/sift.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "too few queries: {exprs:?}");
    let mut names = BTreeSet::new();
    for expr in exprs {
        for prefix in ["sift_", "process_"] {
            let mut rest = expr.as_str();
            while let Some(at) = rest.find(prefix) {
                let preceded_by_name = rest[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                if !preceded_by_name {
                    names.insert(tail[..end].to_string());
                }
                rest = &tail[end..];
            }
        }
    }
    names
}

/// The `expr` of every target, in panels and rows at any depth.
fn collect_exprs(value: &Value, exprs: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(expr)) = map.get("expr") {
                exprs.push(expr.clone());
            }
            map.values().for_each(|v| collect_exprs(v, exprs));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, exprs)),
        _ => {}
    }
}

/// An agent run to its end (the answer is extractive without a model).
async fn run_agent(client: &ApiClient, kb: &str) {
    let session = client
        .post_json("/v1/sessions", &json!({ "kbs": [kb] }))
        .await
        .expect(201);
    let events = ask(
        client,
        session["id"].as_str().unwrap(),
        "What do the studies find?",
    )
    .await
    .rest()
    .await;
    assert!(
        events.iter().any(|e| e.event == "done"),
        "the run did not end: {events:?}"
    );
}

#[tokio::test]
async fn single_node_metrics_pass_promtool_with_bounded_labels() {
    let dir = temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    // Two KBs: `alpha` gets its own series, `beta` is summed under `_other`.
    config.metrics_max_kbs = 1;
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    for kb in ["alpha", "beta"] {
        client.create_kb(json!({ "name": kb, "shards": 2 })).await;
    }
    let documents = short_documents(5);
    client
        .bulk_add("alpha", &bulk_documents(&documents[..3]))
        .await;
    client
        .bulk_add("beta", &bulk_documents(&documents[3..]))
        .await;
    client.wait_ready("alpha", 3, ingest_deadline(3)).await;
    client.wait_ready("beta", 2, ingest_deadline(2)).await;
    client
        .search("alpha", json!({ "query": documents[0].title, "top_k": 3 }))
        .await;
    run_agent(&client, "alpha").await;
    // Scanners' paths must not become label values.
    client
        .get("/v1/no-such-route/8f2c1a")
        .await
        .expect_error(404, "route_not_found");

    let text = client.metrics_text().await;
    assert_promtool_clean("a single node", &text);

    // Request latency by route template, method and status class.
    let searches = sample(
        &text,
        "sift_http_request_duration_seconds_count",
        &[
            &format!("route=\"{SEARCH_ROUTE}\""),
            "method=\"POST\"",
            "status_class=\"2xx\"",
        ],
    );
    assert!(searches.is_some_and(|n| n >= 1.0), "{text}");
    let unmatched = sample(
        &text,
        "sift_http_request_duration_seconds_count",
        &[
            "route=\"unmatched\"",
            "method=\"GET\"",
            "status_class=\"4xx\"",
        ],
    );
    assert!(unmatched.is_some_and(|n| n >= 1.0), "{text}");
    assert!(!text.contains("no-such-route"), "a raw path became a label");

    // The build, the process and the KBs.
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert_eq!(sample(&text, "sift_build_info", &[&version]), Some(1.0));
    assert!(
        sample(&text, "process_resident_memory_bytes", &[]).is_some_and(|bytes| bytes > 0.0),
        "{text}"
    );
    assert!(sample(&text, "process_open_fds", &[]).is_some_and(|fds| fds > 0.0));
    let alpha = ["tenant=\"default\"", "kb=\"alpha\""];
    let other = ["tenant=\"_other\"", "kb=\"_other\""];
    assert_eq!(
        sample(&text, "sift_knowledge_base_documents", &alpha),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "sift_knowledge_base_documents", &other),
        Some(2.0)
    );
    assert!(
        sample(&text, "sift_knowledge_base_chunks", &alpha).is_some_and(|chunks| chunks >= 3.0)
    );
    let bytes: u64 = documents[..3]
        .iter()
        .map(|d| d.text.len() as u64)
        .sum::<u64>();
    assert_eq!(
        sample(&text, "sift_knowledge_base_bytes", &alpha),
        Some(bytes as f64)
    );
    assert!(!text.contains("kb=\"beta\""), "beta is past the cap");
    node.shutdown().await;
}

#[tokio::test]
async fn cluster_metrics_pass_promtool_and_cover_the_dashboard() {
    let model = FakeLlm::start(react_agent(short_documents(1)[0].title.clone())).await;
    let base_url = model.base_url();
    let env = [
        ("SIFT_LLM_BASE_URL", base_url.as_str()),
        ("SIFT_LLM_MODEL", "fake-model"),
    ];
    let dir = temp_dir();
    let internal: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let secret = "metrics-test-secret";
    let first = NodeProcess::start_member(&dir.path().join("n1"), secret, &internal[0], None, &env);
    let second = NodeProcess::start_member(
        &dir.path().join("n2"),
        secret,
        &internal[1],
        Some(&first.url),
        &env,
    );
    let clients = [first.client(), second.client()];
    wait_for_voters(&clients).await;
    first.require_embedded_model().await;
    let client = &clients[0];
    client
        .create_kb(json!({ "name": "papers", "shards": 2, "replication_factor": 2 }))
        .await;
    let documents = short_documents(4);
    client.bulk_add("papers", &bulk_documents(&documents)).await;
    client.wait_ready("papers", 4, ingest_deadline(4)).await;
    for client in &clients {
        client
            .search("papers", json!({ "query": documents[1].title, "top_k": 3 }))
            .await;
    }
    run_agent(client, "papers").await;
    // a refused key: the errors panel counts it
    ApiClient::with_key(&first.url, None)
        .get("/v1/kbs")
        .await
        .expect(401);

    let mut names = BTreeSet::new();
    for (index, client) in clients.iter().enumerate() {
        let text = client.metrics_text().await;
        assert_promtool_clean(&format!("cluster member {}", index + 1), &text);
        assert!(sample(&text, "sift_raft_term", &[]).is_some_and(|t| t >= 1.0));
        assert_eq!(
            sample(&text, "sift_knowledge_base_documents", &["kb=\"papers\""]),
            Some(4.0),
            "member {}",
            index + 1
        );
        names.extend(sample_names(&text));
    }
    let queried = dashboard_metrics();
    let missing: Vec<&String> = queried.iter().filter(|n| !names.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics no member exposes: {missing:?}"
    );
    // The dashboard has the panels the issue lists.
    for needed in [
        "sift_ingest_documents_total",
        "sift_search_channel_seconds_bucket",
        "sift_agent_runs_total",
        "sift_agent_tokens_total",
        "sift_raft_term",
        "sift_replicas",
        "sift_http_request_duration_seconds_bucket",
    ] {
        assert!(queried.contains(needed), "the dashboard lacks {needed}");
    }
}

/// The metric names the workspace's sources emit (`counter!`, `gauge!`, `histogram!` with a
/// literal name) and those they describe (`describe_*!`), by kind.
#[derive(Default)]
struct SourceMetrics {
    emitted: BTreeSet<(String, &'static str)>,
    described: BTreeSet<String>,
}

fn scan_sources(dir: &std::path::Path, found: &mut SourceMetrics) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scan_sources(&path, found);
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for kind in ["counter", "gauge", "histogram"] {
            let call = format!("{kind}!(");
            let mut from = 0;
            while let Some(at) = text[from..].find(&call) {
                let start = from + at;
                from = start + call.len();
                let rest = text[from..].trim_start();
                let Some(rest) = rest.strip_prefix('"') else {
                    continue; // a name that is not a literal
                };
                let name = rest.split('"').next().unwrap().to_string();
                if !name.starts_with("sift_") {
                    continue;
                }
                if text[..start].ends_with("describe_") {
                    found.described.insert(name);
                } else {
                    found.emitted.insert((name, kind));
                }
            }
        }
    }
}

/// Metrics emitted only on rare paths (a failover, a repair) never reach a scrape after
/// ordinary traffic, so promtool cannot see them: the sources say whether they are described
/// and named by the rules.
#[test]
fn every_emitted_metric_is_described_and_named_with_its_unit() {
    let root = sift_tests::repo_root();
    let mut found = SourceMetrics::default();
    for krate in [
        "api", "parse", "node", "actors", "models", "storage", "cluster",
    ] {
        scan_sources(&root.join(krate).join("src"), &mut found);
    }
    assert!(found.emitted.len() > 50, "too few metrics found");
    let undescribed: Vec<_> = found
        .emitted
        .iter()
        .filter(|(name, _)| !found.described.contains(name))
        .collect();
    assert!(undescribed.is_empty(), "never described: {undescribed:?}");
    for (name, kind) in &found.emitted {
        match *kind {
            "counter" => assert!(name.ends_with("_total"), "counter {name} lacks _total"),
            _ => assert!(!name.ends_with("_total"), "{kind} {name} ends with _total"),
        }
        if *kind == "histogram" {
            // the iterations of an agent run are a count, the one histogram without a unit
            assert!(
                name.ends_with("_seconds")
                    || name.ends_with("_bytes")
                    || name == "sift_agent_iterations",
                "histogram {name} has no unit suffix"
            );
        }
    }
}
