//! Ingestion through the public API: each file format is parsed into searchable text, progress
//! streams as server-sent events, deletes are final, and a KB's lifecycle (counts, settings,
//! listing, deletion) behaves as documented.

use futures::StreamExt;
use serde_json::{Value, json};
use sift_tests::{
    ApiClient, InProcessNode, WAIT, bulk_documents, count, document_ids, hits, ingest_deadline,
    short_documents, temp_dir, text_document,
};

const KB: &str = "files";

async fn new_kb(client: &ApiClient) {
    client.create_kb(json!({ "name": KB, "shards": 2 })).await;
}

/// Uploads a file, waits until it is ready, returns its id.
async fn upload_ready(client: &ApiClient, file_name: &str, bytes: Vec<u8>) -> String {
    let added = client.upload_ok(KB, file_name, bytes).await;
    assert_eq!(added["duplicate"], false, "{added}");
    let id = added["id"].as_str().expect("an id").to_string();
    let record = client.wait_document(KB, &id, WAIT).await;
    assert_eq!(record["status"], "ready", "{file_name}: {record}");
    id
}

async fn search(client: &ApiClient, query: &str, channels: &[&str]) -> Value {
    client
        .search(
            KB,
            json!({ "query": query, "top_k": 10, "channels": channels }),
        )
        .await
}

/// The hits of `answer` that belong to document `id`.
fn hits_of(answer: &Value, id: &str) -> Vec<Value> {
    hits(answer)
        .into_iter()
        .filter(|hit| hit["document_id"] == id)
        .collect()
}

const MARKDOWN: &str = "# Tea Guide

A short guide to brewing and keeping tea.

## Brewing Green Tea

Steep green tea leaves at eighty degrees for two minutes. Boiling water scalds the leaves
and makes the cup bitter, so let the kettle rest after it boils.

## Storing Oolong

Keep oolong in an airtight tin, away from light, moisture and strong smells.
";

const HTML: &str = r#"<!DOCTYPE html>
<html><head><title>Kettle Maintenance</title>
<script>var tracker = "quokkascript";</script>
<style>.banner { color: red } /* stylewallaby */</style></head>
<body>
<nav><a href="/">Home</a> <a href="/shop">navwombat shop</a></nav>
<h1>Kettle Maintenance</h1>
<p>Descale the kettle every month with citric acid to dissolve limescale deposits.</p>
<p>Rinse it twice before boiling water for tea again.</p>
<script>document.write("quokkascript footer widget");</script>
<footer>footerplatypus copyright notice</footer>
</body></html>"#;

const JSONL: &str = r#"{"title": "Cheese Notes", "text": "Gruyere ages in damp caves for ten months or more."}
{"text": "Roquefort is ripened with the mould Penicillium roqueforti in limestone caves."}
"#;

const CHINESE: &str = "普洱茶的储存方法与绿茶完全不同。绿茶应当密封冷藏，避免阳光直射和潮湿，最好在一年之内喝完。\
普洱茶则需要通风良好、没有异味的环境，温度和湿度都要适中，可以长期存放，人们常说普洱茶越陈越香。\
储存普洱茶时不要使用冰箱，也不要和香料、樟脑等气味浓重的东西放在一起。";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_of_each_format_are_parsed_and_searchable() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;

    // Markdown: heading paths, and chunks that carry their context.
    let markdown = upload_ready(&client, "tea-guide.md", MARKDOWN.as_bytes().to_vec()).await;
    assert_eq!(client.document(KB, &markdown).await["title"], "Tea Guide");
    let answer = search(
        &client,
        "eighty degrees boiling water scalds leaves",
        &["bm25"],
    )
    .await;
    let found = hits_of(&answer, &markdown);
    let brewing = found
        .iter()
        .find(|hit| hit["text"].as_str().unwrap().contains("eighty degrees"))
        .unwrap_or_else(|| panic!("the brewing section is found: {answer}"));
    let heading: Vec<&str> = brewing["heading_path"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert_eq!(
        heading.last(),
        Some(&"Brewing Green Tea"),
        "heading path {heading:?}"
    );
    assert!(heading.contains(&"Tea Guide"), "heading path {heading:?}");
    let text = brewing["text"].as_str().unwrap();
    assert!(
        text.starts_with("[Context: "),
        "a chunk starts with its context: {text:?}"
    );
    let context = text.lines().next().unwrap();
    assert!(
        context.contains("Brewing Green Tea"),
        "context line {context:?}"
    );
    assert!(
        !text.contains("airtight tin"),
        "the next section is its own chunk: {text:?}"
    );
    let storing = search(&client, "airtight tin oolong", &["bm25"]).await;
    let storing = hits_of(&storing, &markdown);
    assert_eq!(
        storing[0]["heading_path"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        "Storing Oolong",
        "{storing:?}"
    );

    // HTML: scripts, styles, navigation and footers are not content.
    let html = upload_ready(&client, "kettle.html", HTML.as_bytes().to_vec()).await;
    assert_eq!(
        client.document(KB, &html).await["title"],
        "Kettle Maintenance"
    );
    let found = search(&client, "citric acid limescale", &["bm25"]).await;
    assert!(
        !hits_of(&found, &html).is_empty(),
        "the body text is indexed: {found}"
    );
    for hidden in [
        "quokkascript",
        "navwombat",
        "stylewallaby",
        "footerplatypus",
        "tracker",
    ] {
        for channels in [&["bm25"][..], &["dense", "bm25"][..]] {
            let answer = search(&client, hidden, channels).await;
            for hit in hits_of(&answer, &html) {
                assert!(
                    !hit["text"].as_str().unwrap().contains(hidden),
                    "{hidden:?} leaked into the indexed text: {hit}"
                );
            }
            if channels == ["bm25"] {
                assert!(
                    hits_of(&answer, &html).is_empty(),
                    "bm25 finds {hidden:?}: {answer}"
                );
            }
        }
    }
    let chunks = client
        .get(&format!("/v1/kbs/{KB}/documents/{html}/chunks"))
        .await
        .expect(200);
    let all_text: String = chunks["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert!(all_text.contains("Rinse it twice"), "{all_text:?}");
    assert!(
        !all_text.contains("Home"),
        "navigation is not content: {all_text:?}"
    );

    // JSON Lines: the text field of every record, the title of the first.
    let jsonl = upload_ready(&client, "cheese.jsonl", JSONL.as_bytes().to_vec()).await;
    assert_eq!(client.document(KB, &jsonl).await["title"], "Cheese Notes");
    for query in ["Penicillium roqueforti ripened", "Gruyere damp caves"] {
        let answer = search(&client, query, &["bm25"]).await;
        assert!(!hits_of(&answer, &jsonl).is_empty(), "{query:?}: {answer}");
    }

    // GBK-encoded Chinese, found by a Chinese question and decoded without mojibake.
    let (gbk, _, unmappable) = encoding_rs::GBK.encode(CHINESE);
    assert!(!unmappable);
    let chinese = upload_ready(&client, "puer-gbk.txt", gbk.into_owned()).await;
    for channels in [&["bm25"][..], &["dense", "bm25"][..]] {
        let answer = search(&client, "普洱茶应该怎么储存？", channels).await;
        let found = hits_of(&answer, &chinese);
        assert!(
            !found.is_empty(),
            "{channels:?}: the GBK document answers a Chinese query: {answer}"
        );
        assert_eq!(
            document_ids(&answer)[0],
            chinese,
            "it ranks first: {answer}"
        );
        let text = found[0]["text"].as_str().unwrap();
        assert!(text.contains("越陈越香"), "decoded as GBK: {text:?}");
    }

    // UTF-16, little-endian with a BOM and big-endian without one.
    let sencha = "Sencha is a Japanese green tea whose leaves are steamed rather than pan-fired.";
    let mut le = vec![0xff, 0xfe];
    le.extend(sencha.encode_utf16().flat_map(u16::to_le_bytes));
    let gyokuro =
        "Gyokuro bushes are shaded for three weeks before the harvest, which sweetens the tea.";
    let be: Vec<u8> = gyokuro.encode_utf16().flat_map(u16::to_be_bytes).collect();
    for (name, bytes, text, query) in [
        ("sencha-utf16le.txt", le, sencha, "steamed Japanese sencha"),
        ("gyokuro-utf16be.txt", be, gyokuro, "shaded gyokuro bushes"),
    ] {
        let id = upload_ready(&client, name, bytes).await;
        let answer = search(&client, query, &["bm25"]).await;
        let found = hits_of(&answer, &id);
        assert!(!found.is_empty(), "{name}: {answer}");
        assert!(
            found[0]["text"].as_str().unwrap().contains(text),
            "{name} decoded: {}",
            found[0]["text"]
        );
    }

    // The same bytes again: a duplicate, with the first document's id, and nothing new stored.
    let total = client.counts(KB).await["total"].clone();
    let again = client
        .upload_ok(KB, "tea-guide-copy.md", MARKDOWN.as_bytes().to_vec())
        .await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["id"], markdown.as_str(), "{again}");
    assert_eq!(
        client.counts(KB).await["total"],
        total,
        "a duplicate adds no document"
    );
    node.shutdown().await;
}

/// Opens a document's event stream; once this returns, the node is subscribed.
async fn open_events(client: &ApiClient, id: &str) -> reqwest::Response {
    let response = client
        .request(
            reqwest::Method::GET,
            &format!("/v1/kbs/{KB}/documents/{id}/events"),
        )
        .send()
        .await
        .expect("opening the event stream");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    response
}

/// Reads an event stream to its end (bounded); returns (event name, data) pairs.
async fn collect_events(response: reqwest::Response) -> Vec<(String, Value)> {
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let reading = async {
        while let Some(bytes) = stream.next().await {
            buffer.push_str(&String::from_utf8_lossy(
                &bytes.expect("reading the event stream"),
            ));
        }
    };
    if tokio::time::timeout(WAIT, reading).await.is_err() {
        panic!("the event stream did not end within {WAIT:?}; it sent {buffer:?}");
    }
    let mut events = Vec::new();
    for block in buffer.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                name = Some(value.trim().to_string());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim_start());
            }
        }
        if let Some(name) = name {
            let data: Value =
                serde_json::from_str(&data).unwrap_or_else(|e| panic!("event data {data:?}: {e}"));
            events.push((name, data));
        }
    }
    events
}

async fn read_events(client: &ApiClient, id: &str) -> Vec<(String, Value)> {
    collect_events(open_events(client, id).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_events_stream_statuses_until_ready() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;
    let text = short_documents(8)
        .into_iter()
        .map(|d| d.text)
        .collect::<Vec<_>>()
        .join("\n\n");
    let added = client
        .upload_ok(KB, "abstracts.txt", text.into_bytes())
        .await;
    let id = added["id"].as_str().unwrap().to_string();

    let events = read_events(&client, &id).await;
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names.last(),
        Some(&"ready"),
        "the stream ends with ready: {names:?}"
    );
    let order = [
        "queued",
        "parsing",
        "chunking",
        "embedding",
        "indexing",
        "ready",
    ];
    let positions: Vec<usize> = names
        .iter()
        .map(|name| {
            order
                .iter()
                .position(|o| o == name)
                .unwrap_or_else(|| panic!("unknown event {name}"))
        })
        .collect();
    // The current status is sent first and may be repeated by the change that follows it.
    assert!(
        positions.windows(2).all(|w| w[0] <= w[1]),
        "statuses only move forward: {names:?}"
    );
    for (name, data) in &events {
        assert_eq!(data["document_id"], id.as_str(), "{data}");
        assert_eq!(data["status"], name.as_str(), "{data}");
    }
    let (_, last) = events.last().unwrap();
    assert_eq!(last["progress"], 1.0, "{last}");
    assert!(last["chunk_count"].as_u64().unwrap() >= 1, "{last}");

    // A finished document: one event, then the stream ends.
    let again = read_events(&client, &id).await;
    let names: Vec<&str> = again.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["ready"]);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_document_is_never_returned() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;
    let documents = short_documents(6);
    let ids = client.bulk_add(KB, &bulk_documents(&documents)).await;
    client.wait_ready(KB, 6, ingest_deadline(6)).await;
    let (victim, doc) = (&ids[2], &documents[2]);
    let queries = [doc.title.as_str(), doc.text.as_str()];
    let channel_sets = [json!(["dense"]), json!(["bm25"]), json!(["dense", "bm25"])];
    for query in queries {
        for channels in &channel_sets {
            let answer = client
                .search(
                    KB,
                    json!({ "query": query, "top_k": 10, "channels": channels }),
                )
                .await;
            assert_eq!(
                &document_ids(&answer)[0],
                victim,
                "found first before the delete: {answer}"
            );
        }
    }

    client
        .delete(&format!("/v1/kbs/{KB}/documents/{victim}"))
        .await
        .expect(204);
    client
        .document_answer(KB, victim)
        .await
        .expect_error(404, "document_not_found");
    client
        .get(&format!("/v1/kbs/{KB}/documents/{victim}/chunks"))
        .await
        .expect_error(404, "document_not_found");
    client
        .delete(&format!("/v1/kbs/{KB}/documents/{victim}"))
        .await
        .expect_error(404, "document_not_found");
    for query in queries {
        for channels in &channel_sets {
            let answer = client
                .search(
                    KB,
                    json!({ "query": query, "top_k": 100, "channels": channels }),
                )
                .await;
            assert!(
                !hits(&answer).is_empty(),
                "the other documents are still found"
            );
            assert!(
                !document_ids(&answer).contains(victim),
                "deleted but returned: {answer}"
            );
        }
    }
    let counts = client.counts(KB).await;
    assert_eq!(
        (counts["total"].as_u64(), count(&counts, "ready")),
        (Some(5), 5),
        "{counts}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kb_lifecycle_counts_settings_listing_and_delete() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    let created = client.create_kb(json!({ "name": KB, "shards": 3 })).await;
    assert_eq!(created["name"], KB);
    assert_eq!(created["settings"]["shards"], 3);
    assert_eq!(
        created["settings"]["dimension"], 384,
        "all-MiniLM-L6-v2 vectors"
    );
    let counts = &created["documents"];
    assert_eq!(counts["total"], 0);
    for status in [
        "queued",
        "parsing",
        "chunking",
        "embedding",
        "indexing",
        "ready",
        "failed",
    ] {
        assert_eq!(counts[status], 0, "every status is counted: {counts}");
    }
    // By id as well as by name.
    let by_id = client.get_kb(created["id"].as_str().unwrap()).await;
    assert_eq!(by_id["name"], KB);

    // Counts by status: 12 ready and one that fails in the pipeline (HTML with no content).
    let mut documents = bulk_documents(&short_documents(12));
    documents.push(json!({ "external_id": "empty-html", "title": "Empty", "text": "<script>x()</script>", "format": "html" }));
    let ids = client.bulk_add(KB, &documents).await;
    client.wait_ready(KB, 12, ingest_deadline(13)).await;
    let counts = client.wait_idle(KB, WAIT).await;
    assert_eq!(counts["total"], 13, "{counts}");
    assert_eq!(
        (count(&counts, "ready"), count(&counts, "failed")),
        (12, 1),
        "{counts}"
    );
    let failed = client.document(KB, ids.last().unwrap()).await;
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["error"].as_str().is_some_and(|e| !e.is_empty()),
        "a failure says why: {failed}"
    );
    let listed = client.get("/v1/kbs").await.expect(200);
    let mine = listed["kbs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == KB)
        .cloned();
    assert_eq!(
        mine.map(|k| k["documents"].clone()),
        Some(counts.clone()),
        "{listed}"
    );

    // Listing in pages of 5 with next_after: every document once, in id order.
    let paged: Vec<String> = client
        .list_all_documents(KB, 5)
        .await
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(paged, expected, "pages cover every document once");
    let first = client
        .get(&format!("/v1/kbs/{KB}/documents?limit=5"))
        .await
        .expect(200);
    assert_eq!(first["documents"].as_array().unwrap().len(), 5);
    assert_eq!(first["next_after"], first["documents"][4]["id"], "{first}");

    // Filtered by status on the node, with paging: the failed one alone, every ready one.
    let ids_of = |documents: Vec<Value>| -> Vec<String> {
        documents
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_string())
            .collect()
    };
    let failed_only = client
        .list_all_documents_where(KB, 5, "&status=failed")
        .await;
    assert!(failed_only.iter().all(|d| d["status"] == "failed"));
    assert_eq!(ids_of(failed_only), [ids.last().unwrap().clone()]);
    let ready = client
        .list_all_documents_where(KB, 5, "&status=ready")
        .await;
    assert!(ready.iter().all(|d| d["status"] == "ready"));
    let mut expected_ready = ids[..12].to_vec();
    expected_ready.sort();
    assert_eq!(ids_of(ready), expected_ready);
    let none = client
        .get(&format!("/v1/kbs/{KB}/documents?status=queued"))
        .await
        .expect(200);
    assert_eq!(none["documents"], json!([]), "{none}");
    assert_eq!(none["next_after"], Value::Null, "{none}");
    let refused = client
        .get(&format!("/v1/kbs/{KB}/documents?status=done"))
        .await;
    refused.expect_error(400, "invalid_status");
    assert_eq!(refused.body["error"]["param"], "status", "{}", refused.body);

    // PATCH: settings change for documents ingested afterwards.
    let long_text: String = short_documents(6)
        .iter()
        .map(|d| d.text.clone())
        .collect::<Vec<_>>()
        .join("\n\n");
    let before = client
        .bulk_add(KB, &[text_document("long-1", "Long one", &long_text)])
        .await;
    let before = client.wait_document(KB, &before[0], WAIT).await;
    let patched = client
        .patch_json(
            &format!("/v1/kbs/{KB}"),
            &json!({ "chunk_tokens": 64, "chunk_overlap_tokens": 8 }),
        )
        .await
        .expect(200);
    assert_eq!(patched["settings"]["chunk_tokens"], 64, "{patched}");
    assert_eq!(client.get_kb(KB).await["settings"]["chunk_tokens"], 64);
    let after = client
        .bulk_add(KB, &[text_document("long-2", "Long two", &long_text)])
        .await;
    let after = client.wait_document(KB, &after[0], WAIT).await;
    assert!(
        after["chunk_count"].as_u64() > before["chunk_count"].as_u64(),
        "smaller chunks after the PATCH: {} then {}",
        before["chunk_count"],
        after["chunk_count"]
    );

    // DELETE: gone, and a new KB of the same name starts empty.
    client.delete(&format!("/v1/kbs/{KB}")).await.expect(204);
    client
        .get(&format!("/v1/kbs/{KB}"))
        .await
        .expect_error(404, "kb_not_found");
    client
        .search_answer(KB, json!({ "query": "anything" }))
        .await
        .expect_error(404, "kb_not_found");
    client
        .get(&format!("/v1/kbs/{KB}/documents"))
        .await
        .expect_error(404, "kb_not_found");
    client
        .document_answer(KB, &ids[0])
        .await
        .expect_error(404, "kb_not_found");
    let fresh = client.create_kb(json!({ "name": KB })).await;
    assert_eq!(
        fresh["documents"]["total"], 0,
        "nothing of the deleted KB survives: {fresh}"
    );
    let answer = client
        .search(
            KB,
            json!({ "query": short_documents(1)[0].title, "channels": ["bm25"] }),
        )
        .await;
    assert_eq!(answer["hits"], json!([]), "{answer}");
    node.shutdown().await;
}

/// Adds 30 documents in one request and returns the last one's id while it is still in
/// progress (it is processed last).
async fn document_in_progress(client: &ApiClient, prefix: &str) -> (String, Value) {
    let documents: Vec<Value> = short_documents(30)
        .iter()
        .map(|d| text_document(&format!("{prefix}-{}", d.id), &d.title, &d.text))
        .collect();
    let ids = client.bulk_add(KB, &documents).await;
    let id = ids.last().unwrap().clone();
    let record = client.document(KB, &id).await;
    assert!(
        sift_tests::NON_TERMINAL.contains(&record["status"].as_str().unwrap()),
        "still in progress: {record}"
    );
    (id, documents.last().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_when_its_document_is_deleted() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;
    let (id, _) = document_in_progress(&client, "a").await;
    let stream = open_events(&client, &id).await;
    client
        .delete(&format!("/v1/kbs/{KB}/documents/{id}"))
        .await
        .expect(204);
    let events = collect_events(stream).await;
    let (name, data) = events.last().expect("at least one event");
    assert_eq!(name, "deleted", "{events:?}");
    assert_eq!(data["deleted"], true, "{data}");
    assert_eq!(data["document_id"], id.as_str(), "{data}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_ends_when_its_document_is_replaced_or_its_kb_deleted() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;

    // Replaced: a new document with the same external_id supersedes it.
    let (old, document) = document_in_progress(&client, "b").await;
    let stream = open_events(&client, &old).await;
    let replacement = json!({ "external_id": document["external_id"], "title": "Newer", "text": "A newer version." });
    let added = client.bulk_add_answer(KB, &[replacement]).await.expect(202);
    assert_eq!(added["documents"][0]["replaced"], old.as_str(), "{added}");
    let events = collect_events(stream).await;
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("deleted"),
        "{events:?}"
    );

    // Deleted with its knowledge base.
    let (id, _) = document_in_progress(&client, "c").await;
    let stream = open_events(&client, &id).await;
    client.delete(&format!("/v1/kbs/{KB}")).await.expect(204);
    let events = collect_events(stream).await;
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("deleted"),
        "{events:?}"
    );
    node.shutdown().await;
}

/// `depth` nested `<div>`s around `center`.
fn nested_divs(center: &str, depth: usize) -> String {
    format!(
        "{}{center}{}",
        "<div>".repeat(depth),
        "</div>".repeat(depth)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_html_is_refused_with_a_reason_not_a_crash() {
    // Issue 14: a 107 KB bulk request of 10,000 nested <div>s aborted the node (and again on
    // every restart); an upload of 5,000 aborted it during the request.
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    new_kb(&client).await;
    let bulk = json!({ "text": nested_divs("x", 10_000), "format": "html", "title": "Deep bulk" });
    let ids = client.bulk_add(KB, &[bulk]).await;
    let record = client.wait_document(KB, &ids[0], WAIT).await;
    assert_eq!(record["status"], "failed", "{record}");
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("nests elements more than"),
        "{record}"
    );
    let answer = client
        .upload(KB, "deep.html", nested_divs("x", 5_000).into_bytes())
        .await;
    let message = answer.expect_error(422, "nesting_too_deep");
    assert!(message.contains("256"), "{message}");

    // Nesting as deep as real pages go is ingested, and the node still serves.
    let upload = nested_divs("<p>Lighthouse keepers trimmed the wicks at dusk.</p>", 200);
    let id = upload_ready(&client, "deep.html", upload.into_bytes()).await;
    let answer = search(&client, "lighthouse keepers wicks", &["bm25"]).await;
    let found = hits_of(&answer, &id);
    assert!(!found.is_empty(), "{answer}");
    assert!(
        found[0]["text"]
            .as_str()
            .unwrap()
            .contains("Lighthouse keepers trimmed the wicks at dusk."),
        "{answer}"
    );
    client.get("/healthz").await.expect(200);
    node.shutdown().await;
}
