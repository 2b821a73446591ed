//! The actor side of a Sift node: the supervision tree, ingestion, retrieval, model clients.
//!
//! ```text
//! SiftNode
//! ├── ShardsSupervisor ── ShardReplica{kb, shard} x N   (owns a ShardIndex handle)
//! └── IngestSupervisor ── IngestWorker x W               (bounded IngestQueue in front)
//! ```
//!
//! - [`node::SiftNode`]: boots the tree, recovers after a crash, and offers every operation
//!   the HTTP API exposes (KBs, documents, search).
//! - [`ingest`]: parsing ([`ingest::parse`]), structure-aware chunking ([`ingest::chunk`]),
//!   the bounded queue, workers and the pipeline.
//! - [`shards`]: shard replica actors and their supervisor.
//! - [`retrieval`]: scatter-gather over shards with a deadline, per-channel merge, RRF.
//! - [`models`]: the embedded all-MiniLM-L6-v2 embedder (candle) and OpenAI-compatible
//!   `/v1/embeddings` clients.
//! - [`meta`]: the node's handle on the metadata log, publishing document events.
//! - [`sessions`]: chat sessions, supervised agent runs with resumable event logs, admission.

pub mod agent;
pub mod context;
pub mod error;
pub mod events;
pub mod ingest;
pub mod meta;
pub mod models;
pub mod node;
pub mod reconcile;
pub mod retrieval;
pub mod sessions;
pub mod shards;

pub use context::{EMBEDDED_MODEL, Embedders, NodeContext, NodeOptions};
pub use error::{Result, SiftError};
pub use node::SiftNode;
