//! Cluster concerns of a Sift node.
//!
//! - [`placement`]: which shard a document belongs to (`hash(external id, else doc id) % shards`) and where its replicas live (least loaded nodes).
//! - [`meta_log`]: the door through which every metadata change passes. [`LocalMeta`] applies
//!   each [`MetaOp`](sift_storage::meta::MetaOp) to the local state machine in log order.
//! - [`raft`]: metadata consensus on raft-rs: the driver thread ([`raft::RaftNode`],
//!   [`raft::RaftHandle`]), the sled log ([`raft::SledRaftStorage`]), the state machine trait,
//!   an in-memory network for tests, and [`raft::ReplicatedMeta`], the clustered door with
//!   `LocalMeta::propose`'s contract, which the node uses in cluster mode.
//! - [`http_server`]: the accept loop of both HTTP servers (connection caps, header-read
//!   timeout, graceful shutdown).
//! - [`transport`]: the internal HTTP/2 transport between nodes (authenticated server,
//!   per-peer queues, chunked snapshots, forwarded proposals, joins).
//! - `testing` (tests and feature `testing`): a loopback HTTP test cluster.

pub mod error;
pub mod http_server;
pub mod meta_log;
pub mod placement;
pub mod raft;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod transport;

pub use error::{ClusterError, Result};
pub use meta_log::LocalMeta;
