use super::*;

fn settings() -> KbSettings {
    KbSettings {
        shards: 2,
        chunk_tokens: 256,
        chunk_overlap_tokens: 32,
        parent_tokens: 1024,
        embedding_model: "all-MiniLM-L6-v2".into(),
        dimension: 384,
        language: "auto".into(),
        json_text_field: "text".into(),
        json_title_field: "title".into(),
        retrieval: RetrievalSettings::default(),
    }
}

fn kb(id: &str, name: &str) -> KbRecord {
    KbRecord {
        id: id.into(),
        name: name.into(),
        settings: settings(),
        created_at_ms: 1,
        updated_at_ms: 1,
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
                },
                StatusUpdate {
                    document_id: "d2".into(),
                    status: DocStatus::Failed,
                    error: Some("bad".into()),
                    chunk_count: None,
                },
                StatusUpdate {
                    document_id: "gone".into(),
                    status: DocStatus::Ready,
                    error: None,
                    chunk_count: None,
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
    let counts = store.document_counts("k").unwrap();
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
