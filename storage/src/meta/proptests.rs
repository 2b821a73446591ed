//! Property: a log of ops applied one entry at a time, as one batch, or in batches of any
//! sizes leaves byte-equal stores and equal outcomes. The Raft driver applies committed
//! entries in batches of whatever size a ready cycle delivers, a single node applies one op
//! at a time, and every node must end with the same state.
//!
//! The ops draw ids from small pools so that they hit each other: retried creates, name
//! conflicts, duplicates by content hash, replacements by external id, updates of deleted
//! documents, refused replica removals, turns of deleted sessions, retried op ids.

use proptest::prelude::*;

use super::tests::turn;
use super::*;

const KBS: [&str; 3] = ["k0", "k1", "k2"];
const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const DOCS: [&str; 4] = ["d0", "d1", "d2", "d3"];
const HASHES: [&str; 5] = ["h0", "h1", "h2", "h3", "h4"];
const SESSIONS: [&str; 2] = ["s0", "s1"];
const MESSAGES: [&str; 3] = ["m0", "m1", "m2"];
/// Shards of every generated KB; ops also name shard 2, which no KB has.
const SHARDS: u32 = 2;

/// Mostly the two KBs the log starts with; the third exists only once an op creates it.
fn kb_id() -> impl Strategy<Value = String> {
    prop_oneof![3 => Just(KBS[0]), 3 => Just(KBS[1]), 1 => Just(KBS[2])].prop_map(String::from)
}

fn doc_id() -> impl Strategy<Value = String> {
    prop::sample::select(&DOCS[..]).prop_map(String::from)
}

fn session_id() -> impl Strategy<Value = String> {
    prop::sample::select(&SESSIONS[..]).prop_map(String::from)
}

fn node() -> impl Strategy<Value = u64> {
    1u64..=3
}

fn at_ms() -> impl Strategy<Value = u64> {
    1u64..50
}

fn replica_state() -> impl Strategy<Value = ReplicaState> {
    prop_oneof![
        Just(ReplicaState::Initializing),
        Just(ReplicaState::Active),
        Just(ReplicaState::Dead),
        Just(ReplicaState::Recovering),
    ]
}

/// Mostly stages that keep a document pending (`parsing` counts an attempt); a terminal
/// status ends a document's updates.
fn doc_status() -> impl Strategy<Value = DocStatus> {
    prop_oneof![
        3 => Just(DocStatus::Parsing),
        2 => prop::sample::select(&DocStatus::ALL[..]),
    ]
}

/// The replicas of one shard: one to three distinct nodes.
fn shard_placement() -> impl Strategy<Value = ShardPlacement> {
    prop::collection::btree_map(node(), (replica_state(), at_ms()), 1..=3).prop_map(|nodes| {
        ShardPlacement {
            replicas: nodes
                .into_iter()
                .map(|(node, (state, since_ms))| Replica {
                    node,
                    state,
                    since_ms,
                })
                .collect(),
        }
    })
}

fn settings() -> impl Strategy<Value = KbSettings> {
    prop::sample::select(vec![128u32, 256]).prop_map(|chunk_tokens| {
        let mut settings = KbSettings::new(SHARDS, 2, "all-MiniLM-L6-v2", 384);
        settings.chunk_tokens = chunk_tokens;
        settings
    })
}

fn kb_record() -> impl Strategy<Value = KbRecord> {
    (kb_id(), prop::sample::select(&NAMES[..])).prop_flat_map(|(id, name)| kb_named(id, name))
}

fn kb_named(id: String, name: &'static str) -> impl Strategy<Value = KbRecord> {
    (
        Just(id),
        Just(name),
        settings(),
        at_ms(),
        // Some KBs have no placement (as written before placement existed).
        prop_oneof![
            1 => Just(Vec::new()),
            3 => prop::collection::vec(shard_placement(), SHARDS as usize),
        ],
    )
        .prop_map(|(id, name, settings, at, placement)| KbRecord {
            id,
            name: name.into(),
            settings,
            created_at_ms: at,
            updated_at_ms: at,
            placement,
        })
}

/// A document of `kb_id` as its registration carries it.
fn document(kb_id: String) -> impl Strategy<Value = DocumentRecord> {
    (
        doc_id(),
        prop::sample::select(&HASHES[..]),
        prop::option::of(prop::sample::select(vec!["e0", "e1"])),
        0..SHARDS,
        // Mostly queued; a document registered ready has no pending work.
        prop_oneof![4 => Just(DocStatus::Queued), 1 => Just(DocStatus::Ready)],
        1u64..1000,
        at_ms(),
    )
        .prop_map(
            move |(id, hash, external_id, shard, status, size_bytes, at)| DocumentRecord {
                title: format!("title of {id}"),
                id,
                kb_id: kb_id.clone(),
                external_id: external_id.map(String::from),
                source: DocSource::Upload {
                    file_name: "a.txt".into(),
                    format: "text".into(),
                },
                content_hash: hash.into(),
                size_bytes,
                shard,
                status,
                error: None,
                chunk_count: 0,
                metadata: BTreeMap::from([("lang".to_string(), "en".to_string())]),
                created_at_ms: at,
                updated_at_ms: at,
                pages_needing_ocr: 0,
            },
        )
}

fn documents(kb_id: String) -> impl Strategy<Value = Vec<DocumentRecord>> {
    prop::collection::vec(document(kb_id), 1..=3)
}

fn status_update() -> impl Strategy<Value = StatusUpdate> {
    (
        doc_id(),
        doc_status(),
        prop::option::of(Just("failed to parse".to_string())),
        prop::option::of(0u32..20),
    )
        .prop_map(|(document_id, status, error, chunk_count)| StatusUpdate {
            document_id,
            status,
            error,
            chunk_count,
            pages_needing_ocr: None,
        })
}

fn op() -> impl Strategy<Value = MetaOp> {
    prop_oneof![
        1 => kb_record().prop_map(MetaOp::CreateKb),
        1 => (kb_id(), settings(), at_ms())
            .prop_map(|(kb_id, settings, at_ms)| MetaOp::UpdateKb { kb_id, settings, at_ms }),
        1 => kb_id().prop_map(|kb_id| MetaOp::DeleteKb { kb_id }),
        3 => kb_id().prop_flat_map(|kb_id| documents(kb_id.clone())
            .prop_map(move |documents| MetaOp::RegisterDocuments {
                kb_id: kb_id.clone(),
                documents,
            })),
        // Workers may be fewer than documents: the rest get worker 0.
        3 => kb_id().prop_flat_map(|kb_id| (
                documents(kb_id.clone()),
                prop::collection::vec(node(), 0..=3),
            )
            .prop_map(move |(documents, workers)| MetaOp::RegisterDocumentsTo {
                kb_id: kb_id.clone(),
                documents,
                workers,
            })),
        4 => (kb_id(), prop::collection::vec(status_update(), 1..=3), at_ms())
            .prop_map(|(kb_id, updates, at_ms)| MetaOp::SetDocumentStatus {
                kb_id,
                updates,
                at_ms,
            }),
        2 => (kb_id(), doc_id(), at_ms()).prop_map(|(kb_id, document_id, at_ms)| {
            MetaOp::DeleteDocument { kb_id, document_id, at_ms }
        }),
        1 => (kb_id(), doc_id())
            .prop_map(|(kb_id, document_id)| MetaOp::ForgetTombstone { kb_id, document_id }),
        2 => (
                kb_id(),
                prop::collection::vec(doc_id(), 1..=3),
                0u64..=3,
                0u64..=3,
            )
            .prop_map(|(kb_id, document_ids, from, to)| MetaOp::ReassignDocuments {
                kb_id,
                document_ids,
                from,
                to,
            }),
        2 => (
                kb_id(),
                0..=SHARDS,
                node(),
                replica_state(),
                prop::option::of(replica_state()),
                at_ms(),
            )
            .prop_map(|(kb_id, shard, node, state, expected, at_ms)| {
                MetaOp::SetReplicaState { kb_id, shard, node, state, expected, at_ms }
            }),
        2 => (kb_id(), 0..=SHARDS, node(), at_ms()).prop_map(|(kb_id, shard, node, at_ms)| {
            MetaOp::AddReplica { kb_id, shard, node, at_ms }
        }),
        2 => (kb_id(), 0..=SHARDS, node(), at_ms()).prop_map(|(kb_id, shard, node, at_ms)| {
            MetaOp::RemoveReplica { kb_id, shard, node, at_ms }
        }),
        1 => (node(), any::<bool>())
            .prop_map(|(node, draining)| MetaOp::SetNodeDraining { node, draining }),
        2 => (session_id(), prop::collection::vec(kb_id(), 0..=2), at_ms()).prop_map(
            |(id, kbs, created_at_ms)| MetaOp::CreateSession {
                id,
                kbs,
                agent: "default".into(),
                created_at_ms,
            }
        ),
        1 => session_id().prop_map(|id| MetaOp::DeleteSession { id }),
        3 => (session_id(), prop::sample::select(&MESSAGES[..]), at_ms()).prop_map(
            |(session_id, message_id, at)| {
                let mut turn = turn(message_id, &format!("question {message_id}"));
                turn.created_at_ms = at;
                MetaOp::AppendTurn { session_id, turn }
            }
        ),
        1 => (
                session_id(),
                prop::option::of(Just("earlier turns".to_string())),
                0u32..4,
                at_ms(),
            )
            .prop_map(|(session_id, summary, summary_turns, at_ms)| {
                MetaOp::SetHistorySummary { session_id, summary, summary_turns, at_ms }
            }),
        1 => (tenant(), at_ms())
            .prop_map(|(name, created_at_ms)| MetaOp::CreateTenant { name, created_at_ms }),
        1 => (tenant(), at_ms()).prop_map(|(name, at_ms)| MetaOp::DeleteTenant { name, at_ms }),
        1 => (tenant(), prop::option::of(0u64..1000), prop::option::of(1u32..10)).prop_map(
            |(name, max_bytes, max_kbs)| MetaOp::SetTenantLimits {
                name,
                limits: sift_api::TenantLimits { max_bytes, max_kbs, ..Default::default() },
            }
        ),
        1 => (tenant(), kb_record()).prop_map(|(tenant, kb)| MetaOp::CreateTenantKb { tenant, kb }),
        1 => (kb_id(), tenant(), any::<bool>())
            .prop_map(|(kb_id, tenant, shared)| MetaOp::ShareKb { kb_id, tenant, shared }),
        2 => (at_ms(), 0u64..200, tenant()).prop_map(|(at_ms, forget_before_ms, tenant)| {
            MetaOp::AppendAudit {
                entry: super::AuditEntry {
                    id: format!("{at_ms:08}"),
                    at_ms,
                    key_id: None,
                    tenant,
                    role: "admin".into(),
                    method: "POST".into(),
                    route: "/v1/kbs".into(),
                    target: "/v1/kbs".into(),
                    status: 201,
                    address: None,
                },
                forget_before_ms,
            }
        }),
    ]
}

fn tenant() -> impl Strategy<Value = String> {
    prop_oneof![Just("acme"), Just("globex"), Just("default")].prop_map(String::from)
}

/// How an entry of the log carries an op id: none (a single node's op), its own, or the id
/// of an earlier entry (a retried proposal).
#[derive(Clone, Debug)]
enum OpId {
    None,
    Fresh,
    Retry(prop::sample::Index),
}

fn op_id() -> impl Strategy<Value = OpId> {
    prop_oneof![
        1 => Just(OpId::None),
        6 => Just(OpId::Fresh),
        1 => any::<prop::sample::Index>().prop_map(OpId::Retry),
    ]
}

/// The log: ops with their op ids (`None`: applied without one), at indexes 1, 2, …. It
/// starts by creating two of the three KBs, so that most document and placement ops find
/// theirs.
fn log() -> impl Strategy<Value = Vec<(Option<String>, MetaOp)>> {
    (
        kb_named("k0".into(), "alpha"),
        kb_named("k1".into(), "beta"),
        prop::collection::vec((op_id(), op()), 1..48),
    )
        .prop_map(|(first, second, entries)| {
            let prelude = [first, second].map(|kb| (OpId::Fresh, MetaOp::CreateKb(kb)));
            let mut ids: Vec<String> = Vec::new();
            prelude
                .into_iter()
                .chain(entries)
                .enumerate()
                .map(|(position, (op_id, op))| {
                    let id = match op_id {
                        OpId::None => None,
                        OpId::Retry(earlier) if !ids.is_empty() => {
                            Some(ids[earlier.index(ids.len())].clone())
                        }
                        OpId::Fresh | OpId::Retry(_) => Some(format!("op-{position}")),
                    };
                    if let Some(id) = &id {
                        ids.push(id.clone());
                    }
                    (id, op)
                })
                .collect()
        })
}

/// Every entry of every tree of the store's database, by tree and key.
fn dump(store: &SledMetaStore) -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let mut names = store.db().tree_names();
    names.sort();
    let mut entries = Vec::new();
    for name in names {
        let tree = store.db().open_tree(&name).unwrap();
        for item in tree.iter() {
            let (key, value) = item.unwrap();
            entries.push((name.to_vec(), key.to_vec(), value.to_vec()));
        }
    }
    entries
}

/// The first entry where two dumps differ, readable.
fn difference(
    a: &[(Vec<u8>, Vec<u8>, Vec<u8>)],
    b: &[(Vec<u8>, Vec<u8>, Vec<u8>)],
) -> Option<String> {
    let show = |entry: Option<&(Vec<u8>, Vec<u8>, Vec<u8>)>| {
        entry.map(|(tree, key, value)| {
            format!(
                "{} {} = {}",
                String::from_utf8_lossy(tree),
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(value)
            )
        })
    };
    (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .map(|i| format!("{:?} vs {:?}", show(a.get(i)), show(b.get(i))))
}

/// Outcomes compared by value; errors by message (storage errors are not `PartialEq`).
fn comparable(outcomes: Vec<Result<MetaOutcome>>) -> Vec<std::result::Result<MetaOutcome, String>> {
    outcomes
        .into_iter()
        .map(|outcome| outcome.map_err(|error| error.to_string()))
        .collect()
}

fn logged(log: &[(Option<String>, MetaOp)]) -> Vec<LoggedOp<'_>> {
    log.iter()
        .enumerate()
        .map(|(position, (op_id, op))| LoggedOp {
            index: position as u64 + 1,
            op_id: op_id.as_deref(),
            op,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn one_at_a_time_and_in_batches_leave_the_same_state(
        log in log(),
        chunks in prop::collection::vec(1usize..6, 50),
    ) {
        let entries = logged(&log);

        // A: each entry on its own, as a single node (no op id) or a replicated log applies it.
        let dir_a = tempfile::tempdir().unwrap();
        let a = SledMetaStore::open(dir_a.path()).unwrap();
        let singly: Vec<Result<MetaOutcome>> = entries
            .iter()
            .map(|entry| match entry.op_id {
                Some(op_id) => a.apply_with_id(entry.index, op_id, entry.op),
                None => a.apply(entry.index, entry.op),
            })
            .collect();

        // B: the whole log as one batch.
        let dir_b = tempfile::tempdir().unwrap();
        let b = SledMetaStore::open(dir_b.path()).unwrap();
        let batched = b.apply_batch_with_ids(&entries, false).unwrap();

        // C: batches of the sizes drawn.
        let dir_c = tempfile::tempdir().unwrap();
        let c = SledMetaStore::open(dir_c.path()).unwrap();
        let mut chunked = Vec::new();
        let mut rest = entries.as_slice();
        for size in chunks.iter().copied().cycle() {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at(size.min(rest.len()));
            chunked.extend(c.apply_batch_with_ids(head, false).unwrap());
            rest = tail;
        }

        let singly = comparable(singly);
        prop_assert_eq!(&singly, &comparable(batched));
        prop_assert_eq!(&singly, &comparable(chunked));
        let state = dump(&a);
        prop_assert_eq!(difference(&state, &dump(&b)), None, "one at a time vs one batch");
        prop_assert_eq!(difference(&state, &dump(&c)), None, "one at a time vs batches");
        prop_assert_eq!(a.applied_index(), log.len() as u64);
        prop_assert_eq!(b.applied_index(), log.len() as u64);
        prop_assert_eq!(c.applied_index(), log.len() as u64);
    }
}
