//! The actor side of a Sift node: the supervision tree, ingestion, retrieval, sessions and the
//! agent. Model clients live in `sift-models`.
//!
//! ```text
//! NodeSupervisor                         (node/supervisor.rs; restarts with capped backoff)
//! ├── Reconciler                         (reconcile/; acts while its node leads)
//! ├── ShardsSupervisor ── ShardReplica{kb, shard} x N   (owns a ShardIndex handle)
//! └── IngestSupervisor ── IngestWorker x W               (bounded IngestQueue in front)
//! ```
//!
//! - [`node::SiftNode`]: boots the tree, recovers after a crash, and offers every operation
//!   the HTTP API exposes (KBs, documents, search).
//! - [`ingest`]: parsing ([`ingest::parse`]), structure-aware chunking ([`ingest::chunk`]),
//!   the bounded queue, workers and the pipeline.
//! - [`shards`]: shard replica actors, their supervisor, access to replicas anywhere in the
//!   cluster and the shard RPC.
//! - [`retrieval`]: scatter-gather over shards with a deadline, per-channel merge, fusion,
//!   re-scoring and link following.
//! - [`reconcile`]: the leader's housekeeping (replicas, repair, raw-byte collection,
//!   rebalancing, reassignment of silent workers).
//! - [`meta`]: the node's handle on the metadata log, publishing document events.
//! - [`sessions`]: chat sessions, supervised agent runs with resumable event logs, admission.
//! - [`agent`]: the agent loop, its tools and its answer checks.

pub mod agent;
pub mod context;
pub mod error;
pub mod events;
pub mod graph;
pub mod ingest;
pub mod meta;
pub mod node;
pub mod reconcile;
pub mod retrieval;
pub mod scope;
pub mod sessions;
pub mod shards;
pub mod trace_context;

pub use context::{EMBEDDED_MODEL, Embedders, NodeContext, NodeOptions};
pub use error::{ErrorKind, Result, SiftError};
pub use node::SiftNode;
pub use scope::{Need, Scope};
