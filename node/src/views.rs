//! Answers of the public API built from the actors' results: the wire shape is decided here,
//! at the edge, not by the records' owners. (Request bodies are in `sift-api`.)

use serde::Serialize;
use sift_actors::node::KbState;
use sift_storage::meta::{DocumentCounts, KbAccess, KbRecord};

/// A KB as `GET /v1/kbs/{kb}` shows it: the record's fields, `documents` (the counts by
/// ingestion status), its `tenant`, whether the caller reaches it `read_only` (shared by
/// another tenant) and, for its own tenant, the tenants it is `shared_with`.
#[derive(Clone, Debug, Serialize)]
pub struct KbView {
    #[serde(flatten)]
    pub kb: KbRecord,
    pub documents: DocumentCounts,
    pub tenant: String,
    pub read_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_with: Option<Vec<String>>,
}

impl From<KbState> for KbView {
    fn from(state: KbState) -> KbView {
        let owner = state.access == KbAccess::Owner;
        KbView {
            kb: state.record,
            documents: state.documents,
            tenant: state.tenant,
            read_only: !owner,
            shared_with: owner.then_some(state.shared_with),
        }
    }
}

/// `GET /v1/kbs`.
#[derive(Clone, Debug, Serialize)]
pub struct KbList {
    pub kbs: Vec<KbView>,
    /// The `after` of the next page; none on the last.
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
