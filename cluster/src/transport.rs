//! The internal transport between Sift nodes: Raft messages over HTTP/2.
//!
//! - [`InternalServer`]: an axum server on the node's internal port. Every request must carry
//!   the cluster secret (`authorization: Bearer <secret>`); a middleware rejects requests
//!   without it before the body is read, so bytes from an unauthenticated peer never reach a
//!   decoder (rust-protobuf 2.28 has RUSTSEC-2024-0437). Bodies are bincode frames holding
//!   protobuf-encoded Raft messages; malformed frames are refused (400) and counted.
//! - [`HttpTransport`]: the [`Transport`] the Raft driver sends through. One bounded queue and
//!   one sender task per peer: when a peer is slow or down its queue drops the oldest messages
//!   (raft-rs retransmits), and the task reconnects with capped backoff. Snapshots go on their
//!   own task in chunks of `chunk_bytes`, and their fate is reported to Raft.
//!
//! See docs/adr/0005-internal-transport.md for why this is not ractor_cluster.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, oneshot};
use tracing::{debug, info, warn};

use sift_storage::StorageError;
use sift_storage::meta::MetaOutcome;

use crate::error::{ClusterError, Result};
use crate::raft::driver::RaftHandle;
use crate::raft::network::Transport;
use crate::raft::state_machine::Proposal;
use crate::raft::storage::PeerAddress;
use crate::tls::{PeerTls, ServerTls};

const MESSAGES_PATH: &str = "/internal/v1/raft/messages";
const SNAPSHOT_PATH: &str = "/internal/v1/raft/snapshot";
const HEALTH_PATH: &str = "/internal/v1/health";
const PROPOSE_PATH: &str = "/internal/v1/meta/propose";
const JOIN_PATH: &str = "/internal/v1/join";
/// Fault injection (only with [`TransportConfig::fault_injection`]): `{"peers": [ids]}` cuts
/// this node's Raft traffic with those peers ([`HttpTransport::block_peers`]); `[]` heals.
pub const DEBUG_BLOCK_PATH: &str = "/internal/v1/debug/block";
/// Fault injection (only with [`TransportConfig::fault_injection`]): the Raft thread acts as
/// if its next storage write failed ([`RaftHandle::fail_storage`]), as on a full disk.
pub const DEBUG_FAIL_STORAGE_PATH: &str = "/internal/v1/debug/fail-storage";
/// Upper bound of a decoded frame, whatever the body limit.
const FRAME_LIMIT: usize = 64 * 1024 * 1024;
/// Upper bound of an assembled snapshot.
const SNAPSHOT_LIMIT: u64 = 4 * 1024 * 1024 * 1024;

/// Settings of the internal transport.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// This node's Raft id.
    pub id: u64,
    /// The address peers reach this node's internal server at (`host:port`).
    pub advertise: String,
    /// The shared cluster secret.
    pub secret: String,
    /// Raft messages queued per peer before the oldest are dropped.
    pub queue_capacity: usize,
    /// Messages sent in one request at most.
    pub batch_messages: usize,
    /// Snapshot bytes per request.
    pub chunk_bytes: usize,
    pub request_timeout: Duration,
    /// Serve [`DEBUG_BLOCK_PATH`] (tests of partitions; the node's `debug_faults`).
    pub fault_injection: bool,
    /// Plain HTTP or HTTPS to the peers, and the roots their certificates chain to.
    pub peer_tls: PeerTls,
}

impl TransportConfig {
    pub fn new(id: u64, advertise: impl Into<String>, secret: impl Into<String>) -> Self {
        TransportConfig {
            id,
            advertise: advertise.into(),
            secret: secret.into(),
            queue_capacity: 4096,
            batch_messages: 256,
            chunk_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(5),
            fault_injection: false,
            peer_tls: PeerTls::plain(),
        }
    }
}

/// A batch of Raft messages from one node; each message is protobuf bytes.
#[derive(Serialize, Deserialize)]
struct MessageBatch {
    from: u64,
    /// Where the sender listens, so a node that joined recently can answer before it has the
    /// membership (it learns addresses it does not know yet).
    from_address: String,
    messages: Vec<Vec<u8>>,
}

/// One piece of a snapshot message. Chunks of a transfer are sent in order; every chunk
/// carries the (small) snapshot message without its data.
#[derive(Serialize, Deserialize)]
struct SnapshotChunk {
    from: u64,
    from_address: String,
    transfer_id: u64,
    offset: u64,
    total_len: u64,
    message: Vec<u8>,
    data: Vec<u8>,
}

/// Encodes a body of the internal API (bincode, standard config).
pub fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|error| ClusterError::Transport(format!("encode frame: {error}")))
}

/// Decodes a body of the internal API: `None` for anything but exactly one whole value
/// (at most 64 MiB), never a panic.
pub fn decode_frame<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let config = bincode::config::standard().with_limit::<FRAME_LIMIT>();
    match bincode::serde::decode_from_slice(bytes, config) {
        Ok((value, read)) if read == bytes.len() => Some(value),
        _ => None,
    }
}

fn secret_digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares digests without an early exit.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn rejected(reason: &'static str) {
    metrics::counter!("sift_raft_transport_rejected_total", "reason" => reason).increment(1);
}

struct Assembly {
    total_len: u64,
    data: Vec<u8>,
    updated: Instant,
}

struct ServerState {
    secret: [u8; 32],
    raft: RaftHandle,
    transport: Option<HttpTransport>,
    assemblies: Mutex<HashMap<(u64, u64), Assembly>>,
    /// Serialises joins on the leader; the last id given out.
    last_joined: tokio::sync::Mutex<u64>,
    /// How long a joined learner may take to catch up before its promotion is abandoned.
    promotion_timeout: Duration,
}

/// The internal HTTP server of a node. Dropping it (or [`Self::shutdown`]) stops it.
pub struct InternalServer {
    local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl InternalServer {
    /// Serves Raft traffic for `raft` on `listener`. `transport` (this node's own) learns the
    /// addresses of peers that write to it. `extra` routes (shard data) are served on the
    /// same port behind the same authentication, with their own body limits. With `tls`,
    /// every connection is TLS.
    pub fn start(
        listener: tokio::net::TcpListener,
        secret: &str,
        raft: RaftHandle,
        transport: Option<HttpTransport>,
        chunk_bytes: usize,
        extra: Option<Router>,
        tls: Option<ServerTls>,
    ) -> Result<InternalServer> {
        let local_addr = listener
            .local_addr()
            .map_err(|error| ClusterError::Transport(error.to_string()))?;
        let fault_injection = transport
            .as_ref()
            .is_some_and(|transport| transport.inner.config.fault_injection);
        let state = Arc::new(ServerState {
            secret: secret_digest(secret),
            raft,
            transport,
            assemblies: Mutex::new(HashMap::new()),
            last_joined: tokio::sync::Mutex::new(0),
            promotion_timeout: Duration::from_secs(600),
        });
        let body_limit = chunk_bytes.max(4 * 1024 * 1024) * 2;
        let mut app = Router::new();
        if fault_injection {
            app = app
                .route(DEBUG_BLOCK_PATH, post(receive_block))
                .route(DEBUG_FAIL_STORAGE_PATH, post(receive_fail_storage));
        }
        let app = app
            .route(MESSAGES_PATH, post(receive_messages))
            .route(SNAPSHOT_PATH, post(receive_snapshot_chunk))
            .route(PROPOSE_PATH, post(receive_proposal))
            .route(JOIN_PATH, post(receive_join))
            .route(HEALTH_PATH, get(|| async { "ok" }))
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(state.clone())
            .merge(extra.unwrap_or_default())
            // Runs before any extractor: an unauthenticated body is never read.
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                authenticate,
            ))
            .layer(axum::middleware::from_fn(
                crate::http_server::refuse_oversized_heads,
            ));
        let (shutdown, shutdown_signal) = oneshot::channel::<()>();
        let task = tokio::spawn(crate::http_server::serve(
            listener,
            app,
            crate::http_server::ConnectionLimits::default(),
            "internal",
            tls,
            async move {
                let _ = shutdown_signal.await;
            },
        ));
        info!(%local_addr, "internal server listening");
        Ok(InternalServer {
            local_addr,
            shutdown: Some(shutdown),
            task: Some(task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and waits for the server task.
    pub async fn shutdown(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for InternalServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn authenticate(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let provided = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let authorized =
        provided.is_some_and(|secret| same_digest(&secret_digest(secret), &state.secret));
    if !authorized {
        rejected("unauthorized");
        return error_response(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong cluster secret",
        );
    }
    next.run(request).await
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    (status, axum::Json(body)).into_response()
}

#[derive(Deserialize)]
struct BlockRequest {
    peers: Vec<u64>,
}

/// Fault injection: cuts (or with `[]` heals) this node's Raft traffic with the given peers.
async fn receive_block(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<BlockRequest>(&body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "expected {\"peers\": [node ids]}",
        );
    };
    match &state.transport {
        Some(transport) => {
            warn!(peers = ?request.peers, "fault injection: raft traffic with these peers blocked");
            transport.block_peers(&request.peers);
            StatusCode::NO_CONTENT.into_response()
        }
        None => error_response(StatusCode::NOT_FOUND, "not_found", "no transport"),
    }
}

async fn receive_fail_storage(State(state): State<Arc<ServerState>>) -> Response {
    warn!("fault injection: the raft storage fails");
    match state.raft.fail_storage() {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(error) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &error.to_string(),
        ),
    }
}

/// The answer to Raft traffic from a peer blocked by [`HttpTransport::block_peers`].
fn blocked_response() -> Response {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "blocked",
        "traffic from this peer is blocked (fault injection)",
    )
}

fn parse_message(bytes: &[u8]) -> Option<Message> {
    Message::parse_from_bytes(bytes).ok()
}

/// Decodes `bytes` as each body the internal API accepts, as its handlers do (a message batch
/// and its Raft messages, a snapshot chunk and its message, a forwarded proposal, a join
/// request), and returns how many of those decodings succeeded. Used by the fuzz targets
/// (`fuzz/fuzz_targets/cluster_frames.rs`): no body may panic or exhaust the stack.
pub fn decode_any_body(bytes: &[u8]) -> usize {
    let mut decoded = 0;
    if let Some(batch) = decode_frame::<MessageBatch>(bytes) {
        decoded += 1;
        decoded += batch
            .messages
            .iter()
            .filter(|message| parse_message(message).is_some())
            .count();
    }
    if let Some(chunk) = decode_frame::<SnapshotChunk>(bytes) {
        decoded += 1 + usize::from(parse_message(&chunk.message).is_some());
    }
    decoded += usize::from(decode_frame::<Proposal>(bytes).is_some());
    decoded += usize::from(decode_frame::<JoinRequest>(bytes).is_some());
    decoded
}

async fn receive_messages(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let Some(batch) = decode_frame::<MessageBatch>(&body) else {
        rejected("malformed");
        return error_response(StatusCode::BAD_REQUEST, "malformed", "not a message batch");
    };
    let mut messages = Vec::with_capacity(batch.messages.len());
    for bytes in &batch.messages {
        match parse_message(bytes) {
            Some(message) if message.from == batch.from => messages.push(message),
            _ => {
                rejected("malformed");
                return error_response(StatusCode::BAD_REQUEST, "malformed", "bad raft message");
            }
        }
    }
    if let Some(transport) = &state.transport {
        if transport.is_blocked(batch.from) {
            return blocked_response();
        }
        transport.learn_address(batch.from, &batch.from_address);
    }
    for message in messages {
        state.raft.step(message);
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn receive_snapshot_chunk(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let Some(chunk) = decode_frame::<SnapshotChunk>(&body) else {
        rejected("malformed");
        return error_response(StatusCode::BAD_REQUEST, "malformed", "not a snapshot chunk");
    };
    if chunk.total_len > SNAPSHOT_LIMIT {
        rejected("too_large");
        return error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "snapshot too large",
        );
    }
    if state
        .transport
        .as_ref()
        .is_some_and(|transport| transport.is_blocked(chunk.from))
    {
        return blocked_response();
    }
    let key = (chunk.from, chunk.transfer_id);
    let complete = {
        let mut assemblies = state
            .assemblies
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        // Transfers abandoned by their sender are forgotten after a while.
        assemblies.retain(|_, assembly| assembly.updated.elapsed() < Duration::from_secs(120));
        if chunk.offset == 0 {
            assemblies.insert(
                key,
                Assembly {
                    total_len: chunk.total_len,
                    data: Vec::with_capacity(chunk.total_len.min(64 * 1024 * 1024) as usize),
                    updated: Instant::now(),
                },
            );
        }
        let Some(assembly) = assemblies.get_mut(&key) else {
            rejected("out_of_order");
            return error_response(StatusCode::CONFLICT, "out_of_order", "unknown transfer");
        };
        if assembly.data.len() as u64 != chunk.offset
            || assembly.total_len != chunk.total_len
            || chunk
                .offset
                .checked_add(chunk.data.len() as u64)
                .is_none_or(|end| end > chunk.total_len)
        {
            assemblies.remove(&key);
            rejected("out_of_order");
            return error_response(StatusCode::CONFLICT, "out_of_order", "chunk out of order");
        }
        assembly.data.extend_from_slice(&chunk.data);
        assembly.updated = Instant::now();
        if assembly.data.len() as u64 == assembly.total_len {
            assemblies.remove(&key).map(|assembly| assembly.data)
        } else {
            None
        }
    };
    if let Some(data) = complete {
        let Some(mut message) = parse_message(&chunk.message) else {
            rejected("malformed");
            return error_response(StatusCode::BAD_REQUEST, "malformed", "bad snapshot message");
        };
        if message.get_msg_type() != MessageType::MsgSnapshot || message.from != chunk.from {
            rejected("malformed");
            return error_response(
                StatusCode::BAD_REQUEST,
                "malformed",
                "not a snapshot message",
            );
        }
        message.mut_snapshot().data = data.into();
        if let Some(transport) = &state.transport {
            transport.learn_address(chunk.from, &chunk.from_address);
        }
        state.raft.step(message);
    }
    StatusCode::NO_CONTENT.into_response()
}

/// The answer to a forwarded proposal.
#[derive(Serialize, Deserialize)]
enum ForwardReply {
    Applied(Box<MetaOutcome>),
    Failed(WireError),
}

/// A [`ClusterError`] as it crosses the wire: refusals keep their kind (not found, conflict,
/// invalid) so the caller's API answers as if the op ran locally.
#[derive(Serialize, Deserialize)]
struct WireError {
    kind: String,
    message: String,
    leader: Option<u64>,
}

impl WireError {
    fn from_error(error: &ClusterError) -> Self {
        let (kind, leader) = match error {
            ClusterError::Storage(StorageError::NotFound(_)) => ("not_found", None),
            ClusterError::Storage(StorageError::Conflict(_)) => ("conflict", None),
            ClusterError::Storage(StorageError::Invalid(_)) => ("storage_invalid", None),
            ClusterError::Invalid(_) => ("invalid", None),
            ClusterError::NotLeader { leader } => ("not_leader", *leader),
            ClusterError::Unauthorized => ("unauthorized", None),
            ClusterError::Storage(error) if !error.is_transient() => ("invalid", None),
            _ => ("dropped", None),
        };
        let message = match error {
            ClusterError::Storage(
                StorageError::NotFound(message)
                | StorageError::Conflict(message)
                | StorageError::Invalid(message),
            ) => message.clone(),
            other => other.to_string(),
        };
        WireError {
            kind: kind.into(),
            message,
            leader,
        }
    }

    fn into_error(self) -> ClusterError {
        match self.kind.as_str() {
            "not_found" => ClusterError::Storage(StorageError::NotFound(self.message)),
            "conflict" => ClusterError::Storage(StorageError::Conflict(self.message)),
            "storage_invalid" => ClusterError::Storage(StorageError::Invalid(self.message)),
            "invalid" => ClusterError::Invalid(self.message),
            "not_leader" => ClusterError::NotLeader {
                leader: self.leader,
            },
            "unauthorized" => ClusterError::Unauthorized,
            _ => ClusterError::Dropped(self.message),
        }
    }
}

/// A follower forwards a proposal here, to the leader; it answers after the op is applied.
async fn receive_proposal(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let Some(proposal) = decode_frame::<Proposal>(&body) else {
        rejected("malformed");
        return error_response(StatusCode::BAD_REQUEST, "malformed", "not a proposal");
    };
    let reply = match state.raft.propose_proposal(proposal).await {
        Ok(outcome) => ForwardReply::Applied(Box::new(outcome)),
        Err(error) => ForwardReply::Failed(WireError::from_error(&error)),
    };
    match encode_frame(&reply) {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(error) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &error.to_string(),
        ),
    }
}

/// Asks a member to let a new node in.
#[derive(Serialize, Deserialize)]
struct JoinRequest {
    address: PeerAddress,
}

#[derive(Serialize, Deserialize)]
enum JoinReply {
    /// The node is a learner with this id; the leader promotes it to voter once it caught up.
    Accepted { id: u64 },
    /// Ask the leader instead.
    Redirect { leader: u64, internal: String },
    /// No leader right now: try again.
    Unavailable(String),
    /// Never going to work as asked.
    Refused(String),
}

/// Lets a new node in (on the leader): gives it a fresh id (ids are never reused), adds it as a
/// learner, and promotes it to voter in the background once it has caught up. A node that
/// comes back from a wiped data dir at a member's address is refused: that member must be
/// removed first.
async fn receive_join(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let Some(request) = decode_frame::<JoinRequest>(&body) else {
        rejected("malformed");
        return error_response(StatusCode::BAD_REQUEST, "malformed", "not a join request");
    };
    let reply = join_reply(&state, request).await;
    match encode_frame(&reply) {
        Ok(bytes) => (StatusCode::OK, bytes).into_response(),
        Err(error) => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &error.to_string(),
        ),
    }
}

async fn join_reply(state: &ServerState, request: JoinRequest) -> JoinReply {
    let mut last_joined = state.last_joined.lock().await;
    let status = state.raft.status();
    if status.leader != Some(status.id) {
        let leader_address = status.leader.and_then(|leader| {
            state
                .transport
                .as_ref()
                .and_then(|transport| transport.inner.address_of(leader))
                .map(|internal| (leader, internal))
        });
        return match leader_address {
            Some((leader, internal)) => JoinReply::Redirect { leader, internal },
            None => JoinReply::Unavailable("no leader known yet".into()),
        };
    }
    if request.address.internal.is_empty() {
        return JoinReply::Refused("the joining node gave no internal address".into());
    }
    let own_address = state
        .transport
        .as_ref()
        .map(|transport| transport.inner.config.advertise.clone());
    if own_address.as_deref() == Some(request.address.internal.as_str()) {
        return JoinReply::Refused(format!(
            "address {} belongs to node {}, the leader",
            request.address.internal, status.id
        ));
    }
    if let Some(member) = status.peers.iter().find(|peer| {
        peer.address
            .as_ref()
            .is_some_and(|address| address.internal == request.address.internal)
    }) {
        return JoinReply::Refused(format!(
            "address {} belongs to node {}, which is still a member: if its data dir was wiped, \
             remove it first (sift node remove {}) or join from another address",
            request.address.internal, member.id, member.id
        ));
    }
    let id = status.max_node_id.max(*last_joined) + 1;
    match state.raft.add_learner(id, request.address).await {
        Ok(_) => {
            *last_joined = id;
            let raft = state.raft.clone();
            let timeout = state.promotion_timeout;
            tokio::spawn(async move {
                match raft.promote_when_caught_up(id, timeout).await {
                    Ok(_) => info!(node = id, "learner promoted to voter"),
                    Err(error) => warn!(node = id, %error, "learner not promoted"),
                }
            });
            info!(node = id, "node joined as a learner");
            JoinReply::Accepted { id }
        }
        Err(error) if error.is_transient() => JoinReply::Unavailable(error.to_string()),
        Err(error) => JoinReply::Refused(error.to_string()),
    }
}

/// Joins the cluster that the member at `seed` (its internal address) belongs to, following
/// redirects to the leader and retrying while there is none, until `timeout`. Returns the id
/// this node got; start its Raft node with that id and an empty storage.
pub async fn join_cluster(
    seed: &str,
    secret: &str,
    address: PeerAddress,
    timeout: Duration,
    peer_tls: &PeerTls,
) -> Result<u64> {
    let client = peer_tls
        .client_builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|error| ClusterError::Transport(error.to_string()))?;
    let deadline = Instant::now() + timeout;
    let mut target = seed.to_string();
    let body = encode_frame(&JoinRequest { address })?;
    loop {
        let attempt = async {
            let response = client
                .post(peer_tls.url(&target, JOIN_PATH))
                .bearer_auth(secret)
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .body(body.clone())
                .send()
                .await
                .map_err(|error| ClusterError::Transport(error.to_string()))?;
            if response.status() == StatusCode::UNAUTHORIZED {
                return Err(ClusterError::Unauthorized);
            }
            let bytes = response
                .bytes()
                .await
                .map_err(|error| ClusterError::Transport(error.to_string()))?;
            decode_frame::<JoinReply>(&bytes).ok_or_else(|| {
                ClusterError::Transport(format!("{target} sent an unreadable reply"))
            })
        }
        .await;
        let retry = match attempt {
            Ok(JoinReply::Accepted { id }) => return Ok(id),
            Ok(JoinReply::Refused(message)) => return Err(ClusterError::Invalid(message)),
            Ok(JoinReply::Redirect { leader, internal }) => {
                target = internal;
                ClusterError::NotLeader {
                    leader: Some(leader),
                }
            }
            Ok(JoinReply::Unavailable(message)) => ClusterError::Dropped(message),
            Err(error) if error.is_transient() => error,
            Err(error) => return Err(error),
        };
        if Instant::now() >= deadline {
            return Err(retry);
        }
        let pause = if matches!(retry, ClusterError::NotLeader { .. }) {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(200)
        };
        tokio::time::sleep(pause).await;
    }
}

struct PeerQueue {
    messages: Mutex<VecDeque<Message>>,
    notify: Notify,
}

struct Inner {
    config: TransportConfig,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    addresses: RwLock<HashMap<u64, String>>,
    queues: Mutex<HashMap<u64, Arc<PeerQueue>>>,
    raft: OnceLock<RaftHandle>,
    /// Peers this node neither sends to nor accepts Raft traffic from (fault injection:
    /// [`HttpTransport::block_peers`]).
    blocked: RwLock<HashSet<u64>>,
    depth: AtomicI64,
    next_transfer: AtomicU64,
}

/// Sends Raft messages to peers over HTTP. Cheap to clone.
#[derive(Clone)]
pub struct HttpTransport {
    inner: Arc<Inner>,
}

impl HttpTransport {
    /// A transport whose sender tasks run on `runtime`.
    pub fn new(config: TransportConfig, runtime: tokio::runtime::Handle) -> Result<Self> {
        let client = config
            .peer_tls
            .client_builder()
            .http2_prior_knowledge()
            .tcp_nodelay(true)
            .timeout(config.request_timeout)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|error| ClusterError::Transport(error.to_string()))?;
        Ok(HttpTransport {
            inner: Arc::new(Inner {
                config,
                client,
                runtime,
                addresses: RwLock::new(HashMap::new()),
                queues: Mutex::new(HashMap::new()),
                raft: OnceLock::new(),
                blocked: RwLock::new(HashSet::new()),
                depth: AtomicI64::new(0),
                next_transfer: AtomicU64::new(1),
            }),
        })
    }

    /// Gives the transport the Raft node it reports unreachable peers and snapshot outcomes to.
    pub fn attach(&self, raft: RaftHandle) {
        let _ = self.inner.raft.set(raft);
    }

    /// Records the address of a peer that contacted us, unless one is known already.
    pub fn learn_address(&self, id: u64, address: &str) {
        if id == self.inner.config.id || address.is_empty() {
            return;
        }
        let known = self
            .inner
            .addresses
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .contains_key(&id);
        if !known {
            self.inner
                .addresses
                .write()
                .unwrap_or_else(|poison| poison.into_inner())
                .insert(id, address.to_string());
        }
    }

    /// Sends `proposal` to node `leader` (its internal address must be known) and returns what
    /// applying it there produced. A retry of the same proposal applies at most once.
    pub async fn forward(&self, leader: u64, proposal: &Proposal) -> Result<MetaOutcome> {
        let inner = &self.inner;
        if inner.is_blocked(leader) {
            return Err(ClusterError::Transport(format!(
                "node {leader} is unreachable (blocked)"
            )));
        }
        let Some(address) = inner.address_of(leader) else {
            return Err(ClusterError::Transport(format!(
                "no address for node {leader}"
            )));
        };
        let response = inner
            .client
            .post(inner.url(&address, PROPOSE_PATH))
            .bearer_auth(&inner.config.secret)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(encode_frame(proposal)?)
            .send()
            .await
            .map_err(|error| ClusterError::Transport(error.to_string()))?;
        if !response.status().is_success() {
            return Err(ClusterError::Transport(format!(
                "node {leader} answered {}",
                response.status()
            )));
        }
        let body = response
            .bytes()
            .await
            .map_err(|error| ClusterError::Transport(error.to_string()))?;
        match decode_frame::<ForwardReply>(&body) {
            Some(ForwardReply::Applied(outcome)) => Ok(*outcome),
            Some(ForwardReply::Failed(error)) => Err(error.into_error()),
            None => Err(ClusterError::Transport(format!(
                "node {leader} sent an unreadable reply"
            ))),
        }
    }

    /// Fault injection: from now on, Raft messages, snapshots and forwarded proposals to
    /// `peers` are dropped, and Raft traffic from them is refused (503), as if the network
    /// between them and this node were cut. An empty list heals. Block on both sides to cut a
    /// link both ways.
    pub fn block_peers(&self, peers: &[u64]) {
        *self
            .inner
            .blocked
            .write()
            .unwrap_or_else(|poison| poison.into_inner()) = peers.iter().copied().collect();
    }

    /// Whether traffic with `peer` is blocked by [`Self::block_peers`].
    pub fn is_blocked(&self, peer: u64) -> bool {
        self.inner.is_blocked(peer)
    }

    /// Messages waiting in every peer queue.
    pub fn queue_depth(&self) -> i64 {
        self.inner.depth.load(Ordering::Relaxed)
    }

    fn queue_for(&self, to: u64) -> Arc<PeerQueue> {
        let mut queues = self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        queues
            .entry(to)
            .or_insert_with(|| {
                let queue = Arc::new(PeerQueue {
                    messages: Mutex::new(VecDeque::new()),
                    notify: Notify::new(),
                });
                let weak = Arc::downgrade(&self.inner);
                self.inner
                    .runtime
                    .spawn(peer_sender(weak, to, queue.clone()));
                queue
            })
            .clone()
    }
}

impl Inner {
    fn is_blocked(&self, peer: u64) -> bool {
        self.blocked
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .contains(&peer)
    }

    fn address_of(&self, id: u64) -> Option<String> {
        self.addresses
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .get(&id)
            .cloned()
    }

    fn set_depth(&self, delta: i64) {
        let depth = self.depth.fetch_add(delta, Ordering::Relaxed) + delta;
        metrics::gauge!("sift_raft_peer_queue_depth").set(depth as f64);
    }

    fn url(&self, address: &str, path: &str) -> String {
        self.config.peer_tls.url(address, path)
    }
}

impl Transport for HttpTransport {
    fn send(&self, message: Message) {
        let to = message.to;
        if self.inner.is_blocked(to) {
            metrics::counter!("sift_raft_messages_dropped_total", "reason" => "blocked")
                .increment(1);
            if message.get_msg_type() == MessageType::MsgSnapshot
                && let Some(raft) = self.inner.raft.get()
            {
                raft.report_snapshot(to, false);
            }
            return;
        }
        if message.get_msg_type() == MessageType::MsgSnapshot {
            let inner = self.inner.clone();
            self.inner.runtime.spawn(async move {
                let delivered = send_snapshot(&inner, message).await;
                if let Some(raft) = inner.raft.get() {
                    raft.report_snapshot(to, delivered);
                }
            });
            return;
        }
        let queue = self.queue_for(to);
        let dropped = {
            let mut messages = queue
                .messages
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            messages.push_back(message);
            if messages.len() > self.inner.config.queue_capacity {
                messages.pop_front();
                true
            } else {
                false
            }
        };
        if dropped {
            metrics::counter!("sift_raft_messages_dropped_total", "reason" => "queue_full")
                .increment(1);
        } else {
            self.inner.set_depth(1);
        }
        queue.notify.notify_one();
    }

    fn set_peers(&self, peers: &std::collections::BTreeMap<u64, PeerAddress>) {
        let mut addresses = self
            .inner
            .addresses
            .write()
            .unwrap_or_else(|poison| poison.into_inner());
        for (id, address) in peers {
            if address.removed {
                addresses.remove(id);
            } else if *id != self.inner.config.id && !address.internal.is_empty() {
                addresses.insert(*id, address.internal.clone());
            }
        }
    }
}

/// Drains one peer's queue into batched requests until the transport is dropped.
async fn peer_sender(inner: Weak<Inner>, to: u64, queue: Arc<PeerQueue>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        // Wake on new messages, or now and then to notice the transport is gone.
        let _ = tokio::time::timeout(Duration::from_secs(1), queue.notify.notified()).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        loop {
            let batch: Vec<Message> = {
                let mut messages = queue
                    .messages
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner());
                let n = messages.len().min(inner.config.batch_messages);
                messages.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            inner.set_depth(-(batch.len() as i64));
            match send_batch(&inner, to, &batch).await {
                Ok(()) => backoff = Duration::from_millis(50),
                Err(error) => {
                    debug!(to, %error, "raft messages not delivered");
                    metrics::counter!("sift_raft_messages_dropped_total", "reason" => "send_failed")
                        .increment(batch.len() as u64);
                    if let Some(raft) = inner.raft.get() {
                        raft.report_unreachable(to);
                    }
                    // Reconnect after a pause; what queues meanwhile is bounded.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

async fn post_frame(inner: &Inner, to: u64, path: &str, body: Vec<u8>) -> Result<()> {
    let Some(address) = inner.address_of(to) else {
        metrics::counter!("sift_raft_messages_dropped_total", "reason" => "unknown_peer")
            .increment(1);
        return Err(ClusterError::Transport(format!("no address for node {to}")));
    };
    let response = inner
        .client
        .post(inner.url(&address, path))
        .bearer_auth(&inner.config.secret)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(body)
        .send()
        .await
        .map_err(|error| ClusterError::Transport(error.to_string()))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(ClusterError::Transport(format!(
            "node {to} answered {}",
            response.status()
        )))
    }
}

async fn send_batch(inner: &Inner, to: u64, batch: &[Message]) -> Result<()> {
    let mut messages = Vec::with_capacity(batch.len());
    for message in batch {
        messages.push(
            message
                .write_to_bytes()
                .map_err(|error| ClusterError::Transport(error.to_string()))?,
        );
    }
    let frame = encode_frame(&MessageBatch {
        from: inner.config.id,
        from_address: inner.config.advertise.clone(),
        messages,
    })?;
    post_frame(inner, to, MESSAGES_PATH, frame).await
}

/// Sends a snapshot message in chunks, in order. Returns whether all of it was accepted.
async fn send_snapshot(inner: &Inner, mut message: Message) -> bool {
    let to = message.to;
    let data = std::mem::take(&mut message.mut_snapshot().data);
    let Ok(header) = message.write_to_bytes() else {
        return false;
    };
    let transfer_id = inner.next_transfer.fetch_add(1, Ordering::Relaxed);
    let total_len = data.len() as u64;
    let chunk_bytes = inner.config.chunk_bytes.max(1);
    let mut offset = 0usize;
    loop {
        let end = (offset + chunk_bytes).min(data.len());
        let chunk = SnapshotChunk {
            from: inner.config.id,
            from_address: inner.config.advertise.clone(),
            transfer_id,
            offset: offset as u64,
            total_len,
            message: header.clone(),
            data: data[offset..end].to_vec(),
        };
        let sent = match encode_frame(&chunk) {
            Ok(frame) => post_frame(inner, to, SNAPSHOT_PATH, frame).await,
            Err(error) => Err(error),
        };
        if let Err(error) = sent {
            warn!(to, %error, "snapshot transfer failed");
            return false;
        }
        offset = end;
        if offset >= data.len() {
            return true;
        }
    }
}

#[cfg(test)]
mod tests;
