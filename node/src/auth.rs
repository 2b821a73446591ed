//! API keys on the public API: who is calling, and may they call this route.
//!
//! - A key is `sk-sift-{id}-{secret}`: `id` is 12 lowercase hex digits (public: lists, logs),
//!   `secret` 48 (192 random bits). The node stores only the secret's SHA-256 (a
//!   `MetaOp::CreateApiKey`, replicated by Raft like every other change) and compares it in
//!   constant time. Clients send `Authorization: Bearer <key>` (the OpenAI SDKs' `api_key`).
//! - [`authenticate`] runs on every route but `/healthz` and `/readyz`, after routing: it
//!   finds the key, checks it is live (not revoked, not expired), and checks its [`Role`]
//!   against [`required_role`] of the matched route. Failures are 401 (`missing_api_key`,
//!   `invalid_api_key`, `revoked_api_key`, `expired_api_key`; the last two only for a key
//!   whose secret matched) or 403 `forbidden`, counted in `sift_auth_failures_total{reason}`.
//!   No log line or label carries key material: only the public id.
//! - [`bootstrap`]: a node without a usable admin key makes one at start and writes it to
//!   `DATA_DIR/admin.key` (mode 0600), or registers the one `SIFT_ADMIN_KEY` gives.
//! - `auth = "off"` serves every request as an admin; the config accepts it only on a
//!   loopback listen address.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use sift_actors::ingest::pipeline::now_ms;
use sift_actors::{Scope, SiftError, SiftNode};
use sift_storage::meta::{ApiKeyFields, DEFAULT_TENANT, MetaOp, MetaOutcome, Role};
use subtle::ConstantTimeEq;
use tracing::{info, warn};

use crate::api::ApiError;

/// Every key starts with this.
pub const KEY_PREFIX: &str = "sk-sift-";
/// Hex digits of a key's public id.
const ID_HEX: usize = 12;
/// Hex digits of a key's secret (192 bits).
const SECRET_HEX: usize = 48;
/// The file a node writes the admin key it made to.
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// The header a joining node sends to read `GET /v1/cluster` with the cluster secret.
pub const CLUSTER_SECRET_HEADER: &str = "x-sift-cluster-secret";

/// Whether the public API checks keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    On,
    /// Every request is served as an admin (loopback listen addresses only).
    Off,
}

impl AuthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::On => "on",
            AuthMode::Off => "off",
        }
    }
}

/// The caller of a request, once authenticated (in the request's extensions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The key's public id; `None` with auth off.
    pub key_id: Option<String>,
    pub role: Role,
    /// The key's tenant (the default one with auth off).
    pub tenant: String,
    /// The document groups the key reads besides open documents.
    pub groups: Vec<String>,
}

impl Principal {
    /// An admin of the default tenant (auth off, the cluster secret).
    fn operator() -> Principal {
        Principal {
            key_id: None,
            role: Role::Admin,
            tenant: DEFAULT_TENANT.to_string(),
            groups: Vec::new(),
        }
    }

    /// An admin of the default tenant: the cluster, the tenants and the debug routes are
    /// theirs.
    pub fn is_operator(&self) -> bool {
        self.role == Role::Admin && self.tenant == DEFAULT_TENANT
    }

    /// The scope of the node operations the request makes: the key's tenant, and (but for
    /// admins, who read every document of their tenant) its groups.
    pub fn scope(&self) -> Scope {
        let groups = (self.role != Role::Admin).then(|| self.groups.clone());
        Scope::tenant(self.tenant.clone()).with_groups(groups)
    }
}

/// What the middleware needs.
pub struct AuthState {
    pub mode: AuthMode,
    pub node: Arc<SiftNode>,
    /// Request rates per key and tenant ([`crate::limits`]).
    pub limits: crate::limits::RateLimits,
    /// How long audit entries are kept ([`crate::audit`]).
    pub audit_retention: std::time::Duration,
    /// Cluster mode: the shared secret, accepted on `GET /v1/cluster` only (joining nodes).
    pub cluster_secret: Option<String>,
}

impl AuthState {
    /// The request rate of `tenant`'s own limits, if they set one.
    fn tenant_rate(&self, tenant: &str) -> Result<Option<crate::limits::Rate>, SiftError> {
        if tenant == DEFAULT_TENANT {
            return Ok(None);
        }
        let limits = self.node.context().meta.store().tenant_limits(tenant)?;
        Ok(limits
            .rate_limit_per_minute
            .and_then(|rate| crate::limits::Rate::new(rate, limits.rate_limit_burst)))
    }
}

/// A key just made: the full text (shown once) and the fields stored for it.
pub struct NewKey {
    pub key: String,
    pub record: ApiKeyFields,
}

fn random_hex(digits: usize) -> anyhow::Result<String> {
    let mut bytes = vec![0u8; digits.div_ceil(2)];
    getrandom::fill(&mut bytes).map_err(|error| anyhow::anyhow!("no randomness: {error}"))?;
    let mut text = hex::encode(bytes);
    text.truncate(digits);
    Ok(text)
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Makes a new random key.
pub fn generate_key(
    name: &str,
    role: Role,
    expires_at_ms: Option<u64>,
    now_ms: u64,
) -> anyhow::Result<NewKey> {
    let id = random_hex(ID_HEX)?;
    let secret = random_hex(SECRET_HEX)?;
    let key = format!("{KEY_PREFIX}{id}-{secret}");
    Ok(NewKey {
        record: record_for(&id, &secret, name, role, expires_at_ms, now_ms),
        key,
    })
}

fn record_for(
    id: &str,
    secret: &str,
    name: &str,
    role: Role,
    expires_at_ms: Option<u64>,
    now_ms: u64,
) -> ApiKeyFields {
    ApiKeyFields {
        id: id.to_string(),
        name: name.to_string(),
        role,
        secret_sha256: sha256_hex(secret),
        created_at_ms: now_ms,
        expires_at_ms,
        revoked_at_ms: None,
    }
}

/// The id and secret of a well-formed key; `None` for anything else.
pub fn parse_key(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('-')?;
    let lower_hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (lower_hex(id, ID_HEX) && lower_hex(secret, SECRET_HEX)).then_some((id, secret))
}

/// The record of a key given whole (`SIFT_ADMIN_KEY`), as an admin key.
pub fn admin_record_of(key: &str, now_ms: u64) -> anyhow::Result<ApiKeyFields> {
    let Some((id, secret)) = parse_key(key) else {
        bail!(
            "SIFT_ADMIN_KEY is not a Sift key: it must be {KEY_PREFIX}<{ID_HEX} hex digits>-<{SECRET_HEX} hex digits> (lowercase)"
        );
    };
    Ok(record_for(
        id,
        secret,
        "admin (SIFT_ADMIN_KEY)",
        Role::Admin,
        None,
        now_ms,
    ))
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    Missing,
    Invalid,
    Revoked,
    Expired,
    Forbidden,
    /// A route of the operator (an admin of the default tenant) called by another key.
    NotOperator,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Invalid => "invalid",
            Refusal::Revoked => "revoked",
            Refusal::Expired => "expired",
            Refusal::Forbidden | Refusal::NotOperator => "forbidden",
        }
    }

    fn into_error(self, needed: Role) -> ApiError {
        let (status, code, message) = match self {
            Refusal::Missing => (
                StatusCode::UNAUTHORIZED,
                "missing_api_key",
                "this route needs an API key: send `Authorization: Bearer sk-sift-...` (a new node writes its admin key to DATA_DIR/admin.key)".to_string(),
            ),
            Refusal::Invalid => (
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "the API key is not valid".to_string(),
            ),
            Refusal::Revoked => (
                StatusCode::UNAUTHORIZED,
                "revoked_api_key",
                "the API key was revoked".to_string(),
            ),
            Refusal::Expired => (
                StatusCode::UNAUTHORIZED,
                "expired_api_key",
                "the API key has expired".to_string(),
            ),
            Refusal::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("this route needs the {} role", needed.as_str()),
            ),
            Refusal::NotOperator => (
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("this route needs an admin key of the {DEFAULT_TENANT} tenant"),
            ),
        };
        ApiError::new(status, code, message)
    }
}

/// The role a route needs: `admin` for the cluster, tenants, keys and debug faults; `editor`
/// for changes to KBs and documents; `reader` for the rest (reads, search, sessions, runs,
/// chat, `/metrics`).
pub fn required_role(method: &Method, route: &str) -> Role {
    if operator_route(route) || route.starts_with("/v1/keys") || route == "/v1/audit" {
        return Role::Admin;
    }
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if changes && route.starts_with("/v1/kbs") && route != "/v1/kbs/{kb}/search" {
        return Role::Editor;
    }
    Role::Reader
}

/// The routes of the node as a whole, not of one tenant: the cluster, the tenants, the debug
/// faults, the snapshots and `/metrics` need a key of the default tenant (an admin's, but for
/// `/metrics`).
fn operator_route(route: &str) -> bool {
    route.starts_with("/v1/cluster")
        || route.starts_with("/v1/tenants")
        || route.starts_with("/v1/debug/")
        || route.starts_with("/v1/snapshots")
}

/// Whether `principal` may call `route` with `method`.
fn permit(principal: &Principal, method: &Method, route: &str) -> Result<(), Refusal> {
    if principal.role < required_role(method, route) {
        return Err(Refusal::Forbidden);
    }
    let node_wide = operator_route(route) || route == "/metrics";
    if node_wide && principal.tenant != DEFAULT_TENANT {
        return Err(Refusal::NotOperator);
    }
    Ok(())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

impl AuthState {
    /// The principal of a request's headers, or why there is none.
    fn principal(
        &self,
        headers: &HeaderMap,
        method: &Method,
        route: &str,
    ) -> Result<Principal, Refusal> {
        if self.mode == AuthMode::Off {
            return Ok(Principal::operator());
        }
        if route == "/v1/cluster"
            && *method == Method::GET
            && let Some(secret) = &self.cluster_secret
            && let Some(given) = headers.get(CLUSTER_SECRET_HEADER)
        {
            return if bool::from(given.as_bytes().ct_eq(secret.as_bytes())) {
                Ok(Principal::operator())
            } else {
                Err(Refusal::Invalid)
            };
        }
        if headers.get(header::AUTHORIZATION).is_none() {
            return Err(Refusal::Missing);
        }
        let (id, secret) = bearer(headers)
            .and_then(parse_key)
            .ok_or(Refusal::Invalid)?;
        let record = self
            .node
            .context()
            .meta
            .store()
            .get_api_key(id)
            .map_err(|error| {
                warn!(key_id = id, %error, "reading an API key failed");
                Refusal::Invalid
            })?
            .ok_or(Refusal::Invalid)?;
        let given = sha256_hex(secret);
        if !bool::from(given.as_bytes().ct_eq(record.secret_sha256.as_bytes())) {
            return Err(Refusal::Invalid);
        }
        if record.revoked_at_ms.is_some() {
            return Err(Refusal::Revoked);
        }
        if !record.is_live(now_ms()) {
            return Err(Refusal::Expired);
        }
        // A key of a deleted tenant is revoked by the delete; a tenant that is gone anyway
        // (never made, or deleted) reaches nothing.
        match self.node.context().meta.store().get_tenant(&record.tenant) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(Refusal::Revoked),
            Err(error) => {
                warn!(key_id = id, %error, "reading a tenant failed");
                return Err(Refusal::Invalid);
            }
        }
        Ok(Principal {
            key_id: Some(record.id),
            role: record.role,
            tenant: record.tenant,
            groups: record.groups,
        })
    }
}

/// The middleware: authenticates the request and checks its role, or answers the refusal.
/// Changes ([`crate::audit::audited`]) by a known key, allowed or not, go into the audit log
/// with their outcome before the answer is sent.
pub async fn authenticate(
    State(auth): State<Arc<AuthState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_else(|| request.uri().path().to_string());
    let needed = required_role(request.method(), &route);
    let principal = match auth.principal(request.headers(), request.method(), &route) {
        Ok(principal) => principal,
        Err(refusal) => return refused(refusal, needed),
    };
    let audited = crate::audit::audited(request.method(), &route);
    if let Err(refusal) = permit(&principal, request.method(), &route) {
        if audited {
            crate::audit::Call::of(&request, &route, &principal)
                .record(&auth, StatusCode::FORBIDDEN)
                .await;
        }
        return refused(refusal, needed);
    }
    let tenant_rate = match auth.tenant_rate(&principal.tenant) {
        Ok(rate) => rate,
        Err(error) => return ApiError::from(error).into_response(),
    };
    if let Err(limited) = auth.limits.check(&principal, tenant_rate) {
        let mut error = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "too many requests for this {}; retry after {} s",
                limited.scope, limited.retry_after_secs
            ),
        );
        error.retry_after_secs = Some(limited.retry_after_secs);
        return error.into_response();
    }
    let call = audited.then(|| crate::audit::Call::of(&request, &route, &principal));
    request.extensions_mut().insert(principal);
    let response = next.run(request).await;
    if let Some(call) = call {
        call.record(&auth, response.status()).await;
    }
    response
}

/// The answer to a refused request, counted in `sift_auth_failures_total{reason}`.
fn refused(refusal: Refusal, needed: Role) -> Response {
    metrics::counter!("sift_auth_failures_total", "reason" => refusal.reason()).increment(1);
    let mut response = refusal.into_error(needed).into_response();
    if response.status() == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// Where a node writes the admin key it made.
pub fn admin_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_KEY_FILE)
}

/// Makes sure the node has an admin key, at start. With `given` (`SIFT_ADMIN_KEY`), registers
/// it unless it already is. Otherwise, when no live admin key exists and this node may write
/// (a single node, or the cluster's leader: a node that just joined waits for the leader's
/// key to reach it), makes one and writes it to `DATA_DIR/admin.key` (mode 0600).
pub async fn bootstrap(
    node: &SiftNode,
    given: Option<&str>,
    data_dir: &Path,
) -> anyhow::Result<Bootstrap> {
    let meta = &node.context().meta;
    let now = now_ms();
    if let Some(key) = given {
        let record = admin_record_of(key, now)?;
        match meta.store().get_api_key(&record.id)? {
            Some(stored) if stored.secret_sha256 == record.secret_sha256 => {
                if !stored.is_live(now) {
                    bail!(
                        "SIFT_ADMIN_KEY (id {}) was revoked or has expired",
                        record.id
                    );
                }
                return Ok(Bootstrap::AlreadyThere);
            }
            Some(_) => bail!("SIFT_ADMIN_KEY's id {} belongs to another key", record.id),
            None => {}
        }
        let id = record.id.clone();
        propose_key(node, record).await?;
        info!(key_id = %id, "registered the admin key of SIFT_ADMIN_KEY");
        return Ok(Bootstrap::Registered);
    }
    if meta.store().has_live_admin_key(now)? {
        return Ok(Bootstrap::AlreadyThere);
    }
    if let Some(raft) = meta.raft() {
        let status = raft.status();
        if status.leader != Some(status.id) {
            return Ok(Bootstrap::NotLeader);
        }
    }
    let new = generate_key("admin", Role::Admin, None, now)?;
    let id = new.record.id.clone();
    let path = admin_key_path(data_dir);
    // The file first: a key that is stored but was never written would be lost.
    write_secret_file(&path, &new.key)?;
    propose_key(node, new.record).await?;
    info!(key_id = %id, file = %path.display(), "made an admin key");
    Ok(Bootstrap::Made)
}

/// What [`bootstrap`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// Registered `SIFT_ADMIN_KEY`.
    Registered,
    /// Made a key and wrote it to `DATA_DIR/admin.key`.
    Made,
    /// A usable admin key (or the given one) was already stored.
    AlreadyThere,
    /// Cluster mode, not the leader, no admin key stored yet: try again later.
    NotLeader,
}

/// [`bootstrap`] at start. On a single node, once (a failure stops the start). In cluster
/// mode the leader may not be elected yet and a joining node's copy of the metadata may lag,
/// so it tries again: for up to [`BOOTSTRAP_WAIT`] before the node serves (a new cluster's
/// first requests find the key), then on a task until the key exists.
pub async fn bootstrap_at_start(
    node: Arc<SiftNode>,
    mode: AuthMode,
    given: Option<String>,
    data_dir: PathBuf,
) -> anyhow::Result<()> {
    if mode == AuthMode::Off {
        warn!("auth is off: every request is served as an admin (loopback only)");
        return Ok(());
    }
    if !node.context().meta.is_replicated() {
        bootstrap(&node, given.as_deref(), &data_dir).await?;
        return Ok(());
    }
    let attempt = {
        let node = node.clone();
        move || {
            let node = node.clone();
            let given = given.clone();
            let data_dir = data_dir.clone();
            async move {
                match bootstrap(&node, given.as_deref(), &data_dir).await {
                    Ok(Bootstrap::NotLeader) => false,
                    Ok(_) => true,
                    Err(error) => {
                        warn!("making the admin key: {error:#}; trying again");
                        false
                    }
                }
            }
        }
    };
    let started = tokio::time::Instant::now();
    while started.elapsed() < BOOTSTRAP_WAIT {
        if attempt().await {
            return Ok(());
        }
        tokio::time::sleep(BOOTSTRAP_RETRY).await;
    }
    info!("no admin key yet: serving, and trying again in the background");
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        while !attempt().await {
            if started.elapsed() > std::time::Duration::from_secs(600) {
                warn!("no admin key after 10 minutes: set SIFT_ADMIN_KEY on a member");
                return;
            }
            tokio::time::sleep(BOOTSTRAP_RETRY).await;
        }
    });
    Ok(())
}

/// How long a cluster member waits at start for the admin key to exist before it serves.
const BOOTSTRAP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
const BOOTSTRAP_RETRY: std::time::Duration = std::time::Duration::from_millis(250);

async fn propose_key(
    node: &SiftNode,
    record: ApiKeyFields,
) -> anyhow::Result<sift_storage::meta::ApiKeyRecord> {
    match node
        .context()
        .meta
        .propose(MetaOp::CreateApiKey(record))
        .await
        .context("storing the API key")?
    {
        MetaOutcome::ApiKey(record) => Ok(record),
        other => bail!("unexpected outcome {other:?}"),
    }
}

/// Writes `text` to `path`, readable by its owner only, atomically (a temp file renamed).
fn write_secret_file(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let temp = path.with_extension("key.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&temp)
        .with_context(|| format!("creating {}", temp.display()))?;
    file.write_all(format!("{text}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The key in a file written by [`bootstrap`] (its first line), if the file is there.
pub fn read_key_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let key = text.lines().next()?.trim();
    parse_key(key).map(|_| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_hash_their_secret() {
        let new = generate_key("ci", Role::Editor, None, 5).unwrap();
        let (id, secret) = parse_key(&new.key).expect("a generated key parses");
        assert_eq!(id, new.record.id);
        assert_eq!(new.record.secret_sha256, sha256_hex(secret));
        assert!(!new.record.secret_sha256.contains(secret));
        let other = generate_key("ci", Role::Editor, None, 5).unwrap();
        assert_ne!(new.key, other.key, "random");
    }

    #[test]
    fn malformed_keys_do_not_parse() {
        let good = format!("{KEY_PREFIX}{}-{}", "a".repeat(12), "b".repeat(48));
        assert!(parse_key(&good).is_some());
        for bad in [
            String::new(),
            "sk-sift-".to_string(),
            good.to_uppercase(),
            good.replace("sk-sift-", "sk-"),
            format!("{good}0"),
            format!("{KEY_PREFIX}{}-{}", "a".repeat(11), "b".repeat(48)),
            format!("{KEY_PREFIX}{}-{}", "g".repeat(12), "b".repeat(48)),
            format!("{KEY_PREFIX}{}-{}é", "a".repeat(12), "b".repeat(47)),
        ] {
            assert!(parse_key(&bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn routes_need_the_roles_of_the_table() {
        let cases = [
            (Method::GET, "/v1/kbs", Role::Reader),
            (Method::POST, "/v1/kbs/{kb}/search", Role::Reader),
            (Method::POST, "/v1/sessions", Role::Reader),
            (Method::POST, "/v1/chat/completions", Role::Reader),
            (Method::GET, "/metrics", Role::Reader),
            (Method::POST, "/v1/kbs", Role::Editor),
            (Method::PATCH, "/v1/kbs/{kb}", Role::Editor),
            (Method::DELETE, "/v1/kbs/{kb}/documents/{doc}", Role::Editor),
            (Method::POST, "/v1/kbs/{kb}/documents", Role::Editor),
            (Method::GET, "/v1/cluster", Role::Admin),
            (Method::DELETE, "/v1/cluster/nodes/{id}", Role::Admin),
            (Method::GET, "/v1/keys", Role::Admin),
            (Method::POST, "/v1/tenants", Role::Admin),
            (Method::PUT, "/v1/tenants/{name}/limits", Role::Admin),
            (Method::PUT, "/v1/kbs/{kb}/shares/{tenant}", Role::Editor),
            (Method::POST, "/v1/debug/reconciler/crash", Role::Admin),
        ];
        for (method, route, role) in cases {
            assert_eq!(required_role(&method, route), role, "{method} {route}");
        }
    }

    #[test]
    fn node_wide_routes_need_a_key_of_the_default_tenant() {
        let key = |role, tenant: &str| Principal {
            key_id: Some("aaaaaaaaaaaa".into()),
            role,
            tenant: tenant.into(),
            groups: Vec::new(),
        };
        let operator = key(Role::Admin, DEFAULT_TENANT);
        let tenant_admin = key(Role::Admin, "acme");
        assert!(operator.is_operator() && !tenant_admin.is_operator());
        for route in [
            "/v1/cluster",
            "/v1/tenants",
            "/v1/tenants/{name}",
            "/v1/debug/reconciler/crash",
        ] {
            assert_eq!(permit(&operator, &Method::GET, route), Ok(()), "{route}");
            assert_eq!(
                permit(&tenant_admin, &Method::GET, route),
                Err(Refusal::NotOperator),
                "{route}"
            );
        }
        // A tenant's admin manages its keys; /metrics is the default tenant's.
        assert_eq!(permit(&tenant_admin, &Method::POST, "/v1/keys"), Ok(()));
        assert_eq!(
            permit(&key(Role::Reader, "acme"), &Method::GET, "/metrics"),
            Err(Refusal::NotOperator)
        );
        assert_eq!(
            permit(&key(Role::Reader, DEFAULT_TENANT), &Method::GET, "/metrics"),
            Ok(())
        );
        assert_eq!(
            permit(&key(Role::Reader, "acme"), &Method::POST, "/v1/kbs"),
            Err(Refusal::Forbidden)
        );
    }

    #[test]
    fn the_secret_file_is_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = admin_key_path(dir.path());
        let new = generate_key("admin", Role::Admin, None, 1).unwrap();
        write_secret_file(&path, &new.key).unwrap();
        assert_eq!(read_key_file(&path).as_deref(), Some(new.key.as_str()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
