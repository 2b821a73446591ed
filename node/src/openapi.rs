//! The OpenAPI 3.1 document of the public API, served at `GET /v1/openapi.json`.
//!
//! Request bodies and the error body are schemas derived from the wire types of `sift-api`
//! (`utoipa::ToSchema`); the operations come from [`OPERATIONS`], one row per method and route
//! of the public router. A test reads the router's source and fails when a route is missing
//! from the table or the table names one the router does not serve. Answers are described by
//! status and media type; their bodies are the records' serialization (the README's API
//! section), not schemas yet. Every operation's `default` answer is the error body.

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
    Json,
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

use Answer::{Empty, Events, Json as JsonAnswer, Text};
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
        JsonAnswer,
    ),
    op(
        "get",
        "/readyz",
        "probes",
        "Readiness: models loaded, shards open, a Raft leader known (503 naming each failing check)",
        NoBody,
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/cluster",
        "cluster",
        "Members, Raft state and placement",
        NoBody,
        200,
        JsonAnswer,
    ),
    also(
        op(
            "delete",
            "/v1/cluster/nodes/{id}",
            "cluster",
            "Remove a member (202: drained first; 200: removed at once, with force=true or when it holds no replica)",
            NoBody,
            202,
            JsonAnswer,
        ),
        200,
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/kbs",
        "knowledge bases",
        "Create a knowledge base",
        Json("CreateKb"),
        201,
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/kbs",
        "knowledge bases",
        "List the knowledge bases the key may read",
        NoBody,
        200,
        JsonAnswer,
    )),
    op(
        "get",
        "/v1/kbs/{kb}",
        "knowledge bases",
        "A knowledge base with its settings and counts",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "patch",
        "/v1/kbs/{kb}",
        "knowledge bases",
        "Change settings that need no re-indexing",
        Json("UpdateKb"),
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/kbs/{kb}/documents",
        "documents",
        "List documents",
        NoBody,
        200,
        JsonAnswer,
    )),
    op(
        "get",
        "/v1/kbs/{kb}/documents/{doc}",
        "documents",
        "A document's record and status",
        NoBody,
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/kbs/{kb}/search",
        "search",
        "Hybrid search with fusion, re-scoring and link following",
        Json("SearchQuery"),
        200,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/kbs/{kb}/shards",
        "knowledge bases",
        "Where the shards' replicas are and their state",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "put",
        "/v1/kbs/{kb}/shares/{tenant}",
        "tenants",
        "Share a knowledge base with another tenant (read only)",
        NoBody,
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/sessions",
        "agent",
        "List sessions",
        NoBody,
        200,
        JsonAnswer,
    )),
    op(
        "get",
        "/v1/sessions/{id}",
        "agent",
        "A session",
        NoBody,
        200,
        JsonAnswer,
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
    also(
        op(
            "post",
            "/v1/sessions/{id}/messages",
            "agent",
            "Ask: an agent run, streamed as server-sent events (202 with the run when asked not to stream)",
            Json("NewMessage"),
            200,
            Events,
        ),
        202,
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/sessions/{id}/messages",
        "agent",
        "A session's messages",
        NoBody,
        200,
        JsonAnswer,
    )),
    op(
        "get",
        "/v1/runs/{id}",
        "agent",
        "An agent run's status",
        NoBody,
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/chat/completions",
        "openai",
        "OpenAI-compatible chat completions over an agent preset or a knowledge base (`kb:NAME`)",
        AnyJson,
        200,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/models",
        "openai",
        "Agent presets, knowledge bases and embedding models as OpenAI models",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/models/{id}",
        "openai",
        "One model",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/embeddings",
        "openai",
        "OpenAI-compatible embeddings from the node's embedding models",
        AnyJson,
        200,
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/keys",
        "keys",
        "Create an API key (its secret is shown once)",
        Json("NewApiKey"),
        201,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/keys",
        "keys",
        "List API keys (no secrets)",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "delete",
        "/v1/keys/{id}",
        "keys",
        "Revoke an API key",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/tenants",
        "tenants",
        "Create a tenant",
        Json("NewTenant"),
        201,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/tenants",
        "tenants",
        "List tenants",
        NoBody,
        200,
        JsonAnswer,
    ),
    op(
        "get",
        "/v1/tenants/{name}",
        "tenants",
        "A tenant with its usage and limits",
        NoBody,
        200,
        JsonAnswer,
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
        JsonAnswer,
    ),
    op(
        "post",
        "/v1/snapshots",
        "operations",
        "Take a snapshot of the cluster's data",
        Json("CreateSnapshot"),
        201,
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/snapshots",
        "operations",
        "List snapshots",
        NoBody,
        200,
        JsonAnswer,
    )),
    op(
        "get",
        "/v1/snapshots/{id}",
        "operations",
        "A snapshot's state",
        NoBody,
        200,
        JsonAnswer,
    ),
    paged(op(
        "get",
        "/v1/audit",
        "operations",
        "The audit log of administrative actions",
        NoBody,
        200,
        JsonAnswer,
    )),
];

/// The document, built once.
pub(crate) fn document() -> &'static OpenApi {
    static DOCUMENT: OnceLock<OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(build)
}

/// The named request schemas and the error body, from the `sift-api` types.
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
        JsonAnswer => success.content("application/json", content(Object::new())),
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
    use std::collections::BTreeSet;

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
        assert!(json["paths"]["/healthz"]["get"]["security"].is_null());
        assert!(json["paths"]["/v1/kbs"]["get"]["security"].is_array());
        let ids: BTreeSet<String> = OPERATIONS.iter().map(operation_id).collect();
        assert_eq!(ids.len(), OPERATIONS.len(), "operation ids are unique");
    }
}
