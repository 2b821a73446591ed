//! The five nodes, each `sift serve` inside its own network namespace (made by
//! `scripts/chaos.sh`), and the supervisor that restarts a node that exits on its own.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sift_tests::chaos::Exits;

pub const SECRET: &str = "sift-chaos-cluster-secret";
const PUBLIC_PORT: u16 = 7700;
const INTERNAL_PORT: u16 = 7800;
/// An exit within this long after a disk fault healed is still the disk fault's. A node whose
/// Raft storage failed on the full disk drains its connections and closes its stores for up to
/// 15 s before it exits (`sift serve`, EX_SOFTWARE), so a failure met just before the heal
/// exits up to 15 s after it: the grace covers that and the failure's detection. (CI run of
/// stop 45: node 5 failed within the 1 s of a disk fault cut short by the soak's end and exited
/// 15.3 s after the heal, with status 70.)
const DISK_GRACE: Duration = Duration::from_secs(30);

/// Where the nodes live: `--netns-prefix`, `--net`, `--work` of the driver.
#[derive(Clone, Debug)]
pub struct Layout {
    pub binary: PathBuf,
    pub netns_prefix: String,
    /// The first three octets of the nodes' addresses (node i is `NET.i`).
    pub net: String,
    /// Node i's data dir is `WORK/n{i}/data` (a tmpfs mounted at `WORK/n{i}`); logs in
    /// `WORK/logs`.
    pub work: PathBuf,
    pub nodes: usize,
    pub model_dir: PathBuf,
}

impl Layout {
    pub fn namespace(&self, node: usize) -> String {
        format!("{}-n{}", self.netns_prefix, node + 1)
    }

    pub fn ip(&self, node: usize) -> String {
        format!("{}.{}", self.net, node + 1)
    }

    pub fn url(&self, node: usize) -> String {
        format!("http://{}:{PUBLIC_PORT}", self.ip(node))
    }

    pub fn mount(&self, node: usize) -> PathBuf {
        self.work.join(format!("n{}", node + 1))
    }

    fn data_dir(&self, node: usize) -> PathBuf {
        self.mount(node).join("data")
    }

    fn log_path(&self, node: usize) -> PathBuf {
        self.work.join("logs").join(format!("n{}.log", node + 1))
    }
}

/// One node's process and the faults on it.
#[derive(Default)]
struct NodeState {
    child: Option<Child>,
    /// Not restarted before this instant (a kill of the nemesis holds it down a while).
    down_until: Option<Instant>,
    paused: bool,
    /// A graceful stop of the nemesis is under way: the exit is expected.
    stopping: bool,
    disk_full: bool,
    disk_healed_at: Option<Instant>,
    started: u64,
}

/// The nodes, shared by the nemesis, the supervisor and the final checks.
#[derive(Clone)]
pub struct Cluster {
    pub layout: Layout,
    nodes: Arc<Mutex<Vec<NodeState>>>,
    exits: Arc<Mutex<BTreeMap<usize, Exits>>>,
    origin: Instant,
}

impl Cluster {
    pub fn new(layout: Layout, origin: Instant) -> Cluster {
        let nodes = (0..layout.nodes).map(|_| NodeState::default()).collect();
        std::fs::create_dir_all(layout.work.join("logs")).expect("creating the log folder");
        Cluster {
            layout,
            nodes: Arc::new(Mutex::new(nodes)),
            exits: Arc::new(Mutex::new(BTreeMap::new())),
            origin,
        }
    }

    /// Time since the run started (for the log lines).
    pub fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<NodeState>> {
        self.nodes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Starts node `node`'s process (node 0 bootstraps; the others join it the first time).
    pub fn start(&self, node: usize) {
        let mut nodes = self.lock();
        self.spawn(node, &mut nodes[node]);
    }

    fn spawn(&self, node: usize, state: &mut NodeState) {
        let layout = &self.layout;
        let data = layout.data_dir(node);
        let log_path = layout.log_path(node);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("opening a node's log");
        let stdout = log.try_clone().expect("cloning a log handle");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &layout.namespace(node)])
            .arg(&layout.binary)
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen")
            .arg(format!("{}:{PUBLIC_PORT}", layout.ip(node)))
            .arg("--internal-listen")
            .arg(format!("{}:{INTERNAL_PORT}", layout.ip(node)));
        if node != 0 {
            command.arg("--join").arg(layout.url(0));
        }
        for (name, _) in std::env::vars_os() {
            if let Some(name) = name.to_str().filter(|n| n.starts_with("SIFT_")) {
                command.env_remove(name);
            }
        }
        command
            .env("SIFT_MODEL_DIR", &layout.model_dir)
            .env("SIFT_CLUSTER_SECRET", SECRET)
            .env("SIFT_ADMIN_KEY", sift_node::config::TEST_ADMIN_KEY)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(log));
        // `ip netns exec` execs the node: the child's pid is the node's.
        match command.spawn() {
            Ok(child) => {
                state.child = Some(child);
                state.started += 1;
                state.paused = false;
            }
            Err(error) => eprintln!("starting node {}: {error}", node + 1),
        }
    }

    fn pid(&self, node: usize) -> Option<u32> {
        self.lock()[node].child.as_ref().map(Child::id)
    }

    fn signal(pid: u32, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status();
    }

    /// kill -9; the supervisor restarts it after `down`.
    pub fn kill(&self, node: usize, down: Duration) {
        let mut nodes = self.lock();
        let state = &mut nodes[node];
        if let Some(mut child) = state.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        state.paused = false;
        state.down_until = Some(Instant::now() + down);
    }

    /// SIGTERM (a graceful stop), bounded, then restarted by the supervisor.
    pub fn restart(&self, node: usize) {
        let Some(pid) = self.pid(node) else { return };
        self.lock()[node].stopping = true;
        Cluster::signal(pid, "TERM");
        let started = Instant::now();
        loop {
            {
                let mut nodes = self.lock();
                let state = &mut nodes[node];
                let done = match state.child.as_mut() {
                    Some(child) => !matches!(child.try_wait(), Ok(None)),
                    None => true,
                };
                if done || started.elapsed() > Duration::from_secs(20) {
                    if let Some(mut child) = state.child.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    state.stopping = false;
                    state.down_until = Some(Instant::now() + Duration::from_millis(500));
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pause(&self, node: usize) {
        if let Some(pid) = self.pid(node) {
            Cluster::signal(pid, "STOP");
            self.lock()[node].paused = true;
        }
    }

    pub fn resume(&self, node: usize) {
        let pid = self.pid(node);
        if let Some(pid) = pid {
            Cluster::signal(pid, "CONT");
        }
        self.lock()[node].paused = false;
    }

    /// Fills the node's tmpfs with a file until the disk is full.
    pub fn fill_disk(&self, node: usize) {
        use std::io::Write;
        self.lock()[node].disk_full = true;
        let path = filler(&self.layout.mount(node));
        let Ok(mut file) = std::fs::File::create(&path) else {
            return;
        };
        let chunk = vec![0u8; 1 << 20];
        while file.write_all(&chunk).is_ok() {}
        // The last partial chunk: fill the bytes left.
        let mut small = vec![0u8; 4096];
        while file.write_all(&small).is_ok() {}
        small.truncate(1);
        while file.write_all(&small).is_ok() {}
    }

    pub fn free_disk(&self, node: usize) {
        let _ = std::fs::remove_file(filler(&self.layout.mount(node)));
        let mut nodes = self.lock();
        nodes[node].disk_full = false;
        nodes[node].disk_healed_at = Some(Instant::now());
    }

    /// Restarts nodes that are down (after their hold) and records exits nobody asked for.
    /// Runs until `stop`.
    pub fn supervise(&self, stop: &std::sync::atomic::AtomicBool) {
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            self.supervise_once();
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn supervise_once(&self) {
        let now = Instant::now();
        let mut nodes = self.lock();
        for (node, state) in nodes.iter_mut().enumerate() {
            if let Some(child) = state.child.as_mut()
                && !state.stopping
                && let Ok(Some(status)) = child.try_wait()
            {
                let explained = state.disk_full
                    || state
                        .disk_healed_at
                        .is_some_and(|at| now.duration_since(at) < DISK_GRACE);
                eprintln!(
                    "{:>7.1}s node {} exited on its own: {status}{}",
                    now.duration_since(self.origin).as_secs_f64(),
                    node + 1,
                    if explained { " (disk fault)" } else { "" }
                );
                let at = now.duration_since(self.origin).as_nanos() as u64;
                self.exits
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .entry(node)
                    .or_default()
                    .at
                    .push((at, explained));
                state.child = None;
                state.down_until = Some(now + Duration::from_secs(1));
            }
            if state.child.is_none() && state.down_until.is_none_or(|until| now >= until) {
                state.down_until = None;
                self.spawn(node, state);
            }
        }
    }

    pub fn exits(&self) -> BTreeMap<usize, Exits> {
        self.exits
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }

    /// Node starts (first starts and restarts).
    pub fn starts(&self) -> u64 {
        self.lock().iter().map(|state| state.started).sum()
    }

    /// Resumes paused nodes and frees full disks (the end of the run).
    pub fn heal(&self) {
        for node in 0..self.layout.nodes {
            let (paused, full) = {
                let nodes = self.lock();
                (nodes[node].paused, nodes[node].disk_full)
            };
            if paused {
                self.resume(node);
            }
            if full {
                self.free_disk(node);
            }
        }
    }

    /// Kills every node (the end of the run).
    pub fn stop_all(&self) {
        let mut nodes = self.lock();
        for state in nodes.iter_mut() {
            if let Some(mut child) = state.child.take() {
                if state.paused {
                    Cluster::signal(child.id(), "CONT");
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            state.down_until = Some(Instant::now() + Duration::from_secs(3600));
        }
    }
}

fn filler(mount: &Path) -> PathBuf {
    mount.join("filler")
}
