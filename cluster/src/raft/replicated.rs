//! The metadata door of a node in a Raft cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sift_storage::meta::{MetaOp, MetaOutcome, SledMetaStore};

use super::driver::RaftHandle;
use super::state_machine::Proposal;
use crate::error::{ClusterError, Result};
use crate::transport::HttpTransport;

/// Proposes metadata ops from any node: on the leader through its Raft thread, on a follower by
/// forwarding to the leader over the internal transport. Retryable failures (no leader yet,
/// leadership changed, the leader unreachable) are retried with the same op id until
/// `timeout`, so an op applies at most once however often it is retried. Same contract as
/// [`crate::LocalMeta::propose`]: the answer is what applying the op produced.
#[derive(Clone)]
pub struct ReplicatedMeta {
    raft: RaftHandle,
    store: Arc<SledMetaStore>,
    forwarder: Option<HttpTransport>,
    timeout: Duration,
}

impl ReplicatedMeta {
    /// `forwarder` is this node's transport; without one only the leader accepts proposals.
    pub fn new(
        raft: RaftHandle,
        store: Arc<SledMetaStore>,
        forwarder: Option<HttpTransport>,
        timeout: Duration,
    ) -> Self {
        ReplicatedMeta {
            raft,
            store,
            forwarder,
            timeout,
        }
    }

    /// The local state machine, for reads (possibly stale on a follower: see
    /// [`Self::linearizable_barrier`]).
    pub fn store(&self) -> &Arc<SledMetaStore> {
        &self.store
    }

    pub fn raft(&self) -> &RaftHandle {
        &self.raft
    }

    /// Commits and applies `op` under a fresh op id.
    pub async fn propose(&self, op: MetaOp) -> Result<MetaOutcome> {
        self.propose_proposal(Proposal::new(op)).await
    }

    /// Commits and applies `proposal`, retrying retryable failures until the timeout.
    pub async fn propose_proposal(&self, proposal: Proposal) -> Result<MetaOutcome> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            let attempt = match self.raft.propose_proposal(proposal.clone()).await {
                Err(ClusterError::NotLeader {
                    leader: Some(leader),
                }) if leader != self.raft.id() => match &self.forwarder {
                    Some(forwarder) => forwarder.forward(leader, &proposal).await,
                    None => Err(ClusterError::NotLeader {
                        leader: Some(leader),
                    }),
                },
                other => other,
            };
            match attempt {
                Err(error) if error.is_transient() && Instant::now() + backoff < deadline => {
                    tracing::debug!(%error, "proposal will be retried");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                other => {
                    let label = match &other {
                        Ok(_) => "applied",
                        Err(error) if error.is_transient() => "gave_up",
                        Err(_) => "refused",
                    };
                    metrics::counter!("sift_meta_proposals_total", "outcome" => label).increment(1);
                    metrics::histogram!("sift_meta_apply_seconds")
                        .record(started.elapsed().as_secs_f64());
                    return other;
                }
            }
        }
    }

    /// Waits until this node has applied everything committed cluster-wide when it was called
    /// (ReadIndex): local reads after it are linearizable. Use before reads where freshness
    /// matters ("does this KB exist" before accepting an upload).
    pub async fn linearizable_barrier(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            match self.raft.read_index().await {
                Ok(_) => return Ok(()),
                Err(error) if error.is_transient() && Instant::now() + backoff < deadline => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(error) => return Err(error),
            }
        }
    }
}
