//! The query planner (as in the Mnemo seed): intent, sub-queries and rewrites for retrieval.
//!
//! - Rules ([`plan_rules`], pub so retrieval can reuse it) for short or keyword-clear queries:
//!   milliseconds, no model call.
//! - The model for long or compound queries (more than 12 words / 40 CJK characters, several
//!   questions, or no clear intent keyword in a medium-length query): 2 to 4 sub-queries and
//!   rewrites as JSON. Bounded by a timeout; a timeout or unparsable answer falls back to
//!   the rules.
//!
//! The plan does not decide whether to search: the model does, in the loop. `knowledge_search`
//! adds the plan's sub-queries and rewrites to the first search of the question.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::RunCancel;
use super::model_io::{complete_text, extract_json_object};
use super::terms::terms;
use sift_models::llm::{ChatMessage, ChatModel, Usage};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    General,
    Compare,
    Definition,
    Procedure,
    Summary,
    Verification,
    Numeric,
}

impl Intent {
    fn parse(name: &str) -> Intent {
        match name.trim().to_lowercase().as_str() {
            "compare" | "comparison" => Intent::Compare,
            "definition" | "define" => Intent::Definition,
            "procedure" | "howto" | "how_to" => Intent::Procedure,
            "summary" | "summarize" => Intent::Summary,
            "verification" | "verify" | "fact_check" => Intent::Verification,
            "numeric" | "number" | "quantity" => Intent::Numeric,
            _ => Intent::General,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanSource {
    Rules,
    Model,
    /// The model was asked but timed out or answered something unusable.
    RulesAfterModelFailure,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryPlan {
    pub intent: Intent,
    /// Independent questions a compound query splits into (empty for a simple one).
    pub sub_queries: Vec<String>,
    /// Other wordings of the query for better recall (keywords only, synonyms).
    pub rewrites: Vec<String>,
    /// Hits per search.
    pub top_k: usize,
    pub source: PlanSource,
}

impl QueryPlan {
    /// Queries the first search runs: the query itself, then sub-queries and rewrites.
    pub fn search_queries(&self, query: &str, max: usize) -> Vec<String> {
        let mut out = vec![query.trim().to_string()];
        for candidate in self.sub_queries.iter().chain(&self.rewrites) {
            let candidate = candidate.trim();
            if !candidate.is_empty()
                && !out.iter().any(|q| q.eq_ignore_ascii_case(candidate))
                && out.len() < max
            {
                out.push(candidate.to_string());
            }
        }
        out
    }
}

const INTENT_KEYWORDS: &[(Intent, &[&str])] = &[
    (
        Intent::Compare,
        &[
            "compare",
            "comparison",
            "difference",
            "differences",
            "differ",
            "versus",
            " vs ",
            "better than",
            "对比",
            "比较",
            "区别",
            "差异",
        ],
    ),
    (
        Intent::Definition,
        &[
            "what is",
            "what are",
            "define",
            "definition",
            "meaning of",
            "什么是",
            "定义",
        ],
    ),
    (
        Intent::Procedure,
        &[
            "how to",
            "how do",
            "how can",
            "steps",
            "install",
            "configure",
            "如何",
            "怎么",
            "步骤",
        ],
    ),
    (
        Intent::Summary,
        &[
            "summarize",
            "summarise",
            "summary",
            "overview",
            "总结",
            "概述",
        ],
    ),
    (
        Intent::Verification,
        &[
            "is it true",
            "true that",
            "verify",
            "does it",
            "is there",
            "是否",
            "是不是",
        ],
    ),
    (
        Intent::Numeric,
        &[
            "how many",
            "how much",
            "how long",
            "what year",
            "when did",
            "number of",
            "多少",
            "几",
        ],
    ),
];

fn detect_intent(query: &str) -> Option<Intent> {
    let lowered = format!(" {} ", query.to_lowercase());
    INTENT_KEYWORDS
        .iter()
        .find(|(_, keywords)| keywords.iter().any(|k| lowered.contains(k)))
        .map(|(intent, _)| *intent)
}

fn cjk_chars(text: &str) -> usize {
    text.chars()
        .filter(|c| matches!(*c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF))
        .count()
}

fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

fn question_count(text: &str) -> usize {
    text.matches(['?', '？']).count()
}

/// Whether a query goes to the model planner: long, compound, or medium-length without a
/// clear intent keyword.
pub fn needs_model_planner(query: &str) -> bool {
    let cjk = cjk_chars(query);
    let length = if cjk > 0 {
        cjk + word_count(&query.replace(|c: char| c as u32 >= 0x3000, " "))
    } else {
        word_count(query)
    };
    let (short, long) = if cjk > 0 { (15, 40) } else { (6, 12) };
    if length <= short {
        return false;
    }
    if length > long || question_count(query) >= 2 {
        return true;
    }
    detect_intent(query).is_none()
}

/// The rule-based plan: intent by keyword; compound questions split on question marks and
/// comparisons into their sides; a keyword-only rewrite.
pub fn plan_rules(query: &str) -> QueryPlan {
    let query = query.trim();
    let intent = detect_intent(query).unwrap_or(Intent::General);
    let mut sub_queries = Vec::new();
    if question_count(query) >= 2 {
        sub_queries.extend(
            query
                .split_inclusive(['?', '？'])
                .map(str::trim)
                .filter(|q| q.chars().count() > 3)
                .map(String::from),
        );
    } else if intent == Intent::Compare {
        sub_queries.extend(comparison_sides(query));
    }
    let keywords = terms(query)
        .into_iter()
        .filter(|t| t.chars().count() > 1)
        .collect::<Vec<_>>()
        .join(" ");
    let mut rewrites = Vec::new();
    if !keywords.is_empty() && !keywords.eq_ignore_ascii_case(query) {
        rewrites.push(keywords);
    }
    QueryPlan {
        intent,
        sub_queries,
        rewrites,
        top_k: match intent {
            Intent::Compare | Intent::Summary => 10,
            _ => 8,
        },
        source: PlanSource::Rules,
    }
}

/// "compare A and B", "A vs B", "difference between A and B": the two sides, each with the
/// rest of the question's topic words.
fn comparison_sides(query: &str) -> Vec<String> {
    let lowered = query.to_lowercase();
    let body = [
        "difference between",
        "differences between",
        "compare",
        "comparison of",
    ]
    .iter()
    .find_map(|marker| lowered.find(marker).map(|at| &lowered[at + marker.len()..]))
    .unwrap_or(&lowered);
    let body = body.trim_end_matches(['?', '.', '!', ' ']);
    for separator in [" vs. ", " vs ", " versus ", " and ", " with ", "和", "与"] {
        if let Some((left, right)) = body.split_once(separator) {
            let left = left.trim();
            let right = right
                .split([',', ';'])
                .next()
                .unwrap_or(right)
                .split(" in ")
                .next()
                .unwrap_or(right)
                .trim();
            if !left.is_empty() && !right.is_empty() {
                return vec![left.to_string(), right.to_string()];
            }
        }
    }
    Vec::new()
}

const PLANNER_PROMPT: &str = "You plan retrieval for a question over a document collection. \
Answer with one JSON object and nothing else: \
{\"intent\": one of \"general\", \"compare\", \"definition\", \"procedure\", \"summary\", \"verification\", \"numeric\", \
\"sub_queries\": 2 to 4 self-contained search queries if the question has several parts (else []), \
\"rewrites\": 1 to 3 alternative keyword queries for better recall}. \
Do not answer the question.";

/// Plans with the model when the query needs it, within `timeout`; falls back to the rules.
/// Returns the plan and the usage of the model call, if one was made.
pub async fn plan(
    query: &str,
    model: Option<&dyn ChatModel>,
    timeout: Duration,
    cancel: &RunCancel,
) -> (QueryPlan, Option<Usage>) {
    let rules = plan_rules(query);
    let Some(model) = model.filter(|_| needs_model_planner(query)) else {
        return (rules, None);
    };
    let messages = vec![
        ChatMessage::System {
            content: PLANNER_PROMPT.into(),
        },
        ChatMessage::User {
            content: format!("Question: {query}"),
        },
    ];
    match complete_text(model, messages, Some(400), timeout, cancel).await {
        Ok((text, usage)) => match parse_model_plan(&text, &rules) {
            Some(plan) => (plan, Some(usage)),
            None => (
                QueryPlan {
                    source: PlanSource::RulesAfterModelFailure,
                    ..rules
                },
                Some(usage),
            ),
        },
        Err(error) => {
            tracing::debug!(%error, "model planner failed; using rules");
            (
                QueryPlan {
                    source: PlanSource::RulesAfterModelFailure,
                    ..rules
                },
                None,
            )
        }
    }
}

/// Reads the model's JSON plan; `None` when it is unusable.
pub fn parse_model_plan(text: &str, rules: &QueryPlan) -> Option<QueryPlan> {
    let value = extract_json_object(text)?;
    let strings = |key: &str, max: usize| -> Vec<String> {
        value[key]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str())
                    .map(|s| s.trim().chars().take(300).collect::<String>())
                    .filter(|s| !s.is_empty())
                    .take(max)
                    .collect()
            })
            .unwrap_or_default()
    };
    let sub_queries = strings("sub_queries", 4);
    let rewrites = strings("rewrites", 3);
    if sub_queries.is_empty() && rewrites.is_empty() {
        return None;
    }
    let intent = value["intent"]
        .as_str()
        .map(Intent::parse)
        .unwrap_or(rules.intent);
    Some(QueryPlan {
        intent,
        sub_queries,
        rewrites,
        top_k: if sub_queries_len_is_large(&value) {
            10
        } else {
            rules.top_k
        },
        source: PlanSource::Model,
    })
}

fn sub_queries_len_is_large(value: &serde_json::Value) -> bool {
    value["sub_queries"]
        .as_array()
        .is_some_and(|a| a.len() >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_keyword_clear_queries_use_rules() {
        assert!(!needs_model_planner("raft leader election"));
        assert!(!needs_model_planner("What is the boiling point of water?"));
        assert!(!needs_model_planner("向量检索是什么"));
        assert!(!needs_model_planner(
            "how to configure the ingest queue capacity"
        ));
    }

    #[test]
    fn long_or_compound_queries_use_the_model() {
        assert!(needs_model_planner(
            "Which storage engine does the node use for metadata, and what happens to \
             ingestion when the process is killed during a write?"
        ));
        assert!(needs_model_planner("Who wrote it? When was it published?"));
        // Medium length without any intent keyword.
        assert!(needs_model_planner(
            "the effect of vitamin D on bone density in adults"
        ));
    }

    #[test]
    fn rules_split_comparisons_and_multiple_questions() {
        let plan = plan_rules("Compare HNSW and IVF for vector search");
        assert_eq!(plan.intent, Intent::Compare);
        assert_eq!(plan.sub_queries, vec!["hnsw", "ivf for vector search"]);
        let plan = plan_rules("Who founded Acme? Where is its headquarters?");
        assert_eq!(
            plan.sub_queries,
            vec!["Who founded Acme?", "Where is its headquarters?"]
        );
        let plan = plan_rules("What is the boiling point of water?");
        assert_eq!(plan.intent, Intent::Definition);
        assert_eq!(plan.rewrites, vec!["boiling point water"]);
        assert!(plan.sub_queries.is_empty());
        assert_eq!(plan.source, PlanSource::Rules);
    }

    #[test]
    fn search_queries_dedupe_and_cap() {
        let plan = QueryPlan {
            intent: Intent::General,
            sub_queries: vec!["a b".into(), "A B".into(), "c".into()],
            rewrites: vec!["d".into(), "e".into()],
            top_k: 8,
            source: PlanSource::Rules,
        };
        assert_eq!(plan.search_queries("q", 4), vec!["q", "a b", "c", "d"]);
    }

    #[test]
    fn model_plan_parsing_falls_back_on_garbage() {
        let rules = plan_rules("anything at all here");
        let plan = parse_model_plan(
            "Here: {\"intent\": \"compare\", \"sub_queries\": [\"x\", \"\", 3, \"y\"], \"rewrites\": [\"z\"]}",
            &rules,
        )
        .unwrap();
        assert_eq!(plan.intent, Intent::Compare);
        assert_eq!(plan.sub_queries, vec!["x", "y"]);
        assert_eq!(plan.rewrites, vec!["z"]);
        assert_eq!(plan.source, PlanSource::Model);
        assert!(parse_model_plan("I think you should search", &rules).is_none());
        assert!(parse_model_plan("{\"intent\": \"general\"}", &rules).is_none());
    }
}
