//! Configuration of the chat model providers (the clients are built from it in `build.rs`).
//!
//! One OpenAI-compatible provider can come from the environment alone (`SIFT_LLM_BASE_URL`,
//! `SIFT_LLM_MODEL`, `SIFT_LLM_API_KEY`, see [`LlmConfig::from_env`]); several providers,
//! Anthropic and the routing settings come from the config file:
//!
//! ```toml
//! [[llm.providers]]
//! name = "local"
//! kind = "openai"
//! base_url = "http://127.0.0.1:8089/v1"
//! model = "local"
//! tool_mode = "json_schema"
//! priority = 0
//!
//! [[llm.providers]]
//! name = "claude"
//! kind = "anthropic"
//! base_url = "https://api.anthropic.com/v1"
//! model = "claude-sonnet-4-5"
//! api_key = "..."
//! priority = 1
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::LlmError;

/// Environment variables of the env-only setup.
pub const BASE_URL_ENV: &str = "SIFT_LLM_BASE_URL";
pub const MODEL_ENV: &str = "SIFT_LLM_MODEL";
pub const API_KEY_ENV: &str = "SIFT_LLM_API_KEY";
/// Optional overrides of the env-only provider.
pub const TOOL_MODE_ENV: &str = "SIFT_LLM_TOOL_MODE";
pub const CONTEXT_WINDOW_ENV: &str = "SIFT_LLM_CONTEXT_WINDOW";
pub const FIRST_TOKEN_TIMEOUT_ENV: &str = "SIFT_LLM_FIRST_TOKEN_TIMEOUT_MS";

/// All chat model providers; the router tries them by `priority`, lowest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
}

/// The wire format a provider speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// `POST {base_url}/chat/completions` (OpenAI, vLLM, Ollama, llama.cpp, DeepSeek, Qwen).
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// `POST {base_url}/messages` (Anthropic Messages API).
    Anthropic,
}

/// How tools are offered to the model and its calls read back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    /// The API's own tool calling (`tools` / `tool_calls`, `tool_use` blocks).
    #[default]
    Native,
    /// Tools described in the system prompt; calls written as JSON in the text are parsed.
    Text,
    /// Each step requested as JSON `{thought, tool, arguments}` constrained by
    /// `response_format: json_schema` (OpenAI-compatible providers only).
    JsonSchema,
}

/// One provider.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Unique; used in logs, metrics labels and errors.
    pub name: String,
    #[serde(default)]
    pub kind: ProviderKind,
    /// API root including the version, e.g. `http://127.0.0.1:8089/v1` or
    /// `https://api.anthropic.com/v1`.
    pub base_url: String,
    pub model: String,
    /// Bearer token (OpenAI) or `x-api-key` (Anthropic).
    #[serde(default)]
    pub api_key: Option<String>,
    /// Lower is tried first; equal priorities keep their order in the file.
    #[serde(default)]
    pub priority: u32,
    #[serde(default = "default_context_window")]
    pub context_window: u32,
    #[serde(default)]
    pub tool_mode: ToolMode,
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// From sending the request to the first streamed event.
    #[serde(default = "default_first_token_timeout_ms")]
    pub first_token_timeout_ms: u64,
    /// Longest gap between two streamed events.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Retries on this provider (retryable errors before the first token only) before failing
    /// over to the next one.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// First retry delay; doubled on each further retry.
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    /// Consecutive failures that open the circuit breaker.
    #[serde(default = "default_breaker_failure_threshold")]
    pub breaker_failure_threshold: u32,
    /// How long an open breaker refuses requests before letting one probe through.
    #[serde(default = "default_breaker_open_ms")]
    pub breaker_open_ms: u64,
    /// `max_tokens` sent when the request sets none (Anthropic requires one).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
}

fn default_context_window() -> u32 {
    8192
}
fn default_connect_timeout_ms() -> u64 {
    5_000
}
fn default_first_token_timeout_ms() -> u64 {
    60_000
}
fn default_idle_timeout_ms() -> u64 {
    30_000
}
fn default_max_retries() -> u32 {
    1
}
fn default_backoff_ms() -> u64 {
    200
}
fn default_breaker_failure_threshold() -> u32 {
    3
}
fn default_breaker_open_ms() -> u64 {
    30_000
}
fn default_max_tokens() -> u32 {
    2048
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("priority", &self.priority)
            .field("context_window", &self.context_window)
            .field("tool_mode", &self.tool_mode)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("first_token_timeout_ms", &self.first_token_timeout_ms)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("backoff_ms", &self.backoff_ms)
            .field("breaker_failure_threshold", &self.breaker_failure_threshold)
            .field("breaker_open_ms", &self.breaker_open_ms)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

impl ProviderConfig {
    /// An OpenAI-compatible provider named `openai` with every default (the env-only setup).
    pub fn openai(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
    ) -> Self {
        ProviderConfig::with_kind(ProviderKind::OpenAi, "openai", base_url, model, api_key)
    }

    /// An Anthropic provider named `anthropic` with every default.
    pub fn anthropic(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
    ) -> Self {
        ProviderConfig::with_kind(
            ProviderKind::Anthropic,
            "anthropic",
            base_url,
            model,
            api_key,
        )
    }

    fn with_kind(
        kind: ProviderKind,
        name: &str,
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
    ) -> Self {
        ProviderConfig {
            name: name.to_owned(),
            kind,
            base_url: base_url.into(),
            model: model.into(),
            api_key: api_key.filter(|key| !key.is_empty()),
            priority: 0,
            context_window: default_context_window(),
            tool_mode: ToolMode::Native,
            connect_timeout_ms: default_connect_timeout_ms(),
            first_token_timeout_ms: default_first_token_timeout_ms(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_retries: default_max_retries(),
            backoff_ms: default_backoff_ms(),
            breaker_failure_threshold: default_breaker_failure_threshold(),
            breaker_open_ms: default_breaker_open_ms(),
            max_tokens: default_max_tokens(),
        }
    }

    /// `requests` posted to `{base_url}/{path}` (no doubled slash).
    pub(crate) fn endpoint(&self, path: &str) -> String {
        format!("{}/{path}", self.base_url.trim_end_matches('/'))
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// Checks one provider on its own; messages name the provider and the field.
    pub fn validate(&self) -> Result<(), LlmError> {
        let name = &self.name;
        let fail = |message: String| Err(LlmError::Config(message));
        if name.trim().is_empty() {
            return fail("a provider has an empty name".to_owned());
        }
        if !(self.base_url.starts_with("http://") || self.base_url.starts_with("https://")) {
            return fail(format!(
                "provider {name}: base_url must start with http:// or https://, got {:?}",
                self.base_url
            ));
        }
        if self.model.trim().is_empty() {
            return fail(format!("provider {name}: model is empty"));
        }
        if self.context_window == 0 {
            return fail(format!("provider {name}: context_window must be positive"));
        }
        if self.max_tokens == 0 {
            return fail(format!("provider {name}: max_tokens must be positive"));
        }
        for (field, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("first_token_timeout_ms", self.first_token_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("breaker_open_ms", self.breaker_open_ms),
        ] {
            if value == 0 {
                return fail(format!("provider {name}: {field} must be positive"));
            }
        }
        // A week: longer deadlines overflow clock arithmetic (an Instant plus the duration).
        const MAX_MS: u64 = 7 * 24 * 3600 * 1000;
        for (field, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("first_token_timeout_ms", self.first_token_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("breaker_open_ms", self.breaker_open_ms),
            ("backoff_ms", self.backoff_ms),
        ] {
            if value > MAX_MS {
                return fail(format!(
                    "provider {name}: {field} must be at most {MAX_MS} (a week), not {value}"
                ));
            }
        }
        if self.breaker_failure_threshold == 0 {
            return fail(format!(
                "provider {name}: breaker_failure_threshold must be at least 1"
            ));
        }
        if self.kind == ProviderKind::Anthropic && self.tool_mode == ToolMode::JsonSchema {
            return fail(format!(
                "provider {name}: tool_mode json_schema needs an OpenAI-compatible provider \
                 (the Anthropic API has no response_format); use native or text"
            ));
        }
        Ok(())
    }
}

impl LlmConfig {
    /// The env-only setup: one OpenAI-compatible provider named `openai` when
    /// `SIFT_LLM_BASE_URL` and `SIFT_LLM_MODEL` are set, none otherwise. Optional:
    /// `SIFT_LLM_API_KEY`, `SIFT_LLM_TOOL_MODE` (`native` | `text` | `json_schema`; small local
    /// models do best with `json_schema`), `SIFT_LLM_CONTEXT_WINDOW`,
    /// `SIFT_LLM_FIRST_TOKEN_TIMEOUT_MS` (slow CPU models need more than the default 60 s).
    pub fn from_env() -> Result<LlmConfig, LlmError> {
        LlmConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`LlmConfig::from_env`] over any variable lookup (testable without touching the
    /// process environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<LlmConfig, LlmError> {
        let base_url = lookup(BASE_URL_ENV).filter(|value| !value.trim().is_empty());
        let model = lookup(MODEL_ENV).filter(|value| !value.trim().is_empty());
        match (base_url, model) {
            (None, None) => Ok(LlmConfig::default()),
            (Some(base_url), Some(model)) => {
                let mut provider = ProviderConfig::openai(base_url, model, lookup(API_KEY_ENV));
                if let Some(mode) = lookup(TOOL_MODE_ENV).filter(|value| !value.trim().is_empty()) {
                    provider.tool_mode = parse_tool_mode(&mode)?;
                }
                if let Some(window) = parse_number(&lookup, CONTEXT_WINDOW_ENV)? {
                    provider.context_window = window;
                }
                if let Some(timeout) = parse_number(&lookup, FIRST_TOKEN_TIMEOUT_ENV)? {
                    provider.first_token_timeout_ms = timeout;
                }
                provider.validate()?;
                Ok(LlmConfig {
                    providers: vec![provider],
                })
            }
            (Some(_), None) => Err(LlmError::Config(format!(
                "{BASE_URL_ENV} is set but {MODEL_ENV} is not"
            ))),
            (None, Some(_)) => Err(LlmError::Config(format!(
                "{MODEL_ENV} is set but {BASE_URL_ENV} is not"
            ))),
        }
    }

    /// Checks every provider and that names are unique.
    pub fn validate(&self) -> Result<(), LlmError> {
        let mut names = BTreeSet::new();
        for provider in &self.providers {
            provider.validate()?;
            if !names.insert(provider.name.as_str()) {
                return Err(LlmError::Config(format!(
                    "provider name {:?} is used twice",
                    provider.name
                )));
            }
        }
        Ok(())
    }

    /// The providers in the order the router tries them.
    pub fn providers_by_priority(&self) -> Vec<&ProviderConfig> {
        let mut providers: Vec<&ProviderConfig> = self.providers.iter().collect();
        providers.sort_by_key(|provider| provider.priority);
        providers
    }
}

fn parse_tool_mode(value: &str) -> Result<ToolMode, LlmError> {
    match value.trim() {
        "native" => Ok(ToolMode::Native),
        "text" => Ok(ToolMode::Text),
        "json_schema" => Ok(ToolMode::JsonSchema),
        other => Err(LlmError::Config(format!(
            "{TOOL_MODE_ENV} must be native, text or json_schema, got {other:?}"
        ))),
    }
}

fn parse_number<T: std::str::FromStr>(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>, LlmError> {
    let Some(value) = lookup(name).filter(|value| !value.trim().is_empty()) else {
        return Ok(None);
    };
    value
        .trim()
        .parse()
        .map(Some)
        .map_err(|_| LlmError::Config(format!("{name} must be a positive number, got {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::build_router;

    #[test]
    fn defaults_fill_a_minimal_provider() {
        let config: LlmConfig = serde_json::from_value(serde_json::json!({
            "providers": [{"name": "local", "base_url": "http://127.0.0.1:8089/v1", "model": "m"}]
        }))
        .unwrap();
        let provider = &config.providers[0];
        assert_eq!(provider.kind, ProviderKind::OpenAi);
        assert_eq!(provider.tool_mode, ToolMode::Native);
        assert_eq!(provider.context_window, 8192);
        assert_eq!(provider.breaker_failure_threshold, 3);
        assert_eq!(provider.breaker_open_ms, 30_000);
        assert_eq!(
            provider,
            &ProviderConfig {
                name: "local".to_owned(),
                ..ProviderConfig::openai("http://127.0.0.1:8089/v1", "m", None)
            }
        );
    }

    #[test]
    fn kinds_and_tool_modes_parse_by_their_documented_names() {
        let config: LlmConfig = serde_json::from_value(serde_json::json!({
            "providers": [
                {"name": "a", "kind": "anthropic", "base_url": "https://x/v1", "model": "m"},
                {"name": "b", "kind": "openai", "base_url": "http://x/v1", "model": "m",
                 "tool_mode": "json_schema"},
                {"name": "c", "base_url": "http://x/v1", "model": "m", "tool_mode": "text"},
            ]
        }))
        .unwrap();
        assert_eq!(config.providers[0].kind, ProviderKind::Anthropic);
        assert_eq!(config.providers[1].tool_mode, ToolMode::JsonSchema);
        assert_eq!(config.providers[2].tool_mode, ToolMode::Text);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let error = serde_json::from_value::<LlmConfig>(serde_json::json!({
            "providers": [{"name": "a", "base_url": "http://x/v1", "model": "m", "modle": "x"}]
        }))
        .unwrap_err();
        assert!(error.to_string().contains("modle"), "{error}");
    }

    #[test]
    fn invalid_configs_get_clear_messages() {
        let good = ProviderConfig::openai("http://x/v1", "m", None);
        let cases = [
            (
                ProviderConfig {
                    base_url: "x/v1".to_owned(),
                    ..good.clone()
                },
                "base_url must start with http",
            ),
            (
                ProviderConfig {
                    model: String::new(),
                    ..good.clone()
                },
                "model is empty",
            ),
            (
                ProviderConfig {
                    idle_timeout_ms: 0,
                    ..good.clone()
                },
                "idle_timeout_ms must be positive",
            ),
            (
                ProviderConfig {
                    breaker_failure_threshold: 0,
                    ..good.clone()
                },
                "breaker_failure_threshold",
            ),
            (
                ProviderConfig {
                    kind: ProviderKind::Anthropic,
                    tool_mode: ToolMode::JsonSchema,
                    ..good.clone()
                },
                "json_schema needs an OpenAI-compatible provider",
            ),
        ];
        for (provider, expected) in cases {
            let config = LlmConfig {
                providers: vec![provider],
            };
            let error = build_router(&config)
                .err()
                .expect("invalid config accepted");
            assert!(error.to_string().contains(expected), "{error}");
        }
        let twice = LlmConfig {
            providers: vec![good.clone(), good],
        };
        let error = build_router(&twice)
            .err()
            .expect("duplicate names accepted");
        assert!(error.to_string().contains("used twice"), "{error}");
    }

    #[test]
    fn no_providers_means_no_model() {
        assert!(build_router(&LlmConfig::default()).unwrap().is_none());
    }

    #[test]
    fn env_setup_needs_base_url_and_model_together() {
        let lookup = |pairs: Vec<(&'static str, &'static str)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| (*value).to_owned())
            }
        };
        assert_eq!(
            LlmConfig::from_lookup(lookup(vec![])).unwrap(),
            LlmConfig::default()
        );
        let config = LlmConfig::from_lookup(lookup(vec![
            (BASE_URL_ENV, "http://127.0.0.1:8089/v1"),
            (MODEL_ENV, "local"),
            (API_KEY_ENV, "secret"),
        ]))
        .unwrap();
        assert_eq!(config.providers.len(), 1);
        assert_eq!(config.providers[0].api_key.as_deref(), Some("secret"));
        assert!(!format!("{:?}", config.providers[0]).contains("secret"));
        let error =
            LlmConfig::from_lookup(lookup(vec![(BASE_URL_ENV, "http://x/v1")])).unwrap_err();
        assert!(error.to_string().contains(MODEL_ENV), "{error}");
        let tuned = LlmConfig::from_lookup(lookup(vec![
            (BASE_URL_ENV, "http://127.0.0.1:8089/v1"),
            (MODEL_ENV, "local"),
            (TOOL_MODE_ENV, "json_schema"),
            (CONTEXT_WINDOW_ENV, "4096"),
            (FIRST_TOKEN_TIMEOUT_ENV, "180000"),
        ]))
        .unwrap();
        assert_eq!(tuned.providers[0].tool_mode, ToolMode::JsonSchema);
        assert_eq!(tuned.providers[0].context_window, 4096);
        assert_eq!(tuned.providers[0].first_token_timeout_ms, 180_000);
        for (name, value, expected) in [
            (TOOL_MODE_ENV, "xml", "must be native, text or json_schema"),
            (CONTEXT_WINDOW_ENV, "big", "must be a positive number"),
            (CONTEXT_WINDOW_ENV, "0", "context_window must be positive"),
        ] {
            let pairs = vec![
                (BASE_URL_ENV, "http://x/v1"),
                (MODEL_ENV, "m"),
                (name, value),
            ];
            let error = LlmConfig::from_lookup(lookup(pairs)).unwrap_err();
            assert!(error.to_string().contains(expected), "{error}");
        }
    }

    #[test]
    fn priority_orders_providers_stably() {
        let mut first = ProviderConfig::openai("http://a/v1", "m", None);
        first.name = "first".to_owned();
        first.priority = 5;
        let mut second = first.clone();
        second.name = "second".to_owned();
        second.priority = 1;
        let mut third = first.clone();
        third.name = "third".to_owned();
        let config = LlmConfig {
            providers: vec![first, second, third],
        };
        let names: Vec<&str> = config
            .providers_by_priority()
            .iter()
            .map(|provider| provider.name.as_str())
            .collect();
        assert_eq!(names, ["second", "first", "third"]);
        let router = build_router(&config).unwrap().unwrap();
        assert_eq!(router.context_window(), 8192);
    }
}
