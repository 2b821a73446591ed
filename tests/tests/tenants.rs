//! Tenants on the public API: two tenants (`acme` and `globex`) with a KB of the same name
//! (`docs`) each, and a canary document each. Nothing of one tenant reaches the other: not by
//! the KB's id, not by its name, not through search of any channel or option, documents,
//! sessions, runs, the OpenAI-compatible chat or key lists, on a single node or through a
//! follower of a cluster. A KB shared read-only can be read and searched by the other tenant
//! but never changed; deleting a tenant revokes its keys and leaves nothing to a tenant made
//! later under its name; bad tenant names and keys without the role change nothing.
//!
//! How a leak is caught: each canary document holds, in one sentence, a made-up word that BM25
//! matches exactly (the canary, which the other tenant sends as a query, so it may come back
//! to it as an echo of its own question) and a second made-up word (the secret) that no
//! request of the other tenant ever carries. Every answer the other tenant gets is kept
//! ([`Watched`]) and checked, at the end, for the secret and for the ids of the tenant's KB,
//! documents, keys, session and run, except where the request itself carried that id (an
//! error message may name what was asked for).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use sift_tests::sse::{SseEvent, SseReader, answer_text, follow_run};
use sift_tests::{
    Answer, ApiClient, InProcessNode, NodeProcess, bulk_documents, count, document_ids, eventually,
    free_port, hits, ingest_deadline, session_ids, short_documents, temp_dir, text_document,
    wait_for_voters,
};

/// The documents of each tenant's KB `docs`: its canary document and these many SciFact
/// abstracts (the same ones in both tenants).
const SCIFACT_DOCUMENTS: usize = 3;
const DOCUMENTS: usize = SCIFACT_DOCUMENTS + 1;

/// The roles every tenant gets a key of.
const ROLES: [&str; 3] = ["admin", "editor", "reader"];

const CLUSTER_SECRET: &str = "tenants-process-test-secret";

/// How long a follower may still serve a key after the leader answered its revoke: the
/// follower applies the committed op within a heartbeat or two. A few seconds, not the
/// harness's [`sift_tests::WAIT`]: a revoke that takes longer to reach a node is a bug.
const REVOKE_REACHES_EVERY_NODE: Duration = Duration::from_secs(10);

const ACME: TenantSpec = TenantSpec {
    name: "acme",
    canary: "CANARYACME7f3a",
    secret: "ACMESECRET5d1e9b",
};

const GLOBEX: TenantSpec = TenantSpec {
    name: "globex",
    canary: "CANARYGLOBEX91c2",
    secret: "GLOBEXSECRET3e8a40",
};

/// A single node: `globex`'s admin, editor and reader call every route they can reach with
/// `acme`'s KB id, its qualified name `acme:docs`, its document ids, its session and run, and
/// search their own `docs` for `acme`'s canary with every channel and option. Every answer is
/// 404 as for something that does not exist, or holds `globex`'s data only; `acme`'s secret
/// and ids never appear in any of them. Both tenants find their own canary (so a broken
/// search, session or chat fails the test instead of passing it), and `acme`'s data, session
/// included, is unchanged afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_one_tenant_reaches_another_on_any_route() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let url = node.url.as_str();
    let (acme, globex) = two_tenants(url).await;
    let before = kb_snapshot(&acme.client(url, "editor")).await;

    // Acme's reader finds its canary, by the KB's name and id, and through a session; acme's
    // admin sees that session.
    let acme_reader = acme.client(url, "reader");
    assert_finds_own_canary(&acme_reader, &acme, "docs").await;
    assert_finds_own_canary(&acme_reader, &acme, &acme.kb_id).await;
    let acme_session = acme_reader
        .post_json("/v1/sessions", &json!({ "kbs": ["docs"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .expect("a session id")
        .to_string();
    let events = sift_tests::sse::ask(&acme_reader, &acme_session, &acme.question())
        .await
        .rest()
        .await;
    assert_eq!(events.last().expect("events").event, "done", "{events:?}");
    let acme_run = events[0].data["run_id"]
        .as_str()
        .expect("the meta event names the run")
        .to_string();
    let answer = answer_text(&events);
    assert!(
        answer.contains(acme.secret),
        "acme's own session answers from its canary: {answer}"
    );
    let acme_admin = acme.client(url, "admin");
    assert!(
        session_ids(&acme_admin.get("/v1/sessions").await.expect(200)).contains(&acme_session),
        "a tenant's admin sees its tenant's sessions"
    );
    acme_admin
        .get(&format!("/v1/sessions/{acme_session}"))
        .await
        .expect(200);

    let mut markers = acme.markers();
    markers.extend([acme_session.clone(), acme_run.clone()]);
    let watched: Vec<Watched> = ROLES
        .iter()
        .map(|role| Watched::new(globex.client(url, role)))
        .collect();
    for globex_client in &watched {
        assert_kb_unreachable(globex_client, &acme).await;
        assert_own_kb_holds_only_its_own(globex_client, &globex, &acme).await;
        assert_session_unreachable(globex_client, &acme_session, &acme_run).await;
        globex_client
            .get("/metrics")
            .await
            .expect_error(403, "forbidden");
    }
    let [globex_admin, globex_editor, globex_reader] = &watched[..] else {
        unreachable!("one watched client per role");
    };

    // The editor changes nothing of acme's, by id or by name, and cannot squat the
    // qualified name.
    assert_kb_unwritable(globex_editor, &globex, &acme, 404, "kb_not_found").await;
    globex_editor
        .post_json("/v1/kbs", &json!({ "name": "acme:docs" }))
        .await
        .expect_error(400, "invalid_name");

    // The admin lists and manages globex's keys only; it makes none for acme.
    let keys = globex_admin.get("/v1/keys").await.expect(200);
    let listed = keys["keys"].as_array().expect("a list of keys");
    assert!(listed.iter().all(|key| key["tenant"] == "globex"), "{keys}");
    for role in ROLES {
        assert!(
            listed.iter().any(|key| key["id"] == globex.key_id(role)),
            "{keys}"
        );
    }
    globex_admin
        .delete(&format!("/v1/keys/{}", acme.key_id("reader")))
        .await
        .expect_error(404, "api_key_not_found");
    globex_admin
        .post_json(
            "/v1/keys",
            &json!({ "name": "intruder", "role": "admin", "tenant": "acme" }),
        )
        .await
        .expect_error(403, "forbidden");
    for path in ["/v1/cluster", "/v1/tenants"] {
        globex_admin.get(path).await.expect_error(403, "forbidden");
    }
    acme_reader.get("/v1/kbs").await.expect(200); // the revoke attempt did nothing

    // The reader's own session and chat, asked about acme's canary: answers from globex's
    // documents only; asked about its own canary: found.
    let session = globex_reader
        .post_json("/v1/sessions", &json!({ "kbs": ["docs"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .expect("a session id")
        .to_string();
    let events = globex_reader.ask(&session, &acme.question()).await;
    assert_eq!(events.last().expect("events").event, "done", "{events:?}");
    assert_cites_only(&event_citations(&events), &globex);
    let globex_run = events[0].data["run_id"]
        .as_str()
        .expect("the meta event names the run")
        .to_string();
    let events = globex_reader.follow(&globex_run).await;
    assert_cites_only(&event_citations(&events), &globex);
    let events = globex_reader.ask(&session, &globex.question()).await;
    let answer = answer_text(&events);
    assert!(
        answer.contains(globex.secret),
        "globex's session answers from its own canary: {answer}"
    );
    let turns = globex_reader
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    assert_eq!(
        turns["messages"].as_array().map(Vec::len),
        Some(2),
        "{turns}"
    );

    let completion = globex_reader
        .post_json(
            "/v1/chat/completions",
            &chat_request(&acme.question(), "docs", false),
        )
        .await
        .expect(200);
    assert_cites_only(&chat_citations(&completion), &globex);
    let chunks = globex_reader
        .stream(
            "/v1/chat/completions",
            &chat_request(&acme.question(), "docs", true),
        )
        .await;
    assert_eq!(chunks.last().expect("chunks").data, "[DONE]", "{chunks:?}");
    let last = chunks
        .iter()
        .rev()
        .find(|chunk| chunk.data.is_object())
        .expect("a last chunk with the citations");
    assert_cites_only(&chat_citations(&last.data), &globex);
    let own = globex_reader
        .post_json(
            "/v1/chat/completions",
            &chat_request(&globex.question(), "docs", false),
        )
        .await
        .expect(200);
    let content = own["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        content.contains(globex.secret),
        "globex's chat answers from its own canary: {own}"
    );

    // Acme's admin sees its own session, not globex's; nothing of acme changed.
    acme_admin
        .get(&format!("/v1/sessions/{session}"))
        .await
        .expect_error(404, "session_not_found");
    assert!(!session_ids(&acme_admin.get("/v1/sessions").await.expect(200)).contains(&session));
    let turns = acme_admin
        .get(&format!("/v1/sessions/{acme_session}/messages"))
        .await
        .expect(200);
    assert_eq!(
        turns["messages"].as_array().map(Vec::len),
        Some(1),
        "{turns}"
    );
    assert_finds_own_canary(&acme_reader, &acme, "docs").await;
    assert_eq!(kb_snapshot(&acme.client(url, "editor")).await, before);

    // The operator lists every tenant's keys, each with its tenant.
    let keys = ApiClient::new(url).get("/v1/keys").await.expect(200);
    for tenant in [&acme, &globex] {
        for role in ROLES {
            let key = keys["keys"]
                .as_array()
                .expect("a list of keys")
                .iter()
                .find(|key| key["id"] == tenant.key_id(role))
                .unwrap_or_else(|| panic!("{}'s {role} key in {keys}", tenant.name));
            assert_eq!(key["tenant"], tenant.name, "{key}");
            assert_eq!(key["role"], role, "{key}");
        }
    }

    for globex_client in &watched {
        let exchanges = globex_client.assert_free_of(&markers);
        assert!(
            exchanges >= 50,
            "only {exchanges} answers to {} were checked",
            globex_client.describe()
        );
    }
    node.shutdown().await;
}

/// A KB shared read-only: `acme`'s editor shares `docs` with `globex`, whose reader then finds
/// `acme`'s canary by the qualified name `acme:docs` and by the KB's id, lists it as read-only
/// and reads its documents and a session on it, while `globex`'s own `docs` keeps its name.
/// Every change by `globex`'s editor or admin is 403 `kb_read_only` and changes nothing.
/// After the unshare it is 404 again on every route, and no answer holds `acme`'s data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_kb_is_read_only_for_the_other_tenant_until_unshared() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let url = node.url.as_str();
    let (acme, globex) = two_tenants(url).await;
    let acme_editor = acme.client(url, "editor");

    // Only the owner shares, only with a tenant that exists.
    acme_editor
        .send(acme_editor.request(Method::PUT, "/v1/kbs/docs/shares/nobody"))
        .await
        .expect_error(404, "tenant_not_found");
    let globex_editor = globex.client(url, "editor");
    globex_editor
        .send(globex_editor.request(
            Method::PUT,
            &format!("/v1/kbs/{}/shares/globex", acme.kb_id),
        ))
        .await
        .expect_error(404, "kb_not_found");
    let shared = acme_editor
        .send(acme_editor.request(Method::PUT, "/v1/kbs/docs/shares/globex"))
        .await
        .expect(200);
    assert_eq!(shared["id"], acme.kb_id.as_str(), "{shared}");
    assert_eq!(shared["tenant"], "acme", "{shared}");
    let before = kb_snapshot(&acme_editor).await;

    // Globex reads it, by qualified name and by id.
    let globex_reader = globex.client(url, "reader");
    let qualified = "acme:docs";
    for kb in [qualified, acme.kb_id.as_str()] {
        let seen = globex_reader
            .get(&format!("/v1/kbs/{kb}"))
            .await
            .expect(200);
        assert_eq!(seen["id"], acme.kb_id.as_str(), "{seen}");
        assert_eq!(seen["tenant"], "acme", "{seen}");
        assert_eq!(seen["read_only"], true, "{seen}");
        assert_finds_own_canary(&globex_reader, &acme, kb).await;
        let documents = globex_reader
            .get(&format!("/v1/kbs/{kb}/documents?limit=100"))
            .await
            .expect(200);
        assert_eq!(
            sorted_ids(&documents["documents"]),
            sorted(&acme.document_ids)
        );
        let canary = acme.canary_document();
        globex_reader
            .get(&format!("/v1/kbs/{kb}/documents/{canary}"))
            .await
            .expect(200);
        let chunks = globex_reader
            .get(&format!("/v1/kbs/{kb}/documents/{canary}/chunks"))
            .await
            .expect(200);
        assert!(chunks.to_string().contains(acme.secret), "{chunks}");
    }
    let listed = globex_reader.get("/v1/kbs").await.expect(200);
    let listed_ids: BTreeSet<String> = kb_ids(&listed).into_iter().collect();
    assert_eq!(
        listed_ids,
        BTreeSet::from([acme.kb_id.clone(), globex.kb_id.clone()]),
        "{listed}"
    );
    // `docs` is still globex's own.
    let own = globex_reader.get("/v1/kbs/docs").await.expect(200);
    assert_eq!(own["id"], globex.kb_id.as_str(), "{own}");
    assert_eq!(own["read_only"], false, "{own}");
    let own = globex_reader.get("/v1/kbs/globex:docs").await.expect(200);
    assert_eq!(own["id"], globex.kb_id.as_str(), "{own}");

    // A session on the shared KB answers from it.
    let session = globex_reader
        .post_json("/v1/sessions", &json!({ "kbs": [qualified] }))
        .await
        .expect(201)["id"]
        .as_str()
        .expect("a session id")
        .to_string();
    let events = sift_tests::sse::ask(&globex_reader, &session, &acme.question())
        .await
        .rest()
        .await;
    let answer = answer_text(&events);
    assert!(answer.contains(acme.secret), "{answer}");

    // No change by globex, editor or admin, by name or by id; acme's KB is as it was.
    for role in ["editor", "admin"] {
        let intruder = Watched::new(globex.client(url, role));
        assert_kb_unwritable(&intruder, &globex, &acme, 403, "kb_read_only").await;
    }
    assert_eq!(kb_snapshot(&acme_editor).await, before);
    assert_finds_own_canary(&acme.client(url, "reader"), &acme, "docs").await;

    // Unshared: 404 again everywhere, and nothing of acme in any answer.
    acme_editor
        .delete("/v1/kbs/docs/shares/globex")
        .await
        .expect(204);
    let watched: Vec<Watched> = ROLES
        .iter()
        .map(|role| Watched::new(globex.client(url, role)))
        .collect();
    for globex_client in &watched {
        assert_kb_unreachable(globex_client, &acme).await;
        let listed = globex_client.get("/v1/kbs").await.expect(200);
        assert_eq!(kb_ids(&listed), vec![globex.kb_id.clone()], "{listed}");
    }
    let refused = watched[2]
        .post_json(
            &format!("/v1/sessions/{session}/messages"),
            &json!({ "content": acme.question() }),
        )
        .await;
    assert!(
        !refused.status.is_success(),
        "a session on a KB no longer shared answers nothing: {} {}",
        refused.status,
        refused.body
    );
    for globex_client in &watched {
        globex_client.assert_free_of(&acme.markers());
    }
    assert_eq!(kb_snapshot(&acme_editor).await, before);
    node.shutdown().await;
}

/// Deleting a tenant: `globex`'s keys are refused (401) at once, its tenant is gone from the
/// list, and a tenant made later under the same name starts with nothing: no KB (neither its
/// own old `docs` nor the one `acme` had shared), no session, no live key but its new one,
/// while the old keys stay refused. `acme` is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_tenant_revokes_its_keys_and_leaves_nothing_to_its_successor() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let url = node.url.as_str();
    let operator = ApiClient::new(url);
    let (acme, globex) = two_tenants(url).await;
    let acme_editor = acme.client(url, "editor");
    acme_editor
        .send(acme_editor.request(Method::PUT, "/v1/kbs/docs/shares/globex"))
        .await
        .expect(200);
    let old_session = globex
        .client(url, "reader")
        .post_json("/v1/sessions", &json!({ "kbs": ["docs"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .expect("a session id")
        .to_string();
    // The operator's own list holds the default tenant's KBs only.
    let operator_kbs = kb_ids(&operator.get("/v1/kbs").await.expect(200));
    assert!(
        !operator_kbs.contains(&acme.kb_id) && !operator_kbs.contains(&globex.kb_id),
        "{operator_kbs:?}"
    );

    operator.delete("/v1/tenants/globex").await.expect(204);
    for role in ROLES {
        let old = globex.client(url, role);
        for answer in [
            old.get("/v1/kbs").await,
            old.get("/v1/kbs/docs").await,
            old.search_answer("docs", json!({ "query": globex.canary }))
                .await,
        ] {
            assert_eq!(answer.status, 401, "{role}: {}", answer.body);
        }
    }
    let tenants = tenant_names(&operator).await;
    assert_eq!(tenants, names(&["acme", "default"]), "{tenants:?}");
    operator
        .delete("/v1/tenants/globex")
        .await
        .expect_error(404, "tenant_not_found");
    let keys = operator.get("/v1/keys").await.expect(200);
    for key in keys["keys"].as_array().expect("a list of keys") {
        if ROLES.iter().any(|role| key["id"] == globex.key_id(role)) {
            assert!(
                key["revoked_at_ms"].is_u64(),
                "a deleted tenant's key: {key}"
            );
        }
    }
    let shared_with = acme_editor.get("/v1/kbs/docs").await.expect(200)["shared_with"].clone();
    assert!(
        !shared_with.to_string().contains("globex"),
        "the share to the deleted tenant is gone: {shared_with}"
    );

    // A new tenant of the same name inherits nothing.
    operator
        .post_json("/v1/tenants", &json!({ "name": "globex" }))
        .await
        .expect(201);
    let created = operator
        .post_json(
            "/v1/keys",
            &json!({ "name": "globex again", "role": "admin", "tenant": "globex" }),
        )
        .await
        .expect(201);
    let new_key = created["key"].as_str().expect("the key's text");
    let new_id = created["id"].as_str().expect("the key's id");
    let successor = ApiClient::with_key(url, Some(new_key));
    assert_eq!(
        kb_ids(&successor.get("/v1/kbs").await.expect(200)),
        Vec::<String>::new()
    );
    let old_kb = format!("/v1/kbs/{}", globex.kb_id);
    let shared_kb = format!("/v1/kbs/{}", acme.kb_id);
    for path in [
        "/v1/kbs/docs",
        "/v1/kbs/acme:docs",
        old_kb.as_str(),
        shared_kb.as_str(),
    ] {
        successor.get(path).await.expect_error(404, "kb_not_found");
    }
    assert!(session_ids(&successor.get("/v1/sessions").await.expect(200)).is_empty());
    successor
        .get(&format!("/v1/sessions/{old_session}"))
        .await
        .expect_error(404, "session_not_found");
    let keys = successor.get("/v1/keys").await.expect(200);
    for key in keys["keys"].as_array().expect("a list of keys") {
        assert!(
            key["id"] == new_id || key["revoked_at_ms"].is_u64(),
            "a live key the new tenant did not make: {key}"
        );
    }
    for role in ROLES {
        let answer = globex.client(url, role).get("/v1/kbs").await;
        assert_eq!(answer.status, 401, "{role}: {}", answer.body);
    }
    // The name `docs` is free again and makes a new KB.
    let fresh = successor.create_kb(json!({ "name": "docs" })).await;
    assert_ne!(fresh["id"], globex.kb_id.as_str(), "{fresh}");
    let found = successor
        .search(
            "docs",
            json!({ "query": globex.canary, "channels": ["bm25"] }),
        )
        .await;
    assert!(hits(&found).is_empty(), "{found}");

    // Acme is untouched.
    assert_finds_own_canary(&acme.client(url, "reader"), &acme, "docs").await;
    assert_eq!(
        count(&acme_editor.counts("docs").await, "total"),
        DOCUMENTS as u64
    );
    node.shutdown().await;
}

/// Bad input and missing rights change nothing: tenant names that are not plain words (`a/b`,
/// `..`, a NUL, 10,000 characters, empty, uppercase) are 400 `invalid_tenant_name`; an
/// existing name is 409; the default tenant cannot be deleted; a tenant's admin reaches
/// neither the tenants, the cluster, the debug routes nor `/metrics`, nor another tenant's
/// keys; a reader is refused every change and every admin route. The tenants and acme's KB
/// are as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tenant_input_and_missing_rights_change_nothing() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("node")).await;
    let url = node.url.as_str();
    let operator = ApiClient::new(url);
    let tenants = tenant_names(&operator).await;
    assert_eq!(tenants, names(&["default"]));

    let long = "a".repeat(10_000);
    let too_long = "a".repeat(65);
    for name in [
        "a/b",
        "..",
        "a\u{0}b",
        long.as_str(),
        "",
        too_long.as_str(),
        "Acme",
        "-acme",
        "a:b",
        "a b",
        "é",
    ] {
        let message = operator
            .post_json("/v1/tenants", &json!({ "name": name }))
            .await
            .expect_error(400, "invalid_tenant_name");
        // The name is not echoed whole.
        assert!(message.len() < 1_000, "{} bytes", message.len());
    }
    for body in [
        json!({ "name": 7 }),
        json!({ "name": "ok", "quota": 1 }),
        json!({}),
    ] {
        operator
            .post_json("/v1/tenants", &body)
            .await
            .expect_error(400, "invalid_json");
    }
    assert_eq!(
        tenant_names(&operator).await,
        tenants,
        "nothing was created"
    );

    let created = operator
        .post_json("/v1/tenants", &json!({ "name": "acme" }))
        .await
        .expect(201);
    assert_eq!(created["name"], "acme", "{created}");
    assert!(created["created_at_ms"].is_u64(), "{created}");
    for name in ["acme", "default"] {
        operator
            .post_json("/v1/tenants", &json!({ "name": name }))
            .await
            .expect_error(409, "tenant_exists");
    }
    operator
        .delete("/v1/tenants/default")
        .await
        .expect_error(400, "invalid_tenant");
    operator
        .delete("/v1/tenants/nobody")
        .await
        .expect_error(404, "tenant_not_found");
    operator
        .delete("/v1/tenants/a%2Fb")
        .await
        .expect_error(400, "invalid_tenant_name");
    operator
        .post_json(
            "/v1/keys",
            &json!({ "name": "x", "role": "reader", "tenant": "nobody" }),
        )
        .await
        .expect_error(404, "tenant_not_found");
    operator
        .post_json(
            "/v1/keys",
            &json!({ "name": "x", "role": "reader", "tenant": "a/b" }),
        )
        .await
        .expect_error(400, "invalid_tenant_name");
    let listed = operator.get("/v1/tenants").await.expect(200);
    let in_order: Vec<&str> = listed["tenants"]
        .as_array()
        .expect("a list of tenants")
        .iter()
        .map(|tenant| tenant["name"].as_str().expect("a tenant name"))
        .collect();
    assert_eq!(in_order, ["default", "acme"], "{listed}");

    let mut keys = BTreeMap::new();
    for role in ROLES {
        let created = operator
            .post_json(
                "/v1/keys",
                &json!({ "name": format!("acme {role}"), "role": role, "tenant": "acme" }),
            )
            .await
            .expect(201);
        keys.insert(role, created);
    }
    let client = |role: &str| ApiClient::with_key(url, keys[role]["key"].as_str());
    let (admin, editor, reader) = (client("admin"), client("editor"), client("reader"));
    editor.create_kb(json!({ "name": "docs" })).await;
    let before = kb_snapshot(&editor).await;

    // A tenant's admin manages its own tenant's keys, and nothing of the node's.
    for body in [
        json!({ "name": "own", "role": "reader" }),
        json!({ "name": "own", "role": "editor", "tenant": "acme" }),
    ] {
        let created = admin.post_json("/v1/keys", &body).await.expect(201);
        assert_eq!(created["tenant"], "acme", "{created}");
        assert!(
            created["key"]
                .as_str()
                .is_some_and(|key| key.starts_with("sk-sift-")),
            "{created}"
        );
    }
    // Another tenant is 403 whether it exists or not: no probing for tenant names.
    for tenant in ["default", "nobody"] {
        admin
            .post_json(
                "/v1/keys",
                &json!({ "name": "escalate", "role": "admin", "tenant": tenant }),
            )
            .await
            .expect_error(403, "forbidden");
    }
    for (method, path, body) in [
        (Method::GET, "/v1/tenants", Value::Null),
        (Method::POST, "/v1/tenants", json!({ "name": "mine" })),
        (Method::DELETE, "/v1/tenants/acme", Value::Null),
        (Method::GET, "/v1/cluster", Value::Null),
        (Method::DELETE, "/v1/cluster/nodes/1", Value::Null),
        (Method::POST, "/v1/debug/reconciler/crash", Value::Null),
        (
            Method::POST,
            "/v1/debug/kbs/docs/shards/0/crash",
            Value::Null,
        ),
        (Method::GET, "/metrics", Value::Null),
    ] {
        call(&admin, method, path, &body)
            .await
            .expect_error(403, "forbidden");
    }

    // A reader changes nothing and reaches no admin route.
    let document = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    let delete_document = format!("/v1/kbs/docs/documents/{document}");
    let revoke = format!("/v1/keys/{}", keys["editor"]["id"].as_str().expect("an id"));
    for (method, path, body) in [
        (Method::POST, "/v1/kbs", json!({ "name": "mine" })),
        (Method::PATCH, "/v1/kbs/docs", json!({ "chunk_tokens": 64 })),
        (Method::DELETE, "/v1/kbs/docs", Value::Null),
        (
            Method::POST,
            "/v1/kbs/docs/documents",
            json!({ "documents": [text_document("x", "X", "A reader's document.")] }),
        ),
        (Method::DELETE, delete_document.as_str(), Value::Null),
        (Method::PUT, "/v1/kbs/docs/shares/default", Value::Null),
        (Method::DELETE, "/v1/kbs/docs/shares/default", Value::Null),
        (
            Method::POST,
            "/v1/keys",
            json!({ "name": "escalate", "role": "admin" }),
        ),
        (Method::GET, "/v1/keys", Value::Null),
        (Method::DELETE, revoke.as_str(), Value::Null),
        (Method::GET, "/v1/tenants", Value::Null),
        (Method::POST, "/v1/tenants", json!({ "name": "mine" })),
        (Method::DELETE, "/v1/tenants/acme", Value::Null),
        (Method::GET, "/v1/cluster", Value::Null),
        (Method::GET, "/metrics", Value::Null),
    ] {
        let answer = call(&reader, method.clone(), path, &body).await;
        assert_eq!(
            answer.status, 403,
            "{method} {path} by a reader: {}",
            answer.body
        );
        answer.expect_error(403, "forbidden");
    }
    // An editor makes no keys either.
    editor
        .post_json("/v1/keys", &json!({ "name": "escalate", "role": "reader" }))
        .await
        .expect_error(403, "forbidden");

    assert_eq!(kb_snapshot(&editor).await, before);
    editor.get("/v1/kbs/docs").await.expect(200);
    ApiClient::with_key(url, keys["editor"]["key"].as_str())
        .get("/v1/kbs")
        .await
        .expect(200);
    assert_eq!(tenant_names(&operator).await, names(&["acme", "default"]));
    node.shutdown().await;
}

/// A cluster of three `sift serve` processes: tenants, keys and KBs are made through the
/// leader; on each follower `globex`'s keys reach nothing of `acme`'s (404 on every read,
/// search and write route, no `acme` data in any answer) and find their own canary. A key
/// revoked through the leader is refused by the leader at once and by every follower within
/// [`REVOKE_REACHES_EVERY_NODE`], and stays refused; the tenant's other keys keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_keeps_tenants_apart_and_refuses_a_revoked_key() {
    let dir = temp_dir();
    let internal: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let data: Vec<_> = (0..3).map(|i| dir.path().join(format!("n{i}"))).collect();
    let first = start_member(&data[0], &internal[0], None);
    first.require_embedded_model().await;
    let second = start_member(&data[1], &internal[1], Some(&first.url));
    let third = start_member(&data[2], &internal[2], Some(&first.url));
    let nodes = [first, second, third];
    let clients: Vec<ApiClient> = nodes.iter().map(NodeProcess::client).collect();
    let (ids, leader) = wait_for_voters(&clients).await;
    let leader_index = ids
        .iter()
        .position(|id| *id == leader)
        .expect("the leader is one of the nodes");
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader_index).collect();
    let urls: Vec<&str> = nodes.iter().map(|node| node.url.as_str()).collect();
    let (acme, globex) = two_tenants(urls[leader_index]).await;

    // Each follower has applied everything: both tenants find their canary there (so a 404
    // below is tenancy, not a follower that lags).
    for &index in &followers {
        for tenant in [&acme, &globex] {
            let reader = tenant.client(urls[index], "reader");
            let reader = &reader;
            eventually("the tenant's canary searchable on a follower", || async {
                let answer = reader
                    .search_answer(
                        "docs",
                        json!({ "query": tenant.canary, "channels": ["bm25"], "top_k": 5 }),
                    )
                    .await;
                (answer.status == 200
                    && document_ids(&answer.body)
                        .first()
                        .is_some_and(|id| id == tenant.canary_document()))
                .then_some(())
            })
            .await;
        }
    }

    for &index in &followers {
        let watched: Vec<Watched> = ROLES
            .iter()
            .map(|role| Watched::new(globex.client(urls[index], role)))
            .collect();
        for globex_client in &watched {
            assert_kb_unreachable(globex_client, &acme).await;
            assert_own_kb_holds_only_its_own(globex_client, &globex, &acme).await;
            globex_client
                .get("/metrics")
                .await
                .expect_error(403, "forbidden");
        }
        assert_kb_unwritable(&watched[1], &globex, &acme, 404, "kb_not_found").await;
        let keys = watched[0].get("/v1/keys").await.expect(200);
        assert!(
            keys["keys"]
                .as_array()
                .expect("a list of keys")
                .iter()
                .all(|key| key["tenant"] == "globex"),
            "{keys}"
        );
        watched[0]
            .get("/v1/cluster")
            .await
            .expect_error(403, "forbidden");
        for globex_client in &watched {
            let exchanges = globex_client.assert_free_of(&acme.markers());
            assert!(exchanges >= 50, "only {exchanges} answers were checked");
        }
    }
    // Acme's data is whole, seen from a follower.
    assert_eq!(
        count(
            &acme
                .client(urls[followers[0]], "editor")
                .counts("docs")
                .await,
            "total"
        ),
        DOCUMENTS as u64
    );

    // Revoke globex's reader key through the leader.
    let revoked = ApiClient::new(urls[leader_index])
        .delete(&format!("/v1/keys/{}", globex.key_id("reader")))
        .await
        .expect(200);
    assert!(revoked["revoked_at_ms"].is_u64(), "{revoked}");
    let answer = globex
        .client(urls[leader_index], "reader")
        .get("/v1/kbs")
        .await;
    assert_eq!(
        answer.status, 401,
        "the leader applied the revoke before answering: {}",
        answer.body
    );
    for &index in &followers {
        let reader = globex.client(urls[index], "reader");
        refused_within(&reader, REVOKE_REACHES_EVERY_NODE).await;
    }
    for url in &urls {
        let reader = globex.client(url, "reader");
        for _ in 0..5 {
            let answer = reader
                .search_answer("docs", json!({ "query": globex.canary }))
                .await;
            assert_eq!(
                answer.status, 401,
                "a revoked key stays refused: {}",
                answer.body
            );
        }
        globex
            .client(url, "editor")
            .get("/v1/kbs/docs")
            .await
            .expect(200);
    }
}

// ---- helpers ----

/// One tenant's made-up words (see the file's doc).
struct TenantSpec {
    name: &'static str,
    /// In its canary document; BM25 matches it exactly. Another tenant may send it.
    canary: &'static str,
    /// In the same sentence as the canary; no other tenant ever sends it.
    secret: &'static str,
}

/// A key as its creation answered it.
struct Key {
    text: String,
    id: String,
}

/// One tenant as [`two_tenants`] made it.
struct Tenant {
    name: &'static str,
    canary: &'static str,
    secret: &'static str,
    /// Its keys by role.
    keys: BTreeMap<&'static str, Key>,
    /// The id of its KB `docs`.
    kb_id: String,
    /// The documents of `docs`, its canary document first.
    document_ids: Vec<String>,
}

impl Tenant {
    fn client(&self, url: &str, role: &str) -> ApiClient {
        ApiClient::with_key(url, Some(&self.keys[role].text))
    }

    fn key_id(&self, role: &str) -> &str {
        &self.keys[role].id
    }

    fn canary_document(&self) -> &str {
        &self.document_ids[0]
    }

    /// A question that the canary document answers.
    fn question(&self) -> String {
        format!(
            "Which combination opens the vault ledger tagged {}?",
            self.canary
        )
    }

    /// What no answer to another tenant may hold: the secret, the ids of its KB, its
    /// documents and its keys.
    fn markers(&self) -> Vec<String> {
        let mut markers = vec![self.secret.to_string(), self.kb_id.clone()];
        markers.extend(self.document_ids.iter().cloned());
        markers.extend(self.keys.values().map(|key| key.id.clone()));
        markers
    }
}

/// The canary document of `spec`: one sentence holds both the canary and the secret, so an
/// extractive answer or a hit that quotes one quotes the other.
fn canary_document(spec: &TenantSpec) -> Value {
    let TenantSpec {
        name,
        canary,
        secret,
    } = spec;
    text_document(
        &format!("{name}-vault"),
        &format!("The {name} vault"),
        &format!(
            "The tenant {name} keeps one vault for its ledgers. The vault ledger is tagged {canary} and its combination is {secret}. Nobody outside {name} may read the ledger."
        ),
    )
}

/// Makes the tenants `acme` and `globex` through the operator at `url`, an admin, an editor
/// and a reader key of each, and through each editor a KB `docs` (2 shards) holding the
/// tenant's canary document and the same SciFact abstracts; waits until every document is
/// ready.
async fn two_tenants(url: &str) -> (Tenant, Tenant) {
    let operator = ApiClient::new(url);
    let mut tenants = Vec::new();
    for spec in [ACME, GLOBEX] {
        let created = operator
            .post_json("/v1/tenants", &json!({ "name": spec.name }))
            .await
            .expect(201);
        assert_eq!(created["name"], spec.name, "{created}");
        let mut keys = BTreeMap::new();
        for role in ROLES {
            let created = operator
                .post_json(
                    "/v1/keys",
                    &json!({ "name": format!("{} {role}", spec.name), "role": role, "tenant": spec.name }),
                )
                .await
                .expect(201);
            assert_eq!(created["tenant"], spec.name, "{created}");
            assert_eq!(created["role"], role, "{created}");
            keys.insert(
                role,
                Key {
                    text: created["key"].as_str().expect("the key's text").to_string(),
                    id: created["id"].as_str().expect("the key's id").to_string(),
                },
            );
        }
        let mut tenant = Tenant {
            name: spec.name,
            canary: spec.canary,
            secret: spec.secret,
            keys,
            kb_id: String::new(),
            document_ids: Vec::new(),
        };
        let editor = tenant.client(url, "editor");
        let kb = editor
            .create_kb(json!({ "name": "docs", "shards": 2 }))
            .await;
        assert_eq!(kb["tenant"], spec.name, "{kb}");
        tenant.kb_id = kb["id"].as_str().expect("a KB id").to_string();
        let mut documents = vec![canary_document(&spec)];
        documents.extend(bulk_documents(&short_documents(SCIFACT_DOCUMENTS)));
        tenant.document_ids = editor.bulk_add("docs", &documents).await;
        tenants.push(tenant);
    }
    for tenant in &tenants {
        tenant
            .client(url, "editor")
            .wait_ready("docs", DOCUMENTS as u64, ingest_deadline(DOCUMENTS))
            .await;
    }
    let globex = tenants.pop().expect("two tenants");
    let acme = tenants.pop().expect("two tenants");
    assert_ne!(acme.kb_id, globex.kb_id);
    assert!(
        acme.document_ids
            .iter()
            .all(|id| !globex.document_ids.contains(id)),
        "the same text in two tenants is two documents: {:?} {:?}",
        acme.document_ids,
        globex.document_ids
    );
    (acme, globex)
}

/// A client whose every answer is kept, to check at the end that none holds another
/// tenant's data ([`Watched::assert_free_of`]).
struct Watched {
    client: ApiClient,
    /// (the request as text, the answer as text), in order.
    exchanges: Mutex<Vec<(String, String)>>,
}

impl Watched {
    fn new(client: ApiClient) -> Watched {
        Watched {
            client,
            exchanges: Mutex::new(Vec::new()),
        }
    }

    fn describe(&self) -> String {
        format!("the client of {}", self.client.url())
    }

    fn note(&self, request: String, answer: String) {
        self.exchanges
            .lock()
            .expect("the exchanges lock")
            .push((request, answer));
    }

    async fn call(&self, method: Method, path: &str, body: &Value) -> Answer {
        let answer = call(&self.client, method.clone(), path, body).await;
        self.note(format!("{method} {path} {body}"), answer.body.to_string());
        answer
    }

    async fn get(&self, path: &str) -> Answer {
        self.call(Method::GET, path, &Value::Null).await
    }

    async fn delete(&self, path: &str) -> Answer {
        self.call(Method::DELETE, path, &Value::Null).await
    }

    async fn post_json(&self, path: &str, body: &Value) -> Answer {
        self.call(Method::POST, path, body).await
    }

    async fn patch_json(&self, path: &str, body: &Value) -> Answer {
        self.call(Method::PATCH, path, body).await
    }

    async fn upload(&self, kb: &str, file_name: &str, bytes: Vec<u8>) -> Answer {
        let answer = self.client.upload(kb, file_name, bytes).await;
        self.note(
            format!("POST /v1/kbs/{kb}/documents (upload {file_name})"),
            answer.body.to_string(),
        );
        answer
    }

    /// `POST path` with `body` as an event stream, read to its end.
    async fn stream(&self, path: &str, body: &Value) -> Vec<SseEvent> {
        let events = SseReader::open(self.client.request(Method::POST, path).json(body))
            .await
            .rest()
            .await;
        self.note(format!("POST {path} {body}"), events_text(&events));
        events
    }

    /// Asks `content` in `session`; the run's events to its end.
    async fn ask(&self, session: &str, content: &str) -> Vec<SseEvent> {
        let events = sift_tests::sse::ask(&self.client, session, content)
            .await
            .rest()
            .await;
        self.note(
            format!("POST /v1/sessions/{session}/messages {content}"),
            events_text(&events),
        );
        events
    }

    /// Every event of the run `run`.
    async fn follow(&self, run: &str) -> Vec<SseEvent> {
        let events = follow_run(&self.client, run, None).await.rest().await;
        self.note(format!("GET /v1/runs/{run}/events"), events_text(&events));
        events
    }

    /// Checks that no answer holds any of `markers` (case-insensitively), but where its
    /// request carried the marker itself. Returns the number of answers checked.
    fn assert_free_of(&self, markers: &[String]) -> usize {
        let exchanges = self.exchanges.lock().expect("the exchanges lock");
        for (request, answer) in exchanges.iter() {
            let request = request.to_lowercase();
            let answer = answer.to_lowercase();
            for marker in markers {
                let marker = marker.to_lowercase();
                if request.contains(&marker) {
                    continue;
                }
                assert!(
                    !answer.contains(&marker),
                    "{} leaked {marker:?} to {request}: {answer}",
                    self.describe()
                );
            }
        }
        exchanges.len()
    }
}

fn events_text(events: &[SseEvent]) -> String {
    events
        .iter()
        .map(|event| format!("{} {}\n", event.event, event.data))
        .collect()
}

/// A request with a JSON body, or none when `body` is null.
async fn call(client: &ApiClient, method: Method, path: &str, body: &Value) -> Answer {
    let request = client.request(method, path);
    let request = if body.is_null() {
        request
    } else {
        request.json(body)
    };
    client.send(request).await
}

/// Search bodies of every channel and option, all for `query`; the last one filters to
/// `document_ids`.
fn searches(query: &str, document_ids: &[String]) -> Vec<Value> {
    vec![
        json!({ "query": query, "top_k": 10 }),
        json!({ "query": query, "top_k": 10, "channels": ["bm25"] }),
        json!({ "query": query, "top_k": 10, "channels": ["dense"] }),
        json!({ "query": query, "top_k": 10, "channels": ["dense"], "exact": true }),
        json!({ "query": query, "top_k": 10, "channels": ["dense", "bm25"], "fusion": "rrf",
                "rrf_k": 10.0, "weights": { "dense": 0.5, "bm25": 2.0 } }),
        json!({ "query": query, "top_k": 50, "candidates": 200, "explain": true }),
        json!({ "query": query, "top_k": 10, "expand_neighbours": 2, "expand_parent": true,
                "context_tokens": 4000 }),
        json!({ "query": query, "top_k": 10, "multi_query": true,
                "queries": ["which combination opens the vault ledger"] }),
        json!({ "query": query, "top_k": 10, "follow_links": true, "mmr": true,
                "mmr_lambda": 0.5, "duplicate_similarity": 0.95 }),
        json!({ "query": query, "top_k": 10, "rerank": true, "rerank_depth": 20,
                "min_results": 1, "min_relative_score": 0.0 }),
        json!({ "query": query, "top_k": 10, "filters": { "document_ids": document_ids } }),
    ]
}

/// An OpenAI-compatible chat request to the `default` agent preset over `kb`.
fn chat_request(question: &str, kb: &str, stream: bool) -> Value {
    json!({
        "model": "default",
        "messages": [{ "role": "user", "content": question }],
        "stream": stream,
        "sift": { "kbs": [kb] },
    })
}

/// Every read route of `other`'s KB, by its id and by its qualified name, of its documents,
/// and a session or chat over it: each is 404 `kb_not_found`, as for a KB that does not
/// exist.
async fn assert_kb_unreachable(watched: &Watched, other: &Tenant) {
    let qualified = format!("{}:docs", other.name);
    for kb in [other.kb_id.as_str(), qualified.as_str()] {
        for path in [
            format!("/v1/kbs/{kb}"),
            format!("/v1/kbs/{kb}/documents"),
            format!("/v1/kbs/{kb}/shards"),
        ] {
            watched.get(&path).await.expect_error(404, "kb_not_found");
        }
        for body in searches(other.canary, &other.document_ids) {
            watched
                .post_json(&format!("/v1/kbs/{kb}/search"), &body)
                .await
                .expect_error(404, "kb_not_found");
        }
        for document in &other.document_ids {
            for tail in ["", "/chunks", "/events"] {
                watched
                    .get(&format!("/v1/kbs/{kb}/documents/{document}{tail}"))
                    .await
                    .expect_error(404, "kb_not_found");
            }
        }
        for kbs in [json!([kb]), json!(["docs", kb])] {
            watched
                .post_json("/v1/sessions", &json!({ "kbs": kbs }))
                .await
                .expect_error(404, "kb_not_found");
        }
        watched
            .post_json(
                "/v1/chat/completions",
                &chat_request(&other.question(), kb, false),
            )
            .await
            .expect_error(404, "kb_not_found");
    }
}

/// Every change to `other`'s KB by `own`'s client, by its id and by its qualified name:
/// adding documents (JSON and upload), changing its settings, deleting a document, sharing
/// it, deleting it. Each is `status` `code`: 404 `kb_not_found` when it is not shared with
/// `own`, 403 `kb_read_only` when it is.
async fn assert_kb_unwritable(
    watched: &Watched,
    own: &Tenant,
    other: &Tenant,
    status: u16,
    code: &str,
) {
    let qualified = format!("{}:docs", other.name);
    for kb in [other.kb_id.as_str(), qualified.as_str()] {
        let intruder = text_document("intruder", "Intruder", "Written by another tenant.");
        watched
            .post_json(
                &format!("/v1/kbs/{kb}/documents"),
                &json!({ "documents": [intruder] }),
            )
            .await
            .expect_error(status, code);
        watched
            .upload(kb, "intruder.txt", b"Written by another tenant.".to_vec())
            .await
            .expect_error(status, code);
        watched
            .patch_json(&format!("/v1/kbs/{kb}"), &json!({ "chunk_tokens": 64 }))
            .await
            .expect_error(status, code);
        watched
            .delete(&format!(
                "/v1/kbs/{kb}/documents/{}",
                other.canary_document()
            ))
            .await
            .expect_error(status, code);
        let share = format!("/v1/kbs/{kb}/shares/{}", own.name);
        watched
            .call(Method::PUT, &share, &Value::Null)
            .await
            .expect_error(status, code);
        watched.delete(&share).await.expect_error(status, code);
        watched
            .delete(&format!("/v1/kbs/{kb}"))
            .await
            .expect_error(status, code);
    }
}

/// `own`'s client reads and searches its own KB `docs` with `other`'s canary, document ids
/// and external id, with every search option: every answer holds `own`'s documents only;
/// BM25 finds nothing for `other`'s canary and everything for `own`'s.
async fn assert_own_kb_holds_only_its_own(watched: &Watched, own: &Tenant, other: &Tenant) {
    let kb = watched.get("/v1/kbs/docs").await.expect(200);
    assert_eq!(kb["id"], own.kb_id.as_str(), "{kb}");
    assert_eq!(kb["tenant"], own.name, "{kb}");
    assert_eq!(kb["documents"]["total"], DOCUMENTS as u64, "{kb}");
    let listed = watched.get("/v1/kbs").await.expect(200);
    assert_eq!(kb_ids(&listed), vec![own.kb_id.clone()], "{listed}");
    for kb in listed["kbs"].as_array().expect("a list of KBs") {
        assert_eq!(kb["tenant"], own.name, "{kb}");
    }
    let documents = watched
        .get("/v1/kbs/docs/documents?limit=1000")
        .await
        .expect(200);
    assert_eq!(
        sorted_ids(&documents["documents"]),
        sorted(&own.document_ids)
    );
    let external = format!("{}-vault", other.name);
    for document in other.document_ids.iter().chain([&external]) {
        for tail in ["", "/chunks", "/events"] {
            watched
                .get(&format!("/v1/kbs/docs/documents/{document}{tail}"))
                .await
                .expect_error(404, "document_not_found");
        }
    }
    for body in searches(other.canary, &other.document_ids) {
        let answer = watched
            .post_json("/v1/kbs/docs/search", &body)
            .await
            .expect(200);
        assert_hits_only_of(&answer, own, &body);
        for hit in hits(&answer) {
            let text = hit["text"].as_str().unwrap_or_default().to_lowercase();
            assert!(
                !text.contains(&other.canary.to_lowercase()),
                "{body}: {hit}"
            );
        }
    }
    // BM25 matches words exactly: the other tenant's canary is in none of own's documents,
    // and a filter to the other tenant's documents leaves nothing.
    for body in [
        json!({ "query": other.canary, "channels": ["bm25"], "top_k": 10 }),
        json!({ "query": other.canary, "filters": { "document_ids": other.document_ids } }),
    ] {
        let answer = watched
            .post_json("/v1/kbs/docs/search", &body)
            .await
            .expect(200);
        assert!(hits(&answer).is_empty(), "{body}: {answer}");
    }
    // Its own canary is found, by BM25 and by the default channels.
    for body in [
        json!({ "query": own.canary, "channels": ["bm25"], "top_k": 5 }),
        json!({ "query": own.question(), "top_k": 5 }),
    ] {
        let answer = watched
            .post_json("/v1/kbs/docs/search", &body)
            .await
            .expect(200);
        assert_top_hit_is_canary(&answer, own, &body);
    }
    // The abstracts both tenants hold: found, as own's documents.
    let title = short_documents(1)[0].title.clone();
    let answer = watched
        .post_json(
            "/v1/kbs/docs/search",
            &json!({ "query": title, "top_k": 5 }),
        )
        .await
        .expect(200);
    assert!(!hits(&answer).is_empty(), "{answer}");
    assert_hits_only_of(&answer, own, &json!(title));
}

/// `other`'s session and run, through `watched`: 404 on every route, as if neither existed,
/// and not in the list of sessions.
async fn assert_session_unreachable(watched: &Watched, session: &str, run: &str) {
    for path in [
        format!("/v1/sessions/{session}"),
        format!("/v1/sessions/{session}/messages"),
    ] {
        watched
            .get(&path)
            .await
            .expect_error(404, "session_not_found");
    }
    watched
        .post_json(
            &format!("/v1/sessions/{session}/messages"),
            &json!({ "content": "What did you find?" }),
        )
        .await
        .expect_error(404, "session_not_found");
    watched
        .delete(&format!("/v1/sessions/{session}"))
        .await
        .expect_error(404, "session_not_found");
    for path in [format!("/v1/runs/{run}"), format!("/v1/runs/{run}/events")] {
        watched.get(&path).await.expect_error(404, "run_not_found");
    }
    watched
        .post_json(&format!("/v1/runs/{run}/stop"), &json!({}))
        .await
        .expect_error(404, "run_not_found");
    let listed = watched.get("/v1/sessions").await.expect(200);
    assert!(
        !session_ids(&listed).iter().any(|id| id == session),
        "{listed}"
    );
}

/// Searches `kb` through `client` for `tenant`'s canary by BM25: its canary document is the
/// top hit, with the secret in its text.
async fn assert_finds_own_canary(client: &ApiClient, tenant: &Tenant, kb: &str) {
    let body = json!({ "query": tenant.canary, "channels": ["bm25"], "top_k": 5 });
    let answer = client.search(kb, body.clone()).await;
    assert_top_hit_is_canary(&answer, tenant, &body);
}

#[track_caller]
fn assert_top_hit_is_canary(answer: &Value, tenant: &Tenant, query: &Value) {
    let found = hits(answer);
    let top = found
        .first()
        .unwrap_or_else(|| panic!("no hit for {query}: {answer}"));
    assert_eq!(
        top["document_id"],
        tenant.canary_document(),
        "{query}: {answer}"
    );
    assert!(
        top["text"]
            .as_str()
            .is_some_and(|text| text.contains(tenant.secret)),
        "{query}: {top}"
    );
}

#[track_caller]
fn assert_hits_only_of(answer: &Value, tenant: &Tenant, query: &Value) {
    for document in document_ids(answer) {
        assert!(
            tenant.document_ids.contains(&document),
            "a hit of a document not {}'s for {query}: {answer}",
            tenant.name
        );
    }
}

/// The cited documents of a run's events.
fn event_citations(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|event| event.event == "citation")
        .filter_map(|event| event.data["document_id"].as_str().map(str::to_string))
        .collect()
}

/// The cited documents of an OpenAI-compatible answer (or its last chunk).
fn chat_citations(answer: &Value) -> Vec<String> {
    answer["sift"]["citations"]
        .as_array()
        .unwrap_or_else(|| panic!("citations in the sift extension: {answer}"))
        .iter()
        .filter_map(|citation| citation["document_id"].as_str().map(str::to_string))
        .collect()
}

#[track_caller]
fn assert_cites_only(cited: &[String], tenant: &Tenant) {
    for document in cited {
        assert!(
            tenant.document_ids.contains(document),
            "cites {document}, not a document of {} ({:?})",
            tenant.name,
            tenant.document_ids
        );
    }
}

/// What a refused change would alter in a KB: its settings, its last update, its counts and
/// its documents.
async fn kb_snapshot(client: &ApiClient) -> Value {
    let kb = client.get("/v1/kbs/docs").await.expect(200);
    let documents: Vec<Value> = client
        .list_all_documents("docs", 100)
        .await
        .iter()
        .map(|document| json!([document["id"], document["status"]]))
        .collect();
    json!({
        "id": kb["id"],
        "settings": kb["settings"],
        "updated_at_ms": kb["updated_at_ms"],
        "documents": kb["documents"],
        "listed": documents,
    })
}

/// The ids of the KBs of a `GET /v1/kbs` answer, in order.
fn kb_ids(listed: &Value) -> Vec<String> {
    listed["kbs"]
        .as_array()
        .unwrap_or_else(|| panic!("a list of KBs: {listed}"))
        .iter()
        .map(|kb| kb["id"].as_str().expect("a KB id").to_string())
        .collect()
}

/// The `id`s of a list of records, sorted.
fn sorted_ids(records: &Value) -> Vec<String> {
    let mut ids: Vec<String> = records
        .as_array()
        .unwrap_or_else(|| panic!("a list: {records}"))
        .iter()
        .map(|record| record["id"].as_str().expect("an id").to_string())
        .collect();
    ids.sort();
    ids
}

fn sorted(ids: &[String]) -> Vec<String> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids
}

/// A set of tenant names.
fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|name| name.to_string()).collect()
}

/// The names of the tenants the operator lists.
async fn tenant_names(operator: &ApiClient) -> BTreeSet<String> {
    let listed = operator.get("/v1/tenants").await.expect(200);
    listed["tenants"]
        .as_array()
        .unwrap_or_else(|| panic!("a list of tenants: {listed}"))
        .iter()
        .map(|tenant| tenant["name"].as_str().expect("a tenant name").to_string())
        .collect()
}

fn start_member(data_dir: &std::path::Path, internal: &str, join: Option<&str>) -> NodeProcess {
    NodeProcess::start_member(data_dir, CLUSTER_SECRET, internal, join, &[])
}

/// Polls `GET /v1/kbs` with `client`'s key until it is refused with 401; fails if it is still
/// served after `bound`.
async fn refused_within(client: &ApiClient, bound: Duration) {
    let started = Instant::now();
    loop {
        let answer = client.get("/v1/kbs").await;
        if answer.status == 401 {
            return;
        }
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            started.elapsed() < bound,
            "{} still serves the key {bound:?} after its revoke returned",
            client.url()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
