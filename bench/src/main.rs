//! `sift-bench`: measures a running Sift node from the outside, over its HTTP API only.
//!
//! - `quality` ingests a BEIR collection (`dataset`), then scores dense, BM25 and fused
//!   retrieval with nDCG@10, Recall@5/10/100 and MRR@10 (`metrics`) and client-side latency.
//! - `load` drives concurrent search traffic for a fixed time and reports QPS and latency
//!   percentiles from HDR histograms.
//! - `chat` starts a fake model server at a fixed token rate and drives concurrent agent
//!   sessions (SSE) against a node using it: time to first event and to `done`, and the agent
//!   overhead per turn.
//!
//! - `answers` asks a dataset's questions through the OpenAI-compatible endpoint and scores
//!   the answers: gold-answer containment and token F1, citations against the judged
//!   passages, grounding, protocol leaks, wall time and tokens, per answer mode.
//!
//! The subcommands live in the `sift_bench` library (so the integration tests run the same
//! measurements). `client` is a small typed client for `/v1/kbs/...`; it refuses any node that is not on a
//! loopback address, so benchmark traffic never leaves the machine.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sift_bench::{answers, chat, load, quality};

#[derive(Debug, Parser)]
#[command(
    name = "sift-bench",
    version,
    about = "Quality and load benchmarks for a Sift node"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ingest a BEIR collection and score dense, BM25 and fused retrieval.
    Quality(quality::QualityArgs),
    /// Run concurrent searches for a fixed time and report QPS and latency percentiles.
    Load(load::LoadArgs),
    /// Drive concurrent agent sessions (SSE) through a fake model at a fixed token rate.
    Chat(chat::ChatArgs),
    /// Ask a dataset's questions and score the answers against its gold answers and judged
    /// passages, per answer mode (extractive, scripted model, a real model).
    Answers(answers::AnswersArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let outcome = match Cli::parse().command {
        Command::Quality(args) => quality::run(args).await,
        Command::Load(args) => load::run(args).await,
        Command::Chat(args) => chat::run(args).await,
        Command::Answers(args) => answers::run(args).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` prints the whole context chain on one line, without a backtrace.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn quality_defaults() {
        let cli =
            Cli::try_parse_from(["sift-bench", "quality", "--dataset", "data/scifact"]).unwrap();
        let Command::Quality(args) = cli.command else {
            panic!("expected quality");
        };
        assert_eq!(args.node, sift_bench::client::DEFAULT_NODE);
        assert_eq!(args.batch, 500);
        assert_eq!(args.top_k, 100);
        assert!(args.kb.is_none() && !args.reuse);
    }

    #[test]
    fn load_parses_channels_and_durations() {
        let cli = Cli::try_parse_from([
            "sift-bench",
            "load",
            "--kb",
            "scifact",
            "--queries",
            "q.txt",
            "--concurrency",
            "4",
            "--duration",
            "1.5",
            "--channels",
            "bm25",
        ])
        .unwrap();
        let Command::Load(args) = cli.command else {
            panic!("expected load");
        };
        assert_eq!(args.channels, [sift_bench::client::Channel::Bm25]);
        assert_eq!(args.duration, std::time::Duration::from_millis(1500));
        assert_eq!(args.warmup, std::time::Duration::from_secs(2));
        assert_eq!(args.top_k, 10);
        assert!(
            Cli::try_parse_from([
                "sift-bench",
                "load",
                "--kb",
                "k",
                "--queries",
                "q",
                "--concurrency",
                "1",
                "--duration",
                "1",
                "--channels",
                "sparse",
            ])
            .is_err()
        );
    }
}
