//! `cargo bench -p tenure-bench --bench coordinated`
//!
//! Coordinated Leader Election (KEP-4355) against `tenure-apiserver`'s coordinator, in this process
//! on loopback: how long a coordinator-requested handover takes, from the moment the coordinator
//! names a `preferredHolder` on the Lease to the moment the preferred candidate leads (its own
//! renew written). client-go's coordinated candidates let the lease run out instead (a TODO in its
//! code): a full lease, 15 s at defaults.
//!
//! Method: each round, the current leader runs version 1.N and a new candidate with version
//! 1.(N-1) publishes its LeaseCandidate; the coordinator prefers the older version and names it.
//! An observer's watch timestamps the Lease change that names the preferred holder; the new
//! candidate's elector timestamps its tenure. The old leader drains (its work drops the tenure
//! when it ends) and releases; then it withdraws and stops, and the next round begins.
//! TENURE_BENCH_ROUNDS rounds (default 30), lease 2 s. Goal: p99 <= 100 ms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, WatchEvent, WatchParams};
use tenure::{Elector, Timing};
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};
use tenure_kube::coordinated::{CandidateVersions, LeaseCandidacy};
use tenure_kube::{KubeLock, KubeLockRef, LockKind};

const NAMESPACE: &str = "default";
const LEASE: &str = "coordinated";

struct Replica {
    elector: Elector,
    candidacy: LeaseCandidacy,
    /// When this replica's tenure started, as its own elector published it.
    led_at: Arc<Mutex<Option<Instant>>>,
}

fn start(server: &ApiServer, identity: &str, version: &str) -> Replica {
    let client = kube_client(&server.url(), &tenure_kube::user_agent(identity));
    let reference = KubeLockRef { namespace: NAMESPACE.into(), kind: LockKind::Leases, name: LEASE.into() };
    let lock = KubeLock::new(client.clone(), &reference, identity);
    let timing = Timing::new(Duration::from_secs(2), Duration::from_millis(1200), Duration::from_millis(300))
        .expect("valid timing");
    let elector =
        Elector::builder(identity, lock.record_lock()).timing(timing).coordinated().spawn().expect("an elector");
    let versions = CandidateVersions::new(version, version).expect("a version");
    let candidacy = LeaseCandidacy::publish(client, NAMESPACE, LEASE, identity, versions);
    let led_at = Arc::new(Mutex::new(None));
    let (view, mark) = (elector.view(), led_at.clone());
    tokio::spawn(async move {
        // The leader work: hold the tenure until it ends, then let go (the drain).
        if let Ok(tenure) = view.acquired().await {
            *mark.lock().unwrap() = Some(Instant::now());
            tenure.ended().await;
        }
    });
    Replica { elector, candidacy, led_at }
}

/// Timestamps every preferredHolder the Lease names, as an observer's watch delivers it.
fn observe_preferred(server: &ApiServer) -> Arc<Mutex<Vec<(Instant, String)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let leases: Api<Lease> = Api::namespaced(kube_client(&server.url(), "bench-observer"), NAMESPACE);
    tokio::spawn(async move {
        let mut version = "0".to_owned();
        loop {
            let params = WatchParams::default().fields(&format!("metadata.name={LEASE}")).timeout(290);
            let Ok(stream) = leases.watch(&params, &version).await else { return };
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Added(lease) | WatchEvent::Modified(lease) = event {
                    version = lease.metadata.resource_version.clone().unwrap_or(version);
                    if let Some(preferred) = lease.spec.and_then(|s| s.preferred_holder) {
                        sink.lock().unwrap().push((Instant::now(), preferred));
                    }
                }
            }
        }
    });
    seen
}

/// Waits (at most `limit`) for `condition`, checking every millisecond.
async fn wait_for<T>(limit: Duration, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn handovers(report: &mut Report) {
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("the API server starts");
    let preferred = observe_preferred(&server);
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 30);
    let mut leader = start(&server, "r0", &format!("1.{rounds}"));
    wait_for(Duration::from_secs(30), || *leader.led_at.lock().unwrap()).await;
    let mut samples = Vec::new();
    for round in 1..=rounds {
        let identity = format!("r{round}");
        let next = start(&server, &identity, &format!("1.{}", rounds - round));
        let named = wait_for(Duration::from_secs(30), || {
            preferred.lock().unwrap().iter().find(|(_, p)| *p == identity).map(|(at, _)| *at)
        })
        .await;
        let led = wait_for(Duration::from_secs(30), || *next.led_at.lock().unwrap()).await;
        samples.push(ms(led.saturating_duration_since(named)));
        let old = std::mem::replace(&mut leader, next);
        old.candidacy.withdraw().await;
        let _ = old.elector.shutdown().await;
    }
    let summary = Summary::of(&samples).expect("rounds");
    report.distribution(
        "preferred_handover_ms",
        "coordinator-requested handover, preferredHolder named -> new leader (lease 2 s)",
        &summary,
        "ms",
        Some(100.0),
    );
    report.note("client-go's coordinated candidates let the lease run out instead: a full lease (15 s at defaults)");
    leader.candidacy.withdraw().await;
    let _ = leader.elector.shutdown().await;
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("coordinated");
    runtime.block_on(handovers(&mut report));
    report.print();
}
