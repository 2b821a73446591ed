//! Model clients.

pub mod embedding;
