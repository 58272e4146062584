//! The ZooKeeper elector against a real ZooKeeper server (started by the tests on a loopback
//! port): one leader, crash failover, graceful handover, a paused leader, an externally deleted
//! node.

mod common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use tenure_zk::ZkElection;

/// Entry point of candidate processes (a no-op in a normal test run).
#[test]
fn child_candidate() {
    child_candidate_main();
}

async fn election(path: &str) -> Option<ZkElection> {
    let server = server()?;
    Some(ZkElection::connect(&server.servers, path, SESSION_TIMEOUT).await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_elect_exactly_one_leader_and_all_agree() {
    let path = unique_path("three");
    let Some(election) = election(&path).await else { return };
    let ids = ["a", "b", "c"];
    let electors: Vec<_> = ids.iter().map(|id| election.campaign(*id).expect("campaign")).collect();
    let refs: Vec<_> = electors.iter().collect();
    wait_until(&refs, Duration::from_secs(10), "one agreed leader", |s| one_agreed_leader(s, &ids)).await;

    let leader = electors.iter().find(|e| e.is_leader().is_some()).expect("a leader");
    let term = leader.is_leader().expect("term");
    let seen = election.leader().await.expect("leader()").expect("somebody leads");
    assert_eq!(seen.identity, leader.identity());
    assert_eq!(seen.term, term);
    assert!(seen.node.starts_with("_c_") && seen.node.contains("-latch-"), "node {}", seen.node);
    assert_eq!(electors.iter().filter(|e| e.tenure().is_some()).count(), 1);
    // The leader's heartbeats count as renews, as on every backend (/metrics, /healthz).
    let deadline = Instant::now() + Duration::from_secs(10);
    while leader.stats().renews < 2 {
        assert!(Instant::now() < deadline, "no renews counted: {:?}", leader.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(leader.stats().last_renew_latency.is_some());

    for elector in electors {
        elector.shutdown().await.expect("shutdown");
    }
    assert_eq!(election.leader().await.expect("leader()"), None, "shutdown deletes the nodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_hands_over_to_the_next_candidate_within_one_round_trip() {
    let path = unique_path("resign");
    let Some(election) = election(&path).await else { return };
    let ids = ["a", "b", "c"];
    let electors: Vec<_> = ids.iter().map(|id| election.campaign(*id).expect("campaign")).collect();
    let refs: Vec<_> = electors.iter().collect();
    let mut handovers = Vec::new();
    for round in 0..5 {
        wait_until(&refs, Duration::from_secs(10), "one agreed leader", |s| one_agreed_leader(s, &ids)).await;
        let old = electors.iter().position(|e| e.is_leader().is_some()).expect("leader");
        let old_term = electors[old].is_leader().expect("term");
        let started = Instant::now();
        electors[old].resign().await.expect("resign");
        let resigned = Instant::now();
        wait_until(&refs, Duration::from_secs(5), "a new leader", |s| {
            s.iter().enumerate().any(|(i, s)| i != old && s.is_leader())
        })
        .await;
        let handover = resigned.elapsed();
        handovers.push(handover);
        let new = electors.iter().position(|e| e.is_leader().is_some()).expect("new leader");
        assert_ne!(new, old, "round {round}");
        assert!(electors[new].is_leader().expect("term") > old_term, "terms grow");
        eprintln!("round {round}: resign took {:?}, handover {handover:?}", resigned - started);
    }
    let worst = handovers.iter().max().copied().unwrap_or_default();
    eprintln!("handover after resign: worst {worst:?} of {}", handovers.len());
    assert!(worst < Duration::from_millis(500), "handover took {worst:?}");
    for elector in electors {
        elector.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_after_its_session_expires() {
    let path = unique_path("crash");
    let Some(election) = election(&path).await else { return };
    let server = server().expect("server");
    let child = spawn_candidate("child_candidate", &server.servers, &path, "doomed");
    child.expect_line("LEADING", Duration::from_secs(20), |_| {});
    let ids = ["doomed", "x", "y"];
    let followers: Vec<_> = ids[1..].iter().map(|id| election.campaign(*id).expect("campaign")).collect();
    let refs: Vec<_> = followers.iter().collect();
    wait_until(&refs, Duration::from_secs(10), "followers see the child lead", |s| {
        s.iter().all(|s| s.leader.as_deref() == Some("doomed") && !s.is_leader())
    })
    .await;

    child.signal(Signal::SIGKILL);
    let killed = Instant::now();
    wait_until(&refs, SESSION_TIMEOUT + Duration::from_secs(3), "a follower takes over", |s| {
        s.iter().any(|s| s.is_leader())
    })
    .await;
    let failover = killed.elapsed();
    eprintln!(
        "crash failover: {failover:?} = {:.2} x session timeout {SESSION_TIMEOUT:?}",
        failover.as_secs_f64() / SESSION_TIMEOUT.as_secs_f64()
    );
    assert!(failover < SESSION_TIMEOUT + Duration::from_millis(1500), "failover took {failover:?}");
    let names = ["x", "y"];
    wait_until(&refs, Duration::from_secs(5), "followers agree", |s| one_agreed_leader(s, &names)).await;
    for elector in followers {
        elector.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_stops_leading_before_another_is_elected() {
    let path = unique_path("paused");
    let Some(election) = election(&path).await else { return };
    let server = server().expect("server");
    let child = spawn_candidate("child_candidate", &server.servers, &path, "sleepy");
    let first = child.expect_line("LEADING", Duration::from_secs(20), |_| {});
    let mut deadline_ns: u128 = first.split_whitespace().nth(2).expect("deadline").parse().expect("ns");
    let follower = election.campaign("awake").expect("campaign");
    wait_until(&[&follower], Duration::from_secs(10), "the follower sees the child lead", |s| {
        s[0].leader.as_deref() == Some("sleepy")
    })
    .await;

    // Let a heartbeat or two extend the deadline, then freeze the leader.
    let _ = child.expect_line("DEADLINE", SESSION_TIMEOUT, |_| {});
    child.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    for line in child.drain() {
        if let Some(ns) = line.strip_prefix("DEADLINE ") {
            deadline_ns = deadline_ns.max(ns.parse().expect("ns"));
        }
    }
    let tenure =
        tokio::time::timeout(SESSION_TIMEOUT * 4, follower.acquired()).await.expect("elected").expect("tenure");
    let elected_ns = monotonic_ns();
    let margin_ms = (elected_ns as f64 - deadline_ns as f64) / 1e6;
    eprintln!(
        "paused leader: stopped {:?} ago; its self-fencing deadline was {margin_ms:.1} ms before the new leader was elected",
        stopped.elapsed()
    );
    assert!(deadline_ns < elected_ns, "the paused leader's deadline {deadline_ns} is not before {elected_ns}");

    // Once resumed, the old leader finds its session expired and campaigns again as a follower.
    child.signal(Signal::SIGCONT);
    child.expect_line("FOLLOWING", Duration::from_secs(10), |line| panic!("unexpected line after resume: {line}"));
    let resumed = election.leader().await.expect("leader()").expect("leader");
    assert_eq!(resumed.identity, "awake");
    assert_eq!(resumed.term, tenure.term());
    drop(tenure);
    drop(child);
    follower.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_node_deleted_from_outside_ends_the_tenure_and_the_candidate_campaigns_again() {
    let path = unique_path("deleted");
    let Some(election) = election(&path).await else { return };
    let server = server().expect("server");
    let elector = election.campaign("lonely").expect("campaign");
    let tenure =
        tokio::time::timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads").expect("tenure");
    let node = election.leader().await.expect("leader()").expect("leader").node;

    let admin = zookeeper_client::Client::connect(&server.servers).await.expect("admin client");
    admin.delete(&format!("{path}/{node}"), None).await.expect("delete");
    let deleted = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), tenure.ended()).await.expect("tenure ends at once");
    eprintln!("tenure ended {:?} after the node was deleted", deleted.elapsed());
    assert!(!tenure.is_valid());

    let again =
        tokio::time::timeout(Duration::from_secs(10), elector.acquired()).await.expect("leads again").expect("tenure");
    assert!(again.term() > tenure.term(), "a new node gives a greater term");
    let leader = election.leader().await.expect("leader()").expect("leader");
    assert_ne!(leader.node, node);
    assert_eq!(leader.identity, "lonely");
    drop((tenure, again));
    elector.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_shuts_down_and_hands_over_without_waiting_for_expiry() {
    let path = unique_path("dropped");
    let Some(election) = election(&path).await else { return };
    let first = election.campaign("first").expect("campaign");
    tokio::time::timeout(Duration::from_secs(10), first.acquired()).await.expect("leads").expect("tenure");
    let second = election.campaign("second").expect("campaign");
    wait_until(&[&second], Duration::from_secs(10), "the second follows", |s| s[0].leader.as_deref() == Some("first"))
        .await;

    drop(first); // a closed command channel means shutdown: the node is deleted
    let dropped = Instant::now();
    tokio::time::timeout(SESSION_TIMEOUT * 4, second.acquired()).await.expect("takes over").expect("tenure");
    let took = dropped.elapsed();
    eprintln!("handover after dropping the leader's handle: {took:?}");
    assert!(took < SESSION_TIMEOUT / 2, "took {took:?}: the node went with the session, not with the shutdown");
    second.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_log_each_leader_they_observe_like_the_record_lock_elector() {
    use tenure_testkit::log_capture;
    let lines = log_capture::capture();
    let path = unique_path("observed");
    let Some(election) = election(&path).await else { return };
    let a = election.campaign("a").expect("campaign");
    log_capture::assert_each_observed_leader_is_logged(&lines, a, || election.campaign("b").expect("campaign")).await;
}
