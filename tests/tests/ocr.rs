//! Image documents read by OCR (issue 17, item 3): PNG, JPEG, TIFF and WebP uploads whose
//! text comes from an OpenAI-compatible vision model (a real HTTP server started by the test,
//! speaking the chat-completions wire format with `image_url` content parts) or from the
//! `tesseract` CLI when it is installed (`.ci/run` installs it); a KB's `ocr` setting picks
//! the engine. Scanned PDF pages: their images go to the same engine and their text takes
//! its place among the pages; without an engine the document says how many pages need OCR.
//! A page that no one image holds (a tiled scan, shapes) is rendered by `pdftoppm` when it is
//! installed (`.ci/run` installs poppler-utils), else counted; a TIFF reaches the vision model
//! as PNG; a Chinese KB's images are read by tesseract with `chi_sim`.
//! Bad input: an image of 30,000 × 30,000 pixels, bytes that are no image, an image where no
//! engine is set, a vision server that refuses the image.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use serde_json::{Value, json};
use sift_models::ocr::VisionConfig;
use sift_node::config::Config;
use sift_tests::{InProcessNode, WAIT, repo_root, require_model};

/// What the fake vision model saw and how it answers.
#[derive(Default)]
struct Vision {
    /// Each request's model and image (`data:` URI).
    calls: Mutex<Vec<(String, String)>>,
    /// Requests answered 503 before the first real answer (a service warming up).
    unavailable_first: Mutex<usize>,
    /// How long each answer takes (a model at work).
    delay: Mutex<Duration>,
}

/// The model's transcription of the harbour notice, in a Markdown fence as vision models
/// often answer.
const TRANSCRIPTION: &str = "```markdown\n# Harbour notice 4711\n\nPilots board vessels at the \
outer buoy. Harbour dues are payable in advance.\n```";

async fn completions(State(vision): State<Arc<Vision>>, Json(body): Json<Value>) -> Response {
    let content = &body["messages"][0]["content"];
    let image = content
        .as_array()
        .and_then(|parts| parts.iter().find(|part| part["type"] == "image_url"))
        .and_then(|part| part["image_url"]["url"].as_str())
        .unwrap_or_default()
        .to_string();
    let model = body["model"].as_str().unwrap_or_default().to_string();
    vision.calls.lock().unwrap().push((model, image.clone()));
    let delay = *vision.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    {
        let mut unavailable = vision.unavailable_first.lock().unwrap();
        if *unavailable > 0 {
            *unavailable -= 1;
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "error": { "message": "model is loading" } })),
            )
                .into_response();
        }
    }
    if !image.starts_with("data:image/") {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": { "message": "the message holds no image" } })),
        )
            .into_response();
    }
    if image.starts_with("data:image/webp") {
        // This model refuses WebP, as some servers do.
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": { "message": "unsupported image format webp" } })),
        )
            .into_response();
    }
    Json(json!({
        "id": "chatcmpl-ocr",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{
            "index": 0,
            "finish_reason": "stop",
            "message": { "role": "assistant", "content": TRANSCRIPTION },
        }],
    }))
    .into_response()
}

async fn start_vision() -> (Arc<Vision>, String) {
    let vision = Arc::new(Vision::default());
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(vision.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (vision, format!("http://127.0.0.1:{port}/v1"))
}

/// Whether `command probe` runs (tesseract, pdftoppm).
fn installed(command: &str, probe: &str) -> bool {
    std::process::Command::new(command)
        .arg(probe)
        .output()
        .is_ok_and(|output| output.status.success())
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo_root().join("tests/fixtures/ocr").join(name)).unwrap()
}

fn office_fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo_root().join("tests/fixtures/office").join(name)).unwrap()
}

fn pdf_fixture(name: &str) -> Vec<u8> {
    std::fs::read(repo_root().join("tests/fixtures/pdf").join(name)).unwrap()
}

/// The chunks of a document, with their pages.
async fn chunks_of(client: &sift_tests::ApiClient, kb: &str, id: &str) -> Vec<Value> {
    let answer = client
        .get(&format!("/v1/kbs/{kb}/documents/{id}/chunks"))
        .await
        .expect(200);
    answer["chunks"].as_array().cloned().unwrap_or_default()
}

async fn node_with_vision(base_url: &str) -> (tempfile::TempDir, InProcessNode) {
    node_with_vision_and(base_url, |_| {}).await
}

async fn node_with_vision_and(
    base_url: &str,
    change: impl FnOnce(&mut Config),
) -> (tempfile::TempDir, InProcessNode) {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.ocr.vision = Some(VisionConfig {
        base_url: base_url.to_string(),
        model: "olmocr-test".into(),
        api_key: None,
        max_tokens: 2048,
    });
    config.ocr.timeout = Duration::from_secs(10);
    config.ocr.retries = 2;
    // One ingestion worker: a document queued behind another waits for it (the parse
    // progress check below follows a PDF's events before its parse starts).
    config.options.ingest_workers = 1;
    change(&mut config);
    let node = InProcessNode::start_with(config).await;
    (dir, node)
}

/// The text of a document's chunks by page (`0`: none).
async fn page_texts(client: &sift_tests::ApiClient, kb: &str, id: &str) -> Vec<(u64, String)> {
    chunks_of(client, kb, id)
        .await
        .iter()
        .map(|chunk| {
            (
                chunk["pages"]["first"].as_u64().unwrap_or(0),
                chunk["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_read_by_the_vision_model_and_found_by_their_text() {
    let (vision, base_url) = start_vision().await;
    *vision.unavailable_first.lock().unwrap() = 1;
    let (_dir, node) = node_with_vision(&base_url).await;
    let client = node.client();
    client.create_kb(json!({ "name": "scans" })).await;

    // A PNG: the model answers 503 once (retried), then the transcription.
    let png = fixture("harbour-notice.png");
    let added = client.upload_ok("scans", "notice.png", png.clone()).await;
    let id = added["id"].as_str().unwrap().to_string();
    let record = client.wait_document("scans", &id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["source"]["upload"]["format"], "image", "{record}");
    {
        let calls = vision.calls.lock().unwrap();
        assert_eq!(calls.len(), 2, "one 503, then the answer");
        let expected = format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&png)
        );
        for (model, image) in calls.iter() {
            assert_eq!(model, "olmocr-test");
            assert!(*image == expected, "the image sent is the upload's bytes");
        }
    }
    let chunks = client
        .get(&format!("/v1/kbs/scans/documents/{id}/chunks"))
        .await
        .expect(200)
        .to_string();
    assert!(
        chunks.contains("Pilots board vessels at the outer buoy"),
        "{chunks}"
    );
    assert!(
        !chunks.contains("```"),
        "the fence is not indexed: {chunks}"
    );
    let hits = client
        .search(
            "scans",
            json!({ "query": "where do pilots board vessels", "top_k": 3 }),
        )
        .await;
    assert_eq!(hits["hits"][0]["document_id"], id.as_str(), "{hits}");

    // A JPEG goes as it is; a TIFF goes as PNG (most vision servers take no TIFF).
    for (name, media_type) in [
        ("harbour-notice.jpg", "image/jpeg"),
        ("harbour-notice.tif", "image/png"),
    ] {
        let calls_before = vision.calls.lock().unwrap().len();
        let added = client.upload_ok("scans", name, fixture(name)).await;
        let id = added["id"].as_str().unwrap().to_string();
        let record = client.wait_document("scans", &id, WAIT).await;
        assert_eq!(record["status"], "ready", "{name}: {record}");
        let calls = vision.calls.lock().unwrap();
        assert_eq!(calls.len(), calls_before + 1, "{name}");
        let uri = &calls[calls_before].1;
        let prefix = format!("data:{media_type};base64,");
        assert!(
            uri.starts_with(&prefix),
            "{name}: {}",
            &uri[..40.min(uri.len())]
        );
        let data = base64::engine::general_purpose::STANDARD
            .decode(&uri[prefix.len()..])
            .unwrap();
        let magic: &[u8] = match media_type {
            "image/png" => b"\x89PNG\r\n\x1a\n",
            _ => b"\xff\xd8\xff",
        };
        assert!(data.starts_with(magic), "{name}: not {media_type}");
    }

    // A model that refuses the image: the document fails with the reason, nothing retried.
    let calls_before = vision.calls.lock().unwrap().len();
    let webp = client
        .upload_ok("scans", "notice.webp", fixture("harbour-notice.webp"))
        .await;
    let record = client
        .wait_document("scans", webp["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "failed", "{record}");
    let reason = record["error"].as_str().unwrap_or_default();
    assert!(reason.starts_with("ocr_failed"), "{reason}");
    assert!(reason.contains("unsupported image format webp"), "{reason}");
    assert_eq!(vision.calls.lock().unwrap().len(), calls_before + 1);

    // A PDF whose second page is a scan: that page's image goes to the model (followed by
    // its events, page by page), its text takes the page's place.
    *vision.delay.lock().unwrap() = Duration::from_millis(400);
    let calls_before = vision.calls.lock().unwrap().len();
    let mixed = client
        .upload_ok("scans", "handbook.pdf", pdf_fixture("mixed-scan.pdf"))
        .await;
    let mixed_id = mixed["id"].as_str().unwrap().to_string();
    let mut stream = sift_tests::sse::SseReader::open(client.request(
        reqwest::Method::GET,
        &format!("/v1/kbs/scans/documents/{mixed_id}/events"),
    ))
    .await;
    let events = stream.until("ready").await;
    let progress: Vec<&Value> = events
        .iter()
        .filter_map(|event| event.data.get("ocr_pages"))
        .collect();
    assert_eq!(progress, [&json!({ "done": 1, "total": 1 })], "{events:#?}");
    let record = client.document("scans", &mixed_id).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 0, "{record}");
    {
        let calls = vision.calls.lock().unwrap();
        assert_eq!(calls.len(), calls_before + 1, "one scanned page, one call");
        assert!(calls[calls_before].1.starts_with("data:image/png;base64,"));
    }
    let pages: Vec<(u64, String)> = chunks_of(&client, "scans", &mixed_id)
        .await
        .iter()
        .map(|chunk| {
            (
                chunk["pages"]["first"].as_u64().unwrap_or(0),
                chunk["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        pages
            .iter()
            .any(|(page, text)| *page == 1 && text.contains("Port handbook")),
        "{pages:?}"
    );
    assert!(
        pages
            .iter()
            .any(|(page, text)| *page == 2 && text.contains("Pilots board vessels")),
        "{pages:?}"
    );
    *vision.delay.lock().unwrap() = Duration::ZERO;

    // Parsing reports a PDF's pages in its events too. The PDF waits behind an image that the
    // model reads slowly, so its events are followed before its parse starts.
    *vision.delay.lock().unwrap() = Duration::from_millis(1500);
    // Other bytes than the first PNG's (a duplicate would not be ingested at all): the same
    // image with bytes after its end.
    let mut other_png = png.clone();
    other_png.extend_from_slice(b"bytes after IEND");
    let slow = client
        .upload_ok("scans", "notice-again.png", other_png)
        .await;
    assert_eq!(slow["duplicate"], false, "{slow}");
    let pdf = client
        .upload_ok(
            "scans",
            "harbour-lights.pdf",
            pdf_fixture("three-pages.pdf"),
        )
        .await;
    let pdf_id = pdf["id"].as_str().unwrap().to_string();
    let mut stream = sift_tests::sse::SseReader::open(client.request(
        reqwest::Method::GET,
        &format!("/v1/kbs/scans/documents/{pdf_id}/events"),
    ))
    .await;
    let events = stream.until("ready").await;
    let progress: Vec<&Value> = events
        .iter()
        .filter_map(|event| event.data.get("parse_pages"))
        .collect();
    assert_eq!(
        progress,
        [
            &json!({ "done": 1, "total": 3 }),
            &json!({ "done": 2, "total": 3 }),
            &json!({ "done": 3, "total": 3 }),
        ],
        "{events:#?}"
    );
    *vision.delay.lock().unwrap() = Duration::ZERO;
    let slow = client
        .wait_document("scans", slow["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(slow["status"], "ready", "{slow}");

    // A PDF whose pages 2 and 3 have a garbled text layer over the scan: read as scans, the
    // garbage left out.
    let calls_before = vision.calls.lock().unwrap().len();
    let garbled = client
        .upload_ok("scans", "garbled.pdf", pdf_fixture("garbled-scan.pdf"))
        .await;
    let garbled_id = garbled["id"].as_str().unwrap().to_string();
    let record = client.wait_document("scans", &garbled_id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 0, "{record}");
    assert_eq!(vision.calls.lock().unwrap().len(), calls_before + 2);
    let chunks = chunks_of(&client, "scans", &garbled_id).await;
    for page in [2, 3] {
        assert!(
            chunks.iter().any(|chunk| chunk["pages"]["first"] == page
                && chunk["text"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("Pilots board vessels")),
            "page {page}: {chunks:#?}"
        );
    }
    assert!(
        chunks.iter().all(|chunk| {
            let text = chunk["text"].as_str().unwrap_or_default();
            !text.contains("1RWLFH") && !text.contains('\u{E04E}')
        }),
        "{chunks:#?}"
    );

    // A tiled scan (page 2: three image strips, no one of which holds the page) and a page
    // of shapes (page 4) are rendered whole by pdftoppm and read; the blank page 3 is no
    // scan. Without pdftoppm both are counted.
    let renders = installed("pdftoppm", "-v");
    let calls_before = vision.calls.lock().unwrap().len();
    let tiled = client
        .upload_ok("scans", "tiled.pdf", pdf_fixture("tiled-scan.pdf"))
        .await;
    let tiled_id = tiled["id"].as_str().unwrap().to_string();
    let record = client.wait_document("scans", &tiled_id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    if renders {
        assert_eq!(record["pages_needing_ocr"], 0, "{record}");
        {
            let calls = vision.calls.lock().unwrap();
            assert_eq!(calls.len(), calls_before + 2, "pages 2 and 4, rendered");
            assert!(
                calls[calls_before..]
                    .iter()
                    .all(|(_, image)| image.starts_with("data:image/png;base64,"))
            );
        }
        let pages = page_texts(&client, "scans", &tiled_id).await;
        assert!(
            pages
                .iter()
                .any(|(page, text)| *page == 2 && text.contains("Pilots board vessels")),
            "{pages:?}"
        );
    } else {
        eprintln!("pdftoppm is not installed: checking that unrendered pages are counted");
        assert_eq!(record["pages_needing_ocr"], 2, "{record}");
        assert_eq!(vision.calls.lock().unwrap().len(), calls_before);
    }

    // Pictures of Word and PowerPoint files: read where they stand.
    for name in ["pictured.docx", "pictured.pptx"] {
        let calls_before = vision.calls.lock().unwrap().len();
        let added = client.upload_ok("scans", name, office_fixture(name)).await;
        let id = added["id"].as_str().unwrap().to_string();
        let record = client.wait_document("scans", &id, WAIT).await;
        assert_eq!(record["status"], "ready", "{name}: {record}");
        assert_eq!(
            vision.calls.lock().unwrap().len(),
            calls_before + 1,
            "{name}"
        );
        let chunks = chunks_of(&client, "scans", &id).await;
        let text = chunks
            .iter()
            .map(|chunk| chunk["text"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(text.contains("Pilots board vessels"), "{name}: {text}");
        // A slide's picture text stays on its slide (a page of the deck).
        let expected_pages = match name {
            "pictured.pptx" => json!({ "first": 1, "last": 1 }),
            _ => Value::Null,
        };
        for chunk in &chunks {
            assert_eq!(chunk["pages"], expected_pages, "{name}: {chunk:#}");
        }
        assert!(
            text.contains("Pier head") || text.contains("pier head"),
            "{name}: {text}"
        );
        assert!(!text.contains("sift-picture"), "{name}: {text}");
    }

    // Bad input, refused at the door with nothing stored.
    let before = client.list_all_documents("scans", 100).await.len();
    let message = client
        .upload("scans", "huge.png", fixture("huge-30000.png"))
        .await
        .expect_error(422, "image_too_large");
    assert!(message.contains("30000 × 30000"), "{message}");
    client
        .upload("scans", "photo.jpg", b"%PDF-1.7 this is no photo".to_vec())
        .await
        .expect_error(422, "content_mismatch");
    client
        .upload(
            "scans",
            "broken.png",
            png.iter().take(20).copied().collect(),
        )
        .await
        .expect_error(422, "invalid_image");
    assert_eq!(client.list_all_documents("scans", 100).await.len(), before);

    // A KB with OCR off refuses images, naming the setting; the setting is checked.
    client
        .create_kb(json!({ "name": "no-ocr", "ocr": "off" }))
        .await;
    let message = client
        .upload("no-ocr", "notice.png", png.clone())
        .await
        .expect_error(422, "ocr_unavailable");
    assert!(message.contains("ocr"), "{message}");
    client
        .patch_json("/v1/kbs/no-ocr", &json!({ "ocr": "sometimes" }))
        .await
        .expect_error(400, "invalid_settings");
    let kb = client
        .patch_json("/v1/kbs/no-ocr", &json!({ "ocr": "vision" }))
        .await
        .expect(200);
    assert_eq!(kb["settings"]["ocr"], "vision", "{kb}");
    client.upload_ok("no-ocr", "notice.png", png).await;

    // Without an engine: a PDF with text and a scanned page is indexed and says one page
    // needs OCR; a PDF of scans only is refused, naming why.
    client
        .patch_json("/v1/kbs/no-ocr", &json!({ "ocr": "off" }))
        .await
        .expect(200);
    let mixed = client
        .upload_ok("no-ocr", "handbook.pdf", pdf_fixture("mixed-scan.pdf"))
        .await;
    let record = client
        .wait_document("no-ocr", mixed["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 1, "{record}");
    let message = client
        .upload("no-ocr", "notice.pdf", pdf_fixture("notice-scan.pdf"))
        .await
        .expect_error(422, "no_text_layer");
    assert!(message.contains("OCR"), "{message}");
    // A Word file's picture without an engine: its text is indexed, the picture's marker is not.
    let pictured = client
        .upload_ok("no-ocr", "pictured.docx", office_fixture("pictured.docx"))
        .await;
    let pictured_id = pictured["id"].as_str().unwrap().to_string();
    let record = client.wait_document("no-ocr", &pictured_id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    // Its one picture is counted as needing OCR.
    assert_eq!(record["pages_needing_ocr"], 1, "{record}");
    let text = chunks_of(&client, "no-ocr", &pictured_id).await;
    let text = serde_json::to_string(&text).unwrap();
    assert!(text.contains("The notice below is posted"), "{text}");
    assert!(
        !text.contains("sift-picture") && !text.contains("Pilots"),
        "{text}"
    );
    // A tiled scan and a page of shapes without an engine: counted (the blank page is not).
    let tiled = client
        .upload_ok("no-ocr", "tiled.pdf", pdf_fixture("tiled-scan.pdf"))
        .await;
    let record = client
        .wait_document("no-ocr", tiled["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 2, "{record}");
}

/// A node without pdftoppm: a page that no one image holds is counted, never silently empty;
/// a page with one image that covers only part of it is read from that image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pdftoppm_pages_that_no_image_holds_are_counted() {
    let (vision, base_url) = start_vision().await;
    let (_dir, node) = node_with_vision_and(&base_url, |config| config.ocr.pdftoppm = None).await;
    let client = node.client();
    client.create_kb(json!({ "name": "scans" })).await;
    let tiled = client
        .upload_ok("scans", "tiled.pdf", pdf_fixture("tiled-scan.pdf"))
        .await;
    let record = client
        .wait_document("scans", tiled["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 2, "{record}");
    assert_eq!(vision.calls.lock().unwrap().len(), 0, "nothing to send");

    let mixed = client
        .upload_ok("scans", "handbook.pdf", pdf_fixture("mixed-scan.pdf"))
        .await;
    let mixed_id = mixed["id"].as_str().unwrap().to_string();
    let record = client.wait_document("scans", &mixed_id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["pages_needing_ocr"], 0, "{record}");
    {
        let calls = vision.calls.lock().unwrap();
        assert_eq!(calls.len(), 1, "{calls:?}");
        // The page's own image, as the PDF stores it (1000 × 360), not a rendering.
        let uri = &calls[0].1;
        let prefix = "data:image/png;base64,";
        let png = base64::engine::general_purpose::STANDARD
            .decode(&uri[prefix.len()..])
            .unwrap();
        assert_eq!(&png[16..24], &[0, 0, 3, 0xe8, 0, 0, 1, 0x68], "1000 × 360");
    }
    let pages = page_texts(&client, "scans", &mixed_id).await;
    assert!(
        pages
            .iter()
            .any(|(page, text)| *page == 2 && text.contains("Pilots board vessels")),
        "{pages:?}"
    );
}

/// `tesseract` on the PATH (as `.ci/run` installs it) reads the notice; without it, a KB that
/// asks for tesseract refuses images.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tesseract_reads_an_image_when_it_is_installed() {
    let has_tesseract = installed("tesseract", "--version");
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "scans", "ocr": "tesseract" }))
        .await;
    let installed_renderer = installed("pdftoppm", "-v");
    let png = fixture("harbour-notice.png");
    if !has_tesseract {
        eprintln!("tesseract is not installed: checking that images are refused");
        client
            .upload("scans", "notice.png", png)
            .await
            .expect_error(422, "ocr_unavailable");
        return;
    }
    let mut files = vec![
        ("harbour-notice.png", fixture("harbour-notice.png")),
        ("harbour-notice.jpg", fixture("harbour-notice.jpg")),
        ("harbour-notice.tif", fixture("harbour-notice.tif")),
        ("harbour-notice.webp", fixture("harbour-notice.webp")),
        ("notice-scan.pdf", pdf_fixture("notice-scan.pdf")),
    ];
    // The tiled scan's page 2 is rendered (pdftoppm), then read.
    if installed_renderer {
        files.push(("tiled-scan.pdf", pdf_fixture("tiled-scan.pdf")));
    }
    for (name, bytes) in files {
        let added = client.upload_ok("scans", name, bytes).await;
        let id = added["id"].as_str().unwrap().to_string();
        let record = client.wait_document("scans", &id, WAIT).await;
        assert_eq!(record["status"], "ready", "{name}: {record}");
        let chunks = client
            .get(&format!("/v1/kbs/scans/documents/{id}/chunks"))
            .await
            .expect(200)
            .to_string()
            .to_lowercase();
        for words in ["harbour notice 4711", "outer buoy", "payable in advance"] {
            assert!(chunks.contains(words), "{name}: {words:?} not in {chunks}");
        }
    }

    // A KB whose language is zh reads with chi_sim (Debian tesseract-ocr-chi-sim, which
    // `.ci/run` installs), and the notice is found by a Chinese word alone (BM25).
    client
        .create_kb(json!({ "name": "zh-scans", "ocr": "tesseract", "language": "zh" }))
        .await;
    let added = client
        .upload_ok("zh-scans", "notice.png", fixture("chinese-notice.png"))
        .await;
    let id = added["id"].as_str().unwrap().to_string();
    let record = client.wait_document("zh-scans", &id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    let chunks = chunks_of(&client, "zh-scans", &id).await;
    let text: String = chunks
        .iter()
        .map(|chunk| chunk["text"].as_str().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
        .split_whitespace()
        .collect();
    assert!(text.contains("引航员在外浮标登船"), "{text}");
    let hits = client
        .search(
            "zh-scans",
            json!({ "query": "浮标", "channels": ["bm25"], "top_k": 3 }),
        )
        .await;
    assert_eq!(hits["hits"][0]["document_id"], id.as_str(), "{hits}");
}
