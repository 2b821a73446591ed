//! GraphRAG through the API of a real node (ADR 0037): the embedded extractor fills each
//! shard's graph after ingestion, the graph channel bridges from the query's entities to a
//! chunk no query word reaches, explain shows the path, a delete removes what the graph held,
//! communities group what is mentioned together (summarised once by a model), and the bad
//! inputs of the issue are refused or answered empty.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sift_models::fake_server::{FakeLlm, FakeReply, FakeRequest, text_reply, tool_call_reply};
use sift_models::llm::ProviderConfig;
use sift_node::config::Config;
use sift_tests::{
    ApiClient, InProcessNode, WAIT, eventually, require_model, temp_dir, text_document,
};

const FILM: (&str, &str, &str) = (
    "film",
    "Doctor Strange (2016 film)",
    "Doctor Strange is a 2016 American superhero film directed by Scott Derrickson. It stars \
     Benedict Cumberbatch as Stephen Strange.",
);
const DIRECTOR: (&str, &str, &str) = (
    "director",
    "Scott Derrickson",
    "Scott Derrickson is an American director, screenwriter and producer. He grew up in \
     Denver, Colorado, and studied at Biola University.",
);
const OTHERS: [(&str, &str, &str); 3] = [
    (
        "lake",
        "Lake Baikal",
        "Lake Baikal is a rift lake in Siberia, the deepest lake in the world.",
    ),
    (
        "bread",
        "Sourdough",
        "Sourdough bread is made by the fermentation of dough using wild yeast.",
    ),
    (
        "comet",
        "Halley's Comet",
        "Halley's Comet is visible from Earth every 75 to 79 years.",
    ),
];

fn documents(list: &[(&str, &str, &str)]) -> Vec<Value> {
    list.iter()
        .map(|(id, title, text)| text_document(id, title, text))
        .collect()
}

fn external_ids(answer: &Value) -> Vec<String> {
    answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["external_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The graph-only search of `query`, repeated until `done` holds of it (the graph is filled
/// after the documents are ready) or the deadline passes.
async fn graph_search_until(
    client: &ApiClient,
    kb: &str,
    query: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = client
            .search(
                kb,
                json!({ "query": query, "channels": ["graph"], "explain": true, "rerank": false }),
            )
            .await;
        if done(&answer) || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_graph_channel_bridges_through_an_entity_and_forgets_a_deleted_document() {
    let dir = temp_dir();
    let node = InProcessNode::start(dir.path()).await;
    let client = node.client();
    // Two shards: the film and its director may well sit on different ones; entity ids are
    // global, so the walk crosses between them.
    client
        .create_kb(json!({ "name": "films", "shards": 2 }))
        .await;
    let mut all = vec![FILM, DIRECTOR];
    all.extend(OTHERS);
    client.bulk_add("films", &documents(&all)).await;
    client.wait_ready("films", all.len() as u64, WAIT).await;

    // "Denver" is in no query word: only the walk film -> Scott Derrickson -> director reaches it
    // from the query's "Doctor Strange"... and the director's own page names him.
    let query = "Who directed Doctor Strange?";
    let answer = graph_search_until(&client, "films", query, |answer| {
        external_ids(answer).contains(&"director".to_string())
    })
    .await;
    let ids = external_ids(&answer);
    assert!(ids.contains(&"film".to_string()), "{answer}");
    assert!(ids.contains(&"director".to_string()), "{answer}");
    for other in OTHERS {
        assert!(!ids.contains(&other.0.to_string()), "{answer}");
    }
    let director = answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|hit| hit["external_id"] == "director")
        .unwrap();
    assert!(
        director["channels"]["graph"]["rank"].as_u64().is_some(),
        "{director}"
    );
    let explain = director["explain"].as_str().unwrap();
    // Seed, the chunk that names both, the bridge, then this chunk: in that order.
    let film_chunk = answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|hit| hit["external_id"] == "film")
        .unwrap()["chunk_id"]
        .as_str()
        .unwrap()
        .to_string();
    let expected = format!(
        "graph path (hop 2): \"Doctor Strange (2016 film)\" -> chunk {film_chunk} -> \"Scott Derrickson\" -> this chunk"
    );
    assert!(
        explain.contains(&expected),
        "the path names the bridging entity: {explain}"
    );
    assert!(answer["timings"]["graph_ms"].as_f64().unwrap() > 0.0);

    // The default search fuses the graph channel with the others.
    let fused = client
        .search("films", json!({ "query": query, "explain": true }))
        .await;
    let graph_hits = fused["hits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|hit| hit["channels"]["graph"].is_object())
        .count();
    assert!(graph_hits >= 2, "{fused}");

    // Each document says where its graph stands.
    for document in client.list_all_documents("films", 100).await {
        let id = document["id"].as_str().unwrap();
        let view = client.document("films", id).await;
        assert_eq!(view["status"], "ready", "{view}");
        assert!(
            view["graph"] == "ready" || view["graph"] == "pending",
            "{view}"
        );
    }
    let director_id = client
        .list_all_documents("films", 100)
        .await
        .into_iter()
        .find(|d| d["external_id"] == "director")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        client.document("films", &director_id).await["graph"],
        "ready"
    );

    // The partition's counts, per shard replica, in /metrics.
    let entities = |text: &str| -> u64 {
        text.lines()
            .filter(|line| {
                line.starts_with("sift_graph_entities{") && line.contains("kb=\"films\"")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = entities(&client.metrics_text().await);
    assert!(
        before >= 10,
        "both documents' entities are counted: {before}"
    );

    // What a graph browser needs: entities by name, one entity, a path between two.
    let found = client
        .get("/v1/kbs/films/graph/entities?q=scott%20der")
        .await
        .expect(200);
    let scott = &found["entities"][0];
    assert_eq!(scott["name"], "Scott Derrickson", "{found}");
    assert_eq!(scott["chunks"], 2, "the film and his own page: {found}");
    let id = scott["id"].as_str().unwrap().to_string();
    let detail = client
        .get(&format!("/v1/kbs/films/graph/entities/{id}"))
        .await
        .expect(200);
    let neighbours: Vec<&str> = detail["neighbours"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    // The film's title is the entity "Doctor Strange" (its parenthetical folded away).
    assert!(
        neighbours.contains(&"Doctor Strange (2016 film)"),
        "{detail}"
    );
    assert!(neighbours.contains(&"Denver"), "{detail}");
    let mentioned_in: Vec<&str> = detail["mentions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["title"].as_str().unwrap())
        .collect();
    assert_eq!(mentioned_in.len(), 2, "{detail}");
    // By name, the same entity.
    let by_name = client
        .get("/v1/kbs/films/graph/entities/scott%20derrickson")
        .await
        .expect(200);
    assert_eq!(by_name["entity"]["id"], id.as_str());
    let path = client
        .get("/v1/kbs/films/graph/paths?from=Benedict%20Cumberbatch&to=Denver")
        .await
        .expect(200);
    assert_eq!(path["found"], true, "{path}");
    assert_eq!(path["hops"], 2, "film, then the director's page: {path}");
    let steps = path["steps"].as_array().unwrap();
    assert_eq!(steps[0]["entity"]["name"], "Benedict Cumberbatch");
    assert_eq!(steps[2]["entity"]["name"], "Denver");
    assert!(steps[0]["via_chunk"].as_str().is_some(), "{path}");
    client
        .get("/v1/kbs/films/graph/paths?from=Benedict%20Cumberbatch&to=Denver&max_hops=1")
        .await
        .expect(200)["found"]
        .as_bool()
        .map(|found| assert!(!found, "no path of one chunk"))
        .unwrap();

    // Deleted means deleted: the film's mentions go with it, so nothing reaches the director
    // from "Doctor Strange" any more, and the film itself is never a graph hit.
    let film_id = client
        .list_all_documents("films", 100)
        .await
        .into_iter()
        .find(|d| d["external_id"] == "film")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    client
        .delete(&format!("/v1/kbs/films/documents/{film_id}"))
        .await
        .expect(204);
    let after = client
        .search(
            "films",
            json!({ "query": query, "channels": ["graph"], "rerank": false }),
        )
        .await;
    assert!(external_ids(&after).is_empty(), "{after}");
    let after_delete = entities(&client.metrics_text().await);
    assert!(after_delete < before, "{after_delete} < {before}");
    // The film's own entities are gone from the graph, and so is the path through it.
    client
        .get("/v1/kbs/films/graph/entities/Benedict%20Cumberbatch")
        .await
        .expect_error(404, "entity_not_found");
    let gone = client
        .get("/v1/kbs/films/graph/paths?from=Scott%20Derrickson&to=Doctor%20Strange")
        .await
        .expect(200);
    assert_eq!(gone["found"], false, "{gone}");
    let scott = client
        .get("/v1/kbs/films/graph/entities?q=scott")
        .await
        .expect(200);
    assert_eq!(scott["entities"][0]["chunks"], 1, "{scott}");
    // The director is still reached by its own name.
    let own = client
        .search(
            "films",
            json!({ "query": "Scott Derrickson", "channels": ["graph"], "rerank": false }),
        )
        .await;
    assert_eq!(external_ids(&own), ["director"], "{own}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_graph_queries_are_refused_or_empty() {
    let dir = temp_dir();
    let node = InProcessNode::start(dir.path()).await;
    let client = node.client();
    client.create_kb(json!({ "name": "hub" })).await;
    // Twenty documents all naming one company: a hub, never a seed or a bridge.
    let mut hub: Vec<Value> = (0..20)
        .map(|i| {
            text_document(
                &format!("report-{i}"),
                &format!("Report {i}"),
                &format!("Acme Corporation filed quarterly report number {i} with Regulator{i}."),
            )
        })
        .collect();
    hub.push(text_document(
        "canal",
        "Panama Canal",
        "The Panama Canal joins the Atlantic Ocean and the Pacific Ocean.",
    ));
    client.bulk_add("hub", &hub).await;
    client.wait_ready("hub", 21, WAIT).await;
    // Wait for the graph: the canal's own name reaches it.
    let canal = graph_search_until(&client, "hub", "Panama Canal", |answer| {
        !external_ids(answer).is_empty()
    })
    .await;
    assert_eq!(external_ids(&canal), ["canal"], "{canal}");

    // The hub is no seed: the channel stays empty rather than returning all twenty.
    let acme = client
        .search(
            "hub",
            json!({ "query": "Acme Corporation", "channels": ["graph"], "rerank": false }),
        )
        .await;
    assert!(external_ids(&acme).is_empty(), "{acme}");
    // An entity the KB does not know: empty, no error.
    let unknown = client
        .search(
            "hub",
            json!({ "query": "Zebulon Quartermaine", "channels": ["graph"] }),
        )
        .await;
    assert!(external_ids(&unknown).is_empty(), "{unknown}");
    // The graph API's bad inputs.
    client
        .get("/v1/kbs/hub/graph/entities/Zebulon%20Quartermaine")
        .await
        .expect_error(404, "entity_not_found");
    client
        .get("/v1/kbs/hub/graph/entities")
        .await
        .expect_error(400, "invalid_query_string");
    client
        .get("/v1/kbs/hub/graph/entities?q=%20%21%21")
        .await
        .expect_error(400, "invalid_query");
    client
        .get("/v1/kbs/hub/graph/paths?from=Panama%20Canal&to=Pacific%20Ocean&max_hops=9")
        .await
        .expect_error(400, "invalid_graph_hops");
    // Hops above the cap, per request and as a KB setting.
    client
        .search_answer("hub", json!({ "query": "Panama Canal", "graph_hops": 4 }))
        .await
        .expect_error(400, "invalid_graph_hops");
    client
        .patch_json("/v1/kbs/hub", &json!({ "retrieval": { "graph_hops": 0 } }))
        .await
        .expect_error(400, "invalid_graph_hops");
    client
        .search_answer(
            "hub",
            json!({ "query": "Panama Canal", "weights": { "graph": -1.0 } }),
        )
        .await
        .expect_error(400, "invalid_weights");

    // A KB without a graph: a graph-only search is refused; the default search runs without it.
    client
        .create_kb(json!({ "name": "plain", "graph": "off" }))
        .await;
    client
        .post_json(
            "/v1/kbs",
            &json!({ "name": "wrong", "graph": "llm-please" }),
        )
        .await
        .expect_error(400, "invalid_settings");
    client
        .bulk_add("plain", &documents(&[FILM, DIRECTOR]))
        .await;
    client.wait_ready("plain", 2, WAIT).await;
    let plain_document = client.list_all_documents("plain", 100).await[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        client.document("plain", &plain_document).await["graph"],
        "off"
    );
    client
        .search_answer(
            "plain",
            json!({ "query": "Doctor Strange", "channels": ["graph"] }),
        )
        .await
        .expect_error(400, "graph_unavailable");
    client
        .get("/v1/kbs/plain/graph/entities?q=doctor")
        .await
        .expect_error(400, "graph_unavailable");
    client
        .get("/v1/kbs/plain/graph/communities")
        .await
        .expect_error(400, "graph_unavailable");
    // Communities: a bad parameter is refused; the hub is never a member; a summary asked of a
    // node without a chat model says why it is missing.
    client
        .get("/v1/kbs/hub/graph/communities?limit=many")
        .await
        .expect_error(400, "invalid_query_string");
    client
        .get("/v1/kbs/hub/graph/communities?colour=red")
        .await
        .expect_error(400, "invalid_query_string");
    let hub_communities = client
        .get("/v1/kbs/hub/graph/communities?summaries=true&limit=500")
        .await
        .expect(200);
    for community in hub_communities["communities"].as_array().unwrap() {
        assert_eq!(community["summary_error"], "no chat model is configured");
        assert!(
            community["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|member| member["name"] != "Acme Corporation"),
            "{community}"
        );
    }
    let plain = client
        .search("plain", json!({ "query": "Doctor Strange" }))
        .await;
    assert!(!external_ids(&plain).is_empty(), "{plain}");
    assert!(
        plain["hits"]
            .as_array()
            .unwrap()
            .iter()
            .all(|hit| hit["channels"]["graph"].is_null()),
        "{plain}"
    );

    // A KB asking for the LLM extractor on a node without a chat model: the embedded graph,
    // and the state says why.
    client
        .create_kb(json!({ "name": "modelless", "graph": "llm" }))
        .await;
    client.bulk_add("modelless", &documents(&[FILM])).await;
    client.wait_ready("modelless", 1, WAIT).await;
    let view = &settled_graphs(&client, "modelless").await["film"];
    assert_eq!(view["graph"], "failed", "{view}");
    assert!(
        view["graph_error"]
            .as_str()
            .unwrap()
            .contains("no chat model"),
        "{view}"
    );
    client
        .get("/v1/kbs/modelless/graph/entities/Scott%20Derrickson")
        .await
        .expect(200);
    // The plain KB's documents wait for a graph that is off: the queue does not count them.
    eventually("an empty graph queue", || async {
        let metrics = client.metrics_text().await;
        (metrics.contains("sift_graph_queue_documents")
            && counter(&metrics, "sift_graph_queue_documents", "") == 0.0)
            .then_some(())
    })
    .await;
}

/// What the scripted model knows: each entity it reports (name, type) wherever the chunk
/// names it, and each event wherever the chunk names its subject and its predicate.
const KNOWN_ENTITIES: [(&str, &str); 5] = [
    ("Doctor Strange", "work"),
    ("Scott Derrickson", "person"),
    ("Denver", "place"),
    ("Biola University", "organisation"),
    ("Lake Baikal", "place"),
];
/// (subject, predicate, object, time, place)
const KNOWN_EVENTS: [(&str, &str, &str, &str, &str); 2] = [
    ("Scott Derrickson", "directed", "Doctor Strange", "2016", ""),
    ("Scott Derrickson", "grew up in", "", "", "Denver"),
];

/// The chunks of an extraction request: (number, text).
fn requested_chunks(request: &FakeRequest) -> Vec<(u64, String)> {
    let prompt = request.last_user_text();
    prompt
        .split("### Chunk ")
        .filter_map(|part| {
            let (number, text) = part.split_once('\n')?;
            Some((number.trim().parse().ok()?, text.to_string()))
        })
        .collect()
}

/// The `record_graph` arguments a careful model writes for these chunks.
fn extraction_of(chunks: &[(u64, String)]) -> Value {
    let entries: Vec<Value> = chunks
        .iter()
        .map(|(number, text)| {
            let entities: Vec<Value> = KNOWN_ENTITIES
                .iter()
                .filter(|(name, _)| text.contains(name))
                .map(|(name, kind)| json!({ "name": name, "type": kind }))
                .collect();
            let events: Vec<Value> = KNOWN_EVENTS
                .iter()
                .filter(|(subject, predicate, ..)| {
                    text.contains(subject) && text.contains(predicate)
                })
                .map(|(subject, predicate, object, time, place)| {
                    json!({ "subject": subject, "predicate": predicate, "object": object,
                            "time": time, "place": place })
                })
                .collect();
            json!({ "chunk": number, "entities": entities, "events": events })
        })
        .collect();
    json!({ "chunks": entries })
}

/// A model for the LLM extractor: it answers well, except that a chunk saying "Poisoned"
/// always gets the wrong schema, one saying "Flaky" gets prose (invalid JSON) the first
/// time, and one saying "Sleepy" gets no answer at all the first time. Counts requests by
/// those words.
fn extracting_model(
    seen: Arc<Mutex<HashMap<&'static str, usize>>>,
) -> impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static {
    move |request: &FakeRequest| {
        if !request.offers_tool("record_graph") {
            return text_reply(request, "I only extract graphs.", 1);
        }
        let chunks = requested_chunks(request);
        let text: String = chunks.iter().map(|(_, text)| text.as_str()).collect();
        let mut seen = seen.lock().unwrap();
        for word in ["Poisoned", "Flaky", "Sleepy", "Doctor Strange"] {
            if text.contains(word) {
                *seen.entry(word).or_default() += 1;
            }
        }
        if text.contains("Poisoned") {
            return tool_call_reply(
                request,
                "c1",
                "record_graph",
                &json!({ "entities": "none" }),
                3,
            );
        }
        if text.contains("Flaky") && seen["Flaky"] == 1 {
            return text_reply(
                request,
                "Here are the entities: Flaky Harbour, and more.",
                2,
            );
        }
        if text.contains("Sleepy") && seen["Sleepy"] == 1 {
            return FakeReply::Hang;
        }
        tool_call_reply(request, "c1", "record_graph", &extraction_of(&chunks), 4)
    }
}

fn fake_provider(fake: &FakeLlm) -> ProviderConfig {
    let mut provider = ProviderConfig::openai(fake.base_url(), "fake-extractor", None);
    provider.name = "extractor".into();
    provider.max_retries = 0;
    provider.first_token_timeout_ms = 20_000;
    provider
}

/// The sum of a counter's series (with `labels` among theirs) in a /metrics text.
fn counter(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(labels))
        .filter(|line| line[name.len()..].starts_with(['{', ' ']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until every document of `kb` has a graph state other than `pending`; returns each
/// document's view by external id.
async fn settled_graphs(client: &ApiClient, kb: &str) -> HashMap<String, Value> {
    eventually(&format!("the graphs of {kb}"), || async {
        let mut views = HashMap::new();
        for document in client.list_all_documents(kb, 100).await {
            let view = client.document(kb, document["id"].as_str().unwrap()).await;
            if view["graph"].is_null() || view["graph"] == "pending" {
                return None;
            }
            views.insert(document["external_id"].as_str().unwrap().to_string(), view);
        }
        Some(views)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_llm_extractor_stores_typed_entities_and_events_and_survives_a_bad_model() {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let fake = FakeLlm::start(extracting_model(seen.clone())).await;
    let dir = temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.llm.providers = vec![fake_provider(&fake)];
    config.options.graph_llm_timeout = Duration::from_millis(1_500);
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "films", "shards": 2, "graph": "llm" }))
        .await;
    let flaky = (
        "flaky",
        "Flaky Harbour",
        "Flaky Harbour lies on Lake Baikal.",
    );
    let sleepy = (
        "sleepy",
        "Sleepy Hollow",
        "Sleepy Hollow is a village near Denver.",
    );
    let poisoned = (
        "poisoned",
        "The Poisoned Chalice",
        "The Poisoned Chalice is a tavern in Bristol.",
    );
    let all = [FILM, DIRECTOR, flaky, sleepy, poisoned];
    let ids = client.bulk_add("films", &documents(&all)).await;
    // A document's events, to the end of its graph: the model first hangs on this one.
    let events = client
        .request(
            reqwest::Method::GET,
            &format!("/v1/kbs/films/documents/{}/events?until=graph", ids[3]),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let events = tokio::time::timeout(WAIT, events.text())
        .await
        .expect("the stream ends with the graph")
        .unwrap();
    let names: Vec<&str> = events
        .lines()
        .filter_map(|line| line.strip_prefix("event:"))
        .map(str::trim)
        .collect();
    assert!(names.contains(&"ready"), "{events}");
    assert_eq!(names.last(), Some(&"graph"), "{events}");
    let last = events
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .next_back()
        .unwrap();
    let last: Value = serde_json::from_str(last.trim()).unwrap();
    assert_eq!(last["graph"], "ready", "{events}");
    client
        .get(&format!(
            "/v1/kbs/films/documents/{}/events?until=never",
            ids[3]
        ))
        .await
        .expect_error(400, "invalid_until");
    client.wait_ready("films", all.len() as u64, WAIT).await;

    // A bad model holds up no document: each is retried on its own and settles.
    let views = settled_graphs(&client, "films").await;
    for id in ["film", "director", "flaky", "sleepy"] {
        assert_eq!(views[id]["graph"], "ready", "{}", views[id]);
        assert!(views[id]["graph_error"].is_null(), "{}", views[id]);
    }
    let failed = &views["poisoned"];
    assert_eq!(failed["graph"], "failed", "{failed}");
    let reason = failed["graph_error"].as_str().unwrap();
    assert!(
        reason.contains("does not fit the schema") && reason.contains("3 attempts"),
        "{reason}"
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen["Poisoned"], 3, "tried three times: {seen:?}");
        assert_eq!(
            seen["Flaky"], 2,
            "invalid JSON, then a good answer: {seen:?}"
        );
        assert_eq!(seen["Sleepy"], 2, "a timeout, then a good answer: {seen:?}");
    }
    // The failed document's graph is the embedded extractor's: its names are there.
    let tavern = client
        .get("/v1/kbs/films/graph/entities/Poisoned%20Chalice")
        .await
        .expect(200);
    assert_eq!(tavern["entity"]["chunks"], 1, "{tavern}");

    // Typed entities and events, as the model gave them.
    let scott = client
        .get("/v1/kbs/films/graph/entities/scott%20derrickson")
        .await
        .expect(200);
    assert_eq!(scott["entity"]["kind"], "person", "{scott}");
    assert_eq!(scott["entity"]["chunks"], 2, "{scott}");
    let events = scott["events"].as_array().unwrap();
    assert_eq!(events.len(), 2, "{scott}");
    let directed = events
        .iter()
        .find(|event| event["predicate"] == "directed")
        .unwrap_or_else(|| panic!("{scott}"));
    assert_eq!(directed["subject"], "Scott Derrickson");
    assert_eq!(directed["object"], "Doctor Strange");
    assert_eq!(directed["time"], "2016");
    let grew_up = events
        .iter()
        .find(|event| event["predicate"] == "grew up in")
        .unwrap_or_else(|| panic!("{scott}"));
    assert_eq!(grew_up["place"], "Denver");
    let denver = client
        .get("/v1/kbs/films/graph/entities/Denver")
        .await
        .expect(200);
    assert_eq!(denver["entity"]["kind"], "place", "{denver}");
    assert_eq!(
        denver["entity"]["chunks"], 2,
        "the director's page and Sleepy Hollow"
    );

    // The graph channel bridges through the model's entities as through the embedded ones.
    let answer = client
        .search(
            "films",
            json!({ "query": "Who directed Doctor Strange?", "channels": ["graph"], "rerank": false }),
        )
        .await;
    let ids = external_ids(&answer);
    assert!(ids.contains(&"director".to_string()), "{answer}");
    assert!(!ids.contains(&"poisoned".to_string()), "{answer}");

    // Tokens and outcomes are counted.
    let metrics = client.metrics_text().await;
    assert!(
        counter(&metrics, "sift_graph_llm_tokens_total", "") > 0.0,
        "{metrics}"
    );
    for (outcome, at_least) in [
        ("ok", 4.0),
        ("schema", 3.0),
        ("invalid_json", 1.0),
        ("timeout", 1.0),
    ] {
        let label = format!("outcome=\"{outcome}\"");
        let count = counter(&metrics, "sift_graph_llm_requests_total", &label);
        assert!(count >= at_least, "{outcome}: {count}");
    }

    // The same text in another KB comes from the node's cache, not the model.
    let requests = fake.requests().len();
    let hits = counter(&metrics, "sift_graph_llm_cache_hits_total", "");
    client
        .create_kb(json!({ "name": "again", "graph": "llm" }))
        .await;
    client.bulk_add("again", &documents(&[FILM])).await;
    client.wait_ready("again", 1, WAIT).await;
    let again = settled_graphs(&client, "again").await;
    assert_eq!(again["film"]["graph"], "ready", "{}", again["film"]);
    assert_eq!(
        fake.requests().len(),
        requests,
        "no request for a cached chunk"
    );
    let metrics = client.metrics_text().await;
    assert!(counter(&metrics, "sift_graph_llm_cache_hits_total", "") > hits);
    let events = client
        .get("/v1/kbs/again/graph/entities/Doctor%20Strange")
        .await
        .expect(200)["events"]
        .clone();
    assert_eq!(events[0]["predicate"], "directed", "{events}");

    // A KB's token budget: once spent on this node, documents get the embedded graph and say so.
    client
        .create_kb(json!({ "name": "budget", "graph": "llm", "graph_token_budget": 1 }))
        .await;
    // (A text the model has not read before: a cached one costs nothing.)
    let bridge = (
        "bridge",
        "Golden Gate Bridge",
        "The Golden Gate Bridge spans the strait at San Francisco.",
    );
    client.bulk_add("budget", &documents(&[bridge])).await;
    client.wait_ready("budget", 1, WAIT).await;
    assert_eq!(
        settled_graphs(&client, "budget").await["bridge"]["graph"],
        "ready"
    );
    client.bulk_add("budget", &documents(&[OTHERS[0]])).await;
    client.wait_ready("budget", 2, WAIT).await;
    let over = &settled_graphs(&client, "budget").await["lake"];
    assert_eq!(over["graph"], "failed", "{over}");
    assert!(
        over["graph_error"]
            .as_str()
            .unwrap()
            .contains("graph_token_budget"),
        "{over}"
    );
    client
        .get("/v1/kbs/budget/graph/entities/Lake%20Baikal")
        .await
        .expect(200);
    client
        .patch_json("/v1/kbs/budget", &json!({ "graph_token_budget": -1 }))
        .await
        .expect_error(400, "invalid_json");
}

const SPACE: [(&str, &str, &str); 4] = [
    (
        "apollo",
        "Apollo 11",
        "Apollo 11 carried Neil Armstrong and Buzz Aldrin to the Moon while Michael Collins \
         stayed in orbit. NASA ran the mission from Houston.",
    ),
    (
        "armstrong",
        "Neil Armstrong",
        "Neil Armstrong commanded Apollo 11 for NASA, and Buzz Aldrin followed him onto the Moon.",
    ),
    (
        "aldrin",
        "Buzz Aldrin",
        "Buzz Aldrin flew on Gemini 12, then on Apollo 11 with Neil Armstrong and Michael Collins.",
    ),
    (
        "collins",
        "Michael Collins",
        "Michael Collins piloted Columbia on Apollo 11 while Neil Armstrong and Buzz Aldrin \
         walked on the Moon.",
    ),
];
const KITCHEN: [(&str, &str, &str); 4] = [
    (
        "child",
        "Julia Child",
        "Julia Child studied at Le Cordon Bleu in Paris and wrote Mastering the Art of French \
         Cooking with Simone Beck.",
    ),
    (
        "beck",
        "Simone Beck",
        "Simone Beck taught Julia Child in Paris and wrote Mastering the Art of French Cooking \
         with her.",
    ),
    (
        "cordon",
        "Le Cordon Bleu",
        "Le Cordon Bleu is a cooking school in Paris where Julia Child trained under Max Bugnard.",
    ),
    (
        "bugnard",
        "Max Bugnard",
        "Max Bugnard taught Julia Child at Le Cordon Bleu after years at the Rouen Culinary \
         Institute, and Simone Beck admired his cooking.",
    ),
];

/// Each community's member names.
fn member_names(list: &Value) -> Vec<Vec<String>> {
    list["communities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|community| {
            community["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|member| member["name"].as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// The community naming `name`, if any.
fn community_of<'a>(names: &'a [Vec<String>], name: &str) -> Option<&'a Vec<String>> {
    names
        .iter()
        .find(|members| members.iter().any(|m| m == name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn communities_group_what_is_mentioned_together_and_are_summarised_once() {
    // The chat model: summaries of communities as text, and an agent that asks the graph for
    // its communities, then answers.
    let summaries = Arc::new(Mutex::new(0usize));
    let counted = summaries.clone();
    let fake = FakeLlm::start(move |request: &FakeRequest| {
        if request.offers_tool("final_answer") {
            let id = format!("call_{}", request.index);
            return match request.tool_results() {
                0 => tool_call_reply(
                    request,
                    &id,
                    "graph_search",
                    &json!({ "mode": "community" }),
                    4,
                ),
                _ => tool_call_reply(
                    request,
                    &id,
                    "final_answer",
                    &json!({ "answer": "The collection is about the Moon landing and French cooking.", "citations": [] }),
                    8,
                ),
            };
        }
        *counted.lock().unwrap() += 1;
        let prompt = request.last_user_text();
        let first = prompt
            .strip_prefix("Entities: ")
            .and_then(|rest| rest.split([',', '\n']).next())
            .unwrap_or("nothing")
            .to_string();
        text_reply(request, &format!("These passages are about {first}."), 6)
    })
    .await;
    let dir = temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.llm.providers = vec![fake_provider(&fake)];
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client
        .create_kb(json!({ "name": "themes", "shards": 2 }))
        .await;
    let all: Vec<_> = SPACE.iter().chain(KITCHEN.iter()).copied().collect();
    let ids = client.bulk_add("themes", &documents(&all)).await;
    client.wait_ready("themes", 8, WAIT).await;
    settled_graphs(&client, "themes").await;

    // Two themes that share no entity: never one community; the people of each together.
    let list = client
        .get("/v1/kbs/themes/graph/communities")
        .await
        .expect(200);
    let names = member_names(&list);
    let space = community_of(&names, "Neil Armstrong").expect("a community with Neil Armstrong");
    assert!(space.iter().any(|m| m == "Buzz Aldrin"), "{list}");
    let kitchen = community_of(&names, "Julia Child").expect("a community with Julia Child");
    assert!(kitchen.iter().any(|m| m == "Le Cordon Bleu"), "{list}");
    // Named by one document only (deleted below).
    assert!(
        kitchen.iter().any(|m| m == "Rouen Culinary Institute"),
        "{list}"
    );
    assert!(!space.iter().any(|m| m == "Julia Child"), "{list}");
    assert!(list["entities_considered"].as_u64().unwrap() >= 8, "{list}");
    for community in list["communities"].as_array().unwrap() {
        assert!(community["summary"].is_null() && community["summary_error"].is_null());
        assert!(community["size"].as_u64().unwrap() >= 3, "{community}");
        // Each passage mentions members of its community.
        let members: Vec<&str> = community["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        let passages = community["passages"].as_array().unwrap();
        assert!(!passages.is_empty(), "{community}");
        for passage in passages {
            let text = passage["text"].as_str().unwrap();
            let named = members.iter().filter(|m| text.contains(**m)).count();
            assert!(named >= 1, "{passage} names none of {members:?}");
        }
    }
    // The same graph, the same communities (ids included).
    let again = client
        .get("/v1/kbs/themes/graph/communities")
        .await
        .expect(200);
    let ids_of = |list: &Value| -> Vec<String> {
        list["communities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids_of(&again), ids_of(&list));
    assert_eq!(*summaries.lock().unwrap(), 0, "no summary was asked for");

    // Summaries: made once by the model, then from the node's cache.
    let summarised = client
        .get("/v1/kbs/themes/graph/communities?summaries=true")
        .await
        .expect(200);
    let shown = summarised["communities"].as_array().unwrap().len();
    for community in summarised["communities"].as_array().unwrap() {
        let first = community["members"][0]["name"].as_str().unwrap();
        assert_eq!(
            community["summary"],
            format!("These passages are about {first}."),
            "{community}"
        );
    }
    assert_eq!(*summaries.lock().unwrap(), shown);
    let cached = client
        .get("/v1/kbs/themes/graph/communities?summaries=true")
        .await
        .expect(200);
    assert_eq!(cached["communities"], summarised["communities"]);
    assert_eq!(*summaries.lock().unwrap(), shown, "the cache answered");
    let metrics = client.metrics_text().await;
    assert!(
        counter(
            &metrics,
            "sift_graph_community_summaries_total",
            "outcome=\"cache\""
        ) >= shown as f64,
        "{metrics}"
    );

    // The agent's `community` mode shows the summaries and the passages' chunk ids.
    let answer = client
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": "default",
                "messages": [{ "role": "user", "content": "What are the main themes of these documents?" }],
                "sift": { "kbs": ["themes"] },
            }),
        )
        .await
        .expect(200);
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    let observation = fake
        .requests()
        .iter()
        .filter(|request| request.offers_tool("final_answer"))
        .map(|request| request.text())
        .find(|text| text.contains("Communities of"))
        .expect("the communities reached the agent");
    assert!(
        observation.contains("Summary: These passages are about"),
        "{observation}"
    );
    assert!(
        ids.iter()
            .any(|id| observation.contains(&format!("chunk_id: {id}#"))),
        "{observation}"
    );
    assert_eq!(
        *summaries.lock().unwrap(),
        shown,
        "the tool's summaries came from the cache"
    );

    // A deleted document is in no community and no passage.
    client
        .delete(&format!("/v1/kbs/themes/documents/{}", ids[7]))
        .await
        .expect(204);
    let after = client
        .get("/v1/kbs/themes/graph/communities")
        .await
        .expect(200);
    let text = after.to_string();
    assert!(!text.contains("Rouen Culinary Institute"), "{after}");
    assert!(!text.contains(&format!("\"{}\"", ids[7])), "{after}");
    assert!(text.contains("Julia Child"), "{after}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn community_summaries_share_one_deadline() {
    // A model that never answers a summary: the first community waits out the deadline, the
    // others are not asked, and the answer says so for each.
    let fake = FakeLlm::start(|_: &FakeRequest| FakeReply::Hang).await;
    let dir = temp_dir();
    let mut config = Config::for_test(&dir.path().join("node"));
    config.embedding.model_dir = Some(require_model());
    config.llm.providers = vec![fake_provider(&fake)];
    config.options.graph_llm_timeout = Duration::from_millis(1_000);
    let node = InProcessNode::start_with(config).await;
    let client = node.client();
    client.create_kb(json!({ "name": "themes" })).await;
    let all: Vec<_> = SPACE.iter().chain(KITCHEN.iter()).copied().collect();
    client.bulk_add("themes", &documents(&all)).await;
    client.wait_ready("themes", 8, WAIT).await;
    settled_graphs(&client, "themes").await;
    let list = client
        .get("/v1/kbs/themes/graph/communities?summaries=true")
        .await
        .expect(200);
    let errors: Vec<&str> = list["communities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["summary_error"].as_str().unwrap_or_default())
        .collect();
    assert!(errors.len() >= 2, "{list}");
    assert!(errors[0].contains("did not answer within"), "{list}");
    for error in &errors[1..] {
        assert!(error.contains("not summarised"), "{list}");
    }
    assert_eq!(
        fake.requests().len(),
        1,
        "the later communities were not asked"
    );
    node.shutdown().await;
}
