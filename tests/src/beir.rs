//! BEIR-layout slices in `tests/fixtures/` and the quality measures the tests compute.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

#[derive(Clone, Debug, Deserialize)]
pub struct CorpusDocument {
    #[serde(rename = "_id")]
    pub id: String,
    #[serde(default)]
    pub title: String,
    pub text: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Query {
    #[serde(rename = "_id")]
    pub id: String,
    pub text: String,
}

/// Judged documents of one query: corpus id -> graded relevance (> 0).
pub type Judgements = HashMap<String, u32>;

#[derive(Clone, Debug)]
pub struct BeirSlice {
    pub corpus: Vec<CorpusDocument>,
    pub queries: Vec<Query>,
    /// Query id -> judgements.
    pub qrels: HashMap<String, Judgements>,
}

impl BeirSlice {
    /// The bulk-API documents of the corpus, with the corpus id as `external_id`.
    pub fn bulk_documents(&self) -> Vec<Value> {
        self.corpus
            .iter()
            .map(|doc| crate::text_document(&doc.id, &doc.title, &doc.text))
            .collect()
    }
}

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Loads `tests/fixtures/<name>/{corpus.jsonl, queries.jsonl, qrels.tsv}` and checks that
/// every query has a judged document that is in the corpus.
pub fn load_slice(name: &str) -> BeirSlice {
    let dir = fixtures_dir().join(name);
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|error| panic!("reading {name}/{file}: {error}"))
    };
    let corpus: Vec<CorpusDocument> = read("corpus.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}/corpus.jsonl: {e}")))
        .collect();
    let queries: Vec<Query> = read("queries.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}/queries.jsonl: {e}")))
        .collect();
    let mut qrels: HashMap<String, Judgements> = HashMap::new();
    for line in read("qrels.tsv")
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 3, "{name}/qrels.tsv: bad line {line:?}");
        let score: u32 = fields[2]
            .parse()
            .unwrap_or_else(|e| panic!("{name}/qrels.tsv: {e}"));
        if score > 0 {
            qrels
                .entry(fields[0].to_string())
                .or_default()
                .insert(fields[1].to_string(), score);
        }
    }
    let ids: HashSet<&str> = corpus.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), corpus.len(), "{name}: corpus ids are unique");
    for query in &queries {
        let judged = qrels
            .get(&query.id)
            .unwrap_or_else(|| panic!("{name}: query {} has no judgements", query.id));
        assert!(
            judged.keys().all(|id| ids.contains(id.as_str())),
            "{name}: a document judged for query {} is missing from the corpus",
            query.id
        );
    }
    BeirSlice {
        corpus,
        queries,
        qrels,
    }
}

pub fn scifact_slice() -> BeirSlice {
    load_slice("scifact-slice")
}

pub fn cmrc_slice() -> BeirSlice {
    load_slice("cmrc-slice")
}

pub fn hotpotqa_slice() -> BeirSlice {
    load_slice("hotpotqa-slice")
}

/// The distinct `external_id`s of a search answer's hits, in rank order (a document with
/// several matching chunks counts once, at its best rank).
pub fn ranked_external_ids(answer: &Value) -> Vec<String> {
    let mut seen = HashSet::new();
    crate::hits(answer)
        .iter()
        .filter_map(|hit| hit["external_id"].as_str().map(str::to_string))
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

/// Whether a judged document is among the first `k` of `ranked`.
pub fn hit_at_k(ranked: &[String], judged: &Judgements, k: usize) -> bool {
    ranked.iter().take(k).any(|id| judged.contains_key(id))
}

/// The share of the judged documents that are among the first `k` of `ranked`.
pub fn recall_at_k(ranked: &[String], judged: &Judgements, k: usize) -> f64 {
    if judged.is_empty() {
        return 0.0;
    }
    let found = ranked
        .iter()
        .take(k)
        .filter(|id| judged.contains_key(*id))
        .count();
    found as f64 / judged.len() as f64
}

/// nDCG@k with graded gains `rel` and discount `1/log2(rank + 1)` (BEIR's definition).
pub fn ndcg_at_k(ranked: &[String], judged: &Judgements, k: usize) -> f64 {
    let discount = |position: usize| 1.0 / ((position + 2) as f64).log2();
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(position, id)| judged.get(id).copied().unwrap_or(0) as f64 * discount(position))
        .sum();
    let mut ideal: Vec<u32> = judged.values().copied().collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(position, rel)| *rel as f64 * discount(position))
        .sum();
    if idcg == 0.0 { 0.0 } else { dcg / idcg }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(ids: &[(&str, u32)]) -> Judgements {
        ids.iter().map(|(id, rel)| (id.to_string(), *rel)).collect()
    }

    fn ranked(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ndcg_matches_hand_computed_values() {
        let one = judged(&[("a", 1)]);
        assert!((ndcg_at_k(&ranked(&["a", "x"]), &one, 10) - 1.0).abs() < 1e-12);
        // Rank 2: 1/log2(3).
        assert!((ndcg_at_k(&ranked(&["x", "a"]), &one, 10) - 1.0 / 3f64.log2()).abs() < 1e-12);
        assert_eq!(ndcg_at_k(&ranked(&["x", "y"]), &one, 10), 0.0);
        // Beyond k counts nothing.
        assert_eq!(ndcg_at_k(&ranked(&["x", "a"]), &one, 1), 0.0);
        // Two judged, one found at rank 1: 1 / (1 + 1/log2(3)).
        let two = judged(&[("a", 1), ("b", 1)]);
        let expected = 1.0 / (1.0 + 1.0 / 3f64.log2());
        assert!((ndcg_at_k(&ranked(&["a", "x", "y"]), &two, 10) - expected).abs() < 1e-12);
        // Graded: the better document first is ideal.
        let graded = judged(&[("a", 2), ("b", 1)]);
        assert!((ndcg_at_k(&ranked(&["a", "b"]), &graded, 10) - 1.0).abs() < 1e-12);
        assert!(ndcg_at_k(&ranked(&["b", "a"]), &graded, 10) < 1.0);
    }

    #[test]
    fn hit_at_k_looks_at_the_first_k_only() {
        let one = judged(&[("a", 1)]);
        assert!(hit_at_k(&ranked(&["x", "a"]), &one, 2));
        assert!(!hit_at_k(&ranked(&["x", "a"]), &one, 1));
        assert!(!hit_at_k(&[], &one, 10));
    }

    #[test]
    fn external_ids_are_distinct_in_rank_order() {
        let answer = serde_json::json!({ "hits": [
            { "external_id": "b" }, { "external_id": "a" }, { "external_id": "b" }, { "external_id": "c" }
        ] });
        assert_eq!(ranked_external_ids(&answer), ranked(&["b", "a", "c"]));
    }

    #[test]
    fn the_slices_load_and_are_consistent() {
        let scifact = scifact_slice();
        assert_eq!(scifact.corpus.len(), 200);
        assert_eq!(scifact.queries.len(), 40);
        let cmrc = cmrc_slice();
        assert_eq!(cmrc.corpus.len(), 60);
        assert_eq!(cmrc.queries.len(), 80);
    }
}
