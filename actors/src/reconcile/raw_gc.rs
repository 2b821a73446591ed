//! Collection of raw bytes that no document on this node needs any more (the document was
//! deleted, or it is ingested and this node holds no replica of its shard).

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Reconciliation;
use crate::ingest::raw_store;

/// How often a node looks for raw bytes it no longer needs.
const RAW_COLLECTION_INTERVAL: Duration = Duration::from_secs(60);
/// Raw bytes younger than this are never collected (their registration may be in flight).
const RAW_GRACE: Duration = Duration::from_secs(600);

impl Reconciliation {
    /// Every [`RAW_COLLECTION_INTERVAL`], once this node's metadata has caught up with the
    /// leader: removes raw bytes older than [`RAW_GRACE`] that no document here needs
    /// ([`raw_store::raw_unneeded`]).
    pub(super) async fn collect_raw_garbage(&mut self) {
        if self
            .last_raw_collection
            .is_some_and(|at| at.elapsed() < RAW_COLLECTION_INTERVAL)
        {
            return;
        }
        self.last_raw_collection = Some(Instant::now());
        if self.context.meta.linearizable_barrier().await.is_err() {
            return;
        }
        let store = self.context.meta.store().clone();
        let local = self.context.access.local_id();
        let collected = self
            .context
            .raw
            .blocking(move |raw| {
                let kbs = store.list_kbs()?;
                let mut removed = raw.remove_stale_parts(RAW_GRACE)?;
                for id in raw.ids()? {
                    if raw_store::id_age(&id).is_none_or(|age| age < RAW_GRACE) {
                        continue;
                    }
                    let mut found = None;
                    for kb in &kbs {
                        if let Some(record) = store.get_document(&kb.id, &id)? {
                            found = Some((kb, record));
                            break;
                        }
                    }
                    if raw_store::raw_unneeded(found.as_ref().map(|(kb, r)| (*kb, r)), local) {
                        raw.remove(&id)?;
                        removed += 1;
                    }
                }
                Ok(removed)
            })
            .await;
        match collected {
            Ok(0) => {}
            Ok(removed) => {
                info!(removed, "raw bytes no longer needed removed");
                metrics::counter!("sift_raw_collected_total").increment(removed as u64);
            }
            Err(error) => warn!(%error, "collecting unneeded raw bytes failed; will retry"),
        }
    }
}
