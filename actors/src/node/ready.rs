//! Readiness: whether this node can serve what it holds, check by check (`GET /readyz`).

use std::time::Duration;

use serde::Serialize;
use sift_storage::meta::ReplicaState;

use super::SiftNode;
use crate::EMBEDDED_MODEL;
use crate::ingest::pipeline::now_ms;
use crate::shards::ShardKey;

/// A replica placed on this node this recently, after the node started, may still be opening
/// (a KB just created, a replica just moved here): it does not count against readiness yet.
/// Replicas placed before the node started were opened at start and always count.
pub const OPENING_GRACE: Duration = Duration::from_secs(30);

/// One readiness check: its name, whether it passes, and what it saw.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[schema(as = ReadinessCheck)]
pub struct Check {
    #[schema(value_type = String)]
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Every check, in a fixed order. The node is ready when all of them pass.
#[derive(Clone, Debug, Serialize)]
pub struct Readiness {
    pub checks: Vec<Check>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|check| check.ok)
    }

    pub fn failing(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|check| !check.ok)
    }
}

impl SiftNode {
    /// The readiness checks:
    /// - `raft_storage` (cluster mode): the Raft log and state machine are writable;
    /// - `embedding_models`: some embedding model is loaded, and the model of every KB is;
    /// - `shards`: every active replica placed on this node is open (one that could not be
    ///   opened, a damaged index, keeps the node unready until it opens or moves);
    /// - `raft_leader` (cluster mode): this member knows a leader, so metadata moves.
    pub fn readiness(&self) -> Readiness {
        let context = &self.context;
        let mut checks = Vec::new();
        let raft = context.meta.raft();
        if let Some(raft) = raft {
            let failure = raft.storage_failure();
            checks.push(Check {
                name: "raft_storage",
                ok: failure.is_none(),
                detail: failure.unwrap_or_else(|| "writable".to_string()),
            });
        }

        let kbs = match self.store().list_kbs() {
            Ok(kbs) => kbs,
            Err(error) => {
                checks.push(Check {
                    name: "metadata",
                    ok: false,
                    detail: format!("the metadata store cannot be read: {error}"),
                });
                return Readiness { checks };
            }
        };

        let embedders = &context.embedders;
        let mut missing: Vec<String> = Vec::new();
        if embedders.local.is_none() && embedders.remote.is_empty() {
            missing.push(format!(
                "{EMBEDDED_MODEL} ({})",
                embedders
                    .local_error
                    .as_deref()
                    .unwrap_or("no model directory configured")
            ));
        }
        for kb in &kbs {
            let model = &kb.settings.embedding_model;
            if embedders.get(model).is_err() {
                let entry = format!("{model} (used by knowledge base {})", kb.name);
                if !missing.contains(&entry) {
                    missing.push(entry);
                }
            }
        }
        let mut loaded: Vec<&str> = embedders.remote.keys().map(String::as_str).collect();
        if embedders.local.is_some() {
            loaded.push(EMBEDDED_MODEL);
        }
        loaded.sort_unstable();
        checks.push(Check {
            name: "embedding_models",
            ok: missing.is_empty(),
            detail: if missing.is_empty() {
                format!("loaded: {}", loaded.join(", "))
            } else {
                format!("not loaded: {}", missing.join("; "))
            },
        });

        let local = context.access.local_id();
        let settled_before = now_ms().saturating_sub(OPENING_GRACE.as_millis() as u64);
        let mut expected = 0usize;
        let mut closed: Vec<String> = Vec::new();
        for kb in &kbs {
            for shard in 0..kb.settings.shards {
                let placed_here = context.access.replicas(kb, shard).into_iter().any(|r| {
                    let since = r.since_ms.max(kb.created_at_ms);
                    r.node == local
                        && r.state == ReplicaState::Active
                        && (since < self.started_at_ms || since <= settled_before)
                });
                if !placed_here {
                    continue;
                }
                expected += 1;
                let key = ShardKey {
                    kb_id: kb.id.clone(),
                    shard,
                };
                if context.registry.get(&key).is_none() {
                    closed.push(format!("{}/{shard}", kb.name));
                }
            }
        }
        checks.push(Check {
            name: "shards",
            ok: closed.is_empty(),
            detail: if closed.is_empty() {
                format!("{expected} of {expected} replicas open")
            } else {
                let shown: Vec<&str> = closed.iter().take(20).map(String::as_str).collect();
                format!(
                    "{} of {expected} replicas not open (knowledge base/shard): {}{}",
                    closed.len(),
                    shown.join(", "),
                    if closed.len() > shown.len() {
                        ", ..."
                    } else {
                        ""
                    }
                )
            },
        });

        if let Some(raft) = raft {
            let status = raft.status();
            checks.push(Check {
                name: "raft_leader",
                ok: status.leader.is_some(),
                detail: match status.leader {
                    Some(leader) => format!("node {leader} (term {})", status.term),
                    None => format!("no leader known to node {} ({})", status.id, status.role),
                },
            });
        }
        Readiness { checks }
    }
}
