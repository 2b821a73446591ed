//! The node's handle on metadata: proposes ops through the cluster layer and publishes the
//! resulting document events.

use std::sync::Arc;

use sift_cluster::LocalMeta;
use sift_storage::meta::{MetaOp, MetaOutcome, SledMetaStore};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::events::DocumentEvent;

#[derive(Clone)]
pub struct MetaHandle {
    log: LocalMeta,
    events: broadcast::Sender<DocumentEvent>,
}

impl MetaHandle {
    pub fn new(log: LocalMeta) -> Self {
        let (events, _) = broadcast::channel(4096);
        MetaHandle { log, events }
    }

    pub fn store(&self) -> &Arc<SledMetaStore> {
        self.log.store()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DocumentEvent> {
        self.events.subscribe()
    }

    pub async fn propose(&self, op: MetaOp) -> Result<MetaOutcome> {
        let kb_id = match &op {
            MetaOp::DeleteDocument { kb_id, .. } => Some(kb_id.clone()),
            _ => None,
        };
        let outcome = self.log.propose(op).await?;
        match &outcome {
            MetaOutcome::Statuses(records) => {
                for record in records {
                    let _ = self.events.send(DocumentEvent::from_record(record));
                }
            }
            MetaOutcome::Registered(registered) => {
                for entry in registered.iter().filter(|entry| !entry.duplicate) {
                    let _ = self.events.send(DocumentEvent::from_record(&entry.record));
                }
            }
            MetaOutcome::DocumentDeleted(tombstone) => {
                let _ = self.events.send(DocumentEvent {
                    kb_id: kb_id.unwrap_or_default(),
                    document_id: tombstone.document_id.clone(),
                    status: sift_storage::meta::DocStatus::Failed,
                    error: Some("document deleted".into()),
                    chunk_count: 0,
                    progress: 1.0,
                    deleted: true,
                });
            }
            _ => {}
        }
        Ok(outcome)
    }
}
