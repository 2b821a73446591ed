//! The audit log: every change made through the public API (and every change a known key
//! was refused), with who (the key's public id, tenant and role), what (method, route and
//! path), the outcome (the status), when and from which address. Entries are appended through
//! Raft (`MetaOp::AppendAudit`) before the answer is sent, so every member holds the same
//! log; each append forgets entries older than `audit_retention_days`. Nothing secret goes
//! in: keys appear by their public id only, bodies and headers not at all.
//!
//! `GET /v1/audit?after=&limit=`: admins, oldest first; a tenant's admins see their tenant's
//! entries, the operator every tenant's.

use std::net::SocketAddr;

use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Json, Router};
use sift_actors::SiftError;
use sift_actors::ingest::pipeline::now_ms;
use sift_storage::meta::{AuditEntry, MetaOp};
use tracing::warn;

use crate::api::{ApiResult, AppState, Page, next_after, requested_page};
use crate::auth::{AuthState, Principal};

/// Most entries one page of `GET /v1/audit` holds.
pub const MAX_AUDIT_PAGE: usize = 1000;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/audit", get(list_audit))
}

/// Whether a call of `route` with `method` is audited: every change, that is every method
/// but GET, HEAD and OPTIONS, except searches and OpenAI-compatible chat (reads sent as POST).
pub fn audited(method: &Method, route: &str) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
        && route != "/v1/kbs/{kb}/search"
        && route != "/v1/chat/completions"
}

/// What the audit entry of a request records, taken before the request is handled.
pub struct Call {
    entry: AuditEntry,
}

impl Call {
    pub fn of(request: &Request, route: &str, principal: &Principal) -> Call {
        let address = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip().to_string());
        Call {
            entry: AuditEntry {
                id: uuid::Uuid::now_v7().to_string(),
                at_ms: now_ms(),
                key_id: principal.key_id.clone(),
                tenant: principal.tenant.clone(),
                role: principal.role.as_str().to_string(),
                method: request.method().as_str().to_string(),
                route: route.to_string(),
                target: request.uri().path().to_string(),
                status: 0,
                address,
            },
        }
    }

    /// Appends the entry with the answer's status. A failure is logged, never the caller's:
    /// the change itself is done.
    pub async fn record(mut self, auth: &AuthState, status: StatusCode) {
        self.entry.status = status.as_u16();
        let retention = u64::try_from(auth.audit_retention.as_millis()).unwrap_or(u64::MAX);
        let op = MetaOp::AppendAudit {
            forget_before_ms: self.entry.at_ms.saturating_sub(retention),
            entry: self.entry,
        };
        if let Err(error) = auth.node.context().meta.propose(op).await {
            warn!(%error, "could not append to the audit log");
        }
    }
}

async fn list_audit(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    page: Result<Query<Page>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let (after, limit) = requested_page(page, MAX_AUDIT_PAGE)?;
    let entries = state
        .node
        .context()
        .meta
        .store()
        .list_audit(after.as_deref(), limit, |entry| {
            principal.is_operator() || entry.tenant == principal.tenant
        })
        .map_err(SiftError::from)?;
    let next = next_after(&entries, limit, |entry| &entry.id);
    Ok(Json(crate::views::AuditList {
        entries,
        next_after: next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_audited_reads_are_not() {
        assert!(audited(&Method::POST, "/v1/kbs"));
        assert!(audited(&Method::DELETE, "/v1/keys/{id}"));
        assert!(audited(&Method::PUT, "/v1/kbs/{kb}/shares/{tenant}"));
        assert!(audited(&Method::POST, "/v1/sessions/{id}/messages"));
        assert!(!audited(&Method::GET, "/v1/kbs"));
        assert!(!audited(&Method::POST, "/v1/kbs/{kb}/search"));
        assert!(!audited(&Method::POST, "/v1/chat/completions"));
    }
}
