//! Read queries of the store. They read sled directly (never the pending overlay of a batch
//! being applied), so they see the state as of the last written batch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::keys::{
    DOC_PREFIX, DRAIN_PREFIX, KB_PREFIX, PENDING_PREFIX, SHARD_BYTES_PREFIX, doc_key, doc_prefix,
    ext_key, kb_key, kb_name_key, key_tail, pending_key, shard_bytes_prefix, tomb_key, tomb_prefix,
};
use super::records::{DocStatus, DocumentRecord, KbRecord, PendingWork, Tombstone};
use super::{SledMetaStore, decode};
use crate::error::Result;

/// Document counts of a KB by status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DocumentCounts {
    pub total: u64,
    #[serde(flatten)]
    pub by_status: BTreeMap<DocStatus, u64>,
}

/// `total`, then one count per status that has documents (written by hand: the statuses are
/// flattened into the object).
impl utoipa::PartialSchema for DocumentCounts {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let count = || {
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                    utoipa::openapi::KnownFormat::Int64,
                )))
                .minimum(Some(0))
        };
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("total", count())
            .required("total")
            .additional_properties(Some(
                utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
            ));
        for status in DocStatus::ALL {
            object = object.property(status.as_str(), count());
        }
        object.into()
    }
}

impl utoipa::ToSchema for DocumentCounts {}

/// The documents of a KB a caller may read: their counts by status and their chunks (one
/// pass over the KB's document records).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadableDocuments {
    pub counts: DocumentCounts,
    /// The chunks of those documents (none until a document is ready).
    pub chunks: u64,
}

/// What a KB holds, for the per-KB gauges of `/metrics`: its document records (any status),
/// their chunks and their raw bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KbUsage {
    pub documents: u64,
    pub chunks: u64,
    pub bytes: u64,
}

/// One entry of the pending-work index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingDocument {
    pub kb_id: String,
    pub document_id: String,
    pub work: PendingWork,
}

impl SledMetaStore {
    /// The pending-work entry of one document (none once it is ready, failed or deleted).
    pub fn pending_work(&self, kb_id: &str, doc_id: &str) -> Result<Option<PendingWork>> {
        self.tree
            .get(pending_key(kb_id, doc_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// The raw bytes of the live documents of every shard of every KB: `(kb_id, shard)` ->
    /// bytes (placement balances nodes by replica count, then by bytes).
    pub fn shard_bytes(&self) -> Result<BTreeMap<(String, u32), u64>> {
        let mut bytes = BTreeMap::new();
        for item in self.tree.scan_prefix(SHARD_BYTES_PREFIX) {
            let (key, value) = item?;
            let key = key_tail(&key, SHARD_BYTES_PREFIX);
            if let Some((kb_id, shard)) = key.split_once('/')
                && let Ok(shard) = shard.parse()
            {
                bytes.insert((kb_id.to_string(), shard), decode(&value)?);
            }
        }
        Ok(bytes)
    }

    /// The raw bytes of a KB's live documents: the sum of its shards' counts (one key per
    /// shard read; no document record).
    pub fn kb_stored_bytes(&self, kb_id: &str) -> Result<u64> {
        let mut total: u64 = 0;
        for item in self.tree.scan_prefix(shard_bytes_prefix(kb_id)) {
            let (_, value) = item?;
            total = total.saturating_add(decode(&value)?);
        }
        Ok(total)
    }

    /// Nodes being drained before their removal, in id order.
    pub fn draining_nodes(&self) -> Result<Vec<u64>> {
        let mut nodes = Vec::new();
        for item in self.tree.scan_prefix(DRAIN_PREFIX) {
            let (key, _) = item?;
            if let Ok(node) = key_tail(&key, DRAIN_PREFIX).parse() {
                nodes.push(node);
            }
        }
        Ok(nodes)
    }

    /// Every unfinished document with the node that ingests it, in key order.
    pub fn pending_documents(&self) -> Result<Vec<PendingDocument>> {
        let mut pending = Vec::new();
        for item in self.tree.scan_prefix(PENDING_PREFIX) {
            let (key, value) = item?;
            let key = key_tail(&key, PENDING_PREFIX);
            let Some((kb_id, document_id)) = key.split_once('/') else {
                continue;
            };
            pending.push(PendingDocument {
                kb_id: kb_id.to_string(),
                document_id: document_id.to_string(),
                work: decode(&value)?,
            });
        }
        Ok(pending)
    }

    pub fn get_kb(&self, kb_id: &str) -> Result<Option<KbRecord>> {
        self.tree
            .get(kb_key(kb_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Looks a KB up by id, then by name.
    pub fn find_kb(&self, id_or_name: &str) -> Result<Option<KbRecord>> {
        if let Some(kb) = self.get_kb(id_or_name)? {
            return Ok(Some(kb));
        }
        match self.tree.get(kb_name_key(id_or_name))? {
            Some(id) => self.get_kb(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    pub fn list_kbs(&self) -> Result<Vec<KbRecord>> {
        let mut kbs = Vec::new();
        for item in self.tree.scan_prefix(KB_PREFIX) {
            let (_, value) = item?;
            kbs.push(decode::<KbRecord>(&value)?);
        }
        kbs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(kbs)
    }

    pub fn get_document(&self, kb_id: &str, doc_id: &str) -> Result<Option<DocumentRecord>> {
        self.tree
            .get(doc_key(kb_id, doc_id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// Looks a document up by id, then by external id.
    pub fn find_document(
        &self,
        kb_id: &str,
        id_or_external: &str,
    ) -> Result<Option<DocumentRecord>> {
        if let Some(doc) = self.get_document(kb_id, id_or_external)? {
            return Ok(Some(doc));
        }
        match self.tree.get(ext_key(kb_id, id_or_external))? {
            Some(id) => self.get_document(kb_id, &String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// Documents of a KB in id order (ids are time-ordered), starting after `after`.
    pub fn list_documents(
        &self,
        kb_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DocumentRecord>> {
        let prefix = doc_prefix(kb_id);
        let start = match after {
            Some(after) => {
                let mut key = doc_key(kb_id, after);
                key.push(0);
                key
            }
            None => prefix.clone(),
        };
        let mut docs = Vec::new();
        for item in self.tree.range(start..) {
            let (key, value) = item?;
            if !key.starts_with(&prefix) || docs.len() >= limit {
                break;
            }
            docs.push(decode::<DocumentRecord>(&value)?);
        }
        Ok(docs)
    }

    /// Every live document of every KB that is not in a terminal state: work to resume.
    pub fn unfinished_documents(&self) -> Result<Vec<DocumentRecord>> {
        let mut docs = Vec::new();
        for item in self.tree.scan_prefix(DOC_PREFIX) {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            if !doc.status.is_terminal() {
                docs.push(doc);
            }
        }
        Ok(docs)
    }

    /// How many documents a KB holds, whatever their status (their records are not read).
    pub fn document_total(&self, kb_id: &str) -> Result<u64> {
        let mut total = 0;
        for item in self.tree.scan_prefix(doc_prefix(kb_id)) {
            item?;
            total += 1;
        }
        Ok(total)
    }

    /// Whether a document of the KB has this external id (a new one of it replaces it).
    pub fn has_external_id(&self, kb_id: &str, external_id: &str) -> Result<bool> {
        Ok(self.tree.contains_key(ext_key(kb_id, external_id))?)
    }

    /// The documents of a KB by status, counting only those `counted` keeps (a caller's
    /// readable ones: a count must not reveal documents the caller cannot see).
    pub fn document_counts(
        &self,
        kb_id: &str,
        counted: impl Fn(&DocumentRecord) -> bool,
    ) -> Result<DocumentCounts> {
        Ok(self.readable_documents(kb_id, counted)?.counts)
    }

    /// The documents of a KB that `counted` keeps, by status, and their chunks.
    pub fn readable_documents(
        &self,
        kb_id: &str,
        counted: impl Fn(&DocumentRecord) -> bool,
    ) -> Result<ReadableDocuments> {
        let mut readable = ReadableDocuments::default();
        let counts = &mut readable.counts;
        for status in DocStatus::ALL {
            counts.by_status.insert(status, 0);
        }
        for item in self.tree.scan_prefix(doc_prefix(kb_id)) {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            if !counted(&doc) {
                continue;
            }
            counts.total += 1;
            *counts.by_status.entry(doc.status).or_default() += 1;
            readable.chunks += u64::from(doc.chunk_count);
        }
        Ok(readable)
    }

    /// The documents, chunks and raw bytes of a KB: one pass over its document records.
    pub fn kb_usage(&self, kb_id: &str) -> Result<KbUsage> {
        let mut usage = KbUsage::default();
        for item in self.tree.scan_prefix(doc_prefix(kb_id)) {
            let (_, value) = item?;
            let doc: DocumentRecord = decode(&value)?;
            usage.documents += 1;
            usage.chunks += u64::from(doc.chunk_count);
            usage.bytes += doc.size_bytes;
        }
        Ok(usage)
    }

    pub fn is_tombstoned(&self, kb_id: &str, doc_id: &str) -> Result<bool> {
        Ok(self.tree.contains_key(tomb_key(kb_id, doc_id))?)
    }

    pub fn tombstones(&self, kb_id: &str) -> Result<Vec<Tombstone>> {
        let mut tombs = Vec::new();
        for item in self.tree.scan_prefix(tomb_prefix(kb_id)) {
            let (_, value) = item?;
            tombs.push(decode(&value)?);
        }
        Ok(tombs)
    }
}
