//! A [`Corpus`] over a few documents in memory, for the agent's unit tests: one chunk per
//! document, searched by exact cosine similarity of the embedded model's vectors. It answers
//! as the node does where the agent looks (ids, external ids, `not_found` errors, id-ordered
//! listing, the dense channel's score on every hit) without shards, storage or actors.

use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;
use sift_models::embedding::Embedder;
use sift_storage::chunk::{ChunkView, chunk_id};
use sift_storage::meta::{DocSource, DocStatus, DocumentRecord, KbRecord, KbSettings};

use crate::agent::Corpus;
use crate::error::{Result, SiftError};
use crate::node::DocumentPage;
use crate::retrieval::query::SearchQuery;
use crate::retrieval::{Channel, ChannelHitInfo, SearchHit, SearchResponse};

pub struct MemoryCorpus {
    embedder: Embedder,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    kbs: Vec<KbRecord>,
    /// In id order within each KB (ids are numbered in insertion order).
    documents: Vec<Stored>,
    next_id: u32,
}

struct Stored {
    record: DocumentRecord,
    chunk: ChunkView,
    vector: Vec<f32>,
}

impl MemoryCorpus {
    pub fn new(embedder: Embedder) -> Self {
        MemoryCorpus {
            embedder,
            state: Mutex::new(State::default()),
        }
    }

    /// Adds an empty KB and returns its id.
    pub fn add_kb(&self, name: &str) -> String {
        let mut state = self.state.lock().unwrap();
        state.next_id += 1;
        let id = format!("kb-{:04}", state.next_id);
        state.kbs.push(KbRecord {
            id: id.clone(),
            name: name.into(),
            settings: KbSettings::new(1, 1, self.embedder.model_name(), 384),
            created_at_ms: 0,
            updated_at_ms: 0,
            placement: Vec::new(),
        });
        id
    }

    /// Adds a ready document of one chunk, `title` doubling as its external id; returns its id.
    pub async fn add_document(&self, kb: &str, title: &str, text: &str) -> String {
        let vector = self
            .embedder
            .embed(vec![text.to_string()])
            .await
            .unwrap()
            .remove(0);
        let mut state = self.state.lock().unwrap();
        let kb_id = find_kb(&state, kb).unwrap().id;
        state.next_id += 1;
        let id = format!("doc-{:04}", state.next_id);
        let record = DocumentRecord {
            id: id.clone(),
            kb_id,
            external_id: Some(title.into()),
            title: title.into(),
            source: DocSource::Text {
                format: "text".into(),
            },
            content_hash: String::new(),
            size_bytes: text.len() as u64,
            shard: 0,
            status: DocStatus::Ready,
            error: None,
            chunk_count: 1,
            metadata: Default::default(),
            created_at_ms: 0,
            updated_at_ms: 0,
            pages_needing_ocr: 0,
        };
        let chunk = ChunkView {
            chunk_id: chunk_id(&id, 0),
            document_id: id.clone(),
            external_id: Some(title.into()),
            title: title.into(),
            position: 0,
            text: text.into(),
            parent_text: None,
            heading_path: Vec::new(),
            span: (0, text.chars().count() as u32),
            pages: None,
            metadata: Default::default(),
        };
        state.documents.push(Stored {
            record,
            chunk,
            vector,
        });
        id
    }

    fn stored<'a>(state: &'a State, kb: &str, document: &str) -> Result<&'a Stored> {
        let kb = find_kb(state, kb)?;
        state
            .documents
            .iter()
            .find(|stored| {
                stored.record.kb_id == kb.id
                    && (stored.record.id == document
                        || stored.record.external_id.as_deref() == Some(document))
            })
            .ok_or_else(|| SiftError::document_not_found(document))
    }
}

fn find_kb(state: &State, kb: &str) -> Result<KbRecord> {
    state
        .kbs
        .iter()
        .find(|record| record.id == kb || record.name == kb)
        .cloned()
        .ok_or_else(|| SiftError::kb_not_found(kb))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::EPSILON)
}

impl Corpus for MemoryCorpus {
    fn find_kb(&self, kb: &str) -> Result<KbRecord> {
        find_kb(&self.state.lock().unwrap(), kb)
    }

    fn get_document(&self, kb: &str, document: &str) -> Result<DocumentRecord> {
        let state = self.state.lock().unwrap();
        Ok(Self::stored(&state, kb, document)?.record.clone())
    }

    fn list_documents(&self, kb: &str, after: Option<&str>, limit: usize) -> Result<DocumentPage> {
        let state = self.state.lock().unwrap();
        let kb = find_kb(&state, kb)?;
        let documents: Vec<DocumentRecord> = state
            .documents
            .iter()
            .filter(|stored| stored.record.kb_id == kb.id)
            .filter(|stored| after.is_none_or(|after| stored.record.id.as_str() > after))
            .take(limit)
            .map(|stored| stored.record.clone())
            .collect();
        let next_after = (documents.len() == limit)
            .then(|| documents.last().map(|d| d.id.clone()))
            .flatten();
        Ok(DocumentPage {
            documents,
            next_after,
        })
    }

    fn document_chunks<'a>(
        &'a self,
        kb: &'a str,
        document: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ChunkView>>> {
        let chunks = {
            let state = self.state.lock().unwrap();
            Self::stored(&state, kb, document).map(|stored| vec![stored.chunk.clone()])
        };
        Box::pin(async move { chunks })
    }

    fn search<'a>(
        &'a self,
        kb: &'a str,
        query: SearchQuery,
    ) -> BoxFuture<'a, Result<SearchResponse>> {
        Box::pin(async move {
            let kb = self.find_kb(kb)?;
            let vector = self
                .embedder
                .embed(vec![query.query.clone()])
                .await
                .map_err(|error| SiftError::Internal(error.to_string()))?
                .remove(0);
            let state = self.state.lock().unwrap();
            let mut scored: Vec<(f32, &Stored)> = state
                .documents
                .iter()
                .filter(|stored| stored.record.kb_id == kb.id)
                .map(|stored| (cosine(&vector, &stored.vector), stored))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0));
            scored.truncate(query.top_k.unwrap_or(10));
            let hits = scored
                .into_iter()
                .enumerate()
                .map(|(position, (score, stored))| SearchHit {
                    chunk: stored.chunk.clone(),
                    score: f64::from(score),
                    fused_score: f64::from(score),
                    rerank_score: None,
                    channels: HashMap::from([(
                        Channel::Dense,
                        ChannelHitInfo {
                            rank: position + 1,
                            score,
                            contribution: f64::from(score),
                        },
                    )]),
                    also_in: Vec::new(),
                    neighbours: Vec::new(),
                    citation: None,
                    explain: None,
                    path: None,
                    trace: Vec::new(),
                    mmr: None,
                    features: None,
                    fused_rank: position + 1,
                    rerank_rank: None,
                    queries: vec![0],
                })
                .collect();
            Ok(SearchResponse {
                hits,
                failed_shards: Vec::new(),
                timings: Default::default(),
                rerank: None,
                queries: Vec::new(),
                context: None,
                notes: Vec::new(),
            })
        })
    }

    fn embed<'a>(
        &'a self,
        _kb: &'a str,
        texts: Vec<String>,
    ) -> BoxFuture<'a, Option<Vec<Vec<f32>>>> {
        Box::pin(async move { self.embedder.embed(texts).await.ok() })
    }
}
