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

/// How long [`open`] waits for a released lock before it gives the error back. A loaded
/// machine's disk can hold a dropped handle's last flush for seconds (a CI run met a
/// restarted in-process node that waited out 5 s).
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// After this long [`open`] says what it waits for.
const LOCK_WAIT_LOGGED: Duration = Duration::from_secs(2);
const LOCK_POLL: Duration = Duration::from_millis(20);

/// Opens `config`, retrying while another handle of this process is letting go of the lock.
/// A lock held for longer (another process on the same directory) fails after [`LOCK_WAIT`].
/// A database refused as corrupt because of an unfinished snapshot is opened without it.
pub fn open(config: &sled::Config) -> sled::Result<sled::Db> {
    match open_waiting(config, LOCK_WAIT) {
        Err(sled::Error::Corruption { .. }) if remove_unfinished_snapshots(&config.get_path()) => {
            open_waiting(config, LOCK_WAIT)
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

fn open_waiting(config: &sled::Config, wait: Duration) -> sled::Result<sled::Db> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        match config.open() {
            Err(error) if is_lock_held(&error) && started.elapsed() < wait => {
                if !logged && started.elapsed() >= LOCK_WAIT_LOGGED {
                    logged = true;
                    tracing::warn!(
                        path = %config.get_path().display(),
                        "waiting for the lock on a sled database (another process on this \
                         data dir, or a handle of this one still closing)"
                    );
                }
                std::thread::sleep(LOCK_POLL);
            }
            result => return result,
        }
    }
}

/// Waits until no handle holds a lock on any sled database under `root` (a directory with
/// sled's `conf` and `db` files, at most a few levels down), or `timeout` has passed; whether
/// they are all released. A node's shutdown returns only once its stores are closed, so that
/// the same data dir opens again at once.
pub fn wait_released(root: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut databases = Vec::new();
    find_databases(root, 4, &mut databases);
    for db in databases {
        let Ok(file) = std::fs::File::open(&db) else {
            continue; // removed meanwhile: nothing holds it
        };
        loop {
            // sled locks its `db` file with flock, which conflicts with another open file
            // description of this same process too.
            match file.try_lock() {
                Ok(()) => {
                    let _ = file.unlock();
                    break;
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(LOCK_POLL),
                Err(_) => {
                    tracing::warn!(path = %db.display(), "a sled database is still locked");
                    return false;
                }
            }
        }
    }
    true
}

fn find_databases(dir: &Path, depth: usize, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    if dir.join("conf").is_file() && dir.join("db").is_file() {
        found.push(dir.join("db"));
        return;
    }
    if depth == 0 {
        return;
    }
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            find_databases(&entry.path(), depth - 1, found);
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
    fn waiting_for_release_sees_an_open_database_and_its_closing() {
        let root = tempfile::tempdir().unwrap();
        let config = sled::Config::new().path(root.path().join("a").join("meta"));
        let db = open(&config).unwrap();
        db.insert(b"k", b"v").unwrap();
        db.flush().unwrap();
        assert!(!wait_released(root.path(), Duration::from_millis(100)));
        drop(db);
        assert!(wait_released(root.path(), Duration::from_secs(30)));
        // and it opens again
        assert_eq!(open(&config).unwrap().get(b"k").unwrap().unwrap(), b"v");
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
        // sled alone refuses the database (once the dropped handle's threads let go of the
        // lock: a bare `config.open()` on a loaded machine can meet the lock instead, which
        // failed a CI run).
        let config = sled::Config::new().path(dir.path());
        let refused = open_waiting(&config, LOCK_WAIT);
        assert!(
            matches!(refused, Err(sled::Error::Corruption { .. })),
            "{:?}",
            refused.map(|_| ())
        );
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
        let wait = Duration::from_millis(300);
        let error = open_waiting(&config, wait).unwrap_err();
        assert!(is_lock_held(&error), "{error}");
        assert!(started.elapsed() >= wait);
    }
}
