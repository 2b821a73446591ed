//! API key and tenant bodies: `POST /v1/keys`, `POST /v1/tenants`, `PUT
//! /v1/tenants/{name}/limits` (admins).

use serde::{Deserialize, Serialize};

/// `POST /v1/keys`. The answer carries the new key's full text, once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// 1 to 64 characters of lowercase letters, digits, `-` and `_`, starting with a letter
    /// or digit; unique.
    pub name: String,
}

/// `PUT /v1/tenants/{name}/limits`: a tenant's own limits, replacing those it had. A field
/// that is absent or `null` takes the node-wide setting named beside it.
///
/// The same value is stored in the tenant's record and travels in the Raft log as bincode, so
/// no field may be skipped when serialized (`null` stands for "not set").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    /// Requests per minute all keys of the tenant may make on one node
    /// (`rate_limit_per_tenant`); at least 1.
    #[serde(default)]
    pub rate_limit_per_minute: Option<u32>,
    /// Requests the tenant may make at once on top of its rate
    /// (`rate_limit_burst_per_tenant`); at least 1.
    #[serde(default)]
    pub rate_limit_burst: Option<u32>,
    /// Agent runs one key of the tenant may have in flight on one node (`runs.max_per_key`);
    /// at least 1.
    #[serde(default)]
    pub max_runs_per_key: Option<u32>,
    /// Raw bytes of live documents the tenant's KBs may hold (`max_bytes_per_tenant`).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Documents the tenant's KBs may hold (`max_documents_per_tenant`).
    #[serde(default)]
    pub max_documents: Option<u64>,
    /// Knowledge bases the tenant may own (no node-wide setting: only `max_kbs`, for the
    /// whole cluster, bounds it otherwise).
    #[serde(default)]
    pub max_kbs: Option<u32>,
}

impl TenantLimits {
    /// The first field whose value can never be right, as `(field, why)`.
    pub fn invalid_field(&self) -> Option<(&'static str, &'static str)> {
        let at_least_one = [
            ("rate_limit_per_minute", self.rate_limit_per_minute),
            ("rate_limit_burst", self.rate_limit_burst),
            ("max_runs_per_key", self.max_runs_per_key),
        ];
        at_least_one
            .into_iter()
            .find(|(_, value)| *value == Some(0))
            .map(|(field, _)| {
                (
                    field,
                    "must be at least 1 (leave it out for the node-wide setting)",
                )
            })
            .or_else(|| {
                (self.rate_limit_burst.is_some() && self.rate_limit_per_minute.is_none())
                    .then_some(("rate_limit_burst", "needs rate_limit_per_minute"))
            })
    }
}
