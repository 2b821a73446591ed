//! Web search through an HTTP provider speaking the SearxNG JSON format
//! (`GET {base_url}/search?q=...&format=json` -> `{"results": [{"url", "title", "content"}]}`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSearchConfig {
    /// The SearxNG root, e.g. `http://127.0.0.1:8888`.
    pub base_url: String,
    #[serde(default = "default_web_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_max_results")]
    pub max_results: usize,
}

fn default_web_timeout_ms() -> u64 {
    10_000
}

fn default_max_results() -> usize {
    5
}
