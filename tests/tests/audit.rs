//! The audit log: every change through the public API, allowed or refused, with who, what,
//! the outcome and the address; no key material in it; each tenant's admins see their own.

use serde_json::{Value, json};
use sift_node::config::TEST_ADMIN_KEY;
use sift_tests::{ApiClient, InProcessNode};

/// Every entry of the log as `client` sees it, a page of `page` at a time.
async fn all_entries(client: &ApiClient, page: usize) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(id) => format!("/v1/audit?limit={page}&after={id}"),
            None => format!("/v1/audit?limit={page}"),
        };
        let answer = client.get(&path).await.expect(200);
        entries.extend(answer["entries"].as_array().unwrap().iter().cloned());
        match answer["next_after"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return entries,
        }
    }
}

fn find<'a>(entries: &'a [Value], method: &str, route: &str, status: u16) -> Option<&'a Value> {
    entries
        .iter()
        .find(|e| e["method"] == method && e["route"] == route && e["status"] == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_refusals_are_audited_without_secrets_and_per_tenant() {
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let operator = node.client();
    operator
        .post_json("/v1/tenants", &json!({ "name": "acme" }))
        .await
        .expect(201);
    let key =
        |role: &str| json!({ "name": format!("acme {role}"), "role": role, "tenant": "acme" });
    let admin_key = operator
        .post_json("/v1/keys", &key("admin"))
        .await
        .expect(201);
    let reader_key = operator
        .post_json("/v1/keys", &key("reader"))
        .await
        .expect(201);
    let secrets: Vec<String> = [&admin_key, &reader_key]
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_string())
        .collect();
    let acme_admin = ApiClient::with_key(&node.url, Some(&secrets[0]));
    let acme_reader = ApiClient::with_key(&node.url, Some(&secrets[1]));

    // A change, a refused change, a read and a search (neither audited), a revoke.
    acme_admin
        .create_kb(json!({ "name": "docs", "shards": 1 }))
        .await;
    acme_reader
        .post_json("/v1/kbs", &json!({ "name": "mine" }))
        .await
        .expect_error(403, "forbidden");
    acme_reader.get("/v1/kbs").await.expect(200);
    acme_reader
        .post_json(
            "/v1/kbs/docs/search",
            &json!({ "query": "x", "channels": ["bm25"] }),
        )
        .await
        .expect(200);
    let reader_id = reader_key["id"].as_str().unwrap();
    acme_admin
        .delete(&format!("/v1/keys/{reader_id}"))
        .await
        .expect(200);

    // The operator sees every entry, in order, the same whole or a page at a time.
    let entries = all_entries(&operator, 1000).await;
    let paged = all_entries(&operator, 2).await;
    assert_eq!(entries, paged, "paging neither skips nor repeats");
    let ids: Vec<&str> = entries.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "oldest first");

    let tenant = find(&entries, "POST", "/v1/tenants", 201).expect("the tenant's creation");
    assert_eq!(tenant["tenant"], "default");
    assert_eq!(tenant["key_id"], "7e5700000000");
    let created = find(&entries, "POST", "/v1/kbs", 201).expect("the KB's creation");
    assert_eq!(created["tenant"], "acme");
    assert_eq!(created["key_id"], admin_key["id"]);
    assert_eq!(created["role"], "admin");
    assert_eq!(created["target"], "/v1/kbs");
    assert_eq!(created["address"], "127.0.0.1");
    let refused = find(&entries, "POST", "/v1/kbs", 403).expect("the refused creation");
    assert_eq!(refused["key_id"], reader_key["id"]);
    assert_eq!(refused["role"], "reader");
    let revoked = find(&entries, "DELETE", "/v1/keys/{id}", 200).expect("the revoke");
    assert_eq!(revoked["target"], format!("/v1/keys/{reader_id}"));
    assert!(
        entries
            .iter()
            .all(|e| e["method"] != "GET" && e["route"] != "/v1/kbs/{kb}/search"),
        "reads are not audited: {entries:?}"
    );
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["route"] == "/v1/keys" && e["status"] == 201)
            .count(),
        2
    );

    // No key material: the answers that made the keys are the only place their text was.
    let text = serde_json::to_string(&entries).unwrap();
    for secret in secrets.iter().map(String::as_str).chain([TEST_ADMIN_KEY]) {
        assert!(!text.contains(secret), "a key is in the audit log");
        assert!(!text.contains(&secret[secret.len() - 48..]), "a secret");
    }

    // A tenant's admin sees its tenant's entries only; a reader none.
    let acme_entries = all_entries(&acme_admin, 1000).await;
    assert!(!acme_entries.is_empty());
    assert!(
        acme_entries.iter().all(|e| e["tenant"] == "acme"),
        "{acme_entries:?}"
    );
    assert!(find(&acme_entries, "POST", "/v1/tenants", 201).is_none());
    let another_reader = operator
        .post_json("/v1/keys", &key("reader"))
        .await
        .expect(201);
    ApiClient::with_key(&node.url, another_reader["key"].as_str())
        .get("/v1/audit")
        .await
        .expect_error(403, "forbidden");
    operator
        .get("/v1/audit?limit=abc")
        .await
        .expect_error(400, "invalid_query_string");
}
