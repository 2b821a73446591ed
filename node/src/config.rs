//! Node configuration: one serde struct, layered file -> `SIFT_*` environment -> CLI flags,
//! checked into [`Config`] with defaults that run on a laptop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use sift_actors::NodeOptions;

/// The config file's shape. Every field is optional; unknown fields are an error.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    /// Largest accepted upload, in bytes.
    pub max_upload_bytes: Option<u64>,
    /// Largest accepted JSON body, in bytes.
    pub max_json_bytes: Option<u64>,
    pub shard_deadline_ms: Option<u64>,
    pub search_permits_per_shard: Option<usize>,
    pub ingest_queue_capacity: Option<usize>,
    pub ingest_workers: Option<usize>,
    /// Fault injection endpoints, for tests.
    pub debug_faults: Option<bool>,
    #[serde(default)]
    pub embedding: EmbeddingFileConfig,
    /// External rerank services (`[rerank.NAME]`: base_url, api = "tei" | "cohere", model,
    /// api_key, timeout_ms), by the name KBs and requests use in `rerank_model`.
    #[serde(default)]
    pub rerank: BTreeMap<String, sift_actors::retrieval::RerankServiceConfig>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingFileConfig {
    /// Folder of the embedded sentence-transformers model.
    pub model_dir: Option<PathBuf>,
    /// Texts per forward pass of the embedded model.
    pub batch_size: Option<usize>,
    /// OpenAI-compatible embedding endpoints, by the name KBs use in `embedding_model`.
    #[serde(default)]
    pub remote: BTreeMap<String, RemoteEmbedderConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteEmbedderConfig {
    /// API root with version, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// The model name sent to the endpoint.
    pub model: String,
    pub api_key: Option<String>,
    /// Vector dimension; probed with one request when absent.
    pub dimension: Option<usize>,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub batch_size: Option<usize>,
}

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub max_upload_bytes: u64,
    pub max_json_bytes: u64,
    pub options: NodeOptions,
    pub embedding: EmbeddingFileConfig,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
pub const DEFAULT_DATA_DIR: &str = "sift-data";

impl Config {
    /// Loads `path` (if any), applies `SIFT_*` variables from `env`, then checks.
    pub fn load(path: Option<&Path>, env: &BTreeMap<String, String>) -> anyhow::Result<FileConfig> {
        let mut file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str::<FileConfig>(&text)
                    .with_context(|| format!("parsing config file {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let get = |name: &str| env.get(name).filter(|v| !v.is_empty()).cloned();
        let parse = |name: &str| -> anyhow::Result<Option<u64>> {
            get(name)
                .map(|v| {
                    v.parse::<u64>()
                        .with_context(|| format!("{name} must be a number"))
                })
                .transpose()
        };
        if let Some(v) = get("SIFT_DATA_DIR") {
            file.data_dir = Some(v.into());
        }
        if let Some(v) = get("SIFT_LISTEN") {
            file.listen = Some(v);
        }
        if let Some(v) = parse("SIFT_MAX_UPLOAD_BYTES")? {
            file.max_upload_bytes = Some(v);
        }
        if let Some(v) = parse("SIFT_SHARD_DEADLINE_MS")? {
            file.shard_deadline_ms = Some(v);
        }
        if let Some(v) = parse("SIFT_INGEST_QUEUE_CAPACITY")? {
            file.ingest_queue_capacity = Some(v as usize);
        }
        if let Some(v) = parse("SIFT_INGEST_WORKERS")? {
            file.ingest_workers = Some(v as usize);
        }
        if let Some(v) = get("SIFT_DEBUG_FAULTS") {
            file.debug_faults = Some(matches!(v.as_str(), "1" | "true" | "yes"));
        }
        if let Some(v) = get("SIFT_MODEL_DIR") {
            file.embedding.model_dir = Some(v.into());
        }
        Ok(file)
    }

    /// Checks a layered config and fills defaults.
    pub fn check(file: FileConfig) -> anyhow::Result<Config> {
        let listen_text = file.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().with_context(|| {
            format!("listen address {listen_text:?} is not HOST:PORT (an IP address and a port)")
        })?;
        let defaults = NodeOptions::default();
        let options = NodeOptions {
            shard_deadline: file
                .shard_deadline_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.shard_deadline),
            search_permits_per_shard: file
                .search_permits_per_shard
                .unwrap_or(defaults.search_permits_per_shard),
            ingest_queue_capacity: file
                .ingest_queue_capacity
                .unwrap_or(defaults.ingest_queue_capacity),
            ingest_workers: file.ingest_workers.unwrap_or(defaults.ingest_workers),
            shard_write_timeout: defaults.shard_write_timeout,
            debug_faults: file.debug_faults.unwrap_or(false),
            rerank: file.rerank.clone(),
        };
        if options.ingest_queue_capacity == 0
            || options.ingest_workers == 0
            || options.search_permits_per_shard == 0
        {
            bail!(
                "ingest_queue_capacity, ingest_workers and search_permits_per_shard must be at least 1"
            );
        }
        if options.shard_deadline.is_zero() {
            bail!("shard_deadline_ms must be at least 1");
        }
        for (name, remote) in &file.embedding.remote {
            if name == sift_actors::EMBEDDED_MODEL {
                bail!("remote embedder name {name:?} is reserved for the embedded model");
            }
            if !(remote.base_url.starts_with("http://") || remote.base_url.starts_with("https://"))
            {
                bail!("embedding.remote.{name}.base_url must start with http:// or https://");
            }
        }
        for (name, service) in &file.rerank {
            if name == sift_actors::retrieval::rerank::EMBEDDED_RERANKER {
                bail!("rerank service name {name:?} is reserved for the embedded re-scorer");
            }
            if !(service.base_url.starts_with("http://")
                || service.base_url.starts_with("https://"))
            {
                bail!("rerank.{name}.base_url must start with http:// or https://");
            }
        }
        Ok(Config {
            data_dir: file
                .data_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            listen,
            max_upload_bytes: file.max_upload_bytes.unwrap_or(64 * 1024 * 1024),
            max_json_bytes: file.max_json_bytes.unwrap_or(256 * 1024 * 1024),
            options,
            embedding: file.embedding,
        })
    }

    /// A config for tests: a temp data dir, port 0, fault injection on.
    pub fn for_test(data_dir: &Path) -> Config {
        let mut file = FileConfig {
            data_dir: Some(data_dir.to_path_buf()),
            listen: Some("127.0.0.1:0".into()),
            debug_faults: Some(true),
            ..FileConfig::default()
        };
        file.embedding.model_dir = std::env::var_os("SIFT_MODEL_DIR").map(PathBuf::from);
        Config::check(file).expect("the test config is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sift.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:9000\"\ndata_dir = \"/tmp/a\"\n[embedding.remote.tei]\nbase_url = \"http://127.0.0.1:8080/v1\"\nmodel = \"bge\"\n").unwrap();
        let mut env = BTreeMap::new();
        env.insert("SIFT_DATA_DIR".to_string(), "/tmp/b".to_string());
        let config = Config::check(Config::load(Some(&path), &env).unwrap()).unwrap();
        assert_eq!(config.listen.port(), 9000);
        assert_eq!(config.data_dir, PathBuf::from("/tmp/b"));
        assert!(config.embedding.remote.contains_key("tei"));
    }

    #[test]
    fn rejects_unknown_fields_and_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sift.toml");
        std::fs::write(&path, "listn = \"x\"\n").unwrap();
        let error = Config::load(Some(&path), &BTreeMap::new()).unwrap_err();
        assert!(format!("{error:#}").contains("unknown field"), "{error:#}");
        let file = FileConfig {
            listen: Some("nonsense".into()),
            ..FileConfig::default()
        };
        assert!(Config::check(file).is_err());
        let mut env = BTreeMap::new();
        env.insert("SIFT_INGEST_WORKERS".to_string(), "many".to_string());
        assert!(Config::load(None, &env).is_err());
    }
}
