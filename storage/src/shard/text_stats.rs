//! BM25 statistics of the live chunks only, so that replicas score alike.
//!
//! tantivy's own statistics ([`tantivy::Searcher`] as a `Bm25StatisticsProvider`) count
//! deleted documents until a merge drops them: the document count is `max_doc`, a term's
//! document frequency and a field's token count include deleted documents. Two replicas of a
//! shard hold the same live chunks but not the same history: one deleted many documents that
//! the other, filled by a repair, never had. Their IDF and average length differ, so their
//! BM25 scores differ, and a node reading its own replica ranks differently from a node
//! reading another (found by the chaos soak, ADR 0028).
//!
//! [`LiveStatistics`] counts only live documents, in a way that does not depend on how they
//! are laid out in segments:
//!
//! - the document count is the sum of each segment's live documents;
//! - a term's document frequency is tantivy's where a segment has no deletes, else its
//!   postings counted against the segment's alive bitset;
//! - a field's token count is the sum of the live documents' field norms, in every segment
//!   (a field norm is the token count stored in one byte, exact up to 40 tokens and rounded
//!   above; summing it everywhere, rather than tantivy's exact count where a segment has no
//!   deletes, keeps the sum independent of which segments have deletes).
//!
//! The per-segment sums are cached by segment id and delete opstamp (a segment's live
//! documents change only with its delete opstamp), so a search after a commit sums only the
//! segments that commit made or changed.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tantivy::index::SegmentId;
use tantivy::query::Bm25StatisticsProvider;
use tantivy::schema::{Field, IndexRecordOption};
use tantivy::{DocSet, Opstamp, Searcher, SegmentReader, TERMINATED, Term};

/// One segment's live documents and their tokens in one field.
#[derive(Clone, Copy)]
struct SegmentCounts {
    documents: u64,
    tokens: u64,
}

type SegmentKey = (SegmentId, Option<Opstamp>, Field);

/// The cache of per-segment counts, shared by every search of one text index.
#[derive(Default)]
pub(crate) struct LiveCounts {
    segments: Mutex<HashMap<SegmentKey, SegmentCounts>>,
}

impl LiveCounts {
    /// The statistics of `searcher`'s live documents.
    pub fn statistics<'a>(&'a self, searcher: &'a Searcher) -> LiveStatistics<'a> {
        LiveStatistics {
            counts: self,
            searcher,
        }
    }

    fn segment(&self, reader: &SegmentReader, field: Field) -> tantivy::Result<SegmentCounts> {
        let key = (reader.segment_id(), reader.delete_opstamp(), field);
        if let Some(counts) = self.lock().get(&key) {
            return Ok(*counts);
        }
        let mut tokens = 0u64;
        if let Some(norms) = reader.fieldnorms_readers().get_field(field)? {
            let alive = reader.alive_bitset();
            for doc in 0..reader.max_doc() {
                if alive.is_none_or(|bits| bits.is_alive(doc)) {
                    tokens += u64::from(norms.fieldnorm(doc));
                }
            }
        }
        let counts = SegmentCounts {
            documents: u64::from(reader.num_docs()),
            tokens,
        };
        self.lock().insert(key, counts);
        Ok(counts)
    }

    /// Forgets the counts of segments `searcher` no longer has (merged away, or with an older
    /// delete opstamp).
    fn retain_current(&self, searcher: &Searcher) {
        let current: Vec<(SegmentId, Option<Opstamp>)> = searcher
            .segment_readers()
            .iter()
            .map(|reader| (reader.segment_id(), reader.delete_opstamp()))
            .collect();
        self.lock()
            .retain(|(segment, opstamp, _), _| current.contains(&(*segment, *opstamp)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SegmentKey, SegmentCounts>> {
        // The map holds plain counts: one left half-updated by a panic is still valid.
        self.segments.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A searcher's BM25 statistics over its live documents (see the module).
pub(crate) struct LiveStatistics<'a> {
    counts: &'a LiveCounts,
    searcher: &'a Searcher,
}

impl LiveStatistics<'_> {
    fn sum(&self, field: Field) -> tantivy::Result<SegmentCounts> {
        let mut total = SegmentCounts {
            documents: 0,
            tokens: 0,
        };
        for reader in self.searcher.segment_readers() {
            let counts = self.counts.segment(reader, field)?;
            total.documents += counts.documents;
            total.tokens += counts.tokens;
        }
        self.counts.retain_current(self.searcher);
        Ok(total)
    }
}

impl Bm25StatisticsProvider for LiveStatistics<'_> {
    fn total_num_tokens(&self, field: Field) -> tantivy::Result<u64> {
        Ok(self.sum(field)?.tokens)
    }

    fn total_num_docs(&self) -> tantivy::Result<u64> {
        Ok(self
            .searcher
            .segment_readers()
            .iter()
            .map(|reader| u64::from(reader.num_docs()))
            .sum())
    }

    fn doc_freq(&self, term: &Term) -> tantivy::Result<u64> {
        let mut total = 0u64;
        for reader in self.searcher.segment_readers() {
            let inverted = reader.inverted_index(term.field())?;
            let Some(alive) = reader.alive_bitset() else {
                total += u64::from(inverted.doc_freq(term)?);
                continue;
            };
            let Some(mut postings) = inverted.read_postings(term, IndexRecordOption::Basic)? else {
                continue;
            };
            let mut doc = postings.doc();
            while doc != TERMINATED {
                if alive.is_alive(doc) {
                    total += 1;
                }
                doc = postings.advance();
            }
        }
        Ok(total)
    }
}
