//! Near-duplicate collapse and maximal marginal relevance (MMR).
//!
//! Similarity between chunks is the Jaccard similarity of their analysed term sets
//! ([`super::text`]), not the cosine of their vectors: it needs nothing from the shards (the
//! leaves return no vectors), costs microseconds for a hundred candidates, works for hits the
//! dense channel never saw, and "near-identical text" is exactly what it measures.

use serde::Serialize;

use super::root::SearchHit;
use super::text::{TermSet, jaccard, term_set};

/// Another place the same (near-identical) text was found.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct AlsoIn {
    pub chunk_id: String,
    pub document_id: String,
    pub external_id: Option<String>,
    pub title: String,
    pub similarity: f64,
}

/// Folds each hit whose text is at least `threshold` similar to a better-ranked kept hit into
/// that hit's `also_in`, until `keep` hits are kept (the rest follow unchanged). Order is
/// kept. Returns the term sets of the first `keep` hits.
pub fn collapse_duplicates(hits: &mut Vec<SearchHit>, threshold: f64, keep: usize) -> Vec<TermSet> {
    let mut kept: Vec<SearchHit> = Vec::with_capacity(hits.len());
    let mut sets: Vec<TermSet> = Vec::with_capacity(hits.len());
    for hit in hits.drain(..) {
        if kept.len() >= keep {
            kept.push(hit);
            continue;
        }
        let set = term_set(&hit.chunk.text);
        let twin = (threshold <= 1.0)
            .then(|| {
                sets.iter()
                    .enumerate()
                    .map(|(i, other)| (i, jaccard(&set, other)))
                    .find(|(_, similarity)| *similarity >= threshold)
            })
            .flatten();
        match twin {
            Some((index, similarity)) => {
                let keeper = &mut kept[index];
                keeper.trace.push(format!(
                    "absorbed near-identical {} (similarity {similarity:.2})",
                    hit.chunk.chunk_id
                ));
                keeper.also_in.push(AlsoIn {
                    chunk_id: hit.chunk.chunk_id,
                    document_id: hit.chunk.document_id,
                    external_id: hit.chunk.external_id,
                    title: hit.chunk.title,
                    similarity,
                });
            }
            None => {
                kept.push(hit);
                sets.push(set);
            }
        }
    }
    *hits = kept;
    sets
}

/// Reorders the first `take` picks of `hits` by MMR:
/// `argmax λ·rel(d) − (1−λ)·max_{s∈picked} sim(d, s)`, with `rel` the hit's score min-max
/// scaled to [0, 1] over the list. Hits after the picks keep their order.
pub fn mmr(hits: &mut Vec<SearchHit>, sets: &[TermSet], lambda: f64, take: usize) {
    if hits.len() < 2 {
        return;
    }
    let (high, low) = hits.iter().fold((f64::MIN, f64::MAX), |(h, l), hit| {
        (h.max(hit.score), l.min(hit.score))
    });
    let relevance = |score: f64| {
        if high - low > f64::EPSILON {
            (score - low) / (high - low)
        } else {
            1.0
        }
    };
    let mut remaining: Vec<usize> = (0..hits.len()).collect();
    let mut picked: Vec<usize> = Vec::new();
    // Each hit's highest similarity to the picks so far, updated once per pick: O(n·take).
    let mut redundancy = vec![0.0f64; hits.len()];
    while picked.len() < take.min(hits.len()) {
        let (slot, best) = remaining
            .iter()
            .enumerate()
            .map(|(slot, &i)| {
                (
                    slot,
                    lambda * relevance(hits[i].score) - (1.0 - lambda) * redundancy[i],
                )
            })
            .fold((0, f64::MIN), |best, candidate| {
                if candidate.1 > best.1 {
                    candidate
                } else {
                    best
                }
            });
        let index = remaining.remove(slot);
        let was = index + 1;
        let now = picked.len() + 1;
        let decision = if was == now {
            format!(
                "mmr: kept at #{now} (max similarity to better hits {:.2})",
                redundancy[index]
            )
        } else {
            format!(
                "mmr: #{was} -> #{now} (max similarity to better hits {:.2}, value {best:.3})",
                redundancy[index]
            )
        };
        hits[index].trace.push(decision.clone());
        hits[index].mmr = Some(decision);
        picked.push(index);
        for &i in &remaining {
            redundancy[i] = redundancy[i].max(jaccard(&sets[i], &sets[index]));
        }
    }
    picked.extend(remaining);
    let mut slots: Vec<Option<SearchHit>> = hits.drain(..).map(Some).collect();
    hits.extend(picked.into_iter().filter_map(|i| slots[i].take()));
}
