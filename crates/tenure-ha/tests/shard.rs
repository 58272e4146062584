//! A kube-runtime `Controller` on every replica, sharded by a `tenure_group::Group`
//! (`kube_shard::shard_controller`), against the project's API server with real watches: three
//! replicas, each with its own runtime as if they were processes, share 30 ConfigMaps, and their
//! group lives on the same API server (tenure-kube's `KubeGroupStore`: a Lease per member and a
//! ConfigMap for the partition table). Every
//! reconcile is recorded with its replica, partition, term and when it started and ended, so the
//! tests can say who reconciled what under which term, and whether two replicas ever worked on one
//! partition at overlapping times.
#![cfg(feature = "kube")]

mod common;

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::shard::{
    key, names, reconciled_by_current_owners, share_the_partitions, ShardReplica, FOREVER, PARTITIONS,
};
use common::{
    assert_no_overlapping_owners, assert_terms_grow_per_partition, replica_runtime, until, Journal, TestServer,
    PATIENCE,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{watcher, Controller};
use kube::Api;
use serde_json::json;
use tenure::Timing;
use tenure_apiserver::Verb;
use tenure_group::{Group, GroupConfig, NotOwner};
use tenure_ha::kube_shard::{shard_controller, Owning};
use tenure_kube::write_gate::object_key as key_of;
use tenure_kube::{user_agent, KubeGroupStore, RefusalReason, WriteGate, WriteRefused};
use tokio::sync::watch;

/// What one replica's reconciler shares: where it records, the switch that holds its reconciles
/// in flight while on, the requeue interval it asks for (none: wait for a change), and, for a
/// writing replica, its client gated by its membership: each reconcile then creates a ConfigMap
/// `written-<name>-g<generation>-<replica>`, keyed by the reconciled ConfigMap.
struct Probe {
    replica: String,
    journal: Journal,
    hold: watch::Receiver<bool>,
    requeue: Option<Duration>,
    policy_calls: Arc<Mutex<Vec<PolicyCall>>>,
    writer: Option<kube::Client>,
    writes: Arc<Mutex<Vec<Write>>>,
}

/// One write a reconcile made through its gated client: replica, reconciled ConfigMap,
/// generation, and how it ended (`Err(None)`: an error that was not the gate's).
type Write = (String, String, String, Result<(), Option<RefusalReason>>);

/// The key of a written ConfigMap: the one its reconcile was for (`written-<name>-g...`).
fn key_of_written(target: &tenure_kube::WriteTarget<'_>) -> Option<String> {
    let rest = target.name()?.strip_prefix("written-")?;
    Some(key_of(target.namespace(), &rest[..rest.find("-g")?]))
}

/// Why the test's reconcile fails: the partition moved, or the ConfigMap asks it to fail.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    NotOwner(#[from] NotOwner),
    #[error("the ConfigMap asks to fail")]
    Asked,
}

/// One call of the error policy: by which replica, for which object, whether the ConfigMap had
/// asked to fail (not: the reconcile found its partition gone), and the term its context's guard
/// still allowed work under (None: the guard was no longer valid).
#[derive(Debug, Clone, PartialEq)]
struct PolicyCall {
    replica: String,
    name: String,
    asked: bool,
    valid_term: Option<u64>,
}

fn error_policy(cm: Arc<ConfigMap>, error: &Failure, ctx: Arc<Owning<Probe>>) -> Action {
    ctx.policy_calls.lock().unwrap().push(PolicyCall {
        replica: ctx.replica.clone(),
        name: cm.metadata.name.clone().unwrap_or_default(),
        asked: matches!(error, Failure::Asked),
        valid_term: ctx.check().ok().map(|t| t.0),
    });
    Action::requeue(Duration::from_millis(100))
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Owning<Probe>>) -> Result<Action, Failure> {
    let term = ctx.check()?;
    let asks_to_fail = cm.data.as_ref().and_then(|d| d.get("fail")).is_some_and(|f| f == "true");
    let span = ctx.journal.start(&ctx.replica, cm.metadata.name.clone().unwrap_or_default(), ctx.partition(), term.0);
    let mut hold = ctx.hold.clone();
    let _ = hold.wait_for(|on| !*on).await;
    if let Some(writer) = &ctx.writer {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let generation = cm.data.as_ref().and_then(|d| d.get("generation")).cloned().unwrap_or_default();
        let written = format!("written-{name}-g{generation}-{}", ctx.replica);
        let configmaps: Api<ConfigMap> = Api::namespaced(writer.clone(), "default");
        let object =
            ConfigMap { metadata: ObjectMeta { name: Some(written), ..ObjectMeta::default() }, ..ConfigMap::default() };
        let outcome = configmaps.create(&PostParams::default(), &object).await;
        let outcome = outcome.map(drop).map_err(|e| WriteRefused::find(&e).map(|r| r.reason));
        ctx.writes.lock().unwrap().push((ctx.replica.clone(), name, generation, outcome));
    }
    span.complete();
    if asks_to_fail {
        return Err(Failure::Asked);
    }
    Ok(ctx.requeue.map_or_else(Action::await_change, Action::requeue))
}

struct Cluster {
    server: TestServer,
    journal: Journal,
    policy_calls: Arc<Mutex<Vec<PolicyCall>>>,
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = TestServer::start().await;
        let cluster =
            Cluster { server, journal: Journal::default(), policy_calls: Arc::default(), writes: Arc::default() };
        for name in names() {
            let cm = json!({"metadata": {"name": name, "labels": {"app": "shard"}}, "data": {"generation": "0"}});
            cluster.server.create("configmaps", cm);
        }
        cluster
    }

    /// Sets `key` in the data of the ConfigMap `name`: a change its owner reconciles.
    fn set_data(&self, name: &str, key: &str, value: impl ToString) {
        self.server.overwrite("configmaps", name, |cm| cm["data"][key] = json!(value.to_string()));
    }

    /// Sets whether a ConfigMap's reconciles fail.
    fn set_failing(&self, name: &str, failing: bool) {
        self.set_data(name, "fail", failing);
    }

    /// Changes every ConfigMap, so that every one is reconciled again by its owner.
    fn touch_all(&self, generation: u32) {
        for name in names() {
            self.set_data(&name, "generation", generation);
        }
    }

    async fn replica(&self, identity: &str, requeue: Option<Duration>) -> Replica {
        self.start_replica(identity, requeue, false).await
    }

    /// A replica whose reconciles write through a client gated by its membership.
    async fn writing_replica(&self, identity: &str) -> Replica {
        self.start_replica(identity, None, true).await
    }

    async fn start_replica(&self, identity: &str, requeue: Option<Duration>, writing: bool) -> Replica {
        let runtime = replica_runtime();
        let config = self.server.lock_config("leases", "unused");
        let (hold, hold_rx) = watch::channel(false);
        let (journal, policy_calls, writes) = (self.journal.clone(), self.policy_calls.clone(), self.writes.clone());
        let id = identity.to_owned();
        let shard = runtime
            .spawn(async move {
                let client = config.cluster.client(&id).await.unwrap();
                let store = KubeGroupStore::new(client.clone(), "default", "shard");
                let timing =
                    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).unwrap();
                let group = Group::builder(&id, store)
                    .config(GroupConfig { timing, partition_count: PARTITIONS, weight: 1 })
                    .drain_timeout(FOREVER)
                    .join()
                    .unwrap();
                let writer = match writing {
                    // Its own client (the server counts its requests apart), gated by the group.
                    true => {
                        let writer = config.cluster.client(&format!("{id}-writer")).await.unwrap();
                        Some(WriteGate::owner_keyed(group.ownership(), key_of_written).client(writer))
                    }
                    false => None,
                };
                let probe = Arc::new(Probe {
                    replica: id.clone(),
                    journal,
                    hold: hold_rx,
                    requeue,
                    policy_calls,
                    writer,
                    writes,
                });
                let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
                shard_controller(
                    group,
                    Controller::new(configmaps, watcher::Config::default().labels("app=shard")),
                    reconcile,
                    error_policy,
                    probe,
                )
                .unwrap()
            })
            .await
            .unwrap();
        let member = ShardReplica { identity: identity.to_owned(), shard: Some(shard), runtime: Some(runtime) };
        Replica { member, hold }
    }
}

/// A replica, and the switch that holds its reconciles in flight while on.
struct Replica {
    member: ShardReplica,
    hold: watch::Sender<bool>,
}

impl Deref for Replica {
    type Target = ShardReplica;

    fn deref(&self) -> &ShardReplica {
        &self.member
    }
}

impl DerefMut for Replica {
    fn deref_mut(&mut self) -> &mut ShardReplica {
        &mut self.member
    }
}

/// True once every ConfigMap is reconciled by its current owner among `replicas` since `since`.
fn all_reconciled_by_current_owners(journal: &Journal, replicas: &[&Replica], since: Instant) -> bool {
    reconciled_by_current_owners(journal, replicas, &names(), since)
}

/// Waits until `replicas` share the partitions and every ConfigMap was reconciled by its owner.
async fn settled_and_reconciled(journal: &Journal, replicas: &[&Replica], since: Instant) {
    share_the_partitions(replicas).await;
    until("every ConfigMap is reconciled by its current owner", || {
        all_reconciled_by_current_owners(journal, replicas, since)
    })
    .await;
}

/// Holds every reconcile of `replica` in flight (until its `hold` is switched off) and changes
/// every ConfigMap; returns the objects it owns, all now in flight, and when they were changed.
async fn hold_every_reconcile_of(cluster: &Cluster, replica: &Replica) -> (Vec<String>, Instant) {
    let objects: Vec<String> = names().into_iter().filter(|n| replica.owns(n).is_some()).collect();
    replica.hold.send_replace(true);
    let touched = Instant::now();
    cluster.touch_all(1);
    until("the replica's reconciles of all its objects are in flight", || {
        let spans = cluster.journal.spans();
        objects.iter().all(|n| {
            spans
                .iter()
                .any(|s| s.replica == replica.identity && s.name == *n && s.started >= touched && s.ended.is_none())
        })
    })
    .await;
    (objects, touched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_configmap_is_reconciled_by_the_replica_that_owns_its_key_under_the_current_term() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let a = cluster.replica("replica-a", None).await;
    let b = cluster.replica("replica-b", None).await;
    let c = cluster.replica("replica-c", None).await;
    let replicas = [&a, &b, &c];
    settled_and_reconciled(&cluster.journal, &replicas, start).await;
    for replica in replicas {
        assert!(!replica.owned_partitions().is_empty(), "{} owns a share", replica.identity);
    }

    // A change reaches every replica's watch, and only the owner reconciles it.
    let touched = Instant::now();
    cluster.touch_all(1);
    until("every change is reconciled by its owner", || {
        all_reconciled_by_current_owners(&cluster.journal, &replicas, touched)
    })
    .await;
    let spans = cluster.journal.spans();
    for span in spans.iter().filter(|s| s.started >= touched) {
        let owner = replicas.iter().find(|r| r.owns(&span.name).is_some()).unwrap();
        assert_eq!(span.replica, owner.identity, "{span:?} was reconciled by a replica that does not own it");
    }
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_leave_the_new_owners_reconcile_its_objects_without_any_change_and_never_alongside_it() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let mut a = cluster.replica("replica-a", None).await;
    let b = cluster.replica("replica-b", None).await;
    let c = cluster.replica("replica-c", None).await;
    settled_and_reconciled(&cluster.journal, &[&a, &b, &c], start).await;
    let a_objects: Vec<String> = names().into_iter().filter(|n| a.owns(n).is_some()).collect();
    assert!(!a_objects.is_empty(), "replica-a owns some ConfigMaps");

    let leaving = Instant::now();
    let left = a.leave(FOREVER);
    tokio::time::timeout(PATIENCE, left).await.expect("the leave completes").unwrap();
    // No ConfigMap changed: the new owners reconcile replica-a's objects because they gained them.
    until("replica-a's objects are reconciled by their new owners", || {
        all_reconciled_by_current_owners(&cluster.journal, &[&b, &c], leaving)
    })
    .await;
    let spans = cluster.journal.spans();
    for name in &a_objects {
        let new_owner = [&b, &c].into_iter().find(|r| r.owns(name).is_some()).unwrap();
        assert!(
            spans.iter().any(|s| s.name == *name && s.replica == new_owner.identity && s.started >= leaving),
            "{name} was not reconciled by its new owner {}",
            new_owner.identity
        );
    }
    assert!(
        spans.iter().filter(|s| s.replica == "replica-a").all(|s| s.started < leaving),
        "replica-a started no reconcile after it began to leave"
    );
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_in_flight_on_a_revoked_partition_finishes_before_the_new_owner_starts_on_it() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let a = cluster.replica("replica-a", None).await;
    let b = cluster.replica("replica-b", None).await;
    settled_and_reconciled(&cluster.journal, &[&a, &b], start).await;
    let a_partitions = a.owned_partitions();
    // Every reconcile of replica-a now stays in flight until released.
    let (a_objects, touched) = hold_every_reconcile_of(&cluster, &a).await;

    // replica-c joins: some of replica-a's partitions are revoked, but they drain first.
    let c = cluster.replica("replica-c", None).await;
    until("some of replica-a's partitions are revoked", || a.owned_partitions().len() < a_partitions.len()).await;
    let revoked: BTreeSet<u32> = a_partitions.difference(&a.owned_partitions()).copied().collect();
    let moving: Vec<String> =
        a_objects.iter().filter(|n| revoked.contains(&a.group().partition_of(&key(n)))).cloned().collect();
    assert!(!moving.is_empty(), "the revoked partitions hold some of the ConfigMaps");
    // While replica-a's reconciles run, nobody takes their partitions.
    for partition in &revoked {
        assert!(c.group().guard(*partition).is_none(), "replica-c took partition {partition} while it drained");
        assert!(b.group().guard(*partition).is_none(), "replica-b took partition {partition} while it drained");
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
    until("the moving objects are reconciled by replica-c", || {
        moving.iter().all(|n| {
            c.owns(n).is_some()
                && cluster.journal.spans().iter().any(|s| s.replica == "replica-c" && s.name == *n && s.ended.is_some())
        })
    })
    .await;
    let spans = cluster.journal.spans();
    for name in &moving {
        let old = spans.iter().find(|s| s.replica == "replica-a" && s.name == *name && s.started >= touched).unwrap();
        let old_end = old.ended.unwrap();
        assert!(old_end >= released, "{name}'s reconcile was in flight until released");
        let new = spans.iter().filter(|s| s.replica == "replica-c" && s.name == *name).map(|s| s.started).min();
        assert!(new.unwrap() >= old_end, "replica-c started on {name} before replica-a's reconcile of it ended");
    }
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_of_an_object_that_moved_to_another_replica_is_dropped_without_calling_the_reconciler() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    // Every reconcile asks to be requeued soon: replica-a keeps coming back to every object.
    let a = cluster.replica("replica-a", Some(Duration::from_millis(200))).await;
    until("replica-a reconciled everything", || all_reconciled_by_current_owners(&cluster.journal, &[&a], start)).await;

    let b = cluster.replica("replica-b", Some(Duration::from_millis(200))).await;
    share_the_partitions(&[&a, &b]).await;
    let settled = Instant::now();
    // Several requeue intervals: the requeues replica-a had scheduled for b's objects came due.
    until("both replicas requeued their objects several times", || {
        let spans = cluster.journal.spans();
        names().iter().all(|n| spans.iter().filter(|s| s.name == *n && s.started >= settled).count() >= 3)
    })
    .await;
    let spans = cluster.journal.spans();
    let moved: Vec<String> = names().into_iter().filter(|n| b.owns(n).is_some()).collect();
    assert!(!moved.is_empty());
    for name in &moved {
        let b_first = spans.iter().filter(|s| s.replica == "replica-b" && s.name == *name).map(|s| s.started).min();
        let b_first = b_first.expect("replica-b reconciled the objects it gained");
        assert!(
            !spans.iter().any(|s| s.replica == "replica-a" && s.name == *name && s.started >= b_first),
            "replica-a reconciled {name} after it had moved to replica-b"
        );
    }
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_aborts_reconciles_that_outlast_its_drain_timeout_and_then_hands_their_objects_over() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let mut a = cluster.replica("replica-a", None).await;
    let b = cluster.replica("replica-b", None).await;
    settled_and_reconciled(&cluster.journal, &[&a, &b], start).await;
    // replica-a's reconciles never finish on their own.
    let (a_objects, touched) = hold_every_reconcile_of(&cluster, &a).await;

    // The group's own drain timeout is FOREVER: the handover below shows the aborted reconciles
    // dropped their guards.
    let left = a.leave(Duration::from_millis(300));
    tokio::time::timeout(PATIENCE, left).await.expect("the leave completes after its drain timeout").unwrap();
    until("replica-b reconciled replica-a's objects", || {
        all_reconciled_by_current_owners(&cluster.journal, &[&b], touched)
    })
    .await;
    let spans = cluster.journal.spans();
    for name in &a_objects {
        let old = spans.iter().find(|s| s.replica == "replica-a" && s.name == *name && s.started >= touched).unwrap();
        assert!(!old.completed, "replica-a's held reconcile of {name} was aborted, not completed: {old:?}");
    }
    assert_no_overlapping_owners(&spans);
    assert_terms_grow_per_partition(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reconcile_reaches_the_error_policy_with_its_partition_guard_still_valid_and_is_retried_by_the_owner()
{
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let a = cluster.replica("replica-a", None).await;
    let b = cluster.replica("replica-b", None).await;
    settled_and_reconciled(&cluster.journal, &[&a, &b], start).await;
    let owner = if a.owns("cm-00").is_some() { &a } else { &b };
    let term = owner.owns("cm-00").unwrap();

    cluster.set_failing("cm-00", true);
    // Only the failures the ConfigMap asked for: a reconcile queued before the partitions settled
    // may still find its object moved away (NotOwner) and reach the error policy of its replica.
    let asked_calls = || -> Vec<PolicyCall> {
        cluster.policy_calls.lock().unwrap().iter().filter(|c| c.asked).cloned().collect()
    };
    let failing_calls = || asked_calls().len();
    until("the error policy was called for two attempts", || failing_calls() >= 2).await;
    let failed = Instant::now();
    cluster.set_failing("cm-00", false);
    until("a retry after the fix succeeded", || {
        cluster.journal.spans().iter().any(|s| s.name == "cm-00" && s.started >= failed && s.ended.is_some())
    })
    .await;

    let calls = asked_calls();
    assert!(calls.len() >= 2, "{calls:?}");
    for call in &calls {
        let expected =
            PolicyCall { replica: owner.identity.clone(), name: "cm-00".into(), asked: true, valid_term: Some(term) };
        assert_eq!(*call, expected, "the error policy ran on the owner, under its term, with the guard valid");
    }
    assert_no_overlapping_owners(&cluster.journal.spans());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_outlives_its_partition_sends_no_write_and_the_new_owner_writes() {
    let cluster = Cluster::start().await;
    let start = Instant::now();
    let a = cluster.writing_replica("replica-a").await;
    let b = cluster.writing_replica("replica-b").await;
    settled_and_reconciled(&cluster.journal, &[&a, &b], start).await;
    let a_partitions = a.owned_partitions();
    // replica-a's reconciles of generation 1 are held before they write.
    let (a_objects, _) = hold_every_reconcile_of(&cluster, &a).await;

    // replica-c joins: some of replica-a's partitions are revoked while those reconciles run.
    let c = cluster.writing_replica("replica-c").await;
    until("replica-a's share shrank to a third", || a.owned_partitions().len() == PARTITIONS as usize / 3).await;
    let revoked: BTreeSet<u32> = a_partitions.difference(&a.owned_partitions()).copied().collect();
    let (moving, staying): (Vec<String>, Vec<String>) =
        a_objects.iter().cloned().partition(|n| revoked.contains(&a.group().partition_of(&key(n))));
    assert!(!moving.is_empty(), "the revoked partitions hold some of the ConfigMaps");

    a.hold.send_replace(false);
    until("replica-a's held reconciles wrote or were refused, and replica-c wrote the moving objects", || {
        let writes = cluster.writes.lock().unwrap();
        let by = |replica: &str, name: &str| writes.iter().any(|w| w.0 == replica && w.1 == *name && w.2 == "1");
        a_objects.iter().all(|n| by("replica-a", n)) && moving.iter().all(|n| by("replica-c", n))
    })
    .await;
    let writes = cluster.writes.lock().unwrap().clone();
    let outcome = |replica: &str, name: &str| {
        writes.iter().find(|w| w.0 == replica && w.1 == *name && w.2 == "1").map(|w| w.3).unwrap()
    };
    for name in &moving {
        assert_eq!(outcome("replica-a", name), Err(Some(RefusalReason::NotOwner)), "{name} moved away from replica-a");
        assert_eq!(outcome("replica-c", name), Ok(()), "{name} is replica-c's now");
        assert!(cluster.server.object("configmaps", &format!("written-{name}-g1-replica-a")).is_none());
    }
    for name in &staying {
        assert_eq!(outcome("replica-a", name), Ok(()), "{name} stayed with replica-a");
    }
    // The server received exactly the writes the gates let through (once the ones still in
    // flight have been recorded; a refused write that leaked would never be).
    let sent_as_recorded = |replica: &str| {
        let writes = cluster.writes.lock().unwrap();
        let refused = |w: &Write| matches!(w.3, Err(Some(reason)) if reason != RefusalReason::Cancelled);
        let recorded = writes.iter().filter(|w| w.0 == replica && !refused(w)).count() as u64;
        let received = cluster.server.faults().request_count(&user_agent(&format!("{replica}-writer")), Verb::Create);
        received == recorded
    };
    until("every write the server received was let through by a gate", || {
        ["replica-a", "replica-b", "replica-c"].iter().all(|r| sent_as_recorded(r))
    })
    .await;
    drop((b, c));
}
