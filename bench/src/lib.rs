//! The measurements of `sift-bench` (the binary in `main.rs` parses the command line and calls
//! them). A library so the integration tests (`tests/tests/answers.rs`) run the same
//! measurement code as the bench against an in-process node.

pub mod answers;
pub mod chat;
pub mod client;
pub mod dataset;
pub mod error;
pub mod load;
pub mod metrics;
pub mod progress;
pub mod quality;
