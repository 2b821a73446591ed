//! Reading a BEIR-layout collection and cutting a deterministic slice of it.
//!
//! Layout: `corpus.jsonl` (`{"_id","title","text"}`), `queries.jsonl` (`{"_id","text"}`, maybe
//! `"metadata"`) and `qrels/test.tsv` (header `query-id corpus-id score`, tab separated, graded
//! scores; `qrels.tsv` beside the JSONL files, as the test fixtures have it, is read when there
//! is no `qrels/` folder). Gold answers, where a collection has them, are read from a query's
//! `metadata.answer` (a string, HotpotQA) or `metadata.answers` (strings, CMRC 2018).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Deserializer};

/// Graded relevance of the judged documents of one query: corpus id -> score.
pub type Judgements = HashMap<String, f64>;

#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub id: String,
    pub text: String,
    /// Gold answers (aliases), from `metadata.answer` / `metadata.answers`; empty when the
    /// collection has none.
    pub answers: Vec<String>,
}

/// How much of a collection to take; `None` means all of it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SliceLimits {
    pub max_queries: Option<usize>,
    pub max_docs: Option<usize>,
}

/// A collection, or a slice of one, ready to ingest and evaluate.
#[derive(Debug)]
pub struct Dataset {
    pub dir: PathBuf,
    /// Selected documents, in corpus file order.
    pub documents: Vec<Document>,
    /// Selected queries, in file order; each has at least one judgement with score > 0.
    pub queries: Vec<Query>,
    /// Judgements of the selected queries.
    pub qrels: HashMap<String, Judgements>,
    /// Judged documents of the selected queries that the corpus does not contain.
    pub missing_judged_documents: usize,
    /// Queries in `queries.jsonl` without any positive judgement (skipped).
    pub unjudged_queries: usize,
}

impl Dataset {
    /// Loads `dir` and takes a deterministic slice:
    /// - queries: the first `max_queries` queries of `queries.jsonl` (file order) that have
    ///   at least one judgement with score > 0;
    /// - documents: every judged document of those queries (whatever its score), then other
    ///   corpus documents in file order until there are `max_docs` in all. Judged documents
    ///   are never dropped, so a slice holds more than `max_docs` when they alone exceed it.
    ///
    /// Documents are returned in corpus file order.
    pub fn load(dir: &Path, limits: SliceLimits) -> Result<Dataset> {
        let nested = dir.join("qrels").join("test.tsv");
        let flat = dir.join("qrels.tsv");
        let all_qrels = read_qrels(if !nested.exists() && flat.exists() {
            &flat
        } else {
            &nested
        })?;

        let mut queries = Vec::new();
        let mut unjudged_queries = 0;
        for_each_json_line(&dir.join("queries.jsonl"), |line: QueryLine| {
            let judged = all_qrels
                .get(&line.id)
                .is_some_and(|judgements| judgements.values().any(|&score| score > 0.0));
            if !judged {
                unjudged_queries += 1;
            } else if limits.max_queries.is_none_or(|max| queries.len() < max) {
                queries.push(Query {
                    answers: line.metadata.gold_answers(),
                    id: line.id,
                    text: line.text,
                });
            }
            Ok(())
        })?;

        let qrels: HashMap<String, Judgements> = queries
            .iter()
            .filter_map(|query| Some((query.id.clone(), all_qrels.get(&query.id)?.clone())))
            .collect();
        let judged: HashSet<&str> = qrels
            .values()
            .flat_map(|judgements| judgements.keys().map(String::as_str))
            .collect();

        // One pass, memory bounded by judged + max_docs: keep every judged document, and
        // other documents up to max_docs (their final budget is known only at the end).
        let mut kept_judged: Vec<(usize, Document)> = Vec::new();
        let mut kept_other: Vec<(usize, Document)> = Vec::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut position = 0;
        for_each_json_line(&dir.join("corpus.jsonl"), |line: CorpusLine| {
            if !seen.insert(line.id.clone()) {
                return Ok(()); // a repeated _id: the first one wins
            }
            let document = Document {
                id: line.id,
                title: line.title,
                text: line.text,
            };
            if judged.contains(document.id.as_str()) {
                kept_judged.push((position, document));
            } else if limits.max_docs.is_none_or(|max| kept_other.len() < max) {
                kept_other.push((position, document));
            }
            position += 1;
            Ok(())
        })?;

        let missing_judged_documents = judged.len() - kept_judged.len();
        if let Some(max_docs) = limits.max_docs {
            kept_other.truncate(max_docs.saturating_sub(kept_judged.len()));
        }
        let mut documents = kept_judged;
        documents.append(&mut kept_other);
        documents.sort_unstable_by_key(|(position, _)| *position);

        Ok(Dataset {
            dir: dir.to_path_buf(),
            documents: documents
                .into_iter()
                .map(|(_, document)| document)
                .collect(),
            queries,
            qrels,
            missing_judged_documents,
            unjudged_queries,
        })
    }

    /// The collection's folder name, e.g. `scifact`.
    pub fn name(&self) -> String {
        self.dir
            .canonicalize()
            .unwrap_or_else(|_| self.dir.clone())
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "dataset".to_owned())
    }
}

#[derive(Deserialize)]
struct QueryLine {
    #[serde(rename = "_id", deserialize_with = "string_or_number")]
    id: String,
    text: String,
    #[serde(default)]
    metadata: QueryMetadata,
}

/// The parts of a query's `metadata` read here; anything else is ignored.
#[derive(Default, Deserialize)]
struct QueryMetadata {
    #[serde(default)]
    answer: Option<serde_json::Value>,
    #[serde(default)]
    answers: Option<serde_json::Value>,
}

impl QueryMetadata {
    /// `answer` and `answers`, as strings (a list may hold strings or `{"text": ...}`), blank
    /// ones and repeats left out.
    fn gold_answers(&self) -> Vec<String> {
        fn collect(value: &serde_json::Value, out: &mut Vec<String>) {
            match value {
                serde_json::Value::String(text) => {
                    let text = text.trim();
                    if !text.is_empty() && !out.iter().any(|known| known == text) {
                        out.push(text.to_owned());
                    }
                }
                serde_json::Value::Array(items) => items.iter().for_each(|item| collect(item, out)),
                serde_json::Value::Object(map) => {
                    if let Some(text) = map.get("text") {
                        collect(text, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        for value in [&self.answer, &self.answers].into_iter().flatten() {
            collect(value, &mut out);
        }
        out
    }
}

#[derive(Deserialize)]
struct CorpusLine {
    #[serde(rename = "_id", deserialize_with = "string_or_number")]
    id: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    text: String,
}

/// Some BEIR exports write numeric ids as JSON numbers.
fn string_or_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Number(serde_json::Number),
    }
    Ok(match Id::deserialize(deserializer)? {
        Id::Text(text) => text,
        Id::Number(number) => number.to_string(),
    })
}

fn open(path: &Path) -> Result<BufReader<File>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(BufReader::new(file))
}

fn for_each_json_line<T: serde::de::DeserializeOwned>(
    path: &Path,
    mut visit: impl FnMut(T) -> Result<()>,
) -> Result<()> {
    for (index, line) in open(path)?.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: invalid JSON line", path.display(), index + 1))?;
        visit(value)?;
    }
    Ok(())
}

/// Reads `query-id corpus-id score` rows (tab separated, or whitespace); a header is skipped.
fn read_qrels(path: &Path) -> Result<HashMap<String, Judgements>> {
    let mut qrels: HashMap<String, Judgements> = HashMap::new();
    for (index, line) in open(path)?.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        let fields: Vec<&str> = if line.contains('\t') {
            line.split('\t').map(str::trim).collect()
        } else {
            line.split_whitespace().collect()
        };
        if fields.iter().all(|field| field.is_empty()) {
            continue;
        }
        if index == 0 && fields.first() == Some(&"query-id") {
            continue;
        }
        let [query_id, corpus_id, score] = fields[..] else {
            bail!(
                "{}:{}: expected `query-id corpus-id score`, got {line:?}",
                path.display(),
                index + 1
            );
        };
        let score: f64 = score.parse().with_context(|| {
            format!("{}:{}: invalid score {score:?}", path.display(), index + 1)
        })?;
        qrels
            .entry(query_id.to_owned())
            .or_default()
            .insert(corpus_id.to_owned(), score);
    }
    Ok(qrels)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// Six documents, five queries: q2 has no judgement, q4 only a score-0 judgement,
    /// q1 a graded judgement (d4 = 2, d2 = 1), q3 judges d6 and a document missing from the corpus.
    fn tiny_beir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let corpus = [
            r#"{"_id": "d1", "title": "One", "text": "first"}"#,
            r#"{"_id": "d2", "title": "Two", "text": "second"}"#,
            r#"{"_id": "d3", "title": "", "text": "third"}"#,
            r#"{"_id": "d4", "title": "Four", "text": "fourth"}"#,
            r#"{"_id": 5, "text": "fifth, numeric id, no title"}"#,
            r#"{"_id": "d6", "title": "Six", "text": "sixth"}"#,
            "",
        ];
        fs::write(dir.path().join("corpus.jsonl"), corpus.join("\n")).unwrap();
        let queries = [
            r#"{"_id": "q1", "text": "query one", "metadata": {"answer": "one", "answers": ["one", " uno ", {"text": "eins"}]}}"#,
            r#"{"_id": "q2", "text": "query two"}"#,
            r#"{"_id": "q3", "text": "query three"}"#,
            r#"{"_id": "q4", "text": "query four"}"#,
            r#"{"_id": "q5", "text": "query five"}"#,
        ];
        fs::write(dir.path().join("queries.jsonl"), queries.join("\n")).unwrap();
        fs::create_dir(dir.path().join("qrels")).unwrap();
        let qrels = "query-id\tcorpus-id\tscore\n\
                     q1\td4\t2\n\
                     q1\td2\t1\n\
                     q3\td6\t1\n\
                     q3\tgone\t1\n\
                     q4\td1\t0\n\
                     q5\td1\t1\n";
        fs::write(dir.path().join("qrels").join("test.tsv"), qrels).unwrap();
        dir
    }

    fn ids(dataset: &Dataset) -> (Vec<&str>, Vec<&str>) {
        (
            dataset.queries.iter().map(|q| q.id.as_str()).collect(),
            dataset.documents.iter().map(|d| d.id.as_str()).collect(),
        )
    }

    #[test]
    fn without_limits_everything_judged_is_kept() {
        let dir = tiny_beir();
        let dataset = Dataset::load(dir.path(), SliceLimits::default()).unwrap();
        let (queries, documents) = ids(&dataset);
        assert_eq!(queries, ["q1", "q3", "q5"]);
        assert_eq!(documents, ["d1", "d2", "d3", "d4", "5", "d6"]);
        assert_eq!(dataset.unjudged_queries, 2);
        assert_eq!(dataset.missing_judged_documents, 1);
        assert_eq!(dataset.qrels["q1"]["d4"], 2.0);
        assert_eq!(dataset.qrels["q1"]["d2"], 1.0);
        assert!(!dataset.qrels.contains_key("q4"));
        assert_eq!(dataset.documents[4].title, "");
        assert_eq!(dataset.queries[0].text, "query one");
        assert_eq!(dataset.queries[0].answers, ["one", "uno", "eins"]);
        assert!(dataset.queries[1].answers.is_empty());
    }

    #[test]
    fn a_flat_qrels_file_is_read_when_there_is_no_qrels_folder() {
        let dir = tiny_beir();
        fs::rename(
            dir.path().join("qrels").join("test.tsv"),
            dir.path().join("qrels.tsv"),
        )
        .unwrap();
        fs::remove_dir(dir.path().join("qrels")).unwrap();
        let dataset = Dataset::load(dir.path(), SliceLimits::default()).unwrap();
        assert_eq!(ids(&dataset).0, ["q1", "q3", "q5"]);
    }

    #[test]
    fn slice_takes_first_judged_queries_then_their_documents_then_file_order() {
        let dir = tiny_beir();
        let limits = SliceLimits {
            max_queries: Some(2),
            max_docs: Some(4),
        };
        let dataset = Dataset::load(dir.path(), limits).unwrap();
        let (queries, documents) = ids(&dataset);
        // q2 (unjudged) is skipped, so the first two judged queries are q1 and q3.
        assert_eq!(queries, ["q1", "q3"]);
        // Judged: d4, d2, d6 (and "gone", missing); one more slot goes to d1, first in file order.
        assert_eq!(documents, ["d1", "d2", "d4", "d6"]);
        assert_eq!(dataset.missing_judged_documents, 1);
        assert_eq!(dataset.qrels.len(), 2);
    }

    #[test]
    fn judged_documents_are_kept_even_beyond_max_docs() {
        let dir = tiny_beir();
        let limits = SliceLimits {
            max_queries: Some(2),
            max_docs: Some(2),
        };
        let dataset = Dataset::load(dir.path(), limits).unwrap();
        let (_, documents) = ids(&dataset);
        assert_eq!(documents, ["d2", "d4", "d6"]);
    }

    #[test]
    fn max_docs_alone_fills_in_file_order_after_judged_documents() {
        let dir = tiny_beir();
        let limits = SliceLimits {
            max_queries: None,
            max_docs: Some(5),
        };
        let dataset = Dataset::load(dir.path(), limits).unwrap();
        let (queries, documents) = ids(&dataset);
        assert_eq!(queries, ["q1", "q3", "q5"]);
        // Judged: d1 (q5), d2, d4, d6; then d3 is the first unjudged document.
        assert_eq!(documents, ["d1", "d2", "d3", "d4", "d6"]);
    }

    #[test]
    fn slicing_is_deterministic() {
        let dir = tiny_beir();
        let limits = SliceLimits {
            max_queries: Some(1),
            max_docs: Some(3),
        };
        let first = Dataset::load(dir.path(), limits).unwrap();
        let second = Dataset::load(dir.path(), limits).unwrap();
        assert_eq!(first.documents, second.documents);
        assert_eq!(first.queries, second.queries);
        assert_eq!(ids(&first).1, ["d1", "d2", "d4"]);
    }

    #[test]
    fn malformed_qrels_line_is_reported_with_its_position() {
        let dir = tiny_beir();
        fs::write(
            dir.path().join("qrels").join("test.tsv"),
            "query-id\tcorpus-id\tscore\nq1\td1\n",
        )
        .unwrap();
        let error = Dataset::load(dir.path(), SliceLimits::default()).unwrap_err();
        assert!(format!("{error:#}").contains("test.tsv:2"), "{error:#}");
    }

    #[test]
    fn name_is_the_folder_name() {
        let dir = tiny_beir();
        let dataset = Dataset::load(dir.path(), SliceLimits::default()).unwrap();
        let expected = dir.path().file_name().unwrap().to_string_lossy();
        assert_eq!(dataset.name(), expected);
    }
}
