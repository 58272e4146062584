//! Leader-gated work, specified on the memory lock with virtual time (`tokio::time::pause`): when
//! the work starts, when it is told to stop, when it is aborted, and that the lock is released
//! only after it stopped.

use std::convert::Infallible;
use std::time::Duration;

use tenure::locks::memory::MemoryStore;
use tenure::{Elector, LeaderElectionRecord, Leadership, Role, Term};
use tenure_ha::gate::{Gate, LeaderContext};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

const LEASE: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Tokio's timers have millisecond resolution.
const TICK: Duration = Duration::from_millis(2);

fn spawn(store: &MemoryStore, id: &str) -> Elector {
    Elector::builder(id, store.client(id)).seed(7).spawn().expect("valid config")
}

/// A lock, a replica `a` campaigning on it, and a journal for its work.
fn one_replica() -> (MemoryStore, Elector, Journal) {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    (store, a, Journal::new())
}

/// What the work did, with the virtual instant of each entry.
#[derive(Clone)]
struct Journal(watch::Sender<Vec<(Instant, String)>>);

impl Journal {
    fn new() -> Journal {
        Journal(watch::channel(Vec::new()).0)
    }

    fn log(&self, entry: impl Into<String>) {
        let entry = entry.into();
        self.0.send_modify(|entries| entries.push((Instant::now(), entry)));
    }

    /// Waits (bounded, in virtual time) for `entry`; returns when it was logged.
    async fn when(&self, entry: &str) -> Instant {
        let mut rx = self.0.subscribe();
        let entries = timeout(Duration::from_secs(600), rx.wait_for(|e| e.iter().any(|(_, x)| x == entry)))
            .await
            .unwrap_or_else(|_| panic!("{entry:?} not logged within 600 s: {:?}", self.entries()))
            .expect("journal open");
        entries.iter().find(|(_, x)| x == entry).map(|(at, _)| *at).expect("found")
    }

    fn entries(&self) -> Vec<String> {
        self.0.borrow().iter().map(|(_, e)| e.clone()).collect()
    }

    fn has(&self, entry: &str) -> bool {
        self.entries().iter().any(|e| e == entry)
    }
}

/// Logs `dropped <term>` when the work's future is dropped (finished or aborted).
struct OnDrop(Journal, String);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.log(self.1.clone());
    }
}

/// A watcher that finishes in-flight work for `cleanup` after it is told to stop, or never stops
/// by itself when `cleanup` is `None`.
fn watcher(
    journal: &Journal,
    cleanup: Option<Duration>,
) -> impl Fn(LeaderContext) -> futures::future::BoxFuture<'static, Result<(), Infallible>> {
    let journal = journal.clone();
    move |ctx| {
        let journal = journal.clone();
        Box::pin(async move {
            let term = ctx.term().0;
            let _guard = OnDrop(journal.clone(), format!("dropped {term}"));
            journal.log(format!("started {term}"));
            ctx.cancelled().await;
            journal.log(format!("cancelled {term}"));
            match cleanup {
                Some(cleanup) => tokio::time::sleep(cleanup).await,
                None => std::future::pending().await,
            }
            journal.log(format!("stopped {term}"));
            Ok(())
        })
    }
}

/// The gate's counters once its task has ended (it counts a stop just after the work is gone).
async fn stops_after_shutdown(gate: tenure_ha::GateHandle, reason: &'static str) -> (u64, i64) {
    let metrics = gate.metrics().clone();
    gate.shutdown().await;
    (metrics.stops_for(reason), metrics.running.get())
}

async fn until(elector: &Elector, predicate: impl Fn(&Leadership) -> bool) -> Instant {
    timeout(Duration::from_secs(600), elector.subscribe().wait_for(|l| predicate(l)))
        .await
        .expect("condition not reached within 600 s of virtual time")
        .expect("elector stopped");
    Instant::now()
}

fn holder(store: &MemoryStore) -> String {
    store.peek().and_then(|s| s.record.ok()).map(|r| r.holder_identity).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn work_starts_with_the_term_of_the_tenure_as_soon_as_the_replica_leads() {
    let (_store, a, journal) = one_replica();
    let gate = Gate::builder(&a).spawn(watcher(&journal, Some(Duration::ZERO)));
    let led_at = until(&a, |l| l.role == Role::Leader).await;
    let started_at = journal.when("started 1").await;
    assert!(started_at - led_at < TICK);
    assert_eq!(gate.metrics().starts.get(), 1);
    assert_eq!(gate.metrics().running.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn work_stops_before_the_lock_is_released_on_resign() {
    let (store, a, journal) = one_replica();
    let (log, lock) = (journal.clone(), store.clone());
    let gate = Gate::builder(&a).spawn(move |ctx| {
        let (log, lock) = (log.clone(), lock.clone());
        async move {
            log.log("started");
            ctx.cancelled().await;
            log.log("cancelled");
            tokio::time::sleep(Duration::from_secs(2)).await; // in-flight handlers finish
            log.log(format!("stopped while {:?} holds the lock", holder(&lock)));
            Ok::<_, Infallible>(())
        }
    });
    journal.when("started").await;
    let resign_at = Instant::now();
    a.resign().await.expect("resigned");
    let released_at = Instant::now();
    assert_eq!(journal.when("cancelled").await, resign_at);
    let stopped_at = journal.when("stopped while \"a\" holds the lock").await;
    assert_eq!(stopped_at - resign_at, Duration::from_secs(2));
    assert!(released_at - stopped_at < TICK);
    assert_eq!(holder(&store), "");
    assert_eq!(stops_after_shutdown(gate, "resigned").await, (1, 0));
}

#[tokio::test(start_paused = true)]
async fn work_that_ignores_cancellation_is_aborted_at_the_drain_timeout_and_then_the_lock_is_released() {
    let (_store, a, journal) = one_replica();
    let gate = Gate::builder(&a).drain_timeout(Duration::from_secs(3)).spawn(watcher(&journal, None));
    journal.when("started 1").await;
    let resign_at = Instant::now();
    a.resign().await.expect("resigned");
    let released_at = Instant::now();
    let aborted_at = journal.when("dropped 1").await;
    assert_eq!(aborted_at - resign_at, Duration::from_secs(3));
    assert!(released_at - aborted_at < TICK);
    assert!(!journal.has("stopped 1"));
    assert_eq!(stops_after_shutdown(gate, "resigned").await, (1, 0));
}

#[tokio::test(start_paused = true)]
async fn work_is_cancelled_at_the_fencing_deadline_when_the_store_hangs() {
    let (store, a, journal) = one_replica();
    let gate = Gate::builder(&a).drain_timeout(Duration::from_secs(60)).spawn(watcher(&journal, None));
    journal.when("started 1").await;
    let b = spawn(&store, "b");
    until(&b, |l| l.leader.as_deref() == Some("a")).await;
    let valid_until = a.valid_until().expect("leads");
    store.set_delay("a", Duration::from_secs(3600)); // every call of `a` hangs from now on
    let cancelled_at = journal.when("cancelled 1").await;
    // Renews that started before the hang may have moved the deadline; it is the one in force then.
    assert!(cancelled_at >= valid_until && cancelled_at - valid_until <= Duration::from_secs(2) + TICK);
    let aborted_at = journal.when("dropped 1").await;
    // Aborted at the latest when another candidate could lead: one lease after the last renew.
    assert_eq!(aborted_at - cancelled_at, LEASE - RENEW_DEADLINE);
    let b_leads_at = until(&b, |l| l.role == Role::Leader).await;
    assert!(b_leads_at >= aborted_at, "the old leader's work overlapped the new leader");
    assert_eq!(stops_after_shutdown(gate, "fenced").await, (1, 0));
}

#[tokio::test(start_paused = true)]
async fn work_is_aborted_at_once_when_the_lock_is_lost() {
    let (store, a, journal) = one_replica();
    let gate = Gate::builder(&a).spawn(watcher(&journal, None));
    journal.when("started 1").await;
    let now = chrono::Utc::now();
    let intruder = LeaderElectionRecord {
        holder_identity: "intruder".into(),
        lease_duration_seconds: 15,
        acquire_time: Some(now),
        renew_time: Some(now),
        leader_transitions: 2,
        ..Default::default()
    };
    let taken_at = Instant::now();
    store.put_raw(&intruder.to_json());
    // Another candidate may lead already: no drain, the work is aborted the moment the loss is seen.
    let aborted_at = journal.when("dropped 1").await;
    assert!(aborted_at - taken_at < TICK);
    assert!(!journal.has("stopped 1"));
    assert_eq!(stops_after_shutdown(gate, "lost").await, (1, 0));
    assert_eq!(a.leadership().leader.as_deref(), Some("intruder"));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_work_is_restarted_with_backoff_and_the_elector_keeps_leading() {
    let (_store, a, journal) = one_replica();
    let log = journal.clone();
    let gate = Gate::builder(&a).backoff(Duration::from_secs(1), Duration::from_secs(3)).spawn(move |ctx| {
        let log = log.clone();
        async move {
            log.log(format!("attempt {}", ctx.attempt()));
            if ctx.attempt() < 4 {
                panic!("bug in attempt {}", ctx.attempt());
            }
            ctx.cancelled().await;
            Ok::<_, Infallible>(())
        }
    });
    let first = journal.when("attempt 0").await;
    let mut offsets = Vec::new();
    for attempt in 1..=4 {
        offsets.push((journal.when(&format!("attempt {attempt}")).await - first).as_secs());
    }
    assert_eq!(offsets, [1, 3, 6, 9]); // 1 s, doubling, capped at 3 s
    assert_eq!(a.is_leader(), Some(Term(1)));
    assert_eq!(gate.metrics().stops_for("failed"), 4);
    assert_eq!(gate.metrics().starts.get(), 5);
    assert_eq!(gate.metrics().running.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn repeated_failures_make_the_replica_resign_so_another_one_leads() {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    until(&a, |l| l.role == Role::Leader).await;
    let b = spawn(&store, "b");
    let failures = Journal::new();
    let log = failures.clone();
    let _gate_a = Gate::builder(&a).resign_after_failures(2).spawn(move |ctx| {
        let log = log.clone();
        async move {
            log.log(format!("failed {}", ctx.attempt()));
            Err::<(), _>("cannot reach the cloud")
        }
    });
    let journal = Journal::new();
    let _gate_b = Gate::builder(&b).spawn(watcher(&journal, Some(Duration::ZERO)));
    let second_failure = failures.when("failed 1").await;
    let b_started = journal.when("started 2").await;
    assert!(b_started - second_failure < TICK);
    assert_eq!(a.leadership().leader.as_deref(), Some("b"));
    assert_eq!(a.leadership().role, Role::Follower); // still a candidate (L3)
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_stepped_down_campaigns_again_and_restarts_its_work_on_its_next_tenure() {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    let journal_a = Journal::new();
    let _gate_a = Gate::builder(&a).spawn(watcher(&journal_a, Some(Duration::ZERO)));
    journal_a.when("started 1").await;
    let b = spawn(&store, "b");
    let journal_b = Journal::new();
    let _gate_b = Gate::builder(&b).spawn(watcher(&journal_b, Some(Duration::ZERO)));
    until(&b, |l| l.leader.as_deref() == Some("a")).await;
    a.resign().await.expect("a resigned");
    journal_b.when("started 2").await;
    // A replica that resigned leaves the lock to others for one lease; after that it competes.
    tokio::time::sleep(LEASE).await;
    b.resign().await.expect("b resigned");
    journal_a.when("started 3").await;
    assert_eq!(a.is_leader(), Some(Term(3)));
}

#[tokio::test(start_paused = true)]
async fn finished_work_starts_again_only_on_the_next_tenure() {
    let (_store, a, journal) = one_replica();
    let log = journal.clone();
    let gate = Gate::builder(&a).spawn(move |ctx| {
        let log = log.clone();
        async move {
            log.log(format!("ran {}", ctx.term().0));
            Ok::<_, Infallible>(())
        }
    });
    journal.when("ran 1").await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(journal.entries(), ["ran 1"]);
    assert_eq!(gate.metrics().stops_for("finished"), 1);
    a.resign().await.expect("resigned");
    journal.when("ran 2").await; // alone, it takes the lock back after one lease
    assert_eq!(gate.metrics().starts.get(), 2);
}

#[tokio::test(start_paused = true)]
async fn shutting_the_gate_down_stops_the_work_and_the_elector_keeps_leading() {
    let (_store, a, journal) = one_replica();
    let gate = Gate::builder(&a).spawn(watcher(&journal, Some(Duration::from_secs(1))));
    journal.when("started 1").await;
    let metrics = gate.metrics().clone();
    gate.shutdown().await;
    assert!(journal.has("stopped 1"));
    assert_eq!(metrics.stops_for("shutdown"), 1);
    assert_eq!(a.is_leader(), Some(Term(1)));
}

#[tokio::test(start_paused = true)]
async fn the_gate_stops_with_its_elector() {
    let (_store, a, journal) = one_replica();
    let mut gate = Gate::builder(&a).spawn(watcher(&journal, Some(Duration::from_secs(1))));
    journal.when("started 1").await;
    a.shutdown().await.expect("shut down");
    assert!(journal.has("stopped 1"), "the lock was released before the work stopped");
    timeout(Duration::from_secs(1), gate.stopped()).await.expect("the gate stopped with its elector");
    assert!(!gate.is_running());
    assert_eq!(gate.metrics().stops_for("resigned"), 1);
}

/// The same rule on a multi-threaded runtime and the real clock, where the gate's task and the
/// elector's driver run in parallel: the work still stops while the lock is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_stops_before_the_lock_is_released_on_a_multi_threaded_runtime() {
    for round in 0..20 {
        let (store, a, journal) = one_replica();
        let (log, lock) = (journal.clone(), store.clone());
        let gate = Gate::builder(&a).spawn(move |ctx| {
            let (log, lock) = (log.clone(), lock.clone());
            async move {
                log.log("started");
                ctx.cancelled().await;
                tokio::task::yield_now().await; // an in-flight handler finishing
                log.log(format!("stopped while {:?} holds the lock", holder(&lock)));
                Ok::<_, Infallible>(())
            }
        });
        journal.when("started").await;
        a.resign().await.expect("resigned");
        assert_eq!(holder(&store), "", "round {round}");
        assert_eq!(journal.entries()[1], "stopped while \"a\" holds the lock", "round {round}");
        // (The stop is counted by the gate's task just after the work's guard is gone, which may
        // be after the release here; the virtual-time tests check the counters.)
        gate.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_gate_does_not_keep_a_dropped_elector_alive() {
    let (store, a, journal) = one_replica();
    let mut gate = Gate::builder(&a).spawn(watcher(&journal, Some(Duration::from_secs(1))));
    journal.when("started 1").await;
    drop(a); // the elector releases the lock in the background, after the work stopped
    timeout(Duration::from_secs(60), gate.stopped()).await.expect("the gate stopped with its elector");
    assert!(journal.has("stopped 1"));
    assert_eq!(holder(&store), "");
}

// A leader whose work is stuck gives way (issue 35, invariant G1): an operation the work marked in
// flight (`LeaderContext::operation`) that outlives `GateBuilder::stuck_after` makes the replica
// resign so that another one leads; an idle work, operations that return in time and slow renews
// never do; a bound below the renew period is refused.

/// The bound of these tests, and client-go's renew period (the elector's default timing).
const STUCK_AFTER: Duration = Duration::from_secs(30);
const RENEW_PERIOD: Duration = Duration::from_secs(2);
/// The allowance over the allowed silence and one lease.
const MARGIN: Duration = Duration::from_millis(100);

/// A gate on `elector` that gives way after [`STUCK_AFTER`].
fn giving_way(elector: &Elector) -> tenure_ha::gate::GateBuilder {
    Gate::builder(elector).stuck_after(STUCK_AFTER).expect("a valid bound")
}

/// Whether `elector` stops leading within ten minutes of virtual time (it must not).
async fn stops_leading_soon(elector: &Elector) -> bool {
    timeout(Duration::from_secs(600), elector.subscribe().wait_for(|l| l.role != Role::Leader)).await.is_ok()
}

/// A [`watcher`] that, on its first tenure only, first starts an operation that never returns:
/// its guard is held by a sub-task the gate cannot abort, which outlives the tenure (a leaked
/// stuck call). Later tenures are idle.
fn stuck_on_first_tenure(
    journal: &Journal,
) -> impl Fn(LeaderContext) -> futures::future::BoxFuture<'static, Result<(), Infallible>> {
    let (journal, idle) = (journal.clone(), watcher(journal, Some(Duration::ZERO)));
    move |ctx| {
        if ctx.term() == Term(1) {
            let operation = ctx.operation("a call without a timeout");
            journal.log("operation started");
            tokio::spawn(async move {
                let _operation = operation;
                std::future::pending::<()>().await;
            });
        }
        idle(ctx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_work_whose_operation_never_returns_gives_way_and_another_replica_leads() {
    let store = MemoryStore::new();
    let a = spawn(&store, "a");
    until(&a, |l| l.role == Role::Leader).await;
    let b = spawn(&store, "b");
    until(&b, |l| l.leader.as_deref() == Some("a")).await;
    let (journal_a, journal_b) = (Journal::new(), Journal::new());
    // The operation is in flight inside the work itself, which never looks at its cancellation:
    // the gate aborts it at its drain timeout (the renew deadline), then the lock is released.
    let log = journal_a.clone();
    let gate_a = giving_way(&a).spawn(move |ctx| {
        let log = log.clone();
        async move {
            let _operation = ctx.operation("reconcile of default/web");
            log.log(format!("operation started {}", ctx.term().0));
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(())
        }
    });
    let gate_b = giving_way(&b).spawn(watcher(&journal_b, Some(Duration::ZERO)));

    let started = journal_a.when("operation started 1").await;
    let b_started = journal_b.when("started 2").await;
    assert_eq!(b_started - started, STUCK_AFTER + RENEW_DEADLINE, "stuck, then drained as on a resign");
    assert!(b_started - started <= STUCK_AFTER + LEASE + MARGIN);
    assert_eq!(a.leadership().leader.as_deref(), Some("b"));
    assert_eq!(a.leadership().role, Role::Follower, "still a candidate (L3)");
    assert_eq!(gate_a.metrics().stops_for("stuck"), 1);
    assert_eq!(gate_a.metrics().running.get(), 0);
    // b's work is idle: it keeps leading.
    assert!(!stops_leading_soon(&b).await, "an idle leader gave way");
    assert_eq!(gate_b.metrics().stops_for("stuck"), 0);
}

#[tokio::test(start_paused = true)]
async fn after_giving_way_the_replica_campaigns_again_and_its_next_tenure_starts_with_nothing_in_flight() {
    let (_store, a, journal) = one_replica();
    let gate = giving_way(&a).spawn(stuck_on_first_tenure(&journal));
    let started = journal.when("operation started").await;
    let gave_way = until(&a, |l| l.role != Role::Leader).await;
    assert_eq!(gave_way - started, STUCK_AFTER);
    // Alone, it takes the lock back one lease after it resigned (the hold-off), under a new term.
    journal.when("started 2").await;
    assert_eq!(a.is_leader(), Some(Term(2)));
    // The stuck call of term 1 is still in flight (its sub-task was never aborted), but it
    // belongs to the tenure that gave way: no resign loop.
    assert!(!stops_leading_soon(&a).await, "the new tenure gave way for the old tenure's operation");
    assert_eq!(gate.metrics().stops_for("stuck"), 1);
    let expected = ["operation started", "started 1", "cancelled 1", "stopped 1", "dropped 1", "started 2"];
    assert_eq!(journal.entries(), expected);
}

#[tokio::test(start_paused = true)]
async fn an_idle_work_never_gives_way() {
    let (_store, a, journal) = one_replica();
    let gate = Gate::builder(&a)
        .stuck_after(RENEW_PERIOD)
        .expect("the shortest valid bound")
        .spawn(watcher(&journal, Some(Duration::ZERO)));
    journal.when("started 1").await;
    assert!(!stops_leading_soon(&a).await, "an idle leader gave way");
    assert_eq!(gate.metrics().stops_for("stuck"), 0);
    assert_eq!(a.is_leader(), Some(Term(1)));
}

/// Back-to-back operations (one is always in flight) that each return in time, and store calls
/// that each take 2 s (a renew reads and writes: 4 s, twice its period, within the 10 s renew
/// deadline): the bound is per operation and measures only the work, so neither makes the leader
/// give way.
#[tokio::test(start_paused = true)]
async fn operations_that_return_in_time_and_slow_renews_never_make_the_leader_give_way() {
    let (store, a, journal) = one_replica();
    let log = journal.clone();
    let gate = giving_way(&a).spawn(move |ctx| {
        let log = log.clone();
        async move {
            let mut done = 0u32;
            while !ctx.is_cancelled() {
                let _operation = ctx.operation("a slow but healthy reconcile");
                tokio::time::sleep(STUCK_AFTER - Duration::from_secs(1)).await;
                done += 1;
                log.log(format!("operation {done} done"));
            }
            Ok::<_, Infallible>(())
        }
    });
    journal.when("operation 1 done").await;
    store.set_delay("a", Duration::from_secs(2));
    assert!(!stops_leading_soon(&a).await, "a leader with healthy operations gave way");
    assert!(journal.entries().len() >= 20, "the operations went on: {:?}", journal.entries());
    assert_eq!(gate.metrics().stops_for("stuck"), 0);
    assert_eq!(a.is_leader(), Some(Term(1)));
}

#[tokio::test(start_paused = true)]
async fn a_give_way_is_counted_in_the_stops_metric_with_reason_stuck() {
    let (_store, a, journal) = one_replica();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = tenure_ha::metrics::GateMetrics::register(&mut registry);
    let _gate = giving_way(&a).metrics(metrics.clone()).spawn(stuck_on_first_tenure(&journal));
    journal.when("started 2").await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
    assert!(text.contains("tenure_ha_work_stops_total{reason=\"stuck\"} 1"), "{text}");
    assert!(!text.contains("reason=\"resigned\""), "the give-way is counted once, as stuck: {text}");
}

#[tokio::test(start_paused = true)]
async fn a_bound_below_the_renew_period_is_refused_when_it_is_given() {
    let (store, a, _journal) = one_replica();
    assert_eq!(a.timing().retry_period, RENEW_PERIOD);
    for short in [Duration::ZERO, Duration::from_millis(1), RENEW_PERIOD - Duration::from_millis(1)] {
        let refused = Gate::builder(&a).stuck_after(short).map(drop);
        let expected = tenure_ha::GateError::StuckAfterTooShort { stuck_after: short, renew_period: RENEW_PERIOD };
        assert_eq!(refused, Err(expected));
    }
    let error = Gate::builder(&a).stuck_after(Duration::ZERO).map(drop).unwrap_err().to_string();
    assert!(error.contains("stuck_after (0ns) must be at least the elector's renew period (2s)"), "{error}");
    assert!(Gate::builder(&a).stuck_after(RENEW_PERIOD).is_ok());

    // An elector of other timing is checked against its own renew period.
    let timing = tenure::Timing::new(Duration::from_secs(60), Duration::from_secs(40), Duration::from_secs(10));
    let slow = Elector::builder("slow", store.client("slow")).timing(timing.unwrap()).spawn().expect("valid config");
    assert!(Gate::builder(&slow).stuck_after(Duration::from_secs(5)).is_err());
    assert!(Gate::builder(&slow).stuck_after(Duration::from_secs(10)).is_ok());
}

/// A bound past the end of the clock is no bound: no overflow, no give-way.
#[tokio::test(start_paused = true)]
async fn an_endless_bound_never_gives_way() {
    let (_store, a, journal) = one_replica();
    let gate =
        Gate::builder(&a).stuck_after(Duration::MAX).expect("a valid bound").spawn(stuck_on_first_tenure(&journal));
    journal.when("operation started").await;
    assert!(!stops_leading_soon(&a).await);
    assert_eq!(gate.metrics().stops_for("stuck"), 0);
}
