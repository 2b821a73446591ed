//! Checks of per-KB retrieval settings ([`RetrievalSettings`], stored in `KbSettings`) and of
//! a request's overrides, with one error code per mistake.

use sift_storage::meta::RetrievalSettings;

use super::fusion::FusionMethod;
use super::rerank::{EMBEDDED_RERANKER, RerankServices};
use crate::error::{Result, SiftError};

/// Largest packed context, in tokens.
pub const MAX_CONTEXT_TOKENS: u32 = 131_072;
/// Most neighbour chunks on each side of a hit.
pub const MAX_NEIGHBOURS: u32 = 5;
/// Top documents read for links, and links moved up behind each.
pub const MAX_LINK_FROM: u32 = 20;
pub const MAX_LINKS_PER_HIT: u32 = 10;
/// Most candidates per channel, and most hits handed to a reranker.
pub const MAX_CANDIDATES: u32 = 1000;

/// Checks `settings`; `rerankers` are the configured external services.
pub fn validate(settings: &RetrievalSettings, rerankers: &RerankServices) -> Result<()> {
    let invalid = |code: &'static str, message: String| Err(SiftError::invalid(code, message));
    for (name, weight) in [
        ("dense_weight", settings.dense_weight),
        ("bm25_weight", settings.bm25_weight),
    ] {
        if !weight.is_finite() || weight < 0.0 {
            return invalid(
                "invalid_weights",
                format!("{name} must be a finite number >= 0, not {weight}"),
            );
        }
    }
    if !settings.graph_weight.is_finite() || settings.graph_weight < 0.0 {
        return invalid(
            "invalid_weights",
            format!(
                "graph_weight must be a finite number >= 0, not {}",
                settings.graph_weight
            ),
        );
    }
    if !(1..=super::graph::MAX_HOPS).contains(&settings.graph_hops) {
        return invalid(
            "invalid_graph_hops",
            format!(
                "graph_hops must be between 1 and {}, not {}",
                super::graph::MAX_HOPS,
                settings.graph_hops
            ),
        );
    }
    if settings.dense_weight == 0.0 && settings.bm25_weight == 0.0 {
        return invalid(
            "invalid_weights",
            "dense_weight and bm25_weight are both 0: no channel would count".into(),
        );
    }
    if FusionMethod::parse(&settings.fusion).is_none() {
        return invalid(
            "invalid_fusion",
            format!("unknown fusion {:?}; use rrf or dbsf", settings.fusion),
        );
    }
    if !(settings.rrf_k.is_finite() && settings.rrf_k >= 1.0) {
        return invalid("invalid_rrf_k", "rrf_k must be >= 1".into());
    }
    if !(1..=MAX_CANDIDATES).contains(&settings.candidates) {
        return invalid(
            "invalid_candidates",
            format!("candidates must be between 1 and {MAX_CANDIDATES}"),
        );
    }
    if !(0.0..=1.0).contains(&settings.min_relative_score) {
        return invalid(
            "invalid_min_relative_score",
            "min_relative_score must be between 0 and 1".into(),
        );
    }
    if settings.rerank_model != EMBEDDED_RERANKER && !rerankers.contains(&settings.rerank_model) {
        return invalid(
            "unknown_rerank_model",
            format!(
                "rerank_model {:?} is neither {EMBEDDED_RERANKER:?} nor a configured [rerank.NAME] service",
                settings.rerank_model
            ),
        );
    }
    if !(1..=MAX_CANDIDATES).contains(&settings.rerank_depth) {
        return invalid(
            "invalid_rerank_depth",
            format!("rerank_depth must be between 1 and {MAX_CANDIDATES}"),
        );
    }
    if !(0.0..=1.0).contains(&settings.mmr_lambda) {
        return invalid(
            "invalid_mmr_lambda",
            "mmr_lambda must be between 0 and 1".into(),
        );
    }
    if !(settings.duplicate_similarity > 0.0 && settings.duplicate_similarity <= 2.0) {
        return invalid(
            "invalid_duplicate_similarity",
            "duplicate_similarity must be in (0, 1], or above 1 to never collapse".into(),
        );
    }
    if settings.expand_neighbours > MAX_NEIGHBOURS {
        return invalid(
            "invalid_expansion",
            format!("expand_neighbours must be at most {MAX_NEIGHBOURS}"),
        );
    }
    if settings.context_tokens > MAX_CONTEXT_TOKENS {
        return invalid(
            "invalid_context_tokens",
            format!("context_tokens must be at most {MAX_CONTEXT_TOKENS}"),
        );
    }
    if settings.link_from > MAX_LINK_FROM || settings.links_per_hit > MAX_LINKS_PER_HIT {
        return invalid(
            "invalid_links",
            format!(
                "link_from must be at most {MAX_LINK_FROM} and links_per_hit at most {MAX_LINKS_PER_HIT}"
            ),
        );
    }
    Ok(())
}

/// Applies a JSON object of retrieval fields onto `settings` (unknown fields are refused),
/// then checks the result.
pub fn merge_patch(
    settings: &RetrievalSettings,
    patch: &serde_json::Value,
    rerankers: &RerankServices,
) -> Result<RetrievalSettings> {
    let serde_json::Value::Object(fields) = patch else {
        return Err(SiftError::invalid(
            "invalid_retrieval_settings",
            "retrieval must be a JSON object",
        ));
    };
    let mut merged = serde_json::to_value(settings)
        .map_err(|e| SiftError::Internal(format!("retrieval settings: {e}")))?;
    if let serde_json::Value::Object(current) = &mut merged {
        for (key, value) in fields {
            current.insert(key.clone(), value.clone());
        }
    }
    let merged: RetrievalSettings = serde_json::from_value(merged)
        .map_err(|e| SiftError::invalid("invalid_retrieval_settings", format!("retrieval: {e}")))?;
    validate(&merged, rerankers)?;
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_mistakes_have_codes() {
        let none = RerankServices::default();
        let defaults = RetrievalSettings::default();
        validate(&defaults, &none).unwrap();
        let code =
            |patch: serde_json::Value| merge_patch(&defaults, &patch, &none).unwrap_err().code();
        assert_eq!(
            code(serde_json::json!({ "dense_weight": -1.0 })),
            "invalid_weights"
        );
        assert_eq!(
            code(serde_json::json!({ "dense_weight": 0.0, "bm25_weight": 0.0 })),
            "invalid_weights"
        );
        assert_eq!(
            code(serde_json::json!({ "fusion": "max" })),
            "invalid_fusion"
        );
        assert_eq!(
            code(serde_json::json!({ "rerank_model": "nope" })),
            "unknown_rerank_model"
        );
        assert_eq!(
            code(serde_json::json!({ "colour": 1 })),
            "invalid_retrieval_settings"
        );
        assert_eq!(
            code(serde_json::json!({ "mmr_lambda": 2.0 })),
            "invalid_mmr_lambda"
        );
        assert_eq!(
            code(serde_json::json!({ "link_from": 21 })),
            "invalid_links"
        );
        assert_eq!(
            code(serde_json::json!({ "links_per_hit": 11 })),
            "invalid_links"
        );
        let merged =
            merge_patch(&defaults, &serde_json::json!({ "bm25_weight": 2.0 }), &none).unwrap();
        assert_eq!(merged.bm25_weight, 2.0);
        assert_eq!(merged.dense_weight, 1.0);
    }
}
