//! The accept loop of both HTTP servers (the public API and the internal port).
//!
//! `axum::serve` sets no header-read timeout and no cap on connections, so idle or slow
//! sockets pile up until the process runs out of file descriptors and every request fails
//! (issue 14: about 1,020 idle sockets from one client took `/healthz` down). Here every
//! connection:
//! - counts against [`ConnectionLimits::max_connections`] and, per client IP address, against
//!   [`ConnectionLimits::max_connections_per_ip`]; one over a cap is closed at once;
//! - must send its first byte, and then each request's headers, within
//!   [`ConnectionLimits::header_read_timeout`] (hyper's HTTP/1 header timer also covers the
//!   wait for the next request on a kept-alive connection);
//! - has `TCP_NODELAY` set (Nagle's algorithm delays small HTTP/2 frames by up to 40 ms).
//!
//! HTTP/1 and HTTP/2 are both served (hyper-util's auto builder), with upgrades; a shutdown
//! signal stops accepting and lets open connections finish their requests. With a
//! [`ServerTls`], every connection is TLS (the handshake must finish within the header-read
//! timeout too; a failed one is counted in `sift_tls_handshake_failures_total`).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::tls::ServerTls;

/// Bounds on the connections one server holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at once, all clients together.
    pub max_connections: usize,
    /// Open connections at once from one IP address.
    pub max_connections_per_ip: usize,
    /// Longest wait for a connection's first byte, and for each request's headers.
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            max_connections_per_ip: 512,
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// Open connections by client address; a [`Slot`] gives its place back when dropped.
#[derive(Default)]
struct Occupancy {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

struct Slot {
    occupancy: Arc<Mutex<Occupancy>>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut occupancy = self.occupancy.lock().unwrap_or_else(|p| p.into_inner());
        occupancy.total -= 1;
        if let Some(count) = occupancy.by_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                occupancy.by_ip.remove(&self.ip);
            }
        }
    }
}

/// Takes a slot for a connection from `ip`, or says which cap is full.
fn take_slot(
    occupancy: &Arc<Mutex<Occupancy>>,
    limits: &ConnectionLimits,
    ip: IpAddr,
) -> Result<Slot, &'static str> {
    let mut guard = occupancy.lock().unwrap_or_else(|p| p.into_inner());
    if guard.total >= limits.max_connections {
        return Err("max_connections");
    }
    let from_ip = guard.by_ip.get(&ip).copied().unwrap_or(0);
    if from_ip >= limits.max_connections_per_ip {
        return Err("max_connections_per_ip");
    }
    guard.total += 1;
    *guard.by_ip.entry(ip).or_default() += 1;
    Ok(Slot {
        occupancy: occupancy.clone(),
        ip,
    })
}

/// Longest request target (path and query) a handler sees; longer: 414 `uri_too_long`.
pub const MAX_URI_BYTES: usize = 16 * 1024;
/// Most bytes of header names and values a handler sees; more: 431 `headers_too_large`.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The HTTP/2 header list a connection accepts: above both limits of [`refuse_oversized_heads`].
const H2_MAX_HEADER_LIST_BYTES: u32 = 2 * (MAX_URI_BYTES + MAX_HEADER_BYTES) as u32;

/// Middleware of both listeners: answers an over-long request target or header block with the
/// JSON error shape (`{"error": {"code", "message"}}`) before routing. Past the HTTP parser's
/// own bounds (a target over 64 KiB, headers over its ~400 KiB read buffer) and for requests
/// that are not HTTP, no handler runs: hyper answers 414, 431 or 400 itself, without a body.
pub async fn refuse_oversized_heads(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let refuse = |status: StatusCode, code: &str, message: String| {
        let body = serde_json::json!({ "error": {
            "code": code,
            "message": message,
            "type": "invalid_request_error",
            "param": null,
        } });
        (status, axum::Json(body)).into_response()
    };
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |target| target.as_str().len());
    if target > MAX_URI_BYTES {
        return refuse(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!("the request target is {target} bytes; at most {MAX_URI_BYTES}"),
        );
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers > MAX_HEADER_BYTES {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request headers are {headers} bytes; at most {MAX_HEADER_BYTES}"),
        );
    }
    next.run(request).await
}

/// Serves `app` on `listener` within `limits` (over TLS with `tls`) until `shutdown`
/// completes, then waits for the open connections to finish (each is told to close after its
/// current request).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    server: &'static str,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let occupancy = Arc::new(Mutex::new(Occupancy::default()));
    // Dropping `stop` tells connections to shut down; each holds a `tracked` receiver, so
    // `tracker.closed()` returns once the last one is gone.
    let (stop, stopped) = watch::channel(());
    let (tracker, tracked) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors (EMFILE) and the like: back off, keep serving.
                    warn!(server, %error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match take_slot(&occupancy, &limits, peer.ip()) {
            Ok(slot) => slot,
            Err(cap) => {
                metrics::counter!("sift_http_connections_refused_total", "server" => server, "cap" => cap)
                    .increment(1);
                debug!(server, %peer, cap, "connection refused: at the cap");
                drop(stream);
                continue;
            }
        };
        let connection = Connection {
            stream,
            peer,
            app: app.clone(),
            limits,
            tls: tls.clone(),
            stopped: stopped.clone(),
            _tracked: tracked.clone(),
            _slot: slot,
        };
        tokio::spawn(connection.run(server));
    }
    drop(listener);
    drop(stop);
    drop(tracked);
    tracker.closed().await;
}

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<ServerTls>,
    stopped: watch::Receiver<()>,
    _tracked: watch::Receiver<()>,
    _slot: Slot,
}

impl Connection {
    async fn run(self, server: &'static str) {
        if let Err(error) = self.stream.set_nodelay(true) {
            debug!(%error, "could not set TCP_NODELAY");
        }
        // The HTTP/1-or-2 detection reads the first bytes with no timer of its own.
        let mut first = [0u8; 1];
        let wait = self.limits.header_read_timeout;
        match tokio::time::timeout(wait, self.stream.peek(&mut first)).await {
            Ok(Ok(read)) if read > 0 => {}
            Ok(_) => return, // closed by the client, or broken
            Err(_) => {
                metrics::counter!("sift_http_connections_timed_out_total", "server" => server)
                    .increment(1);
                debug!(server, peer = %self.peer, "connection closed: nothing sent");
                return;
            }
        }
        let serving = Serving {
            peer: self.peer,
            app: self.app,
            limits: self.limits,
            stopped: self.stopped,
            server,
        };
        let Some(tls) = &self.tls else {
            serving.run(self.stream).await;
            return;
        };
        match tokio::time::timeout(wait, tls.acceptor().accept(self.stream)).await {
            Ok(Ok(stream)) => serving.run(stream).await,
            Ok(Err(error)) => {
                metrics::counter!("sift_tls_handshake_failures_total", "server" => server)
                    .increment(1);
                debug!(server, peer = %self.peer, %error, "TLS handshake failed");
            }
            Err(_) => {
                metrics::counter!("sift_http_connections_timed_out_total", "server" => server)
                    .increment(1);
                debug!(server, peer = %self.peer, "connection closed: TLS handshake too slow");
            }
        }
    }
}

/// What serving HTTP on one connection needs, whatever the stream under it.
struct Serving {
    peer: SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    stopped: watch::Receiver<()>,
    server: &'static str,
}

impl Serving {
    /// Serves HTTP on one connection (plain or TLS) until it ends or `stopped` fires.
    async fn run<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Serving {
            peer,
            app,
            limits,
            mut stopped,
            server,
        } = self;
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            // hyper's HTTP/2 default (16 KiB, the path included) would answer a bodyless 431
            // before `refuse_oversized_heads` sees the request; this leaves room for its
            // limits, as HTTP/1's larger parser bounds do.
            .max_header_list_size(H2_MAX_HEADER_LIST_BYTES)
            .enable_connect_protocol();
        // Handlers see the client's address as `ConnectInfo` (the audit log records it).
        let app = tower::ServiceExt::map_request(
            app,
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                request
            },
        );
        let service = TowerToHyperService::new(app);
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    debug!(server, %peer, %error, "connection ended with an error");
                }
                return;
            }
            _ = stopped.changed() => {}
        }
        connection.as_mut().graceful_shutdown();
        if let Err(error) = connection.await {
            debug!(server, %peer, %error, "connection ended with an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: ConnectionLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, app, limits, "test", None, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// One HTTP/1.1 request on a fresh connection; the status line, or None if refused.
    async fn get(addr: SocketAddr) -> Option<String> {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        response.lines().next().map(str::to_string)
    }

    /// Reads until the server closes the connection; true if it did within `wait`.
    async fn closed_by_server(stream: &mut TcpStream, wait: Duration) -> bool {
        let mut buffer = [0u8; 256];
        loop {
            match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    #[tokio::test]
    async fn connections_over_the_per_address_cap_are_closed_and_others_still_served() {
        let limits = ConnectionLimits {
            max_connections: 1000,
            max_connections_per_ip: 8,
            header_read_timeout: Duration::from_secs(60),
        };
        let (addr, _stop) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..8 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"G").await.unwrap(); // a request that never finishes
            idle.push(stream);
        }
        // The ninth from the same address is closed without an answer.
        let mut ninth = TcpStream::connect(addr).await.unwrap();
        assert!(closed_by_server(&mut ninth, Duration::from_secs(10)).await);
        // Once one idle socket goes, a new connection is served again.
        drop(idle.pop());
        let mut served = None;
        for _ in 0..100 {
            served = get(addr).await;
            if served.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(served.as_deref(), Some("HTTP/1.1 200 OK"));
    }

    #[tokio::test]
    async fn the_total_cap_holds_across_addresses() {
        let limits = ConnectionLimits {
            max_connections: 4,
            max_connections_per_ip: 100,
            header_read_timeout: Duration::from_secs(60),
        };
        let (addr, _stop) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..4 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"G").await.unwrap();
            idle.push(stream);
        }
        let mut fifth = TcpStream::connect(addr).await.unwrap();
        assert!(closed_by_server(&mut fifth, Duration::from_secs(10)).await);
    }

    #[tokio::test]
    async fn silent_and_slow_header_sockets_are_closed_after_the_timeout() {
        let limits = ConnectionLimits {
            max_connections: 100,
            max_connections_per_ip: 100,
            header_read_timeout: Duration::from_millis(300),
        };
        let (addr, _stop) = start(limits).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nhost")
            .await
            .unwrap();
        assert!(closed_by_server(&mut silent, Duration::from_secs(20)).await);
        assert!(closed_by_server(&mut slow, Duration::from_secs(20)).await);
        // A kept-alive connection that goes quiet after a request is closed too.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_by_server(&mut kept, Duration::from_secs(20)).await);
        assert_eq!(get(addr).await.as_deref(), Some("HTTP/1.1 200 OK"));
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_returns() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            Router::new().route("/healthz", axum::routing::get(|| async { "ok" })),
            ConnectionLimits::default(),
            "test",
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        assert_eq!(get(addr).await.as_deref(), Some("HTTP/1.1 200 OK"));
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .expect("the server returns after shutdown")
            .unwrap();
        assert_eq!(get(addr).await, None, "nothing listens any more");
    }

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tls")
            .join(name)
    }

    #[tokio::test]
    async fn a_tls_server_speaks_http1_and_http2_to_a_client_trusting_its_ca_only() {
        let files = crate::tls::TlsFiles {
            cert: fixture("node-a.crt"),
            key: fixture("node-a.key"),
            ca: Some(fixture("ca.crt")),
        };
        let tls = ServerTls::load(&files).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            app,
            ConnectionLimits::default(),
            "test",
            Some(tls),
            async move {
                let _ = stopped.await;
            },
        ));
        let peer = crate::tls::PeerTls::from_files(&files).unwrap();
        let url = peer.url(&addr.to_string(), "/healthz");
        assert!(url.starts_with("https://"));
        // ALPN picks h2 when the client offers it, HTTP/1.1 when that is all it speaks.
        for http2 in [false, true] {
            let mut builder = peer.client_builder();
            builder = if http2 {
                builder.http2_prior_knowledge()
            } else {
                builder.http1_only()
            };
            let response = builder.build().unwrap().get(&url).send().await.unwrap();
            let expected = if http2 {
                reqwest::Version::HTTP_2
            } else {
                reqwest::Version::HTTP_11
            };
            assert_eq!(response.version(), expected);
            assert_eq!(response.text().await.unwrap(), "ok");
        }
        // A client that does not trust the CA is refused by its own check; plain HTTP to
        // the TLS port gets no HTTP answer.
        let rogue = crate::tls::PeerTls::from_files(&crate::tls::TlsFiles {
            ca: Some(fixture("rogue.crt")),
            ..files.clone()
        })
        .unwrap();
        let refused = rogue
            .client_builder()
            .build()
            .unwrap()
            .get(&url)
            .send()
            .await;
        assert!(refused.is_err());
        let plain = get(addr).await;
        assert!(
            !plain
                .as_deref()
                .is_some_and(|line| line.starts_with("HTTP/")),
            "{plain:?}"
        );
        // The server still serves after both.
        let again = peer
            .client_builder()
            .build()
            .unwrap()
            .get(&url)
            .send()
            .await;
        assert_eq!(again.unwrap().status(), 200);
    }
}
