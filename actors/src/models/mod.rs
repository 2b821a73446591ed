//! Model and service clients.

pub mod embedding;
pub mod llm;
pub mod mcp;
pub mod web_search;
