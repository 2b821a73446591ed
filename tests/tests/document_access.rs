//! Document-level access: a document with `access.groups` is read only by keys of one of
//! them (and the tenant's admins), in search (inside the shards: top-k stays full), the
//! document routes, chat sessions and the OpenAI-compatible endpoint.

use std::time::Duration;

use serde_json::{Value, json};
use sift_tests::sse::{answer_text, ask};
use sift_tests::{ApiClient, InProcessNode};

/// A word no other document holds, so BM25 matches only the restricted document.
const CANARY: &str = "zorblaxfinance";
/// A word of the restricted document that no request names: seen only if its text leaks.
const SECRET: &str = "quibbleprofitsecret";

async fn key(operator: &ApiClient, role: &str, groups: &[&str]) -> String {
    let created = operator
        .post_json(
            "/v1/keys",
            &json!({ "name": format!("{role} {groups:?}"), "role": role, "groups": groups }),
        )
        .await
        .expect(201);
    assert_eq!(created["groups"], json!(groups));
    created["key"].as_str().unwrap().to_string()
}

/// Every text an answer holds, for the canary check.
fn text(value: &Value) -> String {
    value.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_documents_are_read_only_by_their_groups() {
    let dir = sift_tests::temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let operator = node.client();
    operator
        .create_kb(json!({ "name": "docs", "shards": 2 }))
        .await;
    let mut documents = vec![json!({
        "external_id": "secret",
        "title": "Quarterly numbers",
        "text": format!("The {CANARY} figures for the quarter are common knowledge inside finance: {SECRET}."),
        "access": { "groups": ["finance"] },
    })];
    for n in 0..20 {
        documents.push(json!({
            "external_id": format!("open{n}"),
            "title": format!("Open note {n}"),
            "text": format!("An open note number {n} with common knowledge for everyone."),
        }));
    }
    let ids = operator.bulk_add("docs", &documents).await;
    operator
        .wait_ready("docs", documents.len() as u64, Duration::from_secs(120))
        .await;
    let secret_id = &ids[0];

    let finance = ApiClient::with_key(
        &node.url,
        Some(&key(&operator, "reader", &["finance"]).await),
    );
    let outsider =
        ApiClient::with_key(&node.url, Some(&key(&operator, "reader", &["legal"]).await));
    let outsider_editor =
        ApiClient::with_key(&node.url, Some(&key(&operator, "editor", &[]).await));

    // The group's reader finds it by its word on every channel; so does the admin.
    for client in [&finance, &operator] {
        for channels in [json!(["bm25"]), json!(["dense", "bm25"])] {
            let answer = client
                .search(
                    "docs",
                    json!({ "query": CANARY, "channels": channels, "top_k": 3 }),
                )
                .await;
            assert!(
                sift_tests::document_ids(&answer).contains(secret_id),
                "{channels}: {answer}"
            );
        }
    }

    // An outsider never sees it: not in search on any channel or option, not in the
    // document list, not by id, chunks or events; top-k is still full of open documents.
    let mut seen = String::new();
    for body in [
        json!({ "query": CANARY, "channels": ["bm25"] }),
        json!({ "query": CANARY, "channels": ["dense"] }),
        json!({ "query": format!("{CANARY} quarter figures"), "top_k": 10, "explain": true }),
        json!({ "query": "common knowledge", "top_k": 20, "exact": true }),
        json!({ "query": CANARY, "filters": { "document_ids": [secret_id] } }),
        json!({ "query": CANARY, "expand_neighbours": 2, "context_tokens": 2000 }),
    ] {
        let answer = outsider.search("docs", body.clone()).await;
        seen.push_str(&text(&answer));
        assert!(
            !sift_tests::document_ids(&answer).contains(secret_id),
            "{body}"
        );
    }
    let full = outsider
        .search(
            "docs",
            json!({ "query": "common knowledge", "top_k": 10, "channels": ["bm25"] }),
        )
        .await;
    assert_eq!(
        sift_tests::hits(&full).len(),
        10,
        "top-k stays full: {full}"
    );
    let listed = outsider.list_all_documents("docs", 7).await;
    assert_eq!(
        listed.len(),
        20,
        "the open documents, a full page at a time"
    );
    seen.push_str(&serde_json::to_string(&listed).unwrap());
    // The KB's document counts count what the caller reads: a count is an existence oracle.
    for (client, expected) in [(&outsider, 20), (&finance, 21), (&operator, 21)] {
        assert_eq!(client.counts("docs").await["total"], expected);
        let kbs = client.get("/v1/kbs").await.expect(200);
        let listed_kb = kbs["kbs"]
            .as_array()
            .and_then(|kbs| kbs.iter().find(|kb| kb["name"] == "docs"))
            .unwrap_or_else(|| panic!("docs listed: {kbs}"));
        assert_eq!(listed_kb["documents"]["total"], expected, "{listed_kb}");
    }
    let shards = outsider.get("/v1/kbs/docs/shards").await.expect(200);
    for replica in shards["shards"].as_array().unwrap() {
        let replica = &replica["replicas"][0];
        assert!(
            replica["reachable"] == true && replica["documents"].is_null(),
            "{shards}"
        );
    }
    let shards = operator.get("/v1/kbs/docs/shards").await.expect(200);
    let stored: u64 = shards["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|shard| shard["replicas"][0]["documents"].as_u64().unwrap())
        .sum();
    assert_eq!(stored, 21, "{shards}");
    for path in [
        format!("/v1/kbs/docs/documents/{secret_id}"),
        "/v1/kbs/docs/documents/secret".to_string(),
        format!("/v1/kbs/docs/documents/{secret_id}/chunks"),
        format!("/v1/kbs/docs/documents/{secret_id}/events"),
    ] {
        let answer = outsider.get(&path).await;
        seen.push_str(&text(&answer.body));
        answer.expect_error(404, "document_not_found");
    }
    // An editor without the group cannot delete it (it does not exist for them).
    outsider_editor
        .delete(&format!("/v1/kbs/docs/documents/{secret_id}"))
        .await
        .expect_error(404, "document_not_found");
    assert_eq!(
        operator.document("docs", secret_id).await["status"],
        "ready"
    );

    // A session and an OpenAI-compatible chat of the outsider answer from open documents
    // only (no model: extractive answers, cited from the search).
    let session = outsider
        .post_json("/v1/sessions", &json!({ "kbs": ["docs"] }))
        .await
        .expect(201);
    let events = ask(
        &outsider,
        session["id"].as_str().unwrap(),
        &format!("What are the {CANARY} figures?"),
    )
    .await
    .rest()
    .await;
    seen.push_str(&answer_text(&events));
    for event in &events {
        seen.push_str(&event.data.to_string());
    }
    let chat = outsider
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": "default",
                "messages": [{ "role": "user", "content": format!("Tell me the {CANARY} figures") }],
                "sift": { "kbs": ["docs"] },
            }),
        )
        .await
        .expect(200);
    seen.push_str(&text(&chat));
    assert!(
        !seen.contains(SECRET),
        "the restricted text reached an outsider: {seen}"
    );
    // The same calls of the group's reader do reach it (the check above can fail).
    let answer = finance
        .search("docs", json!({ "query": CANARY, "expand_neighbours": 2 }))
        .await;
    assert!(text(&answer).contains(SECRET), "{answer}");

    // Bad access: a group that is not a plain name, or `sift.` metadata, stores nothing.
    for bad in [
        json!({ "text": "x", "access": { "groups": ["Finance"] } }),
        json!({ "text": "x", "access": { "groups": ["a,b"] } }),
        json!({ "text": "x", "access": { "groups": [""] } }),
        json!({ "text": "x", "metadata": { "sift.groups": "finance" } }),
    ] {
        let answer = operator
            .bulk_add_answer("docs", std::slice::from_ref(&bad))
            .await;
        assert_eq!(answer.status.as_u16(), 400, "{bad}: {}", answer.body);
    }
    assert_eq!(
        sift_tests::count(&operator.counts("docs").await, "ready"),
        documents.len() as u64,
        "nothing stored"
    );
}
