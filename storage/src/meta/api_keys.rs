//! API keys in the metadata state machine: who may call the public API, with which role.
//!
//! A key is `sk-sift-{id}-{secret}`. Only the public `id` and the SHA-256 of the secret are
//! stored (keys `apikey/`: see `keys.rs`); the secret is shown once, when the key is made.
//! The secret has 192 random bits, so a plain hash is enough: there is nothing to guess a
//! password from. Revocation keeps the record (with `revoked_at_ms`), so an id is never
//! reused and a revoked key stays refused.
//!
//! Every type here is bincode-safe: ops travel between nodes as bincode.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::keys::{API_KEY_PREFIX, api_key_key};
use super::pending::Pending;
use super::{SledMetaStore, decode};
use crate::error::{Result, StorageError};

/// What a key may do. Each role includes the ones below it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Search, chat, its own sessions and runs.
    Reader,
    /// Also KBs, documents and their settings.
    Editor,
    /// Also the cluster, keys and everything else.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Reader, Role::Editor, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Editor => "editor",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }
}

/// The tenant of everything made before tenants existed, of the first admin key and of
/// everything made with auth off. Its admins are the operators: they alone reach the
/// cluster, the tenants and the debug routes.
pub const DEFAULT_TENANT: &str = "default";

fn default_tenant() -> String {
    DEFAULT_TENANT.to_string()
}

/// A key as [`MetaOp::CreateApiKey`] carries it: the fields of the first key format, frozen
/// (ops are bincode in the Raft log; [`MetaOp::CreateTenantApiKey`] carries the tenant and
/// groups besides).
///
/// [`MetaOp::CreateApiKey`]: super::MetaOp::CreateApiKey
/// [`MetaOp::CreateTenantApiKey`]: super::MetaOp::CreateTenantApiKey
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyFields {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub secret_sha256: String,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub revoked_at_ms: Option<u64>,
}

impl ApiKeyFields {
    /// The record stored for these fields in `tenant`, with `groups`.
    pub fn into_record(self, tenant: &str, groups: &[String]) -> ApiKeyRecord {
        ApiKeyRecord {
            id: self.id,
            name: self.name,
            role: self.role,
            secret_sha256: self.secret_sha256,
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            revoked_at_ms: self.revoked_at_ms,
            tenant: tenant.to_string(),
            groups: groups.to_vec(),
        }
    }
}

/// A stored API key: never the secret, only its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    /// The public part of the key (`sk-sift-{id}-...`): lowercase hex, shown in lists and logs.
    pub id: String,
    /// A name for people ("ci", "alice's laptop").
    pub name: String,
    pub role: Role,
    /// SHA-256 of the secret part, hex.
    pub secret_sha256: String,
    pub created_at_ms: u64,
    /// Refused from this time on, when set.
    pub expires_at_ms: Option<u64>,
    /// Refused since this time, when set.
    pub revoked_at_ms: Option<u64>,
    /// The tenant whose data the key reaches (records of keys made before tenants: the
    /// default one).
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The document groups the key may read besides documents open to all (see the
    /// document-level access of tenants); empty: those only.
    #[serde(default)]
    pub groups: Vec<String>,
}

impl ApiKeyRecord {
    /// Whether the key may be used at `now_ms` (not revoked, not expired).
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.revoked_at_ms.is_none() && self.expires_at_ms.is_none_or(|at| now_ms < at)
    }
}

impl SledMetaStore {
    pub fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRecord>> {
        self.tree
            .get(api_key_key(id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Every key, revoked ones included, by id.
    pub fn list_api_keys(&self) -> Result<Vec<ApiKeyRecord>> {
        let mut keys = Vec::new();
        for item in self.tree.scan_prefix(API_KEY_PREFIX) {
            let (_, value) = item?;
            keys.push(decode::<ApiKeyRecord>(&value)?);
        }
        Ok(keys)
    }

    /// Whether any admin key of the default tenant (an operator's) can still be used at
    /// `now_ms` (first start makes one otherwise).
    pub fn has_live_admin_key(&self, now_ms: u64) -> Result<bool> {
        Ok(self.list_api_keys()?.iter().any(|key| {
            key.role == Role::Admin && key.tenant == DEFAULT_TENANT && key.is_live(now_ms)
        }))
    }

    pub(super) fn apply_create_api_key(
        &self,
        pending: &mut Pending<'_>,
        key: &ApiKeyRecord,
    ) -> Result<ApiKeyRecord> {
        if !self.tenant_exists_in(pending, &key.tenant)? {
            return Err(StorageError::NotFound(format!("tenant {:?}", key.tenant)));
        }
        if let Some(existing) = pending.get::<ApiKeyRecord>(&api_key_key(&key.id))? {
            if existing.secret_sha256 == key.secret_sha256 {
                return Ok(existing); // a retried create
            }
            return Err(StorageError::Conflict(format!(
                "an API key with id {} already exists",
                key.id
            )));
        }
        pending.put(api_key_key(&key.id), key)?;
        Ok(key.clone())
    }

    pub(super) fn apply_revoke_api_key(
        &self,
        pending: &mut Pending<'_>,
        id: &str,
        at_ms: u64,
    ) -> Result<ApiKeyRecord> {
        let Some(mut key) = pending.get::<ApiKeyRecord>(&api_key_key(id))? else {
            return Err(StorageError::NotFound(format!("API key {id}")));
        };
        if key.revoked_at_ms.is_none() {
            key.revoked_at_ms = Some(at_ms);
            pending.put(api_key_key(id), &key)?;
        }
        Ok(key)
    }
}
