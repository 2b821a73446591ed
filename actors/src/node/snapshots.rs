//! Snapshots of chosen KBs (`POST /v1/snapshots`) and their restore as a new single-node
//! cluster (`sift restore`). The files are `sift_storage::backup`'s; the ADR is
//! docs/adr/0022-snapshots.md.
//!
//! A snapshot reads every shard first, then the metadata:
//! 1. each shard of each KB, from one active replica (local or remote, like a repair): its
//!    documents whole, vectors included;
//! 2. after a ReadIndex, the metadata state at an applied index `I` (one export under the
//!    state machine's lock);
//! 3. the raw bytes of every live document of those KBs whose chunks step 1 did not see
//!    (unfinished at `I`, or made ready after its shard was read).
//!
//! A restore holds the metadata at `I`: a document ready or in progress at `I` is ready
//! again if its chunks were read (a shard write is whole per document), queued again if its raw
//! bytes were, and `failed` (`not_in_snapshot`) only when neither could be read; a document
//! deleted at `I` is not restored, whatever step 1 saw.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use sift_storage::StorageError;
use sift_storage::backup::{
    self, Manifest, ManifestKb, RecordReader, RecordWriter, SNAPSHOT_FORMAT, SnapshotWriter,
};
use sift_storage::chunk::DocumentWrite;
use sift_storage::data_dir::FORMAT_VERSION;
use sift_storage::meta::{DocStatus, KbRecord, RestorePlan, RestoreSummary, SledMetaStore};
use sift_storage::shard::{ShardConfig, ShardIndex};
use tracing::info;

use super::SiftNode;
use crate::error::{Result, SiftError};
use crate::ingest::pipeline::now_ms;
use crate::ingest::raw_store::RawStore;
use crate::scope::{Need, Scope};
use crate::shards::access::unexpected;
use crate::shards::rpc::{RawDocument, SINGLE_NODE_ID};
use crate::shards::{ShardError, ShardMessage, ShardReply, ShardRpc};

/// Documents read from a replica per request.
const EXPORT_BATCH_DOCUMENTS: usize = 64;
/// The most KBs one snapshot names.
pub const MAX_SNAPSHOT_KBS: usize = 256;
/// The metadata file of a snapshot.
const META_FILE: &str = "meta.bin";
/// The raw bytes of documents whose chunks the snapshot does not hold.
const RAW_FILE: &str = "raw.bin";

fn shard_file(kb_id: &str, shard: u32) -> String {
    format!("shards/{kb_id}/{shard}")
}

/// A storage failure of a snapshot: a full disk is `insufficient_storage` (507).
fn storage_failure(error: StorageError) -> SiftError {
    match &error {
        StorageError::Io(io) if io.kind() == std::io::ErrorKind::StorageFull => {
            SiftError::InsufficientStorage {
                message: format!("the snapshot directory's disk is full: {io}"),
            }
        }
        _ => SiftError::Storage(error),
    }
}

impl SiftNode {
    /// Writes a consistent snapshot of `kbs` (ids of any tenant's KBs, or names in `scope`)
    /// into a new directory of `root`; returns its manifest.
    pub async fn snapshot(&self, scope: &Scope, kbs: &[String], root: &Path) -> Result<Manifest> {
        if kbs.is_empty() {
            return Err(SiftError::Invalid {
                code: "invalid_request",
                message: "name at least one knowledge base in \"kbs\"".into(),
            });
        }
        if kbs.len() > MAX_SNAPSHOT_KBS {
            return Err(SiftError::Invalid {
                code: "invalid_request",
                message: format!("a snapshot holds at most {MAX_SNAPSHOT_KBS} knowledge bases"),
            });
        }
        let mut records: Vec<KbRecord> = Vec::new();
        for kb in kbs {
            let record = match self.store().get_kb(kb)? {
                Some(record) => record,
                None => self.find_kb(scope, kb, Need::Read)?,
            };
            if !records.iter().any(|known| known.id == record.id) {
                records.push(record);
            }
        }
        let id = uuid::Uuid::now_v7().to_string();
        let started = std::time::Instant::now();
        let writer = {
            let root = root.to_path_buf();
            let id = id.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&root)?;
                SnapshotWriter::create(&root, &id)
            })
            .await
            .map_err(|error| SiftError::Internal(error.to_string()))?
            .map_err(storage_failure)?
        };
        let mut writer = writer;
        // 1. the shards
        let mut chunked: HashSet<String> = HashSet::new();
        let mut counts: HashMap<String, u64> = HashMap::new();
        for kb in &records {
            for shard in 0..kb.settings.shards {
                let file = writer
                    .records(&shard_file(&kb.id, shard))
                    .map_err(storage_failure)?;
                let (file, ids) = self.copy_shard(kb, shard, file).await?;
                *counts.entry(kb.id.clone()).or_default() += ids.len() as u64;
                chunked.extend(ids);
                writer.add(blocking(move || file.finish()).await?);
            }
        }
        // 2. the metadata, fresh
        self.context.meta.linearizable_barrier().await?;
        let store = self.store().clone();
        let (state, meta_index) = blocking(move || {
            use sift_storage::meta::MetaStateMachine;
            let index = store.applied_index();
            Ok((store.export_state()?, index))
        })
        .await?;
        let state_bytes = state.len();
        writer = {
            let mut writer = writer;
            blocking(move || {
                writer.file(META_FILE, &state)?;
                Ok(writer)
            })
            .await?
        };
        // 3. raw bytes of what the shards did not show
        let mut raw_counts: HashMap<String, u64> = HashMap::new();
        let mut file = writer.records(RAW_FILE).map_err(storage_failure)?;
        for kb in &records {
            let mut after: Option<String> = None;
            loop {
                let page = self.store().list_documents(&kb.id, after.as_deref(), 512)?;
                let Some(last) = page.last() else { break };
                after = Some(last.id.clone());
                for record in page {
                    if record.status == DocStatus::Failed || chunked.contains(&record.id) {
                        continue;
                    }
                    if let Some(bytes) = self.raw_bytes(kb, &record).await {
                        let document = RawDocument {
                            document_id: record.id.clone(),
                            upload: RawStore::is_upload(&record),
                            bytes,
                        };
                        file = blocking(move || {
                            file.write(&document)?;
                            Ok(file)
                        })
                        .await?;
                        *raw_counts.entry(kb.id.clone()).or_default() += 1;
                    }
                }
            }
        }
        writer.add(blocking(move || file.finish()).await?);
        let mut manifest_kbs = Vec::new();
        for kb in &records {
            manifest_kbs.push(ManifestKb {
                id: kb.id.clone(),
                name: kb.name.clone(),
                tenant: self.store().kb_tenant(&kb.id)?,
                shards: kb.settings.shards,
                documents: counts.get(&kb.id).copied().unwrap_or(0),
                raw_documents: raw_counts.get(&kb.id).copied().unwrap_or(0),
                settings: kb.settings.clone(),
            });
        }
        let manifest = Manifest {
            snapshot_format: SNAPSHOT_FORMAT,
            data_dir_format: FORMAT_VERSION,
            sift_version: env!("CARGO_PKG_VERSION").to_string(),
            id: id.clone(),
            created_at_ms: now_ms(),
            meta_index,
            kbs: manifest_kbs,
            files: Vec::new(),
        };
        let written = manifest.clone();
        let dir = blocking(move || writer.finish(written)).await?;
        let manifest = backup::read_manifest(&dir).map_err(SiftError::Storage)?;
        metrics::counter!("sift_snapshots_total").increment(1);
        metrics::counter!("sift_snapshot_bytes_total").increment(manifest.total_bytes());
        info!(
            snapshot = %id,
            kbs = manifest.kbs.len(),
            bytes = manifest.total_bytes(),
            metadata_bytes = state_bytes,
            seconds = started.elapsed().as_secs_f64(),
            "snapshot written"
        );
        Ok(manifest)
    }

    /// Copies one shard's documents from an active replica into `file`; returns the file and
    /// the ids copied. Tries each replica of the read plan in turn.
    async fn copy_shard(
        &self,
        kb: &KbRecord,
        shard: u32,
        mut file: RecordWriter,
    ) -> Result<(RecordWriter, Vec<String>)> {
        let access = &self.context.access;
        let mut failures = Vec::new();
        for node in access.read_plan(kb, shard) {
            match self.replica_ids(kb, shard, node).await {
                Ok(ids) => {
                    let mut copied = Vec::with_capacity(ids.len());
                    for batch in ids.chunks(EXPORT_BATCH_DOCUMENTS) {
                        let documents = self
                            .replica_export(kb, shard, node, batch.to_vec())
                            .await
                            .map_err(|error| SiftError::ShardUnavailable {
                                kb_id: kb.id.clone(),
                                shard,
                                reason: error.to_string(),
                            })?;
                        copied.extend(documents.iter().map(|d| d.entry.document_id.clone()));
                        file = blocking(move || {
                            for document in &documents {
                                file.write(document)?;
                            }
                            Ok(file)
                        })
                        .await?;
                    }
                    return Ok((file, copied));
                }
                Err(error) => failures.push((node, error)),
            }
        }
        Err(SiftError::ShardUnavailable {
            kb_id: kb.id.clone(),
            shard,
            reason: if failures.is_empty() {
                "no active replica".into()
            } else {
                ShardError::Replicas(failures).to_string()
            },
        })
    }

    async fn replica_ids(
        &self,
        kb: &KbRecord,
        shard: u32,
        node: u64,
    ) -> std::result::Result<Vec<String>, ShardError> {
        let access = &self.context.access;
        let timeout = access.options().remote_write_timeout;
        if node == access.local_id() {
            return access
                .local_call(&kb.id, shard, timeout, |reply| ShardMessage::DocumentIds {
                    reply,
                })
                .await;
        }
        let rpc = ShardRpc::DocumentIds {
            kb_id: kb.id.clone(),
            shard,
        };
        match access.remote_call(node, &rpc, timeout).await? {
            ShardReply::DocumentIds(ids) => Ok(ids),
            other => Err(unexpected(other)),
        }
    }

    async fn replica_export(
        &self,
        kb: &KbRecord,
        shard: u32,
        node: u64,
        document_ids: Vec<String>,
    ) -> std::result::Result<Vec<DocumentWrite>, ShardError> {
        let access = &self.context.access;
        let timeout = access.options().remote_write_timeout;
        if node == access.local_id() {
            return access
                .local_call(&kb.id, shard, timeout, |reply| ShardMessage::Export {
                    document_ids,
                    reply,
                })
                .await;
        }
        let rpc = ShardRpc::Export {
            kb_id: kb.id.clone(),
            shard,
            document_ids,
        };
        match access.remote_call(node, &rpc, timeout).await? {
            ShardReply::Exported(documents) => Ok(documents),
            other => Err(unexpected(other)),
        }
    }

    /// A document's raw bytes: this node's, else those of a replica of its shard or of any
    /// member that answers.
    async fn raw_bytes(
        &self,
        kb: &KbRecord,
        record: &sift_storage::meta::DocumentRecord,
    ) -> Option<Vec<u8>> {
        let raw = self.context.raw.clone();
        let local = record.clone();
        if let Ok(Ok(bytes)) = tokio::task::spawn_blocking(move || {
            if raw.has(&local) {
                raw.load(&local)
            } else {
                Err(SiftError::Internal("not here".into()))
            }
        })
        .await
        {
            return Some(bytes);
        }
        let access = &self.context.access;
        let local_id = access.local_id();
        let mut candidates: Vec<u64> = kb.replicas(record.shard).iter().map(|r| r.node).collect();
        for member in access.peers().members() {
            if !candidates.contains(&member) {
                candidates.push(member);
            }
        }
        candidates.retain(|node| *node != local_id);
        for node in candidates {
            let rpc = ShardRpc::GetRaw {
                kb_id: kb.id.clone(),
                shard: record.shard,
                document_id: record.id.clone(),
                upload: RawStore::is_upload(record),
            };
            let timeout = access.options().remote_write_timeout;
            if let Ok(ShardReply::Raw(Some(bytes))) = access.remote_call(node, &rpc, timeout).await
            {
                return Some(bytes);
            }
        }
        None
    }
}

/// Runs blocking file work off the runtime; a full disk is `insufficient_storage`.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::result::Result<T, StorageError> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| SiftError::Internal(error.to_string()))?
        .map_err(storage_failure)
}

/// What [`restore`] brought up.
#[derive(Clone, Debug)]
pub struct Restored {
    pub manifest: Manifest,
    pub summary: RestoreSummary,
}

/// Brings the snapshot at `snapshot` up as the data directory `data_dir` of a new single-node
/// cluster (node 1): checks the snapshot whole first, refuses a `data_dir` that exists and is
/// not empty, then imports the metadata, writes every shard's documents and stores the raw
/// bytes. Nothing runs meanwhile; the node starts on the directory afterwards.
pub fn restore(snapshot: &Path, data_dir: &Path) -> Result<Restored> {
    let manifest = backup::verify(snapshot)?;
    if let Ok(mut entries) = std::fs::read_dir(data_dir)
        && entries.next().is_some()
    {
        return Err(SiftError::Invalid {
            code: "data_dir_not_empty",
            message: format!(
                "{} is not empty: restore into a new directory",
                data_dir.display()
            ),
        });
    }
    std::fs::create_dir_all(data_dir).map_err(|error| SiftError::Storage(error.into()))?;
    sift_storage::data_dir::open(data_dir)?;
    let store = SledMetaStore::open(&data_dir.join("meta"))?;
    let state = std::fs::read(snapshot.join(META_FILE))
        .map_err(|error| SiftError::Storage(error.into()))?;
    store.import_state(manifest.meta_index, &state)?;
    // raw bytes
    let raw = RawStore::open(
        data_dir.join("raw"),
        store
            .db()
            .open_tree("raw_texts")
            .map_err(|error| SiftError::Storage(error.into()))?,
    )?;
    let mut raw_ids = HashSet::new();
    let mut reader = RecordReader::open(snapshot, RAW_FILE)?;
    while let Some(document) = reader.read::<RawDocument>()? {
        raw_ids.insert(document.document_id.clone());
        raw.put_many(&[document])?;
    }
    raw.flush()?;
    // shards: the documents the imported metadata still has
    let mut chunked = HashMap::new();
    for kb in &manifest.kbs {
        for shard in 0..kb.shards {
            let mut reader = RecordReader::open(snapshot, &shard_file(&kb.id, shard))?;
            let mut index: Option<ShardIndex> = None;
            let mut batch = Vec::new();
            while let Some(document) = reader.read::<DocumentWrite>()? {
                let id = document.entry.document_id.clone();
                let keep = store
                    .get_document(&kb.id, &id)?
                    .is_some_and(|record| record.status != DocStatus::Failed)
                    && !store.is_tombstoned(&kb.id, &id)?;
                if !keep {
                    continue;
                }
                if index.is_none() {
                    let dimension = document
                        .chunks
                        .first()
                        .map(|chunk| chunk.vector.len())
                        .unwrap_or(0);
                    if dimension == 0 {
                        continue;
                    }
                    let dir = shard_dir(data_dir, &kb.id, shard);
                    index = Some(ShardIndex::open(&dir, ShardConfig::new(dimension))?);
                }
                chunked.insert(id, document.chunks.len() as u32);
                batch.push(document);
                if batch.len() >= EXPORT_BATCH_DOCUMENTS
                    && let Some(index) = &index
                {
                    index.write_documents(std::mem::take(&mut batch))?;
                }
            }
            if let Some(index) = &index
                && !batch.is_empty()
            {
                index.write_documents(batch)?;
            }
        }
    }
    let plan = RestorePlan {
        kbs: manifest.kbs.iter().map(|kb| kb.id.clone()).collect(),
        node: SINGLE_NODE_ID,
        chunked,
        raw: raw_ids,
        at_ms: now_ms(),
    };
    let summary = store.adopt_restored(&plan)?;
    store.flush()?;
    Ok(Restored { manifest, summary })
}

fn shard_dir(data_dir: &Path, kb_id: &str, shard: u32) -> PathBuf {
    data_dir.join("shards").join(kb_id).join(shard.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_insufficient_storage_and_other_failures_are_not() {
        let full = storage_failure(StorageError::Io(std::io::Error::from(
            std::io::ErrorKind::StorageFull,
        )));
        assert_eq!(full.code(), "insufficient_storage");
        assert_eq!(full.kind(), crate::ErrorKind::InsufficientStorage);
        let other = storage_failure(StorageError::Io(std::io::Error::from(
            std::io::ErrorKind::PermissionDenied,
        )));
        assert_eq!(other.code(), "storage_error");
    }
}
