//! `/v1/keys`: API keys, for admins. A new key's full text is in the answer to its creation
//! and nowhere else; lists show the public id (`sk-sift-{id}-…`), never the secret or its
//! hash. A revoke is a Raft op: every node refuses the key once it has applied it.
//!
//! A tenant's admins see and make the keys of their tenant only (another tenant's key is
//! `api_key_not_found`); the operator (an admin of the default tenant) those of every tenant,
//! and makes a new tenant's first keys by naming it.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Serialize;
use sift_actors::ingest::pipeline::now_ms;
use sift_api::NewApiKey;
use sift_storage::meta::{ApiKeyRecord, DEFAULT_TENANT, MetaOp, MetaOutcome, Role};

use crate::api::{ApiError, ApiJson, ApiPath, ApiResult, AppState};
use crate::auth::{KEY_PREFIX, Principal, generate_key};
use crate::tenants_api::{check_tenant_name, tenant_not_found};

/// Longest key name, in characters.
const MAX_NAME_CHARS: usize = 200;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/keys", post(create_key).get(list_keys))
        .route("/v1/keys/{id}", delete(revoke_key))
}

/// A key as lists show it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    pub id: String,
    /// How the key starts, to recognise it: `sk-sift-{id}-`.
    pub prefix: String,
    pub name: String,
    pub role: Role,
    pub tenant: String,
    pub groups: Vec<String>,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub revoked_at_ms: Option<u64>,
}

impl From<ApiKeyRecord> for KeyView {
    fn from(record: ApiKeyRecord) -> KeyView {
        KeyView {
            prefix: format!("{KEY_PREFIX}{}-", record.id),
            id: record.id,
            name: record.name,
            role: record.role,
            tenant: record.tenant,
            groups: record.groups,
            created_at_ms: record.created_at_ms,
            expires_at_ms: record.expires_at_ms,
            revoked_at_ms: record.revoked_at_ms,
        }
    }
}

/// The answer to a creation: the view and, this once, the key itself.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub view: KeyView,
    /// The whole key (`sk-sift-{id}-{secret}`): shown this once.
    pub key: String,
}

/// `GET /v1/keys`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyView>,
}

fn invalid(code: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// Whether `principal` manages the keys of `tenant`.
fn manages(principal: &Principal, tenant: &str) -> bool {
    principal.is_operator() || principal.tenant == tenant
}

async fn create_key(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<NewApiKey>,
) -> ApiResult<impl IntoResponse> {
    let tenant = request
        .tenant
        .clone()
        .unwrap_or_else(|| principal.tenant.clone());
    if !manages(&principal, &tenant) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("only an admin of the {DEFAULT_TENANT} tenant makes keys of other tenants"),
        ));
    }
    check_tenant_name(&tenant)?;
    if state
        .node
        .context()
        .meta
        .store()
        .get_tenant(&tenant)
        .map_err(sift_actors::SiftError::from)?
        .is_none()
    {
        return Err(tenant_not_found(&tenant));
    }
    let name = request.name.trim();
    if name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(invalid(
            "invalid_name",
            format!("a key name is 1 to {MAX_NAME_CHARS} characters, no control characters"),
        ));
    }
    let role = Role::parse(&request.role).ok_or_else(|| {
        invalid(
            "invalid_role",
            format!(
                "role must be admin, editor or reader, not {:?}",
                request.role
            ),
        )
    })?;
    let now = now_ms();
    if request.expires_at_ms.is_some_and(|at| at <= now) {
        return Err(invalid("invalid_expiry", "expires_at_ms is in the past"));
    }
    let new = generate_key(name, role, request.expires_at_ms, now).map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            error.to_string(),
        )
    })?;
    let groups = sift_actors::scope::check_groups(request.groups.as_deref().unwrap_or_default())?;
    // The default tenant's keys without groups keep the op from before tenants.
    let op = if tenant == DEFAULT_TENANT && groups.is_empty() {
        MetaOp::CreateApiKey(new.record)
    } else {
        MetaOp::CreateTenantApiKey {
            key: new.record,
            tenant,
            groups,
        }
    };
    let outcome = state.node.context().meta.propose(op).await?;
    let MetaOutcome::ApiKey(record) = outcome else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected outcome {outcome:?}"),
        ));
    };
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            view: KeyView::from(record),
            key: new.key,
        }),
    ))
}

async fn list_keys(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<impl IntoResponse> {
    let keys: Vec<KeyView> = state
        .node
        .context()
        .meta
        .store()
        .list_api_keys()
        .map_err(sift_actors::SiftError::from)?
        .into_iter()
        .filter(|key| manages(&principal, &key.tenant))
        .map(KeyView::from)
        .collect();
    Ok(Json(KeyList { keys }))
}

async fn revoke_key(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "api_key_not_found",
            format!("no API key with id {id:?}"),
        )
    };
    let store = state.node.context().meta.store();
    if !store
        .get_api_key(&id)
        .map_err(sift_actors::SiftError::from)?
        .is_some_and(|key| manages(&principal, &key.tenant))
    {
        return Err(not_found());
    }
    let outcome = state
        .node
        .context()
        .meta
        .propose(MetaOp::RevokeApiKey {
            id: id.clone(),
            at_ms: now_ms(),
        })
        .await?;
    match outcome {
        MetaOutcome::ApiKey(record) => Ok(Json(KeyView::from(record))),
        _ => Err(not_found()),
    }
}
