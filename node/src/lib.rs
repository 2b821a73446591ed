//! The `sift` binary's library: configuration, the HTTP API, the CLI and the demo.
//!
//! - [`config`]: layered configuration (TOML file, `SIFT_*` environment, flags).
//! - [`server`]: boots a node (model clients, actor tree) and serves [`api`].
//! - [`api`]: the public HTTP API, with one error mapping.
//! - [`auth`]: API keys and roles on every route; the admin key made at first start.
//! - [`keys_api`]: `/v1/keys`, creating, listing and revoking keys.
//! - [`chat_api`]: sessions, run event streams, OpenAI-compatible chat completions.
//! - [`console`]: the web console at `/`, its assets compiled into the binary.
//! - [`cluster`]: cluster mode (`--internal-listen`): the Raft member and `GET /v1/cluster`.
//! - [`cli`]: `sift serve | kb | ingest | search | ask | demo`; client commands talk HTTP.
//! - [`ask`]: `sift ask`, rendering a run's event stream.
//! - [`telemetry`]: logs and the Prometheus recorder.
//! - [`views`]: answers built from the actors' results (request bodies are in `sift-api`).

pub mod api;
pub mod ask;
pub mod audit;
pub mod auth;
pub mod chat_api;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod console;
pub mod demo;
pub mod fetch;
pub mod graph_api;
pub mod keys_api;
pub mod limits;
pub mod openapi;
pub mod requests;
pub mod server;
pub mod snapshots_api;
pub mod telemetry;
pub mod tenants_api;
pub mod traces;
pub mod views;

/// The `sift` binary's entry point (also used by test binaries that run the real CLI).
pub fn main_entry() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(sift_actors::ingest::parse_worker::WORKER_COMMAND) {
        // A parse worker of a node (hidden from the CLI): no logging, no runtime.
        let status = sift_actors::ingest::parse_worker::serve_worker(
            &args[1..],
            std::io::stdin().lock(),
            // Unlocked: the parse thread writes progress lines while the main one waits.
            std::io::stdout(),
        );
        return std::process::ExitCode::from(status);
    }
    cli::run()
}
