//! Opening a sled database in a directory that a handle dropped a moment ago still locks.
//!
//! sled takes an exclusive lock on its directory and releases it only when the last clone of
//! its configuration goes, and its background threads (the flusher, segment writers) keep
//! clones for a short while after the last `Db` is dropped. A shard replica restarted by its
//! supervisor, or a store reopened in a test, would then fail with `WouldBlock`. [`open`]
//! waits that moment out instead.
//!
//! sled 0.34 writes a snapshot to `snap.{lsn}.generating` and renames it once complete. A write
//! that fails (a full disk) leaves that file behind, empty or short, and every later open takes
//! it for the latest snapshot and refuses the whole database as corrupt: a node whose disk
//! filled up once could never start again (found by the chaos soak). [`open`] removes such
//! unfinished snapshots when sled reports corruption, and opens again: sled then recovers from
//! the previous snapshot or from the log, which the failed snapshot never touched.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long [`open`] waits for a released lock before it gives the error back.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_POLL: Duration = Duration::from_millis(20);

/// Opens `config`, retrying while another handle of this process is letting go of the lock.
/// A lock held for longer (another process on the same directory) fails after [`LOCK_WAIT`].
/// A database refused as corrupt because of an unfinished snapshot is opened without it.
pub fn open(config: &sled::Config) -> sled::Result<sled::Db> {
    match open_waiting(config) {
        Err(sled::Error::Corruption { .. }) if remove_unfinished_snapshots(&config.get_path()) => {
            open_waiting(config)
        }
        result => result,
    }
}

/// Removes the `snap.*.generating` files of the sled directory `dir` (snapshots whose write
/// never finished); whether there were any.
fn remove_unfinished_snapshots(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut removed = false;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(
                path = %entry.path().display(),
                "removing an unfinished sled snapshot (a write that failed, e.g. on a full disk)"
            );
            removed |= std::fs::remove_file(entry.path()).is_ok();
        }
    }
    removed
}

fn open_waiting(config: &sled::Config) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(error) if is_lock_held(&error) && Instant::now() < deadline => {
                std::thread::sleep(LOCK_POLL);
            }
            result => return result,
        }
    }
}

fn is_lock_held(error: &sled::Error) -> bool {
    matches!(error, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_opened_again_while_a_dropped_handle_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path());
        for round in 0..20u32 {
            let db = open(&config).unwrap();
            db.insert(round.to_be_bytes(), b"x").unwrap();
            db.flush().unwrap();
            assert_eq!(db.len(), round as usize + 1);
        }
    }

    #[test]
    fn an_unfinished_snapshot_left_by_a_full_disk_does_not_make_the_database_unopenable() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path());
        {
            let db = open(&config).unwrap();
            for i in 0..100u32 {
                db.insert(i.to_be_bytes(), b"kept").unwrap();
            }
            db.flush().unwrap();
        }
        // What a snapshot write that failed with ENOSPC leaves: an empty `.generating` file,
        // named after a later log position than any finished snapshot.
        std::fs::write(dir.path().join("snap.7FFFFFFFFFFFFFFF.generating"), b"").unwrap();
        // sled alone refuses the database.
        let config = sled::Config::new().path(dir.path());
        assert!(matches!(config.open(), Err(sled::Error::Corruption { .. })));
        let db = open(&config).unwrap();
        assert_eq!(db.len(), 100);
        assert_eq!(db.get(7u32.to_be_bytes()).unwrap().unwrap(), b"kept");
    }

    #[test]
    fn a_lock_held_by_a_live_handle_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(dir.path());
        let _held = open(&config).unwrap();
        let started = Instant::now();
        let error = open(&config).unwrap_err();
        assert!(is_lock_held(&error), "{error}");
        assert!(started.elapsed() >= LOCK_WAIT);
    }
}
