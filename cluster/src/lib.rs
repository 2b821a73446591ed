//! Cluster concerns of a Sift node.
//!
//! - [`placement`]: which shard a document belongs to (`hash(doc_id) % shards`).
//! - [`meta_log`]: the door through which every metadata change passes. [`LocalMeta`] applies
//!   each [`MetaOp`](sift_storage::meta::MetaOp) to the local state machine in log order; the
//!   Raft issue replaces it with consensus behind the same `propose` call.

pub mod error;
pub mod meta_log;
pub mod placement;
pub mod raft;
pub mod transport;

pub use error::{ClusterError, Result};
pub use meta_log::LocalMeta;
