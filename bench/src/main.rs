//! `sift-bench`: measures a running Sift node from the outside, over its HTTP API only.
//!
//! - `quality` ingests a BEIR collection (`dataset`), then scores dense, BM25 and fused
//!   retrieval with nDCG@10, Recall@5/10/100 and MRR@10 (`metrics`) and client-side latency.
//! - `load` drives concurrent search traffic for a fixed time and reports QPS and latency
//!   percentiles from HDR histograms.
//! - `chat` runs concurrent chat sessions over SSE against a fake model it serves itself, and
//!   reports time to first event, first answer token and done, and the agent overhead per turn.
//!
//! `client` is a small typed client for `/v1/kbs/...`; it refuses any node that is not on a
//! loopback address, so benchmark traffic never leaves the machine.

mod chat;
mod client;
mod dataset;
mod error;
mod load;
mod metrics;
mod progress;
mod quality;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Concurrent chat sessions (SSE) against a fake model at a fixed token rate.
    Chat(chat::ChatArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let outcome = match Cli::parse().command {
        Command::Quality(args) => quality::run(args).await,
        Command::Load(args) => load::run(args).await,
        Command::Chat(args) => chat::run(args).await,
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
        assert_eq!(args.node, client::DEFAULT_NODE);
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
        assert_eq!(args.channels, [client::Channel::Bm25]);
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
