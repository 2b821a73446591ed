//! API key bodies: `POST /v1/keys` (admins).

use serde::{Deserialize, Serialize};

/// `POST /v1/keys`. The answer carries the new key's full text, once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewApiKey {
    /// For people: what or who the key is for.
    pub name: String,
    /// `admin`, `editor` or `reader`.
    pub role: String,
    /// Refused from this time on (Unix milliseconds); never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}
