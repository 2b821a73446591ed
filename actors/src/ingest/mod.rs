//! Ingestion: bytes -> text -> chunks -> vectors -> shard replicas.
//!
//! [`queue::IngestQueue`] admits jobs (bounded: a full queue is a 429), the
//! [`worker::IngestSupervisor`] runs [`worker::IngestWorker`]s that take jobs one at a time and
//! run [`pipeline::process`].

pub mod handoff;
pub mod pipeline;
pub mod queue;
pub mod raw_store;
pub mod worker;

/// Format parsers and the chunker live in the light `sift-parse` crate (fuzzed on their own).
pub use sift_parse::worker as parse_worker;
pub use sift_parse::{chunk, image, office, parse, pdf};
