//! Applying committed log entries: one op ([`MetaStateMachine::apply`], flushed) or a run of
//! them in one atomic sled batch ([`SledMetaStore::apply_batch_with_ids`], what the Raft
//! driver applies committed entries through), the applied index, and the op-id window that
//! makes a retried proposal return its first outcome instead of applying twice.

use super::SledMetaStore;
use super::keys::{APPLIED_KEY, op_id_key, op_index_key};
use super::ops::{MetaOp, MetaOutcome};
use super::pending::Pending;
use crate::error::Result;

/// Applies committed ops; implemented by the sled store and driven by tests directly.
pub trait MetaStateMachine: Send + Sync {
    /// Applies the op at log `index`. An index at or below [`Self::applied_index`] is skipped
    /// (returns `Unchanged`): replays after a restart do not apply twice.
    fn apply(&self, index: u64, op: &MetaOp) -> Result<MetaOutcome>;
    fn applied_index(&self) -> u64;
}

/// How many log entries the id of an applied op is remembered for (see
/// [`SledMetaStore::apply_with_id`]).
pub const OP_ID_WINDOW: u64 = 100_000;

/// A committed op with its log index and, for replicated logs, the proposer's op id (see
/// [`SledMetaStore::apply_with_id`]).
#[derive(Clone, Copy, Debug)]
pub struct LoggedOp<'a> {
    pub index: u64,
    pub op_id: Option<&'a str>,
    pub op: &'a MetaOp,
}

impl SledMetaStore {
    /// Like [`MetaStateMachine::apply`], for replicated logs where a client may propose the same
    /// op twice (a retry after its leader died). The first application of `op_id` records its
    /// outcome; a later op with the same id within [`OP_ID_WINDOW`] entries returns that outcome
    /// and changes nothing. Ids older than the window are forgotten at a point fixed by the log
    /// index, so every node forgets alike. An op that is refused records nothing: a retry is
    /// judged again.
    ///
    /// Not flushed (unlike [`MetaStateMachine::apply`]): the replicated log is the durable
    /// record, and the op's effects and its applied index are one atomic batch, so after a
    /// crash the store is at some earlier index and the log replays the rest. See
    /// [`Self::flush`].
    pub fn apply_with_id(&self, index: u64, op_id: &str, op: &MetaOp) -> Result<MetaOutcome> {
        self.apply_at(index, Some(op_id), op, false)
    }

    /// Makes every applied op durable.
    pub fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    /// Applies committed ops in log order as one atomic sled batch: each op sees the effects
    /// of those before it, and the batch's last index is the store's applied index. Each op
    /// gets its own outcome; an op that is refused changes nothing but consumes its index. A
    /// storage error in an op ends the batch there: the ops before it are written, the error
    /// is its outcome, and the ops after it are not applied (nor in the result).
    pub fn apply_batch_with_ids(
        &self,
        ops: &[LoggedOp<'_>],
        flush: bool,
    ) -> Result<Vec<Result<MetaOutcome>>> {
        let _guard = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut applied = self.applied_index();
        let mut pending = Pending::new(&self.tree);
        let mut outcomes = Vec::with_capacity(ops.len());
        for logged in ops {
            let index = logged.index;
            if index <= applied {
                outcomes.push(Ok(MetaOutcome::Unchanged));
                continue;
            }
            let outcome = self.apply_one(&mut pending, logged);
            if let Err(error) = &outcome
                && error.is_transient()
            {
                outcomes.push(outcome);
                break;
            }
            applied = index;
            outcomes.push(outcome);
        }
        if applied > self.applied_index() {
            pending.put_raw(APPLIED_KEY.to_vec(), applied.to_be_bytes().to_vec());
            self.tree.apply_batch(pending.into_batch())?;
            if flush {
                self.db.flush()?;
            }
        }
        Ok(outcomes)
    }

    /// One op of a batch (see [`Self::apply_batch_with_ids`]).
    fn apply_one(&self, pending: &mut Pending<'_>, logged: &LoggedOp<'_>) -> Result<MetaOutcome> {
        let LoggedOp { index, op_id, op } = *logged;
        if let Some(op_id) = op_id
            && let Some((_, outcome)) = pending.get::<(u64, MetaOutcome)>(&op_id_key(op_id))?
        {
            return Ok(outcome);
        }
        let mark = pending.mark();
        // A failed op still consumes its index: it is in the log and every node fails it alike.
        let outcome = self.apply_op(pending, op);
        if let (Some(op_id), Ok(outcome)) = (op_id, &outcome) {
            pending.put(op_id_key(op_id), &(index, outcome))?;
            pending.put_str(op_index_key(index), op_id);
        }
        if op_id.is_some() && index > OP_ID_WINDOW {
            let end = op_index_key(index - OP_ID_WINDOW);
            for (key, old_id) in pending.scan_range(op_index_key(0), end)? {
                pending.remove(op_id_key(&String::from_utf8_lossy(&old_id)));
                pending.remove(key);
            }
        }
        if outcome.is_err() {
            pending.rollback(mark);
        }
        outcome
    }

    fn apply_at(
        &self,
        index: u64,
        op_id: Option<&str>,
        op: &MetaOp,
        flush: bool,
    ) -> Result<MetaOutcome> {
        let logged = LoggedOp { index, op_id, op };
        match self.apply_batch_with_ids(&[logged], flush)?.pop() {
            Some(outcome) => outcome,
            None => Ok(MetaOutcome::Unchanged),
        }
    }
}

impl MetaStateMachine for SledMetaStore {
    fn apply(&self, index: u64, op: &MetaOp) -> Result<MetaOutcome> {
        self.apply_at(index, None, op, true)
    }

    fn applied_index(&self) -> u64 {
        match self.tree.get(APPLIED_KEY) {
            Ok(Some(bytes)) if bytes.len() == 8 => {
                let mut array = [0u8; 8];
                array.copy_from_slice(&bytes);
                u64::from_be_bytes(array)
            }
            _ => 0,
        }
    }
}
