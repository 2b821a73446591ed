//! Routing tests against real HTTP servers speaking the OpenAI and Anthropic streaming formats.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::fake_server::{
    FakeLlm, FakeReply, anthropic_sse, collect, openai_chunk, openai_sse, openai_text_answer,
    text_of,
};
use crate::llm::config::{LlmConfig, ProviderConfig, ProviderKind};
use crate::llm::{ChatMessage, FinishReason};
use crate::llm::{build_provider, build_router};

fn question() -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage::User {
            content: "Which provider answers?".to_owned(),
        }],
        ..ChatRequest::default()
    }
}

fn router(providers: Vec<ProviderConfig>) -> SharedChatModel {
    build_router(&LlmConfig { providers }).unwrap().unwrap()
}

fn server_error() -> FakeReply {
    FakeReply::Status(500, json!({"error": {"message": "internal error"}}))
}

/// An accepted stream that produces nothing but the role chunk before failing.
fn role_chunk_only() -> Vec<String> {
    openai_sse(&[openai_chunk(
        json!({"role": "assistant", "content": ""}),
        None,
    )])[..1]
        .to_vec()
}

#[tokio::test]
async fn an_error_status_fails_over_to_the_next_provider() {
    let first = FakeLlm::scripted(vec![], server_error()).await;
    let second = FakeLlm::scripted(
        vec![],
        FakeReply::Stream(openai_text_answer(&["second ", "answers"])),
    )
    .await;
    let model = router(vec![
        first.provider("first", ProviderKind::OpenAi),
        second.provider("second", ProviderKind::OpenAi),
    ]);
    assert_eq!(model.name(), "first>second");

    let (events, error) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "second answers");
    assert_eq!(first.requests().len(), 1);
    assert_eq!(second.requests().len(), 1);
}

#[tokio::test]
async fn a_provider_failing_before_its_first_token_leaks_nothing() {
    let second_answer = openai_text_answer(&["only ", "second"]);
    for failure in [
        FakeReply::StreamThenBreak(role_chunk_only()),
        FakeReply::StreamThenHang(role_chunk_only()),
        FakeReply::Hang,
    ] {
        let first = FakeLlm::scripted(vec![], failure.clone()).await;
        let second = FakeLlm::scripted(vec![], FakeReply::Stream(second_answer.clone())).await;
        let model = router(vec![
            ProviderConfig {
                first_token_timeout_ms: 300,
                ..first.provider("first", ProviderKind::OpenAi)
            },
            second.provider("second", ProviderKind::OpenAi),
        ]);

        let (events, error) = collect(model.stream(question()).await.unwrap()).await;

        assert_eq!(error, None, "{failure:?}");
        // Exactly the second provider's answer: nothing of the first reached the caller.
        assert_eq!(
            events,
            vec![
                ChatEvent::TextDelta("only ".to_owned()),
                ChatEvent::TextDelta("second".to_owned()),
                ChatEvent::Usage(crate::llm::Usage {
                    prompt_tokens: 11,
                    completion_tokens: 2
                }),
                ChatEvent::Finished(FinishReason::Stop),
            ],
            "{failure:?}"
        );
        assert_eq!(first.requests().len(), 1);
    }
}

#[tokio::test]
async fn retryable_errors_are_retried_on_the_same_provider_first() {
    let first = FakeLlm::scripted(
        vec![
            FakeReply::Status(503, json!({"error": {"message": "busy"}})),
            FakeReply::Status(429, json!({"error": {"message": "slow down"}})),
        ],
        FakeReply::Stream(openai_text_answer(&["first, third try"])),
    )
    .await;
    let second = FakeLlm::scripted(vec![], FakeReply::Stream(openai_text_answer(&["no"]))).await;
    let model = router(vec![
        ProviderConfig {
            max_retries: 2,
            ..first.provider("first", ProviderKind::OpenAi)
        },
        second.provider("second", ProviderKind::OpenAi),
    ]);

    let (events, error) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "first, third try");
    assert_eq!(first.requests().len(), 3);
    assert_eq!(second.requests().len(), 0);
}

#[tokio::test]
async fn a_rejected_request_is_not_retried_but_fails_over() {
    let first = FakeLlm::scripted(
        vec![],
        FakeReply::Status(400, json!({"error": {"message": "bad request"}})),
    )
    .await;
    let second = FakeLlm::scripted(vec![], FakeReply::Stream(openai_text_answer(&["ok"]))).await;
    let model = router(vec![
        ProviderConfig {
            max_retries: 3,
            ..first.provider("first", ProviderKind::OpenAi)
        },
        second.provider("second", ProviderKind::OpenAi),
    ]);

    let (events, _) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(text_of(&events), "ok");
    assert_eq!(first.requests().len(), 1);
}

#[tokio::test]
async fn all_providers_down_is_all_failed_with_each_error() {
    let first = FakeLlm::scripted(vec![], server_error()).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = listener.local_addr().unwrap();
    drop(listener);
    let model = router(vec![
        first.provider("first", ProviderKind::OpenAi),
        ProviderConfig {
            name: "second".to_owned(),
            ..ProviderConfig::openai(format!("http://{closed_port}/v1"), "m", None)
        },
    ]);

    let error = model.stream(question()).await.err().unwrap();

    let LlmError::AllFailed(errors) = &error else {
        panic!("expected AllFailed, got {error:?}");
    };
    assert_eq!(errors.len(), 2);
    assert!(
        matches!(&errors[0], LlmError::Status { provider, status: 500, .. } if provider == "first")
    );
    assert!(matches!(&errors[1], LlmError::Connect { provider, .. } if provider == "second"));
    assert!(error.to_string().contains("internal error"), "{error}");
    assert!(!error.is_retryable());
}

#[tokio::test]
async fn the_breaker_opens_after_the_threshold_and_a_half_open_probe_closes_it() {
    let server = FakeLlm::scripted(
        vec![server_error(), server_error(), server_error()],
        FakeReply::Stream(openai_text_answer(&["recovered"])),
    )
    .await;
    let open_for = Duration::from_millis(300);
    let providers = vec![(
        build_provider(&server.provider("flaky", ProviderKind::OpenAi)).unwrap(),
        RouteSettings {
            first_token_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
            max_retries: 0,
            backoff: Duration::from_millis(10),
            breaker_failure_threshold: 2,
            breaker_open: open_for,
        },
    )];
    let router = LlmRouter::new(providers);
    let last_error = |error: LlmError| match error {
        LlmError::AllFailed(mut errors) => errors.pop().unwrap(),
        other => panic!("expected AllFailed, got {other:?}"),
    };

    // Two failures reach the threshold.
    for _ in 0..2 {
        let error = last_error(router.stream(question()).await.err().unwrap());
        assert!(
            matches!(error, LlmError::Status { status: 500, .. }),
            "{error:?}"
        );
    }
    assert_eq!(router.circuit_state("flaky"), Some(CircuitState::Open));
    // Open: refused without a request.
    let error = last_error(router.stream(question()).await.err().unwrap());
    assert!(matches!(error, LlmError::CircuitOpen { .. }), "{error:?}");
    assert_eq!(server.requests().len(), 2);

    // Half-open: one probe goes through; it fails, so the breaker opens again.
    tokio::time::sleep(open_for + Duration::from_millis(50)).await;
    let error = last_error(router.stream(question()).await.err().unwrap());
    assert!(
        matches!(error, LlmError::Status { status: 500, .. }),
        "{error:?}"
    );
    assert_eq!(router.circuit_state("flaky"), Some(CircuitState::Open));
    let error = last_error(router.stream(question()).await.err().unwrap());
    assert!(matches!(error, LlmError::CircuitOpen { .. }), "{error:?}");
    assert_eq!(server.requests().len(), 3);

    // The next probe succeeds and closes it.
    tokio::time::sleep(open_for + Duration::from_millis(50)).await;
    let (events, error) = collect(router.stream(question()).await.unwrap()).await;
    assert_eq!(error, None);
    assert_eq!(text_of(&events), "recovered");
    assert_eq!(router.circuit_state("flaky"), Some(CircuitState::Closed));
    assert_eq!(server.requests().len(), 4);
}

#[tokio::test]
async fn an_open_breaker_sends_requests_straight_to_the_next_provider() {
    let first = FakeLlm::scripted(vec![], server_error()).await;
    let second = FakeLlm::scripted(vec![], FakeReply::Stream(openai_text_answer(&["ok"]))).await;
    let model = router(vec![
        ProviderConfig {
            breaker_failure_threshold: 1,
            ..first.provider("first", ProviderKind::OpenAi)
        },
        second.provider("second", ProviderKind::OpenAi),
    ]);

    for _ in 0..3 {
        let (events, _) = collect(model.stream(question()).await.unwrap()).await;
        assert_eq!(text_of(&events), "ok");
    }

    assert_eq!(first.requests().len(), 1);
    assert_eq!(second.requests().len(), 3);
}

#[tokio::test]
async fn an_error_after_the_first_token_is_passed_through() {
    let pieces = openai_sse(&[openai_chunk(json!({"content": "partial"}), None)]);
    let first = FakeLlm::scripted(vec![], FakeReply::StreamThenBreak(pieces[..1].to_vec())).await;
    let second = FakeLlm::scripted(vec![], FakeReply::Stream(openai_text_answer(&["no"]))).await;
    let model = router(vec![
        first.provider("first", ProviderKind::OpenAi),
        second.provider("second", ProviderKind::OpenAi),
    ]);

    let (events, error) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(events, vec![ChatEvent::TextDelta("partial".to_owned())]);
    assert!(
        matches!(error, Some(LlmError::Protocol { .. })),
        "{error:?}"
    );
    assert_eq!(second.requests().len(), 0);
}

#[tokio::test]
async fn a_stream_going_silent_hits_the_idle_timeout() {
    let pieces = openai_sse(&[openai_chunk(json!({"content": "then silence"}), None)]);
    let server = FakeLlm::scripted(vec![], FakeReply::StreamThenHang(pieces[..1].to_vec())).await;
    let model = router(vec![ProviderConfig {
        idle_timeout_ms: 200,
        ..server.provider("silent", ProviderKind::OpenAi)
    }]);

    let (events, error) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(text_of(&events), "then silence");
    assert!(
        matches!(&error, Some(LlmError::Timeout { what, .. }) if what.contains("idle")),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_anthropic_provider_takes_over_from_a_failed_openai_one() {
    let first = FakeLlm::scripted(vec![], server_error()).await;
    let events = anthropic_sse(&[
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
               "content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "from claude"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_stop"}),
    ]);
    let second = FakeLlm::scripted(vec![], FakeReply::Stream(events)).await;
    let model = router(vec![
        first.provider("openai", ProviderKind::OpenAi),
        ProviderConfig {
            priority: 1,
            ..second.provider("claude", ProviderKind::Anthropic)
        },
    ]);

    let (events, error) = collect(model.stream(question()).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "from claude");
    assert_eq!(second.requests()[0].path, "/v1/messages");
}

/// A recorder keeping every counter, gauge and histogram in memory, keyed by
/// `name{label=value,...}` (labels sorted).
#[derive(Default)]
struct MemoryRecorder {
    values: Mutex<std::collections::BTreeMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    samples: Mutex<std::collections::BTreeMap<String, Arc<Samples>>>,
}

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

fn key_text(key: &metrics::Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|label| format!("{}={}", label.key(), label.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl MemoryRecorder {
    fn value(&self, key: &str) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(
            self.values
                .lock()
                .unwrap()
                .entry(key.to_owned())
                .or_default(),
        )
    }

    fn counter(&self, key: &str) -> u64 {
        self.value(key).load(std::sync::atomic::Ordering::Relaxed)
    }

    fn gauge(&self, key: &str) -> f64 {
        f64::from_bits(self.value(key).load(std::sync::atomic::Ordering::Relaxed))
    }

    fn samples(&self, key: &str) -> usize {
        self.samples
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |samples| samples.0.lock().unwrap().len())
    }
}

impl metrics::Recorder for MemoryRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.value(&key_text(key)))
    }

    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.value(&key_text(key)))
    }

    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let samples = Arc::clone(
            self.samples
                .lock()
                .unwrap()
                .entry(key_text(key))
                .or_default(),
        );
        metrics::Histogram::from_arc(samples)
    }
}

#[tokio::test]
async fn routing_records_outcomes_tokens_failovers_and_breaker_state() {
    let recorder = MemoryRecorder::default();
    // Thread-local: the test runtime runs every task on this thread.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let first = FakeLlm::scripted(vec![], server_error()).await;
    let second = FakeLlm::scripted(
        vec![],
        FakeReply::Stream(openai_text_answer(&["a", "b", "c"])),
    )
    .await;
    let model = router(vec![
        ProviderConfig {
            breaker_failure_threshold: 2,
            ..first.provider("first", ProviderKind::OpenAi)
        },
        second.provider("second", ProviderKind::OpenAi),
    ]);
    assert_eq!(
        recorder.gauge("sift_llm_circuit_state{provider=first}"),
        0.0
    );

    for _ in 0..2 {
        let (_, error) = collect(model.stream(question()).await.unwrap()).await;
        assert_eq!(error, None);
    }

    assert_eq!(recorder.counter("sift_llm_failovers_total{}"), 2);
    assert_eq!(
        recorder.counter("sift_llm_requests_total{outcome=error,provider=first}"),
        2
    );
    assert_eq!(
        recorder.counter("sift_llm_requests_total{outcome=ok,provider=second}"),
        2
    );
    assert_eq!(
        recorder.counter("sift_llm_tokens_total{direction=in,provider=second}"),
        22
    );
    assert_eq!(
        recorder.counter("sift_llm_tokens_total{direction=out,provider=second}"),
        6
    );
    assert_eq!(
        recorder.samples("sift_llm_first_token_seconds{provider=second}"),
        2
    );
    assert_eq!(
        recorder.samples("sift_llm_first_token_seconds{provider=first}"),
        0
    );
    assert_eq!(
        recorder.samples("sift_llm_request_seconds{provider=first}"),
        2
    );
    assert_eq!(
        recorder.samples("sift_llm_request_seconds{provider=second}"),
        2
    );
    assert_eq!(
        recorder.gauge("sift_llm_circuit_state{provider=first}"),
        1.0
    );

    // A stream dropped before its end counts as cancelled.
    let stream = model.stream(question()).await.unwrap();
    drop(stream);
    assert_eq!(
        recorder.counter("sift_llm_requests_total{outcome=circuit_open,provider=first}"),
        1
    );
    assert_eq!(
        recorder.counter("sift_llm_requests_total{outcome=cancelled,provider=second}"),
        1
    );
}

#[tokio::test]
async fn a_breaker_opening_during_retries_reports_the_real_error() {
    let server = FakeLlm::scripted(vec![], server_error()).await;
    let model = router(vec![ProviderConfig {
        max_retries: 5,
        breaker_failure_threshold: 2,
        ..server.provider("flaky", ProviderKind::OpenAi)
    }]);

    let error = model.stream(question()).await.err().unwrap();

    assert_eq!(server.requests().len(), 2);
    let LlmError::AllFailed(errors) = error else {
        panic!("expected AllFailed");
    };
    assert!(
        matches!(&errors[..], [LlmError::Status { status: 500, .. }]),
        "{errors:?}"
    );
}
