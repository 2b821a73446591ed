//! Shard requests between nodes: one internal route (`POST /internal/v1/shard`) on the
//! cluster's internal port, bincode bodies, authenticated with the cluster secret by the
//! internal server before a byte of the body is read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sift_cluster::raft::RaftHandle;
use sift_cluster::tls::PeerTls;
use sift_cluster::transport::{decode_frame, encode_frame};
use sift_storage::chunk::{ChunkView, DocumentWrite, ShardWrite};
use sift_storage::shard::ShardStats;
use tracing::Instrument as _;

use super::error::ShardError;
use super::messages::{LeafRequest, LeafResponse};

/// The internal route of shard requests.
pub const SHARD_RPC_PATH: &str = "/internal/v1/shard";

/// The id of a node that is not a cluster member: a single node is node 1, as it will be if
/// it bootstraps a cluster later.
pub const SINGLE_NODE_ID: u64 = 1;

/// How long a node that failed to answer (unreachable, no answer in time, or outrun by a
/// hedged read) is read last; any answer from it clears the mark sooner.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// A request to one replica of a shard held by another node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShardRpc {
    Search {
        kb_id: String,
        shard: u32,
        request: LeafRequest,
    },
    Chunks {
        kb_id: String,
        shard: u32,
        document_id: String,
    },
    Write {
        kb_id: String,
        shard: u32,
        write: ShardWrite,
    },
    Delete {
        kb_id: String,
        shard: u32,
        document_id: String,
    },
    DocumentIds {
        kb_id: String,
        shard: u32,
    },
    Export {
        kb_id: String,
        shard: u32,
        document_ids: Vec<String>,
    },
    Stats {
        kb_id: String,
        shard: u32,
    },
    /// Stores raw documents (as received) with a replica of their shard, durably, before the
    /// upload is acknowledged; answers with the node's ingestion queue depth.
    PutRaw {
        kb_id: String,
        shard: u32,
        documents: Vec<RawDocument>,
    },
    /// The raw bytes of a document, if this node holds them.
    GetRaw {
        kb_id: String,
        shard: u32,
        document_id: String,
        upload: bool,
    },
    /// Asks the node to ingest documents assigned to it (it also finds them by itself in the
    /// pending-work index; this only saves the wait).
    Ingest {
        kb_id: String,
        shard: u32,
        document_ids: Vec<String>,
    },
}

/// A document's raw bytes in transit: an upload's file or a bulk text.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RawDocument {
    pub document_id: String,
    pub upload: bool,
    pub bytes: Vec<u8>,
}

impl ShardRpc {
    pub fn kb_id(&self) -> &str {
        match self {
            ShardRpc::Search { kb_id, .. }
            | ShardRpc::Chunks { kb_id, .. }
            | ShardRpc::Write { kb_id, .. }
            | ShardRpc::Delete { kb_id, .. }
            | ShardRpc::DocumentIds { kb_id, .. }
            | ShardRpc::Export { kb_id, .. }
            | ShardRpc::Stats { kb_id, .. }
            | ShardRpc::PutRaw { kb_id, .. }
            | ShardRpc::GetRaw { kb_id, .. }
            | ShardRpc::Ingest { kb_id, .. } => kb_id,
        }
    }

    pub fn shard(&self) -> u32 {
        match self {
            ShardRpc::Search { shard, .. }
            | ShardRpc::Chunks { shard, .. }
            | ShardRpc::Write { shard, .. }
            | ShardRpc::Delete { shard, .. }
            | ShardRpc::DocumentIds { shard, .. }
            | ShardRpc::Export { shard, .. }
            | ShardRpc::Stats { shard, .. }
            | ShardRpc::PutRaw { shard, .. }
            | ShardRpc::GetRaw { shard, .. }
            | ShardRpc::Ingest { shard, .. } => *shard,
        }
    }

    /// A short name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ShardRpc::Search { .. } => "search",
            ShardRpc::Chunks { .. } => "chunks",
            ShardRpc::Write { .. } => "write",
            ShardRpc::Delete { .. } => "delete",
            ShardRpc::DocumentIds { .. } => "document_ids",
            ShardRpc::Export { .. } => "export",
            ShardRpc::Stats { .. } => "stats",
            ShardRpc::PutRaw { .. } => "put_raw",
            ShardRpc::GetRaw { .. } => "get_raw",
            ShardRpc::Ingest { .. } => "ingest",
        }
    }
}

/// What the replica's node answered.
#[derive(Debug, Serialize, Deserialize)]
pub enum ShardReply {
    Search(LeafResponse),
    Chunks(Vec<ChunkView>),
    Written,
    Deleted(bool),
    DocumentIds(Vec<String>),
    Exported(Vec<DocumentWrite>),
    Stats(ShardStats),
    /// Raw documents stored; the node's ingestion queue depth.
    RawStored {
        queue_depth: usize,
    },
    Raw(Option<Vec<u8>>),
    Queued,
    /// The node could not serve the request (`code` as in the public API's errors).
    Failed {
        code: String,
        message: String,
    },
}

pub fn encode_reply(reply: &ShardReply) -> Vec<u8> {
    encode_frame(reply).unwrap_or_else(|error| {
        encode_frame(&ShardReply::Failed {
            code: "internal".into(),
            message: error.to_string(),
        })
        .unwrap_or_default()
    })
}

pub fn decode_request(bytes: &[u8]) -> Option<ShardRpc> {
    decode_frame(bytes)
}

/// This node's view of the other nodes, for shard requests: its own id, their internal
/// addresses (from the Raft membership) and an HTTP/2 client. A single node has no peers.
pub struct Peers {
    local_id: u64,
    raft: Option<RaftHandle>,
    secret: String,
    tls: PeerTls,
    client: reqwest::Client,
    inflight: Mutex<HashMap<u64, usize>>,
    /// When each node last failed to answer in time.
    suspects: Mutex<HashMap<u64, Instant>>,
}

impl Peers {
    /// A node that is not a cluster member.
    pub fn single() -> Peers {
        Peers {
            local_id: SINGLE_NODE_ID,
            raft: None,
            secret: String::new(),
            tls: PeerTls::plain(),
            client: reqwest::Client::new(),
            inflight: Mutex::new(HashMap::new()),
            suspects: Mutex::new(HashMap::new()),
        }
    }

    /// A cluster member: addresses come from `raft`'s membership.
    pub fn clustered(raft: RaftHandle, secret: &str, tls: PeerTls) -> Peers {
        let client = tls
            .client_builder()
            .http2_prior_knowledge()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Peers {
            local_id: raft.id(),
            raft: Some(raft),
            secret: secret.to_string(),
            tls,
            client,
            inflight: Mutex::new(HashMap::new()),
            suspects: Mutex::new(HashMap::new()),
        }
    }

    pub fn local_id(&self) -> u64 {
        self.local_id
    }

    /// The nodes that may hold replicas: this one and every member not removed.
    pub fn members(&self) -> Vec<u64> {
        let mut members = vec![self.local_id];
        if let Some(raft) = &self.raft {
            let status = raft.status();
            for peer in status.peers {
                if !peer.address.as_ref().is_some_and(|a| a.removed) {
                    members.push(peer.id);
                }
            }
        }
        members.sort_unstable();
        members.dedup();
        members
    }

    fn address(&self, node: u64) -> Option<String> {
        let raft = self.raft.as_ref()?;
        raft.status()
            .peers
            .into_iter()
            .find(|peer| peer.id == node)
            .and_then(|peer| peer.address)
            .filter(|address| !address.removed && !address.internal.is_empty())
            .map(|address| address.internal)
    }

    /// Requests in flight to `node` (the least loaded replica is read first).
    pub fn inflight(&self, node: u64) -> usize {
        self.inflight
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(&node)
            .copied()
            .unwrap_or(0)
    }

    /// Whether `node` failed to answer in the last [`SUSPECT_FOR`] (reads try it last).
    pub fn suspect(&self, node: u64) -> bool {
        self.suspects
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(&node)
            .is_some_and(|since| since.elapsed() < SUSPECT_FOR)
    }

    /// Remembers that `node` did not answer in time (or a hedge to another replica won).
    pub fn note_unresponsive(&self, node: u64) {
        let mut suspects = self
            .suspects
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let previous = suspects.insert(node, Instant::now());
        if previous.is_none_or(|since| since.elapsed() >= SUSPECT_FOR) {
            metrics::counter!("sift_peer_suspected_total").increment(1);
        }
    }

    fn note_answered(&self, node: u64) {
        self.suspects
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .remove(&node);
    }

    fn track(&self, node: u64, delta: isize) {
        let mut inflight = self
            .inflight
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let count = inflight.entry(node).or_default();
        *count = count.saturating_add_signed(delta);
    }

    /// Sends `rpc` to `node` and waits at most `timeout` for its answer. A refusal by the
    /// replica is an answer (`ShardReply::Failed`); errors are about getting one.
    pub async fn call(
        &self,
        node: u64,
        rpc: &ShardRpc,
        timeout: Duration,
    ) -> Result<ShardReply, ShardError> {
        let Some(address) = self.address(node) else {
            return Err(ShardError::Unreachable {
                node,
                reason: "no address known".into(),
            });
        };
        let body = encode_frame(rpc).map_err(|error| ShardError::Protocol(error.to_string()))?;
        self.track(node, 1);
        let _done = Untrack { peers: self, node };
        let started = std::time::Instant::now();
        let span = tracing::info_span!(
            "shard_rpc",
            otel.kind = "client",
            kind = rpc.kind(),
            node,
            kb_id = rpc.kb_id(),
            shard = rpc.shard(),
        );
        // The trace goes with the request: the serving node's span is this one's child.
        let mut headers = reqwest::header::HeaderMap::new();
        span.in_scope(|| crate::trace_context::inject(&mut headers));
        let outcome = async {
            let response = self
                .client
                .post(self.tls.url(&address, SHARD_RPC_PATH))
                .bearer_auth(&self.secret)
                .headers(headers)
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .timeout(timeout)
                .body(body)
                .send()
                .await
                .map_err(|error| {
                    self.note_unresponsive(node);
                    failure(node, timeout, &error)
                })?;
            let status = response.status();
            let bytes = response.bytes().await.map_err(|error| {
                self.note_unresponsive(node);
                failure(node, timeout, &error)
            })?;
            self.note_answered(node);
            if !status.is_success() {
                return Err(ShardError::Status {
                    node,
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
                });
            }
            decode_frame::<ShardReply>(&bytes).ok_or_else(|| {
                ShardError::Protocol(format!("node {node} sent an unreadable reply"))
            })
        }
        .instrument(span)
        .await;
        let label = if outcome.is_ok() { "ok" } else { "error" };
        metrics::histogram!("sift_shard_rpc_seconds", "kind" => rpc.kind(), "outcome" => label)
            .record(started.elapsed().as_secs_f64());
        outcome
    }
}

struct Untrack<'a> {
    peers: &'a Peers,
    node: u64,
}

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        self.peers.track(self.node, -1);
    }
}

/// A request that got no answer: out of time, or not through.
fn failure(node: u64, timeout: Duration, error: &reqwest::Error) -> ShardError {
    if error.is_timeout() {
        ShardError::Timeout(timeout)
    } else if error.is_connect() {
        ShardError::Unreachable {
            node,
            reason: "unreachable".into(),
        }
    } else {
        ShardError::Unreachable {
            node,
            reason: error.to_string(),
        }
    }
}

/// Shared between the node's parts.
pub type SharedPeers = Arc<Peers>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_failed_to_answer_is_suspect_until_it_answers() {
        let peers = Peers::single();
        assert!(!peers.suspect(2));
        peers.note_unresponsive(2);
        assert!(peers.suspect(2));
        assert!(!peers.suspect(3));
        peers.note_answered(2);
        assert!(!peers.suspect(2));
    }
}
