//! Boots a node: model clients, the actor tree, the HTTP server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sift_actors::sessions::{Sessions, SessionsConfig};
use sift_actors::{Embedders, SiftError, SiftNode};
use sift_models::embedding::{
    Embedder, LocalEmbedderOptions, MiniLmEmbedder, OpenAiEmbedder, OpenAiEmbedderConfig,
    resolve_model_dir,
};
use sift_models::llm::build_router;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::api::{AppState, router};
use crate::config::Config;
use crate::telemetry;

/// A node serving HTTP. Dropping it does not stop it: call [`RunningNode::shutdown`].
pub struct RunningNode {
    pub addr: SocketAddr,
    pub node: Arc<SiftNode>,
    pub sessions: Arc<Sessions>,
    /// Cluster mode: this node's Raft member.
    pub cluster: Option<crate::cluster::ClusterMember>,
    /// `https` with TLS on, else `http`.
    scheme: &'static str,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
    /// Reloads the TLS certificate on SIGHUP.
    reloader: Option<tokio::task::JoinHandle<()>>,
    data_dir: std::path::PathBuf,
    /// The data dir's lock, let go once its stores are closed.
    dir_lock: sift_storage::data_dir::DirLock,
}

impl RunningNode {
    /// The base URL of the HTTP API, e.g. `http://127.0.0.1:7700` (`https://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Resolves once this member's Raft thread has stopped on a storage failure (a full disk),
    /// with the reason; never for a node that runs alone.
    pub async fn storage_failure(&self) -> String {
        let Some(raft) = self.cluster.as_ref().and_then(|member| member.handle()) else {
            return std::future::pending().await;
        };
        let mut interval = tokio::time::interval(Duration::from_millis(200));
        loop {
            interval.tick().await;
            if let Some(failure) = raft.storage_failure() {
                return failure;
            }
        }
    }

    /// Stops accepting requests, lets in-flight ones finish, stops the actors.
    pub async fn shutdown(mut self) {
        self.sessions.shutdown();
        if let Some(reloader) = self.reloader.take() {
            reloader.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(10), &mut self.server)
            .await
            .is_err()
        {
            // Connections still open after the grace period are cut: their tasks hold the
            // node's stores.
            self.server.abort();
            let _ = (&mut self.server).await;
        }
        self.node.shutdown().await;
        if let Some(member) = self.cluster.take() {
            member.shutdown().await;
        }
        // The stores close when the last handle goes; this returns once they have, so the
        // data dir opens again at once (a restart in the same process).
        let RunningNode {
            node,
            sessions,
            data_dir,
            dir_lock,
            ..
        } = self;
        drop(sessions);
        drop(node);
        let _ = tokio::task::spawn_blocking(move || {
            sift_storage::sled_db::wait_released(&data_dir, Duration::from_secs(30))
        })
        .await;
        drop(dir_lock);
    }
}

/// Loads the embedded model (when its files are found) and connects remote embedders.
pub async fn load_embedders(config: &Config) -> anyhow::Result<Embedders> {
    let mut embedders = Embedders::default();
    match resolve_model_dir(config.embedding.model_dir.as_deref()) {
        Some(dir) => {
            let mut options = LocalEmbedderOptions::default();
            if let Some(batch) = config.embedding.batch_size {
                options.batch_size = batch.max(1);
            }
            if let Some(concurrent) = config.embedding.concurrent_batches {
                options.max_concurrent_batches = concurrent.max(1);
            }
            let shown = dir.display().to_string();
            let loaded =
                tokio::task::spawn_blocking(move || MiniLmEmbedder::load(&dir, options)).await?;
            match loaded {
                Ok(model) => {
                    info!(dir = %shown, "embedded model loaded");
                    embedders.local = Some(Embedder::Local(Arc::new(model)));
                }
                Err(error) => {
                    warn!(dir = %shown, %error, "embedded model could not be loaded");
                    embedders.local_error = Some(format!("{error} (from {shown})"));
                }
            }
        }
        None => {
            let message = "model files not found: run scripts/fetch-model.sh or set SIFT_MODEL_DIR"
                .to_string();
            warn!("{message}");
            embedders.local_error = Some(message);
        }
    }
    for (name, remote) in &config.embedding.remote {
        let mut client = OpenAiEmbedderConfig::new(remote.base_url.clone(), remote.model.clone());
        client.api_key = remote.api_key.clone();
        client.dimension = remote.dimension;
        if let Some(ms) = remote.timeout_ms {
            client.timeout = Duration::from_millis(ms);
        }
        if let Some(retries) = remote.max_retries {
            client.max_retries = retries;
        }
        if let Some(batch) = remote.batch_size {
            client.batch_size = batch;
        }
        let embedder = OpenAiEmbedder::connect(client)
            .await
            .with_context(|| format!("connecting embedding.remote.{name}"))?;
        embedders
            .remote
            .insert(name.clone(), Embedder::OpenAi(Arc::new(embedder)));
    }
    Ok(embedders)
}

/// Starts a node with `config` and serves its API until shut down.
pub async fn start(config: Config) -> anyhow::Result<RunningNode> {
    let prometheus = telemetry::prometheus();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    // Before anything is written there: a data dir of a newer format is left as it is.
    sift_storage::data_dir::open(&config.data_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    // One node per data dir: a second one stops here, saying so, before it changes anything.
    let dir_lock = sift_storage::data_dir::lock(&config.data_dir).map_err(anyhow::Error::msg)?;
    let temp_dir = config.data_dir.join("tmp");
    let _ = std::fs::remove_dir_all(&temp_dir); // partial uploads of a previous run
    std::fs::create_dir_all(&temp_dir)?;
    // snapshots a previous run left unfinished
    match sift_storage::backup::remove_partials(&config.snapshot_dir) {
        Ok(0) => {}
        Ok(removed) => info!(removed, "removed unfinished snapshots"),
        Err(error) => {
            warn!(%error, dir = %config.snapshot_dir.display(), "could not remove unfinished snapshots")
        }
    }
    let embedders = load_embedders(&config).await?;
    let mut config = config;
    config.options.ocr = Arc::new(sift_models::ocr::Ocr::start(config.ocr.clone()).await);
    let tls = config
        .tls
        .as_ref()
        .map(sift_cluster::tls::ServerTls::load)
        .transpose()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let addr = listener.local_addr()?;
    let (node, cluster) = match &config.cluster {
        None => (
            Arc::new(
                SiftNode::start(&config.data_dir, config.options.clone(), embedders)
                    .await
                    .map_err(|e| anyhow::anyhow!("starting the node: {e}"))?,
            ),
            None,
        ),
        Some(cluster) => {
            let slot: crate::cluster::NodeSlot = Default::default();
            let route_slot = slot.clone();
            let internal_tls = tls.clone();
            let peer_tls = config.options.peer_tls.clone();
            let (node, member) = SiftNode::start_with_meta(
                &config.data_dir,
                config.options.clone(),
                embedders,
                |store| async move {
                    let member = crate::cluster::MemberStart {
                        config: cluster,
                        public: addr,
                        tls: internal_tls,
                        peer_tls,
                    };
                    crate::cluster::start_member(member, store, route_slot)
                        .await
                        .map_err(|error| SiftError::Internal(format!("cluster mode: {error:#}")))
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("starting the node: {e}"))?;
            let node = Arc::new(node);
            let _ = slot.set(node.clone());
            (node, Some(member))
        }
    };
    let model = build_router(&config.llm).context("configuring the chat model providers")?;
    match &model {
        Some(model) => {
            info!(model = model.name(), "chat model configured");
            // The LLM graph extractor (KBs with graph = "llm") uses the same model.
            let _ = node.context().chat_model.set(model.clone());
        }
        None => info!("no chat model configured: answers are extractive"),
    }
    let sessions = Sessions::new(
        node.clone(),
        SessionsConfig {
            model,
            presets: config.agents.clone(),
            limits: config.runs.clone(),
        },
    )
    .context("starting the session layer")?;
    crate::auth::bootstrap_at_start(
        node.clone(),
        config.auth,
        config.admin_key.clone(),
        config.data_dir.clone(),
    )
    .await
    .context("making the admin key")?;
    let auth = Arc::new(crate::auth::AuthState {
        mode: config.auth,
        node: node.clone(),
        audit_retention: config.audit_retention,
        limits: crate::limits::RateLimits::new(config.rate_per_key, config.rate_per_tenant),
        cluster_secret: config
            .cluster
            .as_ref()
            .map(|cluster| cluster.secret.clone()),
    });
    let state = AppState {
        auth,
        sessions: sessions.clone(),
        node: node.clone(),
        prometheus,
        kb_gauges: Arc::new(telemetry::KbGauges::new(config.metrics_max_kbs)),
        max_upload_bytes: config.max_upload_bytes,
        max_json_bytes: config.max_json_bytes,
        max_bulk_documents: config.max_bulk_documents,
        temp_dir,
        snapshot_dir: config.snapshot_dir.clone(),
        listen: addr,
        cluster_address: cluster.as_ref().map(|member| member.address.clone()),
        peer_tls: config.options.peer_tls.clone(),
        fetcher: Arc::new(crate::fetch::UrlFetcher::new(config.url_fetch.clone())?),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router(state, &config.cors);
    let server = tokio::spawn(sift_cluster::http_server::serve(
        listener,
        app,
        config.connections,
        "public",
        tls.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let reloader = tls.map(reload_on_sighup).transpose()?;
    info!(%addr, scheme, data_dir = %config.data_dir.display(), "sift node listening");
    Ok(RunningNode {
        addr,
        node,
        sessions,
        cluster,
        scheme,
        stop: Some(stop),
        server,
        reloader,
        data_dir: config.data_dir.clone(),
        dir_lock,
    })
}

/// Reads the certificate and key again on every SIGHUP (both listeners share them); a
/// reload that fails is logged and the certificate in use stays.
fn reload_on_sighup(
    tls: sift_cluster::tls::ServerTls,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    Ok(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let _ = tls.reload(); // logged and counted inside
        }
    }))
}
