//! `/v1/kbs/{kb}/graph/...`: a KB's entity graph for a browser (GraphRAG, ADR 0037): entities
//! by name, one entity with its neighbours and mentioning chunks, a path between two
//! entities, and the graph's communities (ADR 0039). Each is answered by [`sift_actors::SiftNode`] from every shard of the KB.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use sift_actors::node::communities::MAX_COMMUNITIES;
use sift_actors::node::graph::MAX_ENTITIES;
use sift_actors::retrieval::graph::MAX_HOPS;

use crate::api::{ApiPath, ApiResult, AppState, query_of};
use crate::auth::Principal;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/kbs/{kb}/graph/entities", get(entities))
        .route("/v1/kbs/{kb}/graph/entities/{entity}", get(entity))
        .route("/v1/kbs/{kb}/graph/paths", get(path))
        .route("/v1/kbs/{kb}/graph/communities", get(communities))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntitySearch {
    q: String,
    limit: Option<usize>,
}

/// `GET /v1/kbs/{kb}/graph/entities?q=NAME&limit=N`: entities whose name starts with `q`.
async fn entities(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    query: Result<Query<EntitySearch>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let query = query_of(query)?;
    let list = state
        .node
        .graph_entities(
            &principal.scope(),
            &kb,
            &query.q,
            query.limit.unwrap_or(20).min(MAX_ENTITIES),
        )
        .await?;
    Ok(Json(list))
}

/// `GET /v1/kbs/{kb}/graph/entities/{entity}`: the entity (its id or its name), its
/// neighbours and the chunks that mention it.
async fn entity(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((kb, entity)): ApiPath<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let detail = state
        .node
        .graph_entity(&principal.scope(), &kb, &entity)
        .await?;
    Ok(Json(detail))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathQuery {
    from: String,
    to: String,
    max_hops: Option<u32>,
}

/// `GET /v1/kbs/{kb}/graph/paths?from=A&to=B&max_hops=N`: the shortest chain of chunks
/// joining two entities.
async fn path(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    query: Result<Query<PathQuery>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let query = query_of(query)?;
    let path = state
        .node
        .graph_path(
            &principal.scope(),
            &kb,
            &query.from,
            &query.to,
            query.max_hops.unwrap_or(MAX_HOPS),
        )
        .await?;
    Ok(Json(path))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommunityQuery {
    limit: Option<usize>,
    summaries: Option<bool>,
}

/// `GET /v1/kbs/{kb}/graph/communities?limit=N&summaries=true`: the largest groups of
/// entities mentioned together, with their passages, and summaries by the node's chat model
/// when asked.
async fn communities(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(kb): ApiPath<String>,
    query: Result<Query<CommunityQuery>, QueryRejection>,
) -> ApiResult<impl IntoResponse> {
    let query = query_of(query)?;
    let list = state
        .node
        .graph_communities(
            &principal.scope(),
            &kb,
            query.limit.unwrap_or(10).min(MAX_COMMUNITIES),
            query.summaries.unwrap_or(false),
        )
        .await?;
    Ok(Json(list))
}
