//! The ZooKeeper elector with digest authentication against a real server: the nodes of an
//! authenticated election are protected from other users, and a wrong password is a clear error
//! and never a leader.

mod common;

use std::time::Duration;

use common::{server, unique_path, wait_until, SESSION_TIMEOUT};
use tenure::Role;
use tenure_zk::{ZkElection, ZkError, ZkOptions};
use zookeeper_client as zk;

fn tenure_user() -> ZkOptions {
    ZkOptions::new().with_digest("tenure", "s3cret")
}

#[tokio::test]
async fn an_authenticated_election_cannot_be_joined_or_broken_by_other_users() {
    let Some(server) = server() else { return };
    let path = unique_path("digest");
    let election = ZkElection::connect_with(&server.servers, &path, SESSION_TIMEOUT, tenure_user()).await.unwrap();
    let a = election.campaign("a").unwrap();
    let b = election.campaign("b").unwrap();
    wait_until(&[&a, &b], Duration::from_secs(10), "one leader", |s| {
        s.iter().filter(|l| l.role == Role::Leader).count() == 1 && s.iter().all(|l| l.leader.is_some())
    })
    .await;
    let leader = election.leader().await.unwrap().expect("a leader");

    // Another client (no credentials, or another user) sees the leader ...
    let stranger = zk::Client::connector().with_auth("digest", b"mallory:pw").connect(&server.servers).await.unwrap();
    let node = format!("{path}/{}", leader.node);
    let (data, _) = stranger.get_data(&node).await.expect("anyone may read");
    assert_eq!(String::from_utf8_lossy(&data), leader.identity);
    // ... but cannot delete the leader's node, change it, or queue up in the election.
    assert!(matches!(stranger.delete(&node, None).await, Err(zk::Error::NoAuth)));
    assert!(matches!(stranger.set_data(&node, b"mallory", None).await, Err(zk::Error::NoAuth)));
    let create = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    assert!(matches!(stranger.create(&format!("{path}/x-"), b"m", &create).await, Err(zk::Error::NoAuth)));
    let anonymous = zk::Client::connect(&server.servers).await.unwrap();
    assert!(matches!(anonymous.delete(&node, None).await, Err(zk::Error::NoAuth)));

    // The same user's candidates hand over as usual.
    let (leading, other) = if a.is_leader().is_some() { (a, b) } else { (b, a) };
    leading.shutdown().await.unwrap();
    wait_until(&[&other], Duration::from_secs(10), "the other leads", |s| s[0].role == Role::Leader).await;
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_and_never_a_leader() {
    let Some(server) = server() else { return };
    let path = unique_path("digest-wrong");
    let wrong = ZkOptions::new().with_digest("tenure", "guess");
    // Before the election exists nothing can tell the password is wrong.
    let early = ZkElection::connect_with(&server.servers, &path, SESSION_TIMEOUT, wrong.clone()).await.unwrap();

    let election = ZkElection::connect_with(&server.servers, &path, SESSION_TIMEOUT, tenure_user()).await.unwrap();
    let a = election.campaign("a").unwrap();
    wait_until(&[&a], Duration::from_secs(10), "a leads", |s| s[0].role == Role::Leader).await;

    let error = ZkElection::connect_with(&server.servers, &path, SESSION_TIMEOUT, wrong).await.unwrap_err();
    assert!(matches!(&error, ZkError::NotAuthorized { user, .. } if user == "tenure"), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("wrong password") && !message.contains("guess"), "{message}");

    // The candidate that got past the check cannot create its node: it never leads, and the
    // leader is undisturbed, for several session timeouts.
    let intruder = early.campaign("intruder").unwrap();
    let mut intruder_seen = intruder.subscribe();
    let watched = tokio::time::timeout(
        SESSION_TIMEOUT * 4,
        intruder_seen.wait_for(|l| l.role == Role::Leader || a.is_leader().is_none()),
    )
    .await;
    assert!(watched.is_err(), "the intruder led or the leader lost: {:?} {:?}", intruder.leadership(), a.leadership());
    assert!(a.is_leader().is_some(), "the leader lost its tenure: {:?}", a.leadership());
    assert_eq!(election.leader().await.unwrap().map(|l| l.identity).as_deref(), Some("a"));
    intruder.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}
