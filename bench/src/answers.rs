//! `sift-bench answers`: answer quality, measured. Asks every judged question of a dataset that
//! carries gold answers (HotpotQA `metadata.answer`, CMRC 2018 `metadata.answers`) through the
//! node's OpenAI-compatible `POST /v1/chat/completions` (not streamed; the answer, its
//! citations, the grounding verdicts in `sift.grounding` and the usage come back in one body),
//! one question at a time, and scores each answer.
//!
//! Modes (`--mode`, repeatable; `MODE@URL` sends that mode to another node than `--node`).
//! The mode is a property of the node, so each node is started for its mode:
//! - `extractive`: a node with no chat model (no `SIFT_LLM_*`): the agent answers with the best
//!   evidence sentences, cited. A node that reports model tokens is refused.
//! - `scripted`: the bench serves the scripted fake model of `sift-bench chat`
//!   ([`crate::chat`]; the real HTTP server [`sift_models::fake_server`]) on `--llm-listen`, and
//!   the node must use it:
//!   `SIFT_LLM_BASE_URL=http://127.0.0.1:7701/v1 SIFT_LLM_MODEL=fake-model sift serve ...`.
//!   The model searches for the question, then answers `final_answer` quoting the opening words
//!   of the first two chunks it was shown, citing them. A node that never calls it is refused.
//! - `llm`: any OpenAI-compatible model the operator configured on the node; `--llm-url` only
//!   labels the run (the bench does not talk to the model).
//!
//! The dataset's corpus is ingested into `--kb` (default: the dataset folder name) unless the
//! KB already holds it ([`crate::quality::prepare_kb`] with reuse).
//!
//! Scores, per mode (means over the questions asked; a failed request scores zero):
//! - **containment**: the answer contains a gold answer or alias, after SQuAD normalisation
//!   (lower case, punctuation and the articles a/an/the removed, whitespace collapsed),
//!   compared as a contiguous token sequence; citation markers (`[3]`, `[chunk-id]`) are
//!   removed first. Only questions with a gold answer count.
//! - **token F1**: SQuAD token F1 against the best gold answer, same normalisation. CJK
//!   characters are tokens each (for Chinese, character F1).
//! - **cited**: share of answers with at least one citation.
//! - **citation precision**: over all citations (micro), the share whose cited chunk belongs
//!   to a judged supporting passage (qrels, score > 0, by external id) or whose text contains
//!   the gold answer (normalised as above).
//! - **citation recall**: per question, the share of its judged supporting passages that at
//!   least one citation points into; then the mean.
//! - **supported**: over the answers that carry grounding verdicts (model answers; extractive
//!   answers carry none), supported sentences / sentences the attribution judged.
//! - **raw protocol**: answers whose text holds step JSON (`{"thought"`, `"tool"`,
//!   `tool_input`, `"final_answer"`, `"tool_calls"`) or chat-template / tool tokens (`<|...|>`,
//!   `[INST]`, `<<SYS>>`, `<tool_call>`, `<think>`).
//! - **wall time**: request sent to the whole answer read, p50 and p99.
//! - **tokens per answer**: the `usage.completion_tokens` the node reports (every model call
//!   of the run, search steps included); an extractive answer reports none, so the answer's
//!   own length is given too, as words: whitespace-separated words, each CJK character one.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use sift_models::fake_server::{FakeLlm, FakeOptions};

use crate::chat::{ModelLedger, scripted_model};
use crate::client::{DEFAULT_NODE, SiftClient};
use crate::dataset::{Dataset, Query, SliceLimits};
use crate::metrics::percentile;
use crate::progress::ProgressLine;
use crate::quality::{IngestReport, KbPlan, prepare_kb};

/// How the node under test answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Extractive,
    Scripted,
    Llm,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Extractive => "extractive",
            Mode::Scripted => "scripted",
            Mode::Llm => "llm",
        }
    }
}

/// A `--mode` value: `MODE` or `MODE@NODE_URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeTarget {
    pub mode: Mode,
    /// The node answering in this mode; `--node` when `None`.
    pub node: Option<String>,
}

impl FromStr for ModeTarget {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (name, node) = match text.split_once('@') {
            Some((name, node)) => (name, Some(node.to_string())),
            None => (text, None),
        };
        let mode = match name {
            "extractive" => Mode::Extractive,
            "scripted" => Mode::Scripted,
            "llm" => Mode::Llm,
            other => {
                return Err(format!(
                    "unknown mode {other:?} (extractive, scripted or llm, optionally @NODE_URL)"
                ));
            }
        };
        Ok(ModeTarget { mode, node })
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct AnswersArgs {
    /// BEIR folder whose queries carry gold answers (`metadata.answer` or `metadata.answers`):
    /// corpus.jsonl, queries.jsonl and qrels/test.tsv (or qrels.tsv).
    #[arg(long, value_name = "DIR")]
    pub dataset: PathBuf,
    /// Base URL of the Sift node (loopback only) for modes without their own `@URL`.
    #[arg(long, value_name = "URL", env = "SIFT_BENCH_NODE", default_value = DEFAULT_NODE)]
    pub node: String,
    /// Answer modes to measure, in order: `extractive`, `scripted`, `llm`, each optionally
    /// `@NODE_URL` (repeat the flag or separate by commas) [default: extractive, or llm with
    /// --llm-url].
    #[arg(long = "mode", value_name = "MODE[@URL]", value_delimiter = ',')]
    pub modes: Vec<ModeTarget>,
    /// The model the node of the `llm` mode is configured with (a label for the report; the
    /// bench never calls it). Without --mode, it selects the `llm` mode.
    #[arg(long, value_name = "URL")]
    pub llm_url: Option<String>,
    /// Where the scripted fake model listens (mode `scripted`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7701")]
    pub llm_listen: SocketAddr,
    /// Agent preset asked (the `model` of the OpenAI request).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub agent: String,
    /// Knowledge base name [default: the dataset folder name]. Ingested unless it already
    /// holds the dataset's documents.
    #[arg(long, value_name = "NAME")]
    pub kb: Option<String>,
    /// Shards of a newly created knowledge base [default: the node's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: Option<u32>,
    /// Chunk size of a newly created KB, in tokens (the node's default when absent).
    #[arg(long, value_name = "N")]
    pub chunk_tokens: Option<u32>,
    /// Ask only the first N judged questions (file order).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queries: Option<u64>,
    /// Documents per ingestion request.
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub batch: u64,
    /// Give up when ingestion has not finished after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    pub ingest_timeout: u64,
    /// Longest wait for one answer, in seconds; a slower one counts as an error.
    #[arg(long, value_name = "S", default_value_t = 600)]
    pub timeout: u64,
    /// Also write the results, per question included, as JSON to this file.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
}

impl AnswersArgs {
    /// Arguments for `dataset` against `node` with every other flag at its default.
    pub fn new(dataset: PathBuf, node: &str, modes: Vec<ModeTarget>) -> AnswersArgs {
        AnswersArgs {
            dataset,
            node: node.to_string(),
            modes,
            llm_url: None,
            llm_listen: SocketAddr::from(([127, 0, 0, 1], 7701)),
            agent: "default".into(),
            kb: None,
            shards: None,
            chunk_tokens: None,
            max_queries: None,
            batch: 500,
            ingest_timeout: 3600,
            timeout: 600,
            json: None,
        }
    }

    fn targets(&self) -> Result<Vec<ModeTarget>> {
        let targets = if self.modes.is_empty() {
            vec![ModeTarget {
                mode: if self.llm_url.is_some() {
                    Mode::Llm
                } else {
                    Mode::Extractive
                },
                node: None,
            }]
        } else {
            self.modes.clone()
        };
        if targets.iter().any(|t| t.mode == Mode::Llm) && self.llm_url.is_none() {
            bail!("mode llm needs --llm-url (the model the node is configured with)");
        }
        Ok(targets)
    }
}

// ---- scoring ----

/// Chat-template tokens, tool tags and step JSON that must never reach an answer.
const RAW_PROTOCOL: [&str; 11] = [
    "{\"thought\"",
    "\"tool\"",
    "tool_input",
    "\"tool_calls\"",
    "\"final_answer\"",
    "<|",
    "[INST]",
    "<<SYS>>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
];

/// Whether `answer` holds protocol text (see [`RAW_PROTOCOL`]).
pub fn has_raw_protocol(answer: &str) -> bool {
    RAW_PROTOCOL.iter().any(|marker| answer.contains(marker))
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // kana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // compatibility ideographs
        | 0x20000..=0x2FA1F) // extensions B-F, compatibility supplement
}

/// Removes citation markers: bracketed runs of at most 64 characters without whitespace
/// (`[3]`, `[c_12]`). A bracketed phrase with spaces is text and stays.
fn strip_markers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find(']') {
            Some(close)
                if close <= 64
                    && !after[..close].is_empty()
                    && !after[..close].contains(char::is_whitespace)
                    && !after[..close].contains('[') =>
            {
                out.push(' ');
                rest = &after[close + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// SQuAD normalisation as tokens: lower case, citation markers and punctuation removed (a
/// punctuation mark joins what it separated, as SQuAD's `remove_punc` does: `6,960` is
/// `6960`), the articles a/an/the dropped, split on whitespace; every CJK character is a token
/// of its own.
pub fn answer_tokens(text: &str) -> Vec<String> {
    let text = strip_markers(text).to_lowercase();
    let mut tokens = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, tokens: &mut Vec<String>| {
        if !word.is_empty() {
            if !matches!(word.as_str(), "a" | "an" | "the") {
                tokens.push(std::mem::take(word));
            }
            word.clear();
        }
    };
    for c in text.chars() {
        if is_cjk(c) {
            flush(&mut word, &mut tokens);
            tokens.push(c.to_string());
        } else if c.is_whitespace() {
            flush(&mut word, &mut tokens);
        } else if c.is_alphanumeric() {
            word.push(c);
        }
        // Punctuation and symbols are dropped without splitting.
    }
    flush(&mut word, &mut tokens);
    tokens
}

/// Whether `needle` occurs in `haystack` as a contiguous run of tokens.
fn contains_run(haystack: &[String], needle: &[String]) -> bool {
    !needle.is_empty()
        && haystack.len() >= needle.len()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// Whether the normalised `text` contains one of the normalised `golds`.
pub fn contains_gold(text: &str, golds: &[String]) -> bool {
    let tokens = answer_tokens(text);
    golds
        .iter()
        .any(|gold| contains_run(&tokens, &answer_tokens(gold)))
}

/// SQuAD token F1 of `answer` against the best of `golds` (0 without golds).
pub fn token_f1(answer: &str, golds: &[String]) -> f64 {
    let predicted = answer_tokens(answer);
    golds
        .iter()
        .map(|gold| {
            let gold = answer_tokens(gold);
            let mut counts: HashMap<&str, i64> = HashMap::new();
            for token in &gold {
                *counts.entry(token).or_default() += 1;
            }
            let mut same = 0i64;
            for token in &predicted {
                if let Some(count) = counts.get_mut(token.as_str())
                    && *count > 0
                {
                    *count -= 1;
                    same += 1;
                }
            }
            if same == 0 {
                return 0.0;
            }
            let precision = same as f64 / predicted.len() as f64;
            let recall = same as f64 / gold.len() as f64;
            2.0 * precision * recall / (precision + recall)
        })
        .fold(0.0, f64::max)
}

/// Whitespace-separated words, each CJK character one.
pub fn answer_words(text: &str) -> usize {
    text.split_whitespace()
        .map(|word| {
            let cjk = word.chars().filter(|&c| is_cjk(c)).count();
            let rest = word.chars().any(|c| !is_cjk(c) && c.is_alphanumeric());
            cjk + usize::from(rest)
        })
        .sum()
}

// ---- results ----

/// One question, one mode.
#[derive(Debug, Clone, Serialize)]
pub struct QuestionResult {
    pub query_id: String,
    pub question: String,
    pub gold: Vec<String>,
    pub answer: String,
    pub contains_gold: bool,
    pub f1: f64,
    pub citations: usize,
    /// External ids of the cited documents, in citation order, each once.
    pub cited_documents: Vec<String>,
    /// Citations in a judged supporting passage or holding the gold answer.
    pub citations_correct: usize,
    pub citation_recall: f64,
    /// Sentences the grounding judged, and how many were supported (`None`: no verdicts).
    pub sentences: Option<u64>,
    pub sentences_supported: Option<u64>,
    /// `extractive` / `not_found` when the model's answer was replaced.
    pub grounding_fallback: Option<String>,
    pub raw_protocol: bool,
    pub wall_ms: f64,
    pub completion_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    pub answer_words: usize,
    /// Calls the scripted model received for this question (scripted mode only).
    pub model_calls: Option<u64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
}

/// The scores of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    pub mode: Mode,
    pub node: String,
    /// `--llm-url` for the `llm` mode.
    pub llm: Option<String>,
    pub kb: String,
    pub ingest: IngestReport,
    pub questions: usize,
    /// Questions with at least one gold answer (containment and F1 are over these).
    pub with_gold: usize,
    pub errors: usize,
    pub containment: f64,
    pub f1: f64,
    pub cited_share: f64,
    /// `None` when no answer cited anything.
    pub citation_precision: Option<f64>,
    pub citation_recall: f64,
    /// `None` when no answer carried grounding verdicts (extractive answers).
    pub sentences_supported: Option<f64>,
    pub grounding_fallbacks: usize,
    pub raw_protocol: usize,
    pub wall_p50_ms: Option<f64>,
    pub wall_p99_ms: Option<f64>,
    /// Mean `usage.completion_tokens` over the answers that reported some.
    pub completion_tokens_mean: Option<f64>,
    pub answer_words_mean: f64,
    pub per_question: Vec<QuestionResult>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct AnswersReport {
    pub dataset: String,
    pub dataset_dir: String,
    pub agent: String,
    pub modes: Vec<ModeReport>,
}

// ---- one question ----

/// What one answer said, read from the OpenAI-compatible response.
fn score_answer(query: &Query, judged: &HashSet<&str>, body: &Value) -> QuestionResult {
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let citations = body["sift"]["citations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut cited_documents: Vec<String> = Vec::new();
    let mut correct = 0;
    for citation in &citations {
        let external = citation["external_id"].as_str().unwrap_or_default();
        let text = citation["text"].as_str().unwrap_or_default();
        if judged.contains(external) || contains_gold(text, &query.answers) {
            correct += 1;
        }
        if !external.is_empty() && !cited_documents.iter().any(|known| known == external) {
            cited_documents.push(external.to_string());
        }
    }
    let recall = if judged.is_empty() {
        0.0
    } else {
        cited_documents
            .iter()
            .filter(|id| judged.contains(id.as_str()))
            .count() as f64
            / judged.len() as f64
    };
    let grounding = &body["sift"]["grounding"];
    let (sentences, supported) = match grounding["sentences"].as_array() {
        Some(list) => (
            Some(list.len() as u64),
            Some(grounding["supported"].as_u64().unwrap_or(0)),
        ),
        None => (None, None),
    };
    let usage = &body["usage"];
    let reported = |field: &str| usage[field].as_u64().filter(|&n| n > 0);
    QuestionResult {
        query_id: query.id.clone(),
        question: query.text.clone(),
        gold: query.answers.clone(),
        contains_gold: contains_gold(&answer, &query.answers),
        f1: token_f1(&answer, &query.answers),
        citations: citations.len(),
        cited_documents,
        citations_correct: correct,
        citation_recall: recall,
        sentences,
        sentences_supported: supported,
        grounding_fallback: grounding["fallback"].as_str().map(str::to_string),
        raw_protocol: has_raw_protocol(&answer),
        wall_ms: 0.0,
        completion_tokens: reported("completion_tokens"),
        prompt_tokens: reported("prompt_tokens"),
        answer_words: answer_words(&answer),
        model_calls: None,
        finish_reason: body["choices"][0]["finish_reason"]
            .as_str()
            .map(str::to_string),
        error: None,
        answer,
    }
}

fn failed(query: &Query, error: String, wall_ms: f64) -> QuestionResult {
    QuestionResult {
        query_id: query.id.clone(),
        question: query.text.clone(),
        gold: query.answers.clone(),
        answer: String::new(),
        contains_gold: false,
        f1: 0.0,
        citations: 0,
        cited_documents: Vec::new(),
        citations_correct: 0,
        citation_recall: 0.0,
        sentences: None,
        sentences_supported: None,
        grounding_fallback: None,
        raw_protocol: false,
        wall_ms,
        completion_tokens: None,
        prompt_tokens: None,
        answer_words: 0,
        model_calls: None,
        finish_reason: None,
        error: Some(error),
    }
}

fn summarise(
    mode: Mode,
    node: String,
    llm: Option<String>,
    kb: String,
    ingest: IngestReport,
    per_question: Vec<QuestionResult>,
) -> ModeReport {
    let n = per_question.len().max(1) as f64;
    let gold: Vec<&QuestionResult> = per_question.iter().filter(|q| !q.gold.is_empty()).collect();
    let with_gold = gold.len();
    let over_gold = |value: &dyn Fn(&QuestionResult) -> f64| {
        gold.iter().map(|q| value(q)).sum::<f64>() / with_gold.max(1) as f64
    };
    let citations: usize = per_question.iter().map(|q| q.citations).sum();
    let correct: usize = per_question.iter().map(|q| q.citations_correct).sum();
    let judged: Vec<&QuestionResult> = per_question
        .iter()
        .filter(|q| q.sentences.is_some_and(|s| s > 0))
        .collect();
    let sentences: u64 = judged.iter().filter_map(|q| q.sentences).sum();
    let supported: u64 = judged.iter().filter_map(|q| q.sentences_supported).sum();
    let walls: Vec<f64> = per_question
        .iter()
        .filter(|q| q.error.is_none())
        .map(|q| q.wall_ms)
        .collect();
    let tokens: Vec<f64> = per_question
        .iter()
        .filter_map(|q| q.completion_tokens)
        .map(|t| t as f64)
        .collect();
    ModeReport {
        mode,
        node,
        llm,
        kb,
        ingest,
        questions: per_question.len(),
        with_gold,
        errors: per_question.iter().filter(|q| q.error.is_some()).count(),
        containment: over_gold(&|q| f64::from(u8::from(q.contains_gold))),
        f1: over_gold(&|q| q.f1),
        cited_share: per_question.iter().filter(|q| q.citations > 0).count() as f64 / n,
        citation_precision: (citations > 0).then(|| correct as f64 / citations as f64),
        citation_recall: per_question.iter().map(|q| q.citation_recall).sum::<f64>() / n,
        sentences_supported: (sentences > 0).then(|| supported as f64 / sentences as f64),
        grounding_fallbacks: per_question
            .iter()
            .filter(|q| q.grounding_fallback.is_some())
            .count(),
        raw_protocol: per_question.iter().filter(|q| q.raw_protocol).count(),
        wall_p50_ms: percentile(&walls, 50.0),
        wall_p99_ms: percentile(&walls, 99.0),
        completion_tokens_mean: (!tokens.is_empty())
            .then(|| tokens.iter().sum::<f64>() / tokens.len() as f64),
        answer_words_mean: per_question
            .iter()
            .map(|q| q.answer_words as f64)
            .sum::<f64>()
            / n,
        per_question,
    }
}

// ---- the run ----

/// Asks every question of `dataset` on the node at `node` in `mode`.
async fn measure_mode(
    args: &AnswersArgs,
    dataset: &Dataset,
    kb: &str,
    target: &ModeTarget,
    ledger: Option<&ModelLedger>,
) -> Result<ModeReport> {
    let node = target.node.clone().unwrap_or_else(|| args.node.clone());
    let timeout = Duration::from_secs(args.timeout);
    let client = SiftClient::new(&node, timeout)?;
    let plan = KbPlan {
        shards: args.shards,
        chunk_tokens: args.chunk_tokens,
        batch: usize::try_from(args.batch).unwrap_or(usize::MAX),
        reuse: true,
        recreate: false,
        ingest_timeout: Duration::from_secs(args.ingest_timeout),
    };
    let ingest = prepare_kb(&client, kb, dataset, &plan).await?;
    eprintln!("{}: {}", target.mode.as_str(), ingest.summary());

    let mut results = Vec::with_capacity(dataset.queries.len());
    let mut line = ProgressLine::new();
    for (index, query) in dataset.queries.iter().enumerate() {
        let judged: HashSet<&str> = dataset
            .qrels
            .get(&query.id)
            .map(|judgements| {
                judgements
                    .iter()
                    .filter(|(_, score)| **score > 0.0)
                    .map(|(id, _)| id.as_str())
                    .collect()
            })
            .unwrap_or_default();
        let body = json!({
            "model": args.agent,
            "messages": [{ "role": "user", "content": query.text }],
            "stream": false,
            "sift": { "kbs": [kb] },
        });
        let calls_before = ledger.map(|l| l.untagged_calls.load(Ordering::Relaxed));
        let started = Instant::now();
        let response = client.chat_completion(&body, timeout).await;
        let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut result = match response {
            Ok(body) => {
                let mut result = score_answer(query, &judged, &body);
                result.wall_ms = wall_ms;
                result
            }
            Err(error) => failed(query, format!("{error:#}"), wall_ms),
        };
        if let (Some(ledger), Some(before)) = (ledger, calls_before) {
            result.model_calls = Some(ledger.untagged_calls.load(Ordering::Relaxed) - before);
        }
        // The first answer tells whether the node answers in the mode it is labelled with.
        if index == 0 && result.error.is_none() {
            match target.mode {
                Mode::Extractive if result.completion_tokens.is_some() => bail!(
                    "the node at {node} answered with a model ({} completion tokens): extractive mode needs a node without SIFT_LLM_*",
                    result.completion_tokens.unwrap_or(0)
                ),
                Mode::Scripted if result.model_calls == Some(0) => bail!(
                    "the node at {node} never called the scripted model: start it with SIFT_LLM_BASE_URL=http://{}/v1 SIFT_LLM_MODEL=fake-model",
                    args.llm_listen
                ),
                _ => {}
            }
        }
        results.push(result);
        let contained = results.iter().filter(|r| r.contains_gold).count();
        line.update(&format!(
            "{} {}/{}: {contained} contain the gold answer",
            target.mode.as_str(),
            index + 1,
            dataset.queries.len()
        ));
    }
    line.finish(&format!(
        "{}: {} questions asked",
        target.mode.as_str(),
        results.len()
    ));
    let llm = (target.mode == Mode::Llm)
        .then(|| args.llm_url.clone())
        .flatten();
    Ok(summarise(
        target.mode,
        node,
        llm,
        kb.to_string(),
        ingest,
        results,
    ))
}

/// Loads the dataset, starts the scripted model when a mode needs it, and measures each mode
/// in turn.
pub async fn measure(args: &AnswersArgs) -> Result<AnswersReport> {
    let targets = args.targets()?;
    let limits = SliceLimits {
        max_queries: args
            .max_queries
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        max_docs: None,
    };
    let dataset = Dataset::load(&args.dataset, limits)
        .with_context(|| format!("cannot load dataset {}", args.dataset.display()))?;
    let name = dataset.name();
    let with_gold = dataset
        .queries
        .iter()
        .filter(|q| !q.answers.is_empty())
        .count();
    eprintln!(
        "dataset {name}: {} documents, {} judged questions, {with_gold} with gold answers",
        dataset.documents.len(),
        dataset.queries.len()
    );
    if with_gold == 0 {
        bail!(
            "no judged question of {} carries a gold answer (metadata.answer or metadata.answers)",
            args.dataset.display()
        );
    }
    let kb = args.kb.clone().unwrap_or_else(|| name.clone());

    let ledger = Arc::new(ModelLedger::default());
    let _fake = if targets.iter().any(|t| t.mode == Mode::Scripted) {
        let options = FakeOptions {
            address: args.llm_listen,
            piece_delay: Duration::ZERO,
            record_requests: false,
        };
        let fake = FakeLlm::start_with_options(scripted_model(ledger.clone(), 12, 40), options)
            .await
            .with_context(|| format!("starting the scripted model on {}", args.llm_listen))?;
        eprintln!(
            "scripted model: {} (the scripted node needs SIFT_LLM_BASE_URL={} SIFT_LLM_MODEL=fake-model)",
            fake.base_url(),
            fake.base_url()
        );
        Some(fake)
    } else {
        None
    };

    let mut modes = Vec::new();
    for target in &targets {
        let ledger = (target.mode == Mode::Scripted).then_some(&*ledger);
        modes.push(measure_mode(args, &dataset, &kb, target, ledger).await?);
    }
    Ok(AnswersReport {
        dataset: name,
        dataset_dir: args.dataset.display().to_string(),
        agent: args.agent.clone(),
        modes,
    })
}

fn optional(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.digits$}"))
}

/// The table printed on stdout.
pub fn render_table(report: &AnswersReport) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<10} {:>5} {:>8} {:>6} {:>6} {:>8} {:>8} {:>9} {:>4} {:>9} {:>9} {:>8} {:>6}\n",
        "mode",
        "asked",
        "contain",
        "F1",
        "cited",
        "cit.prec",
        "cit.rec",
        "supported",
        "raw",
        "p50 ms",
        "p99 ms",
        "tok/ans",
        "words"
    ));
    for mode in &report.modes {
        out.push_str(&format!(
            "{:<10} {:>5} {:>8.3} {:>6.3} {:>6.3} {:>8} {:>8.3} {:>9} {:>4} {:>9} {:>9} {:>8} {:>6.1}\n",
            mode.mode.as_str(),
            mode.questions,
            mode.containment,
            mode.f1,
            mode.cited_share,
            optional(mode.citation_precision, 3),
            mode.citation_recall,
            optional(mode.sentences_supported, 3),
            mode.raw_protocol,
            optional(mode.wall_p50_ms, 1),
            optional(mode.wall_p99_ms, 1),
            optional(mode.completion_tokens_mean, 1),
            mode.answer_words_mean,
        ));
    }
    out
}

pub async fn run(args: AnswersArgs) -> Result<()> {
    let report = measure(&args).await?;
    println!();
    println!(
        "sift-bench answers: {} (agent preset {:?})",
        report.dataset, report.agent
    );
    for mode in &report.modes {
        println!(
            "{}: node {}{}, kb {:?}, {} questions ({} with gold answers), {} errors, {} grounding fallbacks",
            mode.mode.as_str(),
            mode.node,
            mode.llm
                .as_ref()
                .map(|url| format!(" (model {url})"))
                .unwrap_or_default(),
            mode.kb,
            mode.questions,
            mode.with_gold,
            mode.errors,
            mode.grounding_fallbacks
        );
    }
    println!();
    print!("{}", render_table(&report));
    println!(
        "contain: gold answer in the answer (SQuAD-normalised); cited: answers with a citation; cit.prec: citations into a judged passage or holding the gold answer; cit.rec: judged passages cited; supported: grounded sentences / sentences judged (n/a: no verdicts, as for extractive answers); raw: answers with protocol text; tok/ans: usage.completion_tokens (n/a: none reported); words: the answer's words (CJK characters one each)"
    );
    if let Some(path) = &args.json {
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_follows_squad() {
        assert_eq!(
            answer_tokens("The population was 6,960 [3]."),
            ["population", "was", "6960"]
        );
        assert_eq!(answer_tokens("an Apple, a pear"), ["apple", "pear"]);
        assert_eq!(answer_tokens("踢爆。"), ["踢", "爆"]);
        assert_eq!(answer_tokens("4分钟"), ["4", "分", "钟"]);
        // A bracketed phrase with spaces is text, not a marker.
        assert_eq!(answer_tokens("[the end]"), ["end"]);
    }

    #[test]
    fn containment_is_by_token_run() {
        let gold = golds(&["no"]);
        assert!(!contains_gold("It is not known.", &gold));
        assert!(contains_gold("No, they are not.", &gold));
        assert!(contains_gold(
            "Kerry Saxby-Junna was born in Ballina, population 6,960 [c1].",
            &golds(&["6,960"])
        ));
        // A citation marker is not an answer.
        assert!(!contains_gold("It happened [3].", &golds(&["3"])));
        assert!(contains_gold("玩家被踢爆了", &golds(&["踢爆"])));
        assert!(!contains_gold("anything", &[]));
    }

    #[test]
    fn f1_takes_the_best_gold() {
        assert_eq!(token_f1("Stephen King", &golds(&["Stephen King"])), 1.0);
        let f1 = token_f1(
            "the film of Stephen King",
            &golds(&["King", "Stephen King"]),
        );
        // film, of, stephen, king against stephen, king: precision 1/2, recall 1.
        assert!((f1 - 2.0 / 3.0).abs() < 1e-9, "{f1}");
        assert_eq!(token_f1("nothing", &golds(&["else"])), 0.0);
        assert_eq!(token_f1("踢爆", &golds(&["踢爆"])), 1.0);
    }

    #[test]
    fn raw_protocol_is_detected() {
        assert!(has_raw_protocol(
            r#"{"thought": "search", "tool": "knowledge_search"}"#
        ));
        assert!(has_raw_protocol("The answer<|im_end|>"));
        assert!(has_raw_protocol("Answer: tool_input was"));
        assert!(!has_raw_protocol(
            "Raft elects a leader by majority vote [1]."
        ));
    }

    #[test]
    fn words_count_cjk_characters() {
        assert_eq!(answer_words("Stephen King wrote it."), 4);
        assert_eq!(answer_words("玩家用水枪"), 5);
        assert_eq!(answer_words("4分钟"), 3);
    }

    #[test]
    fn modes_parse_with_optional_nodes() {
        assert_eq!(
            "scripted@http://127.0.0.1:7710".parse::<ModeTarget>(),
            Ok(ModeTarget {
                mode: Mode::Scripted,
                node: Some("http://127.0.0.1:7710".into())
            })
        );
        assert_eq!(
            "extractive".parse::<ModeTarget>().unwrap().mode,
            Mode::Extractive
        );
        assert!("chatty".parse::<ModeTarget>().is_err());
    }

    #[test]
    fn an_answer_is_scored_from_the_openai_body() {
        let query = Query {
            id: "q".into(),
            text: "Who directed the film?".into(),
            answers: golds(&["Stephen King"]),
        };
        let judged: HashSet<&str> = ["H1", "H2"].into_iter().collect();
        let body = json!({
            "choices": [{ "message": { "content": "Stephen King directed it [1]." }, "finish_reason": "stop" }],
            "usage": { "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0 },
            "sift": {
                "citations": [
                    { "external_id": "H1", "text": "Maximum Overdrive" },
                    { "external_id": "H7", "text": "directed by Stephen King" },
                    { "external_id": "H8", "text": "unrelated" }
                ],
                "grounding": { "sentences": [{}, {}], "supported": 1 }
            }
        });
        let result = score_answer(&query, &judged, &body);
        assert!(result.contains_gold);
        // 2 of 4 answer tokens, both gold tokens: F1 = 2 x 0.5 x 1 / 1.5.
        assert!((result.f1 - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(result.citations, 3);
        assert_eq!(result.citations_correct, 2);
        assert_eq!(result.citation_recall, 0.5);
        assert_eq!(result.sentences, Some(2));
        assert_eq!(result.sentences_supported, Some(1));
        assert_eq!(result.completion_tokens, None);
        assert!(!result.raw_protocol);
        let report = summarise(
            Mode::Extractive,
            "n".into(),
            None,
            "kb".into(),
            IngestReport::default(),
            vec![result],
        );
        assert_eq!(report.citation_precision, Some(2.0 / 3.0));
        assert_eq!(report.sentences_supported, Some(0.5));
        assert_eq!(report.cited_share, 1.0);
    }
}
