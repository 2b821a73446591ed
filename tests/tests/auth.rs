//! API keys on the public API: the admin key a new node makes, refusals of missing and bad
//! keys, roles, revocation and expiry, and `auth = "off"`.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use serde_json::{Value, json};
use sift_node::config::{Config, TEST_ADMIN_KEY};
use sift_tests::{ApiClient, InProcessNode, NodeProcess, require_model};

/// A well-formed key that no node has.
const UNKNOWN_KEY: &str = "sk-sift-0123456789ab-0123456789abcdef0123456789abcdef0123456789abcdef";

/// A raw GET with `authorization` as the header's bytes (or no header).
async fn get_with(url: &str, authorization: Option<&[u8]>) -> (u16, Option<String>, Value) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(bytes) = authorization {
        request = request.header(AUTHORIZATION, HeaderValue::from_bytes(bytes).unwrap());
    }
    let response = request.send().await.expect("reaching the node");
    let status = response.status().as_u16();
    let challenge = response
        .headers()
        .get(WWW_AUTHENTICATE)
        .map(|value| value.to_str().unwrap().to_string());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, challenge, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_makes_its_admin_key_and_refuses_requests_without_a_good_one() {
    let dir = sift_tests::temp_dir();
    let data = dir.path().join("node");
    // No SIFT_ADMIN_KEY: the node makes a key and writes it to DATA_DIR/admin.key.
    let node = NodeProcess::start(&data, &[("SIFT_ADMIN_KEY", "")]);
    let path = data.join("admin.key");
    let key = std::fs::read_to_string(&path)
        .expect("the node wrote admin.key")
        .trim()
        .to_string();
    assert!(key.starts_with("sk-sift-"), "{key}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "admin.key is private");
    }
    let kbs = format!("{}/v1/kbs", node.url);

    // The probes need no key; readiness says auth is on.
    let ready = ApiClient::with_key(&node.url, None)
        .get("/readyz")
        .await
        .expect(200);
    assert_eq!(ready["auth"], "on");
    ApiClient::with_key(&node.url, None)
        .get("/healthz")
        .await
        .expect(200);

    // No header, the wrong scheme, a malformed key, an unknown key, the right id with the
    // wrong secret, non-ASCII bytes, a 16 KB header: 401 with a JSON body, nothing served.
    let (status, challenge, body) = get_with(&kbs, None).await;
    assert_eq!((status, challenge.as_deref()), (401, Some("Bearer")));
    assert_eq!(body["error"]["code"], "missing_api_key", "{body}");
    let (id, _) = key["sk-sift-".len()..].split_once('-').unwrap();
    let wrong_secret = format!("Bearer sk-sift-{id}-{}", "0".repeat(48));
    let long = format!("Bearer {}", "a".repeat(16 * 1024));
    let basic = format!("Basic {key}");
    let bad: [&[u8]; 7] = [
        basic.as_bytes(),
        b"Bearer sk-sift-nope",
        format!("Bearer {UNKNOWN_KEY}").as_bytes().to_vec().leak(),
        wrong_secret.as_bytes(),
        "Bearer sk-sift-\u{e9}\u{e9}".as_bytes(),
        long.as_bytes(),
        b"Bearer",
    ];
    for authorization in bad {
        let (status, _, body) = get_with(&kbs, Some(authorization)).await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    }

    // The key works, from the API and from the CLI (which finds admin.key by SIFT_DATA_DIR).
    let client = ApiClient::with_key(&node.url, Some(&key));
    client.create_kb(json!({ "name": "papers" })).await;
    let output = tokio::process::Command::new(sift_tests::node_binary())
        .env_remove("SIFT_API_KEY")
        .env("SIFT_DATA_DIR", &data)
        .args(["--node", &node.url, "kb", "list"])
        .output()
        .await
        .expect("running sift kb list");
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(listed.contains("papers"), "{listed}");

    // A restart keeps the key and makes no other.
    let mut node = node;
    assert!(node.stop().success());
    let mut node = NodeProcess::start(&data, &[("SIFT_ADMIN_KEY", "")]);
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), key);
    let keys = ApiClient::with_key(&node.url, Some(&key))
        .get("/v1/keys")
        .await
        .expect(200);
    assert_eq!(keys["keys"].as_array().unwrap().len(), 1, "{keys}");

    // No key material in the node's log, only the public id.
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    let secret = &key[key.len() - 48..];
    assert!(!log.contains(secret), "the secret is in the log");
    assert!(log.contains(id), "the key's id is logged when it is made");
    assert!(node.stop().success());
}

async fn admin(node: &InProcessNode) -> ApiClient {
    let client = node.client();
    client.create_kb(json!({ "name": "papers" })).await;
    client
}

/// Makes a key with `role` through the admin client: (its full text, its id).
async fn new_key(admin: &ApiClient, role: &str, expires_at_ms: Option<u64>) -> (String, String) {
    let mut body = json!({ "name": format!("a {role}"), "role": role });
    if let Some(at) = expires_at_ms {
        body["expires_at_ms"] = json!(at);
    }
    let created = admin.post_json("/v1/keys", &body).await.expect(201);
    (
        created["key"].as_str().unwrap().to_string(),
        created["id"].as_str().unwrap().to_string(),
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_carry_roles_and_are_refused_once_revoked_or_expired() {
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let admin = admin(&node).await;
    let (reader_key, reader_id) = new_key(&admin, "reader", None).await;
    let (editor_key, _) = new_key(&admin, "editor", None).await;
    let reader = ApiClient::with_key(&node.url, Some(&reader_key));
    let editor = ApiClient::with_key(&node.url, Some(&editor_key));

    // A reader reads and searches; it cannot change KBs or touch admin routes.
    reader.get("/v1/kbs/papers").await.expect(200);
    reader
        .post_json(
            "/v1/kbs/papers/search",
            &json!({ "query": "anything", "channels": ["bm25"] }),
        )
        .await
        .expect(200);
    reader
        .post_json("/v1/sessions", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201);
    reader.get("/metrics").await.expect(200);
    for (method, path, body) in [
        ("POST", "/v1/kbs", json!({ "name": "mine" })),
        ("PATCH", "/v1/kbs/papers", json!({ "chunk_tokens": 64 })),
        (
            "POST",
            "/v1/kbs/papers/documents",
            json!({ "documents": [{ "text": "x" }] }),
        ),
        (
            "POST",
            "/v1/keys",
            json!({ "name": "escalate", "role": "admin" }),
        ),
        ("DELETE", "/v1/kbs/papers", Value::Null),
        ("GET", "/v1/keys", Value::Null),
        ("GET", "/v1/cluster", Value::Null),
    ] {
        let request = reader.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            path,
        );
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer = reader.send(request).await;
        let message = answer.expect_error(403, "forbidden");
        assert!(message.contains("role"), "{method} {path}: {message}");
    }
    // An editor changes KBs but is not an admin.
    editor
        .post_json("/v1/kbs", &json!({ "name": "edited" }))
        .await
        .expect(201);
    editor
        .post_json("/v1/keys", &json!({ "name": "escalate", "role": "admin" }))
        .await
        .expect_error(403, "forbidden");
    assert_eq!(
        admin.get("/v1/kbs").await.expect(200)["kbs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Lists never show a secret or its hash.
    let keys = admin.get("/v1/keys").await.expect(200);
    let text = keys.to_string();
    for key in [&reader_key, &editor_key] {
        assert!(!text.contains(&key[key.len() - 48..]), "{text}");
    }
    assert!(!text.contains("sha256"), "{text}");
    assert_eq!(keys["keys"].as_array().unwrap().len(), 3); // the test admin key and two

    // Bad key requests change nothing.
    for (body, code) in [
        (json!({ "name": "x", "role": "root" }), "invalid_role"),
        (json!({ "name": "  ", "role": "reader" }), "invalid_name"),
        (
            json!({ "name": "x\u{0}y", "role": "reader" }),
            "invalid_name",
        ),
        (
            json!({ "name": "x".repeat(10_000), "role": "reader" }),
            "invalid_name",
        ),
        (
            json!({ "name": "x", "role": "reader", "expires_at_ms": 1 }),
            "invalid_expiry",
        ),
        (
            json!({ "name": "x", "role": "reader", "scope": "all" }),
            "invalid_json",
        ),
    ] {
        admin
            .post_json("/v1/keys", &body)
            .await
            .expect_error(400, code);
    }
    admin
        .delete("/v1/keys/0123456789ab")
        .await
        .expect_error(404, "api_key_not_found");
    assert_eq!(
        admin.get("/v1/keys").await.expect(200)["keys"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // Revoked: refused at once, and says so (the secret was right).
    let revoked = admin
        .delete(&format!("/v1/keys/{reader_id}"))
        .await
        .expect(200);
    assert!(revoked["revoked_at_ms"].as_u64().is_some(), "{revoked}");
    reader
        .get("/v1/kbs")
        .await
        .expect_error(401, "revoked_api_key");

    // Expired: works until its time, then refused.
    let (soon_key, _) = new_key(&admin, "reader", Some(now_ms() + 1_500)).await;
    let soon = ApiClient::with_key(&node.url, Some(&soon_key));
    soon.get("/v1/kbs").await.expect(200);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    soon.get("/v1/kbs")
        .await
        .expect_error(401, "expired_api_key");

    // The test admin key still works; a well-formed unknown one does not.
    admin.get("/v1/kbs").await.expect(200);
    ApiClient::with_key(&node.url, Some(UNKNOWN_KEY))
        .get("/v1/kbs")
        .await
        .expect_error(401, "invalid_api_key");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_off_every_request_is_served_and_readyz_says_so() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.auth = sift_node::auth::AuthMode::Off;
    let node = InProcessNode::start_with(config).await;
    let anonymous = ApiClient::with_key(&node.url, None);
    assert_eq!(anonymous.get("/readyz").await.expect(200)["auth"], "off");
    anonymous
        .post_json("/v1/kbs", &json!({ "name": "open" }))
        .await
        .expect(201);
    anonymous.get("/v1/keys").await.expect(200);
    assert!(
        !dir.path().join("node").join("admin.key").exists(),
        "no key is made with auth off"
    );
    // The test key is ignored, not refused.
    ApiClient::with_key(&node.url, Some(TEST_ADMIN_KEY))
        .get("/v1/kbs")
        .await
        .expect(200);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_runs_are_private_to_their_key() {
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let admin = admin(&node).await;
    let (alice_key, _) = new_key(&admin, "reader", None).await;
    let (bob_key, _) = new_key(&admin, "editor", None).await;
    let alice = ApiClient::with_key(&node.url, Some(&alice_key));
    let bob = ApiClient::with_key(&node.url, Some(&bob_key));

    let session = alice
        .post_json("/v1/sessions", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201);
    let id = session["id"].as_str().unwrap().to_string();
    let events = sift_tests::sse::ask(&alice, &id, "what is in here?")
        .await
        .rest()
        .await;
    let run = events[0].data["run_id"].as_str().unwrap().to_string();
    assert_eq!(events.last().unwrap().event, "done");

    // Alice sees her session and its run; an admin sees it too.
    let ids = |page: Value| sift_tests::session_ids(&page);
    assert_eq!(
        ids(alice.get("/v1/sessions").await.expect(200)),
        vec![id.clone()]
    );
    assert_eq!(
        ids(admin.get("/v1/sessions").await.expect(200)),
        vec![id.clone()]
    );
    alice
        .get(&format!("/v1/sessions/{id}/messages"))
        .await
        .expect(200);
    alice.get(&format!("/v1/runs/{run}")).await.expect(200);

    // Bob (an editor, not an admin) cannot tell it exists: the same 404 as for none.
    assert!(ids(bob.get("/v1/sessions").await.expect(200)).is_empty());
    for path in [
        format!("/v1/sessions/{id}"),
        format!("/v1/sessions/{id}/messages"),
    ] {
        bob.get(&path).await.expect_error(404, "session_not_found");
    }
    bob.post_json(
        &format!("/v1/sessions/{id}/messages"),
        &json!({ "content": "hello?" }),
    )
    .await
    .expect_error(404, "session_not_found");
    bob.delete(&format!("/v1/sessions/{id}"))
        .await
        .expect_error(404, "session_not_found");
    for path in [format!("/v1/runs/{run}"), format!("/v1/runs/{run}/events")] {
        bob.get(&path).await.expect_error(404, "run_not_found");
    }
    bob.post_json(&format!("/v1/runs/{run}/stop"), &json!({}))
        .await
        .expect_error(404, "run_not_found");

    // Nothing of Alice's changed.
    let turns = alice
        .get(&format!("/v1/sessions/{id}/messages"))
        .await
        .expect(200);
    assert_eq!(turns["messages"].as_array().unwrap().len(), 1);
    node.shutdown().await;
}

/// Request rates per key and per tenant: a key gets its burst, then 429 `rate_limited` with
/// `Retry-After`; other keys have their own buckets, and a tenant's keys share the tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_tenants_are_rate_limited() {
    use sift_node::limits::Rate;
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    // One request a minute with a burst of 3 per key, 4 per tenant: nothing refills within
    // the test.
    config.rate_per_key = Rate::new(1, Some(3));
    config.rate_per_tenant = Rate::new(1, Some(4));
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    let mut keys = Vec::new();
    for n in 0..2 {
        let created = operator
            .post_json(
                "/v1/keys",
                &json!({ "name": format!("acme {n}"), "role": "reader", "tenant": "acme" }),
            )
            .await
            .expect(201);
        keys.push(created["key"].as_str().unwrap().to_string());
    }
    // The operator used its burst of 3; its next request waits.
    let refused = operator.get("/v1/kbs").await;
    let retry_after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    refused.expect_error(429, "rate_limited");

    // acme's first key: 3 requests, then its own bucket is empty.
    let first = ApiClient::with_key(&node.url, Some(&keys[0]));
    for _ in 0..3 {
        first.get("/v1/kbs").await.expect(200);
    }
    let message = first.get("/v1/kbs").await.expect_error(429, "rate_limited");
    assert!(message.contains("key"), "{message}");
    // The second key has a full bucket of its own, but acme's holds one more request.
    let second = ApiClient::with_key(&node.url, Some(&keys[1]));
    second.get("/v1/kbs").await.expect(200);
    let message = second
        .get("/v1/kbs")
        .await
        .expect_error(429, "rate_limited");
    assert!(message.contains("tenant"), "{message}");
    // Without a key there is no bucket to take from: 401 as always.
    ApiClient::with_key(&node.url, None)
        .get("/v1/kbs")
        .await
        .expect_error(401, "missing_api_key");
}
