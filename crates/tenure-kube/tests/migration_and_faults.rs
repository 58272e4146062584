//! Safety under a rolling migration between lock kinds and under API server faults: at no sampled
//! moment do two electors lead at once, and the election always recovers.

use std::time::Duration;

use tenure_apiserver::{FaultScope, InjectedFault, Verb};
use tenure_kube::user_agent;
use tenure_testkit::kube::*;
use tokio::time::Instant;

/// A rolling upgrade `old` → `multi` → `new`: each replica in turn is replaced by one of the next
/// kind (the leader first, alternately crashed and shut down gracefully), so that at every moment
/// the running kinds are either {old, multi} or {multi, new}, as client-go's migration requires.
async fn rolling_upgrade(old: &str, multi: &str) {
    let cluster = Cluster::start().await;
    let monitor = Monitor::for_mixed_kinds();
    let mut running = Vec::new();
    for i in 0..3 {
        let candidate = cluster.candidate(old, "migrating", &format!("{old}-{i}")).await;
        monitor.watch(&candidate);
        running.push(candidate);
    }
    monitor.one_leader().await;
    let mut step = 0;
    for kind in [multi, "leases"] {
        for _ in 0..3 {
            // Replace the leader while there is one of the previous kind, else any of it.
            let (leader, _) = monitor.one_leader().await;
            let previous_kind = running.iter().find(|c| !c.identity.starts_with(kind)).map(|c| c.identity.clone());
            let leader_is_old = !leader.starts_with(kind);
            let replaced = if leader_is_old { leader } else { previous_kind.unwrap() };
            let old_candidate = take(&mut running, &replaced);
            if step % 2 == 0 {
                old_candidate.crash();
            } else {
                old_candidate.shutdown().await;
            }
            let candidate = cluster.candidate(kind, "migrating", &format!("{kind}-{step}")).await;
            monitor.watch(&candidate);
            running.push(candidate);
            step += 1;
        }
    }
    let (leader, _) = monitor.one_leader().await;
    assert!(leader.starts_with("leases"));
    let lease = cluster.object("leases", "migrating").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], leader);
    let tenures = monitor.tenures();
    assert!(tenures.len() >= 4, "leadership moved through the kinds: {tenures:?}");
    monitor.assert_safe();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_endpoints_through_endpointsleases_to_leases_never_has_two_leaders() {
    rolling_upgrade("endpoints", "endpointsleases").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_configmaps_through_configmapsleases_to_leases_never_has_two_leaders() {
    rolling_upgrade("configmaps", "configmapsleases").await;
}

/// Mixed kinds that share an object, with the leader crashing again and again.
async fn mixed_kinds_share_one_election(kinds: [&str; 2]) {
    let cluster = Cluster::start().await;
    let monitor = Monitor::for_mixed_kinds();
    let mut running = Vec::new();
    let mut next = 0;
    for kind in kinds.iter().chain(kinds.iter()) {
        let candidate = cluster.candidate(kind, "mixed", &format!("{kind}-{next}")).await;
        next += 1;
        monitor.watch(&candidate);
        running.push(candidate);
    }
    for round in 0..4 {
        let (leader, _) = monitor.one_leader().await;
        let kind = kinds.iter().find(|k| leader.starts_with(&format!("{k}-"))).unwrap().to_string();
        take(&mut running, &leader).crash();
        // The replacement is of the other kind, so both kinds lead in turn.
        let other = kinds.iter().find(|k| **k != kind).unwrap();
        let candidate = cluster.candidate(other, "mixed", &format!("{other}-{next}")).await;
        next += 1;
        monitor.watch(&candidate);
        running.push(candidate);
        let _ = round;
    }
    monitor.one_leader().await;
    let kinds_that_led: std::collections::BTreeSet<String> =
        monitor.tenures().iter().map(|(id, _)| id.rsplit_once('-').unwrap().0.to_owned()).collect();
    assert_eq!(kinds_that_led.len(), 2, "both kinds led in turn: {:?}", monitor.tenures());
    monitor.assert_safe();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_endpointsleases_candidates_share_one_election() {
    mixed_kinds_share_one_election(["endpoints", "endpointsleases"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpointsleases_and_leases_candidates_share_one_election() {
    mixed_kinds_share_one_election(["endpointsleases", "leases"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmapsleases_and_leases_candidates_share_one_election() {
    mixed_kinds_share_one_election(["configmapsleases", "leases"]).await;
}

// ---------------------------------------------------------------------------------------------
// API faults

/// Errors, throttling, latency beyond the call timeout, and a partition of the leader's client, one
/// after the other; the monitor checks every change, and an election stands at the end.
async fn faults_never_make_two_leaders(kind: &str) {
    let cluster = Cluster::start().await;
    let (_running, monitor) = candidates(&cluster, kind, "faulty", 3).await;
    let faults = cluster.server.faults();
    monitor.one_leader().await;

    // 500s on a burst of requests from everyone.
    faults.inject(FaultScope { times: Some(12), ..FaultScope::everyone() }, InjectedFault::InternalError);
    let (leader, _) = monitor.one_leader().await;
    faults.clear_errors();

    // Throttling of the leader's writes, longer than its renew deadline.
    let throttled = FaultScope { client: Some(user_agent(&leader)), verbs: vec![Verb::Update], times: None };
    faults.inject(throttled, InjectedFault::TooManyRequests { retry_after_seconds: 1 });
    monitor.until("the throttled leader stepped down", |m| !m.leaders().iter().any(|(l, _)| *l == leader)).await;
    monitor.until("a follower took over", |m| m.leaders().len() == 1).await;
    faults.clear_errors();
    monitor.one_leader().await;

    // Latency near, then beyond, the call timeout (300 ms) for everyone: lost replies, uncertain writes.
    for latency in [250, 400] {
        faults.set_latency(Duration::from_millis(latency));
        tokio::time::sleep(timing().lease_duration * 2).await;
        faults.set_latency(Duration::ZERO);
        monitor.one_leader().await;
    }

    // A partition of the leader's client: it fences itself at its renew deadline, before any
    // follower may take over, and rejoins as a follower once healed.
    let (leader, term) = monitor.one_leader().await;
    let cut_at = Instant::now();
    faults.partition(&user_agent(&leader));
    monitor.until("the partitioned leader fenced itself", |m| !m.leaders().contains(&(leader.clone(), term))).await;
    assert!(cut_at.elapsed() <= timing().renew_deadline + Duration::from_millis(150), "{:?}", cut_at.elapsed());
    // The cut-off candidate cannot learn who leads; the others elect and agree.
    monitor.until("a follower took over", |m| m.leaders().len() == 1).await;
    let (successor, _) = monitor.leaders()[0].clone();
    assert_ne!(successor, leader);
    faults.heal(&user_agent(&leader));
    let (healed_view, _) = monitor.one_leader().await;
    assert_eq!(healed_view, successor, "the healed candidate follows the new leader");
    monitor.assert_safe();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_never_make_two_leaders_on_leases() {
    faults_never_make_two_leaders("leases").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_never_make_two_leaders_on_endpoints() {
    faults_never_make_two_leaders("endpoints").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_never_make_two_leaders_on_endpointsleases() {
    faults_never_make_two_leaders("endpointsleases").await;
}

/// Followers whose watch cannot be opened (the server never answers it) are informed by their
/// reads: the election goes on, and nobody takes over a leader that keeps renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_whose_watch_never_opens_still_respect_a_renewing_leader() {
    let cluster = Cluster::start().await;
    let monitor = Monitor::new();
    let leader = cluster.candidate("leases", "no-watch", "leader").await;
    monitor.watch(&leader);
    let (_, term) = monitor.one_leader().await;
    let mut followers = Vec::new();
    for identity in ["blind-1", "blind-2"] {
        let scope =
            FaultScope { client: Some(user_agent(identity)), verbs: vec![Verb::List, Verb::Watch], times: None };
        cluster.server.faults().inject(scope, InjectedFault::Hang);
        let follower = cluster.candidate("leases", "no-watch", identity).await;
        monitor.watch(&follower);
        followers.push(follower);
    }
    monitor.one_leader().await;
    tokio::time::sleep(timing().lease_duration * 3).await;
    assert_eq!(monitor.tenures(), vec![("leader".to_owned(), term)], "the renewing leader kept the lock");
    assert!(followers.iter().all(|f| f.leadership().borrow().leader.as_deref() == Some("leader")));
    monitor.assert_safe();
}
