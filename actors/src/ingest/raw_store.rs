//! Raw documents as received, kept until the document is deleted: uploads as files under
//! `raw/`, bulk texts in a sled tree. Ingestion reads them (again, after a crash).

use std::path::{Path, PathBuf};

use sift_storage::meta::{DocSource, DocumentRecord};

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

    /// Where an upload's bytes live once accepted.
    pub fn file_path(&self, document_id: &str) -> PathBuf {
        self.dir.join(document_id)
    }

    /// Moves an uploaded temp file into place and syncs it.
    pub fn adopt_file(&self, temp: &Path, document_id: &str) -> Result<()> {
        let target = self.file_path(document_id);
        std::fs::rename(temp, &target).map_err(io)?;
        std::fs::File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
        Ok(())
    }

    /// Stores an upload's bytes received from another node; durable on return.
    pub fn put_file(&self, document_id: &str, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        let target = self.file_path(document_id);
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
            match std::fs::read(self.file_path(document_id)) {
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
            DocSource::Upload { .. } => std::fs::read(self.file_path(&record.id)).map_err(io),
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
            DocSource::Upload { .. } => self.file_path(&record.id).is_file(),
            DocSource::Text { .. } => self
                .texts
                .contains_key(record.id.as_bytes())
                .unwrap_or(false),
        }
    }

    pub fn remove(&self, document_id: &str) -> Result<()> {
        self.texts.remove(document_id.as_bytes()).map_err(storage)?;
        match std::fs::remove_file(self.file_path(document_id)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io(error)),
        }
    }
}

fn io(error: std::io::Error) -> SiftError {
    SiftError::Storage(sift_storage::StorageError::Io(error))
}

fn storage(error: sled::Error) -> SiftError {
    SiftError::Storage(sift_storage::StorageError::Sled(error))
}
