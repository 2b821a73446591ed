//! Documents by URL (`POST /v1/kbs/{kb}/documents` with `{"urls": [...]}`): each URL is
//! fetched into the upload directory behind an SSRF guard, its type sniffed from its bytes,
//! and the file handed to the same checks as an upload.
//!
//! The guard ([`AddressGuard`]): the node connects only to public unicast addresses, never
//! to loopback, private, shared (CGNAT), link-local (cloud metadata at 169.254.169.254
//! included), multicast, unspecified, reserved, benchmarking or documentation ranges, in IPv4
//! or IPv6 (IPv4-mapped, NAT64, 6to4 and Teredo addresses are judged by the IPv4 address
//! inside), unless an operator allow-lists a range (`url_fetch_allow`). Host names are
//! resolved by the guard's own resolver ([`GuardedResolver`]), which drops refused addresses;
//! reqwest connects to what it returned, so the connection is pinned to a checked address and
//! no second lookup can rebind it. A literal IP in a URL is checked before any request.
//! Redirects are followed here, one hop at a time, each checked like the first URL. No proxy is
//! used: a proxy would connect on our behalf to an address the guard never saw.
//!
//! The connect seam ([`ConnectGuard`]): every address the fetcher is about to connect to
//! passes it last, after the SSRF guard: the addresses the resolver hands reqwest, and a
//! literal address right before its request (reqwest connects to a literal without asking
//! the resolver); the peer of every answer is checked again after the fact. In production it
//! admits everything the guard admitted. With `url_fetch_loopback_only` (a test setting) it
//! admits only loopback (127.0.0.0/8, ::1), never asks the system resolver (a name outside
//! `url_fetch_hosts` fails), and counts every refusal in
//! `sift_url_fetch_outside_loopback_total`, failing the fetch with `outside_loopback`: the tests
//! assert that neither is ever seen, so a test that would reach past this machine fails instead.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use axum::http::StatusCode;
use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use sha2::{Digest, Sha256};
use sift_actors::ingest::image;
use sift_actors::ingest::parse::SourceFormat;
use tokio::io::AsyncWriteExt;

use crate::api::ApiError;

/// The fetch settings (`url_fetch_*` in the config).
#[derive(Clone, Debug)]
pub struct FetchSettings {
    /// Ranges the guard lets through although they are not public (`url_fetch_allow`).
    pub allow: Vec<IpNet>,
    /// Names answered before DNS, like `/etc/hosts` (`url_fetch_hosts`); their addresses are
    /// checked like any other.
    pub hosts: BTreeMap<String, IpAddr>,
    /// Longest one fetch may take, redirects and body included (`url_fetch_timeout_ms`).
    pub timeout: Duration,
    /// Redirects followed before the fetch fails (`url_fetch_max_redirects`).
    pub max_redirects: usize,
    /// Tests only (`url_fetch_loopback_only`): connect to loopback and nothing else, resolve
    /// names from `hosts` alone (see [`ConnectGuard`]).
    pub loopback_only: bool,
}

impl Default for FetchSettings {
    fn default() -> Self {
        FetchSettings {
            allow: Vec::new(),
            hosts: BTreeMap::new(),
            timeout: Duration::from_secs(30),
            max_redirects: 5,
            loopback_only: false,
        }
    }
}

/// Longest a connection may take to open, within the fetch's own timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most URLs one request may name: each is fetched before the answer.
pub const MAX_URLS_PER_REQUEST: usize = 20;

/// URLs fetched at once for one request.
pub const FETCH_CONCURRENCY: usize = 4;

/// Longest URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// Decides which addresses the node may connect to.
#[derive(Clone, Debug, Default)]
pub struct AddressGuard {
    allow: Vec<IpNet>,
}

impl AddressGuard {
    pub fn new(allow: Vec<IpNet>) -> AddressGuard {
        AddressGuard { allow }
    }

    /// Why `ip` may not be fetched from, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        if self.allow.iter().any(|net| net.contains(&ip)) {
            return None;
        }
        match ip {
            IpAddr::V4(v4) => v4_refusal(v4),
            IpAddr::V6(v6) => v6_refusal(v6),
        }
    }
}

fn v4_refusal(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_private() {
        Some("a private address")
    } else if ip.is_link_local() {
        Some("a link-local address (cloud metadata lives there)")
    } else if ip.is_multicast() || ip.is_broadcast() {
        Some("a multicast or broadcast address")
    } else if ip.is_unspecified() || a == 0 {
        Some("an unspecified address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a shared (carrier-grade NAT) address")
    } else if a == 192 && b == 0 && c == 0 {
        Some("an IETF protocol assignment address")
    } else if a == 198 && (18..20).contains(&b) {
        Some("a benchmarking address")
    } else if ip.is_documentation() {
        Some("a documentation address")
    } else if a >= 240 {
        Some("a reserved address")
    } else {
        None
    }
}

fn v6_refusal(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_refusal(v4);
    }
    let segments = ip.segments();
    let bits = u128::from(ip);
    // The IPv4 address in the 32 bits that start `shift` bits from the right.
    let embedded = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    // Addresses that carry an IPv4 address are judged by it, since a relay or translator on
    // the path would deliver them there; refused outright where it cannot be found.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64, well-known prefix (64:ff9b::/96): the IPv4 address in the last 32 bits.
        return v4_refusal(embedded(0));
    }
    if segments[0] == 0x64 && segments[1] == 0xff9b && segments[2] == 1 {
        // NAT64, local-use prefix (64:ff9b:1::/48): where the IPv4 address sits depends on
        // the operator's prefix length, so it cannot be judged.
        return Some("a local NAT64 address");
    }
    if segments[0] == 0x2002 {
        // 6to4 (2002::/16): the relay's IPv4 address in bits 16..48.
        return v4_refusal(embedded(80));
    }
    if segments[0] == 0x2001 && segments[1] == 0 {
        // Teredo (2001::/32): the client's IPv4 address, inverted, in the last 32 bits; the
        // server's in bits 32..64.
        let client = Ipv4Addr::from(!((bits & 0xffff_ffff) as u32));
        return v4_refusal(client).or_else(|| v4_refusal(embedded(64)));
    }
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip.is_unique_local() {
        Some("a private (unique local) address")
    } else if ip.is_unicast_link_local() {
        Some("a link-local address")
    } else if segments[0] & 0xffc0 == 0xfec0 {
        Some("a site-local address (deprecated, private)")
    } else if segments[0] == 0x2001 && segments[1] == 0x0db8 {
        Some("a documentation address")
    } else if segments[..3] == [0x2001, 2, 0] {
        Some("a benchmarking address")
    } else if segments[..4] == [0x100, 0, 0, 0] {
        Some("a discard-only address")
    } else if segments[..5] == [0, 0, 0, 0, 0] {
        // IPv4-compatible (::a.b.c.d, deprecated) and the rest of ::/80: refused whatever the
        // IPv4 address, nothing routes them any more
        Some("a reserved address")
    } else {
        None
    }
}

/// A host name resolved to nothing the guard lets through.
#[derive(Debug, thiserror::Error)]
#[error("{host} resolves to {address}, {why}")]
struct RefusedAddress {
    host: String,
    address: IpAddr,
    why: &'static str,
}

/// The connect seam: the last check of an address before the fetcher connects to it, after
/// the SSRF guard ([`AddressGuard`]) admitted it. It admits everything unless
/// `loopback_only` is set (`url_fetch_loopback_only`, for tests), when it admits only
/// loopback addresses and no lookup outside `url_fetch_hosts`; each refusal is logged as an
/// error, counted in `sift_url_fetch_outside_loopback_total` (by `kind`: `connect`,
/// `lookup`) and fails the fetch with `outside_loopback`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnectGuard {
    loopback_only: bool,
}

impl ConnectGuard {
    pub fn new(loopback_only: bool) -> ConnectGuard {
        if loopback_only {
            // Registered at 0, so a test reading `/metrics` sees the seam is there.
            metrics::counter!("sift_url_fetch_outside_loopback_total", "kind" => "connect")
                .increment(0);
            metrics::counter!("sift_url_fetch_outside_loopback_total", "kind" => "lookup")
                .increment(0);
        }
        ConnectGuard { loopback_only }
    }

    /// Whether the fetcher may connect to `address`; a refusal is recorded.
    pub fn admit(&self, address: SocketAddr) -> Result<(), OutsideLoopback> {
        if !self.loopback_only || address.ip().to_canonical().is_loopback() {
            return Ok(());
        }
        Err(OutsideLoopback::record(
            "connect",
            format!("a connection to {address}"),
        ))
    }

    /// Whether the system resolver may be asked for `host` (never in loopback-only mode).
    fn admit_lookup(&self, host: &str) -> Result<(), OutsideLoopback> {
        if !self.loopback_only {
            return Ok(());
        }
        Err(OutsideLoopback::record(
            "lookup",
            format!("a DNS lookup of {host} (a name outside url_fetch_hosts)"),
        ))
    }
}

/// What [`ConnectGuard`] refused in loopback-only mode.
#[derive(Debug, thiserror::Error)]
#[error("{what}: url_fetch_loopback_only (a test setting) admits only loopback")]
pub struct OutsideLoopback {
    what: String,
}

impl OutsideLoopback {
    fn record(kind: &'static str, what: String) -> OutsideLoopback {
        metrics::counter!("sift_url_fetch_outside_loopback_total", "kind" => kind).increment(1);
        tracing::error!(kind, %what, "url fetch tried to leave loopback (url_fetch_loopback_only)");
        OutsideLoopback { what }
    }
}

/// Resolves host names through `url_fetch_hosts`, then the system resolver, and returns only
/// the addresses the guard lets through (an error naming the first refused one when none is),
/// each passed through the connect seam.
pub struct GuardedResolver {
    guard: AddressGuard,
    connect: ConnectGuard,
    hosts: BTreeMap<String, IpAddr>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let guard = self.guard.clone();
        let connect = self.connect;
        let fixed = self.hosts.get(&host).copied();
        Box::pin(async move {
            let addresses: Vec<IpAddr> = match fixed {
                Some(ip) => vec![ip],
                None => {
                    connect.admit_lookup(&host)?;
                    tokio::net::lookup_host((host.as_str(), 0))
                        .await?
                        .map(|address| address.ip())
                        .collect()
                }
            };
            let mut refused = None;
            let mut allowed = Vec::new();
            for address in addresses {
                match guard.refusal(address) {
                    None => allowed.push(SocketAddr::new(address, 0)),
                    Some(why) => {
                        refused.get_or_insert((address, why));
                    }
                }
            }
            if allowed.is_empty() {
                if let Some((address, why)) = refused {
                    return Err(Box::new(RefusedAddress { host, address, why })
                        as Box<dyn std::error::Error + Send + Sync>);
                }
                return Err(format!("{host} has no address").into());
            }
            // reqwest connects to exactly these: the connect seam sees each one first.
            for address in &allowed {
                connect.admit(*address)?;
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// A fetched URL, in the upload directory, ready for the upload checks.
#[derive(Debug)]
pub struct Fetched {
    /// The URL as the request named it (after parsing).
    pub url: String,
    /// Where the last redirect led.
    pub final_url: String,
    pub temp_path: PathBuf,
    /// A file name for the document: the final URL's last path segment, else its host.
    pub file_name: String,
    pub media_type: Option<String>,
    /// The format the bytes are in, sniffed (magic bytes first, then the media type, then the
    /// file name).
    pub format: SourceFormat,
    pub size_bytes: u64,
    pub content_hash: String,
}

/// Fetches URLs behind the guard.
pub struct UrlFetcher {
    client: reqwest::Client,
    guard: AddressGuard,
    connect: ConnectGuard,
    settings: FetchSettings,
}

impl UrlFetcher {
    pub fn new(settings: FetchSettings) -> anyhow::Result<UrlFetcher> {
        let guard = AddressGuard::new(settings.allow.clone());
        let connect = ConnectGuard::new(settings.loopback_only);
        if settings.loopback_only {
            tracing::info!(
                "url fetches reach only loopback (url_fetch_loopback_only, a test setting)"
            );
        }
        let client = reqwest::Client::builder()
            .dns_resolver(GuardedResolver {
                guard: guard.clone(),
                connect,
                hosts: settings.hosts.clone(),
            })
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT.min(settings.timeout))
            .user_agent(concat!(
                "sift/",
                env!("CARGO_PKG_VERSION"),
                " (document import)"
            ))
            .build()?;
        Ok(UrlFetcher {
            client,
            guard,
            connect,
            settings,
        })
    }

    /// Checks a URL's syntax, scheme and (when literal) address, before any connection.
    pub fn check_url(&self, raw: &str) -> Result<Url, ApiError> {
        if raw.len() > MAX_URL_BYTES {
            return Err(invalid_url(format!(
                "a URL of {} bytes; the limit is {MAX_URL_BYTES}",
                raw.len()
            )));
        }
        let url = Url::parse(raw.trim())
            .map_err(|error| invalid_url(format!("{}: {error}", shorten(raw))))?;
        self.check_parsed(&url)?;
        Ok(url)
    }

    fn check_parsed(&self, url: &Url) -> Result<(), ApiError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid_url(format!(
                "{}: only http and https URLs are fetched, not {}:",
                shorten(url.as_str()),
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid_url(format!(
                "{}: URLs with credentials are not fetched",
                shorten(url.as_str())
            )));
        }
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => None,
            None => return Err(invalid_url(format!("{}: no host", shorten(url.as_str())))),
        };
        if let Some(ip) = literal
            && let Some(why) = self.guard.refusal(ip)
        {
            return Err(forbidden(url, &format!("{ip} is {why}")));
        }
        Ok(())
    }

    /// The connect seam for a URL whose host is a literal address, which reqwest connects to
    /// without asking the resolver; called right before each request.
    fn admit_literal(&self, url: &Url) -> Result<(), ApiError> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()), // a name: the resolver passes its addresses through the seam
        };
        let port = url.port_or_known_default().unwrap_or(80);
        self.connect
            .admit(SocketAddr::new(ip, port))
            .map_err(|refused| outside_loopback(url, &refused))
    }

    /// Fetches `url` into `temp_dir`, following redirects, within the timeout and
    /// `max_bytes`. The file is removed again on any error.
    pub async fn fetch(
        &self,
        url: Url,
        temp_dir: &std::path::Path,
        max_bytes: u64,
    ) -> Result<Fetched, ApiError> {
        let path = temp_dir.join(uuid::Uuid::new_v4().to_string());
        let outcome = tokio::time::timeout(
            self.settings.timeout,
            self.fetch_to(url.clone(), &path, max_bytes),
        )
        .await
        .unwrap_or_else(|_| {
            Err(fetch_failed(
                &url,
                &format!(
                    "no complete answer within {} ms (url_fetch_timeout_ms)",
                    self.settings.timeout.as_millis()
                ),
            ))
        });
        if outcome.is_err() {
            let _ = tokio::fs::remove_file(&path).await;
        }
        outcome
    }

    async fn fetch_to(
        &self,
        requested: Url,
        path: &std::path::Path,
        max_bytes: u64,
    ) -> Result<Fetched, ApiError> {
        let mut url = requested.clone();
        let mut seen = vec![url.clone()];
        let mut response = loop {
            self.admit_literal(&url)?;
            let response = self
                .client
                .get(url.clone())
                .header(
                    reqwest::header::ACCEPT,
                    "text/html,application/xhtml+xml,application/pdf;q=0.9,*/*;q=0.8",
                )
                .send()
                .await
                .map_err(|error| request_error(&url, &error))?;
            // After the fact: the peer reqwest reached must be one the seam admitted.
            if let Some(peer) = response.remote_addr() {
                self.connect
                    .admit(peer)
                    .map_err(|refused| outside_loopback(&url, &refused))?;
            }
            if !response.status().is_redirection() {
                break response;
            }
            let Some(location) = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
            else {
                break response; // a 3xx with no Location (304, 300): judged below
            };
            let next = url.join(location).map_err(|error| {
                fetch_failed(
                    &url,
                    &format!("a redirect to an unusable Location: {error}"),
                )
            })?;
            if seen.contains(&next) {
                return Err(fetch_failed(&requested, "a redirect loop"));
            }
            if seen.len() > self.settings.max_redirects {
                return Err(fetch_failed(
                    &requested,
                    &format!(
                        "more than {} redirects (url_fetch_max_redirects)",
                        self.settings.max_redirects
                    ),
                ));
            }
            self.check_parsed(&next)?;
            seen.push(next.clone());
            url = next;
        };
        let status = response.status();
        if !status.is_success() {
            return Err(fetch_failed(&url, &format!("the server answered {status}")));
        }
        if let Some(length) = response.content_length()
            && length > max_bytes
        {
            return Err(too_large(&url, max_bytes));
        }
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| {
                value
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .filter(|value| !value.is_empty());
        let mut out = tokio::fs::File::create(path)
            .await
            .map_err(|error| storage_error(&error))?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut head = Vec::with_capacity(1024);
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| request_error(&url, &error))?
        {
            size += chunk.len() as u64;
            if size > max_bytes {
                return Err(too_large(&url, max_bytes));
            }
            if head.len() < 1024 {
                let take = (1024 - head.len()).min(chunk.len());
                head.extend_from_slice(&chunk[..take]);
            }
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|error| storage_error(&error))?;
        }
        out.sync_all()
            .await
            .map_err(|error| storage_error(&error))?;
        if size == 0 {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "empty_document",
                format!("{}: the server sent no content", shorten(url.as_str())),
            ));
        }
        let file_name = file_name_of(&url);
        let format = sniff(&head, media_type.as_deref(), &file_name).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_type",
                format!(
                    "{}: the content is not in a format Sift reads (the server called it {})",
                    shorten(url.as_str()),
                    media_type.as_deref().unwrap_or("nothing")
                ),
            )
        })?;
        Ok(Fetched {
            url: requested.to_string(),
            final_url: url.to_string(),
            temp_path: path.to_path_buf(),
            file_name,
            media_type,
            format,
            size_bytes: size,
            content_hash: hex::encode(hasher.finalize()),
        })
    }
}

/// The format of fetched bytes: magic bytes first (a PDF, an image, a zip container whose kind
/// the media type or the file name tells), then the media type, then the file name's extension, then
/// markup at the start.
pub fn sniff(head: &[u8], media_type: Option<&str>, file_name: &str) -> Option<SourceFormat> {
    let by_type = media_type.and_then(SourceFormat::from_media_type);
    let by_name = SourceFormat::from_file_name(file_name);
    if head.starts_with(b"%PDF-") {
        return Some(SourceFormat::Pdf);
    }
    if image::sniff_image(head).is_some() {
        return Some(SourceFormat::Image);
    }
    let zipped = |format: &SourceFormat| {
        matches!(
            format,
            SourceFormat::Docx
                | SourceFormat::Pptx
                | SourceFormat::Xlsx
                | SourceFormat::Ods
                | SourceFormat::Epub
        )
    };
    if head.starts_with(b"PK\x03\x04") {
        return by_type.filter(zipped).or(by_name.filter(zipped));
    }
    // A binary container claimed for bytes that are not one: read as what the bytes look like.
    let claimed = by_type.or(by_name).filter(|format| {
        !zipped(format)
            && !matches!(
                format,
                SourceFormat::Pdf | SourceFormat::Xls | SourceFormat::Image
            )
    });
    if claimed.is_some() {
        return claimed;
    }
    let start = String::from_utf8_lossy(&head[..head.len().min(512)]).to_ascii_lowercase();
    let start = start.trim_start_matches('\u{feff}').trim_start();
    if start.starts_with("<!doctype html") || start.starts_with("<html") || start.contains("<body")
    {
        return Some(SourceFormat::Html);
    }
    match media_type {
        None | Some("application/octet-stream") if std::str::from_utf8(head).is_ok() => {
            Some(SourceFormat::Text)
        }
        Some(other) if other.starts_with("text/") => Some(SourceFormat::Text),
        _ => None,
    }
}

/// The final URL's last path segment (percent-decoded, at most 200 characters), else its host.
fn file_name_of(url: &Url) -> String {
    let segment = url
        .path_segments()
        .and_then(|mut segments| segments.next_back())
        .map(|segment| {
            percent_encoding::percent_decode_str(segment)
                .decode_utf8_lossy()
                .chars()
                .filter(|c| !c.is_control() && *c != '/' && *c != '\\')
                .collect::<String>()
        })
        .filter(|segment| !segment.trim().is_empty());
    let name = segment.unwrap_or_else(|| url.host_str().unwrap_or("page").to_string());
    name.chars().take(200).collect()
}

/// A URL for a message, cut to 200 characters.
fn shorten(url: &str) -> String {
    sift_actors::agent::terms::truncate_chars(url, 200)
}

fn invalid_url(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_url", message).with_param("urls")
}

fn forbidden(url: &Url, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "forbidden_url",
        format!(
            "{}: {why}; the node fetches only public addresses unless url_fetch_allow lists the range",
            shorten(url.as_str())
        ),
    )
    .with_param("urls")
}

fn fetch_failed(url: &Url, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "fetch_failed",
        format!("{}: {why}", shorten(url.as_str())),
    )
    .with_param("urls")
}

/// The connect seam refused an address in loopback-only mode: a test reached past loopback.
/// A 422 like any fetch that could not be made (the API contract run, which posts generated
/// URLs, sees a refusal, not a server error); the counter is what the tests assert on.
fn outside_loopback(url: &Url, refused: &OutsideLoopback) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "outside_loopback",
        format!("{}: {refused}", shorten(url.as_str())),
    )
    .with_param("urls")
}

fn too_large(url: &Url, max_bytes: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!(
            "{}: the content is larger than the limit of {max_bytes} bytes (max_upload_bytes)",
            shorten(url.as_str())
        ),
    )
}

fn storage_error(error: &std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "storage_error",
        format!("writing the fetched content: {error}"),
    )
}

/// A failed request: refused by the guard (`forbidden_url`) or the connect seam
/// (`outside_loopback`), else `fetch_failed` with the cause (connection refused, timeout, TLS).
fn request_error(url: &Url, error: &reqwest::Error) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<RefusedAddress>() {
            return forbidden(url, &refused.to_string());
        }
        if let Some(refused) = cause.downcast_ref::<OutsideLoopback>() {
            return outside_loopback(url, refused);
        }
        source = cause.source();
    }
    fetch_failed(url, &sift_models::error_chain(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(guard: &AddressGuard, ip: &str) -> bool {
        guard.refusal(ip.parse().unwrap()).is_some()
    }

    #[test]
    fn only_public_addresses_pass_the_guard() {
        let guard = AddressGuard::default();
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "198.18.0.1",
            "192.0.2.1",
            "240.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "::127.0.0.1",
            "2001:db8::1",
            // IPv6 that carries a refused IPv4 address: 6to4 (bits 16..48)
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:a00:1:1::1",
            "2002::1",
            // Teredo: the client's address inverted in the last 32 bits (127.0.0.1, 10.0.0.1,
            // 169.254.169.254), or a private server in bits 32..64
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
            "2001:0:4136:e378:8000:63bf:5601:5601",
            "2001:0:a00:1:8000:63bf:fefe:fefe",
            // NAT64 (well-known prefix) to loopback and metadata; the local-use prefix
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "64:ff9b:1:2:3::1",
            // IPv4-compatible, whatever the address
            "::a00:1",
            "::808:808",
            // site-local (deprecated), benchmarking, discard-only
            "fec0::1",
            "feff:ffff::1",
            "2001:2::1",
            "100::1",
        ] {
            assert!(refused(&guard, ip), "{ip} passed");
        }
        for ip in [
            "93.184.215.14",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "64:ff9b::101:101",
            // 6to4 of 8.8.8.8, Teredo with a public server and client 8.8.8.8
            "2002:808:808::1",
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
            "2001:4860:4860::8888",
        ] {
            assert!(!refused(&guard, ip), "{ip} was refused");
        }
    }

    #[test]
    fn an_allowed_range_passes_and_nothing_else_does() {
        let guard = AddressGuard::new(vec!["127.0.0.1/32".parse().unwrap()]);
        assert!(!refused(&guard, "127.0.0.1"));
        assert!(refused(&guard, "127.0.0.2"));
        assert!(refused(&guard, "10.0.0.1"));
    }

    fn fetcher() -> UrlFetcher {
        let mut hosts = BTreeMap::new();
        hosts.insert("intranet.test".to_string(), "10.0.0.1".parse().unwrap());
        UrlFetcher::new(FetchSettings {
            hosts,
            ..FetchSettings::default()
        })
        .unwrap()
    }

    fn code_of(result: Result<Url, ApiError>) -> String {
        result.expect_err("refused").code
    }

    #[test]
    fn urls_are_checked_before_any_connection() {
        let fetcher = fetcher();
        for url in [
            "http://127.0.0.1:7700/",
            "http://10.0.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "http://2130706433/",
            "http://0x7f.1/",
        ] {
            assert_eq!(code_of(fetcher.check_url(url)), "forbidden_url", "{url}");
        }
        for url in [
            "file:///etc/passwd",
            "gopher://127.0.0.1:70/",
            "ftp://example.com/",
            "not a url",
            "http://user:secret@example.com/",
        ] {
            assert_eq!(code_of(fetcher.check_url(url)), "invalid_url", "{url}");
        }
        assert!(fetcher.check_url("https://example.com/a.pdf").is_ok());
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_a_private_address_is_refused_without_connecting() {
        let fetcher = fetcher();
        let url = fetcher.check_url("http://intranet.test/secret").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let error = fetcher.fetch(url, dir.path(), 1024).await.unwrap_err();
        assert_eq!(error.code, "forbidden_url", "{}", error.message);
        assert!(error.message.contains("10.0.0.1"), "{}", error.message);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A fetcher in loopback-only mode whose SSRF guard admits a documentation range, so that
    /// only the connect seam stands between it and 192.0.2.1.
    fn loopback_only_fetcher() -> UrlFetcher {
        let mut hosts = BTreeMap::new();
        hosts.insert("public.test".to_string(), "192.0.2.1".parse().unwrap());
        hosts.insert("local.test".to_string(), "127.0.0.1".parse().unwrap());
        UrlFetcher::new(FetchSettings {
            allow: vec![
                "192.0.2.0/24".parse().unwrap(),
                "127.0.0.0/8".parse().unwrap(),
            ],
            hosts,
            // far below a connection attempt's timeout: a fetch that tried to connect to
            // 192.0.2.1 would end with `fetch_failed`, not `outside_loopback`
            timeout: Duration::from_secs(5),
            loopback_only: true,
            ..FetchSettings::default()
        })
        .unwrap()
    }

    #[test]
    fn the_connect_seam_admits_only_loopback_in_loopback_only_mode() {
        let seam = ConnectGuard::new(true);
        for address in [
            "127.0.0.1:80",
            "127.9.9.9:8080",
            "[::1]:443",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(seam.admit(address.parse().unwrap()).is_ok(), "{address}");
        }
        for address in [
            "192.0.2.1:80",
            "10.0.0.1:80",
            "[2606:4700::1]:443",
            "0.0.0.0:80",
        ] {
            let refused = seam.admit(address.parse().unwrap()).unwrap_err();
            assert!(refused.to_string().contains(address), "{refused}");
        }
        assert!(seam.admit_lookup("example.com").is_err());
        let open = ConnectGuard::new(false);
        assert!(open.admit("192.0.2.1:80".parse().unwrap()).is_ok());
        assert!(open.admit_lookup("example.com").is_ok());
    }

    #[tokio::test]
    async fn in_loopback_only_mode_the_fetcher_refuses_other_addresses_before_connecting() {
        let fetcher = loopback_only_fetcher();
        let dir = tempfile::tempdir().unwrap();
        for (url, names) in [
            // a literal address: refused right before the request
            ("http://192.0.2.1:8080/page", "192.0.2.1:8080"),
            // a name mapped to it: refused in the resolver, before reqwest connects
            ("http://public.test/page", "192.0.2.1"),
            // a name outside url_fetch_hosts: never looked up
            ("http://unmapped.example/page", "unmapped.example"),
        ] {
            let url = fetcher.check_url(url).unwrap();
            let started = std::time::Instant::now();
            let error = fetcher
                .fetch(url.clone(), dir.path(), 1024)
                .await
                .unwrap_err();
            assert_eq!(error.code, "outside_loopback", "{url}: {}", error.message);
            assert!(error.message.contains(names), "{}", error.message);
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{url}: it waited on a connection"
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn in_loopback_only_mode_the_fetcher_still_reaches_loopback() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                          Content-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
            }
        });
        let fetcher = loopback_only_fetcher();
        let dir = tempfile::tempdir().unwrap();
        for url in [
            format!("http://127.0.0.1:{port}/a.txt"),
            format!("http://local.test:{port}/a.txt"),
        ] {
            let url = fetcher.check_url(&url).unwrap();
            let fetched = fetcher.fetch(url, dir.path(), 1024).await.unwrap();
            assert_eq!(fetched.size_bytes, 5);
            assert_eq!(fetched.format, SourceFormat::Text);
        }
    }

    #[test]
    fn formats_are_sniffed_from_the_bytes_first() {
        assert_eq!(
            sniff(b"%PDF-1.7\n", Some("text/html"), "page.html"),
            Some(SourceFormat::Pdf)
        );
        assert_eq!(
            sniff(
                b"PK\x03\x04rest",
                Some("application/octet-stream"),
                "report.docx"
            ),
            Some(SourceFormat::Docx)
        );
        assert_eq!(sniff(b"PK\x03\x04rest", None, "archive.zip"), None);
        assert_eq!(
            sniff(b"<!DOCTYPE html><html>", None, "index"),
            Some(SourceFormat::Html)
        );
        // a server (or a name) that calls plain words a PDF is not believed
        assert_eq!(
            sniff(b"plain words", Some("application/pdf"), "x.pdf"),
            None
        );
        assert_eq!(
            sniff(b"plain words", None, "x.pdf"),
            Some(SourceFormat::Text)
        );
        assert_eq!(
            sniff(b"# Title", Some("text/markdown"), "readme"),
            Some(SourceFormat::Markdown)
        );
        assert_eq!(sniff(b"\x00\x01\x02", Some("image/png"), "a.png"), None);
    }

    #[test]
    fn file_names_come_from_the_final_url() {
        let name = |url: &str| file_name_of(&Url::parse(url).unwrap());
        assert_eq!(
            name("https://example.com/docs/report%20v2.pdf"),
            "report v2.pdf"
        );
        assert_eq!(name("https://example.com/"), "example.com");
        assert_eq!(name("https://example.com/a/b/"), "example.com");
    }
}
