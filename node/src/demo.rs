//! `sift demo`: the README's first command. A single node on embedded defaults, the sample
//! corpus that ships in the repo, a few searches with cited hits, and one question answered by
//! an agent run (extractive and cited, since no LLM is configured) — all over the real HTTP API.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;
use sift_api::CreateKb;

use crate::cli::{CliError, Client, ingest, print_hits, search};
use crate::config::{Config, FileConfig};

/// Questions asked of the sample corpus (English and Chinese).
const QUERIES: [&str; 5] = [
    "How does a Raft leader get elected?",
    "what is the ef parameter of an HNSW index",
    "Why should a retrieval system fuse BM25 with dense vectors?",
    "绿茶和红茶的区别是什么？",
    "How do I keep a code block intact when chunking?",
];

pub async fn run(data_dir: &Path, samples: &Path) -> Result<(), CliError> {
    if !samples.is_dir() {
        return Err(CliError::Other(anyhow::anyhow!(
            "sample corpus {} not found: run the demo from the repository root",
            samples.display()
        )));
    }
    if data_dir.exists() {
        std::fs::remove_dir_all(data_dir)
            .with_context(|| format!("wiping {}", data_dir.display()))?;
    }
    let file = FileConfig {
        data_dir: Some(data_dir.to_path_buf()),
        listen: Some("127.0.0.1:0".into()),
        ..FileConfig::default()
    };
    let mut file = file;
    file.embedding.model_dir = std::env::var_os("SIFT_MODEL_DIR").map(Into::into);
    let mut config = Config::check(file)?;
    crate::cli::parse_pdfs_in_workers(&mut config);
    let running = crate::server::start(config).await?;
    println!(
        "sift demo: a node on {} with data in {}",
        running.url(),
        data_dir.display()
    );
    // The key the node made at its first start.
    let key = crate::auth::read_key_file(&crate::auth::admin_key_path(data_dir));
    let outcome = demo(&crate::cli::client(&running.url(), key), samples, data_dir).await;
    running.shutdown().await;
    outcome
}

async fn demo(client: &Client, samples: &Path, data_dir: &Path) -> Result<(), CliError> {
    let ready: Value = client.readyz().await?;
    if ready["embedded_model"].is_null() {
        return Err(CliError::Other(anyhow::anyhow!(
            "the embedded model is not available: {}",
            ready["embedded_model_error"]
        )));
    }
    client
        .create_kb::<Value>(&CreateKb {
            name: "demo".into(),
            shards: Some(2),
            ..CreateKb::default()
        })
        .await?;
    println!(
        "created knowledge base demo (2 shards); ingesting {}",
        samples.display()
    );
    let ids = ingest(client, "demo", &[samples.to_path_buf()], true)
        .await?
        .ids;
    let kb: Value = client.get_kb("demo").await?;
    println!(
        "{} documents: {} ready, {} failed",
        ids.len(),
        kb["documents"]["ready"],
        kb["documents"]["failed"]
    );
    for query in QUERIES {
        let answer = search(client, "demo", query, 3, None).await?;
        print_hits(query, &answer);
    }
    println!("\n== an agent run (no LLM configured: the answer is extractive, with sources) ==");
    crate::ask::ask(client, &["demo".to_string()], QUERIES[0], None, None, false).await?;
    let data_dir = data_dir.display();
    println!(
        "\nsearch the demo KB yourself: sift serve --data-dir {data_dir}, then (the CLI finds the \
         node's key in SIFT_DATA_DIR/admin.key) SIFT_DATA_DIR={data_dir} sift search demo \"your \
         question\" or SIFT_DATA_DIR={data_dir} sift ask demo \"your question\" (set \
         SIFT_LLM_BASE_URL and SIFT_LLM_MODEL on sift serve for an LLM agent)"
    );
    Ok(())
}
