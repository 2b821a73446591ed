//! Documents by URL (issue 17, items 4 and 5): `{"urls": [...]}` and `sift ingest KB URL`
//! against a real web server started by the test on 127.0.0.1, and the SSRF guard.
//!
//! The node allows only `127.0.0.1/32` (`url_fetch_allow`), and its `url_fetch_hosts` maps
//! `site.test` to 127.0.0.1 and `intranet.test` to 10.0.0.1: a name that resolves to a
//! private address without any DNS. Every URL the guard must refuse is refused before a
//! connection is opened; the only connections the tests make go to 127.0.0.1. That is
//! enforced, not hoped for: the node runs with `url_fetch_loopback_only` (as every test node,
//! `Config::for_test`), whose connect seam refuses any connection outside loopback and any DNS
//! lookup with `outside_loopback` and counts it in `sift_url_fetch_outside_loopback_total`;
//! each test ends by asserting that counter is 0 (see [`assert_stayed_on_loopback`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sift_node::config::{Config, TEST_ADMIN_KEY};
use sift_tests::{Answer, ApiClient, InProcessNode, WAIT, repo_root, require_model};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KB: &str = "web";
/// `max_upload_bytes` of the node under test: the `/big` page is twice it.
const MAX_BYTES: u64 = 256 * 1024;

/// The test's web site: what `/article` says changes with `version`.
#[derive(Default)]
struct Site {
    version: AtomicUsize,
    hits: AtomicUsize,
}

fn article(version: usize) -> String {
    format!(
        r#"<!doctype html><html><head><title>Harbour lights guide</title></head><body>
        <nav>Menu Home Contact</nav>
        <main><h1>Harbour lights</h1>
        <p>The harbour light at Ardmore flashes green every {} seconds.</p>
        <p>Fog signals sound from the pier head in poor visibility.</p></main>
        <footer>Copyright the harbour board</footer></body></html>"#,
        4 + version
    )
}

async fn start_site() -> (Arc<Site>, u16) {
    let site = Arc::new(Site::default());
    let pdf = std::fs::read(repo_root().join("tests/fixtures/pdf/three-pages.pdf")).unwrap();
    let app = axum::Router::new()
        .route(
            "/article",
            get(|State(site): State<Arc<Site>>| async move {
                site.hits.fetch_add(1, Ordering::SeqCst);
                let html = article(site.version.load(Ordering::SeqCst));
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html)
            }),
        )
        .route("/moved", get(|| async { Redirect::permanent("/article") }))
        .route(
            "/old-tides",
            get(|| async { Redirect::temporary("/tides") }),
        )
        .route(
            "/tides",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    r#"<!doctype html><html><head><title>Ardmore tide tables</title></head>
                    <body><main><h1>Tide tables</h1><p>The Ardmore tide tables are posted on the
                    harbour office door every Monday morning.</p></main></body></html>"#,
                )
            }),
        )
        .route(
            "/files/manual",
            get(move || {
                let pdf = pdf.clone();
                async move { ([(header::CONTENT_TYPE, "application/octet-stream")], pdf) }
            }),
        )
        .route(
            "/loop",
            get(|| async { Redirect::temporary("/loop-again") }),
        )
        .route(
            "/loop-again",
            get(|| async { Redirect::temporary("/loop") }),
        )
        .route(
            "/to-intranet",
            get(|| async { Redirect::temporary("http://intranet.test/admin") }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(120)).await;
                "too late"
            }),
        )
        .route("/missing", get(|| async { StatusCode::NOT_FOUND }))
        .route(
            "/logo.png",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "image/png")],
                    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
                )
            }),
        )
        .route(
            "/big",
            get(|| async {
                let text = "word ".repeat((2 * MAX_BYTES as usize) / 5);
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/plain")
                    .body(axum::body::Body::from_stream(futures::stream::iter(
                        text.into_bytes()
                            .chunks(8192)
                            .map(|chunk| Ok::<_, std::io::Error>(chunk.to_vec()))
                            .collect::<Vec<_>>(),
                    )))
                    .unwrap()
                    .into_response()
            }),
        )
        .with_state(site.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (site, port)
}

/// A server that claims a 5 GB body and sends a few bytes of it.
async fn start_liar() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                          Content-Length: 5368709120\r\n\r\nsome words",
                    )
                    .await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    port
}

async fn node() -> (tempfile::TempDir, InProcessNode) {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.max_upload_bytes = MAX_BYTES;
    config.url_fetch.allow = vec!["127.0.0.1/32".parse().unwrap()];
    config.url_fetch.hosts = [
        ("site.test".to_string(), "127.0.0.1".parse().unwrap()),
        ("intranet.test".to_string(), "10.0.0.1".parse().unwrap()),
    ]
    .into_iter()
    .collect();
    config.url_fetch.timeout = Duration::from_secs(2);
    assert!(
        config.url_fetch.loopback_only,
        "test nodes fetch from loopback only"
    );
    let node = InProcessNode::start_with(config).await;
    node.client().create_kb(json!({ "name": KB })).await;
    (dir, node)
}

/// Fails the test when any node of this test binary tried to fetch from outside loopback:
/// the connect seam's counter (process-wide, all nodes of the binary) is there and 0.
async fn assert_stayed_on_loopback(client: &ApiClient) {
    let metric = "sift_url_fetch_outside_loopback_total";
    let text = client.metrics_text().await;
    for kind in ["connect", "lookup"] {
        assert!(
            text.lines()
                .any(|line| line.starts_with(&format!("{metric}{{kind=\"{kind}\"}}"))),
            "the connect seam's counter ({kind}) is missing from /metrics: {text}"
        );
    }
    assert_eq!(
        client.metric_sum(metric, None).await,
        0.0,
        "a URL fetch tried to reach past loopback (a connection or a DNS lookup)"
    );
}

/// `POST /v1/kbs/{KB}/documents` with `body` (`{"urls": [...]}`).
async fn post_urls(client: &ApiClient, body: Value) -> Answer {
    client
        .post_json(&format!("/v1/kbs/{KB}/documents"), &body)
        .await
}

/// The one document of a 202 answer to `body`.
async fn added(client: &ApiClient, body: Value) -> Value {
    post_urls(client, body).await.expect(202)["documents"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_by_url_are_fetched_parsed_and_kept_with_their_source() {
    let (site, port) = start_site().await;
    let (_dir, node) = node().await;
    let client = node.client();
    let base = format!("http://site.test:{port}");

    // A page behind a redirect: main content only, title and final URL kept, the URL as
    // the external id.
    let page = added(&client, json!({ "urls": [format!("{base}/moved")] })).await;
    assert_eq!(page["external_id"], format!("{base}/moved"), "{page}");
    let page_id = page["id"].as_str().unwrap().to_string();
    let record = client.wait_document(KB, &page_id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["title"], "Harbour lights guide", "{record}");
    assert_eq!(
        record["metadata"]["sift.source_url"],
        format!("{base}/article"),
        "{record}"
    );
    assert_eq!(record["source"]["upload"]["format"], "html", "{record}");
    // the URL (the external id) names the document in routes, its slashes as %2F
    let by_url = client
        .get(&format!(
            "/v1/kbs/{KB}/documents/{}",
            format!("{base}/moved")
                .replace(':', "%3A")
                .replace('/', "%2F")
        ))
        .await
        .expect(200);
    assert_eq!(by_url["id"], page_id.as_str(), "{by_url}");
    let chunks = client
        .get(&format!("/v1/kbs/{KB}/documents/{page_id}/chunks"))
        .await
        .expect(200);
    let text = chunks.to_string();
    assert!(text.contains("flashes green every 4 seconds"), "{text}");
    for chrome in ["Menu Home", "Copyright the harbour board"] {
        assert!(!text.contains(chrome), "{chrome} was indexed: {text}");
    }

    // A PDF at a URL with no extension, served as octet-stream: sniffed from its bytes, and
    // an object entry with its own external id and metadata.
    let manual = added(
        &client,
        json!({ "urls": [{
                    "url": format!("{base}/files/manual"),
                    "external_id": "manual-v1",
                    "metadata": { "team": "harbour" },
                }] }),
    )
    .await;
    assert_eq!(manual["external_id"], "manual-v1", "{manual}");
    let record = client
        .wait_document(KB, manual["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["source"]["upload"]["format"], "pdf", "{record}");
    assert_eq!(record["metadata"]["team"], "harbour", "{record}");
    let hits = client
        .search(
            KB,
            json!({ "query": "green flashing harbour light", "top_k": 3 }),
        )
        .await;
    assert_eq!(
        hits["hits"][0]["document_id"], page_id,
        "the fetched page answers: {hits}"
    );
    // hits show where the page came from (after the redirect), and so do packed citations
    assert_eq!(
        hits["hits"][0]["metadata"]["sift.source_url"],
        format!("{base}/article"),
        "{hits}"
    );
    let packed = client
        .search(
            KB,
            json!({ "query": "green flashing harbour light", "top_k": 1, "context_tokens": 200 }),
        )
        .await;
    assert_eq!(
        packed["context"]["citations"][0]["source_url"],
        format!("{base}/article"),
        "{packed}"
    );

    // Fetched again unchanged: a duplicate. Changed: a new version replaces the old one.
    let again = added(&client, json!({ "urls": [format!("{base}/moved")] })).await;
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["id"], page_id.as_str(), "{again}");
    site.version.store(1, Ordering::SeqCst);
    let refreshed = added(&client, json!({ "urls": [format!("{base}/moved")] })).await;
    assert_eq!(refreshed["replaced"], page_id.as_str(), "{refreshed}");
    let record = client
        .wait_document(KB, refreshed["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    let hits = client
        .search(KB, json!({ "query": "flashes green every", "top_k": 5 }))
        .await;
    let text = hits.to_string();
    assert!(text.contains("every 5 seconds"), "{text}");
    assert!(
        !text.contains("every 4 seconds"),
        "the old version is gone: {text}"
    );

    // A page behind a redirect, posted with an explicit external id: cited by its final URL.
    let tides = added(
        &client,
        json!({ "urls": [{ "url": format!("{base}/old-tides"), "external_id": "tides-v1" }] }),
    )
    .await;
    let record = client
        .wait_document(KB, tides["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(
        record["metadata"]["sift.source_url"],
        format!("{base}/tides"),
        "{record}"
    );

    // An answer cites each page by the URL it was fetched from after redirects, whatever its
    // external id (the message's `annotations`, and `sift.citations`).
    let annotation_urls = |answer: &Value| -> Vec<String> {
        answer["choices"][0]["message"]["annotations"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|a| a["url_citation"]["url"].as_str().map(str::to_string))
            .collect()
    };
    let answer = client
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": format!("kb:{KB}"),
                "messages": [{ "role": "user", "content": "How often does the harbour light at Ardmore flash green?" }],
            }),
        )
        .await
        .expect(200);
    let urls = annotation_urls(&answer);
    assert!(urls.contains(&format!("{base}/article")), "{answer:#}");
    // every document of the KB came by URL: none is cited by a sift:// link
    assert!(urls.iter().all(|url| url.starts_with(&base)), "{answer:#}");
    let answer = client
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": format!("kb:{KB}"),
                "messages": [{ "role": "user", "content": "When are the Ardmore tide tables posted?" }],
            }),
        )
        .await
        .expect(200);
    let urls = annotation_urls(&answer);
    assert!(urls.contains(&format!("{base}/tides")), "{answer:#}");
    assert!(urls.iter().all(|url| url.starts_with(&base)), "{answer:#}");
    let citations = answer["sift"]["citations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        citations
            .iter()
            .any(|c| c["external_id"] == "tides-v1" && c["source_url"] == format!("{base}/tides")),
        "{answer:#}"
    );

    // `sift ingest` takes URLs beside files and names each one the node refused.
    let output = tokio::process::Command::new(sift_tests::node_binary())
        .env("SIFT_API_KEY", TEST_ADMIN_KEY)
        .args(["--node", &node.url, "ingest", KB])
        .arg(format!("{base}/article"))
        .arg("http://intranet.test/wiki")
        .output()
        .await
        .expect("running sift ingest");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|line| line.contains("http://intranet.test/wiki")
                && line.contains("refused: forbidden_url")),
        "{stderr}"
    );
    assert!(stderr.contains("1 ready, 0 failed, 1 refused"), "{stderr}");
    assert_stayed_on_loopback(&client).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_the_guard_or_the_fetch_refuses_store_nothing() {
    let (site, port) = start_site().await;
    let liar = start_liar().await;
    let (dir, node) = node().await;
    let client = node.client();
    let base = format!("http://site.test:{port}");
    let refused = [
        ("http://10.0.0.1/".to_string(), 400, "forbidden_url"),
        (
            "http://169.254.169.254/latest/meta-data/".to_string(),
            400,
            "forbidden_url",
        ),
        (format!("http://[::1]:{port}/article"), 400, "forbidden_url"),
        // loopback, but outside the allowed 127.0.0.1/32
        (
            format!("http://127.0.0.2:{port}/article"),
            400,
            "forbidden_url",
        ),
        // a name that resolves to a private address
        ("http://intranet.test/".to_string(), 400, "forbidden_url"),
        // an allowed page that redirects to one
        (format!("{base}/to-intranet"), 400, "forbidden_url"),
        ("file:///etc/passwd".to_string(), 400, "invalid_url"),
        (
            "gopher://127.0.0.1:70/_stats".to_string(),
            400,
            "invalid_url",
        ),
        ("http://".to_string(), 400, "invalid_url"),
        // too long to be the external id, and none given
        (
            format!("{base}/article?q={}", "x".repeat(600)),
            400,
            "invalid_url",
        ),
        (format!("{base}/loop"), 422, "fetch_failed"),
        (format!("{base}/hang"), 422, "fetch_failed"),
        (format!("{base}/missing"), 422, "fetch_failed"),
        (
            format!("http://127.0.0.1:{liar}/"),
            413,
            "payload_too_large",
        ),
        (format!("{base}/big"), 413, "payload_too_large"),
        (format!("{base}/logo.png"), 422, "invalid_image"),
    ];
    for (url, status, code) in &refused {
        let message = post_urls(&client, json!({ "urls": [url] }))
            .await
            .expect_error(*status, code);
        assert!(!message.is_empty(), "{url}");
    }
    // One bad URL among good ones: nothing is stored, the good page (fetched) included.
    post_urls(
        &client,
        json!({ "urls": [format!("{base}/article"), format!("{base}/to-intranet")] }),
    )
    .await
    .expect_error(400, "forbidden_url");
    let fetched_before = site.hits.load(Ordering::SeqCst);
    // Bodies refused before any fetch.
    let many: Vec<String> = (0..21).map(|n| format!("{base}/article?n={n}")).collect();
    post_urls(&client, json!({ "urls": many }))
        .await
        .expect_error(413, "too_many_documents");
    post_urls(
        &client,
        json!({ "urls": [format!("{base}/article")], "documents": [{ "text": "x" }] }),
    )
    .await
    .expect_error(400, "invalid_request");
    post_urls(&client, json!({ "urls": [{ "url": format!("{base}/article"), "metadata": { "sift.groups": "x" } }] })).await.expect_error(400, "invalid_metadata");
    post_urls(&client, json!({ "urls": [42] }))
        .await
        .expect_error(400, "invalid_json");
    assert_eq!(site.hits.load(Ordering::SeqCst), fetched_before);

    let documents = client.list_all_documents(KB, 100).await;
    assert!(documents.is_empty(), "{documents:?}");
    let temp = dir.path().join("node/tmp");
    let left: Vec<_> = std::fs::read_dir(&temp).unwrap().flatten().collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
    assert_stayed_on_loopback(&client).await;
    node.shutdown().await;
}
