//! The node's handle on metadata: proposes ops through the cluster layer and publishes the
//! resulting document events.

use std::sync::Arc;

use sift_cluster::LocalMeta;
use sift_cluster::raft::{RaftHandle, ReplicatedMeta};
use sift_storage::meta::{DocStatus, MetaOp, MetaOutcome, SledMetaStore};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::events::DocumentEvent;

/// Where metadata ops go: the local state machine (a single node) or the Raft cluster.
#[derive(Clone)]
enum MetaDoor {
    Local(LocalMeta),
    Replicated(ReplicatedMeta),
}

#[derive(Clone)]
pub struct MetaHandle {
    log: MetaDoor,
    events: broadcast::Sender<DocumentEvent>,
}

impl MetaHandle {
    /// A single node: ops apply to the local store.
    pub fn new(log: LocalMeta) -> Self {
        Self::with_door(MetaDoor::Local(log))
    }

    /// Cluster mode: ops are committed through Raft (forwarded to the leader when this node
    /// is a follower) and applied on every node.
    pub fn replicated(log: ReplicatedMeta) -> Self {
        Self::with_door(MetaDoor::Replicated(log))
    }

    fn with_door(log: MetaDoor) -> Self {
        let (events, _) = broadcast::channel(4096);
        MetaHandle { log, events }
    }

    /// This node's local state machine (on a follower it may lag the leader a little).
    pub fn store(&self) -> &Arc<SledMetaStore> {
        match &self.log {
            MetaDoor::Local(log) => log.store(),
            MetaDoor::Replicated(log) => log.store(),
        }
    }

    /// The Raft node, in cluster mode.
    pub fn raft(&self) -> Option<&RaftHandle> {
        match &self.log {
            MetaDoor::Local(_) => None,
            MetaDoor::Replicated(log) => Some(log.raft()),
        }
    }

    /// Cluster mode: waits until this node has applied everything committed cluster-wide
    /// (ReadIndex), so reads after it are linearizable. A single node is always current.
    pub async fn linearizable_barrier(&self) -> Result<()> {
        match &self.log {
            MetaDoor::Local(_) => Ok(()),
            MetaDoor::Replicated(log) => Ok(log.linearizable_barrier().await?),
        }
    }

    pub fn is_replicated(&self) -> bool {
        matches!(self.log, MetaDoor::Replicated(_))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<DocumentEvent> {
        self.events.subscribe()
    }

    pub async fn propose(&self, op: MetaOp) -> Result<MetaOutcome> {
        let kb_id = match &op {
            MetaOp::DeleteDocument { kb_id, .. }
            | MetaOp::RegisterDocuments { kb_id, .. }
            | MetaOp::RegisterDocumentsTo { kb_id, .. } => Some(kb_id.clone()),
            _ => None,
        };
        let outcome = match &self.log {
            MetaDoor::Local(log) => log.propose(op).await?,
            MetaDoor::Replicated(log) => {
                let outcome = log.propose(op).await?;
                // Read your writes: a follower's answer came from the leader; wait until the
                // op is applied here too, since this node's next steps (an ingestion job, a
                // read) look it up locally.
                let status = log.raft().status();
                if status.leader != Some(status.id)
                    && let Err(error) = log.linearizable_barrier().await
                {
                    tracing::warn!(%error, "applied on the leader, not yet confirmed here");
                }
                outcome
            }
        };
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
            pages_needing_ocr: 0,
            ocr_pages: None,
            parse_pages: None,
            embedded_chunks: None,
        });
    }

    /// Tells subscribers how a stage that goes page by page is getting on (no metadata
    /// changes: the event is this node's own).
    pub fn send_progress(&self, event: DocumentEvent) {
        let _ = self.events.send(event);
    }
}
