//! Shard replicas on this node: one [`replica::ShardReplica`] actor per (KB, shard), each
//! owning a handle to its [`ShardIndex`](sift_storage::shard::ShardIndex), under the
//! [`supervisor::ShardsSupervisor`], which restarts a replica that panics while the node
//! keeps serving the other shards.

//!
//! A KB's shards may have replicas on other nodes: [`access::ShardAccess`] routes reads,
//! writes and deletes to the replicas the placement names, over [`rpc`] for remote ones;
//! [`rpc_server`] serves those requests when they reach this node.

pub mod access;
pub mod error;
mod hedge;
pub mod messages;
pub mod registry;
pub mod replica;
pub mod rpc;
pub mod rpc_server;
pub mod supervisor;

pub use access::{AccessOptions, ShardAccess};
pub use error::ShardError;
pub use messages::{GraphLeafRequest, GraphLeafResponse, LeafRequest, LeafResponse, ShardMessage};
pub use registry::{ShardKey, ShardRegistry};
pub use rpc::{Peers, SHARD_RPC_PATH, ShardReply, ShardRpc};
pub use supervisor::{ShardsMessage, ShardsSupervisor};
