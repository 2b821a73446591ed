//! Ranking metrics (nDCG, Recall, MRR) with BEIR / pytrec_eval conventions, and latency
//! percentiles.
//!
//! - A ranking is a list of corpus ids, best first, each id at most once: build it with
//!   [`dedup_ranking`], which keeps every id at its first (best) position, because several
//!   chunks of one document can be hits.
//! - Relevant means judged with score > 0. Gain is linear: DCG@k = sum over ranks i = 1..k of
//!   score_i / log2(i + 1); the ideal DCG sorts every positive judgement of the query.

use std::collections::HashSet;

use serde::Serialize;

use crate::dataset::Judgements;

/// Keeps each id at its first position and drops later duplicates.
pub fn dedup_ranking<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    ids.into_iter().filter(|id| seen.insert(*id)).collect()
}

fn gain(judgements: &Judgements, id: &str) -> f64 {
    judgements
        .get(id)
        .copied()
        .filter(|&score| score > 0.0)
        .unwrap_or(0.0)
}

fn discount(rank: usize) -> f64 {
    // rank is 1-based: rank 1 has discount log2(2) = 1.
    ((rank + 1) as f64).log2()
}

/// Normalised discounted cumulative gain at `k`, with graded (linear) gain.
/// 0 when the query has no relevant document.
pub fn ndcg_at_k(ranking: &[&str], judgements: &Judgements, k: usize) -> f64 {
    let dcg: f64 = ranking
        .iter()
        .take(k)
        .enumerate()
        .map(|(index, id)| gain(judgements, id) / discount(index + 1))
        .sum();
    let mut ideal: Vec<f64> = judgements
        .values()
        .copied()
        .filter(|&score| score > 0.0)
        .collect();
    ideal.sort_unstable_by(|a, b| b.total_cmp(a));
    let ideal_dcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(index, score)| score / discount(index + 1))
        .sum();
    if ideal_dcg > 0.0 {
        dcg / ideal_dcg
    } else {
        0.0
    }
}

/// |relevant ∩ top-k| / |relevant|; 0 when the query has no relevant document.
pub fn recall_at_k(ranking: &[&str], judgements: &Judgements, k: usize) -> f64 {
    let relevant = judgements.values().filter(|&&score| score > 0.0).count();
    if relevant == 0 {
        return 0.0;
    }
    let found = ranking
        .iter()
        .take(k)
        .filter(|id| gain(judgements, id) > 0.0)
        .count();
    found as f64 / relevant as f64
}

/// 1 / rank of the first relevant document within the top `k`, else 0.
pub fn reciprocal_rank_at_k(ranking: &[&str], judgements: &Judgements, k: usize) -> f64 {
    ranking
        .iter()
        .take(k)
        .position(|id| gain(judgements, id) > 0.0)
        .map_or(0.0, |index| 1.0 / (index + 1) as f64)
}

/// The metrics of one query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct QueryScores {
    pub ndcg_at_10: f64,
    pub recall_at_5: f64,
    pub recall_at_10: f64,
    pub recall_at_100: f64,
    pub mrr_at_10: f64,
}

impl QueryScores {
    /// Scores a deduplicated ranking (see [`dedup_ranking`]).
    pub fn compute(ranking: &[&str], judgements: &Judgements) -> Self {
        Self {
            ndcg_at_10: ndcg_at_k(ranking, judgements, 10),
            recall_at_5: recall_at_k(ranking, judgements, 5),
            recall_at_10: recall_at_k(ranking, judgements, 10),
            recall_at_100: recall_at_k(ranking, judgements, 100),
            mrr_at_10: reciprocal_rank_at_k(ranking, judgements, 10),
        }
    }

    /// The mean of each metric over `scores`; all zeros when empty.
    pub fn mean<'a>(scores: impl IntoIterator<Item = &'a QueryScores>) -> Self {
        let mut sum = QueryScores::default();
        let mut count = 0usize;
        for score in scores {
            sum.ndcg_at_10 += score.ndcg_at_10;
            sum.recall_at_5 += score.recall_at_5;
            sum.recall_at_10 += score.recall_at_10;
            sum.recall_at_100 += score.recall_at_100;
            sum.mrr_at_10 += score.mrr_at_10;
            count += 1;
        }
        if count == 0 {
            return sum;
        }
        let n = count as f64;
        QueryScores {
            ndcg_at_10: sum.ndcg_at_10 / n,
            recall_at_5: sum.recall_at_5 / n,
            recall_at_10: sum.recall_at_10 / n,
            recall_at_100: sum.recall_at_100 / n,
            mrr_at_10: sum.mrr_at_10 / n,
        }
    }
}

/// Nearest-rank percentile (`pct` in 0..=100) of `values`, which need not be sorted;
/// `None` when empty. p50 of [1, 2, 3, 4] is 2, p99 of 1..=100 is 99.
pub fn percentile(values: &[f64], pct: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable_by(f64::total_cmp);
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judgements(pairs: &[(&str, f64)]) -> Judgements {
        pairs.iter().map(|(id, s)| (id.to_string(), *s)).collect()
    }

    fn close(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() < 1e-9,
            "expected {expected}, got {actual}"
        );
    }

    #[test]
    fn dedup_keeps_first_position_of_each_id() {
        let ranking = dedup_ranking(["a", "b", "a", "c", "b", "d"]);
        assert_eq!(ranking, ["a", "b", "c", "d"]);
        assert!(dedup_ranking([]).is_empty());
    }

    #[test]
    fn ndcg_perfect_and_empty() {
        let qrels = judgements(&[("a", 1.0), ("b", 1.0)]);
        close(ndcg_at_k(&["a", "b", "x"], &qrels, 10), 1.0);
        close(ndcg_at_k(&["b", "a"], &qrels, 10), 1.0);
        close(ndcg_at_k(&[], &qrels, 10), 0.0);
        close(ndcg_at_k(&["x", "y"], &qrels, 10), 0.0);
        close(ndcg_at_k(&["a"], &judgements(&[("a", 0.0)]), 10), 0.0);
    }

    #[test]
    fn ndcg_binary_by_hand() {
        // Relevant {a, c}; ranking x, a, y, c.
        // DCG = 1/log2(3) + 1/log2(5) = 0.630930 + 0.430677 = 1.061606
        // IDCG = 1/log2(2) + 1/log2(3) = 1.630930
        let qrels = judgements(&[("a", 1.0), ("c", 1.0)]);
        let dcg = 1.0 / 3f64.log2() + 1.0 / 5f64.log2();
        let idcg = 1.0 + 1.0 / 3f64.log2();
        close(ndcg_at_k(&["x", "a", "y", "c"], &qrels, 10), dcg / idcg);
        assert!((dcg / idcg - 0.650921).abs() < 1e-6, "{}", dcg / idcg);
    }

    #[test]
    fn ndcg_graded_linear_gain_by_hand() {
        // Judged: a = 1, c = 2, d = 1, z = 0 (judged non-relevant).
        // Ranking a, z, c:
        //   DCG  = 1/log2(2) + 0 + 2/log2(4) = 1 + 1 = 2
        //   IDCG = 2/log2(2) + 1/log2(3) + 1/log2(4) = 2 + 0.6309298 + 0.5 = 3.1309298
        //   nDCG = 2 / 3.1309298 = 0.6387878
        let qrels = judgements(&[("a", 1.0), ("c", 2.0), ("d", 1.0), ("z", 0.0)]);
        let ndcg = ndcg_at_k(&["a", "z", "c"], &qrels, 10);
        close(ndcg, 2.0 / (2.0 + 1.0 / 3f64.log2() + 0.5));
        assert!((ndcg - 0.638788).abs() < 1e-6, "{ndcg}");
        // Linear, not exponential gain: with 2^rel - 1 the answer would differ.
        let exponential = (1.0 + 3.0 / 2.0) / (3.0 + 1.0 / 3f64.log2() + 0.5);
        assert!((ndcg - exponential).abs() > 1e-3);
    }

    #[test]
    fn ndcg_cuts_both_dcg_and_ideal_at_k() {
        // Three relevant docs, k = 2, ranking puts one relevant at rank 3 (outside the cut).
        // DCG@2 = 1/log2(2) = 1; IDCG@2 = 1 + 1/log2(3) = 1.6309298
        let qrels = judgements(&[("a", 1.0), ("b", 1.0), ("c", 1.0)]);
        close(
            ndcg_at_k(&["a", "x", "b"], &qrels, 2),
            1.0 / (1.0 + 1.0 / 3f64.log2()),
        );
    }

    #[test]
    fn duplicates_of_one_external_id_count_once_at_their_best_rank() {
        // Chunk hits: d1, d1, d9, d2, d1. Relevant d1 = 1, d2 = 1.
        // Deduplicated: d1, d9, d2 -> DCG = 1 + 1/log2(4) = 1.5; IDCG = 1 + 1/log2(3).
        let hits = ["d1", "d1", "d9", "d2", "d1"];
        let ranking = dedup_ranking(hits);
        let qrels = judgements(&[("d1", 1.0), ("d2", 1.0)]);
        let scores = QueryScores::compute(&ranking, &qrels);
        close(scores.ndcg_at_10, 1.5 / (1.0 + 1.0 / 3f64.log2()));
        close(scores.recall_at_5, 1.0);
        close(scores.mrr_at_10, 1.0);
        // d2 moves up to rank 3 once the duplicates of d1 are gone.
        close(recall_at_k(&ranking, &qrels, 3), 1.0);
    }

    #[test]
    fn without_deduplication_a_chunked_document_would_count_twice() {
        // Hits d1, d1, d9; relevant d1, d2. Deduplicated: d1, d9.
        //   recall@3 = 1/2; nDCG@10 = 1 / (1 + 1/log2(3)) = 0.6131472
        // The raw list would claim recall 2/2 and a perfect nDCG of 1.
        let hits = ["d1", "d1", "d9"];
        let qrels = judgements(&[("d1", 1.0), ("d2", 1.0)]);
        let ranking = dedup_ranking(hits);
        close(recall_at_k(&ranking, &qrels, 3), 0.5);
        close(
            ndcg_at_k(&ranking, &qrels, 10),
            1.0 / (1.0 + 1.0 / 3f64.log2()),
        );
        close(recall_at_k(&hits, &qrels, 3), 1.0);
        close(ndcg_at_k(&hits, &qrels, 10), 1.0);
    }

    #[test]
    fn recall_by_hand() {
        // Relevant a, c, d (b judged 0). Ranking a, b, c.
        let qrels = judgements(&[("a", 1.0), ("b", 0.0), ("c", 2.0), ("d", 1.0)]);
        let ranking = ["a", "b", "c"];
        close(recall_at_k(&ranking, &qrels, 1), 1.0 / 3.0);
        close(recall_at_k(&ranking, &qrels, 2), 1.0 / 3.0);
        close(recall_at_k(&ranking, &qrels, 3), 2.0 / 3.0);
        close(recall_at_k(&ranking, &qrels, 100), 2.0 / 3.0);
        close(recall_at_k(&ranking, &judgements(&[]), 10), 0.0);
    }

    #[test]
    fn reciprocal_rank_by_hand() {
        let qrels = judgements(&[("c", 1.0), ("z", 0.0)]);
        close(
            reciprocal_rank_at_k(&["z", "y", "c"], &qrels, 10),
            1.0 / 3.0,
        );
        close(reciprocal_rank_at_k(&["c"], &qrels, 10), 1.0);
        close(reciprocal_rank_at_k(&["z", "y"], &qrels, 10), 0.0);
        // Relevant at rank 11 is outside MRR@10.
        let mut ranking: Vec<&str> = vec!["x"; 10];
        ranking.push("c");
        close(reciprocal_rank_at_k(&ranking, &qrels, 10), 0.0);
        close(reciprocal_rank_at_k(&ranking, &qrels, 11), 1.0 / 11.0);
    }

    #[test]
    fn recall_at_100_counts_documents_beyond_10() {
        let ids: Vec<String> = (0..50).map(|i| format!("d{i}")).collect();
        let ranking: Vec<&str> = ids.iter().map(String::as_str).collect();
        let qrels = judgements(&[("d3", 1.0), ("d42", 1.0), ("missing", 1.0)]);
        let scores = QueryScores::compute(&ranking, &qrels);
        close(scores.recall_at_5, 1.0 / 3.0);
        close(scores.recall_at_10, 1.0 / 3.0);
        close(scores.recall_at_100, 2.0 / 3.0);
        close(scores.mrr_at_10, 0.25);
    }

    #[test]
    fn mean_averages_each_metric() {
        let a = QueryScores {
            ndcg_at_10: 1.0,
            recall_at_5: 0.5,
            recall_at_10: 1.0,
            recall_at_100: 1.0,
            mrr_at_10: 1.0,
        };
        let b = QueryScores::default();
        let mean = QueryScores::mean([&a, &b]);
        close(mean.ndcg_at_10, 0.5);
        close(mean.recall_at_5, 0.25);
        close(mean.mrr_at_10, 0.5);
        assert_eq!(QueryScores::mean([]), QueryScores::default());
    }

    #[test]
    fn percentile_nearest_rank() {
        let values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[7.5], 99.0), Some(7.5));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
