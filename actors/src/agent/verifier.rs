//! The evidence verifier (as in the Mnemo seed): decides which retrieved chunks count as
//! evidence for the question.
//!
//! A hit is valid evidence when all three checks pass:
//! 1. its relevance is at least `min_score`;
//! 2. it covers at least `min_coverage` of the query terms, a requirement relaxed (halved)
//!    for hits scoring `high_score` or more, since dense retrieval finds paraphrases that share
//!    no words with the query;
//! 3. its text has at least `min_chars` characters (bare titles and navigation are not
//!    evidence, however well they score).
//!
//! The verdict's score weighs relevance and coverage.

use serde::{Deserialize, Serialize};

use super::terms::coverage;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifierConfig {
    pub min_score: f64,
    pub high_score: f64,
    pub min_coverage: f64,
    pub min_chars: usize,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            min_score: 0.2,
            high_score: 0.5,
            min_coverage: 0.3,
            min_chars: 50,
        }
    }
}

/// What the verifier needs of one hit.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub chunk_id: &'a str,
    /// Relevance in [0, 1] (see `tools::relevance`).
    pub relevance: f64,
    pub text: &'a str,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub chunk_id: String,
    pub valid: bool,
    pub relevance: f64,
    pub coverage: f64,
    /// `0.7 * relevance + 0.3 * coverage` for valid hits, 0 otherwise.
    pub score: f64,
    /// Why it was rejected.
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct EvidenceVerifier {
    pub config: VerifierConfig,
}

impl EvidenceVerifier {
    pub fn new(config: VerifierConfig) -> Self {
        EvidenceVerifier { config }
    }

    pub fn verify(&self, query_terms: &[String], candidate: &Candidate<'_>) -> Verdict {
        let config = &self.config;
        let coverage = coverage(query_terms, candidate.text);
        let required = if candidate.relevance >= config.high_score {
            config.min_coverage / 2.0
        } else {
            config.min_coverage
        };
        let length = candidate.text.trim().chars().count();
        let reason = if candidate.relevance < config.min_score {
            Some(format!(
                "relevance {:.2} below {:.2}",
                candidate.relevance, config.min_score
            ))
        } else if coverage < required {
            Some(format!(
                "covers {:.0}% of the query terms, needs {:.0}%",
                coverage * 100.0,
                required * 100.0
            ))
        } else if length < config.min_chars {
            Some(format!(
                "only {length} characters (needs {})",
                config.min_chars
            ))
        } else {
            None
        };
        let valid = reason.is_none();
        Verdict {
            chunk_id: candidate.chunk_id.to_string(),
            valid,
            relevance: candidate.relevance,
            coverage,
            score: if valid {
                0.7 * candidate.relevance + 0.3 * coverage
            } else {
                0.0
            },
            reason,
        }
    }

    pub fn verify_all(&self, query_terms: &[String], candidates: &[Candidate<'_>]) -> Vec<Verdict> {
        candidates
            .iter()
            .map(|candidate| self.verify(query_terms, candidate))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::terms::terms;

    const LONG: &str = "The boiling point of water at sea level is 100 degrees Celsius, \
                        which is 212 degrees Fahrenheit.";

    fn verdict(query: &str, relevance: f64, text: &str) -> Verdict {
        EvidenceVerifier::default().verify(
            &terms(query),
            &Candidate {
                chunk_id: "d#0",
                relevance,
                text,
            },
        )
    }

    #[test]
    fn accepts_relevant_covering_long_hits() {
        let v = verdict("boiling point of water", 0.4, LONG);
        assert!(v.valid, "{v:?}");
        assert!((v.score - (0.7 * 0.4 + 0.3 * 1.0)).abs() < 1e-9);
    }

    #[test]
    fn rejects_low_scores() {
        let v = verdict("boiling point of water", 0.1, LONG);
        assert!(!v.valid);
        assert!(v.reason.unwrap().contains("relevance"));
    }

    #[test]
    fn coverage_threshold_is_relaxed_for_high_scores() {
        // 1 of 4 terms = 25%: below 30% at a middling score, enough (>= 15%) at a high one.
        let query = "water freezing pressure altitude";
        let middling = verdict(query, 0.4, LONG);
        assert!(!middling.valid);
        assert!(middling.reason.unwrap().contains("query terms"));
        assert!(verdict(query, 0.55, LONG).valid);
    }

    #[test]
    fn rejects_short_text_even_when_it_scores_high() {
        let v = verdict("boiling point of water", 0.9, "Boiling point of water");
        assert!(!v.valid);
        assert!(v.reason.unwrap().contains("characters"));
    }
}
