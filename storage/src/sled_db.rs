//! Opening a sled database in a directory that a handle dropped a moment ago still locks.
//!
//! sled takes an exclusive lock on its directory and releases it only when the last clone of
//! its configuration goes, and its background threads (the flusher, segment writers) keep
//! clones for a short while after the last `Db` is dropped. A shard replica restarted by its
//! supervisor, or a store reopened in a test, would then fail with `WouldBlock`. [`open`]
//! waits that moment out instead.

use std::time::{Duration, Instant};

/// How long [`open`] waits for a released lock before it gives the error back.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_POLL: Duration = Duration::from_millis(20);

/// Opens `config`, retrying while another handle of this process is letting go of the lock.
/// A lock held for longer (another process on the same directory) fails after [`LOCK_WAIT`].
pub fn open(config: &sled::Config) -> sled::Result<sled::Db> {
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
