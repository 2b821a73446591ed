//! The wire types of Sift's public HTTP API (`/v1/...`): serde, and `utoipa::ToSchema` for
//! their schemas in the node's OpenAPI document (`GET /v1/openapi.json`).
//!
//! The node deserializes request bodies into these types at the edge and hands them to the
//! actors' operations; [`sift-client`](../sift_client/index.html), `sift-bench` and the tests
//! serialize the same types, so a renamed field breaks the build rather than a request.
//! Request bodies refuse unknown fields: a misspelt setting is a `400 invalid_request`, not a
//! silently ignored one. Optional fields are left out when serialized, so "not set" and
//! "set to the default" stay distinct.
//!
//! Answers are built by the node from stored records and are not here: their shape is the
//! record's serialization (`KbRecord`, `DocumentRecord`, ...), documented in the README's API
//! section.

pub mod documents;
pub mod error;
pub mod kbs;
pub mod keys;
pub mod search;
pub mod sessions;
pub mod snapshots;

pub use self::documents::{
    AddedDocument, BulkDocuments, DocumentAccess, NewTextDocument, NewUrlDocument,
};
pub use self::error::{ErrorBody, ErrorDetail, error_type};
pub use self::kbs::{CreateKb, SettingsPatch, UpdateKb};
pub use self::keys::{NewApiKey, NewTenant, TenantLimits};
pub use self::search::{ChannelWeights, PageRange, SearchFilters, SearchQuery};
pub use self::sessions::{NewMessage, NewSession};
pub use self::snapshots::CreateSnapshot;

/// A JSON object: document metadata, metadata filters.
pub type JsonMap = serde_json::Map<String, serde_json::Value>;
