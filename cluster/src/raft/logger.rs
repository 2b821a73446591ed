//! raft-rs logs through slog; this drain forwards its records to `tracing`.

use slog::{Drain, Level, OwnedKVList, Record};

/// A slog drain that emits every record as a `tracing` event of the same level.
pub struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, _values: &OwnedKVList) -> Result<(), slog::Never> {
        let message = record.msg().to_string();
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{message}"),
            Level::Warning => tracing::warn!(target: "raft", "{message}"),
            Level::Info => tracing::info!(target: "raft", "{message}"),
            Level::Debug => tracing::debug!(target: "raft", "{message}"),
            Level::Trace => tracing::trace!(target: "raft", "{message}"),
        }
        Ok(())
    }
}

/// The logger given to raft-rs, tagged with the node id.
pub fn raft_logger(node_id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!("raft_id" => node_id))
}
