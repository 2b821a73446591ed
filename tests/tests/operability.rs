//! What an operator relies on around the API: a truthful `/readyz`, request ids, the access
//! log (in JSON on request), and CORS for the configured origins.

use reqwest::Method;
use serde_json::{Value, json};
use sift_node::config::Config;
use sift_node::requests::CorsOrigins;
use sift_tests::{InProcessNode, NodeProcess, temp_dir};

fn check<'a>(ready: &'a Value, name: &str) -> &'a Value {
    ready["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|check| check["name"] == name))
        .unwrap_or_else(|| panic!("no {name} check in {ready}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_each_failing_check() {
    // A node whose embedded model cannot be loaded (damaged files, and no remote embedder)
    // serves, but is not ready: 503, the check named.
    let dir = temp_dir();
    let damaged_model = temp_dir();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::write(damaged_model.path().join(file), b"not a model").unwrap();
    }
    let mut config = Config::for_test(&dir.path().join("data"));
    config.embedding.model_dir = Some(damaged_model.path().to_path_buf());
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client.get("/healthz").await.expect(200);
    let answer = client.get("/readyz").await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    let ready = answer.body;
    assert_eq!(ready["status"], "not_ready", "{ready}");
    assert_eq!(ready["error"]["code"], "not_ready", "{ready}");
    let message = ready["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("not ready: embedding_models: not loaded: all-MiniLM-L6-v2"),
        "{message}"
    );
    assert_eq!(check(&ready, "embedding_models")["ok"], false, "{ready}");
    assert_eq!(check(&ready, "shards")["ok"], true, "{ready}");
    node.shutdown().await;

    // With the model and nothing wrong: 200 and every check passes.
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "probe", "shards": 3 }))
        .await;
    let ready = client.get("/readyz").await.expect(200);
    assert_eq!(ready["status"], "ready", "{ready}");
    let names: Vec<&str> = ready["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|check| check["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["embedding_models", "shards"], "{ready}");
    assert!(
        ready["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|check| check["ok"] == true),
        "{ready}"
    );
    assert!(ready.get("error").is_none(), "{ready}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_or_made() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    let id_of = |answer: &sift_tests::Answer| {
        answer
            .headers
            .get("x-request-id")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };

    let sent = client
        .send(
            client
                .request(Method::GET, "/v1/kbs")
                .header("x-request-id", "client-trace-42"),
        )
        .await;
    assert_eq!(sent.status, 200);
    assert_eq!(id_of(&sent), "client-trace-42");

    // None sent: one is made, a different one for each request.
    let first = id_of(&client.get("/v1/kbs").await);
    let second = id_of(&client.get("/v1/kbs").await);
    assert_eq!(first.len(), 32, "{first:?}");
    assert_ne!(first, second);

    // A 10 KB id (or one with spaces) is not echoed: the request is served under a new one.
    let long = "r".repeat(10 * 1024);
    for bad in [long.as_str(), "two words"] {
        let answer = client
            .send(
                client
                    .request(Method::GET, "/v1/kbs")
                    .header("x-request-id", bad),
            )
            .await;
        assert_eq!(answer.status, 200);
        let id = id_of(&answer);
        assert_eq!(id.len(), 32, "{id:?}");
        assert_ne!(id, bad);
    }

    // Refusals carry one too (an unknown route, a missing key).
    let missing = client.get("/v1/no-such-route").await;
    assert_eq!(missing.status, 404);
    assert_eq!(id_of(&missing).len(), 32);
    let anonymous = sift_tests::ApiClient::with_key(client.url(), None);
    let refused = anonymous.get("/v1/kbs").await;
    assert_eq!(refused.status, 401);
    assert_eq!(id_of(&refused).len(), 32);
    node.shutdown().await;
}

/// Every JSON log line of a node's log file.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_and_handler_logs_carry_the_request_id_in_json() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let mut node = NodeProcess::start(&data, &[("SIFT_LOG_FORMAT", "json")]);
    let client = node.client();
    let created = client
        .send(
            client
                .request(Method::POST, "/v1/kbs")
                .header("x-request-id", "create-kb-1")
                .json(&json!({ "name": "logged" })),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let refused = client
        .send(
            client
                .request(Method::GET, "/v1/kbs/absent")
                .header("x-request-id", "get-absent-1"),
        )
        .await;
    assert_eq!(refused.status, 404);
    let body_bytes = serde_json::to_vec(&refused.body).unwrap().len() as u64;
    let status = node.stop();
    assert!(status.success(), "{status:?}");

    let log = std::fs::read_to_string(node.log_path()).expect("the node's log");
    let lines = json_lines(&log);
    assert!(
        lines.len() >= 5 && lines.len() == log.lines().count(),
        "every log line is one JSON object:\n{log}"
    );
    // The handler's own line carries the id, in the request's span.
    let created_line = lines
        .iter()
        .find(|line| line["fields"]["message"] == "knowledge base created")
        .unwrap_or_else(|| panic!("no creation line in\n{log}"));
    assert_eq!(created_line["span"]["id"], "create-kb-1", "{created_line}");
    assert_eq!(created_line["fields"]["kb"], "logged", "{created_line}");

    let access: Vec<&Value> = lines
        .iter()
        .filter(|line| line["target"] == "sift::access")
        .collect();
    let of = |id: &str| {
        access
            .iter()
            .find(|line| line["span"]["id"] == id)
            .unwrap_or_else(|| panic!("no access line for {id} in\n{log}"))
    };
    let create = &of("create-kb-1")["fields"];
    assert_eq!(create["method"], "POST", "{create}");
    assert_eq!(create["route"], "/v1/kbs", "{create}");
    assert_eq!(create["status"], 201, "{create}");
    assert!(create["bytes"].as_u64().unwrap_or(0) > 0, "{create}");
    assert!(create["duration_ms"].as_f64().is_some(), "{create}");
    assert_eq!(create["complete"], true, "{create}");
    let absent = &of("get-absent-1")["fields"];
    assert_eq!(absent["route"], "/v1/kbs/{kb}", "{absent}");
    assert_eq!(absent["path"], "/v1/kbs/absent", "{absent}");
    assert_eq!(absent["status"], 404, "{absent}");
    assert_eq!(absent["bytes"], body_bytes, "{absent}");
    // Keys never reach the log.
    assert!(
        !log.contains(sift_node::config::TEST_ADMIN_KEY),
        "the admin key is in the log"
    );
}

#[test]
fn an_unknown_log_format_stops_the_start_with_a_message() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let status = match NodeProcess::try_start(&data, &[("SIFT_LOG_FORMAT", "xml")]) {
        Ok(_) => panic!("the node started with SIFT_LOG_FORMAT=xml"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Some(2), "{status:?}");
    let log = std::fs::read_to_string(dir.path().join("data.log")).unwrap_or_default();
    assert!(
        log.contains("SIFT_LOG_FORMAT must be text or json, not \"xml\""),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_the_listed_origins_only() {
    const ALLOWED: &str = "http://app.example.test";
    let dir = temp_dir();
    let mut config = Config::for_test(&dir.path().join("data"));
    config.embedding.model_dir = Some(sift_tests::require_model());
    config.cors = CorsOrigins::parse(&[ALLOWED.to_string()]).unwrap();
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    let anonymous = sift_tests::ApiClient::with_key(client.url(), None);
    let allow_origin = |answer: &sift_tests::Answer| {
        answer
            .headers
            .get("access-control-allow-origin")
            .map(|value| value.to_str().unwrap_or_default().to_string())
    };

    // A preflight from the listed origin is answered without a key.
    let preflight = anonymous
        .send(
            anonymous
                .request(Method::OPTIONS, "/v1/kbs/papers/search")
                .header("origin", ALLOWED)
                .header("access-control-request-method", "POST")
                .header(
                    "access-control-request-headers",
                    "authorization,content-type",
                ),
        )
        .await;
    assert_eq!(preflight.status, 200, "{:?}", preflight.headers);
    assert_eq!(allow_origin(&preflight).as_deref(), Some(ALLOWED));
    let methods = preflight.headers["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");
    let headers = preflight.headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(headers.contains("authorization"), "{headers}");

    // The call itself: the page may read the answer and its request id.
    let listed = client
        .send(
            client
                .request(Method::GET, "/v1/kbs")
                .header("origin", ALLOWED),
        )
        .await;
    assert_eq!(listed.status, 200);
    assert_eq!(allow_origin(&listed).as_deref(), Some(ALLOWED));
    let exposed = listed.headers["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(exposed.contains("x-request-id"), "{exposed}");

    // Another origin gets no grant, for the preflight or the call.
    let evil = "http://evil.example.test";
    let preflight = anonymous
        .send(
            anonymous
                .request(Method::OPTIONS, "/v1/kbs")
                .header("origin", evil)
                .header("access-control-request-method", "POST"),
        )
        .await;
    assert_eq!(allow_origin(&preflight), None, "{:?}", preflight.headers);
    let call = client
        .send(
            client
                .request(Method::GET, "/v1/kbs")
                .header("origin", evil),
        )
        .await;
    assert_eq!(call.status, 200);
    assert_eq!(allow_origin(&call), None);
    node.shutdown().await;

    // Without cors_origins no origin gets a grant, and OPTIONS is an ordinary 405.
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let anonymous = sift_tests::ApiClient::with_key(node.client().url(), None);
    let preflight = anonymous
        .send(
            anonymous
                .request(Method::OPTIONS, "/v1/kbs")
                .header("origin", ALLOWED)
                .header("access-control-request-method", "GET"),
        )
        .await;
    assert_eq!(allow_origin(&preflight), None);
    assert_eq!(preflight.status, 405, "{}", preflight.body);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_held_data_dir_stops_saying_so() {
    let dir = temp_dir();
    let data = dir.path().join("data");
    let mut first = NodeProcess::start(&data, &[]);
    let status = match NodeProcess::try_start(&data, &[]) {
        Ok(_) => panic!("a second node started on a data dir in use"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Some(1), "{status:?}");
    let log = std::fs::read_to_string(first.log_path()).unwrap_or_default();
    let expected = format!(
        "the data directory {} is in use by another sift node (pid {})",
        data.display(),
        first.pid()
    );
    assert!(log.contains(&expected), "{log}");
    // The first one serves on, unharmed.
    first.client().get("/v1/kbs").await.expect(200);
    assert!(first.stop().success());
}
