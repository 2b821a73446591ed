//! In-process clusters over the in-memory network: elections, replication, leader loss,
//! partitions, snapshots, restarts and membership changes. Waits are bounded and generous;
//! nothing asserts on timing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use sift_storage::meta::{
    DocSource, DocStatus, DocumentRecord, KbRecord, KbSettings, SledMetaStore, StatusUpdate,
};

use super::*;
use crate::raft::network::MemoryNetwork;

const WAIT: Duration = Duration::from_secs(60);

fn settings() -> KbSettings {
    KbSettings::new(1, 1, "all-MiniLM-L6-v2", 384)
}

fn create_kb(name: &str) -> Proposal {
    Proposal::new(MetaOp::CreateKb(KbRecord {
        id: format!("id-{name}"),
        name: name.into(),
        settings: settings(),
        created_at_ms: 1,
        updated_at_ms: 1,
        placement: Vec::new(),
    }))
}

/// Records every index applied, across restarts, around the real metadata store.
struct RecordingStateMachine {
    store: Arc<SledMetaStore>,
    applied: Arc<Mutex<Vec<u64>>>,
}

impl RaftStateMachine for RecordingStateMachine {
    fn apply(
        &self,
        committed: &[(u64, &Proposal)],
    ) -> sift_storage::Result<Vec<sift_storage::Result<MetaOutcome>>> {
        let outcomes = RaftStateMachine::apply(self.store.as_ref(), committed)?;
        let mut applied = self.applied.lock().unwrap();
        for ((index, _), outcome) in committed.iter().zip(&outcomes) {
            if !matches!(outcome, Err(error) if error.is_transient()) {
                applied.push(*index);
            }
        }
        Ok(outcomes)
    }
    fn flush(&self) -> sift_storage::Result<()> {
        self.store.flush()
    }
    fn applied_index(&self) -> u64 {
        RaftStateMachine::applied_index(self.store.as_ref())
    }
    fn export(&self) -> sift_storage::Result<Vec<u8>> {
        self.store.export_state()
    }
    fn import(&self, index: u64, bytes: &[u8]) -> sift_storage::Result<()> {
        self.store.import_state(index, bytes)
    }
}

struct TestNode {
    raft: RaftNode,
    state_machine: Arc<RecordingStateMachine>,
}

/// Nodes of one process share sled's process-wide concurrency control: dropping (and so
/// flushing) one database while another is written can deadlock in sled 0.34. A "killed" node
/// stops its Raft thread and keeps its database open; databases close once every Raft thread
/// has stopped (see `Drop`).
struct TestCluster {
    network: MemoryNetwork,
    dirs: HashMap<u64, tempfile::TempDir>,
    stores: HashMap<u64, Arc<SledMetaStore>>,
    nodes: BTreeMap<u64, TestNode>,
    applied_log: HashMap<u64, Arc<Mutex<Vec<u64>>>>,
    config: fn(u64) -> RaftConfig,
}

fn address(id: u64) -> PeerAddress {
    PeerAddress {
        internal: format!("node-{id}:7000"),
        public: format!("node-{id}:8000"),
        removed: false,
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let nodes = std::mem::take(&mut self.nodes);
        let mut state_machines = Vec::new();
        for (_, node) in nodes {
            node.raft.stop();
            state_machines.push(node.state_machine);
        }
    }
}

impl TestCluster {
    fn new(config: fn(u64) -> RaftConfig) -> Self {
        TestCluster {
            network: MemoryNetwork::new(7),
            dirs: HashMap::new(),
            stores: HashMap::new(),
            nodes: BTreeMap::new(),
            applied_log: HashMap::new(),
            config,
        }
    }

    /// A cluster whose voters are `ids`, all bootstrapped empty.
    fn with_voters(ids: &[u64]) -> Self {
        let mut cluster = TestCluster::new(RaftConfig::for_test);
        let members: BTreeMap<u64, PeerAddress> =
            ids.iter().map(|id| (*id, address(*id))).collect();
        for id in ids {
            cluster.start_node(*id, Some(&members));
        }
        cluster
    }

    /// Starts (or restarts, keeping its data dir) node `id`; `bootstrap` for a first start of
    /// an initial member.
    fn start_node(&mut self, id: u64, bootstrap: Option<&BTreeMap<u64, PeerAddress>>) {
        self.try_start_node(id, id, bootstrap).unwrap();
    }

    fn try_start_node(
        &mut self,
        dir_of: u64,
        id: u64,
        bootstrap: Option<&BTreeMap<u64, PeerAddress>>,
    ) -> Result<()> {
        let store = match self.stores.get(&dir_of) {
            Some(store) => store.clone(),
            None => {
                let dir = self
                    .dirs
                    .entry(dir_of)
                    .or_insert_with(|| tempfile::tempdir().unwrap());
                let store = Arc::new(SledMetaStore::open(dir.path())?);
                self.stores.insert(dir_of, store.clone());
                store
            }
        };
        let storage = SledRaftStorage::open(store.db())?;
        let applied = self.applied_log.entry(dir_of).or_default().clone();
        let state_machine = Arc::new(RecordingStateMachine { store, applied });
        if let Some(members) = bootstrap {
            RaftNode::bootstrap(&storage, state_machine.as_ref(), members.clone())?;
        }
        let raft = RaftNode::start(
            (self.config)(id),
            storage,
            state_machine.clone(),
            Arc::new(self.network.transport(id)),
        )?;
        self.network.register(id, raft.handle().clone());
        self.nodes.insert(
            id,
            TestNode {
                raft,
                state_machine,
            },
        );
        Ok(())
    }

    /// Stops node `id`: its Raft thread ends, messages to it are lost, pending requests fail.
    /// Its database stays open (see the type's docs); a restart reads it back.
    fn kill(&mut self, id: u64) {
        self.network.unregister(id);
        if let Some(node) = self.nodes.remove(&id) {
            node.raft.stop();
        }
    }

    fn handle(&self, id: u64) -> RaftHandle {
        self.nodes[&id].raft.handle().clone()
    }

    fn statuses(&self) -> Vec<ClusterStatus> {
        self.nodes
            .values()
            .map(|node| node.raft.handle().status())
            .collect()
    }

    /// Waits for a leader among `among` that all of them agree on.
    async fn leader_among(&self, among: &[u64]) -> u64 {
        wait_for("a leader", || {
            let statuses: Vec<ClusterStatus> = among
                .iter()
                .map(|id| self.nodes[id].raft.handle().status())
                .collect();
            let leader = statuses.iter().find(|status| status.role == "leader")?;
            statuses
                .iter()
                .all(|status| status.leader == Some(leader.id) && status.term == leader.term)
                .then_some(leader.id)
        })
        .await
    }

    async fn leader(&self) -> u64 {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.leader_among(&ids).await
    }

    /// Proposes like a client would: to whichever node claims to lead, retrying the same
    /// proposal (same op id) on retryable errors until it is applied.
    async fn write(&self, proposal: &Proposal) -> MetaOutcome {
        let deadline = Instant::now() + WAIT;
        loop {
            for node in self.nodes.values() {
                let handle = node.raft.handle();
                if handle.status().role != "leader" {
                    continue;
                }
                match handle.propose_proposal(proposal.clone()).await {
                    Ok(outcome) => return outcome,
                    Err(error) => assert!(error.is_transient(), "not retryable: {error}"),
                }
            }
            assert!(Instant::now() < deadline, "write not applied in {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running node applied the same index, then returns their exported
    /// states (which the caller compares).
    async fn converged(&self) -> Vec<Vec<u8>> {
        // The status view is published after each round, the state machine moves first: wait
        // for both. Acknowledged writes are in the leader's state machine already.
        wait_for("all nodes to apply the same entries", || {
            let statuses = self.statuses();
            let commit = statuses.iter().map(|status| status.commit).max()?;
            let applied: Vec<u64> = self
                .nodes
                .values()
                .map(|node| RaftStateMachine::applied_index(node.state_machine.as_ref()))
                .collect();
            (statuses
                .iter()
                .all(|status| status.applied == commit && status.commit == commit)
                && applied.iter().all(|index| *index == applied[0]))
            .then_some(())
        })
        .await;
        self.nodes
            .values()
            .map(|node| node.state_machine.store.export_state().unwrap())
            .collect()
    }

    fn kb_exists(&self, id: u64, name: &str) -> bool {
        self.nodes[&id]
            .state_machine
            .store
            .find_kb(name)
            .unwrap()
            .is_some()
    }
}

async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_all_equal(states: &[Vec<u8>]) {
    assert!(states.len() >= 2);
    for state in &states[1..] {
        if state != &states[0] {
            let (a, b) = (pairs(&states[0]), pairs(state));
            let only_a: Vec<_> = a.iter().filter(|pair| !b.contains(pair)).collect();
            let only_b: Vec<_> = b.iter().filter(|pair| !a.contains(pair)).collect();
            panic!("state machines differ:\n first only: {only_a:?}\n other only: {only_b:?}");
        }
    }
}

/// The key/value pairs of an export, readable, for failure messages.
fn pairs(export: &[u8]) -> Vec<(String, String)> {
    fn take(rest: &mut &[u8]) -> String {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let part = String::from_utf8_lossy(&rest[4..4 + len]).into_owned();
        *rest = &rest[4 + len..];
        part
    }
    let mut rest = &export[9..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let key = take(&mut rest);
        let value = take(&mut rest);
        out.push((key, value));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_and_dedupe_retries() {
    let cluster = TestCluster::with_voters(&[1, 2, 3]);
    let leader = cluster.leader().await;
    for i in 0..20 {
        let outcome = cluster.write(&create_kb(&format!("kb-{i}"))).await;
        assert!(matches!(outcome, MetaOutcome::Kb(ref kb) if kb.name == format!("kb-{i}")));
    }
    // a follower refuses proposals and names the leader
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let error = cluster
        .handle(follower)
        .propose(create_kb("elsewhere").op)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClusterError::NotLeader { leader: Some(l) } if l == leader),
        "{error}"
    );

    // a retried op (same id) is applied once, even after later ops changed the same record
    let document = DocumentRecord {
        id: "d1".into(),
        kb_id: "id-kb-0".into(),
        external_id: None,
        title: "d1".into(),
        source: DocSource::Text {
            format: "text".into(),
        },
        content_hash: "h1".into(),
        size_bytes: 1,
        shard: 0,
        status: DocStatus::Queued,
        error: None,
        chunk_count: 0,
        metadata: Default::default(),
        created_at_ms: 2,
        updated_at_ms: 2,
        pages_needing_ocr: 0,
    };
    cluster
        .write(&Proposal::new(MetaOp::RegisterDocuments {
            kb_id: "id-kb-0".into(),
            documents: vec![document],
        }))
        .await;
    let status = |status| MetaOp::SetDocumentStatus {
        kb_id: "id-kb-0".into(),
        updates: vec![StatusUpdate {
            document_id: "d1".into(),
            status,
            error: None,
            chunk_count: None,
            pages_needing_ocr: None,
        }],
        at_ms: 3,
    };
    let parsing = Proposal::new(status(DocStatus::Parsing));
    cluster.write(&parsing).await;
    cluster
        .write(&Proposal::new(status(DocStatus::Ready)))
        .await;
    cluster.write(&parsing).await; // the client never saw the first answer and retries
    let states = cluster.converged().await;
    assert_all_equal(&states);
    for id in [1, 2, 3] {
        let store = &cluster.nodes[&id].state_machine.store;
        assert_eq!(store.list_kbs().unwrap().len(), 20);
        let doc = store.get_document("id-kb-0", "d1").unwrap().unwrap();
        assert_eq!(doc.status, DocStatus::Ready, "node {id}");
    }

    // a linearizable read on a follower sees everything committed before it
    let committed = cluster.handle(leader).status().commit;
    let read = cluster.handle(follower).read_index().await.unwrap();
    assert!(read >= committed);
    assert!(cluster.handle(follower).status().applied >= committed);

    let status = cluster.handle(leader).status();
    assert_eq!(status.voters, vec![1, 2, 3]);
    assert_eq!(status.peers.len(), 2);
    assert!(status.peers.iter().all(|peer| peer.matched.is_some()));
    wait_for("the leader to see both followers healthy", || {
        let status = cluster.handle(leader).status();
        status.peers.iter().all(|peer| peer.healthy).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_elects_a_new_leader_without_losing_acknowledged_ops() {
    let mut cluster = TestCluster::with_voters(&[1, 2, 3]);
    let old_leader = cluster.leader().await;
    let mut acknowledged = Vec::new();
    for i in 0..10 {
        let proposal = create_kb(&format!("before-{i}"));
        cluster.write(&proposal).await;
        acknowledged.push(proposal);
    }
    // proposals in flight when the leader dies
    let handle = cluster.handle(old_leader);
    let in_flight: Vec<Proposal> = (0..20).map(|i| create_kb(&format!("during-{i}"))).collect();
    let tasks: Vec<_> = in_flight
        .iter()
        .cloned()
        .map(|proposal| {
            let handle = handle.clone();
            tokio::spawn(async move { handle.propose_proposal(proposal).await })
        })
        .collect();
    cluster.kill(old_leader);
    let mut failed = 0;
    for (task, proposal) in tasks.into_iter().zip(&in_flight) {
        match task.await.unwrap() {
            Ok(_) => acknowledged.push(proposal.clone()),
            Err(error) => {
                assert!(
                    error.is_transient(),
                    "in-flight error not retryable: {error}"
                );
                failed += 1;
            }
        }
    }
    let survivors: Vec<u64> = [1, 2, 3]
        .into_iter()
        .filter(|id| *id != old_leader)
        .collect();
    let new_leader = cluster.leader_among(&survivors).await;
    assert_ne!(new_leader, old_leader);
    // the client retries what failed; writes resume
    for proposal in &in_flight {
        cluster.write(proposal).await;
    }
    for i in 0..10 {
        let proposal = create_kb(&format!("after-{i}"));
        cluster.write(&proposal).await;
        acknowledged.push(proposal);
    }
    let states = cluster.converged().await;
    assert_all_equal(&states);
    for id in &survivors {
        for proposal in acknowledged.iter().chain(&in_flight) {
            let MetaOp::CreateKb(kb) = &proposal.op else {
                unreachable!()
            };
            assert!(cluster.kb_exists(*id, &kb.name), "{} lost on {id}", kb.name);
        }
        assert_eq!(
            cluster.nodes[id]
                .state_machine
                .store
                .list_kbs()
                .unwrap()
                .len(),
            40
        );
    }
    eprintln!("in-flight proposals that failed and were retried: {failed}");

    // the old leader comes back with its data dir and catches up
    cluster.start_node(old_leader, None);
    let states = cluster.converged().await;
    assert_eq!(states.len(), 3);
    assert_all_equal(&states);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_cannot_commit_and_states_converge_after_healing() {
    let cluster = TestCluster::with_voters(&[1, 2, 3, 4, 5]);
    let old_leader = cluster.leader().await;
    cluster.write(&create_kb("base")).await;
    let majority: Vec<u64> = [1, 2, 3, 4, 5]
        .into_iter()
        .filter(|id| *id != old_leader)
        .take(3)
        .collect();
    let minority: Vec<u64> = [1, 2, 3, 4, 5]
        .into_iter()
        .filter(|id| !majority.contains(id))
        .collect();
    assert!(minority.contains(&old_leader));
    cluster.network.partition(&[&majority, &minority]);

    // the old leader cannot commit: its proposal fails with a retryable error when it steps
    // down (check quorum), not silence
    let stranded = create_kb("stranded");
    let error = cluster
        .handle(old_leader)
        .propose_proposal(stranded.clone())
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");

    let new_leader = cluster.leader_among(&majority).await;
    for i in 0..15 {
        let proposal = create_kb(&format!("majority-{i}"));
        let outcome = cluster
            .handle(new_leader)
            .propose_proposal(proposal)
            .await
            .unwrap();
        assert!(matches!(outcome, MetaOutcome::Kb(_)));
    }
    for id in &minority {
        assert!(!cluster.kb_exists(*id, "majority-0"));
        assert!(!cluster.kb_exists(*id, "stranded"));
        let error = cluster
            .handle(*id)
            .propose(create_kb("minority").op)
            .await
            .unwrap_err();
        assert!(error.is_transient(), "{error}");
    }

    cluster.network.heal();
    let states = cluster.converged().await;
    assert_eq!(states.len(), 5);
    assert_all_equal(&states);
    for id in 1..=5 {
        assert!(cluster.kb_exists(id, "majority-14"));
        assert!(!cluster.kb_exists(id, "stranded"), "uncommitted op applied");
    }
    // the stranded client retries and its op lands once
    cluster.write(&stranded).await;
    cluster.write(&stranded).await;
    let states = cluster.converged().await;
    assert_all_equal(&states);
    assert_eq!(
        cluster.nodes[&1]
            .state_machine
            .store
            .list_kbs()
            .unwrap()
            .len(),
        17
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_compaction_catches_up_by_snapshot() {
    let mut cluster = TestCluster::with_voters(&[1, 2, 3]);
    let leader = cluster.leader().await;
    cluster.write(&create_kb("first")).await;
    cluster.converged().await;
    let lagging = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let lagging_applied = cluster.handle(lagging).status().applied;
    cluster.kill(lagging);
    // well past the compaction threshold (50 in tests)
    for i in 0..130 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    let leader_status = cluster.handle(leader).status();
    assert!(leader_status.snapshot_index > lagging_applied);
    assert!(
        leader_status.first_index > lagging_applied + 1,
        "the leader's log no longer holds what the lagging node needs"
    );

    cluster.start_node(lagging, None);
    let states = cluster.converged().await;
    assert_all_equal(&states);
    let status = cluster.handle(lagging).status();
    assert!(
        status.snapshot_index > lagging_applied,
        "caught up without a snapshot: {status:?}"
    );
    assert_eq!(
        cluster.nodes[&lagging]
            .state_machine
            .store
            .list_kbs()
            .unwrap()
            .len(),
        131
    );
    // and it keeps up by log afterwards
    cluster.write(&create_kb("after")).await;
    assert_all_equal(&cluster.converged().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_the_same_data_dir_rejoins_and_applies_nothing_twice() {
    let mut cluster = TestCluster::with_voters(&[1, 2, 3]);
    cluster.leader().await;
    for i in 0..30 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    cluster.converged().await;
    // restart every node in turn, with writes in between
    for id in [1, 2, 3] {
        cluster.kill(id);
        cluster.write(&create_kb(&format!("while-{id}-down"))).await;
        cluster.start_node(id, None);
        cluster.write(&create_kb(&format!("after-{id}"))).await;
        cluster.converged().await;
    }
    let states = cluster.converged().await;
    assert_all_equal(&states);
    for (id, log) in &cluster.applied_log {
        let log = log.lock().unwrap();
        let mut seen = std::collections::HashSet::new();
        for index in log.iter() {
            assert!(seen.insert(*index), "node {id} applied index {index} twice");
        }
    }
    for id in [1, 2, 3] {
        assert_eq!(
            cluster.nodes[&id]
                .state_machine
                .store
                .list_kbs()
                .unwrap()
                .len(),
            36
        );
    }
    // a data dir keeps its node id
    cluster.kill(3);
    let error = cluster.try_start_node(3, 9, None).unwrap_err();
    assert!(
        error.to_string().contains("belongs to raft node 3"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learners_join_catch_up_get_promoted_and_nodes_are_removed() {
    let mut cluster = TestCluster::new(RaftConfig::for_test);
    cluster.start_node(1, Some(&BTreeMap::from([(1, address(1))])));
    cluster.leader().await;
    for i in 0..70 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    let leader = cluster.handle(1);
    for id in [2, 3] {
        cluster.start_node(id, None); // empty storage: learns everything from the leader
        let conf = leader.add_learner(id, address(id)).await.unwrap();
        assert!(conf.learners.contains(&id));
        let conf = leader.promote_when_caught_up(id, WAIT).await.unwrap();
        assert!(conf.voters.contains(&id) && !conf.learners.contains(&id));
    }
    // the status view is published by the raft thread after each round
    let status = wait_for("the status to show 3 voters", || {
        let status = leader.status();
        (status.voters == vec![1, 2, 3]).then_some(status)
    })
    .await;
    assert_eq!(
        status
            .peers
            .iter()
            .map(|peer| peer.address.clone())
            .collect::<Vec<_>>(),
        vec![Some(address(2)), Some(address(3))]
    );
    cluster.write(&create_kb("three-voters")).await;
    assert_all_equal(&cluster.converged().await);
    // the new members know every address (from the snapshot or the conf change entries)
    wait_for("peers to be known", || {
        (cluster
            .handle(3)
            .status()
            .peers
            .iter()
            .all(|peer| peer.address.is_some()))
        .then_some(())
    })
    .await;

    let conf = leader.remove_node(3).await.unwrap();
    assert_eq!(conf.voters, vec![1, 2]);
    cluster.kill(3);
    cluster.write(&create_kb("two-voters")).await;
    assert!(
        cluster.kb_exists(2, "two-voters") || {
            cluster.converged().await;
            cluster.kb_exists(2, "two-voters")
        }
    );
    // a membership change on a follower names the leader
    let error = cluster.handle(2).remove_node(1).await.unwrap_err();
    assert!(matches!(error, ClusterError::NotLeader { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lossy_network_with_duplicates_still_converges() {
    let cluster = TestCluster::with_voters(&[1, 2, 3]);
    cluster.network.set_faults(100, 100); // 10% dropped, 10% duplicated
    for i in 0..30 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    cluster.network.set_faults(0, 0);
    let states = cluster.converged().await;
    assert_all_equal(&states);
    assert_eq!(
        cluster.nodes[&1]
            .state_machine
            .store
            .list_kbs()
            .unwrap()
            .len(),
        30
    );
    let (delivered, dropped) = cluster.network.counts();
    assert!(delivered > 0 && dropped > 0);
}

/// Tries to get `proposal` applied through whichever node leads, for up to `budget`.
async fn try_write(cluster: &TestCluster, proposal: &Proposal, budget: Duration) -> bool {
    let deadline = Instant::now() + budget;
    while Instant::now() < deadline {
        let leaders: Vec<RaftHandle> = cluster
            .nodes
            .values()
            .map(|node| node.raft.handle().clone())
            .filter(|handle| handle.status().role == "leader")
            .collect();
        for handle in leaders {
            let attempt = tokio::time::timeout(
                Duration::from_millis(500),
                handle.propose_proposal(proposal.clone()),
            )
            .await;
            match attempt {
                Ok(Ok(_)) => return true,
                Ok(Err(error)) => assert!(error.is_transient(), "{error}"),
                Err(_elapsed) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A small deterministic generator for the randomized test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Prints the seed if the test fails, so the run can be repeated with SIFT_RAFT_SEED.
struct SeedReporter(u64);

impl Drop for SeedReporter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("randomized raft test failed with SIFT_RAFT_SEED={}", self.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_kills_restarts_and_partitions_keep_the_invariants() {
    let seed = std::env::var("SIFT_RAFT_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let _reporter = SeedReporter(seed);
    let mut rng = Rng(seed);
    let ids = [1u64, 2, 3, 4, 5];
    let mut cluster = TestCluster::with_voters(&ids);
    cluster.network.set_faults(20, 20);
    let mut acknowledged: Vec<Proposal> = Vec::new();
    let mut unknown: Vec<Proposal> = Vec::new();
    let mut down: Vec<u64> = Vec::new();
    let mut counter = 0;
    for _round in 0..20 {
        match rng.below(5) {
            0 if down.len() < 2 => {
                let up: Vec<u64> = cluster.nodes.keys().copied().collect();
                let victim = up[rng.below(up.len() as u64) as usize];
                cluster.kill(victim);
                down.push(victim);
            }
            1 if !down.is_empty() => {
                let back = down.remove(rng.below(down.len() as u64) as usize);
                cluster.start_node(back, None);
            }
            2 => {
                let mut shuffled = ids.to_vec();
                for i in (1..shuffled.len()).rev() {
                    shuffled.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let cut = 1 + rng.below(4) as usize;
                let (a, b) = shuffled.split_at(cut);
                cluster.network.partition(&[a, b]);
            }
            3 => {
                // isolate whoever leads now, with writes racing the step-down
                if let Some(leader) = cluster
                    .nodes
                    .values()
                    .map(|node| node.raft.handle().status())
                    .find(|status| status.role == "leader")
                {
                    let rest: Vec<u64> =
                        ids.iter().copied().filter(|id| *id != leader.id).collect();
                    cluster.network.partition(&[&[leader.id], &rest]);
                }
            }
            _ => cluster.network.heal(),
        }
        for _ in 0..5 {
            counter += 1;
            let proposal = create_kb(&format!("op-{counter}"));
            let done = try_write(&cluster, &proposal, Duration::from_millis(1000)).await;
            if done {
                acknowledged.push(proposal);
            } else {
                unknown.push(proposal);
                break; // no quorum reachable now: on to the next fault
            }
        }
    }
    // Repair everything, then every client retries what it never saw acknowledged.
    cluster.network.heal();
    cluster.network.set_faults(0, 0);
    for id in down.drain(..) {
        cluster.start_node(id, None);
    }
    for proposal in &unknown {
        cluster.write(proposal).await;
    }
    let states = cluster.converged().await;
    assert_eq!(states.len(), 5);
    assert_all_equal(&states);
    for id in ids {
        let store = &cluster.nodes[&id].state_machine.store;
        for proposal in &acknowledged {
            let MetaOp::CreateKb(kb) = &proposal.op else {
                unreachable!()
            };
            assert!(
                store.find_kb(&kb.name).unwrap().is_some(),
                "acknowledged {} lost on {id}",
                kb.name
            );
        }
        assert_eq!(store.list_kbs().unwrap().len(), counter, "node {id}");
    }
    for (id, log) in &cluster.applied_log {
        let log = log.lock().unwrap();
        let mut seen = std::collections::HashSet::new();
        assert!(
            log.iter().all(|index| seen.insert(*index)),
            "node {id} applied an index twice"
        );
    }
    eprintln!(
        "seed {seed}: {} acknowledged, {} retried after an unknown outcome",
        acknowledged.len(),
        unknown.len()
    );
}
