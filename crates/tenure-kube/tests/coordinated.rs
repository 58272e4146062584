//! Coordinated Leader Election against `tenure-apiserver`'s coordinator: candidates lead only when
//! the coordinator names them, a rolling upgrade keeps leadership on the oldest version until the
//! last replica is upgraded, a preferred holder is handed over to gracefully (drain, then release)
//! within a round trip, and plain candidates never take a coordinated lease.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Elector, Term, Timing, WaitReason};
use tenure_apiserver::ApiServerConfig;
use tenure_kube::coordinated::{CandidateVersions, LeaseCandidacy};
use tenure_kube::KubeLock;
use tenure_testkit::kube::{Cluster, PATIENCE};
use tokio::time::Instant;

const LEASE: &str = "ctl";

/// One tenure of one candidate: who, which term, and when it started and ended.
#[derive(Debug, Clone)]
struct Interval {
    identity: String,
    term: Term,
    start: Instant,
    end: Option<Instant>,
}

/// Every tenure of every candidate, as the candidates' own guards saw them.
#[derive(Clone, Default)]
struct History(Arc<Mutex<Vec<Interval>>>);

impl History {
    /// Two tenures that overlap in time, or a term that is not above every earlier one.
    fn violations(&self) -> Vec<String> {
        let intervals = self.0.lock().unwrap().clone();
        let mut found = Vec::new();
        for (i, a) in intervals.iter().enumerate() {
            for b in &intervals[i + 1..] {
                let a_end = a.end.unwrap_or_else(Instant::now);
                let b_end = b.end.unwrap_or_else(Instant::now);
                if a.start < b_end && b.start < a_end {
                    found.push(format!("{} (term {}) and {} (term {}) led at once", a.identity, a.term, b.identity, b.term));
                }
            }
        }
        let mut sorted = intervals.clone();
        sorted.sort_by_key(|i| i.start);
        for pair in sorted.windows(2) {
            if pair[1].term <= pair[0].term {
                found.push(format!("term {} of {} is not above {}", pair[1].term, pair[1].identity, pair[0].term));
            }
        }
        found
    }
}

/// A coordinated candidate: its elector, its published candidacy, and a task that does "leader
/// work" while it leads (holding the tenure until it ends, then dropping it: the drain).
struct Replica {
    identity: String,
    version: String,
    elector: Elector,
    candidacy: LeaseCandidacy,
}

fn timing() -> Timing {
    Timing::new(Duration::from_secs(2), Duration::from_millis(1200), Duration::from_millis(300)).unwrap()
}

impl Replica {
    async fn start(cluster: &Cluster, identity: &str, version: &str, history: &History) -> Replica {
        let client = cluster.client(identity).await;
        let reference = format!("kube://default/leases/{LEASE}").parse().unwrap();
        let lock = KubeLock::new(client.clone(), &reference, identity);
        let elector = Elector::builder(identity, lock.record_lock()).timing(timing()).coordinated().spawn().unwrap();
        let versions = CandidateVersions::new(version, version).unwrap();
        let candidacy = LeaseCandidacy::publish(client, "default", LEASE, identity, versions);
        let mut leadership = elector.subscribe();
        let view = elector.view();
        let (history, name) = (history.clone(), identity.to_owned());
        tokio::spawn(async move {
            loop {
                if let Some(tenure) = view.tenure() {
                    let index = {
                        let mut intervals = history.0.lock().unwrap();
                        intervals.push(Interval { identity: name.clone(), term: tenure.term(), start: Instant::now(), end: None });
                        intervals.len() - 1
                    };
                    tenure.ended().await;
                    history.0.lock().unwrap()[index].end = Some(Instant::now());
                    drop(tenure);
                }
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        });
        Replica { identity: identity.to_owned(), version: version.to_owned(), elector, candidacy }
    }

    /// Withdraws the candidacy first, so that the coordinator never names a replica on its way
    /// out, then releases.
    async fn stop(self) {
        self.candidacy.withdraw().await;
        self.elector.shutdown().await.unwrap();
    }
}

/// The identity the Lease names, once one of `replicas` leads under it.
async fn leader_of(replicas: &[Replica]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(leader) = replicas.iter().find(|r| r.elector.is_leader().is_some()) {
            return leader.identity.clone();
        }
        assert!(Instant::now() < deadline, "nobody led within {PATIENCE:?}");
        let mut changes: Vec<_> = replicas.iter().map(|r| r.elector.subscribe()).collect();
        let any = futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
        let _ = tokio::time::timeout(Duration::from_millis(200), any).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_keeps_the_oldest_version_leading_and_every_move_is_graceful() {
    let cluster = Cluster::start_with(ApiServerConfig::default()).await;
    let history = History::default();
    let mut replicas = Vec::new();
    for identity in ["a", "b", "c"] {
        replicas.push(Replica::start(&cluster, identity, "1.0", &history).await);
    }
    leader_of(&replicas).await;

    // Upgrade the replicas one by one, the leader last but one, as a Deployment might.
    let order = ["b", "a", "c"];
    for (step, identity) in order.iter().enumerate() {
        let position = replicas.iter().position(|r| r.identity == *identity).unwrap();
        let old = replicas.remove(position);
        old.stop().await;
        replicas.push(Replica::start(&cluster, identity, "1.1", &history).await);
        let leader = leader_of(&replicas).await;
        let leader_version = &replicas.iter().find(|r| r.identity == leader).unwrap().version;
        let old_left = replicas.iter().any(|r| r.version == "1.0");
        if old_left {
            assert_eq!(leader_version, "1.0", "step {step}: leadership left the old version while one remained");
        }
    }
    let leader = leader_of(&replicas).await;
    assert!(replicas.iter().all(|r| r.version == "1.1"));
    assert!(replicas.iter().any(|r| r.identity == leader));

    for replica in replicas {
        replica.stop().await;
    }
    assert_eq!(history.violations(), Vec::<String>::new());
    assert!(history.0.lock().unwrap().len() >= 2, "leadership moved during the upgrade");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_holder_is_handed_over_to_gracefully_within_a_round_trip() {
    let cluster = Cluster::start_with(ApiServerConfig::default()).await;
    let history = History::default();
    let new = Replica::start(&cluster, "new", "1.1", &history).await;
    assert_eq!(leader_of(std::slice::from_ref(&new)).await, "new");

    // An older version joins: the coordinator names it the preferred holder, and the holder hands
    // over: it drains (its guard ends first) and releases; it does not wait for its lease.
    let started = Instant::now();
    let old = Replica::start(&cluster, "old", "1.0", &history).await;
    let replicas = [new, old];
    let deadline = Instant::now() + PATIENCE;
    while replicas[1].elector.is_leader().is_none() {
        assert!(Instant::now() < deadline, "the preferred holder never led");
        let mut leadership = replicas[1].elector.subscribe();
        let _ = tokio::time::timeout(Duration::from_millis(200), leadership.changed()).await;
    }
    let took = started.elapsed();
    assert!(took < timing().lease_duration, "handed over in {took:?}: the lease ran out instead");
    let lease = cluster.object("leases", LEASE).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "old");
    assert_eq!(lease["spec"]["strategy"], "OldestEmulationVersion");

    for replica in replicas {
        replica.stop().await;
    }
    assert_eq!(history.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_outside_the_coordination_never_take_a_coordinated_lease() {
    let cluster = Cluster::start_with(ApiServerConfig::default()).await;
    let history = History::default();
    let coordinated = Replica::start(&cluster, "coordinated", "1.0", &history).await;
    assert_eq!(leader_of(std::slice::from_ref(&coordinated)).await, "coordinated");
    coordinated.stop().await;

    // The lease is free now, but it has a strategy: a plain candidate says why it does not take it.
    let plain = cluster.candidate("leases", LEASE, "plain").await;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stats = plain.stats();
        if stats.waiting.map(|w| w.reason) == Some(WaitReason::CoordinatedLease) {
            break;
        }
        assert!(Instant::now() < deadline, "the plain candidate never said why it waits: {stats:?}");
        let mut leadership = plain.leadership();
        let _ = tokio::time::timeout(Duration::from_millis(100), leadership.changed()).await;
    }
    assert_eq!(plain.is_leader(), None);
    plain.shutdown().await;
}
