//! Snapshots (`/v1/snapshots`, for operators).

use serde::{Deserialize, Serialize};

/// `POST /v1/snapshots`: the knowledge bases to snapshot, by id (any tenant's) or by name (the
/// default tenant's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    pub kbs: Vec<String>,
}
