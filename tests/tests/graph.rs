//! GraphRAG through the API of a real node (ADR 0037): the embedded extractor fills each
//! shard's graph after ingestion, the graph channel bridges from the query's entities to a
//! chunk no query word reaches, explain shows the path, a delete removes what the graph held,
//! and the bad inputs of the issue are refused or answered empty.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sift_tests::{ApiClient, InProcessNode, WAIT, temp_dir, text_document};

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
}
