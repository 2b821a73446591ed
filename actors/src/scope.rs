//! On whose behalf an operation runs: the caller's tenant and, for document-level access,
//! the document groups it reads (none: every document, for admins). Every KB operation of [`SiftNode`]
//! takes a [`Scope`] and finds its KB through [`SiftNode::find_kb`], the one lookup, which
//! answers a KB of another tenant (not shared with the caller's) as one that does not exist.
//! An agent run reads through a [`ScopedCorpus`] of its caller's scope, so its tools cannot
//! reach further than the caller could.
//!
//! [`SiftNode`]: crate::SiftNode
//! [`SiftNode::find_kb`]: crate::SiftNode::find_kb

use std::sync::Arc;

use futures::future::BoxFuture;
use sift_storage::chunk::ChunkView;
pub use sift_storage::meta::{DEFAULT_TENANT, KbAccess};
use sift_storage::meta::{DocumentRecord, KbRecord};

use crate::SiftNode;
use crate::agent::Corpus;
use crate::error::{Result, SiftError};
use crate::node::DocumentPage;
use crate::retrieval::SearchResponse;
use crate::retrieval::query::SearchQuery;

/// The tenant an operation runs for, and the groups whose documents it reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scope {
    tenant: String,
    /// `None`: every document of the tenant's KBs; else the open ones and those of a group
    /// listed here.
    groups: Option<Vec<String>>,
}

/// Most groups a document or a key names.
pub const MAX_GROUPS: usize = 32;
/// Longest group name, in bytes.
pub const MAX_GROUP_NAME: usize = 64;

/// Checks group names (1 to [`MAX_GROUP_NAME`] of lowercase ASCII letters, digits, `-`, `_`,
/// `.`; at most [`MAX_GROUPS`]); sorted and deduplicated.
pub fn check_groups(groups: &[String]) -> Result<Vec<String>> {
    if groups.len() > MAX_GROUPS {
        return Err(SiftError::invalid(
            "invalid_groups",
            format!("at most {MAX_GROUPS} groups"),
        ));
    }
    for group in groups {
        let valid = !group.is_empty()
            && group.len() <= MAX_GROUP_NAME
            && group
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.'));
        if !valid {
            let shown: String = group.chars().take(40).collect();
            return Err(SiftError::invalid(
                "invalid_groups",
                format!(
                    "group {shown:?} is not 1 to {MAX_GROUP_NAME} lowercase letters, digits, '-', '_' or '.'"
                ),
            ));
        }
    }
    let mut groups = groups.to_vec();
    groups.sort();
    groups.dedup();
    Ok(groups)
}

impl Scope {
    /// Every document of `name`'s KBs.
    pub fn tenant(name: impl Into<String>) -> Scope {
        Scope {
            tenant: name.into(),
            groups: None,
        }
    }

    /// Only the open documents and those of `groups` (`None`: every document).
    pub fn with_groups(mut self, groups: Option<Vec<String>>) -> Scope {
        self.groups = groups;
        self
    }

    pub fn groups(&self) -> Option<&[String]> {
        self.groups.as_deref()
    }

    /// Whether the scope reads `document`.
    pub fn may_read(&self, document: &DocumentRecord) -> bool {
        sift_storage::chunk::may_read(&document.metadata, self.groups())
    }

    /// The default tenant's scope: auth off, the operator's tools, tests.
    pub fn default_tenant() -> Scope {
        Scope::tenant(DEFAULT_TENANT)
    }

    pub fn name(&self) -> &str {
        &self.tenant
    }
}

/// What an operation does to the KB it finds: a shared KB may be read, not changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
}

/// The node as one caller's agent run sees it: every read in the caller's scope.
pub struct ScopedCorpus {
    pub node: Arc<SiftNode>,
    pub scope: Scope,
}

impl Corpus for ScopedCorpus {
    fn find_kb(&self, kb: &str) -> Result<KbRecord> {
        self.node.find_kb(&self.scope, kb, Need::Read)
    }

    fn get_document(&self, kb: &str, document: &str) -> Result<DocumentRecord> {
        self.node.get_document(&self.scope, kb, document)
    }

    fn list_documents(&self, kb: &str, after: Option<&str>, limit: usize) -> Result<DocumentPage> {
        self.node
            .list_documents(&self.scope, kb, after, limit, None)
    }

    fn document_chunks<'a>(
        &'a self,
        kb: &'a str,
        document: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ChunkView>>> {
        Box::pin(self.node.document_chunks(&self.scope, kb, document))
    }

    fn search<'a>(
        &'a self,
        kb: &'a str,
        query: SearchQuery,
    ) -> BoxFuture<'a, Result<SearchResponse>> {
        Box::pin(self.node.search(&self.scope, kb, query))
    }

    fn graph_entities<'a>(
        &'a self,
        kb: &'a str,
        q: &'a str,
    ) -> BoxFuture<'a, Result<crate::node::graph::EntityList>> {
        Box::pin(self.node.graph_entities(&self.scope, kb, q, 10))
    }

    fn graph_entity<'a>(
        &'a self,
        kb: &'a str,
        entity: &'a str,
    ) -> BoxFuture<'a, Result<crate::node::graph::EntityDetail>> {
        Box::pin(self.node.graph_entity(&self.scope, kb, entity))
    }

    fn graph_path<'a>(
        &'a self,
        kb: &'a str,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<crate::node::graph::GraphPath>> {
        Box::pin(
            self.node
                .graph_path(&self.scope, kb, from, to, crate::retrieval::graph::MAX_HOPS),
        )
    }

    fn graph_communities<'a>(
        &'a self,
        kb: &'a str,
    ) -> BoxFuture<'a, Result<crate::node::communities::CommunityList>> {
        let summaries = self.node.context().chat_model.get().is_some();
        Box::pin(self.node.graph_communities(
            &self.scope,
            kb,
            crate::agent::tools::graph::COMMUNITIES_SHOWN,
            summaries,
        ))
    }

    fn embed<'a>(
        &'a self,
        kb: &'a str,
        texts: Vec<String>,
    ) -> BoxFuture<'a, Option<Vec<Vec<f32>>>> {
        Box::pin(async move {
            let record = self.node.find_kb(&self.scope, kb, Need::Read).ok()?;
            let context = self.node.context();
            let embedder = context
                .embedders
                .get(&record.settings.embedding_model)
                .ok()?;
            context.embed_cached(&embedder, texts).await.ok()
        })
    }
}
