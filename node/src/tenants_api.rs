//! `/v1/tenants`: the tenants, for the operator (an admin of the default tenant). A tenant
//! owns KBs, keys and sessions; deleting one deletes its KBs, revokes its keys and deletes
//! its sessions, so a tenant made later under the same name starts with nothing. A tenant's
//! limits (`PUT /v1/tenants/{name}/limits`) replace node-wide settings for it alone.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use sift_actors::ingest::pipeline::now_ms;
use sift_actors::{Scope, SiftError};
use sift_api::{NewTenant, TenantLimits};
use sift_storage::meta::{DEFAULT_TENANT, MetaOp, MetaOutcome, TenantRecord};

use crate::api::{ApiError, ApiJson, ApiPath, ApiResult, AppState};

/// Longest tenant name, in bytes.
pub const MAX_TENANT_NAME: usize = 64;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{name}", get(get_tenant).delete(delete_tenant))
        .route("/v1/tenants/{name}/limits", put(set_tenant_limits))
}

/// Checks a tenant name: 1 to [`MAX_TENANT_NAME`] lowercase ASCII letters, digits, `-` and
/// `_`, starting with a letter or digit (so never `/`, `..`, `:`, NUL or a path).
pub fn check_tenant_name(name: &str) -> ApiResult<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if valid {
        return Ok(());
    }
    let mut shown: String = name.chars().take(40).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_tenant_name",
        format!(
            "tenant name {shown:?} is not 1 to {MAX_TENANT_NAME} lowercase letters, digits, '-' or '_' starting with a letter or digit"
        ),
    ))
}

pub(crate) fn tenant_not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "tenant_not_found",
        format!("no tenant named {name:?}"),
    )
}

async fn create_tenant(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<NewTenant>,
) -> ApiResult<impl IntoResponse> {
    check_tenant_name(&request.name)?;
    let store = state.node.context().meta.store();
    if store
        .get_tenant(&request.name)
        .map_err(SiftError::from)?
        .is_some()
    {
        return Err(tenant_exists(&request.name));
    }
    let outcome = state
        .node
        .context()
        .meta
        .propose(MetaOp::CreateTenant {
            name: request.name.clone(),
            created_at_ms: now_ms(),
        })
        .await
        .map_err(|error| {
            if error.code() == "conflict" {
                tenant_exists(&request.name)
            } else {
                ApiError::from(error)
            }
        })?;
    match outcome {
        MetaOutcome::Tenant(record) => Ok((StatusCode::CREATED, Json(record))),
        other => Err(ApiError::from(SiftError::Internal(format!(
            "unexpected outcome {other:?}"
        )))),
    }
}

async fn get_tenant(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    check_tenant_name(&name)?;
    let store = state.node.context().meta.store();
    match store.get_tenant(&name).map_err(SiftError::from)? {
        Some(record) => Ok(Json(record)),
        None => Err(tenant_not_found(&name)),
    }
}

/// Replaces the tenant's limits (a field left out: the node-wide setting). The default
/// tenant has the node-wide settings and no limits of its own.
async fn set_tenant_limits(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(limits): ApiJson<TenantLimits>,
) -> ApiResult<impl IntoResponse> {
    if name == DEFAULT_TENANT {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_tenant",
            "the default tenant has the node-wide limits of the config; set them there",
        ));
    }
    check_tenant_name(&name)?;
    if let Some((field, why)) = limits.invalid_field() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_limits",
            format!("{field} {why}"),
        ));
    }
    let outcome = state
        .node
        .context()
        .meta
        .propose(MetaOp::SetTenantLimits {
            name: name.clone(),
            limits,
        })
        .await
        .map_err(|error| {
            if error.code() == "not_found" {
                tenant_not_found(&name)
            } else {
                ApiError::from(error)
            }
        })?;
    match outcome {
        MetaOutcome::Tenant(record) => Ok(Json(record)),
        other => Err(ApiError::from(SiftError::Internal(format!(
            "unexpected outcome {other:?}"
        )))),
    }
}

fn tenant_exists(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "tenant_exists",
        format!("a tenant named {name:?} already exists"),
    )
}

async fn list_tenants(State(state): State<AppState>) -> ApiResult<impl IntoResponse> {
    let tenants: Vec<TenantRecord> = state
        .node
        .context()
        .meta
        .store()
        .list_tenants()
        .map_err(SiftError::from)?;
    Ok(Json(crate::views::TenantList { tenants }))
}

/// Deletes the tenant's KBs (each as `DELETE /v1/kbs/{kb}` would), then the tenant itself
/// (one op: its keys revoked, its sessions deleted). A KB made meanwhile makes the last
/// step fail; it is tried again a few times.
async fn delete_tenant(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    if name == DEFAULT_TENANT {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_tenant",
            "the default tenant cannot be deleted",
        ));
    }
    check_tenant_name(&name)?;
    let store = state.node.context().meta.store();
    if store.get_tenant(&name).map_err(SiftError::from)?.is_none() {
        return Err(tenant_not_found(&name));
    }
    let scope = Scope::tenant(name.clone());
    let mut last_error = None;
    for _ in 0..3 {
        for kb in state.node.list_kbs(&scope)? {
            if kb.tenant == name {
                match state.node.delete_kb(&scope, &kb.record.id).await {
                    Ok(()) => {}
                    Err(error) if error.code() == "kb_not_found" => {}
                    Err(error) => return Err(error.into()),
                }
            }
        }
        match state
            .node
            .context()
            .meta
            .propose(MetaOp::DeleteTenant {
                name: name.clone(),
                at_ms: now_ms(),
            })
            .await
        {
            Ok(_) => return Ok(StatusCode::NO_CONTENT),
            Err(error) if error.code() == "conflict" => last_error = Some(error),
            Err(error) => return Err(error.into()),
        }
    }
    Err(last_error
        .map(ApiError::from)
        .unwrap_or_else(|| tenant_not_found(&name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_plain_words() {
        for good in ["acme", "a", "team-7", "x_y", &"a".repeat(64)] {
            assert!(check_tenant_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            "a\0b",
            "Acme",
            "-acme",
            "a:b",
            "é",
            &"a".repeat(65),
            &"a".repeat(10_000),
        ] {
            let error = check_tenant_name(bad).unwrap_err();
            assert_eq!(error.code, "invalid_tenant_name", "{bad:?}");
            assert!(error.message.len() < 300, "a long name is not echoed whole");
        }
    }
}
