//! The embedded rerank stage: a re-scorer over features Sift already has, used because no
//! cross-encoder's weights can be obtained through a package registry here (see ADR 0007).
//!
//! For each candidate of the fused list:
//! - `dense`, `bm25`: the channel's score mapped to [0, 1] as distribution-based score fusion
//!   does (`(s - (μ - 3σ)) / 6σ`, μ and σ over the channel's top 50, clipped); 0 when the
//!   channel did not return the candidate;
//! - `coverage`: the IDF-weighted share of the query's terms found in the chunk's title,
//!   heading path and text (IDF over the candidate set, so it needs no corpus statistics);
//! - `title`: the same share counted in the title and heading path only;
//! - `graph`: the graph channel's mass, mapped like `dense` (0 when the channel did not run or
//!   did not reach the candidate).
//!
//! `score = w_dense·dense + 1.2·w_bm25·bm25 + 0.4·coverage + 0.4·title + g·w_graph·graph`,
//! where the w are the KB's channel weights and g is [`GRAPH_FACTOR`]. The constants were chosen by a grid search on SciFact (and nothing
//! else): nDCG@10 0.7185 → 0.7328 offline on the same channel lists (docs/benchmarks-history.md).

use std::collections::HashMap;

use super::fusion::{Channel, DBSF_WINDOW};
use super::root::SearchHit;
use super::text::{TermSet, term_set};

pub const BM25_FACTOR: f64 = 1.2;
pub const COVERAGE_WEIGHT: f64 = 0.4;
pub const TITLE_WEIGHT: f64 = 0.4;
/// The graph feature's factor: chosen on HotpotQA100 (ADR 0037).
pub const GRAPH_FACTOR: f64 = 1.0;

/// The features of one candidate (shown by `explain`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Features {
    pub dense: f64,
    pub bm25: f64,
    pub coverage: f64,
    pub title: f64,
    pub graph: f64,
}

/// Scores every hit; returns the features and the score of each, in input order.
pub fn rescore(
    query: &str,
    hits: &[SearchHit],
    dense_weight: f64,
    bm25_weight: f64,
    graph_weight: f64,
) -> Vec<(Features, f64)> {
    let ranges = channel_ranges(hits);
    let query_terms = term_set(query);
    let texts: Vec<(TermSet, TermSet)> = hits
        .iter()
        .map(|hit| {
            let heading = format!("{} {}", hit.chunk.title, hit.chunk.heading_path.join(" "));
            let title = term_set(&heading);
            let all = term_set(&hit.chunk.text).union(&title);
            (all, title)
        })
        .collect();
    let count = hits.len() as f64;
    let idf: Vec<(u64, f64)> = query_terms
        .iter()
        .map(|term| {
            let df = texts.iter().filter(|(all, _)| all.contains(term)).count() as f64;
            (term, (1.0 + (count + 1.0) / (1.0 + df)).ln())
        })
        .collect();
    let total: f64 = idf.iter().map(|(_, w)| w).sum::<f64>().max(f64::EPSILON);
    hits.iter()
        .zip(&texts)
        .map(|(hit, (all, title))| {
            let normalised = |channel: Channel| {
                hit.channels.get(&channel).map_or(0.0, |info| {
                    let (low, width) = ranges.get(&channel).copied().unwrap_or((0.0, 0.0));
                    if width > f64::EPSILON {
                        ((f64::from(info.score) - low) / width).clamp(0.0, 1.0)
                    } else {
                        1.0
                    }
                })
            };
            let share = |set: &TermSet| {
                idf.iter()
                    .filter(|(term, _)| set.contains(*term))
                    .map(|(_, weight)| weight)
                    .sum::<f64>()
                    / total
            };
            let features = Features {
                dense: normalised(Channel::Dense),
                bm25: normalised(Channel::Bm25),
                coverage: share(all),
                title: share(title),
                graph: normalised(Channel::Graph),
            };
            let score = dense_weight * features.dense
                + BM25_FACTOR * bm25_weight * features.bm25
                + COVERAGE_WEIGHT * features.coverage
                + TITLE_WEIGHT * features.title
                + GRAPH_FACTOR * graph_weight * features.graph;
            (features, score)
        })
        .collect()
}

/// `(μ - 3σ, 6σ)` of each channel's scores over its best `DBSF_WINDOW` ranks among `hits`.
fn channel_ranges(hits: &[SearchHit]) -> HashMap<Channel, (f64, f64)> {
    let mut by_channel: HashMap<Channel, Vec<(usize, f64)>> = HashMap::new();
    for hit in hits {
        for (channel, info) in &hit.channels {
            by_channel
                .entry(*channel)
                .or_default()
                .push((info.rank, f64::from(info.score)));
        }
    }
    by_channel
        .into_iter()
        .map(|(channel, mut scores)| {
            scores.sort_by_key(|(rank, _)| *rank);
            scores.truncate(DBSF_WINDOW);
            let n = scores.len().max(1) as f64;
            let mean = scores.iter().map(|(_, s)| s).sum::<f64>() / n;
            let deviation =
                (scores.iter().map(|(_, s)| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
            (channel, (mean - 3.0 * deviation, 6.0 * deviation))
        })
        .collect()
}
