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
    /// The tenant the key belongs to; the caller's when absent (only an admin of the
    /// default tenant may name another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The document groups the key reads besides open documents (see `access` of a
    /// document); an admin key reads every document of its tenant anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
}

/// `POST /v1/tenants`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// 1 to 64 characters of lowercase letters, digits, `-` and `_`, starting with a letter
    /// or digit; unique.
    pub name: String,
}
