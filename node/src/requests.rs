//! What every public request gets around its handler: a request id, a span that carries it
//! into every log line of the handler and is the request's span in its trace (a caller's
//! `traceparent` its parent), an access log line, and CORS headers for the configured origins.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{self, HeaderName};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::Instrument;

/// The header a client may send to name its request, echoed on every answer.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id accepted from a client; a longer one (or one with anything but
/// visible ASCII) is replaced by a generated id.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// The id of the request being served, in the request's extensions.
#[derive(Clone, Debug)]
pub struct RequestId(pub HeaderValue);

impl RequestId {
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

/// The client's `x-request-id` when it is 1..=128 bytes of visible ASCII, else a new UUIDv7
/// (time-ordered, so ids sort by arrival in logs).
fn request_id(request: &Request) -> HeaderValue {
    request
        .headers()
        .get(&REQUEST_ID)
        .filter(|value| {
            let bytes = value.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= MAX_REQUEST_ID_BYTES
                && bytes.iter().all(u8::is_ascii_graphic)
        })
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::now_v7().simple().to_string())
                .expect("a UUID is a header value")
        })
}

/// Outermost layer of the public router: gives the request its id (kept in its extensions
/// and echoed in the `x-request-id` answer header), runs the rest inside a `request` span
/// (`id`, `method`, and `route` once routing matched), and logs one access line per request
/// when its answer's body has been sent or dropped.
pub async fn track(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let span = tracing::info_span!(
        "request",
        otel.kind = "server",
        otel.name = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        id = id.to_str().unwrap_or_default(),
        method = %method,
        route = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    // A caller's `traceparent` makes this request part of its trace (ignored when malformed).
    sift_actors::trace_context::adopt(&span, request.headers());
    let mut response = next.run(request).instrument(span.clone()).await;
    let route = crate::telemetry::route_of(&response);
    span.record("otel.name", format!("{method} {route}"));
    span.record("status", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
    response.headers_mut().insert(REQUEST_ID, id.clone());
    let entry = AccessEntry {
        span,
        method,
        route,
        path,
        status: response.status().as_u16(),
        started,
        head: started.elapsed(),
    };
    response.map(|body| {
        Body::new(Logged {
            inner: body,
            bytes: 0,
            ended: false,
            entry: Some(entry),
        })
    })
}

/// One request's access log line, written when its body is done.
struct AccessEntry {
    span: tracing::Span,
    method: Method,
    route: String,
    path: String,
    status: u16,
    started: Instant,
    /// Until the answer's head was ready.
    head: Duration,
}

impl AccessEntry {
    /// Probes and scrapes at debug (they come every few seconds), everything else at info.
    /// Never the query string, the headers or the body: no keys and no content.
    fn log(self, bytes: u64, complete: bool) {
        let _entered = self.span.enter();
        let duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let head_ms = self.head.as_secs_f64() * 1000.0;
        let probe = matches!(self.route.as_str(), "/healthz" | "/readyz" | "/metrics");
        if probe {
            tracing::debug!(
                target: "sift::access",
                method = %self.method, route = %self.route, path = %self.path,
                status = self.status, duration_ms, head_ms, bytes, complete,
                "request"
            );
        } else {
            tracing::info!(
                target: "sift::access",
                method = %self.method, route = %self.route, path = %self.path,
                status = self.status, duration_ms, head_ms, bytes, complete,
                "request"
            );
        }
    }
}

/// An answer body that counts the bytes it yields and writes the access line when it is
/// dropped: after its end, or early when the client went away (`complete=false`). A
/// streamed answer (SSE) is thus logged with its whole duration.
struct Logged {
    inner: Body,
    bytes: u64,
    ended: bool,
    entry: Option<AccessEntry>,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => this.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            let complete = self.ended || http_body::Body::is_end_stream(&self.inner);
            entry.log(self.bytes, complete);
        }
    }
}

/// The origins whose browser pages may call the public API (`cors_origins`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum CorsOrigins {
    /// No CORS headers at all: browsers refuse cross-origin calls (the default).
    #[default]
    None,
    /// `*`: any origin (without credentials, which browsers never send to `*`).
    Any,
    /// Exactly these origins (`scheme://host[:port]`).
    List(Vec<HeaderValue>),
}

/// The most origins `cors_origins` may list.
pub const MAX_CORS_ORIGINS: usize = 100;

impl CorsOrigins {
    /// Checks each entry: `*` alone, or an `http`/`https` origin with no path, query or
    /// trailing slash (browsers send `Origin: https://app.example.com` exactly so).
    pub fn parse(entries: &[String]) -> Result<CorsOrigins, String> {
        if entries.is_empty() {
            return Ok(CorsOrigins::None);
        }
        if entries.iter().any(|entry| entry == "*") {
            if entries.len() > 1 {
                return Err("\"*\" allows every origin and cannot be listed with others".into());
            }
            return Ok(CorsOrigins::Any);
        }
        if entries.len() > MAX_CORS_ORIGINS {
            return Err(format!(
                "at most {MAX_CORS_ORIGINS} origins, not {}",
                entries.len()
            ));
        }
        let mut origins = Vec::with_capacity(entries.len());
        for entry in entries {
            let rest = entry
                .strip_prefix("https://")
                .or_else(|| entry.strip_prefix("http://"));
            let Some(authority) = rest else {
                return Err(format!(
                    "{entry:?} is not an origin: it must start with http:// or https://"
                ));
            };
            if authority.is_empty()
                || authority.contains(['/', '?', '#', ' ', '@'])
                || !authority.is_ascii()
            {
                return Err(format!(
                    "{entry:?} is not an origin: scheme://host[:port], with no path and no trailing slash"
                ));
            }
            let value = HeaderValue::from_str(entry)
                .map_err(|_| format!("{entry:?} is not a valid header value"))?;
            origins.push(value);
        }
        Ok(CorsOrigins::List(origins))
    }

    /// The CORS layer for these origins, `None` when CORS is off. Preflights are answered
    /// by the layer itself (no key needed); the methods and headers are those of the API;
    /// `x-request-id` and `retry-after` are readable by the page.
    pub fn layer(&self) -> Option<CorsLayer> {
        let allow = match self {
            CorsOrigins::None => return None,
            CorsOrigins::Any => AllowOrigin::any(),
            CorsOrigins::List(origins) => AllowOrigin::list(origins.iter().cloned()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods([
                    Method::GET,
                    Method::POST,
                    Method::PUT,
                    Method::PATCH,
                    Method::DELETE,
                ])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    header::ACCEPT,
                    HeaderName::from_static("last-event-id"),
                    REQUEST_ID,
                    HeaderName::from_static("traceparent"),
                ])
                .expose_headers([REQUEST_ID, header::RETRY_AFTER])
                .max_age(Duration::from_secs(600)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|entry| entry.to_string()).collect()
    }

    #[test]
    fn cors_origins_are_checked() {
        assert_eq!(CorsOrigins::parse(&[]), Ok(CorsOrigins::None));
        assert_eq!(CorsOrigins::parse(&strings(&["*"])), Ok(CorsOrigins::Any));
        assert_eq!(
            CorsOrigins::parse(&strings(&[
                "https://app.example.com",
                "http://127.0.0.1:3000"
            ])),
            Ok(CorsOrigins::List(vec![
                HeaderValue::from_static("https://app.example.com"),
                HeaderValue::from_static("http://127.0.0.1:3000"),
            ]))
        );
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://app.example.com/path",
            "ftp://app.example.com",
            "https://",
            "https://user@app.example.com",
        ] {
            let error = CorsOrigins::parse(&strings(&[bad])).unwrap_err();
            assert!(error.contains(bad), "{bad}: {error}");
        }
        assert!(CorsOrigins::parse(&strings(&["*", "https://a.example"])).is_err());
        let many: Vec<String> = (0..=MAX_CORS_ORIGINS)
            .map(|i| format!("https://{i}.example"))
            .collect();
        assert!(CorsOrigins::parse(&many).unwrap_err().contains("at most"));
    }

    #[test]
    fn a_request_id_is_kept_only_when_short_and_visible() {
        let with = |value: &[u8]| {
            let mut request = Request::new(Body::empty());
            request
                .headers_mut()
                .insert(&REQUEST_ID, HeaderValue::from_bytes(value).unwrap());
            request_id(&request)
        };
        assert_eq!(with(b"abc-123"), "abc-123");
        let long = [b'a'; MAX_REQUEST_ID_BYTES + 1];
        for bad in [&long[..], b"has space", b"tab\there", &[0xC3, 0xA9][..]] {
            let generated = with(bad);
            assert_ne!(generated.as_bytes(), bad);
            assert_eq!(generated.len(), 32, "a simple UUID: {generated:?}");
        }
        let fresh = request_id(&Request::new(Body::empty()));
        assert_eq!(fresh.len(), 32);
        assert_ne!(fresh, request_id(&Request::new(Body::empty())));
    }
}
