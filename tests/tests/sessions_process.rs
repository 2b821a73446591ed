//! Sessions with the real `sift serve` binary: one OpenAI-compatible model configured by
//! environment alone (`SIFT_LLM_*`), and sessions with their turns surviving a restart.

use serde_json::json;
use sift_models::fake_server::{FakeLlm, react_agent};
use sift_tests::sse::{answer_text, ask, names};
use sift_tests::{NodeProcess, bulk_documents, ingest_deadline, short_documents, temp_dir};

#[tokio::test]
async fn env_configured_model_answers_and_sessions_survive_a_restart() {
    let documents = short_documents(6);
    let fake = FakeLlm::start(react_agent(documents[0].title.clone())).await;
    let dir = temp_dir();
    let data_dir = dir.path().join("node");
    let base_url = fake.base_url();
    let mut node = NodeProcess::start(
        &data_dir,
        &[
            ("SIFT_LLM_BASE_URL", base_url.as_str()),
            ("SIFT_LLM_MODEL", "env-model"),
            ("SIFT_LLM_API_KEY", "secret-key"),
        ],
    );
    let client = node.client();
    client.create_kb(json!({ "name": "papers" })).await;
    client.bulk_add("papers", &bulk_documents(&documents)).await;
    client
        .wait_ready(
            "papers",
            documents.len() as u64,
            ingest_deadline(documents.len()),
        )
        .await;
    let session = client
        .post_json("/v1/sessions", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let events = ask(&client, &session, "What does the first study find?")
        .await
        .rest()
        .await;
    assert_eq!(events.last().unwrap().event, "done", "{:?}", names(&events));
    assert!(answer_text(&events).contains("[1]"));
    let requests = fake.requests();
    assert!(
        !requests.is_empty(),
        "the env-configured model was never called"
    );
    assert!(requests.iter().all(|r| r.body["model"] == "env-model"));
    let before = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    assert_eq!(before["messages"][0]["mode"], "agent");

    // Restart without a model: the session and its turn are still there; answers are now
    // extractive.
    assert!(node.stop().success());
    drop(node);
    let node = NodeProcess::start(&data_dir, &[]);
    let client = node.client();
    let after = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    assert_eq!(after, before, "stored turns changed across a restart");
    let calls_before = fake.requests().len();
    let events = ask(&client, &session, &documents[1].title)
        .await
        .rest()
        .await;
    assert_eq!(events.last().unwrap().data["finish_reason"], "stop");
    assert!(answer_text(&events).starts_with("Extractive answer"));
    assert_eq!(
        fake.requests().len(),
        calls_before,
        "no model is configured any more"
    );
    let turns = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    assert_eq!(turns["messages"].as_array().unwrap().len(), 2);
}
