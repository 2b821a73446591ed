//! The public HTTP API (axum). Handlers parse, call one [`SiftNode`] method, and render;
//! every error goes through [`ApiError`], the one mapping to
//! `{ "error": { "code", "message", "type", "param" } }`.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{
    DefaultBodyLimit, FromRequest, FromRequestParts, Multipart, Path, Query, Request, State,
};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::Stream;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use sha2::{Digest, Sha256};
use sift_actors::SiftNode;
use sift_actors::events::DocumentEvent;
use sift_actors::node::{Upload, metadata_from_json};
use sift_actors::{ErrorKind, Need, Scope, SiftError};
use sift_api::{BulkDocuments, CreateKb, ErrorBody, SearchQuery, UpdateKb};
use sift_storage::meta::DocStatus;
use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

use crate::auth::Principal;
use crate::fetch;
use crate::views::{
    AddedDocuments, ChunkList, DocumentList, Health, KbList, KbView, NodeDraining, NodeRemoved,
    Readiness, ShardList,
};

/// Shared by every handler.
#[derive(Clone)]
pub struct AppState {
    pub node: Arc<SiftNode>,
    pub prometheus: PrometheusHandle,
    /// The per-KB gauges of `/metrics`, capped at `metrics_max_kbs` KBs.
    pub kb_gauges: Arc<crate::telemetry::KbGauges>,
    pub max_upload_bytes: u64,
    pub max_json_bytes: u64,
    pub max_bulk_documents: usize,
    pub temp_dir: PathBuf,
    /// Where `POST /v1/snapshots` writes ([`crate::snapshots_api`]).
    pub snapshot_dir: PathBuf,
    /// Chat sessions and agent runs (routes in [`crate::chat_api`]).
    pub sessions: Arc<sift_actors::sessions::Sessions>,
    /// The bound public address.
    pub listen: std::net::SocketAddr,
    /// Cluster mode: this node's addresses as the cluster knows them.
    pub cluster_address: Option<sift_cluster::raft::PeerAddress>,
    /// API keys and roles ([`crate::auth`]).
    pub auth: Arc<crate::auth::AuthState>,
    /// How this node reaches other members (forwarded admin calls).
    pub peer_tls: sift_cluster::tls::PeerTls,
    /// Fetches the pages of `{"urls": [...]}` behind the SSRF guard ([`crate::fetch`]).
    pub fetcher: Arc<crate::fetch::UrlFetcher>,
}

/// The public API. Outside in, every request meets: the request id, span and access log
/// ([`crate::requests::track`]), CORS when `cors_origins` lists any, the request metrics, the
/// head-size limits, then routing (with the key check on every route but the probes).
pub fn router(state: AppState, cors: &crate::requests::CorsOrigins) -> Router {
    // Every route but the probes needs a key (checked after routing: an unknown path is a
    // plain 404).
    let authenticated = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/v1/openapi.json", get(openapi_document))
        .route("/v1/cluster", get(cluster_status))
        .route(
            "/v1/cluster/nodes/{id}",
            axum::routing::delete(remove_cluster_node),
        )
        .route("/v1/kbs", post(create_kb).get(list_kbs))
        .route(
            "/v1/kbs/{kb}",
            get(get_kb).patch(update_kb).delete(delete_kb),
        )
        .route(
            "/v1/kbs/{kb}/documents",
            post(add_documents)
                .get(list_documents)
                .layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/kbs/{kb}/documents/{doc}",
            get(get_document).delete(delete_document),
        )
        .route("/v1/kbs/{kb}/documents/{doc}/events", get(document_events))
        .route("/v1/kbs/{kb}/documents/{doc}/chunks", get(document_chunks))
        .route("/v1/kbs/{kb}/search", post(search))
        .route("/v1/kbs/{kb}/shards", get(kb_shards))
        .route(
            "/v1/kbs/{kb}/shares/{tenant}",
            axum::routing::put(share_kb).delete(unshare_kb),
        )
        .route("/v1/debug/kbs/{kb}/shards/{shard}/crash", post(crash_shard))
        .route("/v1/debug/reconciler/crash", post(crash_reconciler))
        .route("/v1/debug/sessions/crash", post(crash_sessions_actor))
        .route("/v1/debug/sessions/{id}/crash", post(crash_session_actor))
        .merge(crate::chat_api::routes())
        .merge(crate::keys_api::routes())
        .merge(crate::snapshots_api::routes())
        .merge(crate::tenants_api::routes())
        .merge(crate::audit::routes())
        .merge(crate::graph_api::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::auth::authenticate,
        ));
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(authenticated)
        // the web console's page and assets (no key: the page signs in to the API itself)
        .merge(crate::console::routes())
        // route templates for the request metrics (only on matched routes, so inside routing)
        .route_layer(axum::middleware::from_fn(crate::telemetry::tag_route))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(
            sift_cluster::http_server::refuse_oversized_heads,
        ))
        .layer(axum::middleware::from_fn(
            crate::telemetry::observe_requests,
        ))
        .with_state(state);
    let router = match cors.layer() {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.layer(axum::middleware::from_fn(crate::requests::track))
}

// ---- errors ----

/// An error answer: status, stable code, human message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub retry_after_secs: Option<u64>,
    /// The request field at fault (`param` in the body), when one is.
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
            retry_after_secs: None,
            param: None,
        }
    }

    /// Names the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }
}

/// The HTTP status of each kind of node error: the one place the API decides it.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::UnsupportedType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
    }
}

impl From<SiftError> for ApiError {
    fn from(error: SiftError) -> Self {
        let status = status_of(error.kind());
        let retry_after_secs = error.retry_after_secs();
        if status.is_server_error() {
            tracing::error!(%error, code = error.code(), "request failed");
        }
        ApiError {
            status,
            code: error.code().to_string(),
            message: error.to_string(),
            retry_after_secs,
            param: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody::new(
            self.status.as_u16(),
            self.code,
            self.message,
            self.param,
        ));
        let mut response = (self.status, body).into_response();
        if let Some(seconds) = self.retry_after_secs
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        // A body refused as too large is mostly unread: the connection cannot carry another
        // request, and a client must not take it back into its pool.
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// `Json` whose rejections are our JSON errors.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// `Path` whose rejections (a non-numeric id, a segment that is not UTF-8) are our JSON
/// errors.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                rejection.body_text(),
            )),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "expected a JSON body with content-type application/json",
        ),
        JsonRejection::BytesRejection(_) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            rejection.body_text(),
        ),
        other => ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", other.body_text()),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "route_not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

// ---- operations ----

async fn cluster_status(
    State(state): State<AppState>,
) -> Result<Json<crate::cluster::ClusterView>, ApiError> {
    let rebalancing = state.node.rebalancing()?;
    let meta = &state.node.context().meta;
    Ok(Json(match (meta.raft(), &state.cluster_address) {
        (Some(raft), Some(address)) => {
            crate::cluster::ClusterView::member(&raft.status(), address, rebalancing)
        }
        _ => {
            use sift_storage::meta::MetaStateMachine;
            crate::cluster::ClusterView::single(
                state.listen,
                meta.store().applied_index(),
                rebalancing,
            )
        }
    }))
}

/// Header marking a removal forwarded from another node (forwarded at most once).
const FORWARDED: &str = "x-sift-forwarded";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveNode {
    force: Option<bool>,
}

/// Removes a member from the cluster. A member that holds replicas is drained first (202: the
/// leader re-creates its replicas on other nodes, then removes it); `force=true` removes it at
/// once. Any node accepts it; a follower forwards an immediate removal to the leader's public
/// address once.
async fn remove_cluster_node(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
    query: Result<Query<RemoveNode>, QueryRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let query = query_of(query)?;
    let force = query.force.unwrap_or(false);
    let meta = &state.node.context().meta;
    let Some(raft) = meta.raft() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_clustered",
            "this node runs alone (no --internal-listen): there is no member to remove",
        ));
    };
    let status = raft.status();
    let members: Vec<u64> = status
        .voters
        .iter()
        .chain(&status.learners)
        .copied()
        .collect();
    if !members.contains(&id) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "node_not_found",
            format!("node {id} is not a member of the cluster (members: {members:?})"),
        ));
    }
    let replicas = state.node.replicas_on(id)?;
    if !force && replicas > 0 {
        state.node.drain_node(id).await?;
        return Ok((
            StatusCode::ACCEPTED,
            Json(NodeDraining {
                draining: id,
                replicas,
                message: format!(
                    "node {id} holds {replicas} replicas: they are re-created on other nodes, then the node is removed"
                ),
            }),
        )
            .into_response());
    }
    match raft.remove_node(id).await {
        Ok(conf) => Ok(Json(NodeRemoved {
            removed: id,
            voters: conf.voters,
            learners: conf.learners,
        })
        .into_response()),
        Err(sift_cluster::ClusterError::NotLeader {
            leader: Some(leader),
        }) if !headers.contains_key(FORWARDED) => {
            let public = status
                .peers
                .iter()
                .find(|peer| peer.id == leader)
                .and_then(|peer| peer.address.as_ref())
                .map(|address| address.public.clone())
                .filter(|public| !public.is_empty());
            let Some(public) = public else {
                return Err(SiftError::Meta(sift_cluster::ClusterError::NotLeader {
                    leader: Some(leader),
                })
                .into());
            };
            let unavailable = |error: String| {
                ApiError::from(SiftError::Meta(sift_cluster::ClusterError::Transport(
                    format!("forwarding to the leader {leader} at {public}: {error}"),
                )))
            };
            let client = state
                .peer_tls
                .client_builder()
                .build()
                .map_err(|error| unavailable(error.to_string()))?;
            let mut forwarded = client
                .delete(
                    state
                        .peer_tls
                        .url(&public, &format!("/v1/cluster/nodes/{id}?force=true")),
                )
                .header(FORWARDED, "1");
            // The caller's key works on the leader too: keys are replicated.
            if let Some(authorization) = headers.get(header::AUTHORIZATION) {
                forwarded = forwarded.header(header::AUTHORIZATION, authorization.as_bytes());
            }
            let response = forwarded
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .map_err(|error| unavailable(error.to_string()))?;
            let code = response.status().as_u16();
            let body: serde_json::Value = response
                .json()
                .await
                .map_err(|error| unavailable(error.to_string()))?;
            if (200..300).contains(&code) {
                Ok((StatusCode::OK, Json(body)).into_response())
            } else {
                Err(ApiError::new(
                    StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY),
                    body["error"]["code"].as_str().unwrap_or("unavailable"),
                    body["error"]["message"]
                        .as_str()
                        .unwrap_or("the leader refused the removal")
                        .to_string(),
                ))
            }
        }
        Err(error) => Err(SiftError::Meta(error).into()),
    }
}

async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// `GET /readyz`: 200 when every readiness check passes ([`SiftNode::readiness`]: Raft
/// storage, embedding models, open shards, a known Raft leader), else 503 naming each failing
/// check in `error.message` and in `checks`.
async fn readyz(State(state): State<AppState>) -> Response {
    let context = state.node.context();
    let readiness = state.node.readiness();
    let ready = readiness.ready();
    let view = Readiness {
        status: if ready { "ready" } else { "not_ready" },
        checks: readiness.checks.clone(),
        embedded_model: context
            .embedders
            .local
            .as_ref()
            .map(|e| e.model_name().to_string()),
        embedded_model_error: context.embedders.local_error.clone(),
        remote_embedders: context.embedders.remote.keys().cloned().collect(),
        shards: context.registry.len(),
        ingest_queue_depth: state.node.queue_depth(),
        auth: state.auth.mode.as_str(),
    };
    if ready {
        return Json(view).into_response();
    }
    let mut body = json!(view);
    let failing: Vec<String> = readiness
        .failing()
        .map(|check| format!("{}: {}", check.name, check.detail))
        .collect();
    // A member whose Raft storage failed serves frozen metadata (`sift serve` exits with status
    // 70 moments later): its own code, which operators alert on.
    let code = if readiness
        .failing()
        .any(|check| check.name == "raft_storage")
    {
        "raft_storage_failed"
    } else {
        "not_ready"
    };
    body["error"] = json!({
        "code": code,
        "message": format!("not ready: {}", failing.join("; ")),
    });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    let store = state.node.context().meta.store().clone();
    let mut text = crate::telemetry::render(&state.prometheus);
    text.push_str(&state.kb_gauges.render(store.clone()).await);
    text.push_str(&crate::telemetry::graph_gauges_text(
        &store,
        &state.node.graph_stats(),
        state.kb_gauges.max_kbs(),
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn create_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<CreateKb>,
) -> ApiResult<impl IntoResponse> {
    let kb = state.node.create_kb(&principal.scope(), request).await?;
    tracing::info!(
        kb = %kb.record.name,
        kb_id = %kb.record.id,
        shards = kb.record.settings.shards,
        "knowledge base created"
    );
    Ok((StatusCode::CREATED, Json(KbView::from(kb))))
}

/// `GET /v1/openapi.json`: the OpenAPI 3.1 document of this API ([`crate::openapi`]).
async fn openapi_document() -> impl IntoResponse {
    Json(crate::openapi::document())
}

/// `GET /v1/kbs?after=ID&limit=N`: in creation order, paged like the documents of a KB.
async fn list_kbs(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    page: Result<Query<Page>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let (after, limit) = requested_page(page, 1000)?;
    let kbs = state
        .node
        .list_kbs_page(&principal.scope(), after.as_deref(), limit)?;
    let next = next_after(&kbs, limit, |kb| &kb.record.id);
    Ok(Json(KbList::new(kbs, next)))
}

async fn get_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(KbView::from(
        state
            .node
            .get_kb_linearizable(&principal.scope(), &kb)
            .await?,
    )))
}

async fn kb_shards(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    let shards = state.node.kb_shards(&principal.scope(), &kb).await?;
    Ok(Json(ShardList { shards }))
}

async fn update_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateKb>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(KbView::from(
        state
            .node
            .update_kb(&principal.scope(), &kb, request)
            .await?,
    )))
}

async fn delete_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    state.node.delete_kb(&principal.scope(), &kb).await?;
    tracing::info!(%kb, "knowledge base deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/kbs/{kb}/shares/{tenant}`: the tenant may read and search the KB, not change it.
async fn share_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, tenant)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(KbView::from(
        state
            .node
            .share_kb(&principal.scope(), &kb, &tenant, true)
            .await?,
    )))
}

/// `DELETE /v1/kbs/{kb}/shares/{tenant}`.
async fn unshare_kb(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, tenant)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    state
        .node
        .share_kb(&principal.scope(), &kb, &tenant, false)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Multipart upload (field `file`, optional `external_id` and `metadata`) or a JSON body of
/// bulk texts, by content type.
async fn add_documents(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    request: Request,
) -> ApiResult<Response> {
    let scope = principal.scope();
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // Fail fast on an unknown (or read-only) KB, before reading any body.
    state.node.find_kb(&scope, &kb, Need::Write)?;
    if content_type.starts_with("multipart/form-data") {
        let multipart = Multipart::from_request(request, &state)
            .await
            .map_err(|rejection| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_multipart",
                    rejection.body_text(),
                )
            })?;
        let upload = receive_upload(&state, multipart).await?;
        let temp = upload.temp_path.clone();
        let outcome = state.node.add_upload(&scope, &kb, upload).await;
        let _ = tokio::fs::remove_file(&temp).await; // gone already when adopted
        let added = outcome?;
        Ok((
            StatusCode::ACCEPTED,
            Json(AddedDocuments {
                documents: vec![added],
            }),
        )
            .into_response())
    } else if content_type.starts_with("application/json") {
        let body = axum::body::to_bytes(request.into_body(), state.max_json_bytes as usize)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("JSON bodies are limited to {} bytes", state.max_json_bytes),
                )
            })?;
        let bulk: BulkDocuments = serde_json::from_slice(&body).map_err(|error| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", error.to_string())
        })?;
        if !bulk.urls.is_empty() {
            if !bulk.documents.is_empty() {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "send `documents` or `urls`, not both in one request",
                ));
            }
            let added = add_urls(&state, &scope, &kb, bulk.urls).await?;
            return Ok((
                StatusCode::ACCEPTED,
                Json(AddedDocuments { documents: added }),
            )
                .into_response());
        }
        if bulk.documents.len() > state.max_bulk_documents {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_many_documents",
                format!(
                    "{} documents in one request; the limit is {} (max_bulk_documents)",
                    bulk.documents.len(),
                    state.max_bulk_documents
                ),
            ));
        }
        let added = state.node.add_texts(&scope, &kb, bulk.documents).await?;
        Ok((
            StatusCode::ACCEPTED,
            Json(AddedDocuments { documents: added }),
        )
            .into_response())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send multipart/form-data with a `file` field, or application/json with `documents` or `urls`",
        ))
    }
}

/// `{"urls": [...]}`: every URL checked, then fetched (at most [`fetch::FETCH_CONCURRENCY`]
/// at a time) into the upload directory, then all registered together as uploads. Nothing is
/// stored unless every URL was fetched and passed the upload checks.
async fn add_urls(
    state: &AppState,
    scope: &Scope,
    kb: &str,
    urls: Vec<sift_api::NewUrlDocument>,
) -> ApiResult<Vec<sift_api::AddedDocument>> {
    use futures::StreamExt;
    if urls.len() > fetch::MAX_URLS_PER_REQUEST {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_documents",
            format!(
                "{} URLs in one request; the limit is {}",
                urls.len(),
                fetch::MAX_URLS_PER_REQUEST
            ),
        )
        .with_param("urls"));
    }
    // Every URL and field checked before the first connection.
    let mut checked = Vec::with_capacity(urls.len());
    for entry in urls {
        let url = state.fetcher.check_url(&entry.url)?;
        let metadata = metadata_from_json(entry.metadata.unwrap_or_default())?;
        let groups = entry.access.map(|access| access.groups).unwrap_or_default();
        let external_id = match entry.external_id {
            Some(external_id) => external_id,
            // the URL names the document unless it is too long to be an external id
            None if url.as_str().len() > MAX_DEFAULT_EXTERNAL_ID_BYTES => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_url",
                    format!(
                        "a URL of {} bytes is too long to be the document's external id (at                          most {MAX_DEFAULT_EXTERNAL_ID_BYTES}): give it an `external_id`",
                        url.as_str().len()
                    ),
                )
                .with_param("urls"));
            }
            None => url.to_string(),
        };
        checked.push((url, external_id, metadata, groups));
    }
    let targets: Vec<reqwest::Url> = checked.iter().map(|(url, ..)| url.clone()).collect();
    let fetcher = state.fetcher.clone();
    let temp_dir = state.temp_dir.clone();
    let max_bytes = state.max_upload_bytes;
    let fetched: Vec<Result<fetch::Fetched, ApiError>> = futures::stream::iter(targets)
        .map(move |url| {
            let fetcher = fetcher.clone();
            let temp_dir = temp_dir.clone();
            async move { fetcher.fetch(url, &temp_dir, max_bytes).await }
        })
        .buffered(fetch::FETCH_CONCURRENCY)
        .collect()
        .await;
    let temps: Vec<PathBuf> = fetched
        .iter()
        .filter_map(|outcome| outcome.as_ref().ok())
        .map(|fetched| fetched.temp_path.clone())
        .collect();
    let outcome = async {
        let mut uploads = Vec::with_capacity(fetched.len());
        for (outcome, (_, external_id, mut metadata, groups)) in fetched.into_iter().zip(checked) {
            let fetched = outcome?;
            metadata.insert(SOURCE_URL_KEY.to_string(), fetched.final_url.clone());
            uploads.push(Upload {
                temp_path: fetched.temp_path,
                file_name: fetched.file_name,
                media_type: fetched.media_type,
                external_id: Some(external_id),
                size_bytes: fetched.size_bytes,
                content_hash: fetched.content_hash,
                metadata,
                groups,
                format: Some(fetched.format),
            });
        }
        Ok::<_, ApiError>(state.node.add_uploads(scope, kb, uploads).await?)
    }
    .await;
    for temp in temps {
        let _ = tokio::fs::remove_file(&temp).await; // gone already when adopted
    }
    outcome
}

/// The longest URL that is a fetched document's external id by default (the external id limit).
const MAX_DEFAULT_EXTERNAL_ID_BYTES: usize = 512;

/// The metadata key of a fetched document's final URL (after redirects).
pub use sift_storage::chunk::SOURCE_URL_KEY;

/// Largest text field (`external_id`, `metadata`) of a multipart upload, in bytes.
pub const MAX_MULTIPART_TEXT_BYTES: usize = 64 * 1024;

/// Reads a multipart text field, refusing it as soon as it passes
/// [`MAX_MULTIPART_TEXT_BYTES`] (never buffered whole).
async fn text_field(
    field: &mut axum::extract::multipart::Field<'_>,
    name: &str,
) -> ApiResult<String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_multipart",
            error.body_text(),
        )
    })? {
        if bytes.len() + chunk.len() > MAX_MULTIPART_TEXT_BYTES {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "field_too_large",
                format!("the {name} field is longer than {MAX_MULTIPART_TEXT_BYTES} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_multipart",
            format!("the {name} field is not UTF-8 text"),
        )
    })
}

/// Most bytes of a refused upload read and dropped before the answer (see [`drain`]).
const DRAIN_BYTES: u64 = 16 * 1024 * 1024;
/// Longest a refused upload is drained before the answer.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and drops what is left of a refused upload's file, up to [`DRAIN_BYTES`] and for at
/// most [`DRAIN_TIME`] (a lingering close): a client still sending it then reads the 413
/// instead of a connection reset in the middle of its write.
async fn drain(field: &mut axum::extract::multipart::Field<'_>) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut drained = 0u64;
        while let Ok(Some(chunk)) = field.chunk().await {
            drained += chunk.len() as u64;
            if drained > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

/// A file name is used only for its extension and display; anything that looks like a path
/// is refused outright rather than sanitised.
fn check_file_name(name: &str) -> ApiResult<()> {
    let bad = name.is_empty()
        || name.len() > 255
        || name.contains(['/', '\\', '\0'])
        || name == "."
        || name.contains("..")
        || name.chars().any(char::is_control);
    if bad {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_file_name",
            format!("file name {name:?} is not a plain file name"),
        ));
    }
    Ok(())
}

async fn receive_upload(state: &AppState, mut multipart: Multipart) -> ApiResult<Upload> {
    let multipart_error = |error: axum::extract::multipart::MultipartError| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_multipart",
            error.body_text(),
        )
    };
    let mut file: Option<(PathBuf, String, u64, String)> = None;
    let mut media_type = None;
    let mut external_id = None;
    let mut metadata = sift_storage::chunk::Metadata::new();
    let mut groups = Vec::new();
    let result: ApiResult<()> = async {
        while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
            match field.name().unwrap_or("") {
                "file" => {
                    if file.is_some() {
                        return Err(ApiError::new(
                            StatusCode::BAD_REQUEST,
                            "invalid_multipart",
                            "one file per request",
                        ));
                    }
                    let name = field.file_name().unwrap_or("").to_string();
                    check_file_name(&name)?;
                    media_type = field.content_type().map(str::to_string);
                    let path = state.temp_dir.join(uuid::Uuid::new_v4().to_string());
                    // Registered before the first write so that any early return cleans it up.
                    file = Some((path.clone(), name, 0, String::new()));
                    let mut out = tokio::fs::File::create(&path)
                        .await
                        .map_err(|e| ApiError::from(SiftError::Storage(e.into())))?;
                    let mut hasher = Sha256::new();
                    let mut size = 0u64;
                    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                        size += chunk.len() as u64;
                        if size > state.max_upload_bytes {
                            drain(&mut field).await;
                            return Err(ApiError::new(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "payload_too_large",
                                format!(
                                    "the file is larger than the limit of {} bytes",
                                    state.max_upload_bytes
                                ),
                            ));
                        }
                        hasher.update(&chunk);
                        out.write_all(&chunk)
                            .await
                            .map_err(|e| ApiError::from(SiftError::Storage(e.into())))?;
                    }
                    out.sync_all()
                        .await
                        .map_err(|e| ApiError::from(SiftError::Storage(e.into())))?;
                    if let Some(entry) = file.as_mut() {
                        entry.2 = size;
                        entry.3 = hex::encode(hasher.finalize());
                    }
                }
                "external_id" => external_id = Some(text_field(&mut field, "external_id").await?),
                "metadata" => {
                    let text = text_field(&mut field, "metadata").await?;
                    let map: serde_json::Map<String, serde_json::Value> =
                        serde_json::from_str(&text).map_err(|e| {
                            ApiError::new(
                                StatusCode::BAD_REQUEST,
                                "invalid_metadata",
                                format!("metadata: {e}"),
                            )
                        })?;
                    metadata = metadata_from_json(map)?;
                }
                "access" => {
                    let text = text_field(&mut field, "access").await?;
                    let access: sift_api::DocumentAccess =
                        serde_json::from_str(&text).map_err(|e| {
                            ApiError::new(
                                StatusCode::BAD_REQUEST,
                                "invalid_access",
                                format!("access: {e}"),
                            )
                        })?;
                    groups = access.groups;
                }
                other => {
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_multipart",
                        format!(
                            "unknown field {other:?}; fields are file, external_id, metadata, access"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(error) = result {
        if let Some((path, ..)) = &file {
            let _ = tokio::fs::remove_file(path).await;
        }
        return Err(error);
    }
    let Some((temp_path, file_name, size_bytes, content_hash)) = file else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing_file",
            "no `file` field in the upload",
        ));
    };
    if size_bytes == 0 {
        let _ = tokio::fs::remove_file(&temp_path).await;
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "empty_document",
            "the file is empty",
        ));
    }
    Ok(Upload {
        temp_path,
        file_name,
        media_type,
        external_id,
        size_bytes,
        content_hash,
        metadata,
        groups,
        format: None,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Page {
    pub after: Option<String>,
    pub limit: Option<usize>,
}

/// The page a list route is asked for: `?after=ID&limit=N` (limit 100 when absent, clamped
/// to `1..=max`), or 400 `invalid_query_string`.
/// A query string's fields, or 400 `invalid_query_string` naming what is wrong.
pub(crate) fn query_of<T>(query: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    query.map(|Query(query)| query).map_err(|rejection| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query_string",
            rejection.body_text(),
        )
    })
}

pub(crate) fn requested_page(
    page: Result<Query<Page>, QueryRejection>,
    max: usize,
) -> ApiResult<(Option<String>, usize)> {
    let page = query_of(page)?;
    Ok((page.after, page.limit.unwrap_or(100).clamp(1, max)))
}

/// `next_after` of a list answer: the last item's id when the page is full (there may be
/// more), else none.
pub(crate) fn next_after<T>(items: &[T], limit: usize, id: impl Fn(&T) -> &str) -> Option<String> {
    (items.len() == limit)
        .then(|| items.last().map(|item| id(item).to_string()))
        .flatten()
}

/// `GET /v1/kbs/{kb}/documents?after=&limit=&status=`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DocumentListQuery {
    after: Option<String>,
    limit: Option<usize>,
    status: Option<String>,
}

/// A document status as the API names it (`ready`), or 400 `invalid_status`.
fn requested_status(status: Option<&str>) -> ApiResult<Option<DocStatus>> {
    let Some(status) = status else {
        return Ok(None);
    };
    DocStatus::ALL
        .into_iter()
        .find(|known| known.as_str() == status)
        .map(Some)
        .ok_or_else(|| {
            let known: Vec<&str> = DocStatus::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_status",
                format!("status must be one of {}", known.join(", ")),
            )
            .with_param("status")
        })
}

async fn list_documents(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    query: Result<Query<DocumentListQuery>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let query = query_of(query)?;
    let status = requested_status(query.status.as_deref())?;
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let page = state.node.list_documents(
        &principal.scope(),
        &kb,
        query.after.as_deref(),
        limit,
        status,
    )?;
    Ok(Json(DocumentList {
        documents: page.documents,
        next_after: page.next_after,
    }))
}

async fn get_document(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, doc)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let scope = principal.scope();
    let record = state.node.get_document(&scope, &kb, &doc)?;
    let graph = state.node.document_graph(&scope, &kb, &record).await;
    let (graph, graph_error) = match graph {
        Some(graph) => (Some(graph.state), graph.error),
        None => (None, None),
    };
    Ok(Json(crate::views::DocumentView {
        record,
        graph,
        graph_error,
    }))
}

async fn delete_document(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, doc)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    state
        .node
        .delete_document(&principal.scope(), &kb, &doc)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn document_chunks(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, doc)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let chunks = state
        .node
        .document_chunks(&principal.scope(), &kb, &doc)
        .await?;
    Ok(Json(ChunkList { chunks }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    /// `graph`: go on after `ready` until the document's graph is ready or failed.
    until: Option<String>,
}

/// How often a stream waiting for a document's graph looks at it.
const GRAPH_POLL: Duration = Duration::from_millis(250);

/// Progress of one document as server-sent events: the current status first, then every
/// change, ending after `ready`, `failed` or deletion. Event name = status. With
/// `?until=graph`, a ready document's stream goes on with `graph` events (`pending`, then
/// `ready`, `failed` or `off`) and ends with its graph's final state.
async fn document_events(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, doc)): ApiPath<(String, String)>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let until_graph = match query_of(query)?.until.as_deref() {
        None => false,
        Some("graph") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_until",
                format!("until is graph or absent, not {other:?}"),
            ));
        }
    };
    // Subscribe before reading the current status so no change falls between the two.
    let receiver = state.node.subscribe_events();
    let scope = principal.scope();
    let record = state.node.get_document(&scope, &kb, &doc)?;
    let first = DocumentEvent::from_record(&record);
    struct Progress {
        receiver: broadcast::Receiver<DocumentEvent>,
        node: Arc<SiftNode>,
        scope: Scope,
        kb: String,
        document_id: String,
        pending: Option<DocumentEvent>,
        until_graph: bool,
        /// The document is ready: its graph's states follow (with `until_graph`).
        graph_phase: bool,
        /// The graph state sent last.
        graph_sent: Option<&'static str>,
        done: bool,
    }
    let progress = Progress {
        receiver,
        node: state.node.clone(),
        scope,
        kb,
        document_id: record.id.clone(),
        pending: Some(first),
        until_graph,
        graph_phase: false,
        graph_sent: None,
        done: false,
    };
    let stream = futures::stream::unfold(progress, |mut progress| async move {
        if progress.done {
            return None;
        }
        if progress.graph_phase {
            return next_graph_event(
                progress.node.clone(),
                &progress.scope,
                &progress.kb,
                &progress.document_id,
                &mut progress.graph_sent,
            )
            .await
            .map(|(sse, last)| {
                progress.done = last;
                (Ok(sse), progress)
            });
        }
        let event = match progress.pending.take() {
            Some(event) => event,
            None => loop {
                match progress.receiver.recv().await {
                    Ok(event) if event.document_id == progress.document_id => break event,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // Missed events: re-read the current status instead.
                        match progress.node.get_document(
                            &progress.scope,
                            &progress.kb,
                            &progress.document_id,
                        ) {
                            Ok(record) => break DocumentEvent::from_record(&record),
                            Err(_) => return None,
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            },
        };
        let ready = !event.deleted && event.status == DocStatus::Ready;
        if event.is_final() {
            if progress.until_graph && ready {
                progress.graph_phase = true;
            } else {
                progress.done = true;
            }
        }
        let name = if event.deleted {
            "deleted"
        } else {
            event.status.as_str()
        };
        let sse = Event::default()
            .event(name)
            .json_data(&event)
            .unwrap_or_else(|_| Event::default().event("error"));
        Some((Ok(sse), progress))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10))))
}

/// The next `graph` event of a ready document: its graph's state when it differs from the
/// one sent last (looked at every [`GRAPH_POLL`]), and whether it is the last (anything but
/// `pending`). `None`: the document is gone (the stream ends).
async fn next_graph_event(
    node: Arc<SiftNode>,
    scope: &Scope,
    kb: &str,
    document_id: &str,
    sent: &mut Option<&'static str>,
) -> Option<(Event, bool)> {
    loop {
        let record = node.get_document(scope, kb, document_id).ok()?;
        if record.status != DocStatus::Ready {
            return None;
        }
        if let Some(graph) = node.document_graph(scope, kb, &record).await
            && *sent != Some(graph.state)
        {
            *sent = Some(graph.state);
            let last = graph.state != "pending";
            let body = json!({
                "kb_id": record.kb_id,
                "document_id": record.id,
                "graph": graph.state,
                "graph_error": graph.error,
            });
            let sse = Event::default()
                .event("graph")
                .json_data(&body)
                .unwrap_or_else(|_| Event::default().event("error"));
            return Some((sse, last));
        }
        tokio::time::sleep(GRAPH_POLL).await;
    }
}

async fn search(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    ApiJson(query): ApiJson<SearchQuery>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        state.node.search(&principal.scope(), &kb, query).await?,
    ))
}

async fn crash_shard(
    State(state): State<AppState>,
    ApiPath((kb, shard)): ApiPath<(String, u32)>,
) -> ApiResult<impl IntoResponse> {
    state.node.crash_shard(&kb, shard)?;
    Ok(StatusCode::ACCEPTED)
}

async fn crash_reconciler(State(state): State<AppState>) -> ApiResult<impl IntoResponse> {
    state.node.crash_reconciler()?;
    Ok(StatusCode::ACCEPTED)
}

async fn crash_sessions_actor(State(state): State<AppState>) -> ApiResult<impl IntoResponse> {
    state.sessions.crash_sessions_actor()?;
    Ok(StatusCode::ACCEPTED)
}

async fn crash_session_actor(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    state.sessions.crash_session_actor(&id)?;
    Ok(StatusCode::ACCEPTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_unavailability_answers_a_retryable_503() {
        let no_leader = ApiError::from(SiftError::Meta(sift_cluster::ClusterError::NotLeader {
            leader: None,
        }));
        assert_eq!(no_leader.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(no_leader.code, "not_leader");
        assert_eq!(no_leader.retry_after_secs, Some(1));
        let refused = ApiError::from(SiftError::Meta(sift_cluster::ClusterError::Invalid(
            "bad conf change".into(),
        )));
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert_eq!(refused.retry_after_secs, None);
        let full = ApiError::from(SiftError::QueueFull {
            retry_after_secs: 3,
        });
        assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.retry_after_secs, Some(3));
    }
}
