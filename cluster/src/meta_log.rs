//! The metadata log of a single node.

use std::sync::Arc;
use std::time::Instant;

use sift_storage::meta::{MetaOp, MetaOutcome, MetaStateMachine, SledMetaStore};
use tokio::sync::Mutex;

use crate::error::{ClusterError, Result};

/// Applies metadata ops locally, one at a time, in log order. Each op gets the next log index
/// and is durable (flushed) before `propose` returns. This is the seam where Raft goes: the
/// Raft driver will take the same ops, commit them on a quorum and apply them through the same
/// [`MetaStateMachine`].
#[derive(Clone)]
pub struct LocalMeta {
    store: Arc<SledMetaStore>,
    /// Orders proposals: index assignment and apply happen under it.
    order: Arc<Mutex<()>>,
}

impl LocalMeta {
    pub fn new(store: Arc<SledMetaStore>) -> Self {
        LocalMeta {
            store,
            order: Arc::new(Mutex::new(())),
        }
    }

    /// The state machine, for reads.
    pub fn store(&self) -> &Arc<SledMetaStore> {
        &self.store
    }

    /// Commits and applies `op`; returns what applying it produced.
    pub async fn propose(&self, op: MetaOp) -> Result<MetaOutcome> {
        let started = Instant::now();
        let _order = self.order.lock().await;
        let store = self.store.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let index = store.applied_index() + 1;
            store.apply(index, &op)
        })
        .await
        .map_err(|error| ClusterError::Dropped(error.to_string()))?;
        let label = if outcome.is_ok() {
            "applied"
        } else {
            "refused"
        };
        metrics::counter!("sift_meta_proposals_total", "outcome" => label).increment(1);
        metrics::histogram!("sift_meta_apply_seconds").record(started.elapsed().as_secs_f64());
        Ok(outcome?)
    }
}
