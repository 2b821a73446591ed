//! Raw documents as received, kept until the document is deleted: uploads as files under
//! `raw/`, bulk texts in a sled tree. Ingestion reads them (again, after a crash).

use std::path::{Path, PathBuf};

use sift_storage::meta::{DocSource, DocumentRecord};

use crate::error::{Result, SiftError};

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
