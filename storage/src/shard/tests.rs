use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tempfile::TempDir;

use super::{ShardConfig, ShardIndex};
use crate::chunk::{
    ChunkRecord, DocumentCommit, DocumentEntry, DocumentSlice, DocumentWrite, Metadata,
    ParentRecord, ScoredChunk, SearchFilter, ShardWrite,
};
use crate::error::StorageError;

const DIM: usize = 16;

/// SplitMix64: deterministic test data without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn unit_vector(&mut self, dimension: usize) -> Vec<f32> {
        normalise((0..dimension).map(|_| self.next_f32()).collect())
    }
}

fn normalise(vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    vector.into_iter().map(|v| v / norm).collect()
}

fn vector_for(seed: u64) -> Vec<f32> {
    Rng(seed).unit_vector(DIM)
}

fn metadata(pairs: &[(&str, &str)]) -> Metadata {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// A document with one parent and one chunk per text; chunk `i` gets `vector_for(seed + i)`.
fn document(id: &str, title: &str, texts: &[&str], seed: u64, meta: Metadata) -> DocumentWrite {
    DocumentWrite {
        entry: DocumentEntry {
            document_id: id.to_owned(),
            external_id: Some(format!("ext-{id}")),
            title: title.to_owned(),
            metadata: meta,
        },
        parents: vec![ParentRecord {
            position: 0,
            text: format!("parent of {id}: {}", texts.join(" ")),
            span: (0, 100),
            pages: None,
        }],
        chunks: texts
            .iter()
            .enumerate()
            .map(|(position, text)| ChunkRecord {
                position: position as u32,
                parent_position: 0,
                text: (*text).to_owned(),
                heading_path: vec!["Intro".to_owned()],
                span: (position as u32 * 10, position as u32 * 10 + 10),
                pages: None,
                vector: vector_for(seed + position as u64),
            })
            .collect(),
    }
}

fn open(dir: &TempDir) -> ShardIndex {
    ShardIndex::open(dir.path(), ShardConfig::new(DIM)).expect("open shard")
}

fn no_filter() -> SearchFilter {
    SearchFilter::default()
}

fn ids(hits: &[ScoredChunk]) -> Vec<String> {
    hits.iter().map(|hit| hit.chunk.chunk_id.clone()).collect()
}

fn documents_of(hits: &[ScoredChunk]) -> HashSet<String> {
    hits.iter()
        .map(|hit| hit.chunk.document_id.clone())
        .collect()
}

fn sample_documents() -> Vec<DocumentWrite> {
    vec![
        document(
            "apollo",
            "Moon landing",
            &[
                "Apollo eleven landed on the moon",
                "Astronauts walked on the lunar surface",
            ],
            100,
            metadata(&[("lang", "en"), ("topic", "space")]),
        ),
        document(
            "kitchen",
            "Cooking pasta",
            &[
                "Boil the pasta in salted water",
                "Drain and add tomato sauce",
            ],
            200,
            metadata(&[("lang", "en"), ("topic", "food")]),
        ),
        document(
            "garden",
            "Growing tomatoes",
            &["Tomato plants need sun and water"],
            300,
            metadata(&[("lang", "en"), ("topic", "garden")]),
        ),
    ]
}

#[test]
fn shard_index_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ShardIndex>();
}

#[test]
fn write_then_search_both_channels() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();

    let dense = shard
        .search_dense(&vector_for(201), 3, &no_filter())
        .unwrap();
    assert_eq!(dense[0].chunk.chunk_id, "kitchen#1");
    assert!(
        (dense[0].score - 1.0).abs() < 1e-4,
        "score {}",
        dense[0].score
    );
    assert!(dense.windows(2).all(|pair| pair[0].score >= pair[1].score));
    assert_eq!(dense.len(), 3);

    let text = shard
        .search_bm25("lunar astronauts", 5, &no_filter())
        .unwrap();
    assert_eq!(ids(&text), vec!["apollo#1"]);
    let view = &text[0].chunk;
    assert_eq!(view.document_id, "apollo");
    assert_eq!(view.external_id.as_deref(), Some("ext-apollo"));
    assert_eq!(view.title, "Moon landing");
    assert_eq!(view.position, 1);
    assert_eq!(view.heading_path, vec!["Intro".to_owned()]);
    assert_eq!(view.span, (10, 20));
    assert!(
        view.parent_text
            .as_deref()
            .unwrap()
            .starts_with("parent of apollo")
    );
    assert_eq!(
        view.metadata.get("topic").map(String::as_str),
        Some("space")
    );

    // The title is searchable too, and BM25 ranks the chunk with more matches first.
    let tomato = shard.search_bm25("tomato", 5, &no_filter()).unwrap();
    assert_eq!(
        documents_of(&tomato),
        HashSet::from(["kitchen".to_owned(), "garden".to_owned()])
    );
    assert_eq!(tomato[0].chunk.document_id, "garden");

    let chunks = shard.get_chunks("kitchen").unwrap();
    assert_eq!(
        ids(&chunks
            .iter()
            .map(|c| ScoredChunk {
                chunk: c.clone(),
                score: 0.0
            })
            .collect::<Vec<_>>()),
        vec!["kitchen#0", "kitchen#1"]
    );
    assert!(matches!(
        shard.get_chunks("nope"),
        Err(StorageError::NotFound(_))
    ));
    assert!(shard.contains_document("garden").unwrap());
    assert!(!shard.contains_document("nope").unwrap());

    let stats = shard.stats();
    assert_eq!((stats.documents, stats.chunks, stats.tombstones), (3, 5, 0));
    assert_eq!(stats.indexed_vectors, 5);
    assert!(stats.disk_bytes > 0);
}

#[test]
fn empty_and_stop_word_queries_match_nothing() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    assert!(shard.search_bm25("", 5, &no_filter()).unwrap().is_empty());
    assert!(
        shard
            .search_bm25("the and of , !", 5, &no_filter())
            .unwrap()
            .is_empty()
    );
    assert!(
        shard
            .search_bm25("pasta", 0, &no_filter())
            .unwrap()
            .is_empty()
    );
    assert!(
        shard
            .search_dense(&vector_for(1), 0, &no_filter())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn replacing_a_document_removes_its_old_chunks() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    shard
        .write_documents(vec![document(
            "kitchen",
            "Baking bread",
            &["Knead the dough", "Bake the loaf", "Let it cool"],
            900,
            metadata(&[("lang", "en"), ("topic", "baking")]),
        )])
        .unwrap();

    assert!(
        shard
            .search_bm25("pasta sauce", 10, &no_filter())
            .unwrap()
            .is_empty()
    );
    let bread = shard.search_bm25("dough", 10, &no_filter()).unwrap();
    assert_eq!(ids(&bread), vec!["kitchen#0"]);
    assert_eq!(bread[0].chunk.title, "Baking bread");

    // The old vectors are still in the graph but never returned.
    let dense = shard
        .search_dense(&vector_for(200), 10, &no_filter())
        .unwrap();
    assert_eq!(dense.len(), 6);
    assert!(
        dense
            .iter()
            .all(|hit| hit.chunk.document_id != "kitchen" || hit.chunk.title == "Baking bread")
    );
    let food = SearchFilter {
        document_ids: None,
        metadata: metadata(&[("topic", "food")]),
        ..SearchFilter::default()
    };
    assert!(
        shard
            .search_dense(&vector_for(200), 10, &food)
            .unwrap()
            .is_empty()
    );
    assert!(shard.search_bm25("pasta", 10, &food).unwrap().is_empty());

    let chunks = shard.get_chunks("kitchen").unwrap();
    assert_eq!(chunks.len(), 3);
    let stats = shard.stats();
    assert_eq!(
        (stats.documents, stats.chunks, stats.indexed_vectors),
        (3, 6, 8)
    );

    // Same id twice in one batch: the last one wins.
    shard
        .write_documents(vec![
            document("twice", "First", &["first version"], 10, Metadata::new()),
            document("twice", "Second", &["second version"], 20, Metadata::new()),
        ])
        .unwrap();
    let twice = shard.get_chunks("twice").unwrap();
    assert_eq!(twice.len(), 1);
    assert_eq!(twice[0].title, "Second");
    assert!(
        shard
            .search_bm25("first", 5, &no_filter())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn deleted_document_is_never_returned() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    assert!(shard.delete_document("apollo").unwrap());
    assert!(!shard.delete_document("apollo").unwrap());
    assert!(!shard.delete_document("never-existed").unwrap());
    assert!(!shard.contains_document("apollo").unwrap());

    // k larger than what is left: everything left, nothing deleted.
    let dense = shard
        .search_dense(&vector_for(100), 50, &no_filter())
        .unwrap();
    assert_eq!(dense.len(), 3);
    assert!(!documents_of(&dense).contains("apollo"));
    assert!(
        shard
            .search_bm25("moon lunar apollo", 50, &no_filter())
            .unwrap()
            .is_empty()
    );
    let water = shard.search_bm25("water moon", 50, &no_filter()).unwrap();
    assert_eq!(
        documents_of(&water),
        HashSet::from(["kitchen".to_owned(), "garden".to_owned()])
    );
    // Asking for the deleted document explicitly finds nothing either.
    let only_apollo = SearchFilter {
        document_ids: Some(vec!["apollo".to_owned()]),
        ..SearchFilter::default()
    };
    assert!(
        shard
            .search_dense(&vector_for(100), 5, &only_apollo)
            .unwrap()
            .is_empty()
    );
    assert!(
        shard
            .search_bm25("moon", 5, &only_apollo)
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        shard.get_chunks("apollo"),
        Err(StorageError::NotFound(_))
    ));

    let stats = shard.stats();
    assert_eq!((stats.documents, stats.chunks, stats.tombstones), (2, 3, 1));
}

/// 600 documents of 4 chunks: a metadata filter passing half of them (1200 chunks) goes
/// through the HNSW filter; a document-id filter is scored exactly. Both fill k.
#[test]
fn filters_apply_before_ranking_and_fill_k() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    let mut batch = Vec::new();
    for index in 0..600u64 {
        let lang = if index % 2 == 0 { "en" } else { "fr" };
        let id = format!("doc{index}");
        batch.push(document(
            &id,
            "Shared title",
            &[
                "common words here",
                "more common words",
                "common again",
                "last common chunk",
            ],
            index * 10,
            metadata(&[("lang", lang), ("parity", &(index % 3).to_string())]),
        ));
        if batch.len() == 100 {
            shard.write_documents(std::mem::take(&mut batch)).unwrap();
        }
    }
    // A query vector close to an English document's chunk.
    let query = vector_for(0);
    let french = SearchFilter {
        document_ids: None,
        metadata: metadata(&[("lang", "fr")]),
        ..SearchFilter::default()
    };
    let hits = shard.search_dense(&query, 50, &french).unwrap();
    assert_eq!(hits.len(), 50);
    assert!(hits.iter().all(|hit| hit.chunk.metadata["lang"] == "fr"));
    assert!(hits.windows(2).all(|pair| pair[0].score >= pair[1].score));

    let narrow = SearchFilter {
        document_ids: None,
        metadata: metadata(&[("lang", "fr"), ("parity", "1")]),
        ..SearchFilter::default()
    };
    let hits = shard.search_dense(&query, 30, &narrow).unwrap();
    assert_eq!(hits.len(), 30);
    assert!(
        hits.iter()
            .all(|hit| hit.chunk.metadata["lang"] == "fr" && hit.chunk.metadata["parity"] == "1")
    );

    let two = SearchFilter {
        document_ids: Some(vec![
            "doc7".to_owned(),
            "doc300".to_owned(),
            "missing".to_owned(),
        ]),
        ..SearchFilter::default()
    };
    let hits = shard.search_dense(&query, 10, &two).unwrap();
    assert_eq!(hits.len(), 8);
    assert_eq!(
        documents_of(&hits),
        HashSet::from(["doc7".to_owned(), "doc300".to_owned()])
    );
    let hits = shard.search_bm25("common", 10, &two).unwrap();
    assert_eq!(hits.len(), 8);
    assert_eq!(
        documents_of(&hits),
        HashSet::from(["doc7".to_owned(), "doc300".to_owned()])
    );

    let hits = shard.search_bm25("common words", 40, &french).unwrap();
    assert_eq!(hits.len(), 40);
    assert!(hits.iter().all(|hit| hit.chunk.metadata["lang"] == "fr"));
    let both = SearchFilter {
        document_ids: Some(vec!["doc7".to_owned(), "doc8".to_owned()]),
        metadata: metadata(&[("lang", "fr")]),
        ..SearchFilter::default()
    };
    assert_eq!(
        documents_of(&shard.search_bm25("common", 10, &both).unwrap()),
        HashSet::from(["doc7".to_owned()])
    );
    assert_eq!(
        documents_of(&shard.search_dense(&query, 10, &both).unwrap()),
        HashSet::from(["doc7".to_owned()])
    );

    let none = SearchFilter {
        document_ids: Some(Vec::new()),
        ..SearchFilter::default()
    };
    assert!(shard.search_dense(&query, 10, &none).unwrap().is_empty());
    assert!(shard.search_bm25("common", 10, &none).unwrap().is_empty());
    let unknown = SearchFilter {
        document_ids: None,
        metadata: metadata(&[("lang", "de")]),
        ..SearchFilter::default()
    };
    assert!(shard.search_dense(&query, 10, &unknown).unwrap().is_empty());
    assert!(
        shard
            .search_bm25("common", 10, &unknown)
            .unwrap()
            .is_empty()
    );

    // Deleting most French documents: the filter still fills k from the rest.
    for index in (1..500u64).step_by(2) {
        assert!(shard.delete_document(&format!("doc{index}")).unwrap());
    }
    let hits = shard.search_dense(&query, 50, &french).unwrap();
    assert_eq!(hits.len(), 50);
    assert!(hits.iter().all(|hit| {
        let number: u64 = hit.chunk.document_id[3..].parse().unwrap();
        number >= 500 && hit.chunk.metadata["lang"] == "fr"
    }));
    let hits = shard.search_bm25("common", 400, &french).unwrap();
    assert_eq!(hits.len(), 200);
}

#[test]
fn reopen_returns_the_same_results() {
    let dir = TempDir::new().unwrap();
    let (dense_before, text_before) = {
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        shard.delete_document("garden").unwrap();
        (
            shard
                .search_dense(&vector_for(100), 10, &no_filter())
                .unwrap(),
            shard
                .search_bm25("pasta moon water", 10, &no_filter())
                .unwrap(),
        )
    };
    let shard = open(&dir);
    let dense_after = shard
        .search_dense(&vector_for(100), 10, &no_filter())
        .unwrap();
    let text_after = shard
        .search_bm25("pasta moon water", 10, &no_filter())
        .unwrap();
    assert_eq!(ids(&dense_before), ids(&dense_after));
    for (before, after) in dense_before.iter().zip(&dense_after) {
        assert!((before.score - after.score).abs() < 1e-5);
        assert_eq!(before.chunk, after.chunk);
    }
    assert_eq!(text_before, text_after);
    // New writes continue with fresh internal ids.
    shard
        .write_documents(vec![document(
            "late",
            "Late",
            &["arrived after reopen"],
            5,
            Metadata::new(),
        )])
        .unwrap();
    assert_eq!(
        ids(&shard.search_bm25("arrived", 5, &no_filter()).unwrap()),
        vec!["late#0"]
    );
    assert_eq!(shard.stats().chunks, 5);
}

#[test]
fn crash_after_the_chunk_store_step_is_replayed_on_open() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        // A replacement and a new document reach sled, then the process "dies".
        shard
            .write_chunk_store_only(vec![
                document(
                    "kitchen",
                    "Soup",
                    &["Simmer the lentil soup"],
                    700,
                    Metadata::new(),
                ),
                document(
                    "orphan",
                    "Orphan",
                    &["Zeppelins crossed the ocean"],
                    800,
                    Metadata::new(),
                ),
            ])
            .unwrap();
        assert!(
            shard
                .search_bm25("zeppelins", 5, &no_filter())
                .unwrap()
                .is_empty()
        );
    }
    let shard = open(&dir);
    assert_eq!(
        ids(&shard.search_bm25("zeppelins", 5, &no_filter()).unwrap()),
        vec!["orphan#0"]
    );
    assert_eq!(
        ids(&shard.search_bm25("lentil", 5, &no_filter()).unwrap()),
        vec!["kitchen#0"]
    );
    assert!(
        shard
            .search_bm25("pasta", 5, &no_filter())
            .unwrap()
            .is_empty()
    );
    assert!(
        shard.raw_bm25_ids("pasta").unwrap().is_empty(),
        "old version left in tantivy"
    );
    let dense = shard
        .search_dense(&vector_for(800), 1, &no_filter())
        .unwrap();
    assert_eq!(ids(&dense), vec!["orphan#0"]);
    assert_eq!(shard.stats().chunks, 5);
}

#[test]
fn crash_in_the_middle_of_a_delete_is_completed_on_open() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        assert!(shard.delete_chunk_store_only("apollo").unwrap());
    }
    let shard = open(&dir);
    assert!(
        shard.raw_bm25_ids("moon").unwrap().is_empty(),
        "delete not replayed into tantivy"
    );
    assert!(
        shard
            .search_bm25("moon", 5, &no_filter())
            .unwrap()
            .is_empty()
    );
    assert!(
        !documents_of(
            &shard
                .search_dense(&vector_for(100), 10, &no_filter())
                .unwrap()
        )
        .contains("apollo")
    );
    assert_eq!(shard.stats().tombstones, 1);
}

#[test]
fn tombstones_survive_reopen_and_purge() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        assert!(shard.delete_document("apollo").unwrap());
    }
    {
        let shard = open(&dir);
        assert!(!shard.contains_document("apollo").unwrap());
        assert!(
            shard
                .search_bm25("moon", 5, &no_filter())
                .unwrap()
                .is_empty()
        );
        assert!(
            !documents_of(
                &shard
                    .search_dense(&vector_for(100), 10, &no_filter())
                    .unwrap()
            )
            .contains("apollo")
        );
        let stats = shard.stats();
        assert_eq!(
            (
                stats.documents,
                stats.chunks,
                stats.tombstones,
                stats.indexed_vectors
            ),
            (2, 3, 1, 3)
        );
        assert_eq!(shard.purge_deleted().unwrap(), 2);
        assert_eq!(shard.stats().tombstones, 0);
        assert_eq!(shard.purge_deleted().unwrap(), 0);
    }
    let shard = open(&dir);
    assert!(!shard.contains_document("apollo").unwrap());
    assert!(
        shard
            .search_bm25("moon", 5, &no_filter())
            .unwrap()
            .is_empty()
    );
    assert_eq!(shard.stats().indexed_vectors, 3);
}

#[test]
fn rewriting_a_deleted_document_brings_a_new_version() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        shard.delete_document("apollo").unwrap();
        shard
            .write_documents(vec![document(
                "apollo",
                "Mars",
                &["Rovers on the red planet"],
                400,
                Metadata::new(),
            )])
            .unwrap();
        assert_eq!(shard.stats().tombstones, 0);
        assert_eq!(
            ids(&shard.search_bm25("rovers", 5, &no_filter()).unwrap()),
            vec!["apollo#0"]
        );
        assert!(
            shard
                .search_bm25("moon", 5, &no_filter())
                .unwrap()
                .is_empty()
        );
        assert_eq!(shard.purge_deleted().unwrap(), 0);
    }
    let shard = open(&dir);
    assert_eq!(shard.get_chunks("apollo").unwrap().len(), 1);
    assert_eq!(
        ids(&shard
            .search_dense(&vector_for(400), 1, &no_filter())
            .unwrap()),
        vec!["apollo#0"]
    );
}

#[test]
fn purge_rebuilds_the_graph_without_dead_points() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    let documents = (0..200u64)
        .map(|index| {
            document(
                &format!("d{index}"),
                "T",
                &["alpha", "beta"],
                index * 7,
                Metadata::new(),
            )
        })
        .collect();
    shard.write_documents(documents).unwrap();
    for index in 0..100u64 {
        shard.delete_document(&format!("d{index}")).unwrap();
    }
    assert_eq!(shard.stats().indexed_vectors, 400);
    assert_eq!(shard.purge_deleted().unwrap(), 200);
    let stats = shard.stats();
    assert_eq!(
        (stats.indexed_vectors, stats.chunks, stats.tombstones),
        (200, 200, 0)
    );
    let hits = shard
        .search_dense(&vector_for(150 * 7), 300, &no_filter())
        .unwrap();
    assert_eq!(hits.len(), 200);
    assert_eq!(hits[0].chunk.chunk_id, "d150#0");
    assert!(shard.search_bm25("alpha", 300, &no_filter()).unwrap().len() == 100);
}

#[test]
fn chinese_text_is_found_by_a_chinese_query_sharing_a_word() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard
        .write_documents(vec![
            document(
                "zh1",
                "自然语言处理",
                &["我们在北京大学学习自然语言处理和机器学习"],
                1,
                Metadata::new(),
            ),
            document(
                "zh2",
                "天气",
                &["今天上海的天气很好，适合散步"],
                2,
                Metadata::new(),
            ),
            document(
                "en",
                "English",
                &["Natural language processing in English"],
                3,
                Metadata::new(),
            ),
        ])
        .unwrap();
    let tokens = shard.analyze("我们在北京大学学习");
    assert!(tokens.contains(&"北京".to_owned()), "{tokens:?}");
    assert!(!tokens.iter().any(|token| token.trim().is_empty()));
    let hits = shard
        .search_bm25("机器学习的方法", 5, &no_filter())
        .unwrap();
    assert_eq!(hits[0].chunk.document_id, "zh1");
    let hits = shard.search_bm25("上海天气", 5, &no_filter()).unwrap();
    assert_eq!(documents_of(&hits), HashSet::from(["zh2".to_owned()]));
    let hits = shard.search_bm25("北京", 5, &no_filter()).unwrap();
    assert_eq!(documents_of(&hits), HashSet::from(["zh1".to_owned()]));
}

#[test]
fn english_stemming_matches_word_forms() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard
        .write_documents(vec![
            document(
                "runner",
                "Sport",
                &["The dog runs in the park every morning."],
                1,
                Metadata::new(),
            ),
            document(
                "other",
                "Other",
                &["A cat sleeps on the sofa."],
                2,
                Metadata::new(),
            ),
        ])
        .unwrap();
    assert_eq!(
        ids(&shard.search_bm25("running", 5, &no_filter()).unwrap()),
        vec!["runner#0"]
    );
    assert_eq!(
        ids(&shard.search_bm25("Sleeping cats", 5, &no_filter()).unwrap()),
        vec!["other#0"]
    );
    assert_eq!(
        shard.analyze("The Running, of the DOGS!"),
        vec!["run".to_owned(), "dog".to_owned()]
    );
}

#[test]
fn wrong_dimensions_and_bad_vectors_are_rejected() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        let mut bad = document("bad", "Bad", &["text"], 1, Metadata::new());
        bad.chunks[0].vector = vec![0.5; DIM + 1];
        assert!(matches!(
            shard.write_documents(vec![bad.clone()]),
            Err(StorageError::DimensionMismatch { expected: DIM, actual })
                if actual == DIM + 1
        ));
        bad.chunks[0].vector = vec![0.0; DIM];
        assert!(matches!(
            shard.write_documents(vec![bad.clone()]),
            Err(StorageError::Invalid(_))
        ));
        bad.chunks[0].vector = vec![f32::NAN; DIM];
        assert!(matches!(
            shard.write_documents(vec![bad]),
            Err(StorageError::Invalid(_))
        ));
        assert!(matches!(
            shard.search_dense(&[1.0, 0.0], 5, &no_filter()),
            Err(StorageError::DimensionMismatch { .. })
        ));
        assert_eq!(shard.stats().documents, 0);

        // Vectors that are not unit length are normalised.
        let mut loud = document("loud", "Loud", &["text"], 1, Metadata::new());
        loud.chunks[0]
            .vector
            .iter_mut()
            .for_each(|value| *value *= 3.0);
        shard.write_documents(vec![loud]).unwrap();
        let hits = shard.search_dense(&vector_for(1), 1, &no_filter()).unwrap();
        assert!((hits[0].score - 1.0).abs() < 1e-4);
    }
    // The dimension is fixed at creation.
    assert!(matches!(
        ShardIndex::open(dir.path(), ShardConfig::new(DIM * 2)),
        Err(StorageError::DimensionMismatch { expected: DIM, .. })
    ));
}

#[test]
fn invalid_configs_are_errors_not_exits() {
    let dir = TempDir::new().unwrap();
    let config = ShardConfig {
        hnsw_m: 300,
        ..ShardConfig::new(DIM)
    };
    assert!(matches!(
        ShardIndex::open(dir.path(), config),
        Err(StorageError::Invalid(_))
    ));
    let config = ShardConfig {
        writer_memory_bytes: 1_000_000,
        ..ShardConfig::new(DIM)
    };
    assert!(matches!(
        ShardIndex::open(dir.path(), config),
        Err(StorageError::Invalid(_))
    ));
    assert!(matches!(
        ShardIndex::open(dir.path(), ShardConfig::new(0)),
        Err(StorageError::Invalid(_))
    ));
}

#[test]
fn searches_run_while_writing() {
    let dir = TempDir::new().unwrap();
    let shard = Arc::new(open(&dir));
    shard.write_documents(sample_documents()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3u64)
        .map(|reader| {
            let shard = Arc::clone(&shard);
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut searches = 0;
                while !done.load(Ordering::Relaxed) {
                    let dense = shard
                        .search_dense(&vector_for(reader), 10, &no_filter())
                        .unwrap();
                    assert!(!dense.is_empty());
                    let text = shard.search_bm25("water words", 10, &no_filter()).unwrap();
                    assert!(!text.is_empty());
                    // The permanent documents are always there.
                    let hits = shard.search_bm25("tomato", 10, &no_filter()).unwrap();
                    assert_eq!(documents_of(&hits).len(), 2);
                    searches += 1;
                }
                searches
            })
        })
        .collect();
    let mut expected: HashSet<String> = ["apollo", "kitchen", "garden"].map(String::from).into();
    for round in 0..20u64 {
        let batch = (0..10u64)
            .map(|index| {
                let id = format!("r{}", (round * 10 + index) % 50);
                expected.insert(id.clone());
                document(
                    &id,
                    "Round",
                    &["some words", "more words"],
                    round * 100 + index,
                    Metadata::new(),
                )
            })
            .collect();
        shard.write_documents(batch).unwrap();
        let deleted = format!("r{}", round * 3 % 50);
        assert_eq!(
            shard.delete_document(&deleted).unwrap(),
            expected.remove(&deleted)
        );
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }
    assert_eq!(shard.stats().documents, expected.len() as u64);
}

fn single_chunk_documents(range: std::ops::Range<u64>) -> Vec<DocumentWrite> {
    range
        .map(|index| {
            document(
                &format!("s{index}"),
                "Snapshot",
                &[&format!("chunk number {index}")],
                index * 3,
                Metadata::new(),
            )
        })
        .collect()
}

fn snapshot_description(dir: &TempDir) -> Option<serde_json::Value> {
    let json = std::fs::read(dir.path().join("hnsw/current/snapshot.json")).ok()?;
    serde_json::from_slice(&json).ok()
}

#[test]
fn hnsw_snapshot_is_loaded_and_caught_up_on_reopen() {
    let dir = TempDir::new().unwrap();
    let expected = {
        let shard = open(&dir);
        for start in (0..2500).step_by(500) {
            shard
                .write_documents(single_chunk_documents(start..start + 500))
                .unwrap();
        }
        // Saved at 2000 points; 500 more since.
        assert_eq!(snapshot_description(&dir).unwrap()["points"], 2000);
        for index in 0..5 {
            shard.delete_document(&format!("s{index}")).unwrap();
        }
        shard
            .write_documents(single_chunk_documents(2500..2510))
            .unwrap();
        (0..2510)
            .step_by(97)
            .map(|index| {
                shard
                    .search_dense(&vector_for(index * 3), 5, &no_filter())
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    let shard = open(&dir);
    // 2000 from the snapshot (5 of them dead) + 510 caught up.
    let stats = shard.stats();
    assert_eq!((stats.indexed_vectors, stats.chunks), (2510, 2505));
    let after: Vec<_> = (0..2510)
        .step_by(97)
        .map(|index| {
            shard
                .search_dense(&vector_for(index * 3), 5, &no_filter())
                .unwrap()
        })
        .collect();
    for (before, after) in expected.iter().zip(&after) {
        assert_eq!(before[0].chunk.chunk_id, after[0].chunk.chunk_id);
    }
    assert_eq!(
        ids(&shard
            .search_dense(&vector_for(2509 * 3), 1, &no_filter())
            .unwrap()),
        vec!["s2509#0"]
    );
    assert!(
        shard.search_dense(&vector_for(0), 1, &no_filter()).unwrap()[0]
            .chunk
            .document_id
            != "s0"
    );
    // Purging rebuilds only past the dead share; the graph stays as it is here.
    assert_eq!(shard.purge_deleted().unwrap(), 5);
    assert_eq!(shard.stats().indexed_vectors, 2510);
}

#[test]
fn damaged_hnsw_snapshot_falls_back_to_a_rebuild() {
    let dir = TempDir::new().unwrap();
    {
        let shard = open(&dir);
        shard
            .write_documents(single_chunk_documents(0..2000))
            .unwrap();
        shard.delete_document("s5").unwrap();
    }
    let description = snapshot_description(&dir).unwrap();
    let data = dir.path().join(format!(
        "hnsw/current/{}.hnsw.data",
        description["basename"].as_str().unwrap()
    ));
    let mut bytes = std::fs::read(&data).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(&data, bytes).unwrap();
    let shard = open(&dir);
    // Rebuilt from the live chunks: the snapshot would have brought the dead point along.
    assert_eq!(shard.stats().indexed_vectors, 1999);
    assert_eq!(
        ids(&shard
            .search_dense(&vector_for(1234 * 3), 1, &no_filter())
            .unwrap()),
        vec!["s1234#0"]
    );
}

/// Per-component noise around a cluster centre: points of one cluster have cosine 0.57.
const NOISE: f32 = 0.08;

/// Clustered unit vectors: `clusters` random centres, points = centre + noise.
fn clustered_vectors(
    rng: &mut Rng,
    count: usize,
    clusters: usize,
    dimension: usize,
) -> Vec<Vec<f32>> {
    let centres: Vec<Vec<f32>> = (0..clusters).map(|_| rng.unit_vector(dimension)).collect();
    (0..count)
        .map(|index| {
            let centre = &centres[index % clusters];
            normalise(
                centre
                    .iter()
                    .map(|value| value + NOISE * rng.next_f32())
                    .collect(),
            )
        })
        .collect()
}

fn dot(left: &[f32], right: &[f32]) -> f32 {
    left.iter().zip(right).map(|(a, b)| a * b).sum()
}

#[test]
fn hnsw_recall_at_10_against_brute_force() {
    const DIMENSION: usize = 384;
    let dir = TempDir::new().unwrap();
    let shard = ShardIndex::open(dir.path(), ShardConfig::new(DIMENSION)).unwrap();
    let mut rng = Rng(42);
    let data = clustered_vectors(&mut rng, 2000, 40, DIMENSION);
    let queries = clustered_vectors(&mut rng, 50, 40, DIMENSION);
    let documents: Vec<DocumentWrite> = data
        .iter()
        .enumerate()
        .map(|(index, vector)| DocumentWrite {
            entry: DocumentEntry {
                document_id: format!("v{index}"),
                external_id: None,
                title: String::new(),
                metadata: Metadata::new(),
            },
            parents: Vec::new(),
            chunks: vec![ChunkRecord {
                position: 0,
                parent_position: 0,
                text: format!("vector {index}"),
                heading_path: Vec::new(),
                span: (0, 0),
                pages: None,
                vector: vector.clone(),
            }],
        })
        .collect();
    // Batches under 64 chunks are inserted serially, and hnsw_rs draws levels from a seeded
    // generator: the graph, and so this test, is deterministic. (Parallel inserts vary:
    // 0.992 to 1.0 over runs.)
    for batch in documents.chunks(50) {
        shard.write_documents(batch.to_vec()).unwrap();
    }
    let mut found = 0;
    let started = Instant::now();
    for query in &queries {
        let mut exact: Vec<(usize, f32)> = data
            .iter()
            .enumerate()
            .map(|(index, vector)| (index, dot(query, vector)))
            .collect();
        exact.sort_by(|left, right| right.1.total_cmp(&left.1));
        let truth: HashSet<String> = exact[..10]
            .iter()
            .map(|(index, _)| format!("v{index}"))
            .collect();
        let exact_hits = shard.search_dense_exact(query, 10, &no_filter()).unwrap();
        let exact_ids: HashSet<String> = exact_hits
            .iter()
            .map(|hit| hit.chunk.document_id.clone())
            .collect();
        assert_eq!(
            exact_ids, truth,
            "search_dense_exact is the brute-force truth"
        );
        let hits = shard.search_dense(query, 10, &no_filter()).unwrap();
        assert_eq!(hits.len(), 10);
        found += hits
            .iter()
            .filter(|hit| truth.contains(&hit.chunk.document_id))
            .count();
    }
    let recall = found as f64 / (queries.len() * 10) as f64;
    println!(
        "hnsw recall@10 = {recall:.4} ({} queries, {:.2} ms/query incl. brute force)",
        queries.len(),
        started.elapsed().as_secs_f64() * 1000.0 / queries.len() as f64
    );
    assert!(recall >= 0.99, "recall@10 {recall}");
}

/// Document-level access inside the shard: a caller whose groups reach 1% of the chunks
/// still gets a full top-10 from both channels, all of them documents it may read, and the
/// dense top-10 matches an exact scan over the permitted chunks; a caller of no group sees
/// the open documents only, and one without a group filter sees everything.
#[test]
fn access_groups_filter_inside_the_shard_and_fill_k() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    let mut batch = Vec::new();
    for index in 0..1000u64 {
        let id = format!("doc{index}");
        // 10 documents (1%) of group finance, the rest of group legal, and 5 open ones.
        let groups = match index {
            _ if index % 100 == 0 => Some("finance,audit"),
            _ if index % 200 == 1 => None,
            _ => Some("legal"),
        };
        let meta = match groups {
            Some(groups) => metadata(&[(crate::chunk::ACCESS_GROUPS_KEY, groups)]),
            None => metadata(&[]),
        };
        batch.push(document(
            &id,
            "Shared title",
            &["common words here", "more common words"],
            index * 10,
            meta,
        ));
        if batch.len() == 200 {
            shard.write_documents(std::mem::take(&mut batch)).unwrap();
        }
    }
    let query = vector_for(5);
    let finance = SearchFilter {
        groups: Some(vec!["finance".to_owned()]),
        ..SearchFilter::default()
    };
    let readable =
        |hit: &ScoredChunk| crate::chunk::may_read(&hit.chunk.metadata, finance.groups.as_deref());
    let dense = shard.search_dense(&query, 10, &finance).unwrap();
    assert_eq!(dense.len(), 10, "a full top-10 from 1% of the chunks");
    assert!(dense.iter().all(readable));
    let exact = shard.search_dense_exact(&query, 10, &finance).unwrap();
    let found: HashSet<String> = ids(&dense).into_iter().collect();
    let truth: HashSet<String> = ids(&exact).into_iter().collect();
    let recall = found.intersection(&truth).count() as f64 / truth.len() as f64;
    assert!(recall >= 0.95, "recall {recall} against the exact scan");
    let bm25 = shard.search_bm25("common words", 10, &finance).unwrap();
    assert_eq!(bm25.len(), 10);
    assert!(bm25.iter().all(readable));
    assert!(
        bm25.iter()
            .any(|hit| !crate::chunk::access_groups(&hit.chunk.metadata).is_empty()),
        "the group's own documents are found, not only the open ones"
    );

    // No group: the 5 open documents (10 chunks) only.
    let nobody = SearchFilter {
        groups: Some(Vec::new()),
        ..SearchFilter::default()
    };
    for hits in [
        shard.search_dense(&query, 50, &nobody).unwrap(),
        shard.search_bm25("common words", 50, &nobody).unwrap(),
    ] {
        assert_eq!(hits.len(), 10);
        assert!(
            hits.iter()
                .all(|hit| crate::chunk::access_groups(&hit.chunk.metadata).is_empty())
        );
    }
    // No group filter: everything.
    assert_eq!(
        shard
            .search_bm25("common words", 50, &no_filter())
            .unwrap()
            .len(),
        50
    );
}

/// The tantivy writer is opened by the first write, closed once idle, and opened again by the
/// next write or delete; nothing is lost either way (`scripts/shard-cost.sh` counts the
/// threads this saves).
#[test]
fn an_idle_shard_closes_its_text_writer_and_a_write_reopens_it() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    assert!(!shard.writer_is_open(), "opening a shard opens no writer");
    let mut documents = sample_documents();
    let garden = documents.pop().unwrap();
    shard.write_documents(documents).unwrap();
    assert!(shard.writer_is_open());
    assert!(
        !shard
            .release_idle_writer(std::time::Duration::from_secs(3600))
            .unwrap()
    );
    assert!(
        shard
            .release_idle_writer(std::time::Duration::ZERO)
            .unwrap()
    );
    assert!(!shard.writer_is_open());
    let moon = shard.search_bm25("moon", 10, &no_filter()).unwrap();
    assert!(
        documents_of(&moon).contains("apollo"),
        "searches need no writer"
    );

    shard.write_documents(vec![garden]).unwrap();
    assert!(shard.writer_is_open());
    assert!(
        shard
            .release_idle_writer(std::time::Duration::ZERO)
            .unwrap()
    );
    assert!(shard.delete_document("apollo").unwrap());
    assert!(shard.writer_is_open());
    assert!(
        shard
            .search_bm25("moon lunar apollo", 50, &no_filter())
            .unwrap()
            .iter()
            .all(|hit| hit.chunk.document_id != "apollo")
    );
    let water = documents_of(&shard.search_bm25("water", 50, &no_filter()).unwrap());
    drop(shard);

    let shard = open(&dir);
    assert_eq!(
        documents_of(&shard.search_bm25("water", 50, &no_filter()).unwrap()),
        water
    );
    assert!(!shard.contains_document("apollo").unwrap());
}

/// A caller's groups hide nothing in a shard without restricted documents (the shard leaves
/// them out of its searches), and hide a restricted document from the moment it is written
/// until it is deleted; replaced by an open version, it is readable again.
#[test]
fn groups_start_hiding_with_the_first_restricted_document() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    let outsider = SearchFilter {
        groups: Some(vec!["sales".to_owned()]),
        ..SearchFilter::default()
    };
    let both = |filter: &SearchFilter| {
        let mut found = documents_of(&shard.search_bm25("water moon sauce", 50, filter).unwrap());
        found.extend(documents_of(
            &shard.search_dense(&vector_for(100), 50, filter).unwrap(),
        ));
        found
    };
    let everything = both(&no_filter());
    assert_eq!(both(&outsider), everything);

    let secret = |groups: Option<&str>| {
        let meta = match groups {
            Some(groups) => metadata(&[(crate::chunk::ACCESS_GROUPS_KEY, groups)]),
            None => metadata(&[]),
        };
        document(
            "secret",
            "Secret water",
            &["water moon secret plans"],
            100,
            meta,
        )
    };
    shard
        .write_documents(vec![secret(Some("finance"))])
        .unwrap();
    assert_eq!(
        both(&outsider),
        everything,
        "the restricted one stays hidden"
    );
    let finance = SearchFilter {
        groups: Some(vec!["finance".to_owned()]),
        ..SearchFilter::default()
    };
    assert!(both(&finance).contains("secret"));
    shard.write_documents(vec![secret(None)]).unwrap();
    assert!(both(&outsider).contains("secret"), "now open");
    shard
        .write_documents(vec![secret(Some("finance"))])
        .unwrap();
    assert!(!both(&outsider).contains("secret"));
    assert!(shard.delete_document("secret").unwrap());
    assert_eq!(both(&outsider), everything);
}

/// Two replicas holding the same live documents answer a BM25 query alike, whatever their
/// history: one wrote and deleted other documents first (deleted chunks stay in tantivy's
/// segments, and its statistics, until a merge), the other was filled by a repair in another
/// order. Many chunks tie on score here, as templated notes do; the cut at k must not depend
/// on where a chunk sits in the segments (found by the chaos soak: nodes, each reading its
/// own replica, answered with different top-10s).
#[test]
fn replicas_with_different_histories_rank_alike() {
    let note = |n: u64| {
        let topic = n % 3;
        document(
            &format!("note-{n:03}"),
            "Chaos note",
            &[&format!(
                "Chaos note {n} is about topic{topic}. Disks fill and topic{topic} notes stay findable."
            )],
            1_000 + n,
            Metadata::new(),
        )
    };
    let live: Vec<u64> = (0..60).collect();
    let history_dir = TempDir::new().unwrap();
    let with_history = open(&history_dir);
    // Written with noise in between that is deleted later, a few documents per batch.
    for batch in live.chunks(7) {
        let mut writes: Vec<DocumentWrite> = batch.iter().map(|&n| note(n)).collect();
        writes.extend(batch.iter().map(|&n| {
            document(
                &format!("noise-{n:03}"),
                "Noise",
                &["topic1 notes and notes and notes, topic2 notes"],
                5_000 + n,
                Metadata::new(),
            )
        }));
        with_history.write_documents(writes).unwrap();
    }
    for &n in &live {
        assert!(
            with_history
                .delete_document(&format!("noise-{n:03}"))
                .unwrap()
        );
    }
    let repaired_dir = TempDir::new().unwrap();
    let repaired = open(&repaired_dir);
    for &n in live.iter().rev() {
        repaired.write_documents(vec![note(n)]).unwrap();
    }

    for query in ["topic1 notes", "topic2 notes", "disks fill"] {
        for k in [1, 5, 10, 25] {
            let answer = |shard: &ShardIndex| -> Vec<(String, f32)> {
                shard
                    .search_bm25(query, k, &no_filter())
                    .unwrap()
                    .into_iter()
                    .map(|hit| (hit.chunk.chunk_id, hit.score))
                    .collect()
            };
            let (left, right) = (answer(&with_history), answer(&repaired));
            assert_eq!(left.len(), k, "{query:?} k={k}");
            assert_eq!(left, right, "{query:?} k={k}");
        }
    }
}

/// `document` cut into slices of `per_slice` chunks, each with the parents its chunks
/// name first, and the commit that ends it.
fn sliced(document: DocumentWrite, per_slice: usize) -> (Vec<DocumentSlice>, DocumentCommit) {
    let DocumentWrite {
        entry,
        parents,
        chunks,
    } = document;
    let commit = DocumentCommit {
        entry: entry.clone(),
        chunk_count: chunks.len() as u32,
        parent_count: parents.len() as u32,
    };
    let mut parents = parents.into_iter().peekable();
    let slices = chunks
        .chunks(per_slice)
        .map(|slice| {
            let last_parent = slice.iter().map(|c| c.parent_position).max().unwrap_or(0);
            let mut slice_parents = Vec::new();
            while let Some(parent) = parents.next_if(|p| p.position <= last_parent) {
                slice_parents.push(parent);
            }
            DocumentSlice {
                document_id: entry.document_id.clone(),
                parents: slice_parents,
                chunks: slice.to_vec(),
            }
        })
        .collect();
    (slices, commit)
}

/// A document of `count` chunks about lighthouses, two parents.
fn long_document(id: &str, count: u32, seed: u64) -> DocumentWrite {
    let texts: Vec<String> = (0..count)
        .map(|i| format!("lighthouse keeper log entry {i} fog signal"))
        .collect();
    let text_refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut document = document(id, "Keeper's log", &text_refs, seed, Metadata::new());
    let half = count / 2;
    document.parents = vec![
        ParentRecord {
            position: 0,
            text: "first half of the log".into(),
            span: (0, 10),
            pages: None,
        },
        ParentRecord {
            position: 1,
            text: "second half of the log".into(),
            span: (10, 20),
            pages: None,
        },
    ];
    for chunk in &mut document.chunks {
        chunk.parent_position = u32::from(chunk.position >= half);
    }
    document
}

#[test]
fn a_document_written_in_slices_is_hidden_until_its_commit() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    let whole = long_document("log", 10, 500);
    let (slices, commit) = sliced(whole.clone(), 4);
    assert_eq!(slices.len(), 3);
    for slice in &slices {
        shard.write(ShardWrite::Slice(slice.clone())).unwrap();
    }
    // Written, but in no channel, listing or export yet.
    assert!(
        shard
            .search_bm25("lighthouse", 20, &no_filter())
            .unwrap()
            .is_empty()
    );
    let dense = shard
        .search_dense(&vector_for(503), 20, &no_filter())
        .unwrap();
    assert!(dense.iter().all(|hit| hit.chunk.document_id != "log"));
    assert!(!shard.contains_document("log").unwrap());
    assert!(shard.export_document("log").unwrap().is_none());
    assert!(!shard.document_ids().unwrap().contains(&"log".to_owned()));
    assert_eq!(shard.stats().documents, 3);

    // A slice written again replaces its positions and keeps their internal ids.
    let before = shard.store.slice_index("log").unwrap();
    let mut again = slices[1].clone();
    again.chunks[0].text = "rewritten entry about a lantern".into();
    shard.write(ShardWrite::Slice(again)).unwrap();
    assert_eq!(
        shard.store.slice_index("log").unwrap().chunks,
        before.chunks
    );

    // A commit that names a chunk no slice wrote is refused and changes nothing.
    let too_many = DocumentCommit {
        chunk_count: 11,
        ..commit.clone()
    };
    let refused = shard.write(ShardWrite::Commit(too_many)).unwrap_err();
    assert!(
        matches!(&refused, StorageError::Invalid(m) if m.contains("10 of its 11 chunks")),
        "{refused}"
    );
    assert!(!shard.contains_document("log").unwrap());

    shard.write(ShardWrite::Commit(commit)).unwrap();
    let hits = shard.search_bm25("lighthouse", 20, &no_filter()).unwrap();
    assert_eq!(hits.len(), 9);
    let lantern = shard.search_bm25("lantern", 5, &no_filter()).unwrap();
    assert_eq!(ids(&lantern), vec!["log#4"]);
    assert_eq!(
        lantern[0].chunk.parent_text.as_deref(),
        Some("first half of the log")
    );
    let dense = shard
        .search_dense(&vector_for(507), 1, &no_filter())
        .unwrap();
    assert_eq!(ids(&dense), vec!["log#7"]);
    assert_eq!(
        dense[0].chunk.parent_text.as_deref(),
        Some("second half of the log")
    );
    let chunks = shard.get_chunks("log").unwrap();
    assert_eq!(
        chunks.iter().map(|c| c.position).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let exported = shard.export_document("log").unwrap().unwrap();
    assert_eq!(exported.parents, whole.parents);
    assert_eq!(exported.chunks.len(), 10);
    assert_eq!(exported.chunks[7].text, whole.chunks[7].text);
    assert!(dot(&exported.chunks[7].vector, &whole.chunks[7].vector) > 0.9999);
    let stats = shard.stats();
    assert_eq!(
        (stats.documents, stats.chunks, stats.indexed_vectors),
        (4, 15, 15)
    );
    assert!(shard.store.slice_index("log").unwrap().chunks.is_empty());

    // As written after a restart, from the store alone.
    drop(shard);
    let shard = open(&dir);
    assert_eq!(
        shard
            .search_bm25("lighthouse", 20, &no_filter())
            .unwrap()
            .len(),
        9
    );
    assert_eq!(
        ids(&shard
            .search_dense(&vector_for(507), 1, &no_filter())
            .unwrap()),
        vec!["log#7"]
    );
    assert_eq!(shard.stats().chunks, 15);
}

#[test]
fn slices_without_a_commit_survive_a_restart_and_a_delete_removes_them() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    let (slices, commit) = sliced(long_document("log", 6, 700), 2);
    for slice in &slices[..2] {
        shard.write(ShardWrite::Slice(slice.clone())).unwrap();
    }
    // The process stops half way: the slices are kept, and out of every index.
    drop(shard);
    let shard = open(&dir);
    assert_eq!(shard.stats().indexed_vectors, 0);
    assert!(
        shard
            .search_bm25("lighthouse", 20, &no_filter())
            .unwrap()
            .is_empty()
    );
    let kept = shard.store.slice_index("log").unwrap();
    assert_eq!(kept.chunks.len(), 4);

    // The document is tried again from its start, and committed.
    for slice in &slices {
        shard.write(ShardWrite::Slice(slice.clone())).unwrap();
    }
    shard.write(ShardWrite::Commit(commit.clone())).unwrap();
    assert_eq!(
        shard
            .search_bm25("lighthouse", 20, &no_filter())
            .unwrap()
            .len(),
        6
    );
    assert_eq!(shard.stats().indexed_vectors, 6);

    // A document given up half way: the delete takes its slices, records included.
    let (slices, _) = sliced(long_document("abandoned", 4, 900), 2);
    shard.write(ShardWrite::Slice(slices[0].clone())).unwrap();
    let written = shard.store.slice_index("abandoned").unwrap();
    assert!(!shard.delete_document("abandoned").unwrap());
    assert!(
        shard
            .store
            .slice_index("abandoned")
            .unwrap()
            .chunks
            .is_empty()
    );
    for (_, id) in written.chunks {
        assert!(shard.store.chunk(id).unwrap().is_none());
        assert!(shard.store.vector(id).unwrap().is_none());
    }
    assert!(shard.store.parent("abandoned", 0).unwrap().is_none());
    // A commit after that finds nothing to commit.
    let refused = shard
        .write(ShardWrite::Commit(DocumentCommit {
            entry: commit.entry.clone(),
            chunk_count: 6,
            parent_count: 2,
        }))
        .unwrap_err();
    assert!(matches!(refused, StorageError::Invalid(_)));
    assert_eq!(
        shard.get_chunks("log").unwrap().len(),
        6,
        "the live version stays"
    );
}

#[test]
fn a_commit_replaces_an_earlier_version_and_clears_a_tombstone() {
    let dir = TempDir::new().unwrap();
    let shard = open(&dir);
    shard.write_documents(sample_documents()).unwrap();
    // "kitchen" again, written in slices: its pasta chunks go.
    let mut log = long_document("kitchen", 5, 1200);
    log.entry.metadata = metadata(&[("topic", "sea")]);
    let (slices, commit) = sliced(log, 2);
    for slice in slices {
        shard.write(ShardWrite::Slice(slice)).unwrap();
    }
    shard.write(ShardWrite::Commit(commit)).unwrap();
    assert!(
        shard
            .search_bm25("pasta", 10, &no_filter())
            .unwrap()
            .is_empty()
    );
    let sea = SearchFilter {
        metadata: metadata(&[("topic", "sea")]),
        ..SearchFilter::default()
    };
    assert_eq!(shard.search_bm25("lighthouse", 10, &sea).unwrap().len(), 5);
    assert_eq!(shard.get_chunks("kitchen").unwrap().len(), 5);

    // Deleted, then written in slices again: a new version, the tombstone gone.
    assert!(shard.delete_document("garden").unwrap());
    assert_eq!(shard.stats().tombstones, 1);
    let (slices, commit) = sliced(long_document("garden", 3, 1300), 3);
    shard.write(ShardWrite::Slice(slices[0].clone())).unwrap();
    shard.write(ShardWrite::Commit(commit)).unwrap();
    let stats = shard.stats();
    assert_eq!(
        (stats.documents, stats.chunks, stats.tombstones),
        (3, 10, 0)
    );
    assert_eq!(
        shard.store.parent("garden", 1).unwrap().unwrap().text,
        "second half of the log"
    );
    assert!(
        shard
            .search_bm25("tomato", 10, &no_filter())
            .unwrap()
            .is_empty()
    );
}

mod graph {
    //! The graph partition: pending marks, entities in and out with their documents.
    use super::*;
    use crate::shard::{ChunkGraph, GraphDocumentState, GraphEvent, GraphMention, GraphPut};

    fn mention(id: u64, name: &str) -> GraphMention {
        GraphMention {
            id,
            canonical: name.to_lowercase(),
            name: name.to_owned(),
            kind: "name".to_owned(),
            count: 1,
        }
    }

    /// Extracts "entities" the way a test can check: every capitalised word, id = its length
    /// and first letter.
    fn extract_all(shard: &ShardIndex) -> usize {
        let pending = shard.graph_pending(100, |_, _| false).unwrap();
        let count = pending.len();
        for document in pending {
            let chunks = document
                .chunks
                .iter()
                .map(|chunk| ChunkGraph {
                    position: chunk.position,
                    mentions: chunk
                        .text
                        .split_whitespace()
                        .filter(|word| word.chars().next().is_some_and(char::is_uppercase))
                        .map(|word| mention(entity(word), word))
                        .collect(),
                    events: Vec::new(),
                })
                .collect();
            let put = GraphPut {
                chunks,
                ..GraphPut::default()
            };
            assert!(
                shard
                    .graph_put(&document.document_id, document.sequence, put)
                    .unwrap()
            );
        }
        count
    }

    fn entity(word: &str) -> u64 {
        word.bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
    }

    fn chunks_of(shard: &ShardIndex, word: &str) -> Vec<String> {
        let mut ids: Vec<String> = shard
            .graph_neighbourhood(&[entity(word)], 100, &no_filter())
            .unwrap()
            .into_iter()
            .flat_map(|n| n.chunks.into_iter().map(|c| c.chunk_id))
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn writes_are_pending_until_extracted_and_deletes_take_their_entities() {
        let dir = TempDir::new().unwrap();
        let shard = open(&dir);
        shard
            .write_documents(vec![
                document(
                    "a",
                    "A",
                    &["Alice met Bob", "Bob went to Paris"],
                    1,
                    metadata(&[]),
                ),
                document("b", "B", &["Carol lives in Paris"], 3, metadata(&[])),
            ])
            .unwrap();
        assert_eq!(shard.graph_stats().pending, 2);
        assert_eq!(
            shard.graph_document_state("a").unwrap(),
            Some(GraphDocumentState::Pending)
        );
        assert_eq!(extract_all(&shard), 2);
        assert_eq!(
            shard.graph_document_state("a").unwrap(),
            Some(GraphDocumentState::Ready)
        );
        let stats = shard.graph_stats();
        assert_eq!((stats.pending, stats.entities), (0, 4));
        assert_eq!(chunks_of(&shard, "Paris"), ["a#1", "b#0"]);
        assert_eq!(
            shard.graph_chunk_counts(&[entity("Paris"), 42]),
            [(entity("Paris"), 2)]
        );
        // The most mentioned first (Bob and Paris, in two chunks each); a skipped kind is left out.
        let mut top: Vec<String> = shard
            .graph_top_entities(2, &[])
            .unwrap()
            .into_iter()
            .map(|e| format!("{}:{}", e.name, e.chunks))
            .collect();
        top.sort();
        assert_eq!(top, ["Bob:2", "Paris:2"]);
        assert_eq!(shard.graph_top_entities(10, &[]).unwrap().len(), 4);
        assert!(shard.graph_top_entities(10, &["name"]).unwrap().is_empty());
        let neighbourhood = shard
            .graph_neighbourhood(&[entity("Alice")], 10, &no_filter())
            .unwrap();
        assert_eq!(
            neighbourhood[0].chunks[0].entities,
            [(entity("Alice"), 1), (entity("Bob"), 2)]
        );

        // Deleting `a` takes Alice and Bob (no other mention) and one mention of Paris.
        assert!(shard.delete_document("a").unwrap());
        assert_eq!(chunks_of(&shard, "Paris"), ["b#0"]);
        assert!(chunks_of(&shard, "Alice").is_empty());
        let names: Vec<String> = shard
            .graph_entities(&[entity("Alice"), entity("Bob"), entity("Paris")])
            .unwrap()
            .into_iter()
            .map(|e| format!("{}:{}", e.name, e.chunks))
            .collect();
        assert_eq!(names, ["Paris:1"]);
        assert!(
            shard
                .graph_entities_by_prefix("ali", 10)
                .unwrap()
                .is_empty()
        );
        assert_eq!(shard.graph_entities_by_prefix("par", 10).unwrap().len(), 1);
        assert_eq!(shard.graph_stats().entities, 2);

        // All of it survives a reopen; so does the absence of what was deleted.
        drop(shard);
        let shard = open(&dir);
        assert_eq!(shard.graph_stats().entities, 2);
        assert_eq!(shard.graph_stats().pending, 0);
        assert_eq!(chunks_of(&shard, "Paris"), ["b#0"]);
    }

    #[test]
    fn a_replaced_document_drops_its_old_entities_and_a_stale_extraction_is_refused() {
        let dir = TempDir::new().unwrap();
        let shard = open(&dir);
        shard
            .write_documents(vec![document(
                "a",
                "A",
                &["Alice in Rome"],
                1,
                metadata(&[]),
            )])
            .unwrap();
        let old = shard.graph_pending(10, |_, _| false).unwrap().remove(0);
        extract_all(&shard);
        assert_eq!(chunks_of(&shard, "Rome"), ["a#0"]);
        shard
            .write_documents(vec![document(
                "a",
                "A",
                &["Alice in Oslo"],
                1,
                metadata(&[]),
            )])
            .unwrap();
        // The old version's entities are gone at once, before the new one is extracted.
        assert!(chunks_of(&shard, "Rome").is_empty());
        assert!(chunks_of(&shard, "Alice").is_empty());
        // An extraction of the old version arriving late stores nothing.
        assert!(
            !shard
                .graph_put(
                    "a",
                    old.sequence,
                    GraphPut {
                        chunks: vec![ChunkGraph {
                            position: 0,
                            mentions: vec![mention(entity("Rome"), "Rome")],
                            events: Vec::new(),
                        }],
                        ..GraphPut::default()
                    }
                )
                .unwrap()
        );
        assert!(chunks_of(&shard, "Rome").is_empty());
        assert_eq!(extract_all(&shard), 1);
        assert_eq!(chunks_of(&shard, "Oslo"), ["a#0"]);
        // A deleted document's pending mark goes with it.
        shard
            .write_documents(vec![document("b", "B", &["Bob"], 1, metadata(&[]))])
            .unwrap();
        assert_eq!(shard.graph_stats().pending, 1);
        shard.delete_document("b").unwrap();
        assert_eq!(shard.graph_stats().pending, 0);
        assert!(shard.graph_pending(10, |_, _| false).unwrap().is_empty());
    }

    #[test]
    fn events_failures_and_tokens_live_and_die_with_their_version() {
        let dir = TempDir::new().unwrap();
        let shard = open(&dir);
        shard
            .write_documents(vec![
                document("a", "A", &["Ada met Babbage in London"], 1, metadata(&[])),
                document("b", "B", &["Bob"], 2, metadata(&[])),
            ])
            .unwrap();
        // The extractor skips what it names: a document being extracted is not handed out.
        let pending = shard.graph_pending(10, |id, _| id == "a").unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].document_id, "b");
        let a = shard
            .graph_pending(10, |id, _| id == "b")
            .unwrap()
            .remove(0);
        assert_eq!(
            shard.graph_document_state("a").unwrap(),
            Some(GraphDocumentState::Pending)
        );
        let (ada, babbage, london) = (entity("Ada"), entity("Babbage"), entity("London"));
        let met = GraphEvent {
            subject: "Ada".into(),
            predicate: "met".into(),
            object: "Babbage".into(),
            time: String::new(),
            place: "London".into(),
            entities: vec![ada, babbage, london],
        };
        // An event naming an entity the chunk does not list is dropped.
        let stray = GraphEvent {
            entities: vec![ada, entity("Paris")],
            ..met.clone()
        };
        let put = GraphPut {
            chunks: vec![ChunkGraph {
                position: 0,
                mentions: vec![
                    mention(ada, "Ada"),
                    mention(babbage, "Babbage"),
                    mention(london, "London"),
                ],
                events: vec![met.clone(), stray],
            }],
            failure: None,
            tokens: 120,
        };
        assert!(shard.graph_put("a", a.sequence, put).unwrap());
        assert_eq!(
            shard.graph_document_state("a").unwrap(),
            Some(GraphDocumentState::Ready)
        );
        assert_eq!(
            shard.graph_events(babbage, 10, &no_filter()).unwrap(),
            vec![("a#0".to_owned(), met.clone())]
        );
        assert!(
            shard
                .graph_events(entity("Bob"), 10, &no_filter())
                .unwrap()
                .is_empty()
        );
        // A failed extraction says why, and its tokens count too.
        let b = shard.graph_pending(10, |_, _| false).unwrap().remove(0);
        let failed = GraphPut {
            failure: Some("the model answered invalid JSON".into()),
            tokens: 30,
            ..GraphPut::default()
        };
        assert!(shard.graph_put("b", b.sequence, failed).unwrap());
        assert_eq!(
            shard.graph_document_state("b").unwrap(),
            Some(GraphDocumentState::Failed(
                "the model answered invalid JSON".into()
            ))
        );
        assert_eq!(shard.graph_tokens().unwrap(), 150);
        // A new version of b is pending again; its failure is gone.
        shard
            .write_documents(vec![document("b", "B", &["Bob again"], 3, metadata(&[]))])
            .unwrap();
        assert_eq!(
            shard.graph_document_state("b").unwrap(),
            Some(GraphDocumentState::Pending)
        );
        // Deleting a removes its events with its mentions; reopened, all of it holds.
        shard.delete_document("a").unwrap();
        assert!(
            shard
                .graph_events(babbage, 10, &no_filter())
                .unwrap()
                .is_empty()
        );
        assert_eq!(shard.graph_document_state("a").unwrap(), None);
        drop(shard);
        let shard = open(&dir);
        assert_eq!(shard.graph_tokens().unwrap(), 150);
        assert_eq!(
            shard.graph_document_state("b").unwrap(),
            Some(GraphDocumentState::Pending)
        );
        assert!(shard.store.graph().scan_prefix(b"V").next().is_none());
    }

    #[test]
    fn neighbourhoods_respect_the_filter_and_the_cap() {
        let dir = TempDir::new().unwrap();
        let shard = open(&dir);
        let texts: Vec<String> = (0..20).map(|i| format!("Hub item{i}")).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        shard
            .write_documents(vec![
                document("open", "O", &texts, 1, metadata(&[])),
                document(
                    "secret",
                    "S",
                    &["Hub Secret"],
                    50,
                    metadata(&[("sift.groups", "hr")]),
                ),
            ])
            .unwrap();
        extract_all(&shard);
        let capped = shard
            .graph_neighbourhood(&[entity("Hub")], 5, &no_filter())
            .unwrap();
        assert_eq!((capped[0].chunks.len(), capped[0].chunks_total), (5, 21));
        let outsider = SearchFilter {
            groups: Some(vec!["sales".to_owned()]),
            ..SearchFilter::default()
        };
        let seen = shard
            .graph_neighbourhood(&[entity("Hub")], 100, &outsider)
            .unwrap();
        assert_eq!(seen[0].chunks.len(), 20);
        assert!(
            seen[0]
                .chunks
                .iter()
                .all(|c| c.chunk_id.starts_with("open#"))
        );
        let hits = shard
            .graph_chunks(
                &[("secret#0".to_owned(), 1.0), ("open#3".to_owned(), 0.5)],
                &outsider,
            )
            .unwrap();
        assert_eq!(ids(&hits), ["open#3"]);
    }

    #[test]
    fn a_shard_written_before_the_graph_marks_its_documents_pending_once() {
        let dir = TempDir::new().unwrap();
        let shard = open(&dir);
        shard.write_documents(sample_documents()).unwrap();
        extract_all(&shard);
        // As if the graph tree were new: the marker gone, the tree empty.
        shard.store.graph().clear().unwrap();
        shard.store.meta_remove_for_test(b"graph_backfilled");
        drop(shard);
        let shard = open(&dir);
        assert_eq!(shard.graph_stats().pending, sample_documents().len() as u64);
        extract_all(&shard);
        drop(shard);
        let shard = open(&dir);
        assert_eq!(shard.graph_stats().pending, 0);
    }
}
