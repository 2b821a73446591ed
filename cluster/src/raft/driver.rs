//! The Raft driver: one `RawNode` on its own named thread, fed by a bounded channel.
//!
//! [`RaftNode::start`] opens the node from its [`SledRaftStorage`] and state machine and spawns
//! the thread; [`RaftHandle`] (cheap to clone) is how the rest of the node talks to it:
//! proposals, peer messages, conf changes, read-index requests and the status view.
//!
//! Guarantees:
//! - a proposal is answered only after its entry is applied, with the state machine's outcome;
//! - when the answer cannot be known (leadership lost, entry superseded by a new leader, the
//!   request timed out, the thread stopped) the caller gets a retryable error, never silence.
//!   A retry with the same [`Proposal`] (same op id) is applied at most once;
//! - after a restart nothing is applied twice: `applied` is restored from the state machine and
//!   the storage, and the state machine skips indexes at or below its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType,
    Message, MessageType, Snapshot,
};
use raft::{ProgressState, RawNode, SnapshotStatus, StateRole};
use serde::{Deserialize, Serialize};
use sift_storage::meta::{MetaOp, MetaOutcome};
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

use super::logger::raft_logger;
use super::network::Transport;
use super::state_machine::{Proposal, RaftStateMachine};
use super::storage::{PeerAddress, SledRaftStorage};
use crate::error::{ClusterError, Result};

/// Log entries removed per pass of the Raft loop while compacting (about 2 ms of sled work).
const COMPACT_STEP: u64 = 128;

/// Settings of one Raft node. [`RaftConfig::new`] has defaults for a LAN; `for_test` is faster.
#[derive(Clone, Debug)]
pub struct RaftConfig {
    /// This node's Raft id (non-zero, unique in the cluster, persisted in the data dir).
    pub id: u64,
    pub tick_interval: Duration,
    /// Election timeout in ticks (randomised by raft-rs between this and twice this).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// A snapshot is taken and the log compacted once this many entries were applied since the
    /// last snapshot.
    pub compact_threshold: u64,
    /// Entries kept in the log below a snapshot, so followers slightly behind need no snapshot.
    pub compact_keep: u64,
    pub max_size_per_msg: u64,
    pub max_inflight_msgs: usize,
    /// Capacity of the input channel; beyond it proposals are refused (retryable) and peer
    /// messages dropped (raft-rs retransmits).
    pub input_capacity: usize,
    /// Proposals and reads not answered within this many ticks get a retryable error.
    pub request_timeout_ticks: u64,
}

impl RaftConfig {
    pub fn new(id: u64) -> Self {
        RaftConfig {
            id,
            tick_interval: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            compact_threshold: 10_000,
            compact_keep: 1_000,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 256,
            input_capacity: 8192,
            request_timeout_ticks: 100,
        }
    }

    /// Short ticks and a small compaction threshold, for tests.
    pub fn for_test(id: u64) -> Self {
        RaftConfig {
            tick_interval: Duration::from_millis(20),
            compact_threshold: 50,
            compact_keep: 5,
            request_timeout_ticks: 250,
            ..RaftConfig::new(id)
        }
    }
}

/// What a snapshot's data holds: the member addresses and the state machine's export.
#[derive(Serialize, Deserialize)]
struct SnapshotPayload {
    peers: BTreeMap<u64, PeerAddress>,
    state: Vec<u8>,
}

impl SnapshotPayload {
    fn encode(&self) -> Result<Vec<u8>> {
        bincode::serde::encode_to_vec(self, bincode::config::standard())
            .map_err(|error| ClusterError::Invalid(format!("encode snapshot: {error}")))
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(payload, _)| payload)
            .map_err(|error| ClusterError::Invalid(format!("decode snapshot: {error}")))
    }
}

/// The Raft view of one node, for `GET /v1/cluster`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClusterStatus {
    pub id: u64,
    /// `leader`, `follower`, `candidate`, `pre_candidate` or `learner`.
    pub role: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub commit: u64,
    pub applied: u64,
    pub first_index: u64,
    pub last_index: u64,
    /// The index of the last snapshot installed or log compaction (entries up to it are
    /// reflected in the state machine and may have left the log).
    pub snapshot_index: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Every other member; replication progress is known on the leader only.
    pub peers: Vec<PeerStatus>,
    /// The highest node id ever in the cluster (removed ones included).
    pub max_node_id: u64,
    /// Set once the Raft log or the state machine could not be written: the Raft thread has
    /// stopped and this node's metadata no longer moves (the node must restart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_failure: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PeerStatus {
    pub id: u64,
    pub address: Option<PeerAddress>,
    /// `voter` or `learner`.
    pub role: String,
    pub matched: Option<u64>,
    pub next_index: Option<u64>,
    /// `probe`, `replicate` or `snapshot` (leader only).
    pub progress: Option<String>,
    pub recent_active: Option<bool>,
    /// Milliseconds since a message from this peer arrived, if one ever did.
    pub last_contact_ms: Option<u64>,
    /// A message from it arrived within two election timeouts.
    pub healthy: bool,
}

enum Input {
    Propose {
        proposal: Box<Proposal>,
        reply: oneshot::Sender<Result<MetaOutcome>>,
        started: Instant,
    },
    Peer(Box<Message>),
    ConfChange {
        change: ConfChangeV2,
        reply: oneshot::Sender<Result<ConfState>>,
    },
    ReadIndex {
        reply: oneshot::Sender<Result<u64>>,
    },
    Tick,
    Campaign,
    ReportSnapshot {
        to: u64,
        delivered: bool,
    },
    ReportUnreachable(u64),
    /// Fault injection: the next storage write of `on_ready` fails.
    FailStorage,
}

/// How the rest of the node talks to the Raft thread. Cheap to clone.
#[derive(Clone)]
pub struct RaftHandle {
    id: u64,
    sender: SyncSender<Input>,
    status: Arc<RwLock<ClusterStatus>>,
}

impl RaftHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    fn send(&self, input: Input) -> Result<()> {
        match self.sender.try_send(input) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                Err(ClusterError::Dropped("raft input queue is full".into()))
            }
            Err(TrySendError::Disconnected(_)) => Err(ClusterError::Stopped),
        }
    }

    /// Proposes `op` under a fresh op id; see [`Self::propose_proposal`].
    pub async fn propose(&self, op: MetaOp) -> Result<MetaOutcome> {
        self.propose_proposal(Proposal::new(op)).await
    }

    /// Proposes on this node, which must be the leader ([`ClusterError::NotLeader`] names the
    /// one it knows). Answers after the entry is applied here. A retryable error means the
    /// outcome is unknown: retry with the same `proposal` (same op id) and it applies once.
    pub async fn propose_proposal(&self, proposal: Proposal) -> Result<MetaOutcome> {
        let (reply, answer) = oneshot::channel();
        self.send(Input::Propose {
            proposal: Box::new(proposal),
            reply,
            started: Instant::now(),
        })?;
        answer.await.map_err(|_| ClusterError::Stopped)?
    }

    /// Steps a message from a peer into the node. Best effort: when the input queue is full
    /// the message is dropped and raft-rs retransmits.
    pub fn step(&self, message: Message) {
        if self.send(Input::Peer(Box::new(message))).is_err() {
            metrics::counter!("sift_raft_messages_dropped_total", "reason" => "input_full")
                .increment(1);
        }
    }

    /// A linearizable read barrier (ReadIndex): resolves once this node has applied everything
    /// committed when the request reached the leader. Returns that index.
    pub async fn read_index(&self) -> Result<u64> {
        let (reply, answer) = oneshot::channel();
        self.send(Input::ReadIndex { reply })?;
        answer.await.map_err(|_| ClusterError::Stopped)?
    }

    /// Proposes a membership change (must be called on the leader). `addresses` are recorded
    /// for the nodes the change adds. Answers once the change is applied here.
    pub async fn change_membership(
        &self,
        changes: Vec<ConfChangeSingle>,
        addresses: BTreeMap<u64, PeerAddress>,
    ) -> Result<ConfState> {
        let mut change = ConfChangeV2::default();
        change.set_changes(changes.into());
        change.context = serde_json::to_vec(&addresses)
            .map_err(|error| ClusterError::Invalid(error.to_string()))?
            .into();
        let (reply, answer) = oneshot::channel();
        self.send(Input::ConfChange { change, reply })?;
        answer.await.map_err(|_| ClusterError::Stopped)?
    }

    /// Adds `id` as a learner: it receives the log but does not vote.
    pub async fn add_learner(&self, id: u64, address: PeerAddress) -> Result<ConfState> {
        let change = conf_change_single(id, ConfChangeType::AddLearnerNode);
        self.change_membership(vec![change], BTreeMap::from([(id, address)]))
            .await
    }

    /// Makes `id` (a learner) a voter.
    pub async fn promote_voter(&self, id: u64) -> Result<ConfState> {
        let change = conf_change_single(id, ConfChangeType::AddNode);
        self.change_membership(vec![change], BTreeMap::new()).await
    }

    /// Waits (polling the status, up to `timeout`) until learner `id` has replicated the
    /// leader's commit index, then promotes it.
    pub async fn promote_when_caught_up(&self, id: u64, timeout: Duration) -> Result<ConfState> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status();
            if status.leader != Some(self.id) {
                return Err(ClusterError::NotLeader {
                    leader: status.leader,
                });
            }
            let caught_up = status
                .peers
                .iter()
                .any(|peer| peer.id == id && peer.matched.is_some_and(|m| m >= status.commit));
            if caught_up {
                return self.promote_voter(id).await;
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Dropped(format!(
                    "learner {id} did not catch up in {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Removes `id` from the cluster.
    pub async fn remove_node(&self, id: u64) -> Result<ConfState> {
        let change = conf_change_single(id, ConfChangeType::RemoveNode);
        self.change_membership(vec![change], BTreeMap::new()).await
    }

    /// Starts an election now (tests and leader hand-over).
    pub fn campaign(&self) -> Result<()> {
        self.send(Input::Campaign)
    }

    /// An extra tick (the thread also ticks on its own every `tick_interval`).
    pub fn tick(&self) -> Result<()> {
        self.send(Input::Tick)
    }

    /// The transport tells whether a snapshot reached `to`.
    pub fn report_snapshot(&self, to: u64, delivered: bool) {
        let _ = self.send(Input::ReportSnapshot { to, delivered });
    }

    /// The transport could not reach `to`.
    pub fn report_unreachable(&self, to: u64) {
        let _ = self.send(Input::ReportUnreachable(to));
    }

    /// Fault injection (tests, the node's `debug_faults`): the Raft thread acts as if its next
    /// storage write failed, as on a full disk.
    pub fn fail_storage(&self) -> Result<()> {
        self.send(Input::FailStorage)
    }

    /// Why the Raft thread stopped on a storage failure, if it did.
    pub fn storage_failure(&self) -> Option<String> {
        self.status
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .storage_failure
            .clone()
    }

    /// The latest status published by the Raft thread.
    pub fn status(&self) -> ClusterStatus {
        self.status
            .read()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }
}

/// A running Raft node: its thread and a handle. Dropping it stops the thread (pending
/// requests get [`ClusterError::Stopped`]).
pub struct RaftNode {
    handle: RaftHandle,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RaftNode {
    /// Opens the node from `storage` and `state_machine` and starts its thread. A storage that
    /// belongs to another node id is refused. A brand new storage must be bootstrapped
    /// ([`SledRaftStorage::bootstrap`]) or will learn its membership from the leader (a joining
    /// learner).
    pub fn start(
        config: RaftConfig,
        storage: SledRaftStorage,
        state_machine: Arc<dyn RaftStateMachine>,
        transport: Arc<dyn Transport>,
    ) -> Result<RaftNode> {
        if config.id == 0 {
            return Err(ClusterError::Invalid("raft node id 0 is reserved".into()));
        }
        match storage.node_id()? {
            Some(existing) if existing != config.id => {
                return Err(ClusterError::Invalid(format!(
                    "this data dir belongs to raft node {existing}, not {}",
                    config.id
                )));
            }
            Some(_) => {}
            None => storage.set_node_id(config.id)?,
        }

        // A snapshot installed just before a crash may not have reached the state machine.
        let snapshot = storage.stored_snapshot()?;
        let snapshot_index = snapshot.get_metadata().index;
        let mut applied = storage.applied()?.max(state_machine.applied_index());
        if snapshot_index > applied && !snapshot.data.is_empty() {
            let payload = SnapshotPayload::decode(&snapshot.data)?;
            state_machine.import(snapshot_index, &payload.state)?;
            storage.set_peers(&payload.peers)?;
            storage.set_conf_state(snapshot.get_metadata().get_conf_state(), snapshot_index)?;
            applied = snapshot_index;
        }
        applied = applied.max(snapshot_index);
        // Entries are applied before the hard state of their Ready is persisted: after a crash
        // the applied index may be ahead of the persisted commit. Applied entries are committed.
        let hard_state = storage.hard_state()?;
        if hard_state.commit < applied {
            storage.set_commit(applied)?;
        }

        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied,
            max_size_per_msg: config.max_size_per_msg,
            max_inflight_msgs: config.max_inflight_msgs,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        raft_config
            .validate()
            .map_err(|error| ClusterError::Invalid(error.to_string()))?;
        let logger = raft_logger(config.id);
        let raw = RawNode::new(&raft_config, storage.clone(), &logger)
            .map_err(|error| ClusterError::Invalid(format!("raft: {error}")))?;

        // The log may have been compacted past the stored snapshot (compaction stores none).
        let snapshot_index = snapshot_index.max(raw.raft.raft_log.first_index() - 1);
        let peers = storage.peers()?;
        transport.set_peers(&peers);
        let (sender, receiver) = std::sync::mpsc::sync_channel(config.input_capacity);
        let status = Arc::new(RwLock::new(ClusterStatus::default()));
        let handle = RaftHandle {
            id: config.id,
            sender,
            status: status.clone(),
        };
        let stopping = Arc::new(AtomicBool::new(false));
        let conf_state = storage.conf_state()?;
        let mut driver = Driver {
            raw,
            storage,
            state_machine,
            transport,
            receiver,
            applied,
            snapshot_index,
            compact_to: 0,
            conf_state,
            peers,
            pending: HashMap::new(),
            pending_reads: HashMap::new(),
            waiting_reads: Vec::new(),
            next_read_id: 0,
            ticks: 0,
            was_leader: false,
            leader: 0,
            last_contact: HashMap::new(),
            snapshot_sent_tick: HashMap::new(),
            status,
            stopping: stopping.clone(),
            storage_failure: None,
            inject_storage_failure: false,
            config: config.clone(),
        };
        driver.publish_status();
        info!(raft_id = config.id, applied, "raft node starting");
        let thread = std::thread::Builder::new()
            .name(format!("sift-raft-{}", config.id))
            .spawn(move || driver.run())
            .map_err(|error| ClusterError::Invalid(format!("spawn raft thread: {error}")))?;
        Ok(RaftNode {
            handle,
            stopping,
            thread: Some(thread),
        })
    }

    /// Makes an empty storage the first member(s) of a new cluster: `members` become the
    /// voters. The state machine's current state (empty, or the metadata of a node that ran
    /// alone so far) becomes the first snapshot, so nothing is lost and a later member catches
    /// up from it. Every member of the initial set must be bootstrapped with the same state;
    /// nodes that join later are not bootstrapped (they learn everything from the leader).
    pub fn bootstrap(
        storage: &SledRaftStorage,
        state_machine: &dyn RaftStateMachine,
        members: BTreeMap<u64, PeerAddress>,
    ) -> Result<()> {
        let conf_state = ConfState {
            voters: members.keys().copied().collect(),
            ..Default::default()
        };
        // At least 1: a snapshot at index 0 is never sent, so a node joining later would
        // replay the log from the start without ever learning the initial members.
        let index = state_machine.applied_index().max(1);
        let payload = SnapshotPayload {
            peers: members.clone(),
            state: state_machine.export()?,
        };
        storage.bootstrap(conf_state, index, payload.encode()?)?;
        storage.set_peers(&members)
    }

    pub fn handle(&self) -> &RaftHandle {
        &self.handle
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.handle.tick(); // wakes the thread if it waits for input
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RaftNode {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

enum Waiter {
    Op(oneshot::Sender<Result<MetaOutcome>>),
    Conf(oneshot::Sender<Result<ConfState>>),
}

impl Waiter {
    fn fail(self, error: ClusterError) {
        match self {
            Waiter::Op(reply) => {
                let _ = reply.send(Err(error));
            }
            Waiter::Conf(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// A committed normal entry on its way to the state machine.
struct Committed {
    index: u64,
    /// None for an entry without data.
    proposal: Option<Result<Proposal>>,
    pending: Option<Pending>,
}

struct Pending {
    term: u64,
    waiter: Waiter,
    started: Instant,
    tick: u64,
}

struct Driver {
    config: RaftConfig,
    raw: RawNode<SledRaftStorage>,
    /// The same tree as the one inside `raw`, for the writes of `on_ready`.
    storage: SledRaftStorage,
    state_machine: Arc<dyn RaftStateMachine>,
    transport: Arc<dyn Transport>,
    receiver: Receiver<Input>,
    applied: u64,
    snapshot_index: u64,
    /// Log entries up to this index are being removed, [`COMPACT_STEP`] at a time.
    compact_to: u64,
    conf_state: ConfState,
    peers: BTreeMap<u64, PeerAddress>,
    /// Proposals and conf changes of this leader, by log index.
    pending: HashMap<u64, Pending>,
    /// Read-index requests waiting for the leader's answer, by request context.
    pending_reads: HashMap<Vec<u8>, (oneshot::Sender<Result<u64>>, u64)>,
    /// Read-index requests waiting for `applied` to reach their index.
    waiting_reads: Vec<(u64, oneshot::Sender<Result<u64>>)>,
    next_read_id: u64,
    ticks: u64,
    was_leader: bool,
    leader: u64,
    last_contact: HashMap<u64, Instant>,
    snapshot_sent_tick: HashMap<u64, u64>,
    status: Arc<RwLock<ClusterStatus>>,
    stopping: Arc<AtomicBool>,
    /// Why the thread stopped, once a storage write failed (published in the status).
    storage_failure: Option<String>,
    /// Fault injection ([`RaftHandle::fail_storage`]): the next `on_ready` fails.
    inject_storage_failure: bool,
}

fn outcome_label(outcome: &Result<MetaOutcome>) -> &'static str {
    match outcome {
        Ok(_) => "applied",
        Err(ClusterError::Storage(_)) => "refused",
        Err(ClusterError::NotLeader { .. }) => "not_leader",
        Err(_) => "dropped",
    }
}

impl Driver {
    fn run(mut self) {
        let interval = self.config.tick_interval;
        let mut next_tick = Instant::now() + interval;
        loop {
            if self.stopping.load(Ordering::Acquire) {
                break;
            }
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.receiver.recv_timeout(wait) {
                Ok(input) => {
                    self.handle_input(input);
                    // Batch: everything already queued goes into the same Ready (one fsync).
                    for _ in 0..1024 {
                        match self.receiver.try_recv() {
                            Ok(input) => self.handle_input(input),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if now >= next_tick {
                self.raw.tick();
                self.ticks += 1;
                self.on_tick();
                next_tick = if now >= next_tick + interval {
                    now + interval
                } else {
                    next_tick + interval
                };
            }
            let ready = if self.inject_storage_failure {
                Err(ClusterError::Storage(sift_storage::StorageError::Io(
                    std::io::Error::other("injected storage failure (debug_faults)"),
                )))
            } else {
                self.on_ready()
            };
            if let Err(error) = ready {
                // The log or the state machine cannot be written: stop rather than diverge, and
                // say so in the status, which the node watches (its /readyz fails and `sift
                // serve` exits so that a supervisor restarts it once the disk has room).
                error!(raft_id = self.config.id, %error, "raft storage failed, stopping the node");
                self.storage_failure = Some(error.to_string());
                self.publish_status();
                break;
            }
            self.publish_status();
        }
        info!(raft_id = self.config.id, "raft node stopped");
        // Dropping the driver drops every pending reply sender: callers get `Stopped`.
    }

    fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    fn leader_hint(&self) -> Option<u64> {
        let leader = self.raw.raft.leader_id;
        (leader != 0).then_some(leader)
    }

    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Propose {
                proposal,
                reply,
                started,
            } => self.propose(*proposal, reply, started),
            Input::Peer(message) => {
                self.last_contact.insert(message.from, Instant::now());
                if message.get_msg_type() == MessageType::MsgSnapshot {
                    metrics::counter!("sift_raft_snapshots_received_total").increment(1);
                    metrics::counter!("sift_raft_snapshot_bytes_total", "direction" => "received")
                        .increment(message.get_snapshot().data.len() as u64);
                }
                if let Err(error) = self.raw.step(*message) {
                    debug!(raft_id = self.config.id, %error, "peer message refused");
                }
            }
            Input::ConfChange { change, reply } => self.propose_conf_change(change, reply),
            Input::ReadIndex { reply } => {
                if self.leader_hint().is_none() {
                    let _ = reply.send(Err(ClusterError::NotLeader { leader: None }));
                    return;
                }
                self.next_read_id += 1;
                let context = self.next_read_id.to_be_bytes().to_vec();
                self.raw.read_index(context.clone());
                self.pending_reads.insert(context, (reply, self.ticks));
            }
            Input::Tick => {}
            Input::Campaign => {
                if let Err(error) = self.raw.campaign() {
                    debug!(raft_id = self.config.id, %error, "campaign refused");
                }
            }
            Input::ReportSnapshot { to, delivered } => {
                let status = if delivered {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
            Input::ReportUnreachable(to) => self.raw.report_unreachable(to),
            Input::FailStorage => {
                warn!(
                    raft_id = self.config.id,
                    "fault injection: the next storage write fails"
                );
                self.inject_storage_failure = true;
            }
        }
    }

    fn propose(
        &mut self,
        proposal: Proposal,
        reply: oneshot::Sender<Result<MetaOutcome>>,
        started: Instant,
    ) {
        if !self.is_leader() {
            metrics::counter!("sift_raft_proposals_total", "outcome" => "not_leader").increment(1);
            let _ = reply.send(Err(ClusterError::NotLeader {
                leader: self.leader_hint(),
            }));
            return;
        }
        let data = match proposal.encode() {
            Ok(data) => data,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let before = self.raw.raft.raft_log.last_index();
        let result = self.raw.propose(Vec::new(), data);
        let index = self.raw.raft.raft_log.last_index();
        match result {
            Ok(()) if index > before => {
                self.pending.insert(
                    index,
                    Pending {
                        term: self.raw.raft.term,
                        waiter: Waiter::Op(reply),
                        started,
                        tick: self.ticks,
                    },
                );
            }
            Ok(()) | Err(_) => {
                metrics::counter!("sift_raft_proposals_total", "outcome" => "dropped").increment(1);
                let reason = match result {
                    Err(error) => error.to_string(),
                    Ok(()) => "not appended".into(),
                };
                let _ = reply.send(Err(ClusterError::Dropped(reason)));
            }
        }
    }

    fn propose_conf_change(
        &mut self,
        change: ConfChangeV2,
        reply: oneshot::Sender<Result<ConfState>>,
    ) {
        if !self.is_leader() {
            let _ = reply.send(Err(ClusterError::NotLeader {
                leader: self.leader_hint(),
            }));
            return;
        }
        let before = self.raw.raft.raft_log.last_index();
        let result = self.raw.propose_conf_change(Vec::new(), change);
        let index = self.raw.raft.raft_log.last_index();
        match result {
            Ok(()) if index > before => {
                self.pending.insert(
                    index,
                    Pending {
                        term: self.raw.raft.term,
                        waiter: Waiter::Conf(reply),
                        started: Instant::now(),
                        tick: self.ticks,
                    },
                );
            }
            // raft-rs refuses a change while another is pending (it appends an empty entry).
            Ok(()) => {
                let _ = reply.send(Err(ClusterError::Dropped(
                    "another membership change is in progress".into(),
                )));
            }
            Err(error) => {
                let _ = reply.send(Err(ClusterError::Dropped(error.to_string())));
            }
        }
    }

    fn on_tick(&mut self) {
        let timeout = self.config.request_timeout_ticks;
        let now = self.ticks;
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, pending)| now.saturating_sub(pending.tick) > timeout)
            .map(|(index, _)| *index)
            .collect();
        for index in expired {
            if let Some(pending) = self.pending.remove(&index) {
                metrics::counter!("sift_raft_proposals_total", "outcome" => "dropped").increment(1);
                pending.waiter.fail(ClusterError::Dropped(
                    "not committed in time; outcome unknown, retry with the same op id".into(),
                ));
            }
        }
        let expired: Vec<Vec<u8>> = self
            .pending_reads
            .iter()
            .filter(|(_, (_, tick))| now.saturating_sub(*tick) > timeout)
            .map(|(context, _)| context.clone())
            .collect();
        for context in expired {
            if let Some((reply, _)) = self.pending_reads.remove(&context) {
                let _ = reply.send(Err(ClusterError::Dropped("read index timed out".into())));
            }
        }
        // raft-rs drops a read-index request silently (no leader, or a new leader that has not
        // committed in its term yet): ask again now and then until it is answered or expires.
        let resend_every = self.config.heartbeat_ticks.max(1) as u64 * 2;
        if now.is_multiple_of(resend_every) && self.leader_hint().is_some() {
            let contexts: Vec<Vec<u8>> = self.pending_reads.keys().cloned().collect();
            for context in contexts {
                self.raw.read_index(context);
            }
        }
        // A snapshot that never arrived leaves the peer paused in raft-rs: report the failure so
        // the leader probes again and resends.
        if self.is_leader() {
            let give_up = 5 * self.config.election_ticks as u64;
            let stuck: Vec<u64> = self
                .raw
                .raft
                .prs()
                .iter()
                .filter(|(id, progress)| {
                    progress.state == ProgressState::Snapshot
                        && self
                            .snapshot_sent_tick
                            .get(id)
                            .is_some_and(|sent| now.saturating_sub(*sent) > give_up)
                })
                .map(|(id, _)| *id)
                .collect();
            for id in stuck {
                self.snapshot_sent_tick.remove(&id);
                self.raw.report_snapshot(id, SnapshotStatus::Failure);
            }
        }
    }

    fn send_messages(&mut self, messages: Vec<Message>) {
        for message in messages {
            if message.get_msg_type() == MessageType::MsgSnapshot {
                metrics::counter!("sift_raft_snapshots_sent_total").increment(1);
                metrics::counter!("sift_raft_snapshot_bytes_total", "direction" => "sent")
                    .increment(message.get_snapshot().data.len() as u64);
                self.snapshot_sent_tick.insert(message.to, self.ticks);
            }
            self.transport.send(message);
        }
    }

    /// Handles one `Ready`. The order matters (raft-rs's documented order): messages ->
    /// snapshot -> committed entries -> persist entries and hard state -> persisted messages ->
    /// advance -> commit index -> (light ready) messages and committed entries -> advance_apply.
    fn on_ready(&mut self) -> Result<()> {
        if !self.raw.has_ready() {
            self.maybe_compact()?;
            return Ok(());
        }
        let mut ready = self.raw.ready();

        let mut lost_leadership = false;
        if let Some(soft_state) = ready.ss() {
            let leader = soft_state.leader_id;
            let is_leader = soft_state.raft_state == StateRole::Leader;
            if leader != self.leader {
                metrics::counter!("sift_raft_leader_changes_total").increment(1);
                info!(
                    raft_id = self.config.id,
                    leader,
                    term = self.raw.raft.term,
                    "raft leader changed"
                );
                self.leader = leader;
            }
            lost_leadership = self.was_leader && !is_leader;
            self.was_leader = is_leader;
        }

        // 1. Messages a leader may send before its own entries are persisted.
        if !ready.messages().is_empty() {
            let messages = ready.take_messages();
            self.send_messages(messages);
        }

        // 2. A snapshot from the leader: install it.
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            self.install_snapshot(&snapshot)?;
        }

        // 3. Committed entries.
        let committed = ready.take_committed_entries();
        self.apply_committed(committed)?;
        if lost_leadership {
            // What committed before the step-down was answered above; the rest may never be.
            self.fail_pending("leadership lost");
        }

        // 4. Persist new entries and the hard state.
        self.storage.persist(ready.entries(), ready.hs())?;

        let read_states = ready.take_read_states();

        // 5. Messages that must wait for persistence (votes, append responses).
        if !ready.persisted_messages().is_empty() {
            let messages = ready.take_persisted_messages();
            self.send_messages(messages);
        }

        // 6. Advance.
        let mut light = self.raw.advance(ready);

        // 7. The commit index moved by the advance.
        if let Some(commit) = light.commit_index() {
            self.storage.set_commit(commit)?;
        }
        let messages = light.take_messages();
        self.send_messages(messages);
        let committed = light.take_committed_entries();
        self.apply_committed(committed)?;

        // 8. Done applying.
        self.raw.advance_apply();

        for state in read_states {
            if let Some((reply, _)) = self.pending_reads.remove(&state.request_ctx) {
                self.waiting_reads.push((state.index, reply));
            }
        }
        self.answer_reads();
        self.storage.set_applied(self.applied)?;
        self.maybe_compact()?;

        let raft = &self.raw.raft;
        metrics::gauge!("sift_raft_term").set(raft.term as f64);
        metrics::gauge!("sift_raft_commit_index").set(raft.raft_log.committed as f64);
        metrics::gauge!("sift_raft_applied_index").set(self.applied as f64);
        metrics::gauge!("sift_raft_apply_lag_entries")
            .set(raft.raft_log.committed.saturating_sub(self.applied) as f64);
        metrics::gauge!("sift_raft_commit_lag_entries").set(
            raft.raft_log
                .last_index()
                .saturating_sub(raft.raft_log.committed) as f64,
        );
        Ok(())
    }

    fn fail_pending(&mut self, why: &str) {
        for (_, pending) in self.pending.drain() {
            metrics::counter!("sift_raft_proposals_total", "outcome" => "dropped").increment(1);
            pending.waiter.fail(ClusterError::Dropped(format!(
                "{why}; outcome unknown, retry with the same op id"
            )));
        }
    }

    fn answer_reads(&mut self) {
        let applied = self.applied;
        let mut still_waiting = Vec::new();
        for (index, reply) in self.waiting_reads.drain(..) {
            if index <= applied {
                let _ = reply.send(Ok(index));
            } else {
                still_waiting.push((index, reply));
            }
        }
        self.waiting_reads = still_waiting;
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<()> {
        let meta = snapshot.get_metadata();
        let index = meta.index;
        let payload = SnapshotPayload::decode(&snapshot.data)?;
        // Log and raft state first (flushed), then the state machine; a crash in between is
        // repaired at start from the stored snapshot.
        self.storage.apply_snapshot(snapshot)?;
        self.state_machine.import(index, &payload.state)?;
        self.storage.set_peers(&payload.peers)?;
        self.storage.set_conf_state(meta.get_conf_state(), index)?;
        self.transport.set_peers(&payload.peers);
        self.peers = payload.peers;
        self.conf_state = meta.get_conf_state().clone();
        self.applied = index;
        self.snapshot_index = index;
        let superseded: Vec<u64> = self
            .pending
            .keys()
            .copied()
            .filter(|pending| *pending <= index)
            .collect();
        for pending in superseded {
            if let Some(pending) = self.pending.remove(&pending) {
                pending.waiter.fail(ClusterError::Dropped(
                    "superseded by a snapshot; retry with the same op id".into(),
                ));
            }
        }
        info!(
            raft_id = self.config.id,
            index,
            term = meta.term,
            "raft snapshot installed"
        );
        Ok(())
    }

    /// Applies committed entries in log order. The proposals between two conf changes go to
    /// the state machine as one batch (one sled write on every node, not one per entry).
    fn apply_committed(&mut self, entries: Vec<Entry>) -> Result<()> {
        let mut run = Vec::new();
        for entry in entries {
            let index = entry.index;
            if index <= self.applied {
                continue; // delivered again after a restart, already applied
            }
            let pending = self.take_pending(index, entry.term);
            match entry.get_entry_type() {
                EntryType::EntryNormal => {
                    // Empty data: a new leader's first entry, nothing to apply.
                    let proposal = (!entry.data.is_empty()).then(|| Proposal::decode(&entry.data));
                    run.push(Committed {
                        index,
                        proposal,
                        pending,
                    });
                }
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_proposals(std::mem::take(&mut run))?;
                    let result = self.apply_conf_change(&entry);
                    if let Some(Pending {
                        waiter: Waiter::Conf(reply),
                        ..
                    }) = pending
                    {
                        let _ = reply.send(result);
                    } else if let Err(error) = result {
                        warn!(raft_id = self.config.id, index, %error, "conf change not applied");
                    }
                    self.applied = index;
                }
            }
        }
        self.apply_proposals(run)
    }

    /// The waiter of the proposal at `index`, if this node proposed it and it is the entry
    /// committed there; a waiter whose entry a new leader replaced learns it was dropped.
    fn take_pending(&mut self, index: u64, term: u64) -> Option<Pending> {
        match self.pending.remove(&index) {
            Some(pending) if pending.term == term => Some(pending),
            Some(pending) => {
                metrics::counter!("sift_raft_proposals_total", "outcome" => "dropped").increment(1);
                pending.waiter.fail(ClusterError::Dropped(
                    "superseded by a new leader's entry; retry with the same op id".into(),
                ));
                None
            }
            None => None,
        }
    }

    /// Applies a run of normal entries as one batch and answers their proposers.
    fn apply_proposals(&mut self, run: Vec<Committed>) -> Result<()> {
        let batch: Vec<(u64, &Proposal)> = run
            .iter()
            .filter_map(|committed| match &committed.proposal {
                Some(Ok(proposal)) => Some((committed.index, proposal)),
                _ => None,
            })
            .collect();
        let mut outcomes = if batch.is_empty() {
            Vec::new()
        } else {
            self.state_machine.apply(&batch)?
        }
        .into_iter();
        for committed in run {
            let outcome = match committed.proposal {
                None => {
                    self.applied = committed.index;
                    continue;
                }
                Some(Err(error)) => {
                    // Only this code writes entries: a bad one is a bug, skipped alike on every
                    // node.
                    error!(raft_id = self.config.id, index = committed.index, %error, "undecodable raft entry");
                    Err(error)
                }
                Some(Ok(_)) => match outcomes.next() {
                    Some(Err(error)) if error.is_transient() => {
                        // Not applied: stop, and apply it again after a restart.
                        return Err(ClusterError::Storage(sift_storage::StorageError::Io(
                            std::io::Error::other(error.to_string()),
                        )));
                    }
                    Some(outcome) => outcome.map_err(ClusterError::Storage),
                    None => {
                        return Err(ClusterError::Storage(sift_storage::StorageError::Io(
                            std::io::Error::other("the state machine returned too few outcomes"),
                        )));
                    }
                },
            };
            if let Some(Pending {
                waiter: Waiter::Op(reply),
                started,
                ..
            }) = committed.pending
            {
                metrics::counter!("sift_raft_proposals_total", "outcome" => outcome_label(&outcome))
                    .increment(1);
                metrics::histogram!("sift_raft_commit_seconds")
                    .record(started.elapsed().as_secs_f64());
                let _ = reply.send(outcome);
            }
            self.applied = committed.index;
        }
        Ok(())
    }

    fn apply_conf_change(&mut self, entry: &Entry) -> Result<ConfState> {
        let change = if entry.get_entry_type() == EntryType::EntryConfChange {
            let v1 = ConfChange::parse_from_bytes(&entry.data)
                .map_err(|error| ClusterError::Invalid(error.to_string()))?;
            let mut v2 = ConfChangeV2::default();
            v2.set_changes(vec![conf_change_single(v1.node_id, v1.get_change_type())].into());
            v2.context = v1.context;
            v2
        } else {
            ConfChangeV2::parse_from_bytes(&entry.data)
                .map_err(|error| ClusterError::Invalid(error.to_string()))?
        };
        let conf_state = match self.raw.apply_conf_change(&change) {
            Ok(conf_state) => conf_state,
            Err(error) => {
                // Refused alike on every node; the entry still counts as applied.
                self.storage.set_conf_state(&self.conf_state, entry.index)?;
                return Err(ClusterError::Invalid(format!("conf change: {error}")));
            }
        };
        let addresses: BTreeMap<u64, PeerAddress> = if change.context.is_empty() {
            BTreeMap::new()
        } else {
            serde_json::from_slice(&change.context).unwrap_or_default()
        };
        for single in change.get_changes() {
            match single.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    if let Some(address) = addresses.get(&single.node_id) {
                        self.peers.insert(single.node_id, address.clone());
                    }
                }
                ConfChangeType::RemoveNode => {
                    // Kept as removed: the id is never given to a joining node again.
                    self.peers.entry(single.node_id).or_default().removed = true;
                    self.last_contact.remove(&single.node_id);
                }
            }
        }
        self.storage.set_peers(&self.peers)?;
        self.storage.set_conf_state(&conf_state, entry.index)?;
        self.transport.set_peers(&self.peers);
        self.conf_state = conf_state.clone();
        info!(raft_id = self.config.id, index = entry.index, voters = ?conf_state.voters, learners = ?conf_state.learners, "membership changed");
        Ok(conf_state)
    }

    /// Compacts the log once enough entries were applied since the last compaction, and
    /// builds a snapshot when raft-rs asked for one (a follower is too far behind or new).
    ///
    /// Compaction exports nothing: the state machine is flushed (it is the snapshot), then the
    /// log entries below `applied - compact_keep` are removed [`COMPACT_STEP`] at a time, one
    /// step per pass of the loop, so the Raft thread is never held for long whatever the size
    /// of the state or the length of the log. The whole state is exported only when a
    /// follower needs it, and kept in memory for the followers that need it next
    /// ([`SledRaftStorage::offer_snapshot`]).
    fn maybe_compact(&mut self) -> Result<()> {
        if self.storage.take_snapshot_wanted() {
            self.offer_snapshot()?;
        }
        let due = self.applied >= self.snapshot_index + self.config.compact_threshold;
        if due
            && self.applied > self.snapshot_index
            && self.applied <= self.raw.raft.raft_log.last_index()
        {
            // Entries are about to leave the log: what they did must be durable first.
            self.state_machine.flush()?;
            self.compact_to = self
                .compact_to
                .max(self.applied.saturating_sub(self.config.compact_keep));
            self.snapshot_index = self.applied;
            metrics::counter!("sift_raft_snapshots_taken_total").increment(1);
            debug!(
                raft_id = self.config.id,
                index = self.applied,
                "raft log compaction started"
            );
        }
        let truncated = self.raw.raft.raft_log.first_index() - 1;
        if self.compact_to > truncated {
            self.storage.compact_log(self.compact_to, COMPACT_STEP)?;
        }
        Ok(())
    }

    /// Exports the state machine at `applied` as the snapshot followers are sent, unless the
    /// one on offer is already that.
    fn offer_snapshot(&mut self) -> Result<()> {
        if let Some((index, conf_state)) = self.storage.offered_snapshot()
            && index >= self.applied
            && conf_state == self.conf_state
        {
            return Ok(());
        }
        let started = Instant::now();
        let payload = SnapshotPayload {
            peers: self.peers.clone(),
            state: self.state_machine.export()?,
        };
        let data = payload.encode()?;
        let bytes = data.len();
        self.storage
            .offer_snapshot(self.applied, self.conf_state.clone(), data)?;
        debug!(
            raft_id = self.config.id,
            index = self.applied,
            bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "raft snapshot exported for a follower"
        );
        Ok(())
    }

    fn publish_status(&mut self) {
        let raft = &self.raw.raft;
        let id = self.config.id;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre_candidate",
            StateRole::Follower if self.conf_state.learners.contains(&id) => "learner",
            StateRole::Follower => "follower",
        };
        let is_leader = raft.state == StateRole::Leader;
        let mut members: Vec<u64> = self
            .conf_state
            .voters
            .iter()
            .chain(self.conf_state.learners.iter())
            .copied()
            .filter(|member| *member != id)
            .collect();
        members.sort_unstable();
        let now = Instant::now();
        let healthy_within = self.config.tick_interval * (2 * self.config.election_ticks) as u32;
        let peers = members
            .into_iter()
            .map(|peer| {
                let progress = if is_leader {
                    raft.prs().get(peer)
                } else {
                    None
                };
                PeerStatus {
                    id: peer,
                    address: self.peers.get(&peer).cloned(),
                    role: if self.conf_state.learners.contains(&peer) {
                        "learner".into()
                    } else {
                        "voter".into()
                    },
                    matched: progress.map(|p| p.matched),
                    next_index: progress.map(|p| p.next_idx),
                    progress: progress.map(|p| {
                        match p.state {
                            ProgressState::Probe => "probe",
                            ProgressState::Replicate => "replicate",
                            ProgressState::Snapshot => "snapshot",
                        }
                        .to_string()
                    }),
                    recent_active: progress.map(|p| p.recent_active),
                    last_contact_ms: self
                        .last_contact
                        .get(&peer)
                        .map(|at| now.duration_since(*at).as_millis() as u64),
                    healthy: self
                        .last_contact
                        .get(&peer)
                        .is_some_and(|at| now.duration_since(*at) <= healthy_within),
                }
            })
            .collect();
        let status = ClusterStatus {
            id,
            role: role.into(),
            leader: (raft.leader_id != 0).then_some(raft.leader_id),
            term: raft.term,
            commit: raft.raft_log.committed,
            applied: self.applied,
            first_index: raft.raft_log.first_index(),
            last_index: raft.raft_log.last_index(),
            snapshot_index: self.snapshot_index,
            voters: self.conf_state.voters.clone(),
            learners: self.conf_state.learners.clone(),
            peers,
            max_node_id: self
                .peers
                .keys()
                .chain(&self.conf_state.voters)
                .chain(&self.conf_state.learners)
                .chain(std::iter::once(&id))
                .copied()
                .max()
                .unwrap_or(id),
            storage_failure: self.storage_failure.clone(),
        };
        *self
            .status
            .write()
            .unwrap_or_else(|poison| poison.into_inner()) = status;
    }
}

fn conf_change_single(node_id: u64, change_type: ConfChangeType) -> ConfChangeSingle {
    let mut single = ConfChangeSingle {
        node_id,
        ..Default::default()
    };
    single.set_change_type(change_type);
    single
}

/// Describes the Raft metrics (call once at startup, after installing the recorder).
pub fn describe_metrics() {
    metrics::describe_gauge!("sift_raft_term", "current raft term");
    metrics::describe_counter!("sift_raft_leader_changes_total", "leader changes seen");
    metrics::describe_counter!(
        "sift_raft_proposals_total",
        "proposals by outcome: applied, refused, dropped, not_leader"
    );
    metrics::describe_histogram!(
        "sift_raft_commit_seconds",
        "time from proposal to applied on the leader"
    );
    metrics::describe_gauge!("sift_raft_commit_index", "raft commit index");
    metrics::describe_gauge!("sift_raft_applied_index", "raft applied index");
    metrics::describe_gauge!(
        "sift_raft_apply_lag_entries",
        "committed but not applied entries"
    );
    metrics::describe_gauge!(
        "sift_raft_commit_lag_entries",
        "appended but not committed entries"
    );
    metrics::describe_counter!(
        "sift_raft_snapshots_sent_total",
        "snapshots sent to followers"
    );
    metrics::describe_counter!("sift_raft_snapshots_received_total", "snapshots received");
    metrics::describe_counter!(
        "sift_raft_snapshot_bytes_total",
        "snapshot bytes by direction"
    );
    metrics::describe_counter!(
        "sift_raft_snapshots_taken_total",
        "local snapshots and compactions"
    );
    metrics::describe_counter!(
        "sift_raft_messages_dropped_total",
        "raft messages dropped by reason"
    );
    metrics::describe_gauge!(
        "sift_raft_peer_queue_depth",
        "raft messages queued to peers"
    );
}

#[cfg(test)]
mod tests;
