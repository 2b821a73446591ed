//! A cluster of Raft nodes talking over the real internal HTTP transport on loopback, each
//! with its own sled directory: for this crate's tests and its `raft_http` bench (feature
//! `testing`). Helpers panic on failure; they are not for production code.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sift_storage::meta::{KbRecord, KbSettings, MetaOp, MetaOutcome, SledMetaStore};

use crate::raft::driver::{RaftConfig, RaftNode};
use crate::raft::state_machine::Proposal;
use crate::raft::storage::{PeerAddress, SledRaftStorage};
use crate::transport::{HttpTransport, InternalServer, TransportConfig};

/// The cluster secret of every test cluster.
pub const SECRET: &str = "test-cluster-secret";
/// How long the helpers wait for a leader, a write or convergence before they panic.
pub const WAIT: Duration = Duration::from_secs(60);

/// A proposal that creates a one-shard KB named `name` (id `id-{name}`).
pub fn create_kb(name: &str) -> Proposal {
    Proposal::new(MetaOp::CreateKb(KbRecord {
        id: format!("id-{name}"),
        name: name.into(),
        settings: KbSettings::new(1, 1, "all-MiniLM-L6-v2", 384),
        created_at_ms: 1,
        updated_at_ms: 1,
        placement: Vec::new(),
    }))
}

pub struct HttpNode {
    pub raft: RaftNode,
    pub transport: HttpTransport,
    _server: InternalServer,
    pub store: Arc<SledMetaStore>,
}

/// Nodes by id. Like the in-memory test cluster, a killed node keeps its database open (sled 0.34 can
/// deadlock when a database is dropped while another one in the process is written).
pub struct HttpCluster {
    dirs: BTreeMap<u64, tempfile::TempDir>,
    stores: BTreeMap<u64, Arc<SledMetaStore>>,
    pub addresses: BTreeMap<u64, PeerAddress>,
    pub nodes: BTreeMap<u64, HttpNode>,
    chunk_bytes: usize,
    raft_config: fn(u64) -> RaftConfig,
}

impl Drop for HttpCluster {
    fn drop(&mut self) {
        for (_, node) in std::mem::take(&mut self.nodes) {
            node.raft.stop();
        }
    }
}

impl HttpCluster {
    pub async fn start(ids: &[u64], chunk_bytes: usize) -> Self {
        Self::start_with(ids, chunk_bytes, RaftConfig::for_test).await
    }

    pub async fn start_with(
        ids: &[u64],
        chunk_bytes: usize,
        raft_config: fn(u64) -> RaftConfig,
    ) -> Self {
        let mut listeners = BTreeMap::new();
        let mut addresses = BTreeMap::new();
        for id in ids {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap().to_string();
            addresses.insert(
                *id,
                PeerAddress {
                    internal: address.clone(),
                    public: String::new(),
                    removed: false,
                },
            );
            listeners.insert(*id, listener);
        }
        let mut cluster = HttpCluster {
            dirs: BTreeMap::new(),
            stores: BTreeMap::new(),
            addresses,
            nodes: BTreeMap::new(),
            chunk_bytes,
            raft_config,
        };
        for (id, listener) in listeners {
            cluster.start_node(id, listener, true);
        }
        cluster
    }

    pub fn start_node(&mut self, id: u64, listener: tokio::net::TcpListener, bootstrap: bool) {
        let dir = self
            .dirs
            .entry(id)
            .or_insert_with(|| tempfile::tempdir().unwrap());
        let store = self
            .stores
            .entry(id)
            .or_insert_with(|| Arc::new(SledMetaStore::open(dir.path()).unwrap()))
            .clone();
        let storage = SledRaftStorage::open(store.db()).unwrap();
        if bootstrap {
            RaftNode::bootstrap(&storage, store.as_ref(), self.addresses.clone()).unwrap();
        }
        let mut config = TransportConfig::new(id, self.addresses[&id].internal.clone(), SECRET);
        config.chunk_bytes = self.chunk_bytes;
        let transport = HttpTransport::new(config, tokio::runtime::Handle::current()).unwrap();
        let raft = RaftNode::start(
            (self.raft_config)(id),
            storage,
            store.clone(),
            Arc::new(transport.clone()),
        )
        .unwrap();
        transport.attach(raft.handle().clone());
        let server = InternalServer::start(
            listener,
            SECRET,
            raft.handle().clone(),
            Some(transport.clone()),
            self.chunk_bytes,
            None,
            None,
        )
        .unwrap();
        self.nodes.insert(
            id,
            HttpNode {
                raft,
                transport,
                _server: server,
                store,
            },
        );
    }

    pub async fn restart(&mut self, id: u64) {
        let address = self.addresses[&id].internal.clone();
        let listener = tokio::net::TcpListener::bind(&address).await.unwrap();
        self.start_node(id, listener, false);
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(node) = self.nodes.remove(&id) {
            node.raft.stop();
        }
    }

    pub async fn leader(&self) -> u64 {
        wait_for("a leader", || {
            let statuses: Vec<_> = self
                .nodes
                .values()
                .map(|n| n.raft.handle().status())
                .collect();
            let leader = statuses.iter().find(|status| status.role == "leader")?;
            statuses
                .iter()
                .all(|status| status.leader == Some(leader.id))
                .then_some(leader.id)
        })
        .await
    }

    pub async fn write(&self, proposal: &Proposal) -> MetaOutcome {
        let deadline = Instant::now() + WAIT;
        loop {
            for node in self.nodes.values() {
                let handle = node.raft.handle();
                if handle.status().role != "leader" {
                    continue;
                }
                match handle.propose_proposal(proposal.clone()).await {
                    Ok(outcome) => return outcome,
                    Err(error) => assert!(error.is_transient(), "{error}"),
                }
            }
            assert!(Instant::now() < deadline, "write not applied");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn converged(&self) -> Vec<Vec<u8>> {
        wait_for("convergence", || {
            let statuses: Vec<_> = self
                .nodes
                .values()
                .map(|n| n.raft.handle().status())
                .collect();
            let commit = statuses.iter().map(|status| status.commit).max()?;
            let applied: Vec<u64> = self
                .nodes
                .values()
                .map(|node| {
                    sift_storage::meta::MetaStateMachine::applied_index(node.store.as_ref())
                })
                .collect();
            (statuses
                .iter()
                .all(|status| status.applied == commit && status.commit == commit)
                && applied.iter().all(|index| *index == applied[0]))
            .then_some(())
        })
        .await;
        self.nodes
            .values()
            .map(|node| node.store.export_state().unwrap())
            .collect()
    }
}

pub async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
