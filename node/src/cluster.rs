//! Cluster mode (`sift serve --internal-listen`): the node's metadata goes through Raft.
//!
//! Starting a member: a data dir that already belongs to a Raft node restarts under its id; a
//! new one joins the cluster of `--join ADDR` (any member's public or internal address) or,
//! without `--join`, bootstraps a new single-voter cluster whose first snapshot is the
//! node's existing metadata. The same internal port serves shard requests
//! (`sift_actors::shards::rpc`) once the node is up: replicas of a KB's shards live on the
//! nodes its placement names.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use sift_actors::SiftNode;
use sift_actors::shards::SHARD_RPC_PATH;
use sift_actors::shards::rpc::{ShardReply, decode_request, encode_reply};

use anyhow::Context;
use serde::Serialize;
use sift_actors::meta::MetaHandle;
use sift_cluster::raft::{
    ClusterStatus, PeerAddress, RaftConfig, RaftHandle, RaftNode, ReplicatedMeta, SledRaftStorage,
};
use sift_cluster::tls::{PeerTls, ServerTls};
use sift_cluster::transport::{HttpTransport, InternalServer, TransportConfig, join_cluster};
use sift_storage::meta::SledMetaStore;
use tracing::{Instrument as _, info, warn};

use crate::config::ClusterConfig;

/// How long a proposal is retried (no leader yet, leadership changing) before a 503.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `--join` keeps trying to reach the cluster.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// A running cluster member: its Raft thread and internal server. Dropping it stops both.
pub struct ClusterMember {
    pub id: u64,
    /// This node's addresses as the cluster knows them.
    pub address: PeerAddress,
    raft: Option<RaftNode>,
    server: Option<InternalServer>,
}

impl ClusterMember {
    pub fn handle(&self) -> Option<&RaftHandle> {
        self.raft.as_ref().map(RaftNode::handle)
    }

    /// Stops the internal server, then the Raft thread.
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        if let Some(raft) = self.raft.take() {
            let _ = tokio::task::spawn_blocking(move || raft.stop()).await;
        }
    }
}

/// Where the shard route finds the node once it has started (shard requests that arrive
/// before are answered 503, and the sender tries another replica or marks this one dead).
pub type NodeSlot = Arc<OnceLock<Arc<SiftNode>>>;

/// Largest shard request body (writes are split below this by the sender).
const SHARD_BODY_LIMIT: usize = 80 * 1024 * 1024;

fn shard_routes(slot: NodeSlot) -> Router {
    Router::new()
        .route(SHARD_RPC_PATH, post(serve_shard_rpc))
        .layer(DefaultBodyLimit::max(SHARD_BODY_LIMIT))
        .with_state(slot)
}

async fn serve_shard_rpc(
    State(slot): State<NodeSlot>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let Some(node) = slot.get().cloned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the node is starting").into_response();
    };
    let Some(rpc) = decode_request(&body) else {
        metrics::counter!("sift_raft_transport_rejected_total", "reason" => "bad_shard_request")
            .increment(1);
        return (StatusCode::BAD_REQUEST, "unreadable shard request").into_response();
    };
    // The serving side of the sender's `shard_rpc` span, in the sender's trace.
    let span = tracing::info_span!(
        "serve_shard_rpc",
        otel.kind = "server",
        kind = rpc.kind(),
        kb_id = rpc.kb_id(),
        shard = rpc.shard(),
    );
    sift_actors::trace_context::adopt(&span, &headers);
    let reply: ShardReply = node.handle_shard_rpc(rpc).instrument(span).await;
    (
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        encode_reply(&reply),
    )
        .into_response()
}

/// What a member starts with besides its metadata store.
pub struct MemberStart<'a> {
    pub config: &'a ClusterConfig,
    /// The bound public address.
    pub public: SocketAddr,
    /// TLS on the internal listener (the public one's certificate).
    pub tls: Option<ServerTls>,
    /// How this node reaches the other members.
    pub peer_tls: PeerTls,
}

/// Starts this node's Raft member on `store` and returns the metadata door that proposes
/// through it. The internal server also serves shard requests for the node in `slot`.
pub async fn start_member(
    start: MemberStart<'_>,
    store: Arc<SledMetaStore>,
    slot: NodeSlot,
) -> anyhow::Result<(MetaHandle, ClusterMember)> {
    let MemberStart {
        config,
        public,
        tls,
        peer_tls,
    } = start;
    let listener = tokio::net::TcpListener::bind(config.internal_listen)
        .await
        .with_context(|| format!("binding the internal address {}", config.internal_listen))?;
    let address = PeerAddress {
        internal: listener.local_addr()?.to_string(),
        public: public.to_string(),
        removed: false,
    };
    let storage = SledRaftStorage::open(store.db()).context("opening the raft log")?;
    let id = match storage.node_id()? {
        Some(id) => {
            if config.join.is_some() {
                info!(
                    id,
                    "this data dir is already a cluster member: restarting, --join ignored"
                );
            }
            id
        }
        None => match &config.join {
            Some(seed) => {
                let seed = resolve_seed(seed, &config.secret, &peer_tls).await;
                info!(%seed, "joining the cluster");
                let id = join_cluster(
                    &seed,
                    &config.secret,
                    address.clone(),
                    JOIN_TIMEOUT,
                    &peer_tls,
                )
                .await
                .with_context(|| format!("joining the cluster at {seed}"))?;
                info!(id, "joined the cluster as a learner");
                id
            }
            None => {
                let id = 1;
                RaftNode::bootstrap(
                    &storage,
                    store.as_ref(),
                    BTreeMap::from([(id, address.clone())]),
                )
                .context("bootstrapping a new cluster")?;
                info!(id, "bootstrapped a new cluster from this node's metadata");
                id
            }
        },
    };
    let mut transport_config = TransportConfig::new(id, address.internal.clone(), &config.secret);
    transport_config.fault_injection = config.debug_faults;
    transport_config.peer_tls = peer_tls;
    let chunk_bytes = transport_config.chunk_bytes;
    let transport = HttpTransport::new(transport_config, tokio::runtime::Handle::current())?;
    let raft = RaftNode::start(
        RaftConfig::new(id),
        storage,
        store.clone(),
        Arc::new(transport.clone()),
    )
    .context("starting raft")?;
    transport.attach(raft.handle().clone());
    let server = InternalServer::start(
        listener,
        &config.secret,
        raft.handle().clone(),
        Some(transport.clone()),
        chunk_bytes,
        Some(shard_routes(slot)),
        tls,
    )?;
    info!(id, internal = %address.internal, "cluster member started");
    let meta = ReplicatedMeta::new(
        raft.handle().clone(),
        store,
        Some(transport),
        PROPOSE_TIMEOUT,
    );
    Ok((
        MetaHandle::replicated(meta),
        ClusterMember {
            id,
            address,
            raft: Some(raft),
            server: Some(server),
        },
    ))
}

/// `--join` may name a member's public address: its `GET /v1/cluster` tells the internal
/// address of the leader (or of any member); the cluster secret authorizes that read.
/// Anything else is taken as an internal address.
async fn resolve_seed(seed: &str, secret: &str, peer_tls: &PeerTls) -> String {
    let client = match peer_tls
        .client_builder()
        .timeout(Duration::from_secs(3))
        .build()
    {
        Ok(client) => client,
        Err(_) => return seed.to_string(),
    };
    let base = if seed.starts_with("http://") || seed.starts_with("https://") {
        seed.trim_end_matches('/').to_string()
    } else {
        format!("{}://{seed}", peer_tls.scheme())
    };
    let view = async {
        client
            .get(format!("{base}/v1/cluster"))
            .header(crate::auth::CLUSTER_SECRET_HEADER, secret)
            .send()
            .await
            .ok()?
            .error_for_status()
            .ok()?
            .json::<serde_json::Value>()
            .await
            .ok()
    }
    .await;
    let Some(view) = view else {
        return seed
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
    };
    let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
    let internal_of = |node: &serde_json::Value| node["internal_listen"].as_str().map(String::from);
    let leader = nodes
        .iter()
        .find(|node| node["id"] == view["leader"] && !view["leader"].is_null())
        .and_then(internal_of);
    match leader.or_else(|| nodes.iter().find_map(internal_of)) {
        Some(internal) => internal,
        None => {
            warn!(%seed, "the seed's /v1/cluster names no internal address (single node?)");
            seed.to_string()
        }
    }
}

/// One member in `GET /v1/cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeView {
    pub id: u64,
    pub listen: Option<String>,
    pub internal_listen: Option<String>,
    /// `leader`, `follower`, `learner` (or `candidate` during an election).
    pub role: String,
    pub healthy: bool,
    /// Known for this node, and for every member on the leader.
    pub commit: Option<u64>,
    pub applied: Option<u64>,
    /// The replicated index (leader only).
    pub matched: Option<u64>,
    /// Milliseconds since this node last heard from the member.
    pub last_contact_ms: Option<u64>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// `single` (no `--internal-listen`) or `cluster`.
    #[schema(value_type = String)]
    pub mode: &'static str,
    /// The node answering.
    pub id: u64,
    pub leader: Option<u64>,
    pub term: u64,
    pub nodes: Vec<NodeView>,
    /// What this node knows of replicas being moved, recovered or drained.
    pub rebalancing: sift_actors::node::Rebalancing,
    /// Why this node's Raft thread stopped (a storage write failed); absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub storage_failure: Option<String>,
}

impl ClusterView {
    /// A single node (no `--internal-listen`): it is its own leader.
    pub fn single(
        listen: SocketAddr,
        applied: u64,
        rebalancing: sift_actors::node::Rebalancing,
    ) -> ClusterView {
        ClusterView {
            mode: "single",
            id: 1,
            leader: Some(1),
            term: 0,
            rebalancing,
            storage_failure: None,
            nodes: vec![NodeView {
                id: 1,
                listen: Some(listen.to_string()),
                internal_listen: None,
                role: "leader".into(),
                healthy: true,
                commit: Some(applied),
                applied: Some(applied),
                matched: None,
                last_contact_ms: None,
            }],
        }
    }

    /// A cluster member's view, from its Raft status.
    pub fn member(
        status: &ClusterStatus,
        own: &PeerAddress,
        rebalancing: sift_actors::node::Rebalancing,
    ) -> ClusterView {
        let role = |id: u64, learner: bool| {
            if status.leader == Some(id) {
                "leader"
            } else if learner {
                "learner"
            } else {
                "follower"
            }
        };
        let own_role = match status.role.as_str() {
            "leader" | "learner" | "follower" => status.role.clone(),
            other => other.to_string(),
        };
        let mut nodes = vec![NodeView {
            id: status.id,
            listen: Some(own.public.clone()),
            internal_listen: Some(own.internal.clone()),
            role: own_role,
            healthy: true,
            commit: Some(status.commit),
            applied: Some(status.applied),
            matched: None,
            last_contact_ms: Some(0),
        }];
        for peer in &status.peers {
            let address = peer.address.as_ref();
            nodes.push(NodeView {
                id: peer.id,
                listen: address.map(|a| a.public.clone()).filter(|a| !a.is_empty()),
                internal_listen: address.map(|a| a.internal.clone()),
                role: role(peer.id, peer.role == "learner").into(),
                healthy: peer.healthy,
                commit: None,
                applied: None,
                matched: peer.matched,
                last_contact_ms: peer.last_contact_ms,
            });
        }
        nodes.sort_by_key(|node| node.id);
        ClusterView {
            mode: "cluster",
            id: status.id,
            leader: status.leader,
            term: status.term,
            nodes,
            rebalancing,
            storage_failure: status.storage_failure.clone(),
        }
    }
}
