//! `GatedWatch` as a controller author uses it (issue 18): a handler that fails has its change
//! retried while the checkpoint waits before it, and a watch that includes its own checkpoint
//! object does not feed on its own writes. Everything comes from `tenure-ha`'s root re-exports,
//! as a controller that depends on `tenure-ha` alone would name it. Against the project's API
//! server, with a Lease lock on the same server; requests are counted per client (user agent).
#![cfg(feature = "kube")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{until, TestServer as Cluster};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tenure::{Elector, Tenure, Term, Timing};
use tenure_apiserver::resources::{find_resource_type, ResourceType};
use tenure_apiserver::{ApiServerConfig, Verb};
use tenure_ha::tenure_kube::resume::Backoff;
use tenure_ha::{
    Change, GatedWatch, GatedWatchHandle, KubeCheckpointStore, KubeLockConfig, ResumeConfig, Standby, WatchMetrics,
};

const CHECKPOINT: &str = "controller-checkpoint";

/// Renews every 100 ms: the checkpoint's flush period too.
fn timing() -> Timing {
    Timing::new(Duration::from_secs(2), Duration::from_millis(1500), Duration::from_millis(100)).unwrap()
}

fn configmaps() -> &'static ResourceType {
    find_resource_type("", "v1", "configmaps").unwrap()
}

impl Cluster {
    /// Without bookmarks: a bookmark carries the server's newest version, which the Lease renews
    /// move, so each one may (deliberately) advance a quiet checkpoint; these tests count the
    /// writes that changes cause.
    async fn without_bookmarks() -> Cluster {
        Cluster::start_with(ApiServerConfig { bookmark_interval: Duration::ZERO, ..ApiServerConfig::default() }).await
    }

    fn create_configmap(&self, name: &str) -> u64 {
        let object = json!({"metadata": {"name": name}, "data": {"key": "value"}});
        let created = self.server.store().create(configmaps(), "default", object).unwrap();
        created["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }

    /// The ConfigMaps' version in the stored checkpoint.
    fn checkpointed(&self) -> Option<u64> {
        let object = self.object("configmaps", CHECKPOINT)?;
        let document =
            object["metadata"]["annotations"][tenure_ha::checkpoint::kube::CHECKPOINT_ANNOTATION].as_str()?;
        let document: Value = serde_json::from_str(document).ok()?;
        document["resourceVersions"]["configmaps"].as_str()?.parse().ok()
    }

    /// Writes of the checkpoint store of `replica` (it has a client of its own).
    fn checkpoint_writes(&self, replica: &str) -> u64 {
        let agent = format!("{replica}-checkpoint");
        [Verb::Create, Verb::Update, Verb::Patch].into_iter().map(|verb| self.requests(&agent, verb)).sum()
    }

    /// Lease renews of `replica`'s elector (each one an update of the Lease).
    fn renews(&self, replica: &str) -> u64 {
        self.requests(replica, Verb::Update)
    }
}

/// What the handlers did, and which objects fail on which replica.
#[derive(Clone, Default)]
struct Script(Arc<Mutex<ScriptState>>);

#[derive(Default)]
struct ScriptState {
    /// Every call: (replica, "applied NAME" / "deleted NAME", succeeded).
    calls: Vec<(String, String, bool)>,
    /// (replica, object name) pairs whose handling fails with a conflict.
    failing: Vec<(String, String)>,
    /// (replica, object name) pairs whose next call waits until its tenure ends, then returns
    /// `Ok` with no effect: deposed, as the README's handler once returned.
    held: Vec<(String, String)>,
}

impl Script {
    fn fail(&self, replica: &str, name: &str) {
        self.0.lock().unwrap().failing.push((replica.into(), name.into()));
    }

    fn hold(&self, replica: &str, name: &str) {
        self.0.lock().unwrap().held.push((replica.into(), name.into()));
    }

    fn heal(&self) {
        self.0.lock().unwrap().failing.clear();
    }

    /// The changes `replica` handled successfully, in order.
    fn handled_by(&self, replica: &str) -> Vec<String> {
        let state = self.0.lock().unwrap();
        state.calls.iter().filter(|(r, _, ok)| r == replica && *ok).map(|(_, c, _)| c.clone()).collect()
    }

    /// How often `replica`'s handler failed on `change`.
    fn failures(&self, replica: &str, change: &str) -> usize {
        let state = self.0.lock().unwrap();
        state.calls.iter().filter(|(r, c, ok)| r == replica && c == change && !*ok).count()
    }

    fn calls_by(&self, replica: &str) -> usize {
        self.0.lock().unwrap().calls.iter().filter(|(r, _, _)| r == replica).count()
    }

    fn saw(&self, name: &str) -> bool {
        self.0.lock().unwrap().calls.iter().any(|(_, c, _)| c.ends_with(&format!(" {name}")))
    }

    /// The handler a controller author writes: `Err` when its write would have failed.
    async fn handle(self, replica: String, change: Change<ConfigMap>, tenure: Tenure) -> Result<(), String> {
        let name = change.object().name_any();
        let what = match &change {
            Change::Applied(_) => format!("applied {name}"),
            Change::Deleted(_) => format!("deleted {name}"),
        };
        let held = {
            let mut state = self.0.lock().unwrap();
            let held = state.held.iter().position(|(r, n)| *r == replica && *n == name);
            held.map(|at| state.held.remove(at)).is_some()
        };
        if held {
            self.0.lock().unwrap().calls.push((replica, format!("{what} (held)"), false));
            tenure.ended().await;
            return Ok(()); // deposed: nothing done
        }
        let mut state = self.0.lock().unwrap();
        let fails = state.failing.iter().any(|(r, n)| *r == replica && *n == name);
        state.calls.push((replica, what.clone(), !fails));
        if fails {
            return Err(format!("{what}: 409 Conflict (injected)"));
        }
        Ok(())
    }
}

/// A replica: an elector on the Lease and a gated watch of every ConfigMap of the checkpoint's
/// namespace (no selector), so the checkpoint object is among the watched ones.
struct Replica {
    elector: Option<Elector>,
    watch: Option<GatedWatchHandle>,
}

impl Replica {
    async fn start(
        cluster: &Cluster,
        identity: &str,
        standby: Standby,
        script: &Script,
        metrics: WatchMetrics,
    ) -> Replica {
        let config: KubeLockConfig = cluster.lock_config("leases", "controller");
        let lock = config.connect(identity).await.unwrap();
        let elector = Elector::builder(identity, lock).timing(timing()).spawn().unwrap();
        let watch_client = config.cluster.client(&format!("{identity}-watch")).await.unwrap();
        let store_client = config.cluster.client(&format!("{identity}-checkpoint")).await.unwrap();
        let store = Arc::new(KubeCheckpointStore::new(store_client, "default", CHECKPOINT, "controller"));
        let resume = ResumeConfig::default()
            .backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) });
        let (script, id) = (script.clone(), identity.to_owned());
        let watch = GatedWatch::new(Api::<ConfigMap>::namespaced(watch_client, "default"), "configmaps", store)
            .config(resume)
            .standby(standby)
            .metrics(metrics)
            .retry_backoff(Duration::from_millis(20), Duration::from_millis(100))
            .run(&elector, move |change, tenure| script.clone().handle(id.clone(), change, tenure));
        Replica { elector: Some(elector), watch: Some(watch) }
    }

    fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    fn term(&self) -> Option<Term> {
        self.elector.as_ref().and_then(|e| e.is_leader())
    }

    /// A graceful stop: the work drains (last checkpoint), then the lock is released.
    async fn stop(mut self) {
        self.watch.take().unwrap().shutdown().await;
        self.elector.take().unwrap().shutdown().await.unwrap();
    }
}

/// Issue 18.2: with the checkpoint among the watched objects, each checkpoint write came back as a
/// change that moved the checkpoint: one write per renew period forever.
async fn a_watch_that_includes_its_checkpoint_writes_nothing_while_nothing_changes(standby: Standby) {
    let cluster = Cluster::without_bookmarks().await;
    let script = Script::default();
    let a = Replica::start(&cluster, "replica-a", standby, &script, WatchMetrics::default()).await;
    until("replica-a leads", || a.is_leader()).await;
    let version = cluster.create_configmap("cm-1");
    until("the leader handled cm-1", || script.handled_by("replica-a").contains(&"applied cm-1".to_owned())).await;
    until("the leader checkpointed past cm-1", || cluster.checkpointed() >= Some(version)).await;

    // Nothing changes from here on: over five renew periods (five flush periods), no write.
    let (writes, renews) = (cluster.checkpoint_writes("replica-a"), cluster.renews("replica-a"));
    until("the elector renewed five more times", || cluster.renews("replica-a") >= renews + 5).await;
    assert_eq!(cluster.checkpoint_writes("replica-a") - writes, 0, "checkpoint writes while nothing changed");
    assert!(!script.saw(CHECKPOINT), "the handler must never see the checkpoint's own object");
    assert!(a.is_leader());
    a.stop().await;
}

/// Issue 18.1: a failing change is retried with back-off, changes of other objects go on, and the
/// checkpoint stays before the failing change until it succeeds.
async fn a_failing_change_is_retried_and_holds_the_checkpoint_while_others_proceed(standby: Standby) {
    let cluster = Cluster::without_bookmarks().await;
    let script = Script::default();
    let metrics = WatchMetrics::default();
    let a = Replica::start(&cluster, "replica-a", standby, &script, metrics.clone()).await;
    until("replica-a leads", || a.is_leader()).await;
    let before = cluster.create_configmap("cm-0");
    until("the leader checkpointed past cm-0", || cluster.checkpointed() >= Some(before)).await;

    script.fail("replica-a", "cm-bad");
    let bad = cluster.create_configmap("cm-bad");
    let good = cluster.create_configmap("cm-good");
    until("cm-good was handled", || script.handled_by("replica-a").contains(&"applied cm-good".to_owned())).await;
    until("cm-bad failed three times", || script.failures("replica-a", "applied cm-bad") >= 3).await;
    // Several flush periods pass while cm-bad keeps failing: the checkpoint stays before it.
    let renews = cluster.renews("replica-a");
    until("the elector renewed three more times", || cluster.renews("replica-a") >= renews + 3).await;
    let held = cluster.checkpointed();
    assert!(held >= Some(before) && held < Some(bad), "checkpoint {held:?} must stay before cm-bad ({bad})");
    assert!(metrics.handler_failures.get() >= 3, "failures counted");
    assert!(metrics.retries.get() >= 2, "retries counted");
    assert_eq!(metrics.retry_pending.get(), 1, "one object waits for a retry");

    script.heal();
    until("cm-bad was handled on retry", || script.handled_by("replica-a").contains(&"applied cm-bad".to_owned()))
        .await;
    until("the checkpoint moved past both", || cluster.checkpointed() >= Some(good)).await;
    let handled = script.handled_by("replica-a");
    let position = |change: &str| handled.iter().position(|c| c == change).unwrap();
    assert!(position("applied cm-good") < position("applied cm-bad"), "cm-good did not wait for cm-bad: {handled:?}");
    assert_eq!(metrics.retry_pending.get(), 0);
    a.stop().await;
}

/// Retries stop with the tenure; the next leader resumes before the failing change and handles it.
async fn a_change_still_failing_when_leadership_ends_reaches_the_next_leader(standby: Standby) {
    let cluster = Cluster::without_bookmarks().await;
    let script = Script::default();
    let a = Replica::start(&cluster, "replica-a", standby, &script, WatchMetrics::default()).await;
    until("replica-a leads", || a.is_leader()).await;
    let b = Replica::start(&cluster, "replica-b", standby, &script, WatchMetrics::default()).await;
    let before = cluster.create_configmap("cm-0");
    until("the leader checkpointed past cm-0", || cluster.checkpointed() >= Some(before)).await;

    script.fail("replica-a", "cm-bad");
    let bad = cluster.create_configmap("cm-bad");
    until("cm-bad failed twice on replica-a", || script.failures("replica-a", "applied cm-bad") >= 2).await;
    a.stop().await;
    let calls_of_a = script.calls_by("replica-a");
    assert!(cluster.checkpointed() < Some(bad), "the last checkpoint stays before cm-bad");

    until("replica-b leads", || b.is_leader()).await;
    until("replica-b handled cm-bad", || script.handled_by("replica-b").contains(&"applied cm-bad".to_owned())).await;
    until("the checkpoint moved past cm-bad", || cluster.checkpointed() >= Some(bad)).await;
    assert!(!script.handled_by("replica-b").contains(&"applied cm-0".to_owned()), "cm-0 was checkpointed");
    assert_eq!(script.calls_by("replica-a"), calls_of_a, "retries stopped with replica-a's tenure");
    b.stop().await;
}

/// Issue 30: the handler of a change is in flight when the Lease is deleted; the same replica
/// leads again at once (it is the only one). The handler returns `Ok` when deposed, or is aborted
/// first: either way the change must be handled under the new term, and no checkpoint may pass it
/// meanwhile. Before the fix a warm replica never handled it again and checkpointed past it.
async fn a_change_in_flight_when_the_lease_is_deleted_is_handled_when_the_same_replica_leads_again(standby: Standby) {
    let cluster = Cluster::without_bookmarks().await;
    let script = Script::default();
    let a = Replica::start(&cluster, "replica-a", standby, &script, WatchMetrics::default()).await;
    until("replica-a leads", || a.is_leader()).await;
    let before = cluster.create_configmap("cm-0");
    until("the leader checkpointed past cm-0", || cluster.checkpointed() >= Some(before)).await;
    let first = a.term().expect("leads");

    script.hold("replica-a", "cm-slow");
    let slow = cluster.create_configmap("cm-slow");
    let in_flight = || script.0.lock().unwrap().calls.iter().any(|(_, c, _)| c == "applied cm-slow (held)");
    until("the handler of cm-slow is in flight", in_flight).await;
    cluster.delete("leases", "controller");
    until("replica-a leads again under a new term", || a.term().is_some_and(|term| term > first)).await;
    until("replica-a handled cm-slow", || script.handled_by("replica-a").contains(&"applied cm-slow".to_owned())).await;
    until("the checkpoint moved past cm-slow", || cluster.checkpointed() >= Some(slow)).await;
    a.stop().await;
}

crate::in_both_standby_modes!(
    a_change_in_flight_when_the_lease_is_deleted_is_handled_when_the_same_replica_leads_again,
    a_watch_that_includes_its_checkpoint_writes_nothing_while_nothing_changes,
    a_failing_change_is_retried_and_holds_the_checkpoint_while_others_proceed,
    a_change_still_failing_when_leadership_ends_reaches_the_next_leader,
);
