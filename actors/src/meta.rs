//! The node's handle on metadata: proposes ops through the cluster layer and publishes the
//! resulting document events.

use std::sync::Arc;

use sift_cluster::LocalMeta;
use sift_storage::meta::{DocStatus, MetaOp, MetaOutcome, SledMetaStore};
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
            MetaOp::DeleteDocument { kb_id, .. } | MetaOp::RegisterDocuments { kb_id, .. } => {
                Some(kb_id.clone())
            }
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
                for entry in registered {
                    if !entry.duplicate {
                        let _ = self.events.send(DocumentEvent::from_record(&entry.record));
                    }
                    if let Some(replaced) = &entry.replaced {
                        self.send_deleted(
                            kb_id.as_deref().unwrap_or_default(),
                            &replaced.document_id,
                        );
                    }
                }
            }
            MetaOutcome::DocumentDeleted(tombstone) => {
                self.send_deleted(kb_id.as_deref().unwrap_or_default(), &tombstone.document_id);
            }
            MetaOutcome::KbDeleted { kb, documents } => {
                for tombstone in documents {
                    self.send_deleted(&kb.id, &tombstone.document_id);
                }
            }
            _ => {}
        }
        Ok(outcome)
    }

    /// Tells subscribers a document is gone: its event stream ends.
    fn send_deleted(&self, kb_id: &str, document_id: &str) {
        let _ = self.events.send(DocumentEvent {
            kb_id: kb_id.to_string(),
            document_id: document_id.to_string(),
            status: DocStatus::Failed,
            error: Some("document deleted".into()),
            chunk_count: 0,
            progress: 1.0,
            deleted: true,
        });
    }
}
