//! The command line. `serve` runs a node; every other command is an HTTP client of a node.
//!
//! Exit codes: 0 success, 1 the node refused the request (its error code and message are
//! printed), 2 bad usage, 3 the node could not be reached.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use sift_api::{CreateKb, SearchQuery};

pub use sift_client::Client;

use crate::config::Config;

#[derive(Parser, Debug)]
#[command(
    name = "sift",
    version,
    about = "Sift: agentic retrieval-augmented generation on a cluster of equal nodes"
)]
pub struct Cli {
    /// Base URL of the node client commands talk to (`http://` is assumed without a scheme).
    #[arg(
        long,
        global = true,
        env = "SIFT_NODE",
        default_value = "http://127.0.0.1:7700"
    )]
    pub node: String,
    /// API key of client commands [default: DATA_DIR/admin.key when --node is on this
    /// machine, DATA_DIR being SIFT_DATA_DIR or ./sift-data].
    #[arg(long, global = true, env = "SIFT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// PEM file of the roots an https:// node's certificate must chain to (client commands;
    /// default: the system's roots). `sift serve` reads the same SIFT_TLS_CA as its `tls.ca`.
    #[arg(long, global = true, env = "SIFT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a node.
    #[command(
        after_help = "Examples:\n  sift serve\n  sift serve --data-dir /var/lib/sift --listen 0.0.0.0:7700\n  SIFT_CLUSTER_SECRET=s sift serve --internal-listen 10.0.0.2:7701 --join 10.0.0.1:7701"
    )]
    Serve(ServeArgs),
    /// Manage knowledge bases.
    #[command(
        subcommand,
        after_help = "Examples:\n  sift kb create papers --shards 4\n  sift kb list\n  sift kb shards papers\n  sift kb delete papers"
    )]
    Kb(KbCommand),
    /// Upload files or whole folders into a knowledge base and wait until they are indexed.
    #[command(
        after_help = "Exit status: 0 when every file was accepted and indexed, 1 when any was refused or failed (each one is printed with its reason), 3 when the node cannot be reached.\n\nExamples:\n  sift ingest papers ./docs\n  sift ingest papers report.pdf slides.pptx --no-wait\n  sift ingest papers https://example.com/guide.html"
    )]
    Ingest {
        /// The knowledge base (name or id).
        kb: String,
        /// Files and folders (walked; unsupported files are reported and skipped), and
        /// http(s) URLs of pages or files for the node to fetch.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Return after uploading instead of waiting for indexing.
        #[arg(long)]
        no_wait: bool,
    },
    /// Search a knowledge base.
    #[command(
        after_help = "Examples:\n  sift search papers \"aspirin and heart attacks\"\n  sift search papers \"BRCA1\" --channels bm25 --top-k 10 --json"
    )]
    Search {
        /// The knowledge base (name or id).
        kb: String,
        /// What to look for, in words.
        query: String,
        /// How many hits to print.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
        /// Comma-separated channels: dense, bm25.
        #[arg(long)]
        channels: Option<String>,
        /// Print the raw JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Ask a question over one or more knowledge bases (comma-separated) and watch the agent
    /// work: thoughts dimmed, tool calls, then the answer and its numbered sources.
    #[command(
        after_help = "Examples:\n  sift ask papers \"What does aspirin do to heart attack risk?\"\n  sift ask papers,notes \"Compare the two studies\" --agent brief\n  sift ask papers \"And in women?\" --session SESSION_ID"
    )]
    Ask {
        /// The knowledge bases (names or ids, comma-separated).
        kb: String,
        /// The question.
        question: String,
        /// Agent preset.
        #[arg(long)]
        agent: Option<String>,
        /// Continue this session (a follow-up question; the session's KBs apply).
        #[arg(long)]
        session: Option<String>,
        /// Print every event as `name json` instead of rendering.
        #[arg(long)]
        raw: bool,
    },
    /// Cluster membership (cluster mode).
    #[command(subcommand, after_help = "Example:\n  sift node remove 3")]
    Node(NodeCommand),
    /// Show the cluster: leader, term, members, roles and health.
    #[command(after_help = "Example:\n  sift --node http://10.0.0.1:7700 cluster")]
    Cluster,
    /// Snapshots of knowledge bases on the node (operators).
    #[command(
        subcommand,
        after_help = "Examples:\n  sift snapshot create papers notes\n  sift snapshot list"
    )]
    Snapshot(SnapshotCommand),
    /// Bring a snapshot up as the data directory of a new single-node cluster (offline: no
    /// node runs on DATA_DIR; start one on it afterwards with `sift serve --data-dir`).
    #[command(
        after_help = "Example:\n  sift restore sift-data/snapshots/SNAPSHOT_ID --data-dir restored && sift serve --data-dir restored"
    )]
    Restore {
        /// The snapshot's directory (one of the node's `snapshot_dir`, with manifest.json).
        snapshot: PathBuf,
        /// The new node's data directory: absent or empty.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Start a node on embedded defaults, load the sample corpus, search it and print cited hits.
    #[command(after_help = "Example (from the repository root):\n  sift demo")]
    Demo {
        /// Where the demo node keeps its data (wiped first).
        #[arg(long, default_value = ".sift-demo")]
        data_dir: PathBuf,
        /// The sample corpus.
        #[arg(long, default_value = "samples")]
        samples: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Snapshot knowledge bases (ids or names) into the node's snapshot_dir.
    Create {
        /// The knowledge bases to snapshot (ids, or names in the default tenant).
        #[arg(required = true)]
        kbs: Vec<String>,
    },
    /// The node's snapshots, newest first.
    List,
}

#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML config file (also SIFT_CONFIG).
    #[arg(long, env = "SIFT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory (also SIFT_DATA_DIR; default ./sift-data).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// HOST:PORT to listen on (also SIFT_LISTEN; default 127.0.0.1:7700).
    #[arg(long)]
    pub listen: Option<String>,
    /// Cluster mode: HOST:PORT of the internal Raft server (also SIFT_INTERNAL_LISTEN). The
    /// cluster secret comes from SIFT_CLUSTER_SECRET or the config file.
    #[arg(long)]
    pub internal_listen: Option<String>,
    /// Cluster mode: join the cluster of the member at ADDR (its public or internal address;
    /// also SIFT_JOIN). Without it a new cluster is bootstrapped (or a member restarts).
    #[arg(long, value_name = "ADDR")]
    pub join: Option<String>,
    /// Largest accepted upload in bytes (also SIFT_MAX_UPLOAD_BYTES).
    #[arg(long)]
    pub max_upload_bytes: Option<u64>,
    /// Folder of the embedded model (also SIFT_MODEL_DIR).
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Remove member ID from the cluster (any member accepts it). A member holding replicas is
    /// drained first: its replicas are re-created on other nodes, then it is removed.
    Remove {
        /// The member's node id (`sift cluster` lists them).
        id: u64,
        /// Remove at once, without draining (its replicas there are lost where they have no
        /// other copy).
        #[arg(long)]
        force: bool,
        /// Return once draining started instead of waiting for the removal.
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum KbCommand {
    /// Create a knowledge base.
    Create {
        /// Its name: 1–64 of a-z 0-9 - _, unique in the tenant.
        name: String,
        /// Shards (1–64; default 2).
        #[arg(long)]
        shards: Option<u32>,
        /// Copies of each shard on distinct nodes (default: min(3, nodes)).
        #[arg(long)]
        replication_factor: Option<u32>,
        /// Target chunk size in cl100k tokens.
        #[arg(long)]
        chunk_tokens: Option<u32>,
        /// Tokens each chunk repeats from the one before.
        #[arg(long)]
        chunk_overlap_tokens: Option<u32>,
        /// `all-MiniLM-L6-v2` (embedded, the default) or a configured remote embedder's name;
        /// fixed once created.
        #[arg(long)]
        embedding_model: Option<String>,
        /// The documents' language (e.g. `en`, `zh`).
        #[arg(long)]
        language: Option<String>,
    },
    /// List knowledge bases with document counts.
    List,
    /// Show one knowledge base.
    Get {
        /// The knowledge base (name or id).
        kb: String,
    },
    /// Show where a knowledge base's shard replicas live and their states.
    Shards {
        /// The knowledge base (name or id).
        kb: String,
    },
    /// Delete a knowledge base and all its documents.
    Delete {
        /// The knowledge base (name or id).
        kb: String,
    },
}

/// An error from a client command, with its exit code.
#[derive(Debug)]
pub enum CliError {
    /// The node answered with an error.
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// The node could not be reached.
    Unreachable(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> Self {
        CliError::Other(error)
    }
}

impl From<sift_client::Error> for CliError {
    fn from(error: sift_client::Error) -> Self {
        match error {
            sift_client::Error::Api { error, .. } => CliError::Refused {
                status: error.status.as_u16(),
                code: if error.code == sift_client::NO_CODE {
                    "unknown".to_string()
                } else {
                    error.code
                },
                message: error.message,
            },
            error @ sift_client::Error::Transport { .. } => {
                CliError::Unreachable(error.to_string())
            }
            error => CliError::Other(error.into()),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Refused {
                status,
                code,
                message,
            } => write!(f, "error {status} {code}: {message}"),
            CliError::Unreachable(message) => write!(
                f,
                "cannot reach the node: {message}\n\
                 hint: is a node running there? Start one with `sift serve`, or point --node \
                 (or SIFT_NODE) at a running node"
            ),
            CliError::Other(error) => write!(f, "error: {error:#}"),
        }
    }
}

pub fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Only a node exports traces; the client commands log to stderr alone.
    let serving = matches!(cli.command, Command::Serve(_));
    if let Err(error) = crate::telemetry::init_logging(serving) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(dispatch(cli));
    crate::traces::shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            match error {
                CliError::Refused { .. } | CliError::Other(_) => ExitCode::from(1),
                CliError::Unreachable(_) => ExitCode::from(3),
            }
        }
    }
}

/// `--node` as a base URL: `127.0.0.1:7700` or `localhost:7700` without a scheme means
/// `http://`.
pub fn node_url(node: &str) -> String {
    let node = node.trim().trim_end_matches('/');
    if node.contains("://") {
        node.to_string()
    } else {
        format!("http://{node}")
    }
}

async fn dispatch(mut cli: Cli) -> Result<(), CliError> {
    cli.node = node_url(&cli.node);
    let api_key = cli.api_key.clone().or_else(|| local_admin_key(&cli.node));
    let roots = match &cli.tls_ca {
        Some(path) => sift_cluster::tls::read_roots(path).map_err(|e| CliError::Other(e.into()))?,
        None => Vec::new(),
    };
    let client = client_with_roots(&cli.node, api_key, roots);
    match cli.command {
        Command::Serve(args) => serve(args).await.map_err(CliError::Other),
        Command::Kb(command) => kb(&client, command).await,
        Command::Node(NodeCommand::Remove { id, force, no_wait }) => {
            let answer: Value = client.remove_node(id, force).await?;
            if answer.get("draining").is_none() {
                println!("removed node {id}; voters now {}", answer["voters"]);
                return Ok(());
            }
            println!("{}", answer["message"].as_str().unwrap_or("draining"));
            if no_wait {
                return Ok(());
            }
            let started = std::time::Instant::now();
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let view: Value = client.cluster().await?;
                let present = view["nodes"]
                    .as_array()
                    .is_some_and(|nodes| nodes.iter().any(|n| n["id"] == id));
                if !present {
                    println!("removed node {id} after {}s", started.elapsed().as_secs());
                    return Ok(());
                }
            }
        }
        Command::Snapshot(SnapshotCommand::Create { kbs }) => {
            let answer: Value = client.create_snapshot(&kbs).await?;
            println!(
                "snapshot {} ({} bytes) at {}",
                answer["id"].as_str().unwrap_or("?"),
                answer["bytes"],
                answer["path"].as_str().unwrap_or("?")
            );
            Ok(())
        }
        Command::Snapshot(SnapshotCommand::List) => {
            let answer: Value = client.list_snapshots().await?;
            for snapshot in answer["snapshots"].as_array().into_iter().flatten() {
                let kbs: Vec<&str> = snapshot["manifest"]["kbs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|kb| kb["name"].as_str())
                    .collect();
                println!(
                    "{}  {} bytes  {}",
                    snapshot["id"].as_str().unwrap_or("?"),
                    snapshot["bytes"],
                    kbs.join(",")
                );
            }
            Ok(())
        }
        Command::Restore { snapshot, data_dir } => {
            let restored = tokio::task::spawn_blocking(move || {
                sift_actors::node::snapshots::restore(&snapshot, &data_dir)
                    .map(|restored| (restored, data_dir))
            })
            .await
            .map_err(|error| CliError::Other(error.into()))?
            .map_err(|error| CliError::Other(anyhow::anyhow!("restore failed: {error}")))?;
            let (restored, data_dir) = restored;
            let names: Vec<&str> = restored
                .manifest
                .kbs
                .iter()
                .map(|kb| kb.name.as_str())
                .collect();
            println!(
                "restored snapshot {} ({}) into {}: {} documents ready, {} queued to ingest again, {} failed (not_in_snapshot)",
                restored.manifest.id,
                names.join(", "),
                data_dir.display(),
                restored.summary.ready,
                restored.summary.requeued,
                restored.summary.failed
            );
            println!(
                "start it with: sift serve --data-dir {}",
                data_dir.display()
            );
            Ok(())
        }
        Command::Cluster => {
            let answer: Value = client.cluster().await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
            Ok(())
        }
        Command::Ingest { kb, paths, no_wait } => {
            let ingested = ingest(&client, &kb, &paths, !no_wait).await?;
            if ingested.refused + ingested.failed > 0 {
                // Each one was named above; the exit status tells a script.
                return Err(CliError::Other(anyhow::anyhow!(
                    "{} file(s) refused, {} failed",
                    ingested.refused,
                    ingested.failed
                )));
            }
            Ok(())
        }
        Command::Search {
            kb,
            query,
            top_k,
            channels,
            json,
        } => {
            let channels: Option<Vec<String>> = channels.map(|c| {
                c.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            });
            let answer = search(&client, &kb, &query, top_k, channels).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&answer).unwrap_or_default()
                );
            } else {
                print_hits(&query, &answer);
            }
            Ok(())
        }
        Command::Ask {
            kb,
            question,
            agent,
            session,
            raw,
        } => {
            let kbs: Vec<String> = kb
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            crate::ask::ask(
                &client,
                &kbs,
                &question,
                agent.as_deref(),
                session.as_deref(),
                raw,
            )
            .await
        }
        Command::Demo { data_dir, samples } => crate::demo::run(&data_dir, &samples).await,
    }
}

/// Builds the layered config for `sift serve`: file, then environment, then flags.
pub fn serve_config(args: &ServeArgs) -> anyhow::Result<Config> {
    // `vars_os`: a variable that is not UTF-8 is skipped here, not a panic (SIFT_OCR_TESSERACT
    // is read as the OS gives it by `Config::load`).
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("SIFT_"))
        .collect();
    let mut file = Config::load(args.config.as_deref(), &env)?;
    if let Some(dir) = &args.data_dir {
        file.data_dir = Some(dir.clone());
    }
    if let Some(listen) = &args.listen {
        file.listen = Some(listen.clone());
    }
    if let Some(internal) = &args.internal_listen {
        file.internal_listen = Some(internal.clone());
    }
    if let Some(join) = &args.join {
        file.join = Some(join.clone());
    }
    if let Some(limit) = args.max_upload_bytes {
        file.max_upload_bytes = Some(limit);
    }
    if let Some(dir) = &args.model_dir {
        file.embedding.model_dir = Some(dir.clone());
    }
    let mut config = Config::check(file)?;
    parse_pdfs_in_workers(&mut config);
    Ok(config)
}

/// A node run from the `sift` binary parses each PDF in a child process of that binary
/// (`sift __parse pdf ...`; an `.xls` workbook too, ADR 0030), killed at the parse budget
/// (ADR 0024). Nodes inside other programs
/// (tests) keep the guarded thread: their binary is no parse worker.
pub fn parse_pdfs_in_workers(config: &mut Config) {
    match std::env::current_exe() {
        Ok(program) => config.options.pdf_limits.worker = Some(program),
        Err(error) => {
            tracing::warn!(%error, "PDFs are parsed on a thread: the binary's path is unknown")
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = serve_config(&args)?;
    let running = crate::server::start(config).await?;
    // Scripts read this line to learn the bound address (useful with port 0).
    println!("sift listening on {}", running.url());
    let failure = tokio::select! {
        _ = shutdown_signal() => None,
        failure = running.storage_failure() => Some(failure),
    };
    let Some(failure) = failure else {
        tracing::info!("shutting down");
        running.shutdown().await;
        return Ok(());
    };
    // The metadata of this member can no longer move: exit with a status of its own so that a
    // supervisor restarts it (once the disk has room) instead of it serving stale metadata.
    tracing::error!(%failure, "raft storage failed, exiting");
    let _ = tokio::time::timeout(Duration::from_secs(15), running.shutdown()).await;
    eprintln!("error: the raft storage failed: {failure}");
    std::process::exit(EXIT_RAFT_STORAGE_FAILED)
}

/// The exit status of `sift serve` when its Raft storage failed (EX_SOFTWARE).
pub const EXIT_RAFT_STORAGE_FAILED: i32 = 70;

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}

async fn kb(client: &Client, command: KbCommand) -> Result<(), CliError> {
    match command {
        KbCommand::Create {
            name,
            shards,
            replication_factor,
            chunk_tokens,
            chunk_overlap_tokens,
            embedding_model,
            language,
        } => {
            let body = CreateKb {
                name,
                shards,
                replication_factor,
                chunk_tokens,
                chunk_overlap_tokens,
                embedding_model,
                language,
                ..CreateKb::default()
            };
            let kb: Value = client.create_kb(&body).await?;
            println!(
                "created knowledge base {} ({})",
                kb["name"].as_str().unwrap_or(""),
                kb["id"].as_str().unwrap_or("")
            );
        }
        KbCommand::List => {
            // Every page, in creation order; the header once the node answered.
            let mut after: Option<String> = None;
            loop {
                let answer: Value = client.list_kbs(1000, after.as_deref()).await?;
                if after.is_none() {
                    println!(
                        "{:<24} {:<38} {:>6} {:>8} {:>8} {:>8}",
                        "NAME", "ID", "SHARDS", "DOCS", "READY", "FAILED"
                    );
                }
                for kb in answer["kbs"].as_array().into_iter().flatten() {
                    println!(
                        "{:<24} {:<38} {:>6} {:>8} {:>8} {:>8}",
                        kb["name"].as_str().unwrap_or(""),
                        kb["id"].as_str().unwrap_or(""),
                        kb["settings"]["shards"].as_u64().unwrap_or(0),
                        kb["documents"]["total"].as_u64().unwrap_or(0),
                        kb["documents"]["ready"].as_u64().unwrap_or(0),
                        kb["documents"]["failed"].as_u64().unwrap_or(0),
                    );
                }
                match answer["next_after"].as_str() {
                    Some(next) => after = Some(next.to_string()),
                    None => break,
                }
            }
        }
        KbCommand::Get { kb } => {
            let answer: Value = client.get_kb(&kb).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&answer).unwrap_or_default()
            );
        }
        KbCommand::Shards { kb } => {
            let answer: Value = client.kb_shards(&kb).await?;
            println!(
                "{:>5} {:>5} {:<12} {:>9} {:>9}",
                "SHARD", "NODE", "STATE", "DOCS", "CHUNKS"
            );
            for shard in answer["shards"].as_array().into_iter().flatten() {
                for replica in shard["replicas"].as_array().into_iter().flatten() {
                    let count = |key: &str| {
                        replica[key]
                            .as_u64()
                            .map_or("?".to_string(), |n| n.to_string())
                    };
                    println!(
                        "{:>5} {:>5} {:<12} {:>9} {:>9}",
                        shard["shard"].as_u64().unwrap_or(0),
                        replica["node"].as_u64().unwrap_or(0),
                        replica["state"].as_str().unwrap_or(""),
                        count("documents"),
                        count("chunks"),
                    );
                }
            }
        }
        KbCommand::Delete { kb } => {
            client.delete_kb(&kb).await?;
            println!("deleted knowledge base {kb}");
        }
    }
    Ok(())
}

/// File extensions `ingest` picks up when walking a folder: every type the node parses.
const INGESTED_EXTENSIONS: &[&str] = sift_actors::ingest::parse::SUPPORTED_EXTENSIONS;

/// The files to upload: named files as they are, folders walked for files with an
/// [`INGESTED_EXTENSIONS`] extension; and how many files met in a folder were refused. An
/// old binary Word or PowerPoint file is a document Sift cannot read: named on stderr as
/// refused (`unsupported_type`, as the node would answer) and counted. Any other file is named
/// as skipped (hidden files, dot-files, are passed over without a word).
fn collect_files(paths: &[PathBuf]) -> anyhow::Result<(Vec<PathBuf>, usize)> {
    let mut files = Vec::new();
    let mut refused = 0;
    for path in paths {
        let metadata = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        if metadata.is_dir() {
            let mut stack = vec![path.clone()];
            while let Some(dir) = stack.pop() {
                let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .with_context(|| format!("{}", dir.display()))?
                    .filter_map(|entry| entry.ok().map(|e| e.path()))
                    .collect();
                entries.sort();
                for entry in entries {
                    if entry.is_dir() {
                        stack.push(entry);
                    } else if entry.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        INGESTED_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())
                    }) {
                        files.push(entry);
                    } else if !entry
                        .file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| name.starts_with('.'))
                    {
                        let name = entry.to_string_lossy();
                        match sift_actors::ingest::office::legacy_office_format(&name) {
                            Some(format) => {
                                refused += 1;
                                eprintln!(
                                    "{}: refused: unsupported_type: {}",
                                    entry.display(),
                                    sift_actors::ingest::office::legacy_office_message(
                                        format,
                                        sift_actors::ingest::office::legacy_save_as(format)
                                    )
                                );
                            }
                            None => eprintln!(
                                "{}: skipped: not a supported type ({})",
                                entry.display(),
                                INGESTED_EXTENSIONS
                                    .iter()
                                    .map(|e| format!(".{e}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        }
                    }
                }
            }
        } else {
            files.push(path.clone()); // named explicitly: let the node judge the type
        }
    }
    Ok((files, refused))
}

/// What `ingest` did.
#[derive(Debug, Default)]
pub struct Ingested {
    /// The document ids of the accepted files.
    pub ids: Vec<String>,
    /// Files the node refused and old binary Office files met in a folder (each named on
    /// stderr with its reason).
    pub refused: usize,
    /// Accepted files that failed in the pipeline (when waited for).
    pub failed: usize,
}

/// A line above the progress bar, or on stderr when the bar is hidden (not a terminal:
/// indicatif then drops its lines, and a script must still read each refusal).
fn report(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Uploads every file, then (when `wait`) shows a progress bar until all are ready or failed.
pub async fn ingest(
    client: &Client,
    kb: &str,
    paths: &[PathBuf],
    wait: bool,
) -> Result<Ingested, CliError> {
    // http(s) arguments are pages for the node to fetch; the rest are files and folders.
    let (urls, paths): (Vec<&PathBuf>, Vec<&PathBuf>) = paths.iter().partition(|path| {
        path.to_str()
            .is_some_and(|text| text.starts_with("http://") || text.starts_with("https://"))
    });
    let paths: Vec<PathBuf> = paths.into_iter().cloned().collect();
    let (files, mut refused) = collect_files(&paths)?;
    if files.is_empty() && urls.is_empty() && refused == 0 {
        return Err(CliError::Other(anyhow::anyhow!("no files to ingest")));
    }
    let bar = ProgressBar::new((files.len() + urls.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("uploading");
    let mut ids = Vec::new();
    for url in urls {
        let url = url.to_string_lossy().into_owned();
        let answer: Result<Value, CliError> = client
            .add_urls(kb, std::slice::from_ref(&url))
            .await
            .map_err(Into::into);
        match answer {
            Ok(answer) => {
                let doc = &answer["documents"][0];
                if let Some(id) = doc["id"].as_str() {
                    ids.push(id.to_string());
                }
                if doc["duplicate"] == json!(true) {
                    report(&bar, format!("{url}: already in the knowledge base"));
                }
            }
            Err(CliError::Refused { code, message, .. }) => {
                refused += 1;
                report(&bar, format!("{url}: refused: {code}: {message}"));
            }
            Err(error) => {
                bar.finish_and_clear();
                return Err(error);
            }
        }
        bar.inc(1);
    }
    for file in &files {
        match upload(client, kb, file).await {
            Ok(answer) => {
                let doc = &answer["documents"][0];
                if let Some(id) = doc["id"].as_str() {
                    ids.push(id.to_string());
                }
                if doc["duplicate"] == json!(true) {
                    report(
                        &bar,
                        format!("{}: already in the knowledge base", file.display()),
                    );
                }
            }
            Err(CliError::Refused { code, message, .. }) => {
                refused += 1;
                report(
                    &bar,
                    format!("{}: refused: {code}: {message}", file.display()),
                );
            }
            Err(error) => {
                bar.finish_and_clear();
                return Err(error);
            }
        }
        bar.inc(1);
    }
    if !wait {
        bar.finish_with_message("uploaded");
        if refused > 0 {
            eprintln!("{} uploaded, {refused} refused", ids.len());
        }
        return Ok(Ingested {
            ids,
            refused,
            failed: 0,
        });
    }
    bar.set_position(0);
    bar.set_length(ids.len() as u64);
    bar.set_message("indexing");
    let mut pending: Vec<String> = ids.clone();
    let mut failed = 0;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for id in pending {
            let doc: Result<Value, CliError> = client.document(kb, &id).await.map_err(Into::into);
            match doc {
                Ok(doc) => match doc["status"].as_str() {
                    Some("ready") => bar.inc(1),
                    Some("failed") => {
                        failed += 1;
                        report(
                            &bar,
                            format!(
                                "{}: failed: {}",
                                doc["title"].as_str().unwrap_or(&id),
                                doc["error"].as_str().unwrap_or("no reason given")
                            ),
                        );
                        bar.inc(1);
                    }
                    _ => still.push(id),
                },
                Err(CliError::Refused { status: 404, .. }) => bar.inc(1), // deleted meanwhile
                Err(error) => return Err(error),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    bar.finish_with_message("done");
    eprintln!(
        "{} ready, {failed} failed, {refused} refused",
        ids.len() - failed
    );
    Ok(Ingested {
        ids,
        refused,
        failed,
    })
}

/// Where a hit or citation lies: `page 2` or `pages 2–3` (and its chars) when its document
/// has pages, `slide 2` or `slides 2–3` when they are a deck's slides, else its chars.
pub(crate) fn place(item: &Value) -> String {
    let chars = format!("chars {}–{}", item["span"][0], item["span"][1]);
    let pages = &item["pages"];
    let (one, many) = if on_slides(item) {
        ("slide", "slides")
    } else {
        ("page", "pages")
    };
    match (pages["first"].as_u64(), pages["last"].as_u64()) {
        (Some(first), Some(last)) if first == last => format!("{one} {first}, {chars}"),
        (Some(first), Some(last)) => format!("{many} {first}–{last}, {chars}"),
        _ => chars,
    }
}

/// Whether the pages of a hit or citation are a deck's slides. Neither names a format, but a
/// deck's Markdown gives every slide the heading `# Slide N: title` (ADR 0026), and only a
/// slide's chunks start their heading path with the heading of their first page. (A citation
/// of a turn stored before citations carried their heading path says `page`.)
fn on_slides(item: &Value) -> bool {
    let Some(first) = item["pages"]["first"].as_u64() else {
        return false;
    };
    item["heading_path"][0].as_str().is_some_and(|heading| {
        heading
            .strip_prefix("Slide ")
            .map(|rest| rest.split(':').next().unwrap_or_default())
            .is_some_and(|number| number == first.to_string())
    })
}

pub fn print_hits(query: &str, answer: &Value) {
    println!("\n? {query}");
    let hits = answer["hits"].as_array().cloned().unwrap_or_default();
    if hits.is_empty() {
        println!("  (no hits)");
    }
    for (n, hit) in hits.iter().enumerate() {
        let title = hit["title"].as_str().unwrap_or("");
        // The heading path usually starts with the document's title (its H1): show it once.
        let heading: Vec<&str> = hit["heading_path"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .skip_while(|heading| *heading == title)
            .collect();
        let text = hit["text"].as_str().unwrap_or("");
        let body = text
            .strip_prefix("[Context:")
            .and_then(|rest| rest.split_once('\n').map(|(_, body)| body))
            .unwrap_or(text);
        let snippet: String = body
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(160)
            .collect();
        let channels = hit["channels"]
            .as_object()
            .map(|c| {
                c.iter()
                    .map(|(name, info)| format!("{name} #{}", info["rank"]))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!(
            "  [{}] {}{} (score {:.4}; {channels})",
            n + 1,
            title,
            if heading.is_empty() {
                String::new()
            } else {
                format!(" › {}", heading.join(" › "))
            },
            hit["score"].as_f64().unwrap_or(0.0),
        );
        println!("      \"{snippet}…\"");
        println!(
            "      cite: {} {}",
            hit["chunk_id"].as_str().unwrap_or(""),
            place(hit)
        );
    }
    if let Some(failed) = answer["failed_shards"].as_array().filter(|f| !f.is_empty()) {
        println!(
            "  partial: {} shard(s) failed: {}",
            failed.len(),
            Value::Array(failed.clone())
        );
    }
}

/// The admin key a node on this machine wrote to its data dir (`SIFT_DATA_DIR`, else
/// `./sift-data`), when `node` is a loopback address and the file is there.
fn local_admin_key(node: &str) -> Option<String> {
    let host = reqwest::Url::parse(node).ok()?.host_str()?.to_string();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return None;
    }
    let data_dir = std::env::var_os("SIFT_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_DATA_DIR));
    crate::auth::read_key_file(&crate::auth::admin_key_path(&data_dir))
}

/// The client of the node at `base` for the CLI's commands.
pub fn client(base: &str, api_key: Option<String>) -> Client {
    client_with_roots(base, api_key, Vec::new())
}

/// [`client`], trusting only `roots` for https:// (the system's roots when empty).
pub fn client_with_roots(
    base: &str,
    api_key: Option<String>,
    roots: Vec<reqwest::Certificate>,
) -> Client {
    // Bounds a whole request, event streams of `ask` included (runs have their own
    // deadline, 300 s by default).
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(900));
    if !roots.is_empty() {
        builder = builder.tls_certs_only(roots);
    }
    Client::with_http(base, api_key, builder.build().unwrap_or_default())
}

/// Uploads one file (its name as the document's file name).
async fn upload(client: &Client, kb: &str, file: &Path) -> Result<Value, CliError> {
    let bytes = tokio::fs::read(file)
        .await
        .with_context(|| format!("reading {}", file.display()))?;
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("upload");
    Ok(client.upload(kb, name, bytes).await?)
}

pub async fn search(
    client: &Client,
    kb: &str,
    query: &str,
    top_k: usize,
    channels: Option<Vec<String>>,
) -> Result<Value, CliError> {
    let body = SearchQuery {
        top_k: Some(top_k),
        channels,
        ..SearchQuery::new(query)
    };
    Ok(client.search(kb, &body).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_deck_hit_says_slide_and_a_pdf_hit_says_page() {
        let slide = serde_json::json!({
            "span": [10, 20],
            "pages": {"first": 2, "last": 2},
            "heading_path": ["Slide 2: Storage Engine"],
        });
        assert_eq!(place(&slide), "slide 2, chars 10–20");
        let slides = serde_json::json!({
            "span": [10, 90],
            "pages": {"first": 3, "last": 4},
            "heading_path": ["Slide 3"],
        });
        assert_eq!(place(&slides), "slides 3–4, chars 10–90");
        let pdf = serde_json::json!({
            "span": [0, 5],
            "pages": {"first": 7, "last": 8},
            "heading_path": ["Slide rules", "History"],
        });
        assert_eq!(place(&pdf), "pages 7–8, chars 0–5");
        let text = serde_json::json!({"span": [0, 5], "pages": null, "heading_path": []});
        assert_eq!(place(&text), "chars 0–5");
    }

    /// Every argument of every command explains itself, and every command a user runs shows
    /// examples (its own, or its parent's for `sift kb create` and the like).
    #[test]
    fn every_argument_has_help_and_every_command_examples() {
        fn walk(
            command: &clap::Command,
            path: &str,
            parent_examples: bool,
            missing: &mut Vec<String>,
        ) {
            let examples = parent_examples
                || command
                    .get_after_help()
                    .is_some_and(|help| help.to_string().contains("Example"));
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg
                    .get_help()
                    .is_none_or(|help| help.to_string().trim().is_empty())
                {
                    missing.push(format!("{path} {id}: no help"));
                }
            }
            let mut subcommands = command.get_subcommands().peekable();
            if subcommands.peek().is_none() && !examples && path != "sift" {
                missing.push(format!("{path}: no examples"));
            }
            for sub in command.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                walk(
                    sub,
                    &format!("{path} {}", sub.get_name()),
                    examples,
                    missing,
                );
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "sift", false, &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
    }

    #[test]
    fn a_node_without_a_scheme_is_http() {
        assert_eq!(node_url("127.0.0.1:7700"), "http://127.0.0.1:7700");
        assert_eq!(node_url("localhost:7700/"), "http://localhost:7700");
        assert_eq!(
            node_url("https://sift.example:443"),
            "https://sift.example:443"
        );
    }
}
