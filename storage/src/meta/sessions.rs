//! Chat sessions in the metadata state machine: sessions, their stored turns and the history
//! summary. Kept in the same sled tree as the rest of the metadata so that a turn and the
//! applied index are written in one atomic batch, and a snapshot of the tree carries sessions
//! (keys `sess/`, `turn/`, `turnmsg/`: see `keys.rs`).
//!
//! Every type here is bincode-safe (no `serde_json::Value`, no internally tagged enums): ops
//! travel between nodes as bincode.

use serde::{Deserialize, Serialize};

use super::keys::{
    SESSION_PREFIX, session_key, turn_key, turn_message_key, turn_message_prefix, turn_prefix,
};
use super::pending::Pending;
use super::{SledMetaStore, decode};
use crate::error::{Result, StorageError};

/// A chat session: the KBs and agent its runs use, and its turns so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionRecord {
    pub id: String,
    /// KB ids the session's runs search.
    pub kbs: Vec<String>,
    /// The agent preset's name.
    pub agent: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Stored turns so far (the next turn's sequence number).
    pub turns: u32,
    /// Summary of the oldest `summary_turns` turns, made by context management.
    pub history_summary: Option<String>,
    pub summary_turns: u32,
    /// The id of the API key that made the session: only it (and admins) may see or use it.
    /// `None` for sessions made with auth off (or before keys existed): admins only.
    #[serde(default)]
    pub owner: Option<String>,
}

impl SessionRecord {
    /// A new session, before any turn.
    pub fn new(
        id: &str,
        kbs: &[String],
        agent: &str,
        created_at_ms: u64,
        owner: Option<String>,
    ) -> SessionRecord {
        SessionRecord {
            id: id.to_string(),
            kbs: kbs.to_vec(),
            agent: agent.to_string(),
            created_at_ms,
            updated_at_ms: created_at_ms,
            turns: 0,
            history_summary: None,
            summary_turns: 0,
            owner,
        }
    }
}

/// A citation as stored with a turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnCitation {
    pub n: u32,
    pub chunk_id: String,
    pub kb_id: String,
    pub document_id: String,
    pub document_title: String,
    pub external_id: Option<String>,
    pub span: (u32, u32),
    pub text: String,
}

/// One step of a run's trace as stored (`detail` is JSON text: bincode cannot carry
/// free-form JSON values).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnTraceStep {
    pub kind: String,
    pub name: String,
    pub started_ms: u64,
    pub duration_ms: u64,
    pub detail_json: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TurnUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub iterations: u32,
}

/// One question and its answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredTurn {
    pub message_id: String,
    pub session_id: String,
    pub run_id: String,
    /// Position in the session, from 0; set when applied.
    pub seq: u32,
    pub question: String,
    pub answer: String,
    pub citations: Vec<TurnCitation>,
    /// `stop`, `budget`, `stopped` or `error`.
    pub finish_reason: String,
    /// `agent`, `fast_path` or `extractive`.
    pub mode: String,
    pub usage: TurnUsage,
    pub trace: Vec<TurnTraceStep>,
    pub created_at_ms: u64,
}

impl SledMetaStore {
    pub fn get_session(&self, id: &str) -> Result<Option<SessionRecord>> {
        self.tree
            .get(session_key(id))?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// A page of at most `limit` sessions in descending id order (newest first: the node's
    /// session ids are UUIDv7, ordered by creation time), starting after the session `after`
    /// when given; only the sessions `keep` accepts. Reads only up to the page (and the
    /// sessions `keep` refuses in between).
    pub fn list_sessions(
        &self,
        after: Option<&str>,
        limit: usize,
        mut keep: impl FnMut(&SessionRecord) -> bool,
    ) -> Result<Vec<SessionRecord>> {
        let end = match after {
            Some(id) => session_key(id),
            // Every key under the prefix sorts below the prefix followed by 0xff.
            None => [SESSION_PREFIX, &[0xff]].concat(),
        };
        let mut sessions = Vec::new();
        for item in self.tree.range(SESSION_PREFIX.to_vec()..end).rev() {
            if sessions.len() == limit {
                break;
            }
            let (_, value) = item?;
            let session = decode::<SessionRecord>(&value)?;
            if keep(&session) {
                sessions.push(session);
            }
        }
        Ok(sessions)
    }

    /// The stored turns of a session, oldest first.
    pub fn session_turns(&self, session_id: &str) -> Result<Vec<StoredTurn>> {
        let mut turns = Vec::new();
        for item in self.tree.scan_prefix(turn_prefix(session_id)) {
            let (_, value) = item?;
            turns.push(decode::<StoredTurn>(&value)?);
        }
        Ok(turns)
    }

    pub(super) fn apply_create_session(
        &self,
        pending: &mut Pending<'_>,
        session: &SessionRecord,
    ) -> Result<SessionRecord> {
        if let Some(existing) = pending.get::<SessionRecord>(&session_key(&session.id))? {
            return Ok(existing); // a retried create
        }
        let mut record = session.clone();
        record.turns = 0;
        record.summary_turns = 0;
        pending.put(session_key(&record.id), &record)?;
        Ok(record)
    }

    /// Removes the session and its turns; `None` when it did not exist.
    pub(super) fn apply_delete_session(
        &self,
        pending: &mut Pending<'_>,
        id: &str,
    ) -> Result<Option<SessionRecord>> {
        let Some(session) = pending.get::<SessionRecord>(&session_key(id))? else {
            return Ok(None);
        };
        pending.remove(session_key(id));
        for prefix in [turn_prefix(id), turn_message_prefix(id)] {
            for (key, _) in pending.scan_prefix(&prefix)? {
                pending.remove(key);
            }
        }
        Ok(Some(session))
    }

    /// Appends a turn; a retried append of the same message id returns the stored turn.
    pub(super) fn apply_append_turn(
        &self,
        pending: &mut Pending<'_>,
        session_id: &str,
        turn: &StoredTurn,
    ) -> Result<StoredTurn> {
        let Some(mut session) = pending.get::<SessionRecord>(&session_key(session_id))? else {
            return Err(StorageError::NotFound(format!("session {session_id}")));
        };
        if let Some(seq) = pending.get_str(&turn_message_key(session_id, &turn.message_id))? {
            let seq: u32 = seq
                .parse()
                .map_err(|_| StorageError::Corrupt(format!("turn seq {seq:?}")))?;
            if let Some(existing) = pending.get::<StoredTurn>(&turn_key(session_id, seq))? {
                return Ok(existing);
            }
        }
        let mut stored = turn.clone();
        stored.session_id = session_id.to_string();
        stored.seq = session.turns;
        pending.put(turn_key(session_id, stored.seq), &stored)?;
        pending.put_str(
            turn_message_key(session_id, &stored.message_id),
            &stored.seq.to_string(),
        );
        session.turns += 1;
        session.updated_at_ms = session.updated_at_ms.max(stored.created_at_ms);
        pending.put(session_key(session_id), &session)?;
        Ok(stored)
    }

    pub(super) fn apply_set_history_summary(
        &self,
        pending: &mut Pending<'_>,
        session_id: &str,
        summary: &Option<String>,
        summary_turns: u32,
        at_ms: u64,
    ) -> Result<Option<SessionRecord>> {
        let Some(mut session) = pending.get::<SessionRecord>(&session_key(session_id))? else {
            return Ok(None); // deleted meanwhile
        };
        session.history_summary = summary.clone();
        session.summary_turns = summary_turns.min(session.turns);
        session.updated_at_ms = session.updated_at_ms.max(at_ms);
        pending.put(session_key(session_id), &session)?;
        Ok(Some(session))
    }
}
