//! The format version of a data directory: `DATA_DIR/FORMAT` holds `sift-data-dir N`.
//!
//! A node checks it before it opens anything else: a directory of a newer format (written by a
//! newer Sift) is refused with a message naming both versions, so an older binary never
//! misreads or rewrites it; a directory of an older format is brought to this one by the steps
//! in [`upgrade`] and then stamped; a new directory is stamped with [`FORMAT_VERSION`]. A
//! directory made before versioning (it has `meta/` and no `FORMAT`) is format 1, which is what
//! every Sift wrote until then.

use std::io::Write;
use std::path::Path;

use crate::error::{Result, StorageError};

/// The format this build writes and reads. Raise it with every change an older build would
/// misread, and add the step from the previous format to [`upgrade`].
pub const FORMAT_VERSION: u32 = 1;

/// The file that holds the format version.
pub const FORMAT_FILE: &str = "FORMAT";

const MAGIC: &str = "sift-data-dir";

/// What [`open`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// A new directory, now stamped with [`FORMAT_VERSION`].
    New,
    /// A directory of this format.
    Current,
    /// A directory of an older format, upgraded to this one.
    Upgraded { from: u32 },
}

/// Checks (and where needed upgrades and stamps) the format of the data directory `dir`, which
/// must exist.
pub fn open(dir: &Path) -> Result<Opened> {
    let path = dir.join(FORMAT_FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => Some(parse(&text).ok_or_else(|| {
            StorageError::DataDir(format!(
                "{} does not hold a Sift data-directory format ({MAGIC} N): {:?}",
                path.display(),
                text.chars().take(80).collect::<String>()
            ))
        })?),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error.into()),
    };
    let opened = match found {
        Some(version) if version > FORMAT_VERSION => {
            return Err(StorageError::DataDir(format!(
                "{} is of data-directory format {version}, newer than this build's {FORMAT_VERSION}: it was written by a newer Sift; run that version (or newer) on it",
                dir.display()
            )));
        }
        Some(version) if version == FORMAT_VERSION => return Ok(Opened::Current),
        Some(version) => {
            upgrade(dir, version)?;
            Opened::Upgraded { from: version }
        }
        // Before versioning every data directory was format 1.
        None if dir.join("meta").exists() => {
            upgrade(dir, 1)?;
            if FORMAT_VERSION == 1 {
                Opened::Current
            } else {
                Opened::Upgraded { from: 1 }
            }
        }
        None => Opened::New,
    };
    stamp(dir, FORMAT_VERSION)?;
    Ok(opened)
}

/// The version in a `FORMAT` file's text, if it is one.
fn parse(text: &str) -> Option<u32> {
    let mut words = text.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(MAGIC), Some(version), None) => version.parse().ok().filter(|v| *v > 0),
        _ => None,
    }
}

/// Brings a directory of format `from` to [`FORMAT_VERSION`], one step per format. Format 1 is
/// the first, so there is no step yet.
fn upgrade(_dir: &Path, from: u32) -> Result<()> {
    debug_assert!(from <= FORMAT_VERSION);
    Ok(())
}

/// Writes `FORMAT` whole or not at all (a temp file renamed over it, both synced).
pub fn stamp(dir: &Path, version: u32) -> Result<()> {
    let temp = dir.join(format!("{FORMAT_FILE}.tmp"));
    {
        let mut file = std::fs::File::create(&temp)?;
        writeln!(file, "{MAGIC} {version}")?;
        file.sync_all()?;
    }
    std::fs::rename(&temp, dir.join(FORMAT_FILE))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_is_stamped_and_then_current() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(open(dir.path()).unwrap(), Opened::New);
        let text = std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap();
        assert_eq!(text, format!("sift-data-dir {FORMAT_VERSION}\n"));
        assert_eq!(open(dir.path()).unwrap(), Opened::Current);
    }

    #[test]
    fn a_directory_from_before_versioning_is_format_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("meta")).unwrap();
        assert_eq!(open(dir.path()).unwrap(), Opened::Current);
        assert_eq!(
            parse(&std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap()),
            Some(1)
        );
    }

    #[test]
    fn a_newer_format_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        stamp(dir.path(), FORMAT_VERSION + 1).unwrap();
        let message = open(dir.path()).unwrap_err().to_string();
        assert!(message.contains("newer than this build's"), "{message}");
        assert!(
            message.contains(&(FORMAT_VERSION + 1).to_string()),
            "{message}"
        );
        assert_eq!(
            parse(&std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap()),
            Some(FORMAT_VERSION + 1)
        );
    }

    #[test]
    fn a_garbled_format_file_is_refused() {
        for text in [
            "",
            "sift-data-dir",
            "sift-data-dir x",
            "sift-data-dir 0",
            "other 1",
            "sift-data-dir 1 2",
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join(FORMAT_FILE), text).unwrap();
            let message = open(dir.path()).unwrap_err().to_string();
            assert!(message.contains("does not hold"), "{text:?}: {message}");
        }
    }
}

/// The file whose exclusive lock marks a data directory as in use by one process.
pub const LOCK_FILE: &str = "LOCK";

/// A data directory held by this process: the lock on its [`LOCK_FILE`] (which names the
/// holder's pid) lasts as long as this value, and ends with the process however it ends.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Takes `dir`'s lock without waiting. Held by another process (or another node of this one):
/// an error that says so in one line, with the holder's pid when it wrote one.
pub fn lock(dir: &Path) -> std::result::Result<DirLock, String> {
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|error| format!("opening {}: {error}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let by = if holder.is_empty() {
                "another sift node".to_string()
            } else {
                format!("another sift node (pid {holder})")
            };
            return Err(format!(
                "the data directory {} is in use by {by}: stop it, or give this node its own --data-dir",
                dir.display()
            ));
        }
        Err(std::fs::TryLockError::Error(error)) => {
            return Err(format!("locking {}: {error}", path.display()));
        }
    }
    // The holder's pid, for the message above. Best effort: the lock, not the pid, is what
    // excludes, and a full disk must not stop a node from starting.
    let _ = file.set_len(0).and_then(|()| {
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(0))?;
        writeln!(file, "{}", std::process::id())
    });
    Ok(DirLock { _file: file })
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn a_data_dir_is_held_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        let error = lock(dir.path()).unwrap_err();
        assert!(
            error.contains("is in use by another sift node (pid "),
            "{error}"
        );
        assert!(error.contains(&std::process::id().to_string()), "{error}");
        drop(held);
        lock(dir.path()).expect("free again once dropped");
    }
}
