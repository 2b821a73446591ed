//! Tests against a real HTTP server speaking the OpenAI chat completions streaming format.

use serde_json::{Value, json};

use super::*;
use crate::fake_server::{
    FakeLlm, FakeReply, collect, openai_chunk, openai_sse, openai_text_answer, openai_usage,
    split_argument_pieces, split_pieces, text_of,
};
use crate::llm::config::ProviderKind;

fn search_tool() -> ToolSpec {
    ToolSpec {
        name: "knowledge_search".to_owned(),
        description: "Hybrid search over the knowledge bases".to_owned(),
        parameters: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
    }
}

fn answer_tool() -> ToolSpec {
    ToolSpec {
        name: "final_answer".to_owned(),
        description: "The answer with citations".to_owned(),
        parameters: json!({"type": "object", "properties": {"answer": {"type": "string"}}}),
    }
}

fn question() -> ChatRequest {
    ChatRequest {
        messages: vec![
            ChatMessage::System {
                content: "Answer from evidence.".to_owned(),
            },
            ChatMessage::User {
                content: "What is Sift?".to_owned(),
            },
        ],
        ..ChatRequest::default()
    }
}

async fn provider_for(server: &FakeLlm, mode: ToolMode) -> OpenAiProvider {
    OpenAiProvider::new(ProviderConfig {
        tool_mode: mode,
        ..server.provider("fake", ProviderKind::OpenAi)
    })
    .unwrap()
}

/// Fragments of one tool call's argument text, a few characters each.
fn fragments(text: &str, size: usize) -> Vec<String> {
    text.chars()
        .collect::<Vec<_>>()
        .chunks(size)
        .map(|piece| piece.iter().collect())
        .collect()
}

#[tokio::test]
async fn text_streams_with_usage_and_the_request_follows_the_wire_format() {
    let answer = split_pieces(openai_text_answer(&[
        "Sift ", "is a ", "search ", "engine.",
    ]));
    let server = FakeLlm::scripted(vec![FakeReply::Stream(answer)], FakeReply::Hang).await;
    let provider = provider_for(&server, ToolMode::Native).await;

    let (events, error) = collect(provider.stream(question()).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "Sift is a search engine.");
    assert_eq!(
        events[events.len() - 2..],
        [
            ChatEvent::Usage(Usage {
                prompt_tokens: 11,
                completion_tokens: 4
            }),
            ChatEvent::Finished(FinishReason::Stop)
        ]
    );
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.headers["authorization"].to_str().unwrap(),
        "Bearer test-key"
    );
    assert_eq!(request.body["model"], "fake-model");
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.body["stream_options"]["include_usage"], true);
    assert_eq!(request.body["max_tokens"], 2048);
    assert_eq!(
        request.body["messages"],
        json!([
            {"role": "system", "content": "Answer from evidence."},
            {"role": "user", "content": "What is Sift?"},
        ])
    );
    assert!(request.body.get("tools").is_none());
}

#[tokio::test]
async fn interleaved_tool_calls_split_across_many_chunks_are_rebuilt() {
    let first_arguments = r#"{"query": "raft leader election", "top_k": 5}"#;
    let second_arguments = r#"{"answer": "Sift uses \"raft\" [1]."}"#;
    let first = fragments(first_arguments, 3);
    let second = fragments(second_arguments, 2);
    let mut chunks = vec![openai_chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_a", "type": "function",
             "function": {"name": "knowledge_search", "arguments": ""}}
        ]}),
        None,
    )];
    chunks.push(openai_chunk(
        json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "final_answer", "arguments": ""}}]}),
        None,
    ));
    // The two calls' argument fragments alternate, several per chunk at times.
    for position in 0..first.len().max(second.len()) {
        let mut pieces = Vec::new();
        if let Some(piece) = first.get(position) {
            pieces.push(json!({"index": 0, "function": {"arguments": piece}}));
        }
        if let Some(piece) = second.get(position) {
            pieces.push(json!({"index": 1, "function": {"arguments": piece}}));
        }
        chunks.push(openai_chunk(json!({"tool_calls": pieces}), None));
    }
    chunks.push(openai_chunk(json!({}), Some("tool_calls")));
    chunks.push(openai_usage(30, 20));
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(split_pieces(openai_sse(&chunks)))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Native).await;
    let request = ChatRequest {
        tools: vec![search_tool(), answer_tool()],
        ..question()
    };

    let (events, error) = collect(provider.stream(request).await.unwrap()).await;
    let (events, pieces) = split_argument_pieces(events);

    assert_eq!(error, None);
    // The arguments also came piece by piece, as written, each call's apart.
    assert_eq!(
        pieces.into_values().collect::<Vec<_>>(),
        [
            ("knowledge_search".to_owned(), first_arguments.to_owned()),
            ("final_answer".to_owned(), second_arguments.to_owned()),
        ]
    );
    assert_eq!(
        events,
        vec![
            ChatEvent::ToolCall(ToolCall {
                id: "call_a".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: first_arguments.to_owned(),
            }),
            ChatEvent::ToolCall(ToolCall {
                id: "call_b".to_owned(),
                name: "final_answer".to_owned(),
                arguments: second_arguments.to_owned(),
            }),
            ChatEvent::Usage(Usage {
                prompt_tokens: 30,
                completion_tokens: 20
            }),
            ChatEvent::Finished(FinishReason::ToolCalls),
        ]
    );
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "knowledge_search");
    assert_eq!(
        body["tools"][0]["function"]["parameters"],
        search_tool().parameters
    );
}

#[tokio::test]
async fn history_with_tool_calls_and_results_is_converted() {
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(openai_text_answer(&["ok"]))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Native).await;
    let mut request = question();
    request.tools = vec![search_tool()];
    request.temperature = Some(0.25);
    request.max_tokens = Some(77);
    request.messages.extend([
        ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: r#"{"query":"sift"}"#.to_owned(),
            }],
        },
        ChatMessage::Tool {
            call_id: "call_1".to_owned(),
            name: "knowledge_search".to_owned(),
            content: "[1] Sift is a search engine".to_owned(),
        },
    ]);

    let (_, error) = collect(provider.stream(request).await.unwrap()).await;

    assert_eq!(error, None);
    let body = &server.requests()[0].body;
    assert_eq!(body["max_tokens"], 77);
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "knowledge_search", "arguments": "{\"query\":\"sift\"}"}
        }]})
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "[1] Sift is a search engine"})
    );
}

#[tokio::test]
async fn reasoning_content_becomes_reasoning_deltas() {
    let chunks = vec![
        openai_chunk(json!({"reasoning_content": "The user asks "}), None),
        openai_chunk(json!({"reasoning_content": "about Sift."}), None),
        openai_chunk(json!({"content": "Sift."}), None),
        openai_chunk(json!({}), Some("length")),
    ];
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(openai_sse(&chunks))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Native).await;

    let (events, error) = collect(provider.stream(question()).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![
            ChatEvent::ReasoningDelta("The user asks ".to_owned()),
            ChatEvent::ReasoningDelta("about Sift.".to_owned()),
            ChatEvent::TextDelta("Sift.".to_owned()),
            ChatEvent::Finished(FinishReason::Length),
        ]
    );
}

#[tokio::test]
async fn an_error_status_carries_the_servers_message() {
    let server = FakeLlm::scripted(
        vec![FakeReply::Status(
            503,
            json!({"error": {"message": "model is loading", "type": "unavailable"}}),
        )],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Native).await;

    let error = provider.stream(question()).await.err().unwrap();

    assert_eq!(
        error,
        LlmError::Status {
            provider: "fake".to_owned(),
            status: 503,
            message: "model is loading".to_owned(),
        }
    );
    assert!(error.is_retryable());
}

#[tokio::test]
async fn a_broken_or_truncated_stream_is_a_protocol_error() {
    let partial = openai_sse(&[openai_chunk(json!({"content": "Half an"}), None)]);
    let without_done = partial[..1].to_vec();
    let server = FakeLlm::scripted(
        vec![
            FakeReply::StreamThenBreak(without_done.clone()),
            FakeReply::Stream(without_done),
            FakeReply::Stream(vec!["data: {not json\n\n".to_owned()]),
            FakeReply::Stream(vec![
                "data: {\"error\": {\"message\": \"out of memory\"}}\n\n".to_owned(),
            ]),
        ],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Native).await;

    for expected in [
        "stream broken",
        "ended before the answer finished",
        "not JSON",
        "out of memory",
    ] {
        let (events, error) = collect(provider.stream(question()).await.unwrap()).await;
        let error = error.expect("the stream must fail");
        assert!(
            matches!(&error, LlmError::Protocol { message, .. } if message.contains(expected)),
            "{error:?} should mention {expected}"
        );
        assert!(
            events
                .iter()
                .all(|event| !matches!(event, ChatEvent::Finished(_))),
            "{events:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let provider = OpenAiProvider::new(ProviderConfig::openai(
        format!("http://{address}/v1"),
        "m",
        None,
    ))
    .unwrap();

    let error = provider.stream(question()).await.err().unwrap();

    assert!(matches!(error, LlmError::Connect { .. }), "{error:?}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn text_mode_describes_tools_and_parses_calls_from_the_text() {
    let text = "Let me search first.\n```json\n{\"name\": \"knowledge_search\", \
                \"arguments\": {\"query\": \"raft\"}}\n```\n";
    let pieces: Vec<String> = fragments(text, 4);
    let piece_refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(openai_text_answer(&piece_refs))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::Text).await;
    let mut request = question();
    request.tools = vec![search_tool(), answer_tool()];
    request.messages.extend([
        ChatMessage::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: r#"{"query":"sift"}"#.to_owned(),
            }],
        },
        ChatMessage::Tool {
            call_id: "c1".to_owned(),
            name: "knowledge_search".to_owned(),
            content: "nothing found".to_owned(),
        },
    ]);

    let (events, error) = collect(provider.stream(request).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "Let me search first.\n\n");
    let calls: Vec<&ToolCall> = events
        .iter()
        .filter_map(|event| match event {
            ChatEvent::ToolCall(call) => Some(call),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "knowledge_search");
    assert_eq!(
        serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
        json!({"query": "raft"})
    );
    assert_eq!(
        events.last(),
        Some(&ChatEvent::Finished(FinishReason::ToolCalls))
    );
    let body = &server.requests()[0].body;
    assert!(body.get("tools").is_none());
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with("Answer from evidence."));
    assert!(system.contains("- knowledge_search: Hybrid search"));
    assert!(system.contains("- final_answer:"));
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert!(
        body["messages"][2]["content"]
            .as_str()
            .unwrap()
            .contains("\"name\":\"knowledge_search\"")
    );
    assert!(
        body["messages"][3]["content"]
            .as_str()
            .unwrap()
            .contains("nothing found")
    );
}

#[tokio::test]
async fn json_schema_mode_constrains_each_step_and_streams_the_thought() {
    let step = json!({
        "thought": "I need evidence about \"raft\" first.\nSearch.",
        "tool": "knowledge_search",
        "tool_input": {"query": "raft élection"},
    })
    .to_string();
    let pieces = fragments(&step, 3);
    let piece_refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(openai_text_answer(&piece_refs))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server, ToolMode::JsonSchema).await;
    let request = ChatRequest {
        tools: vec![search_tool(), answer_tool()],
        ..question()
    };

    let (events, error) = collect(provider.stream(request).await.unwrap()).await;

    assert_eq!(error, None);
    let reasoning: Vec<&str> = events
        .iter()
        .filter_map(|event| match event {
            ChatEvent::ReasoningDelta(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        reasoning.len() > 1,
        "the thought is streamed: {reasoning:?}"
    );
    assert_eq!(
        reasoning.concat(),
        "I need evidence about \"raft\" first.\nSearch."
    );
    assert_eq!(text_of(&events), "");
    let call = events
        .iter()
        .find_map(|event| match event {
            ChatEvent::ToolCall(call) => Some(call),
            _ => None,
        })
        .unwrap();
    assert_eq!(call.name, "knowledge_search");
    assert_eq!(
        serde_json::from_str::<Value>(&call.arguments).unwrap(),
        json!({"query": "raft élection"})
    );
    assert_eq!(
        events[events.len() - 2..],
        [
            ChatEvent::Usage(Usage {
                prompt_tokens: 11,
                completion_tokens: pieces.len() as u32
            }),
            ChatEvent::Finished(FinishReason::ToolCalls)
        ]
    );
    let body = &server.requests()[0].body;
    assert!(body.get("tools").is_none());
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "agent_step");
    // One alternative per tool, each with that tool's own parameters.
    let alternatives = format["json_schema"]["schema"]["anyOf"].as_array().unwrap();
    let names: Vec<&Value> = alternatives
        .iter()
        .map(|a| &a["properties"]["tool"]["enum"][0])
        .collect();
    assert_eq!(names, [&json!("knowledge_search"), &json!("final_answer")]);
    for alternative in alternatives {
        assert_eq!(
            alternative["required"],
            json!(["thought", "tool", "tool_input"])
        );
        assert_eq!(alternative["properties"]["thought"]["maxLength"], 600);
    }
    // Properties go out in the order a constrained decoder makes the model write them.
    let text = serde_json::to_string(&alternatives[0]["properties"]).unwrap();
    let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap();
    assert!(
        at("thought") < at("tool") && at("tool") < at("tool_input"),
        "{text}"
    );
    assert_eq!(
        alternatives[1]["properties"]["tool_input"],
        json!({"type": "object", "properties": {"answer": {"type": "string"}}})
    );
}

#[test]
fn step_schemas_keep_what_constrained_decoders_support() {
    let tool = ToolSpec {
        name: "mcp_tool".to_owned(),
        description: "A tool of an MCP server".to_owned(),
        parameters: json!({
            "type": "object",
            "$schema": "http://json-schema.org/draft-07/schema#",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 3},
                "mode": {"enum": ["a", "b"], "description": "how"},
            },
            "required": ["ids"],
        }),
    };
    let format = step_response_format(&[tool]);
    assert_eq!(
        format["json_schema"]["schema"]["anyOf"][0]["properties"]["tool_input"],
        json!({
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "mode": {"enum": ["a", "b"]},
            },
            "required": ["ids"],
        })
    );
}

#[test]
fn calls_without_an_index_or_with_a_reused_index_stay_apart() {
    let call = |id: &str, name: &str, arguments: &str| {
        ChatEvent::ToolCall(ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        })
    };
    // No index at all: one complete call per fragment (older Ollama), then a continuation.
    let mut aggregator = StreamAggregator::default();
    for delta in [
        json!({"tool_calls": [{"id": "a", "function": {"name": "knowledge_search", "arguments": "{\"query\":"}}]}),
        json!({"tool_calls": [{"function": {"arguments": "\"x\"}"}}]}),
        json!({"tool_calls": [{"id": "b", "function": {"name": "final_answer", "arguments": {"answer": "y"}}}]}),
    ] {
        // Only argument pieces until the choice finishes.
        let (complete, _) =
            split_argument_pieces(aggregator.push(&openai_chunk(delta, None)).unwrap());
        assert!(complete.is_empty());
    }
    let mut events = aggregator
        .push(&openai_chunk(json!({}), Some("stop")))
        .unwrap();
    events.extend(aggregator.finish());
    assert_eq!(
        events,
        vec![
            call("a", "knowledge_search", r#"{"query":"x"}"#),
            call("b", "final_answer", r#"{"answer":"y"}"#),
            ChatEvent::Finished(FinishReason::ToolCalls),
        ]
    );

    // Every call numbered 0 by the server, each with its own id.
    let mut aggregator = StreamAggregator::default();
    for delta in [
        json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "one", "arguments": "{\"n\":"}}]}),
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        json!({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "two", "arguments": "{\"n\":"}}]}),
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "2}"}}]}),
    ] {
        aggregator.push(&openai_chunk(delta, None)).unwrap();
    }
    let mut events = aggregator
        .push(&openai_chunk(json!({}), Some("tool_calls")))
        .unwrap();
    events.extend(aggregator.finish());
    assert_eq!(
        events,
        vec![
            call("a", "one", r#"{"n":1}"#),
            call("b", "two", r#"{"n":2}"#),
            ChatEvent::Finished(FinishReason::ToolCalls),
        ]
    );
}
