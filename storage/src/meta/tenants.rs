//! Tenants in the metadata state machine: whose KBs, keys and sessions are whose.
//!
//! Every KB belongs to one tenant (`kbtenant/{kb}`; none: the default tenant), and its name is
//! unique within that tenant (`kbname/{tenant}:{name}`, the default tenant's `kbname/{name}`).
//! Every key belongs to one tenant ([`ApiKeyRecord::tenant`]); a session belongs to the
//! tenant of the key that owns it. A KB may be shared read-only with other tenants
//! (`kbshare/{kb}/{tenant}`). [`SledMetaStore::find_kb_in`] is the one lookup of a KB on
//! behalf of a tenant: a KB of another tenant that is not shared with it is not found.
//!
//! Every type here is bincode-safe: ops travel between nodes as bincode.
//!
//! [`ApiKeyRecord::tenant`]: super::ApiKeyRecord::tenant

use serde::{Deserialize, Serialize};
use sift_api::TenantLimits;

use super::api_keys::{ApiKeyRecord, DEFAULT_TENANT};
use super::keys::{
    API_KEY_PREFIX, KB_PREFIX, KB_SHARE_PREFIX, SESSION_PREFIX, TENANT_PREFIX, kb_key,
    kb_share_key, kb_share_prefix, kb_tenant_key, tenant_kb_name_key, tenant_key,
};
use super::pending::Pending;
use super::records::KbRecord;
use super::sessions::SessionRecord;
use super::{SledMetaStore, decode};
use crate::error::{Result, StorageError};

/// A tenant: a name that owns KBs, keys and sessions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantRecord {
    pub name: String,
    pub created_at_ms: u64,
    /// Its own limits, where they differ from the node-wide settings (records stored
    /// before limits existed have none).
    #[serde(default)]
    pub limits: TenantLimits,
}

impl TenantRecord {
    /// The default tenant, which exists without a record.
    pub fn default_tenant() -> TenantRecord {
        TenantRecord {
            name: DEFAULT_TENANT.to_string(),
            created_at_ms: 0,
            limits: TenantLimits::default(),
        }
    }
}

/// How a tenant reaches a KB it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KbAccess {
    /// The KB is the tenant's own.
    Owner,
    /// Another tenant shares the KB with it, read-only.
    Shared,
}

/// What deleting a tenant removed besides its record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDeleted {
    pub name: String,
    /// The ids of its keys that the delete revoked.
    pub revoked_keys: Vec<String>,
    /// The ids of its sessions that the delete removed.
    pub sessions: Vec<String>,
}

impl SledMetaStore {
    /// The tenant named `name` (the default tenant always exists).
    pub fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>> {
        if name == DEFAULT_TENANT {
            return Ok(Some(TenantRecord::default_tenant()));
        }
        self.tree
            .get(tenant_key(name))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Every tenant, the default one first, then by name.
    pub fn list_tenants(&self) -> Result<Vec<TenantRecord>> {
        let mut tenants = vec![TenantRecord::default_tenant()];
        for item in self.tree.scan_prefix(TENANT_PREFIX) {
            let (_, value) = item?;
            tenants.push(decode(&value)?);
        }
        Ok(tenants)
    }

    /// The limits of the tenant `name` (none for the default tenant, or one that is gone: the
    /// node-wide settings apply).
    pub fn tenant_limits(&self, name: &str) -> Result<TenantLimits> {
        if name == DEFAULT_TENANT {
            return Ok(TenantLimits::default());
        }
        Ok(self
            .get_tenant(name)?
            .map(|record| record.limits)
            .unwrap_or_default())
    }

    /// The tenant that owns the KB `kb_id`.
    pub fn kb_tenant(&self, kb_id: &str) -> Result<String> {
        Ok(match self.tree.get(kb_tenant_key(kb_id))? {
            Some(name) => String::from_utf8_lossy(&name).into_owned(),
            None => DEFAULT_TENANT.to_string(),
        })
    }

    /// The tenants a KB is shared with, by name.
    pub fn kb_shares(&self, kb_id: &str) -> Result<Vec<String>> {
        let prefix = kb_share_prefix(kb_id);
        let mut tenants = Vec::new();
        for item in self.tree.scan_prefix(&prefix) {
            let (key, _) = item?;
            tenants.push(String::from_utf8_lossy(&key[prefix.len()..]).into_owned());
        }
        Ok(tenants)
    }

    fn is_shared_with(&self, kb_id: &str, tenant: &str) -> Result<bool> {
        Ok(self.tree.get(kb_share_key(kb_id, tenant))?.is_some())
    }

    /// How `tenant` reaches the KB `kb_id`, if at all.
    fn access_of(&self, kb_id: &str, tenant: &str) -> Result<Option<KbAccess>> {
        if self.kb_tenant(kb_id)? == tenant {
            Ok(Some(KbAccess::Owner))
        } else if self.is_shared_with(kb_id, tenant)? {
            Ok(Some(KbAccess::Shared))
        } else {
            Ok(None)
        }
    }

    /// The KB `kb` names for `tenant`: its id, a name of the tenant's own KBs, or
    /// `{owner}:{name}` (a KB of `owner` shared with `tenant`, or the tenant's own). Another
    /// tenant's KB that is not shared with it is `None`, as one that does not exist.
    pub fn find_kb_in(&self, tenant: &str, kb: &str) -> Result<Option<(KbRecord, KbAccess)>> {
        let id = match kb.split_once(':') {
            Some((owner, name)) => self.tree.get(tenant_kb_name_key(owner, name))?,
            None => match self.get_kb(kb)? {
                Some(record) => {
                    return Ok(self
                        .access_of(&record.id, tenant)?
                        .map(|access| (record, access)));
                }
                None => self.tree.get(tenant_kb_name_key(tenant, kb))?,
            },
        };
        let Some(id) = id else {
            return Ok(None);
        };
        let Some(record) = self.get_kb(&String::from_utf8_lossy(&id))? else {
            return Ok(None);
        };
        Ok(self
            .access_of(&record.id, tenant)?
            .map(|access| (record, access)))
    }

    /// The KBs `tenant` reaches: its own and those shared with it, by name.
    pub fn list_kbs_in(&self, tenant: &str) -> Result<Vec<(KbRecord, KbAccess)>> {
        let mut kbs = Vec::new();
        for kb in self.list_kbs()? {
            if let Some(access) = self.access_of(&kb.id, tenant)? {
                kbs.push((kb, access));
            }
        }
        Ok(kbs)
    }

    /// The tenant of the key `owner` of a session or run (none: made with auth off, the
    /// default tenant). A key that is gone counts as no tenant's.
    pub fn owner_tenant(&self, owner: Option<&str>) -> Result<Option<String>> {
        match owner {
            None => Ok(Some(DEFAULT_TENANT.to_string())),
            Some(id) => Ok(self.get_api_key(id)?.map(|key| key.tenant)),
        }
    }

    pub(super) fn tenant_exists_in(&self, pending: &Pending<'_>, name: &str) -> Result<bool> {
        Ok(name == DEFAULT_TENANT || pending.get_raw(&tenant_key(name))?.is_some())
    }

    pub(super) fn apply_create_tenant(
        &self,
        pending: &mut Pending<'_>,
        name: &str,
        created_at_ms: u64,
    ) -> Result<TenantRecord> {
        if name == DEFAULT_TENANT {
            return Err(StorageError::Conflict(format!(
                "the tenant {name:?} already exists"
            )));
        }
        if let Some(existing) = pending.get::<TenantRecord>(&tenant_key(name))? {
            if existing.created_at_ms == created_at_ms {
                return Ok(existing); // a retried create
            }
            return Err(StorageError::Conflict(format!(
                "the tenant {name:?} already exists"
            )));
        }
        let record = TenantRecord {
            name: name.to_string(),
            created_at_ms,
            limits: TenantLimits::default(),
        };
        pending.put(tenant_key(name), &record)?;
        Ok(record)
    }

    /// Replaces the limits of a tenant (see [`super::MetaOp::SetTenantLimits`]).
    pub(super) fn apply_set_tenant_limits(
        &self,
        pending: &mut Pending<'_>,
        name: &str,
        limits: &TenantLimits,
    ) -> Result<TenantRecord> {
        if name == DEFAULT_TENANT {
            return Err(StorageError::Invalid(
                "the default tenant has the node-wide limits".into(),
            ));
        }
        let Some(mut record) = pending.get::<TenantRecord>(&tenant_key(name))? else {
            return Err(StorageError::NotFound(format!("tenant {name:?}")));
        };
        record.limits = limits.clone();
        pending.put(tenant_key(name), &record)?;
        Ok(record)
    }

    /// Deletes a tenant that owns no KB any more: revokes its keys, deletes its sessions and
    /// the shares made to it. A tenant of the same name made later starts with nothing.
    pub(super) fn apply_delete_tenant(
        &self,
        pending: &mut Pending<'_>,
        name: &str,
        at_ms: u64,
    ) -> Result<Option<TenantDeleted>> {
        if name == DEFAULT_TENANT {
            return Err(StorageError::Invalid(
                "the default tenant cannot be deleted".into(),
            ));
        }
        if pending.get_raw(&tenant_key(name))?.is_none() {
            return Ok(None);
        }
        for (key, _) in pending.scan_prefix(KB_PREFIX)? {
            let kb_id = String::from_utf8_lossy(&key[KB_PREFIX.len()..]).into_owned();
            if pending.get_str(&kb_tenant_key(&kb_id))?.as_deref() == Some(name) {
                return Err(StorageError::Conflict(format!(
                    "the tenant {name:?} still owns knowledge bases: delete them first"
                )));
            }
        }
        let mut revoked_keys = Vec::new();
        for (key, value) in pending.scan_prefix(API_KEY_PREFIX)? {
            let mut record: ApiKeyRecord = decode(&value)?;
            if record.tenant != name {
                continue;
            }
            revoked_keys.push(record.id.clone());
            if record.revoked_at_ms.is_none() {
                record.revoked_at_ms = Some(at_ms);
                pending.put(key, &record)?;
            }
        }
        let mut sessions = Vec::new();
        for (_, value) in pending.scan_prefix(SESSION_PREFIX)? {
            let session: SessionRecord = decode(&value)?;
            if session
                .owner
                .as_ref()
                .is_some_and(|owner| revoked_keys.contains(owner))
            {
                sessions.push(session.id);
            }
        }
        for id in &sessions {
            self.apply_delete_session(pending, id)?;
        }
        let suffix = format!("/{name}");
        for (key, _) in pending.scan_prefix(KB_SHARE_PREFIX)? {
            if key.ends_with(suffix.as_bytes()) {
                pending.remove(key);
            }
        }
        pending.remove(tenant_key(name));
        Ok(Some(TenantDeleted {
            name: name.to_string(),
            revoked_keys,
            sessions,
        }))
    }

    /// Creates a KB of `tenant` (see [`super::MetaOp::CreateTenantKb`]).
    pub(super) fn apply_create_tenant_kb(
        &self,
        pending: &mut Pending<'_>,
        tenant: &str,
        kb: &KbRecord,
    ) -> Result<KbRecord> {
        if let Some(existing) = pending.get::<KbRecord>(&kb_key(&kb.id))? {
            return Ok(existing); // a retried create
        }
        if !self.tenant_exists_in(pending, tenant)? {
            return Err(StorageError::NotFound(format!("tenant {tenant:?}")));
        }
        let name_key = tenant_kb_name_key(tenant, &kb.name);
        if pending.get_raw(&name_key)?.is_some() {
            return Err(StorageError::Conflict(format!(
                "a knowledge base named {:?} already exists",
                kb.name
            )));
        }
        pending.put(kb_key(&kb.id), kb)?;
        pending.put_str(name_key, &kb.id);
        if tenant != DEFAULT_TENANT {
            pending.put_str(kb_tenant_key(&kb.id), tenant);
        }
        Ok(kb.clone())
    }

    /// Removes what ties a deleted KB to its tenant: its name, its owner, its shares.
    pub(super) fn remove_kb_tenancy(&self, pending: &mut Pending<'_>, kb: &KbRecord) -> Result<()> {
        let tenant = pending
            .get_str(&kb_tenant_key(&kb.id))?
            .unwrap_or_else(|| DEFAULT_TENANT.to_string());
        pending.remove(tenant_kb_name_key(&tenant, &kb.name));
        pending.remove(kb_tenant_key(&kb.id));
        for (key, _) in pending.scan_prefix(&kb_share_prefix(&kb.id))? {
            pending.remove(key);
        }
        Ok(())
    }

    /// Shares a KB with `tenant` read-only, or stops sharing it; the tenants it is shared
    /// with afterwards.
    pub(super) fn apply_share_kb(
        &self,
        pending: &mut Pending<'_>,
        kb_id: &str,
        tenant: &str,
        shared: bool,
    ) -> Result<Vec<String>> {
        if pending.get_raw(&kb_key(kb_id))?.is_none() {
            return Err(StorageError::NotFound(format!("knowledge base {kb_id}")));
        }
        let owner = pending
            .get_str(&kb_tenant_key(kb_id))?
            .unwrap_or_else(|| DEFAULT_TENANT.to_string());
        if shared {
            if !self.tenant_exists_in(pending, tenant)? {
                return Err(StorageError::NotFound(format!("tenant {tenant:?}")));
            }
            if owner == tenant {
                return Err(StorageError::Invalid(
                    "a knowledge base is not shared with its own tenant".into(),
                ));
            }
            pending.put_str(kb_share_key(kb_id, tenant), "1");
        } else {
            pending.remove(kb_share_key(kb_id, tenant));
        }
        let prefix = kb_share_prefix(kb_id);
        Ok(pending
            .scan_prefix(&prefix)?
            .into_iter()
            .map(|(key, _)| String::from_utf8_lossy(&key[prefix.len()..]).into_owned())
            .collect())
    }
}
