//! The real `sift serve` in a child process.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{ApiClient, WAIT, require_model};

/// The line `sift serve` prints once it listens.
const LISTENING: &str = "sift listening on ";

/// A `sift serve --data-dir D --listen 127.0.0.1:0` child process. Killed (SIGKILL) on drop.
pub struct NodeProcess {
    /// Base URL of the node's HTTP API.
    pub url: String,
    pub child: Child,
    pub data_dir: PathBuf,
    /// The node's stderr (its logs), next to the data dir.
    pub log_path: PathBuf,
}

impl NodeProcess {
    /// Starts a node on `data_dir` with extra environment variables (e.g.
    /// `("SIFT_DEBUG_FAULTS", "1")`) and waits, bounded, until it listens.
    pub fn start(data_dir: &Path, extra_env: &[(&str, &str)]) -> NodeProcess {
        NodeProcess::start_binary(&binary(), data_dir, extra_env)
    }

    /// [`NodeProcess::start`] with an explicit binary, e.g. `env!("CARGO_BIN_EXE_sift-under-test")`.
    pub fn start_binary(binary: &Path, data_dir: &Path, extra_env: &[(&str, &str)]) -> NodeProcess {
        NodeProcess::try_start_binary(binary, data_dir, extra_env).unwrap_or_else(|status| {
            panic!(
                "the node exited before listening ({status:?}); its log:\n{}",
                tail(&log_path_for(data_dir))
            )
        })
    }

    /// [`NodeProcess::start`], or the exit status of a node that ended before it listened
    /// (for tests of nodes that crash while starting).
    pub fn try_start(
        data_dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> Result<NodeProcess, ExitStatus> {
        NodeProcess::try_start_binary(&binary(), data_dir, extra_env)
    }

    fn try_start_binary(
        binary: &Path,
        data_dir: &Path,
        extra_env: &[(&str, &str)],
    ) -> Result<NodeProcess, ExitStatus> {
        let model = require_model();
        assert!(
            binary.is_file(),
            "the node binary {} does not exist",
            binary.display()
        );
        let log_path = log_path_for(data_dir);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap_or_else(|error| panic!("opening {}: {error}", log_path.display()));
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .env("SIFT_MODEL_DIR", &model)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        // Settings of the outer environment must not leak into the node under test (an
        // outer OTLP endpoint would have it export spans off this machine).
        for (name, _) in std::env::vars_os() {
            if let Some(name) = name.to_str().filter(|n| {
                (n.starts_with("SIFT_") && *n != "SIFT_MODEL_DIR") || n.starts_with("OTEL_")
            }) {
                command.env_remove(name);
            }
        }
        // Every test node shares one admin key; `extra_env` may override it ("" for none).
        command.env("SIFT_ADMIN_KEY", sift_node::config::TEST_ADMIN_KEY);
        // URL fetches of a test node reach loopback and nothing else (as `Config::for_test`).
        command.env("SIFT_URL_FETCH_LOOPBACK_ONLY", "true");
        for (name, value) in extra_env {
            command.env(name, value);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", binary.display()));

        // Read stdout on a thread so the wait for the listening line is bounded; the thread
        // keeps draining stdout until the process ends.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines, received) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = lines.send(line);
            }
        });
        let started = Instant::now();
        let url = loop {
            let left = WAIT.saturating_sub(started.elapsed());
            match received.recv_timeout(left) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix(LISTENING) {
                        break url.trim().to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(child.wait().expect("waiting for the node"));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "the node did not listen within {WAIT:?}; its log:\n{}",
                        tail(&log_path)
                    );
                }
            }
        };
        Ok(NodeProcess {
            url,
            child,
            data_dir: data_dir.to_path_buf(),
            log_path,
        })
    }

    /// A cluster member on `data_dir` with internal address `internal`, joining `join` when
    /// given, with `secret` and extra environment variables.
    pub fn start_member(
        data_dir: &Path,
        secret: &str,
        internal: &str,
        join: Option<&str>,
        extra_env: &[(&str, &str)],
    ) -> NodeProcess {
        let mut env = vec![
            ("SIFT_CLUSTER_SECRET", secret),
            ("SIFT_INTERNAL_LISTEN", internal),
        ];
        if let Some(join) = join {
            env.push(("SIFT_JOIN", join));
        }
        env.extend_from_slice(extra_env);
        NodeProcess::start(data_dir, &env)
    }

    pub fn client(&self) -> ApiClient {
        ApiClient::new(&self.url)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) until the node is ready (a cluster member may not know its leader
    /// yet), then checks that it loaded the embedded model (tests of search quality and of
    /// dense search mean nothing without it).
    pub async fn require_embedded_model(&self) {
        let started = Instant::now();
        let ready = loop {
            let answer = self.client().get("/readyz").await;
            if answer.status == 200 {
                break answer.body;
            }
            assert!(
                started.elapsed() < WAIT,
                "the node is not ready after {WAIT:?}: {}",
                answer.body
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            ready["embedded_model"].is_string(),
            "the node has no embedded model: {}",
            ready["embedded_model_error"]
        );
    }

    /// SIGKILL (std's `Child::kill` on unix) and reap: the process gets no chance to clean up.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let status = self.child.wait().expect("waiting for the killed node");
        assert!(
            !status.success(),
            "a SIGKILLed node does not exit cleanly: {status:?}"
        );
    }

    /// SIGTERM, then a bounded wait for a graceful exit. Returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill -TERM");
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the node") {
                return status;
            }
            if started.elapsed() > WAIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the node did not exit within {WAIT:?} of SIGTERM; its log:\n{}",
                    tail(&self.log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status, if the process has ended (reaped), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("polling the node")
    }

    /// The node's log file (its stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last lines of the node's log, for failure messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log_path)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `sift-under-test` binary: cargo's runtime variable when set, else next to the test
/// executable's `deps/` folder (where cargo puts a package's binaries for its integration tests).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_sift-under-test") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe
        .parent()
        .expect("the test executable's folder")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(format!("sift-under-test{}", std::env::consts::EXE_SUFFIX))
}

fn log_path_for(data_dir: &Path) -> PathBuf {
    let name = data_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("node");
    data_dir.with_file_name(format!("{name}.log"))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
