//! Answers of the public API built from the actors' results: the wire shape is decided here,
//! at the edge, not by the records' owners. (Request bodies are in `sift-api`.) Each answer
//! derives `utoipa::ToSchema`: the OpenAPI document describes it from this code.

use serde::Serialize;
use sift_actors::node::KbState;
use sift_actors::node::ShardView;
use sift_actors::sessions::TurnView;
use sift_storage::backup::Manifest;
use sift_storage::chunk::ChunkView;
use sift_storage::meta::{
    AuditEntry, DocumentCounts, DocumentRecord, KbAccess, KbRecord, SessionRecord, TenantRecord,
};
use utoipa::ToSchema;

/// A KB as `GET /v1/kbs/{kb}` shows it: the record's fields, `documents` (the counts by
/// ingestion status), its size (`chunks`, `stored_bytes`), its `tenant`, whether the caller
/// reaches it `read_only` (shared by another tenant) and, for its own tenant, the tenants it
/// is `shared_with`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct KbView {
    #[serde(flatten)]
    pub kb: KbRecord,
    pub documents: DocumentCounts,
    /// The chunks of the documents counted in `documents`.
    #[schema(minimum = 0)]
    pub chunks: u64,
    /// The raw bytes of the KB's live documents as they were added (what tenant quotas
    /// count), from per-shard counters; `null` for a key restricted to document groups (they
    /// include documents it may not read).
    #[schema(minimum = 0)]
    pub stored_bytes: Option<u64>,
    pub tenant: String,
    pub read_only: bool,
    /// Absent when the caller's tenant does not own the KB.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub shared_with: Option<Vec<String>>,
}

impl From<KbState> for KbView {
    fn from(state: KbState) -> KbView {
        let owner = state.access == KbAccess::Owner;
        KbView {
            kb: state.record,
            documents: state.documents,
            chunks: state.chunks,
            stored_bytes: state.stored_bytes,
            tenant: state.tenant,
            read_only: !owner,
            shared_with: owner.then_some(state.shared_with),
        }
    }
}

/// `GET /v1/kbs`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct KbList {
    pub kbs: Vec<KbView>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

impl KbList {
    pub fn new(states: Vec<KbState>, next_after: Option<String>) -> KbList {
        KbList {
            kbs: states.into_iter().map(KbView::from).collect(),
            next_after,
        }
    }
}

/// `POST /v1/kbs/{kb}/documents` (202): the documents registered, in request order (one for
/// an upload).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct AddedDocuments {
    pub documents: Vec<sift_api::AddedDocument>,
}

/// `GET /v1/kbs/{kb}/documents`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct DocumentList {
    pub documents: Vec<DocumentRecord>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

/// `GET /v1/kbs/{kb}/documents/{doc}`: the record, and where its graph stands.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct DocumentView {
    #[serde(flatten)]
    pub record: sift_storage::meta::DocumentRecord,
    /// A ready document's entity graph (ADR 0037): `pending` while its entities are being
    /// extracted (it is searchable by the other channels meanwhile), `ready`, `failed` (the
    /// extractor gave up: `graph_error` says why, and the embedded extractor's entities
    /// stand in), or `off` in a KB without a graph; absent before the document is ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub graph: Option<&'static str>,
    /// Why the graph extraction failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_error: Option<String>,
}

/// `GET /v1/kbs/{kb}/documents/{doc}/chunks`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChunkList {
    pub chunks: Vec<ChunkView>,
}

/// `GET /v1/kbs/{kb}/shards`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ShardList {
    pub shards: Vec<ShardView>,
}

/// `GET /v1/sessions`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionRecord>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

/// `GET /v1/sessions/{id}/messages`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessageList {
    pub messages: Vec<TurnView>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

/// `GET /v1/tenants`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantRecord>,
}

/// `GET /v1/audit`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct AuditList {
    pub entries: Vec<AuditEntry>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

/// A snapshot as the API shows it: its manifest, its size and where it is on the node.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SnapshotView {
    pub id: String,
    pub created_at_ms: u64,
    /// The bytes of its files.
    pub bytes: u64,
    /// Its directory on `node`.
    #[schema(value_type = String)]
    pub path: std::path::PathBuf,
    /// The public address of the node that holds it.
    pub node: String,
    pub manifest: Manifest,
}

/// `GET /v1/snapshots`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
    /// The `after` of the next page; `null` on the last.
    pub next_after: Option<String>,
}

/// `GET /healthz`.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(value_type = String, pattern = "^ok$")]
    pub status: &'static str,
}

/// `GET /readyz` when every check passes (the 503 adds `error` to the same fields).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    #[schema(value_type = String)]
    pub status: &'static str,
    pub checks: Vec<sift_actors::node::ready::Check>,
    /// The embedded embedding model's name, `null` when it did not load.
    pub embedded_model: Option<String>,
    /// Why the embedded model did not load.
    pub embedded_model_error: Option<String>,
    /// The configured remote embedding models.
    pub remote_embedders: Vec<String>,
    /// Shards open on this node.
    pub shards: usize,
    pub ingest_queue_depth: usize,
    /// The auth mode.
    #[schema(value_type = String)]
    pub auth: &'static str,
}

/// `DELETE /v1/cluster/nodes/{id}` (202): the member holds replicas; they are re-created on
/// other nodes, then it is removed.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct NodeDraining {
    pub draining: u64,
    pub replicas: usize,
    pub message: String,
}

/// `DELETE /v1/cluster/nodes/{id}` (200): removed; the voters and learners after.
#[derive(Clone, Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct NodeRemoved {
    pub removed: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}
