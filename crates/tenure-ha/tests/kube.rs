//! The Kubernetes parts of the HA runtime against the project's API server: checkpoints in a
//! ConfigMap annotation that an old term cannot move back, and gated watches in both standby modes
//! whose new leader learns of a Pod deleted while nobody led. Electors use a Lease lock on the
//! same API server; a crash is the replica's runtime vanishing without a release.
#![cfg(feature = "kube")]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{replica_runtime, until, TestServer as Cluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use tenure::{Elector, Term, Timing};
use tenure_apiserver::{ApiServerConfig, Verb};
use tenure_ha::checkpoint::kube::{KubeCheckpointStore, CHECKPOINT_ANNOTATION};
use tenure_ha::checkpoint::{Checkpoint, CheckpointError, CheckpointStore};
use tenure_ha::gc::{ExternalResource, ExternalResources, GarbageCollector, GcTrigger};
use tenure_ha::kube_watch::{Change, GatedWatch, GatedWatchHandle, Standby, WatchMetrics};
use tenure_kube::resume::{Backoff, ResumeConfig};
use tokio_util::sync::CancellationToken;

const CONTROLLER: &str = "ipam";
const CHECKPOINT: &str = "ipam-checkpoint";

/// A lease long enough that "the leader crashed, nobody leads yet" lasts for the test's deletion.
fn timing() -> Timing {
    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).unwrap()
}

impl Cluster {
    fn create_pod(&self, name: &str) {
        let spec = json!({"containers": [{"name": "main", "image": "registry.example/web:1"}]});
        self.create("pods", json!({"metadata": {"name": name, "labels": {"app": "web"}}, "spec": spec}));
    }

    fn pod_version(&self, name: &str) -> u64 {
        self.object("pods", name).unwrap()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
    }

    fn checkpoint_annotation(&self) -> Option<Value> {
        let object = self.object("configmaps", CHECKPOINT)?;
        let document = object["metadata"]["annotations"][CHECKPOINT_ANNOTATION].as_str()?;
        serde_json::from_str(document).ok()
    }

    /// The resourceVersion of Pods in the stored checkpoint, if any.
    fn checkpointed_pod_version(&self) -> Option<u64> {
        self.checkpoint_annotation()?["resourceVersions"]["pods"].as_str()?.parse().ok()
    }
}

async fn store(cluster: &Cluster, identity: &str) -> Arc<KubeCheckpointStore> {
    Arc::new(KubeCheckpointStore::new(cluster.client(identity).await, "default", CHECKPOINT, CONTROLLER))
}

fn checkpoint_at(version: &str) -> Checkpoint {
    let mut checkpoint = Checkpoint::new(CONTROLLER);
    checkpoint.resource_versions.insert("pods".into(), version.into());
    checkpoint
}

#[tokio::test]
async fn a_paused_old_leader_cannot_move_the_kube_checkpoint_back() {
    let cluster = Cluster::start().await;
    let old = store(&cluster, "old-leader").await;
    let new = store(&cluster, "new-leader").await;
    old.save(Term(1), &checkpoint_at("10")).await.unwrap();
    new.save(Term(2), &checkpoint_at("25")).await.unwrap();

    // The old leader wakes up from its pause and flushes what it had.
    let late = old.save(Term(1), &checkpoint_at("12")).await;
    assert!(
        matches!(late, Err(CheckpointError::Superseded { ours: Term(1), newer: Some(Term(2)) })),
        "the late write must be refused, got {late:?}"
    );
    let stored = new.load().await.unwrap().expect("a checkpoint");
    assert_eq!((stored.term, stored.checkpoint.resource_version("pods")), (Term(2), Some("25")));
    // The newer term itself keeps writing.
    new.save(Term(2), &checkpoint_at("30")).await.unwrap();
    assert_eq!(cluster.checkpointed_pod_version(), Some(30));
}

#[tokio::test]
async fn concurrent_kube_checkpoint_writers_never_let_the_older_term_win() {
    let cluster = Cluster::start().await;
    let old = store(&cluster, "old-leader").await;
    let new = store(&cluster, "new-leader").await;
    old.save(Term(1), &checkpoint_at("1")).await.unwrap();
    for round in 0..20u32 {
        let (older, newer) = (checkpoint_at(&format!("{}", 100 + round)), checkpoint_at(&format!("{}", 200 + round)));
        let (a, b) = tokio::join!(old.save(Term(1), &older), new.save(Term(2), &newer));
        b.unwrap();
        // Once term 2 has written, term 1 never writes again, whichever request came first.
        if round > 0 {
            assert!(a.is_err(), "round {round}: term 1 wrote after term 2");
        }
        assert_eq!(new.load().await.unwrap().unwrap().term, Term(2));
    }
}

#[tokio::test]
async fn a_steady_leader_writes_its_kube_checkpoint_with_one_request_per_save() {
    let cluster = Cluster::start().await;
    let leader = store(&cluster, "leader").await;
    leader.save(Term(1), &checkpoint_at("1")).await.unwrap();
    cluster.server.faults().reset_counts();
    for version in 2..7 {
        leader.save(Term(1), &checkpoint_at(&version.to_string())).await.unwrap();
    }
    let agent = tenure_kube::user_agent("leader");
    let faults = cluster.server.faults();
    assert_eq!((faults.request_count(&agent, Verb::Get), faults.request_count(&agent, Verb::Update)), (0, 5));
    assert_eq!(cluster.checkpointed_pod_version(), Some(6));
}

#[tokio::test]
async fn a_new_leader_claims_the_kube_checkpoint_without_reading_it_twice() {
    let cluster = Cluster::start().await;
    store(&cluster, "old-leader").await.save(Term(1), &checkpoint_at("10")).await.unwrap();
    let new = store(&cluster, "new-leader").await;
    cluster.server.faults().reset_counts();
    // What a takeover does before its first reconcile: load, then claim under the new term.
    let loaded = new.load().await.unwrap().expect("a checkpoint");
    new.save(Term(2), &loaded.checkpoint).await.unwrap();
    let agent = tenure_kube::user_agent("new-leader");
    let faults = cluster.server.faults();
    assert_eq!((faults.request_count(&agent, Verb::Get), faults.request_count(&agent, Verb::Update)), (1, 1));
    assert_eq!(new.load().await.unwrap().map(|s| s.term), Some(Term(2)));
}

#[tokio::test]
async fn bad_kube_checkpoints_are_treated_as_absent() {
    let cluster = Cluster::start().await;
    let store = store(&cluster, "leader").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client("writer").await, "default");
    let put = |document: &str| {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(CHECKPOINT.into());
        object.metadata.annotations = Some([(CHECKPOINT_ANNOTATION.to_owned(), document.to_owned())].into());
        object
    };
    configmaps.create(&Default::default(), &put("{not json")).await.unwrap();
    assert_eq!(store.load().await.unwrap(), None, "a document that does not parse");
    store.save(Term(1), &checkpoint_at("5")).await.expect("an unusable document does not block writing");

    configmaps.delete(CHECKPOINT, &Default::default()).await.unwrap();
    let foreign = r#"{"term":3,"formatVersion":1,"controller":"someone-else","resourceVersions":{"pods":"9"}}"#;
    configmaps.create(&Default::default(), &put(foreign)).await.unwrap();
    assert_eq!(store.load().await.unwrap(), None, "another controller's checkpoint");

    configmaps.delete(CHECKPOINT, &Default::default()).await.unwrap();
    let newer = r#"{"term":9,"formatVersion":99,"controller":"ipam"}"#;
    configmaps.create(&Default::default(), &put(newer)).await.unwrap();
    assert_eq!(store.load().await.unwrap(), None, "a newer format");
    assert!(store.save(Term(8), &checkpoint_at("5")).await.is_err(), "its term still fences older writers");
}

/// What the handlers saw: (replica, change, whether the replica held a valid tenure then).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String, bool)>>>);

impl Seen {
    fn by(&self, replica: &str) -> Vec<String> {
        self.0.lock().unwrap().iter().filter(|(r, _, _)| r == replica).map(|(_, c, _)| c.clone()).collect()
    }
    fn all_while_leading(&self) -> bool {
        self.0.lock().unwrap().iter().all(|(_, _, leading)| *leading)
    }
}

/// A replica as if it were a process: elector and watch on a runtime of its own.
struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    elector: Option<Elector>,
    watch: Option<GatedWatchHandle>,
}

impl Replica {
    async fn start(cluster: &Cluster, identity: &str, standby: Standby, seen: Seen, gc: Option<GcTrigger>) -> Replica {
        Replica::start_with(cluster, identity, standby, seen, gc, WatchMetrics::default()).await
    }

    async fn start_with(
        cluster: &Cluster,
        identity: &str,
        standby: Standby,
        seen: Seen,
        gc: Option<GcTrigger>,
        metrics: WatchMetrics,
    ) -> Replica {
        let runtime = replica_runtime();
        let config = cluster.lock_config("leases", "ipam");
        let id = identity.to_owned();
        let (elector, watch) = runtime
            .spawn(async move {
                let lock = config.connect(&id).await.unwrap();
                let client = config.cluster.client(&id).await.unwrap();
                let elector = Elector::builder(&id, lock).timing(timing()).spawn().unwrap();
                let store = Arc::new(KubeCheckpointStore::new(client.clone(), "default", CHECKPOINT, CONTROLLER));
                let resume = ResumeConfig::default()
                    .labels("app=web")
                    .backoff(Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) });
                let mut watch = GatedWatch::new(Api::<Pod>::namespaced(client, "default"), "pods", store)
                    .config(resume)
                    .standby(standby)
                    .metrics(metrics);
                if let Some(gc) = gc {
                    watch = watch.gc_trigger(gc);
                }
                let handle = watch.run(&elector, move |change, tenure| {
                    let seen = seen.clone();
                    let id = id.clone();
                    async move {
                        let what = match &change {
                            Change::Applied(pod) => format!("applied {}", pod.name_any()),
                            Change::Deleted(pod) => format!("deleted {}", pod.name_any()),
                        };
                        seen.0.lock().unwrap().push((id, what, tenure.check().is_ok()));
                        Ok::<_, std::convert::Infallible>(())
                    }
                });
                (elector, handle)
            })
            .await
            .unwrap();
        Replica { runtime: Some(runtime), elector: Some(elector), watch: Some(watch) }
    }

    fn is_leader(&self) -> bool {
        self.elector.as_ref().is_some_and(|e| e.is_leader().is_some())
    }

    /// SIGKILL: everything stops at once, nothing is released or flushed.
    fn crash(mut self) {
        self.runtime.take().unwrap().shutdown_background();
    }

    /// A graceful stop: the work drains (last checkpoint), then the lock is released.
    async fn stop(mut self) {
        let runtime = self.runtime.take().unwrap();
        let watch = self.watch.take().unwrap();
        let elector = self.elector.take().unwrap();
        runtime
            .spawn(async move {
                watch.shutdown().await;
                elector.shutdown().await.unwrap();
            })
            .await
            .unwrap();
        runtime.shutdown_background();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A leader handles two Pods and checkpoints; it crashes; while nobody leads one Pod is deleted
/// and another created; the standby takes over and handles exactly those two changes.
async fn a_deletion_while_nobody_led_reaches_the_new_leader(standby: Standby) {
    let cluster = Cluster::start().await;
    let seen = Seen::default();
    let a = Replica::start(&cluster, "replica-a", standby, seen.clone(), None).await;
    until("replica-a leads", || a.is_leader()).await;
    let b = Replica::start(&cluster, "replica-b", standby, seen.clone(), None).await;

    cluster.create_pod("p1");
    cluster.create_pod("p2");
    let p2 = cluster.pod_version("p2");
    until("the leader handled both Pods", || seen.by("replica-a").len() == 2).await;
    until("the leader checkpointed past them", || cluster.checkpointed_pod_version() >= Some(p2)).await;
    assert_eq!(seen.by("replica-a"), ["applied p1", "applied p2"]);
    assert!(seen.by("replica-b").is_empty(), "the follower must reconcile nothing");

    a.crash();
    cluster.delete("pods", "p1");
    cluster.create_pod("p3");
    assert!(!b.is_leader(), "the deletion must happen while nobody leads");

    until("replica-b handled the changes made while nobody led", || seen.by("replica-b").len() >= 2).await;
    let mut handled = seen.by("replica-b");
    handled.sort();
    assert_eq!(handled, ["applied p3", "deleted p1"], "exactly what changed since the checkpoint");
    assert!(seen.all_while_leading(), "every reconcile ran under a valid tenure");
    b.stop().await;
}

/// A graceful handover: the old leader writes its last checkpoint and releases; the standby
/// continues from there, handling nothing twice.
async fn a_graceful_handover_hands_nothing_twice(standby: Standby) {
    let cluster = Cluster::start().await;
    let seen = Seen::default();
    let a = Replica::start(&cluster, "replica-a", standby, seen.clone(), None).await;
    until("replica-a leads", || a.is_leader()).await;
    let b = Replica::start(&cluster, "replica-b", standby, seen.clone(), None).await;
    cluster.create_pod("p1");
    until("the leader handled p1", || seen.by("replica-a").len() == 1).await;

    a.stop().await;
    until("replica-b leads", || b.is_leader()).await;
    cluster.create_pod("p2");
    until("replica-b handled p2", || !seen.by("replica-b").is_empty()).await;
    assert_eq!(seen.by("replica-a"), ["applied p1"]);
    assert_eq!(seen.by("replica-b"), ["applied p2"], "p1 was checkpointed by the old leader");
    assert!(seen.all_while_leading());
    b.stop().await;
}

crate::in_both_standby_modes!(
    a_deletion_while_nobody_led_reaches_the_new_leader,
    a_graceful_handover_hands_nothing_twice,
);

/// External resources that count how often the collector listed them (one list per pass).
#[derive(Clone, Default)]
struct CountingResources(Arc<Mutex<u32>>);

#[async_trait]
impl ExternalResources for CountingResources {
    async fn list(&self) -> Result<Vec<ExternalResource>, String> {
        *self.0.lock().unwrap() += 1;
        Ok(Vec::new())
    }
    async fn delete(&self, _id: &str, _term: Term) -> Result<(), String> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_standby_resume_past_the_event_window_relists_counts_and_collects_garbage() {
    let cluster = Cluster::start_with(ApiServerConfig { event_log_capacity: 8, ..ApiServerConfig::default() }).await;
    let seen = Seen::default();
    let a = Replica::start(&cluster, "replica-a", Standby::Cold, seen.clone(), None).await;
    until("replica-a leads", || a.is_leader()).await;
    cluster.create_pod("p1");
    let p1 = cluster.pod_version("p1");
    until("the leader checkpointed p1", || cluster.checkpointed_pod_version() >= Some(p1)).await;
    a.crash();
    // More changes than the server keeps: the checkpoint falls out of its window.
    cluster.delete("pods", "p1");
    for i in 0..20 {
        cluster.create_pod(&format!("q{i}"));
    }

    let resources = CountingResources::default();
    let collector = Arc::new(GarbageCollector::builder(resources.clone(), HashSet::new).build());
    let metrics = WatchMetrics::default();
    let b = Replica::start_with(
        &cluster,
        "replica-b",
        Standby::Cold,
        seen.clone(),
        Some(collector.trigger()),
        metrics.clone(),
    )
    .await;
    until("replica-b handled the relisted Pods", || seen.by("replica-b").len() == 20).await;
    assert_eq!(metrics.resume_failures.get(), 1, "the failed resume is counted once");
    assert!(!seen.by("replica-b").contains(&"deleted p1".to_owned()), "a relist cannot report the deletion");

    // The trigger asked for a pass: a collector that starts now runs its first pass and, at once,
    // the requested one (its period is an hour).
    let tenure = b.elector.as_ref().and_then(Elector::tenure).expect("replica-b leads");
    let cancel = CancellationToken::new();
    let gc = tokio::spawn({
        let (collector, cancel) = (collector.clone(), cancel.clone());
        async move { collector.run(&tenure, &cancel, Duration::from_secs(3600)).await }
    });
    until("the triggered pass ran", || *resources.0.lock().unwrap() >= 2).await;
    cancel.cancel();
    gc.await.unwrap();
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_standby_with_an_unusable_checkpoint_relists_everything() {
    let cluster = Cluster::start().await;
    let configmap = json!({
        "metadata": {"name": CHECKPOINT, "annotations": {CHECKPOINT_ANNOTATION: "{\"term\": 1, garbage"}},
    });
    cluster.create("configmaps", configmap);
    cluster.create_pod("p1");
    cluster.create_pod("p2");

    let seen = Seen::default();
    let metrics = WatchMetrics::default();
    let a = Replica::start_with(&cluster, "replica-a", Standby::Cold, seen.clone(), None, metrics.clone()).await;
    until("the leader handled every Pod", || seen.by("replica-a").len() == 2).await;
    let mut handled = seen.by("replica-a");
    handled.sort();
    assert_eq!(handled, ["applied p1", "applied p2"]);
    assert_eq!(metrics.resume_failures.get(), 0, "an unusable checkpoint is absent, not a failed resume");
    until("the leader replaced it with a usable one", || cluster.checkpointed_pod_version().is_some()).await;
    a.stop().await;
}
