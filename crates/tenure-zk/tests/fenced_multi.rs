//! Writes fenced by ZooKeeper itself (W2) against a real server: a fenced multi-operation lands
//! only while its tenure's election node exists, a failed operation of the user's own is told
//! apart from a deposed writer, and a term no tenure has is a typed error, never a write.

mod common;

use std::time::Duration;

use common::*;
use tenure::Term;
use tenure_zk::{zk, FencedMultiError, ZkElection};
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(10);

async fn data(election: &ZkElection, node: &str) -> Option<(String, i32)> {
    match election.client().get_data(node).await {
        Ok((data, stat)) => Some((String::from_utf8(data).unwrap(), stat.version)),
        Err(zk::Error::NoNode) => None,
        Err(error) => panic!("read {node}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_multi_lands_while_its_tenure_holds_tells_a_failed_operation_from_deposed_and_refuses_bad_terms() {
    let Some(server) = server() else { return };
    let path = unique_path("fenced");
    let election = ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect");
    let a = election.campaign("a").expect("campaign");
    let tenure = timeout(PATIENCE, a.acquired()).await.unwrap().unwrap();
    let term_a = tenure.term();
    let resource = format!("{path}-allocations");
    let acls = election.acls();

    // Leads: the user's operations run; the results are the user's.
    let created = election
        .fenced_multi(term_a, |multi| {
            multi.add_create(&resource, b"pod-1", &zk::CreateMode::Persistent.with_acls(acls))
        })
        .await
        .expect("a fenced create");
    assert!(matches!(created.as_slice(), [zk::MultiWriteResult::Create { .. }]), "{created:?}");
    assert_eq!(data(&election, &resource).await, Some(("pod-1".to_owned(), 0)));

    // Leads, but the user's own version check fails: not deposed, and the index is the user's.
    let error = election
        .fenced_multi(term_a, |multi| {
            multi.add_check_version(&resource, 0)?;
            multi.add_set_data(&resource, b"pod-2", Some(7))
        })
        .await
        .unwrap_err();
    assert!(matches!(error, FencedMultiError::Operation { index: 1, source: zk::Error::BadVersion }), "{error}");
    assert_eq!(data(&election, &resource).await, Some(("pod-1".to_owned(), 0)));

    // Another leads: deposed, naming who leads; nothing applied.
    let b = election.campaign("b").expect("campaign");
    let mut b_view = b.subscribe();
    timeout(PATIENCE, b_view.wait_for(|l| l.leader.as_deref() == Some("a") && l.role == tenure::Role::Follower))
        .await
        .unwrap()
        .unwrap();
    drop(tenure);
    a.resign().await.expect("resign");
    let term_b = timeout(PATIENCE, b.acquired()).await.unwrap().unwrap().term();
    let error = election.fenced_multi(term_a, |multi| multi.add_set_data(&resource, b"late", None)).await.unwrap_err();
    let FencedMultiError::Deposed { term, shows, .. } = &error else { panic!("{error}") };
    assert_eq!(*term, term_a);
    assert!(shows.starts_with(&format!("\"b\" leading at term {term_b}")), "{error}");
    assert!(error.to_string().starts_with("deposed: "), "{error}");
    assert_eq!(data(&election, &resource).await, Some(("pod-1".to_owned(), 0)));

    // The new tenure writes.
    election.fenced_multi(term_b, |multi| multi.add_set_data(&resource, b"pod-3", Some(0))).await.expect("b writes");
    assert_eq!(data(&election, &resource).await, Some(("pod-3".to_owned(), 1)));

    // Terms no tenure has: typed errors, no write. A zxid that is no election node's: deposed.
    for bad in [Term(0), Term(u64::MAX)] {
        let error = election.fenced_multi(bad, |multi| multi.add_set_data(&resource, b"bad", None)).await.unwrap_err();
        assert!(matches!(error, FencedMultiError::BadTerm { .. }), "{error}");
    }
    // The term of a queued follower's node (a, queued again after its resign), or a zxid that is
    // no election node's: no tenure, deposed.
    let mut a_view = a.subscribe();
    timeout(PATIENCE, a_view.wait_for(|l| l.leader.as_deref() == Some("b") && l.role == tenure::Role::Follower))
        .await
        .unwrap()
        .unwrap();
    let client = election.client();
    let mut queued = None;
    for child in client.list_children(&path).await.unwrap() {
        let (identity, stat) = client.get_data(&format!("{path}/{child}")).await.unwrap();
        if identity == b"a" {
            queued = Some(Term::from_count(stat.czxid));
        }
    }
    let resource_zxid = Term::from_count(client.check_stat(&resource).await.unwrap().unwrap().mzxid);
    for not_leading in [queued.expect("a's node"), resource_zxid] {
        let error =
            election.fenced_multi(not_leading, |multi| multi.add_set_data(&resource, b"bad", None)).await.unwrap_err();
        assert!(matches!(error, FencedMultiError::Deposed { .. }), "{error}");
    }
    // A malformed path among the user's operations: a typed error before anything is sent.
    let error = election.fenced_multi(term_b, |multi| multi.add_set_data("no-slash", b"bad", None)).await.unwrap_err();
    assert!(matches!(error, FencedMultiError::Invalid(_)), "{error}");
    assert_eq!(data(&election, &resource).await, Some(("pod-3".to_owned(), 1)));

    b.shutdown().await.expect("shutdown");
    a.shutdown().await.expect("shutdown");
    // Nobody leads: deposed, and it says so.
    let error = election.fenced_multi(term_b, |multi| multi.add_set_data(&resource, b"late", None)).await.unwrap_err();
    assert!(matches!(&error, FencedMultiError::Deposed { shows, .. } if shows == "no leader"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_a_session_that_outlives_the_candidates_is_refused_once_its_node_is_deleted() {
    let Some(server) = server() else { return };
    let path = unique_path("outlives");
    // The writer's session (the election's own, 10 s) outlives the candidate's node, as a data
    // session or a client that reconnects with a new session would (KAFKA-6082).
    let writer = ZkElection::connect(&server.servers, &path, Duration::from_secs(10)).await.expect("connect");
    let candidates = ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect");
    let a = candidates.campaign("a").expect("campaign");
    let term = timeout(PATIENCE, a.acquired()).await.unwrap().unwrap().term();
    let resource = format!("{path}-resource");
    let acls = writer.acls();
    writer
        .fenced_multi(term, |multi| multi.add_create(&resource, b"a", &zk::CreateMode::Persistent.with_acls(acls)))
        .await
        .expect("a writes");

    // The election node goes (as when the candidate's session expires); the writer's session lives.
    let node = format!("{path}/{}", writer.leader().await.unwrap().expect("a leads").node);
    writer.client().delete(&node, None).await.expect("delete the election node");
    let error = writer.fenced_multi(term, |multi| multi.add_set_data(&resource, b"late", None)).await.unwrap_err();
    assert!(matches!(error, FencedMultiError::Deposed { .. }), "{error}");
    assert_eq!(data(&writer, &resource).await, Some(("a".to_owned(), 0)));
    let _ = a.shutdown().await;
}
