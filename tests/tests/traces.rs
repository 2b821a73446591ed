//! Traces over OTLP/HTTP: two `sift serve` processes export their spans to a real OTLP/HTTP
//! receiver started by the test (protobuf `ExportTraceServiceRequest`s on `POST /v1/traces`,
//! decoded with the protocol's own message types). One trace follows a search from the
//! caller's `traceparent` through the request, the root, each shard's leaf and a shard
//! request to the other node; an agent run's steps, model calls and tool searches join the
//! trace of the request that started it; a malformed `traceparent` starts a trace of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use serde_json::json;
use sift_models::fake_server::{FakeLlm, react_agent};
use sift_tests::sse::{answer_text, ask};
use sift_tests::{
    NodeProcess, bulk_documents, eventually, free_port, ingest_deadline, short_documents, temp_dir,
};

const SECRET: &str = "traces-test-secret";

/// One span as the receiver got it.
#[derive(Clone, Debug)]
struct Received {
    /// The exporting process (`process.pid` of its resource).
    pid: i64,
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
    /// Requests that were not protobuf OTLP.
    refused: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, format!("http://{address}"))
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Vec<u8>) {
    let content_type = headers
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(request) if content_type == "application/x-protobuf" => request,
        other => {
            receiver
                .refused
                .lock()
                .unwrap()
                .push(format!("{content_type}: {other:?}"));
            return (StatusCode::BAD_REQUEST, Vec::new());
        }
    };
    let mut spans = receiver.spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = attributes(
            &resource_spans
                .resource
                .map(|resource| resource.attributes)
                .unwrap_or_default(),
        );
        let pid = resource
            .get("process.pid")
            .and_then(|pid| pid.parse().ok())
            .unwrap_or(-1);
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    pid,
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                });
            }
        }
    }
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn attributes(pairs: &[KeyValue]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|pair| {
            let value = match pair
                .value
                .as_ref()
                .and_then(|v: &AnyValue| v.value.as_ref())
            {
                Some(any_value::Value::StringValue(text)) => text.clone(),
                Some(any_value::Value::IntValue(number)) => number.to_string(),
                Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
                Some(any_value::Value::DoubleValue(number)) => number.to_string(),
                other => format!("{other:?}"),
            };
            (pair.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The spans of one trace by name.
fn in_trace<'a>(spans: &'a [Received], trace_id: &str, name: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|span| span.trace_id == trace_id && span.name == name)
        .collect()
}

/// Whether `child` descends from `ancestor` through the spans received.
fn descends(spans: &[Received], child: &Received, ancestor: &Received) -> bool {
    let mut current = child.parent_span_id.clone();
    for _ in 0..64 {
        if current == ancestor.span_id {
            return true;
        }
        match spans.iter().find(|span| span.span_id == current) {
            Some(parent) => current = parent.parent_span_id.clone(),
            None => return false,
        }
    }
    false
}

#[tokio::test]
async fn one_trace_follows_a_request_across_the_cluster_and_into_agent_runs() {
    let (receiver, endpoint) = Receiver::start().await;
    let documents = short_documents(8);
    let fake = FakeLlm::start(react_agent(documents[0].title.clone())).await;
    let base_url = fake.base_url();
    let dir = temp_dir();
    let internal: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let tracing_env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        // Batches go out every 100 ms instead of every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("SIFT_LLM_BASE_URL", base_url.as_str()),
        ("SIFT_LLM_MODEL", "traced-model"),
    ];
    let first = NodeProcess::start_member(
        &dir.path().join("n1"),
        SECRET,
        &internal[0],
        None,
        &tracing_env,
    );
    let second = NodeProcess::start_member(
        &dir.path().join("n2"),
        SECRET,
        &internal[1],
        Some(&first.url),
        &tracing_env,
    );
    let client = first.client();
    eventually("two voters", || async {
        let view = client.get("/v1/cluster").await.body;
        (view["nodes"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await;

    // Two shards, one replica each: one shard lives on each node (balanced placement).
    client
        .create_kb(json!({ "name": "traced", "shards": 2, "replication_factor": 1 }))
        .await;
    let placement = client.placement("traced").await;
    let holders: Vec<u64> = placement
        .values()
        .flat_map(|replicas| replicas.iter().map(|(node, _, _)| *node))
        .collect();
    assert!(
        holders.contains(&1) && holders.contains(&2),
        "each node holds a shard: {placement:?}"
    );
    client.bulk_add("traced", &bulk_documents(&documents)).await;
    client
        .wait_ready(
            "traced",
            documents.len() as u64,
            ingest_deadline(documents.len()),
        )
        .await;

    // A search with the caller's trace context.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let answer = client
        .send(
            client
                .request(reqwest::Method::POST, "/v1/kbs/traced/search")
                .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
                .json(&json!({ "query": documents[0].title, "top_k": 5 })),
        )
        .await
        .expect(200);
    assert!(!answer["hits"].as_array().unwrap().is_empty(), "{answer}");

    let spans = eventually("the search's spans from both nodes", || async {
        let spans = receiver.spans();
        let served = in_trace(&spans, trace_id, "serve_shard_rpc");
        (!served.is_empty() && !in_trace(&spans, trace_id, "request").is_empty()).then_some(spans)
    })
    .await;
    let request = in_trace(&spans, trace_id, "request");
    assert_eq!(request.len(), 1, "{request:?}");
    let request = request[0];
    assert_eq!(request.parent_span_id, caller_span, "{request:?}");
    assert_eq!(request.pid, i64::from(first.pid()));
    assert_eq!(request.service, "sift");
    assert_eq!(
        request.attributes.get("route").map(String::as_str),
        Some("/v1/kbs/{kb}/search"),
        "{request:?}"
    );
    assert_eq!(request.attributes["status"], "200", "{request:?}");
    let search = in_trace(&spans, trace_id, "search");
    assert_eq!(search.len(), 1, "one search root: {search:?}");
    assert!(descends(&spans, search[0], request));
    let leaves = in_trace(&spans, trace_id, "leaf");
    let shards: std::collections::BTreeSet<&str> = leaves
        .iter()
        .filter_map(|leaf| leaf.attributes.get("shard").map(String::as_str))
        .collect();
    assert_eq!(shards.len(), 2, "a leaf per shard: {leaves:?}");
    assert!(leaves.iter().all(|leaf| descends(&spans, leaf, search[0])));
    let sent = in_trace(&spans, trace_id, "shard_rpc");
    assert!(!sent.is_empty(), "the remote shard's request: {spans:?}");
    assert!(sent.iter().all(|rpc| rpc.pid == i64::from(first.pid())));
    let served = in_trace(&spans, trace_id, "serve_shard_rpc");
    for span in &served {
        assert_eq!(
            span.pid,
            i64::from(second.pid()),
            "served by the other node"
        );
        assert!(
            sent.iter().any(|rpc| rpc.span_id == span.parent_span_id),
            "the serving span is the request's child: {span:?} {sent:?}"
        );
        assert_eq!(span.attributes["kind"], "search", "{span:?}");
    }

    // A malformed traceparent: the request is served, in a trace of its own.
    client
        .send(
            client
                .request(reqwest::Method::POST, "/v1/kbs/traced/search")
                .header("traceparent", "00-not-a-trace-01")
                .header("x-request-id", "malformed-traceparent")
                .json(&json!({ "query": documents[1].title })),
        )
        .await
        .expect(200);
    let own = eventually("the malformed request's span", || async {
        receiver.spans().into_iter().find(|span| {
            span.name == "request"
                && span.attributes.get("id").map(String::as_str) == Some("malformed-traceparent")
        })
    })
    .await;
    assert_eq!(own.parent_span_id, "", "a root span: {own:?}");
    assert_eq!(own.trace_id.len(), 32, "{own:?}");
    assert_ne!(own.trace_id, "0".repeat(32), "{own:?}");
    assert_ne!(own.trace_id, trace_id);

    // An agent run: its span is a child of the request that started it, with its steps,
    // its model calls and its searches (reaching the other node) in the same trace.
    let session = client
        .post_json("/v1/sessions", &json!({ "kbs": ["traced"] }))
        .await
        .expect(201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let events = ask(&client, &session, "What does the first study find?")
        .await
        .rest()
        .await;
    assert!(answer_text(&events).contains("[1]"), "{events:?}");
    assert!(!fake.requests().is_empty());
    let (spans, run) = eventually("the agent run's spans", || async {
        let spans = receiver.spans();
        let run = spans.iter().find(|span| span.name == "agent_run")?.clone();
        let steps = in_trace(&spans, &run.trace_id, "agent_step");
        (steps.len() >= 2 && !in_trace(&spans, &run.trace_id, "serve_shard_rpc").is_empty())
            .then_some((spans, run))
    })
    .await;
    let starter = spans
        .iter()
        .find(|span| span.span_id == run.parent_span_id)
        .unwrap_or_else(|| panic!("the run's parent was exported: {run:?}"));
    assert_eq!(starter.name, "request", "{starter:?}");
    assert_eq!(
        starter.attributes["route"], "/v1/sessions/{id}/messages",
        "{starter:?}"
    );
    let steps = in_trace(&spans, &run.trace_id, "agent_step");
    assert!(
        steps.iter().all(|step| step.parent_span_id == run.span_id),
        "{steps:?}"
    );
    let calls = in_trace(&spans, &run.trace_id, "model_call");
    assert!(
        steps
            .iter()
            .all(|step| calls.iter().any(|call| call.parent_span_id == step.span_id)),
        "a model call in every step: {calls:?}"
    );
    let searches = in_trace(&spans, &run.trace_id, "search");
    assert!(!searches.is_empty(), "the run's knowledge_search");
    assert!(searches.iter().all(|search| descends(&spans, search, &run)));
    let remote = in_trace(&spans, &run.trace_id, "serve_shard_rpc");
    assert!(
        remote
            .iter()
            .all(|span| span.pid == i64::from(second.pid()))
    );
    let embeddings = in_trace(&spans, &run.trace_id, "embed");
    assert!(
        embeddings.iter().any(|embed| descends(&spans, embed, &run)),
        "the query embedding is in the run's trace: {embeddings:?}"
    );
    assert!(
        receiver.refused.lock().unwrap().is_empty(),
        "{:?}",
        receiver.refused.lock().unwrap()
    );
}
