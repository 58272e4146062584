//! A reconcile or a watch handler that never returns makes its replica give way (issue 35,
//! invariant G1): two replicas on one Lease of the project's API server, one whose reconciles (or
//! handler calls) hang, the other healthy. With `stuck_after`, the stuck replica resigns and the
//! healthy one leads and does the work, within the bound + one lease + a margin for a loaded
//! machine. Waits are on events (what the replicas did, in order; leadership snapshots), bounded.
#![cfg(feature = "kube")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, PATIENCE};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::runtime::controller::Action;
use kube::runtime::{watcher, Controller};
use kube::{Api, ResourceExt};
use serde_json::json;
use tenure::{Elector, NotLeader, Role, Tenure, Timing};
use tenure_ha::checkpoint::memory::MemoryCheckpointStore;
use tenure_ha::kube_controller::Leading;
use tenure_ha::{Change, Gate, GateError, GateHandle, GatedWatch, GatedWatchHandle};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

/// 4 s lease, 3 s renew deadline (the gate's and the elector's drain timeout), 200 ms renews.
fn timing() -> Timing {
    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).unwrap()
}

const LEASE: Duration = Duration::from_secs(4);
const STUCK_AFTER: Duration = Duration::from_secs(1);
/// Over the bound and one lease: the API server's answers and the scheduling of two shared cores.
const MARGIN: Duration = Duration::from_secs(1);

/// What the replicas did, in order, with the instant of each entry.
#[derive(Clone)]
struct Events(mpsc::UnboundedSender<(String, Instant)>);

/// The receiving end: reads the entries as they come.
struct Seen {
    events: mpsc::UnboundedReceiver<(String, Instant)>,
    entries: Vec<String>,
}

impl Events {
    fn new() -> (Events, Seen) {
        let (sender, events) = mpsc::unbounded_channel();
        (Events(sender), Seen { events, entries: Vec::new() })
    }

    fn log(&self, entry: String) {
        let _ = self.0.send((entry, Instant::now()));
    }
}

impl Seen {
    /// Reads entries until `entry` (up to `PATIENCE`); returns when it was logged.
    async fn until(&mut self, entry: &str) -> Instant {
        loop {
            let next = timeout(PATIENCE, self.events.recv()).await;
            let (seen, at) = next
                .unwrap_or_else(|_| panic!("{entry:?} not logged within {PATIENCE:?}: {:?}", self.entries))
                .expect("a replica holds the sender");
            self.entries.push(seen.clone());
            if seen == entry {
                return at;
            }
        }
    }

    /// Every entry logged so far.
    fn all(&mut self) -> &[String] {
        while let Ok((seen, _)) = self.events.try_recv() {
            self.entries.push(seen);
        }
        &self.entries
    }
}

/// replica-a's work on `object` hung; checks that it gave way and replica-b did the work, within
/// the bound + one lease + the margin.
async fn assert_gave_way(seen: &mut Seen, object: &str, a: &Elector, b: &Elector) {
    let started = seen.until(&format!("replica-a started {object}")).await;
    let done = seen.until(&format!("replica-b finished {object}")).await;
    let took = done - started;
    assert!(took >= STUCK_AFTER, "gave way before the work was stuck: {took:?}");
    assert!(took <= STUCK_AFTER + LEASE + MARGIN, "replica-b did the work only {took:?} after replica-a's hung");
    assert!(b.is_leader().is_some());
    // replica-a publishes its role after its release write, which replica-b may have seen first.
    let follows = timeout(PATIENCE, a.subscribe().wait_for(|l| l.role == Role::Follower)).await.map(|r| r.is_ok());
    assert_eq!(follows, Ok(true), "replica-a stays a candidate (L3): {:?}", a.leadership());
    let finished = format!("replica-a finished {object}");
    assert!(!seen.all().contains(&finished), "{:?}", seen.all());
}

/// The work of `replica` on one object: `replica-a`'s never returns, the others' return at once.
async fn work(replica: &str, name: String, events: &Events) {
    events.log(format!("{replica} started {name}"));
    if replica == "replica-a" {
        std::future::pending::<()>().await;
    }
    events.log(format!("{replica} finished {name}"));
}

async fn elector(server: &TestServer, identity: &str) -> Elector {
    let lock = server.lock_config("leases", "give-way").connect(identity).await.unwrap();
    Elector::builder(identity, lock).timing(timing()).spawn().unwrap()
}

async fn leads(elector: &Elector) {
    timeout(PATIENCE, elector.subscribe().wait_for(|l| l.role == Role::Leader))
        .await
        .expect("leads in time")
        .expect("elector running");
}

struct Probe {
    replica: String,
    events: Events,
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Leading<Probe>>) -> Result<Action, NotLeader> {
    ctx.check()?;
    work(&ctx.replica, pod.name_any(), &ctx.events).await;
    Ok(Action::await_change())
}

/// A `Controller` of the Pods, gated by `elector`, giving way after [`STUCK_AFTER`].
async fn controller(server: &TestServer, elector: &Elector, events: &Events) -> Result<GateHandle, GateError> {
    let identity = elector.identity().to_owned();
    let pods: Api<Pod> = Api::namespaced(server.client(&identity).await, "default");
    let probe = Arc::new(Probe { replica: identity, events: events.clone() });
    Ok(Gate::builder(elector).stuck_after(STUCK_AFTER)?.spawn_controller(
        move |_tenure| Controller::new(pods.clone(), watcher::Config::default()),
        reconcile,
        |_pod, _error, _ctx| Action::requeue(Duration::from_millis(100)),
        probe,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_never_returns_gives_way_to_another_replica() {
    let server = TestServer::start().await;
    let pod = json!({
        "metadata": {"name": "p1"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/web:1"}]},
    });
    server.create("pods", pod);
    let (events, mut seen) = Events::new();
    let a = elector(&server, "replica-a").await;
    let gate_a = controller(&server, &a, &events).await.expect("a valid bound");
    leads(&a).await;
    let b = elector(&server, "replica-b").await;
    let _gate_b = controller(&server, &b, &events).await.expect("a valid bound");
    assert_gave_way(&mut seen, "p1", &a, &b).await;
    assert_eq!(gate_a.metrics().stops_for("stuck"), 1);
}

/// A cold-standby gated watch of the ConfigMaps, checkpointing into the replicas' shared store,
/// giving way after [`STUCK_AFTER`].
async fn gated_watch(
    server: &TestServer,
    elector: &Elector,
    events: &Events,
    checkpoints: &Arc<MemoryCheckpointStore>,
) -> Result<GatedWatchHandle, GateError> {
    let identity = elector.identity().to_owned();
    let configmaps: Api<ConfigMap> = Api::namespaced(server.client(&identity).await, "default");
    let events = events.clone();
    let watch = GatedWatch::new(configmaps, "configmaps", checkpoints.clone()).stuck_after(STUCK_AFTER, elector)?;
    Ok(watch.run(elector, move |change: Change<ConfigMap>, tenure: Tenure| {
        let (events, identity) = (events.clone(), identity.clone());
        async move {
            tenure.check()?;
            work(&identity, change.object().name_any(), &events).await;
            Ok::<_, NotLeader>(())
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_handler_that_never_returns_gives_way_to_another_replica() {
    let server = TestServer::start().await;
    server.create("configmaps", json!({"metadata": {"name": "c1"}, "data": {"key": "value"}}));
    let (events, mut seen) = Events::new();
    let checkpoints = Arc::new(MemoryCheckpointStore::new("give-way"));
    let a = elector(&server, "replica-a").await;
    let watch_a = gated_watch(&server, &a, &events, &checkpoints).await.expect("a valid bound");
    leads(&a).await;
    let b = elector(&server, "replica-b").await;
    let _watch_b = gated_watch(&server, &b, &events, &checkpoints).await.expect("a valid bound");
    assert_gave_way(&mut seen, "c1", &a, &b).await;
    assert_eq!(watch_a.gate().metrics().stops_for("stuck"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_bound_below_the_renew_period_is_refused_before_the_watch_runs() {
    let server = TestServer::start().await;
    let a = elector(&server, "replica-a").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(server.client("replica-a").await, "default");
    let short = Duration::from_millis(100);
    let refused = GatedWatch::new(configmaps, "configmaps", Arc::new(MemoryCheckpointStore::new("give-way")))
        .stuck_after(short, &a)
        .map(drop);
    let renew_period = timing().retry_period;
    assert_eq!(refused, Err(GateError::StuckAfterTooShort { stuck_after: short, renew_period }));
}
