//! Retrieval quality on small slices of public collections, per channel (dense, BM25, fused),
//! ingested through the bulk JSON API into a 2-shard KB. The floors sit a little below what
//! was measured, so a ranking, tokenisation, chunking or merge regression fails the test.

use serde_json::{Value, json};
use sift_tests::beir::{self, BeirSlice, hit_at_k, ndcg_at_k, ranked_external_ids, recall_at_k};
use sift_tests::{ApiClient, InProcessNode, count, ingest_deadline, temp_dir};

/// Requested channels, by the name printed and asserted.
const CHANNELS: [(&str, Option<&[&str]>); 6] = [
    ("dense", Some(&["dense"])),
    ("bm25", Some(&["bm25"])),
    ("fused", None),     // both channels, distribution-based score fusion, no rerank
    ("fused-rrf", None), // both channels, reciprocal rank fusion, no rerank
    ("default", None),   // the default pipeline: DBSF, then the embedded re-scorer
    ("default+mmr", None), // the default pipeline with MMR
];

#[derive(Debug)]
struct Quality {
    channel: &'static str,
    hit_at_10: f64,
    ndcg_at_10: f64,
}

/// Ingests `slice` into a new 2-shard KB and waits until every document is ready.
async fn ingest(client: &ApiClient, kb: &str, language: &str, slice: &BeirSlice) {
    client
        .create_kb(json!({ "name": kb, "shards": 2, "language": language }))
        .await;
    let documents = slice.bulk_documents();
    for batch in documents.chunks(50) {
        client.bulk_add(kb, batch).await;
    }
    let counts = client
        .wait_ready(kb, documents.len() as u64, ingest_deadline(documents.len()))
        .await;
    assert_eq!(count(&counts, "failed"), 0, "no document fails: {counts}");
    assert_eq!(counts["total"], json!(documents.len()), "{counts}");
}

/// Runs every query of `slice` on each channel with top_k 10.
async fn measure(client: &ApiClient, kb: &str, slice: &BeirSlice) -> Vec<Quality> {
    let mut results = Vec::new();
    for (channel, channels) in CHANNELS {
        let (mut hits, mut ndcg) = (0usize, 0.0f64);
        for query in &slice.queries {
            let mut body = json!({ "query": query.text, "top_k": 10 });
            if let Some(channels) = channels {
                body["channels"] = json!(channels);
            }
            match channel {
                "default" => {}
                "default+mmr" => body["mmr"] = json!(true),
                "fused-rrf" => {
                    body["fusion"] = json!("rrf");
                    body["rerank"] = json!(false);
                }
                _ => body["rerank"] = json!(false),
            }
            let answer: Value = client.search(kb, body).await;
            assert_eq!(
                answer["failed_shards"],
                json!([]),
                "a complete answer: {answer}"
            );
            let returned = answer["hits"].as_array().map_or(0, Vec::len);
            assert!(returned <= 10, "at most top_k hits: {returned}");
            let ranked = ranked_external_ids(&answer);
            let judged = &slice.qrels[&query.id];
            hits += usize::from(hit_at_k(&ranked, judged, 10));
            ndcg += ndcg_at_k(&ranked, judged, 10);
        }
        let n = slice.queries.len() as f64;
        results.push(Quality {
            channel,
            hit_at_10: hits as f64 / n,
            ndcg_at_10: ndcg / n,
        });
    }
    results
}

fn report(collection: &str, results: &[Quality]) {
    for result in results {
        println!(
            "{collection} {:<5} hit@10 {:.3} nDCG@10 {:.3}",
            result.channel, result.hit_at_10, result.ndcg_at_10
        );
    }
}

/// (channel, hit@10 floor, nDCG@10 floor)
type Floors = [(&'static str, f64, f64); 6];

fn assert_floors(collection: &str, results: &[Quality], floors: &Floors) {
    for (channel, hit_floor, ndcg_floor) in floors {
        let measured = results
            .iter()
            .find(|r| r.channel == *channel)
            .expect("every channel is measured");
        assert!(
            measured.hit_at_10 >= *hit_floor && measured.ndcg_at_10 >= *ndcg_floor,
            "{collection} {channel}: hit@10 {:.3} (floor {hit_floor}), nDCG@10 {:.3} (floor {ndcg_floor})",
            measured.hit_at_10,
            measured.ndcg_at_10
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scifact_slice_quality_per_channel() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    let slice = beir::scifact_slice();
    ingest(&client, "scifact", "auto", &slice).await;
    let results = measure(&client, "scifact", &slice).await;
    report("scifact-slice", &results);
    // Measured (40 queries, 200 docs, 2 shards, all-MiniLM-L6-v2, debug build)
    // over two complete runs: dense hit@10 0.950 nDCG@10 0.862; bm25 0.900 / 0.801-0.821;
    // fused-rrf 0.925 / 0.841-0.861. Then with DBSF as the default fusion: fused (dbsf)
    // 0.975 / 0.878.
    // Issue 6 (rerank by the embedded re-scorer is now the default; `fused` asks for no
    // rerank): fused 0.975 / 0.875, default 0.925 / 0.859, default+mmr 0.925 / 0.858.
    // Runs vary a little (documents land on shards at random, which changes per-shard BM25
    // statistics and HNSW graphs), so the floors leave a step or two of 0.025.
    let floors: Floors = [
        ("dense", 0.875, 0.78),
        ("bm25", 0.85, 0.74),
        ("fused", 0.925, 0.80),
        ("fused-rrf", 0.875, 0.78),
        ("default", 0.875, 0.80),
        ("default+mmr", 0.875, 0.80),
    ];
    assert_floors("scifact", &results, &floors);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmrc_slice_quality_per_channel() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    let slice = beir::cmrc_slice();
    ingest(&client, "cmrc", "zh", &slice).await;
    let results = measure(&client, "cmrc", &slice).await;
    report("cmrc-slice", &results);
    // Measured (80 questions, 60 paragraphs, 2 shards, jieba BM25) over four runs:
    // dense hit@10 0.613 nDCG@10 0.433 (an English model on Chinese text); bm25 1.000 /
    // 0.977-0.989; fused-rrf 0.900-0.950 / 0.776-0.797. With DBSF as the default fusion:
    // fused (dbsf) 1.000 / 0.863 (DBSF keeps BM25's large score gaps; RRF does not).
    // Issue 6: fused 0.988 / 0.872; the default pipeline (DBSF + embedded re-scorer, whose
    // term-coverage features count CJK characters) 1.000 / 0.975; with MMR 1.000 / 0.975.
    let floors: Floors = [
        ("dense", 0.55, 0.38),
        ("bm25", 0.95, 0.92),
        ("fused", 0.95, 0.80),
        ("fused-rrf", 0.85, 0.72),
        ("default", 0.95, 0.92),
        ("default+mmr", 0.95, 0.92),
    ];
    assert_floors("cmrc", &results, &floors);
    node.shutdown().await;
}

/// Multi-hop questions: the second supporting passage is often named in the first rather than
/// similar to the question. Link following moves it up behind the passage naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotpotqa_slice_links_reach_the_second_hop() {
    let dir = temp_dir();
    let node = InProcessNode::start(&dir.path().join("data")).await;
    let client = node.client();
    let slice = beir::hotpotqa_slice();
    ingest(&client, "hotpot", "auto", &slice).await;
    let mut recall = Vec::new();
    let mut explained_links = 0;
    for follow_links in [false, true] {
        let mut total = 0.0;
        for query in &slice.queries {
            let body = json!({
                "query": query.text,
                "top_k": 10,
                "follow_links": follow_links,
                "explain": true,
            });
            let answer: Value = client.search("hotpot", body).await;
            let ranked = ranked_external_ids(&answer);
            total += recall_at_k(&ranked, &slice.qrels[&query.id], 5);
            for hit in sift_tests::hits(&answer) {
                let steps = hit["path"]["steps"].as_array().cloned().unwrap_or_default();
                let linked = steps.iter().any(|step| {
                    step.as_str().is_some_and(|s| {
                        s.starts_with("link: named in") || s.starts_with("link: names")
                    })
                });
                assert!(
                    follow_links || !linked,
                    "no link moves when follow_links is off: {hit}"
                );
                explained_links += usize::from(linked);
            }
        }
        recall.push(total / slice.queries.len() as f64);
    }
    println!(
        "hotpotqa-slice recall@5: without links {:.3}, with links (the default) {:.3}; {explained_links} hits moved by a link",
        recall[0], recall[1]
    );
    // Measured (20 questions, their 200 passages, 2 shards, debug build): without links
    // 0.875, with links 0.925 (18 hits moved). One passage is 0.025; the floors leave two
    // steps.
    assert!(explained_links > 0, "the explain path shows link moves");
    assert!(
        recall[0] >= 0.825,
        "recall@5 without links {:.3}",
        recall[0]
    );
    assert!(
        recall[1] >= 0.875,
        "recall@5 with links {:.3} (without {:.3})",
        recall[1],
        recall[0]
    );
    node.shutdown().await;
}
