//! Tenure candidates and Apache Curator's `LeaderLatch` (Java, in a child JVM) on one election
//! path agree on one leader, in both directions.

mod common;

use std::time::Duration;

use common::*;
use tenure_zk::ZkElection;

/// Asks the probe who leads in its view; returns (leader id, probe has leadership).
fn latch_view(probe: &mut ChildProcess) -> (String, bool) {
    probe.send("leader");
    let line = probe.expect_line("LEADERID ", Duration::from_secs(10), |_| {});
    let mut parts = line.split_whitespace().skip(1);
    let id = parts.next().unwrap_or_default().to_owned();
    let leads = parts.next() == Some("true");
    (id, leads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_tenure_agree_on_one_leader() {
    let Some(server) = server() else { return };
    let path = unique_path("curator");
    let election = ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect");

    // A Tenure candidate leads first; the Java latch queues up behind it and agrees.
    let first = election.campaign("tenure-1").expect("campaign");
    let tenure = tokio::time::timeout(Duration::from_secs(10), first.acquired()).await.expect("leads").expect("tenure");
    let mut latch = spawn_latch_probe(&server.servers, &path, "java-1");
    let started = latch.expect_line("STARTED ", Duration::from_secs(30), |_| {});
    let node = started.rsplit('/').next().unwrap_or_default().to_owned();
    assert!(node.starts_with("_c_") && node.contains("-latch-"), "Curator's node name: {node}");
    assert_eq!(latch_view(&mut latch), ("tenure-1".to_owned(), false));

    // A second Tenure candidate queues behind the latch and names the same leader.
    let second = election.campaign("tenure-2").expect("campaign");
    wait_until(&[&first, &second], Duration::from_secs(10), "both Tenure candidates agree", |s| {
        s[0].is_leader() && s[1].leader.as_deref() == Some("tenure-1") && !s[1].is_leader() && s[0].term == s[1].term
    })
    .await;

    // The Tenure leader leaves: the latch (next in line) leads, and Tenure agrees.
    drop(tenure);
    first.shutdown().await.expect("shutdown");
    latch.expect_line("LEADER", Duration::from_secs(10), |_| {});
    assert_eq!(latch_view(&mut latch), ("java-1".to_owned(), true));
    wait_until(&[&second], Duration::from_secs(10), "Tenure sees the latch lead", |s| {
        s[0].leader.as_deref() == Some("java-1") && !s[0].is_leader()
    })
    .await;
    let seen = election.leader().await.expect("leader()").expect("leader");
    assert_eq!((seen.identity.as_str(), seen.node.as_str()), ("java-1", node.as_str()));

    // The latch closes: the Tenure candidate behind it leads.
    latch.send("quit");
    latch.expect_line("CLOSED", Duration::from_secs(10), |_| {});
    tokio::time::timeout(Duration::from_secs(10), second.acquired()).await.expect("leads").expect("tenure");
    assert_eq!(second.leadership().leader.as_deref(), Some("tenure-2"));
    second.shutdown().await.expect("shutdown");
}
