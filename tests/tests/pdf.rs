//! PDF ingestion (issue 17, first increment): uploads, pages on chunks, hits and citations,
//! bad PDFs refused with their codes, `sift ingest` of a folder with PDFs in it, and the parse
//! worker process of a node run from the `sift` binary, killed when a PDF (or an `.xls`
//! workbook) makes it spin, and held to its memory budget when a PDF inflates.
//!
//! The fixtures are `tests/fixtures/pdf/` (made by its `make.py`; see its README).

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};
use sift_node::config::{Config, TEST_ADMIN_KEY};
use sift_tests::sse::ask;
use sift_tests::{ApiClient, InProcessNode, NodeProcess, WAIT, repo_root, require_model};

const KB: &str = "manuals";

fn fixture(name: &str) -> Vec<u8> {
    let path = repo_root().join("tests/fixtures/pdf").join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn office_fixture(name: &str) -> Vec<u8> {
    let path = repo_root().join("tests/fixtures/office").join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

async fn node_with(tweak: impl FnOnce(&mut Config)) -> (tempfile::TempDir, InProcessNode) {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    tweak(&mut config);
    let node = InProcessNode::start_with(config).await;
    node.client().create_kb(json!({ "name": KB })).await;
    (dir, node)
}

fn pages(first: u32, last: u32) -> Value {
    json!({ "first": first, "last": last })
}

/// Uploads `bytes` as a file part named `file_name` of media type `media_type`.
async fn upload_typed(
    client: &ApiClient,
    file_name: &str,
    media_type: &str,
    bytes: Vec<u8>,
) -> Value {
    let part = reqwest::multipart::Part::bytes(bytes)
        .file_name(file_name.to_string())
        .mime_str(media_type)
        .unwrap();
    let request = client
        .request(Method::POST, &format!("/v1/kbs/{KB}/documents"))
        .multipart(reqwest::multipart::Form::new().part("file", part));
    client.send(request).await.expect(202)["documents"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_is_searchable_and_its_hits_and_citations_carry_pages() {
    let (_dir, node) = node_with(|_| {}).await;
    let client = node.client();
    let added = client
        .upload_ok(KB, "harbour-lights.pdf", fixture("three-pages.pdf"))
        .await;
    let id = added["id"].as_str().unwrap().to_string();
    let record = client.wait_document(KB, &id, WAIT).await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["source"]["upload"]["format"], "pdf", "{record}");

    // A chunk per page (the pages are short), each under its outline heading.
    let chunks = client
        .get(&format!("/v1/kbs/{KB}/documents/{id}/chunks"))
        .await
        .expect(200);
    let chunks = chunks["chunks"].as_array().unwrap().clone();
    let placed: Vec<(Value, Value)> = chunks
        .iter()
        .map(|chunk| (chunk["pages"].clone(), chunk["heading_path"].clone()))
        .collect();
    assert_eq!(
        placed,
        [
            (pages(1, 1), json!(["Introduction"])),
            (pages(2, 2), json!(["Optics"])),
            (pages(3, 3), json!(["Tides and weather"])),
        ],
        "{chunks:#?}"
    );

    // Text from page 2 is found, with its page, in the hit and in the packed context.
    let answer = client
        .search(
            KB,
            json!({ "query": "Fresnel lens of the Skerryvore lighthouse", "top_k": 3, "context_tokens": 400 }),
        )
        .await;
    let hit = &answer["hits"][0];
    assert!(
        hit["text"].as_str().unwrap().contains("Skerryvore"),
        "{answer:#}"
    );
    assert_eq!(hit["pages"], pages(2, 2), "{hit:#}");
    assert_eq!(hit["heading_path"], json!(["Optics"]));
    // Hyphenation at the line end undone in the indexed text.
    assert!(hit["text"].as_str().unwrap().contains("information plate"));
    let citation = &answer["context"]["citations"][0];
    assert_eq!(citation["chunk_ids"][0], hit["chunk_id"], "{answer:#}");
    assert_eq!(citation["pages"], pages(2, 2), "{citation:#}");

    // An agent run's citation (no model: extractive) names the page too.
    let session = client
        .post_json("/v1/sessions", &json!({ "kbs": [KB] }))
        .await
        .expect(201);
    let events = ask(
        &client,
        session["id"].as_str().unwrap(),
        "What does the Fresnel lens of the Skerryvore lighthouse do?",
    )
    .await
    .rest()
    .await;
    let citations: Vec<&Value> = events
        .iter()
        .filter(|event| event.event == "citation")
        .map(|event| &event.data)
        .collect();
    let cited = citations
        .iter()
        .find(|citation| {
            citation["text"]
                .as_str()
                .unwrap_or("")
                .contains("Skerryvore")
        })
        .unwrap_or_else(|| panic!("no citation of page 2: {citations:#?}"));
    assert_eq!(cited["pages"], pages(2, 2), "{cited:#}");
    assert_eq!(cited["document_id"], id.as_str());

    // Documents of other formats have no pages.
    client
        .upload_ok(
            KB,
            "notes.txt",
            b"Keepers logged the fog signal hours.".to_vec(),
        )
        .await;
    client.wait_ready(KB, 2, WAIT).await;
    let answer = client
        .search(KB, json!({ "query": "fog signal hours", "top_k": 1 }))
        .await;
    assert_eq!(answer["hits"][0]["title"], "notes.txt", "{answer:#}");
    assert_eq!(answer["hits"][0]["pages"], Value::Null);

    // A table in a PDF is found as a Markdown table, whole, with its header row and page.
    client
        .upload_ok(KB, "coast-lights.pdf", fixture("table.pdf"))
        .await;
    client.wait_ready(KB, 3, WAIT).await;
    let answer = client
        .search(
            KB,
            json!({ "query": "Bell Rock Fl W 5s", "top_k": 1, "channels": ["bm25"] }),
        )
        .await;
    let hit = &answer["hits"][0];
    let text = hit["text"].as_str().unwrap();
    for row in [
        "| Light | Range (nm) | Character |",
        "| Bell Rock | 18 | Fl W 5s |",
        "| Eddystone | 17 | Fl (2) W 10s |",
    ] {
        assert!(text.contains(row), "{row:?} in {answer:#}");
    }
    assert_eq!(hit["pages"], pages(2, 2), "{hit:#}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_is_recognised_by_its_media_type_and_opens_with_an_empty_password() {
    let (_dir, node) = node_with(|_| {}).await;
    let client = node.client();
    // No extension: the part's Content-Type says PDF.
    let added = upload_typed(
        &client,
        "scan-0042",
        "application/pdf",
        fixture("three-pages.pdf"),
    )
    .await;
    let record = client
        .wait_document(KB, added["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    assert_eq!(record["source"]["upload"]["format"], "pdf", "{record}");
    // Encrypted with an empty user password: readers open it without asking, so do we.
    let added = client
        .upload_ok(KB, "open.pdf", fixture("empty-password.pdf"))
        .await;
    let record = client
        .wait_document(KB, added["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    let chunks = client
        .get(&format!(
            "/v1/kbs/{KB}/documents/{}/chunks",
            record["id"].as_str().unwrap()
        ))
        .await
        .expect(200);
    assert!(
        chunks["chunks"][1]["text"]
            .as_str()
            .unwrap()
            .contains("Skerryvore"),
        "{chunks:#}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pdfs_are_refused_with_their_codes_and_nothing_is_stored() {
    let (dir, node) = node_with(|_| {}).await;
    let client = node.client();
    // Without OCR a scan has no text to give (with it, see ocr.rs).
    client
        .patch_json(&format!("/v1/kbs/{KB}"), &json!({ "ocr": "off" }))
        .await
        .expect(200);
    let refusals = [
        ("locked.pdf", fixture("encrypted.pdf"), "encrypted_pdf"),
        ("corrupt.pdf", fixture("corrupt.pdf"), "invalid_pdf"),
        ("truncated.pdf", fixture("truncated.pdf"), "invalid_pdf"),
        ("fake.pdf", b"%PDF-1.7\n%binary".to_vec(), "invalid_pdf"),
        ("scan.pdf", fixture("scanned.pdf"), "no_text_layer"),
        ("loop.pdf", fixture("page-tree-loop.pdf"), "invalid_pdf"),
        ("bomb.pdf", fixture("flate-bomb.pdf"), "pdf_too_large"),
    ];
    for (name, bytes, code) in refusals {
        let message = client.upload(KB, name, bytes).await.expect_error(422, code);
        assert!(!message.is_empty(), "{name}");
    }
    let kb = client.get(&format!("/v1/kbs/{KB}")).await.expect(200);
    assert_eq!(kb["documents"]["total"], 0, "{kb:#}");
    // No temp file of a refused upload is left behind.
    let temp = dir.path().join("node").join("tmp");
    let left: Vec<_> = std::fs::read_dir(&temp)
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    // The node still serves, and reads the damage readers repair: a broken xref table (the
    // objects found by scanning) and a stream that declares 2 GiB (read to its `endstream`).
    client
        .upload_ok(KB, "fine.txt", b"still here".to_vec())
        .await;
    client
        .upload_ok(KB, "xref.pdf", fixture("broken-xref.pdf"))
        .await;
    client
        .upload_ok(KB, "long.pdf", fixture("huge-length.pdf"))
        .await;
    client.wait_ready(KB, 3, WAIT).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_past_the_page_cap_is_pdf_too_large() {
    let (_dir, node) = node_with(|config| config.options.pdf_limits.max_pages = 2).await;
    let client = node.client();
    let message = client
        .upload(KB, "long.pdf", fixture("three-pages.pdf"))
        .await
        .expect_error(422, "pdf_too_large");
    assert!(message.contains("3 pages"), "{message}");
    assert!(message.contains("pdf_max_pages"), "{message}");
    let kb = client.get(&format!("/v1/kbs/{KB}")).await.expect(200);
    assert_eq!(kb["documents"]["total"], 0, "{kb:#}");
    node.shutdown().await;
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sift_ingest_of_a_folder_uploads_pdfs_and_exits_1_naming_the_refused_file() {
    let (dir, node) = node_with(|_| {}).await;
    let folder = dir.path().join("handbook");
    std::fs::create_dir_all(folder.join("annex")).unwrap();
    write(&folder, "harbour-lights.pdf", &fixture("three-pages.pdf"));
    write(
        &folder,
        "notes.md",
        b"# Notes\n\nThe fog bell rang every thirty seconds.",
    );
    write(
        &folder.join("annex"),
        "locked.pdf",
        &fixture("encrypted.pdf"),
    );
    write(&folder, "slides.ppt", b"\xd0\xcf\x11\xe0 old PowerPoint");
    let output = tokio::process::Command::new(sift_tests::node_binary())
        .env("SIFT_API_KEY", TEST_ADMIN_KEY)
        .args(["--node", &node.url, "ingest", KB])
        .arg(&folder)
        .output()
        .await
        .expect("running sift ingest");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let refusal = stderr
        .lines()
        .find(|line| line.contains("locked.pdf"))
        .unwrap_or_else(|| panic!("the refused file is named: {stderr}"));
    assert!(refusal.contains("refused: encrypted_pdf"), "{refusal}");
    assert!(
        stderr.lines().any(|line| line.contains("slides.ppt")
            && line.contains("refused: unsupported_type")
            && line.contains("PowerPoint 97-2003")),
        "{stderr}"
    );
    assert!(stderr.contains("2 ready, 0 failed, 2 refused"), "{stderr}");
    let client = node.client();
    let counts = client.wait_ready(KB, 2, WAIT).await;
    assert_eq!(counts["total"], 2, "{counts}");
    node.shutdown().await;
}

/// The `comm` of every live process whose parent is `pid`.
fn child_processes(pid: u32) -> Vec<String> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let parent = tail.split_whitespace().nth(1);
        if parent == Some(pid.to_string().as_str()) {
            children.push(
                head.split_once('(')
                    .map(|(_, c)| c)
                    .unwrap_or(head)
                    .to_string(),
            );
        }
    }
    children
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_process_parses_pdfs_and_xls_in_workers_and_kills_those_that_spin() {
    let dir = sift_tests::temp_dir();
    let mut node = NodeProcess::start(
        &dir.path().join("node"),
        &[("SIFT_PDF_PARSE_TIMEOUT_MS", "1500")],
    );
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB })).await;

    // pdf_oxide spins on this file for far longer than the budget (found by fuzzing).
    let upload = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .upload(KB, "spins.pdf", fixture("hangs-parser.pdf"))
                .await
        })
    };
    let watched = std::time::Instant::now();
    let mut worker_seen = false;
    while !upload.is_finished() && watched.elapsed() < std::time::Duration::from_secs(30) {
        worker_seen |= !child_processes(node.pid()).is_empty();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let message = upload.await.unwrap().expect_error(422, "pdf_too_large");
    assert!(message.contains("budget"), "{message}");
    assert!(
        worker_seen,
        "the PDF was parsed in a child process of the node"
    );
    let left = child_processes(node.pid());
    assert!(left.is_empty(), "the spinning worker was killed: {left:?}");

    // An ordinary PDF goes through a worker to the end, pages and all.
    let added = client
        .upload_ok(KB, "harbour-lights.pdf", fixture("three-pages.pdf"))
        .await;
    let record = client
        .wait_document(KB, added["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    let answer = client
        .search(
            KB,
            json!({ "query": "Fresnel lens of the Skerryvore lighthouse", "top_k": 3 }),
        )
        .await;
    assert_eq!(answer["hits"][0]["pages"], pages(2, 2), "{answer:#}");
    assert_eq!(answer["hits"][0]["heading_path"], json!(["Optics"]));
    assert!(child_processes(node.pid()).is_empty());

    // An Excel 97-2003 workbook goes through a worker too: calamine loops on this one's
    // sector chain (found by fuzzing), copying as it goes, so its worker either runs into
    // its memory cap or is killed at the budget, whichever comes first.
    let message = client
        .upload(KB, "loops.xls", office_fixture("calamine-cfb-loop.xls"))
        .await
        .expect_error(422, "document_too_large");
    assert!(
        message.contains("pdf_parse_timeout_ms") || message.contains("pdf_worker_memory_mb"),
        "{message}"
    );
    assert!(child_processes(node.pid()).is_empty());
    let added = client
        .upload_ok(KB, "inventory.xls", office_fixture("inventory.xls"))
        .await;
    let record = client
        .wait_document(KB, added["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    let answer = client
        .search(
            KB,
            json!({ "query": "Tidewater Forge supplier", "top_k": 3 }),
        )
        .await;
    assert!(
        answer["hits"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Row 2: Name: Tidewater Forge; Country: Norway"),
        "{answer:#}"
    );
    assert_eq!(answer["hits"][0]["heading_path"], json!(["Suppliers"]));
    node.stop();
}

/// A PDF of `pages` pages that all draw the same content stream of about `kib` KiB of text:
/// a small file whose text is `pages` times larger (a bomb that needs no compression, so
/// the parser's decompression limits do not stop it).
fn inflating_pdf(pages: usize, kib: usize) -> Vec<u8> {
    let line = format!("({}) Tj T*\n", "The keeper logs the tide. ".repeat(40));
    let mut content = String::from("BT /F1 11 Tf 14 TL 72 720 Td\n");
    while content.len() < kib * 1024 {
        content.push_str(&line);
    }
    content.push_str("ET");
    let kids: Vec<String> = (0..pages).map(|page| format!("{} 0 R", 5 + page)).collect();
    let mut objects = vec![
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} >>",
            kids.join(" ")
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_string(),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ),
    ];
    objects.extend((0..pages).map(|_| {
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] \
         /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
            .to_string()
    }));
    let mut pdf = String::from("%PDF-1.7\n");
    let mut offsets = Vec::new();
    for (number, body) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.push_str(&format!("{} 0 obj\n{body}\nendobj\n", number + 1));
    }
    let xref = pdf.len();
    pdf.push_str(&format!(
        "xref\n0 {}\n0000000000 65535 f \n",
        objects.len() + 1
    ));
    for offset in offsets {
        pdf.push_str(&format!("{offset:010} 00000 n \n"));
    }
    pdf.push_str(&format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    ));
    pdf.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_that_inflates_past_the_worker_memory_is_refused_and_the_node_serves_on() {
    let dir = sift_tests::temp_dir();
    let mut node = NodeProcess::start(
        &dir.path().join("node"),
        &[("SIFT_PDF_WORKER_MEMORY_MB", "128")],
    );
    node.require_embedded_model().await;
    let client = node.client();
    client.create_kb(json!({ "name": KB })).await;

    // 1 MiB of file, 200 MiB of text: the worker's allocations fail at its 128 MiB.
    let bomb = inflating_pdf(200, 1024);
    assert!(bomb.len() < 2 << 20, "{}", bomb.len());
    let message = client
        .upload(KB, "inflates.pdf", bomb)
        .await
        .expect_error(422, "pdf_too_large");
    assert!(message.contains("pdf_worker_memory_mb"), "{message}");
    assert!(child_processes(node.pid()).is_empty());

    // The same shape at a size that fits goes through, and nothing of the bomb was stored.
    let added = client.upload_ok(KB, "fits.pdf", inflating_pdf(3, 2)).await;
    let record = client
        .wait_document(KB, added["id"].as_str().unwrap(), WAIT)
        .await;
    assert_eq!(record["status"], "ready", "{record}");
    let listed = client.list_all_documents(KB, 10).await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["id"], added["id"]);
    node.stop();
}
