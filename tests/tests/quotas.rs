//! Quotas: the bytes and the number of documents a tenant may hold, and the agent runs one
//! key may have in flight. Past either, a 4xx with its own code; nothing already stored changes.
//! A tenant's own limits (`PUT /v1/tenants/{name}/limits`) replace the node-wide ones for it.
//! A KB's answer shows the bytes quotas count (`stored_bytes`) and its chunks.

use std::time::Duration;

use serde_json::{Value, json};
use sift_models::fake_server::{FakeLlm, FakeReply};
use sift_models::llm::config::ProviderConfig;
use sift_node::config::Config;
use sift_tests::sse::ask;
use sift_tests::{ApiClient, InProcessNode, count, require_model};

/// A node whose model never answers, so that a run stays in flight until it is stopped.
fn hanging_model_config(dir: &tempfile::TempDir, fake: &FakeLlm) -> Config {
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    let mut provider = ProviderConfig::openai(fake.base_url(), "fake-model", None);
    provider.max_retries = 0;
    provider.first_token_timeout_ms = 60_000;
    config.llm.providers = vec![provider];
    config
}

/// A new session of `client` over the KB `papers`; its id.
async fn new_session(client: &ApiClient) -> String {
    client
        .post_json("/v1/sessions", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn text(bytes: usize) -> String {
    "quota words ".repeat(bytes / 12 + 1)[..bytes].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_no_more_bytes_than_its_quota() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.options.max_bytes_per_tenant = Some(1000);
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    let acme = operator.tenant_client("acme", "editor").await;
    acme.create_kb(json!({ "name": "docs", "shards": 2 })).await;
    let first = acme
        .bulk_add("docs", &[json!({ "external_id": "a", "text": text(700) })])
        .await;
    // 700 + 400 > 1000: refused, nothing stored.
    let refused = acme
        .bulk_add_answer("docs", &[json!({ "external_id": "b", "text": text(400) })])
        .await;
    let message = refused.expect_error(403, "storage_quota_exceeded");
    assert!(message.contains("1000"), "{message}");
    let upload = acme.upload("docs", "big.txt", text(400).into_bytes()).await;
    upload.expect_error(403, "storage_quota_exceeded");
    assert_eq!(count(&acme.counts("docs").await, "total"), 1);
    // Another tenant's quota is its own: the default tenant adds 900 bytes.
    operator.create_kb(json!({ "name": "mine" })).await;
    operator
        .bulk_add("mine", &[json!({ "text": text(900) })])
        .await;
    // Deleting frees the bytes.
    acme.wait_ready("docs", 1, Duration::from_secs(60)).await;
    acme.delete(&format!("/v1/kbs/docs/documents/{}", first[0]))
        .await
        .expect(204);
    acme.bulk_add("docs", &[json!({ "external_id": "b", "text": text(400) })])
        .await;
}

/// `stored_bytes` of `GET /v1/kbs/{kb}` and of the KB in `GET /v1/kbs`, which must agree.
async fn stored_bytes(client: &ApiClient, kb: &str) -> Value {
    let one = client.get_kb(kb).await;
    let list = client.get("/v1/kbs").await.expect(200);
    let listed = list["kbs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|listed| listed["name"] == kb)
        .unwrap_or_else(|| panic!("{kb} is not listed: {list}"));
    assert_eq!(listed["stored_bytes"], one["stored_bytes"], "{listed}");
    assert_eq!(listed["chunks"], one["chunks"], "{listed}");
    one["stored_bytes"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kbs_size_follows_its_uploads_and_deletes() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "sized", "shards": 2 }))
        .await;
    assert_eq!(stored_bytes(&client, "sized").await, 0);
    assert_eq!(client.get_kb("sized").await["chunks"], 0);
    let first = client
        .upload_ok("sized", "first.txt", text(700).into_bytes())
        .await;
    assert_eq!(
        stored_bytes(&client, "sized").await,
        700,
        "counted once registered"
    );
    client
        .upload_ok(
            "sized",
            "second.md",
            format!("# Second\n\n{}", text(290)).into_bytes(),
        )
        .await;
    client.wait_ready("sized", 2, Duration::from_secs(60)).await;
    assert_eq!(stored_bytes(&client, "sized").await, 1000);
    let chunks = client.get_kb("sized").await["chunks"].as_u64().unwrap();
    assert!(chunks >= 2, "{chunks} chunks");
    // The same bytes again add nothing (a duplicate).
    let again = client
        .upload_ok("sized", "again.txt", text(700).into_bytes())
        .await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(stored_bytes(&client, "sized").await, 1000);

    // A key limited to document groups sees no byte count: it would count documents the key
    // may not read.
    let restricted = client
        .post_json(
            "/v1/keys",
            &json!({ "name": "finance reader", "role": "reader", "groups": ["finance"] }),
        )
        .await
        .expect(201)["key"]
        .as_str()
        .unwrap()
        .to_string();
    let restricted = ApiClient::with_http(client.url(), Some(&restricted), client.http().clone());
    let seen = restricted.get_kb("sized").await;
    assert_eq!(seen["stored_bytes"], Value::Null, "{seen}");

    client
        .delete(&format!(
            "/v1/kbs/sized/documents/{}",
            first["id"].as_str().unwrap()
        ))
        .await
        .expect(204);
    assert_eq!(stored_bytes(&client, "sized").await, 300);
    let fewer = client.get_kb("sized").await["chunks"].as_u64().unwrap();
    assert!(
        fewer < chunks,
        "{fewer} chunks after the delete, {chunks} before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_no_more_documents_than_its_quota() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.options.max_documents_per_tenant = Some(3);
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    let acme = operator.tenant_client("acme", "editor").await;
    acme.create_kb(json!({ "name": "one", "shards": 2 })).await;
    acme.create_kb(json!({ "name": "two" })).await;
    let doc = |id: &str| json!({ "external_id": id, "text": format!("document {id} words") });
    let first = acme.bulk_add("one", &[doc("a"), doc("b")]).await;
    // Two more in another KB of the tenant: 2 + 2 > 3, refused whole, nothing stored.
    let refused = acme.bulk_add_answer("two", &[doc("c"), doc("d")]).await;
    let message = refused.expect_error(403, "document_quota_exceeded");
    assert!(message.contains('3'), "{message}");
    assert_eq!(count(&acme.counts("two").await, "total"), 0);
    acme.bulk_add("two", &[doc("c")]).await;
    acme.upload("one", "more.txt", b"one more".to_vec())
        .await
        .expect_error(403, "document_quota_exceeded");
    // Replacing a document by its external id adds none, even at the quota.
    acme.wait_ready("one", 2, Duration::from_secs(60)).await;
    acme.bulk_add(
        "one",
        &[json!({ "external_id": "a", "text": "document a, new words" })],
    )
    .await;
    acme.wait_ready("one", 2, Duration::from_secs(60)).await;
    assert_eq!(count(&acme.counts("one").await, "total"), 2);
    // Another tenant's quota is its own.
    operator.create_kb(json!({ "name": "mine" })).await;
    operator
        .bulk_add("mine", &[doc("x"), doc("y"), doc("z")])
        .await;
    // Deleting frees room.
    acme.delete(&format!("/v1/kbs/one/documents/{}", first[1]))
        .await
        .expect(204);
    acme.bulk_add("two", &[doc("e")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_additions_cannot_pass_a_quota_together() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.options.max_documents_per_tenant = Some(5);
    config.options.max_bytes_per_tenant = Some(100_000);
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    let acme = operator.tenant_client("acme", "editor").await;
    acme.create_kb(json!({ "name": "docs", "shards": 2 })).await;
    // Twenty one-document additions at once: each alone fits, five together fill the quota.
    let additions = (0..20).map(|n| {
        let acme = acme.clone();
        tokio::spawn(async move {
            let document = json!({ "text": format!("concurrent document {n}") });
            acme.bulk_add_answer("docs", &[document]).await
        })
    });
    let mut accepted = 0;
    for addition in futures::future::join_all(additions).await {
        let answer = addition.expect("an addition task");
        if answer.status == 202 {
            accepted += 1;
        } else {
            answer.expect_error(403, "document_quota_exceeded");
        }
    }
    assert_eq!(accepted, 5, "accepted additions");
    acme.wait_ready("docs", 5, Duration::from_secs(120)).await;
    assert_eq!(count(&acme.counts("docs").await, "total"), 5);
    // The reservations are gone once the additions are registered: deleting one frees room.
    let listed = acme.list_all_documents("docs", 10).await;
    let id = listed[0]["id"].as_str().expect("a document id");
    acme.delete(&format!("/v1/kbs/docs/documents/{id}"))
        .await
        .expect(204);
    acme.bulk_add("docs", &[json!({ "text": "one after the delete" })])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_has_no_more_runs_in_flight_than_its_cap() {
    let fake = FakeLlm::start(|_| FakeReply::Hang).await;
    let dir = sift_tests::temp_dir();
    let mut config = hanging_model_config(&dir, &fake);
    config.runs.max_runs_per_key = Some(1);
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_kb(json!({ "name": "papers" })).await;
    let mut clients = Vec::new();
    for n in 0..2 {
        let created = operator
            .post_json(
                "/v1/keys",
                &json!({ "name": format!("r{n}"), "role": "reader" }),
            )
            .await
            .expect(201);
        clients.push(ApiClient::with_key(&node.url, created["key"].as_str()));
    }
    let (one, two) = (
        new_session(&clients[0]).await,
        new_session(&clients[0]).await,
    );
    let mut running = ask(&clients[0], &one, "first question").await;
    let meta = running.next().await.expect("meta");
    let run_id = meta.data["run_id"].as_str().unwrap().to_string();
    // The same key's second run, in another session: refused, retryable.
    let refused = clients[0]
        .post_json(
            &format!("/v1/sessions/{two}/messages"),
            &json!({ "content": "second question" }),
        )
        .await;
    assert_eq!(refused.headers["retry-after"], "1");
    refused.expect_error(429, "too_many_runs");
    // Another key is not held back.
    let other = new_session(&clients[1]).await;
    let mut theirs = ask(&clients[1], &other, "their question").await;
    let their_meta = theirs.next().await.expect("meta");
    // Once the first run ends, the key may ask again.
    clients[0]
        .post_json(&format!("/v1/runs/{run_id}/stop"), &json!({}))
        .await
        .expect(202);
    let rest = running.rest().await;
    assert_eq!(rest.last().unwrap().event, "done", "{rest:?}");
    let mut again = ask(&clients[0], &two, "second question").await;
    assert_eq!(again.next().await.expect("meta").event, "meta");
    let their_run = their_meta.data["run_id"].as_str().unwrap().to_string();
    clients[1]
        .post_json(&format!("/v1/runs/{their_run}/stop"), &json!({}))
        .await
        .expect(202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_limits_of_its_own() {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.options.max_documents_per_tenant = Some(100);
    let node = InProcessNode::start_with(config).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    operator.create_tenant("globex").await;
    let acme = operator.tenant_client("acme", "admin").await;
    let globex = operator.tenant_client("globex", "editor").await;

    // Bad limits and bad callers change nothing.
    let limits = json!({ "max_documents": 2, "max_kbs": 1 });
    operator
        .put_json("/v1/tenants/nobody/limits", &limits)
        .await
        .expect_error(404, "tenant_not_found");
    operator
        .put_json("/v1/tenants/default/limits", &limits)
        .await
        .expect_error(400, "invalid_tenant");
    for (body, code) in [
        (json!({ "max_runs_per_key": 0 }), "invalid_limits"),
        (json!({ "rate_limit_burst": 5 }), "invalid_limits"),
        (json!({ "max_documents": -1 }), "invalid_json"),
        (json!({ "max_docs": 2 }), "invalid_json"),
    ] {
        operator
            .put_json("/v1/tenants/acme/limits", &body)
            .await
            .expect_error(400, code);
    }
    acme.put_json("/v1/tenants/acme/limits", &json!({}))
        .await
        .expect_error(403, "forbidden");
    let shown = operator.get("/v1/tenants/acme").await.expect(200);
    assert_eq!(shown["limits"]["max_documents"], Value::Null, "{shown}");

    // acme's own limits: two documents, one KB; globex keeps the node-wide ones.
    let set = operator
        .put_json("/v1/tenants/acme/limits", &limits)
        .await
        .expect(200);
    assert_eq!(set["limits"]["max_documents"], 2, "{set}");
    let listed = operator.get("/v1/tenants").await.expect(200);
    let acme_listed = listed["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tenant| tenant["name"] == "acme")
        .cloned()
        .unwrap();
    assert_eq!(acme_listed["limits"]["max_kbs"], 1, "{listed}");
    acme.create_kb(json!({ "name": "one" })).await;
    let message = acme
        .post_json("/v1/kbs", &json!({ "name": "two" }))
        .await
        .expect_error(403, "kb_quota_exceeded");
    assert!(message.contains("max_kbs"), "{message}");
    let doc = |id: &str| json!({ "external_id": id, "text": format!("document {id} words") });
    acme.bulk_add("one", &[doc("a"), doc("b")]).await;
    let message = acme
        .bulk_add_answer("one", &[doc("c")])
        .await
        .expect_error(403, "document_quota_exceeded");
    assert!(message.contains("the tenant's max_documents"), "{message}");
    globex.create_kb(json!({ "name": "one" })).await;
    globex.create_kb(json!({ "name": "two" })).await;
    globex
        .bulk_add("one", &[doc("a"), doc("b"), doc("c")])
        .await;

    // Limits replaced by none: the node-wide settings apply again.
    operator
        .put_json("/v1/tenants/acme/limits", &json!({}))
        .await
        .expect(200);
    acme.bulk_add("one", &[doc("c")]).await;
    acme.create_kb(json!({ "name": "two" })).await;
    assert_eq!(count(&acme.counts("one").await, "total"), 3);

    // A request rate of globex's own: its burst, then 429 with Retry-After; acme is not held.
    operator
        .put_json(
            "/v1/tenants/globex/limits",
            &json!({ "rate_limit_per_minute": 1, "rate_limit_burst": 3 }),
        )
        .await
        .expect(200);
    for _ in 0..3 {
        globex.get("/v1/kbs").await.expect(200);
    }
    let refused = globex.get("/v1/kbs").await;
    assert!(refused.headers.contains_key("retry-after"));
    refused.expect_error(429, "rate_limited");
    for _ in 0..5 {
        acme.get("/v1/kbs").await.expect(200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_caps_the_runs_of_its_keys() {
    let fake = FakeLlm::start(|_| FakeReply::Hang).await;
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start_with(hanging_model_config(&dir, &fake)).await;
    let operator = node.client();
    operator.create_tenant("acme").await;
    operator
        .put_json("/v1/tenants/acme/limits", &json!({ "max_runs_per_key": 1 }))
        .await
        .expect(200);
    let admin = operator.tenant_client("acme", "admin").await;
    admin.create_kb(json!({ "name": "papers" })).await;
    let reader = operator.tenant_client("acme", "reader").await;
    let (one, two) = (new_session(&reader).await, new_session(&reader).await);
    let mut running = ask(&reader, &one, "first question").await;
    let meta = running.next().await.expect("meta");
    let run_id = meta.data["run_id"].as_str().unwrap().to_string();
    let message = reader
        .post_json(
            &format!("/v1/sessions/{two}/messages"),
            &json!({ "content": "second question" }),
        )
        .await
        .expect_error(429, "too_many_runs");
    assert!(message.contains('1'), "{message}");
    // The default tenant has no cap (none node-wide): two runs of one key at once.
    operator.create_kb(json!({ "name": "papers" })).await;
    let (three, four) = (new_session(&operator).await, new_session(&operator).await);
    let mut first = ask(&operator, &three, "a question").await;
    let mut second = ask(&operator, &four, "another question").await;
    for stream in [&mut first, &mut second] {
        let meta = stream.next().await.expect("meta");
        let run = meta.data["run_id"].as_str().unwrap().to_string();
        operator
            .post_json(&format!("/v1/runs/{run}/stop"), &json!({}))
            .await
            .expect(202);
    }
    reader
        .post_json(&format!("/v1/runs/{run_id}/stop"), &json!({}))
        .await
        .expect(202);
}
