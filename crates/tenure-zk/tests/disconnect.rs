//! A lost connection ends the tenure at once; after a reconnect within the session the candidate
//! replaces the node of the ended tenure and leads again under a greater term. Uses a server of its own, which it kills and restarts.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tenure::Role;
use tenure_zk::ZkElection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connection_ends_the_tenure_at_once_and_after_a_reconnect_it_leads_under_a_new_term() {
    let Some(server) = ZkServer::private() else { return };
    // A session long enough to survive the server's restart (a JVM start).
    let session_timeout = Duration::from_secs(8);
    let path = unique_path("disconnect");
    let election = ZkElection::connect(&server.servers, &path, session_timeout).await.expect("connect");
    let elector = election.campaign("steady").expect("campaign");
    let tenure =
        tokio::time::timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");
    let before = election.leader().await.expect("leader()").expect("leader");

    server.kill();
    let killed = Instant::now();
    tokio::time::timeout(session_timeout / 2, tenure.ended()).await.expect("the tenure ends when the connection goes");
    eprintln!("tenure ended {:?} after the server was killed", killed.elapsed());
    assert!(!tenure.is_valid());
    wait_until(&[&elector], Duration::from_secs(2), "no leader reported while disconnected", |s| {
        s[0].role == Role::Follower && s[0].leader.is_none()
    })
    .await;

    server.restart();
    let again = tokio::time::timeout(session_timeout, elector.acquired()).await.expect("leads again").expect("tenure");
    eprintln!("leading again {:?} after the server was killed", killed.elapsed());
    let after = election.leader().await.expect("leader()").expect("leader");
    // The tenure of the old node ended: leading again with it would revive its term (S2), so
    // the candidate queued again with a new node, hence a greater term.
    assert_ne!(after.node, before.node, "the node of the ended tenure was replaced");
    assert!(again.term() > tenure.term(), "term {} after term {}", again.term(), tenure.term());
    assert!(!tenure.is_valid(), "the ended tenure never comes back");
    drop((tenure, again));
    elector.shutdown().await.expect("shutdown");
}
