//! The nemesis: one fault at a time, chosen by a seeded RNG, held a while, then healed.
//! Partitions are blackhole routes inside the nodes' namespaces (there is no iptables here);
//! slow links are `tc netem` delay and loss where the kernel offers it, else a `tc tbf` rate
//! limit.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::cluster::Cluster;

/// The kinds of fault, by the name the summary counts them under.
pub const KINDS: [&str; 8] = [
    "kill",
    "pause",
    "restart",
    "partition_minority",
    "partition_majority",
    "partition_bridge",
    "slow_link",
    "disk_full",
];

/// A fault in force, to heal.
enum Active {
    None,
    Paused(usize),
    Routes(Vec<(usize, usize)>),
    Slow(usize),
    Disk(usize),
}

pub struct Nemesis {
    cluster: Cluster,
    rng: StdRng,
    active: Active,
    /// Whether `tc qdisc ... netem` works on this kernel (probed once).
    netem: Option<bool>,
    pub counts: BTreeMap<String, u64>,
}

impl Nemesis {
    pub fn new(cluster: Cluster, rng: StdRng) -> Nemesis {
        Nemesis {
            cluster,
            rng,
            active: Active::None,
            netem: None,
            counts: KINDS.iter().map(|k| (k.to_string(), 0)).collect(),
        }
    }

    pub fn netem(&self) -> bool {
        self.netem.unwrap_or(false)
    }

    /// A pause between faults, and how long the next one is held.
    pub fn quiet(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(2_000..6_000))
    }

    fn hold(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(4_000..12_000))
    }

    /// Injects one fault (`leader`: the node the cluster names leader, if known, a likely
    /// target) and returns how long to hold it before [`Self::heal`].
    pub fn inject(&mut self, leader: Option<usize>) -> (&'static str, Duration) {
        let n = self.cluster.layout.nodes;
        let kind = KINDS[self.rng.random_range(0..KINDS.len())];
        let target = match leader {
            Some(leader) if self.rng.random_bool(0.5) => leader,
            _ => self.rng.random_range(0..n),
        };
        let hold = self.hold();
        eprintln!(
            "{:>7.1}s nemesis: {kind} on node {} for {hold:?}",
            self.cluster.elapsed().as_secs_f64(),
            target + 1
        );
        match kind {
            "kill" => {
                self.cluster.kill(target, hold);
                self.active = Active::None;
            }
            "pause" => {
                self.cluster.pause(target);
                self.active = Active::Paused(target);
            }
            "restart" => {
                self.cluster.restart(target);
                self.active = Active::None;
            }
            "partition_minority" => {
                let others: Vec<usize> = (0..n).filter(|i| *i != target).collect();
                self.active = Active::Routes(self.cut(&[target], &others));
            }
            "partition_majority" => {
                let mut all: Vec<usize> = (0..n).collect();
                all.shuffle(&mut self.rng);
                let (small, large) = all.split_at(n / 2);
                self.active = Active::Routes(self.cut(small, large));
            }
            "partition_bridge" => {
                // Two halves that cannot talk, and one node (the bridge) that talks to both.
                let mut all: Vec<usize> = (0..n).collect();
                all.shuffle(&mut self.rng);
                let half = (n - 1) / 2;
                let (left, rest) = all.split_at(half);
                let right = &rest[1..];
                self.active = Active::Routes(self.cut(left, right));
            }
            "slow_link" => {
                self.slow(target);
                self.active = Active::Slow(target);
            }
            "disk_full" => {
                self.cluster.fill_disk(target);
                self.active = Active::Disk(target);
            }
            _ => unreachable!("every kind is handled"),
        }
        *self.counts.entry(kind.into()).or_insert(0) += 1;
        (kind, hold)
    }

    /// Heals the fault in force (a killed node is restarted by the supervisor).
    pub fn heal(&mut self) {
        if !matches!(self.active, Active::None) {
            eprintln!(
                "{:>7.1}s nemesis: healed",
                self.cluster.elapsed().as_secs_f64()
            );
        }
        match std::mem::replace(&mut self.active, Active::None) {
            Active::None => {}
            Active::Paused(node) => self.cluster.resume(node),
            Active::Routes(routes) => {
                for (from, to) in routes {
                    let address = format!("{}/32", self.cluster.layout.ip(to));
                    self.ip_in(from, &["route", "del", "blackhole", &address]);
                }
            }
            Active::Slow(node) => {
                self.ip_in_command(node, "tc", &["qdisc", "del", "dev", "eth0", "root"]);
            }
            Active::Disk(node) => self.cluster.free_disk(node),
        }
    }

    /// Blackhole routes both ways between every node of `a` and every node of `b`.
    fn cut(&self, a: &[usize], b: &[usize]) -> Vec<(usize, usize)> {
        let mut routes = Vec::new();
        for &x in a {
            for &y in b {
                for (from, to) in [(x, y), (y, x)] {
                    let address = format!("{}/32", self.cluster.layout.ip(to));
                    self.ip_in(from, &["route", "add", "blackhole", &address]);
                    routes.push((from, to));
                }
            }
        }
        routes
    }

    fn slow(&mut self, node: usize) {
        let netem = [
            "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "150ms", "50ms", "loss", "3%",
        ];
        if self.netem != Some(false) {
            let worked = self.ip_in_command(node, "tc", &netem);
            self.netem = Some(worked);
            if worked {
                return;
            }
        }
        self.ip_in_command(
            node,
            "tc",
            &[
                "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "256kbit", "burst", "16kbit",
                "latency", "400ms",
            ],
        );
    }

    fn ip_in(&self, node: usize, args: &[&str]) -> bool {
        self.ip_in_command(node, "ip", args)
    }

    /// Runs `program args` inside node `node`'s namespace; whether it succeeded.
    fn ip_in_command(&self, node: usize, program: &str, args: &[&str]) -> bool {
        let namespace = self.cluster.layout.namespace(node);
        Command::new("ip")
            .args(["netns", "exec", &namespace, program])
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}
