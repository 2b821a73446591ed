//! The chat part of the HTTP API: sessions, runs as server-sent events, and the
//! OpenAI-compatible `POST /v1/chat/completions`, `GET /v1/models` and `GET /v1/models/{id}`
//! (agent presets, and a `kb:NAME` model per readable KB). Errors go through the
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
use sift_actors::Need;
use sift_actors::agent::{AgentEvent, Citation, PastTurn, RunFinish};
use sift_actors::sessions::{
    Caller, EphemeralRun, MAX_SESSIONS_PAGE, RunEvent, RunEventKind, RunLog,
};
use sift_api::{NewMessage, NewSession};
use sift_storage::meta::Role;

use crate::api::{ApiError, ApiJson, ApiPath, AppState, Page, next_after, requested_page};
use crate::auth::Principal;
use crate::views::{MessageList, SessionList};

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
        .route("/v1/models/{id}", get(get_model))
        .route("/v1/embeddings", post(embeddings))
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
    Ok(Json(SessionList {
        sessions,
        next_after: next,
    }))
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
    Ok(Json(MessageList {
        messages: page,
        next_after: next,
    }))
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
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    /// Sift's extension: `{"kbs": [...]}`.
    sift: Option<SiftExtension>,
    /// Every other field, each one checked by [`check_parameters`].
    #[serde(flatten)]
    other: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SiftExtension {
    kbs: Vec<String>,
}

/// OpenAI request fields a Sift answer does not apply: the agent preset decides sampling,
/// length and stop sequences. They are accepted (clients send them by default) and named in
/// the answer (`x-sift-ignored-params`, `sift.ignored_params`), never dropped silently.
const NOT_APPLIED: &[&str] = &[
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "reasoning_effort",
    "service_tier",
    "verbosity",
    "user",
    "metadata",
    "store",
    "prompt_cache_key",
    "safety_identifier",
];

/// The request fields beyond model, messages, stream and `sift`: those Sift cannot honour
/// are a 400 naming the field; those it does not apply are returned for the answer to name.
fn check_parameters(other: &serde_json::Map<String, Value>) -> ApiResult<Vec<String>> {
    let unsupported = |param: &str, message: &str| {
        Err(invalid("unsupported_parameter", message).with_param(param))
    };
    let mut ignored = Vec::new();
    for (name, value) in other {
        if value.is_null() {
            continue;
        }
        match name.as_str() {
            "n" if value.as_u64() == Some(1) => {}
            "n" => return unsupported("n", "one choice per request: n must be 1"),
            "tools" | "functions" if value.as_array().is_some_and(Vec::is_empty) => {}
            "tools" | "functions" => {
                return unsupported(
                    name,
                    "client-side tools are not supported: the agent calls its own retrieval tools and answers from the knowledge bases",
                );
            }
            "tool_choice" | "function_call"
                if matches!(value.as_str(), Some("none") | Some("auto")) => {}
            "tool_choice" | "function_call" => {
                return unsupported(
                    name,
                    "no client-side tool can be chosen: tools are not supported",
                );
            }
            "parallel_tool_calls" => {}
            "response_format" if value["type"] == "text" => {}
            "response_format" => {
                return unsupported(
                    "response_format",
                    "answers are cited text: only response_format {\"type\": \"text\"} is supported",
                );
            }
            "logprobs" if value == &Value::Bool(false) => {}
            "logprobs" | "top_logprobs" => {
                return unsupported(name, "log probabilities are not available");
            }
            "modalities" if value == &json!(["text"]) => {}
            "modalities" | "audio" | "prediction" | "web_search_options" => {
                return unsupported(name, "only text in and text out is supported");
            }
            known if NOT_APPLIED.contains(&known) => ignored.push(known.to_string()),
            unknown => {
                return Err(invalid(
                    "unknown_parameter",
                    format!("unknown request field {unknown:?}"),
                )
                .with_param(unknown));
            }
        }
    }
    Ok(ignored)
}

/// The agent preset and KBs a request's `model` (and `sift.kbs`) name: `kb:REF` is the
/// `default` preset over that KB (a name, an id or `tenant:name`); a preset name uses the
/// extension's KBs, else the preset's own `kbs`. A KB the caller may not read is answered
/// as a model that does not exist.
fn resolve_model(
    state: &AppState,
    principal: &Principal,
    model: &str,
    extension: Option<SiftExtension>,
) -> ApiResult<(String, Vec<String>)> {
    if let Some(kb) = model.strip_prefix("kb:") {
        if extension.is_some() {
            return Err(invalid(
                "conflicting_kbs",
                format!("the model {model:?} names the knowledge base; drop sift.kbs or use an agent preset as the model"),
            )
            .with_param("sift.kbs"));
        }
        let record = state
            .node
            .find_kb(&principal.scope(), kb, Need::Read)
            .map_err(|_| model_not_found(model))?;
        return Ok((DEFAULT_PRESET.to_string(), vec![record.id]));
    }
    let preset = state
        .sessions
        .preset(model)
        .map_err(|_| model_not_found(model))?;
    let kbs = match extension {
        Some(extension) => extension.kbs,
        None => preset.kbs.clone(),
    };
    if kbs.is_empty() {
        return Err(invalid(
            "missing_kbs",
            format!(
                "the agent preset {model:?} names no knowledge bases: use a model \"kb:NAME\" (GET /v1/models lists them), give the preset kbs, or name them in the extension field \"sift\": {{\"kbs\": [...]}}"
            ),
        )
        .with_param("model"));
    }
    Ok((model.to_string(), kbs))
}

/// The preset `kb:` models run.
const DEFAULT_PRESET: &str = "default";

fn model_not_found(model: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "model_not_found",
        format!("no model {model:?}; GET /v1/models lists them"),
    )
    .with_param("model")
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
    let ignored = check_parameters(&request.other)?;
    let model = request.model.clone();
    let (preset, kbs) = resolve_model(&state, &principal, &model, request.sift)?;
    let (question, history) = question_and_history(&request.messages)?;
    let log = state
        .sessions
        .ask_ephemeral(
            EphemeralRun {
                agent: Some(preset),
                kbs,
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
    let reply = Reply {
        id: format!("chatcmpl-{}", log.run_id),
        model,
        created,
        ignored,
    };
    let mut response = if request.stream.unwrap_or(false) {
        let include_usage = request
            .stream_options
            .is_some_and(|options| options.include_usage);
        stream_completion(log, reply.clone(), include_usage)
    } else {
        complete(log, reply.clone()).await?
    };
    if !reply.ignored.is_empty()
        && let Ok(value) = axum::http::HeaderValue::from_str(&reply.ignored.join(", "))
    {
        response.headers_mut().insert(IGNORED_PARAMS_HEADER, value);
    }
    Ok(response)
}

/// Names the request fields the answer did not apply ([`NOT_APPLIED`]).
const IGNORED_PARAMS_HEADER: &str = "x-sift-ignored-params";

/// What every answer of one completion repeats.
#[derive(Clone)]
struct Reply {
    id: String,
    /// The `model` as the client named it.
    model: String,
    created: u64,
    /// Fields of [`NOT_APPLIED`] the request set.
    ignored: Vec<String>,
}

/// The citations whose `[n]` marker is in `answer`, in the `annotations` shape of an OpenAI
/// message: a `url_citation` over the marker (character offsets), its URL the page the
/// document was fetched from (after redirects) for a document added by URL, else the external
/// id when that is an http(s) URL, else `sift://kb/{kb}/documents/{doc}#{chunk}`.
fn annotations(answer: &str, citations: &[Citation]) -> Vec<Value> {
    let mut annotations = Vec::new();
    for citation in citations {
        let marker = format!("[{}]", citation.n);
        let Some(at) = answer.find(&marker) else {
            continue;
        };
        let start = answer[..at].chars().count();
        let web = |url: &&String| url.starts_with("http://") || url.starts_with("https://");
        let url = match citation
            .source_url
            .as_ref()
            .filter(web)
            .or(citation.external_id.as_ref().filter(web))
        {
            Some(url) => url.clone(),
            None => format!(
                "sift://kb/{}/documents/{}#{}",
                citation.kb_id, citation.document_id, citation.chunk_id
            ),
        };
        annotations.push(json!({
            "type": "url_citation",
            "url_citation": {
                "start_index": start,
                "end_index": start + marker.chars().count(),
                "url": url,
                "title": citation.document_title,
            },
        }));
    }
    annotations
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

    fn extension(&self, run_id: &str, ignored: &[String]) -> Value {
        json!({
            "run_id": run_id,
            "citations": self.citations,
            "grounding": self.grounding,
            "finish_reason": self.finish.map(sift_actors::sessions::finish_name),
            "ignored_params": ignored,
        })
    }
}

async fn complete(log: Arc<RunLog>, reply: Reply) -> ApiResult<Response> {
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
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": collected.answer,
                "refusal": null,
                "annotations": annotations(&collected.answer, &collected.citations),
            },
            "logprobs": null,
            "finish_reason": collected.finish_reason(),
        }],
        "usage": collected.usage(),
        "sift": collected.extension(&run_id, &reply.ignored),
    }))
    .into_response())
}

/// OpenAI chunk stream: `data: {chunk}` lines, then `data: [DONE]`. Thoughts go out as
/// `reasoning_content`; the last chunk with a choice carries the finish reason, the
/// citations as `annotations` and in the `sift` extension field, and the usage, which with
/// `stream_options.include_usage` comes instead in a chunk of its own with empty `choices`.
fn stream_completion(log: Arc<RunLog>, reply: Reply, include_usage: bool) -> Response {
    let run_id = log.run_id.clone();
    let Reply {
        id,
        model,
        created,
        ignored,
    } = reply;
    let chunk = move |choices: Value| -> Value {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        })
    };
    let choice = |delta: Value, finish: Option<&str>| json!([{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }]);
    let first = chunk(choice(json!({ "role": "assistant", "content": "" }), None));
    // The state: the run's events, what they said, and the chunks still to send once it ended.
    let state = (
        Box::pin(log.follow(0)),
        Collected::default(),
        std::collections::VecDeque::<Event>::new(),
        false,
    );
    let events = futures::stream::unfold(
        state,
        move |(mut events, mut collected, mut tail, ended)| {
            let chunk = chunk.clone();
            let run_id = run_id.clone();
            let ignored = ignored.clone();
            async move {
                if let Some(next) = tail.pop_front() {
                    return Some((next, (events, collected, tail, ended)));
                }
                if ended {
                    return None;
                }
                loop {
                    let Some(event) = events.next().await else {
                        return Some((
                            Event::default().data("[DONE]"),
                            (events, collected, tail, true),
                        ));
                    };
                    collected.add(&event);
                    let data = match &event.kind {
                        RunEventKind::Agent(AgentEvent::Delta { text }) => {
                            chunk(choice(json!({ "content": text }), None))
                        }
                        RunEventKind::Agent(AgentEvent::Thought { delta }) => {
                            chunk(choice(json!({ "reasoning_content": delta }), None))
                        }
                        RunEventKind::Agent(AgentEvent::Error { code, message }) => json!({
                            "error": {
                                "code": code,
                                "message": message,
                                "type": "server_error",
                                "param": null,
                            }
                        }),
                        RunEventKind::Done { .. } => {
                            let delta = json!({
                                "annotations": annotations(&collected.answer, &collected.citations),
                            });
                            let mut last = chunk(choice(delta, Some(collected.finish_reason())));
                            last["sift"] = collected.extension(&run_id, &ignored);
                            if include_usage {
                                let mut usage = chunk(json!([]));
                                usage["usage"] = collected.usage();
                                tail.push_back(Event::default().data(usage.to_string()));
                            } else {
                                last["usage"] = collected.usage();
                            }
                            last
                        }
                        _ => continue,
                    };
                    let event = Event::default().data(data.to_string());
                    return Some((event, (events, collected, tail, false)));
                }
            }
        },
    );
    let stream = futures::stream::once(async move { Event::default().data(first.to_string()) })
        .chain(events)
        .map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

/// The models a caller may name: every agent preset, and `kb:NAME` for every KB it may read
/// (`kb:TENANT:NAME` for one another tenant shares with it).
fn models(state: &AppState, principal: &Principal) -> ApiResult<Vec<Value>> {
    let mut data: Vec<Value> = state
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
                "kbs": preset.kbs,
            })
        })
        .collect();
    // Records and owners only: a model list needs no document counts.
    let scope = principal.scope();
    let store = state.node.context().meta.store();
    for (record, _) in store
        .list_kbs_in(scope.name())
        .map_err(sift_actors::SiftError::from)?
    {
        let tenant = store
            .kb_tenant(&record.id)
            .map_err(sift_actors::SiftError::from)?;
        data.push(kb_model(&record, &tenant, scope.name()));
    }
    let embedders = &state.node.context().embedders;
    let local = embedders
        .local
        .as_ref()
        .map(|embedder| (sift_actors::EMBEDDED_MODEL, embedder));
    let remote = embedders
        .remote
        .iter()
        .map(|(name, embedder)| (name.as_str(), embedder));
    for (name, embedder) in local.into_iter().chain(remote) {
        data.push(json!({
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "sift",
            "description": format!(
                "embedding model ({} dimensions), for POST /v1/embeddings",
                embedder.dimension()
            ),
        }));
    }
    Ok(data)
}

/// The `kb:` model of `record`, owned by `owner`, as a caller of tenant `caller` names it.
fn kb_model(record: &sift_storage::meta::KbRecord, owner: &str, caller: &str) -> Value {
    let id = if owner == caller {
        format!("kb:{}", record.name)
    } else {
        format!("kb:{owner}:{}", record.name)
    };
    json!({
        "id": id,
        "object": "model",
        "created": record.created_at_ms / 1000,
        "owned_by": owner,
        "description": format!(
            "the {DEFAULT_PRESET} agent over knowledge base {}",
            record.name
        ),
        "kbs": [record.id],
    })
}

async fn list_models(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        json!({ "object": "list", "data": models(&state, &principal)? }),
    ))
}

/// `GET /v1/models/{id}`: one agent preset or `kb:` model; 404 `model_not_found` for anything
/// else, a KB the caller may not read included.
async fn get_model(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    if let Some(kb) = id.strip_prefix("kb:") {
        let scope = principal.scope();
        let record = state
            .node
            .find_kb(&scope, kb, Need::Read)
            .map_err(|_| model_not_found(&id))?;
        let owner = state
            .node
            .context()
            .meta
            .store()
            .kb_tenant(&record.id)
            .map_err(sift_actors::SiftError::from)?;
        return Ok(Json(kb_model(&record, &owner, scope.name())));
    }
    models(&state, &principal)?
        .into_iter()
        .find(|model| model["id"] == id.as_str())
        .map(Json)
        .ok_or_else(|| model_not_found(&id))
}

// ---- embeddings ----

/// The most texts one `POST /v1/embeddings` embeds (OpenAI's own limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<u64>,
    /// Accepted; no effect.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

/// `POST /v1/embeddings`: the node's embedding models (the embedded one, and every remote one
/// by its configured name) for other tools, in OpenAI's shape; `encoding_format` `float` or
/// `base64` (little-endian f32, what the `openai` SDK asks for). Usage counts cl100k tokens,
/// as the rest of Sift does.
/// The texts of an embeddings request's `input`, as OpenAI takes it: a string, an array of
/// strings, an array of token ids (one text) or an array of such arrays. Token ids are cl100k
/// (the tokenizer of OpenAI's embedding models, what LangChain sends by default), decoded to
/// text for the node's own model; an id that is not a cl100k token is refused.
fn embedding_inputs(input: Value) -> ApiResult<Vec<String>> {
    let refused = |message: String| invalid("invalid_input", message).with_param("input");
    let decoded = |items: &[Value], at: &str| -> ApiResult<String> {
        let ids = items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                item.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| refused(format!("{at}[{index}] is not a token id")))
            })
            .collect::<ApiResult<Vec<u32>>>()?;
        sift_actors::ingest::chunk::decode_tokens(&ids)
            .map_err(|id| refused(format!("{at} holds {id}, which is not a cl100k token id")))
    };
    match input {
        Value::String(text) => Ok(vec![text]),
        Value::Array(items) if items.iter().all(Value::is_string) => Ok(items
            .into_iter()
            .map(|item| item.as_str().unwrap_or_default().to_string())
            .collect()),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Ok(vec![decoded(&items, "input")?])
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let ids = item.as_array().map(Vec::as_slice).unwrap_or_default();
                decoded(ids, &format!("input[{index}]"))
            })
            .collect(),
        _ => Err(refused(
            "input must be a string, an array of strings, an array of token ids or an array of \
             token id arrays"
                .to_string(),
        )),
    }
}

async fn embeddings(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<EmbeddingsRequest>,
) -> ApiResult<impl IntoResponse> {
    let embedder = state
        .node
        .context()
        .embedders
        .get(&request.model)
        .map_err(|_| model_not_found(&request.model))?;
    let texts = embedding_inputs(request.input)?;
    if texts.is_empty() || texts.len() > MAX_EMBEDDING_INPUTS {
        return Err(invalid(
            "invalid_input",
            format!(
                "input holds {} texts: 1 to {MAX_EMBEDDING_INPUTS}",
                texts.len()
            ),
        )
        .with_param("input"));
    }
    if let Some(index) = texts.iter().position(|text| text.trim().is_empty()) {
        return Err(
            invalid("invalid_input", format!("input[{index}] is empty")).with_param("input")
        );
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(invalid(
                "unsupported_parameter",
                format!("encoding_format must be float or base64, not {other:?}"),
            )
            .with_param("encoding_format"));
        }
    };
    if let Some(dimensions) = request.dimensions
        && dimensions != embedder.dimension() as u64
    {
        return Err(invalid(
            "unsupported_parameter",
            format!(
                "{} makes vectors of {} dimensions only, not {dimensions}",
                request.model,
                embedder.dimension()
            ),
        )
        .with_param("dimensions"));
    }
    let tokens: usize = texts
        .iter()
        .map(|text| sift_actors::ingest::chunk::count_tokens(text))
        .sum();
    let vectors = embedder
        .embed(texts)
        .await
        .map_err(|error| ApiError::from(sift_actors::SiftError::Embedding(error)))?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                use base64::Engine as _;
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn citation(n: u32, external_id: Option<&str>, source_url: Option<&str>) -> Citation {
        Citation {
            n,
            chunk_id: format!("d{n}#0"),
            kb_id: "kb1".into(),
            document_id: format!("d{n}"),
            document_title: format!("Page {n}"),
            external_id: external_id.map(str::to_string),
            source_url: source_url.map(str::to_string),
            span: (0, 10),
            pages: None,
            text: "cited".into(),
            heading_path: Vec::new(),
        }
    }

    #[test]
    fn annotations_link_to_the_fetched_page_then_a_web_external_id_then_sift() {
        let answer = "One [1]. Two [2]. Three [3]. Four [4].";
        let citations = [
            // fetched by URL with an explicit external id, through a redirect
            citation(1, Some("tides-v1"), Some("https://example.com/tides")),
            citation(
                2,
                Some("https://example.com/old"),
                Some("https://example.com/new"),
            ),
            citation(3, Some("https://example.com/posted"), None),
            citation(4, Some("notes-4"), None),
        ];
        let urls: Vec<Value> = annotations(answer, &citations)
            .into_iter()
            .map(|a| a["url_citation"]["url"].clone())
            .collect();
        assert_eq!(
            urls,
            [
                "https://example.com/tides",
                "https://example.com/new",
                "https://example.com/posted",
                "sift://kb/kb1/documents/d4#d4#0",
            ]
        );
    }
}
