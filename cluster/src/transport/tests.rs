//! Raft nodes talking over the real internal HTTP transport on loopback.

use sift_storage::meta::{MetaOp, MetaOutcome};

use super::*;
use crate::raft::replicated::ReplicatedMeta;
use crate::testing::{HttpCluster, SECRET, WAIT, create_kb, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_cluster_replicates_fails_over_and_ships_chunked_snapshots() {
    // 512-byte chunks: the snapshot below takes hundreds of requests
    let mut cluster = HttpCluster::start(&[1, 2, 3], 512).await;
    let leader = cluster.leader().await;
    for i in 0..10 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    let states = cluster.converged().await;
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]));

    let lagging = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let lagging_applied = cluster.nodes[&lagging].raft.handle().status().applied;
    cluster.kill(lagging);
    for i in 10..130 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    let leader_status = cluster.nodes[&leader].raft.handle().status();
    assert!(leader_status.first_index > lagging_applied + 1);
    cluster.restart(lagging).await;
    let states = cluster.converged().await;
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]));
    assert!(states[0].len() > 512 * 20, "snapshot fits in few chunks");
    let status = cluster.nodes[&lagging].raft.handle().status();
    assert!(status.snapshot_index > lagging_applied, "{status:?}");
    assert_eq!(cluster.nodes[&lagging].store.list_kbs().unwrap().len(), 130);

    // kill the leader: a new one is elected over HTTP and writes resume
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    assert_ne!(new_leader, leader);
    cluster.write(&create_kb("after-failover")).await;
    let states = cluster.converged().await;
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]));
    for node in cluster.nodes.values() {
        assert!(node.store.find_kb("after-failover").unwrap().is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_port_rejects_unauthenticated_and_malformed_bytes() {
    let cluster = HttpCluster::start(&[1], 1024).await;
    cluster.leader().await;
    let address = cluster.addresses[&1].internal.clone();
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = |path: &str| format!("http://{address}{path}");
    // a stale heartbeat from a node that is not a member: accepted and ignored by raft
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = 2;
    heartbeat.to = 1;
    let valid = encode_frame(&MessageBatch {
        from: 2,
        from_address: "127.0.0.1:1".into(),
        messages: vec![heartbeat.write_to_bytes().unwrap()],
    })
    .unwrap();

    // no secret, wrong secret: 401 whatever the body
    let response = client
        .post(url(MESSAGES_PATH))
        .body(valid.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let response = client
        .post(url(SNAPSHOT_PATH))
        .bearer_auth("wrong")
        .body(vec![0xff; 100])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = client.get(url(HEALTH_PATH)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // authenticated garbage: 400, never a panic
    let garbage_protobuf = encode_frame(&MessageBatch {
        from: 2,
        from_address: String::new(),
        messages: vec![vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]],
    })
    .unwrap();
    let bad_bodies: Vec<(&str, Vec<u8>)> = vec![
        (MESSAGES_PATH, b"not a frame".to_vec()),
        (MESSAGES_PATH, valid[..valid.len() - 1].to_vec()),
        (MESSAGES_PATH, [valid.clone(), vec![0]].concat()),
        (MESSAGES_PATH, garbage_protobuf),
        (MESSAGES_PATH, Vec::new()),
        (SNAPSHOT_PATH, vec![0xff; 64]),
    ];
    for (path, body) in bad_bodies {
        let response = client
            .post(url(path))
            .bearer_auth(SECRET)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    // a snapshot chunk for a transfer that never started, and one that holds more than its
    // transfer's length
    for (transfer_id, offset, total_len) in [(9, 10, 20), (10, 0, 5)] {
        let chunk = encode_frame(&SnapshotChunk {
            from: 2,
            from_address: String::new(),
            transfer_id,
            offset,
            total_len,
            message: Vec::new(),
            data: vec![0; 10],
        })
        .unwrap();
        let response = client
            .post(url(SNAPSHOT_PATH))
            .bearer_auth(SECRET)
            .body(chunk)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::CONFLICT,
            "transfer {transfer_id}"
        );
    }

    // an over-long target or header block: the JSON error of the public port, before the
    // secret is even checked
    let long_target = format!("{}?{}", url(HEALTH_PATH), "q".repeat(20 * 1024));
    let response = client.get(long_target).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::URI_TOO_LONG);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "uri_too_long");
    let response = client
        .get(url(HEALTH_PATH))
        .bearer_auth(SECRET)
        .header("x-padding", "p".repeat(70 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "headers_too_large");

    // authenticated and well formed: accepted; the node still serves
    let response = client
        .post(url(MESSAGES_PATH))
        .bearer_auth(SECRET)
        .body(valid)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = client
        .get(url(HEALTH_PATH))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let outcome = cluster.write(&create_kb("still-alive")).await;
    assert!(matches!(outcome, MetaOutcome::Kb(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_forward_writes_to_the_leader() {
    let mut cluster = HttpCluster::start(&[1, 2, 3], 1024 * 1024).await;
    let leader = cluster.leader().await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    fn meta(cluster: &HttpCluster, id: u64) -> ReplicatedMeta {
        let node = &cluster.nodes[&id];
        ReplicatedMeta::new(
            node.raft.handle().clone(),
            node.store.clone(),
            Some(node.transport.clone()),
            WAIT,
        )
    }
    let on_follower = meta(&cluster, follower);
    let outcome = on_follower
        .propose(create_kb("forwarded").op)
        .await
        .unwrap();
    assert!(matches!(outcome, MetaOutcome::Kb(ref kb) if kb.name == "forwarded"));
    // the leader applied it before answering; a barrier makes the follower's reads fresh
    on_follower.linearizable_barrier().await.unwrap();
    assert!(on_follower.store().find_kb("forwarded").unwrap().is_some());

    // a refusal on the leader comes back as the same kind of error
    let mut clash = create_kb("forwarded");
    if let MetaOp::CreateKb(kb) = &mut clash.op {
        kb.id = "another-id".into();
    }
    let error = on_follower.propose_proposal(clash).await.unwrap_err();
    assert!(
        matches!(error, ClusterError::Storage(StorageError::Conflict(_))),
        "{error}"
    );
    let error = on_follower
        .propose(MetaOp::UpdateKb {
            kb_id: "missing".into(),
            settings: match &create_kb("x").op {
                MetaOp::CreateKb(kb) => kb.settings.clone(),
                _ => unreachable!(),
            },
            at_ms: 1,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClusterError::Storage(StorageError::NotFound(_))),
        "{error}"
    );

    // the same proposal forwarded twice applies once
    let twice = create_kb("twice");
    on_follower.propose_proposal(twice.clone()).await.unwrap();
    on_follower.propose_proposal(twice).await.unwrap();

    // the leader dies: the follower's door finds the new leader and the write lands
    cluster.kill(leader);
    let survivor = meta(&cluster, follower);
    survivor
        .propose(create_kb("after-leader-died").op)
        .await
        .unwrap();
    let states = cluster.converged().await;
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]));
    for node in cluster.nodes.values() {
        assert_eq!(node.store.list_kbs().unwrap().len(), 3);
    }
}

/// Issue 4: a minority partition cannot commit; the majority keeps going; after healing,
/// every node's state machine is byte-for-byte equal. The leader is the minority: it steps
/// down (check quorum), its pending proposal fails retryably, and the retry applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_minority_cannot_commit_and_heals_to_equal_states() {
    let cluster = HttpCluster::start(&[1, 2, 3], 1024 * 1024).await;
    let old_leader = cluster.leader().await;
    for i in 0..5 {
        cluster.write(&create_kb(&format!("before-{i}"))).await;
    }
    cluster.converged().await;
    let majority: Vec<u64> = [1, 2, 3]
        .into_iter()
        .filter(|id| *id != old_leader)
        .collect();
    // cut the old leader off, both ways
    cluster.nodes[&old_leader].transport.block_peers(&majority);
    for id in &majority {
        cluster.nodes[id].transport.block_peers(&[old_leader]);
    }
    let isolated = cluster.nodes[&old_leader].raft.handle().clone();
    let commit_at_cut = isolated.status().commit;

    // a proposal on the isolated leader gets a retryable error, not silence and not success
    let stranded = create_kb("stranded");
    let error = isolated
        .propose_proposal(stranded.clone())
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");

    // the majority elects a leader among itself and keeps committing
    let new_leader = wait_for("a leader in the majority", || {
        majority.iter().copied().find(|id| {
            let status = cluster.nodes[id].raft.handle().status();
            status.role == "leader" && status.leader == Some(*id)
        })
    })
    .await;
    let handle = cluster.nodes[&new_leader].raft.handle().clone();
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let proposal = create_kb(&format!("during-{i}"));
        handle.propose_proposal(proposal.clone()).await.unwrap();
        acknowledged.push(proposal);
    }
    // the minority committed nothing meanwhile
    let status = isolated.status();
    assert_eq!(status.commit, commit_at_cut, "{status:?}");
    assert_ne!(status.role, "leader", "{status:?}");
    let minority_store = &cluster.nodes[&old_leader].store;
    assert!(minority_store.find_kb("during-0").unwrap().is_none());
    assert!(minority_store.find_kb("stranded").unwrap().is_none());

    // heal; the client retries its stranded proposal with the same op id
    for node in cluster.nodes.values() {
        node.transport.block_peers(&[]);
    }
    cluster.write(&stranded).await;
    cluster.write(&stranded).await;
    let states = cluster.converged().await;
    assert_eq!(states.len(), 3);
    assert!(
        states.windows(2).all(|pair| pair[0] == pair[1]),
        "states differ after healing"
    );
    for node in cluster.nodes.values() {
        for proposal in &acknowledged {
            let MetaOp::CreateKb(kb) = &proposal.op else {
                unreachable!()
            };
            assert!(
                node.store.find_kb(&kb.name).unwrap().is_some(),
                "{} lost",
                kb.name
            );
        }
        // 5 before, 20 during, the stranded one once
        assert_eq!(node.store.list_kbs().unwrap().len(), 26);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_as_learners_get_promoted_and_ids_are_never_reused() {
    let mut cluster = HttpCluster::start(&[1], 1024 * 1024).await;
    cluster.leader().await;
    for i in 0..60 {
        cluster.write(&create_kb(&format!("kb-{i}"))).await;
    }
    let seed = cluster.addresses[&1].internal.clone();
    // node 2 joins through the leader, node 3 through node 2 (redirected to the leader)
    for (expected_id, through) in [(2u64, seed.clone()), (3, String::new())] {
        let through = if through.is_empty() {
            cluster.addresses[&2].internal.clone()
        } else {
            through
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = PeerAddress {
            internal: listener.local_addr().unwrap().to_string(),
            public: String::new(),
            removed: false,
        };
        let id = join_cluster(&through, SECRET, address.clone(), WAIT, &PeerTls::plain())
            .await
            .unwrap();
        assert_eq!(id, expected_id);
        cluster.addresses.insert(id, address);
        cluster.start_node(id, listener, false);
        wait_for("the new node to be a voter", || {
            let status = cluster.nodes[&1].raft.handle().status();
            status.voters.contains(&id).then_some(())
        })
        .await;
    }
    cluster.write(&create_kb("three-voters")).await;
    let states = cluster.converged().await;
    assert_eq!(states.len(), 3);
    assert!(states.windows(2).all(|pair| pair[0] == pair[1]));

    // a node whose data dir was wiped comes back at node 3's address: refused, clearly
    let error = join_cluster(
        &seed,
        SECRET,
        cluster.addresses[&3].clone(),
        WAIT,
        &PeerTls::plain(),
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("belongs to node 3"), "{error}");
    assert!(matches!(error, ClusterError::Invalid(_)));
    // the wrong secret is refused
    let error = join_cluster(
        &seed,
        "wrong",
        cluster.addresses[&3].clone(),
        WAIT,
        &PeerTls::plain(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ClusterError::Unauthorized), "{error}");

    // after removing node 3, its address may join again, under a new id
    let leader = cluster.leader().await;
    cluster.nodes[&leader]
        .raft
        .handle()
        .remove_node(3)
        .await
        .unwrap();
    cluster.kill(3);
    // The status a join is checked against is published by the Raft thread after it applied
    // the removal; wait for it rather than race it.
    wait_for("node 3 to leave the leader's status", || {
        let status = cluster.nodes[&leader].raft.handle().status();
        (!status.peers.iter().any(|peer| peer.id == 3)).then_some(())
    })
    .await;
    let id = join_cluster(
        &seed,
        SECRET,
        cluster.addresses[&3].clone(),
        WAIT,
        &PeerTls::plain(),
    )
    .await
    .unwrap();
    assert_eq!(id, 4, "a removed id is never given out again");
}

#[test]
fn forwarded_errors_keep_their_kind() {
    let cases = vec![
        ClusterError::Storage(StorageError::NotFound("kb x".into())),
        ClusterError::Storage(StorageError::Conflict("name taken".into())),
        ClusterError::Storage(StorageError::Invalid("bad".into())),
        ClusterError::Invalid("bad conf change".into()),
        ClusterError::NotLeader { leader: Some(3) },
        ClusterError::Dropped("leadership lost".into()),
        ClusterError::Stopped,
        ClusterError::Storage(StorageError::Corrupt("broken".into())),
    ];
    for error in cases {
        let wire = WireError::from_error(&error);
        let bytes = encode_frame(&ForwardReply::Failed(wire)).unwrap();
        let Some(ForwardReply::Failed(wire)) = decode_frame::<ForwardReply>(&bytes) else {
            panic!("reply did not round-trip");
        };
        let back = wire.into_error();
        assert_eq!(
            back.is_transient(),
            error.is_transient(),
            "{error} -> {back}"
        );
        match (&error, &back) {
            (
                ClusterError::Storage(StorageError::NotFound(a)),
                ClusterError::Storage(StorageError::NotFound(b)),
            )
            | (
                ClusterError::Storage(StorageError::Conflict(a)),
                ClusterError::Storage(StorageError::Conflict(b)),
            )
            | (
                ClusterError::Storage(StorageError::Invalid(a)),
                ClusterError::Storage(StorageError::Invalid(b)),
            ) => assert_eq!(a, b),
            (ClusterError::NotLeader { leader: a }, ClusterError::NotLeader { leader: b }) => {
                assert_eq!(a, b)
            }
            (ClusterError::Invalid(_), ClusterError::Invalid(_))
            | (ClusterError::Dropped(_) | ClusterError::Stopped, ClusterError::Dropped(_))
            | (ClusterError::Storage(StorageError::Corrupt(_)), ClusterError::Invalid(_)) => {}
            _ => panic!("{error:?} came back as {back:?}"),
        }
    }
}
