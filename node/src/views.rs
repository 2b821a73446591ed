//! Answers of the public API built from the actors' results: the wire shape is decided here,
//! at the edge, not by the records' owners. (Request bodies are in `sift-api`.)

use serde::Serialize;
use sift_actors::node::KbState;
use sift_storage::meta::{DocumentCounts, KbRecord};

/// A KB as `GET /v1/kbs/{kb}` shows it: the record's fields, and `documents`, the counts by
/// ingestion status.
#[derive(Clone, Debug, Serialize)]
pub struct KbView {
    #[serde(flatten)]
    pub kb: KbRecord,
    pub documents: DocumentCounts,
}

impl From<KbState> for KbView {
    fn from(state: KbState) -> KbView {
        KbView {
            kb: state.record,
            documents: state.documents,
        }
    }
}

/// `GET /v1/kbs`.
#[derive(Clone, Debug, Serialize)]
pub struct KbList {
    pub kbs: Vec<KbView>,
}

impl From<Vec<KbState>> for KbList {
    fn from(states: Vec<KbState>) -> KbList {
        KbList {
            kbs: states.into_iter().map(KbView::from).collect(),
        }
    }
}
