//! The key layout of the metadata tree (the sled tree `meta`): every key the state machine
//! writes, and the functions that build them. Keys are prefixed by kind; values are JSON
//! unless said otherwise; "text" is UTF-8 bytes, not JSON. Numbers inside keys are
//! zero-padded so that key order is numeric order.
//!
//! | key | value |
//! |---|---|
//! | `kb/{kb_id}` | [`KbRecord`] |
//! | `kbname/{name}` | kb id (text): a KB of the default tenant |
//! | `kbname/{tenant}:{name}` | kb id (text): a KB of another tenant |
//! | `kbtenant/{kb_id}` | tenant name (text); none: the default tenant |
//! | `kbshare/{kb_id}/{tenant}` | `1` (text): the KB is shared read-only with the tenant |
//! | `tenant/{name}` | [`TenantRecord`] (the default tenant has none) |
//! | `doc/{kb_id}/{doc_id}` | [`DocumentRecord`] |
//! | `docext/{kb_id}/{external_id}` | doc id (text) |
//! | `dochash/{kb_id}/{content_hash}` | doc id (text) |
//! | `tomb/{kb_id}/{doc_id}` | [`Tombstone`] |
//! | `pend/{kb_id}/{doc_id}` | [`PendingWork`]: an unfinished document and its worker |
//! | `shardbytes/{kb_id}/{shard:010}` | `u64`: raw bytes of the shard's live documents |
//! | `drain/{node:020}` | `1` (text): the node is draining |
//! | `sess/{session_id}` | [`SessionRecord`] |
//! | `turn/{session_id}/{seq:010}` | [`StoredTurn`] |
//! | `turnmsg/{session_id}/{message_id}` | seq of the turn (decimal text): idempotent appends |
//! | `audit/{id}` | [`AuditEntry`]: one audited request (UUIDv7 ids: time order) |
//! | `apikey/{id}` | [`ApiKeyRecord`]: a key's hash, role, expiry, revocation |
//! | `opid/{op_id}` | `(u64, MetaOutcome)`: log index and outcome of an op with an id |
//! | `opindex/{index:020}` | op id (text) applied at that index: the op-id window |
//! | `index/derived/v1` | `1` (text): `pend/` and `shardbytes/` cover every document |
//! | `applied` | last applied log index (`u64`, 8 bytes big-endian, not JSON) |
//!
//! `pend/` and `shardbytes/` are derived from `doc/`: the store builds them when opened if
//! `index/derived/v1` is missing. Every key but `applied` is part of a state export.
//!
//! [`KbRecord`]: super::KbRecord
//! [`DocumentRecord`]: super::DocumentRecord
//! [`Tombstone`]: super::Tombstone
//! [`PendingWork`]: super::PendingWork
//! [`SessionRecord`]: super::SessionRecord
//! [`StoredTurn`]: super::StoredTurn
//! [`ApiKeyRecord`]: super::ApiKeyRecord
//! [`TenantRecord`]: super::TenantRecord
//! [`AuditEntry`]: super::AuditEntry

/// The last applied log index.
pub(super) const APPLIED_KEY: &[u8] = b"applied";
/// Set once the derived indexes (pending work, bytes per shard) cover every document: stores
/// written before they existed build them when opened.
pub(super) const PENDING_INDEX_KEY: &[u8] = b"index/derived/v1";

/// Every KB record.
pub(super) const KB_PREFIX: &[u8] = b"kb/";
/// Every document record of every KB.
pub(super) const DOC_PREFIX: &[u8] = b"doc/";
/// Every pending-work entry.
pub(super) const PENDING_PREFIX: &[u8] = b"pend/";
/// Every shard byte count.
pub(super) const SHARD_BYTES_PREFIX: &[u8] = b"shardbytes/";
/// Every draining mark.
pub(super) const DRAIN_PREFIX: &[u8] = b"drain/";
/// Every session record.
pub(super) const SESSION_PREFIX: &[u8] = b"sess/";
/// Every API key record.
pub(super) const API_KEY_PREFIX: &[u8] = b"apikey/";

/// Every audit entry.
pub(super) const AUDIT_PREFIX: &[u8] = b"audit/";
pub(super) fn audit_key(id: &str) -> Vec<u8> {
    format!("audit/{id}").into_bytes()
}
/// Every tenant record.
pub(super) const TENANT_PREFIX: &[u8] = b"tenant/";
/// Every share of every KB.
pub(super) const KB_SHARE_PREFIX: &[u8] = b"kbshare/";

/// The name key of a KB of `tenant` (the default tenant's keep the form from before tenants).
pub(super) fn tenant_kb_name_key(tenant: &str, name: &str) -> Vec<u8> {
    if tenant == super::DEFAULT_TENANT {
        kb_name_key(name)
    } else {
        format!("kbname/{tenant}:{name}").into_bytes()
    }
}
pub(super) fn kb_tenant_key(kb_id: &str) -> Vec<u8> {
    format!("kbtenant/{kb_id}").into_bytes()
}
pub(super) fn kb_share_prefix(kb_id: &str) -> Vec<u8> {
    format!("kbshare/{kb_id}/").into_bytes()
}
pub(super) fn kb_share_key(kb_id: &str, tenant: &str) -> Vec<u8> {
    format!("kbshare/{kb_id}/{tenant}").into_bytes()
}
pub(super) fn tenant_key(name: &str) -> Vec<u8> {
    format!("tenant/{name}").into_bytes()
}
pub(super) fn kb_key(kb_id: &str) -> Vec<u8> {
    format!("kb/{kb_id}").into_bytes()
}
pub(super) fn kb_name_key(name: &str) -> Vec<u8> {
    format!("kbname/{name}").into_bytes()
}
pub(super) fn doc_prefix(kb_id: &str) -> Vec<u8> {
    format!("doc/{kb_id}/").into_bytes()
}
pub(super) fn doc_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("doc/{kb_id}/{doc_id}").into_bytes()
}
pub(super) fn ext_prefix(kb_id: &str) -> Vec<u8> {
    format!("docext/{kb_id}/").into_bytes()
}
pub(super) fn ext_key(kb_id: &str, external_id: &str) -> Vec<u8> {
    format!("docext/{kb_id}/{external_id}").into_bytes()
}
pub(super) fn hash_prefix(kb_id: &str) -> Vec<u8> {
    format!("dochash/{kb_id}/").into_bytes()
}
pub(super) fn hash_key(kb_id: &str, hash: &str) -> Vec<u8> {
    format!("dochash/{kb_id}/{hash}").into_bytes()
}
pub(super) fn tomb_prefix(kb_id: &str) -> Vec<u8> {
    format!("tomb/{kb_id}/").into_bytes()
}
pub(super) fn tomb_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("tomb/{kb_id}/{doc_id}").into_bytes()
}
pub(super) fn pending_prefix(kb_id: &str) -> Vec<u8> {
    format!("pend/{kb_id}/").into_bytes()
}
pub(super) fn pending_key(kb_id: &str, doc_id: &str) -> Vec<u8> {
    format!("pend/{kb_id}/{doc_id}").into_bytes()
}
pub(super) fn shard_bytes_prefix(kb_id: &str) -> Vec<u8> {
    format!("shardbytes/{kb_id}/").into_bytes()
}
pub(super) fn shard_bytes_key(kb_id: &str, shard: u32) -> Vec<u8> {
    format!("shardbytes/{kb_id}/{shard:010}").into_bytes()
}
pub(super) fn drain_key(node: u64) -> Vec<u8> {
    format!("drain/{node:020}").into_bytes()
}
pub(super) fn api_key_key(id: &str) -> Vec<u8> {
    format!("apikey/{id}").into_bytes()
}
pub(super) fn session_key(id: &str) -> Vec<u8> {
    format!("sess/{id}").into_bytes()
}
pub(super) fn turn_prefix(session_id: &str) -> Vec<u8> {
    format!("turn/{session_id}/").into_bytes()
}
pub(super) fn turn_key(session_id: &str, seq: u32) -> Vec<u8> {
    format!("turn/{session_id}/{seq:010}").into_bytes()
}
pub(super) fn turn_message_prefix(session_id: &str) -> Vec<u8> {
    format!("turnmsg/{session_id}/").into_bytes()
}
pub(super) fn turn_message_key(session_id: &str, message_id: &str) -> Vec<u8> {
    format!("turnmsg/{session_id}/{message_id}").into_bytes()
}
pub(super) fn op_id_key(op_id: &str) -> Vec<u8> {
    format!("opid/{op_id}").into_bytes()
}
pub(super) fn op_index_key(index: u64) -> Vec<u8> {
    format!("opindex/{index:020}").into_bytes()
}

/// The part of `key` after `prefix`, as text (lossy).
pub(super) fn key_tail(key: &[u8], prefix: &[u8]) -> String {
    String::from_utf8_lossy(&key[prefix.len()..]).into_owned()
}
