//! How Raft messages leave a node: the [`Transport`] trait, and [`MemoryNetwork`], an
//! in-process network for tests that can partition nodes, drop and duplicate messages, and
//! lose nodes (a dropped driver thread).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use raft::eraftpb::Message;

use super::driver::RaftHandle;
use super::storage::PeerAddress;

/// Sends Raft messages to peers. Called from the Raft thread: implementations must not block
/// (queue and return). A message may be lost; raft-rs retransmits.
pub trait Transport: Send + Sync + 'static {
    /// Sends `message` to `message.to`.
    fn send(&self, message: Message);
    /// The addresses of the members changed (a conf change or snapshot was applied).
    fn set_peers(&self, _peers: &BTreeMap<u64, PeerAddress>) {}
}

#[derive(Default)]
struct NetworkState {
    nodes: HashMap<u64, RaftHandle>,
    /// Node -> group; messages between different groups are dropped.
    groups: HashMap<u64, u32>,
    /// Directed links that drop everything.
    cut: HashSet<(u64, u64)>,
    /// Probability (0..=1000 per mille) that a message is dropped / duplicated.
    drop_per_mille: u32,
    duplicate_per_mille: u32,
    rng: u64,
    delivered: u64,
    dropped: u64,
}

impl NetworkState {
    fn roll(&mut self) -> u32 {
        // xorshift64*: deterministic for a given seed
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as u32 % 1000
    }
}

/// An in-memory network between Raft nodes of one process.
#[derive(Clone)]
pub struct MemoryNetwork {
    state: Arc<Mutex<NetworkState>>,
}

impl MemoryNetwork {
    /// A network whose random drops and duplicates follow `seed`.
    pub fn new(seed: u64) -> Self {
        MemoryNetwork {
            state: Arc::new(Mutex::new(NetworkState {
                rng: seed | 1,
                ..Default::default()
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NetworkState> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The transport node `from` sends through.
    pub fn transport(&self, from: u64) -> MemoryTransport {
        MemoryTransport {
            from,
            network: self.clone(),
        }
    }

    /// Connects a running node: messages to `id` are stepped into `handle`.
    pub fn register(&self, id: u64, handle: RaftHandle) {
        self.lock().nodes.insert(id, handle);
    }

    /// Disconnects a node (it crashed or was stopped): messages to it are lost.
    pub fn unregister(&self, id: u64) {
        self.lock().nodes.remove(&id);
    }

    /// Splits the nodes into groups that cannot talk to each other; nodes not named are in a
    /// group of their own.
    pub fn partition(&self, groups: &[&[u64]]) {
        let mut state = self.lock();
        state.groups.clear();
        let mut next = 1;
        for group in groups {
            for id in *group {
                state.groups.insert(*id, next);
            }
            next += 1;
        }
        let ids: Vec<u64> = state.nodes.keys().copied().collect();
        for id in ids {
            if let std::collections::hash_map::Entry::Vacant(vacant) = state.groups.entry(id) {
                vacant.insert(next);
                next += 1;
            }
        }
    }

    /// Cuts the link from `from` to `to` (one direction).
    pub fn cut(&self, from: u64, to: u64) {
        self.lock().cut.insert((from, to));
    }

    /// Removes every partition and cut link.
    pub fn heal(&self) {
        let mut state = self.lock();
        state.groups.clear();
        state.cut.clear();
    }

    /// Drops and duplicates messages at random, in per mille.
    pub fn set_faults(&self, drop_per_mille: u32, duplicate_per_mille: u32) {
        let mut state = self.lock();
        state.drop_per_mille = drop_per_mille.min(1000);
        state.duplicate_per_mille = duplicate_per_mille.min(1000);
    }

    /// Messages delivered and dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.delivered, state.dropped)
    }

    fn deliver(&self, from: u64, message: Message) {
        let to = message.to;
        let (target, copies) = {
            let mut state = self.lock();
            let separated = match (state.groups.get(&from), state.groups.get(&to)) {
                (Some(a), Some(b)) => a != b,
                _ => false,
            };
            let target = state.nodes.get(&to).cloned();
            let dropped = separated
                || state.cut.contains(&(from, to))
                || target.is_none()
                || (state.drop_per_mille > 0 && state.roll() < state.drop_per_mille);
            if dropped {
                state.dropped += 1;
                return;
            }
            let copies =
                if state.duplicate_per_mille > 0 && state.roll() < state.duplicate_per_mille {
                    2
                } else {
                    1
                };
            state.delivered += 1;
            (target, copies)
        };
        if let Some(target) = target {
            for _ in 1..copies {
                target.step(message.clone());
            }
            target.step(message);
        }
    }
}

/// One node's side of a [`MemoryNetwork`].
pub struct MemoryTransport {
    from: u64,
    network: MemoryNetwork,
}

impl Transport for MemoryTransport {
    fn send(&self, message: Message) {
        self.network.deliver(self.from, message);
    }
}
