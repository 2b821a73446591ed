//! The ops of the state machine and what applying them produces. [`MetaOp`] is the entry of
//! the metadata log (bincode in the Raft log) and [`MetaOutcome`] is remembered per op id
//! (JSON in sled): variant names, their order and field names are the encoded form; add
//! variants at the end, never rename or reorder.

use serde::{Deserialize, Serialize};

use super::api_keys::{ApiKeyFields, ApiKeyRecord};
use super::audit::AuditEntry;
use super::records::{DocStatus, DocumentRecord, KbRecord, KbSettings, ReplicaState, Tombstone};
use super::sessions::{SessionRecord, StoredTurn};
use super::tenants::{TenantDeleted, TenantRecord};

/// One document's move to another ingestion stage (see [`MetaOp::SetDocumentStatus`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusUpdate {
    pub document_id: String,
    pub status: DocStatus,
    pub error: Option<String>,
    pub chunk_count: Option<u32>,
    /// Sets [`DocumentRecord::pages_needing_ocr`] when given; absent in ops written before it
    /// existed.
    #[serde(default)]
    pub pages_needing_ocr: Option<u32>,
}

/// A metadata change. Ops carry every id and timestamp they need, so applying one is
/// deterministic and a retried op is recognised (idempotent) instead of applied twice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaOp {
    CreateKb(KbRecord),
    UpdateKb {
        kb_id: String,
        settings: KbSettings,
        at_ms: u64,
    },
    DeleteKb {
        kb_id: String,
    },
    /// Registers documents; one with the same content hash as a live document of the KB is a
    /// duplicate (the existing document is returned); one whose external id names a live
    /// document with other content replaces it (the old one is tombstoned).
    RegisterDocuments {
        kb_id: String,
        documents: Vec<DocumentRecord>,
    },
    /// Moves documents through the ingestion stages. A document that is already ready or
    /// failed is left alone (a second worker that processed it too cannot undo the result).
    SetDocumentStatus {
        kb_id: String,
        updates: Vec<StatusUpdate>,
        at_ms: u64,
    },
    DeleteDocument {
        kb_id: String,
        document_id: String,
        at_ms: u64,
    },
    /// Changes the state of one replica of a shard. `expected`, when given, must be the
    /// replica's current state (a compare-and-set: a stale writer cannot mark dead a replica
    /// that was repaired meanwhile); otherwise the op changes nothing.
    SetReplicaState {
        kb_id: String,
        shard: u32,
        node: u64,
        state: ReplicaState,
        expected: Option<ReplicaState>,
        at_ms: u64,
    },
    /// Places a new replica of a shard on `node` (state `initializing`: its node fills it
    /// from an active replica). Nothing changes when the node already holds one.
    AddReplica {
        kb_id: String,
        shard: u32,
        node: u64,
        at_ms: u64,
    },
    /// Removes the replica of a shard on `node`; refused when no other active replica of the
    /// shard would be left.
    RemoveReplica {
        kb_id: String,
        shard: u32,
        node: u64,
        at_ms: u64,
    },
    /// Forgets a tombstone once every replica has purged the document.
    ForgetTombstone {
        kb_id: String,
        document_id: String,
    },
    /// Creates a chat session (a retried create returns the existing one).
    CreateSession {
        id: String,
        kbs: Vec<String>,
        agent: String,
        created_at_ms: u64,
    },
    /// Deletes a session and its turns.
    DeleteSession {
        id: String,
    },
    /// Stores a finished turn; idempotent by `turn.message_id`.
    AppendTurn {
        session_id: String,
        turn: StoredTurn,
    },
    /// Stores the summary of the oldest `summary_turns` turns of a session.
    SetHistorySummary {
        session_id: String,
        summary: Option<String>,
        summary_turns: u32,
        at_ms: u64,
    },
    /// [`MetaOp::RegisterDocuments`] with the node that ingests each document (`workers[i]`
    /// for `documents[i]`): the pending-work index records it until the document is ready,
    /// failed or deleted, so the leader can hand the work of a dead node to another one.
    RegisterDocumentsTo {
        kb_id: String,
        documents: Vec<DocumentRecord>,
        workers: Vec<u64>,
    },
    /// Hands the unfinished documents of `kb_id` assigned to `from` to `to` (a compare-and-set
    /// per document: ones finished or reassigned meanwhile are left alone).
    ReassignDocuments {
        kb_id: String,
        document_ids: Vec<String>,
        from: u64,
        to: u64,
    },
    /// Marks a node as draining (its replicas are re-created elsewhere, then the leader
    /// removes it from the cluster), or clears the mark.
    SetNodeDraining {
        node: u64,
        draining: bool,
    },
    /// Stores a new API key of the default tenant (a retried create with the same secret
    /// hash returns it; another key with the same id is a conflict).
    CreateApiKey(ApiKeyFields),
    /// [`MetaOp::CreateSession`] for the API key `owner`: only it (and admins) may see the
    /// session.
    CreateOwnedSession {
        id: String,
        kbs: Vec<String>,
        agent: String,
        created_at_ms: u64,
        owner: String,
    },
    /// Revokes an API key: refused on every node once applied there. Revoking twice keeps
    /// the first time.
    RevokeApiKey {
        id: String,
        at_ms: u64,
    },
    /// Creates a tenant (a retried create returns it; another of the same name is a
    /// conflict; the default tenant always exists).
    CreateTenant {
        name: String,
        created_at_ms: u64,
    },
    /// Deletes a tenant that owns no KB: revokes its keys, deletes its sessions and the
    /// shares made to it.
    DeleteTenant {
        name: String,
        at_ms: u64,
    },
    /// [`MetaOp::CreateKb`] for `tenant`: the name is unique within the tenant.
    CreateTenantKb {
        tenant: String,
        kb: KbRecord,
    },
    /// Shares a KB read-only with another tenant (`shared`), or stops sharing it.
    ShareKb {
        kb_id: String,
        tenant: String,
        shared: bool,
    },
    /// [`MetaOp::CreateApiKey`] for a key of `tenant` that may read the documents of
    /// `groups` besides those open to all.
    CreateTenantApiKey {
        key: ApiKeyFields,
        tenant: String,
        groups: Vec<String>,
    },
    /// Appends an entry to the audit log, and forgets entries made before
    /// `forget_before_ms` (the retention is the proposer's; applying stays deterministic).
    AppendAudit {
        entry: AuditEntry,
        forget_before_ms: u64,
    },
    /// Replaces the limits of a tenant (not the default one, which has the node-wide
    /// settings).
    SetTenantLimits {
        name: String,
        limits: sift_api::TenantLimits,
    },
}

/// The outcome of registering one document (see [`MetaOp::RegisterDocuments`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registered {
    pub record: DocumentRecord,
    /// True when the same bytes were already in the KB: `record` is the existing document.
    pub duplicate: bool,
    /// The document this one replaced (same external id, other content).
    pub replaced: Option<Tombstone>,
}

/// What applying an op produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MetaOutcome {
    Kb(KbRecord),
    KbDeleted {
        kb: KbRecord,
        documents: Vec<Tombstone>,
    },
    Registered(Vec<Registered>),
    /// Status updates: the records as they now are; ids no longer present are skipped.
    Statuses(Vec<DocumentRecord>),
    DocumentDeleted(Tombstone),
    /// The op changed nothing (e.g. a repeated delete).
    Unchanged,
    Session(SessionRecord),
    SessionDeleted(SessionRecord),
    TurnAppended(StoredTurn),
    /// The documents a [`MetaOp::ReassignDocuments`] moved.
    Reassigned(Vec<String>),
    /// A node's draining mark changed.
    Draining {
        node: u64,
        draining: bool,
    },
    ApiKey(ApiKeyRecord),
    Tenant(TenantRecord),
    TenantDeleted(TenantDeleted),
    /// The tenants a KB is shared with after a [`MetaOp::ShareKb`].
    Shares {
        kb_id: String,
        tenants: Vec<String>,
    },
}
