//! Benchmark of the ZooKeeper elector against a ZooKeeper server it starts on a loopback port:
//! handover after resign (p50/p99/max), crash failover as a multiple of the session timeout, and
//! requests per second per candidate in steady state. Prints numbers; asserts nothing.
//!
//! `cargo run --release -p tenure-zk --example zk_bench`

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tenure_testkit::leadership::{one_agreed_leader, wait_until};
use tenure_testkit::zk_candidates::{child_candidate_main, spawn_candidate, CHILD_ENV};
use tenure_testkit::zookeeper::{four_letter_word, unique_path, ZkServer, SESSION_TIMEOUT};
use tenure_zk::ZkElection;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn received(port: u16) -> u64 {
    four_letter_word(port, "srvr")
        .and_then(|a| a.lines().find_map(|l| l.strip_prefix("Received: ").map(|n| n.trim().parse().unwrap_or(0))))
        .unwrap_or(0)
}

fn main() {
    if std::env::var(CHILD_ENV).is_ok() {
        child_candidate_main();
        return;
    }
    let Some(server) = ZkServer::private() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        // Handover after resign.
        let path = unique_path("bench-handover");
        let election = ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect");
        let ids = ["a", "b", "c"];
        let electors: Vec<_> = ids.iter().map(|id| election.campaign(*id).expect("campaign")).collect();
        let refs: Vec<_> = electors.iter().collect();
        let mut handovers = Vec::new();
        for _ in 0..100 {
            wait_until(&refs, Duration::from_secs(10), "a leader", |s| one_agreed_leader(s, &ids)).await;
            let old = electors.iter().position(|e| e.is_leader().is_some()).expect("leader");
            electors[old].resign().await.expect("resign");
            let resigned = Instant::now();
            wait_until(&refs, Duration::from_secs(5), "a new leader", |s| {
                s.iter().enumerate().any(|(i, s)| i != old && s.is_leader())
            })
            .await;
            handovers.push(resigned.elapsed());
        }
        handovers.sort();
        println!(
            "handover after resign (n={}): p50 {:?} p99 {:?} max {:?}",
            handovers.len(),
            percentile(&handovers, 0.5),
            percentile(&handovers, 0.99),
            handovers[handovers.len() - 1]
        );

        // Steady state: requests per second per candidate (3 candidates, one leading).
        let window = Duration::from_secs(10);
        let idle_start = received(server.port);
        tokio::time::sleep(window).await; // measuring a rate over a fixed window
        let with_candidates = received(server.port).saturating_sub(idle_start);
        for elector in electors {
            elector.shutdown().await.expect("shutdown");
        }
        let baseline_start = received(server.port);
        tokio::time::sleep(window).await;
        let baseline = received(server.port).saturating_sub(baseline_start);
        let per_candidate = with_candidates.saturating_sub(baseline) as f64 / window.as_secs_f64() / 3.0;
        println!(
            "steady state, session timeout {SESSION_TIMEOUT:?}: {per_candidate:.2} requests/s per candidate \
             (pings and the leader's heartbeat; {} packets in {window:?} with 3 candidates, {baseline} without)",
            with_candidates
        );

        // Crash failover: a candidate process leads and is killed with SIGKILL.
        let mut ratios = Vec::new();
        for round in 0..5 {
            let path = unique_path(&format!("bench-crash-{round}"));
            let election = ZkElection::connect(&server.servers, &path, SESSION_TIMEOUT).await.expect("connect");
            let child = spawn_candidate("child", &server.servers, &path, "doomed");
            child.expect_line("LEADING", Duration::from_secs(20), |_| {});
            let followers: Vec<_> = ["x", "y"].iter().map(|id| election.campaign(*id).expect("campaign")).collect();
            let refs: Vec<_> = followers.iter().collect();
            wait_until(&refs, Duration::from_secs(10), "followers", |s| s.iter().all(|s| s.leader.as_deref() == Some("doomed")))
                .await;
            child.signal(Signal::SIGKILL);
            let killed = Instant::now();
            wait_until(&refs, SESSION_TIMEOUT * 4, "takeover", |s| s.iter().any(|s| s.is_leader())).await;
            ratios.push(killed.elapsed().as_secs_f64() / SESSION_TIMEOUT.as_secs_f64());
            for elector in followers {
                elector.shutdown().await.expect("shutdown");
            }
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        println!(
            "crash failover (n={}), as a multiple of the session timeout {SESSION_TIMEOUT:?}: min {:.2} median {:.2} max {:.2}",
            ratios.len(),
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1]
        );
    });
}
