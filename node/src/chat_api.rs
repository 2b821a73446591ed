//! The chat part of the HTTP API: sessions, runs as server-sent events, and the
//! OpenAI-compatible `POST /v1/chat/completions` and `GET /v1/models`. Errors go through the
//! same [`ApiError`] mapping as the rest of the API.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use sift_actors::agent::{AgentEvent, Citation, PastTurn, RunFinish};
use sift_actors::sessions::{
    Caller, EphemeralRun, MAX_SESSIONS_PAGE, RunEvent, RunEventKind, RunLog,
};
use sift_api::{NewMessage, NewSession};
use sift_storage::meta::Role;

use crate::api::{ApiError, ApiJson, ApiPath, AppState, Page, next_after, requested_page};
use crate::auth::Principal;

type ApiResult<T> = Result<T, ApiError>;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route(
            "/v1/sessions/{id}/messages",
            post(post_message).get(list_messages),
        )
        .route("/v1/runs/{id}", get(run_status))
        .route("/v1/runs/{id}/events", get(run_events))
        .route("/v1/runs/{id}/stop", post(stop_run))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(list_models))
}

// ---- sessions ----

/// The session layer's view of the request's caller (put there by `auth::authenticate`).
fn caller(principal: &Principal) -> Caller {
    Caller {
        owner: principal.key_id.clone(),
        scope: principal.scope(),
        sees_tenant: principal.role == Role::Admin,
    }
}

async fn create_session(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<NewSession>,
) -> ApiResult<impl IntoResponse> {
    let session = state
        .sessions
        .create_session(request, &caller(&principal))
        .await?;
    Ok((StatusCode::CREATED, Json(session)))
}

/// `GET /v1/sessions?after=ID&limit=N`: newest first, paged like the documents of a KB.
async fn list_sessions(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    page: Result<Query<Page>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let (after, limit) = requested_page(page, MAX_SESSIONS_PAGE)?;
    let sessions = state
        .sessions
        .list_sessions(after.as_deref(), limit, &caller(&principal))?;
    let next = next_after(&sessions, limit, |session| &session.id);
    Ok(Json(json!({ "sessions": sessions, "next_after": next })))
}

async fn get_session(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(state.sessions.get_session(&id, &caller(&principal))?))
}

async fn delete_session(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    state
        .sessions
        .delete_session(&id, &caller(&principal))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/messages?after=MESSAGE_ID&limit=N`: the stored turns, oldest
/// first, paged like the documents of a KB; an `after` that is no message of the session is
/// 400 `invalid_cursor`.
async fn list_messages(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let (after, limit) = requested_page(page, MAX_SESSIONS_PAGE)?;
    let turns = state.sessions.turns(&id, &caller(&principal))?;
    let start = match after {
        None => 0,
        Some(after) => {
            turns
                .iter()
                .position(|turn| turn.message_id == after)
                .ok_or_else(|| {
                    invalid(
                        "invalid_cursor",
                        format!("after: no message {after:?} in this session"),
                    )
                })?
                + 1
        }
    };
    let page: Vec<_> = turns.into_iter().skip(start).take(limit).collect();
    let next = next_after(&page, limit, |turn| &turn.message_id);
    Ok(Json(json!({ "messages": page, "next_after": next })))
}

/// Starts a run and streams its events (`meta` first, `done` last).
async fn post_message(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(message): ApiJson<NewMessage>,
) -> ApiResult<Response> {
    let log = state
        .sessions
        .ask(&id, &message.content, &caller(&principal))
        .await?;
    Ok(sse_response(log, 0))
}

// ---- runs ----

async fn run_status(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(state.sessions.run(&id, &caller(&principal))?.status()))
}

/// The run's events after `Last-Event-ID` (all of them without the header), then new ones
/// until `done`.
async fn run_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let after = match headers.get("last-event-id") {
        None => 0,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_last_event_id",
                    "Last-Event-ID must be an event id (a non-negative integer)",
                )
            })?,
    };
    let log = state.sessions.run(&id, &caller(&principal))?;
    Ok(sse_response(log, after))
}

async fn stop_run(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    let status = state.sessions.stop(&id, &caller(&principal))?;
    Ok((StatusCode::ACCEPTED, Json(status)))
}

fn sse_event(event: &RunEvent) -> Event {
    Event::default()
        .id(event.id.to_string())
        .event(event.name())
        .json_data(event.data())
        .unwrap_or_else(|_| Event::default().event("error"))
}

fn sse_response(log: Arc<RunLog>, after: u64) -> Response {
    let stream = log
        .follow(after)
        .map(|event| Ok::<_, Infallible>(sse_event(&event)));
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

// ---- OpenAI-compatible ----

#[derive(Deserialize)]
struct ChatCompletionRequest {
    model: String,
    messages: Vec<ChatMessageIn>,
    #[serde(default)]
    stream: bool,
    /// Sift's extension: `{"kbs": [...]}`.
    sift: Option<SiftExtension>,
    // Other OpenAI fields (temperature, max_tokens, ...) are accepted and ignored: the agent
    // preset decides.
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SiftExtension {
    kbs: Vec<String>,
}

#[derive(Deserialize)]
struct ChatMessageIn {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// A message's text: a string, or the `text` parts of a content array.
fn message_text(content: &Option<Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn invalid(code: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// The question (the last user message) and the earlier user/assistant pairs as history.
fn question_and_history(messages: &[ChatMessageIn]) -> ApiResult<(String, Vec<PastTurn>)> {
    let Some(last) = messages.last() else {
        return Err(invalid("invalid_messages", "messages is empty"));
    };
    if last.role != "user" {
        return Err(invalid(
            "invalid_messages",
            "the last message must have role \"user\"",
        ));
    }
    let mut history = Vec::new();
    let mut pending_question: Option<String> = None;
    for message in &messages[..messages.len() - 1] {
        match message.role.as_str() {
            "user" => pending_question = Some(message_text(&message.content)),
            "assistant" => {
                if let Some(question) = pending_question.take() {
                    history.push(PastTurn {
                        question,
                        answer: message_text(&message.content),
                        citations: Vec::new(),
                    });
                }
            }
            // The agent preset owns the system prompt; tool messages belong to other agents.
            "system" | "developer" | "tool" => {}
            other => {
                return Err(invalid(
                    "invalid_messages",
                    format!("unknown message role {other:?}"),
                ));
            }
        }
    }
    Ok((message_text(&last.content), history))
}

async fn chat_completions(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<ChatCompletionRequest>,
) -> ApiResult<Response> {
    let model = request.model.clone();
    state.sessions.preset(&model).map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("no agent preset named {model:?}; GET /v1/models lists them"),
        )
    })?;
    let Some(extension) = request.sift else {
        return Err(invalid(
            "missing_kbs",
            "name the knowledge bases to search in the extension field \"sift\": {\"kbs\": [...]}",
        ));
    };
    let (question, history) = question_and_history(&request.messages)?;
    let log = state
        .sessions
        .ask_ephemeral(
            EphemeralRun {
                agent: Some(model.clone()),
                kbs: extension.kbs,
                question,
                history,
            },
            &caller(&principal),
        )
        .await?;
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let id = format!("chatcmpl-{}", log.run_id);
    if request.stream {
        Ok(stream_completion(log, id, model, created))
    } else {
        complete(log, id, model, created).await
    }
}

/// What a finished run said, gathered from its events.
#[derive(Default)]
struct Collected {
    answer: String,
    citations: Vec<Citation>,
    grounding: Option<sift_actors::agent::GroundingReport>,
    error: Option<(String, String)>,
    prompt_tokens: u64,
    completion_tokens: u64,
    finish: Option<RunFinish>,
}

impl Collected {
    fn add(&mut self, event: &RunEvent) {
        match &event.kind {
            RunEventKind::Agent(AgentEvent::Delta { text }) => self.answer.push_str(text),
            RunEventKind::Agent(AgentEvent::Citation(citation)) => {
                self.citations.push(citation.clone())
            }
            RunEventKind::Agent(AgentEvent::Grounding(report)) => {
                self.grounding = Some(report.clone())
            }
            RunEventKind::Agent(AgentEvent::Error { code, message }) => {
                self.error = Some((code.clone(), message.clone()))
            }
            RunEventKind::Agent(AgentEvent::Usage {
                prompt_tokens,
                completion_tokens,
                ..
            }) => {
                // The run reports its totals (the last report wins).
                self.prompt_tokens = *prompt_tokens as u64;
                self.completion_tokens = *completion_tokens as u64;
            }
            RunEventKind::Done { finish_reason, .. } => self.finish = Some(*finish_reason),
            _ => {}
        }
    }

    fn finish_reason(&self) -> &'static str {
        match self.finish {
            Some(RunFinish::Budget) => "length",
            _ => "stop",
        }
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }

    fn extension(&self, run_id: &str) -> Value {
        json!({
            "run_id": run_id,
            "citations": self.citations,
            "grounding": self.grounding,
            "finish_reason": self.finish.map(sift_actors::sessions::finish_name),
        })
    }
}

async fn complete(
    log: Arc<RunLog>,
    id: String,
    model: String,
    created: u64,
) -> ApiResult<Response> {
    let run_id = log.run_id.clone();
    let mut collected = Collected::default();
    let mut events = Box::pin(log.follow(0));
    while let Some(event) = events.next().await {
        collected.add(&event);
    }
    if collected.answer.is_empty()
        && let Some((code, message)) = &collected.error
    {
        let status = if code == "overloaded" {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::BAD_GATEWAY
        };
        return Err(ApiError::new(status, code, message.clone()));
    }
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": collected.answer },
            "finish_reason": collected.finish_reason(),
        }],
        "usage": collected.usage(),
        "sift": collected.extension(&run_id),
    }))
    .into_response())
}

/// OpenAI chunk stream: `data: {chunk}` lines, then `data: [DONE]`. Thoughts go out as
/// `reasoning_content`; the last chunk carries the finish reason, usage and the citations in
/// the `sift` extension field.
fn stream_completion(log: Arc<RunLog>, id: String, model: String, created: u64) -> Response {
    let run_id = log.run_id.clone();
    let chunk = move |delta: Value, finish: Option<&str>| -> Value {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let first = chunk(json!({ "role": "assistant", "content": "" }), None);
    let state = (Box::pin(log.follow(0)), Collected::default(), false);
    let events = futures::stream::unfold(state, move |(mut events, mut collected, ended)| {
        let chunk = chunk.clone();
        let run_id = run_id.clone();
        async move {
            if ended {
                return None;
            }
            loop {
                let Some(event) = events.next().await else {
                    return Some((Event::default().data("[DONE]"), (events, collected, true)));
                };
                collected.add(&event);
                let data = match &event.kind {
                    RunEventKind::Agent(AgentEvent::Delta { text }) => {
                        chunk(json!({ "content": text }), None)
                    }
                    RunEventKind::Agent(AgentEvent::Thought { delta }) => {
                        chunk(json!({ "reasoning_content": delta }), None)
                    }
                    RunEventKind::Agent(AgentEvent::Error { code, message }) => {
                        json!({ "error": { "code": code, "message": message } })
                    }
                    RunEventKind::Done { .. } => {
                        let mut last = chunk(json!({}), Some(collected.finish_reason()));
                        last["usage"] = collected.usage();
                        last["sift"] = collected.extension(&run_id);
                        last
                    }
                    _ => continue,
                };
                let event = Event::default().data(data.to_string());
                return Some((event, (events, collected, false)));
            }
        }
    });
    let stream = futures::stream::once(async move { Event::default().data(first.to_string()) })
        .chain(events)
        .map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

async fn list_models(State(state): State<AppState>) -> impl IntoResponse {
    let data: Vec<Value> = state
        .sessions
        .presets()
        .iter()
        .map(|preset| {
            json!({
                "id": preset.name,
                "object": "model",
                "created": 0,
                "owned_by": "sift",
                "description": preset.description,
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}
