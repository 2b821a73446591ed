//! `/v1/snapshots`: consistent snapshots of chosen KBs, for operators (an admin key of the
//! default tenant). The work is `SiftNode::snapshot` (`actors/src/node/snapshots.rs`); the
//! files live in the node's `snapshot_dir`, and `sift restore` brings one up as a new cluster.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use sift_actors::Scope;
use sift_api::CreateSnapshot;
use sift_storage::backup::{self, Manifest};

use crate::api::{
    ApiError, ApiJson, ApiPath, ApiResult, AppState, Page, next_after, requested_page,
};
use crate::views::{SnapshotList, SnapshotView};

/// Most snapshots in one page of `GET /v1/snapshots`.
const MAX_SNAPSHOTS_PAGE: usize = 1000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/snapshots", post(create_snapshot).get(list_snapshots))
        .route("/v1/snapshots/{id}", get(get_snapshot))
}

/// A snapshot as the API shows it: its manifest, its size and where it is on the node.
fn view(state: &AppState, manifest: &Manifest) -> SnapshotView {
    SnapshotView {
        id: manifest.id.clone(),
        created_at_ms: manifest.created_at_ms,
        bytes: manifest.total_bytes(),
        path: state.snapshot_dir.join(&manifest.id),
        node: state.listen.to_string(),
        manifest: manifest.clone(),
    }
}

/// `POST /v1/snapshots {"kbs": [...]}`: 201 with the snapshot once it is complete on disk.
async fn create_snapshot(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<CreateSnapshot>,
) -> ApiResult<impl IntoResponse> {
    let manifest = state
        .node
        .snapshot(&Scope::default_tenant(), &request.kbs, &state.snapshot_dir)
        .await?;
    Ok((StatusCode::CREATED, Json(view(&state, &manifest))))
}

/// `GET /v1/snapshots?after=ID&limit=N`: this node's complete snapshots, newest first.
async fn list_snapshots(
    State(state): State<AppState>,
    page: Result<Query<Page>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let (after, limit) = requested_page(page, MAX_SNAPSHOTS_PAGE)?;
    let dir = state.snapshot_dir.clone();
    let all = tokio::task::spawn_blocking(move || backup::list(&dir))
        .await
        .map_err(|error| sift_actors::SiftError::Internal(error.to_string()))?
        .map_err(sift_actors::SiftError::from)?;
    let start = match &after {
        Some(after) => all
            .iter()
            .position(|manifest| &manifest.id == after)
            .map(|position| position + 1)
            .unwrap_or(all.len()),
        None => 0,
    };
    let page: Vec<Manifest> = all.into_iter().skip(start).take(limit).collect();
    let next = next_after(&page, limit, |manifest| &manifest.id);
    let snapshots: Vec<_> = page.iter().map(|manifest| view(&state, manifest)).collect();
    Ok(Json(SnapshotList {
        snapshots,
        next_after: next,
    }))
}

/// `GET /v1/snapshots/{id}`.
async fn get_snapshot(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<impl IntoResponse> {
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "snapshot_not_found",
            format!("no snapshot with id {id:?} on this node"),
        )
    };
    if backup::check_id(&id).is_err() {
        return Err(not_found());
    }
    let dir = state.snapshot_dir.join(&id);
    let manifest = tokio::task::spawn_blocking(move || backup::read_manifest(&dir))
        .await
        .map_err(|error| sift_actors::SiftError::Internal(error.to_string()))?
        .map_err(|_| not_found())?;
    Ok(Json(view(&state, &manifest)))
}
