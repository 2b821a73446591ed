//! The reflector (as in the Mnemo seed): after each retrieval, judges whether the evidence
//! gathered so far suffices, and if not, says what to do next. Its verdict is appended to the
//! retrieval's observation so the model reads it before its next step.
//!
//! Sufficient when: at least `min_evidence` valid hits, the best scoring at least
//! `min_top_score`, and the valid evidence together covering at least `min_coverage` of the
//! query terms. Also reported: weak discrimination (the first and third best within
//! `min_spread`), and stagnation (two rounds in a row without new valid evidence), which
//! calls for a different strategy rather than the same query again. At most
//! `max_retrievals` retrievals per turn; past that the model is told to answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::terms::missing_terms;
use super::verifier::Verdict;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReflectorConfig {
    pub min_evidence: usize,
    pub min_top_score: f64,
    pub min_coverage: f64,
    pub min_spread: f64,
    pub stagnation_rounds: u32,
    pub max_retrievals: u32,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        ReflectorConfig {
            min_evidence: 3,
            min_top_score: 0.6,
            min_coverage: 0.3,
            min_spread: 0.02,
            stagnation_rounds: 2,
            max_retrievals: 5,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reflection {
    pub sufficient: bool,
    pub valid_evidence: usize,
    pub top_score: f64,
    pub coverage: f64,
    pub stagnant: bool,
    pub limit_reached: bool,
    pub missing_terms: Vec<String>,
    pub suggestions: Vec<String>,
}

impl Reflection {
    /// The verdict as the model reads it.
    pub fn render(&self) -> String {
        let mut out = format!(
            "[reflector] {} valid evidence chunk(s) so far, best score {:.2}, query-term coverage {:.0}%: {}.",
            self.valid_evidence,
            self.top_score,
            self.coverage * 100.0,
            if self.sufficient {
                "evidence looks sufficient; read the best chunks if needed, then call final_answer"
            } else {
                "evidence is not sufficient yet"
            }
        );
        for suggestion in &self.suggestions {
            out.push_str("\n- ");
            out.push_str(suggestion);
        }
        out
    }
}

/// Reflection state over one turn.
#[derive(Clone, Debug, Default)]
pub struct Reflector {
    pub config: ReflectorConfig,
    /// Best verdict per valid chunk.
    valid: BTreeMap<String, Verdict>,
    /// Valid texts, for coverage of the union.
    valid_text: BTreeMap<String, String>,
    retrievals: u32,
    rounds_without_growth: u32,
}

impl Reflector {
    pub fn new(config: ReflectorConfig) -> Self {
        Reflector {
            config,
            ..Reflector::default()
        }
    }

    pub fn retrievals(&self) -> u32 {
        self.retrievals
    }

    /// True when another retrieval is allowed this turn.
    pub fn may_retrieve(&self) -> bool {
        self.retrievals < self.config.max_retrievals
    }

    /// Records one retrieval round: the verdicts of its hits and their texts by chunk id.
    pub fn observe<'a>(
        &mut self,
        query_terms: &[String],
        verdicts: &[Verdict],
        text_of: impl Fn(&str) -> Option<&'a str>,
    ) -> Reflection {
        self.retrievals += 1;
        let before = self.valid.len();
        for verdict in verdicts.iter().filter(|v| v.valid) {
            let better = self
                .valid
                .get(&verdict.chunk_id)
                .is_none_or(|known| known.score < verdict.score);
            if better {
                self.valid.insert(verdict.chunk_id.clone(), verdict.clone());
                if let Some(text) = text_of(&verdict.chunk_id) {
                    self.valid_text
                        .insert(verdict.chunk_id.clone(), text.to_string());
                }
            }
        }
        if self.valid.len() > before {
            self.rounds_without_growth = 0;
        } else {
            self.rounds_without_growth += 1;
        }
        self.reflect(query_terms)
    }

    fn reflect(&self, query_terms: &[String]) -> Reflection {
        let config = &self.config;
        let mut scores: Vec<f64> = self.valid.values().map(|v| v.score).collect();
        scores.sort_by(|a, b| b.total_cmp(a));
        let top_score = scores.first().copied().unwrap_or(0.0);
        let union: String = self
            .valid_text
            .values()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n");
        let missing = missing_terms(query_terms, &union);
        let coverage = if query_terms.is_empty() {
            1.0
        } else {
            1.0 - missing.len() as f64 / query_terms.len() as f64
        };
        let stagnant = self.rounds_without_growth >= config.stagnation_rounds;
        let limit_reached = self.retrievals >= config.max_retrievals;
        let sufficient = scores.len() >= config.min_evidence
            && top_score >= config.min_top_score
            && coverage >= config.min_coverage;
        let mut suggestions = Vec::new();
        if limit_reached {
            suggestions.push(format!(
                "The retrieval limit ({} per turn) is reached: answer now with final_answer from the evidence you have, and say what is missing.",
                config.max_retrievals
            ));
        } else if !sufficient {
            if stagnant {
                suggestions.push(format!(
                    "Retrieval is stagnating ({} rounds without new evidence): change strategy instead of repeating the query: use different keywords or synonyms, grep_chunks for an exact term, or read_chunk around the best hit.",
                    self.rounds_without_growth
                ));
            }
            if coverage < config.min_coverage && !missing.is_empty() {
                suggestions.push(format!(
                    "Not yet covered: {}. Search for these terms specifically.",
                    missing
                        .iter()
                        .take(8)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if scores.len() < config.min_evidence {
                suggestions.push(format!(
                    "Only {} valid chunk(s); {} are wanted. Try a rephrased or narrower query.",
                    scores.len(),
                    config.min_evidence
                ));
            } else if top_score < config.min_top_score {
                suggestions.push(format!(
                    "The best evidence scores {top_score:.2} (< {:.2}): try a more specific query.",
                    config.min_top_score
                ));
            }
        }
        if scores.len() >= 3 && scores[0] - scores[2] < config.min_spread {
            suggestions.push(
                "The top results score almost the same: they may be equally weak; read them before relying on one."
                    .into(),
            );
        }
        Reflection {
            sufficient,
            valid_evidence: scores.len(),
            top_score,
            coverage,
            stagnant,
            limit_reached,
            missing_terms: missing,
            suggestions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::terms::terms;

    fn valid(id: &str, score: f64) -> Verdict {
        Verdict {
            chunk_id: id.into(),
            valid: true,
            relevance: score,
            coverage: 1.0,
            score,
            reason: None,
        }
    }

    const TEXT: &str = "the raft leader replicates log entries to followers";

    #[test]
    fn sufficient_with_three_strong_covering_hits() {
        let query = terms("raft leader log replication");
        let mut reflector = Reflector::default();
        let reflection = reflector.observe(
            &query,
            &[valid("a", 0.8), valid("b", 0.7), valid("c", 0.65)],
            |_| Some(TEXT),
        );
        assert!(reflection.sufficient, "{reflection:?}");
        assert!(reflection.render().contains("sufficient"));
    }

    #[test]
    fn too_few_or_weak_hits_are_insufficient_with_suggestions() {
        let query = terms("raft leader election timeout");
        let mut reflector = Reflector::default();
        let reflection = reflector.observe(&query, &[valid("a", 0.5)], |_| Some("unrelated words"));
        assert!(!reflection.sufficient);
        assert!(reflection.coverage < 0.3);
        assert!(reflection.missing_terms.contains(&"election".to_string()));
        let text = reflection.render();
        assert!(text.contains("Not yet covered"), "{text}");
        assert!(text.contains("Only 1 valid"), "{text}");
    }

    #[test]
    fn stagnation_after_two_rounds_without_new_evidence() {
        let query = terms("raft leader");
        let mut reflector = Reflector::default();
        assert!(
            !reflector
                .observe(&query, &[valid("a", 0.5)], |_| Some(TEXT))
                .stagnant
        );
        assert!(
            !reflector
                .observe(&query, &[valid("a", 0.5)], |_| Some(TEXT))
                .stagnant
        );
        let third = reflector.observe(&query, &[valid("a", 0.4)], |_| Some(TEXT));
        assert!(third.stagnant);
        assert!(third.render().contains("change strategy"));
        // New evidence resets it.
        assert!(
            !reflector
                .observe(&query, &[valid("b", 0.5)], |_| Some(TEXT))
                .stagnant
        );
    }

    #[test]
    fn at_most_five_retrievals() {
        let query = terms("anything");
        let mut reflector = Reflector::default();
        for round in 0..5 {
            assert!(reflector.may_retrieve(), "round {round}");
            reflector.observe(&query, &[], |_| None);
        }
        assert!(!reflector.may_retrieve());
        assert!(reflector.reflect(&query).limit_reached);
        assert!(
            reflector
                .reflect(&query)
                .render()
                .contains("retrieval limit")
        );
    }
}
