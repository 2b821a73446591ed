//! The agent's view of the knowledge it answers from: the few reads its tools make, behind
//! one trait. The node implements it over its shards, in the caller's scope
//! ([`crate::scope::ScopedCorpus`]); the agent's unit tests
//! implement it over a handful of chunks in memory, without booting a node.

use futures::future::BoxFuture;
use sift_storage::chunk::ChunkView;
use sift_storage::meta::{DocumentRecord, KbRecord};

use crate::error::{Result, SiftError};
use crate::node::DocumentPage;
use crate::node::communities::CommunityList;
use crate::node::graph::{EntityDetail, EntityList, GraphPath};
use crate::retrieval::SearchResponse;
use crate::retrieval::query::SearchQuery;

/// What an agent run reads. Every method takes KB ids or names as the API does; a missing
/// KB or document is a `not_found` error.
pub trait Corpus: Send + Sync {
    /// A KB by id or name.
    fn find_kb(&self, kb: &str) -> Result<KbRecord>;

    /// A document of `kb` by id or external id.
    fn get_document(&self, kb: &str, document: &str) -> Result<DocumentRecord>;

    /// Up to `limit` documents of `kb` in id order, after the id `after`, and the `after` of
    /// the next page (`None` on the last; a page may be short and still have one).
    fn list_documents(&self, kb: &str, after: Option<&str>, limit: usize) -> Result<DocumentPage>;

    /// Every chunk of a document, by position.
    fn document_chunks<'a>(
        &'a self,
        kb: &'a str,
        document: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ChunkView>>>;

    /// One search of `kb`, with the KB's retrieval settings under the query's overrides.
    fn search<'a>(
        &'a self,
        kb: &'a str,
        query: SearchQuery,
    ) -> BoxFuture<'a, Result<SearchResponse>>;

    /// Embeds `texts` with the embedding model of `kb` (attribution compares an answer's
    /// sentences with the evidence by meaning). `None` when no model is at hand: attribution
    /// is then lexical only.
    fn embed<'a>(
        &'a self,
        kb: &'a str,
        texts: Vec<String>,
    ) -> BoxFuture<'a, Option<Vec<Vec<f32>>>> {
        let _ = (kb, texts);
        Box::pin(async { None })
    }

    /// Entities of `kb`'s graph whose name starts with `q`.
    fn graph_entities<'a>(&'a self, kb: &'a str, q: &'a str) -> BoxFuture<'a, Result<EntityList>> {
        let _ = (kb, q);
        Box::pin(async { Err(no_graph()) })
    }

    /// One entity of `kb`'s graph (its id or name), its neighbours and mentioning chunks.
    fn graph_entity<'a>(
        &'a self,
        kb: &'a str,
        entity: &'a str,
    ) -> BoxFuture<'a, Result<EntityDetail>> {
        let _ = (kb, entity);
        Box::pin(async { Err(no_graph()) })
    }

    /// The shortest chain of chunks joining two entities of `kb`'s graph.
    fn graph_path<'a>(
        &'a self,
        kb: &'a str,
        from: &'a str,
        to: &'a str,
    ) -> BoxFuture<'a, Result<GraphPath>> {
        let _ = (kb, from, to);
        Box::pin(async { Err(no_graph()) })
    }

    /// The largest communities of `kb`'s graph, summarised when the node has a chat model.
    fn graph_communities<'a>(&'a self, kb: &'a str) -> BoxFuture<'a, Result<CommunityList>> {
        let _ = kb;
        Box::pin(async { Err(no_graph()) })
    }
}

fn no_graph() -> SiftError {
    SiftError::invalid("graph_unavailable", "this corpus has no graph")
}
