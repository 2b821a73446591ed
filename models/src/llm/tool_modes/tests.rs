//! Tests of the text and JSON-step tool call readers, fed in every possible chunking.

use serde_json::json;

use super::*;

fn names() -> Vec<String> {
    vec!["knowledge_search".to_owned(), "final_answer".to_owned()]
}

/// Parses `text` fed in pieces of `size` characters; text deltas are merged for comparison.
fn parse_in_pieces(text: &str, size: usize) -> Vec<ChatEvent> {
    let mut parser = TextToolParser::new(names());
    let characters: Vec<char> = text.chars().collect();
    let mut events = Vec::new();
    for piece in characters.chunks(size) {
        events.extend(parser.push(&piece.iter().collect::<String>()));
    }
    events.extend(parser.finish());
    merge_text(events)
}

/// Made-up call ids are `call_<random>_<n>`: keeps `call_<n>` for comparison (idempotent).
fn normalise_ids(events: Vec<ChatEvent>) -> Vec<ChatEvent> {
    events
        .into_iter()
        .map(|event| match event {
            ChatEvent::ToolCall(mut call) => {
                let parts: Vec<&str> = call.id.split('_').collect();
                if let ["call", random, number] = parts[..] {
                    assert_eq!(random.len(), 12, "{}", call.id);
                    call.id = format!("call_{number}");
                }
                ChatEvent::ToolCall(call)
            }
            other => other,
        })
        .collect()
}

fn merge_text(events: Vec<ChatEvent>) -> Vec<ChatEvent> {
    let mut merged: Vec<ChatEvent> = Vec::new();
    for event in normalise_ids(events) {
        match (merged.last_mut(), event) {
            (Some(ChatEvent::TextDelta(previous)), ChatEvent::TextDelta(text)) => {
                previous.push_str(&text)
            }
            (_, event) => merged.push(event),
        }
    }
    merged
}

fn call(number: usize, name: &str, arguments: serde_json::Value) -> ChatEvent {
    ChatEvent::ToolCall(ToolCall {
        id: format!("call_{number}"),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    })
}

fn text(text: &str) -> ChatEvent {
    ChatEvent::TextDelta(text.to_owned())
}

/// Asserts the same events whatever the chunking.
fn assert_parses(input: &str, expected: Vec<ChatEvent>) {
    for size in 1..=input.chars().count() {
        assert_eq!(
            parse_in_pieces(input, size),
            expected,
            "piece size {size} of {input:?}"
        );
    }
}

#[test]
fn a_fenced_call_between_text_is_parsed() {
    assert_parses(
        "I will search.\n```json\n{\"name\": \"knowledge_search\", \"arguments\": {\"query\": \"a {b}\"}}\n```\nWaiting.",
        vec![
            text("I will search.\n"),
            call(1, "knowledge_search", json!({"query": "a {b}"})),
            text("\nWaiting."),
        ],
    );
}

#[test]
fn bare_objects_of_either_shape_are_calls() {
    assert_parses(
        "{\"tool\": \"knowledge_search\", \"args\": {\"query\": \"x\"}} then {\"name\": \"final_answer\", \"arguments\": \"{\\\"answer\\\": \\\"y\\\"}\"}",
        vec![
            call(1, "knowledge_search", json!({"query": "x"})),
            text(" then "),
            ChatEvent::ToolCall(ToolCall {
                id: "call_2".to_owned(),
                name: "final_answer".to_owned(),
                arguments: "{\"answer\": \"y\"}".to_owned(),
            }),
        ],
    );
}

#[test]
fn qwen_tags_and_arrays_of_calls_are_parsed() {
    assert_parses(
        "<tool_call>\n{\"name\": \"knowledge_search\", \"arguments\": {\"query\": \"q\"}}\n</tool_call>",
        vec![call(1, "knowledge_search", json!({"query": "q"}))],
    );
    assert_parses(
        "```\n[{\"name\": \"knowledge_search\", \"arguments\": {}}, {\"name\": \"final_answer\", \"arguments\": {}}]\n```",
        vec![
            call(1, "knowledge_search", json!({})),
            call(2, "final_answer", json!({})),
        ],
    );
}

#[test]
fn json_and_code_that_are_not_calls_stay_text() {
    for input in [
        "The set {a, b} has two members.",
        "Result: {\"answer\": 42} as JSON.",
        "Her {\"name\": \"Ada\"} record.",
        "```python\nprint({'a': 1})\n```",
        "An unclosed { brace and ``` fence",
        "Ends with a partial opener ``",
    ] {
        assert_parses(input, vec![text(input)]);
    }
}

#[test]
fn a_known_tool_without_arguments_is_a_call() {
    assert_parses(
        "{\"name\": \"final_answer\"}",
        vec![call(1, "final_answer", json!({}))],
    );
}

#[test]
fn an_unclosed_fence_holding_a_call_is_still_a_call() {
    assert_parses(
        "```json\n{\"name\": \"knowledge_search\", \"arguments\": {\"query\": \"z\"}}",
        vec![call(1, "knowledge_search", json!({"query": "z"}))],
    );
}

#[test]
fn unknown_tool_names_are_calls_for_the_agent_to_reject() {
    assert_parses(
        "```json\n{\"name\": \"delete_everything\", \"arguments\": {}}\n```",
        vec![call(1, "delete_everything", json!({}))],
    );
}

/// Parses a JSON step fed in pieces of `size` characters.
fn step_in_pieces(input: &str, size: usize) -> Vec<ChatEvent> {
    let mut parser = JsonStepParser::default();
    let characters: Vec<char> = input.chars().collect();
    let mut events = Vec::new();
    for piece in characters.chunks(size) {
        events.extend(parser.push(&piece.iter().collect::<String>()));
    }
    events.extend(parser.finish());
    normalise_ids(events)
}

#[test]
fn made_up_call_ids_differ_between_answers() {
    let text = "{\"name\": \"final_answer\", \"arguments\": {}}";
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let mut parser = TextToolParser::new(names());
            let mut events = parser.push(text);
            events.extend(parser.finish());
            match &events[..] {
                [ChatEvent::ToolCall(call)] => call.id.clone(),
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn json_steps_stream_the_thought_with_escapes_in_any_chunking() {
    let thought = "Quote \" backslash \\ newline\n é \u{1F600} tab\t end";
    // serde_json escapes quotes and control characters; write the emoji and é as \u escapes
    // too, as some servers do.
    let step = format!(
        "{{ \"thought\" : {}, \"tool\": \"knowledge_search\", \"arguments\": {{\"query\": \"q\"}} }}",
        serde_json::to_string(thought)
            .unwrap()
            .replace('é', "\\u00e9")
            .replace('\u{1F600}', "\\ud83d\\ude00")
    );
    for size in 1..=step.chars().count() {
        let events = step_in_pieces(&step, size);
        let reasoning: String = events
            .iter()
            .filter_map(|event| match event {
                ChatEvent::ReasoningDelta(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning, thought, "piece size {size}");
        assert_eq!(
            events.last(),
            Some(&ChatEvent::ToolCall(ToolCall {
                id: "call_1".to_owned(),
                name: "knowledge_search".to_owned(),
                arguments: r#"{"query":"q"}"#.to_owned(),
            })),
            "piece size {size}"
        );
    }
}

#[test]
fn a_step_that_is_not_json_falls_back_to_the_text_reader() {
    assert_eq!(
        step_in_pieces("I think the answer is 4.", 5),
        vec![text("I think the answer is 4.")]
    );
    let events = step_in_pieces(
        "Sure: {\"name\": \"final_answer\", \"arguments\": {\"answer\": \"4\"}}",
        4,
    );
    assert_eq!(
        merge_text(events),
        vec![
            text("Sure: "),
            ChatEvent::ToolCall(ToolCall {
                id: "call_1".to_owned(),
                name: "final_answer".to_owned(),
                arguments: r#"{"answer":"4"}"#.to_owned(),
            })
        ]
    );
}

#[test]
fn the_decoder_holds_usage_until_the_flushed_calls() {
    let tools = vec![ToolSpec {
        name: "knowledge_search".to_owned(),
        description: "search".to_owned(),
        parameters: json!({"type": "object"}),
    }];
    let mut decoder = ToolModeDecoder::new(ToolMode::Text, &tools);
    let mut events = Vec::new();
    for event in [
        text("{\"name\": \"knowledge_search\", \"arguments\": {}"),
        ChatEvent::Usage(Usage {
            prompt_tokens: 1,
            completion_tokens: 2,
        }),
        ChatEvent::Finished(FinishReason::Stop),
    ] {
        events.extend(decoder.map(event));
    }
    // The object never closed: it stays text, usage comes last before Finished(Stop).
    assert_eq!(
        events,
        vec![
            text("{\"name\": \"knowledge_search\", \"arguments\": {}"),
            ChatEvent::Usage(Usage {
                prompt_tokens: 1,
                completion_tokens: 2
            }),
            ChatEvent::Finished(FinishReason::Stop),
        ]
    );
    // Without tools there is nothing to parse: JSON text passes through untouched.
    let mut plain = ToolModeDecoder::new(ToolMode::Text, &[]);
    let call_text = text("{\"name\": \"knowledge_search\", \"arguments\": {}}");
    assert_eq!(plain.map(call_text.clone()), vec![call_text]);
}

#[test]
fn history_is_rewritten_for_templates_without_tool_roles() {
    let request = ChatRequest {
        messages: vec![
            ChatMessage::User {
                content: "q".to_owned(),
            },
            ChatMessage::Assistant {
                content: "searching".to_owned(),
                tool_calls: vec![ToolCall {
                    id: "c1".to_owned(),
                    name: "knowledge_search".to_owned(),
                    arguments: r#"{"query":"q"}"#.to_owned(),
                }],
            },
            ChatMessage::Tool {
                call_id: "c1".to_owned(),
                name: "knowledge_search".to_owned(),
                content: "first".to_owned(),
            },
            ChatMessage::Tool {
                call_id: "c2".to_owned(),
                name: "knowledge_search".to_owned(),
                content: "second".to_owned(),
            },
        ],
        tools: vec![ToolSpec {
            name: "knowledge_search".to_owned(),
            description: "search".to_owned(),
            parameters: json!({"type": "object"}),
        }],
        ..ChatRequest::default()
    };

    let rewritten = rewrite_for_text_tools(&request, ToolMode::JsonSchema);

    assert!(rewritten.tools.is_empty());
    assert_eq!(rewritten.messages.len(), 4);
    assert!(
        matches!(&rewritten.messages[0], ChatMessage::System { content } if content.contains("- knowledge_search: search"))
    );
    let ChatMessage::Assistant {
        content,
        tool_calls,
    } = &rewritten.messages[2]
    else {
        panic!("{:?}", rewritten.messages[2]);
    };
    assert!(tool_calls.is_empty());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(content).unwrap(),
        json!({"thought": "searching", "tool": "knowledge_search", "tool_input": {"query": "q"}})
    );
    // Written in the order a step is decoded: thought, tool, then the tool's input.
    let thought = content.find("\"thought\"").unwrap();
    let tool = content.find("\"tool\"").unwrap();
    let input = content.find("\"tool_input\"").unwrap();
    assert!(thought < tool && tool < input, "{content}");
    let ChatMessage::User { content } = &rewritten.messages[3] else {
        panic!("{:?}", rewritten.messages[3]);
    };
    assert!(content.contains("first") && content.contains("second") && content.contains("c2"));
}

#[test]
fn json_steps_stream_their_arguments_once_the_tool_is_named() {
    let step = r#"{"thought": "I have it.", "tool": "final_answer", "tool_input": {"answer": "Leaders are elected \"by vote\".", "citations": ["a#1"]}}"#;
    let arguments_start = step.find(r#"{"answer""#).unwrap();
    for size in 1..=step.chars().count() {
        let events = step_in_pieces(step, size);
        let (others, pieces) = crate::fake_server::split_argument_pieces(events);
        // One call's pieces, named, from the arguments' first byte to the step's end.
        let pieces: Vec<(u64, (String, String))> = pieces.into_iter().collect();
        assert_eq!(
            pieces,
            [(
                0,
                (
                    "final_answer".to_owned(),
                    step[arguments_start..].to_owned()
                )
            )],
            "piece size {size}"
        );
        // The field can be read from them as it grows.
        let text = &pieces[0].1.1;
        let start = find_string_value_start(text, "answer").unwrap();
        let (answer, _, closed) = decode_json_string_prefix(&text[start..]);
        assert!(closed);
        assert_eq!(answer, "Leaders are elected \"by vote\".");
        assert!(
            matches!(others.last(), Some(ChatEvent::ToolCall(call)) if call.name == "final_answer")
        );
    }
    // A step that never names its tool gives no pieces.
    let unnamed = step_in_pieces(r#"{"thought": "x", "tool_input": {"answer": "y"}}"#, 3);
    assert!(
        !unnamed
            .iter()
            .any(|event| matches!(event, ChatEvent::ToolArgumentsDelta { .. }))
    );
}
