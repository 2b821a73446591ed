//! Shard replicas on this node: one [`replica::ShardReplica`] actor per (KB, shard), each
//! owning a handle to its [`ShardIndex`](sift_storage::shard::ShardIndex), under the
//! [`supervisor::ShardsSupervisor`], which restarts a replica that panics while the node
//! keeps serving the other shards.

pub mod messages;
pub mod registry;
pub mod replica;
pub mod supervisor;

pub use messages::{LeafRequest, LeafResponse, ShardMessage};
pub use registry::{ShardKey, ShardRegistry};
pub use supervisor::{ShardsMessage, ShardsSupervisor};
