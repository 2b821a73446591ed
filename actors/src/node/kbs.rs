//! Knowledge bases: create (placing every shard's replicas), read, update the settings that
//! can change without re-indexing, delete.

use sift_api::kbs::{CreateKb, SettingsPatch, UpdateKb};
use sift_cluster::placement::place_replicas;
use sift_models::ocr::OCR_SETTINGS;
use sift_storage::meta::{
    DEFAULT_TENANT, DocumentCounts, KbAccess, KbRecord, KbSettings, MetaOp, MetaOutcome, Replica,
    ReplicaState, ShardPlacement,
};

use super::SiftNode;
use crate::context::EMBEDDED_MODEL;
use crate::error::{Result, SiftError};
use crate::ingest::pipeline::now_ms;
use crate::reconcile::rebalance::{node_loads, replicas_on};
use crate::retrieval::settings as retrieval_settings;
use crate::scope::{Need, Scope};
use crate::shards::supervisor::drop_kb_shards;

/// A KB with its document counts by status and its size; the node's answer to reads and
/// writes of KBs.
#[derive(Clone, Debug)]
pub struct KbState {
    pub record: KbRecord,
    pub documents: DocumentCounts,
    /// The chunks of the documents the caller reads.
    pub chunks: u64,
    /// The raw bytes of the KB's live documents (the per-shard counts tenant quotas read);
    /// `None` for a caller restricted to document groups: they count documents it may not
    /// read.
    pub stored_bytes: Option<u64>,
    /// The tenant that owns it.
    pub tenant: String,
    /// How the caller reaches it.
    pub access: KbAccess,
    /// The tenants its owner shares it with (empty for a caller it is shared with).
    pub shared_with: Vec<String>,
}

impl SiftNode {
    pub async fn create_kb(&self, scope: &Scope, request: CreateKb) -> Result<KbState> {
        validate_kb_name(&request.name)?;
        if self
            .store()
            .find_kb_in(scope.name(), &request.name)?
            .is_some_and(|(_, access)| access == KbAccess::Owner)
        {
            return Err(SiftError::Conflict {
                code: "kb_exists",
                message: format!("a knowledge base named {:?} already exists", request.name),
            });
        }
        let embedding_model = request
            .embedding_model
            .clone()
            .unwrap_or_else(|| EMBEDDED_MODEL.to_string());
        let embedder = self.context.embedders.get(&embedding_model)?;
        let shards = request.shards.unwrap_or(2);
        if !(1..=64).contains(&shards) {
            return Err(SiftError::invalid(
                "invalid_settings",
                "shards must be between 1 and 64",
            ));
        }
        let members = self.context.access.placement_members();
        let replication_factor = request
            .replication_factor
            .unwrap_or_else(|| (members.len() as u32).min(3));
        if replication_factor == 0 || replication_factor as usize > members.len() {
            return Err(SiftError::invalid(
                "invalid_settings",
                format!(
                    "replication_factor must be between 1 and the number of nodes ({})",
                    members.len()
                ),
            ));
        }
        let mut settings = KbSettings::new(
            shards,
            replication_factor,
            embedding_model,
            embedder.dimension() as u32,
        );
        self.apply_settings(&mut settings, request.settings_patch())?;
        let kbs = self.store().list_kbs()?;
        let limits = &self.context.options;
        if kbs.len() >= limits.max_kbs {
            return Err(SiftError::Conflict {
                code: "too_many_kbs",
                message: format!(
                    "the cluster holds {} knowledge bases, the limit (max_kbs); delete one first",
                    limits.max_kbs
                ),
            });
        }
        if let Some(limit) = self.store().tenant_limits(scope.name())?.max_kbs {
            let owned = self
                .store()
                .list_kbs_in(scope.name())?
                .into_iter()
                .filter(|(_, access)| *access == KbAccess::Owner)
                .count();
            if owned >= limit as usize {
                return Err(SiftError::Forbidden {
                    code: "kb_quota_exceeded",
                    message: format!(
                        "the tenant {:?} owns {owned} knowledge bases, its limit (max_kbs); delete one first",
                        scope.name()
                    ),
                });
            }
        }
        let now = now_ms();
        let load = node_loads(self.store(), &kbs, &members);
        let placed = place_replicas(shards, replication_factor, &members, &load);
        // Every shard replica costs its node memory, threads and files: none goes over its cap.
        for &node in &members {
            let new = placed.iter().filter(|nodes| nodes.contains(&node)).count();
            let held = replicas_on(&kbs, node);
            if new > 0 && held + new > limits.max_shards_per_node {
                return Err(SiftError::Conflict {
                    code: "too_many_shards",
                    message: format!(
                        "node {node} holds {held} shard replicas; {new} more would pass the \
                         limit of {} (max_shards_per_node)",
                        limits.max_shards_per_node
                    ),
                });
            }
        }
        let placement = placed
            .into_iter()
            .map(|nodes| ShardPlacement {
                replicas: nodes
                    .into_iter()
                    .map(|node| Replica {
                        node,
                        // Nothing to fill: a new KB's replicas serve at once.
                        state: ReplicaState::Active,
                        since_ms: now,
                    })
                    .collect(),
            })
            .collect();
        let kb = KbRecord {
            id: uuid::Uuid::now_v7().to_string(),
            name: request.name,
            settings,
            created_at_ms: now,
            updated_at_ms: now,
            placement,
        };
        // The default tenant's KBs keep the op from before tenants.
        let op = if scope.name() == DEFAULT_TENANT {
            MetaOp::CreateKb(kb)
        } else {
            MetaOp::CreateTenantKb {
                tenant: scope.name().to_string(),
                kb,
            }
        };
        let outcome = self
            .context
            .meta
            .propose(op)
            .await
            .map_err(conflict_as_kb_exists)?;
        let MetaOutcome::Kb(kb) = outcome else {
            return Err(SiftError::Internal(format!(
                "unexpected outcome {outcome:?}"
            )));
        };
        self.open_shards(&kb).await?;
        self.kb_state(scope, kb, KbAccess::Owner)
    }

    /// The KB `kb` (an id, a name of the scope's tenant, or `{tenant}:{name}`) as the scope
    /// reaches it: the one lookup of every KB operation. A KB of another tenant not shared
    /// with the scope's is `kb_not_found`, as one that does not exist; a shared one refuses
    /// [`Need::Write`] (`kb_read_only`).
    pub fn find_kb(&self, scope: &Scope, kb: &str, need: Need) -> Result<KbRecord> {
        let (record, access) = self.find_kb_access(scope, kb)?;
        check_need(&record, access, need)?;
        Ok(record)
    }

    fn find_kb_access(&self, scope: &Scope, kb: &str) -> Result<(KbRecord, KbAccess)> {
        self.store()
            .find_kb_in(scope.name(), kb)?
            .ok_or_else(|| SiftError::kb_not_found(kb))
    }

    /// The KB about to take documents or queries on this node. In cluster mode a KB created
    /// elsewhere may not be applied here yet (a linearizable read settles it) and this node's
    /// replicas of it not open yet (the reconciler opens them within a round; so does this).
    pub(super) async fn find_kb_for_data(
        &self,
        scope: &Scope,
        kb: &str,
        need: Need,
    ) -> Result<KbRecord> {
        if !self.context.meta.is_replicated() {
            return self.find_kb(scope, kb, need);
        }
        let record = match self.store().find_kb_in(scope.name(), kb)? {
            Some((record, access)) => {
                check_need(&record, access, need)?;
                record
            }
            None => {
                self.context.meta.linearizable_barrier().await?;
                self.find_kb(scope, kb, need)?
            }
        };
        if let Err(error) = self.open_shards(&record).await {
            // A damaged replica here: its searches report the shard as failed, its writes
            // are refused as unavailable; the KB's other shards serve.
            tracing::debug!(kb_id = %record.id, %error, "a replica of this node is not open");
        }
        Ok(record)
    }

    /// [`Self::get_kb`] after a ReadIndex barrier in cluster mode, so that the answer is
    /// linearizable: a lagging or partitioned member never answers settings older than a
    /// change that has returned (it answers an error instead when it cannot reach a leader).
    pub async fn get_kb_linearizable(&self, scope: &Scope, kb: &str) -> Result<KbState> {
        self.context.meta.linearizable_barrier().await?;
        self.get_kb(scope, kb)
    }

    pub fn get_kb(&self, scope: &Scope, kb: &str) -> Result<KbState> {
        let (kb, access) = self.find_kb_access(scope, kb)?;
        self.kb_state(scope, kb, access)
    }

    /// A KB as `scope` sees it: its document and chunk counts are of the documents the scope
    /// reads; its bytes come from the per-shard counts, not from the document records.
    fn kb_state(&self, scope: &Scope, kb: KbRecord, access: KbAccess) -> Result<KbState> {
        let store = self.store();
        let readable = store.readable_documents(&kb.id, |doc| scope.may_read(doc))?;
        let stored_bytes = match scope.groups() {
            Some(_) => None,
            None => Some(store.kb_stored_bytes(&kb.id)?),
        };
        let shared_with = match access {
            KbAccess::Owner => store.kb_shares(&kb.id)?,
            KbAccess::Shared => Vec::new(),
        };
        Ok(KbState {
            tenant: store.kb_tenant(&kb.id)?,
            record: kb,
            documents: readable.counts,
            chunks: readable.chunks,
            stored_bytes,
            access,
            shared_with,
        })
    }

    /// The KBs of the scope's tenant and those shared with it.
    pub fn list_kbs(&self, scope: &Scope) -> Result<Vec<KbState>> {
        self.list_kbs_page(scope, None, usize::MAX)
    }

    /// The KBs the scope may read in id order (creation order: ids are UUIDv7), at most
    /// `limit` of them after the id `after`; only the page's document counts are computed.
    pub fn list_kbs_page(
        &self,
        scope: &Scope,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<KbState>> {
        let mut kbs = self.store().list_kbs_in(scope.name())?;
        kbs.sort_by(|(a, _), (b, _)| a.id.cmp(&b.id));
        kbs.into_iter()
            .filter(|(kb, _)| after.is_none_or(|after| kb.id.as_str() > after))
            .take(limit)
            .map(|(kb, access)| self.kb_state(scope, kb, access))
            .collect()
    }

    /// Shares a KB of the scope's tenant read-only with `tenant` (`shared`), or stops.
    pub async fn share_kb(
        &self,
        scope: &Scope,
        kb: &str,
        tenant: &str,
        shared: bool,
    ) -> Result<KbState> {
        let kb = self.find_kb(scope, kb, Need::Write)?;
        if shared {
            if self.store().get_tenant(tenant)?.is_none() {
                return Err(SiftError::NotFound {
                    code: "tenant_not_found",
                    what: format!("tenant {tenant:?}"),
                });
            }
            if tenant == scope.name() {
                return Err(SiftError::invalid(
                    "invalid_tenant",
                    "a knowledge base is not shared with its own tenant",
                ));
            }
        }
        self.context
            .meta
            .propose(MetaOp::ShareKb {
                kb_id: kb.id.clone(),
                tenant: tenant.to_string(),
                shared,
            })
            .await?;
        self.kb_state(scope, kb, KbAccess::Owner)
    }

    pub async fn update_kb(&self, scope: &Scope, kb: &str, request: UpdateKb) -> Result<KbState> {
        let kb = self.find_kb(scope, kb, Need::Write)?;
        if request.shards.is_some_and(|s| s != kb.settings.shards) {
            return Err(SiftError::invalid(
                "immutable_setting",
                "shards is fixed when the knowledge base is created",
            ));
        }
        if request
            .replication_factor
            .is_some_and(|r| r != kb.settings.replication_factor)
        {
            return Err(SiftError::invalid(
                "immutable_setting",
                "replication_factor is fixed when the knowledge base is created",
            ));
        }
        if request
            .embedding_model
            .as_ref()
            .is_some_and(|m| *m != kb.settings.embedding_model)
        {
            return Err(SiftError::invalid(
                "immutable_setting",
                "embedding_model is fixed when the knowledge base is created",
            ));
        }
        let mut settings = kb.settings.clone();
        self.apply_settings(&mut settings, request.settings_patch())?;
        let outcome = self
            .context
            .meta
            .propose(MetaOp::UpdateKb {
                kb_id: kb.id.clone(),
                settings,
                at_ms: now_ms(),
            })
            .await?;
        let MetaOutcome::Kb(kb) = outcome else {
            return Err(SiftError::kb_not_found(&kb.id));
        };
        self.kb_state(scope, kb, KbAccess::Owner)
    }

    /// Sets the values `patch` carries on `settings` (the defaults of a new KB, or a KB's
    /// current ones), then checks the result as a whole.
    fn apply_settings(&self, settings: &mut KbSettings, patch: SettingsPatch) -> Result<()> {
        if let Some(value) = patch.chunk_tokens {
            settings.chunk_tokens = value;
        }
        if let Some(value) = patch.chunk_overlap_tokens {
            settings.chunk_overlap_tokens = value;
        }
        if let Some(value) = patch.parent_tokens {
            settings.parent_tokens = value;
        } else if settings.parent_tokens < settings.chunk_tokens {
            settings.parent_tokens = settings.chunk_tokens.saturating_mul(4);
        }
        if let Some(value) = patch.language {
            settings.language = value;
        }
        if let Some(value) = patch.json_text_field {
            settings.json_text_field = value;
        }
        if let Some(value) = patch.json_title_field {
            settings.json_title_field = value;
        }
        if let Some(value) = patch.ocr {
            settings.ocr = value;
        }
        if let Some(value) = patch.graph {
            settings.graph = value;
        }
        if let Some(value) = patch.graph_token_budget {
            settings.graph_token_budget = value;
        }
        check_settings(settings)?;
        if let Some(retrieval) = &patch.retrieval {
            settings.retrieval = retrieval_settings::merge_patch(
                &settings.retrieval,
                retrieval,
                self.root.rerankers(),
            )?;
        }
        Ok(())
    }

    pub async fn delete_kb(&self, scope: &Scope, kb: &str) -> Result<()> {
        let kb = self.find_kb(scope, kb, Need::Write)?;
        let outcome = self
            .context
            .meta
            .propose(MetaOp::DeleteKb {
                kb_id: kb.id.clone(),
            })
            .await?;
        let kb_id = kb.id.clone();
        drop_kb_shards(&self.shards, kb_id).await;
        if let MetaOutcome::KbDeleted { documents, .. } = outcome {
            for tombstone in documents {
                let _ = self.context.raw.remove(&tombstone.document_id);
            }
        }
        Ok(())
    }
}

/// Refuses a change to a KB the caller reaches only through a share.
fn check_need(kb: &KbRecord, access: KbAccess, need: Need) -> Result<()> {
    if need == Need::Write && access == KbAccess::Shared {
        return Err(SiftError::Forbidden {
            code: "kb_read_only",
            message: format!(
                "knowledge base {:?} is shared with your tenant read-only",
                kb.name
            ),
        });
    }
    Ok(())
}

fn conflict_as_kb_exists(error: SiftError) -> SiftError {
    if error.code() == "conflict" {
        SiftError::Conflict {
            code: "kb_exists",
            message: error.to_string(),
        }
    } else {
        error
    }
}

fn validate_kb_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
        && uuid::Uuid::parse_str(name).is_err();
    if valid {
        Ok(())
    } else {
        Err(SiftError::invalid(
            "invalid_name",
            "a knowledge base name is 1 to 64 characters of letters, digits, '-', '_' or '.', not starting with '.'",
        ))
    }
}

fn check_settings(settings: &KbSettings) -> Result<()> {
    let invalid = |message: &str| Err(SiftError::invalid("invalid_settings", message));
    if !(16..=8192).contains(&settings.chunk_tokens) {
        return invalid("chunk_tokens must be between 16 and 8192");
    }
    if u64::from(settings.chunk_overlap_tokens) * 2 > u64::from(settings.chunk_tokens) {
        return invalid("chunk_overlap_tokens must be at most half of chunk_tokens");
    }
    if settings.parent_tokens < settings.chunk_tokens || settings.parent_tokens > 32768 {
        return invalid("parent_tokens must be between chunk_tokens and 32768");
    }
    if !matches!(settings.language.as_str(), "auto" | "en" | "zh") {
        return invalid("language must be auto, en or zh");
    }
    if settings.json_text_field.is_empty() || settings.json_title_field.is_empty() {
        return invalid("json_text_field and json_title_field must not be empty");
    }
    if !OCR_SETTINGS.contains(&settings.ocr.as_str()) {
        return invalid("ocr must be auto, off, vision or tesseract");
    }
    if !matches!(settings.graph.as_str(), "embedded" | "llm" | "off") {
        return invalid("graph must be embedded, llm or off");
    }
    Ok(())
}
