//! Raw documents as received, kept until the document is deleted: uploads as files under
//! `raw/`, bulk texts in a sled tree. Ingestion reads them (again, after a crash).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sift_storage::meta::{DocSource, DocumentRecord, KbRecord};

use crate::error::{Result, SiftError};
use crate::shards::rpc::RawDocument;

#[derive(Clone)]
pub struct RawStore {
    dir: PathBuf,
    texts: sled::Tree,
}

impl RawStore {
    pub fn open(dir: PathBuf, texts: sled::Tree) -> Result<Self> {
        std::fs::create_dir_all(&dir).map_err(io)?;
        Ok(RawStore { dir, texts })
    }

    /// Where an upload's bytes live once accepted. Ids come from other nodes too: anything but
    /// a plain id (a UUID as this node makes them: letters, digits, `-`, `_`) is refused
    /// before a path is built from it.
    pub fn file_path(&self, document_id: &str) -> Result<PathBuf> {
        Ok(self.dir.join(plain_id(document_id)?))
    }

    /// Moves an uploaded temp file into place and syncs it.
    pub fn adopt_file(&self, temp: &Path, document_id: &str) -> Result<()> {
        let target = self.file_path(document_id)?;
        std::fs::rename(temp, &target).map_err(io)?;
        std::fs::File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
        Ok(())
    }

    /// Stores an upload's bytes received from another node; durable on return.
    pub fn put_file(&self, document_id: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let target = self.file_path(document_id)?;
        let temp = self.dir.join(format!(".{document_id}.part"));
        let mut file = std::fs::File::create(&temp).map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&temp, &target).map_err(io)?;
        std::fs::File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
        Ok(())
    }

    /// Stores raw documents received from another node; durable on return.
    pub fn put_many(&self, documents: &[RawDocument]) -> Result<()> {
        for document in documents {
            if document.upload {
                self.put_file(&document.document_id, &document.bytes)?;
            } else {
                self.texts
                    .insert(document.document_id.as_bytes(), document.bytes.as_slice())
                    .map_err(storage)?;
            }
        }
        self.flush()
    }

    /// A document's raw bytes by id and kind, if this node holds them.
    pub fn get(&self, document_id: &str, upload: bool) -> Result<Option<Vec<u8>>> {
        if upload {
            match std::fs::read(self.file_path(document_id)?) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(io(error)),
            }
        } else {
            Ok(self
                .texts
                .get(document_id.as_bytes())
                .map_err(storage)?
                .map(|bytes| bytes.to_vec()))
        }
    }

    /// Runs `work` on the store off the async runtime (file and sled I/O block).
    pub async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&RawStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|error| SiftError::Internal(error.to_string()))?
    }

    /// Stores bulk texts; durable once [`Self::flush`] returns.
    pub fn put_text(&self, document_id: &str, text: &str) -> Result<()> {
        self.texts
            .insert(document_id.as_bytes(), text.as_bytes())
            .map_err(storage)?;
        Ok(())
    }

    pub fn flush(&self) -> Result<()> {
        self.texts.flush().map_err(storage)?;
        Ok(())
    }

    pub fn load(&self, record: &DocumentRecord) -> Result<Vec<u8>> {
        match &record.source {
            DocSource::Upload { .. } => std::fs::read(self.file_path(&record.id)?).map_err(io),
            DocSource::Text { .. } => self
                .texts
                .get(record.id.as_bytes())
                .map_err(storage)?
                .map(|bytes| bytes.to_vec())
                .ok_or_else(|| {
                    SiftError::Internal(format!("raw text of document {} is missing", record.id))
                }),
        }
    }

    /// Whether the document is an upload (a file) rather than a bulk text.
    pub fn is_upload(record: &DocumentRecord) -> bool {
        matches!(record.source, DocSource::Upload { .. })
    }

    /// Whether this node holds the document's bytes.
    pub fn has(&self, record: &DocumentRecord) -> bool {
        match &record.source {
            DocSource::Upload { .. } => self.file_path(&record.id).is_ok_and(|path| path.is_file()),
            DocSource::Text { .. } => self
                .texts
                .contains_key(record.id.as_bytes())
                .unwrap_or(false),
        }
    }

    /// Ids of every raw document held here (files and bulk texts).
    pub fn ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(io)?
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter(|name| !name.starts_with('.'))
            .collect();
        for key in self.texts.iter().keys() {
            if let Ok(id) = String::from_utf8(key.map_err(storage)?.to_vec()) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Removes the temp files of writes that were interrupted (a crash mid-`put_file`) more
    /// than `older_than` ago; returns how many.
    pub fn remove_stale_parts(&self, older_than: Duration) -> Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.dir).map_err(io)?.flatten() {
            let name = entry.file_name();
            let is_part = name
                .to_str()
                .is_some_and(|name| name.starts_with('.') && name.ends_with(".part"));
            let old = entry
                .metadata()
                .and_then(|meta| meta.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age >= older_than);
            if is_part && old && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    pub fn remove(&self, document_id: &str) -> Result<()> {
        self.texts.remove(document_id.as_bytes()).map_err(storage)?;
        match std::fs::remove_file(self.file_path(document_id)?) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io(error)),
        }
    }
}

/// Longest document id accepted (a UUID has 36 characters).
const MAX_ID_LEN: usize = 64;

/// `document_id` when it is a plain id that is safe as a file name.
fn plain_id(document_id: &str) -> Result<&str> {
    let plain = !document_id.is_empty()
        && document_id.len() <= MAX_ID_LEN
        && document_id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
    if plain {
        Ok(document_id)
    } else {
        Err(SiftError::invalid(
            "invalid_document_id",
            format!("{document_id:?} is not a document id"),
        ))
    }
}

fn io(error: std::io::Error) -> SiftError {
    SiftError::Storage(sift_storage::StorageError::Io(error))
}

fn storage(error: sled::Error) -> SiftError {
    SiftError::Storage(sift_storage::StorageError::Sled(error))
}

/// How old a document id (a UUIDv7, so it carries its creation time) is, if it is one.
pub fn id_age(document_id: &str) -> Option<Duration> {
    let (seconds, nanos) = uuid::Uuid::parse_str(document_id)
        .ok()?
        .get_timestamp()?
        .to_unix();
    let created = std::time::UNIX_EPOCH + Duration::new(seconds, nanos);
    Some(created.elapsed().unwrap_or_default())
}

/// Whether raw bytes held by node `local` are needed no more: no knowledge base has the
/// document (a duplicate upload, or a request that failed after its bytes reached the
/// replicas), or it is finished and its shard has no replica on this node (moved away, or
/// this node only received the upload). `found` is the document's KB and record.
pub fn raw_unneeded(found: Option<(&KbRecord, &DocumentRecord)>, local: u64) -> bool {
    match found {
        None => true,
        Some((kb, record)) => {
            record.status.is_terminal()
                && !kb.placement.is_empty()
                && !kb.replicas(record.shard).iter().any(|r| r.node == local)
        }
    }
}

#[cfg(test)]
mod tests {
    use sift_storage::meta::{DocStatus, KbSettings, Replica, ReplicaState, ShardPlacement};

    use super::*;

    fn kb(on: &[u64]) -> KbRecord {
        KbRecord {
            id: "kb".into(),
            name: "kb".into(),
            settings: KbSettings::new(1, on.len() as u32, "m", 4),
            created_at_ms: 1,
            updated_at_ms: 1,
            placement: vec![ShardPlacement {
                replicas: on
                    .iter()
                    .map(|node| Replica {
                        node: *node,
                        state: ReplicaState::Active,
                        since_ms: 1,
                    })
                    .collect(),
            }],
        }
    }

    fn document(status: DocStatus) -> DocumentRecord {
        DocumentRecord {
            id: uuid::Uuid::now_v7().to_string(),
            kb_id: "kb".into(),
            external_id: None,
            title: "t".into(),
            source: DocSource::Text {
                format: "text".into(),
            },
            content_hash: String::new(),
            size_bytes: 1,
            shard: 0,
            status,
            error: None,
            chunk_count: 0,
            metadata: Default::default(),
            created_at_ms: 1,
            updated_at_ms: 1,
            pages_needing_ocr: 0,
        }
    }

    #[test]
    fn raw_bytes_are_kept_while_a_replica_here_or_the_work_needs_them() {
        let on_two = kb(&[2, 3]);
        let ready = document(DocStatus::Ready);
        let embedding = document(DocStatus::Embedding);
        // Unregistered: garbage.
        assert!(raw_unneeded(None, 1));
        // Finished, shard held elsewhere: garbage; held here: kept.
        assert!(raw_unneeded(Some((&on_two, &ready)), 1));
        assert!(!raw_unneeded(Some((&on_two, &ready)), 2));
        // Unfinished: kept anywhere (a worker may still fetch it).
        assert!(!raw_unneeded(Some((&on_two, &embedding)), 1));
        // A single node's KB (no placement) keeps everything.
        let single = KbRecord {
            placement: Vec::new(),
            ..kb(&[1])
        };
        assert!(!raw_unneeded(Some((&single, &ready)), 1));
    }

    #[test]
    fn ids_list_files_and_texts_and_stale_parts_go() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let store = RawStore::open(dir.path().join("raw"), db.open_tree("texts").unwrap()).unwrap();
        store.put_file("b-file", b"bytes").unwrap();
        store.put_text("a-text", "text").unwrap();
        std::fs::write(dir.path().join("raw/.c.part"), b"half").unwrap();
        assert_eq!(store.ids().unwrap(), ["a-text", "b-file"]);
        assert_eq!(
            store.remove_stale_parts(Duration::from_secs(3600)).unwrap(),
            0
        );
        assert_eq!(store.remove_stale_parts(Duration::ZERO).unwrap(), 1);
        assert!(!dir.path().join("raw/.c.part").exists());
        assert!(dir.path().join("raw/b-file").exists());
        let age = id_age(&uuid::Uuid::now_v7().to_string()).unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
        assert_eq!(id_age("not-a-uuid"), None);
        // Ids from other nodes never become paths outside the store.
        for bad in [
            "../escape",
            "/etc/passwd",
            "a/b",
            "",
            ".hidden",
            "x\0y",
            &"a".repeat(65),
        ] {
            assert!(store.put_file(bad, b"x").is_err(), "{bad:?}");
            assert!(store.get(bad, true).is_err(), "{bad:?}");
            assert!(store.remove(bad).is_err(), "{bad:?}");
        }
        assert!(!dir.path().join("escape").exists());
        assert_eq!(id_age(&uuid::Uuid::new_v4().to_string()), None);
    }
}
