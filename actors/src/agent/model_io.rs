//! Small helpers around [`ChatModel`] for the one-shot calls of a run (planning, follow-up
//! rewriting, history summaries, the fast path's answer): the whole text of a streamed
//! completion, bounded by a timeout and the run's cancellation.

use std::time::Duration;

use futures::StreamExt;

use sift_models::llm::{ChatEvent, ChatMessage, ChatModel, ChatRequest, LlmError, Usage};

use super::RunCancel;

#[derive(Debug, thiserror::Error)]
pub enum AuxError {
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("cancelled")]
    Cancelled,
    #[error(transparent)]
    Model(#[from] LlmError),
}

/// The text a model answers to `messages` (no tools), with the usage it reported.
#[tracing::instrument(name = "model_call", skip_all, fields(otel.kind = "client", messages = messages.len()))]
pub async fn complete_text(
    model: &dyn ChatModel,
    messages: Vec<ChatMessage>,
    max_tokens: Option<u32>,
    timeout: Duration,
    cancel: &RunCancel,
) -> Result<(String, Usage), AuxError> {
    let request = ChatRequest {
        messages,
        tools: Vec::new(),
        max_tokens,
        temperature: Some(0.0),
    };
    let work = async {
        let mut stream = model.stream(request).await?;
        let mut text = String::new();
        let mut usage = Usage::default();
        while let Some(event) = stream.next().await {
            match event? {
                ChatEvent::TextDelta(delta) => text.push_str(&delta),
                ChatEvent::Usage(reported) => usage = reported,
                ChatEvent::Finished(_) => break,
                ChatEvent::ReasoningDelta(_)
                | ChatEvent::ToolArgumentsDelta { .. }
                | ChatEvent::ToolCall(_) => {}
            }
        }
        Ok::<_, AuxError>((text, usage))
    };
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(AuxError::Cancelled),
        outcome = tokio::time::timeout(timeout, work) => match outcome {
            Ok(result) => result,
            Err(_) => Err(AuxError::Timeout(timeout)),
        },
    }
}

/// The first JSON object in `text` (models wrap JSON in prose or code fences).
pub fn extract_json_object(text: &str) -> Option<serde_json::Value> {
    find_json_object(text).map(|(value, _, _)| value)
}

/// The first JSON object in `text` with its byte range.
pub fn find_json_object(text: &str) -> Option<(serde_json::Value, usize, usize)> {
    let mut search_from = 0;
    while let Some(offset) = text[search_from..].find('{') {
        let start = search_from + offset;
        let mut depth = 0i32;
        let mut in_string = false;
        let mut escaped = false;
        for (index, c) in text[start..].char_indices() {
            if in_string {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_string = true,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        let end = start + index + 1;
                        if let Ok(value) =
                            serde_json::from_str::<serde_json::Value>(&text[start..end])
                            && value.is_object()
                        {
                            return Some((value, start, end));
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        search_from = start + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_json_in_prose_and_fences() {
        let text = "Sure! ```json\n{\"a\": {\"b\": \"}\"}, \"c\": [1]}\n``` done";
        let value = extract_json_object(text).unwrap();
        assert_eq!(value["a"]["b"], "}");
        assert_eq!(value["c"][0], 1);
        assert!(extract_json_object("no json {here").is_none());
        // A broken first object does not hide a good second one.
        assert_eq!(
            extract_json_object("{bad} then {\"ok\": true}").unwrap()["ok"],
            true
        );
    }
}
