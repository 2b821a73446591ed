//! Fusion of retrieval channels.
//!
//! Each channel is first merged across shards by its own score (cosine for dense, BM25 for
//! text); fusing per shard would be wrong because a shard's rank 1 is not the KB's rank 1.
//! Then one of:
//! - [`rrf_fuse`], reciprocal rank fusion: `fused(d) = Σ_c w_c / (k + rank_c(d))`, ranks
//!   from 1. Uses ranks only, so it needs no calibration.
//! - [`dbsf_fuse`] (the default), distribution-based score fusion (as in Qdrant): each channel's scores are
//!   mapped to [0, 1] by `(s - (μ - 3σ)) / 6σ`, with μ and σ over the channel's top 50, clipped, then summed
//!   with the weights. Keeps how far apart the scores are, which RRF throws away: nDCG@10
//!   0.724 against RRF's 0.710 on SciFact, 0.819 against 0.702 on CMRC 2018 (where the dense
//!   channel is weak), 0.824 against 0.813 on HotpotQA100 (docs/benchmarks-history.md, ADR 0004).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// How channels are fused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FusionMethod {
    /// Reciprocal rank fusion.
    Rrf,
    /// Distribution-based score fusion: the default, better than RRF on every collection
    /// measured here (ADR 0004).
    #[default]
    Dbsf,
}

impl FusionMethod {
    pub fn parse(name: &str) -> Option<FusionMethod> {
        match name {
            "rrf" => Some(FusionMethod::Rrf),
            "dbsf" => Some(FusionMethod::Dbsf),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Dense,
    Bm25,
    Graph,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Dense => "dense",
            Channel::Bm25 => "bm25",
            Channel::Graph => "graph",
        }
    }
}

/// Where a fused hit stood in one channel.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChannelHitInfo {
    /// 1-based rank in the channel after the global merge.
    pub rank: usize,
    /// The channel's own score.
    pub score: f32,
    /// This channel's term of the fused score.
    pub contribution: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FusedHit<K> {
    pub key: K,
    pub score: f64,
    pub channels: Vec<(Channel, ChannelHitInfo)>,
}

/// One channel's input to fusion: the channel, its weight, its hits `(key, score)` best first.
pub type RankedList<K> = (Channel, f64, Vec<(K, f32)>);

/// Fuses ranked lists with reciprocal rank fusion (see the module docs).
pub fn rrf_fuse<K>(lists: &[RankedList<K>], k: f64) -> Vec<FusedHit<K>>
where
    K: Clone + Eq + std::hash::Hash + Ord,
{
    fuse(lists, |_, weight, rank, _| weight / (k + rank as f64))
}

/// Hits of each channel whose scores set its mean and deviation for [`dbsf_fuse`].
pub const DBSF_WINDOW: usize = 50;

/// Fuses ranked lists with distribution-based score fusion (see the module docs).
pub fn dbsf_fuse<K>(lists: &[RankedList<K>]) -> Vec<FusedHit<K>>
where
    K: Clone + Eq + std::hash::Hash + Ord,
{
    let ranges: HashMap<Channel, (f64, f64)> = lists
        .iter()
        .map(|(channel, _, hits)| {
            // Statistics over a fixed head of the list, so that asking for more candidates
            // (a deeper tail of weak hits) does not shift every normalised score.
            let hits = &hits[..hits.len().min(DBSF_WINDOW)];
            let count = hits.len().max(1) as f64;
            let mean = hits.iter().map(|(_, s)| f64::from(*s)).sum::<f64>() / count;
            let variance = hits
                .iter()
                .map(|(_, s)| (f64::from(*s) - mean).powi(2))
                .sum::<f64>()
                / count;
            let deviation = variance.sqrt();
            (*channel, (mean - 3.0 * deviation, 6.0 * deviation))
        })
        .collect();
    fuse(lists, |channel, weight, _, score| {
        let (low, width) = ranges[&channel];
        let normalised = if width > f64::EPSILON {
            ((f64::from(score) - low) / width).clamp(0.0, 1.0)
        } else {
            1.0 // one hit, or all equal: each is the channel's best
        };
        weight * normalised
    })
}

/// Sums each key's per-channel contributions. A key listed twice in one channel counts once,
/// at its best rank. Channels with weight 0 still show in `channels` (for explain) but add
/// nothing. Ties on the fused score break by the best single-channel rank, then by key, so
/// results are deterministic.
fn fuse<K>(
    lists: &[RankedList<K>],
    contribution: impl Fn(Channel, f64, usize, f32) -> f64,
) -> Vec<FusedHit<K>>
where
    K: Clone + Eq + std::hash::Hash + Ord,
{
    let mut fused: HashMap<K, FusedHit<K>> = HashMap::new();
    for (channel, weight, hits) in lists {
        for (position, (key, score)) in hits.iter().enumerate() {
            let rank = position + 1;
            let entry = fused.entry(key.clone()).or_insert_with(|| FusedHit {
                key: key.clone(),
                score: 0.0,
                channels: Vec::new(),
            });
            if entry.channels.iter().any(|(c, _)| c == channel) {
                continue;
            }
            let contribution = contribution(*channel, *weight, rank, *score);
            entry.score += contribution;
            entry.channels.push((
                *channel,
                ChannelHitInfo {
                    rank,
                    score: *score,
                    contribution,
                },
            ));
        }
    }
    let mut hits: Vec<FusedHit<K>> = fused.into_values().collect();
    let best_rank = |hit: &FusedHit<K>| {
        hit.channels
            .iter()
            .map(|(_, info)| info.rank)
            .min()
            .unwrap_or(usize::MAX)
    };
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| best_rank(a).cmp(&best_rank(b)))
            .then_with(|| a.key.cmp(&b.key))
    });
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn agreement_wins_and_weights_apply() {
        let dense = vec![("a", 0.9), ("b", 0.8), ("c", 0.7)];
        let bm25 = vec![("b", 12.0), ("c", 9.0), ("d", 3.0)];
        let fused = rrf_fuse(
            &[
                (Channel::Dense, 1.0, dense.clone()),
                (Channel::Bm25, 1.0, bm25.clone()),
            ],
            60.0,
        );
        let order: Vec<_> = fused.iter().map(|h| h.key).collect();
        assert_eq!(order, vec!["b", "c", "a", "d"]);
        let b = &fused[0];
        assert!((b.score - (1.0 / 62.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert_eq!(b.channels.len(), 2);
        // Zero weight on BM25: dense order alone.
        let fused = rrf_fuse(
            &[(Channel::Dense, 1.0, dense), (Channel::Bm25, 0.0, bm25)],
            60.0,
        );
        let order: Vec<_> = fused.iter().take(3).map(|h| h.key).collect();
        assert_eq!(order, vec!["a", "b", "c"]);
    }

    #[test]
    fn duplicate_key_in_one_channel_counts_once() {
        let fused = rrf_fuse(&[(Channel::Dense, 1.0, vec![("a", 1.0), ("a", 0.5)])], 60.0);
        assert_eq!(fused.len(), 1);
        assert!((fused[0].score - 1.0 / 61.0).abs() < 1e-12);
    }

    #[test]
    fn dbsf_keeps_score_gaps_that_rrf_ignores() {
        // Dense: "a" far ahead of the pack; BM25: "b" barely ahead of "a".
        let dense = vec![("a", 0.95), ("b", 0.40), ("c", 0.39), ("d", 0.38)];
        let bm25 = vec![("b", 10.1), ("a", 10.0), ("c", 2.0), ("d", 1.9)];
        let lists = [(Channel::Dense, 1.0, dense), (Channel::Bm25, 1.0, bm25)];
        // RRF sees a tie (ranks 1+2 each) and breaks it by key; DBSF sees the gap.
        let rrf = rrf_fuse(&lists, 60.0);
        assert!((rrf[0].score - rrf[1].score).abs() < 1e-12);
        let dbsf = dbsf_fuse(&lists);
        assert_eq!(dbsf[0].key, "a");
        for hit in &dbsf {
            for (_, info) in &hit.channels {
                assert!((0.0..=1.0).contains(&info.contribution), "{info:?}");
            }
        }
        // A single hit normalises to 1.
        let single = dbsf_fuse(&[(Channel::Dense, 2.0, vec![("x", 0.3)])]);
        assert!((single[0].score - 2.0).abs() < 1e-12);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn fused_is_sorted_and_complete(
            dense in proptest::collection::vec(0u32..40, 0..30),
            bm25 in proptest::collection::vec(0u32..40, 0..30),
            wd in 0.0f64..3.0, wb in 0.0f64..3.0,
        ) {
            let dedup = |v: Vec<u32>| { let mut seen = std::collections::HashSet::new(); v.into_iter().filter(|x| seen.insert(*x)).map(|x| (x, 1.0f32)).collect::<Vec<_>>() };
            let dense = dedup(dense);
            let bm25 = dedup(bm25);
            let fused = rrf_fuse(&[(Channel::Dense, wd, dense.clone()), (Channel::Bm25, wb, bm25.clone())], 60.0);
            let mut all: std::collections::HashSet<u32> = dense.iter().map(|h| h.0).collect();
            all.extend(bm25.iter().map(|h| h.0));
            prop_assert_eq!(fused.len(), all.len());
            for pair in fused.windows(2) {
                prop_assert!(pair[0].score >= pair[1].score);
            }
            // A key ranked first in every channel it appears in, and present in all, is first
            // when weights are positive.
            if wd > 0.0 && wb > 0.0 && !dense.is_empty() && !bm25.is_empty() && dense[0].0 == bm25[0].0 {
                prop_assert_eq!(fused[0].key, dense[0].0);
            }
        }
    }
}
