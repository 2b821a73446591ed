//! Real OpenAI clients, unchanged, against a node: the official `openai` SDK and LangChain's
//! `ChatOpenAI` (tests/clients/openai_clients.py, in the Python environment that
//! scripts/client-venv.sh makes and scripts/test.sh names in `SIFT_CLIENTS_PYTHON`), with the
//! fake chat model and no Sift extension field.

use std::process::Command;

use serde_json::json;
use sift_models::fake_server::{FakeLlm, react_agent};
use sift_models::llm::config::ProviderConfig;
use sift_node::config::{Config, TEST_ADMIN_KEY};
use sift_tests::{InProcessNode, bulk_documents, ingest_deadline, require_model};

/// The Python with `openai` and `langchain-openai`, or `None` when the tests are told to
/// skip this check (`SIFT_TEST_SKIP_CLIENTS=1`).
fn clients_python() -> Option<String> {
    if std::env::var("SIFT_TEST_SKIP_CLIENTS").is_ok_and(|v| v == "1") {
        eprintln!("SIFT_TEST_SKIP_CLIENTS=1: the real OpenAI clients are not run");
        return None;
    }
    let python = std::env::var("SIFT_CLIENTS_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SIFT_CLIENTS_PYTHON is not set: run scripts/test.sh, or set it to the python that \
             scripts/client-venv.sh prints (or SIFT_TEST_SKIP_CLIENTS=1 to skip)"
        )
    });
    Some(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_and_langchain_work_unchanged() {
    let Some(python) = clients_python() else {
        return;
    };
    let documents = sift_tests::short_documents(6);
    let fake = FakeLlm::start(react_agent(documents[0].title.clone())).await;
    let mut provider = ProviderConfig::openai(fake.base_url(), "fake-model", None);
    provider.name = "local".into();
    provider.max_retries = 0;
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.llm.providers = vec![provider];
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "papers", "shards": 2 }))
        .await;
    client.bulk_add("papers", &bulk_documents(&documents)).await;
    client
        .wait_ready(
            "papers",
            documents.len() as u64,
            ingest_deadline(documents.len()),
        )
        .await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/clients/openai_clients.py");
    let url = client.url().to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .arg(script)
            .arg(&url)
            .arg(TEST_ADMIN_KEY)
            .arg("kb:papers")
            .arg(sift_actors::EMBEDDED_MODEL)
            .output()
            .unwrap_or_else(|error| panic!("running {python}: {error}"))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the clients failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("all OpenAI client checks passed"),
        "{stdout}\n{stderr}"
    );
    node.shutdown().await;
}
