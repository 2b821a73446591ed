//! Tests against a real HTTP server speaking the OpenAI embeddings wire format.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::*;
use crate::embedding::Embedder;

/// What the fake server does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Answers correctly, with `data` in reverse index order.
    Answer,
    /// Answers with a status and an OpenAI error body.
    Fail(u16),
    /// Answers 503 with `Retry-After` as an HTTP-date this many seconds ahead.
    FailUntil(u64),
    /// Never answers.
    Hang,
    /// Answers with one embedding too few.
    DropLast,
}

#[derive(Debug, Clone)]
struct Recorded {
    authorization: Option<String>,
    model: String,
    input: Vec<String>,
}

struct FakeState {
    dimension: usize,
    required_key: Option<String>,
    /// Consumed one per request; `Answer` once empty.
    script: Mutex<VecDeque<Behaviour>>,
    requests: Mutex<Vec<Recorded>>,
}

struct FakeServer {
    address: SocketAddr,
    state: Arc<FakeState>,
}

impl FakeServer {
    async fn start(dimension: usize, required_key: Option<&str>, script: &[Behaviour]) -> Self {
        let state = Arc::new(FakeState {
            dimension,
            required_key: required_key.map(str::to_owned),
            script: Mutex::new(script.iter().copied().collect()),
            requests: Mutex::new(Vec::new()),
        });
        let router = Router::new()
            .route("/v1/embeddings", post(embeddings))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        FakeServer { address, state }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    fn config(&self) -> OpenAiEmbedderConfig {
        OpenAiEmbedderConfig {
            base_url: self.base_url(),
            model: "fake-embed".to_owned(),
            api_key: None,
            dimension: None,
            timeout: Duration::from_secs(5),
            max_retries: 3,
            batch_size: 16,
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }
}

/// A deterministic, unnormalised vector that differs per text.
fn fake_vector(text: &str, dimension: usize) -> Vec<f32> {
    let seed = text.bytes().fold(7u32, |hash, byte| {
        hash.wrapping_mul(31).wrapping_add(u32::from(byte))
    });
    (0..dimension)
        .map(|position| {
            let mixed = seed.wrapping_mul(position as u32 + 1).rotate_left(7) % 97;
            mixed as f32 + 1.0
        })
        .collect()
}

fn normalised(mut vector: Vec<f32>) -> Vec<f32> {
    l2_normalize(&mut vector);
    vector
}

async fn embeddings(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let input: Vec<String> = serde_json::from_value(body["input"].clone()).unwrap();
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    state.requests.lock().unwrap().push(Recorded {
        authorization: authorization.clone(),
        model: model.clone(),
        input: input.clone(),
    });
    if let Some(key) = &state.required_key
        && authorization.as_deref() != Some(&format!("Bearer {key}"))
    {
        return error_response(401, "Incorrect API key provided");
    }
    let behaviour = state
        .script
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(Behaviour::Answer);
    let mut data: Vec<Value> = input
        .iter()
        .enumerate()
        .map(|(index, text)| {
            json!({"object": "embedding", "index": index, "embedding": fake_vector(text, state.dimension)})
        })
        .collect();
    match behaviour {
        Behaviour::Answer => {}
        Behaviour::Fail(status) => return error_response(status, "try again later"),
        Behaviour::FailUntil(seconds) => {
            let date = std::time::SystemTime::now() + Duration::from_secs(seconds);
            let mut response = error_response(503, "come back later");
            let date = httpdate::fmt_http_date(date).parse().unwrap();
            response.headers_mut().insert("retry-after", date);
            return response;
        }
        Behaviour::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Behaviour::DropLast => {
            data.pop();
        }
    }
    data.reverse();
    let tokens: usize = input
        .iter()
        .map(|text| text.split_whitespace().count())
        .sum();
    Json(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response()
}

fn error_response(status: u16, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "invalid_request_error", "code": null}});
    (StatusCode::from_u16(status).unwrap(), Json(body)).into_response()
}

fn texts(count: usize) -> Vec<String> {
    (0..count)
        .map(|index| format!("text number {index}"))
        .collect()
}

#[tokio::test]
async fn happy_path_probes_dimension_normalises_and_orders() {
    let server = FakeServer::start(12, Some("sk-test"), &[]).await;
    let config = OpenAiEmbedderConfig {
        api_key: Some("sk-test".to_owned()),
        ..server.config()
    };
    let embedder = Embedder::OpenAi(Arc::new(OpenAiEmbedder::connect(config).await.unwrap()));
    assert_eq!(embedder.dimension(), 12);
    assert_eq!(embedder.model_name(), "fake-embed");
    assert_eq!(server.requests().len(), 1, "one probe request");

    let inputs = texts(5);
    let vectors = embedder.embed(inputs.clone()).await.unwrap();
    assert_eq!(vectors.len(), inputs.len());
    for (text, vector) in inputs.iter().zip(&vectors) {
        assert_eq!(vector, &normalised(fake_vector(text, 12)), "{text}");
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let request = &requests[1];
    assert_eq!(request.authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(request.model, "fake-embed");
    assert_eq!(request.input, inputs);
}

#[tokio::test]
async fn batches_split_inputs_and_configured_dimension_skips_probe() {
    let server = FakeServer::start(4, None, &[]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        batch_size: 2,
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    assert!(server.requests().is_empty(), "no probe when configured");

    let inputs = texts(5);
    let vectors = embedder.embed(inputs.clone()).await.unwrap();
    assert_eq!(vectors.len(), 5);
    for (text, vector) in inputs.iter().zip(&vectors) {
        assert_eq!(vector, &normalised(fake_vector(text, 4)));
    }
    let batches: Vec<Vec<String>> = server.requests().into_iter().map(|r| r.input).collect();
    assert_eq!(
        batches,
        vec![
            inputs[0..2].to_vec(),
            inputs[2..4].to_vec(),
            inputs[4..5].to_vec()
        ]
    );
    assert!(
        server.requests().iter().all(|r| r.authorization.is_none()),
        "no key, no header"
    );
    assert!(embedder.embed(Vec::new()).await.unwrap().is_empty());
    assert_eq!(server.requests().len(), 3, "empty input sends nothing");
}

#[tokio::test]
async fn transient_failures_are_retried_then_succeed() {
    let script = [
        Behaviour::Fail(500),
        Behaviour::Fail(429),
        Behaviour::Fail(503),
    ];
    let server = FakeServer::start(4, None, &script).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        max_retries: 3,
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    let started = std::time::Instant::now();
    let vectors = embedder.embed(texts(3)).await.unwrap();
    assert_eq!(vectors.len(), 3);
    assert_eq!(server.requests().len(), 4, "three failures, then success");
    // Backoff: at least half of 100 + 200 + 400 ms.
    assert!(started.elapsed() >= Duration::from_millis(350));
}

#[tokio::test]
async fn exhausted_retries_report_the_last_failure() {
    let server = FakeServer::start(4, None, &[Behaviour::Fail(503); 2]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        max_retries: 1,
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config.clone()).await.unwrap();
    let error = embedder.embed(texts(1)).await.unwrap_err();
    assert!(matches!(error, EmbeddingError::Overloaded), "{error}");
    assert!(error.is_transient());
    assert_eq!(server.requests().len(), 2);

    let server = FakeServer::start(4, None, &[Behaviour::Fail(500); 2]).await;
    let embedder = OpenAiEmbedder::connect(OpenAiEmbedderConfig {
        base_url: server.base_url(),
        ..config
    })
    .await
    .unwrap();
    let error = embedder.embed(texts(1)).await.unwrap_err();
    assert!(
        matches!(error, EmbeddingError::Http { status: Some(500), ref message } if message.contains("try again later")),
        "{error}"
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn hanging_server_times_out() {
    let server = FakeServer::start(4, None, &[Behaviour::Hang]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        timeout: Duration::from_millis(200),
        max_retries: 0,
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    let started = std::time::Instant::now();
    let error = embedder.embed(texts(2)).await.unwrap_err();
    assert!(matches!(error, EmbeddingError::Timeout), "{error}");
    assert!(error.is_transient());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn configured_dimension_must_match_the_server() {
    let server = FakeServer::start(4, None, &[]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(8),
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    assert_eq!(embedder.dimension(), 8);
    let error = embedder.embed(texts(2)).await.unwrap_err();
    assert!(
        matches!(
            error,
            EmbeddingError::DimensionMismatch {
                expected: 8,
                actual: 4
            }
        ),
        "{error}"
    );
    assert!(!error.is_transient());
    assert_eq!(server.requests().len(), 1, "not retried");
}

#[tokio::test]
async fn fewer_embeddings_than_inputs_is_a_bad_response() {
    let server = FakeServer::start(4, None, &[Behaviour::DropLast]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    let error = embedder.embed(texts(3)).await.unwrap_err();
    assert!(matches!(error, EmbeddingError::BadResponse(_)), "{error}");
    assert_eq!(server.requests().len(), 1, "not retried");
}

#[tokio::test]
async fn unauthorised_is_a_permanent_http_error() {
    let server = FakeServer::start(4, Some("sk-right"), &[]).await;
    let config = OpenAiEmbedderConfig {
        api_key: Some("sk-wrong".to_owned()),
        ..server.config()
    };
    // The probe at connect already fails.
    let error = OpenAiEmbedder::connect(config.clone()).await.unwrap_err();
    assert!(
        matches!(error, EmbeddingError::Http { status: Some(401), ref message } if message.contains("Incorrect API key")),
        "{error}"
    );
    assert!(!error.is_transient());
    assert_eq!(server.requests().len(), 1, "not retried");

    let embedder = OpenAiEmbedder::connect(OpenAiEmbedderConfig {
        dimension: Some(4),
        api_key: None,
        ..config
    })
    .await
    .unwrap();
    let error = embedder.embed(texts(1)).await.unwrap_err();
    assert!(
        matches!(
            error,
            EmbeddingError::Http {
                status: Some(401),
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn unreachable_endpoint_is_a_transient_http_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let config = OpenAiEmbedderConfig {
        max_retries: 0,
        ..OpenAiEmbedderConfig::new(format!("http://{address}/v1/"), "fake-embed")
    };
    let error = OpenAiEmbedder::connect(config).await.unwrap_err();
    assert!(
        matches!(error, EmbeddingError::Http { status: None, .. }),
        "{error}"
    );
    assert!(error.is_transient());
}

#[test]
fn response_checks() {
    let item = |index, embedding: Vec<f32>| EmbeddingItem {
        index: Some(index),
        embedding,
    };
    let ordered = order_and_check(
        vec![item(1, vec![0.0, 2.0]), item(0, vec![3.0, 4.0])],
        2,
        Some(2),
    )
    .unwrap();
    assert_eq!(ordered, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
    assert!(matches!(
        order_and_check(vec![item(0, vec![1.0]), item(0, vec![1.0])], 2, None),
        Err(EmbeddingError::BadResponse(_))
    ));
    assert!(matches!(
        order_and_check(vec![item(5, vec![1.0])], 1, None),
        Err(EmbeddingError::BadResponse(_))
    ));
    assert!(matches!(
        order_and_check(vec![item(0, vec![])], 1, None),
        Err(EmbeddingError::BadResponse(_))
    ));
    assert!(matches!(
        order_and_check(vec![item(0, vec![1.0]), item(1, vec![1.0, 2.0])], 2, None),
        Err(EmbeddingError::DimensionMismatch {
            expected: 1,
            actual: 2
        })
    ));
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_waited_for() {
    let server = FakeServer::start(4, None, &[Behaviour::FailUntil(2)]).await;
    let config = OpenAiEmbedderConfig {
        dimension: Some(4),
        ..server.config()
    };
    let embedder = OpenAiEmbedder::connect(config).await.unwrap();
    let started = std::time::Instant::now();
    embedder.embed(texts(1)).await.unwrap();
    assert_eq!(server.requests().len(), 2);
    // The date has whole seconds: over one second from now, where our own first wait is
    // under 100 ms.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < MAX_BACKOFF,
        "{waited:?}"
    );
}

#[test]
fn retry_after_takes_seconds_or_a_date() {
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let parse = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().unwrap());
        parse_retry_after(&headers, now)
    };
    assert_eq!(parse("7"), Some(Duration::from_secs(7)));
    assert_eq!(parse(" 0 "), Some(Duration::ZERO));
    let ahead = httpdate::fmt_http_date(now + Duration::from_secs(30));
    assert_eq!(parse(&ahead), Some(Duration::from_secs(30)));
    // The two obsolete forms RFC 9110 still asks recipients to read.
    assert_eq!(
        parse("Friday, 15-Jan-27 08:00:30 GMT"),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse("Fri Jan 15 08:00:30 2027"),
        Some(Duration::from_secs(30))
    );
    let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
    assert_eq!(parse(&past), None, "a date already past: our own backoff");
    assert_eq!(parse("soon"), None);
    assert_eq!(parse("-3"), None);
    assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
}

#[test]
fn error_messages_come_from_the_body() {
    let openai = br#"{"error": {"message": "bad model", "type": "x"}}"#;
    assert!(error_message(StatusCode::BAD_REQUEST, openai).ends_with("bad model"));
    let bare = br#"{"error": "overloaded"}"#;
    assert!(error_message(StatusCode::SERVICE_UNAVAILABLE, bare).ends_with("overloaded"));
    let long = "x".repeat(1_000);
    assert!(error_message(StatusCode::BAD_GATEWAY, long.as_bytes()).len() < 400);
    assert_eq!(
        error_message(StatusCode::BAD_GATEWAY, b""),
        "502 Bad Gateway"
    );
}

#[test]
fn debug_hides_the_api_key() {
    let config = OpenAiEmbedderConfig {
        api_key: Some("sk-secret".to_owned()),
        ..OpenAiEmbedderConfig::new("http://localhost/v1", "m")
    };
    assert!(!format!("{config:?}").contains("sk-secret"));
}
