//! What an elector tells its users: who leads, whether it is us, with which term, and a guard to
//! check before every side effect. Every backend (record locks, etcd, ZooKeeper) publishes these
//! same types through a [`Publisher`], so everything above the backends is backend-agnostic.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::term::Term;

/// This instance's part in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// This instance leads (its self-fencing deadline has not passed).
    Leader,
    /// Another instance leads, or nobody does and this one is trying.
    Follower,
    /// This instance stopped leading and still holds the lock while its work stops, before it
    /// releases the lock (resign or shutdown).
    Releasing,
}

/// A snapshot of the election as one instance sees it, published on a `tokio::sync::watch`
/// channel whenever the leader, the term or this instance's role changes (not on every renew).
///
/// A snapshot can be stale by the time it is read (a process resumed after a long pause sees
/// the snapshot it had before): before a side effect, decide with [`Tenure::check`] or
/// [`crate::Elector::is_leader`], which read the local clock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Leadership {
    /// Identity of the holder of the lock, `None` when it is free or unknown.
    pub leader: Option<String>,
    /// Term of the holder's tenure, when known.
    pub term: Option<Term>,
    /// This instance's role.
    pub role: Role,
}

impl Leadership {
    /// Nothing known yet: the state before the first read of the lock.
    pub fn unknown() -> Self {
        Leadership { leader: None, term: None, role: Role::Follower }
    }

    /// True when this snapshot says this instance leads.
    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }
}

/// Counters of an elector's work, for metrics and probes (renew latency, failures, transitions).
///
/// Why in the core: only the driver sees each renew; every backend's driver records into the same
/// counters through its [`Publisher`], so `/metrics` reads alike whatever the lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ElectorStats {
    /// Tenures started by this instance (times it became leader).
    pub tenures_started: u64,
    /// Successful renews (keep-alives on session backends).
    pub renews: u64,
    /// Renews that failed (error, timeout or conflict) while leading.
    pub failed_renews: u64,
    /// Failed calls to the lock of any kind (reads, writes, watches).
    pub lock_errors: u64,
    /// How long the last successful renew took.
    #[serde(with = "optional_seconds")]
    pub last_renew_latency: Option<std::time::Duration>,
    /// When the last successful renew started, as seconds on this process's monotonic clock.
    #[serde(skip)]
    pub last_renew_started: Option<Instant>,
    /// Failed calls to the lock since the last successful one: a store that keeps refusing
    /// (unreadable file, read-only file system, API server down) shows here, not only in logs.
    pub consecutive_lock_errors: u64,
    /// Since when every call to the lock has failed (wall clock, for people), if the last call
    /// failed.
    #[serde(serialize_with = "wall_time::optional")]
    pub lock_unreachable_since: Option<std::time::SystemTime>,
    /// Why this instance waits before it may take the lock, when the record it waits on is not
    /// a live leader's (a deleted or corrupt record, a hold-off after resigning).
    pub waiting: Option<LockWait>,
}

/// Why a candidate waits before it may take a lock that no live leader may be renewing, and
/// until when.
///
/// Why it is published: such a wait can be long (a deleted record that claimed a 24 h lease is
/// honoured for up to 24 h, see [`crate::Candidate`]) and nothing else shows it: operators see it
/// in logs, `/status` and `tenure status`, and can break the lock deliberately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockWait {
    /// What is waited out.
    pub reason: WaitReason,
    /// When the wait ends on this instance's monotonic clock.
    #[serde(skip)]
    pub until: Instant,
    /// The same instant on the wall clock, for people.
    #[serde(serialize_with = "wall_time::one")]
    pub until_wall: std::time::SystemTime,
}

/// What a [`LockWait`] waits out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WaitReason {
    /// The lock was deleted while another holder held it: that holder may not know yet, so its
    /// lease is honoured from when the deletion was seen.
    DeletedWhileHeld,
    /// The lock holds something that is not a valid record (or an empty file): an unknown holder
    /// is assumed for one lease of this instance's own configuration from when it was seen.
    CorruptRecord,
    /// This instance resigned and leaves the lock to others for one lease.
    HoldOffAfterResign,
    /// The lock is a coordinated lease (it has a `strategy`): the API server's coordinator gives
    /// it, and this instance does not take part in the coordination.
    CoordinatedLease,
    /// This instance takes part in the coordination, but the lease names a strategy it does not
    /// know: it does not campaign on that lock.
    UnknownStrategy,
    /// This instance takes part in the coordination and no live holder has the lease: it waits
    /// for the coordinator to name one.
    Coordinator,
}

impl WaitReason {
    /// The reason in words, for logs and `tenure status`.
    pub fn describe(self) -> &'static str {
        match self {
            WaitReason::DeletedWhileHeld => {
                "the lock was deleted while another holder held it; waiting out that holder's lease"
            }
            WaitReason::CorruptRecord => "the lock holds no valid record; waiting one lease for an unknown holder",
            WaitReason::HoldOffAfterResign => "this instance resigned; leaving the lock to others for one lease",
            WaitReason::CoordinatedLease => {
                "the lease is coordinated by the API server (it has a strategy); start this instance as a coordinated candidate to take part"
            }
            WaitReason::UnknownStrategy => {
                "the lease names a coordination strategy this instance does not know; not campaigning on it"
            }
            WaitReason::Coordinator => {
                "waiting for the API server's coordinator to name a leader (if none is named, is the CoordinatedLeaderElection feature on?)"
            }
        }
    }

    /// True for waits that last until something changes rather than until a known instant.
    pub fn is_open_ended(self) -> bool {
        matches!(self, WaitReason::CoordinatedLease | WaitReason::UnknownStrategy | WaitReason::Coordinator)
    }
}

/// Wall-clock instants as RFC 3339 text, as people and other tools read them.
mod wall_time {
    pub fn one<S: serde::Serializer>(value: &std::time::SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let time = chrono::DateTime::<chrono::Utc>::from(*value);
        s.serialize_str(&time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }

    pub fn optional<S: serde::Serializer>(value: &Option<std::time::SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(time) => one(time, s),
            None => s.serialize_none(),
        }
    }
}

mod optional_seconds {
    pub fn serialize<S: serde::Serializer>(value: &Option<std::time::Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_f64(d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

/// The error returned by [`Tenure::check`] once the tenure is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("leadership of term {term} has ended")]
pub struct NotLeader {
    /// The term that ended.
    pub term: Term,
}

#[derive(Debug)]
struct TenureShared {
    term: Term,
    valid_until: Mutex<Instant>,
    /// Set (SeqCst) before the guards are counted at the end of a tenure, and read (SeqCst) after
    /// a guard is counted: together they ensure that a guard handed out as valid is always waited
    /// for by the drain.
    is_over: AtomicBool,
    ended: CancellationToken,
    guards: AtomicUsize,
    all_dropped: Notify,
}

/// Proof of one tenure, to hold while doing leader work and to check before each side effect.
///
/// Why a guard rather than a flag: a graceful handover releases the lock only after every
/// `Tenure` of the ending term has been dropped (or a deadline passed), so the next leader never
/// overlaps with work this instance is still finishing.
///
/// ```no_run
/// # async fn f(elector: tenure::Elector) -> Result<(), Box<dyn std::error::Error>> {
/// let tenure = elector.acquired().await?;
/// while tenure.is_valid() {
///     let term = tenure.check()?;        // cheap: no I/O
///     // write to the protected resource with `term` as fencing token
/// #   let _ = term; break;
/// }
/// drop(tenure);                          // lets a graceful release proceed
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Tenure {
    shared: Arc<TenureShared>,
}

impl Tenure {
    /// The fencing term of this tenure.
    pub fn term(&self) -> Term {
        self.shared.term
    }

    /// True while the tenure lasts: not ended by the elector and within its self-fencing deadline
    /// on the local monotonic clock (so a process resumed after a long pause sees `false` at once).
    pub fn is_valid(&self) -> bool {
        !self.shared.is_over.load(Ordering::SeqCst) && Instant::now() < self.valid_until()
    }

    /// The term if the tenure is still valid: call before a side effect.
    pub fn check(&self) -> Result<Term, NotLeader> {
        let term = self.shared.term;
        self.is_valid().then_some(term).ok_or(NotLeader { term })
    }

    /// The instant at which the tenure ends unless the next renew succeeds.
    pub fn valid_until(&self) -> Instant {
        *self.shared.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Completes when the tenure ends (lost, self-fenced, resigned or shut down).
    pub async fn ended(&self) {
        self.shared.ended.cancelled().await
    }

    /// A token cancelled when the tenure ends, to hand to tasks that take one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.shared.ended.child_token()
    }
}

impl Clone for Tenure {
    fn clone(&self) -> Self {
        Tenure::from_shared(self.shared.clone())
    }
}

impl Drop for Tenure {
    fn drop(&mut self) {
        if self.shared.guards.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.all_dropped.notify_waiters();
        }
    }
}

impl Tenure {
    fn from_shared(shared: Arc<TenureShared>) -> Self {
        shared.guards.fetch_add(1, Ordering::SeqCst);
        Tenure { shared }
    }
}

/// The publishing side that an elector's driver owns: it turns the driver's view into
/// [`Leadership`] snapshots and [`Tenure`] guards. Public so that native electors (etcd,
/// ZooKeeper) publish exactly what record-lock electors publish.
#[derive(Debug)]
pub struct Publisher {
    stats: Arc<Mutex<ElectorStats>>,
    recorder: StatsRecorder,
    leadership: watch::Sender<Leadership>,
    current: watch::Sender<Option<Arc<TenureShared>>>,
    ending: Vec<Arc<TenureShared>>,
}

/// Records into an elector's counters ([`ElectorStats`]); cheap to clone, so a task beside the
/// driver (an etcd keep-alive stream, a ZooKeeper heartbeat) counts its renews and failures in
/// the same place as the driver, and `/status`, `/metrics` and the probes read alike on every
/// backend.
#[derive(Debug, Clone)]
pub struct StatsRecorder {
    stats: Arc<Mutex<ElectorStats>>,
}

impl StatsRecorder {
    /// Records a renew (or keep-alive) that started at `started`: `Ok(latency)` or a failure.
    pub fn record_renew(&self, started: Instant, outcome: Result<std::time::Duration, ()>) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(latency) => {
                stats.renews += 1;
                stats.last_renew_latency = Some(latency);
                stats.last_renew_started = Some(started);
            }
            Err(()) => stats.failed_renews += 1,
        }
    }

    /// The counters as they are now (the driver's own view of what it published).
    pub fn stats_snapshot(&self) -> ElectorStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a failed call to the lock; returns how many calls in a row have failed.
    pub fn record_lock_error(&self) -> u64 {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.lock_errors += 1;
        stats.consecutive_lock_errors += 1;
        stats.lock_unreachable_since.get_or_insert_with(std::time::SystemTime::now);
        stats.consecutive_lock_errors
    }

    /// Records a call to the lock that reached the store (a compare-and-swap conflict counts:
    /// the store answered). Returns the failure streak it ends: how many calls failed in a row
    /// and since when, if any did.
    pub fn record_lock_reached(&self) -> Option<(u64, std::time::SystemTime)> {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let since = stats.lock_unreachable_since.take()?;
        Some((std::mem::take(&mut stats.consecutive_lock_errors), since))
    }
}

/// The receiving side, held by the [`crate::Elector`] handle.
#[derive(Debug, Clone)]
pub struct Subscriber {
    stats: Arc<Mutex<ElectorStats>>,
    leadership: watch::Receiver<Leadership>,
    current: watch::Receiver<Option<Arc<TenureShared>>>,
}

impl Publisher {
    /// A publisher and the subscriber half that handles give to users.
    pub fn new() -> (Publisher, Subscriber) {
        let (leadership, leadership_rx) = watch::channel(Leadership::unknown());
        let (current, current_rx) = watch::channel(None);
        let stats = Arc::new(Mutex::new(ElectorStats::default()));
        let recorder = StatsRecorder { stats: stats.clone() };
        let publisher = Publisher { stats: stats.clone(), recorder, leadership, current, ending: Vec::new() };
        (publisher, Subscriber { stats, leadership: leadership_rx, current: current_rx })
    }

    /// Publishes a snapshot; subscribers wake only if it differs from the last one.
    pub fn publish(&self, leadership: Leadership) {
        self.leadership.send_if_modified(|old| {
            let changed = *old != leadership;
            if changed {
                *old = leadership;
            }
            changed
        });
    }

    /// The counters' recording side, for tasks that run beside the driver (a keep-alive task)
    /// and for [`crate::FailureLog`].
    pub fn recorder(&self) -> &StatsRecorder {
        &self.recorder
    }

    /// Records a renew (or keep-alive) that started at `started`: `Ok(latency)` or a failure.
    pub fn record_renew(&self, started: Instant, outcome: Result<std::time::Duration, ()>) {
        self.recorder.record_renew(started, outcome)
    }

    /// Records a failed call to the lock; returns how many calls in a row have failed.
    pub fn record_lock_error(&self) -> u64 {
        self.recorder.record_lock_error()
    }

    /// Publishes why this instance waits before it may take the lock (`None`: it does not).
    /// Returns true if that changed.
    pub fn set_wait(&self, wait: Option<LockWait>) -> bool {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let changed = stats.waiting.map(|w| (w.reason, w.until)) != wait.map(|w| (w.reason, w.until));
        stats.waiting = wait;
        changed
    }

    /// Starts a tenure: guards handed out from now on carry `term`.
    pub fn start_tenure(&mut self, term: Term, valid_until: Instant) {
        self.end_tenure();
        {
            // The acquisition counts as the tenure's first renew (liveness probes judge from it).
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.tenures_started += 1;
            stats.last_renew_started = Some(Instant::now());
        }
        let shared = Arc::new(TenureShared {
            term, valid_until: Mutex::new(valid_until), is_over: AtomicBool::new(false),
            ended: CancellationToken::new(), guards: AtomicUsize::new(0), all_dropped: Notify::new(),
        });
        self.current.send_replace(Some(shared));
    }

    /// Moves the self-fencing deadline of the current tenure after a successful renew; returns
    /// whether the tenure still lasts.
    ///
    /// Why it can refuse: once the deadline has passed, users may have seen the tenure as over
    /// ([`Tenure::is_valid`] reads the clock, not the driver), and a tenure seen as over must never
    /// come back with the same term (invariant S2). A renew that completes after the deadline,
    /// however it started, therefore ends the tenure (`false`); the driver must then stop leading
    /// and lead again only under a new term. Without a current tenure there is nothing to extend
    /// and nothing to refuse (`true`).
    pub fn extend_tenure(&mut self, valid_until: Instant) -> bool {
        let lapsed = match self.current.borrow().as_ref() {
            None => return true,
            Some(shared) => {
                let mut deadline = shared.valid_until.lock().unwrap_or_else(|e| e.into_inner());
                let lapsed = Instant::now() >= *deadline;
                if !lapsed {
                    *deadline = (*deadline).max(valid_until);
                }
                lapsed
            }
        };
        if lapsed {
            self.end_tenure();
        }
        !lapsed
    }

    /// Ends the current tenure: its guards turn invalid and `ended()` completes.
    pub fn end_tenure(&mut self) {
        self.prune_ended();
        if let Some(shared) = self.current.send_replace(None) {
            shared.end();
            self.ending.push(shared);
        }
    }

    /// A future that completes once every guard of every tenure ended so far has been dropped.
    pub fn wait_for_ended_tenures(&mut self) -> impl Future<Output = ()> + Send + 'static {
        let ending = std::mem::take(&mut self.ending);
        async move {
            for shared in ending {
                loop {
                    let notified = shared.all_dropped.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if shared.guards.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                    notified.await;
                }
            }
        }
    }

    /// Forgets ended tenures whose guards are all gone (keeps the list short).
    pub fn prune_ended(&mut self) {
        self.ending.retain(|s| s.guards.load(Ordering::SeqCst) > 0);
    }
}

impl TenureShared {
    fn end(&self) {
        self.is_over.store(true, Ordering::SeqCst);
        self.ended.cancel();
    }
}

impl Drop for Publisher {
    /// A driver that stops for any reason (including a panic) ends its tenure, so leader work
    /// waiting on [`Tenure::ended`] always learns of it.
    fn drop(&mut self) {
        if let Some(shared) = self.current.send_replace(None) {
            shared.end();
        }
    }
}

impl Subscriber {
    /// A receiver of leadership snapshots.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// The elector's counters so far.
    pub fn stats(&self) -> ElectorStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest snapshot.
    pub fn current(&self) -> Leadership {
        self.leadership.borrow().clone()
    }

    /// A guard for the current tenure, if this instance leads.
    pub fn tenure(&self) -> Option<Tenure> {
        let shared = self.current.borrow().clone()?;
        let tenure = Tenure::from_shared(shared);
        tenure.is_valid().then_some(tenure)
    }

    /// Waits until this instance leads, then returns a guard; `None` if the elector stopped.
    pub async fn acquired(&self) -> Option<Tenure> {
        let mut current = self.current.clone();
        loop {
            if let Some(shared) = current.borrow_and_update().clone() {
                let tenure = Tenure::from_shared(shared);
                if tenure.is_valid() {
                    return Some(tenure);
                }
            }
            current.changed().await.ok()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_extension_after_the_deadline_ends_the_tenure_instead_of_reviving_it() {
        let (mut publisher, subscriber) = Publisher::new();
        let start = Instant::now();
        publisher.start_tenure(Term(3), start + Duration::from_secs(2));
        let tenure = subscriber.tenure().expect("a valid tenure");

        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!tenure.is_valid(), "the deadline passed: the tenure reads as over");

        // A renew that started in time but is handled only now must not bring it back.
        assert!(!publisher.extend_tenure(start + Duration::from_secs(5)));
        assert!(!tenure.is_valid());
        assert_eq!(tenure.valid_until(), start + Duration::from_secs(2), "the deadline did not move");
        tokio::time::timeout(Duration::from_millis(1), tenure.ended()).await.expect("ended() completes");
        assert!(subscriber.tenure().is_none(), "no guard of the lapsed term is handed out again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_before_the_deadline_moves_it_and_never_shortens_it() {
        let (mut publisher, subscriber) = Publisher::new();
        let start = Instant::now();
        publisher.start_tenure(Term(3), start + Duration::from_secs(2));
        let tenure = subscriber.tenure().expect("a valid tenure");

        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(publisher.extend_tenure(start + Duration::from_secs(4)));
        assert!(publisher.extend_tenure(start + Duration::from_secs(3)), "an older renew is no failure");
        assert_eq!(tenure.valid_until(), start + Duration::from_secs(4));
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert!(tenure.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn extending_without_a_tenure_does_nothing() {
        let (mut publisher, subscriber) = Publisher::new();
        assert!(publisher.extend_tenure(Instant::now() + Duration::from_secs(1)));
        assert!(subscriber.tenure().is_none());
    }
}
