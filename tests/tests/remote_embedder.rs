//! A KB embedded by a remote OpenAI-compatible server. The server is a real HTTP server in the
//! test speaking `/v1/embeddings` (deterministic hashed bag-of-words vectors); when it starts
//! answering with another dimension, new documents fail with a clear error and the KB keeps
//! serving what it has; while it is down (503), new documents wait and are indexed once it is
//! back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use sift_node::config::{Config, FileConfig, RemoteEmbedderConfig};
use sift_tests::{InProcessNode, WAIT, document_ids, temp_dir, text_document};

const KB: &str = "remote";
const API_KEY: &str = "sk-test-remote";

/// The fake embedding service's state: the dimension it answers with, and what it saw.
#[derive(Default)]
struct Service {
    dimension: AtomicUsize,
    requests: AtomicUsize,
    texts: AtomicUsize,
    bad_auth: AtomicUsize,
    /// While set, every request is answered 503 (an outage).
    down: AtomicBool,
    refused: AtomicUsize,
    /// Once this many texts were embedded (0: never), the service goes down.
    down_after_texts: AtomicUsize,
    /// Once this many texts were embedded (0: never), it answers with 32 dimensions.
    resized_after_texts: AtomicUsize,
}

/// FNV-1a: a stable hash, so vectors are the same on every run.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Hashed bag of words, L2-normalised: texts sharing words point the same way.
fn bag_of_words(text: &str, dimension: usize) -> Vec<f32> {
    let mut vector = vec![0f32; dimension];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        vector[(fnv1a(&word.to_lowercase()) % dimension as u64) as usize] += 1.0;
    }
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm == 0.0 {
        vector[0] = 1.0; // no words: still a valid unit vector
    } else {
        vector.iter_mut().for_each(|v| *v /= norm);
    }
    vector
}

/// `POST /v1/embeddings` as OpenAI answers it.
async fn embeddings(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Json(request): Json<Value>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    service.requests.fetch_add(1, Ordering::SeqCst);
    let texts = service.texts.load(Ordering::SeqCst);
    let reached = |after: &AtomicUsize| {
        let after = after.load(Ordering::SeqCst);
        after != 0 && texts >= after
    };
    if reached(&service.down_after_texts) {
        service.down_after_texts.store(0, Ordering::SeqCst);
        service.down.store(true, Ordering::SeqCst);
    }
    if reached(&service.resized_after_texts) {
        service.resized_after_texts.store(0, Ordering::SeqCst);
        service.dimension.store(32, Ordering::SeqCst);
    }
    if service.down.load(Ordering::SeqCst) {
        service.refused.fetch_add(1, Ordering::SeqCst);
        let error =
            json!({ "error": { "message": "the model is loading", "type": "server_error" } });
        return Err((StatusCode::SERVICE_UNAVAILABLE, Json(error)));
    }
    let authorized = headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {API_KEY}"));
    if !authorized {
        service.bad_auth.fetch_add(1, Ordering::SeqCst);
        let error =
            json!({ "error": { "message": "invalid api key", "type": "invalid_request_error" } });
        return Err((StatusCode::UNAUTHORIZED, Json(error)));
    }
    let inputs: Vec<String> = match &request["input"] {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => {
            let error =
                json!({ "error": { "message": "input must be a string or an array of strings" } });
            return Err((StatusCode::BAD_REQUEST, Json(error)));
        }
    };
    service.texts.fetch_add(inputs.len(), Ordering::SeqCst);
    let dimension = service.dimension.load(Ordering::SeqCst);
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| json!({ "object": "embedding", "index": index, "embedding": bag_of_words(text, dimension) }))
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": request["model"],
        "usage": { "prompt_tokens": 0, "total_tokens": 0 },
    })))
}

async fn start_service(service: Arc<Service>) -> String {
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    format!("http://{addr}/v1")
}

const DOCUMENTS: [(&str, &str, &str); 4] = [
    (
        "kettle",
        "Kettle care",
        "Descale the kettle every month with citric acid to remove limescale.",
    ),
    (
        "bread",
        "Sourdough",
        "A sourdough starter needs flour, water and patience before the bread rises.",
    ),
    (
        "bikes",
        "Bicycle chains",
        "Clean and oil the bicycle chain after riding in the rain.",
    ),
    (
        "tides",
        "Tides",
        "The moon's gravity pulls the oceans and causes the tides on the coast.",
    ),
];

/// A node whose remote embedder "fake" is the service at `base_url`, retrying each request
/// `max_retries` times.
async fn start_node(dir: &tempfile::TempDir, base_url: String, max_retries: u32) -> InProcessNode {
    start_node_with(dir, base_url, max_retries, |_| {}).await
}

/// [`start_node`] with `tweak` applied to its config (slices, streaming).
async fn start_node_with(
    dir: &tempfile::TempDir,
    base_url: String,
    max_retries: u32,
    tweak: impl FnOnce(&mut FileConfig),
) -> InProcessNode {
    let mut file = FileConfig {
        data_dir: Some(dir.path().join("data")),
        listen: Some("127.0.0.1:0".into()),
        admin_key: Some(sift_node::config::TEST_ADMIN_KEY.into()),
        url_fetch_loopback_only: Some(true), // as every test node
        ..FileConfig::default()
    };
    tweak(&mut file);
    let remote = RemoteEmbedderConfig {
        base_url,
        model: "bag-of-words-64".into(),
        api_key: Some(API_KEY.into()),
        dimension: None, // probed
        timeout_ms: Some(30_000),
        max_retries: Some(max_retries),
        batch_size: Some(8),
    };
    file.embedding.remote = BTreeMap::from([("fake".to_string(), remote)]);
    let config = Config::check(file).expect("a valid config");
    InProcessNode::start_with(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_embedder_serves_a_kb_and_a_dimension_change_fails_clearly() {
    let service = Arc::new(Service::default());
    service.dimension.store(64, Ordering::SeqCst);
    let base_url = start_service(service.clone()).await;

    let dir = temp_dir();
    let node = start_node(&dir, base_url, 1).await;
    let client = node.client();
    assert!(
        service.requests.load(Ordering::SeqCst) >= 1,
        "the dimension was probed at start"
    );
    let ready = client.get("/readyz").await.expect(200);
    assert_eq!(ready["remote_embedders"], json!(["fake"]), "{ready}");

    let kb = client
        .create_kb(json!({ "name": KB, "shards": 2, "embedding_model": "fake" }))
        .await;
    assert_eq!(kb["settings"]["embedding_model"], "fake");
    assert_eq!(
        kb["settings"]["dimension"], 64,
        "the probed dimension: {kb}"
    );

    let texts_before = service.texts.load(Ordering::SeqCst);
    let documents: Vec<Value> = DOCUMENTS
        .iter()
        .map(|(id, title, text)| text_document(id, title, text))
        .collect();
    let ids = client.bulk_add(KB, &documents).await;
    client.wait_ready(KB, 4, WAIT).await;
    assert!(
        service.texts.load(Ordering::SeqCst) >= texts_before + 4,
        "every chunk was embedded by the remote service"
    );

    // Dense search goes through the remote embedder: shared words rank the right document first.
    for (position, query) in [
        "how to remove limescale from a kettle with citric acid",
        "sourdough starter flour water",
        "oil the bicycle chain after rain",
        "moon gravity causes tides",
    ]
    .into_iter()
    .enumerate()
    {
        let requests = service.requests.load(Ordering::SeqCst);
        let answer = client
            .search(
                KB,
                json!({ "query": query, "top_k": 4, "channels": ["dense"] }),
            )
            .await;
        assert_eq!(
            document_ids(&answer)[0],
            ids[position],
            "{query:?}: {answer}"
        );
        assert_eq!(
            service.requests.load(Ordering::SeqCst),
            requests + 1,
            "the query was embedded remotely"
        );
    }
    assert_eq!(
        service.bad_auth.load(Ordering::SeqCst),
        0,
        "every request carried the API key"
    );

    // The service now answers with another dimension.
    service.dimension.store(32, Ordering::SeqCst);
    let new = client
        .bulk_add(
            KB,
            &[text_document(
                "late",
                "Late arrival",
                "Tea kettles whistle when the water boils.",
            )],
        )
        .await;
    let record = client.wait_document(KB, &new[0], WAIT).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    println!("the failed document says: {error}");
    assert!(
        error.contains("dimension") && error.contains("64") && error.contains("32"),
        "the error names the dimensions: {error:?}"
    );
    let counts = client.counts(KB).await;
    assert_eq!(
        (counts["ready"].as_u64(), counts["failed"].as_u64()),
        (Some(4), Some(1)),
        "{counts}"
    );

    // The KB keeps serving what it has: BM25 needs no embedding ...
    let answer = client
        .search(
            KB,
            json!({ "query": "citric acid limescale", "channels": ["bm25"] }),
        )
        .await;
    assert_eq!(document_ids(&answer)[0], ids[0], "{answer}");
    // ... a dense query embedded with the wrong dimension is refused with a clear error ...
    let refused = client
        .search_answer(
            KB,
            json!({ "query": "tides of the ocean", "channels": ["dense"] }),
        )
        .await;
    assert!(
        refused.status.is_client_error() || refused.status.is_server_error(),
        "{refused:?}"
    );
    let message = refused.expect_error(refused.status.as_u16(), "dimension_mismatch");
    println!("a dense search then answers {}: {message}", refused.status);
    assert!(message.contains("dimension"), "{message}");
    // ... and once the service is fixed, dense search works on the earlier documents again.
    service.dimension.store(64, Ordering::SeqCst);
    let answer = client
        .search(
            KB,
            json!({ "query": "tides of the ocean", "channels": ["dense"] }),
        )
        .await;
    assert_eq!(document_ids(&answer)[0], ids[3], "{answer}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_wait_out_an_embedding_service_outage_and_are_indexed_when_it_returns() {
    let service = Arc::new(Service::default());
    service.dimension.store(64, Ordering::SeqCst);
    let base_url = start_service(service.clone()).await;
    let dir = temp_dir();
    // No retries inside the embedder: every refusal reaches the ingestion job.
    let node = start_node(&dir, base_url, 0).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": KB, "shards": 1, "embedding_model": "fake" }))
        .await;

    service.down.store(true, Ordering::SeqCst);
    let documents: Vec<Value> = DOCUMENTS
        .iter()
        .map(|(id, title, text)| text_document(id, title, text))
        .collect();
    let ids = client.bulk_add(KB, &documents).await;
    // More refused attempts than a document may be interrupted (3) before it counts as a
    // poison pill: a transient outage is not a crash.
    let started = std::time::Instant::now();
    while service.refused.load(Ordering::SeqCst) < 5 {
        assert!(
            started.elapsed() < WAIT,
            "ingestion stopped trying the service"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for id in &ids {
        let record = client.document(KB, id).await;
        assert_ne!(record["status"], "failed", "{record}");
        assert_ne!(record["status"], "ready", "{record}");
    }

    service.down.store(false, Ordering::SeqCst);
    client.wait_ready(KB, 4, WAIT).await;
    let counts = client.counts(KB).await;
    assert_eq!(counts["failed"].as_u64(), Some(0), "{counts}");
    let answer = client
        .search(
            KB,
            json!({ "query": "moon gravity causes tides", "channels": ["dense"] }),
        )
        .await;
    assert_eq!(document_ids(&answer)[0], ids[3], "{answer}");
    node.shutdown().await;
}

/// A keeper's log of `entries` paragraphs, each naming its own landmark (`LANDMARKS`).
fn keepers_log(entries: usize) -> String {
    (0..entries)
        .map(|i| {
            format!(
                "Entry {i}. The keeper climbed to the lantern gallery at dusk and wrote that \
                 the {} stood clear against the evening sky, the tide turning slowly over the \
                 reef while the lamp was trimmed, the lens polished and the log kept up to date.",
                LANDMARKS[i % LANDMARKS.len()]
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

const LANDMARKS: [&str; 24] = [
    "abbey",
    "barn",
    "causeway",
    "dovecote",
    "estuary",
    "ferry",
    "granary",
    "harbour",
    "inn",
    "jetty",
    "kiln",
    "lock",
    "mill",
    "netloft",
    "orchard",
    "pier",
    "quarry",
    "rectory",
    "smithy",
    "tollhouse",
    "viaduct",
    "weir",
    "yard",
    "zigzag",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_document_is_written_in_slices_and_an_outage_half_way_is_waited_out() {
    let service = Arc::new(Service::default());
    service.dimension.store(64, Ordering::SeqCst);
    let base_url = start_service(service.clone()).await;
    let dir = temp_dir();
    // Slices of 4 chunks; no retries inside the embedder.
    let node = start_node_with(&dir, base_url, 0, |file| file.ingest_slice_chunks = Some(4)).await;
    let client = node.client();
    client
        .create_kb(json!({
            "name": KB, "shards": 1, "embedding_model": "fake", "chunk_tokens": 32,
            "chunk_overlap_tokens": 0, "parent_tokens": 128,
        }))
        .await;

    // The service goes away after two slices of the long document.
    let texts_before = service.texts.load(Ordering::SeqCst);
    service
        .down_after_texts
        .store(texts_before + 8, Ordering::SeqCst);
    let ids = client
        .bulk_add(
            KB,
            &[
                text_document("log", "Keeper's log", &keepers_log(24)),
                text_document("note", "A note", "The lamp oil arrives on Tuesdays."),
            ],
        )
        .await;
    let started = std::time::Instant::now();
    while service.refused.load(Ordering::SeqCst) < 1 {
        assert!(started.elapsed() < WAIT, "the outage was never met");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Its first slices are written, and out of sight: no search finds them.
    let record = client.document(KB, &ids[0]).await;
    assert_ne!(record["status"], "ready", "{record}");
    assert_ne!(record["status"], "failed", "{record}");
    // (BM25 only: a dense query would need the service.)
    let answer = client
        .search(
            KB,
            json!({ "query": "keeper lantern gallery abbey", "channels": ["bm25"] }),
        )
        .await;
    assert!(
        !document_ids(&answer).contains(&ids[0]),
        "a document half written is found: {answer}"
    );

    // The service returns; the document is written again from its first slice, and each
    // slice reports its chunks in the document's events.
    let mut events = sift_tests::sse::SseReader::open(client.request(
        reqwest::Method::GET,
        &format!("/v1/kbs/{KB}/documents/{}/events", ids[0]),
    ))
    .await;
    service.down.store(false, Ordering::SeqCst);
    let seen = events.until("ready").await;
    let record = client.document(KB, &ids[0]).await;
    assert_eq!(record["status"], "ready", "{record}");
    let total = record["chunk_count"].as_u64().unwrap();
    assert!(total > 12, "{total} chunks: more than three slices");
    let done: Vec<u64> = seen
        .iter()
        .filter_map(|event| event.data.get("embedded_chunks"))
        .map(|progress| {
            assert_eq!(progress["total"].as_u64(), Some(total), "{progress}");
            progress["done"].as_u64().unwrap()
        })
        .collect();
    // (An attempt that met the outage again may have reported its first slices before.)
    let expected: Vec<u64> = (1..=total.div_ceil(4))
        .map(|i| (i * 4).min(total))
        .collect();
    assert!(done.ends_with(&expected), "{done:?}: {seen:#?}");

    // Every chunk, in order, each with its parent; the first and last entries are found.
    let chunks = client
        .get(&format!("/v1/kbs/{KB}/documents/{}/chunks", ids[0]))
        .await
        .expect(200);
    let chunks = chunks["chunks"].as_array().unwrap();
    assert_eq!(chunks.len() as u64, total);
    for (position, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["position"].as_u64(), Some(position as u64), "{chunk}");
        assert!(
            chunk["parent_text"].as_str().is_some_and(|p| !p.is_empty()),
            "{chunk}"
        );
    }
    // The first entry is in the first slice, the last in the last.
    for (query, slice) in [("abbey", 0..4), ("zigzag", total - 4..total)] {
        let answer = client
            .search(
                KB,
                json!({ "query": query, "channels": ["bm25"], "top_k": 1 }),
            )
            .await;
        let hit = &answer["hits"][0];
        assert_eq!(
            hit["document_id"].as_str(),
            Some(ids[0].as_str()),
            "{answer}"
        );
        let position = hit["position"].as_u64().unwrap();
        assert!(slice.contains(&position), "{query}: {answer}");
    }
    let note = client.document(KB, &ids[1]).await;
    assert_eq!(note["status"], "ready", "{note}");

    // A long document whose embeddings change dimension half way fails with the reason;
    // the first stays as it was.
    let texts_before = service.texts.load(Ordering::SeqCst);
    service
        .resized_after_texts
        .store(texts_before + 8, Ordering::SeqCst);
    let failing = client
        .bulk_add(KB, &[text_document("log2", "Second log", &keepers_log(20))])
        .await;
    let record = client.wait_document(KB, &failing[0], WAIT).await;
    assert_eq!(record["status"], "failed", "{record}");
    assert!(
        record["error"]
            .as_str()
            .unwrap_or_default()
            .contains("dimension"),
        "{record}"
    );
    service.dimension.store(64, Ordering::SeqCst);
    let answer = client
        .search(KB, json!({ "query": "zigzag", "channels": ["bm25"] }))
        .await;
    let found: std::collections::BTreeSet<String> = document_ids(&answer).into_iter().collect();
    assert_eq!(found, [ids[0].clone()].into(), "{answer}");
    node.shutdown().await;
}

/// A CSV file of `rows` rows: an id, a code word of its own (`code0042x`) and a note about
/// `what`.
fn inventory_csv(rows: usize, what: &str) -> Vec<u8> {
    let mut csv = String::from("id,code,note\n");
    for row in 0..rows {
        csv.push_str(&format!(
            "{row},code{row:04}x,\"crate of {what}, stored on shelf {}\"\n",
            row % 40
        ));
    }
    csv.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_spreadsheet_is_read_row_by_row_and_written_in_slices() {
    let service = Arc::new(Service::default());
    service.dimension.store(64, Ordering::SeqCst);
    let base_url = start_service(service.clone()).await;
    let dir = temp_dir();
    // Every spreadsheet and CSV file is streamed; slices of 8 chunks.
    let node = start_node_with(&dir, base_url, 0, |file| {
        file.ingest_slice_chunks = Some(8);
        file.ingest_stream_bytes = Some(1);
    })
    .await;
    let client = node.client();
    client
        .create_kb(json!({
            "name": KB, "shards": 1, "embedding_model": "fake", "chunk_tokens": 64,
            "chunk_overlap_tokens": 0, "parent_tokens": 256,
        }))
        .await;

    // 6,000 rows: more than one run of rows (256 KiB of records) and many slices.
    let rows = 6_000;
    let id = client
        .upload_ok(KB, "inventory.csv", inventory_csv(rows, "lamp wicks"))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut events = sift_tests::sse::SseReader::open(client.request(
        reqwest::Method::GET,
        &format!("/v1/kbs/{KB}/documents/{id}/events"),
    ))
    .await;
    let seen = events.until("ready").await;
    let record = client.document(KB, &id).await;
    assert_eq!(record["status"], "ready", "{record}");
    let total = record["chunk_count"].as_u64().unwrap();
    assert!(total > 100, "{total} chunks");
    // Progress after each slice; the last says the exact count.
    let progress: Vec<(u64, u64)> = seen
        .iter()
        .filter_map(|event| event.data.get("embedded_chunks"))
        .map(|p| (p["done"].as_u64().unwrap(), p["total"].as_u64().unwrap()))
        .collect();
    assert!(progress.len() as u64 >= total.div_ceil(8), "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0].0 < w[1].0), "{progress:?}");
    assert!(
        progress.iter().all(|(done, total)| done <= total),
        "{progress:?}"
    );
    assert_eq!(progress.last(), Some(&(total, total)), "{progress:?}");
    // Parsed, chunked and embedded together, a run of rows at a time: no chunking stage of
    // its own (a document parsed whole has one).
    let statuses: Vec<&str> = seen.iter().map(|event| event.event.as_str()).collect();
    assert!(statuses.contains(&"embedding"), "{statuses:?}");
    assert!(!statuses.contains(&"chunking"), "{statuses:?}");

    // Every chunk in order with its parent, spans increasing, every row in exactly one chunk.
    let chunks = client
        .get(&format!("/v1/kbs/{KB}/documents/{id}/chunks"))
        .await
        .expect(200);
    let chunks = chunks["chunks"].as_array().unwrap();
    assert_eq!(chunks.len() as u64, total);
    let mut last_span_end = 0;
    let mut rows_seen = Vec::new();
    for (position, chunk) in chunks.iter().enumerate() {
        assert_eq!(chunk["position"].as_u64(), Some(position as u64), "{chunk}");
        assert!(
            chunk["parent_text"].as_str().is_some_and(|p| !p.is_empty()),
            "{chunk}"
        );
        let span = &chunk["span"];
        let (start, end) = (span[0].as_u64().unwrap(), span[1].as_u64().unwrap());
        assert!(start >= last_span_end && end > start, "{chunk}");
        last_span_end = end;
        let text = chunk["text"].as_str().unwrap();
        rows_seen.extend(
            text.match_indices("Row ")
                .map(|(at, _)| text[at + 4..].split(':').next().unwrap().to_string()),
        );
    }
    let expected: Vec<String> = (2..rows + 2).map(|row| row.to_string()).collect();
    assert_eq!(rows_seen, expected, "every row once, in order");
    // The first row, one in the middle and the last are found, each with its header.
    for row in [0, rows / 2, rows - 1] {
        let code = format!("code{row:04}x");
        let answer = client
            .search(
                KB,
                json!({ "query": code, "channels": ["bm25"], "top_k": 1 }),
            )
            .await;
        let hit = &answer["hits"][0];
        assert_eq!(hit["document_id"].as_str(), Some(id.as_str()), "{answer}");
        assert!(
            hit["text"]
                .as_str()
                .is_some_and(|text| text.contains(&format!("code: {code}"))),
            "{answer}"
        );
    }

    // A workbook streamed sheet by sheet: each chunk under its sheet's name.
    let workbook = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/office/inventory.xlsx"
    ))
    .unwrap();
    let book = client.upload_ok(KB, "inventory.xlsx", workbook).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let record = client.wait_document(KB, &book, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    let answer = client
        .search(
            KB,
            json!({ "query": "Tidewater Forge", "channels": ["bm25"], "top_k": 1 }),
        )
        .await;
    assert_eq!(
        answer["hits"][0]["document_id"].as_str(),
        Some(book.as_str()),
        "{answer}"
    );
    assert_eq!(
        answer["hits"][0]["heading_path"],
        json!(["Suppliers"]),
        "{answer}"
    );

    // Embeddings that change dimension half way fail the file with the reason, and none of
    // its slices stays behind.
    let texts_before = service.texts.load(Ordering::SeqCst);
    service
        .resized_after_texts
        .store(texts_before + 40, Ordering::SeqCst);
    let failing = client
        .upload_ok(KB, "second.csv", inventory_csv(3_000, "lens cloths"))
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let record = client.wait_document(KB, &failing, WAIT).await;
    assert_eq!(record["status"], "failed", "{record}");
    assert!(
        record["error"]
            .as_str()
            .unwrap_or_default()
            .contains("dimension"),
        "{record}"
    );
    service.dimension.store(64, Ordering::SeqCst);
    let answer = client
        .search(
            KB,
            json!({ "query": "code0001x", "channels": ["bm25"], "top_k": 10 }),
        )
        .await;
    assert_eq!(document_ids(&answer), vec![id.clone()], "{answer}");
    node.shutdown().await;
}
