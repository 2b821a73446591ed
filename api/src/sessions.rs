//! Session bodies: `POST /v1/sessions` and `POST /v1/sessions/{id}/messages`.

use serde::{Deserialize, Serialize};

/// `POST /v1/sessions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// KB names or ids (at most 16).
    pub kbs: Vec<String>,
    /// Agent preset name; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// `POST /v1/sessions/{id}/messages`: a question; the answer streams back as SSE.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMessage {
    pub content: String,
}
