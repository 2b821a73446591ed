//! Answer quality on the HotpotQA slice (20 questions with gold answers, their 200 passages),
//! measured by `sift-bench answers`' own code ([`sift_bench::answers`]) against a node in the
//! test process: first with no chat model (extractive answers), then, on the same data
//! directory (the KB is found loaded and reused), with the bench's scripted fake model
//! (search, then a `final_answer` quoting and citing two chunks). The floors sit a little
//! below what was measured, so a retrieval, citation, grounding or scrubbing regression fails.

use std::net::SocketAddr;

use sift_bench::answers::{AnswersArgs, Mode, ModeReport, ModeTarget, measure, render_table};
use sift_models::llm::config::ProviderConfig;
use sift_node::config::Config;
use sift_tests::{InProcessNode, beir, free_port, require_model, temp_dir};

/// A node on `data` without API keys (the bench sends `SIFT_API_KEY`, which a test cannot
/// set), with the embedded model and `providers` as its chat models.
async fn node(data: &std::path::Path, providers: Vec<ProviderConfig>) -> InProcessNode {
    let mut config = Config::for_test(data);
    config.embedding.model_dir = Some(require_model());
    config.auth = sift_node::auth::AuthMode::Off;
    config.llm.providers = providers;
    InProcessNode::start_with(config).await
}

async fn answers(node: &InProcessNode, mode: Mode, llm_listen: SocketAddr) -> ModeReport {
    let mut args = AnswersArgs::new(
        beir::fixtures_dir().join("hotpotqa-slice"),
        &node.url,
        vec![ModeTarget { mode, node: None }],
    );
    args.kb = Some("hotpot".into());
    args.shards = Some(2);
    args.llm_listen = llm_listen;
    args.timeout = 120;
    let report = measure(&args).await.expect("the measurement runs");
    print!("{}", render_table(&report));
    let mode_report = report.modes.into_iter().next().expect("one mode");
    assert_eq!(mode_report.questions, 20);
    assert_eq!(mode_report.with_gold, 20);
    assert_eq!(mode_report.errors, 0, "{:?}", mode_report.per_question);
    mode_report
}

/// (containment, citation precision, citation recall) floors.
fn assert_floors(report: &ModeReport, containment: f64, precision: f64, recall: f64) {
    let mode = report.mode.as_str();
    assert_eq!(report.cited_share, 1.0, "{mode}: every answer cites");
    assert_eq!(report.raw_protocol, 0, "{mode}: no protocol text");
    assert!(
        report.containment >= containment,
        "{mode}: containment {:.3} (floor {containment})",
        report.containment
    );
    let measured = report.citation_precision.unwrap_or(0.0);
    assert!(
        measured >= precision,
        "{mode}: citation precision {measured:.3} (floor {precision})"
    );
    assert!(
        report.citation_recall >= recall,
        "{mode}: citation recall {:.3} (floor {recall})",
        report.citation_recall
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotpotqa_slice_answers_extractive_and_scripted() {
    let dir = temp_dir();
    let data = dir.path().join("node");
    let llm_listen = SocketAddr::from(([127, 0, 0, 1], free_port()));

    let extractive_node = node(&data, Vec::new()).await;
    let extractive = answers(&extractive_node, Mode::Extractive, llm_listen).await;
    assert!(!extractive.ingest.skipped, "the first run ingests");
    extractive_node.shutdown().await;
    assert_eq!(
        extractive.sentences_supported, None,
        "no verdicts on extractive answers"
    );

    let provider = ProviderConfig::openai(format!("http://{llm_listen}/v1"), "fake-model", None);
    let scripted_node = node(&data, vec![provider]).await;
    let scripted = answers(&scripted_node, Mode::Scripted, llm_listen).await;
    assert!(scripted.ingest.skipped, "the loaded KB is reused");
    scripted_node.shutdown().await;
    assert!(
        scripted
            .per_question
            .iter()
            .all(|q| q.model_calls.unwrap_or(0) >= 2),
        "every scripted answer searched and answered through the model"
    );

    // Measured (20 questions, 200 passages, 2 shards, debug build): extractive containment
    // 0.600, citation precision 0.483, recall 0.650; scripted containment 0.350, precision
    // 0.700, recall 0.700, sentences supported 0.986; every answer cited, none with protocol
    // text. One question is 0.05; the floors leave two.
    assert_floors(&extractive, 0.50, 0.40, 0.55);
    assert_floors(&scripted, 0.25, 0.60, 0.60);
    assert!(
        scripted.sentences_supported.unwrap_or(0.0) >= 0.90,
        "scripted: sentences supported {:?}",
        scripted.sentences_supported
    );
}
