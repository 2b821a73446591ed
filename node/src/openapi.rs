//! The OpenAPI 3.1 document of the public API, served at `GET /v1/openapi.json`.
//!
//! Every schema is derived from the Rust types (`utoipa::ToSchema`): request bodies and the
//! error body from the wire types of `sift-api`; answers from the types the handlers
//! serialize: the node's views (`views.rs`, `ClusterView`, `KeyView`), the actors' results
//! (`SearchResponse`, `RunStatus`, `TurnView`) and the storage records they show
//! (`DocumentRecord`, `SessionRecord`, ...). Fields skipped when empty are optional, fields
//! sent as `null` nullable, enums sent as strings string enums. The operations come from
//! [`OPERATIONS`], one row per method and route of the public router, each naming its answer's
//! schema. A test reads the router's source and fails when a route is missing from the table
//! or the table names one the router does not serve; another serializes sample answers and
//! checks them against their schemas. Left loose (any JSON object): OpenAI's answer shapes
//! (`/v1/chat/completions`, `/v1/models`, `/v1/embeddings`), built as JSON values in
//! `chat_api.rs`, and this document. Streams are described event by event (`event`, `data`
//! as JSON text, `id`), not by the payload of each event name. Every operation's `default`
//! answer is the error body.

use std::sync::OnceLock;

use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{Object, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, PathsBuilder, Ref,
    RefOr, Required, ResponseBuilder, ResponsesBuilder, Schema,
};
use utoipa::{PartialSchema, ToSchema};

/// What an operation takes in its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    None,
    /// A JSON body of the named schema (a `sift-api` type).
    Json(&'static str),
    /// A JSON object this document does not describe field by field (OpenAI's request shapes).
    AnyJson,
    /// `multipart/form-data` with a `file` (an upload), or a JSON [`BulkDocuments`] body.
    ///
    /// [`BulkDocuments`]: sift_api::BulkDocuments
    Documents,
}

/// What an operation answers with when it succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A JSON body of the named schema (an answer type of `views`, the actors or the storage
    /// records, deriving `utoipa::ToSchema`).
    Json(&'static str),
    /// A JSON object this document does not describe field by field: OpenAI's answer shapes,
    /// which the node builds as JSON values, and this document itself.
    AnyJson,
    /// [`Answer::AnyJson`], or `text/event-stream` when the request asks for a stream
    /// (OpenAI's `"stream": true`).
    AnyJsonOrEvents,
    /// `text/event-stream`.
    Events,
    /// `text/plain` (the Prometheus exposition format).
    Text,
    /// No body (204).
    Empty,
}

/// One operation of the public API.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    pub body: Body,
    pub status: u16,
    pub answer: Answer,
    /// Takes `?after=ID&limit=N`.
    pub paged: bool,
    /// A second success answer (a drain accepted, a run started without a stream).
    pub also: Option<(u16, Answer)>,
}

const fn op(
    method: &'static str,
    path: &'static str,
    tag: &'static str,
    summary: &'static str,
    body: Body,
    status: u16,
    answer: Answer,
) -> Operation {
    Operation {
        method,
        path,
        tag,
        summary,
        body,
        status,
        answer,
        paged: false,
        also: None,
    }
}

const fn paged(mut operation: Operation) -> Operation {
    operation.paged = true;
    operation
}

const fn also(mut operation: Operation, status: u16, answer: Answer) -> Operation {
    operation.also = Some((status, answer));
    operation
}

use Answer::{AnyJson as AnyJsonAnswer, AnyJsonOrEvents, Empty, Events, Json as JsonAnswer, Text};
use Body::{AnyJson, Documents, Json, None as NoBody};

/// Every operation of the public router (the `/v1/debug/...` fault injection routes, served
/// only with `debug_faults`, and the cluster's internal port are left out).
pub(crate) const OPERATIONS: &[Operation] = &[
    op(
        "get",
        "/healthz",
        "probes",
        "Liveness: the process answers",
        NoBody,
        200,
        JsonAnswer("Health"),
    ),
    op(
        "get",
        "/readyz",
        "probes",
        "Readiness: models loaded, shards open, a Raft leader known (503 naming each failing check)",
        NoBody,
        200,
        JsonAnswer("Readiness"),
    ),
    op(
        "get",
        "/metrics",
        "operations",
        "Prometheus metrics",
        NoBody,
        200,
        Text,
    ),
    op(
        "get",
        "/v1/openapi.json",
        "operations",
        "This document",
        NoBody,
        200,
        AnyJsonAnswer,
    ),
    op(
        "get",
        "/v1/cluster",
        "cluster",
        "Members, Raft state and placement",
        NoBody,
        200,
        JsonAnswer("ClusterView"),
    ),
    also(
        op(
            "delete",
            "/v1/cluster/nodes/{id}",
            "cluster",
            "Remove a member (202: drained first; 200: removed at once, with force=true or when it holds no replica)",
            NoBody,
            202,
            JsonAnswer("NodeDraining"),
        ),
        200,
        JsonAnswer("NodeRemoved"),
    ),
    op(
        "post",
        "/v1/kbs",
        "knowledge bases",
        "Create a knowledge base",
        Json("CreateKb"),
        201,
        JsonAnswer("KbView"),
    ),
    paged(op(
        "get",
        "/v1/kbs",
        "knowledge bases",
        "List the knowledge bases the key may read",
        NoBody,
        200,
        JsonAnswer("KbList"),
    )),
    op(
        "get",
        "/v1/kbs/{kb}",
        "knowledge bases",
        "A knowledge base with its settings and counts",
        NoBody,
        200,
        JsonAnswer("KbView"),
    ),
    op(
        "patch",
        "/v1/kbs/{kb}",
        "knowledge bases",
        "Change settings that need no re-indexing",
        Json("UpdateKb"),
        200,
        JsonAnswer("KbView"),
    ),
    op(
        "delete",
        "/v1/kbs/{kb}",
        "knowledge bases",
        "Delete a knowledge base and everything in it",
        NoBody,
        204,
        Empty,
    ),
    op(
        "post",
        "/v1/kbs/{kb}/documents",
        "documents",
        "Add documents: a file (multipart), texts or URLs (JSON)",
        Documents,
        202,
        JsonAnswer("AddedDocuments"),
    ),
    paged(op(
        "get",
        "/v1/kbs/{kb}/documents",
        "documents",
        "List documents",
        NoBody,
        200,
        JsonAnswer("DocumentList"),
    )),
    op(
        "get",
        "/v1/kbs/{kb}/documents/{doc}",
        "documents",
        "A document's record and status",
        NoBody,
        200,
        JsonAnswer("DocumentView"),
    ),
    op(
        "delete",
        "/v1/kbs/{kb}/documents/{doc}",
        "documents",
        "Delete a document",
        NoBody,
        204,
        Empty,
    ),
    op(
        "get",
        "/v1/kbs/{kb}/documents/{doc}/events",
        "documents",
        "A document's progress as server-sent events",
        NoBody,
        200,
        Events,
    ),
    op(
        "get",
        "/v1/kbs/{kb}/documents/{doc}/chunks",
        "documents",
        "A document's chunks in order",
        NoBody,
        200,
        JsonAnswer("ChunkList"),
    ),
    op(
        "post",
        "/v1/kbs/{kb}/search",
        "search",
        "Hybrid search with fusion, re-scoring and link following",
        Json("SearchQuery"),
        200,
        JsonAnswer("SearchResponse"),
    ),
    op(
        "get",
        "/v1/kbs/{kb}/graph/entities",
        "graph",
        "Entities whose name starts with q, most mentioned first",
        NoBody,
        200,
        JsonAnswer("EntityList"),
    ),
    op(
        "get",
        "/v1/kbs/{kb}/graph/entities/{entity}",
        "graph",
        "An entity (its 16-digit id or its name), its neighbours and the chunks that mention it",
        NoBody,
        200,
        JsonAnswer("EntityDetail"),
    ),
    op(
        "get",
        "/v1/kbs/{kb}/graph/paths",
        "graph",
        "The shortest chain of chunks joining two entities",
        NoBody,
        200,
        JsonAnswer("GraphPath"),
    ),
    op(
        "get",
        "/v1/kbs/{kb}/graph/communities",
        "graph",
        "The largest groups of entities mentioned together, with passages and optional summaries",
        NoBody,
        200,
        JsonAnswer("CommunityList"),
    ),
    op(
        "get",
        "/v1/kbs/{kb}/shards",
        "knowledge bases",
        "Where the shards' replicas are and their state",
        NoBody,
        200,
        JsonAnswer("ShardList"),
    ),
    op(
        "put",
        "/v1/kbs/{kb}/shares/{tenant}",
        "tenants",
        "Share a knowledge base with another tenant (read only)",
        NoBody,
        200,
        JsonAnswer("KbView"),
    ),
    op(
        "delete",
        "/v1/kbs/{kb}/shares/{tenant}",
        "tenants",
        "Stop sharing a knowledge base with a tenant",
        NoBody,
        204,
        Empty,
    ),
    op(
        "post",
        "/v1/sessions",
        "agent",
        "Start a session over knowledge bases",
        Json("NewSession"),
        201,
        JsonAnswer("SessionRecord"),
    ),
    paged(op(
        "get",
        "/v1/sessions",
        "agent",
        "List sessions",
        NoBody,
        200,
        JsonAnswer("SessionList"),
    )),
    op(
        "get",
        "/v1/sessions/{id}",
        "agent",
        "A session",
        NoBody,
        200,
        JsonAnswer("SessionRecord"),
    ),
    op(
        "delete",
        "/v1/sessions/{id}",
        "agent",
        "Delete a session",
        NoBody,
        204,
        Empty,
    ),
    op(
        "post",
        "/v1/sessions/{id}/messages",
        "agent",
        "Ask: an agent run, streamed as server-sent events",
        Json("NewMessage"),
        200,
        Events,
    ),
    paged(op(
        "get",
        "/v1/sessions/{id}/messages",
        "agent",
        "A session's messages",
        NoBody,
        200,
        JsonAnswer("MessageList"),
    )),
    op(
        "get",
        "/v1/runs/{id}",
        "agent",
        "An agent run's status",
        NoBody,
        200,
        JsonAnswer("RunStatus"),
    ),
    op(
        "get",
        "/v1/runs/{id}/events",
        "agent",
        "An agent run's events, resumable with Last-Event-ID",
        NoBody,
        200,
        Events,
    ),
    op(
        "post",
        "/v1/runs/{id}/stop",
        "agent",
        "Stop an agent run",
        NoBody,
        202,
        JsonAnswer("RunStatus"),
    ),
    op(
        "post",
        "/v1/chat/completions",
        "openai",
        "OpenAI-compatible chat completions over an agent preset or a knowledge base (`kb:NAME`); chunks as server-sent events with `stream: true`",
        AnyJson,
        200,
        AnyJsonOrEvents,
    ),
    op(
        "get",
        "/v1/models",
        "openai",
        "Agent presets, knowledge bases and embedding models as OpenAI models",
        NoBody,
        200,
        AnyJsonAnswer,
    ),
    op(
        "get",
        "/v1/models/{id}",
        "openai",
        "One model",
        NoBody,
        200,
        AnyJsonAnswer,
    ),
    op(
        "post",
        "/v1/embeddings",
        "openai",
        "OpenAI-compatible embeddings from the node's embedding models",
        AnyJson,
        200,
        AnyJsonAnswer,
    ),
    op(
        "post",
        "/v1/keys",
        "keys",
        "Create an API key (its secret is shown once)",
        Json("NewApiKey"),
        201,
        JsonAnswer("CreatedKey"),
    ),
    op(
        "get",
        "/v1/keys",
        "keys",
        "List API keys (no secrets)",
        NoBody,
        200,
        JsonAnswer("KeyList"),
    ),
    op(
        "delete",
        "/v1/keys/{id}",
        "keys",
        "Revoke an API key",
        NoBody,
        200,
        JsonAnswer("KeyView"),
    ),
    op(
        "post",
        "/v1/tenants",
        "tenants",
        "Create a tenant",
        Json("NewTenant"),
        201,
        JsonAnswer("TenantRecord"),
    ),
    op(
        "get",
        "/v1/tenants",
        "tenants",
        "List tenants",
        NoBody,
        200,
        JsonAnswer("TenantList"),
    ),
    op(
        "get",
        "/v1/tenants/{name}",
        "tenants",
        "A tenant with its usage and limits",
        NoBody,
        200,
        JsonAnswer("TenantRecord"),
    ),
    op(
        "delete",
        "/v1/tenants/{name}",
        "tenants",
        "Delete a tenant and everything it owns",
        NoBody,
        204,
        Empty,
    ),
    op(
        "put",
        "/v1/tenants/{name}/limits",
        "tenants",
        "Set a tenant's quotas and rate limit",
        Json("TenantLimits"),
        200,
        JsonAnswer("TenantRecord"),
    ),
    op(
        "post",
        "/v1/snapshots",
        "operations",
        "Take a snapshot of the cluster's data",
        Json("CreateSnapshot"),
        201,
        JsonAnswer("SnapshotView"),
    ),
    paged(op(
        "get",
        "/v1/snapshots",
        "operations",
        "List snapshots",
        NoBody,
        200,
        JsonAnswer("SnapshotList"),
    )),
    op(
        "get",
        "/v1/snapshots/{id}",
        "operations",
        "A snapshot's state",
        NoBody,
        200,
        JsonAnswer("SnapshotView"),
    ),
    paged(op(
        "get",
        "/v1/audit",
        "operations",
        "The audit log of administrative actions",
        NoBody,
        200,
        JsonAnswer("AuditList"),
    )),
];

/// The document, built once.
pub(crate) fn document() -> &'static OpenApi {
    static DOCUMENT: OnceLock<OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(build)
}

/// The named schemas: request bodies and the error body from the `sift-api` types, answers
/// from the node's views, the actors' results and the storage records they show.
fn schemas() -> Vec<(String, RefOr<Schema>)> {
    let mut schemas = Vec::new();
    macro_rules! add {
        ($($ty:ty),* $(,)?) => {$(
            schemas.push((<$ty as ToSchema>::name().into_owned(), <$ty as PartialSchema>::schema()));
            <$ty as ToSchema>::schemas(&mut schemas);
        )*};
    }
    add!(
        sift_api::ErrorBody,
        sift_api::CreateKb,
        sift_api::UpdateKb,
        sift_api::BulkDocuments,
        sift_api::SearchQuery,
        sift_api::NewSession,
        sift_api::NewMessage,
        sift_api::NewApiKey,
        sift_api::NewTenant,
        sift_api::TenantLimits,
        sift_api::CreateSnapshot,
        // Answers.
        crate::views::Health,
        crate::views::Readiness,
        crate::cluster::ClusterView,
        crate::views::NodeDraining,
        crate::views::NodeRemoved,
        crate::views::KbView,
        crate::views::KbList,
        crate::views::AddedDocuments,
        crate::views::DocumentList,
        sift_storage::meta::DocumentRecord,
        crate::views::DocumentView,
        crate::views::ChunkList,
        sift_actors::retrieval::SearchResponse,
        sift_actors::node::graph::EntityList,
        sift_actors::node::graph::EntityDetail,
        sift_actors::node::graph::EventView,
        sift_actors::node::graph::GraphPath,
        sift_actors::node::communities::CommunityList,
        crate::views::ShardList,
        sift_storage::meta::SessionRecord,
        crate::views::SessionList,
        crate::views::MessageList,
        sift_actors::sessions::RunStatus,
        crate::keys_api::CreatedKey,
        crate::keys_api::KeyList,
        crate::keys_api::KeyView,
        sift_storage::meta::TenantRecord,
        crate::views::TenantList,
        crate::views::SnapshotView,
        crate::views::SnapshotList,
        crate::views::AuditList,
    );
    schemas
}

fn build() -> OpenApi {
    let mut paths = PathsBuilder::new();
    for operation in OPERATIONS {
        paths = paths.path(
            operation.path,
            utoipa::openapi::PathItem::new(method(operation.method), build_operation(operation)),
        );
    }
    let bearer = SecurityScheme::Http(
        HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("An API key: `Authorization: Bearer sk-sift-...`"))
            .build(),
    );
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Sift")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Knowledge bases, hybrid search and a cited agent. Every answer that is not \
                     a success carries `{\"error\": {\"code\", \"message\", \"type\", \"param\"}}`.",
                ))
                .build(),
        )
        .paths(paths.build())
        .components(Some(
            ComponentsBuilder::new()
                .schemas_from_iter(schemas())
                .security_scheme("api_key", bearer)
                .build(),
        ))
        .build()
}

fn method(name: &str) -> HttpMethod {
    match name {
        "get" => HttpMethod::Get,
        "post" => HttpMethod::Post,
        "put" => HttpMethod::Put,
        "patch" => HttpMethod::Patch,
        "delete" => HttpMethod::Delete,
        other => unreachable!("no operation uses {other}"),
    }
}

/// The query parameters of the graph routes: (name, required, description, integer).
fn graph_query_parameters(path: &str) -> &'static [(&'static str, bool, &'static str, bool)] {
    match path {
        "/v1/kbs/{kb}/graph/entities" => &[
            (
                "q",
                true,
                "The start of a name (case and punctuation folded)",
                false,
            ),
            (
                "limit",
                false,
                "Entities listed (default 20, at most 100)",
                true,
            ),
        ],
        "/v1/kbs/{kb}/graph/communities" => &[
            (
                "limit",
                false,
                "Communities listed (default 10, at most 20)",
                true,
            ),
            (
                "summaries",
                false,
                "`true`: summarise each community with the node's chat model (cached)",
                false,
            ),
        ],
        "/v1/kbs/{kb}/documents/{doc}/events" => &[(
            "until",
            false,
            "`graph`: after `ready`, go on with `graph` events until the document's graph is ready or failed",
            false,
        )],
        "/v1/kbs/{kb}/graph/paths" => &[
            (
                "from",
                true,
                "An entity: its 16-digit id or its name",
                false,
            ),
            ("to", true, "An entity: its 16-digit id or its name", false),
            (
                "max_hops",
                false,
                "Most chunks on the path (1 to 3, default 3)",
                true,
            ),
        ],
        _ => &[],
    }
}

fn build_operation(operation: &Operation) -> utoipa::openapi::path::Operation {
    let mut builder = OperationBuilder::new()
        .tag(operation.tag)
        .summary(Some(operation.summary))
        .operation_id(Some(operation_id(operation)));
    for name in path_parameters(operation.path) {
        builder = builder.parameter(
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .schema(Some(String::schema())),
        );
    }
    if operation.paged {
        builder = builder
            .parameter(
                ParameterBuilder::new()
                    .name("after")
                    .parameter_in(ParameterIn::Query)
                    .required(Required::False)
                    .description(Some("The id after which the page starts"))
                    .schema(Some(String::schema())),
            )
            .parameter(
                ParameterBuilder::new()
                    .name("limit")
                    .parameter_in(ParameterIn::Query)
                    .required(Required::False)
                    .description(Some(
                        "Items in the page (default 100; 0 and values past the route's most \
                         are clamped to 1 and to it)",
                    ))
                    .schema(Some(
                        utoipa::openapi::ObjectBuilder::new()
                            .schema_type(Type::Integer)
                            .minimum(Some(0))
                            .maximum(Some(u64::MAX))
                            .build(),
                    )),
            );
    }
    if operation.path == "/v1/kbs/{kb}/documents" && operation.method == "get" {
        builder = builder.parameter(
            ParameterBuilder::new()
                .name("status")
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .description(Some(
                    "Only the documents in this status (else 400 `invalid_status`); a page may \
                     then hold fewer than `limit` and still have a `next_after`",
                ))
                .schema(Some(Ref::from_schema_name("DocStatus"))),
        );
    }
    for (name, required, description, integer) in graph_query_parameters(operation.path) {
        let schema: utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> = if *integer {
            utoipa::openapi::ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .maximum(Some(u64::from(u32::MAX)))
                .build()
                .into()
        } else {
            String::schema()
        };
        builder = builder.parameter(
            ParameterBuilder::new()
                .name(*name)
                .parameter_in(ParameterIn::Query)
                .required(if *required {
                    Required::True
                } else {
                    Required::False
                })
                .description(Some(*description))
                .schema(Some(schema)),
        );
    }
    if operation.path == "/v1/cluster/nodes/{id}" {
        builder = builder.parameter(
            ParameterBuilder::new()
                .name("force")
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .schema(Some(bool::schema())),
        );
    }
    builder = match operation.body {
        NoBody => builder,
        Json(name) => builder.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content("application/json", content(Ref::from_schema_name(name)))
                .build(),
        )),
        AnyJson => builder.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content("application/json", content(Object::new()))
                .build(),
        )),
        Documents => builder.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content(
                    "application/json",
                    content(Ref::from_schema_name("BulkDocuments")),
                )
                .content("multipart/form-data", content(upload_form()))
                .build(),
        )),
    };
    let success = success_answer(operation.summary, operation.answer);
    let error = ResponseBuilder::new()
        .description("Any failure: the error body")
        .content(
            "application/json",
            content(Ref::from_schema_name("ErrorBody")),
        );
    let mut responses = ResponsesBuilder::new().response(operation.status.to_string(), success);
    if let Some((status, answer)) = operation.also {
        responses = responses.response(
            status.to_string(),
            success_answer(operation.summary, answer),
        );
    }
    builder = builder.responses(responses.response("default", error.build()).build());
    if !matches!(operation.path, "/healthz" | "/readyz") {
        builder = builder.security(utoipa::openapi::security::SecurityRequirement::new::<
            &str,
            [&str; 0],
            &str,
        >("api_key", []));
    }
    builder.build()
}

/// A success answer of `answer`'s media type.
fn success_answer(summary: &str, answer: Answer) -> utoipa::openapi::Response {
    let success = ResponseBuilder::new().description(summary);
    match answer {
        JsonAnswer(name) => {
            success.content("application/json", content(Ref::from_schema_name(name)))
        }
        AnyJsonAnswer => success.content("application/json", content(Object::new())),
        AnyJsonOrEvents => success
            .content("application/json", content(Object::new()))
            .content("text/event-stream", content(sse_event())),
        Events => success.content("text/event-stream", content(sse_event())),
        Text => success.content("text/plain", content(String::schema())),
        Empty => success,
    }
    .build()
}

/// One server-sent event: its name (`event`), its JSON payload as text (`data`) and, on
/// resumable streams, its `id`.
fn sse_event() -> utoipa::openapi::schema::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("event", text_of(None))
        .property("data", text_of(Some("application/json")))
        .property("id", text_of(None))
        .required("data")
        .build()
}

/// A string schema, holding content of `media_type` when given.
fn text_of(media_type: Option<&str>) -> utoipa::openapi::schema::Object {
    let builder = utoipa::openapi::ObjectBuilder::new().schema_type(Type::String);
    match media_type {
        Some(media_type) => builder.content_media_type(media_type),
        None => builder,
    }
    .build()
}

fn content(schema: impl Into<RefOr<Schema>>) -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(schema)).build()
}

/// The multipart upload: one `file`, and optional `external_id`, `metadata` (a JSON object)
/// and `access` (`{"groups": [...]}`) fields.
fn upload_form() -> utoipa::openapi::schema::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("file", text_of(Some("application/octet-stream")))
        .required("file")
        .property("external_id", text_of(None))
        .property("metadata", text_of(None))
        .property("access", text_of(None))
        .build()
}

/// `getKbsKbDocuments` style: the method, then each path segment, braces dropped.
fn operation_id(operation: &Operation) -> String {
    let mut id = operation.method.to_string();
    for segment in operation
        .path
        .split('/')
        .filter(|s| !s.is_empty() && *s != "v1")
    {
        let segment = segment.trim_matches(|c| c == '{' || c == '}');
        for word in segment.split(|c: char| !c.is_ascii_alphanumeric()) {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                id.push(first.to_ascii_uppercase());
                id.extend(chars);
            }
        }
    }
    id
}

fn path_parameters(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::{Value, json};

    use super::*;

    /// `(method, path)` of every `.route(...)` of the public routers, read from their source.
    fn routed() -> BTreeSet<(String, String)> {
        let sources = [
            include_str!("api.rs"),
            include_str!("chat_api.rs"),
            include_str!("keys_api.rs"),
            include_str!("snapshots_api.rs"),
            include_str!("tenants_api.rs"),
            include_str!("audit.rs"),
            include_str!("graph_api.rs"),
        ];
        let method = methods_called();
        let mut routes = BTreeSet::new();
        for source in sources {
            for piece in source.split(".route(").skip(1) {
                // The route's arguments: up to the parenthesis that closes `.route(`.
                let mut depth = 1;
                let end = piece
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(piece.len(), |(at, _)| at);
                let arguments = &piece[..end];
                let Some(path) = arguments.split('"').nth(1) else {
                    continue; // a constant (the cluster's internal route is in cluster.rs)
                };
                for name in method(arguments) {
                    routes.insert((name, path.to_string()));
                }
            }
        }
        routes
    }

    /// The methods named in a route's arguments: `get(`, `.post(`, `axum::routing::delete(`.
    fn methods_called() -> impl Fn(&str) -> Vec<String> {
        |arguments: &str| {
            let mut found = Vec::new();
            for name in ["get", "post", "put", "patch", "delete"] {
                let call = format!("{name}(");
                let mut rest = arguments;
                while let Some(at) = rest.find(&call) {
                    let before = rest[..at].chars().next_back();
                    if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                        found.push(name.to_string());
                    }
                    rest = &rest[at + call.len()..];
                }
            }
            found
        }
    }

    #[test]
    fn every_public_route_is_in_the_document_and_nothing_else() {
        let routed: BTreeSet<(String, String)> = routed()
            .into_iter()
            .filter(|(_, path)| !path.starts_with("/v1/debug/"))
            .collect();
        assert!(
            routed.len() > 40,
            "the router's source was not read: {routed:?}"
        );
        let documented: BTreeSet<(String, String)> = OPERATIONS
            .iter()
            .map(|op| (op.method.to_string(), op.path.to_string()))
            .collect();
        let missing: Vec<_> = routed.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&routed).collect();
        assert!(
            missing.is_empty(),
            "routes missing from the OpenAPI document: {missing:?}"
        );
        assert!(extra.is_empty(), "documented but not routed: {extra:?}");
    }

    #[test]
    fn the_document_is_openapi_3_1_with_its_schemas_resolved() {
        let json = serde_json::to_value(document()).unwrap();
        assert!(
            json["openapi"].as_str().unwrap().starts_with("3.1"),
            "{}",
            json["openapi"]
        );
        let schemas = json["components"]["schemas"].as_object().unwrap();
        // Every reference points at a schema of the document.
        let text = json.to_string();
        for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &reference[..reference.find('"').unwrap()];
            assert!(
                schemas.contains_key(name),
                "{name} is referenced but not defined"
            );
        }
        let search = &json["paths"]["/v1/kbs/{kb}/search"]["post"];
        assert_eq!(search["operationId"], "postKbsKbSearch");
        assert_eq!(search["parameters"][0]["name"], "kb");
        assert_eq!(
            search["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/SearchQuery"
        );
        assert_eq!(
            search["responses"]["default"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
        // The search body's fields come from the Rust type.
        assert!(
            schemas["SearchQuery"]["properties"]["query"].is_object(),
            "{}",
            schemas["SearchQuery"]
        );
        let upload = &json["paths"]["/v1/kbs/{kb}/documents"]["post"]["requestBody"]["content"];
        assert!(
            upload["multipart/form-data"].is_object() && upload["application/json"].is_object()
        );
        let list = &json["paths"]["/v1/kbs"]["get"]["parameters"];
        assert_eq!(list[0]["name"], "after");
        let documents = json["paths"]["/v1/kbs/{kb}/documents"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let status = documents.iter().find(|p| p["name"] == "status").unwrap();
        assert_eq!(status["in"], "query");
        assert_eq!(status["schema"]["$ref"], "#/components/schemas/DocStatus");
        assert!(json["paths"]["/healthz"]["get"]["security"].is_null());
        assert!(json["paths"]["/v1/kbs"]["get"]["security"].is_array());
        let ids: BTreeSet<String> = OPERATIONS.iter().map(operation_id).collect();
        assert_eq!(ids.len(), OPERATIONS.len(), "operation ids are unique");
    }

    #[test]
    fn every_reference_resolves_and_every_json_answer_names_its_schema() {
        let json = serde_json::to_value(document()).unwrap();
        let schemas = json["components"]["schemas"].as_object().unwrap();
        let text = json.to_string();
        let references: BTreeSet<&str> = text
            .split("\"$ref\":\"")
            .skip(1)
            .map(|reference| &reference[..reference.find('"').unwrap()])
            .collect();
        for reference in &references {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{reference} points outside the components"));
            assert!(
                schemas.contains_key(name),
                "{name} is referenced but not defined"
            );
        }
        for operation in OPERATIONS {
            let answers =
                std::iter::once((operation.status, operation.answer)).chain(operation.also);
            for (status, answer) in answers {
                if let JsonAnswer(name) = answer {
                    let schema = &json["paths"][operation.path][operation.method]["responses"]
                        [status.to_string()]["content"]["application/json"]["schema"];
                    assert_eq!(
                        schema["$ref"],
                        format!("#/components/schemas/{name}"),
                        "{} {}",
                        operation.method,
                        operation.path
                    );
                }
            }
        }
    }

    #[test]
    fn no_two_types_share_a_schema_name() {
        let mut seen: BTreeMap<String, RefOr<Schema>> = BTreeMap::new();
        for (name, schema) in schemas() {
            if let Some(before) = seen.insert(name.clone(), schema.clone()) {
                assert!(before == schema, "two different schemas are named {name}");
            }
        }
    }

    /// The mismatches of `value` with `schema` (resolved in `document`), by path: a type the
    /// schema does not allow (`null` included), a required property missing, a property the
    /// schema does not name, a value outside an enum, not exactly one `oneOf` branch.
    fn mismatches(document: &Value, schema: &Value, value: &Value, path: &str) -> Vec<String> {
        let schema = resolve(document, schema);
        let mut found = Vec::new();
        if let Some(branches) = schema["oneOf"].as_array() {
            let matching = branches
                .iter()
                .filter(|branch| mismatches(document, branch, value, path).is_empty())
                .count();
            if matching != 1 {
                found.push(format!("{path}: {matching} oneOf branches match {value}"));
            }
            return found;
        }
        if let Some(allowed) = schema["enum"].as_array()
            && !allowed.contains(value)
        {
            found.push(format!("{path}: {value} not in {allowed:?}"));
        }
        let types: Vec<&str> = match &schema["type"] {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ if schema["allOf"].is_array() || schema["properties"].is_object() => {
                vec!["object"]
            }
            _ => return found, // any value
        };
        let fits = types.iter().any(|kind| match *kind {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "string" => value.is_string(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => false,
        });
        if !fits {
            found.push(format!("{path}: {value} is not {types:?}"));
            return found;
        }
        if let Some(items) = value.as_array() {
            for (at, item) in items.iter().enumerate() {
                found.extend(mismatches(
                    document,
                    &schema["items"],
                    item,
                    &format!("{path}[{at}]"),
                ));
            }
        }
        if let Some(fields) = value.as_object() {
            let (properties, required, additional) = shape(document, schema);
            for name in &required {
                if !fields.contains_key(name) {
                    found.push(format!("{path}: required {name} missing"));
                }
            }
            for (name, field) in fields {
                let at = format!("{path}.{name}");
                match (properties.get(name), &additional) {
                    (Some(property), _) => found.extend(mismatches(document, property, field, &at)),
                    (None, Some(values)) => found.extend(mismatches(document, values, field, &at)),
                    (None, None) => found.push(format!("{at}: not in the schema")),
                }
            }
        }
        found
    }

    fn resolve<'a>(document: &'a Value, schema: &'a Value) -> &'a Value {
        match schema["$ref"].as_str() {
            Some(reference) => {
                let name = reference.trim_start_matches("#/components/schemas/");
                resolve(document, &document["components"]["schemas"][name])
            }
            None => schema,
        }
    }

    /// An object schema's properties, required names and the schema of other properties
    /// (a map's values), its `allOf` parts (serde's `flatten`) merged.
    fn shape(
        document: &Value,
        schema: &Value,
    ) -> (BTreeMap<String, Value>, BTreeSet<String>, Option<Value>) {
        let schema = resolve(document, schema);
        let mut properties = BTreeMap::new();
        let mut required = BTreeSet::new();
        let mut additional = match &schema["additionalProperties"] {
            Value::Object(values) => Some(Value::Object(values.clone())),
            Value::Bool(true) => Some(json!({})),
            _ => None,
        };
        for part in schema["allOf"].as_array().into_iter().flatten() {
            let (more, also_required, other) = shape(document, part);
            properties.extend(more);
            required.extend(also_required);
            additional = additional.or(other);
        }
        for (name, property) in schema["properties"].as_object().into_iter().flatten() {
            properties.insert(name.clone(), property.clone());
        }
        for name in schema["required"].as_array().into_iter().flatten() {
            required.insert(name.as_str().unwrap().to_string());
        }
        (properties, required, additional)
    }

    /// One answer of each named schema, with options set and unset, lists full.
    fn sample_answers() -> Vec<(&'static str, Value)> {
        use sift_actors::agent::{Citation, RunFinish, TraceStep};
        use sift_actors::node::communities::{CommunityList, CommunityView};
        use sift_actors::node::graph::{
            EntityDetail, EntityList, EntityNeighbour, EntityView, EventView, GraphPath, PathStep,
        };
        let entity = |name: &str| EntityView {
            id: "00a1b2c3d4e5f607".into(),
            name: name.into(),
            kind: "name".into(),
            chunks: 2,
        };
        use sift_actors::node::ready::Check;
        use sift_actors::node::{ReplicaView, ShardView};
        use sift_actors::retrieval::fusion::{Channel, ChannelHitInfo};
        use sift_actors::retrieval::mmr::AlsoIn;
        use sift_actors::retrieval::packing::{self, Neighbour, PackedContext};
        use sift_actors::retrieval::rerank::RerankReport;
        use sift_actors::retrieval::root::{FailedShard, HitPath, SearchHit};
        use sift_actors::retrieval::{SearchResponse, SearchTimings};
        use sift_actors::sessions::{RunStatus, TurnView};
        use sift_api::{AddedDocument, PageRange};
        use sift_storage::backup::{Manifest, ManifestFile, ManifestKb};
        use sift_storage::chunk::ChunkView;
        use sift_storage::meta::{
            ApiKeyRecord, AuditEntry, DocSource, DocStatus, DocumentCounts, DocumentRecord,
            KbRecord, KbSettings, Replica, ReplicaState, Role, SessionRecord, ShardPlacement,
            TenantRecord, TurnUsage,
        };

        use crate::keys_api::{CreatedKey, KeyList, KeyView};
        use crate::views::*;

        let settings = KbSettings::new(2, 1, "all-MiniLM-L6-v2", 384);
        let kb = KbRecord {
            id: "kb1".into(),
            name: "docs".into(),
            settings: settings.clone(),
            created_at_ms: 1,
            updated_at_ms: 2,
            placement: vec![ShardPlacement {
                replicas: vec![Replica {
                    node: 1,
                    state: ReplicaState::Active,
                    since_ms: 1,
                }],
            }],
        };
        let counts = DocumentCounts {
            total: 3,
            by_status: [(DocStatus::Ready, 2), (DocStatus::Failed, 1)].into(),
        };
        let kb_view = |shared_with: Option<Vec<String>>| KbView {
            kb: kb.clone(),
            documents: counts.clone(),
            chunks: 12,
            // a key restricted to groups sees no byte count
            stored_bytes: shared_with.as_ref().map(|_| 4096),
            tenant: "default".into(),
            read_only: shared_with.is_none(),
            shared_with,
        };
        let metadata: BTreeMap<String, String> = [("lang".into(), "en".into())].into();
        let document = |external_id: Option<String>, source: DocSource| DocumentRecord {
            id: "d1".into(),
            kb_id: "kb1".into(),
            external_id,
            title: "Lights".into(),
            source,
            content_hash: "ab".into(),
            size_bytes: 10,
            shard: 0,
            status: DocStatus::Failed,
            error: Some("no text".into()),
            chunk_count: 0,
            metadata: metadata.clone(),
            created_at_ms: 1,
            updated_at_ms: 2,
            pages_needing_ocr: 0,
        };
        let chunk = |pages: Option<PageRange>, parent_text: Option<String>| ChunkView {
            chunk_id: "c1".into(),
            document_id: "d1".into(),
            external_id: None,
            title: "Lights".into(),
            position: 0,
            text: "Lighthouses guide ships.".into(),
            parent_text,
            heading_path: vec!["Coast".into()],
            span: (0, 24),
            pages,
            metadata: metadata.clone(),
        };
        let hit = |full: bool| SearchHit {
            chunk: chunk(full.then_some(PageRange { first: 1, last: 2 }), None),
            score: 0.9,
            fused_score: 0.5,
            rerank_score: full.then_some(0.9),
            channels: [(
                Channel::Bm25,
                ChannelHitInfo {
                    rank: 1,
                    score: 2.5,
                    contribution: 0.5,
                },
            )]
            .into(),
            also_in: if full {
                vec![AlsoIn {
                    chunk_id: "c2".into(),
                    document_id: "d2".into(),
                    external_id: Some("x".into()),
                    title: "Copy".into(),
                    similarity: 0.95,
                }]
            } else {
                vec![]
            },
            neighbours: if full {
                vec![Neighbour {
                    chunk_id: "c0".into(),
                    position: 0,
                    text: "Before.".into(),
                }]
            } else {
                vec![]
            },
            citation: full.then_some(1),
            explain: full.then(|| "found by BM25".into()),
            path: full.then(|| HitPath {
                fused_rank: 1,
                fused_score: 0.5,
                rerank_rank: Some(1),
                rerank_score: Some(0.9),
                rerank_features: None,
                mmr: None,
                queries: vec!["ships".into()],
                steps: vec!["fused".into()],
            }),
            trace: vec![],
            mmr: None,
            features: None,
            fused_rank: 1,
            rerank_rank: None,
            queries: vec![0],
        };
        let search = |full: bool| SearchResponse {
            hits: vec![hit(true), hit(false)],
            failed_shards: vec![FailedShard {
                shard: 1,
                reason: "deadline".into(),
            }],
            timings: SearchTimings::default(),
            rerank: full.then(|| RerankReport {
                applied: false,
                model: "embedded".into(),
                depth: 0,
                reason: Some("one hit".into()),
            }),
            queries: if full {
                vec!["ships".into(), "boats".into()]
            } else {
                vec![]
            },
            context: full.then(|| PackedContext {
                text: "[1] Lighthouses guide ships.".into(),
                tokens: 8,
                budget: 100,
                citations: vec![packing::Citation {
                    n: 1,
                    document_id: "d1".into(),
                    external_id: None,
                    source_url: Some("https://example.com/lights".into()),
                    title: "Lights".into(),
                    chunk_ids: vec!["c1".into()],
                    pages: None,
                    expansion: "chunk",
                    tokens: 8,
                }],
                trimmed: false,
                notes: vec!["trimmed".into()],
            }),
            notes: if full { vec!["note".into()] } else { vec![] },
        };
        let session = SessionRecord::new("s1", &["kb1".into()], "default", 1, None);
        let turn = TurnView {
            message_id: "m1".into(),
            run_id: "r1".into(),
            seq: 0,
            question: "Who guides ships?".into(),
            answer: "Lighthouses [1].".into(),
            citations: vec![Citation {
                n: 1,
                chunk_id: "c1".into(),
                kb_id: "kb1".into(),
                document_id: "d1".into(),
                document_title: "Lights".into(),
                external_id: None,
                source_url: Some("https://example.com/lights".into()),
                span: (0, 24),
                pages: Some(PageRange { first: 1, last: 1 }),
                text: "Lighthouses guide ships.".into(),
                heading_path: vec!["Lights".into()],
            }],
            finish_reason: "stop".into(),
            mode: "extractive".into(),
            usage: TurnUsage::default(),
            trace: vec![TraceStep {
                kind: "tool".into(),
                name: "search".into(),
                started_ms: 0,
                duration_ms: 3,
                detail: json!({"hits": 1}),
            }],
            grounding: None,
            created_at_ms: 1,
        };
        let run = |finish_reason: Option<RunFinish>| RunStatus {
            run_id: "r1".into(),
            session_id: "s1".into(),
            finished: finish_reason.is_some(),
            finish_reason,
            events: 3,
        };
        let key = KeyView::from(ApiKeyRecord {
            id: "0a1b".into(),
            name: "ci".into(),
            role: Role::Editor,
            secret_sha256: "ff".into(),
            created_at_ms: 1,
            expires_at_ms: None,
            revoked_at_ms: Some(2),
            tenant: "default".into(),
            groups: vec!["staff".into()],
        });
        let snapshot = SnapshotView {
            id: "snap1".into(),
            created_at_ms: 1,
            bytes: 10,
            path: "/data/snapshots/snap1".into(),
            node: "127.0.0.1:7700".into(),
            manifest: Manifest {
                snapshot_format: 1,
                data_dir_format: 1,
                sift_version: "0.1.0".into(),
                id: "snap1".into(),
                created_at_ms: 1,
                meta_index: 7,
                kbs: vec![ManifestKb {
                    id: "kb1".into(),
                    name: "docs".into(),
                    tenant: "default".into(),
                    shards: 2,
                    documents: 3,
                    raw_documents: 0,
                    settings,
                }],
                files: vec![ManifestFile {
                    path: "meta.json".into(),
                    bytes: 10,
                    sha256: "ee".into(),
                }],
            },
        };
        let audit = AuditEntry {
            id: "a1".into(),
            at_ms: 1,
            key_id: None,
            tenant: "default".into(),
            role: "admin".into(),
            method: "POST".into(),
            route: "/v1/kbs".into(),
            target: "/v1/kbs".into(),
            status: 201,
            address: Some("127.0.0.1".into()),
        };
        let rebalancing = sift_actors::node::Rebalancing {
            draining: vec![sift_actors::node::DrainingNode {
                node: 3,
                replicas: 1,
            }],
            replicas: vec![sift_actors::node::MovingReplica {
                kb_id: "kb1".into(),
                kb: "docs".into(),
                shard: 0,
                node: 2,
                state: "recovering",
                since_ms: 5,
                sources: vec![1],
            }],
            planned: vec![sift_actors::node::PlannedStep {
                kb_id: "kb1".into(),
                kb: "docs".into(),
                shard: 0,
                action: "remove_replica",
                node: 3,
                reason: "remove_extra_replica",
            }],
        };
        let cluster =
            crate::cluster::ClusterView::single("127.0.0.1:7700".parse().unwrap(), 4, rebalancing);
        let answers: Vec<(&'static str, Value)> = vec![
            ("Health", json!(Health { status: "ok" })),
            (
                "Readiness",
                json!(Readiness {
                    status: "ready",
                    checks: vec![Check {
                        name: "raft_storage",
                        ok: true,
                        detail: "ok".into(),
                    }],
                    embedded_model: None,
                    embedded_model_error: Some("no model dir".into()),
                    remote_embedders: vec!["openai".into()],
                    shards: 2,
                    ingest_queue_depth: 0,
                    auth: "keys",
                }),
            ),
            ("ClusterView", json!(cluster)),
            (
                "NodeDraining",
                json!(NodeDraining {
                    draining: 2,
                    replicas: 3,
                    message: "draining".into(),
                }),
            ),
            (
                "NodeRemoved",
                json!(NodeRemoved {
                    removed: 2,
                    voters: vec![1, 3],
                    learners: vec![],
                }),
            ),
            ("KbView", json!(kb_view(Some(vec!["acme".into()])))),
            ("KbView", json!(kb_view(None))),
            (
                "KbList",
                json!(KbList {
                    kbs: vec![kb_view(None)],
                    next_after: Some("kb1".into()),
                }),
            ),
            (
                "AddedDocuments",
                json!(AddedDocuments {
                    documents: vec![AddedDocument {
                        id: "d1".into(),
                        external_id: None,
                        status: "queued".into(),
                        duplicate: false,
                        replaced: Some("d0".into()),
                    }],
                }),
            ),
            (
                "DocumentRecord",
                json!(document(
                    Some("x".into()),
                    DocSource::Upload {
                        file_name: "a.pdf".into(),
                        format: "pdf".into(),
                    },
                )),
            ),
            (
                "DocumentView",
                json!(crate::views::DocumentView {
                    record: document(
                        None,
                        DocSource::Text {
                            format: "markdown".into(),
                        },
                    ),
                    graph: Some("failed"),
                    graph_error: Some(
                        "the model answered invalid JSON 3 times: expected value at line 1 column 1".into()
                    ),
                }),
            ),
            (
                "DocumentList",
                json!(DocumentList {
                    documents: vec![document(
                        None,
                        DocSource::Text {
                            format: "markdown".into(),
                        },
                    )],
                    next_after: None,
                }),
            ),
            (
                "ChunkList",
                json!(ChunkList {
                    chunks: vec![chunk(None, Some("Parent.".into()))],
                }),
            ),
            ("SearchResponse", json!(search(true))),
            (
                "EntityList",
                json!(EntityList {
                    entities: vec![entity("Scott Derrickson")],
                }),
            ),
            (
                "EntityDetail",
                json!(EntityDetail {
                    entity: entity("Scott Derrickson"),
                    neighbours: vec![EntityNeighbour {
                        entity: entity("Doctor Strange"),
                        shared_chunks: 1,
                    }],
                    mentions: vec![chunk(None, Some("Parent.".into()))],
                    events: vec![EventView {
                        subject: "Scott Derrickson".into(),
                        predicate: "directed".into(),
                        object: "Doctor Strange".into(),
                        time: "2016".into(),
                        place: String::new(),
                        chunk_id: "d1#0".into(),
                    }],
                }),
            ),
            (
                "GraphPath",
                json!(GraphPath {
                    found: true,
                    hops: 1,
                    steps: vec![
                        PathStep {
                            entity: entity("Doctor Strange"),
                            via_chunk: Some("d1#0".into()),
                        },
                        PathStep {
                            entity: entity("Scott Derrickson"),
                            via_chunk: None,
                        },
                    ],
                }),
            ),
            (
                "CommunityList",
                json!(CommunityList {
                    communities: vec![CommunityView {
                        id: "00c0ffee00c0ffee".into(),
                        size: 4,
                        chunks: 3,
                        members: vec![entity("Scott Derrickson"), entity("Doctor Strange")],
                        passages: vec![chunk(None, Some("Parent.".into()))],
                        summary: Some("Scott Derrickson directed Doctor Strange.".into()),
                        summary_error: None,
                    }, CommunityView {
                        id: "00c0ffee00c0ffef".into(),
                        size: 3,
                        chunks: 2,
                        members: vec![entity("Ed Wood")],
                        passages: Vec::new(),
                        summary: None,
                        summary_error: Some("no chat model is configured".into()),
                    }],
                    entities_considered: 9,
                }),
            ),
            ("SearchResponse", json!(search(false))),
            (
                "ShardList",
                json!(ShardList {
                    shards: vec![ShardView {
                        shard: 0,
                        replicas: vec![ReplicaView {
                            node: 1,
                            state: ReplicaState::Active.as_str(),
                            since_ms: 1,
                            local: true,
                            reachable: true,
                            documents: Some(3),
                            chunks: None,
                        }],
                    }],
                }),
            ),
            ("SessionRecord", json!(session)),
            (
                "SessionList",
                json!(SessionList {
                    sessions: vec![session.clone()],
                    next_after: None,
                }),
            ),
            (
                "MessageList",
                json!(MessageList {
                    messages: vec![turn],
                    next_after: Some("m1".into()),
                }),
            ),
            ("RunStatus", json!(run(None))),
            ("RunStatus", json!(run(Some(RunFinish::Budget)))),
            (
                "CreatedKey",
                json!(CreatedKey {
                    view: KeyView::from(ApiKeyRecord {
                        id: "0a1c".into(),
                        name: "ops".into(),
                        role: Role::Admin,
                        secret_sha256: "ff".into(),
                        created_at_ms: 1,
                        expires_at_ms: Some(9),
                        revoked_at_ms: None,
                        tenant: "default".into(),
                        groups: vec![],
                    }),
                    key: "sk-sift-0a1c-secret".into(),
                }),
            ),
            ("KeyView", json!(key)),
            (
                "KeyList",
                json!(KeyList {
                    keys: vec![KeyView::from(ApiKeyRecord {
                        id: "0a1d".into(),
                        name: "r".into(),
                        role: Role::Reader,
                        secret_sha256: "ff".into(),
                        created_at_ms: 1,
                        expires_at_ms: None,
                        revoked_at_ms: None,
                        tenant: "acme".into(),
                        groups: vec![],
                    })],
                }),
            ),
            ("TenantRecord", json!(TenantRecord::default_tenant())),
            (
                "TenantList",
                json!(TenantList {
                    tenants: vec![TenantRecord {
                        name: "acme".into(),
                        created_at_ms: 1,
                        limits: sift_api::TenantLimits {
                            max_kbs: Some(3),
                            ..Default::default()
                        },
                    }],
                }),
            ),
            ("SnapshotView", json!(snapshot.clone())),
            (
                "SnapshotList",
                json!(SnapshotList {
                    snapshots: vec![snapshot],
                    next_after: None,
                }),
            ),
            (
                "AuditList",
                json!(AuditList {
                    entries: vec![audit],
                    next_after: None,
                }),
            ),
        ];
        answers
    }

    #[test]
    fn answers_match_their_schemas() {
        let document = serde_json::to_value(document()).unwrap();
        let samples = sample_answers();
        let sampled: BTreeSet<&str> = samples.iter().map(|(name, _)| *name).collect();
        for operation in OPERATIONS {
            for (_, answer) in
                std::iter::once((operation.status, operation.answer)).chain(operation.also)
            {
                if let JsonAnswer(name) = answer {
                    assert!(sampled.contains(name), "no sample answer of {name}");
                }
            }
        }
        let mut found = Vec::new();
        for (name, value) in &samples {
            let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
            found.extend(mismatches(&document, &schema, value, name));
        }
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn the_checker_finds_what_a_schema_does_not_describe() {
        let document = serde_json::to_value(document()).unwrap();
        let schema = json!({ "$ref": "#/components/schemas/RunStatus" });
        let mut run = json!({
            "run_id": "r1", "session_id": "s1", "finished": false,
            "finish_reason": null, "events": 0,
        });
        assert_eq!(
            mismatches(&document, &schema, &run, "run"),
            Vec::<String>::new()
        );
        run["extra"] = json!(1);
        run["finish_reason"] = json!("later");
        run.as_object_mut().unwrap().remove("events");
        let found = mismatches(&document, &schema, &run, "run");
        assert_eq!(found.len(), 3, "{found:#?}");
    }
}
