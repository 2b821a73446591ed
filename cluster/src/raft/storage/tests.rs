use super::*;
use proptest::prelude::*;

fn open() -> (tempfile::TempDir, sled::Db, SledRaftStorage) {
    let dir = tempfile::tempdir().unwrap();
    let db = sift_storage::sled_db::open(&sled::Config::new().path(dir.path())).unwrap();
    let storage = SledRaftStorage::open(&db).unwrap();
    (dir, db, storage)
}

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("op-{index}-{term}").into_bytes().into(),
        ..Default::default()
    }
}

fn voters(ids: &[u64]) -> ConfState {
    ConfState {
        voters: ids.to_vec(),
        ..Default::default()
    }
}

fn all(storage: &SledRaftStorage) -> Vec<(u64, u64)> {
    let first = storage.first_index().unwrap();
    let last = storage.last_index().unwrap();
    storage
        .entries(first, last + 1, None, GetEntriesContext::empty(false))
        .unwrap()
        .iter()
        .map(|entry| (entry.index, entry.term))
        .collect()
}

#[test]
fn empty_storage_reads() {
    let (_dir, _db, storage) = open();
    assert!(!storage.is_initialized().unwrap());
    assert_eq!(storage.first_index().unwrap(), 1);
    assert_eq!(storage.last_index().unwrap(), 0);
    assert_eq!(storage.term(0).unwrap(), 0);
    let state = storage.initial_state().unwrap();
    assert!(!state.initialized());
    assert!(
        storage
            .entries(1, 1, None, GetEntriesContext::empty(false))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn append_truncates_conflicting_tail() {
    let (_dir, _db, storage) = open();
    storage
        .append(&[entry(1, 1), entry(2, 1), entry(3, 1), entry(4, 1)])
        .unwrap();
    assert_eq!(storage.last_index().unwrap(), 4);
    // a new leader of term 2 overwrites from index 3: entry 4 of term 1 must go
    storage.append(&[entry(3, 2)]).unwrap();
    assert_eq!(all(&storage), vec![(1, 1), (2, 1), (3, 2)]);
    assert_eq!(storage.term(3).unwrap(), 2);
    assert!(matches!(
        storage.term(4),
        Err(raft::Error::Store(raft::StorageError::Unavailable))
    ));
    let entries = storage
        .entries(2, 4, None, GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(entries[1].data.as_ref(), b"op-3-2");
}

#[test]
fn entries_respects_max_size_and_returns_at_least_one() {
    let (_dir, _db, storage) = open();
    let entries: Vec<Entry> = (1..=5).map(|index| entry(index, 1)).collect();
    storage.append(&entries).unwrap();
    let one = u64::from(entries[0].compute_size());
    let ctx = || GetEntriesContext::empty(false);
    assert_eq!(storage.entries(1, 6, Some(0), ctx()).unwrap().len(), 1);
    assert_eq!(
        storage.entries(1, 6, Some(one * 2), ctx()).unwrap().len(),
        2
    );
    assert_eq!(
        storage
            .entries(1, 6, Some(one * 2 + one / 2), ctx())
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        storage.entries(1, 6, Some(u64::MAX), ctx()).unwrap().len(),
        5
    );
    assert_eq!(storage.entries(2, 4, None, ctx()).unwrap().len(), 2);
}

#[test]
#[should_panic(expected = "index out of bound")]
fn entries_past_last_index_panics() {
    let (_dir, _db, storage) = open();
    storage.append(&[entry(1, 1), entry(2, 1)]).unwrap();
    let _ = storage.entries(1, 4, None, GetEntriesContext::empty(false));
}

#[test]
#[should_panic(expected = "continuous")]
fn append_with_a_gap_panics() {
    let (_dir, _db, storage) = open();
    storage.append(&[entry(1, 1)]).unwrap();
    storage.append(&[entry(3, 1)]).unwrap();
}

#[test]
#[should_panic(expected = "compacted")]
fn append_below_compaction_panics() {
    let (_dir, _db, storage) = open();
    storage
        .append(&(1..=5).map(|index| entry(index, 1)).collect::<Vec<_>>())
        .unwrap();
    storage.set_conf_state(&voters(&[1]), 5).unwrap();
    storage
        .compact_to_snapshot(4, b"state".to_vec(), 0)
        .unwrap();
    storage.append(&[entry(3, 2)]).unwrap();
}

#[test]
fn log_compaction_goes_in_steps_and_offered_snapshots_are_served_first() {
    let (dir, db, storage) = open();
    storage
        .append(
            &(1..=10)
                .map(|index| entry(index, index / 4 + 1))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    storage.set_conf_state(&voters(&[1, 2, 3]), 8).unwrap();
    // at most 3 entries a step, up to 7
    assert_eq!(storage.compact_log(7, 3).unwrap(), 3);
    assert_eq!(storage.first_index().unwrap(), 4);
    assert_eq!(storage.compact_log(7, 3).unwrap(), 6);
    assert_eq!(storage.compact_log(7, 3).unwrap(), 7);
    assert_eq!(storage.compact_log(7, 3).unwrap(), 7); // done: nothing more
    assert_eq!(storage.compact_log(2, 3).unwrap(), 7); // never backwards
    assert_eq!(all(&storage), vec![(8, 3), (9, 3), (10, 3)]);
    assert_eq!(storage.term(7).unwrap(), 2);
    assert!(storage.compact_log(11, 100).is_err()); // past the last entry

    // compaction stores no snapshot: one is built on demand
    assert!(!storage.take_snapshot_wanted());
    assert!(matches!(
        storage.snapshot(0, 2),
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable
        ))
    ));
    assert!(storage.take_snapshot_wanted());
    storage
        .offer_snapshot(9, voters(&[1, 2, 3]), b"state@9".to_vec())
        .unwrap();
    assert_eq!(storage.offered_snapshot(), Some((9, voters(&[1, 2, 3]))));
    let snapshot = storage.snapshot(0, 2).unwrap();
    assert_eq!(snapshot.get_metadata().index, 9);
    assert_eq!(snapshot.get_metadata().term, 3);
    assert_eq!(snapshot.data.as_ref(), b"state@9");
    // one that does not include the receiver, or is older than asked, is not served
    assert!(storage.snapshot(0, 4).is_err());
    assert!(storage.snapshot(10, 2).is_err());
    assert!(storage.take_snapshot_wanted());

    // the truncation point survives a restart (made durable by the next flush)
    storage.set_hard_state(&HardState::default()).unwrap();
    drop(storage);
    drop(db);
    let db = sift_storage::sled_db::open(&sled::Config::new().path(dir.path())).unwrap();
    let storage = SledRaftStorage::open(&db).unwrap();
    assert_eq!(storage.first_index().unwrap(), 8);
    assert_eq!(all(&storage), vec![(8, 3), (9, 3), (10, 3)]);
    assert_eq!(storage.offered_snapshot(), None);
}

#[test]
fn a_commit_only_hard_state_is_kept() {
    let (_dir, _db, storage) = open();
    storage.append(&[entry(1, 1), entry(2, 1)]).unwrap();
    let hard_state = HardState {
        term: 1,
        vote: 2,
        commit: 1,
        ..Default::default()
    };
    storage.persist(&[], Some(&hard_state)).unwrap();
    // only the commit index moves: written (not flushed)
    let moved = HardState {
        commit: 2,
        ..hard_state.clone()
    };
    storage.persist(&[], Some(&moved)).unwrap();
    assert_eq!(storage.hard_state().unwrap(), moved);
    storage.set_commit(1).unwrap();
    assert_eq!(storage.hard_state().unwrap().commit, 1);
    assert_eq!(storage.hard_state().unwrap().vote, 2);
}

#[test]
fn compaction_keeps_a_tail_and_serves_the_snapshot() {
    let (_dir, _db, storage) = open();
    storage
        .append(
            &(1..=10)
                .map(|index| entry(index, index / 4 + 1))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    storage.set_conf_state(&voters(&[1, 2, 3]), 8).unwrap();
    storage
        .compact_to_snapshot(8, b"state@8".to_vec(), 3)
        .unwrap();
    assert_eq!(storage.first_index().unwrap(), 6);
    assert_eq!(storage.last_index().unwrap(), 10);
    assert_eq!(storage.term(5).unwrap(), 2); // the truncated entry's term is kept
    assert!(matches!(
        storage.term(4),
        Err(raft::Error::Store(raft::StorageError::Compacted))
    ));
    assert!(matches!(
        storage.entries(5, 7, None, GetEntriesContext::empty(false)),
        Err(raft::Error::Store(raft::StorageError::Compacted))
    ));
    let snapshot = storage.snapshot(0, 2).unwrap();
    assert_eq!(snapshot.get_metadata().index, 8);
    assert_eq!(snapshot.get_metadata().term, 3);
    assert_eq!(
        snapshot.get_metadata().get_conf_state().voters,
        vec![1, 2, 3]
    );
    assert_eq!(snapshot.data.as_ref(), b"state@8");
    // asking for a newer one than stored flags the driver to build one
    assert!(!storage.take_snapshot_wanted());
    assert!(storage.snapshot(0, 4).is_err()); // 4 joined after it was taken
    assert!(storage.take_snapshot_wanted());
    assert!(matches!(
        storage.snapshot(9, 2),
        Err(raft::Error::Store(
            raft::StorageError::SnapshotTemporarilyUnavailable
        ))
    ));
    assert!(storage.take_snapshot_wanted());
    // compacting everything
    storage
        .compact_to_snapshot(10, b"state@10".to_vec(), 0)
        .unwrap();
    assert_eq!(storage.first_index().unwrap(), 11);
    assert_eq!(storage.last_index().unwrap(), 10);
    assert_eq!(storage.term(10).unwrap(), 3);
    storage.append(&[entry(11, 4)]).unwrap();
    assert_eq!(all(&storage), vec![(11, 4)]);
}

#[test]
fn apply_snapshot_replaces_log_and_state_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = sift_storage::sled_db::open(&sled::Config::new().path(dir.path())).unwrap();
        let storage = SledRaftStorage::open(&db).unwrap();
        storage
            .append(&(1..=3).map(|index| entry(index, 1)).collect::<Vec<_>>())
            .unwrap();
        storage
            .set_hard_state(&HardState {
                term: 1,
                vote: 2,
                commit: 2,
                ..Default::default()
            })
            .unwrap();
        let mut snapshot = Snapshot {
            data: b"leader-state".to_vec().into(),
            ..Default::default()
        };
        let meta = snapshot.mut_metadata();
        meta.index = 20;
        meta.term = 3;
        meta.set_conf_state(voters(&[1, 2, 3]));
        storage.apply_snapshot(&snapshot).unwrap();
        storage.set_node_id(2).unwrap();
    }
    let db = sift_storage::sled_db::open(&sled::Config::new().path(dir.path())).unwrap();
    let storage = SledRaftStorage::open(&db).unwrap();
    assert_eq!(storage.node_id().unwrap(), Some(2));
    assert_eq!(storage.first_index().unwrap(), 21);
    assert_eq!(storage.last_index().unwrap(), 20);
    assert_eq!(storage.term(20).unwrap(), 3);
    let state = storage.initial_state().unwrap();
    assert_eq!(state.hard_state.commit, 20);
    assert_eq!(state.hard_state.term, 3);
    assert_eq!(state.hard_state.vote, 2);
    assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    assert_eq!(
        storage.stored_snapshot().unwrap().data.as_ref(),
        b"leader-state"
    );
    // an older snapshot is refused
    let mut old = Snapshot::default();
    old.mut_metadata().index = 5;
    assert!(storage.apply_snapshot(&old).is_err());
}

#[test]
fn bootstrap_once() {
    let (_dir, _db, storage) = open();
    storage
        .bootstrap(voters(&[1]), 7, b"existing".to_vec())
        .unwrap();
    assert!(storage.is_initialized().unwrap());
    assert_eq!(storage.first_index().unwrap(), 8);
    assert_eq!(storage.term(7).unwrap(), 1);
    assert_eq!(storage.applied().unwrap(), 7);
    assert_eq!(storage.initial_state().unwrap().hard_state.commit, 7);
    assert!(storage.bootstrap(voters(&[1]), 0, Vec::new()).is_err());
}

#[test]
fn peers_and_commit_persist() {
    let (_dir, _db, storage) = open();
    let mut peers = BTreeMap::new();
    peers.insert(
        3,
        PeerAddress {
            internal: "127.0.0.1:7001".into(),
            public: "127.0.0.1:8001".into(),
            removed: false,
        },
    );
    storage.set_peers(&peers).unwrap();
    assert_eq!(storage.peers().unwrap(), peers);
    storage.set_commit(4).unwrap();
    assert_eq!(storage.hard_state().unwrap().commit, 4);
    storage.set_applied(3).unwrap();
    assert_eq!(storage.applied().unwrap(), 3);
}

#[derive(Clone, Debug)]
enum LogOp {
    /// Append `terms.len()` entries starting `back` entries before last + 1.
    Append { back: u64, terms: Vec<u64> },
    /// Compact at `back` before the last index, keeping `keep` entries.
    Compact { back: u64, keep: u64 },
}

fn log_op() -> impl Strategy<Value = LogOp> {
    prop_oneof![
        4 => (0u64..6, prop::collection::vec(1u64..5, 1..6))
            .prop_map(|(back, terms)| LogOp::Append { back, terms }),
        1 => (0u64..6, 0u64..4).prop_map(|(back, keep)| LogOp::Compact { back, keep }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The sled log behaves like a Vec of (index, term) with a truncation point.
    #[test]
    fn log_matches_vec_model(ops in prop::collection::vec(log_op(), 1..30)) {
        let (_dir, _db, storage) = open();
        storage.set_conf_state(&voters(&[1]), 0).unwrap();
        // model: entries after `offset` (first index = offset + 1)
        let mut offset = 0u64;
        let mut offset_term = 0u64;
        let mut model: Vec<u64> = Vec::new(); // terms, model[i] is index offset + 1 + i
        for op in ops {
            let last = offset + model.len() as u64;
            match op {
                LogOp::Append { back, terms } => {
                    let start = (last + 1).saturating_sub(back).max(offset + 1);
                    let entries: Vec<Entry> = terms
                        .iter()
                        .enumerate()
                        .map(|(i, term)| entry(start + i as u64, *term))
                        .collect();
                    storage.append(&entries).unwrap();
                    model.truncate((start - offset - 1) as usize);
                    model.extend(terms);
                }
                LogOp::Compact { back, keep } => {
                    let at = last.saturating_sub(back);
                    if at <= offset {
                        continue;
                    }
                    storage.compact_to_snapshot(at, at.to_be_bytes().to_vec(), keep).unwrap();
                    let to = at.saturating_sub(keep).max(offset);
                    if to > offset {
                        offset_term = model[(to - offset - 1) as usize];
                        model.drain(..(to - offset) as usize);
                        offset = to;
                    }
                    let snapshot = storage.snapshot(0, 1).unwrap();
                    prop_assert!(storage.snapshot(0, 2).is_err()); // 2 is not a member
                    prop_assert_eq!(snapshot.get_metadata().index, at);
                }
            }
            prop_assert_eq!(storage.first_index().unwrap(), offset + 1);
            prop_assert_eq!(storage.last_index().unwrap(), offset + model.len() as u64);
            prop_assert_eq!(storage.term(offset).unwrap(), offset_term);
            let expected: Vec<(u64, u64)> = model
                .iter()
                .enumerate()
                .map(|(i, term)| (offset + 1 + i as u64, *term))
                .collect();
            prop_assert_eq!(all(&storage), expected);
            for (i, term) in model.iter().enumerate() {
                prop_assert_eq!(storage.term(offset + 1 + i as u64).unwrap(), *term);
            }
        }
    }
}
