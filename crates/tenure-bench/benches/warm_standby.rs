//! `CARGO_PROFILE_BENCH_LTO=false cargo bench -p tenure-bench --bench warm_standby`
//!
//! A Pod controller in warm standby (`tenure_ha::kube_watch::GatedWatch` with `Standby::Warm`):
//! how soon the new leader reconciles after the leader crashes or hands over, and what its
//! checkpoints cost in API requests.
//!
//! Method: the project's in-memory API server in this process; two replicas, each an elector on a
//! Lease lock plus a warm gated watch of Pods and a `KubeCheckpointStore`, each on a tokio runtime
//! of its own with its own clients (`User-Agent`s name them, so the server's counters are per
//! replica and per purpose). Timing: lease TENURE_BENCH_LEASE_MS (default 1000), renew deadline
//! 70 % of it, retry period TENURE_BENCH_RETRY_MS (default 100).
//! - crash: at a random point of the renew period the leader's runtime is dropped (nothing is
//!   released or flushed), and a Pod is created at once; measured until the standby's handler is
//!   called for that Pod, both from the crash and from the leader's last renew (the Lease's
//!   `renewTime`, which is when the lease starts to run out). Goal: p99 from the last renew
//!   <= lease + 50 ms. TENURE_BENCH_KILLS rounds (default 20);
//! - handover: the leader's watch is shut down (in-flight work drains, last checkpoint written),
//!   a Pod is created, the leader's elector shuts down (releases the Lease); measured from the
//!   start of the shutdown until the standby's handler is called for that Pod. Goal: p99 <= 50 ms.
//!   TENURE_BENCH_ROUNDS rounds (default 20). Also split into phases: the old leader's work
//!   stopped, the Lease released, the new leader elected (its elector reports leading), the first
//!   reconcile;
//! - checkpoint cost: a steady leader handling one Pod change every 20 ms for
//!   TENURE_BENCH_WINDOW_SECS (default 10): its checkpoint requests and its Lease renews per
//!   minute.
//!
//! Before each round a replacement replica is started (as the next standby); whichever of it and
//! the standby wins the election is the new leader measured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use rand::RngExt;
use serde_json::json;
use tenure::{Elector, Timing};
use tenure_apiserver::resources::find_resource_type;
use tenure_apiserver::{ApiServer, ApiServerConfig, Store, Verb};
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize, ms};
use tenure_ha::checkpoint::kube::KubeCheckpointStore;
use tenure_ha::kube_watch::{Change, GatedWatch, GatedWatchHandle, Standby};
use tenure_kube::{KubeLock, KubeLockRef, LockKind};
use tokio::sync::mpsc;

const NAMESPACE: &str = "default";
const PATIENCE: Duration = Duration::from_secs(30);

/// (replica, Pod) of every Applied change a handler was called with, and when.
type Reconciled = mpsc::UnboundedSender<(String, String, Instant)>;

struct Replica {
    identity: String,
    runtime: Option<tokio::runtime::Runtime>,
    elector: Option<Elector>,
    watch: Option<GatedWatchHandle>,
}

impl Replica {
    async fn start(url: &str, identity: &str, timing: Timing, reconciled: Reconciled) -> Replica {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let (url, id) = (url.to_owned(), identity.to_owned());
        let (elector, watch) = runtime
            .spawn(async move {
                let reference =
                    KubeLockRef { namespace: NAMESPACE.into(), kind: LockKind::Leases, name: "bench".into() };
                let lock = KubeLock::new(kube_client(&url, &tenure_kube::user_agent(&id)), &reference, &id);
                let elector = Elector::builder(&id, lock.record_lock()).timing(timing).spawn().expect("an elector");
                let checkpoints = KubeCheckpointStore::new(
                    kube_client(&url, &format!("{id}-checkpoint")),
                    NAMESPACE,
                    "bench-checkpoint",
                    "bench",
                );
                let pods: Api<Pod> = Api::namespaced(kube_client(&url, &format!("{id}-watch")), NAMESPACE);
                let watch = GatedWatch::new(pods, "pods", Arc::new(checkpoints)).standby(Standby::Warm).run(
                    &elector,
                    move |change, _tenure| {
                        if let Change::Applied(pod) = change {
                            let _ = reconciled.send((id.clone(), pod.name_any(), Instant::now()));
                        }
                        async { Ok::<_, std::convert::Infallible>(()) }
                    },
                );
                (elector, watch)
            })
            .await
            .expect("the replica starts");
        Replica { identity: identity.to_owned(), runtime: Some(runtime), elector: Some(elector), watch: Some(watch) }
    }

    fn is_leader(&self) -> bool {
        self.elector.as_ref().is_some_and(|e| e.is_leader().is_some())
    }

    fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Stops the watch (drain, last checkpoint), runs `between`, then releases the Lease.
    /// Returns when the watch had stopped and when the Lease was released.
    async fn stop(mut self, between: impl FnOnce()) -> (Instant, Instant) {
        let runtime = self.runtime.take().expect("running");
        let watch = self.watch.take().expect("running");
        runtime.spawn(watch.shutdown()).await.expect("the watch stops");
        let stopped = Instant::now();
        between();
        let elector = self.elector.take().expect("running");
        runtime.spawn(elector.shutdown()).await.expect("the elector stops").expect("a clean release");
        let released = Instant::now();
        runtime.shutdown_background();
        (stopped, released)
    }

    /// Completes with the instant this replica's elector reports that it leads (or never), as
    /// seen on the replica's own runtime.
    fn led_at(&self) -> tokio::task::JoinHandle<Option<Instant>> {
        let mut leadership = self.elector.as_ref().expect("running").subscribe();
        let runtime = self.runtime.as_ref().expect("running");
        runtime.spawn(async move { leadership.wait_for(|l| l.is_leader()).await.ok().map(|_| Instant::now()) })
    }
}

fn create_pod(store: &Store, name: &str) {
    let pods = find_resource_type("", "v1", "pods").expect("pods");
    let pod = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    store.create(pods, NAMESPACE, pod).expect("a Pod");
}

/// How long ago the Lease was last renewed, by its `renewTime` (microseconds, wall clock).
fn since_last_renew(store: &Store) -> Duration {
    let leases = find_resource_type("coordination.k8s.io", "v1", "leases").expect("leases");
    let lease = store.get(leases, NAMESPACE, "bench").expect("the Lease");
    let renewed = lease["spec"]["renewTime"].as_str().expect("a renewTime");
    let renewed = chrono::DateTime::parse_from_rfc3339(renewed).expect("an RFC 3339 time");
    (chrono::Utc::now() - renewed.with_timezone(&chrono::Utc)).to_std().unwrap_or_default()
}

/// Waits until a replica other than the stopped `old` leader reconciles `pod` (the standby, or
/// the replacement started just before, whichever won the election); returns when.
async fn reconciled_by_other(
    events: &mut mpsc::UnboundedReceiver<(String, String, Instant)>,
    old: &str,
    pod: &str,
) -> Instant {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv()).await;
        let (who, what, at) = event.expect("the standby reconciles in time").expect("replicas running");
        assert!(!(who == old && what == pod), "the stopped leader reconciled {pod}");
        if what == pod {
            return at;
        }
    }
}

async fn leader_of(replicas: &[Replica]) -> usize {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(i) = replicas.iter().position(Replica::is_leader) {
            return i;
        }
        assert!(Instant::now() < deadline, "nobody leads");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn run(report: &mut Report) {
    let lease = Duration::from_millis(env_usize("TENURE_BENCH_LEASE_MS", 1000) as u64);
    let retry = Duration::from_millis(env_usize("TENURE_BENCH_RETRY_MS", 100) as u64);
    let timing = Timing::new(lease, lease * 7 / 10, retry).expect("a valid timing");
    let kills = env_usize("TENURE_BENCH_KILLS", 20);
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 20);
    let window = env_seconds("TENURE_BENCH_WINDOW_SECS", Duration::from_secs(10));

    let server = ApiServer::start(ApiServerConfig::default()).await.expect("a server");
    let store = server.store().clone();
    let url = server.url();
    let (sink, mut events) = mpsc::unbounded_channel();
    let mut next = 0usize;
    let replica = |n: &mut usize| {
        *n += 1;
        format!("replica-{n}")
    };
    let first = Replica::start(&url, &replica(&mut next), timing, sink.clone()).await;
    leader_of(std::slice::from_ref(&first)).await;
    let second = Replica::start(&url, &replica(&mut next), timing, sink.clone()).await;
    let mut replicas = [first, second];

    // Checkpoint cost of a steady leader.
    let leader = leader_of(&replicas).await;
    let identity = replicas[leader].identity.clone();
    server.faults().reset_counts();
    let started = Instant::now();
    let mut changes = 0usize;
    while started.elapsed() < window {
        create_pod(&store, &format!("steady-{changes}"));
        changes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let faults = server.faults();
    let checkpoint_agent = format!("{identity}-checkpoint");
    let checkpoint_requests: u64 = [Verb::Get, Verb::Create, Verb::Update, Verb::Patch]
        .into_iter()
        .map(|verb| faults.request_count(&checkpoint_agent, verb))
        .sum();
    let renews = faults.request_count(&tenure_kube::user_agent(&identity), Verb::Update);
    report.goal(
        "checkpoint_requests_per_min",
        &format!("checkpoint requests per minute per leader ({} changes/min)", (changes as f64 / minutes).round()),
        checkpoint_requests as f64 / minutes,
        "req/min",
        60_000.0 / ms(retry),
    );
    report.info("renews_per_min", "Lease renews per minute of the same leader", renews as f64 / minutes, "req/min");

    // Crash -> first reconcile on the new leader.
    let mut from_crash = Vec::new();
    let mut from_renew = Vec::new();
    for round in 0..kills {
        let leader = leader_of(&replicas).await;
        let phase = rand::rng().random_range(Duration::ZERO..retry);
        tokio::time::sleep(phase).await;
        let pod = format!("crash-{round}");
        let fresh = Replica::start(&url, &replica(&mut next), timing, sink.clone()).await;
        let crashed = std::mem::replace(&mut replicas[leader], fresh);
        let renewed_ago = since_last_renew(&store);
        let crashed_at = Instant::now();
        let old = crashed.identity.clone();
        crashed.crash();
        create_pod(&store, &pod);
        let at = reconciled_by_other(&mut events, &old, &pod).await;
        from_crash.push(ms(at - crashed_at));
        from_renew.push(ms(at - crashed_at + renewed_ago));
    }
    let lease_ms = ms(lease);
    let summary = |samples: &[f64]| Summary::of(samples).expect("samples");
    let label = "crash -> first reconcile, from last renew";
    report.distribution("crash_from_renew_ms", label, &summary(&from_renew), "ms", Some(lease_ms + 50.0));
    report.distribution("crash_ms", "crash -> first reconcile, from the crash", &summary(&from_crash), "ms", None);

    // Graceful handover -> first reconcile, and where the time goes.
    let mut handover = Vec::new();
    let mut phases: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        let leader = leader_of(&replicas).await;
        let pod = format!("handover-{round}");
        let fresh = Replica::start(&url, &replica(&mut next), timing, sink.clone()).await;
        let stopping = std::mem::replace(&mut replicas[leader], fresh);
        let old = stopping.identity.clone();
        let led: Vec<_> = replicas.iter().map(Replica::led_at).collect();
        let started = Instant::now();
        let (stopped, released) = stopping.stop(|| create_pod(&store, &pod)).await;
        let at = reconciled_by_other(&mut events, &old, &pod).await;
        let mut elected = None;
        for handle in led {
            if handle.is_finished() {
                elected = elected.or(handle.await.ok().flatten());
            } else {
                handle.abort();
            }
        }
        let elected = elected.expect("the new leader reported leading before it reconciled");
        handover.push(ms(at - started));
        for (phase, (from, to)) in
            phases.iter_mut().zip([(started, stopped), (stopped, released), (released, elected), (elected, at)])
        {
            phase.push(ms(to.saturating_duration_since(from)));
        }
    }
    report.distribution("handover_ms", "graceful handover -> first reconcile", &summary(&handover), "ms", Some(50.0));
    for (phase, (key, label)) in phases.iter().zip([
        ("handover_stop_ms", "  old leader's work stopped (drain)"),
        ("handover_release_ms", "  -> Lease released (last checkpoint, release)"),
        ("handover_elect_ms", "  -> new leader elected"),
        ("handover_first_reconcile_ms", "  -> first reconcile (claim checkpoint, reconcile)"),
    ]) {
        report.distribution(key, label, &summary(phase), "ms", None);
    }
    report.extra("lease_ms", json!(lease_ms));
    report.extra("retry_ms", json!(ms(retry)));
    report.note(format!(
        "lease {lease_ms} ms, renew deadline 70 %, retry {} ms; Lease lock and ConfigMap checkpoint on the in-process API server",
        ms(retry)
    ));
    report.note("checkpoint goal: at most one request per renew (retry) period; the Lease renews are shown beside it");
    for replica in replicas {
        replica.crash();
    }
    server.shutdown().await;
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("warm_standby");
    runtime.block_on(run(&mut report));
    report.print();
}
