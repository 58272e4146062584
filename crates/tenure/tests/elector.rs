//! The election core's specification, on the memory lock with virtual time
//! (`tokio::time::pause`): every timing rule is checked to the millisecond, instantly.

use std::time::Duration;

use tenure::locks::memory::MemoryStore;
use tenure::{
    ChangeStream, Elector, LeaderElectionRecord, Leadership, LockError, RecordLock, Role, StoredRecord, Term, Timing,
    Version,
};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

const LEASE: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Tokio's timers have millisecond resolution.
const TICK: Duration = Duration::from_millis(2);

fn spawn(store: &MemoryStore, id: &str) -> Elector {
    Elector::builder(id, store.client(id)).seed(42).spawn().expect("valid config")
}

/// Waits (in virtual time) until the snapshot satisfies `predicate`; returns when that happened.
async fn until(rx: &mut watch::Receiver<Leadership>, predicate: impl Fn(&Leadership) -> bool) -> Instant {
    timeout(Duration::from_secs(600), rx.wait_for(|l| predicate(l)))
        .await
        .expect("condition not reached within 600 s of virtual time")
        .expect("elector stopped");
    Instant::now()
}

fn leads(l: &Leadership) -> bool {
    l.role == Role::Leader
}

/// The instant of every change of the record as seen by a passive observer, with the holder.
fn record_changes(store: &MemoryStore) -> watch::Receiver<Vec<(Instant, String)>> {
    let (tx, rx) = watch::channel(Vec::new());
    let mut changes = store.client("observer").watch().expect("memory lock watches");
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut last_version = None;
        while let Some(Ok(stored)) = changes.next().await {
            let version = stored.as_ref().map(|s| s.version.clone());
            if version == last_version {
                continue; // a partition wakes watchers without changing the record
            }
            last_version = version;
            let holder = stored.and_then(|s| s.record.ok()).map(|r| r.holder_identity).unwrap_or_default();
            tx.send_modify(|v| v.push((Instant::now(), holder)));
        }
    });
    rx
}

fn foreign_record(holder: &str, lease_seconds: i64, transitions: i64) -> String {
    let ancient = chrono::DateTime::parse_from_rfc3339("2001-01-01T00:00:00Z").unwrap().to_utc();
    LeaderElectionRecord {
        holder_identity: holder.into(),
        lease_duration_seconds: lease_seconds,
        acquire_time: Some(ancient),
        renew_time: Some(ancient),
        leader_transitions: transitions,
        ..Default::default()
    }
    .to_json()
}

fn holder(store: &MemoryStore) -> String {
    store.peek().and_then(|s| s.record.ok()).map(|r| r.holder_identity).unwrap_or_default()
}

/// A candidate spawned on `store`, once it leads, and its snapshots.
async fn leading(store: &MemoryStore, id: &str) -> (Elector, watch::Receiver<Leadership>) {
    let elector = spawn(store, id);
    let mut rx = elector.subscribe();
    until(&mut rx, leads).await;
    (elector, rx)
}

/// "a" leads, then "b" follows it: both electors, and b's snapshots.
async fn a_leads_b_follows(store: &MemoryStore) -> (Elector, Elector, watch::Receiver<Leadership>) {
    let (a, _) = leading(store, "a").await;
    let b = spawn(store, "b");
    let mut b_rx = b.subscribe();
    until(&mut b_rx, |l| l.leader.as_deref() == Some("a")).await;
    (a, b, b_rx)
}

#[tokio::test(start_paused = true)]
async fn first_candidate_acquires_an_empty_lock_at_once_with_term_one() {
    let store = MemoryStore::new();
    let start = Instant::now();
    let a = spawn(&store, "a");
    let at = until(&mut a.subscribe(), leads).await;
    assert!(at - start < TICK);
    assert_eq!(a.is_leader(), Some(Term(1)));
    assert_eq!(a.valid_until(), Some(start + RENEW_DEADLINE));
    assert_eq!(a.leadership().leader.as_deref(), Some("a"));
    let record = store.peek().unwrap().record.unwrap();
    assert_eq!(
        (record.holder_identity.as_str(), record.leader_transitions, record.lease_duration_seconds),
        ("a", 1, 15)
    );
}

#[tokio::test(start_paused = true)]
async fn follower_waits_a_full_lease_from_its_own_observation_ignoring_remote_timestamps() {
    let store = MemoryStore::new();
    // Held by a holder that renewed "in 2001": comparing clocks would take it over at once (S3).
    store.put_raw(&foreign_record("ghost", 15, 4));
    tokio::time::sleep(Duration::from_secs(100)).await;
    let seen = Instant::now();
    let b = spawn(&store, "b");
    let mut rx = b.subscribe();
    until(&mut rx, |l| l.leader.as_deref() == Some("ghost") && l.role == Role::Follower).await;
    let at = until(&mut rx, leads).await;
    assert!(at - seen >= LEASE && at - seen < LEASE + TICK, "took over after {:?}", at - seen);
    assert_eq!(b.is_leader(), Some(Term(5)), "the term continues from the record");
}

#[tokio::test(start_paused = true)]
async fn follower_takes_over_exactly_when_the_crashed_leaders_lease_expires() {
    let store = MemoryStore::new();
    let changes = record_changes(&store);
    let (_a, b, mut b_rx) = a_leads_b_follows(&store).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    store.partition("a", true); // a "crashes" as far as the store is concerned
    let b_leads = until(&mut b_rx, leads).await;
    let last_renew_seen = changes.borrow().iter().rev().find(|(_, h)| h == "a").map(|(t, _)| *t).unwrap();
    let waited = b_leads - last_renew_seen;
    assert!(waited >= LEASE && waited < LEASE + TICK, "b took over {waited:?} after a's last renew");
    assert_eq!(b.is_leader(), Some(Term(2)));
}

#[tokio::test(start_paused = true)]
async fn leader_renews_every_retry_period_and_keeps_leading() {
    let store = MemoryStore::new();
    let (a, _) = leading(&store, "a").await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(a.is_leader(), Some(Term(1)));
    let requests = store.requests("a");
    // One create, then one update every 2 s: 30 renews in 61 s, and no reads.
    assert_eq!((requests.create, requests.update, requests.get), (1, 30, 1));
    let stats = a.stats();
    assert_eq!((stats.tenures_started, stats.renews, stats.failed_renews, stats.lock_errors), (1, 30, 0, 0));
    assert_eq!(stats.last_renew_latency, Some(Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn leader_cut_off_from_the_store_steps_down_at_its_renew_deadline_before_anyone_takes_over() {
    let store = MemoryStore::new();
    let changes = record_changes(&store);
    let (a, _b, mut b_rx) = a_leads_b_follows(&store).await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    store.partition("a", true);
    let stepped_down = until(&mut a.subscribe(), |l| !leads(l)).await;
    let last_renew = changes.borrow().iter().rev().find(|(_, h)| h == "a").map(|(t, _)| *t).unwrap();
    assert!(
        stepped_down - last_renew <= RENEW_DEADLINE + TICK,
        "stepped down {:?} after the last renew",
        stepped_down - last_renew
    );
    assert_eq!(a.is_leader(), None);
    let b_leads = until(&mut b_rx, leads).await;
    assert!(b_leads > stepped_down + (LEASE - RENEW_DEADLINE) - TICK);
}

#[tokio::test(start_paused = true)]
async fn leader_whose_store_hangs_steps_down_even_while_a_call_is_in_flight() {
    let store = MemoryStore::new();
    let (_a, mut a_rx) = leading(&store, "a").await;
    let slowed = Instant::now();
    store.set_delay("a", Duration::from_secs(3600));
    let stepped_down = until(&mut a_rx, |l| !leads(l)).await;
    // The last renew started at most one retry period before the store slowed down.
    assert!(stepped_down - slowed <= RENEW_DEADLINE + TICK);
    assert!(stepped_down - slowed >= RENEW_DEADLINE - Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_releases_the_lock_and_a_watching_follower_takes_over_at_once() {
    let store = MemoryStore::new();
    let (a, b, mut b_rx) = a_leads_b_follows(&store).await;
    let before = store.requests("b");
    let released = Instant::now();
    a.shutdown().await.unwrap();
    let b_leads = until(&mut b_rx, leads).await;
    assert!(b_leads - released < TICK, "handover took {:?}", b_leads - released);
    assert_eq!(b.is_leader(), Some(Term(2)));
    // b reacted to the pushed change: one write, no read.
    let after = store.requests("b");
    assert_eq!((after.get - before.get, after.update - before.update), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_release_asked_for_during_a_renew_goes_out_as_soon_as_the_renew_returns() {
    let store = MemoryStore::new();
    let (a, _b, mut b_rx) = a_leads_b_follows(&store).await;
    let round_trip = Duration::from_millis(300);
    store.set_delay("a", round_trip);
    // The next renew starts at 2 s; ask for the release while it is in flight.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let asked = Instant::now();
    let shutdown = tokio::spawn(a.shutdown());
    let b_leads = until(&mut b_rx, leads).await;
    // At most: the rest of the renew, then the release's own round trip.
    assert!(b_leads - asked <= 2 * round_trip + TICK, "handover took {:?}", b_leads - asked);
    shutdown.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fenced_leader_no_longer_names_itself_as_the_leader() {
    let store = MemoryStore::new();
    let (a, mut rx) = leading(&store, "a").await;
    store.partition("a", true);
    until(&mut rx, |l| !leads(l)).await;
    assert_eq!(a.leadership(), Leadership { leader: None, term: None, role: Role::Follower });
}

#[tokio::test(start_paused = true)]
async fn release_writes_an_empty_holder_with_a_one_second_lease_like_client_go() {
    let store = MemoryStore::new();
    let (a, _) = leading(&store, "a").await;
    a.shutdown().await.unwrap();
    let record = store.peek().unwrap().record.unwrap();
    assert_eq!((record.holder_identity.as_str(), record.lease_duration_seconds, record.leader_transitions), ("", 1, 1));
}

#[tokio::test(start_paused = true)]
async fn release_waits_until_the_leader_work_has_stopped() {
    let store = MemoryStore::new();
    let a = Elector::builder("a", store.client("a")).drain_timeout(Duration::from_secs(8)).spawn().unwrap();
    let tenure = a.acquired().await.unwrap();
    let b = spawn(&store, "b");
    let mut b_rx = b.subscribe();
    until(&mut b_rx, |l| l.leader.as_deref() == Some("a")).await;
    let work = tokio::spawn(async move {
        tenure.ended().await; // told to stop...
        assert!(!tenure.is_valid());
        tokio::time::sleep(Duration::from_secs(5)).await; // ...finishes its current operation...
        Instant::now() // ...and drops the guard
    });
    let asked = Instant::now();
    let shutdown = tokio::spawn(a.shutdown());
    let b_leads = until(&mut b_rx, leads).await;
    let work_done = work.await.unwrap();
    assert!(b_leads >= work_done, "b started leading before a's work stopped");
    assert!(b_leads - asked < Duration::from_secs(5) + TICK);
    shutdown.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn release_proceeds_after_the_drain_timeout_if_the_work_never_stops() {
    let store = MemoryStore::new();
    let a = Elector::builder("a", store.client("a")).drain_timeout(Duration::from_secs(3)).spawn().unwrap();
    let stuck = a.acquired().await.unwrap();
    let asked = Instant::now();
    a.shutdown().await.unwrap();
    assert!(Instant::now() - asked >= Duration::from_secs(3));
    assert_eq!(holder(&store), "");
    assert!(!stuck.is_valid());
}

/// The default drain timeout is the renew deadline of the timing the elector runs with, not of
/// client-go's default timing (10 s) when the timing is set after it.
#[tokio::test(start_paused = true)]
async fn the_default_drain_timeout_is_the_renew_deadline_of_the_timing_given() {
    let store = MemoryStore::new();
    let timing = Timing::from_ttl(Duration::from_secs(2)).unwrap();
    let a = Elector::builder("a", store.client("a")).timing(timing).spawn().unwrap();
    let stuck = a.acquired().await.unwrap();
    let asked = Instant::now();
    a.shutdown().await.unwrap();
    let drained = Instant::now() - asked;
    assert!(drained >= timing.renew_deadline && drained < Duration::from_secs(10), "drained for {drained:?}");
    assert!(!stuck.is_valid());
}

#[tokio::test(start_paused = true)]
async fn candidates_racing_for_an_empty_lock_elect_exactly_one() {
    let store = MemoryStore::new();
    let electors: Vec<Elector> = ["a", "b", "c", "d", "e"].iter().map(|id| spawn(&store, id)).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leaders: Vec<&str> = electors.iter().filter(|e| e.is_leader().is_some()).map(|e| e.identity()).collect();
    assert_eq!(leaders.len(), 1, "leaders: {leaders:?}");
    for e in &electors {
        assert_eq!(e.leadership().leader.as_deref(), Some(leaders[0]), "{} disagrees", e.identity());
        assert_eq!(e.leadership().term, Some(Term(1)));
    }
}

#[tokio::test(start_paused = true)]
async fn corrupt_record_is_held_by_an_unknown_holder_for_one_lease_then_taken_over() {
    let store = MemoryStore::new();
    store.put_raw("{this is not a record");
    let seen = Instant::now();
    let a = spawn(&store, "a");
    let mut rx = a.subscribe();
    let at = until(&mut rx, leads).await;
    assert!(at - seen >= LEASE && at - seen < LEASE + TICK, "took over after {:?}", at - seen);
    assert_eq!(a.is_leader(), Some(Term(1)));
}

#[tokio::test(start_paused = true)]
async fn leader_whose_record_is_overwritten_stops_leading_and_recovers_when_the_hijack_stops() {
    let store = MemoryStore::new();
    let (a, mut rx) = leading(&store, "a").await;
    let hijacked = Instant::now();
    store.put_raw(&foreign_record("hijacker", 15, 1)); // same term, another holder
    let stopped = until(&mut rx, |l| !leads(l)).await;
    assert!(stopped - hijacked < TICK, "noticed the hijack after {:?}", stopped - hijacked);
    assert_eq!(a.leadership().leader.as_deref(), Some("hijacker"));
    // The hijacker never renews: a waits one lease from the hijack, then leads with a new term.
    let back = until(&mut rx, leads).await;
    assert!(back - hijacked >= LEASE && back - hijacked < LEASE + TICK);
    assert_eq!(a.is_leader(), Some(Term(2)));
}

#[tokio::test(start_paused = true)]
async fn a_deleted_lock_is_noticed_and_recreated_with_a_higher_term() {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    let first = a.acquired().await.unwrap();
    let deleted = Instant::now();
    store.delete();
    first.ended().await;
    assert!(Instant::now() - deleted < TICK);
    let second = a.acquired().await.unwrap();
    assert_eq!(second.term(), Term(2), "the term survives in the candidate's memory");
}

#[tokio::test(start_paused = true)]
async fn terms_strictly_increase_across_handovers_and_reacquisition_by_the_same_identity() {
    let store = MemoryStore::new();
    let (a, mut a_rx) = leading(&store, "a").await;
    assert_eq!(a.is_leader(), Some(Term(1)));
    // a loses leadership (cut off past its renew deadline) and takes it back itself.
    store.partition("a", true);
    until(&mut a_rx, |l| !leads(l)).await;
    store.partition("a", false);
    until(&mut a_rx, leads).await;
    assert_eq!(a.is_leader(), Some(Term(2)), "same identity, new tenure, new term");
    // a resigns: b takes over with the next term; b shuts down: a leads again.
    let b = spawn(&store, "b");
    let mut b_rx = b.subscribe();
    until(&mut b_rx, |l| l.leader.as_deref() == Some("a")).await;
    a.resign().await.unwrap();
    until(&mut b_rx, leads).await;
    assert_eq!(b.is_leader(), Some(Term(3)));
    b.shutdown().await.unwrap();
    until(&mut a_rx, leads).await;
    assert_eq!(a.is_leader(), Some(Term(4)));
}

#[tokio::test(start_paused = true)]
async fn resigned_candidate_stays_a_candidate_and_leaves_the_lock_to_others_for_a_lease() {
    let store = MemoryStore::new();
    let (a, mut a_rx) = leading(&store, "a").await;
    let resigned = Instant::now();
    a.resign().await.unwrap();
    assert_eq!(a.leadership().role, Role::Follower);
    // Nobody else wants it: a takes it back, but only after one lease.
    let back = until(&mut a_rx, leads).await;
    assert!(back - resigned >= LEASE && back - resigned < LEASE + TICK);
    assert_eq!(a.is_leader(), Some(Term(2)));
}

#[tokio::test(start_paused = true)]
async fn lost_replies_and_failed_calls_never_make_two_leaders() {
    let store = MemoryStore::new();
    let changes = record_changes(&store);
    let (a, b, _) = a_leads_b_follows(&store).await;
    let first = a.tenure().unwrap();
    // a's writes land but a never hears back: it must fence itself at its renew deadline.
    store.lose_next_replies("a", 100);
    first.ended().await;
    let stepped_down = Instant::now();
    let last_landed = changes.borrow().iter().rev().find(|(_, h)| h == "a").map(|(t, _)| *t).unwrap();
    assert!(
        stepped_down - last_landed <= RENEW_DEADLINE,
        "a led {:?} past its last landed write",
        stepped_down - last_landed
    );
    assert_eq!((a.is_leader(), b.is_leader()), (None, None));
    // Lost replies cost no extra writes: one renew attempt per retry period.
    assert!(store.requests("a").update <= 1 + 15 / 2 + 1, "{:?}", store.requests("a"));
    store.lose_next_replies("a", 0);
    // Someone leads again, and never both.
    let deadline = Instant::now() + LEASE * 3;
    while a.is_leader().is_none() && b.is_leader().is_none() {
        assert!(Instant::now() < deadline, "nobody leads again");
        assert!(a.is_leader().is_none() || b.is_leader().is_none());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (leader, follower) = if a.is_leader().is_some() { (&a, &b) } else { (&b, &a) };
    assert!(leader.is_leader().unwrap() > first.term());
    // Failed calls (no effect) on both sides: nothing changes hands.
    store.fail_next("a", 3);
    store.fail_next("b", 10);
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(follower.is_leader().is_none());
    }
    assert!(leader.is_leader().is_some());
}

#[tokio::test(start_paused = true)]
async fn watching_followers_make_no_requests_while_the_leader_renews() {
    let store = MemoryStore::new();
    let (_a, b, _) = a_leads_b_follows(&store).await;
    let before = store.requests("b");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(store.requests("b"), before, "a watching follower must not poll");
    assert_eq!(b.leadership().leader.as_deref(), Some("a"));
}

/// A lock that cannot push changes, to check the polling fallback.
struct WithoutWatch(tenure::locks::memory::MemoryLock);

#[async_trait::async_trait]
impl RecordLock for WithoutWatch {
    fn describe(&self) -> String {
        self.0.describe()
    }
    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        self.0.get().await
    }
    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.0.create(record).await
    }
    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.0.update(expected, record).await
    }
    fn watch(&self) -> Option<ChangeStream> {
        None
    }
}

#[tokio::test(start_paused = true)]
async fn without_notifications_followers_poll_every_jittered_retry_period_and_see_a_release() {
    let store = MemoryStore::new();
    let (a, _) = leading(&store, "a").await;
    let b = Elector::builder("b", WithoutWatch(store.client("b"))).seed(1).spawn().unwrap();
    let mut b_rx = b.subscribe();
    until(&mut b_rx, |l| l.leader.is_some()).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Between 60/4.4 and 60/2 reads: client-go's polling pattern.
    let reads = store.requests("b").get;
    assert!((13..=31).contains(&reads), "{reads} reads in 60 s");
    let released = Instant::now();
    a.shutdown().await.unwrap();
    let b_leads = until(&mut b_rx, leads).await;
    assert!(b_leads - released <= Duration::from_millis(4400) + TICK);
}

#[tokio::test(start_paused = true)]
async fn a_follower_reports_the_current_leader_at_all_times() {
    let store = MemoryStore::new();
    let (a, _) = leading(&store, "a").await;
    let b = spawn(&store, "b");
    let c = spawn(&store, "c");
    let mut c_rx = c.subscribe();
    until(&mut c_rx, |l| l.leader.as_deref() == Some("a")).await;
    a.shutdown().await.unwrap();
    until(&mut c_rx, |l| l.leader.as_deref().is_some_and(|x| x != "a")).await;
    let leader = c.leadership().leader.unwrap();
    assert_eq!(b.leadership().leader.as_deref(), Some(leader.as_str()));
    assert!(leader == "b" || leader == "c");
}

#[tokio::test]
async fn rejects_invalid_configuration_with_a_clear_error() {
    let store = MemoryStore::new();
    let err = Elector::builder("", store.client("x")).spawn().err().unwrap();
    assert_eq!(err.to_string(), "the identity of a candidate must not be empty");
    let timing = Timing { renew_deadline: Duration::from_secs(20), ..Timing::default() };
    let err = Elector::builder("x", store.client("x")).timing(timing).spawn().err().unwrap();
    assert!(err.to_string().contains("must be greater than the renew deadline"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_foreign_record_claiming_an_endless_lease_is_honoured_for_at_most_a_day() {
    let store = MemoryStore::new();
    store.put_raw(&foreign_record("squatter", i64::MAX, 1));
    let seen = Instant::now();
    let b = spawn(&store, "b");
    let mut rx = b.subscribe();
    // The elector survives the record and, in time, takes over.
    timeout(Duration::from_secs(48 * 3600), rx.wait_for(leads)).await.expect("took over within two days").unwrap();
    let at = Instant::now();
    assert!(at - seen >= Duration::from_secs(24 * 3600) && at - seen < Duration::from_secs(24 * 3600) + TICK);
    assert_eq!(b.is_leader(), Some(Term(2)));
}

#[tokio::test(start_paused = true)]
async fn an_unbounded_drain_timeout_waits_for_the_work_and_then_releases() {
    let store = MemoryStore::new();
    let a = Elector::builder("a", store.client("a")).drain_timeout(Duration::MAX).spawn().unwrap();
    let tenure = a.acquired().await.unwrap();
    let work = tokio::spawn(async move {
        tenure.ended().await;
        tokio::time::sleep(Duration::from_secs(30)).await; // longer than the lease: renewals continue
    });
    a.shutdown().await.unwrap();
    assert!(work.is_finished());
    assert_eq!(holder(&store), "");
}

#[tokio::test(start_paused = true)]
async fn leader_work_learns_that_its_tenure_ended_when_the_elector_task_is_gone() {
    let (mut publisher, subscriber) = tenure::Publisher::new();
    publisher.start_tenure(Term(7), Instant::now() + Duration::from_secs(60));
    let tenure = subscriber.tenure().expect("a valid tenure");
    drop(publisher); // a driver that stopped for any reason, a panic included
    timeout(Duration::from_secs(1), tenure.ended()).await.expect("the tenure ends with its driver");
    assert!(tenure.check().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_wait_on_a_deleted_long_lease_is_published_with_its_end_and_cleared_after() {
    let store = MemoryStore::new();
    store.put_raw(&foreign_record("gone", 86_400, 4));
    let b = spawn(&store, "b");
    until(&mut b.subscribe(), |l| l.leader.as_deref() == Some("gone")).await;
    assert_eq!(b.stats().waiting, None, "a valid holder's lease is no wait to report");
    store.delete();
    let deleted = Instant::now();
    let mut rx = b.subscribe();
    until(&mut rx, |l| l.leader.is_none()).await;
    tokio::time::sleep(TICK).await;
    let wait = b.stats().waiting.expect("the wait is published");
    assert_eq!(wait.reason, tenure::WaitReason::DeletedWhileHeld);
    let until_deadline = wait.until - deleted;
    assert!(until_deadline >= Duration::from_secs(86_400) && until_deadline < Duration::from_secs(86_400) + TICK);
    let json = serde_json::to_value(b.stats()).unwrap();
    assert_eq!(json["waiting"]["reason"], "deletedWhileHeld");
    assert!(json["waiting"]["untilWall"].as_str().unwrap().ends_with('Z'), "{json}");

    tokio::time::sleep_until(deleted + Duration::from_secs(86_400) - TICK).await;
    assert_eq!(b.is_leader(), None, "the deleted holder's lease is honoured to its end");
    let at = until(&mut rx, leads).await;
    assert!(at - deleted < Duration::from_secs(86_400) + TICK);
    assert_eq!(b.stats().waiting, None, "no wait once it leads");
}

#[tokio::test(start_paused = true)]
async fn a_store_that_keeps_failing_is_published_as_unreachable_since_its_first_failure_until_it_answers() {
    let store = MemoryStore::new();
    let (_a, b, _) = a_leads_b_follows(&store).await;
    store.partition("b", true);
    // b learns of the partition through its watch; its reads then fail and back off.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let stats = b.stats();
    assert!(stats.consecutive_lock_errors >= 3, "{stats:?}");
    assert!(stats.lock_unreachable_since.is_some());
    let calls = store.requests("b");
    // At most one of each per jittered `max_failure_backoff` (0.72-0.9 s, the outage probe) once
    // the streak has grown: a store that answers again is found within a second.
    let probe = Timing::default().max_failure_backoff().mul_f64(0.8);
    let per_kind = (120.0 / probe.as_secs_f64()).ceil() as u64 + 3;
    assert!(calls.get <= per_kind && calls.watch <= per_kind, "{calls:?} in 120 s to a store that keeps failing");

    store.partition("b", false);
    tokio::time::sleep(Timing::default().max_failure_backoff() + TICK).await;
    let stats = b.stats();
    assert_eq!((stats.consecutive_lock_errors, stats.lock_unreachable_since), (0, None), "{stats:?}");
    assert_eq!(b.leadership().leader.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_fenced_leader_whose_late_renews_get_through_leads_again_only_under_a_new_term() {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    let first = a.acquired().await.unwrap();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    store.partition("a", true);
    let deadline = first.valid_until();
    // Heal shortly before the deadline, with calls so slow that a renew started in time is
    // answered only after the deadline: the worst moment for a revival.
    tokio::time::sleep_until(deadline - Duration::from_secs(1)).await;
    store.set_delay("a", Duration::from_secs(3));
    store.partition("a", false);
    timeout(deadline - Instant::now() + TICK, first.ended()).await.expect("fenced by its deadline");
    assert!(!first.is_valid());

    let second = timeout(Duration::from_secs(120), a.acquired()).await.unwrap().unwrap();
    assert!(second.term() > first.term(), "term {} after term {}", second.term(), first.term());
    assert!(!first.is_valid(), "the fenced tenure never comes back");
    assert_eq!(a.is_leader(), Some(second.term()));
}
