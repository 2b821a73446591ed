//! Routing over several chat model providers by priority.
//!
//! [`LlmRouter`] implements [`ChatModel`] by trying its providers in order. Each attempt has a
//! first-token deadline, and once streaming, a deadline for every gap between events.
//! Retryable failures before the first token are retried on the same provider with exponential
//! backoff, then the next provider is tried (a failover). Each provider has a circuit breaker:
//! `closed` → `open` after `breaker_failure_threshold` consecutive failures; an open breaker
//! refuses attempts until `breaker_open` has passed, then lets one probe through (`half-open`);
//! the probe's success closes it, its failure opens it again.
//!
//! First-token probing: [`ChatModel::stream`] resolves only once a provider produced its first
//! event, which is buffered and handed on first. A provider failing before that is failed over
//! without anything reaching the caller; an error after it is passed through (the caller has
//! already shown output and decides what to do).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::BackoffBuilder;
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::{ChatEvent, ChatModel, ChatRequest, ChatStream, LlmError, SharedChatModel};

/// Per-provider routing settings (from [`super::config::ProviderConfig::route_settings`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSettings {
    pub first_token_timeout: Duration,
    pub idle_timeout: Duration,
    /// Retries on the same provider after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry; doubled for each further one.
    pub backoff: Duration,
    pub breaker_failure_threshold: u32,
    pub breaker_open: Duration,
}

/// A circuit breaker's state; the number is the `sift_llm_circuit_state` gauge value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CircuitState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// Longest backoff between two attempts on one provider.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Routes requests over providers by priority (see the module docs).
pub struct LlmRouter {
    name: String,
    routes: Vec<Arc<Route>>,
}

impl std::fmt::Debug for LlmRouter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LlmRouter")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One provider with its settings and breaker.
struct Route {
    model: SharedChatModel,
    settings: RouteSettings,
    breaker: Mutex<Breaker>,
}

#[derive(Debug)]
struct Breaker {
    state: CircuitState,
    consecutive_failures: u32,
    opened_at: Instant,
    /// When the last half-open probe started (a probe that never reports back, e.g. because
    /// its caller went away, is replaced after another open duration).
    probe_started: Option<Instant>,
}

impl LlmRouter {
    /// A router over `providers`, tried in the given order.
    pub fn new(providers: Vec<(SharedChatModel, RouteSettings)>) -> Self {
        let name = providers
            .iter()
            .map(|(model, _)| model.name())
            .collect::<Vec<_>>()
            .join(">");
        let routes = providers
            .into_iter()
            .map(|(model, settings)| {
                gauge_circuit(model.name(), CircuitState::Closed);
                Arc::new(Route {
                    model,
                    settings,
                    breaker: Mutex::new(Breaker {
                        state: CircuitState::Closed,
                        consecutive_failures: 0,
                        opened_at: Instant::now(),
                        probe_started: None,
                    }),
                })
            })
            .collect();
        LlmRouter { name, routes }
    }

    /// The breaker state of the provider named `provider`.
    pub fn circuit_state(&self, provider: &str) -> Option<CircuitState> {
        self.routes
            .iter()
            .find(|route| route.model.name() == provider)
            .map(|route| route.lock_breaker().state)
    }

    async fn route(&self, request: ChatRequest) -> Result<ChatStream, LlmError> {
        let mut errors = Vec::new();
        for (position, route) in self.routes.iter().enumerate() {
            match Arc::clone(route).try_provider(&request).await {
                Ok(stream) => return Ok(stream),
                Err(error) => {
                    if position + 1 < self.routes.len() {
                        metrics::counter!("sift_llm_failovers_total").increment(1);
                        warn!(provider = route.model.name(), %error, "model provider failed, failing over");
                    } else {
                        warn!(provider = route.model.name(), %error, "model provider failed");
                    }
                    errors.push(error);
                }
            }
        }
        Err(LlmError::AllFailed(errors))
    }
}

impl ChatModel for LlmRouter {
    fn name(&self) -> &str {
        &self.name
    }

    /// The first provider's window (context is budgeted for the preferred model).
    fn context_window(&self) -> u32 {
        self.routes
            .first()
            .map_or(0, |route| route.model.context_window())
    }

    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>> {
        Box::pin(self.route(request))
    }
}

impl Route {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn lock_breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        // A panic while holding this lock cannot leave the breaker inconsistent: keep going.
        self.breaker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Attempts with retries until the first event, or the last error. A breaker that opens
    /// during the retries ends them with the error that opened it.
    async fn try_provider(self: Arc<Self>, request: &ChatRequest) -> Result<ChatStream, LlmError> {
        // backon gives the waits; the loop stays here because each attempt first asks the
        // breaker, and a breaker that opens between retries ends with the last model error.
        let mut delays = crate::jittered_backoff(
            self.settings.backoff,
            MAX_BACKOFF,
            self.settings.max_retries,
        )
        .build()
        .enumerate();
        let mut last_error: Option<LlmError> = None;
        loop {
            if !self.acquire() {
                return Err(last_error.unwrap_or_else(|| {
                    record_outcome(self.name(), "circuit_open");
                    LlmError::CircuitOpen {
                        provider: self.name().to_owned(),
                    }
                }));
            }
            let started = Instant::now();
            let error = match self.first_event(request.clone()).await {
                Ok((first, rest)) => {
                    self.succeeded();
                    metrics::histogram!("sift_llm_first_token_seconds", "provider" => self.name().to_owned())
                        .record(started.elapsed().as_secs_f64());
                    debug!(provider = self.name(), "first model event received");
                    return Ok(Passthrough::new(self, first, rest, started).into_stream());
                }
                Err(error) => error,
            };
            self.failed(&error);
            record_outcome(self.name(), outcome_label(&error));
            record_seconds(self.name(), started);
            let Some((retry, delay)) = delays.next().filter(|_| error.is_retryable()) else {
                return Err(error);
            };
            warn!(provider = self.name(), retry = retry + 1, delay_ms = delay.as_millis() as u64, %error, "model request failed, retrying");
            last_error = Some(error);
            tokio::time::sleep(delay).await;
        }
    }

    /// Starts the request and waits for its first event, within the first-token deadline.
    async fn first_event(&self, request: ChatRequest) -> Result<(ChatEvent, ChatStream), LlmError> {
        let attempt = async {
            let mut stream = self.model.stream(request).await?;
            match stream.next().await {
                Some(Ok(event)) => Ok((event, stream)),
                Some(Err(error)) => Err(error),
                None => Err(LlmError::Protocol {
                    provider: self.name().to_owned(),
                    message: "stream ended before its first event".to_owned(),
                }),
            }
        };
        tokio::time::timeout(self.settings.first_token_timeout, attempt)
            .await
            .unwrap_or_else(|_elapsed| {
                Err(LlmError::Timeout {
                    provider: self.name().to_owned(),
                    what: "first token".to_owned(),
                })
            })
    }

    /// Whether the breaker lets an attempt through now (moving open → half-open when due).
    fn acquire(&self) -> bool {
        let now = Instant::now();
        let mut breaker = self.lock_breaker();
        let open_for = self.settings.breaker_open;
        match breaker.state {
            CircuitState::Closed => true,
            CircuitState::Open if now.duration_since(breaker.opened_at) >= open_for => {
                breaker.state = CircuitState::HalfOpen;
                breaker.probe_started = Some(now);
                gauge_circuit(self.name(), CircuitState::HalfOpen);
                debug!(provider = self.name(), "circuit half-open, probing");
                true
            }
            CircuitState::Open => false,
            CircuitState::HalfOpen => {
                let stale = breaker
                    .probe_started
                    .is_none_or(|started| now.duration_since(started) >= open_for);
                if stale {
                    breaker.probe_started = Some(now);
                }
                stale
            }
        }
    }

    fn succeeded(&self) {
        let mut breaker = self.lock_breaker();
        breaker.consecutive_failures = 0;
        breaker.probe_started = None;
        if breaker.state != CircuitState::Closed {
            breaker.state = CircuitState::Closed;
            gauge_circuit(self.name(), CircuitState::Closed);
            debug!(provider = self.name(), "circuit closed");
        }
    }

    /// Counts a failure against the breaker. Errors that say nothing about the provider's
    /// health (a request it rejects as invalid) do not count.
    fn failed(&self, error: &LlmError) {
        if !error.is_retryable() {
            return;
        }
        let mut breaker = self.lock_breaker();
        breaker.consecutive_failures = breaker.consecutive_failures.saturating_add(1);
        let trips = breaker.state == CircuitState::HalfOpen
            || breaker.consecutive_failures >= self.settings.breaker_failure_threshold;
        if trips && breaker.state != CircuitState::Open {
            breaker.state = CircuitState::Open;
            breaker.opened_at = Instant::now();
            breaker.probe_started = None;
            gauge_circuit(self.name(), CircuitState::Open);
            warn!(
                provider = self.name(),
                failures = breaker.consecutive_failures,
                "circuit opened"
            );
        }
    }
}

/// The caller's stream once a provider produced its first event: that event, then the rest
/// with an idle deadline between events. Records the attempt's outcome, duration and tokens.
struct Passthrough {
    route: Arc<Route>,
    first: Option<ChatEvent>,
    rest: ChatStream,
    started: Instant,
    /// The outcome is recorded (the stream ended, failed, or was dropped).
    ended: bool,
}

impl Passthrough {
    fn new(route: Arc<Route>, first: ChatEvent, rest: ChatStream, started: Instant) -> Self {
        Passthrough {
            route,
            first: Some(first),
            rest,
            started,
            ended: false,
        }
    }

    fn into_stream(self) -> ChatStream {
        Box::pin(futures::stream::unfold(self, |mut state| async move {
            state.next().await.map(|item| (item, state))
        }))
    }

    async fn next(&mut self) -> Option<Result<ChatEvent, LlmError>> {
        if self.ended {
            return None;
        }
        if let Some(first) = self.first.take() {
            self.observe(&first);
            return Some(Ok(first));
        }
        match tokio::time::timeout(self.route.settings.idle_timeout, self.rest.next()).await {
            Ok(Some(Ok(event))) => {
                self.observe(&event);
                Some(Ok(event))
            }
            Ok(None) => {
                self.end("ok");
                None
            }
            Ok(Some(Err(error))) => Some(Err(self.fail(error))),
            Err(_elapsed) => Some(Err(self.fail(LlmError::Timeout {
                provider: self.route.name().to_owned(),
                what: "idle between events".to_owned(),
            }))),
        }
    }

    fn observe(&mut self, event: &ChatEvent) {
        match event {
            ChatEvent::Usage(usage) => {
                let provider = self.route.name().to_owned();
                metrics::counter!("sift_llm_tokens_total", "provider" => provider.clone(), "direction" => "in")
                    .increment(u64::from(usage.prompt_tokens));
                metrics::counter!("sift_llm_tokens_total", "provider" => provider, "direction" => "out")
                    .increment(u64::from(usage.completion_tokens));
            }
            ChatEvent::Finished(_) => self.end("ok"),
            _ => {}
        }
    }

    fn fail(&mut self, error: LlmError) -> LlmError {
        warn!(provider = self.route.name(), %error, "model stream failed after its first event");
        self.route.failed(&error);
        self.end(outcome_label(&error));
        error
    }

    fn end(&mut self, outcome: &'static str) {
        if self.ended {
            return;
        }
        self.ended = true;
        record_outcome(self.route.name(), outcome);
        record_seconds(self.route.name(), self.started);
    }
}

impl Drop for Passthrough {
    fn drop(&mut self) {
        // Dropped before the end: the caller stopped the run.
        self.end("cancelled");
    }
}

fn outcome_label(error: &LlmError) -> &'static str {
    match error {
        LlmError::Timeout { .. } => "timeout",
        LlmError::CircuitOpen { .. } => "circuit_open",
        _ => "error",
    }
}

fn record_outcome(provider: &str, outcome: &'static str) {
    metrics::counter!("sift_llm_requests_total", "provider" => provider.to_owned(), "outcome" => outcome)
        .increment(1);
}

fn record_seconds(provider: &str, started: Instant) {
    metrics::histogram!("sift_llm_request_seconds", "provider" => provider.to_owned())
        .record(started.elapsed().as_secs_f64());
}

fn gauge_circuit(provider: &str, state: CircuitState) {
    metrics::gauge!("sift_llm_circuit_state", "provider" => provider.to_owned())
        .set(f64::from(state as u8));
}

#[cfg(test)]
mod tests;
