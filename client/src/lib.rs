//! The client of Sift's public HTTP API, used by the `sift` CLI, `sift-bench` and the
//! integration tests.
//!
//! - [`Client`]: a base URL, an optional API key (sent as `Authorization: Bearer ...`) and one
//!   method per route; answers decode into any `serde` type (`serde_json::Value` included).
//! - [`Error`]: the node's refusals as [`ApiError`] (`{"error": {"code", "message"}}`),
//!   transport failures (rendered with their source chain by [`render_error`]), bodies that
//!   do not decode, broken event streams.
//! - [`sse`]: the one parser of the API's server-sent event streams ([`Events`]).
//!
//! - [`api`]: the request bodies (`sift-api`), re-exported; methods take any `Serialize` body
//!   so tests can also send what the types would not allow.
//!
//! The crate knows the API only by its wire format: it depends on `sift-api` and no crate of
//! the node.

mod error;
pub mod sse;

use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub use error::{ApiError, Error, NO_CODE, Result, parse_retry_after, render_error};
pub use reqwest;
pub use sift_api as api;
pub use sse::{Events, SseEvent};

/// One whole answer, whatever its status: status, headers and the body as JSON (`Null` when
/// empty, a JSON string when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

/// A client of one node. Cheap to clone: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    api_key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the node at `base` (`http://127.0.0.1:7700`), with reqwest's defaults (no
    /// overall timeout). `api_key`, when given, goes with every request as a bearer token.
    pub fn new(base: &str, api_key: Option<String>) -> Client {
        Client::with_http(base, api_key, reqwest::Client::new())
    }

    /// A client that sends through `http` (for its timeouts, pool and proxy settings).
    pub fn with_http(base: &str, api_key: Option<String>, http: reqwest::Client) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            api_key,
            http,
        }
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request to `path` (`/v1/kbs?limit=5`, taken as written), with the API key.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.authorized(self.http.request(method, format!("{}{path}", self.base)))
    }

    /// A request to the path of `segments`, each percent-encoded (a KB name may hold any
    /// character), with the API key.
    pub fn request_to(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        self.authorized(self.http.request(method, self.url(segments)))
    }

    /// The URL of the path of `segments`, each percent-encoded.
    pub fn url(&self, segments: &[&str]) -> String {
        let mut url = self.base.clone();
        for segment in segments {
            url.push('/');
            encode_segment(segment, &mut url);
        }
        url
    }

    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// Sends `request`; the response whatever its status.
    pub async fn send(&self, request: RequestBuilder) -> Result<(Method, reqwest::Response)> {
        let (http, request) = request.build_split();
        // A request that does not build (an invalid URL) has no method to name.
        let request = request.map_err(|cause| Error::Transport {
            method: Method::from_bytes(b"HTTP").unwrap_or_default(),
            url: self.base.clone(),
            cause,
        })?;
        let method = request.method().clone();
        let url = request.url().to_string();
        let response = http
            .execute(request)
            .await
            .map_err(|cause| Error::Transport {
                method: method.clone(),
                url,
                cause,
            })?;
        Ok((method, response))
    }

    /// Sends `request` and reads the whole answer, whatever its status.
    pub async fn answer(&self, request: RequestBuilder) -> Result<Answer> {
        let (method, response) = self.send(request).await?;
        let url = response.url().to_string();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes =
            response
                .bytes()
                .await
                .map_err(|cause| Error::Transport { method, url, cause })?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// Sends `request` and decodes a 2xx JSON body (an empty body decodes as `null`), or
    /// turns a 4xx/5xx into [`Error::Api`].
    pub async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T> {
        let (method, response) = self.send(request).await?;
        let url = response.url().to_string();
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(|cause| Error::Transport {
            method: method.clone(),
            url: url.clone(),
            cause,
        })?;
        if !status.is_success() {
            return Err(Error::Api {
                method,
                url,
                error: ApiError::from_body(status, &body, retry_after),
            });
        }
        let body: &[u8] = if body.is_empty() { b"null" } else { &body };
        serde_json::from_slice(body).map_err(|cause| Error::Decode { method, url, cause })
    }

    /// Sends `request` and opens the event stream it answers with, or turns a 4xx/5xx into
    /// [`Error::Api`].
    pub async fn events(&self, request: RequestBuilder) -> Result<Events> {
        let (method, response) = self.send(request).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(Events::new(method, response));
        }
        let url = response.url().to_string();
        let retry_after = retry_after(response.headers());
        let body = response.bytes().await.map_err(|cause| Error::Transport {
            method: method.clone(),
            url: url.clone(),
            cause,
        })?;
        Err(Error::Api {
            method,
            url,
            error: ApiError::from_body(status, &body, retry_after),
        })
    }

    async fn get_json<T: DeserializeOwned>(&self, segments: &[&str]) -> Result<T> {
        self.json(self.request_to(Method::GET, segments)).await
    }

    async fn post_json<T: DeserializeOwned>(
        &self,
        segments: &[&str],
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.json(self.request_to(Method::POST, segments).json(body))
            .await
    }

    async fn delete_json<T: DeserializeOwned>(&self, segments: &[&str]) -> Result<T> {
        self.json(self.request_to(Method::DELETE, segments)).await
    }

    // ---- node ----

    /// `GET /healthz`.
    pub async fn healthz<T: DeserializeOwned>(&self) -> Result<T> {
        self.get_json(&["healthz"]).await
    }

    /// `GET /readyz` (whether the node serves, and its embedded model).
    pub async fn readyz<T: DeserializeOwned>(&self) -> Result<T> {
        self.get_json(&["readyz"]).await
    }

    /// `GET /metrics`: the Prometheus text.
    pub async fn metrics(&self) -> Result<String> {
        let answer = self
            .answer(self.request_to(Method::GET, &["metrics"]))
            .await?;
        match answer.body {
            Value::String(text) => Ok(text),
            other => Ok(other.to_string()),
        }
    }

    /// `GET /v1/cluster`: leader, term, members, roles and health.
    pub async fn cluster<T: DeserializeOwned>(&self) -> Result<T> {
        self.get_json(&["v1", "cluster"]).await
    }

    /// `DELETE /v1/cluster/nodes/{id}`: removes a member (drained first unless `force`).
    pub async fn remove_node<T: DeserializeOwned>(&self, id: u64, force: bool) -> Result<T> {
        let mut url = self.url(&["v1", "cluster", "nodes", &id.to_string()]);
        if force {
            url.push_str("?force=true");
        }
        self.json(self.authorized(self.http.delete(url))).await
    }

    // ---- snapshots ----

    /// `POST /v1/snapshots {"kbs": [...]}` (operators).
    pub async fn create_snapshot<T: DeserializeOwned>(&self, kbs: &[String]) -> Result<T> {
        let body = sift_api::CreateSnapshot { kbs: kbs.to_vec() };
        self.post_json(&["v1", "snapshots"], &body).await
    }

    /// `GET /v1/snapshots` (the first page).
    pub async fn list_snapshots<T: DeserializeOwned>(&self) -> Result<T> {
        self.get_json(&["v1", "snapshots"]).await
    }

    // ---- knowledge bases ----

    /// `GET /v1/kbs`: a page of at most `limit` KBs after the id `after`.
    pub async fn list_kbs<T: DeserializeOwned>(
        &self,
        limit: usize,
        after: Option<&str>,
    ) -> Result<T> {
        let mut url = self.url(&["v1", "kbs"]);
        url.push_str(&format!("?limit={limit}"));
        if let Some(after) = after {
            url.push_str("&after=");
            encode_segment(after, &mut url);
        }
        self.json(self.authorized(self.http.get(url))).await
    }

    /// `POST /v1/kbs`; `body` holds `name` and settings.
    pub async fn create_kb<T: DeserializeOwned>(
        &self,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.post_json(&["v1", "kbs"], body).await
    }

    /// `GET /v1/kbs/{kb}` (by name or id).
    pub async fn get_kb<T: DeserializeOwned>(&self, kb: &str) -> Result<T> {
        self.get_json(&["v1", "kbs", kb]).await
    }

    /// `GET /v1/kbs/{kb}/shards`: where the KB's shard replicas live and their states.
    pub async fn kb_shards<T: DeserializeOwned>(&self, kb: &str) -> Result<T> {
        self.get_json(&["v1", "kbs", kb, "shards"]).await
    }

    /// `DELETE /v1/kbs/{kb}`.
    pub async fn delete_kb(&self, kb: &str) -> Result<()> {
        self.delete_json::<Value>(&["v1", "kbs", kb])
            .await
            .map(drop)
    }

    // ---- documents ----

    /// `POST /v1/kbs/{kb}/documents` with `{"documents": [...]}` (the bulk JSON API).
    pub async fn add_documents<T: DeserializeOwned>(
        &self,
        kb: &str,
        documents: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.post_json(
            &["v1", "kbs", kb, "documents"],
            &json!({ "documents": documents }),
        )
        .await
    }

    /// `POST /v1/kbs/{kb}/documents` with `{"urls": [...]}`: the node fetches each page.
    pub async fn add_urls<T: DeserializeOwned>(&self, kb: &str, urls: &[String]) -> Result<T> {
        self.post_json(&["v1", "kbs", kb, "documents"], &json!({ "urls": urls }))
            .await
    }

    /// The multipart upload of one file (field `file`) to `POST /v1/kbs/{kb}/documents`.
    pub fn upload_request(&self, kb: &str, file_name: &str, bytes: Vec<u8>) -> RequestBuilder {
        let part = reqwest::multipart::Part::bytes(bytes).file_name(file_name.to_string());
        let form = reqwest::multipart::Form::new().part("file", part);
        self.request_to(Method::POST, &["v1", "kbs", kb, "documents"])
            .multipart(form)
    }

    /// Uploads one file (multipart field `file`).
    pub async fn upload<T: DeserializeOwned>(
        &self,
        kb: &str,
        file_name: &str,
        bytes: Vec<u8>,
    ) -> Result<T> {
        self.json(self.upload_request(kb, file_name, bytes)).await
    }

    /// `GET /v1/kbs/{kb}/documents/{id}`.
    pub async fn document<T: DeserializeOwned>(&self, kb: &str, id: &str) -> Result<T> {
        self.get_json(&["v1", "kbs", kb, "documents", id]).await
    }

    /// `GET /v1/kbs/{kb}/documents`: a page of at most `limit` documents after `after`.
    pub async fn list_documents<T: DeserializeOwned>(
        &self,
        kb: &str,
        limit: usize,
        after: Option<&str>,
    ) -> Result<T> {
        let mut url = self.url(&["v1", "kbs", kb, "documents"]);
        url.push_str(&format!("?limit={limit}"));
        if let Some(after) = after {
            url.push_str("&after=");
            encode_segment(after, &mut url);
        }
        self.json(self.authorized(self.http.get(url))).await
    }

    /// `DELETE /v1/kbs/{kb}/documents/{id}`.
    pub async fn delete_document(&self, kb: &str, id: &str) -> Result<()> {
        self.delete_json::<Value>(&["v1", "kbs", kb, "documents", id])
            .await
            .map(drop)
    }

    // ---- search ----

    /// `POST /v1/kbs/{kb}/search`; `body` is the full request (`query`, `top_k`, ...).
    pub async fn search<T: DeserializeOwned>(
        &self,
        kb: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.post_json(&["v1", "kbs", kb, "search"], body).await
    }

    // ---- sessions and runs ----

    /// `POST /v1/sessions`; `body` holds `kbs` (and optionally `agent`).
    pub async fn create_session<T: DeserializeOwned>(
        &self,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.post_json(&["v1", "sessions"], body).await
    }

    /// `POST /v1/sessions/{id}/messages`.
    pub fn ask_request(&self, session: &str, content: &str) -> RequestBuilder {
        self.request_to(Method::POST, &["v1", "sessions", session, "messages"])
            .json(&sift_api::NewMessage {
                content: content.to_string(),
            })
    }

    /// Asks `content` in a session: the run's event stream.
    pub async fn ask(&self, session: &str, content: &str) -> Result<Events> {
        self.events(self.ask_request(session, content)).await
    }

    /// `GET /v1/runs/{id}/events`, resuming after `last_event_id` when given.
    pub fn follow_run_request(&self, run: &str, last_event_id: Option<&str>) -> RequestBuilder {
        let request = self.request_to(Method::GET, &["v1", "runs", run, "events"]);
        match last_event_id {
            Some(id) => request.header("Last-Event-ID", id),
            None => request,
        }
    }

    /// A run's event stream, resuming after `last_event_id` when given.
    pub async fn follow_run(&self, run: &str, last_event_id: Option<&str>) -> Result<Events> {
        self.events(self.follow_run_request(run, last_event_id))
            .await
    }

    // ---- OpenAI-compatible chat ----

    /// `POST /v1/chat/completions` (not streamed).
    pub async fn chat_completions<T: DeserializeOwned>(
        &self,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.post_json(&["v1", "chat", "completions"], body).await
    }

    /// `POST /v1/chat/completions` with `"stream": true` in `body`: the chunks' stream.
    pub async fn chat_completions_stream(
        &self,
        body: &(impl Serialize + ?Sized),
    ) -> Result<Events> {
        self.events(
            self.request_to(Method::POST, &["v1", "chat", "completions"])
                .json(body),
        )
        .await
    }
}

/// Whether `headers` say the body is an event stream.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_retry_after)
}

/// Percent-encodes one path segment (or query value): everything but the unreserved
/// characters.
fn encode_segment(segment: &str, out: &mut String) {
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_segments_and_tolerate_trailing_slashes() {
        let client = Client::new("http://127.0.0.1:7700/", None);
        assert_eq!(client.base_url(), "http://127.0.0.1:7700");
        assert_eq!(
            client.url(&["v1", "kbs", "sci fact", "search"]),
            "http://127.0.0.1:7700/v1/kbs/sci%20fact/search"
        );
        assert_eq!(
            client.url(&["v1", "kbs", "a/b?c#d", "thé"]),
            "http://127.0.0.1:7700/v1/kbs/a%2Fb%3Fc%23d/th%C3%A9"
        );
    }
}
