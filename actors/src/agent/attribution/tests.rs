use super::*;
use crate::agent::evidence::tests::chunk;

fn split(text: &str) -> Vec<&str> {
    split_sentences(text)
        .into_iter()
        .map(|(a, b)| &text[a..b])
        .collect()
}

#[test]
fn sentences_split_at_ends_not_at_abbreviations_decimals_or_initials() {
    assert_eq!(
        split(
            "Snowfall is 43.8 inches, e.g. in Boston. J. R. R. Tolkien wrote it [a#1]. Next?  Yes!"
        ),
        vec![
            "Snowfall is 43.8 inches, e.g. in Boston.",
            "J. R. R. Tolkien wrote it [a#1].",
            "Next?",
            "Yes!"
        ]
    );
    // Markers and quotes after the end belong to the sentence; lines split.
    assert_eq!(
        split("He said \"stop.\" [1][2] Then left.\n- a list item\n\nMore"),
        vec![
            "He said \"stop.\" [1][2]",
            "Then left.",
            "- a list item",
            "More"
        ]
    );
    assert_eq!(
        split("绿茶是不发酵茶。红茶是全发酵茶！对吗？"),
        vec!["绿茶是不发酵茶。", "红茶是全发酵茶！", "对吗？"]
    );
    assert_eq!(
        split("The U.S. team won. etc. and more"),
        vec!["The U.S. team won. etc. and more"]
    );
    assert!(split("  \n ").is_empty());
}

#[test]
fn stems_join_numbers_and_fold_inflections() {
    assert_eq!(
        stems("It boils at 43.8 inches"),
        vec!["boil", "438", "inch"]
    );
    assert_eq!(stems("boiling elections"), vec!["boil", "election"]);
    let set: BTreeSet<String> = stems("Raft elects a leader").into_iter().collect();
    assert!(stem_in("election", &set), "{set:?}");
    assert!(!stem_in(
        "lead",
        &BTreeSet::from(["leadership".to_string()])
    ));
}

fn evidence() -> Evidence {
    let mut evidence = Evidence::default();
    evidence.insert(chunk(
        "water",
        0,
        "Water boils at 100 degrees Celsius at sea level. At higher altitude the boiling point is lower.",
    ));
    evidence.insert(chunk(
        "raft",
        1,
        "Raft elects a leader by randomized election timeouts. The leader replicates log entries.",
    ));
    evidence.insert(chunk(
        "boston",
        2,
        "Boston's average snowfall is 43.8 inches per year, mostly between December and March.",
    ));
    evidence
}

fn run(answer: &str, cited: &[&str], question: &str, policy: Grounding) -> Attributed {
    let cited: Vec<String> = cited.iter().map(|c| c.to_string()).collect();
    attribute(&AttributionInput {
        answer,
        cited: &cited,
        question,
        evidence: &evidence(),
        policy,
        nothing_relevant: false,
        tool_outputs: &[],
        semantic: &SemanticMatches::new(),
        pinned: 0,
    })
}

#[test]
fn a_supported_sentence_gets_a_citation_to_the_chunk_that_holds_it() {
    let out = run(
        "Based on the evidence, the average snowfall in Boston is 43.8 inches.",
        &[],
        "What is the usual average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(
        out.text,
        "Based on the evidence, the average snowfall in Boston is 43.8 inches [1]."
    );
    assert_eq!(out.citations.len(), 1);
    assert_eq!(out.citations[0].chunk_id, "boston#2");
    let verdict = &out.report.sentences[0];
    assert_eq!(verdict.verdict, Verdict::Supported);
    assert_eq!(verdict.support[0].chunk_id, "boston#2");
    assert_eq!(verdict.support[0].n, 1);
    assert!(verdict.support[0].overlap >= SUPPORT_SHARE);
    assert_eq!(out.report.supported, 1);
}

#[test]
fn strict_removes_unsupported_sentences_and_flag_marks_them() {
    let answer = "Water boils at 100 degrees Celsius at sea level [water#0]. The moon is made of green cheese [raft#1].";
    let strict = run(answer, &[], "When does water boil?", Grounding::Strict);
    assert_eq!(
        strict.text,
        "Water boils at 100 degrees Celsius at sea level [1]."
    );
    assert_eq!(strict.report.removed, 1);
    assert_eq!(strict.report.unsupported, 1);
    let moon = &strict.report.sentences[1];
    assert_eq!(moon.verdict, Verdict::Unsupported);
    assert!(!moon.kept);
    // The model's marker pointed at a chunk that does not hold the claim: rejected.
    assert_eq!(moon.rejected_markers, vec!["raft#1"]);
    assert_eq!(strict.citations.len(), 1);

    let flag = run(answer, &[], "When does water boil?", Grounding::Flag);
    assert_eq!(
        flag.text,
        "Water boils at 100 degrees Celsius at sea level [1]. The moon is made of green cheese [unsupported]."
    );
    assert_eq!(flag.report.removed, 0);
    assert!(flag.report.sentences[1].kept);
    assert_eq!(
        flag.citations.len(),
        1,
        "no citation for the unsupported sentence"
    );
}

#[test]
fn a_cited_id_never_retrieved_is_dropped_and_the_sentence_attributed_anew() {
    let out = run(
        "Raft elects its leader with randomized timeouts [made-up#9].",
        &["made-up#9"],
        "How does Raft pick a leader?",
        Grounding::Strict,
    );
    assert_eq!(
        out.text,
        "Raft elects its leader with randomized timeouts [1]."
    );
    assert_eq!(out.citations[0].chunk_id, "raft#1");
    assert_eq!(out.dropped, vec!["made-up#9"]);
}

#[test]
fn echoes_and_fragments_are_unsupported_but_entities_and_yes_no_stand() {
    let echo = run(
        "The usual average snowfall in Boston.",
        &[],
        "What is the usual average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(echo.report.sentences[0].verdict, Verdict::Echo);
    assert!(echo.text.is_empty());

    // Two words echoed from the question.
    let two_words = run(
        "Average snowfall",
        &[],
        "What is the average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(two_words.report.sentences[0].verdict, Verdict::Echo);

    let fragment = run("Probably Paris.", &[], "Where is it?", Grounding::Strict);
    assert_eq!(fragment.report.sentences[0].verdict, Verdict::Fragment);
    assert!(!fragment.report.has_answer());

    let entity = run(
        "43.8 inches.",
        &[],
        "What is the average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(entity.report.sentences[0].verdict, Verdict::SupportedEntity);
    assert_eq!(entity.text, "43.8 inches [1].");

    let yes = run("Yes.", &[], "Does Raft elect a leader?", Grounding::Strict);
    assert_eq!(yes.report.sentences[0].verdict, Verdict::SupportedYesNo);
    assert_eq!(yes.citations[0].chunk_id, "raft#1");
    // Restating a yes/no question affirms it, when the evidence holds it; a negation does not.
    let restated = run(
        "Raft elects a leader.",
        &[],
        "Does Raft elect a leader?",
        Grounding::Strict,
    );
    assert_eq!(
        restated.report.sentences[0].verdict,
        Verdict::SupportedYesNo
    );
    assert_eq!(restated.text, "Raft elects a leader [1].");
    let negated = run(
        "Raft does not elect a leader.",
        &[],
        "Does Raft elect a leader?",
        Grounding::Strict,
    );
    assert_eq!(negated.report.sentences[0].verdict, Verdict::Echo);
    let yes_to_what = run("Yes.", &[], "What is Raft?", Grounding::Strict);
    assert_eq!(yes_to_what.report.sentences[0].verdict, Verdict::Fragment);
}

#[test]
fn a_sentence_joining_two_chunks_cites_both() {
    let out = run(
        "Water boils at 100 degrees Celsius while Raft elects leaders with randomized timeouts.",
        &[],
        "Tell me about water and raft",
        Grounding::Strict,
    );
    assert_eq!(out.report.sentences[0].verdict, Verdict::Supported);
    let ids: Vec<&str> = out.citations.iter().map(|c| c.chunk_id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{out:?}");
    assert!(ids.contains(&"water#0") && ids.contains(&"raft#1"));
}

#[test]
fn an_answer_in_another_language_is_unsupported() {
    let out = run(
        "Wasser kocht auf Meereshöhe bei hundert Grad.",
        &["water#0"],
        "When does water boil?",
        Grounding::Strict,
    );
    assert_eq!(out.report.sentences[0].verdict, Verdict::Unsupported);
    assert!(!out.report.has_answer());
    assert!(out.citations.is_empty());
}

#[test]
fn refusals_stand_when_nothing_relevant_was_found_or_beside_an_answer() {
    let cited: Vec<String> = Vec::new();
    let evidence = evidence();
    let semantic = SemanticMatches::new();
    let input = |answer, nothing_relevant| AttributionInput {
        answer,
        cited: &cited,
        question: "Who founded Sift?",
        evidence: &evidence,
        policy: Grounding::Strict,
        nothing_relevant,
        tool_outputs: &[],
        semantic: &semantic,
        pinned: 0,
    };
    let alone = attribute(&input(
        "The knowledge base does not say who founded Sift.",
        true,
    ));
    assert!(alone.report.only_refusal());
    assert_eq!(
        alone.text,
        "The knowledge base does not say who founded Sift."
    );
    let with_relevant = attribute(&input("The knowledge base does not say.", false));
    assert!(
        !with_relevant.report.has_answer(),
        "relevant evidence existed"
    );
    let beside = attribute(&input(
        "Raft elects a leader by randomized timeouts. The evidence does not mention who founded it.",
        false,
    ));
    assert_eq!(beside.report.sentences.len(), 2);
    assert!(beside.report.sentences.iter().all(|s| s.kept));
}

#[test]
fn duplicates_and_marker_lines_go_and_layout_stays() {
    let out = run(
        "Water boils at 100 degrees Celsius at sea level.\n[water#0]\nWater boils at 100 degrees Celsius at sea level.\n\nRaft elects a leader by randomized timeouts.",
        &[],
        "water and raft",
        Grounding::Strict,
    );
    assert_eq!(
        out.text,
        "Water boils at 100 degrees Celsius at sea level [1].\n\nRaft elects a leader by randomized timeouts [2]."
    );
    assert_eq!(out.report.sentences[1].verdict, Verdict::Duplicate);
}

#[test]
fn the_support_span_is_the_chunk_sentence_holding_the_content() {
    let out = run(
        "At higher altitude the boiling point is lower.",
        &[],
        "Does altitude matter for water?",
        Grounding::Strict,
    );
    let support = &out.report.sentences[0].support[0];
    let chunk_text = &evidence().get("water#0").unwrap().chunk.text.clone();
    let own: String = chunk_text
        .chars()
        .skip(support.span.0 as usize)
        .take((support.span.1 - support.span.0) as usize)
        .collect();
    assert_eq!(own, "At higher altitude the boiling point is lower.");
}

#[test]
fn a_service_tool_output_supports_without_a_citation() {
    let cited: Vec<String> = Vec::new();
    let evidence = evidence();
    let outputs = vec![(
        "atlas__capital".to_string(),
        "The capital of Freedonia is Fredville.".to_string(),
    )];
    let out = attribute(&AttributionInput {
        answer: "According to the atlas service, Fredville.",
        cited: &cited,
        question: "What is the capital of Freedonia?",
        evidence: &evidence,
        policy: Grounding::Strict,
        nothing_relevant: true,
        tool_outputs: &outputs,
        semantic: &SemanticMatches::new(),
        pinned: 0,
    });
    assert_eq!(out.report.sentences[0].verdict, Verdict::SupportedByTool);
    assert_eq!(
        out.report.sentences[0].tool.as_deref(),
        Some("atlas__capital")
    );
    assert_eq!(out.text, "According to the atlas service, Fredville.");
    assert!(out.citations.is_empty());
}

#[test]
fn meaning_supports_only_a_borderline_sentence_and_only_above_the_bar() {
    let evidence = evidence();
    let answer =
        "Climbers at altitude see their water boil before it gets as hot, as the air is thinner.";
    let attribute_with = |semantic: &SemanticMatches| {
        attribute(&AttributionInput {
            answer,
            cited: &[],
            question: "Why does altitude change cooking?",
            evidence: &evidence,
            policy: Grounding::Strict,
            nothing_relevant: false,
            tool_outputs: &[],
            semantic,
            pinned: 0,
        })
    };
    let first = attribute_with(&SemanticMatches::new());
    assert_eq!(first.report.sentences[0].verdict, Verdict::Unsupported);
    assert_eq!(first.borderline.len(), 1);
    assert_eq!(first.borderline[0].candidates[0].0, "water#0");
    assert_eq!(
        first.borderline[0].candidates[0].1,
        "At higher altitude the boiling point is lower."
    );
    // Below the bar, or for a chunk that shares none of its content: still unsupported.
    let weak = SemanticMatches::from([(0, vec![("water#0".to_string(), SEMANTIC_SUPPORT - 0.01)])]);
    assert_eq!(
        attribute_with(&weak).report.sentences[0].verdict,
        Verdict::Unsupported
    );
    let unrelated = SemanticMatches::from([(0, vec![("raft#1".to_string(), 0.99)])]);
    assert_eq!(
        attribute_with(&unrelated).report.sentences[0].verdict,
        Verdict::Unsupported
    );
    let strong = SemanticMatches::from([(0, vec![("water#0".to_string(), 0.8)])]);
    let out = attribute_with(&strong);
    assert_eq!(out.report.sentences[0].verdict, Verdict::Supported);
    assert_eq!(out.report.sentences[0].support[0].similarity, Some(0.8));
    assert_eq!(out.citations[0].chunk_id, "water#0");
    assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-6);
    assert_eq!(cosine(&[], &[]), 0.0);
    assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
}

#[test]
fn a_number_the_chunk_does_not_hold_is_not_supported_by_it() {
    let out = run(
        "Boston's average snowfall is 38.4 inches per year.",
        &[],
        "What is the average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(out.report.sentences[0].verdict, Verdict::Unsupported);
    let out = run(
        "Water boils at 90 degrees Celsius at sea level.",
        &[],
        "When does water boil?",
        Grounding::Strict,
    );
    assert_eq!(out.report.sentences[0].verdict, Verdict::Unsupported);
    let out = run(
        "38.4 inches.",
        &[],
        "What is the average snowfall in Boston?",
        Grounding::Strict,
    );
    assert_eq!(out.report.sentences[0].verdict, Verdict::Fragment);
}

mod properties {
    use super::*;
    use crate::agent::protocol::{repair_json, scrub};
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        // Words, punctuation, markers, CJK, braces and template tokens, mixed.
        let pieces = prop::sample::select(vec![
            "Water",
            "boils",
            "at",
            "100",
            "43.8",
            "degrees",
            "e.g.",
            "J.",
            "Raft",
            "leader",
            ". ",
            "! ",
            "? ",
            "。",
            "\n",
            " ",
            "[water#0]",
            "[1]",
            "[raft#1, made#2]",
            "{",
            "}",
            "\"",
            ":",
            ",",
            "\"answer\":",
            "{\"tool\":",
            "<|im_end|>",
            "</s>",
            "<tool_call>",
            "绿茶",
            "Wasser",
            "(",
            "[",
            "]",
            "\\",
        ]);
        prop::collection::vec(pieces, 0..60).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn attribution_never_panics_and_cites_only_supporting_evidence(answer in text()) {
            for policy in [Grounding::Strict, Grounding::Flag] {
                let out = run(&answer, &["water#0", "nope#3"], "When does water boil?", policy);
                for citation in &out.citations {
                    prop_assert!(evidence().contains(&citation.chunk_id));
                    let marker = format!("[{}]", citation.n);
                    prop_assert!(out.text.contains(&marker), "{} lacks {}", out.text, marker);
                }
                for sentence in &out.report.sentences {
                    prop_assert_eq!(sentence.verdict.is_supported(), !sentence.support.is_empty()
                        || sentence.verdict == Verdict::SupportedByTool);
                }
            }
        }

        #[test]
        fn sentences_are_ordered_trimmed_slices(answer in text()) {
            let mut last = 0;
            for (start, end) in split_sentences(&answer) {
                prop_assert!(start >= last && start < end && end <= answer.len());
                let piece = &answer[start..end];
                prop_assert_eq!(piece, piece.trim());
                last = end;
            }
        }

        #[test]
        fn repair_and_scrub_never_panic_and_scrub_leaves_no_template_tokens(raw in text()) {
            let _ = repair_json(&raw);
            let cleaned = scrub(&raw);
            prop_assert!(!cleaned.contains("<|im_end|>") && !cleaned.contains("</s>"));
            prop_assert!(!cleaned.contains("<tool_call>"));
            let step = "{\"tool\":";
            prop_assert!(!cleaned.contains(step), "{}", cleaned);
        }
    }
}
