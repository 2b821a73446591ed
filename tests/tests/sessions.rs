//! Sessions, agent runs over SSE, and the OpenAI-compatible API, end to end: a real node in
//! the test process, a real KB ingested with the embedded model, and a fake model server
//! speaking the OpenAI and Anthropic streaming wire formats (`sift_tests::fake_llm`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use sift_actors::models::llm::config::{ProviderConfig, ToolMode};
use sift_node::config::Config;
use sift_tests::fake_llm::{
    FakeLlm, FakeReply, FakeRequest, final_answer_citing, openai_text, react_agent, text_reply,
};
use sift_tests::sse::{SseEvent, answer_text, ask, follow_run, names};
use sift_tests::{ApiClient, InProcessNode, bulk_documents, ingest_deadline, require_model};

const DOCUMENTS: usize = 8;

struct Fixture {
    _dir: tempfile::TempDir,
    node: InProcessNode,
    client: ApiClient,
    /// Title of the first document: a query that finds it.
    query: String,
    /// Every chunk id of the KB.
    chunk_ids: BTreeSet<String>,
}

fn provider(fake: &FakeLlm, name: &str, priority: u32) -> ProviderConfig {
    let mut provider = ProviderConfig::openai(fake.base_url(), "fake-model", None);
    provider.name = name.into();
    provider.priority = priority;
    provider.max_retries = 0;
    provider.first_token_timeout_ms = 5_000;
    provider
}

fn anthropic_provider(fake: &FakeLlm, name: &str, priority: u32) -> ProviderConfig {
    let mut provider = ProviderConfig::anthropic(fake.base_url(), "fake-claude", Some("k".into()));
    provider.name = name.into();
    provider.priority = priority;
    provider.max_retries = 0;
    provider.first_token_timeout_ms = 5_000;
    provider
}

/// A node with `providers` (none: extractive answers) and a KB `papers` of SciFact abstracts.
async fn fixture(providers: Vec<ProviderConfig>, tweak: impl FnOnce(&mut Config)) -> Fixture {
    let dir = sift_tests::temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.llm.providers = providers;
    tweak(&mut config);
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "papers", "shards": 2 }))
        .await;
    let documents = sift_tests::short_documents(DOCUMENTS);
    let ids = client.bulk_add("papers", &bulk_documents(&documents)).await;
    client
        .wait_ready("papers", DOCUMENTS as u64, ingest_deadline(DOCUMENTS))
        .await;
    let mut chunk_ids = BTreeSet::new();
    for id in &ids {
        let chunks = client
            .get(&format!("/v1/kbs/papers/documents/{id}/chunks"))
            .await
            .expect(200);
        for chunk in chunks["chunks"].as_array().unwrap() {
            chunk_ids.insert(chunk["chunk_id"].as_str().unwrap().to_string());
        }
    }
    Fixture {
        _dir: dir,
        node,
        client,
        query: documents[0].title.clone(),
        chunk_ids,
    }
}

async fn new_session(client: &ApiClient) -> String {
    let session = client
        .post_json("/v1/sessions", &json!({ "kbs": ["papers"] }))
        .await
        .expect(201);
    session["id"].as_str().unwrap().to_string()
}

fn events_named<'a>(events: &'a [SseEvent], name: &str) -> Vec<&'a SseEvent> {
    events.iter().filter(|e| e.event == name).collect()
}

/// The common shape of every run's stream: `meta` first, exactly one `done` last, ids 1..n.
#[track_caller]
fn assert_well_formed(events: &[SseEvent], session_id: &str) -> String {
    assert!(!events.is_empty());
    assert_eq!(events[0].event, "meta", "{:#?}", names(events));
    assert_eq!(events[0].data["session_id"], session_id);
    let run_id = events[0].data["run_id"].as_str().unwrap().to_string();
    assert_eq!(events.last().unwrap().event, "done", "{:#?}", names(events));
    assert_eq!(events_named(events, "done").len(), 1);
    let ids: Vec<u64> = events
        .iter()
        .map(|e| e.id.expect("every event has an id"))
        .collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    run_id
}

/// Citations of a stream: every one points at a chunk the run's tools returned.
#[track_caller]
fn assert_citations_retrieved(events: &[SseEvent]) -> Vec<Value> {
    let retrieved: BTreeSet<String> = events_named(events, "tool_result")
        .iter()
        .flat_map(|e| e.data["hits"].as_array().cloned().unwrap_or_default())
        .map(|hit| hit["chunk_id"].as_str().unwrap().to_string())
        .collect();
    let citations: Vec<Value> = events_named(events, "citation")
        .iter()
        .map(|e| e.data.clone())
        .collect();
    assert!(!citations.is_empty(), "no citations: {:#?}", names(events));
    for citation in &citations {
        let chunk = citation["chunk_id"].as_str().unwrap();
        assert!(
            retrieved.contains(chunk),
            "citation {chunk} was not retrieved in this run ({retrieved:?})"
        );
    }
    citations
}

#[tokio::test]
async fn react_run_streams_a_cited_answer_and_the_next_turn_sees_the_history() {
    // The scripted model searches for the first document's title.
    let query = first_title();
    let fake = FakeLlm::start(react_agent(query.clone())).await;
    let fixture = fixture_with_llm(vec![provider(&fake, "local", 0)]).await;
    let client = &fixture.client;
    let session = new_session(client).await;

    let events = ask(client, &session, "What does the first study find?")
        .await
        .rest()
        .await;
    let run_id = assert_well_formed(&events, &session);
    let calls = events_named(&events, "tool_call");
    let search = calls
        .iter()
        .find(|e| e.data["name"] == "knowledge_search")
        .expect("a knowledge_search call");
    // Arguments streamed in 12 fragments arrive whole.
    assert_eq!(search.data["arguments"]["query"], query.as_str());
    let citations = assert_citations_retrieved(&events);
    for citation in &citations {
        assert!(
            fixture
                .chunk_ids
                .contains(citation["chunk_id"].as_str().unwrap())
        );
    }
    let answer = answer_text(&events);
    assert!(
        answer.contains("[1]"),
        "answer without [n] markers: {answer}"
    );
    let done = events.last().unwrap();
    assert_eq!(done.data["finish_reason"], "stop");
    let message_id = done.data["message_id"]
        .as_str()
        .expect("a stored message id");

    // The turn is stored with its citations and trace.
    let stored = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    let turns = stored["messages"].as_array().unwrap();
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0]["message_id"], message_id);
    assert_eq!(turns[0]["run_id"], run_id.as_str());
    assert_eq!(turns[0]["answer"], answer.as_str());
    assert_eq!(turns[0]["mode"], "agent");
    let stored_ids: Vec<&Value> = turns[0]["citations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["chunk_id"])
        .collect();
    let streamed_ids: Vec<&Value> = citations.iter().map(|c| &c["chunk_id"]).collect();
    assert_eq!(stored_ids, streamed_ids);
    assert!(!turns[0]["trace"].as_array().unwrap().is_empty());
    let session_view = client
        .get(&format!("/v1/sessions/{session}"))
        .await
        .expect(200);
    assert_eq!(session_view["turns"], 1);

    // The next run gets the first turn as history.
    let before = fake.requests().len();
    let events = ask(client, &session, "And what about its methods?")
        .await
        .rest()
        .await;
    assert_well_formed(&events, &session);
    let later: Vec<FakeRequest> = fake.requests().into_iter().skip(before).collect();
    assert!(
        later
            .iter()
            .any(|r| r.text().contains("What does the first study find?")),
        "the second run did not send the first question as history"
    );
    let stored = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await
        .expect(200);
    assert_eq!(stored["messages"].as_array().unwrap().len(), 2);
    fixture.node.shutdown().await;
}

fn first_title() -> String {
    sift_tests::short_documents(1)[0].title.clone()
}

async fn fixture_with_llm(providers: Vec<ProviderConfig>) -> Fixture {
    fixture(providers, |_| {}).await
}
