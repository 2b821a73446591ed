//! Tests against a real HTTP server speaking the Anthropic Messages streaming format.

use serde_json::{Value, json};

use super::*;
use crate::fake_server::{
    FakeLlm, FakeReply, anthropic_sse, collect, split_argument_pieces, split_pieces, text_of,
};
use crate::llm::ToolSpec;
use crate::llm::config::ProviderKind;

fn provider_for(server: &FakeLlm) -> AnthropicProvider {
    AnthropicProvider::new(server.provider("claude", ProviderKind::Anthropic)).unwrap()
}

fn search_tool() -> ToolSpec {
    ToolSpec {
        name: "knowledge_search".to_owned(),
        description: "Hybrid search".to_owned(),
        parameters: json!({"type": "object", "properties": {"query": {"type": "string"}}}),
    }
}

fn message_start(input_tokens: u32) -> Value {
    json!({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "fake-model",
        "content": [], "stop_reason": null,
        "usage": {"input_tokens": input_tokens, "cache_read_input_tokens": 5, "output_tokens": 1},
    }})
}

fn text_answer(text: &str) -> Vec<String> {
    anthropic_sse(&[
        message_start(10),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ])
}

#[tokio::test]
async fn thinking_text_and_a_tool_use_split_across_chunks_stream_in_order() {
    let arguments = r#"{"query": "raft \"leader\" election", "top_k": 3}"#;
    let mut events = vec![
        message_start(20),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "I should "}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "search."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Searching."}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block":
               {"type": "tool_use", "id": "toolu_1", "name": "knowledge_search", "input": {}}}),
    ];
    let characters: Vec<char> = arguments.chars().collect();
    for piece in characters.chunks(4) {
        let partial: String = piece.iter().collect();
        events.push(json!({"type": "content_block_delta", "index": 2,
                           "delta": {"type": "input_json_delta", "partial_json": partial}}));
    }
    events.extend([
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"output_tokens": 42}}),
        json!({"type": "message_stop"}),
    ]);
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(split_pieces(anthropic_sse(&events)))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server);
    let request = ChatRequest {
        messages: vec![
            ChatMessage::System {
                content: "Cite evidence.".to_owned(),
            },
            ChatMessage::User {
                content: "How are leaders elected?".to_owned(),
            },
        ],
        tools: vec![search_tool()],
        ..ChatRequest::default()
    };

    let (events, error) = collect(provider.stream(request).await.unwrap()).await;
    let (events, pieces) = split_argument_pieces(events);

    assert_eq!(error, None);
    assert_eq!(
        pieces.into_values().collect::<Vec<_>>(),
        [("knowledge_search".to_owned(), arguments.to_owned())]
    );
    assert_eq!(
        events,
        vec![
            ChatEvent::ReasoningDelta("I should ".to_owned()),
            ChatEvent::ReasoningDelta("search.".to_owned()),
            ChatEvent::TextDelta("Searching.".to_owned()),
            ChatEvent::ToolCall(ToolCall {
                id: "toolu_1".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: arguments.to_owned(),
            }),
            ChatEvent::Usage(Usage {
                prompt_tokens: 25,
                completion_tokens: 42
            }),
            ChatEvent::Finished(FinishReason::ToolCalls),
        ]
    );
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(request.headers["x-api-key"], "test-key");
    assert_eq!(request.headers["anthropic-version"], ANTHROPIC_VERSION);
    assert!(request.headers.get("authorization").is_none());
    let body = &request.body;
    assert_eq!(body["stream"], true);
    assert_eq!(body["max_tokens"], 2048);
    assert_eq!(body["system"], "Cite evidence.");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "How are leaders elected?"}]}])
    );
    assert_eq!(
        body["tools"],
        json!([{"name": "knowledge_search", "description": "Hybrid search",
                "input_schema": search_tool().parameters}])
    );
}

#[tokio::test]
async fn tool_uses_and_consecutive_results_follow_the_block_format() {
    let server = FakeLlm::scripted(
        vec![FakeReply::Stream(text_answer("done"))],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server);
    let call = |id: &str, arguments: &str| ToolCall {
        id: id.to_owned(),
        name: "knowledge_search".to_owned(),
        arguments: arguments.to_owned(),
    };
    let result = |id: &str, content: &str| ChatMessage::Tool {
        call_id: id.to_owned(),
        name: "knowledge_search".to_owned(),
        content: content.to_owned(),
    };
    let request = ChatRequest {
        messages: vec![
            ChatMessage::User {
                content: "Compare A and B".to_owned(),
            },
            ChatMessage::Assistant {
                content: "Two searches.".to_owned(),
                tool_calls: vec![call("t1", r#"{"query":"A"}"#), call("t2", "not json")],
            },
            result("t1", "A is 1"),
            result("t2", "B is 2"),
            ChatMessage::User {
                content: "Be brief.".to_owned(),
            },
        ],
        tools: vec![search_tool()],
        ..ChatRequest::default()
    };

    let (events, error) = collect(provider.stream(request).await.unwrap()).await;

    assert_eq!(error, None);
    assert_eq!(text_of(&events), "done");
    let body = &server.requests()[0].body;
    assert!(body.get("system").is_none());
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Compare A and B"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Two searches."},
                {"type": "tool_use", "id": "t1", "name": "knowledge_search", "input": {"query": "A"}},
                {"type": "tool_use", "id": "t2", "name": "knowledge_search", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "A is 1"},
                {"type": "tool_result", "tool_use_id": "t2", "content": "B is 2"},
                {"type": "text", "text": "Be brief."},
            ]},
        ])
    );
}

#[tokio::test]
async fn error_events_and_statuses_become_llm_errors() {
    let overloaded = anthropic_sse(&[
        message_start(3),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let truncated = text_answer("cut")[..3].to_vec();
    let server = FakeLlm::scripted(
        vec![
            FakeReply::Stream(overloaded),
            FakeReply::Stream(truncated),
            FakeReply::Status(
                401,
                json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
            ),
        ],
        FakeReply::Hang,
    )
    .await;
    let provider = provider_for(&server);
    let request = ChatRequest {
        messages: vec![ChatMessage::User {
            content: "hi".to_owned(),
        }],
        ..ChatRequest::default()
    };

    let (_, error) = collect(provider.stream(request.clone()).await.unwrap()).await;
    let error = error.unwrap();
    assert!(
        matches!(&error, LlmError::Status { status: 529, message, .. } if message.contains("Overloaded")),
        "{error:?}"
    );
    assert!(error.is_retryable());

    let (events, error) = collect(provider.stream(request.clone()).await.unwrap()).await;
    assert_eq!(text_of(&events), "cut");
    assert!(
        matches!(&error, Some(LlmError::Protocol { message, .. }) if message.contains("message_stop")),
        "{error:?}"
    );

    let error = provider.stream(request).await.err().unwrap();
    assert_eq!(
        error,
        LlmError::Status {
            provider: "claude".to_owned(),
            status: 401,
            message: "invalid x-api-key".to_owned(),
        }
    );
}

#[tokio::test]
async fn text_mode_works_over_anthropic_too() {
    let text = "<tool_call>\n{\"name\": \"knowledge_search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>";
    let server =
        FakeLlm::scripted(vec![FakeReply::Stream(text_answer(text))], FakeReply::Hang).await;
    let provider = AnthropicProvider::new(ProviderConfig {
        tool_mode: ToolMode::Text,
        ..server.provider("claude", ProviderKind::Anthropic)
    })
    .unwrap();
    let request = ChatRequest {
        messages: vec![ChatMessage::User {
            content: "find x".to_owned(),
        }],
        tools: vec![search_tool()],
        ..ChatRequest::default()
    };

    let (mut events, error) = collect(provider.stream(request).await.unwrap()).await;

    assert_eq!(error, None);
    if let Some(ChatEvent::ToolCall(call)) = events.first_mut() {
        assert!(
            call.id.starts_with("call_") && call.id.ends_with("_1"),
            "{}",
            call.id
        );
        call.id = "made-up".to_owned();
    }
    assert_eq!(
        events,
        vec![
            ChatEvent::ToolCall(ToolCall {
                id: "made-up".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: r#"{"query":"x"}"#.to_owned(),
            }),
            ChatEvent::Usage(Usage {
                prompt_tokens: 15,
                completion_tokens: 2
            }),
            ChatEvent::Finished(FinishReason::ToolCalls),
        ]
    );
    let body = &server.requests()[0].body;
    assert!(body.get("tools").is_none());
    assert!(
        body["system"]
            .as_str()
            .unwrap()
            .contains("- knowledge_search: Hybrid search")
    );
}
