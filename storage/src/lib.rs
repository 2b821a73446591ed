//! Data on one Sift node, with no actors and no network.
//!
//! - [`meta`]: the metadata state machine. Every metadata change is a serialisable
//!   [`meta::MetaOp`] applied by [`meta::SledMetaStore`] (one sled database). In a cluster
//!   `sift_cluster` commits the ops through Raft (raft-rs) and applies the committed ones here
//!   in log order, so every node holds the same metadata; a single node applies them directly.
//!   The metadata includes each KB's placement: which nodes hold the replicas of its shards.
//! - [`shard`]: one shard replica's indexes: an HNSW dense index (hnsw_rs), a BM25 index
//!   (tantivy, English stemming + jieba for CJK) and a chunk store (sled) that doubles as the
//!   write-ahead record from which the indexes are rebuilt after a crash.
//! - [`chunk`]: the records that flow from ingestion into a shard and out of a search.
//! - [`embedding_cache`]: a node-local cache of embeddings, keyed by model and text.
//! - [`extraction_cache`]: a node-local cache of a model's graph extractions, keyed likewise.
//! - [`backup`]: snapshots of chosen KBs on disk (manifest, record files, verification).
//! - [`sled_db`]: opens a sled database, waiting out the lock a just-dropped handle holds.

pub mod backup;
pub mod chunk;
pub mod data_dir;
pub mod embedding_cache;
pub mod error;
pub mod extraction_cache;
pub mod meta;
pub mod shard;
pub mod sled_db;

pub use error::{Result, StorageError};
