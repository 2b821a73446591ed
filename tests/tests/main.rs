//! The integration tests: one binary, one module per file beside this one.
//!
//! `cargo test -p sift-tests --test integration` runs them all; a module's name filters them,
//! e.g. `cargo test -p sift-tests --test integration replication_process::`.

mod answers;
mod api_errors;
mod audit;
mod auth;
mod clients;
mod cluster_process;
mod crash_loop;
mod document_access;
mod durability;
mod graph;
mod ingestion;
mod metrics;
mod ocr;
mod office;
mod operability;
mod pdf;
mod quality;
mod quotas;
mod remote_embedder;
mod replacement_process;
mod replication_process;
mod retrieval;
mod sessions;
mod sessions_process;
mod shard_crash;
mod snapshots;
mod supervision_process;
mod tenants;
mod tls;
mod traces;
mod upgrade;
mod url_import;
