use super::keys::{op_id_key, op_index_key};
use super::snapshot::EXPORT_MAGIC;
use super::*;

fn settings() -> KbSettings {
    KbSettings::new(2, 1, "all-MiniLM-L6-v2", 384)
}

fn kb(id: &str, name: &str) -> KbRecord {
    KbRecord {
        id: id.into(),
        name: name.into(),
        settings: settings(),
        created_at_ms: 1,
        updated_at_ms: 1,
        placement: Vec::new(),
    }
}

fn doc(id: &str, kb_id: &str, hash: &str, external_id: Option<&str>) -> DocumentRecord {
    DocumentRecord {
        id: id.into(),
        kb_id: kb_id.into(),
        external_id: external_id.map(String::from),
        title: id.into(),
        source: DocSource::Text {
            format: "text".into(),
        },
        content_hash: hash.into(),
        size_bytes: 10,
        shard: 0,
        status: DocStatus::Queued,
        error: None,
        chunk_count: 0,
        metadata: Default::default(),
        created_at_ms: 5,
        updated_at_ms: 5,
        pages_needing_ocr: 0,
    }
}

struct Log<'a> {
    store: &'a SledMetaStore,
    index: u64,
}

impl Log<'_> {
    fn apply(&mut self, op: MetaOp) -> Result<MetaOutcome> {
        self.index += 1;
        self.store.apply(self.index, &op)
    }
}

#[test]
fn kb_lifecycle_and_name_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    log.apply(MetaOp::CreateKb(kb("k1", "alpha"))).unwrap();
    let error = log.apply(MetaOp::CreateKb(kb("k2", "alpha"))).unwrap_err();
    assert!(matches!(error, StorageError::Conflict(_)), "{error}");
    assert_eq!(store.find_kb("alpha").unwrap().unwrap().id, "k1");
    assert_eq!(store.find_kb("k1").unwrap().unwrap().name, "alpha");
    // A retried create of the same id is not a conflict.
    assert!(matches!(
        log.apply(MetaOp::CreateKb(kb("k1", "alpha"))).unwrap(),
        MetaOutcome::Kb(_)
    ));
    let mut changed = settings();
    changed.chunk_tokens = 128;
    log.apply(MetaOp::UpdateKb {
        kb_id: "k1".into(),
        settings: changed,
        at_ms: 9,
    })
    .unwrap();
    assert_eq!(
        store.get_kb("k1").unwrap().unwrap().settings.chunk_tokens,
        128
    );
    log.apply(MetaOp::RegisterDocuments {
        kb_id: "k1".into(),
        documents: vec![doc("d1", "k1", "h1", None)],
    })
    .unwrap();
    let outcome = log.apply(MetaOp::DeleteKb { kb_id: "k1".into() }).unwrap();
    let MetaOutcome::KbDeleted { documents, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(documents.len(), 1);
    assert!(store.find_kb("alpha").unwrap().is_none());
    assert!(store.get_document("k1", "d1").unwrap().is_none());
    // The name is free again.
    log.apply(MetaOp::CreateKb(kb("k3", "alpha"))).unwrap();
}

#[test]
fn dedupe_by_hash_and_replace_by_external_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    log.apply(MetaOp::CreateKb(kb("k", "kb"))).unwrap();
    let first = log
        .apply(MetaOp::RegisterDocuments {
            kb_id: "k".into(),
            documents: vec![
                doc("d1", "k", "same", Some("ext")),
                doc("d2", "k", "same", None),
            ],
        })
        .unwrap();
    let MetaOutcome::Registered(outcomes) = first else {
        panic!()
    };
    assert!(!outcomes[0].duplicate);
    assert!(
        outcomes[1].duplicate,
        "same bytes in one batch are a duplicate"
    );
    assert_eq!(outcomes[1].record.id, "d1");
    // Same external id, other content: a new version that tombstones the old one.
    let second = log
        .apply(MetaOp::RegisterDocuments {
            kb_id: "k".into(),
            documents: vec![doc("d3", "k", "other", Some("ext"))],
        })
        .unwrap();
    let MetaOutcome::Registered(outcomes) = second else {
        panic!()
    };
    assert_eq!(outcomes[0].replaced.as_ref().unwrap().document_id, "d1");
    assert!(store.is_tombstoned("k", "d1").unwrap());
    assert_eq!(store.find_document("k", "ext").unwrap().unwrap().id, "d3");
    // After the delete, the old bytes are not a duplicate any more.
    let third = log
        .apply(MetaOp::RegisterDocuments {
            kb_id: "k".into(),
            documents: vec![doc("d4", "k", "same", None)],
        })
        .unwrap();
    let MetaOutcome::Registered(outcomes) = third else {
        panic!()
    };
    assert!(!outcomes[0].duplicate);
}

#[test]
fn statuses_counts_delete_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledMetaStore::open(dir.path()).unwrap();
        let mut log = Log {
            store: &store,
            index: 0,
        };
        log.apply(MetaOp::CreateKb(kb("k", "kb"))).unwrap();
        log.apply(MetaOp::RegisterDocuments {
            kb_id: "k".into(),
            documents: vec![
                doc("d1", "k", "a", None),
                doc("d2", "k", "b", None),
                doc("d3", "k", "c", None),
            ],
        })
        .unwrap();
        log.apply(MetaOp::SetDocumentStatus {
            kb_id: "k".into(),
            updates: vec![
                StatusUpdate {
                    document_id: "d1".into(),
                    status: DocStatus::Ready,
                    error: None,
                    chunk_count: Some(4),
                    pages_needing_ocr: None,
                },
                StatusUpdate {
                    document_id: "d2".into(),
                    status: DocStatus::Failed,
                    error: Some("bad".into()),
                    chunk_count: None,
                    pages_needing_ocr: None,
                },
                StatusUpdate {
                    document_id: "gone".into(),
                    status: DocStatus::Ready,
                    error: None,
                    chunk_count: None,
                    pages_needing_ocr: None,
                },
            ],
            at_ms: 7,
        })
        .unwrap();
        let deleted = log
            .apply(MetaOp::DeleteDocument {
                kb_id: "k".into(),
                document_id: "d3".into(),
                at_ms: 8,
            })
            .unwrap();
        assert!(matches!(deleted, MetaOutcome::DocumentDeleted(_)));
        let again = log
            .apply(MetaOp::DeleteDocument {
                kb_id: "k".into(),
                document_id: "d3".into(),
                at_ms: 9,
            })
            .unwrap();
        assert_eq!(again, MetaOutcome::Unchanged);
        assert_eq!(store.applied_index(), 5);
    }
    let store = SledMetaStore::open(dir.path()).unwrap();
    assert_eq!(store.applied_index(), 5);
    // Replaying an already applied index changes nothing.
    let replay = store
        .apply(
            3,
            &MetaOp::DeleteDocument {
                kb_id: "k".into(),
                document_id: "d1".into(),
                at_ms: 1,
            },
        )
        .unwrap();
    assert_eq!(replay, MetaOutcome::Unchanged);
    let readable = store.readable_documents("k", |_| true).unwrap();
    assert_eq!(readable.chunks, 4, "d1's chunks");
    let counts = store.document_counts("k", |_| true).unwrap();
    assert_eq!(counts.total, 2);
    assert_eq!(counts.by_status[&DocStatus::Ready], 1);
    assert_eq!(counts.by_status[&DocStatus::Failed], 1);
    let d1 = store.get_document("k", "d1").unwrap().unwrap();
    assert_eq!(d1.chunk_count, 4);
    assert!(store.is_tombstoned("k", "d3").unwrap());
    assert!(store.unfinished_documents().unwrap().is_empty());
    let page = store.list_documents("k", None, 1).unwrap();
    assert_eq!(page.len(), 1);
    let next = store.list_documents("k", Some(&page[0].id), 10).unwrap();
    assert_eq!(next.len(), 1);
    assert_ne!(next[0].id, page[0].id);
}

#[test]
fn ops_round_trip_through_serde() {
    let op = MetaOp::RegisterDocuments {
        kb_id: "k".into(),
        documents: vec![doc("d", "k", "h", Some("e"))],
    };
    let bytes = serde_json::to_vec(&op).unwrap();
    let back: MetaOp = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(op, back);
    let bin = bincode::serde::encode_to_vec(&op, bincode::config::standard()).unwrap();
    let (back, _): (MetaOp, usize) =
        bincode::serde::decode_from_slice(&bin, bincode::config::standard()).unwrap();
    assert_eq!(op, back);
}

#[test]
fn op_ids_dedupe_a_retried_op_even_after_later_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    store
        .apply_with_id(1, "op-1", &MetaOp::CreateKb(kb("k1", "alpha")))
        .unwrap();
    let register = MetaOp::RegisterDocuments {
        kb_id: "k1".into(),
        documents: vec![doc("d1", "k1", "h1", None)],
    };
    store.apply_with_id(2, "op-2", &register).unwrap();
    let parsing = MetaOp::SetDocumentStatus {
        kb_id: "k1".into(),
        updates: vec![StatusUpdate {
            document_id: "d1".into(),
            status: DocStatus::Parsing,
            error: None,
            chunk_count: None,
            pages_needing_ocr: None,
        }],
        at_ms: 10,
    };
    let first = store.apply_with_id(3, "op-3", &parsing).unwrap();
    let ready = MetaOp::SetDocumentStatus {
        kb_id: "k1".into(),
        updates: vec![StatusUpdate {
            document_id: "d1".into(),
            status: DocStatus::Ready,
            error: None,
            chunk_count: Some(4),
            pages_needing_ocr: None,
        }],
        at_ms: 20,
    };
    store.apply_with_id(4, "op-4", &ready).unwrap();
    // The retry of op-3 (its client never saw the answer) returns the first outcome and does
    // not move the document back to parsing.
    let retried = store.apply_with_id(5, "op-3", &parsing).unwrap();
    assert_eq!(retried, first);
    let doc = store.get_document("k1", "d1").unwrap().unwrap();
    assert_eq!(doc.status, DocStatus::Ready);
    assert_eq!(store.applied_index(), 5);
    // Without an id the same op applies again, but a finished document stays finished (a
    // second worker cannot move it back).
    let again = store.apply(6, &parsing).unwrap();
    assert_eq!(again, MetaOutcome::Statuses(Vec::new()));
    let doc = store.get_document("k1", "d1").unwrap().unwrap();
    assert_eq!(doc.status, DocStatus::Ready);
}

#[test]
fn op_ids_are_forgotten_after_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    store
        .apply_with_id(1, "create", &MetaOp::CreateKb(kb("k1", "alpha")))
        .unwrap();
    assert!(store.tree.contains_key(op_id_key("create")).unwrap());
    let forget = MetaOp::ForgetTombstone {
        kb_id: "k1".into(),
        document_id: "none".into(),
    };
    store
        .apply_with_id(OP_ID_WINDOW + 1, "later", &forget)
        .unwrap();
    assert!(!store.tree.contains_key(op_id_key("create")).unwrap());
    assert!(!store.tree.contains_key(op_index_key(1)).unwrap());
    assert!(store.tree.contains_key(op_id_key("later")).unwrap());
}

#[test]
fn export_import_round_trip_is_deterministic() {
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let c_dir = tempfile::tempdir().unwrap();
    let a = SledMetaStore::open(a_dir.path()).unwrap();
    let b = SledMetaStore::open(b_dir.path()).unwrap();
    let ops = [
        MetaOp::CreateKb(kb("k1", "alpha")),
        MetaOp::RegisterDocuments {
            kb_id: "k1".into(),
            documents: vec![
                doc("d1", "k1", "h1", Some("e1")),
                doc("d2", "k1", "h2", None),
            ],
        },
        MetaOp::DeleteDocument {
            kb_id: "k1".into(),
            document_id: "d2".into(),
            at_ms: 9,
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        a.apply_with_id(i as u64 + 1, &format!("op-{i}"), op)
            .unwrap();
        // b applied the same ops at other indexes (e.g. conf changes between them)
        b.apply_with_id(i as u64 * 2 + 1, &format!("op-{i}"), op)
            .unwrap();
    }
    let exported = a.export_state().unwrap();
    assert_ne!(exported, b.export_state().unwrap()); // op index records differ
    let c = SledMetaStore::open(c_dir.path()).unwrap();
    c.apply(1, &MetaOp::CreateKb(kb("stale", "gone"))).unwrap();
    c.import_state(3, &exported).unwrap();
    assert_eq!(c.export_state().unwrap(), exported);
    assert_eq!(c.applied_index(), 3);
    assert!(c.get_kb("stale").unwrap().is_none());
    assert!(c.find_document("k1", "e1").unwrap().is_some());
    assert!(c.is_tombstoned("k1", "d2").unwrap());
    // a retry of an op recorded in the snapshot is still recognised after import
    let retried = c
        .apply_with_id(4, "op-0", &MetaOp::CreateKb(kb("k1", "alpha")))
        .unwrap();
    assert!(matches!(retried, MetaOutcome::Kb(_)));

    // malformed bytes are refused and change nothing
    for bad in [
        b"nope".to_vec(),
        exported[..exported.len() - 1].to_vec(),
        [EXPORT_MAGIC, &[0, 0, 0, 9, 1]].concat(),
    ] {
        let error = c.import_state(9, &bad).unwrap_err();
        assert!(matches!(error, StorageError::Corrupt(_)), "{error}");
    }
    assert_eq!(c.applied_index(), 4);
    assert!(c.get_kb("k1").unwrap().is_some());
}

pub(super) fn turn(message_id: &str, question: &str) -> StoredTurn {
    StoredTurn {
        message_id: message_id.into(),
        session_id: String::new(),
        run_id: format!("run-{message_id}"),
        seq: 0,
        question: question.into(),
        answer: format!("answer to {question} [1]"),
        citations: vec![TurnCitation {
            n: 1,
            chunk_id: "c1".into(),
            kb_id: "k".into(),
            document_id: "d1".into(),
            document_title: "Doc".into(),
            external_id: Some("e1".into()),
            span: (3, 40),
            text: "cited text".into(),
        }],
        finish_reason: "stop".into(),
        mode: "agent".into(),
        usage: TurnUsage {
            prompt_tokens: 10,
            completion_tokens: 5,
            iterations: 2,
        },
        trace: vec![TurnTraceStep {
            kind: "tool".into(),
            name: "knowledge_search".into(),
            started_ms: 1,
            duration_ms: 2,
            detail_json: "{\"hits\":3}".into(),
        }],
        created_at_ms: 100,
    }
}

#[test]
fn sessions_turns_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let create = MetaOp::CreateSession {
        id: "s1".into(),
        kbs: vec!["k".into()],
        agent: "default".into(),
        created_at_ms: 10,
    };
    let MetaOutcome::Session(session) = log.apply(create.clone()).unwrap() else {
        panic!()
    };
    assert_eq!(session.turns, 0);
    // A retried create returns the same session, unchanged.
    assert_eq!(log.apply(create).unwrap(), MetaOutcome::Session(session));
    log.apply(MetaOp::CreateSession {
        id: "s2".into(),
        kbs: vec![],
        agent: "default".into(),
        created_at_ms: 20,
    })
    .unwrap();
    let listed = |after: Option<&str>, limit: usize| -> Vec<String> {
        store
            .list_sessions(after, limit, |_| true)
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    assert_eq!(listed(None, 10), ["s2", "s1"], "newest id first");
    assert_eq!(listed(None, 1), ["s2"], "one page");
    assert_eq!(listed(Some("s2"), 10), ["s1"], "the page after s2");
    assert!(
        listed(Some("s1"), 10).is_empty(),
        "nothing after the oldest"
    );
    assert!(
        listed(Some("s0"), 10).is_empty(),
        "an unknown id below every id"
    );
    assert_eq!(
        listed(Some("s3"), 10),
        ["s2", "s1"],
        "an unknown id above them"
    );
    // Owned sessions: an owner sees only its own, a page at a time.
    for (id, owner) in [("s3", "key-a"), ("s4", "key-b"), ("s5", "key-a")] {
        log.apply(MetaOp::CreateOwnedSession {
            id: id.into(),
            kbs: vec![],
            agent: "default".into(),
            created_at_ms: 30,
            owner: owner.into(),
        })
        .unwrap();
    }
    let owned = |owner: &str, after: Option<&str>, limit: usize| -> Vec<String> {
        store
            .list_sessions(after, limit, |session| {
                session.owner.as_deref() == Some(owner)
            })
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    };
    assert_eq!(owned("key-a", None, 10), ["s5", "s3"]);
    assert_eq!(owned("key-a", None, 1), ["s5"]);
    assert_eq!(owned("key-a", Some("s5"), 10), ["s3"]);
    assert_eq!(owned("key-b", None, 10), ["s4"]);
    assert!(owned("key-c", None, 10).is_empty());
    assert_eq!(
        store.get_session("s4").unwrap().unwrap().owner.as_deref(),
        Some("key-b")
    );
    assert_eq!(
        listed(None, 10),
        ["s5", "s4", "s3", "s2", "s1"],
        "all, for admins"
    );

    let MetaOutcome::TurnAppended(first) = log
        .apply(MetaOp::AppendTurn {
            session_id: "s1".into(),
            turn: turn("m1", "q1"),
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((first.seq, first.session_id.as_str()), (0, "s1"));
    // A retried append (same message id) is not stored twice.
    let again = log
        .apply(MetaOp::AppendTurn {
            session_id: "s1".into(),
            turn: turn("m1", "q1"),
        })
        .unwrap();
    assert_eq!(again, MetaOutcome::TurnAppended(first.clone()));
    log.apply(MetaOp::AppendTurn {
        session_id: "s1".into(),
        turn: turn("m2", "q2"),
    })
    .unwrap();
    let turns = store.session_turns("s1").unwrap();
    assert_eq!(turns.len(), 2);
    assert_eq!(turns[0], first);
    assert_eq!((turns[1].seq, turns[1].question.as_str()), (1, "q2"));
    assert_eq!(store.get_session("s1").unwrap().unwrap().turns, 2);
    assert!(store.session_turns("s2").unwrap().is_empty());

    // A turn for a session that does not exist is an error and stores nothing.
    let error = log
        .apply(MetaOp::AppendTurn {
            session_id: "nope".into(),
            turn: turn("m3", "q3"),
        })
        .unwrap_err();
    assert!(matches!(error, StorageError::NotFound(_)), "{error}");
    assert!(store.session_turns("nope").unwrap().is_empty());

    log.apply(MetaOp::SetHistorySummary {
        session_id: "s1".into(),
        summary: Some("earlier: q1".into()),
        summary_turns: 5,
        at_ms: 200,
    })
    .unwrap();
    let s1 = store.get_session("s1").unwrap().unwrap();
    assert_eq!(s1.history_summary.as_deref(), Some("earlier: q1"));
    assert_eq!(s1.summary_turns, 2, "never more than the stored turns");

    let deleted = log
        .apply(MetaOp::DeleteSession { id: "s1".into() })
        .unwrap();
    assert!(matches!(deleted, MetaOutcome::SessionDeleted(_)));
    assert!(store.get_session("s1").unwrap().is_none());
    assert!(store.session_turns("s1").unwrap().is_empty());
    assert_eq!(
        log.apply(MetaOp::DeleteSession { id: "s1".into() })
            .unwrap(),
        MetaOutcome::Unchanged
    );
    // The other session is untouched.
    assert!(store.get_session("s2").unwrap().is_some());
}

#[test]
fn session_ops_round_trip_through_bincode() {
    let ops = [
        MetaOp::CreateSession {
            id: "s".into(),
            kbs: vec!["k1".into(), "k2".into()],
            agent: "default".into(),
            created_at_ms: 1,
        },
        MetaOp::AppendTurn {
            session_id: "s".into(),
            turn: turn("m", "q"),
        },
        MetaOp::SetHistorySummary {
            session_id: "s".into(),
            summary: None,
            summary_turns: 0,
            at_ms: 3,
        },
        MetaOp::DeleteSession { id: "s".into() },
        MetaOp::CreateOwnedSession {
            id: "o".into(),
            kbs: vec!["k1".into()],
            agent: "default".into(),
            created_at_ms: 4,
            owner: "0123456789ab".into(),
        },
        MetaOp::CreateApiKey(ApiKeyFields {
            id: "0123456789ab".into(),
            name: "ci".into(),
            role: Role::Reader,
            secret_sha256: "ab".repeat(32),
            created_at_ms: 5,
            expires_at_ms: Some(6),
            revoked_at_ms: None,
        }),
        MetaOp::RevokeApiKey {
            id: "0123456789ab".into(),
            at_ms: 7,
        },
        MetaOp::CreateTenant {
            name: "acme".into(),
            created_at_ms: 8,
        },
        MetaOp::DeleteTenant {
            name: "acme".into(),
            at_ms: 9,
        },
        MetaOp::CreateTenantKb {
            tenant: "acme".into(),
            kb: kb("k2", "docs"),
        },
        MetaOp::ShareKb {
            kb_id: "k2".into(),
            tenant: "globex".into(),
            shared: true,
        },
        MetaOp::CreateTenantApiKey {
            key: ApiKeyFields {
                id: "0123456789ac".into(),
                name: "acme ci".into(),
                role: Role::Editor,
                secret_sha256: "cd".repeat(32),
                created_at_ms: 10,
                expires_at_ms: None,
                revoked_at_ms: None,
            },
            tenant: "acme".into(),
            groups: vec!["finance".into()],
        },
    ];
    for op in ops {
        let bin = bincode::serde::encode_to_vec(&op, bincode::config::standard()).unwrap();
        let (back, _): (MetaOp, usize) =
            bincode::serde::decode_from_slice(&bin, bincode::config::standard()).unwrap();
        assert_eq!(op, back);
    }
}

#[test]
fn replica_states_and_moves() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let mut record = kb("k1", "alpha");
    let replica = |node, state| Replica {
        node,
        state,
        since_ms: 1,
    };
    record.placement = vec![
        ShardPlacement {
            replicas: vec![
                replica(1, ReplicaState::Active),
                replica(2, ReplicaState::Active),
            ],
        },
        ShardPlacement {
            replicas: vec![replica(2, ReplicaState::Active)],
        },
    ];
    log.apply(MetaOp::CreateKb(record)).unwrap();
    let set = |node, state, expected| MetaOp::SetReplicaState {
        kb_id: "k1".into(),
        shard: 0,
        node,
        state,
        expected,
        at_ms: 9,
    };
    // A compare-and-set on the state the proposer saw.
    assert_eq!(
        log.apply(set(2, ReplicaState::Dead, Some(ReplicaState::Recovering)))
            .unwrap(),
        MetaOutcome::Unchanged
    );
    assert!(matches!(
        log.apply(set(2, ReplicaState::Dead, Some(ReplicaState::Active)))
            .unwrap(),
        MetaOutcome::Kb(_)
    ));
    let stored = store.get_kb("k1").unwrap().unwrap();
    assert_eq!(stored.replicas(0)[1].state, ReplicaState::Dead);
    assert_eq!(stored.replicas(0)[1].since_ms, 9);
    // A replica that is not (or no longer) placed: nothing to change, not an error.
    assert_eq!(
        log.apply(set(7, ReplicaState::Dead, None)).unwrap(),
        MetaOutcome::Unchanged
    );

    // A move: add on node 3 (initializing), then remove the old one.
    let add = MetaOp::AddReplica {
        kb_id: "k1".into(),
        shard: 1,
        node: 3,
        at_ms: 10,
    };
    log.apply(add.clone()).unwrap();
    assert_eq!(log.apply(add).unwrap(), MetaOutcome::Unchanged);
    let stored = store.get_kb("k1").unwrap().unwrap();
    assert_eq!(stored.replicas(1).len(), 2);
    assert_eq!(stored.replicas(1)[1].state, ReplicaState::Initializing);
    let remove = |node| MetaOp::RemoveReplica {
        kb_id: "k1".into(),
        shard: 1,
        node,
        at_ms: 11,
    };
    // The only active replica cannot go before the new one is active.
    let error = log.apply(remove(2)).unwrap_err();
    assert!(matches!(error, StorageError::Conflict(_)), "{error}");
    log.apply(MetaOp::SetReplicaState {
        kb_id: "k1".into(),
        shard: 1,
        node: 3,
        state: ReplicaState::Active,
        expected: Some(ReplicaState::Initializing),
        at_ms: 12,
    })
    .unwrap();
    log.apply(remove(2)).unwrap();
    let stored = store.get_kb("k1").unwrap().unwrap();
    assert_eq!(
        stored
            .replicas(1)
            .iter()
            .map(|r| r.node)
            .collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(log.apply(remove(2)).unwrap(), MetaOutcome::Unchanged);
}

fn pending_of(store: &SledMetaStore) -> Vec<(String, u64)> {
    store
        .pending_documents()
        .unwrap()
        .into_iter()
        .map(|p| (p.document_id, p.work.worker))
        .collect()
}

#[test]
fn pending_work_follows_registration_status_reassignment_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    log.apply(MetaOp::CreateKb(kb("k", "kb"))).unwrap();
    log.apply(MetaOp::RegisterDocumentsTo {
        kb_id: "k".into(),
        documents: vec![
            doc("d1", "k", "h1", None),
            doc("d2", "k", "h2", Some("x")),
            doc("d3", "k", "h3", None),
            // A duplicate of d1's bytes: not pending (it is d1).
            doc("d4", "k", "h1", None),
        ],
        workers: vec![2, 3, 2, 3],
    })
    .unwrap();
    assert_eq!(
        pending_of(&store),
        [("d1".into(), 2), ("d2".into(), 3), ("d3".into(), 2)]
    );
    let bytes = |store: &SledMetaStore| {
        store
            .shard_bytes()
            .unwrap()
            .get(&("k".to_string(), 0))
            .copied()
    };
    assert_eq!(
        bytes(&store),
        Some(30),
        "three documents of 10 bytes (not the duplicate)"
    );
    // Ready and failed leave the index; a stage change does not.
    log.apply(MetaOp::SetDocumentStatus {
        kb_id: "k".into(),
        updates: vec![
            StatusUpdate {
                document_id: "d1".into(),
                status: DocStatus::Ready,
                error: None,
                chunk_count: Some(1),
                pages_needing_ocr: None,
            },
            StatusUpdate {
                document_id: "d3".into(),
                status: DocStatus::Embedding,
                error: None,
                chunk_count: None,
                pages_needing_ocr: None,
            },
        ],
        at_ms: 6,
    })
    .unwrap();
    assert_eq!(pending_of(&store), [("d2".into(), 3), ("d3".into(), 2)]);
    // Reassignment is a compare-and-set on the current worker.
    let outcome = log
        .apply(MetaOp::ReassignDocuments {
            kb_id: "k".into(),
            document_ids: vec!["d1".into(), "d2".into(), "d3".into()],
            from: 3,
            to: 1,
        })
        .unwrap();
    assert_eq!(outcome, MetaOutcome::Reassigned(vec!["d2".into()]));
    assert_eq!(pending_of(&store), [("d2".into(), 1), ("d3".into(), 2)]);
    // Replaced (same external id, new bytes) and deleted documents leave it.
    log.apply(MetaOp::RegisterDocumentsTo {
        kb_id: "k".into(),
        documents: vec![doc("d5", "k", "h5", Some("x"))],
        workers: vec![3],
    })
    .unwrap();
    assert_eq!(pending_of(&store), [("d3".into(), 2), ("d5".into(), 3)]);
    assert_eq!(bytes(&store), Some(30), "d5 replaced d2");
    log.apply(MetaOp::DeleteDocument {
        kb_id: "k".into(),
        document_id: "d3".into(),
        at_ms: 7,
    })
    .unwrap();
    assert_eq!(pending_of(&store), [("d5".into(), 3)]);
    assert_eq!(bytes(&store), Some(20));
    assert_eq!(store.kb_stored_bytes("k").unwrap(), 20);
    // A deleted KB takes its pending work along.
    log.apply(MetaOp::DeleteKb { kb_id: "k".into() }).unwrap();
    assert!(pending_of(&store).is_empty());
    assert!(store.shard_bytes().unwrap().is_empty());
    assert_eq!(store.kb_stored_bytes("k").unwrap(), 0);
}

/// Opens a store that was just dropped. sled's background flusher can hold the directory's
/// lock for a moment after the drop, so a failed lock is retried (bounded).
fn open_again(dir: &std::path::Path) -> SledMetaStore {
    let started = std::time::Instant::now();
    loop {
        match SledMetaStore::open(dir) {
            Ok(store) => return store,
            Err(error) if started.elapsed() < std::time::Duration::from_secs(10) => {
                assert!(error.to_string().contains("lock"), "{error}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(error) => panic!("reopening the store: {error}"),
        }
    }
}

#[test]
fn each_committed_start_of_processing_counts_as_an_attempt_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let stage = |document_id: &str, status: DocStatus| MetaOp::SetDocumentStatus {
        kb_id: "k".into(),
        updates: vec![StatusUpdate {
            document_id: document_id.into(),
            status,
            error: None,
            chunk_count: None,
            pages_needing_ocr: None,
        }],
        at_ms: 5,
    };
    let attempts = |store: &SledMetaStore, id: &str| {
        store
            .pending_work("k", id)
            .unwrap()
            .map(|work| work.attempts)
    };
    let index;
    {
        let store = SledMetaStore::open(dir.path()).unwrap();
        let mut log = Log {
            store: &store,
            index: 0,
        };
        log.apply(MetaOp::CreateKb(kb("k", "kb"))).unwrap();
        log.apply(MetaOp::RegisterDocumentsTo {
            kb_id: "k".into(),
            documents: vec![doc("d1", "k", "h1", None), doc("d2", "k", "h2", None)],
            workers: vec![2, 2],
        })
        .unwrap();
        assert_eq!(attempts(&store, "d1"), Some(0));
        // Only the start (parsing) counts, not the later stages of the same attempt.
        for status in [
            DocStatus::Parsing,
            DocStatus::Chunking,
            DocStatus::Embedding,
        ] {
            log.apply(stage("d1", status)).unwrap();
        }
        log.apply(stage("d1", DocStatus::Parsing)).unwrap();
        assert_eq!(attempts(&store, "d1"), Some(2));
        assert_eq!(attempts(&store, "d2"), Some(0));
        // A reassignment keeps the count: a document that crashes one node counts on the next.
        log.apply(MetaOp::ReassignDocuments {
            kb_id: "k".into(),
            document_ids: vec!["d1".into()],
            from: 2,
            to: 3,
        })
        .unwrap();
        assert_eq!(attempts(&store, "d1"), Some(2));
        store.flush().unwrap();
        index = log.index;
    }
    let store = open_again(dir.path());
    assert_eq!(attempts(&store, "d1"), Some(2), "the count is durable");
    let mut log = Log {
        store: &store,
        index,
    };
    log.apply(stage("d1", DocStatus::Failed)).unwrap();
    assert_eq!(
        attempts(&store, "d1"),
        None,
        "finished work leaves the index"
    );
}

#[test]
fn a_store_without_the_pending_index_builds_it_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledMetaStore::open(dir.path()).unwrap();
        let mut log = Log {
            store: &store,
            index: 0,
        };
        log.apply(MetaOp::CreateKb(kb("k", "kb"))).unwrap();
        log.apply(MetaOp::RegisterDocuments {
            kb_id: "k".into(),
            documents: vec![doc("d1", "k", "h1", None), doc("d2", "k", "h2", None)],
        })
        .unwrap();
        log.apply(MetaOp::SetDocumentStatus {
            kb_id: "k".into(),
            updates: vec![StatusUpdate {
                document_id: "d2".into(),
                status: DocStatus::Failed,
                error: Some("bad".into()),
                chunk_count: None,
                pages_needing_ocr: None,
            }],
            at_ms: 6,
        })
        .unwrap();
        // As written by a version without the index.
        let derived = [
            b"pend/k/d1".as_slice(),
            b"shardbytes/k/0000000000",
            PENDING_INDEX_KEY,
        ];
        for key in derived {
            assert!(store.tree.remove(key).unwrap().is_some());
        }
        store.flush().unwrap();
        assert!(pending_of(&store).is_empty());
    }
    let store = SledMetaStore::open(dir.path()).unwrap();
    assert_eq!(pending_of(&store), [("d1".into(), 0)]);
    assert_eq!(
        store.shard_bytes().unwrap(),
        BTreeMap::from([(("k".to_string(), 0), 20)])
    );
}

#[test]
fn draining_marks_are_set_and_cleared_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let drain = |node, draining| MetaOp::SetNodeDraining { node, draining };
    assert_eq!(
        log.apply(drain(12, true)).unwrap(),
        MetaOutcome::Draining {
            node: 12,
            draining: true
        }
    );
    assert_eq!(log.apply(drain(12, true)).unwrap(), MetaOutcome::Unchanged);
    log.apply(drain(3, true)).unwrap();
    assert_eq!(store.draining_nodes().unwrap(), [3, 12]);
    log.apply(drain(12, false)).unwrap();
    assert_eq!(log.apply(drain(12, false)).unwrap(), MetaOutcome::Unchanged);
    assert_eq!(store.draining_nodes().unwrap(), [3]);
}

/// Ops that each depend on the ones before them, with refusals in between.
fn dependent_ops() -> Vec<MetaOp> {
    vec![
        MetaOp::CreateKb(kb("k1", "alpha")),
        MetaOp::CreateKb(kb("k2", "alpha")), // refused: the name is taken
        MetaOp::RegisterDocuments {
            kb_id: "k1".into(),
            documents: vec![
                doc("d1", "k1", "h1", Some("e1")),
                doc("d2", "k1", "h2", None),
            ],
        },
        MetaOp::RegisterDocuments {
            kb_id: "missing".into(), // refused
            documents: vec![doc("d9", "missing", "h9", None)],
        },
        MetaOp::CreateSession {
            id: "s1".into(),
            kbs: vec!["k1".into()],
            agent: "default".into(),
            created_at_ms: 3,
        },
        MetaOp::AppendTurn {
            session_id: "s1".into(),
            turn: turn("m1", "q1"),
        },
        MetaOp::DeleteSession { id: "s1".into() },
        // Sees the documents registered earlier in the same batch.
        MetaOp::DeleteKb { kb_id: "k1".into() },
        MetaOp::CreateKb(kb("k3", "alpha")), // the name is free again
    ]
}

#[test]
fn a_batch_applies_exactly_like_its_ops_one_at_a_time() {
    let ops = dependent_ops();
    let ids: Vec<String> = (0..ops.len()).map(|i| format!("op-{i}")).collect();
    let logged: Vec<LoggedOp<'_>> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| LoggedOp {
            index: i as u64 + 1,
            op_id: Some(&ids[i]),
            op,
        })
        .collect();

    let one_dir = tempfile::tempdir().unwrap();
    let one = SledMetaStore::open(one_dir.path()).unwrap();
    let singly: Vec<Result<MetaOutcome>> = logged
        .iter()
        .map(|op| one.apply_with_id(op.index, op.op_id.unwrap(), op.op))
        .collect();

    let batch_dir = tempfile::tempdir().unwrap();
    let batch = SledMetaStore::open(batch_dir.path()).unwrap();
    let batched = batch.apply_batch_with_ids(&logged, false).unwrap();

    assert_eq!(batched.len(), ops.len());
    for (i, (a, b)) in singly.iter().zip(&batched).enumerate() {
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "op {i}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "op {i}"),
            _ => panic!("op {i}: {a:?} one at a time, {b:?} in a batch"),
        }
    }
    assert!(batched[1].is_err() && batched[3].is_err());
    let MetaOutcome::KbDeleted { documents, .. } = batched[7].as_ref().unwrap() else {
        panic!("{:?}", batched[7])
    };
    assert_eq!(
        documents.len(),
        2,
        "the delete saw the batch's own documents"
    );
    assert_eq!(batch.applied_index(), ops.len() as u64);
    assert_eq!(batch.export_state().unwrap(), one.export_state().unwrap());
    assert_eq!(batch.find_kb("alpha").unwrap().unwrap().id, "k3");
    assert!(batch.get_session("s1").unwrap().is_none());

    // A replayed batch changes nothing; a retried op id returns its first outcome.
    let again = batch.apply_batch_with_ids(&logged, false).unwrap();
    assert!(
        again
            .iter()
            .all(|outcome| matches!(outcome, Ok(MetaOutcome::Unchanged)))
    );
    let retried = MetaOp::CreateKb(kb("k1", "alpha"));
    let retry = LoggedOp {
        index: ops.len() as u64 + 1,
        op_id: Some(&ids[0]),
        op: &retried,
    };
    let outcome = batch.apply_batch_with_ids(&[retry], false).unwrap();
    assert_eq!(outcome[0].as_ref().unwrap(), singly[0].as_ref().unwrap());
    assert!(
        batch.get_kb("k1").unwrap().is_none(),
        "the retry did not recreate k1"
    );
    assert_eq!(batch.applied_index(), ops.len() as u64 + 1);
}

#[test]
fn api_keys_are_created_once_and_stay_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let key = |id: &str, hash: &str, role: Role| ApiKeyFields {
        id: id.into(),
        name: "k".into(),
        role,
        secret_sha256: hash.into(),
        created_at_ms: 1,
        expires_at_ms: None,
        revoked_at_ms: None,
    };
    assert!(!store.has_live_admin_key(10).unwrap());
    let admin = key("aaaaaaaaaaaa", "h1", Role::Admin);
    assert_eq!(
        log.apply(MetaOp::CreateApiKey(admin.clone())).unwrap(),
        MetaOutcome::ApiKey(admin.clone().into_record(DEFAULT_TENANT, &[]))
    );
    // A retried create is the same key; another secret under the same id is refused.
    assert_eq!(
        log.apply(MetaOp::CreateApiKey(admin.clone())).unwrap(),
        MetaOutcome::ApiKey(admin.clone().into_record(DEFAULT_TENANT, &[]))
    );
    let clash = log
        .apply(MetaOp::CreateApiKey(key("aaaaaaaaaaaa", "h2", Role::Admin)))
        .unwrap_err();
    assert!(clash.to_string().contains("already exists"), "{clash}");
    assert!(store.has_live_admin_key(10).unwrap());
    log.apply(MetaOp::CreateApiKey(key(
        "bbbbbbbbbbbb",
        "h3",
        Role::Reader,
    )))
    .unwrap();

    // Revoked once, at the first time; the record stays.
    let MetaOutcome::ApiKey(revoked) = log
        .apply(MetaOp::RevokeApiKey {
            id: "aaaaaaaaaaaa".into(),
            at_ms: 20,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(revoked.revoked_at_ms, Some(20));
    log.apply(MetaOp::RevokeApiKey {
        id: "aaaaaaaaaaaa".into(),
        at_ms: 30,
    })
    .unwrap();
    let stored = store.get_api_key("aaaaaaaaaaaa").unwrap().unwrap();
    assert_eq!(stored.revoked_at_ms, Some(20));
    assert!(!stored.is_live(25));
    assert!(
        !store.has_live_admin_key(25).unwrap(),
        "a reader is not an admin"
    );
    assert_eq!(store.list_api_keys().unwrap().len(), 2);
    let missing = log
        .apply(MetaOp::RevokeApiKey {
            id: "cccccccccccc".into(),
            at_ms: 40,
        })
        .unwrap_err();
    assert!(missing.to_string().contains("cccccccccccc"), "{missing}");

    // Expiry: live before its time, not at or after it.
    let mut expiring = key("dddddddddddd", "h4", Role::Admin).into_record(DEFAULT_TENANT, &[]);
    expiring.expires_at_ms = Some(100);
    assert!(expiring.is_live(99) && !expiring.is_live(100));
}

/// The first key format (before tenants) is still read: its records belong to the default
/// tenant, with no groups.
#[test]
fn api_key_records_from_before_tenants_are_default_tenant_keys() {
    let old = r#"{"id":"aaaaaaaaaaaa","name":"k","role":"admin","secret_sha256":"h","created_at_ms":1,"expires_at_ms":null,"revoked_at_ms":null}"#;
    let record: ApiKeyRecord = serde_json::from_str(old).unwrap();
    assert_eq!(record.tenant, DEFAULT_TENANT);
    assert!(record.groups.is_empty());
}

/// A tenant's limits replace its earlier ones, survive a reopen, go with the tenant, and
/// records stored before limits existed read as "none of its own".
#[test]
fn tenant_limits_are_set_replaced_and_go_with_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let set = |name: &str, limits: sift_api::TenantLimits| MetaOp::SetTenantLimits {
        name: name.into(),
        limits,
    };
    let tight = sift_api::TenantLimits {
        max_documents: Some(3),
        max_kbs: Some(1),
        ..Default::default()
    };
    let missing = log.apply(set("acme", tight.clone())).unwrap_err();
    assert!(matches!(missing, StorageError::NotFound(_)), "{missing}");
    let default = log.apply(set(DEFAULT_TENANT, tight.clone())).unwrap_err();
    assert!(matches!(default, StorageError::Invalid(_)), "{default}");
    log.apply(MetaOp::CreateTenant {
        name: "acme".into(),
        created_at_ms: 5,
    })
    .unwrap();
    assert_eq!(store.tenant_limits("acme").unwrap(), Default::default());
    match log.apply(set("acme", tight.clone())).unwrap() {
        MetaOutcome::Tenant(record) => assert_eq!(record.limits, tight),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.tenant_limits("acme").unwrap(), tight);
    let other = sift_api::TenantLimits {
        rate_limit_per_minute: Some(60),
        ..Default::default()
    };
    log.apply(set("acme", other.clone())).unwrap();
    assert_eq!(
        store.tenant_limits("acme").unwrap(),
        other,
        "replaced whole"
    );
    drop(store);
    let store = SledMetaStore::open(dir.path()).unwrap();
    assert_eq!(store.tenant_limits("acme").unwrap(), other, "durable");
    let mut log = Log {
        store: &store,
        index: 10,
    };
    log.apply(MetaOp::DeleteTenant {
        name: "acme".into(),
        at_ms: 9,
    })
    .unwrap();
    log.apply(MetaOp::CreateTenant {
        name: "acme".into(),
        created_at_ms: 10,
    })
    .unwrap();
    assert_eq!(
        store.tenant_limits("acme").unwrap(),
        Default::default(),
        "a tenant made again under the name starts with none"
    );
    let old: TenantRecord = serde_json::from_str(r#"{"name":"acme","created_at_ms":1}"#).unwrap();
    assert_eq!(old.limits, Default::default());
}

#[test]
fn tenants_scope_kb_names_keys_sessions_and_shares() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let tenant = |name: &str| MetaOp::CreateTenant {
        name: name.into(),
        created_at_ms: 5,
    };
    log.apply(tenant("acme")).unwrap();
    log.apply(tenant("globex")).unwrap();
    // A retried create is the same tenant; the default one and a second acme are refused.
    assert!(matches!(
        log.apply(tenant("acme")).unwrap(),
        MetaOutcome::Tenant(_)
    ));
    let again = log
        .apply(MetaOp::CreateTenant {
            name: "acme".into(),
            created_at_ms: 6,
        })
        .unwrap_err();
    assert!(matches!(again, StorageError::Conflict(_)), "{again}");
    assert!(log.apply(tenant(DEFAULT_TENANT)).is_err());
    let names: Vec<String> = store
        .list_tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["default", "acme", "globex"]);

    // The same KB name in three tenants; each finds its own, by name or id.
    log.apply(MetaOp::CreateKb(kb("k0", "docs"))).unwrap();
    let create = |tenant: &str, id: &str| MetaOp::CreateTenantKb {
        tenant: tenant.into(),
        kb: kb(id, "docs"),
    };
    log.apply(create("acme", "k1")).unwrap();
    log.apply(create("globex", "k2")).unwrap();
    let clash = log.apply(create("acme", "k3")).unwrap_err();
    assert!(matches!(clash, StorageError::Conflict(_)), "{clash}");
    assert!(log.apply(create("nobody", "k4")).is_err(), "no such tenant");
    let found = |tenant: &str, kb: &str| {
        store
            .find_kb_in(tenant, kb)
            .unwrap()
            .map(|(record, access)| (record.id, access))
    };
    assert_eq!(
        found(DEFAULT_TENANT, "docs"),
        Some(("k0".into(), KbAccess::Owner))
    );
    assert_eq!(found("acme", "docs"), Some(("k1".into(), KbAccess::Owner)));
    assert_eq!(found("acme", "k1"), Some(("k1".into(), KbAccess::Owner)));
    assert_eq!(
        found("acme", "acme:docs"),
        Some(("k1".into(), KbAccess::Owner))
    );
    // Another tenant's KB is not found, by id, name or qualified name.
    assert_eq!(found("globex", "k1"), None);
    assert_eq!(found("globex", "acme:docs"), None);
    assert_eq!(found(DEFAULT_TENANT, "k1"), None);
    assert_eq!(store.kb_tenant("k1").unwrap(), "acme");
    assert_eq!(store.kb_tenant("k0").unwrap(), DEFAULT_TENANT);

    // Shared with globex: found there read-only, by id or qualified name.
    let share = |shared| MetaOp::ShareKb {
        kb_id: "k1".into(),
        tenant: "globex".into(),
        shared,
    };
    log.apply(share(true)).unwrap();
    assert_eq!(found("globex", "k1"), Some(("k1".into(), KbAccess::Shared)));
    assert_eq!(
        found("globex", "acme:docs"),
        Some(("k1".into(), KbAccess::Shared))
    );
    assert_eq!(
        found("globex", "docs"),
        Some(("k2".into(), KbAccess::Owner))
    );
    assert_eq!(store.list_kbs_in("globex").unwrap().len(), 2);
    assert_eq!(store.list_kbs_in("acme").unwrap().len(), 1);
    assert!(
        log.apply(MetaOp::ShareKb {
            kb_id: "k1".into(),
            tenant: "acme".into(),
            shared: true,
        })
        .is_err(),
        "not with its owner"
    );
    log.apply(share(false)).unwrap();
    assert_eq!(found("globex", "k1"), None);
    log.apply(share(true)).unwrap();

    // Keys of a tenant; a key of an unknown tenant is refused.
    let key = |id: &str, tenant: &str| MetaOp::CreateTenantApiKey {
        key: ApiKeyFields {
            id: id.into(),
            name: "k".into(),
            role: Role::Admin,
            secret_sha256: format!("hash-{id}"),
            created_at_ms: 1,
            expires_at_ms: None,
            revoked_at_ms: None,
        },
        tenant: tenant.into(),
        groups: vec!["team".into()],
    };
    log.apply(key("aaaaaaaaaaaa", "globex")).unwrap();
    log.apply(key("bbbbbbbbbbbb", "acme")).unwrap();
    assert!(log.apply(key("cccccccccccc", "nobody")).is_err());
    let stored = store.get_api_key("aaaaaaaaaaaa").unwrap().unwrap();
    assert_eq!((stored.tenant.as_str(), stored.groups.len()), ("globex", 1));
    assert!(
        !store.has_live_admin_key(10).unwrap(),
        "a tenant's admin is no operator"
    );
    assert_eq!(
        store.owner_tenant(Some("aaaaaaaaaaaa")).unwrap().as_deref(),
        Some("globex")
    );
    assert_eq!(
        store.owner_tenant(None).unwrap().as_deref(),
        Some(DEFAULT_TENANT)
    );
    for (id, owner) in [("s1", "aaaaaaaaaaaa"), ("s2", "bbbbbbbbbbbb")] {
        log.apply(MetaOp::CreateOwnedSession {
            id: id.into(),
            kbs: vec!["k2".into()],
            agent: "default".into(),
            created_at_ms: 1,
            owner: owner.into(),
        })
        .unwrap();
    }

    // A tenant that owns a KB cannot be deleted; once its KBs are gone, its keys are
    // revoked, its sessions and the shares made to it deleted.
    let delete = MetaOp::DeleteTenant {
        name: "globex".into(),
        at_ms: 50,
    };
    let refused = log.apply(delete.clone()).unwrap_err();
    assert!(matches!(refused, StorageError::Conflict(_)), "{refused}");
    log.apply(MetaOp::DeleteKb { kb_id: "k2".into() }).unwrap();
    assert_eq!(found("globex", "docs"), None);
    let MetaOutcome::TenantDeleted(deleted) = log.apply(delete.clone()).unwrap() else {
        panic!("deleted")
    };
    assert_eq!(deleted.revoked_keys, ["aaaaaaaaaaaa"]);
    assert_eq!(deleted.sessions, ["s1"]);
    assert_eq!(log.apply(delete).unwrap(), MetaOutcome::Unchanged);
    assert!(store.get_tenant("globex").unwrap().is_none());
    let revoked = store.get_api_key("aaaaaaaaaaaa").unwrap().unwrap();
    assert_eq!(revoked.revoked_at_ms, Some(50));
    assert!(store.get_session("s1").unwrap().is_none());
    assert!(store.get_session("s2").unwrap().is_some());
    assert!(store.kb_shares("k1").unwrap().is_empty());
    // A new globex starts with nothing: the old share is gone.
    log.apply(tenant("globex")).unwrap();
    assert_eq!(found("globex", "k1"), None);
    assert!(
        log.apply(MetaOp::DeleteTenant {
            name: DEFAULT_TENANT.into(),
            at_ms: 60,
        })
        .is_err()
    );

    // Deleting a KB frees its name in its tenant.
    log.apply(MetaOp::DeleteKb { kb_id: "k1".into() }).unwrap();
    assert_eq!(found("acme", "docs"), None);
    log.apply(create("acme", "k5")).unwrap();
    assert_eq!(found("acme", "docs"), Some(("k5".into(), KbAccess::Owner)));
}

#[test]
fn the_audit_log_pages_in_time_order_and_forgets_past_its_retention() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    let entry = |n: u64, tenant: &str| AuditEntry {
        // Ids sort as the times do (the node's are UUIDv7).
        id: format!("0000-{n:04}"),
        at_ms: n * 10,
        key_id: Some("aaaaaaaaaaaa".into()),
        tenant: tenant.into(),
        role: "editor".into(),
        method: "POST".into(),
        route: "/v1/kbs".into(),
        target: "/v1/kbs".into(),
        status: 201,
        address: Some("127.0.0.1".into()),
    };
    for n in 1..=6 {
        let tenant = if n % 2 == 0 { "acme" } else { DEFAULT_TENANT };
        log.apply(MetaOp::AppendAudit {
            entry: entry(n, tenant),
            forget_before_ms: 0,
        })
        .unwrap();
    }
    let ids =
        |entries: Vec<AuditEntry>| -> Vec<u64> { entries.iter().map(|e| e.at_ms / 10).collect() };
    assert_eq!(
        ids(store.list_audit(None, 4, |_| true).unwrap()),
        [1, 2, 3, 4]
    );
    assert_eq!(
        ids(store.list_audit(Some("0000-0004"), 4, |_| true).unwrap()),
        [5, 6]
    );
    assert_eq!(
        ids(store.list_audit(None, 10, |e| e.tenant == "acme").unwrap()),
        [2, 4, 6]
    );
    // An append forgets what is older than its retention boundary, and only that.
    log.apply(MetaOp::AppendAudit {
        entry: entry(7, "acme"),
        forget_before_ms: 35,
    })
    .unwrap();
    assert_eq!(
        ids(store.list_audit(None, 10, |_| true).unwrap()),
        [4, 5, 6, 7]
    );
}

#[test]
fn kb_usage_sums_the_documents_of_one_kb() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledMetaStore::open(dir.path()).unwrap();
    let mut log = Log {
        store: &store,
        index: 0,
    };
    log.apply(MetaOp::CreateKb(kb("k1", "alpha"))).unwrap();
    log.apply(MetaOp::CreateKb(kb("k2", "beta"))).unwrap();
    assert_eq!(store.kb_usage("k1").unwrap(), KbUsage::default());
    let mut first = doc("d1", "k1", "h1", None);
    first.chunk_count = 3;
    first.size_bytes = 100;
    let mut second = doc("d2", "k1", "h2", None);
    second.chunk_count = 4;
    second.size_bytes = 23;
    log.apply(MetaOp::RegisterDocuments {
        kb_id: "k1".into(),
        documents: vec![first, second],
    })
    .unwrap();
    log.apply(MetaOp::RegisterDocuments {
        kb_id: "k2".into(),
        documents: vec![doc("d3", "k2", "h3", None)],
    })
    .unwrap();
    assert_eq!(
        store.kb_usage("k1").unwrap(),
        KbUsage {
            documents: 2,
            chunks: 7,
            bytes: 123,
        }
    );
    assert_eq!(store.kb_usage("k2").unwrap().documents, 1);
}
