//! Model clients.

pub mod embedding;
pub mod llm;
