//! Elections on every Kubernetes lock kind against the in-memory API server, with real electors:
//! agreement, crash failover, graceful handover, compare-and-swap, deletion and hijacking of the
//! lock object, request counts in steady state, client-go records, and Events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tenure::{LeaderElectionRecord, LockError, RecordLock, Term, Version, LEADER_ANNOTATION};
use tenure_apiserver::Verb;
use tenure_kube::UNKNOWN_LEADER;
use tenure_testkit::kube::*;
use tokio::time::Instant;

/// A record as client-go writes it into an annotation or a Lease.
fn client_go_record(holder: &str, lease_seconds: i64, transitions: i64) -> LeaderElectionRecord {
    let now = chrono::Utc::now();
    LeaderElectionRecord {
        holder_identity: holder.to_owned(),
        lease_duration_seconds: lease_seconds,
        acquire_time: Some(now),
        renew_time: Some(now),
        leader_transitions: transitions,
        ..Default::default()
    }
}

/// Writes `record` into the stored object of kind `plural` as another writer would: the Lease's
/// spec, or the leader annotation.
fn write_record(object: &mut Value, plural: &str, record: &LeaderElectionRecord) {
    if plural == "leases" {
        let micro = |t: Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        };
        object["spec"] = json!({
            "holderIdentity": record.holder_identity,
            "leaseDurationSeconds": record.lease_duration_seconds,
            "acquireTime": micro(record.acquire_time),
            "renewTime": micro(record.renew_time),
            "leaseTransitions": record.leader_transitions,
        });
    } else {
        object["metadata"]["annotations"][LEADER_ANNOTATION] = json!(record.to_json());
    }
}

/// Writes `record` into every object of the lock, creating those that do not exist.
fn impose_record(cluster: &Cluster, kind: &str, name: &str, record: &LeaderElectionRecord) {
    for plural in objects_of(kind) {
        if cluster.object(plural, name).is_some() {
            cluster.overwrite(plural, name, |object| write_record(object, plural, record));
        } else {
            let mut object = json!({"metadata": {"name": name, "namespace": "default"}});
            write_record(&mut object, plural, record);
            cluster.create(plural, object);
        }
    }
}

/// Keeps writing `record` (renewed) into the lock's objects every 200 ms until stopped, as a
/// writer that ignores compare-and-swap would.
struct Intruder {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Intruder {
    fn start(cluster: &Arc<Cluster>, kind: &str, name: &str, record: LeaderElectionRecord) -> Intruder {
        let stop = Arc::new(AtomicBool::new(false));
        let (cluster, kind, name, flag) = (cluster.clone(), kind.to_owned(), name.to_owned(), stop.clone());
        impose_record(&cluster, &kind, &name, &record);
        let task = tokio::spawn(async move {
            let mut record = record;
            while !flag.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                record.renew_time = Some(chrono::Utc::now());
                impose_record(&cluster, &kind, &name, &record);
            }
        });
        Intruder { stop, task }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
    }
}

/// Runs `$test(kind)` as one test per lock kind.
macro_rules! for_every_kind {
    ($test:ident) => {
        for_every_kind!(@ $test, leases, endpoints, configmaps, endpointsleases, configmapsleases);
    };
    (@ $test:ident, $($kind:ident),*) => {
        mod $test {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $kind() {
                    super::$test(stringify!($kind)).await
                }
            )*
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Agreement, failover, handover

for_every_kind!(three_candidates_agree_fail_over_after_a_crash_and_hand_over_on_shutdown);
async fn three_candidates_agree_fail_over_after_a_crash_and_hand_over_on_shutdown(kind: &str) {
    let cluster = Cluster::start().await;
    let (mut candidates, monitor) = candidates(&cluster, kind, "election", 3).await;
    let (first, first_term) = monitor.one_leader().await;
    assert_eq!(first_term, Term(1));

    // Crash: the leader vanishes without releasing; a follower takes over once the lease has run
    // out (L1: within the lease and a round trip of its last observation).
    let crashed_at = Instant::now();
    take(&mut candidates, &first).crash();
    let (second, second_term) = monitor.one_leader().await;
    let failover = crashed_at.elapsed();
    assert_ne!(second, first);
    assert!(second_term > first_term);
    let lease = timing().lease_duration;
    assert!(failover >= lease - timing().retry_period - Duration::from_millis(100), "took over early: {failover:?}");
    assert!(failover <= lease + Duration::from_millis(700), "failover took {failover:?}");

    // Graceful: shutdown releases and the watching follower takes over at once (L2), long
    // before any lease could have run out.
    let released_at = Instant::now();
    take(&mut candidates, &second).shutdown().await;
    let (third, third_term) = monitor.one_leader().await;
    let handover = released_at.elapsed();
    assert!(third != first && third != second && third_term > second_term);
    assert!(handover < lease / 2, "handover took {handover:?}");
    monitor.assert_safe();
}

// ---------------------------------------------------------------------------------------------
// Compare-and-swap

for_every_kind!(concurrent_writers_conflict_instead_of_overwriting_each_other);
async fn concurrent_writers_conflict_instead_of_overwriting_each_other(kind: &str) {
    let cluster = Cluster::start().await;
    let a = cluster.lock(kind, "cas", "a").await;
    let b = cluster.lock(kind, "cas", "b").await;
    assert_eq!(a.get().await.unwrap(), None);
    let v1 = a.create(&client_go_record("a", 15, 1)).await.unwrap();
    let second_create = b.create(&client_go_record("b", 15, 1)).await.unwrap_err();
    assert!(second_create.is_conflict(), "{second_create:?}");

    let seen = b.get().await.unwrap().unwrap();
    assert_eq!(seen.version, v1);
    assert_eq!(seen.record.unwrap().holder_identity, "a");

    let v2 = a.update(&v1, &client_go_record("a", 15, 1)).await.unwrap();
    assert_ne!(v2, v1);
    assert_eq!(b.update(&v1, &client_go_record("b", 15, 2)).await, Err(LockError::Conflict), "stale version");
    assert_eq!(
        b.update(&Version("not-a-version".into()), &client_go_record("b", 15, 2)).await,
        Err(LockError::Conflict)
    );
    let v3 = b.update(&v2, &client_go_record("b", 15, 2)).await.unwrap();
    assert_eq!(a.get().await.unwrap().unwrap().version, v3);
    assert_eq!(a.update(&v2, &client_go_record("a", 15, 3)).await, Err(LockError::Conflict), "a lost the race");

    for plural in objects_of(kind) {
        cluster.delete(plural, "cas");
    }
    assert_eq!(b.update(&v3, &client_go_record("b", 15, 2)).await, Err(LockError::Conflict), "deleted since read");
}

/// The multi-lock's Lease is written with compare-and-swap on the version it read: a Lease that a
/// `leases` candidate created after the read is never overwritten (client-go's MultiLock would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multilock_never_overwrites_a_lease_acquired_after_its_read() {
    let cluster = Cluster::start().await;
    let multi = cluster.lock("endpointsleases", "late", "multi").await;
    let lease = cluster.lock("leases", "late", "lease").await;
    assert_eq!(multi.get().await.unwrap(), None);
    lease.create(&client_go_record("lease", 15, 1)).await.unwrap();
    assert_eq!(multi.create(&client_go_record("multi", 15, 1)).await, Err(LockError::Conflict));
    let combined = multi.get().await.unwrap().unwrap().record.unwrap();
    assert_eq!(combined.holder_identity, UNKNOWN_LEADER, "the Endpoints names multi, the Lease names lease");
    assert_eq!(lease.get().await.unwrap().unwrap().record.unwrap().holder_identity, "lease");

    // Read both, then the Lease changes: the multi-lock's update fails on the Lease.
    let read = multi.get().await.unwrap().unwrap();
    let renewed = lease.get().await.unwrap().unwrap().version;
    lease.update(&renewed, &client_go_record("lease", 15, 1)).await.unwrap();
    assert_eq!(multi.update(&read.version, &client_go_record("multi", 15, 2)).await, Err(LockError::Conflict));
    assert_eq!(lease.get().await.unwrap().unwrap().record.unwrap().holder_identity, "lease");
}

// ---------------------------------------------------------------------------------------------
// Requests in steady state

for_every_kind!(followers_only_watch_and_the_leader_writes_once_per_renew);
async fn followers_only_watch_and_the_leader_writes_once_per_renew(kind: &str) {
    let cluster = Cluster::start().await;
    let (candidates, monitor) = candidates(&cluster, kind, "quiet", 3).await;
    let (leader, _) = monitor.one_leader().await;
    let leader = candidates.iter().find(|c| c.identity == leader).unwrap();
    // Let the acquisition's echoes settle (two renews, and every follower's watch of every lock
    // object requested: what a follower does before that is not what this measures, and on a
    // loaded machine it can come after two renews), then measure a window of about ten renews.
    let objects = objects_of(kind).len() as u64;
    let followers: Vec<&str> =
        candidates.iter().filter(|c| c.identity != leader.identity).map(|c| c.identity.as_str()).collect();
    let _ = monitor
        .until("two renews and every follower watching", |_| {
            leader.stats().renews >= 2 && followers.iter().all(|f| cluster.requests(f, Verb::Watch) >= objects)
        })
        .await;
    let renews_before = leader.stats().renews;
    cluster.server.faults().reset_counts();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let renews = leader.stats().renews - renews_before;
    let counts = cluster.server.faults().request_counts();
    let writes_per_renew = objects_of(kind).len() as u64;

    for follower in candidates.iter().filter(|c| c.identity != leader.identity) {
        let made: Vec<_> =
            counts.iter().filter(|((client, _), _)| *client == tenure_kube::user_agent(&follower.identity)).collect();
        assert!(made.is_empty(), "follower {} made requests: {made:?}", follower.identity);
    }
    assert!(renews >= 7, "only {renews} renews in 2 s");
    let updates = cluster.requests(&leader.identity, Verb::Update);
    assert!(
        updates.abs_diff(renews * writes_per_renew) <= writes_per_renew,
        "{updates} updates for {renews} renews of {writes_per_renew} object(s)"
    );
    for verb in [Verb::Get, Verb::List, Verb::Watch, Verb::Create] {
        assert_eq!(cluster.requests(&leader.identity, verb), 0, "leader {verb} requests");
    }
    monitor.assert_safe();
}

// ---------------------------------------------------------------------------------------------
// Deletion and hijacking of the lock object

for_every_kind!(deleting_the_lock_object_ends_the_tenure_and_leadership_recovers);
async fn deleting_the_lock_object_ends_the_tenure_and_leadership_recovers(kind: &str) {
    let cluster = Cluster::start().await;
    let (_candidates, monitor) = candidates(&cluster, kind, "deleted", 3).await;
    let (leader, term) = monitor.one_leader().await;
    // The leader gets its answers late (by 150 ms, within its 300 ms call timeout), so the
    // followers learn of the deletion well before it does: the case where recreating the lock at
    // once would make a second leader while the first still believes it leads.
    cluster.server.faults().set_client_latency(&tenure_kube::user_agent(&leader), Duration::from_millis(150));
    let deleted_at = Instant::now();
    for plural in objects_of(kind) {
        cluster.delete(plural, "deleted");
    }
    monitor.until("the deleted tenure ended", |m| !m.leaders().contains(&(leader.clone(), term))).await;
    assert!(deleted_at.elapsed() <= timing().renew_deadline + Duration::from_millis(200), "{:?}", deleted_at.elapsed());
    let (_, new_term) = monitor.one_leader().await;
    assert!(new_term > term, "the recreated lock continues the terms");
    for plural in objects_of(kind) {
        assert!(cluster.object(plural, "deleted").is_some(), "{plural} recreated");
    }
    // Followers that saw the deletion wait one lease of the deleted record before recreating the
    // lock (client-go recreates it at once, while the old leader may still believe it leads).
    let tenures = monitor.tenures();
    assert!(tenures.windows(2).all(|w| w[0].1 < w[1].1), "terms increase: {tenures:?}");
    monitor.assert_safe();
}

for_every_kind!(a_hijacked_record_ends_the_tenure_nobody_claims_it_and_leadership_recovers_after);
async fn a_hijacked_record_ends_the_tenure_nobody_claims_it_and_leadership_recovers_after(kind: &str) {
    let cluster = Arc::new(Cluster::start().await);
    let (candidates, monitor) = candidates(&cluster, kind, "hijacked", 3).await;
    let (leader, term) = monitor.one_leader().await;

    // The intruder writes a record that names the leader itself, with a term it never acquired.
    let hijack_term = Term(term.0 + 10);
    let hijacked_at = Instant::now();
    // Its lease (3 s) outlasts the whole seconds of its renewTime, as client-go's must.
    let intruder = Intruder::start(&cluster, kind, "hijacked", client_go_record(&leader, 3, hijack_term.0 as i64));
    monitor.until("the hijacked tenure ended", |m| m.leaders().is_empty()).await;
    assert!(
        hijacked_at.elapsed() <= timing().renew_deadline + Duration::from_millis(200),
        "{:?}",
        hijacked_at.elapsed()
    );

    // While the intruder keeps renewing (more than a lease), nobody leads, and everyone names
    // the intruder's record, not its own.
    let watched_from = Instant::now();
    while watched_from.elapsed() < Duration::from_secs(4) {
        monitor
            .until("every candidate sees the intruder's record", |_| {
                candidates.iter().all(|c| {
                    let l = c.leadership().borrow().clone();
                    if c.identity == leader {
                        // A record naming this identity in a tenure it did not acquire names nobody it knows.
                        l.leader.is_none() && !l.is_leader()
                    } else {
                        l.leader.as_deref() == Some(leader.as_str()) && l.term == Some(hijack_term) && !l.is_leader()
                    }
                })
            })
            .await;
        assert!(monitor.leaders().is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(monitor.tenures(), vec![(leader.clone(), term)], "nobody treated the intruder's record as theirs");

    intruder.stop().await;
    let (_, new_term) = monitor.one_leader().await;
    assert!(new_term > hijack_term, "terms continue above the intruder's");
    monitor.assert_safe();
}

// ---------------------------------------------------------------------------------------------
// Records written by someone else

for_every_kind!(a_client_go_record_held_by_someone_else_is_respected_and_written_back_compatibly);
async fn a_client_go_record_held_by_someone_else_is_respected_and_written_back_compatibly(kind: &str) {
    let cluster = Arc::new(Cluster::start().await);
    // A client-go candidate holds the lock with a 2 s lease and renews it.
    let client_go = Intruder::start(&cluster, kind, "shared", client_go_record("kube-controller-manager_1a2b", 2, 7));
    let (candidates, monitor) = candidates(&cluster, kind, "shared", 3).await;
    monitor
        .until("every candidate sees the client-go holder", |_| {
            candidates.iter().all(|c| c.leadership().borrow().leader.as_deref() == Some("kube-controller-manager_1a2b"))
        })
        .await;
    assert_eq!(candidates[0].leadership().borrow().term, Some(Term(7)));
    tokio::time::sleep(Duration::from_secs(3)).await; // longer than the client-go lease
    assert!(monitor.tenures().is_empty(), "nobody took a lock that is being renewed");

    let stopped_at = Instant::now();
    client_go.stop().await;
    let (leader, term) = monitor.one_leader().await;
    assert_eq!(term, Term(8));
    // Waited out the client-go lease (2 s) from the last change seen, which (whole-second
    // renewTime) may be up to a second and a renew period before the writer stopped.
    assert!(stopped_at.elapsed() >= Duration::from_millis(800), "took over after {:?}", stopped_at.elapsed());

    // What Tenure wrote reads as client-go writes it.
    for plural in objects_of(kind) {
        let object = cluster.object(plural, "shared").unwrap();
        if plural == "leases" {
            let spec = &object["spec"];
            assert_eq!(spec["holderIdentity"], leader);
            assert_eq!(spec["leaseDurationSeconds"], 1);
            assert_eq!(spec["leaseTransitions"], 8);
            let renew = spec["renewTime"].as_str().unwrap();
            assert_eq!(renew.len(), "2024-05-01T10:00:00.000000Z".len(), "MicroTime: {renew}");
        } else {
            let text = object["metadata"]["annotations"][LEADER_ANNOTATION].as_str().unwrap();
            let keys: Vec<String> =
                serde_json::from_str::<serde_json::Map<String, Value>>(text).unwrap().keys().cloned().collect();
            assert!(text.starts_with(&format!("{{\"holderIdentity\":\"{leader}\",\"leaseDurationSeconds\":1,")));
            assert_eq!(keys.len(), 5, "{text}");
            let record = LeaderElectionRecord::from_json(text).unwrap();
            assert_eq!((record.holder_identity.as_str(), record.leader_transitions), (leader.as_str(), 8));
        }
    }
    monitor.assert_safe();
}

/// A record as the Kubernetes Python client's `ConfigMapLock` writes it into the annotation:
/// `json.dumps` spacing, the lease as a string, `str(datetime)` times, no `leaderTransitions`.
fn python_client_annotation(holder: &str, lease_seconds: u32) -> String {
    let now = chrono::Utc::now().naive_utc().to_string();
    format!(
        r#"{{"holderIdentity": "{holder}", "leaseDurationSeconds": "{lease_seconds}", "acquireTime": "{now}", "renewTime": "{now}"}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_by_the_python_client_names_its_leader_and_its_own_lease_is_waited_out() {
    for kind in ["configmaps", "endpoints"] {
        let cluster = Arc::new(Cluster::start().await);
        let mut object = json!({"metadata": {"name": "py", "namespace": "default"}});
        object["metadata"]["annotations"][LEADER_ANNOTATION] = json!(python_client_annotation("py-1", 4));
        cluster.create(kind, object);
        let started = Instant::now();
        let (candidates, monitor) = candidates(&cluster, kind, "py", 3).await;
        monitor
            .until("every candidate names the Python holder", |_| {
                candidates.iter().all(|c| c.leadership().borrow().leader.as_deref() == Some("py-1"))
            })
            .await;
        assert_eq!(candidates[0].leadership().borrow().term, Some(Term(0)), "no leaderTransitions reads as 0");

        // The holder stopped renewing: the record's 4 s lease is waited out, not our own 1 s.
        let (_, term) = monitor.one_leader().await;
        assert!(started.elapsed() >= Duration::from_millis(3_800), "took over after {:?}", started.elapsed());
        assert_eq!(term, Term(1));
        monitor.assert_safe();
    }
}

// ---------------------------------------------------------------------------------------------
// Events

/// Waits until the store holds an event with `message` about `kind`/`name`; returns it.
async fn event(cluster: &Cluster, involved_kind: &str, name: &str, message: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let events = tenure_apiserver::resources::find_resource_type("", "v1", "events").unwrap();
        let (items, _) = cluster.server.store().list(events, Some("default"), &Default::default());
        if let Some(found) = items.iter().find(|e| {
            e["message"] == message
                && e["involvedObject"]["kind"] == involved_kind
                && e["involvedObject"]["name"] == name
        }) {
            return (**found).clone();
        }
        assert!(Instant::now() < deadline, "no event {message:?} on {involved_kind} {name}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_say_who_became_leader_and_who_stopped_leading_on_the_lock_object() {
    for (kind, involved) in [("leases", vec!["Lease"]), ("endpointsleases", vec!["Endpoints", "Lease"])] {
        let cluster = Cluster::start().await;
        let (mut candidates, monitor) = candidates(&cluster, kind, "evented", 2).await;
        let (leader, _) = monitor.one_leader().await;
        for (involved_kind, plural) in involved.iter().zip(objects_of(kind)) {
            let became = event(&cluster, involved_kind, "evented", &format!("{leader} became leader")).await;
            assert_eq!(became["reason"], "LeaderElection");
            assert_eq!(became["type"], "Normal");
            assert_eq!(became["source"]["component"], "tenure");
            let object = cluster.object(plural, "evented").unwrap();
            assert_eq!(became["involvedObject"]["uid"], object["metadata"]["uid"], "kubectl describe finds it");
        }
        take(&mut candidates, &leader).shutdown().await;
        for involved_kind in &involved {
            event(&cluster, involved_kind, "evented", &format!("{leader} stopped leading")).await;
        }
        let (next, _) = monitor.one_leader().await;
        event(&cluster, involved[0], "evented", &format!("{next} became leader")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_event_posts_never_affect_leadership() {
    use tenure_apiserver::{FaultScope, InjectedFault};
    let cluster = Cluster::start().await;
    let (mut candidates, monitor) = candidates(&cluster, "leases", "no-events", 3).await;
    let (leader, _) = monitor.one_leader().await;
    // Events are the only creates once the Lease exists: fail every one of them.
    let scope = FaultScope { verbs: vec![Verb::Create], ..FaultScope::everyone() };
    cluster.server.faults().inject(scope, InjectedFault::InternalError);
    take(&mut candidates, &leader).shutdown().await;
    let (next, _) = monitor.one_leader().await;
    take(&mut candidates, &next).shutdown().await;
    let (last, _) = monitor.one_leader().await;
    monitor.until("the last leader tried to post its event", |_| cluster.requests(&last, Verb::Create) >= 1).await;
    monitor.assert_safe();
}
