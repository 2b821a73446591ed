//! The in-memory view of which chunks are live and what each belongs to, so that search
//! filters (document ids, metadata equality) and deletes are checked without touching disk.
//!
//! A chunk id absent from the map is dead: deleted, replaced, or not yet visible because its
//! write is still in progress. Both channels drop dead ids, and the dense channel drops them
//! inside the HNSW search so they do not take places in the top k.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::chunk::{Metadata, SearchFilter};

/// What the filter needs to know about a live document.
#[derive(Debug, PartialEq)]
pub(crate) struct LiveDocument {
    pub document_id: String,
    pub metadata: Metadata,
    pub chunk_ids: Vec<u64>,
    /// Its access groups, parsed once (empty: open to every caller of its KB).
    groups: Vec<String>,
}

impl LiveDocument {
    pub fn new(document_id: String, metadata: Metadata, chunk_ids: Vec<u64>) -> LiveDocument {
        let groups = crate::chunk::access_groups(&metadata)
            .into_iter()
            .map(String::from)
            .collect();
        LiveDocument {
            document_id,
            metadata,
            chunk_ids,
            groups,
        }
    }

    fn is_restricted(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Whether a caller of `groups` (`None`: one who sees every document) may read it.
    fn may_read(&self, groups: Option<&[String]>) -> bool {
        match groups {
            None => true,
            Some(caller) => {
                self.groups.is_empty() || self.groups.iter().any(|g| caller.contains(g))
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct LiveDocuments {
    by_chunk: HashMap<u64, Arc<LiveDocument>>,
    by_document: HashMap<String, Arc<LiveDocument>>,
    /// Live documents restricted to groups, and the chunks of the open ones: a caller's groups
    /// hide nothing in a shard without restricted documents, and cannot be selective where
    /// the open chunks alone are many.
    restricted_documents: usize,
    open_chunks: usize,
}

impl LiveDocuments {
    /// Adds a document, replacing (and hiding the chunks of) any previous version.
    pub fn insert(&mut self, document: LiveDocument) {
        self.remove(&document.document_id);
        if document.is_restricted() {
            self.restricted_documents += 1;
        } else {
            self.open_chunks += document.chunk_ids.len();
        }
        let document = Arc::new(document);
        for &id in &document.chunk_ids {
            self.by_chunk.insert(id, Arc::clone(&document));
        }
        self.by_document
            .insert(document.document_id.clone(), document);
    }

    /// Removes a document; its chunks become dead.
    pub fn remove(&mut self, document_id: &str) -> Option<Arc<LiveDocument>> {
        let document = self.by_document.remove(document_id)?;
        if document.is_restricted() {
            self.restricted_documents -= 1;
        } else {
            self.open_chunks -= document.chunk_ids.len();
        }
        for id in &document.chunk_ids {
            self.by_chunk.remove(id);
        }
        Some(document)
    }

    pub fn chunk(&self, internal_id: u64) -> Option<&Arc<LiveDocument>> {
        self.by_chunk.get(&internal_id)
    }

    pub fn chunk_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_chunk.keys().copied()
    }

    pub fn is_live(&self, internal_id: u64) -> bool {
        self.by_chunk.contains_key(&internal_id)
    }

    pub fn document_count(&self) -> usize {
        self.by_document.len()
    }

    pub fn chunk_count(&self) -> usize {
        self.by_chunk.len()
    }

    /// Whether any live document is restricted to groups (if none, a caller's groups hide
    /// nothing here).
    pub fn has_restricted(&self) -> bool {
        self.restricted_documents > 0
    }

    /// Every live chunk passing `filter`, however many (for exact search).
    pub fn all_matching_chunks(&self, filter: &CompiledFilter<'_>) -> Vec<u64> {
        self.by_document
            .values()
            .filter(|document| filter.matches(document))
            .flat_map(|document| document.chunk_ids.iter().copied())
            .collect()
    }

    /// The live chunks passing a non-empty `filter`, or `None` if the filter is empty or
    /// passes more than `limit` chunks (then the caller searches the graph with the filter
    /// instead of scoring every candidate). A selective filter, such as a caller's groups
    /// that reach 1% of the documents, is scored exactly: the graph, filtered that hard,
    /// explores most of itself before it finds `k` permitted points.
    pub fn matching_chunks(&self, filter: &CompiledFilter<'_>, limit: usize) -> Option<Vec<u64>> {
        let mut ids = Vec::new();
        let mut add = |document: &LiveDocument| {
            if filter.matches(document) {
                ids.extend_from_slice(&document.chunk_ids);
            }
            ids.len() <= limit
        };
        match &filter.document_ids {
            Some(document_ids) => {
                for id in document_ids {
                    if let Some(document) = self.by_document.get(*id)
                        && !add(document)
                    {
                        return None;
                    }
                }
            }
            None => {
                if filter.metadata.is_empty() && filter.groups.is_none() {
                    return None;
                }
                // Groups alone pass every open chunk: too many to score one by one.
                if filter.metadata.is_empty() && self.open_chunks > limit {
                    return None;
                }
                for document in self.by_document.values() {
                    if !add(document) {
                        return None;
                    }
                }
            }
        }
        Some(ids)
    }
}

/// A [`SearchFilter`] prepared for many membership checks.
pub(crate) struct CompiledFilter<'a> {
    document_ids: Option<HashSet<&'a str>>,
    metadata: &'a Metadata,
    groups: Option<&'a [String]>,
}

impl<'a> CompiledFilter<'a> {
    pub fn new(filter: &'a SearchFilter) -> CompiledFilter<'a> {
        CompiledFilter {
            document_ids: filter
                .document_ids
                .as_ref()
                .map(|ids| ids.iter().map(String::as_str).collect()),
            metadata: &filter.metadata,
            groups: filter.groups.as_deref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.document_ids.is_none() && self.metadata.is_empty() && self.groups.is_none()
    }

    /// Only the caller's groups of `filter`: which documents the caller may read at all.
    pub fn groups_of(filter: &'a SearchFilter) -> CompiledFilter<'a> {
        static NO_METADATA: Metadata = Metadata::new();
        CompiledFilter {
            document_ids: None,
            metadata: &NO_METADATA,
            groups: filter.groups.as_deref(),
        }
    }

    /// The filter for the documents of `live`: without its groups when no document there is
    /// restricted (they would hide nothing, and cost a check per candidate).
    pub fn for_documents_of(mut self, live: &LiveDocuments) -> CompiledFilter<'a> {
        if !live.has_restricted() {
            self.groups = None;
        }
        self
    }

    pub fn matches(&self, document: &LiveDocument) -> bool {
        if let Some(ids) = &self.document_ids
            && !ids.contains(document.document_id.as_str())
        {
            return false;
        }
        self.metadata
            .iter()
            .all(|(key, value)| document.metadata.get(key) == Some(value))
            && document.may_read(self.groups)
    }
}
