//! The retrieval pipeline after fusion, through the API of a real node: external rerank
//! services (real HTTP servers in the test speaking the TEI and Cohere/Jina wire formats,
//! some of them misbehaving), the embedded re-scorer, duplicate collapse, neighbour expansion,
//! context packing into a token budget, multi-query, per-KB settings and their validation.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use sift_actors::retrieval::{RerankApi, RerankServiceConfig};
use sift_node::config::Config;
use sift_tests::{ApiClient, InProcessNode, WAIT, require_model, temp_dir, text_document};

/// `POST /{mode}/rerank` in the TEI shape (`{query, texts}` -> `[{index, score}]`) or, for
/// `cohere`, `POST /cohere/v1/rerank` (`{model, query, documents, top_n}` ->
/// `{results: [{index, relevance_score}]}`). Every mode scores document i with i, so a
/// reranker that is applied reverses the fused order.
async fn rerank(Path(mode): Path<String>, Json(body): Json<Value>) -> Json<Value> {
    let texts = body["texts"]
        .as_array()
        .or_else(|| body["documents"].as_array())
        .cloned()
        .unwrap_or_default();
    let n = texts.len();
    match mode.as_str() {
        "slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Json(json!([]))
        }
        // One score short.
        "fewer" => Json(Value::Array(
            (0..n.saturating_sub(1))
                .map(|i| json!({ "index": i, "score": i as f64 }))
                .collect(),
        )),
        // Every score, listed in a scrambled order (odd indices first, then even).
        "shuffled" => {
            let order = (0..n)
                .filter(|i| i % 2 == 1)
                .chain((0..n).filter(|i| i % 2 == 0));
            Json(Value::Array(
                order
                    .map(|i| json!({ "index": i, "score": i as f64 }))
                    .collect(),
            ))
        }
        "badindex" => Json(Value::Array(
            (0..n)
                .map(|i| json!({ "index": i + 100, "score": 1.0 }))
                .collect(),
        )),
        "cohere" => {
            assert_eq!(body["model"], "rerank-test");
            assert_eq!(body["top_n"], json!(n));
            Json(json!({
                "results": (0..n).rev()
                    .map(|i| json!({ "index": i, "relevance_score": i as f64 / 10.0 }))
                    .collect::<Vec<_>>()
            }))
        }
        other => panic!("unknown mode {other}"),
    }
}

async fn start_rerank_server() -> SocketAddr {
    let app = Router::new()
        .route("/{mode}/rerank", post(rerank))
        .route("/{mode}/v1/rerank", post(rerank));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn start_node(dir: &std::path::Path, rerank_addr: SocketAddr) -> InProcessNode {
    let mut config = Config::for_test(dir);
    config.embedding.model_dir = Some(require_model());
    for (name, path, api, timeout_ms) in [
        ("slow", "slow", RerankApi::Tei, 300),
        ("fewer", "fewer", RerankApi::Tei, 5000),
        ("shuffled", "shuffled", RerankApi::Tei, 5000),
        ("badindex", "badindex", RerankApi::Tei, 5000),
        ("cohere", "cohere/v1", RerankApi::Cohere, 5000),
    ] {
        config.options.rerank.insert(
            name.to_string(),
            RerankServiceConfig {
                base_url: format!("http://{rerank_addr}/{path}"),
                api,
                model: Some("rerank-test".into()),
                api_key: None,
                timeout_ms: Some(timeout_ms),
            },
        );
    }
    InProcessNode::start_with(config).await
}

const FACTS: [(&str, &str, &str); 6] = [
    (
        "vitamin",
        "Vitamin D and bone",
        "Vitamin D supplementation improves bone density in older adults.",
    ),
    (
        "vitamin-copy",
        "A reprint",
        "Vitamin D supplementation improves bone density in older adults!",
    ),
    (
        "exercise",
        "Exercise",
        "Regular exercise lowers blood pressure in adults with hypertension.",
    ),
    (
        "coffee",
        "Coffee",
        "Coffee consumption is associated with a lower risk of liver disease in adults.",
    ),
    (
        "sleep",
        "Sleep",
        "Sleep deprivation impairs memory consolidation in students and adults.",
    ),
    (
        "calcium",
        "Calcium and bone",
        "Calcium intake and vitamin D together reduce fractures in older adults.",
    ),
];

async fn facts_kb(client: &ApiClient, name: &str, retrieval: Option<Value>) {
    // One shard: BM25 statistics over the whole (tiny) collection, so the ranking is stable.
    let mut body = json!({ "name": name, "shards": 1 });
    if let Some(retrieval) = retrieval {
        body["retrieval"] = retrieval;
    }
    client.create_kb(body).await;
    let documents: Vec<Value> = FACTS
        .iter()
        .map(|(id, title, text)| text_document(id, title, text))
        .collect();
    client.bulk_add(name, &documents).await;
    client.wait_ready(name, documents.len() as u64, WAIT).await;
}

fn external_ids(answer: &Value) -> Vec<String> {
    answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["external_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn adults_query(extra: Value) -> Value {
    let mut body = json!({ "query": "adults", "top_k": 10, "duplicate_similarity": 2.0 });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_rerank_services_apply_or_are_skipped_with_a_reason() {
    let dir = temp_dir();
    let addr = start_rerank_server().await;
    let node = start_node(&dir.path().join("data"), addr).await;
    let client = node.client();
    facts_kb(&client, "facts", None).await;

    let fused = client
        .search("facts", adults_query(json!({ "rerank": false })))
        .await;
    let fused_order = external_ids(&fused);
    assert_eq!(fused_order.len(), FACTS.len(), "{fused}");
    assert!(fused.get("rerank").is_none(), "no rerank asked: {fused}");

    // Times out, answers one score short, or with indices out of range: fused order kept.
    for (model, reason) in [
        ("slow", "timed out"),
        ("fewer", "5 scores for 6 documents"),
        ("badindex", "index 100"),
    ] {
        let answer = client
            .search(
                "facts",
                adults_query(json!({ "rerank": true, "rerank_model": model })),
            )
            .await;
        assert_eq!(
            answer["rerank"]["applied"],
            json!(false),
            "{model}: {answer}"
        );
        let said = answer["rerank"]["reason"].as_str().unwrap_or_default();
        assert!(said.contains(reason), "{model}: reason {said:?}");
        assert_eq!(
            external_ids(&answer),
            fused_order,
            "{model}: fused order kept"
        );
        assert!(
            answer["notes"].to_string().contains("skipped"),
            "{model}: {answer}"
        );
    }

    // Scores listed out of order (TEI) or best first (Cohere shape): sorted by us; document
    // i scored i, so the fused order comes back reversed.
    let mut reversed = fused_order.clone();
    reversed.reverse();
    for model in ["shuffled", "cohere"] {
        let answer = client
            .search(
                "facts",
                adults_query(json!({ "rerank": true, "rerank_model": model, "explain": true })),
            )
            .await;
        assert_eq!(
            answer["rerank"]["applied"],
            json!(true),
            "{model}: {answer}"
        );
        assert_eq!(external_ids(&answer), reversed, "{model}");
        let scores: Vec<f64> = answer["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["rerank_score"].as_f64().unwrap())
            .collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
        let first = &answer["hits"][0]["path"];
        assert_eq!(first["fused_rank"], json!(FACTS.len()), "{first}");
        assert_eq!(first["rerank_rank"], json!(1), "{first}");
    }

    // Depth: only the head is reranked; the tail keeps its fused order after it.
    let answer = client
        .search(
            "facts",
            adults_query(json!({ "rerank_model": "shuffled", "rerank_depth": 2 })),
        )
        .await;
    let ids = external_ids(&answer);
    assert_eq!(ids[0], fused_order[1]);
    assert_eq!(ids[1], fused_order[0]);
    assert_eq!(ids[2..], fused_order[2..]);

    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_pipeline_collapses_duplicates_and_explains_each_step() {
    let dir = temp_dir();
    let addr = start_rerank_server().await;
    let node = start_node(&dir.path().join("data"), addr).await;
    let client = node.client();
    facts_kb(&client, "facts", None).await;

    let answer = client
        .search(
            "facts",
            json!({ "query": "does vitamin D help bone density", "top_k": 5, "explain": true }),
        )
        .await;
    assert_eq!(answer["rerank"]["applied"], json!(true), "{answer}");
    assert_eq!(answer["rerank"]["model"], json!("embedded"));
    let hits = answer["hits"].as_array().unwrap();
    // The two copies of the vitamin D sentence are one hit that names both sources.
    let top = &hits[0];
    let sources: Vec<&str> = std::iter::once(top["external_id"].as_str().unwrap())
        .chain(
            top["also_in"]
                .as_array()
                .unwrap_or_else(|| panic!("also_in on the top hit: {top}"))
                .iter()
                .map(|a| a["external_id"].as_str().unwrap()),
        )
        .collect();
    assert!(
        sources.contains(&"vitamin") && sources.contains(&"vitamin-copy"),
        "{sources:?}"
    );
    let ids = external_ids(&answer);
    assert_eq!(
        ids.iter().filter(|id| id.starts_with("vitamin")).count(),
        1,
        "{ids:?}"
    );
    // Explain: channels, fusion, rerank features, in order.
    let path = &top["path"];
    assert!(path["fused_rank"].as_u64().unwrap() >= 1, "{path}");
    assert!(
        path["rerank_features"]["coverage"].as_f64().unwrap() > 0.5,
        "{path}"
    );
    let explain = top["explain"].as_str().unwrap();
    for word in ["fused", "rerank (embedded)", "absorbed near-identical"] {
        assert!(explain.contains(word), "{word:?} in {explain}");
    }

    // Multi-query: a planner's sub-query finds what the query alone does not rank first.
    let answer = client
        .search(
            "facts",
            json!({ "query": "vitamin D bone", "queries": ["coffee liver"], "top_k": 10, "explain": true }),
        )
        .await;
    assert_eq!(answer["queries"], json!(["vitamin D bone", "coffee liver"]));
    let coffee = answer["hits"]
        .as_array()
        .unwrap()
        .iter()
        .position(|h| h["external_id"] == "coffee")
        .expect("the sub-query's document is found");
    assert!(coffee <= 2, "coffee at {coffee}: {answer}");
    assert!(
        answer["hits"][coffee]["explain"]
            .as_str()
            .unwrap()
            .contains("multi-query")
    );
    node.shutdown().await;
}

const LONG: [&str; 6] = [
    "Glaciers in the northern valleys retreat every summer as meltwater carves new channels through the ice sheets of the region.",
    "Volcanic islands form when magma rises through the ocean floor and cools into black basalt ridges that break the surface.",
    "Monsoon rains arrive in early June and flood the river deltas where rice farmers plant their seedlings in terraced paddies.",
    "Coral reefs bleach when warm currents linger for weeks and the symbiotic algae leave the stony skeletons of the colonies.",
    "Desert dunes migrate downwind a few metres each year, burying roads and oases under ripples of fine quartz sand.",
    "Tundra permafrost thaws along its southern edge, releasing methane from peat that froze thousands of years ago.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neighbours_and_parents_pack_into_the_budget_or_are_trimmed() {
    let dir = temp_dir();
    let addr = start_rerank_server().await;
    let node = start_node(&dir.path().join("data"), addr).await;
    let client = node.client();
    client
        .create_kb(json!({
            "name": "long", "shards": 2, "chunk_tokens": 32, "chunk_overlap_tokens": 0,
            "parent_tokens": 256,
        }))
        .await;
    client
        .bulk_add(
            "long",
            &[text_document("earth", "Landscapes", &LONG.join("\n\n"))],
        )
        .await;
    client.wait_ready("long", 1, WAIT).await;

    // Neighbours: the monsoon chunk comes with the chunks before and after it.
    let answer = client
        .search(
            "long",
            json!({ "query": "monsoon rice paddies", "top_k": 1, "expand_neighbours": 1,
                     "context_tokens": 4000, "expand_parent": false }),
        )
        .await;
    let hit = &answer["hits"][0];
    assert!(hit["text"].as_str().unwrap().contains("Monsoon"), "{hit}");
    let position = hit["position"].as_u64().unwrap();
    let neighbours: Vec<u64> = hit["neighbours"]
        .as_array()
        .unwrap_or_else(|| panic!("neighbours: {hit}"))
        .iter()
        .map(|n| n["position"].as_u64().unwrap())
        .collect();
    assert!(!neighbours.is_empty());
    assert!(
        neighbours.iter().all(|p| p.abs_diff(position) == 1),
        "{neighbours:?} around {position}"
    );
    let context = &answer["context"];
    assert_eq!(context["trimmed"], json!(false), "{context}");
    assert_eq!(context["citations"][0]["expansion"], json!("neighbours"));
    let text = context["text"].as_str().unwrap();
    assert!(text.starts_with("[1] Landscapes"), "{text}");
    assert!(
        text.contains("Volcanic") || text.contains("Coral"),
        "{text}"
    );

    // More expansion than the budget holds: trimmed, within budget, and said so.
    let answer = client
        .search(
            "long",
            json!({ "query": "monsoon coral glaciers dunes", "top_k": 5, "expand_neighbours": 2,
                     "expand_parent": true, "context_tokens": 60 }),
        )
        .await;
    let context = &answer["context"];
    assert_eq!(context["trimmed"], json!(true), "{context}");
    assert!(context["tokens"].as_u64().unwrap() <= 60, "{context}");
    assert!(
        !context["citations"].as_array().unwrap().is_empty(),
        "{context}"
    );
    let notes = answer["notes"].to_string();
    assert!(notes.contains("60"), "{notes}");
    // Citations are numbered 1..n and each hit points at one.
    let numbers: Vec<u64> = context["citations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["n"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());

    // A budget too large, or too many neighbours: refused.
    client
        .search_answer(
            "long",
            json!({ "query": "monsoon", "context_tokens": 10_000_000 }),
        )
        .await
        .expect_error(400, "invalid_context_tokens");
    client
        .search_answer(
            "long",
            json!({ "query": "monsoon", "expand_neighbours": 50 }),
        )
        .await
        .expect_error(400, "invalid_expansion");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kb_retrieval_settings_are_validated_applied_and_overridable() {
    let dir = temp_dir();
    let addr = start_rerank_server().await;
    let node = start_node(&dir.path().join("data"), addr).await;
    let client = node.client();

    for (retrieval, code) in [
        (json!({ "dense_weight": -0.5 }), "invalid_weights"),
        (
            json!({ "dense_weight": 0.0, "bm25_weight": 0.0 }),
            "invalid_weights",
        ),
        (json!({ "rerank_model": "absent" }), "unknown_rerank_model"),
        (json!({ "fusion": "borda" }), "invalid_fusion"),
        (json!({ "no_such_field": 1 }), "invalid_retrieval_settings"),
    ] {
        client
            .post_json("/v1/kbs", &json!({ "name": "bad", "retrieval": retrieval }))
            .await
            .expect_error(400, code);
    }
    client
        .get("/v1/kbs/bad")
        .await
        .expect_error(404, "kb_not_found");

    // Empty KB: a search answers with no hits, and says the reranker had nothing to do.
    facts_kb(
        &client,
        "facts",
        Some(json!({ "rerank": false, "bm25_weight": 2.0 })),
    )
    .await;
    client
        .create_kb(json!({ "name": "empty", "retrieval": { "context_tokens": 500 } }))
        .await;
    let answer = client
        .search("empty", json!({ "query": "anything", "rerank": true }))
        .await;
    assert_eq!(answer["hits"], json!([]), "{answer}");
    assert_eq!(answer["rerank"]["applied"], json!(false));
    assert_eq!(answer["context"]["citations"], json!([]));
    assert_eq!(answer["context"]["tokens"], json!(0));

    let kb = client.get_kb("facts").await;
    assert_eq!(kb["settings"]["retrieval"]["rerank"], json!(false), "{kb}");
    assert_eq!(kb["settings"]["retrieval"]["bm25_weight"], json!(2.0));
    let answer = client
        .search("facts", json!({ "query": "vitamin D" }))
        .await;
    assert!(
        answer.get("rerank").is_none(),
        "rerank is off for this KB: {answer}"
    );
    let answer = client
        .search("facts", json!({ "query": "vitamin D", "rerank": true }))
        .await;
    assert_eq!(answer["rerank"]["applied"], json!(true), "request override");

    // PATCH: bad values refused and nothing changes; good values apply.
    for (retrieval, code) in [
        (json!({ "bm25_weight": -1.0 }), "invalid_weights"),
        (
            json!({ "dense_weight": 0.0, "bm25_weight": 0.0 }),
            "invalid_weights",
        ),
        (json!({ "mmr_lambda": 1.5 }), "invalid_mmr_lambda"),
    ] {
        client
            .patch_json("/v1/kbs/facts", &json!({ "retrieval": retrieval }))
            .await
            .expect_error(400, code);
    }
    let unchanged = client.get_kb("facts").await;
    assert_eq!(unchanged["settings"], kb["settings"]);
    let patched = client
        .patch_json(
            "/v1/kbs/facts",
            &json!({ "retrieval": { "rerank": true, "mmr": true, "mmr_lambda": 0.5 } }),
        )
        .await
        .expect(200);
    assert_eq!(patched["settings"]["retrieval"]["rerank"], json!(true));
    assert_eq!(
        patched["settings"]["retrieval"]["bm25_weight"],
        json!(2.0),
        "kept"
    );
    let answer = client
        .search("facts", json!({ "query": "adults", "explain": true }))
        .await;
    assert_eq!(answer["rerank"]["applied"], json!(true));
    assert!(
        answer["hits"][0]["path"]["mmr"]
            .as_str()
            .is_some_and(|m| m.starts_with("mmr:")),
        "{answer}"
    );

    // Relative-score filter: a high bar keeps only each channel's near-best hits; when that
    // leaves fewer than min_results, the unfiltered lists are used and the answer says so.
    let all = client
        .search(
            "facts",
            json!({ "query": "vitamin D bone", "top_k": 10, "rerank": false }),
        )
        .await;
    let strict = client
        .search(
            "facts",
            json!({ "query": "vitamin D bone", "top_k": 10, "rerank": false,
                     "min_relative_score": 0.95, "min_results": 1 }),
        )
        .await;
    assert!(
        external_ids(&strict).len() < external_ids(&all).len(),
        "{strict}"
    );
    let fallback = client
        .search(
            "facts",
            json!({ "query": "vitamin D bone", "top_k": 10, "rerank": false,
                     "min_relative_score": 0.95, "min_results": 100 }),
        )
        .await;
    assert_eq!(external_ids(&fallback), external_ids(&all));
    assert!(
        fallback["notes"].to_string().contains("unfiltered"),
        "{fallback}"
    );

    // Per-request: negative or all-zero weights and unknown rerank models are refused.
    for (body, code) in [
        (
            json!({ "query": "x", "weights": { "dense": -1.0 } }),
            "invalid_weights",
        ),
        (
            json!({ "query": "x", "weights": { "dense": 0.0, "bm25": 0.0 } }),
            "invalid_weights",
        ),
        (
            json!({ "query": "x", "rerank_model": "absent" }),
            "unknown_rerank_model",
        ),
        (json!({ "query": "x", "queries": [""] }), "invalid_queries"),
    ] {
        client
            .search_answer("facts", body)
            .await
            .expect_error(400, code);
    }
    node.shutdown().await;
}
