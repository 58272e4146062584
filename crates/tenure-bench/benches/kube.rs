//! `cargo bench -p tenure-bench --bench kube`
//!
//! Tenure's Kubernetes locks against the project's in-memory API server (`tenure-apiserver`), all
//! in this process on loopback: what the server sees in steady state, crash failover, graceful
//! handover, and 1,000 candidates on one lock.
//!
//! Method: every candidate is a `tenure::Elector` on a `tenure_kube::KubeLock` with its own
//! kube-rs client, whose `User-Agent` names it, so the server's counters are per candidate. An
//! observer client watches the lock object; "last renew" and "new leader" are the instants at which
//! the observer's watch delivers the last record of the old holder and the first of the new one.
//! - steady state: 3 candidates, client-go's default timing (lease 15 s, renew deadline 10 s,
//!   retry 2 s), requests counted over a window (TENURE_BENCH_WINDOW_SECS, default 30);
//! - failover: 3 candidates with `--ttl 2s` timing (lease 2 s); the leader is cut off at the server
//!   (a partition: its requests are never answered, as if it had crashed) at a random point of its
//!   renew period; TENURE_BENCH_KILLS rounds (default 20). Goal: p99 <= lease + 50 ms;
//! - handover: the leader shuts down (releases the lock); TENURE_BENCH_ROUNDS rounds (default 30),
//!   measured from just before the shutdown call. Goal: p99 <= 100 ms;
//! - crowd: TENURE_BENCH_CROWD candidates (default 1000) with client-go's timing on one Lease:
//!   requests per second over 10 s, then TENURE_BENCH_CROWD_ROUNDS handovers (default 5).
//!
//! Lock kind: TENURE_BENCH_LOCK_KIND (default leases; endpointsleases etc. also work).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, WatchEvent, WatchParams};
use rand::RngExt;
use serde_json::json;
use tenure::{Elector, Timing};
use tenure_apiserver::{ApiServer, ApiServerConfig, Verb};
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize, ms};
use tenure_kube::{KubeLock, KubeLockRef, LockKind};

const NAMESPACE: &str = "default";

/// A candidate: its elector and the name the server counts it under.
struct Candidate {
    agent: String,
    elector: Elector,
}

fn client(server: &ApiServer, agent: &str) -> kube::Client {
    kube_client(&server.url(), agent)
}

fn start(server: &ApiServer, reference: &KubeLockRef, identity: &str, timing: Timing) -> Candidate {
    let agent = tenure_kube::user_agent(identity);
    let lock = KubeLock::new(client(server, &agent), reference, identity);
    let elector = Elector::builder(identity, lock.record_lock()).timing(timing).spawn().expect("an elector");
    Candidate { agent, elector }
}

/// Records, as they arrive at an observer's watch, who holds the Lease: (instant, holder).
#[derive(Clone, Default)]
struct Observed(Arc<Mutex<Vec<(Instant, String)>>>);

impl Observed {
    fn start(server: &ApiServer, name: &str) -> Observed {
        let observed = Observed::default();
        let sink = observed.clone();
        let leases: Api<Lease> = Api::namespaced(client(server, "bench-observer"), NAMESPACE);
        let name = name.to_owned();
        tokio::spawn(async move {
            let mut version = "0".to_owned();
            loop {
                let params = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(290);
                let Ok(stream) = leases.watch(&params, &version).await else { return };
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(event)) = stream.next().await {
                    if let WatchEvent::Added(lease) | WatchEvent::Modified(lease) = event {
                        version = lease.metadata.resource_version.clone().unwrap_or(version);
                        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                        sink.0.lock().unwrap().push((Instant::now(), holder));
                    }
                }
            }
        });
        observed
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Waits until a record after index `from` satisfies `holder_ok`; returns its index, instant and holder.
    async fn wait(
        &self,
        from: usize,
        limit: Duration,
        holder_ok: impl Fn(&str) -> bool,
    ) -> Option<(usize, Instant, String)> {
        let deadline = Instant::now() + limit;
        loop {
            {
                let seen = self.0.lock().unwrap();
                if let Some((i, (at, holder))) = seen.iter().enumerate().skip(from).find(|(_, (_, h))| holder_ok(h)) {
                    return Some((i, *at, holder.clone()));
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The instant of the last record of `holder` before index `before`.
    fn last_of(&self, holder: &str, before: usize) -> Option<Instant> {
        let seen = self.0.lock().unwrap();
        seen[..before].iter().rev().find(|(_, h)| h == holder).map(|(at, _)| *at)
    }
}

fn lock_kind() -> LockKind {
    std::env::var("TENURE_BENCH_LOCK_KIND").ok().map_or(LockKind::Leases, |k| k.parse().expect("a lock kind"))
}

fn reference(name: &str) -> KubeLockRef {
    KubeLockRef { namespace: NAMESPACE.into(), kind: lock_kind(), name: name.into() }
}

async fn leader_of(candidates: &[Candidate], limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(i) = candidates.iter().position(|c| c.elector.is_leader().is_some()) {
            return i;
        }
        assert!(Instant::now() < deadline, "nobody leads within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (at most 60 s, checking every 5 ms) until every candidate names `leader`.
async fn all_name(candidates: &[Candidate], leader: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !candidates.iter().all(|c| c.elector.leadership().leader.as_deref() == Some(leader)) {
        assert!(Instant::now() < deadline, "not every candidate named {leader} within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn steady_state(report: &mut Report) {
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("a server");
    let window = env_seconds("TENURE_BENCH_WINDOW_SECS", Duration::from_secs(30));
    let reference = reference("steady");
    let candidates: Vec<Candidate> =
        (0..3).map(|i| start(&server, &reference, &format!("steady-{i}"), Timing::default())).collect();
    let leader = leader_of(&candidates, Duration::from_secs(10)).await;
    // Let every follower settle into its watch.
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.faults().reset_counts();
    tokio::time::sleep(window).await;
    let counts = server.faults().request_counts();
    let per_minute = |agent: &str, verbs: &[Verb]| {
        let n: u64 = verbs.iter().map(|v| counts.get(&(agent.to_owned(), *v)).copied().unwrap_or(0)).sum();
        n as f64 * 60.0 / window.as_secs_f64()
    };
    let writes = [Verb::Update, Verb::Create, Verb::Patch];
    let reads = [Verb::Get, Verb::List];
    let leader_agent = &candidates[leader].agent;
    let followers: Vec<&Candidate> =
        candidates.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, c)| c).collect();
    let follower_requests: f64 = followers
        .iter()
        .map(|f| per_minute(&f.agent, &[Verb::Get, Verb::List, Verb::Update, Verb::Create, Verb::Patch, Verb::Watch]))
        .sum::<f64>()
        / followers.len() as f64;
    report.info(
        "steady_leader_writes_per_min",
        "leader writes per minute (renew every 2 s: 30)",
        per_minute(leader_agent, &writes),
        "/min",
    );
    report.info(
        "steady_leader_reads_per_min",
        "leader reads (GET/LIST) per minute",
        per_minute(leader_agent, &reads),
        "/min",
    );
    report.goal(
        "steady_follower_requests_per_min",
        "follower requests per minute besides an open watch (client-go: 14-30 GETs)",
        follower_requests,
        "/min",
        0.0,
    );
    let by_verb: BTreeMap<String, u64> =
        counts.iter().map(|((agent, verb), n)| (format!("{agent} {verb}"), *n)).collect();
    report.extra("steady_counts", json!(by_verb));
    report.extra("steady_window_s", json!(window.as_secs_f64()));
    for candidate in candidates {
        let _ = candidate.elector.shutdown().await;
    }
    server.shutdown().await;
}

async fn failover_and_handover(report: &mut Report) {
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("a server");
    let timing = Timing::from_ttl(Duration::from_secs(2)).expect("a timing");
    let reference = reference("fast");
    let observed = Observed::start(&server, "fast");
    let mut next = 0;
    let mut fresh = |server: &ApiServer| {
        next += 1;
        start(server, &reference, &format!("fast-{next}"), timing)
    };
    let mut candidates: Vec<Candidate> = (0..3).map(|_| fresh(&server)).collect();
    let mut rng = rand::rng();

    let kills = env_usize("TENURE_BENCH_KILLS", 20);
    let mut failovers = Vec::new();
    let mut cut_off = Vec::new();
    for round in 1..=kills {
        let leader = leader_of(&candidates, Duration::from_secs(10)).await;
        let leader_id = candidates[leader].elector.identity().to_owned();
        // A renew of the leader, then a random part of the renew period.
        let from = observed.len();
        observed.wait(from, Duration::from_secs(5), |h| h == leader_id).await.expect("the leader renews");
        tokio::time::sleep(timing.retry_period.mul_f64(rng.random::<f64>())).await;
        let dead = candidates.remove(leader);
        server.faults().partition(&dead.agent);
        let mark = observed.len();
        let (index, new_at, new_holder) = observed
            .wait(mark, Duration::from_secs(10), |h| !h.is_empty() && h != leader_id)
            .await
            .unwrap_or_else(|| panic!("round {round}: no new leader within 10 s"));
        let last_renew = observed.last_of(&leader_id, index).expect("a renew of the old leader");
        failovers.push(ms(new_at - last_renew));
        cut_off.push(ms(new_at.saturating_duration_since(last_renew)));
        assert!(candidates.iter().any(|c| c.elector.identity() == new_holder), "round {round}: {new_holder} leads");
        // The dead candidate is never heard from again; its elector is dropped in the background.
        tokio::spawn(async move { drop(dead) });
        candidates.push(fresh(&server));
    }

    let rounds = env_usize("TENURE_BENCH_ROUNDS", 30);
    let mut handovers = Vec::new();
    for round in 1..=rounds {
        let leader = leader_of(&candidates, Duration::from_secs(10)).await;
        let leader_id = candidates[leader].elector.identity().to_owned();
        let from = observed.len();
        observed.wait(from, Duration::from_secs(5), |h| h == leader_id).await.expect("the leader renews");
        tokio::time::sleep(timing.retry_period.mul_f64(rng.random::<f64>())).await;
        let stopping = candidates.remove(leader);
        let mark = observed.len();
        let started = Instant::now();
        let shutdown = tokio::spawn(stopping.elector.shutdown());
        let (_, new_at, _) = observed
            .wait(mark, Duration::from_secs(10), |h| !h.is_empty() && h != leader_id)
            .await
            .unwrap_or_else(|| panic!("round {round}: no new leader within 10 s"));
        handovers.push(ms(new_at - started));
        let _ = shutdown.await;
        candidates.push(fresh(&server));
    }
    let lease_ms = ms(timing.lease_duration);
    let failover = Summary::of(&failovers).expect("failovers");
    report.distribution(
        "failover_ms",
        "crash failover, last renew -> new leader (lease 2 s)",
        &failover,
        "ms",
        Some(lease_ms + 50.0),
    );
    let over: Vec<f64> = failovers.iter().map(|f| f - lease_ms).collect();
    report.distribution(
        "failover_minus_lease_ms",
        "crash failover - lease",
        &Summary::of(&over).expect("failovers"),
        "ms",
        None,
    );
    let handover = Summary::of(&handovers).expect("handovers");
    report.distribution("handover_ms", "graceful handover, shutdown -> new leader", &handover, "ms", Some(100.0));
    for candidate in candidates {
        let _ = candidate.elector.shutdown().await;
    }
    server.shutdown().await;
}

async fn crowd(report: &mut Report) {
    let size = env_usize("TENURE_BENCH_CROWD", 1000);
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("a server");
    let reference = reference("crowd");
    let observed = Observed::start(&server, "crowd");
    let started = Instant::now();
    let mut candidates: Vec<Candidate> =
        (0..size).map(|i| start(&server, &reference, &format!("crowd-{i}"), Timing::default())).collect();
    let leader = leader_of(&candidates, Duration::from_secs(30)).await;
    let elected = started.elapsed();
    // Every follower has read the lock and opened its watch once it reports the leader.
    let leader_id = candidates[leader].elector.identity().to_owned();
    all_name(&candidates, &leader_id).await;
    let settled = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.faults().reset_counts();
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let total: u64 =
        server.faults().request_counts().iter().filter(|((a, _), _)| a != "bench-observer").map(|(_, n)| n).sum();
    report.info(
        "crowd_requests_per_s",
        &format!("{size} candidates, steady state: requests per second"),
        total as f64 / window.as_secs_f64(),
        "/s",
    );
    report.info("crowd_settle_ms", &format!("{size} candidates started -> all name the leader"), ms(settled), "ms");
    report.extra("crowd_first_leader_ms", json!(ms(elected)));

    let mut leader_id = leader_id;
    let mut handovers = Vec::new();
    let mut all_know = Vec::new();
    let mut requests_per_handover = Vec::new();
    for round in 1..=env_usize("TENURE_BENCH_CROWD_ROUNDS", 5) {
        let leader = leader_of(&candidates, Duration::from_secs(30)).await;
        assert_eq!(candidates[leader].elector.identity(), leader_id, "round {round}: the leader everyone named");
        let mark = observed.len();
        let leaving = candidates.remove(leader);
        server.faults().reset_counts();
        let handover_started = Instant::now();
        let shutdown = tokio::spawn(leaving.elector.shutdown());
        let (_, new_at, new_holder) = observed
            .wait(mark, Duration::from_secs(30), |h| !h.is_empty() && h != leader_id)
            .await
            .expect("a new leader in the crowd");
        handovers.push(ms(new_at - handover_started));
        let _ = shutdown.await;
        all_name(&candidates, &new_holder).await;
        all_know.push(ms(handover_started.elapsed()));
        let counts = server.faults().request_counts();
        requests_per_handover
            .push(counts.iter().filter(|((a, _), _)| a != "bench-observer").map(|(_, n)| *n as f64).sum());
        leader_id = new_holder;
    }
    let label = format!("{size} candidates: graceful handover");
    report.distribution("crowd_handover_ms", &label, &Summary::of(&handovers).expect("handovers"), "ms", None);
    let label = format!("{size} candidates: requests per handover (release, acquisition attempts, reads)");
    report.distribution(
        "crowd_requests_per_handover",
        &label,
        &Summary::of(&requests_per_handover).expect("handovers"),
        "",
        None,
    );
    let label = format!("{size} candidates: shutdown -> all name the new leader");
    report.distribution("crowd_all_know_ms", &label, &Summary::of(&all_know).expect("handovers"), "ms", None);
    for candidate in candidates.drain(..) {
        drop(candidate.elector);
    }
    server.shutdown().await;
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("kube");
    runtime.block_on(async {
        eprintln!("kube: steady state (3 candidates, client-go timing)");
        steady_state(&mut report).await;
        eprintln!("kube: failover and handover (3 candidates, lease 2 s)");
        failover_and_handover(&mut report).await;
        eprintln!("kube: crowd");
        crowd(&mut report).await;
    });
    report.note(format!(
        "lock kind {}; server, candidates and observer share one 2-worker runtime on loopback",
        lock_kind()
    ));
    report.print();
}
