//! Knowledge-base bodies: `POST /v1/kbs` and `PATCH /v1/kbs/{kb}`.

use serde::{Deserialize, Serialize};

/// `POST /v1/kbs`. Unset fields take the defaults of the README's KB settings table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKb {
    /// 1 to 64 of letters, digits, `-`, `_` and `.`, not starting with `.` (and not a UUID).
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
    /// Shards, 1 to 64 (default 2); fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 64)]
    pub shards: Option<u32>,
    /// Copies of each shard on distinct nodes (default: min(3, nodes)); fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub replication_factor: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 8192)]
    pub chunk_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_overlap_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 32768)]
    pub parent_tokens: Option<u32>,
    /// Fixed at creation (default: the embedded model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_text_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_title_field: Option<String>,
    /// OCR of images: `auto` (default), `off`, `vision` or `tesseract`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocr: Option<String>,
    /// Graph extraction: `embedded` (default), `llm` (the node's chat model) or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
    /// Tokens the `llm` graph extractor may spend on this KB on each node (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_token_budget: Option<u64>,
    /// Retrieval settings (fields of `RetrievalSettings`; the others keep their defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrieval: Option<serde_json::Value>,
}

/// `PATCH /v1/kbs/{kb}`: settings that can change without re-indexing. The three fixed at
/// creation are accepted only with the value they already have.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateKb {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 8192)]
    pub chunk_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_overlap_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 32768)]
    pub parent_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_text_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_title_field: Option<String>,
    /// OCR of images: `auto` (default), `off`, `vision` or `tesseract`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocr: Option<String>,
    /// Graph extraction: `embedded` (default), `llm` (the node's chat model) or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
    /// Tokens the `llm` graph extractor may spend on this KB on each node (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_token_budget: Option<u64>,
    /// Refused unless unchanged: fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// Refused unless unchanged: fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<u32>,
    /// Refused unless unchanged: fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_model: Option<String>,
    /// Retrieval settings to change (the others are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrieval: Option<serde_json::Value>,
}

/// The settings both bodies may set, taken out of either so one function applies them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SettingsPatch {
    pub chunk_tokens: Option<u32>,
    pub chunk_overlap_tokens: Option<u32>,
    pub parent_tokens: Option<u32>,
    pub language: Option<String>,
    pub json_text_field: Option<String>,
    pub json_title_field: Option<String>,
    pub ocr: Option<String>,
    pub graph: Option<String>,
    pub graph_token_budget: Option<u64>,
    pub retrieval: Option<serde_json::Value>,
}

/// The [`SettingsPatch`] of a body that has its fields.
macro_rules! settings_patch_of {
    ($body:expr) => {
        SettingsPatch {
            chunk_tokens: $body.chunk_tokens,
            chunk_overlap_tokens: $body.chunk_overlap_tokens,
            parent_tokens: $body.parent_tokens,
            language: $body.language.clone(),
            json_text_field: $body.json_text_field.clone(),
            json_title_field: $body.json_title_field.clone(),
            ocr: $body.ocr.clone(),
            graph: $body.graph.clone(),
            graph_token_budget: $body.graph_token_budget,
            retrieval: $body.retrieval.clone(),
        }
    };
}

impl CreateKb {
    pub fn settings_patch(&self) -> SettingsPatch {
        settings_patch_of!(self)
    }
}

impl UpdateKb {
    pub fn settings_patch(&self) -> SettingsPatch {
        settings_patch_of!(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_setting_is_refused_not_ignored() {
        let error = serde_json::from_str::<CreateKb>(r#"{"name":"a","chunk_token":64}"#)
            .expect_err("unknown field");
        assert!(error.to_string().contains("chunk_token"), "{error}");
    }

    #[test]
    fn unset_settings_are_left_out_when_sent() {
        let body = CreateKb {
            name: "a".into(),
            shards: Some(1),
            ..CreateKb::default()
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({ "name": "a", "shards": 1 })
        );
        let back: CreateKb = serde_json::from_value(serde_json::to_value(&body).unwrap()).unwrap();
        assert_eq!(back, body);
    }

    #[test]
    fn both_bodies_hand_over_the_same_patch() {
        let create: CreateKb = serde_json::from_str(
            r#"{"name":"a","chunk_tokens":64,"language":"zh","retrieval":{"rerank":false}}"#,
        )
        .unwrap();
        let update: UpdateKb = serde_json::from_str(
            r#"{"chunk_tokens":64,"language":"zh","retrieval":{"rerank":false}}"#,
        )
        .unwrap();
        assert_eq!(create.settings_patch(), update.settings_patch());
        assert_eq!(create.settings_patch().chunk_tokens, Some(64));
    }
}
