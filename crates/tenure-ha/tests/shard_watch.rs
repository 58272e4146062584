//! Sharded watches (`kube_shard_watch::ShardedWatch` and `kube_labeller::Labeller`) against the
//! project's API server: replicas, each with its own runtime as if they were processes, share 30
//! ConfigMaps created without a partition label; the labeller (leader-gated, in a runtime of its
//! own) labels them, and each replica watches and caches only the objects of the partitions it
//! owns. Every reconcile is recorded (replica, partition, term, start, end), and the log lines of
//! the labeller and of the replicas are captured, so the tests can say what each replica cached,
//! who reconciled what, and why an object was relabelled or skipped.
#![cfg(feature = "kube")]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::shard::{
    key, names, reconciled_by_current_owners, share_the_partitions, ShardReplica, FOREVER, OBJECTS, PARTITIONS,
};
use common::{
    assert_no_overlapping_owners, assert_terms_grow_per_partition, replica_runtime, until, Journal, TestServer,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;
use tenure::{Elector, Timing};
use tenure_group::{Group, GroupConfig, NotOwner};
use tenure_ha::kube_labeller::{Labeller, LabellerCounters};
use tenure_ha::kube_shard::Owning;
use tenure_ha::kube_shard_watch::{ShardedWatch, WatchCounters, PARTITION_LABEL};
use tenure_ha::{Gate, GateHandle};
use tenure_kube::{KubeGroupStore, WriteGate};
use tokio::sync::watch;

/// The partition of a test ConfigMap's key.
fn partition(name: &str) -> u32 {
    tenure_group::assignment::partition_of(key(name).as_bytes(), PARTITIONS)
}

fn timing() -> Timing {
    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).unwrap()
}

/// Every log line of the test's process (INFO and above), captured: the global subscriber writes
/// here (the first test of a process to start a cluster installs it).
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(Mutex::default)
}

struct Capture;

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        logs().lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured log lines that contain every one of `needles`.
fn log_lines_with(needles: &[&str]) -> Vec<String> {
    let logs = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    logs.lines().filter(|line| needles.iter().all(|n| line.contains(n))).map(str::to_owned).collect()
}

struct Probe {
    replica: String,
    journal: Journal,
    hold: watch::Receiver<bool>,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Owning<Probe>>) -> Result<Action, NotOwner> {
    let term = ctx.check()?;
    let span = ctx.journal.start(&ctx.replica, cm.metadata.name.clone().unwrap_or_default(), ctx.partition(), term.0);
    let mut hold = ctx.hold.clone();
    let _ = hold.wait_for(|on| !*on).await;
    span.complete();
    Ok(Action::await_change())
}

struct Cluster {
    server: TestServer,
    journal: Journal,
}

impl Cluster {
    /// The API server with the test's ConfigMaps, none of them labelled with a partition.
    async fn start() -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
        let cluster = Cluster { server: TestServer::start().await, journal: Journal::default() };
        for name in names() {
            let cm = json!({"metadata": {"name": name, "labels": {"app": "shard"}}, "data": {"generation": "0"}});
            cluster.server.create("configmaps", cm);
        }
        cluster
    }

    /// Changes a ConfigMap with `change` (a data or label edit), as another writer would.
    fn edit(&self, name: &str, change: impl FnOnce(&mut serde_json::Value)) {
        self.server.overwrite("configmaps", name, change);
    }

    /// The partition label the server holds for `name`.
    fn label(&self, name: &str) -> Option<String> {
        let cm = self.server.object("configmaps", name)?;
        cm["metadata"]["labels"][PARTITION_LABEL].as_str().map(str::to_owned)
    }

    /// True once every ConfigMap carries its key's partition.
    fn all_labelled(&self) -> bool {
        names().iter().all(|n| self.label(n) == Some(partition(n).to_string()))
    }

    async fn replica(&self, identity: &str) -> Replica {
        let runtime = replica_runtime();
        let config = self.server.lock_config("leases", "unused");
        let (hold, hold_rx) = watch::channel(false);
        let journal = self.journal.clone();
        let id = identity.to_owned();
        let (shard, cache, counters) = runtime
            .spawn(async move {
                let client = config.cluster.client(&id).await.unwrap();
                let store = KubeGroupStore::new(client.clone(), "default", "shard");
                let group = Group::builder(&id, store)
                    .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
                    .drain_timeout(FOREVER)
                    .join()
                    .unwrap();
                let probe = Arc::new(Probe { replica: id.clone(), journal, hold: hold_rx });
                let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
                let watch = ShardedWatch::new(group, configmaps, watcher::Config::default().labels("app=shard"));
                let (cache, counters) = (watch.store(), watch.counters());
                let shard = watch
                    .run(reconcile, |_cm, _error, _ctx| Action::requeue(Duration::from_millis(100)), probe)
                    .unwrap();
                (shard, cache, counters)
            })
            .await
            .unwrap();
        let member = ShardReplica { identity: identity.to_owned(), shard: Some(shard), runtime: Some(runtime) };
        Replica { member, hold, cache, counters }
    }

    /// A labeller in a runtime of its own, elected on the Lease `labeller`.
    async fn labeller(&self, identity: &str) -> LabellerProcess {
        let runtime = replica_runtime();
        let config = self.server.lock_config("leases", "labeller");
        let id = identity.to_owned();
        let (elector, gate, counters) = runtime
            .spawn(async move {
                let lock = config.connect(&id).await.unwrap();
                let elector = Elector::builder(&id, lock).timing(timing()).spawn().unwrap();
                let client = WriteGate::leader(&elector).client(config.cluster.client(&id).await.unwrap());
                let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, "default");
                let labeller = Labeller::new(metadata, watcher::Config::default().labels("app=shard"), PARTITIONS);
                let counters = labeller.counters();
                let gate = labeller.spawn(Gate::builder(&elector));
                (elector, gate, counters)
            })
            .await
            .unwrap();
        LabellerProcess { elector: Some(elector), gate: Some(gate), counters, runtime: Some(runtime) }
    }
}

struct LabellerProcess {
    elector: Option<Elector>,
    gate: Option<GateHandle>,
    counters: Arc<LabellerCounters>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl LabellerProcess {
    /// Stops labelling and releases the Lease (graceful, as on SIGTERM).
    async fn stop(&mut self) {
        let (gate, elector) = (self.gate.take().unwrap(), self.elector.take().unwrap());
        let stopped = self.runtime.as_ref().unwrap().spawn(async move {
            gate.shutdown().await;
            elector.shutdown().await.unwrap();
        });
        stopped.await.unwrap();
    }
}

impl Drop for LabellerProcess {
    fn drop(&mut self) {
        drop((self.gate.take(), self.elector.take()));
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A replica, the switch that holds its reconciles in flight while on, its cache and its watch's
/// counters.
struct Replica {
    member: ShardReplica,
    hold: watch::Sender<bool>,
    cache: Store<ConfigMap>,
    counters: Arc<WatchCounters>,
}

impl Deref for Replica {
    type Target = ShardReplica;

    fn deref(&self) -> &ShardReplica {
        &self.member
    }
}

impl Replica {
    /// The names of the ConfigMaps in this replica's cache.
    fn cached(&self) -> BTreeSet<String> {
        self.cache.state().iter().filter_map(|cm| cm.metadata.name.clone()).collect()
    }
}

/// Waits until `replicas` share the partitions and each caches exactly the objects of its
/// partitions.
async fn shared_and_cached(replicas: &[&Replica]) {
    share_the_partitions(replicas).await;
    until("each replica caches exactly the objects of its partitions", || {
        replicas.iter().all(|r| r.cached() == r.owned_objects())
    })
    .await;
}

/// Waits until `replicas` share the partitions, each caches exactly the objects of its partitions,
/// and every ConfigMap was reconciled by its owner since `since`.
async fn settled(journal: &Journal, replicas: &[&Replica], since: Instant) {
    shared_and_cached(replicas).await;
    until("every ConfigMap is reconciled by its current owner", || {
        reconciled_by_current_owners(journal, replicas, &names(), since)
    })
    .await;
}

/// The replica among `replicas` that owns `name`.
fn owner_of<'a>(replicas: &[&'a Replica], name: &str) -> &'a Replica {
    replicas.iter().copied().find(|r| r.owns(name).is_some()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_watches_and_caches_only_the_objects_of_the_partitions_it_owns() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let labeller = cluster.labeller("labeller-1").await;
    let a = cluster.replica("replica-a").await;
    let b = cluster.replica("replica-b").await;
    let c = cluster.replica("replica-c").await;
    let replicas = [&a, &b, &c];
    settled(&cluster.journal, &replicas, start).await;
    assert!(cluster.all_labelled(), "the labeller labelled every ConfigMap with its key's partition");
    assert!(labeller.counters.patched() >= OBJECTS as u64, "every ConfigMap was created unlabelled");

    let mut cached = BTreeSet::new();
    for replica in replicas {
        let mine = replica.cached();
        assert!(!mine.is_empty(), "{} caches its share", replica.identity);
        assert!(mine.len() < OBJECTS, "{} caches only its share, not all {OBJECTS}: {mine:?}", replica.identity);
        assert!(cached.is_disjoint(&mine), "no object is cached by two replicas");
        cached.extend(mine);
    }
    assert_eq!(cached, names().into_iter().collect(), "together the replicas cache every ConfigMap");

    // A change reaches only the owner's watch, and only the owner reconciles it.
    let events: Vec<u64> = replicas.iter().map(|r| r.counters.events()).collect();
    let touched = Instant::now();
    cluster.edit("cm-00", |cm| cm["data"]["generation"] = json!("1"));
    let owner = owner_of(&replicas, "cm-00");
    until("the owner reconciled the change", || {
        reconciled_by_current_owners(&cluster.journal, &replicas, &["cm-00".into()], touched)
    })
    .await;
    for (replica, before) in replicas.iter().zip(events) {
        let received = replica.counters.events() - before;
        let expected = u64::from(replica.identity == owner.identity);
        assert_eq!(received, expected, "{} received {received} events for a change of cm-00", replica.identity);
    }
    let spans = cluster.journal.spans();
    assert!(spans.iter().filter(|s| s.started >= touched).all(|s| s.replica == owner.identity));
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_moves_objects_between_caches_and_no_object_is_reconciled_by_two_replicas_at_once() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let _labeller = cluster.labeller("labeller-1").await;
    let a = cluster.replica("replica-a").await;
    let b = cluster.replica("replica-b").await;
    settled(&cluster.journal, &[&a, &b], start).await;
    let a_partitions = a.owned_partitions();
    let a_lists = a.counters.lists();
    let b_before = b.owned_objects();

    // Every reconcile of replica-a stays in flight until released.
    let a_objects: Vec<String> = a.owned_objects().into_iter().collect();
    a.hold.send_replace(true);
    let touched = Instant::now();
    for name in &a_objects {
        cluster.edit(name, |cm| cm["data"]["generation"] = json!("1"));
    }
    until("replica-a's reconciles of all its objects are in flight", || {
        let spans = cluster.journal.spans();
        a_objects.iter().all(|n| spans.iter().any(|s| s.replica == "replica-a" && s.name == *n && s.started >= touched))
    })
    .await;

    // replica-c joins: some of replica-a's partitions are revoked, but drain first.
    let joined = Instant::now();
    let c = cluster.replica("replica-c").await;
    until("some of replica-a's partitions are revoked", || a.owned_partitions().len() < a_partitions.len()).await;
    let revoked: BTreeSet<u32> = a_partitions.difference(&a.owned_partitions()).copied().collect();
    let moving: Vec<String> = a_objects.iter().filter(|n| revoked.contains(&partition(n))).cloned().collect();
    assert!(!moving.is_empty(), "the revoked partitions hold some of the ConfigMaps");
    until("replica-a's watch dropped the revoked partitions' objects", || {
        a.cached().iter().all(|n| !moving.contains(n)) && a.counters.lists() > a_lists
    })
    .await;
    for partition in &revoked {
        assert!(c.group().guard(*partition).is_none(), "replica-c took partition {partition} while it drained");
    }
    assert!(
        cluster
            .journal
            .spans()
            .iter()
            .all(|s| !(moving.contains(&s.name) && s.replica != "replica-a" && s.started >= touched)),
        "another replica reconciled a draining object"
    );

    let released = Instant::now();
    a.hold.send_replace(false);
    let replicas = [&a, &b, &c];
    shared_and_cached(&replicas).await;
    let c_objects: Vec<String> = c.owned_objects().into_iter().collect();
    until("replica-c reconciled every object it gained, without any change to them", || {
        reconciled_by_current_owners(&cluster.journal, &replicas, &c_objects, joined)
    })
    .await;
    let spans = cluster.journal.spans();
    for name in &moving {
        let old = spans.iter().find(|s| s.replica == "replica-a" && s.name == *name && s.started >= touched).unwrap();
        assert!(old.ended.unwrap() >= released, "{name}'s reconcile was in flight until released");
        let new = spans.iter().filter(|s| s.replica == "replica-c" && s.name == *name).map(|s| s.started).min();
        assert!(new.unwrap() >= old.ended.unwrap(), "replica-c started on {name} before replica-a's reconcile ended");
        assert!(c.cached().contains(name), "{name} moved into replica-c's cache");
    }
    // What replica-b owned before and after was not reconciled again: its watch's re-list queued
    // only objects of gained partitions or changed ones.
    let b_kept: BTreeSet<String> = b_before.intersection(&b.owned_objects()).cloned().collect();
    assert!(!b_kept.is_empty(), "replica-b kept some of its objects");
    let b_again = spans.iter().filter(|s| s.replica == "replica-b" && s.started >= joined && b_kept.contains(&s.name));
    assert_eq!(b_again.count(), 0, "objects whose partition stayed put are not reconciled again on a join");
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_whose_label_was_removed_or_edited_is_reconciled_by_exactly_its_owner_once_relabelled() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let _labeller = cluster.labeller("labeller-1").await;
    let a = cluster.replica("replica-a").await;
    let b = cluster.replica("replica-b").await;
    let replicas = [&a, &b];
    settled(&cluster.journal, &replicas, start).await;

    // Three ConfigMaps of replica-a: one loses its label, one is labelled with a partition of
    // replica-b, one with a partition out of range; each change is also a change of its data.
    let a_objects: Vec<String> = a.owned_objects().into_iter().collect();
    let [removed, other, out_of_range] = [&a_objects[0], &a_objects[1], &a_objects[2]];
    let b_partition = *b.owned_partitions().first().unwrap();
    let edited = Instant::now();
    cluster.edit(removed, |cm| {
        cm["metadata"]["labels"].as_object_mut().unwrap().remove(PARTITION_LABEL);
        cm["data"]["generation"] = json!("1");
    });
    cluster.edit(other, |cm| {
        cm["metadata"]["labels"][PARTITION_LABEL] = json!(b_partition.to_string());
        cm["data"]["generation"] = json!("1");
    });
    cluster.edit(out_of_range, |cm| {
        cm["metadata"]["labels"][PARTITION_LABEL] = json!("99");
        cm["data"]["generation"] = json!("1");
    });
    let edits = [removed.clone(), other.clone(), out_of_range.clone()];
    until("the labeller restored the labels and the owner reconciled the edits", || {
        cluster.all_labelled() && reconciled_by_current_owners(&cluster.journal, &replicas, &edits, edited)
    })
    .await;

    for (name, why) in [(removed, "is missing"), (other, "names another partition"), (out_of_range, "is out of range")]
    {
        let lines = log_lines_with(&["relabelling the object", &format!("key=\"default/{name}\""), why]);
        assert!(!lines.is_empty(), "the labeller said why it relabelled {name} ({why})");
    }
    let spans = cluster.journal.spans();
    for span in spans.iter().filter(|s| s.started >= edited) {
        assert_eq!(span.replica, "replica-a", "only the owner reconciled after the edits: {span:?}");
    }
    assert_no_overlapping_owners(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_labeller_delays_reconciles_but_never_makes_two_replicas_reconcile_an_object() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let mut labeller = cluster.labeller("labeller-1").await;
    let a = cluster.replica("replica-a").await;
    let b = cluster.replica("replica-b").await;
    let replicas = [&a, &b];
    settled(&cluster.journal, &replicas, start).await;
    labeller.stop().await;

    // While no labeller runs: one of replica-a's ConfigMaps is labelled with a partition of
    // replica-b (and changed), and a new ConfigMap is created without a label.
    let moved = a.owned_objects().into_iter().next().unwrap();
    let b_partition = *b.owned_partitions().first().unwrap();
    let edited = Instant::now();
    cluster.edit(&moved, |cm| {
        cm["metadata"]["labels"][PARTITION_LABEL] = json!(b_partition.to_string());
        cm["data"]["generation"] = json!("1");
    });
    cluster.server.create("configmaps", json!({"metadata": {"name": "cm-new", "labels": {"app": "shard"}}}));

    // replica-b's watch now shows it the mislabelled object: it skips it and says why; replica-a
    // no longer sees it. Nobody sees the unlabelled one.
    until("replica-b skipped the mislabelled object", || b.counters.mislabelled() > 0).await;
    let skipped = log_lines_with(&["replica-b", &format!("key=\"default/{moved}\""), "names another partition"]);
    assert!(!skipped.is_empty(), "replica-b said why it skipped {moved}");
    until("replica-a's cache dropped the mislabelled object", || !a.cached().contains(&moved)).await;
    assert!(replicas.iter().all(|r| !r.cached().contains("cm-new")), "an unlabelled object is in no cache");
    let spans = cluster.journal.spans();
    assert!(
        spans.iter().all(|s| s.started < edited || (s.name != moved && s.name != "cm-new")),
        "nobody reconciled the mislabelled or unlabelled objects while no labeller ran"
    );

    // A labeller again: both are labelled and reconciled, each by its owner alone.
    let restarted = Instant::now();
    let _labeller = cluster.labeller("labeller-2").await;
    let objects = [moved.clone(), "cm-new".to_string()];
    until("both objects are labelled and reconciled by their owners", || {
        reconciled_by_current_owners(&cluster.journal, &replicas, &objects, restarted)
    })
    .await;
    let spans = cluster.journal.spans();
    for name in &objects {
        let owner = owner_of(&replicas, name);
        let reconcilers: BTreeSet<&str> =
            spans.iter().filter(|s| s.name == *name && s.started >= edited).map(|s| s.replica.as_str()).collect();
        assert_eq!(reconcilers, BTreeSet::from([owner.identity.as_str()]), "{name} was reconciled by its owner alone");
    }
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}
