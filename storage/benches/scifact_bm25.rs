//! BM25 nDCG@10 of one shard on SciFact (test queries), with the title given as the document
//! title (the shard indexes it into the text field) and, for comparison, prefixed to the chunk
//! text by hand. `SIFT_SCIFACT_DIR` (default `../shared/data/scifact` beside the workspace) holds `corpus.jsonl`,
//! `queries.jsonl` and `qrels/test.tsv`.
//!
//! `cargo bench -p sift-storage --bench scifact_bm25`
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it returns at once.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use sift_storage::chunk::{
    ChunkRecord, DocumentEntry, DocumentWrite, Metadata, ParentRecord, SearchFilter,
};
use sift_storage::shard::{ShardConfig, ShardIndex};

/// The dense index is not searched here; every chunk gets the same small unit vector.
const DIMENSION: usize = 4;

fn read_jsonl(root: &Path, name: &str) -> Vec<serde_json::Value> {
    let path = root.join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn text_field<'a>(record: &'a serde_json::Value, field: &str) -> &'a str {
    record[field].as_str().unwrap_or_default()
}

/// Relevant document ids per query id (grade above 0).
fn read_qrels(root: &Path) -> HashMap<String, HashSet<String>> {
    let path = root.join("qrels/test.tsv");
    let mut qrels: HashMap<String, HashSet<String>> = HashMap::new();
    for line in std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
        .lines()
        .skip(1)
    {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() >= 3 && fields[2] != "0" {
            qrels
                .entry(fields[0].to_owned())
                .or_default()
                .insert(fields[1].to_owned());
        }
    }
    qrels
}

fn document(id: &str, title: String, text: String) -> DocumentWrite {
    let mut vector = vec![0.0; DIMENSION];
    vector[0] = 1.0;
    DocumentWrite {
        entry: DocumentEntry {
            document_id: id.to_owned(),
            external_id: None,
            title,
            metadata: Metadata::new(),
        },
        parents: vec![ParentRecord {
            position: 0,
            text: String::new(),
            span: (0, text.len() as u32),
            pages: None,
        }],
        chunks: vec![ChunkRecord {
            position: 0,
            parent_position: 0,
            span: (0, text.len() as u32),
            pages: None,
            text,
            heading_path: Vec::new(),
            vector,
        }],
    }
}

fn main() {
    if !std::env::args().any(|argument| argument == "--bench") {
        return;
    }
    // cargo runs a bench in its package's folder: the default is found from the workspace.
    let root = std::env::var("SIFT_SCIFACT_DIR").map_or_else(
        |_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/scifact"),
        PathBuf::from,
    );
    let corpus = read_jsonl(&root, "corpus.jsonl");
    let queries: HashMap<String, String> = read_jsonl(&root, "queries.jsonl")
        .iter()
        .map(|query| {
            (
                text_field(query, "_id").to_owned(),
                text_field(query, "text").to_owned(),
            )
        })
        .collect();
    let qrels = read_qrels(&root);
    let no_filter = SearchFilter::default();
    for title_in_text in [false, true] {
        let dir = tempfile::TempDir::new().expect("a temporary directory");
        let shard = ShardIndex::open(dir.path(), ShardConfig::new(DIMENSION)).expect("opening");
        let documents: Vec<DocumentWrite> = corpus
            .iter()
            .map(|record| {
                let title = text_field(record, "title");
                let text = text_field(record, "text");
                let (title, text) = if title_in_text {
                    (String::new(), format!("{title}\n{text}"))
                } else {
                    (title.to_owned(), text.to_owned())
                };
                document(text_field(record, "_id"), title, text)
            })
            .collect();
        let started = Instant::now();
        for batch in documents.chunks(500) {
            shard.write_documents(batch.to_vec()).expect("writing");
        }
        let indexing = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut total = 0.0;
        for (query_id, relevant) in &qrels {
            let Some(query) = queries.get(query_id) else {
                continue;
            };
            let hits = shard.search_bm25(query, 10, &no_filter).expect("searching");
            let dcg: f64 = hits
                .iter()
                .enumerate()
                .filter(|(_, hit)| relevant.contains(&hit.chunk.document_id))
                .map(|(rank, _)| 1.0 / (rank as f64 + 2.0).log2())
                .sum();
            let ideal: f64 = (0..relevant.len().min(10))
                .map(|rank| 1.0 / (rank as f64 + 2.0).log2())
                .sum();
            total += dcg / ideal;
        }
        let searching = started.elapsed().as_secs_f64();
        println!(
            "scifact bm25 nDCG@10 = {:.4} (title {}; {} queries in {:.3} ms/query; {} documents indexed in {indexing:.1} s)",
            total / qrels.len() as f64,
            if title_in_text {
                "prefixed to the chunk text"
            } else {
                "as the document title"
            },
            qrels.len(),
            searching * 1000.0 / qrels.len() as f64,
            corpus.len()
        );
    }
}
