//! Snapshots on disk: a directory holding `manifest.json` and the files it lists.
//!
//! ```text
//! SNAPSHOT_DIR/{id}/manifest.json     what the snapshot holds: its format, the data-dir format
//!                                     it was taken from, its KBs, every file with its size and
//!                                     SHA-256
//!                   meta.bin          the metadata state ([`crate::meta::SledMetaStore::export_state`])
//!                   shards/{kb}/{n}   the shard's documents, vectors included (records)
//!                   raw.bin           raw bytes of documents the shards do not hold yet (records)
//! SNAPSHOT_DIR/.partial-{id}/         a snapshot being written; renamed to {id} once complete,
//!                                     removed at the next start if the writer died
//! ```
//!
//! A record file is [`RECORDS_MAGIC`], then per record its length (u32, big-endian) and its
//! bincode bytes. [`SnapshotWriter`] hashes every file as it writes it and makes the snapshot
//! visible only once every byte and the manifest are flushed; [`verify`] checks a snapshot's
//! manifest, its versions and every file's size and digest before anything reads it.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data_dir::FORMAT_VERSION;
use crate::error::{Result, StorageError};
use crate::meta::KbSettings;

/// The snapshot format this build writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;
/// The manifest's file name inside a snapshot directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The first bytes of every record file.
pub const RECORDS_MAGIC: &[u8] = b"SIFTREC1";
/// The prefix of a snapshot directory still being written.
pub const PARTIAL_PREFIX: &str = ".partial-";
/// The largest record a reader accepts (one document with its vectors, or one raw file).
pub const MAX_RECORD_BYTES: usize = 1 << 30;

/// What a snapshot holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Manifest {
    /// [`SNAPSHOT_FORMAT`] of the build that wrote it.
    pub snapshot_format: u32,
    /// The data-directory format ([`FORMAT_VERSION`]) of the node that took it.
    pub data_dir_format: u32,
    /// The `sift` version that took it.
    pub sift_version: String,
    pub id: String,
    pub created_at_ms: u64,
    /// The metadata's applied index when it was exported.
    pub meta_index: u64,
    pub kbs: Vec<ManifestKb>,
    pub files: Vec<ManifestFile>,
}

/// One KB of a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ManifestKb {
    pub id: String,
    pub name: String,
    pub tenant: String,
    pub shards: u32,
    /// Documents whose chunks the snapshot holds.
    pub documents: u64,
    /// Documents restored from their raw bytes (ingested again after a restore).
    pub raw_documents: u64,
    pub settings: KbSettings,
}

/// One file of a snapshot, relative to its directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ManifestFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

impl Manifest {
    /// The bytes of every file.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|file| file.bytes).sum()
    }
}

/// Writes one snapshot into `ROOT/.partial-{id}/`; [`SnapshotWriter::finish`] renames it to
/// `ROOT/{id}/`. Dropped unfinished, it removes the partial directory.
pub struct SnapshotWriter {
    root: PathBuf,
    id: String,
    partial: PathBuf,
    files: Vec<ManifestFile>,
    finished: bool,
}

impl SnapshotWriter {
    pub fn create(root: &Path, id: &str) -> Result<SnapshotWriter> {
        check_id(id)?;
        std::fs::create_dir_all(root)?;
        let partial = root.join(format!("{PARTIAL_PREFIX}{id}"));
        std::fs::create_dir(&partial)?;
        Ok(SnapshotWriter {
            root: root.to_path_buf(),
            id: id.to_string(),
            partial,
            files: Vec::new(),
            finished: false,
        })
    }

    /// A new file of records at `path` (relative, `/`-separated); [`Self::add`] its
    /// [`RecordWriter::finish`] to the manifest.
    pub fn records(&self, path: &str) -> Result<RecordWriter> {
        let relative = checked_relative(path)?;
        let full = self.partial.join(relative);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut writer = RecordWriter {
            path: path.to_string(),
            file: HashingWriter::new(BufWriter::new(File::create(&full)?)),
            records: 0,
        };
        writer.file.write_all(RECORDS_MAGIC)?;
        Ok(writer)
    }

    /// A whole file at `path` from `bytes`.
    pub fn file(&mut self, path: &str, bytes: &[u8]) -> Result<()> {
        let relative = checked_relative(path)?;
        let full = self.partial.join(relative);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = HashingWriter::new(BufWriter::new(File::create(&full)?));
        file.write_all(bytes)?;
        let entry = file.finish(path)?;
        self.files.push(entry);
        Ok(())
    }

    /// Lists a finished record file in the manifest.
    pub fn add(&mut self, file: ManifestFile) {
        self.files.push(file);
    }

    /// Writes the manifest (`files` filled in here), flushes the directory and makes the
    /// snapshot visible under its id. Returns the snapshot's directory.
    pub fn finish(mut self, mut manifest: Manifest) -> Result<PathBuf> {
        manifest.files = std::mem::take(&mut self.files);
        manifest.id = self.id.clone();
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|error| StorageError::Corrupt(error.to_string()))?;
        let path = self.partial.join(MANIFEST_FILE);
        let mut file = File::create(&path)?;
        file.write_all(&json)?;
        file.sync_all()?;
        sync_tree(&self.partial)?;
        let done = self.root.join(&self.id);
        std::fs::rename(&self.partial, &done)?;
        File::open(&self.root)?.sync_all()?;
        self.finished = true;
        Ok(done)
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(&self.partial);
        }
    }
}

/// A file of records being written.
pub struct RecordWriter {
    path: String,
    file: HashingWriter<BufWriter<File>>,
    records: u64,
}

impl RecordWriter {
    pub fn write<T: Serialize>(&mut self, record: &T) -> Result<()> {
        let bytes = bincode::serde::encode_to_vec(record, bincode::config::standard())
            .map_err(|error| StorageError::Corrupt(error.to_string()))?;
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(StorageError::Invalid(format!(
                "a record of {} bytes is over the snapshot limit of {MAX_RECORD_BYTES}",
                bytes.len()
            )));
        }
        self.file.write_all(&(bytes.len() as u32).to_be_bytes())?;
        self.file.write_all(&bytes)?;
        self.records += 1;
        Ok(())
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flushes the file; its entry of the manifest.
    pub fn finish(self) -> Result<ManifestFile> {
        self.file.finish(&self.path)
    }
}

/// Counts and hashes what goes through it.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }
}

impl HashingWriter<BufWriter<File>> {
    fn finish(self, path: &str) -> Result<ManifestFile> {
        let file = self
            .inner
            .into_inner()
            .map_err(|error| StorageError::Io(error.into_error()))?;
        file.sync_all()?;
        Ok(ManifestFile {
            path: path.to_string(),
            bytes: self.bytes,
            sha256: hex::encode(self.hasher.finalize()),
        })
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Reads the manifest of the snapshot at `dir` and checks it before anything else reads the
/// snapshot: its formats are ones this build reads, its paths stay inside it, and every file
/// it lists has its size and SHA-256.
pub fn verify(dir: &Path) -> Result<Manifest> {
    let manifest = read_manifest(dir)?;
    if manifest.snapshot_format > SNAPSHOT_FORMAT {
        return Err(StorageError::DataDir(format!(
            "the snapshot is of format {}, written by a newer Sift; this build reads format {SNAPSHOT_FORMAT} and older",
            manifest.snapshot_format
        )));
    }
    if manifest.data_dir_format > FORMAT_VERSION {
        return Err(StorageError::DataDir(format!(
            "the snapshot was taken from a data directory of format {}, newer than this build's {FORMAT_VERSION}",
            manifest.data_dir_format
        )));
    }
    for file in &manifest.files {
        let path = dir.join(checked_relative(&file.path)?);
        let metadata = std::fs::metadata(&path).map_err(|error| {
            StorageError::Corrupt(format!("snapshot file {} is missing: {error}", file.path))
        })?;
        if metadata.len() != file.bytes {
            return Err(StorageError::Corrupt(format!(
                "snapshot file {} has {} bytes, the manifest says {}",
                file.path,
                metadata.len(),
                file.bytes
            )));
        }
        let mut reader = BufReader::new(File::open(&path)?);
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            let read = reader.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        let digest = hex::encode(hasher.finalize());
        if digest != file.sha256 {
            return Err(StorageError::Corrupt(format!(
                "snapshot file {} does not match its SHA-256 in the manifest",
                file.path
            )));
        }
    }
    Ok(manifest)
}

/// The manifest of the snapshot at `dir`, unchecked (for listing).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).map_err(|error| {
        StorageError::NotFound(format!(
            "no snapshot manifest at {}: {error}",
            path.display()
        ))
    })?;
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|error| {
        StorageError::Corrupt(format!("the snapshot manifest does not parse: {error}"))
    })?;
    check_id(&manifest.id)?;
    Ok(manifest)
}

/// The records of a file written by [`RecordWriter`], read one at a time.
pub struct RecordReader {
    file: BufReader<File>,
    path: PathBuf,
}

impl RecordReader {
    pub fn open(dir: &Path, path: &str) -> Result<RecordReader> {
        let full = dir.join(checked_relative(path)?);
        let mut file = BufReader::new(File::open(&full)?);
        let mut magic = [0u8; RECORDS_MAGIC.len()];
        file.read_exact(&mut magic)?;
        if magic != RECORDS_MAGIC {
            return Err(StorageError::Corrupt(format!(
                "{} is not a snapshot record file",
                full.display()
            )));
        }
        Ok(RecordReader { file, path: full })
    }

    /// The next record, or `None` at the end.
    pub fn read<T: DeserializeOwned>(&mut self) -> Result<Option<T>> {
        let mut length = [0u8; 4];
        match self.file.read_exact(&mut length) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error.into()),
        }
        let length = u32::from_be_bytes(length) as usize;
        let corrupt =
            |what: String| StorageError::Corrupt(format!("{}: {what}", self.path.display()));
        if length > MAX_RECORD_BYTES {
            return Err(corrupt(format!("a record of {length} bytes")));
        }
        let mut bytes = vec![0u8; length];
        self.file
            .read_exact(&mut bytes)
            .map_err(|error| corrupt(format!("a cut record: {error}")))?;
        let (record, _) = bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
            .map_err(|error| corrupt(error.to_string()))?;
        Ok(Some(record))
    }
}

/// The snapshots in `root`, complete ones only, newest first.
pub fn list(root: &Path) -> Result<Vec<Manifest>> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let mut manifests = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(PARTIAL_PREFIX) || !entry.file_type()?.is_dir() {
            continue;
        }
        if let Ok(manifest) = read_manifest(&entry.path())
            && manifest.id == name
        {
            manifests.push(manifest);
        }
    }
    manifests.sort_by(|a, b| (b.created_at_ms, &b.id).cmp(&(a.created_at_ms, &a.id)));
    Ok(manifests)
}

/// Removes the partial snapshots a writer that died left in `root`; returns how many.
pub fn remove_partials(root: &Path) -> Result<usize> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error.into()),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(PARTIAL_PREFIX))
        {
            std::fs::remove_dir_all(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A snapshot id is what [`SnapshotWriter`] makes: letters, digits and `-` only.
pub fn check_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(StorageError::Invalid(format!(
            "{id:?} is not a snapshot id (letters, digits and '-', at most 64)"
        )));
    }
    Ok(())
}

/// `path` as a relative path that stays inside the snapshot.
fn checked_relative(path: &str) -> Result<&Path> {
    let relative = Path::new(path);
    if path.is_empty()
        || !relative
            .components()
            .all(|component| matches!(component, Component::Normal(_)))
    {
        return Err(StorageError::Corrupt(format!(
            "snapshot path {path:?} leaves the snapshot"
        )));
    }
    Ok(relative)
}

/// fsyncs every directory under `dir` (files are synced as they are finished).
fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            snapshot_format: SNAPSHOT_FORMAT,
            data_dir_format: FORMAT_VERSION,
            sift_version: "test".into(),
            id: String::new(),
            created_at_ms: 1,
            meta_index: 7,
            kbs: Vec::new(),
            files: Vec::new(),
        }
    }

    #[test]
    fn a_finished_snapshot_verifies_and_reads_back() {
        let root = tempfile::tempdir().unwrap();
        let mut writer = SnapshotWriter::create(root.path(), "snap-1").unwrap();
        writer.file("meta.bin", b"state").unwrap();
        let mut records = writer.records("shards/kb/0").unwrap();
        records.write(&("a".to_string(), 1u32)).unwrap();
        records.write(&("b".to_string(), 2u32)).unwrap();
        let file = records.finish().unwrap();
        writer.add(file);
        let dir = writer.finish(manifest()).unwrap();
        assert_eq!(dir, root.path().join("snap-1"));
        let read = verify(&dir).unwrap();
        assert_eq!(read.id, "snap-1");
        assert_eq!(read.files.len(), 2);
        let mut reader = RecordReader::open(&dir, "shards/kb/0").unwrap();
        assert_eq!(
            reader.read::<(String, u32)>().unwrap(),
            Some(("a".into(), 1))
        );
        assert_eq!(
            reader.read::<(String, u32)>().unwrap(),
            Some(("b".into(), 2))
        );
        assert_eq!(reader.read::<(String, u32)>().unwrap(), None);
        assert_eq!(list(root.path()).unwrap().len(), 1);
    }

    #[test]
    fn a_changed_byte_or_a_newer_format_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut writer = SnapshotWriter::create(root.path(), "s").unwrap();
        writer.file("meta.bin", b"state").unwrap();
        let dir = writer.finish(manifest()).unwrap();
        std::fs::write(dir.join("meta.bin"), b"stale").unwrap();
        let error = verify(&dir).unwrap_err().to_string();
        assert!(error.contains("SHA-256"), "{error}");

        let mut newer = manifest();
        newer.id = "s".into();
        newer.snapshot_format = SNAPSHOT_FORMAT + 1;
        std::fs::write(dir.join(MANIFEST_FILE), serde_json::to_vec(&newer).unwrap()).unwrap();
        let error = verify(&dir).unwrap_err().to_string();
        assert!(error.contains("newer Sift"), "{error}");
    }

    #[test]
    fn paths_that_leave_the_snapshot_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut writer = SnapshotWriter::create(root.path(), "s").unwrap();
        assert!(writer.file("../escape", b"x").is_err());
        assert!(writer.file("/etc/passwd", b"x").is_err());
        assert!(SnapshotWriter::create(root.path(), "../x").is_err());
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing_and_partials_are_removed() {
        let root = tempfile::tempdir().unwrap();
        {
            let mut writer = SnapshotWriter::create(root.path(), "gone").unwrap();
            writer.file("meta.bin", b"state").unwrap();
        }
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        std::fs::create_dir(root.path().join(".partial-dead")).unwrap();
        assert_eq!(remove_partials(root.path()).unwrap(), 1);
        assert!(list(root.path()).unwrap().is_empty());
    }
}
