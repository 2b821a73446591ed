//! Clients of every model service a Sift node talks to, and nothing else: a change to the
//! actors does not recompile candle or the HTTP clients.
//!
//! - [`llm`]: chat providers (OpenAI-compatible, Anthropic), the router with retries and
//!   breakers, tool-calling modes, and their config ([`llm::config`]; construction in
//!   [`llm::build`]).
//! - [`embedding`]: the embedded all-MiniLM-L6-v2 embedder (candle) and OpenAI-compatible
//!   `/v1/embeddings` clients.
//! - [`rerank`]: external rerank services (TEI, Cohere/Jina wire shapes).
//! - [`mcp`]: MCP servers over streamable HTTP, their tools offered to the agent.
//! - [`web_search`]: the web-search tool's HTTP backends.
//! - `fake_server` (feature `fake-server`): a scripted chat-model server speaking the OpenAI
//!   and Anthropic streaming wire formats, for the tests of every crate and for `sift-bench`.

pub mod embedding;
#[cfg(any(test, feature = "fake-server"))]
pub mod fake_server;
pub mod llm;
pub mod mcp;
pub mod ocr;
pub mod rerank;
pub mod web_search;

/// Waits between retries (backon): exponential with jitter, the `n`th between half and all of
/// `first * 2^n`, none longer than `max`; at most `retries` of them.
pub(crate) fn jittered_backoff(
    first: std::time::Duration,
    max: std::time::Duration,
    retries: u32,
) -> backon::ExponentialBuilder {
    // backon's jitter adds up to one more delay: halve both ends so the sum stays under them.
    backon::ExponentialBuilder::default()
        .with_min_delay(first / 2)
        .with_max_delay(max / 2)
        .with_max_times(retries as usize)
        .with_jitter()
}

/// An error and its causes, `: `-separated. reqwest's own message mostly names the URL; the
/// useful part ("tcp connect error: Connection refused") is in the source chain.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use backon::BackoffBuilder;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(10));
        let delays: Vec<Duration> = super::jittered_backoff(first, max, 20).build().collect();
        assert_eq!(delays.len(), 20);
        for (retry, delay) in delays.iter().enumerate() {
            let ceiling = first.saturating_mul(1 << retry.min(16)).min(max);
            assert!(
                *delay <= ceiling && *delay >= ceiling / 2,
                "{retry}: {delay:?}"
            );
        }
        // Two runs draw different jitter (with backon's `std` feature).
        let again: Vec<Duration> = super::jittered_backoff(first, max, 20).build().collect();
        assert_ne!(delays, again);
    }

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|layer| layer as _)
        }
    }

    #[test]
    fn the_chain_names_every_cause_in_order() {
        let error = Layer(
            "error sending request",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer(
                    "tcp connect error: Connection refused",
                    None,
                ))),
            ))),
        );
        assert_eq!(
            super::error_chain(&error),
            "error sending request: client error (Connect): tcp connect error: Connection refused"
        );
        assert_eq!(super::error_chain(&Layer("alone", None)), "alone");
    }
}
