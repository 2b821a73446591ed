//! Provider clients and the router, built from their configuration.

use std::sync::Arc;
use std::time::Duration;

use super::anthropic::AnthropicProvider;
use super::config::{LlmConfig, ProviderConfig, ProviderKind};
use super::openai::OpenAiProvider;
use super::router::{LlmRouter, RouteSettings};
use super::{LlmError, SharedChatModel};

impl ProviderConfig {
    /// The router's settings for this provider.
    pub fn route_settings(&self) -> RouteSettings {
        RouteSettings {
            first_token_timeout: Duration::from_millis(self.first_token_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_retries: self.max_retries,
            backoff: Duration::from_millis(self.backoff_ms),
            breaker_failure_threshold: self.breaker_failure_threshold,
            breaker_open: Duration::from_millis(self.breaker_open_ms),
        }
    }
}

/// One provider client for `config` (no routing around it).
pub fn build_provider(config: &ProviderConfig) -> Result<SharedChatModel, LlmError> {
    config.validate()?;
    Ok(match config.kind {
        ProviderKind::OpenAi => Arc::new(OpenAiProvider::new(config.clone())?),
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(config.clone())?),
    })
}

/// The router over every configured provider, `None` when there is none (the agent then
/// answers extractively).
pub fn build_router(config: &LlmConfig) -> Result<Option<SharedChatModel>, LlmError> {
    config.validate()?;
    if config.providers.is_empty() {
        return Ok(None);
    }
    let providers = config
        .providers_by_priority()
        .into_iter()
        .map(|provider| Ok((build_provider(provider)?, provider.route_settings())))
        .collect::<Result<Vec<_>, LlmError>>()?;
    Ok(Some(Arc::new(LlmRouter::new(providers))))
}
