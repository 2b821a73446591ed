//! The bounded ingestion queue: admission control for the write path.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::{Result, SiftError};

/// Documents of one KB to ingest together (one upload, or one bulk request).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IngestJob {
    pub kb_id: String,
    pub document_ids: Vec<String>,
    /// How many times a transient error has sent these documents back (see
    /// `worker::retry_later`).
    #[serde(default)]
    pub retries: u32,
}

/// The sending side. A full queue refuses work at once (the API answers 429 with
/// `Retry-After`) instead of buffering without bound.
#[derive(Clone)]
pub struct IngestQueue {
    sender: mpsc::Sender<IngestJob>,
    capacity: usize,
    /// Documents queued or being ingested here: a document found again in the pending-work
    /// index (by the reconciler, or at start-up) is not queued twice.
    claimed: Arc<Mutex<HashSet<String>>>,
}

impl IngestQueue {
    pub fn new(capacity: usize) -> (IngestQueue, mpsc::Receiver<IngestJob>) {
        let (sender, receiver) = mpsc::channel(capacity.max(1));
        (
            IngestQueue {
                sender,
                capacity: capacity.max(1),
                claimed: Arc::default(),
            },
            receiver,
        )
    }

    pub fn try_submit(&self, job: IngestJob) -> Result<()> {
        match self.sender.try_send(job) {
            Ok(()) => {
                self.report_depth();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!("sift_ingest_rejected_total").increment(1);
                Err(SiftError::QueueFull {
                    retry_after_secs: 2,
                })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                Err(SiftError::Internal("the ingestion queue is closed".into()))
            }
        }
    }

    /// Reserves room for `jobs` jobs at once, or refuses with `QueueFull`. Reserving before
    /// registering documents keeps the bound exact under concurrent requests: a request that
    /// got its permits can always enqueue, one that did not registers nothing.
    pub fn try_reserve(&self, jobs: usize) -> Result<mpsc::PermitIterator<'_, IngestJob>> {
        match self.sender.try_reserve_many(jobs) {
            Ok(permits) => Ok(permits),
            Err(mpsc::error::TrySendError::Full(())) => {
                metrics::counter!("sift_ingest_rejected_total").increment(1);
                Err(SiftError::QueueFull {
                    retry_after_secs: 2,
                })
            }
            Err(mpsc::error::TrySendError::Closed(())) => {
                Err(SiftError::Internal("the ingestion queue is closed".into()))
            }
        }
    }

    /// Waits for room; used when resuming unfinished work at start-up.
    pub async fn submit(&self, job: IngestJob) -> Result<()> {
        self.sender
            .send(job)
            .await
            .map_err(|_| SiftError::Internal("the ingestion queue is closed".into()))?;
        self.report_depth();
        Ok(())
    }

    /// Claims the documents not already queued or in progress here; returns those.
    pub fn claim(&self, document_ids: &[String]) -> Vec<String> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        document_ids
            .iter()
            .filter(|id| claimed.insert((*id).clone()))
            .cloned()
            .collect()
    }

    /// Ends claims (the job finished, or could not be queued).
    pub fn release(&self, document_ids: &[String]) {
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        for id in document_ids {
            claimed.remove(id);
        }
    }

    /// Whether a free slot is left (for work found in the background: it never takes the
    /// last slots from uploads).
    pub fn has_room(&self, jobs: usize) -> bool {
        self.sender.capacity() > jobs
    }

    pub fn depth(&self) -> usize {
        self.capacity - self.sender.capacity()
    }

    pub fn report_depth(&self) {
        metrics::gauge!("sift_ingest_queue_depth").set(self.depth() as f64);
    }
}
