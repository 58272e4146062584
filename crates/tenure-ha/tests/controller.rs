//! A kube-runtime `Controller` gated by leadership (`GateBuilder::spawn_controller`), with real
//! elections: two or three candidates on one Lease of the project's API server, each with its
//! elector and controller on a runtime of its own, as if they were processes. Every reconcile is
//! recorded with its replica, its term and when it started and ended, so the tests can say who
//! reconciled, under which term, and whether two leaders' reconciles ever overlapped.
#![cfg(feature = "kube")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{replica_runtime, until, Journal, Span, TestServer, PATIENCE};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{watcher, Controller};
use kube::{Api, ResourceExt};
use serde_json::json;
use tenure::{Elector, Leadership, NotLeader, Role, Timing};
use tenure_apiserver::{FaultScope, InjectedFault, Verb};
use tenure_ha::kube_controller::Leading;
use tenure_ha::{Gate, GateHandle};
use tenure_kube::{user_agent, RefusalReason, WriteGate, WriteRefused};
use tokio::sync::watch;

const LEASE: &str = "pods-controller";
/// A drain timeout no test reaches: a stop that depends on it hangs, and the test fails after
/// `PATIENCE` instead of passing slowly.
const FOREVER: Duration = Duration::from_secs(3600);

fn timing() -> Timing {
    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).unwrap()
}

/// One write a reconcile made through its gated client: by which replica, for which Pod, and
/// how it ended (`Err(None)`: an error that was not the gate's).
type Write = (String, String, Result<(), Option<RefusalReason>>);

/// What every replica's reconciler shares: where it records, the switch that holds a reconcile
/// in flight (a Pod labelled `hold=<replica>` waits in that replica until it opens), and the
/// replica's client gated by its elector, through which a Pod labelled `write=true` has a
/// ConfigMap `written-<pod>-<replica>` created.
struct Probe {
    replica: String,
    journal: Journal,
    open: watch::Receiver<bool>,
    writer: kube::Client,
    writes: Arc<Mutex<Vec<Write>>>,
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Leading<Probe>>) -> Result<Action, NotLeader> {
    let term = ctx.check()?;
    let span = ctx.journal.start(&ctx.replica, pod.name_any(), 0, term.0);
    if pod.labels().get("hold") == Some(&ctx.replica) {
        let mut open = ctx.open.clone();
        let _ = open.wait_for(|open| *open).await;
    }
    if pod.labels().get("write").is_some_and(|w| w == "true") {
        let configmaps: Api<ConfigMap> = Api::namespaced(ctx.writer.clone(), "default");
        let name = format!("written-{}-{}", pod.name_any(), ctx.replica);
        let cm =
            ConfigMap { metadata: ObjectMeta { name: Some(name), ..ObjectMeta::default() }, ..ConfigMap::default() };
        let outcome = configmaps.create(&PostParams::default(), &cm).await;
        let outcome = outcome.map(drop).map_err(|e| WriteRefused::find(&e).map(|r| r.reason));
        ctx.writes.lock().unwrap().push((ctx.replica.clone(), pod.name_any(), outcome));
    }
    span.complete();
    Ok(Action::await_change())
}

struct Cluster {
    server: TestServer,
    journal: Journal,
    open: watch::Sender<bool>,
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = TestServer::start().await;
        Cluster { server, journal: Journal::default(), open: watch::channel(false).0, writes: Arc::default() }
    }

    fn create_pod(&self, name: &str, hold: Option<&str>) {
        let labels = match hold {
            Some(replica) => json!({"app": "web", "hold": replica}),
            None => json!({"app": "web"}),
        };
        self.create_pod_labelled(name, labels);
    }

    fn create_pod_labelled(&self, name: &str, labels: serde_json::Value) {
        let pod = json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "registry.example/web:1"}]},
        });
        self.server.create("pods", pod);
    }

    /// The holder the Lease names on the server.
    fn lease_holder(&self) -> Option<String> {
        let lease = self.server.object("leases", LEASE)?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
    }

    /// Starts a replica whose gate drains for `drain` and whose elector waits for its work up to
    /// `elector_drain` before releasing the lock.
    async fn replica(&self, identity: &str, drain: Duration, elector_drain: Duration) -> Replica {
        let runtime = replica_runtime();
        let config = self.server.lock_config("leases", LEASE);
        let (journal, open, writes) = (self.journal.clone(), self.open.subscribe(), self.writes.clone());
        let id = identity.to_owned();
        let (elector, gate) = runtime
            .spawn(async move {
                let lock = config.connect(&id).await.unwrap();
                let client = config.cluster.client(&id).await.unwrap();
                let elector =
                    Elector::builder(&id, lock).timing(timing()).drain_timeout(elector_drain).spawn().unwrap();
                // The reconciler writes through a client of its own (its requests are counted
                // apart), gated by the elector.
                let writer = config.cluster.client(&format!("{id}-writer")).await.unwrap();
                let writer = WriteGate::leader(&elector).client(writer);
                let probe = Arc::new(Probe { replica: id.clone(), journal, open, writer, writes });
                let pods: Api<Pod> = Api::namespaced(client, "default");
                let gate = Gate::builder(&elector).drain_timeout(drain).spawn_controller(
                    move |_tenure| Controller::new(pods.clone(), watcher::Config::default().labels("app=web")),
                    reconcile,
                    |_pod, _error, _ctx| Action::requeue(Duration::from_millis(100)),
                    probe,
                );
                (elector, gate)
            })
            .await
            .unwrap();
        Replica { identity: identity.to_owned(), runtime: Some(runtime), elector: Some(elector), gate: Some(gate) }
    }
}

struct Replica {
    identity: String,
    runtime: Option<tokio::runtime::Runtime>,
    elector: Option<Elector>,
    gate: Option<GateHandle>,
}

impl Replica {
    fn is_leader(&self) -> bool {
        self.elector.as_ref().is_some_and(|e| e.is_leader().is_some())
    }

    /// The client name of this replica's gated writer, as the server counts it.
    fn writer(&self) -> String {
        user_agent(&format!("{}-writer", self.identity))
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.elector.as_ref().unwrap().subscribe()
    }

    /// A graceful stop as on SIGTERM, through the elector only: its tenure ends, the gate stops
    /// the controller, and the lock is released once the controller's work is gone.
    fn stop(&mut self) -> tokio::task::JoinHandle<()> {
        let elector = self.elector.take().unwrap();
        let mut gate = self.gate.take().unwrap();
        self.runtime.as_ref().unwrap().spawn(async move {
            elector.shutdown().await.unwrap();
            gate.stopped().await;
        })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Waits for a replica's graceful stop (its lock released), failing the test if it hangs.
async fn stopped_in_time(stop: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(PATIENCE, stop)
        .await
        .expect("the stop completes without waiting out a drain timeout")
        .unwrap();
}

fn leader_of(replicas: &[Replica]) -> Option<usize> {
    let leaders: Vec<usize> = (0..replicas.len()).filter(|&i| replicas[i].is_leader()).collect();
    assert!(leaders.len() <= 1, "two replicas lead at once: {leaders:?}");
    leaders.first().copied()
}

/// Checks that the reconciles of different terms never overlapped: every span of a term ended
/// before any span of a later term started. Returns the terms in order.
fn assert_terms_never_overlap(spans: &[Span]) -> Vec<u64> {
    let mut terms: Vec<u64> = spans.iter().map(|s| s.term).collect();
    terms.sort();
    terms.dedup();
    for pair in terms.windows(2) {
        let (older, newer) = (pair[0], pair[1]);
        let last_end = spans
            .iter()
            .filter(|s| s.term == older)
            .map(|s| s.ended.expect("every reconcile of an older term has ended"))
            .max()
            .unwrap();
        let first_start = spans.iter().filter(|s| s.term == newer).map(|s| s.started).min().unwrap();
        assert!(last_end <= first_start, "term {newer} started reconciling before term {older} finished: {spans:#?}");
    }
    terms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_each_next_leader_starts_after_the_last_one_finished() {
    let cluster = Cluster::start().await;
    cluster.create_pod("p1", None);
    cluster.create_pod("p2", None);
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b", "replica-c"] {
        replicas.push(cluster.replica(identity, FOREVER, FOREVER).await);
    }

    let mut leaders = Vec::new();
    for round in 0..3 {
        until("a replica leads", || leader_of(&replicas).is_some()).await;
        let leader = leader_of(&replicas).unwrap();
        let identity = replicas[leader].identity.clone();
        until("the leader reconciled every Pod", || cluster.journal.completed_by(&identity) == ["p1", "p2"]).await;
        for (i, replica) in replicas.iter().enumerate() {
            if i != leader && !leaders.contains(&replica.identity) {
                assert!(cluster.journal.by(&replica.identity).is_empty(), "round {round}: a follower reconciled");
            }
        }
        leaders.push(identity);
        stopped_in_time(replicas[leader].stop()).await;
    }

    let spans = cluster.journal.spans();
    assert!(spans.iter().all(|s| s.completed), "no reconcile was aborted: {spans:#?}");
    let terms = assert_terms_never_overlap(&spans);
    assert_eq!(terms.len(), 3, "one term per leader: {spans:#?}");
    // Each term's reconciles were all made by one replica, the leaders in the order they led.
    let by_term: Vec<String> = terms
        .iter()
        .map(|t| {
            let replicas: Vec<&str> = spans.iter().filter(|s| s.term == *t).map(|s| s.replica.as_str()).collect();
            assert!(replicas.iter().all(|r| *r == replicas[0]), "term {t} reconciled by several replicas");
            replicas[0].to_owned()
        })
        .collect();
    assert_eq!(by_term, leaders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_in_flight_when_leadership_ends_finishes_before_the_lock_is_released() {
    let cluster = Cluster::start().await;
    cluster.create_pod("p1", Some("replica-a"));
    let mut a = cluster.replica("replica-a", FOREVER, FOREVER).await;
    until("replica-a leads", || a.is_leader()).await;
    let b = cluster.replica("replica-b", FOREVER, FOREVER).await;
    until("replica-a's reconcile of p1 is in flight", || !cluster.journal.by("replica-a").is_empty()).await;

    let mut leadership = a.leadership();
    let stopping = a.stop();
    leadership.wait_for(|l| l.role != Role::Leader).await.unwrap();
    let ended = Instant::now();
    // Leadership has ended, but the reconcile is still running: the Lease stays with replica-a.
    assert_eq!(cluster.journal.by("replica-a")[0].ended, None, "the reconcile is in flight");
    assert_eq!(cluster.lease_holder().as_deref(), Some("replica-a"));
    assert!(!b.is_leader());

    cluster.open.send_replace(true);
    stopped_in_time(stopping).await;
    until("replica-b reconciled p1", || cluster.journal.completed_by("replica-b") == ["p1"]).await;

    let old = &cluster.journal.by("replica-a")[0];
    let (finished_at, completed) = (old.ended.unwrap(), old.completed);
    assert!(completed, "the in-flight reconcile ran to completion within the drain");
    assert!(finished_at > ended, "it finished after leadership had ended");
    assert_terms_never_overlap(&cluster.journal.spans());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_outlasting_the_drain_timeout_is_aborted_before_the_lock_is_released() {
    let cluster = Cluster::start().await;
    cluster.create_pod("p1", Some("replica-a")); // never finishes in replica-a
    // The gate gives up after 300 ms; the elector would wait for the work's guards forever, so
    // the release shows that the aborted reconcile dropped its context.
    let mut a = cluster.replica("replica-a", Duration::from_millis(300), FOREVER).await;
    until("replica-a leads", || a.is_leader()).await;
    let b = cluster.replica("replica-b", FOREVER, FOREVER).await;
    until("replica-a's reconcile of p1 is in flight", || !cluster.journal.by("replica-a").is_empty()).await;

    stopped_in_time(a.stop()).await;
    until("replica-b reconciled p1", || cluster.journal.completed_by("replica-b") == ["p1"]).await;
    assert!(b.is_leader());
    let old = &cluster.journal.by("replica-a")[0];
    assert!(old.ended.is_some() && !old.completed, "the reconcile was aborted, not completed: {old:?}");
    assert_terms_never_overlap(&cluster.journal.spans());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_when_leadership_ends_is_cancelled_and_the_next_leader_writes() {
    let cluster = Cluster::start().await;
    cluster.create_pod_labelled("p1", json!({"app": "web", "write": "true"}));
    // The server holds replica-a's first write without answering: in flight until cancelled.
    let writer_a = user_agent("replica-a-writer");
    let scope = FaultScope { client: Some(writer_a.clone()), verbs: vec![Verb::Create], times: Some(1) };
    cluster.server.faults().inject(scope, InjectedFault::Hang);
    let mut a = cluster.replica("replica-a", FOREVER, FOREVER).await;
    assert_eq!(a.writer(), writer_a);
    until("replica-a leads", || a.is_leader()).await;
    until("replica-a's write is in flight", || cluster.server.faults().request_count(&writer_a, Verb::Create) == 1)
        .await;
    let b = cluster.replica("replica-b", FOREVER, FOREVER).await;

    // A graceful stop: the reconcile may finish (the drain waits for ever), but its write is
    // dropped the moment the tenure ends, so the stop does not wait on the server.
    stopped_in_time(a.stop()).await;
    until("replica-b wrote for p1", || cluster.writes.lock().unwrap().iter().any(|w| w.0 == "replica-b")).await;

    let writes = cluster.writes.lock().unwrap().clone();
    assert_eq!(
        writes,
        vec![
            ("replica-a".to_owned(), "p1".to_owned(), Err(Some(RefusalReason::Cancelled))),
            ("replica-b".to_owned(), "p1".to_owned(), Ok(())),
        ]
    );
    let writes_of = |client: &str| {
        [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            .iter()
            .map(|verb| cluster.server.faults().request_count(client, *verb))
            .sum::<u64>()
    };
    assert_eq!(writes_of(&writer_a), 1, "replica-a sent only the write it made while leading");
    assert_eq!(writes_of(&b.writer()), 1);
    assert!(cluster.server.object("configmaps", "written-p1-replica-a").is_none());
    assert!(cluster.server.object("configmaps", "written-p1-replica-b").is_some());
    assert_terms_never_overlap(&cluster.journal.spans());
}
