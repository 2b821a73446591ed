//! Node configuration: one serde struct, layered file -> `SIFT_*` environment -> CLI flags,
//! checked into [`Config`] with defaults that run on a laptop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use figment::value::{Dict, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;
use sift_actors::NodeOptions;
use sift_actors::agent::AgentPreset;
use sift_actors::sessions::RunLimits;
use sift_models::llm::config::LlmConfig;

use crate::auth::AuthMode;

/// The config file's shape. Every field is optional; unknown fields are an error.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    /// Where `POST /v1/snapshots` writes snapshots (default DATA_DIR/snapshots; also
    /// SIFT_SNAPSHOT_DIR).
    pub snapshot_dir: Option<PathBuf>,
    pub listen: Option<String>,
    /// Cluster mode: HOST:PORT of the internal (Raft) server. Absent: a single node.
    pub internal_listen: Option<String>,
    /// Cluster mode: any member's public or internal address, to join its cluster.
    pub join: Option<String>,
    /// The secret every member of a cluster shares (also SIFT_CLUSTER_SECRET).
    pub cluster_secret: Option<String>,
    /// `on` (default): every public route but /healthz and /readyz needs an API key. `off`:
    /// every request is served as an admin, accepted only on a loopback listen address.
    pub auth: Option<String>,
    /// An admin key to register at start instead of making one (also SIFT_ADMIN_KEY).
    pub admin_key: Option<String>,
    /// Requests one API key may make per minute on a node (default: no limit; also
    /// SIFT_RATE_LIMIT_PER_KEY).
    pub rate_limit_per_key: Option<u32>,
    /// Requests one key may make at once past its rate (default: two seconds' worth).
    pub rate_limit_burst_per_key: Option<u32>,
    /// Requests all keys of one tenant may make per minute on a node (default: no limit;
    /// also SIFT_RATE_LIMIT_PER_TENANT).
    pub rate_limit_per_tenant: Option<u32>,
    /// Requests a tenant may make at once past its rate (default: two seconds' worth).
    pub rate_limit_burst_per_tenant: Option<u32>,
    /// Days an audit log entry is kept (default 90; also SIFT_AUDIT_RETENTION_DAYS).
    pub audit_retention_days: Option<u64>,
    /// Largest accepted upload, in bytes.
    pub max_upload_bytes: Option<u64>,
    /// Largest accepted JSON body, in bytes.
    pub max_json_bytes: Option<u64>,
    /// Most documents in one bulk JSON request.
    pub max_bulk_documents: Option<usize>,
    /// KBs with their own series in the per-KB gauges of `/metrics`; the rest are summed
    /// under `kb="_other"` (default 100).
    pub metrics_max_kbs: Option<usize>,
    /// Origins (`https://app.example.com`, or `*` for any) whose browser pages may call the
    /// public API (CORS; default none; also SIFT_CORS_ORIGINS, comma-separated).
    pub cors_origins: Option<Vec<String>>,
    /// Address ranges (CIDR, `10.1.0.0/16`) that documents by URL may be fetched from although
    /// they are not public: loopback, private, link-local and the like are refused otherwise
    /// (default none; also SIFT_URL_FETCH_ALLOW, comma-separated).
    pub url_fetch_allow: Option<Vec<String>>,
    /// Host names answered before DNS when fetching URLs, like `/etc/hosts`
    /// (`{"wiki.corp" = "10.1.2.3"}`); their addresses still pass the guard (default none).
    pub url_fetch_hosts: Option<BTreeMap<String, String>>,
    /// Longest one URL fetch may take, redirects and body included (ms, default 30000).
    pub url_fetch_timeout_ms: Option<u64>,
    /// Redirects a URL fetch follows before it fails (default 5, at most 20).
    pub url_fetch_max_redirects: Option<usize>,
    /// For tests: URL fetches connect only to loopback and resolve names only through
    /// `url_fetch_hosts`; anything else fails with `outside_loopback` and is counted in
    /// `sift_url_fetch_outside_loopback_total` (default false; also
    /// SIFT_URL_FETCH_LOOPBACK_ONLY).
    pub url_fetch_loopback_only: Option<bool>,
    /// Open connections to the public port, all clients together.
    pub max_connections: Option<usize>,
    /// Open connections to the public port from one IP address.
    pub max_connections_per_ip: Option<usize>,
    /// Longest wait for a connection's first byte and for each request's headers (ms).
    pub header_read_timeout_ms: Option<u64>,
    pub shard_deadline_ms: Option<u64>,
    /// A leaf search not answered after this many ms goes to a second replica too.
    pub hedge_after_ms: Option<u64>,
    /// Longest one request of the LLM graph extractor may take (ms).
    pub graph_llm_timeout_ms: Option<u64>,
    /// Active replicas that must store a write before it is acknowledged (default 1).
    pub write_quorum: Option<u32>,
    /// Longest a write to another node's replica may take before it is marked dead (ms).
    pub replica_write_timeout_ms: Option<u64>,
    /// How often a member repairs its dead replicas and drops deleted KBs' (ms).
    pub repair_interval_ms: Option<u64>,
    /// How long the leader waits for an unresponsive ingestion worker before handing its
    /// unfinished documents to another replica (ms).
    pub reassign_after_ms: Option<u64>,
    /// How long the leader waits for a member that stopped answering before re-creating its
    /// replicas elsewhere (ms).
    pub replace_after_ms: Option<u64>,
    pub search_permits_per_shard: Option<usize>,
    pub ingest_queue_capacity: Option<usize>,
    pub ingest_workers: Option<usize>,
    /// Interrupted starts of processing after which a document fails (`crashed_processing`).
    pub ingest_max_attempts: Option<u32>,
    /// Chunks above which a document is embedded and written in slices of this many.
    pub ingest_slice_chunks: Option<usize>,
    /// Bytes from which a spreadsheet or CSV file is read a run of rows at a time.
    pub ingest_stream_bytes: Option<u64>,
    /// Spreadsheet rows one file may have, all sheets together (default 200000).
    pub sheet_max_rows: Option<usize>,
    /// Spreadsheet cells with a value one file may have (default 2000000).
    pub sheet_max_cells: Option<usize>,
    /// Bytes an Office, EPUB or spreadsheet file may inflate to (default 256 MiB).
    pub office_max_unpacked_bytes: Option<u64>,
    /// A PDF with more pages is refused with `pdf_too_large` (default 2000).
    pub pdf_max_pages: Option<usize>,
    /// Longest parsing one PDF may take before it fails with `pdf_too_large` (ms, default
    /// 120000).
    pub pdf_parse_timeout_ms: Option<u64>,
    /// Memory one PDF parse worker may take (MiB, default 1024, at least 128); a PDF that
    /// needs more fails with `pdf_too_large`.
    pub pdf_worker_memory_mb: Option<u64>,
    /// Knowledge bases the cluster may hold.
    pub max_kbs: Option<usize>,
    /// Shard replicas one node may hold.
    pub max_shards_per_node: Option<usize>,
    /// Raw bytes of documents one tenant may hold (default: no quota; also
    /// SIFT_MAX_BYTES_PER_TENANT).
    pub max_bytes_per_tenant: Option<u64>,
    /// Documents one tenant may hold (default: no quota; also SIFT_MAX_DOCUMENTS_PER_TENANT).
    pub max_documents_per_tenant: Option<u64>,
    /// Fault injection endpoints, for tests.
    pub debug_faults: Option<bool>,
    #[serde(default)]
    pub embedding: EmbeddingFileConfig,
    /// External rerank services (`[rerank.NAME]`: base_url, api = "tei" | "cohere", model,
    /// api_key, timeout_ms), by the name KBs and requests use in `rerank_model`.
    #[serde(default)]
    pub rerank: BTreeMap<String, sift_actors::retrieval::RerankServiceConfig>,
    /// Agent runs: concurrency, queue, retention of finished runs' events.
    #[serde(default)]
    pub runs: RunsFileConfig,
    /// Agent presets (`[[agents]]`); `default` exists even when not listed.
    #[serde(default)]
    pub agents: Vec<AgentPreset>,
    /// Chat model providers (`[[llm.providers]]`). None: answers are extractive.
    #[serde(default)]
    pub llm: LlmConfig,
    /// TLS on the public and internal listeners (`[tls]`: cert, key, ca).
    #[serde(default)]
    pub tls: TlsFileConfig,
    /// Text recognition of image documents (`[ocr]`).
    #[serde(default)]
    pub ocr: OcrFileConfig,
}

/// `[ocr]`: the engines that read image documents. A KB's `ocr` setting picks one (`auto`:
/// the vision model when set, else tesseract when installed).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OcrFileConfig {
    /// An OpenAI-compatible vision model's API root with version, e.g.
    /// `http://127.0.0.1:8000/v1` (also SIFT_OCR_VISION_URL). Default: none.
    pub vision_url: Option<String>,
    /// The model name sent to it (also SIFT_OCR_VISION_MODEL); needed with `vision_url`.
    pub vision_model: Option<String>,
    /// Its bearer key (also SIFT_OCR_VISION_API_KEY).
    pub vision_api_key: Option<String>,
    /// `max_tokens` of one image's transcription (default 4096).
    pub vision_max_tokens: Option<u32>,
    /// The tesseract program (default `tesseract`, used when it runs; `""` turns it off;
    /// also SIFT_OCR_TESSERACT).
    pub tesseract: Option<String>,
    /// tesseract's `-l` (default `eng`; `eng+chi_sim` with Chinese installed; also
    /// SIFT_OCR_LANGUAGES). A KB whose language is `zh` reads with `chi_sim` first when
    /// tesseract has it installed.
    pub tesseract_languages: Option<String>,
    /// The pdftoppm program that renders scanned PDF pages no one image holds (default
    /// `pdftoppm`, used when it runs; `""` turns it off; also SIFT_OCR_PDFTOPPM).
    pub pdftoppm: Option<String>,
    /// Longest one image's recognition may take, per attempt (ms, default 120000, at most
    /// 600000).
    pub timeout_ms: Option<u64>,
    /// Retries of a failure that may pass (unreachable, timeout, 429, 5xx; default 2, at most
    /// 10).
    pub retries: Option<u32>,
    /// Images recognised at once on this node (default 2, 1 to 64).
    pub max_in_flight: Option<usize>,
}

/// `[tls]`: PEM files. With `cert` and `key`, both listeners speak only TLS (reloaded on
/// SIGHUP) and this node reaches other members over HTTPS.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFileConfig {
    /// The certificate chain, leaf first (also SIFT_TLS_CERT).
    pub cert: Option<PathBuf>,
    /// Its private key (also SIFT_TLS_KEY).
    pub key: Option<PathBuf>,
    /// Roots other members' certificates must chain to (default: the system's; also
    /// SIFT_TLS_CA).
    pub ca: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunsFileConfig {
    /// Runs executing at once on this node (default 64).
    pub max_concurrent: Option<usize>,
    /// Runs that may wait for a slot (default 256); beyond that a run is `overloaded`.
    pub max_queued: Option<usize>,
    /// Longest wait for a slot, in milliseconds (default 30000).
    pub queue_timeout_ms: Option<u64>,
    /// How long a finished run's events stay available for resumption (default 600 s).
    pub retention_secs: Option<u64>,
    /// Most finished runs kept for resumption (default 10000); past it the oldest go first.
    pub max_retained: Option<usize>,
    /// Longest accepted question in characters (default 8192); longer ones get 413.
    pub max_question_chars: Option<usize>,
    /// Runs one API key may have in flight on a node (default: no cap but max_concurrent
    /// and max_queued); past it 429 `too_many_runs`.
    pub max_per_key: Option<usize>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingFileConfig {
    /// Folder of the embedded sentence-transformers model.
    pub model_dir: Option<PathBuf>,
    /// Texts per forward pass of the embedded model.
    pub batch_size: Option<usize>,
    /// Forward passes of the embedded model that may run at once, node-wide.
    pub concurrent_batches: Option<usize>,
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
    /// Where snapshots are written.
    pub snapshot_dir: PathBuf,
    pub listen: SocketAddr,
    /// Cluster mode, when set.
    pub cluster: Option<ClusterConfig>,
    pub max_upload_bytes: u64,
    pub max_json_bytes: u64,
    pub max_bulk_documents: usize,
    /// KBs with their own series in the per-KB gauges (`metrics_max_kbs`).
    pub metrics_max_kbs: usize,
    /// Origins browser pages may call from (`cors_origins`); empty: no CORS headers.
    pub cors: crate::requests::CorsOrigins,
    /// Documents by URL: the guard's allowed ranges, host names, timeout, redirects.
    pub url_fetch: crate::fetch::FetchSettings,
    /// Caps and timeouts of the public server's connections.
    pub connections: sift_cluster::http_server::ConnectionLimits,
    pub options: NodeOptions,
    pub embedding: EmbeddingFileConfig,
    pub runs: RunLimits,
    pub agents: Vec<AgentPreset>,
    pub llm: LlmConfig,
    pub auth: AuthMode,
    /// `SIFT_ADMIN_KEY`: registered as an admin key at start.
    pub admin_key: Option<String>,
    /// How long audit log entries are kept.
    pub audit_retention: Duration,
    /// Request rates per key and per tenant (none: unlimited).
    pub rate_per_key: Option<crate::limits::Rate>,
    pub rate_per_tenant: Option<crate::limits::Rate>,
    /// TLS on both listeners and to the other members; None: plain HTTP.
    pub tls: Option<sift_cluster::tls::TlsFiles>,
    /// The OCR engines as configured (tesseract is probed when the node starts).
    pub ocr: sift_models::ocr::OcrConfig,
}

/// The admin key of [`Config::for_test`] and of the test harness's nodes. Public test data:
/// never a key of a real deployment.
pub const TEST_ADMIN_KEY: &str =
    "sk-sift-7e5700000000-7e57000000000000000000000000000000000000000000a1";

/// Cluster mode: metadata is replicated with Raft between the members.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub internal_listen: SocketAddr,
    /// A member's public or internal address; None: bootstrap a new cluster (or restart).
    pub join: Option<String>,
    pub secret: String,
    /// Fault injection on the internal port (`debug_faults`): an endpoint that cuts this
    /// node's Raft traffic with given peers, for partition tests.
    pub debug_faults: bool,
}

/// The `SIFT_*` variables whose key is their name after `SIFT_` in lower case.
const ENV_KEYS: &[&str] = &[
    "SIFT_DATA_DIR",
    "SIFT_SNAPSHOT_DIR",
    "SIFT_LISTEN",
    "SIFT_INTERNAL_LISTEN",
    "SIFT_JOIN",
    "SIFT_CLUSTER_SECRET",
    "SIFT_AUTH",
    "SIFT_ADMIN_KEY",
    "SIFT_RATE_LIMIT_PER_KEY",
    "SIFT_RATE_LIMIT_PER_TENANT",
    "SIFT_AUDIT_RETENTION_DAYS",
    "SIFT_MAX_UPLOAD_BYTES",
    "SIFT_MAX_JSON_BYTES",
    "SIFT_MAX_BULK_DOCUMENTS",
    "SIFT_METRICS_MAX_KBS",
    "SIFT_CORS_ORIGINS",
    "SIFT_URL_FETCH_ALLOW",
    "SIFT_URL_FETCH_TIMEOUT_MS",
    "SIFT_URL_FETCH_MAX_REDIRECTS",
    "SIFT_URL_FETCH_LOOPBACK_ONLY",
    "SIFT_MAX_CONNECTIONS",
    "SIFT_MAX_CONNECTIONS_PER_IP",
    "SIFT_HEADER_READ_TIMEOUT_MS",
    "SIFT_SHARD_DEADLINE_MS",
    "SIFT_HEDGE_AFTER_MS",
    "SIFT_WRITE_QUORUM",
    "SIFT_REPLICA_WRITE_TIMEOUT_MS",
    "SIFT_REPAIR_INTERVAL_MS",
    "SIFT_REASSIGN_AFTER_MS",
    "SIFT_REPLACE_AFTER_MS",
    "SIFT_INGEST_QUEUE_CAPACITY",
    "SIFT_INGEST_WORKERS",
    "SIFT_INGEST_MAX_ATTEMPTS",
    "SIFT_INGEST_SLICE_CHUNKS",
    "SIFT_INGEST_STREAM_BYTES",
    "SIFT_SHEET_MAX_ROWS",
    "SIFT_SHEET_MAX_CELLS",
    "SIFT_OFFICE_MAX_UNPACKED_BYTES",
    "SIFT_PDF_MAX_PAGES",
    "SIFT_PDF_PARSE_TIMEOUT_MS",
    "SIFT_PDF_WORKER_MEMORY_MB",
    "SIFT_MAX_KBS",
    "SIFT_MAX_SHARDS_PER_NODE",
    "SIFT_MAX_BYTES_PER_TENANT",
    "SIFT_MAX_DOCUMENTS_PER_TENANT",
    "SIFT_DEBUG_FAULTS",
];

/// The `SIFT_*` variables named otherwise than their key, which is in a table.
/// SIFT_OCR_TESSERACT, SIFT_OCR_PDFTOPPM and the SIFT_LLM_* variables are read apart (see
/// [`Config::load`]).
const ENV_TABLE_KEYS: &[(&str, &str)] = &[
    ("SIFT_TLS_CERT", "tls.cert"),
    ("SIFT_TLS_KEY", "tls.key"),
    ("SIFT_TLS_CA", "tls.ca"),
    ("SIFT_OCR_VISION_URL", "ocr.vision_url"),
    ("SIFT_OCR_VISION_MODEL", "ocr.vision_model"),
    ("SIFT_OCR_VISION_API_KEY", "ocr.vision_api_key"),
    ("SIFT_OCR_LANGUAGES", "ocr.tesseract_languages"),
    ("SIFT_MODEL_DIR", "embedding.model_dir"),
    ("SIFT_MAX_CONCURRENT_RUNS", "runs.max_concurrent"),
    ("SIFT_MAX_QUEUED_RUNS", "runs.max_queued"),
    ("SIFT_RUN_QUEUE_TIMEOUT_MS", "runs.queue_timeout_ms"),
    ("SIFT_RUN_RETENTION_SECS", "runs.retention_secs"),
];

/// The variables that hold comma-separated lists.
const ENV_LISTS: &[&str] = &["SIFT_CORS_ORIGINS", "SIFT_URL_FETCH_ALLOW"];

/// Every variable of the config layer with its key (dotted under a table).
fn env_keys() -> impl Iterator<Item = (&'static str, String)> {
    let plain = ENV_KEYS
        .iter()
        .map(|name| (*name, name["SIFT_".len()..].to_ascii_lowercase()));
    plain.chain(
        ENV_TABLE_KEYS
            .iter()
            .map(|(name, key)| (*name, key.to_string())),
    )
}

/// One layer of the config for figment: its values, and metadata that names their keys in
/// errors (`max_kbs` in a file, `SIFT_MAX_KBS` in the environment).
struct Layer {
    metadata: Metadata,
    values: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<figment::value::Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
pub const DEFAULT_DATA_DIR: &str = "sift-data";

impl Config {
    /// Loads `path` (if any), applies `SIFT_*` variables from `env`, then checks.
    ///
    /// figment merges the layers (the file, then the variables of [`ENV_KEYS`] and
    /// [`ENV_TABLE_KEYS`] over it) and deserializes the result, so a bad value's error names
    /// its file key or variable. Variables are taken from `env`, not the process, so tests
    /// pass their own.
    pub fn load(path: Option<&Path>, env: &BTreeMap<String, String>) -> anyhow::Result<FileConfig> {
        let mut figment = Figment::new();
        if let Some(path) = path {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            let values: Dict = toml::from_str(&text)
                .with_context(|| format!("parsing config file {}", path.display()))?;
            let metadata = Metadata::from("config file", path)
                .interpolater(|_: &Profile, keys: &[&str]| keys.join("."));
            figment = figment.merge(Layer { metadata, values });
        }
        // Empty variables are unset (an empty SIFT_ADMIN_KEY: none).
        let set = |name: &str| env.get(name).filter(|value| !value.is_empty());
        let mut values = Dict::new();
        for (name, key) in env_keys() {
            let Some(value) = set(name) else { continue };
            // Lists are comma-separated; other values stay text that figment reads as the
            // field's type (`extract_lossy`: numbers, and true/false/yes/no/on/off/1/0).
            let value = if ENV_LISTS.contains(&name) {
                let items = value
                    .split(',')
                    .map(str::trim)
                    .filter(|item| !item.is_empty());
                Value::from(items.map(String::from).collect::<Vec<_>>())
            } else {
                Value::from(value.clone())
            };
            match key.split_once('.') {
                Some((table, field)) => {
                    let table = values.entry(table.into()).or_insert(Dict::new().into());
                    if let Value::Dict(_, table) = table {
                        table.insert(field.into(), value);
                    }
                }
                None => drop(values.insert(key, value)),
            }
        }
        let metadata =
            Metadata::named("the environment").interpolater(|_: &Profile, keys: &[&str]| {
                let key = keys.join(".");
                env_keys()
                    .find(|(_, known)| *known == key)
                    .map_or(key, |(name, _)| name.to_string())
            });
        let mut file: FileConfig = figment
            .merge(Layer { metadata, values })
            .extract_lossy()
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        // The program path as the OS gives it, even when not UTF-8 (not in `env`, which holds
        // only UTF-8 values); empty turns tesseract off, so it is not filtered like the rest.
        if let Some(v) = std::env::var_os("SIFT_OCR_TESSERACT") {
            file.ocr.tesseract = Some(v.to_string_lossy().into_owned());
        }
        if let Some(v) = std::env::var_os("SIFT_OCR_PDFTOPPM") {
            file.ocr.pdftoppm = Some(v.to_string_lossy().into_owned());
        }
        // SIFT_LLM_BASE_URL + SIFT_LLM_MODEL (+ SIFT_LLM_API_KEY and the rest of
        // `LlmConfig::from_lookup`): one OpenAI-compatible provider named `openai` put first,
        // replacing a file provider of that name (an array entry figment's merge cannot make).
        let from_env = LlmConfig::from_lookup(|name| set(name).cloned())
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        for provider in from_env.providers {
            file.llm.providers.retain(|p| p.name != provider.name);
            file.llm.providers.insert(0, provider);
        }
        Ok(file)
    }

    /// Checks a layered config and fills defaults.
    pub fn check(file: FileConfig) -> anyhow::Result<Config> {
        let url_fetch = url_fetch_settings(&file)?;
        let ocr = ocr_config(&file.ocr)?;
        let listen_text = file.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().with_context(|| {
            format!("listen address {listen_text:?} is not HOST:PORT (an IP address and a port)")
        })?;
        let tls = match (file.tls.cert.clone(), file.tls.key.clone()) {
            (Some(cert), Some(key)) => {
                let files = sift_cluster::tls::TlsFiles {
                    cert,
                    key,
                    ca: file.tls.ca.clone(),
                };
                // Read now, so a bad file fails the start with its name (the CA below).
                sift_cluster::tls::ServerTls::load(&files)?;
                Some(files)
            }
            (None, None) if file.tls.ca.is_none() => None,
            (None, None) => bail!("tls.ca needs tls.cert and tls.key"),
            _ => bail!("TLS needs both tls.cert and tls.key (SIFT_TLS_CERT, SIFT_TLS_KEY)"),
        };
        let audit_days = file.audit_retention_days.unwrap_or(90);
        if !(1..=36_500).contains(&audit_days) {
            bail!("audit_retention_days must be between 1 and 36500, not {audit_days}");
        }
        let audit_retention = Duration::from_secs(audit_days * 24 * 3600);
        let auth = match file.auth.as_deref().unwrap_or("on") {
            "on" => AuthMode::On,
            "off" if listen.ip().is_loopback() => AuthMode::Off,
            "off" => bail!(
                "auth = \"off\" is accepted only on a loopback listen address, not {listen}: \
                 anyone who reaches the port would be an admin"
            ),
            other => bail!("auth must be \"on\" or \"off\", not {other:?}"),
        };
        if let Some(key) = &file.admin_key {
            crate::auth::admin_record_of(key, 0)?;
        }
        let cluster = match file.internal_listen {
            Some(text) => {
                let internal_listen: SocketAddr = text.parse().with_context(|| {
                    format!("internal listen address {text:?} is not HOST:PORT (an IP address and a port)")
                })?;
                let secret = file.cluster_secret.filter(|s| !s.is_empty()).context(
                    "cluster mode (--internal-listen) needs the cluster secret: set SIFT_CLUSTER_SECRET or cluster_secret in the config file",
                )?;
                if internal_listen == listen && listen.port() != 0 {
                    bail!("the internal listen address must differ from the public one");
                }
                Some(ClusterConfig {
                    internal_listen,
                    join: file.join.filter(|j| !j.is_empty()),
                    secret,
                    debug_faults: file.debug_faults.unwrap_or(false),
                })
            }
            None if file.join.is_some() => {
                bail!("--join needs --internal-listen (cluster mode)")
            }
            None => None,
        };
        let defaults = NodeOptions::default();
        let options = NodeOptions {
            // The engines of `ocr` below, made when the node starts (tesseract is probed).
            ocr: defaults.ocr.clone(),
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
            ingest_max_attempts: file
                .ingest_max_attempts
                .unwrap_or(defaults.ingest_max_attempts),
            ingest_slice_chunks: file
                .ingest_slice_chunks
                .unwrap_or(defaults.ingest_slice_chunks),
            ingest_stream_bytes: file
                .ingest_stream_bytes
                .unwrap_or(defaults.ingest_stream_bytes),
            office_limits: sift_actors::ingest::office::OfficeLimits {
                max_rows: file
                    .sheet_max_rows
                    .unwrap_or(defaults.office_limits.max_rows),
                max_cells: file
                    .sheet_max_cells
                    .unwrap_or(defaults.office_limits.max_cells),
                max_unpacked_bytes: file
                    .office_max_unpacked_bytes
                    .unwrap_or(defaults.office_limits.max_unpacked_bytes),
                ..defaults.office_limits.clone()
            },
            pdf_limits: sift_actors::ingest::pdf::PdfLimits {
                max_pages: file.pdf_max_pages.unwrap_or(defaults.pdf_limits.max_pages),
                time_budget: file
                    .pdf_parse_timeout_ms
                    .map(Duration::from_millis)
                    .unwrap_or(defaults.pdf_limits.time_budget),
                // Set by `sift serve` to its own binary (`cli::serve_config`).
                worker: None,
                worker_memory_bytes: match file.pdf_worker_memory_mb {
                    Some(mib) => worker_memory_bytes(mib)?,
                    None => defaults.pdf_limits.worker_memory_bytes,
                },
                // Chosen per parse by whether the KB has an OCR engine.
                scanned: sift_actors::ingest::pdf::Scanned::Refuse,
                // Set per parse to send the document's events.
                report: Default::default(),
            },
            max_kbs: file.max_kbs.unwrap_or(defaults.max_kbs),
            max_shards_per_node: file
                .max_shards_per_node
                .unwrap_or(defaults.max_shards_per_node),
            max_bytes_per_tenant: file.max_bytes_per_tenant,
            max_documents_per_tenant: file.max_documents_per_tenant,
            shard_write_timeout: defaults.shard_write_timeout,
            debug_faults: file.debug_faults.unwrap_or(false),
            rerank: file.rerank.clone(),
            hedge_after: file
                .hedge_after_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.hedge_after),
            remote_write_timeout: file
                .replica_write_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.remote_write_timeout),
            write_quorum: file.write_quorum.unwrap_or(defaults.write_quorum),
            repair_interval: file
                .repair_interval_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.repair_interval),
            reassign_after: file
                .reassign_after_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.reassign_after),
            replace_after: file
                .replace_after_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.replace_after),
            cluster_secret: cluster.as_ref().map(|c| c.secret.clone()),
            peer_tls: match &tls {
                Some(files) => sift_cluster::tls::PeerTls::from_files(files)?,
                None => sift_cluster::tls::PeerTls::plain(),
            },
            graph_llm_timeout: file
                .graph_llm_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(defaults.graph_llm_timeout),
        };
        if options.write_quorum == 0 {
            bail!("write_quorum must be at least 1");
        }
        if options.repair_interval.is_zero()
            || options.graph_llm_timeout.is_zero()
            || options.remote_write_timeout.is_zero()
            || options.reassign_after.is_zero()
            || options.replace_after.is_zero()
        {
            bail!(
                "repair_interval_ms, graph_llm_timeout_ms, replica_write_timeout_ms, \
                 reassign_after_ms and replace_after_ms must be at least 1"
            );
        }
        if options.ingest_queue_capacity == 0
            || options.ingest_workers == 0
            || options.ingest_max_attempts == 0
            || options.ingest_slice_chunks == 0
            || options.office_limits.max_rows == 0
            || options.office_limits.max_cells == 0
            || options.office_limits.max_unpacked_bytes == 0
            || options.max_kbs == 0
            || options.max_shards_per_node == 0
            || options.search_permits_per_shard == 0
            || options.pdf_limits.max_pages == 0
            || options.pdf_limits.time_budget.is_zero()
        {
            bail!(
                "ingest_queue_capacity, ingest_workers, ingest_max_attempts, \
                 ingest_slice_chunks, sheet_max_rows, sheet_max_cells, \
                 office_max_unpacked_bytes, max_kbs, max_shards_per_node, \
                 search_permits_per_shard, pdf_max_pages and \
                 pdf_parse_timeout_ms must be at least 1"
            );
        }
        let default_limits = sift_cluster::http_server::ConnectionLimits::default();
        let connections = sift_cluster::http_server::ConnectionLimits {
            max_connections: file
                .max_connections
                .unwrap_or(default_limits.max_connections),
            max_connections_per_ip: file
                .max_connections_per_ip
                .unwrap_or(default_limits.max_connections_per_ip),
            header_read_timeout: file
                .header_read_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(default_limits.header_read_timeout),
        };
        if connections.max_connections == 0
            || connections.max_connections_per_ip == 0
            || connections.header_read_timeout.is_zero()
        {
            bail!(
                "max_connections, max_connections_per_ip and header_read_timeout_ms must be at least 1"
            );
        }
        let max_bulk_documents = file.max_bulk_documents.unwrap_or(10_000);
        // Each KB with its own series adds three; a cap keeps a scrape's size bounded.
        let metrics_max_kbs = file.metrics_max_kbs.unwrap_or(100);
        if metrics_max_kbs > 10_000 {
            bail!("metrics_max_kbs must be at most 10000, not {metrics_max_kbs}");
        }
        if max_bulk_documents == 0 {
            bail!("max_bulk_documents must be at least 1");
        }
        let cors = crate::requests::CorsOrigins::parse(file.cors_origins.as_deref().unwrap_or(&[]))
            .map_err(|error| anyhow::anyhow!("cors_origins: {error}"))?;
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
        let run_defaults = RunLimits::default();
        let runs = RunLimits {
            max_concurrent_runs: file
                .runs
                .max_concurrent
                .unwrap_or(run_defaults.max_concurrent_runs),
            max_queued_runs: file.runs.max_queued.unwrap_or(run_defaults.max_queued_runs),
            queue_timeout: file
                .runs
                .queue_timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(run_defaults.queue_timeout),
            retention: file
                .runs
                .retention_secs
                .map(Duration::from_secs)
                .unwrap_or(run_defaults.retention),
            max_retained: file.runs.max_retained.unwrap_or(run_defaults.max_retained),
            max_runs_per_key: file.runs.max_per_key,
            max_question_chars: file
                .runs
                .max_question_chars
                .unwrap_or(run_defaults.max_question_chars),
        };
        if runs.max_runs_per_key == Some(0) {
            bail!("runs.max_per_key must be at least 1");
        }
        if runs.max_concurrent_runs == 0 || runs.max_question_chars == 0 || runs.max_retained == 0 {
            bail!(
                "runs.max_concurrent, runs.max_question_chars and runs.max_retained must be at least 1"
            );
        }
        check_upper_bounds(&options, &runs, &connections, max_bulk_documents)?;
        let mut names = std::collections::BTreeSet::new();
        for preset in &file.agents {
            if preset.name.is_empty() || !names.insert(preset.name.clone()) {
                bail!(
                    "agent preset names must be non-empty and unique: {:?}",
                    preset.name
                );
            }
            if preset.name.starts_with("kb:") {
                bail!(
                    "agent preset name {:?}: names starting with \"kb:\" are the models of knowledge bases",
                    preset.name
                );
            }
            let budget = &preset.budget;
            let max_secs = MAX_DURATION.as_secs();
            if budget.deadline_secs > max_secs || budget.tool_timeout_secs > max_secs {
                bail!(
                    "agents.budget.deadline_secs and agents.budget.tool_timeout_secs must be at \
                     most {max_secs} (a week), not {} and {} (preset {:?})",
                    budget.deadline_secs,
                    budget.tool_timeout_secs,
                    preset.name
                );
            }
        }
        file.llm
            .validate()
            .map_err(|error| anyhow::anyhow!("llm: {error}"))?;
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
        let data_dir = file
            .data_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        Ok(Config {
            llm: file.llm,
            runs,
            agents: file.agents,
            snapshot_dir: file
                .snapshot_dir
                .unwrap_or_else(|| data_dir.join("snapshots")),
            data_dir,
            listen,
            cluster,
            max_upload_bytes: file.max_upload_bytes.unwrap_or(128 * 1024 * 1024),
            max_json_bytes: file.max_json_bytes.unwrap_or(256 * 1024 * 1024),
            max_bulk_documents,
            metrics_max_kbs,
            cors,
            url_fetch,
            connections,
            options,
            embedding: file.embedding,
            auth,
            admin_key: file.admin_key,
            audit_retention,
            rate_per_key: file
                .rate_limit_per_key
                .and_then(|rate| crate::limits::Rate::new(rate, file.rate_limit_burst_per_key)),
            rate_per_tenant: file
                .rate_limit_per_tenant
                .and_then(|rate| crate::limits::Rate::new(rate, file.rate_limit_burst_per_tenant)),
            tls,
            ocr,
        })
    }

    /// A config for tests: a temp data dir, port 0, fault injection on, [`TEST_ADMIN_KEY`],
    /// URL fetches confined to loopback (`url_fetch_loopback_only`).
    pub fn for_test(data_dir: &Path) -> Config {
        let mut file = FileConfig {
            data_dir: Some(data_dir.to_path_buf()),
            listen: Some("127.0.0.1:0".into()),
            debug_faults: Some(true),
            url_fetch_loopback_only: Some(true),
            admin_key: Some(TEST_ADMIN_KEY.to_string()),
            ..FileConfig::default()
        };
        file.embedding.model_dir = std::env::var_os("SIFT_MODEL_DIR").map(PathBuf::from);
        Config::check(file).expect("the test config is valid")
    }
}

/// The `[ocr]` keys, checked.
fn ocr_config(file: &OcrFileConfig) -> anyhow::Result<sift_models::ocr::OcrConfig> {
    use sift_models::ocr::{OcrConfig, TesseractConfig, VisionConfig};
    let defaults = OcrConfig::default();
    let vision = match (&file.vision_url, &file.vision_model) {
        (None, None) => None,
        (Some(url), Some(model)) => {
            let parsed = reqwest::Url::parse(url)
                .with_context(|| format!("ocr.vision_url {url:?} is not a URL"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                bail!("ocr.vision_url must be an http or https URL, not {url:?}");
            }
            if model.trim().is_empty() {
                bail!("ocr.vision_model must not be empty");
            }
            Some(VisionConfig {
                base_url: url.clone(),
                model: model.clone(),
                api_key: file.vision_api_key.clone(),
                max_tokens: file.vision_max_tokens.unwrap_or(4096).clamp(1, 1 << 20),
            })
        }
        (Some(_), None) => bail!("ocr.vision_url needs ocr.vision_model"),
        (None, Some(_)) => bail!("ocr.vision_model needs ocr.vision_url"),
    };
    let tesseract = match file.tesseract.as_deref() {
        Some("") => None,
        command => Some(TesseractConfig {
            command: command.map_or(TesseractConfig::default().command, PathBuf::from),
            languages: file
                .tesseract_languages
                .clone()
                .unwrap_or_else(|| TesseractConfig::default().languages),
        }),
    };
    if let Some(tesseract) = &tesseract {
        let valid = |language: &str| {
            !language.is_empty()
                && language
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if !tesseract.languages.split('+').all(valid) {
            bail!(
                "ocr.tesseract_languages must be language names joined by '+' (eng+chi_sim), not {:?}",
                tesseract.languages
            );
        }
    }
    let pdftoppm = match file.pdftoppm.as_deref() {
        Some("") => None,
        Some(command) => Some(PathBuf::from(command)),
        None => defaults.pdftoppm.clone(),
    };
    let timeout_ms = file
        .timeout_ms
        .unwrap_or(defaults.timeout.as_millis() as u64);
    if !(1..=600_000).contains(&timeout_ms) {
        bail!("ocr.timeout_ms must be between 1 and 600000, not {timeout_ms}");
    }
    let retries = file.retries.unwrap_or(defaults.retries);
    if retries > 10 {
        bail!("ocr.retries must be at most 10, not {retries}");
    }
    let max_in_flight = file.max_in_flight.unwrap_or(defaults.max_in_flight);
    if !(1..=64).contains(&max_in_flight) {
        bail!("ocr.max_in_flight must be between 1 and 64, not {max_in_flight}");
    }
    Ok(OcrConfig {
        vision,
        tesseract,
        pdftoppm,
        timeout: Duration::from_millis(timeout_ms),
        retries,
        max_in_flight,
    })
}

/// The `url_fetch_*` keys, checked: ranges in CIDR form (a bare address is its own range),
/// host names mapped to addresses, a timeout of 1 ms to 10 minutes, at most 20 redirects.
fn url_fetch_settings(file: &FileConfig) -> anyhow::Result<crate::fetch::FetchSettings> {
    let defaults = crate::fetch::FetchSettings::default();
    let mut allow = Vec::new();
    for range in file.url_fetch_allow.iter().flatten() {
        let net = range
            .parse::<ipnet::IpNet>()
            .or_else(|_| range.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                anyhow::anyhow!("url_fetch_allow: {range:?} is not an address range (10.1.0.0/16)")
            })?;
        allow.push(net);
    }
    let mut hosts = BTreeMap::new();
    for (name, address) in file.url_fetch_hosts.iter().flatten() {
        let address = address.parse::<std::net::IpAddr>().map_err(|_| {
            anyhow::anyhow!("url_fetch_hosts.{name}: {address:?} is not an IP address")
        })?;
        hosts.insert(name.to_ascii_lowercase(), address);
    }
    let timeout = file
        .url_fetch_timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(defaults.timeout);
    if timeout.is_zero() || timeout > Duration::from_secs(600) {
        bail!(
            "url_fetch_timeout_ms must be between 1 and 600000, not {}",
            timeout.as_millis()
        );
    }
    let max_redirects = file
        .url_fetch_max_redirects
        .unwrap_or(defaults.max_redirects);
    if max_redirects > 20 {
        bail!("url_fetch_max_redirects must be at most 20, not {max_redirects}");
    }
    Ok(crate::fetch::FetchSettings {
        allow,
        hosts,
        timeout,
        max_redirects,
        loopback_only: file.url_fetch_loopback_only.unwrap_or(false),
    })
}

/// `pdf_worker_memory_mb` in bytes: at least what the parser thread's stack reserves, at most
/// 1 TiB.
fn worker_memory_bytes(mib: u64) -> anyhow::Result<u64> {
    let min_mib = sift_actors::ingest::pdf::MIN_WORKER_MEMORY_BYTES >> 20;
    const MAX_MIB: u64 = 1 << 20;
    if !(min_mib..=MAX_MIB).contains(&mib) {
        bail!("pdf_worker_memory_mb must be between {min_mib} and {MAX_MIB}, not {mib}");
    }
    Ok(mib << 20)
}

/// The longest duration any `*_ms` key may set: a week. Longer ones would overflow deadline
/// arithmetic (an `Instant` plus the duration) somewhere in the node.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `runs.retention_secs`: a year.
const MAX_RETENTION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Refuses counts and durations past what the node can hold: semaphores and queues are sized
/// from them, workers are threads, deadlines are added to clocks. Each refusal names its key.
fn check_upper_bounds(
    options: &NodeOptions,
    runs: &RunLimits,
    connections: &sift_cluster::http_server::ConnectionLimits,
    max_bulk_documents: usize,
) -> anyhow::Result<()> {
    let counts: [(&str, Option<usize>, usize); 14] = [
        ("ingest_workers", Some(options.ingest_workers), 256),
        (
            "ingest_slice_chunks",
            Some(options.ingest_slice_chunks),
            1 << 20,
        ),
        (
            "ingest_queue_capacity",
            Some(options.ingest_queue_capacity),
            1 << 20,
        ),
        (
            "search_permits_per_shard",
            Some(options.search_permits_per_shard),
            1 << 16,
        ),
        (
            "max_connections",
            Some(connections.max_connections),
            1 << 20,
        ),
        (
            "max_connections_per_ip",
            Some(connections.max_connections_per_ip),
            1 << 20,
        ),
        ("max_bulk_documents", Some(max_bulk_documents), 1 << 20),
        ("pdf_max_pages", Some(options.pdf_limits.max_pages), 1 << 20),
        (
            "runs.max_concurrent",
            Some(runs.max_concurrent_runs),
            1 << 16,
        ),
        ("runs.max_queued", Some(runs.max_queued_runs), 1 << 20),
        ("runs.max_retained", Some(runs.max_retained), 1 << 24),
        (
            "runs.max_question_chars",
            Some(runs.max_question_chars),
            1 << 24,
        ),
        ("runs.max_per_key", runs.max_runs_per_key, 1 << 16),
        (
            "ingest_max_attempts",
            Some(options.ingest_max_attempts as usize),
            1000,
        ),
    ];
    for (name, value, max) in counts {
        if let Some(value) = value.filter(|value| *value > max) {
            bail!("{name} must be at most {max}, not {value}");
        }
    }
    let durations = [
        ("shard_deadline_ms", options.shard_deadline),
        ("hedge_after_ms", options.hedge_after),
        ("graph_llm_timeout_ms", options.graph_llm_timeout),
        ("replica_write_timeout_ms", options.remote_write_timeout),
        ("repair_interval_ms", options.repair_interval),
        ("reassign_after_ms", options.reassign_after),
        ("replace_after_ms", options.replace_after),
        ("header_read_timeout_ms", connections.header_read_timeout),
        ("runs.queue_timeout_ms", runs.queue_timeout),
        ("pdf_parse_timeout_ms", options.pdf_limits.time_budget),
    ];
    let max_ms = MAX_DURATION.as_millis();
    for (name, value) in durations {
        if value > MAX_DURATION {
            bail!(
                "{name} must be at most {max_ms} (a week), not {}",
                value.as_millis()
            );
        }
    }
    if runs.retention > MAX_RETENTION {
        bail!(
            "runs.retention_secs must be at most {} (a year), not {}",
            MAX_RETENTION.as_secs(),
            runs.retention.as_secs()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_mode_needs_a_secret_and_join_needs_cluster_mode() {
        let mut env = BTreeMap::new();
        env.insert(
            "SIFT_INTERNAL_LISTEN".to_string(),
            "127.0.0.1:7800".to_string(),
        );
        let error = Config::check(Config::load(None, &env).unwrap()).unwrap_err();
        assert!(
            format!("{error:#}").contains("SIFT_CLUSTER_SECRET"),
            "{error:#}"
        );
        env.insert("SIFT_CLUSTER_SECRET".to_string(), "s3cret".to_string());
        env.insert("SIFT_JOIN".to_string(), "127.0.0.1:7801".to_string());
        let config = Config::check(Config::load(None, &env).unwrap()).unwrap();
        let cluster = config.cluster.expect("cluster mode");
        assert_eq!(cluster.internal_listen.port(), 7800);
        assert_eq!(cluster.join.as_deref(), Some("127.0.0.1:7801"));
        assert_eq!(cluster.secret, "s3cret");

        let mut env = BTreeMap::new();
        env.insert("SIFT_JOIN".to_string(), "127.0.0.1:7801".to_string());
        assert!(Config::check(Config::load(None, &env).unwrap()).is_err());
        assert!(
            Config::check(Config::load(None, &BTreeMap::new()).unwrap())
                .unwrap()
                .cluster
                .is_none()
        );
    }

    #[test]
    fn tls_needs_a_readable_matching_pair() {
        let fixture = |name: &str| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/tls")
                .join(name)
                .display()
                .to_string()
        };
        let check = |pairs: &[(&str, String)]| {
            let env: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect();
            Config::check(Config::load(None, &env).unwrap()).map_err(|e| format!("{e:#}"))
        };
        let ok = check(&[
            ("SIFT_TLS_CERT", fixture("node-a.crt")),
            ("SIFT_TLS_KEY", fixture("node-a.key")),
            ("SIFT_TLS_CA", fixture("ca.crt")),
        ])
        .unwrap();
        assert!(ok.tls.is_some() && ok.options.peer_tls.enabled());
        assert!(check(&[]).unwrap().tls.is_none());
        let only_cert = check(&[("SIFT_TLS_CERT", fixture("node-a.crt"))]).unwrap_err();
        assert!(
            only_cert.contains("both tls.cert and tls.key"),
            "{only_cert}"
        );
        let only_ca = check(&[("SIFT_TLS_CA", fixture("ca.crt"))]).unwrap_err();
        assert!(only_ca.contains("tls.ca needs"), "{only_ca}");
        let mismatched = check(&[
            ("SIFT_TLS_CERT", fixture("node-a.crt")),
            ("SIFT_TLS_KEY", fixture("node-b.key")),
        ])
        .unwrap_err();
        assert!(mismatched.contains("does not match"), "{mismatched}");
        let bad_ca = check(&[
            ("SIFT_TLS_CERT", fixture("node-a.crt")),
            ("SIFT_TLS_KEY", fixture("node-a.key")),
            ("SIFT_TLS_CA", fixture("missing-ca.crt")),
        ])
        .unwrap_err();
        assert!(bad_ca.contains("missing-ca.crt"), "{bad_ca}");
    }

    #[test]
    fn auth_off_only_on_loopback_and_the_admin_key_must_be_well_formed() {
        let check = |pairs: &[(&str, &str)]| {
            let env: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::check(Config::load(None, &env).unwrap())
        };
        assert_eq!(check(&[]).unwrap().auth, AuthMode::On, "on by default");
        let off = check(&[("SIFT_AUTH", "off"), ("SIFT_LISTEN", "127.0.0.1:7700")]).unwrap();
        assert_eq!(off.auth, AuthMode::Off);
        let error = check(&[("SIFT_AUTH", "off"), ("SIFT_LISTEN", "0.0.0.0:7700")]).unwrap_err();
        assert!(format!("{error:#}").contains("loopback"), "{error:#}");
        let error = check(&[("SIFT_AUTH", "maybe")]).unwrap_err();
        assert!(
            format!("{error:#}").contains("\"on\" or \"off\""),
            "{error:#}"
        );
        let error = check(&[("SIFT_ADMIN_KEY", "hunter2")]).unwrap_err();
        assert!(format!("{error:#}").contains("SIFT_ADMIN_KEY"), "{error:#}");
        let given = check(&[("SIFT_ADMIN_KEY", TEST_ADMIN_KEY)]).unwrap();
        assert_eq!(given.admin_key.as_deref(), Some(TEST_ADMIN_KEY));
        assert_eq!(
            check(&[("SIFT_ADMIN_KEY", "")]).unwrap().admin_key,
            None,
            "empty is unset"
        );
    }

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
        assert!(config.llm.providers.is_empty());
    }

    #[test]
    fn llm_from_env_and_presets_and_runs_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sift.toml");
        std::fs::write(
            &path,
            "[runs]\nmax_concurrent = 3\nretention_secs = 5\n\n[[agents]]\nname = \"brief\"\ndescription = \"short answers\"\n\n[[llm.providers]]\nname = \"backup\"\nkind = \"anthropic\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"claude\"\npriority = 5\n",
        )
        .unwrap();
        let mut env = BTreeMap::new();
        env.insert(
            "SIFT_LLM_BASE_URL".to_string(),
            "http://127.0.0.1:8089/v1".to_string(),
        );
        env.insert("SIFT_LLM_MODEL".to_string(), "local".to_string());
        env.insert("SIFT_MAX_QUEUED_RUNS".to_string(), "7".to_string());
        let config = Config::check(Config::load(Some(&path), &env).unwrap()).unwrap();
        let names: Vec<&str> = config
            .llm
            .providers
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["openai", "backup"]);
        assert_eq!(config.llm.providers[0].model, "local");
        assert_eq!(config.runs.max_concurrent_runs, 3);
        assert_eq!(config.runs.max_queued_runs, 7);
        assert_eq!(config.runs.retention, Duration::from_secs(5));
        assert_eq!(config.agents[0].name, "brief");
        // Half an env configuration is an error, not a silent extractive node.
        let mut env = BTreeMap::new();
        env.insert(
            "SIFT_LLM_BASE_URL".to_string(),
            "http://127.0.0.1:8089/v1".to_string(),
        );
        assert!(Config::load(None, &env).is_err());
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
        // The per-KB gauges' cap: from the environment, bounded.
        let mut env = BTreeMap::new();
        env.insert("SIFT_METRICS_MAX_KBS".to_string(), "7".to_string());
        let config = Config::check(Config::load(None, &env).unwrap()).unwrap();
        assert_eq!(config.metrics_max_kbs, 7);
        let file: FileConfig = toml::from_str("metrics_max_kbs = 10001\n").unwrap();
        let error = Config::check(file).unwrap_err();
        assert!(
            format!("{error:#}").contains("metrics_max_kbs"),
            "{error:#}"
        );
        // CORS origins: a comma-separated list from the environment, each one checked.
        let mut env = BTreeMap::new();
        env.insert(
            "SIFT_CORS_ORIGINS".to_string(),
            "https://app.example.com, http://127.0.0.1:3000".to_string(),
        );
        let config = Config::check(Config::load(None, &env).unwrap()).unwrap();
        assert_eq!(
            config.cors,
            crate::requests::CorsOrigins::parse(&[
                "https://app.example.com".to_string(),
                "http://127.0.0.1:3000".to_string(),
            ])
            .unwrap()
        );
        assert_eq!(
            Config::check(FileConfig::default()).unwrap().cors,
            crate::requests::CorsOrigins::None
        );
        let file: FileConfig = toml::from_str("cors_origins = [\"https://a.example/\"]\n").unwrap();
        let error = Config::check(file).unwrap_err();
        assert!(format!("{error:#}").contains("cors_origins"), "{error:#}");
    }

    #[test]
    fn every_variable_sets_its_key_and_bad_values_name_their_source() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // "1" is a valid text, path, number, boolean and one-item list: each variable must
        // land on a field of its own (an unknown key would fail; an ignored one would leave
        // the config as it was).
        let unset = format!("{:?}", Config::load(None, &BTreeMap::new()).unwrap());
        for (name, key) in env_keys() {
            let file = Config::load(None, &env(&[(name, "1")]))
                .unwrap_or_else(|error| panic!("{name} -> {key}: {error:#}"));
            assert_ne!(format!("{file:?}"), unset, "{name} -> {key} set nothing");
        }
        let file = Config::load(None, &env(&[("SIFT_DEBUG_FAULTS", "yes")])).unwrap();
        assert_eq!(file.debug_faults, Some(true));
        let file = Config::load(None, &env(&[("SIFT_URL_FETCH_LOOPBACK_ONLY", "true")]));
        assert!(
            Config::check(file.unwrap())
                .unwrap()
                .url_fetch
                .loopback_only
        );
        let file = Config::load(None, &env(&[("SIFT_URL_FETCH_ALLOW", " 10.0.0.0/8,,::1 ")]));
        assert_eq!(
            file.unwrap().url_fetch_allow.unwrap(),
            ["10.0.0.0/8", "::1"]
        );

        // A bad number in the environment: the variable and the value.
        let error = Config::load(None, &env(&[("SIFT_INGEST_WORKERS", "many")])).unwrap_err();
        let error = format!("{error:#}");
        assert!(error.contains("SIFT_INGEST_WORKERS"), "{error}");
        assert!(error.contains("\"many\""), "{error}");
        let error = Config::load(None, &env(&[("SIFT_MAX_QUEUED_RUNS", "-3")])).unwrap_err();
        assert!(
            format!("{error:#}").contains("SIFT_MAX_QUEUED_RUNS"),
            "{error:#}"
        );
        let error = Config::load(None, &env(&[("SIFT_WRITE_QUORUM", "99999999999")])).unwrap_err();
        assert!(
            format!("{error:#}").contains("SIFT_WRITE_QUORUM"),
            "{error:#}"
        );

        // A bad number in the file: the key, the value and the file; the environment's
        // good value of another key does not hide it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sift.toml");
        std::fs::write(&path, "[runs]\nmax_queued = \"lots\"\n").unwrap();
        let error = Config::load(Some(&path), &env(&[("SIFT_MAX_KBS", "3")])).unwrap_err();
        let error = format!("{error:#}");
        assert!(error.contains("runs.max_queued"), "{error}");
        assert!(error.contains("\"lots\""), "{error}");
        assert!(error.contains("sift.toml"), "{error}");
        // The environment wins over the file, value by value.
        let error = Config::load(Some(&path), &env(&[("SIFT_MAX_QUEUED_RUNS", "4")]));
        assert_eq!(error.unwrap().runs.max_queued, Some(4));
    }

    #[test]
    fn pdftoppm_is_on_by_default_and_an_empty_command_turns_it_off() {
        let default = ocr_config(&OcrFileConfig::default()).unwrap();
        assert_eq!(default.pdftoppm, Some(PathBuf::from("pdftoppm")));
        let off = ocr_config(&OcrFileConfig {
            pdftoppm: Some(String::new()),
            ..OcrFileConfig::default()
        })
        .unwrap();
        assert_eq!(off.pdftoppm, None);
        let named = ocr_config(&OcrFileConfig {
            pdftoppm: Some("/opt/poppler/bin/pdftoppm".into()),
            ..OcrFileConfig::default()
        })
        .unwrap();
        assert_eq!(
            named.pdftoppm,
            Some(PathBuf::from("/opt/poppler/bin/pdftoppm"))
        );
    }

    #[test]
    fn every_count_and_duration_has_an_upper_bound() {
        // Each key at half the largest value its type takes, under its table where it has one.
        let keys = [
            "ingest_workers",
            "ingest_queue_capacity",
            "search_permits_per_shard",
            "max_connections",
            "max_connections_per_ip",
            "max_bulk_documents",
            "ingest_max_attempts",
            "ingest_slice_chunks",
            "pdf_max_pages",
            "pdf_parse_timeout_ms",
            "shard_deadline_ms",
            "hedge_after_ms",
            "graph_llm_timeout_ms",
            "replica_write_timeout_ms",
            "repair_interval_ms",
            "reassign_after_ms",
            "replace_after_ms",
            "header_read_timeout_ms",
            "runs.max_concurrent",
            "runs.max_queued",
            "runs.max_retained",
            "runs.max_question_chars",
            "runs.max_per_key",
            "runs.queue_timeout_ms",
            "runs.retention_secs",
        ];
        for key in keys {
            let max = if key == "ingest_max_attempts" {
                u64::from(u32::MAX)
            } else {
                u64::MAX
            };
            let text = match key.split_once('.') {
                Some((table, field)) => format!("[{table}]\n{field} = {}\n", max / 2),
                None => format!("{key} = {}\n", max / 2),
            };
            let file: FileConfig = toml::from_str(&text).expect(&text);
            let error = Config::check(file).expect_err(&text);
            assert!(format!("{error:#}").contains(key), "{key}: {error:#}");
            // A value in range still passes.
            let text = text.replace(&(max / 2).to_string(), "5");
            Config::check(toml::from_str(&text).expect(&text)).expect(&text);
        }
        // The PDF worker's memory has a floor too: the parser thread's stack.
        for mib in [u64::MAX / 2, 5] {
            let text = format!("pdf_worker_memory_mb = {mib}\n");
            let error = Config::check(toml::from_str(&text).unwrap()).expect_err(&text);
            assert!(
                format!("{error:#}").contains("pdf_worker_memory_mb"),
                "{error:#}"
            );
        }
        let config =
            Config::check(toml::from_str("pdf_worker_memory_mb = 512\n").unwrap()).unwrap();
        assert_eq!(config.options.pdf_limits.worker_memory_bytes, 512 << 20);
        // The durations of presets and providers, which a run adds to its clock.
        let huge = u64::MAX / 2;
        for (key, text) in [
            (
                "deadline_secs",
                format!("[[agents]]\nname = \"a\"\nbudget = {{ deadline_secs = {huge} }}\n"),
            ),
            (
                "breaker_open_ms",
                format!(
                    "[[llm.providers]]\nname = \"p\"\nbase_url = \"http://127.0.0.1:1/v1\"\n\
                     model = \"m\"\nbreaker_open_ms = {huge}\n"
                ),
            ),
        ] {
            let error = Config::check(toml::from_str(&text).expect(&text)).expect_err(&text);
            assert!(format!("{error:#}").contains(key), "{key}: {error:#}");
            let text = text.replace(&huge.to_string(), "5");
            Config::check(toml::from_str(&text).expect(&text)).expect(&text);
        }
    }
}
