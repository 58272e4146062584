//! The sans-IO decision core of one candidate: the client-go algorithm, driven by explicit time.
//!
//! [`Candidate`] never reads a clock and never does I/O. Its driver asks it what to do
//! ([`Candidate::poll_action`]), performs the action on the lock, and feeds the result back
//! ([`Candidate::on_read`], [`Candidate::on_write`], [`Candidate::on_change`]), passing the local
//! monotonic time of each step. Leadership changes come out as [`Event`]s. Because time is an
//! input, every timing rule is testable with virtual time, and the randomized simulation can give
//! each candidate a clock running at its own rate.
//!
//! The rules, beyond client-go:
//! - **S1 self-fencing**: leadership is valid until the *start* of the last successful renew plus
//!   the renew deadline; past that instant [`Candidate::is_leader`] is `None` even before anyone
//!   told the candidate anything.
//! - **S2 terms**: every acquisition writes `leaderTransitions + 1`, also when this identity held
//!   the lock before, so the term of each tenure is strictly greater than all earlier ones.
//! - **S3 skew**: another holder's lease is counted from the local time at which this candidate
//!   saw the record change, never from the timestamps inside it.
//! - **Push**: with a watchable lock a follower makes no request until the exact moment the lease
//!   runs out (or a change arrives); without one it polls every jittered retry period.
//! - **Identities**: only a tenure this candidate acquired is its own. A record naming this
//!   identity with another term (a restarted process, or a duplicate identity) is waited out
//!   like any other holder's, because the two cannot be told apart.
//! - **Corrupt records** are held by an unknown holder for one full lease from when they were
//!   first seen, then taken over.
//! - **Deleted records**: a lock object deleted while another holder held it is still held for one
//!   of that record's leases from when the deletion is seen. The holder may not know of the
//!   deletion until its next renew fails, and self-fences only at its renew deadline; creating the
//!   object at once would give two leaders (client-go has this gap). The wait counts from the
//!   deletion, not from the record as last seen, because that view may be stale (missed renews):
//!   a create has no version to compare, so nothing else would catch it.
//! - **Coordinated leases** (Kubernetes' Coordinated Leader Election): a lease whose record has a
//!   `strategy` is the API server coordinator's to give. A candidate that is not coordinated
//!   ([`Candidate::coordinated`]) never takes one. A coordinated candidate never takes a free or
//!   expired lease either: it takes the lease when it sees the record change to name it (the
//!   coordinator's grant), at once and under a new term, and when the record names another
//!   preferred holder while it leads, it hands over gracefully ([`Event::HandoverRequested`]:
//!   drain, then release) instead of letting the lease run out.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::clock::MonotonicTime;
use crate::leadership::WaitReason;
use crate::stage::Stage;
use crate::lock::{LockError, StoredRecord, Version};
use crate::record::LeaderElectionRecord;
use crate::term::Term;
use crate::timing::{Timing, MAX_LEASE};

/// What the driver must do next on the lock.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Read the record ([`crate::RecordLock::get`]), then call [`Candidate::on_read`].
    Read,
    /// Create the record, then call [`Candidate::on_write`].
    Create(LeaderElectionRecord),
    /// Replace the record if still at `expected`, then call [`Candidate::on_write`].
    Update {
        /// The version the record must still have.
        expected: Version,
        /// The new record.
        record: LeaderElectionRecord,
    },
}

/// Why a candidate stopped leading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// No renew succeeded within the renew deadline (store unreachable, slow, or this process was
    /// paused): the candidate fenced itself.
    RenewDeadlineExceeded,
    /// The record now names another holder or tenure, or was deleted.
    LockLost,
    /// The user asked to resign or shut down.
    SteppedDown,
}

/// A change the driver publishes.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// This candidate became leader with this term.
    StartedLeading {
        /// The fencing term of the new tenure.
        term: Term,
    },
    /// This candidate, which was leading, stopped.
    StoppedLeading {
        /// The term of the tenure that ended.
        term: Term,
        /// Why it ended.
        reason: StopReason,
    },
    /// The coordinator of a coordinated lease prefers another holder: the driver steps down
    /// (drains, then releases), so the preferred candidate leads within a round trip.
    HandoverRequested {
        /// The term of the tenure to hand over.
        term: Term,
        /// The candidate the coordinator named.
        to: String,
    },
    /// The holder seen in the lock changed (including to or from this candidate).
    LeaderObserved {
        /// The holder's identity; `None` when the lock is free, absent, or unreadable.
        leader: Option<String>,
        /// The holder's term, when the record is readable and held.
        term: Option<Term>,
    },
}

#[derive(Debug, Clone)]
struct Observed {
    stored: Option<StoredRecord>,
    seen_at: MonotonicTime,
}

#[derive(Debug, Clone)]
struct OwnTenure {
    term: Term,
    acquire_time: Option<DateTime<Utc>>,
    valid_until: MonotonicTime,
    leading: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    Acquire,
    Renew,
    Release,
}

#[derive(Debug, Clone)]
enum Pending {
    Read { started: MonotonicTime },
    Write { started: MonotonicTime, kind: WriteKind, record: LeaderElectionRecord },
}

/// How the observed record relates to this candidate.
#[derive(Debug)]
enum Holder {
    Absent,
    Free,
    Ours,
    Other { expires_at: MonotonicTime },
    /// Coordinated: the coordinator just named this candidate; take it now.
    Granted,
    /// Not this candidate's to take however long it waits: a coordinated lease the coordinator
    /// has not given it (or a lease under a strategy this candidate does not take part in).
    NotOurs,
}

/// The decision state of one candidate in one election. See the module documentation.
///
/// ```
/// use std::time::Duration;
/// use tenure::{Action, Candidate, MonotonicTime, Stage, Timing};
/// let mut c = Candidate::new("a", Timing::default(), true, 7);
/// let (t0, stage) = (MonotonicTime::ZERO, Stage::Campaigning);
/// assert_eq!(c.poll_action(t0, chrono::Utc::now(), stage), Some(Action::Read));
/// c.on_read(t0, Ok(None));
/// let Some(Action::Create(record)) = c.poll_action(t0, chrono::Utc::now(), stage) else { panic!() };
/// c.on_write(t0, Ok(tenure::Version("1".into())), stage);
/// assert_eq!(c.is_leader(t0), Some(tenure::Term(1)));
/// assert_eq!(c.is_leader(t0 + Duration::from_secs(10)), None); // fenced at the renew deadline
/// # let _ = record;
/// ```
#[derive(Debug)]
pub struct Candidate {
    identity: String,
    timing: Timing,
    has_watch: bool,
    rng: SmallRng,
    observed: Option<Observed>,
    tenure: Option<OwnTenure>,
    /// The term of the last tenure this candidate acquired; a record with it and our identity is ours.
    last_own_term: Option<Term>,
    /// The last acquisition whose outcome is unknown (its call failed without a conflict, or was
    /// abandoned): the store may still apply it, late, typically as it answers again after an
    /// outage. Seen in the store, it is this candidate's, so it takes it over at once instead of
    /// waiting out a lease nobody holds.
    unconfirmed: Option<LeaderElectionRecord>,
    /// The next acquisition confirms a late write recognised as ours. If it goes unanswered too,
    /// it is not recognised again: a candidate whose writes keep landing after their calls time
    /// out (a slow link) would otherwise rewrite the record under a new term every call timeout,
    /// and everybody else would wait forever on a record that keeps changing. It waits out a
    /// lease like the others instead.
    confirming: bool,
    highest_term_seen: Term,
    pending: Option<Pending>,
    needs_read: bool,
    next_attempt: MonotonicTime,
    /// After a resign, do not try to acquire before this instant.
    hold_off_until: Option<MonotonicTime>,
    /// A release was asked for ([`Candidate::release`]) and has not landed: whenever the lock
    /// holds this candidate's tenure, it writes the release rather than renew or take the lock,
    /// whatever the stage (a release that outlives its stop's deadline still lands, and the
    /// candidate leaves the lock to others for a lease from then).
    releasing: bool,
    published_holder: Option<(Option<String>, Option<Term>)>,
    events: VecDeque<Event>,
    /// The version of the last change notified while an action was in flight (`Some(None)`: the
    /// record was deleted). A reply that disagrees with it may be older news.
    notified_while_pending: Option<Option<Version>>,
    /// A resync was asked for while a request was in flight: read again after its reply.
    resync_after_pending: bool,
    /// The record was deleted while another holder held it: until this instant the absent record
    /// counts as still held (see the module documentation).
    deleted_lease_until: Option<MonotonicTime>,
    /// Calls to the lock that failed in a row (a conflict is an answer, not a failure).
    consecutive_failures: u32,
    /// Takes part in Coordinated Leader Election (see the module documentation).
    coordinated: bool,
    /// Coordinated: the version of the record in which the coordinator named this candidate,
    /// seen change to name it (or first seen naming it, never renewed).
    granted: Option<Version>,
    /// Coordinated: the term for which a handover was already asked for.
    handover_asked: Option<Term>,
}

impl Candidate {
    /// A candidate named `identity`. `has_watch` says whether its lock pushes changes (then it
    /// does not poll); `seed` makes the jitter of its retries reproducible.
    pub fn new(identity: impl Into<String>, timing: Timing, has_watch: bool, seed: u64) -> Self {
        Candidate {
            identity: identity.into(), timing, has_watch, rng: SmallRng::seed_from_u64(seed),
            observed: None, tenure: None, last_own_term: None, unconfirmed: None, confirming: false,
            highest_term_seen: Term(0), pending: None,
            needs_read: true, next_attempt: MonotonicTime::ZERO, hold_off_until: None, releasing: false,
            published_holder: None, events: VecDeque::new(), notified_while_pending: None, resync_after_pending: false,
            deleted_lease_until: None, consecutive_failures: 0, coordinated: false, granted: None, handover_asked: None,
        }
    }

    /// Makes this a candidate of Kubernetes' Coordinated Leader Election: it leads only when the
    /// API server's coordinator names it in the lease and hands over when the coordinator prefers
    /// another candidate (see the module documentation). Publishing the candidacy (a
    /// `LeaseCandidate`) is the backend's part.
    #[must_use]
    pub fn coordinated(mut self) -> Self {
        self.coordinated = true;
        self
    }

    /// The strategy this candidate can take part in, when coordinated.
    pub const COORDINATED_STRATEGY: &'static str = "OldestEmulationVersion";

    /// Why and until when this candidate waits before it may take the lock, when what it waits
    /// on is not a live leader's record: a deleted or corrupt record, or its own hold-off after a
    /// resign. `None` while it leads, while a valid record names a holder (a live leader, as far
    /// as anyone can tell), or when it may take the lock now.
    ///
    /// Why: such waits can be long (a deleted record that claimed a day-long lease is honoured
    /// for a day) and must be visible to operators, who can then break the lock deliberately.
    pub fn wait(&self, now: MonotonicTime, stage: Stage) -> Option<(WaitReason, MonotonicTime)> {
        if stage != Stage::Campaigning || self.releasing || self.tenure.is_some() {
            return None;
        }
        let observed = self.observed.as_ref()?;
        let record_wait = match (&observed.stored, self.classify()) {
            (None, Holder::Other { expires_at }) => Some((WaitReason::DeletedWhileHeld, expires_at)),
            (Some(StoredRecord { record: Err(_), .. }), Holder::Other { expires_at }) => {
                Some((WaitReason::CorruptRecord, expires_at))
            }
            (None, Holder::NotOurs) => Some((WaitReason::Coordinator, observed.seen_at + MAX_LEASE)),
            (Some(stored), Holder::NotOurs) => self.not_ours_reason(stored, observed.seen_at, now).map(|reason| {
                // Until something changes: no deadline of its own.
                (reason, observed.seen_at + MAX_LEASE)
            }),
            _ => None,
        };
        let hold_off = self.hold_off_until.map(|until| (WaitReason::HoldOffAfterResign, until));
        [record_wait, hold_off].into_iter().flatten().filter(|(_, until)| *until > now).max_by_key(|(_, until)| *until)
    }

    /// Why a lease that is not this candidate's to take is waited on; `None` for a live holder's
    /// lease (an ordinary follower).
    fn not_ours_reason(&self, stored: &StoredRecord, seen_at: MonotonicTime, now: MonotonicTime) -> Option<WaitReason> {
        let record = stored.record.as_ref().ok();
        let strategy = record.and_then(|r| r.coordination_strategy());
        let live_holder =
            record.is_some_and(|r| !r.holder_identity.is_empty()) && now < seen_at + self.lease_of(stored);
        match (self.coordinated, strategy) {
            (false, Some(_)) => Some(WaitReason::CoordinatedLease),
            (true, Some(s)) if s != Self::COORDINATED_STRATEGY => Some(WaitReason::UnknownStrategy),
            (true, _) if !live_holder => Some(WaitReason::Coordinator),
            _ => None,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing it runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The term of the current tenure if this candidate leads at `now` (S1: only until the start
    /// of its last successful renew plus the renew deadline).
    pub fn is_leader(&self, now: MonotonicTime) -> Option<Term> {
        self.tenure.as_ref().filter(|t| t.leading && now < t.valid_until).map(|t| t.term)
    }

    /// Until when the current leadership is valid, if this candidate leads.
    pub fn leader_valid_until(&self) -> Option<MonotonicTime> {
        self.tenure.as_ref().filter(|t| t.leading).map(|t| t.valid_until)
    }

    /// The holder seen in the lock: `None` when free, absent, unreadable or never read.
    pub fn observed_leader(&self) -> Option<&str> {
        match self.observed_record() {
            Some(r) if !r.holder_identity.is_empty() => Some(r.holder_identity.as_str()),
            _ => None,
        }
    }

    /// The record last seen, if it was readable.
    pub fn observed_record(&self) -> Option<&LeaderElectionRecord> {
        self.observed.as_ref()?.stored.as_ref()?.record.as_ref().ok()
    }

    /// When the observed record last changed, on this candidate's clock.
    pub fn observed_at(&self) -> Option<MonotonicTime> {
        self.observed.as_ref().map(|o| o.seen_at)
    }

    /// True once the release last asked for ([`Candidate::release`]) is over: its write landed,
    /// or the lock holds nothing of this candidate's.
    pub fn has_released(&self) -> bool {
        !self.releasing
    }

    /// True while the lock holds a tenure this candidate stepped down from (in `stage`): it
    /// neither leads nor lets another lead until the release.
    pub fn is_releasing(&self, stage: Stage) -> bool {
        (stage.is_stepping_down() || self.releasing) && self.holds_lock()
    }

    /// True when the record last seen holds this candidate's own tenure.
    pub fn holds_lock(&self) -> bool {
        matches!(self.classify(), Holder::Ours)
    }

    /// Schedules a fresh read now: changes may have been missed (a watch was re-opened).
    pub fn resync(&mut self, now: MonotonicTime) {
        self.needs_read = true;
        if self.consecutive_failures == 0 || self.tenure.is_some() {
            // While calls keep failing, the read waits for the back-off already scheduled.
            self.next_attempt = self.next_attempt.min(now);
        }
        // A reply to a request already in flight may predate the missed changes.
        self.resync_after_pending |= self.pending.is_some();
    }

    /// True while an action handed out by [`Candidate::poll_action`] awaits its result.
    pub fn is_busy(&self) -> bool {
        self.pending.is_some()
    }

    /// The next leadership change to publish.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The instant at which the driver must call [`Candidate::poll_action`] again if nothing else
    /// happens: the next attempt, or the self-fencing deadline.
    pub fn next_wakeup(&self, stage: Stage) -> Option<MonotonicTime> {
        if stage == Stage::Stopped {
            return None;
        }
        let fence = self.tenure.as_ref().map(|t| t.valid_until);
        let attempt = if self.pending.is_some() { None } else { Some(self.next_attempt) };
        fence.into_iter().chain(attempt).min()
    }

    /// Decides what to do at `now` in the elector's `stage` ([`crate::lifecycle`]). `None`:
    /// nothing until [`Candidate::next_wakeup`] or a result or change arrives. `wall` only fills
    /// the informational times of the record.
    pub fn poll_action(&mut self, now: MonotonicTime, wall: DateTime<Utc>, stage: Stage) -> Option<Action> {
        self.fence(now);
        // Released: the stop ends (nothing more until the stage moves on).
        let released = matches!(stage, Stage::Releasing(_)) && !self.releasing;
        if released || stage == Stage::Stopped || self.pending.is_some() || now < self.next_attempt {
            return None;
        }
        // Nothing of ours to release, and no uncertain write to check: released, even if the
        // store is unreachable.
        if self.releasing && self.tenure.is_none() && !self.holds_lock() && !self.needs_read {
            self.released(now);
            return None;
        }
        if self.needs_read || self.observed.is_none() {
            self.pending = Some(Pending::Read { started: now });
            self.notified_while_pending = None;
            return Some(Action::Read);
        }
        let holder = self.classify();
        if self.releasing {
            if matches!(holder, Holder::Ours) {
                return self.write(now, WriteKind::Release, self.released_record(wall));
            }
            // The lock holds nothing of ours any more: released.
            self.released(now);
            return None;
        }
        let campaigning = stage == Stage::Campaigning;
        // A grant skips the hold-off after a resign: the coordinator chose this candidate again.
        let may_acquire =
            campaigning && (self.hold_off_until.is_none_or(|t| now >= t) || matches!(holder, Holder::Granted));
        match holder {
            Holder::Ours if self.tenure.is_some() => {
                return self.write(now, WriteKind::Renew, self.renewed_record(wall));
            }
            Holder::Absent | Holder::Free | Holder::Ours | Holder::Granted if may_acquire => {
                return self.write(now, WriteKind::Acquire, self.acquired_record(wall));
            }
            Holder::Other { expires_at } if may_acquire && now >= expires_at => {
                return self.write(now, WriteKind::Acquire, self.acquired_record(wall));
            }
            Holder::Other { expires_at } if campaigning => {
                // Wait for the exact moment the lease runs out; without notifications, look again
                // every jittered retry period meanwhile.
                let mut next = expires_at.max(self.hold_off_until.unwrap_or(expires_at));
                if !self.has_watch {
                    let poll = now + self.jittered_retry();
                    if poll < next {
                        self.needs_read = true;
                        next = poll;
                    }
                }
                // A lease that ran out while held off: never schedule in the past, or the driver
                // would spin.
                self.next_attempt = if next > now { next } else { now + self.timing.retry_period };
            }
            Holder::NotOurs if campaigning => {
                // Only a change can make it ours: wait for one (without notifications, look
                // again every jittered retry period).
                let wait = if self.has_watch { self.timing.lease_duration } else { self.jittered_retry() };
                self.needs_read = !self.has_watch;
                self.next_attempt = now + wait;
            }
            _ if campaigning => {
                // Held off after a resign: look again when the hold-off ends; without notifications,
                // keep polling meanwhile, so that a new holder's lease counts from when it took over.
                let mut next = self.hold_off_until.unwrap_or(now).max(now + Duration::from_millis(1));
                if !self.has_watch {
                    self.needs_read = true;
                    next = next.min(now + self.jittered_retry());
                }
                self.next_attempt = next;
            }
            _ => {
                // Draining without a record of ours, or facing an expired lease it must not take:
                // nothing to renew, nothing to take; never schedule in the past.
                self.next_attempt = now + self.timing.retry_period;
            }
        }
        None
    }

    /// The result of an [`Action::Read`] that completed at `now`.
    pub fn on_read(&mut self, now: MonotonicTime, result: Result<Option<StoredRecord>, LockError>) {
        // A reply handled after the fencing deadline must not revive an ended tenure.
        self.fence(now);
        let started = match self.pending {
            Some(Pending::Read { started }) => {
                self.pending = None;
                started
            }
            _ => now,
        };
        let notified = self.notified_while_pending.take();
        if result.is_ok() {
            self.consecutive_failures = 0;
        }
        match result {
            Ok(stored) if notified.is_some_and(|n| n != stored.as_ref().map(|s| s.version.clone())) => {
                // A notification arrived while this read was in flight and says something else:
                // versions are opaque, so either may be the newer. Read again rather than let a
                // reply that left the store earlier undo the newer news.
                self.needs_read = true;
                self.next_attempt = now;
            }
            Ok(stored) => {
                self.needs_read = std::mem::take(&mut self.resync_after_pending);
                self.observe(now, stored, true);
                self.next_attempt = now;
            }
            Err(_) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.needs_read = true;
                self.next_attempt = self.after_failure(started, now);
            }
        }
    }

    /// The result of an [`Action::Create`] or [`Action::Update`] that completed at `now`, in the
    /// elector's `stage`.
    pub fn on_write(&mut self, now: MonotonicTime, result: Result<Version, LockError>, stage: Stage) {
        // A renew reply handled after the fencing deadline must not revive an ended tenure.
        self.fence(now);
        let Some(Pending::Write { started, kind, record }) = self.pending.take() else {
            return;
        };
        let notified = self.notified_while_pending.take();
        let confirming = std::mem::take(&mut self.confirming);
        self.consecutive_failures = match &result {
            Err(error) if !error.is_conflict() => self.consecutive_failures.saturating_add(1),
            _ => 0,
        };
        let version = match result {
            Ok(version) => version,
            Err(error) => {
                if kind == WriteKind::Acquire && !error.is_conflict() && !confirming {
                    self.unconfirmed = Some(record);
                    // Its watch echo may have come before this reply: look at what was seen.
                    let seen = self.observed.as_ref().and_then(|o| o.stored.clone());
                    self.recognise_unconfirmed(seen.as_ref());
                }
                self.needs_read = true;
                self.next_attempt = if error.is_conflict() {
                    // News that arrived while the write was in flight (typically the release the
                    // conflict lost to) is already here: look now rather than a retry period later.
                    if self.has_watch && self.tenure.is_none() && notified.is_none() {
                        // The winner's record is on its way through the watch; read only if it
                        // does not arrive within a retry period.
                        now + self.timing.retry_period
                    } else {
                        now
                    }
                } else {
                    self.after_failure(started, now)
                };
                return;
            }
        };
        self.unconfirmed = None;
        let notified_other = notified.is_some_and(|n| n.as_ref() != Some(&version));
        let term = Term::from_count(record.leader_transitions);
        self.observed =
            Some(Observed { stored: Some(StoredRecord { version, record: Ok(record.clone()) }), seen_at: now });
        self.note_term(term);
        self.needs_read = false;
        self.next_attempt = if self.releasing {
            // A release asked for while this write was in flight goes out at once (L2).
            now
        } else {
            (started + self.timing.retry_period).max(now)
        };
        let valid_until = started + self.timing.renew_deadline;
        match kind {
            WriteKind::Acquire => {
                self.last_own_term = Some(term);
                let leading = stage == Stage::Campaigning && !self.releasing && now < valid_until;
                self.tenure = Some(OwnTenure { term, acquire_time: record.acquire_time, valid_until, leading });
                if leading {
                    self.events.push_back(Event::StartedLeading { term });
                }
            }
            WriteKind::Renew => {
                if let Some(tenure) = self.tenure.as_mut().filter(|t| t.term == term) {
                    tenure.valid_until = tenure.valid_until.max(valid_until);
                }
            }
            WriteKind::Release if self.releasing => self.released(now),
            WriteKind::Release => self.tenure = None,
        }
        if notified_other || std::mem::take(&mut self.resync_after_pending) {
            // A notification arrived while the write was in flight: it may be older than the
            // write (then the read changes nothing) or newer (someone wrote on top, typically
            // taking a lock just released); find out now rather than at the next conflict.
            self.needs_read = true;
            self.next_attempt = now;
        }
        self.publish_holder();
    }

    /// A change pushed by the lock's watch, received at `now`.
    pub fn on_change(&mut self, now: MonotonicTime, stored: Option<StoredRecord>) {
        self.fence(now);
        self.observe(now, stored, false);
    }

    /// Stops leading now but keeps holding (and renewing, while the stage is
    /// [`Stage::Draining`]) the lock, so that nobody else starts leading while the user's work
    /// finishes. Follow with [`Candidate::release`].
    pub fn step_down(&mut self, _now: MonotonicTime) {
        self.stop_leading(StopReason::SteppedDown);
    }

    /// Starts the release: the candidate writes the release (holder cleared,
    /// `leaseDurationSeconds: 1`) if the lock still holds its tenure, until
    /// [`Candidate::has_released`]. From then it leaves the lock to others for one lease (what
    /// a resign asks; after a shutdown the stage is [`Stage::Stopped`] and it never campaigns).
    pub fn release(&mut self, now: MonotonicTime) {
        self.step_down(now);
        self.releasing = true;
        self.next_attempt = now;
    }

    /// The release is over at `now`: nothing of this candidate's is in the lock. After a resign
    /// it leaves the lock to others for one lease (a shutdown never campaigns again).
    fn released(&mut self, now: MonotonicTime) {
        self.releasing = false;
        self.tenure = None;
        self.hold_off_until = Some(now + self.timing.lease_duration);
        self.next_attempt = now;
    }

    /// Forgets any in-flight action, as if its reply was lost (used when the driver gives up on a
    /// call that timed out).
    pub fn abandon_pending(&mut self, now: MonotonicTime) {
        if let Some(pending) = self.pending.take() {
            if let Pending::Write { kind: WriteKind::Acquire, record, .. } = pending {
                if !std::mem::take(&mut self.confirming) {
                    self.unconfirmed = Some(record);
                }
            }
            self.needs_read = true;
            self.next_attempt = now;
        }
    }

    /// Ends the tenure now because its guards' deadline passed before the driver could extend
    /// it (the driver woke late): like self-fencing, the candidate then acquires again under a
    /// new term, so the lapsed tenure never comes back (S2).
    pub fn lapse(&mut self) {
        if self.tenure.as_ref().is_some_and(|t| t.leading) {
            self.stop_leading(StopReason::RenewDeadlineExceeded);
            self.tenure = None;
        }
    }

    fn fence(&mut self, now: MonotonicTime) {
        if self.tenure.as_ref().is_some_and(|t| now >= t.valid_until) {
            self.stop_leading(StopReason::RenewDeadlineExceeded);
            self.tenure = None;
        }
    }

    fn stop_leading(&mut self, reason: StopReason) {
        if let Some(tenure) = self.tenure.as_mut().filter(|t| t.leading) {
            tenure.leading = false;
            self.events.push_back(Event::StoppedLeading { term: tenure.term, reason });
        }
    }

    fn same_as_observed(&self, stored: &Option<StoredRecord>) -> bool {
        let version = |stored: &Option<StoredRecord>| stored.as_ref().map(|s| s.version.clone());
        self.observed.as_ref().is_some_and(|o| version(&o.stored) == version(stored))
    }

    fn observe(&mut self, now: MonotonicTime, stored: Option<StoredRecord>, authoritative: bool) {
        if !authoritative && self.pending.is_some() {
            self.notified_while_pending = Some(stored.as_ref().map(|s| s.version.clone()));
        }
        if self.same_as_observed(&stored) {
            return;
        }
        self.recognise_unconfirmed(stored.as_ref());
        let ours = self.is_own_tenure(stored.as_ref());
        if (self.tenure.is_some() || self.holds_lock()) && !ours {
            if !authoritative {
                // A watch may deliver an event older than our last write; confirm with a read
                // before giving up a tenure.
                self.needs_read = true;
                self.next_attempt = now;
                return;
            }
            self.stop_leading(StopReason::LockLost);
            self.tenure = None;
        }
        if let Some(Ok(record)) = stored.as_ref().map(|s| &s.record) {
            self.note_term(Term::from_count(record.leader_transitions));
        }
        if self.coordinated {
            self.observe_coordination(stored.as_ref(), ours);
        }
        // A deletion does not end another holder's lease (see the module documentation); the
        // holder itself, having seen it, knows its tenure is over.
        self.deleted_lease_until = match (&stored, self.classify(), self.observed_lease()) {
            (None, Holder::Other { .. }, Some(lease)) => Some(now + lease),
            _ => None,
        };
        self.observed = Some(Observed { stored, seen_at: now });
        if !authoritative && self.pending.is_none() {
            // Fresh news needs no read. Someone else's change may call for a decision now; our own
            // record (the echo of a write whose reply was lost) must not pull the next renew
            // forward, or every lost reply would trigger another write at once.
            self.needs_read = false;
            if !ours {
                self.next_attempt = now;
            }
        }
        self.publish_holder();
    }

    /// Coordinated: notes a grant (the record changed to name this candidate) and asks once per
    /// term for a handover when the coordinator prefers another candidate.
    fn observe_coordination(&mut self, stored: Option<&StoredRecord>, ours: bool) {
        let names_self = |stored: Option<&StoredRecord>| {
            matches!(stored.map(|s| &s.record), Some(Ok(r)) if r.holder_identity == self.identity)
        };
        let named_before = self.observed.as_ref().map(|o| names_self(o.stored.as_ref()));
        // A record first seen naming this candidate is a grant only if nobody renewed it yet (the
        // coordinator writes acquireTime = renewTime): the candidacy may be published before
        // the first read. Otherwise it may be a live duplicate's, and is waited out.
        let fresh = matches!(stored.map(|s| &s.record), Some(Ok(r)) if r.acquire_time == r.renew_time);
        self.granted = match (named_before, names_self(stored)) {
            (Some(false), true) | (None, true) if !ours && (named_before.is_some() || fresh) => {
                stored.map(|s| s.version.clone())
            }
            _ => None,
        };
        let Some(Ok(record)) = stored.map(|s| &s.record) else { return };
        let Some(tenure) = self.tenure.as_ref().filter(|t| ours && t.leading) else { return };
        if let Some(to) = record.preferred_other_than(&self.identity) {
            if self.handover_asked != Some(tenure.term) {
                self.handover_asked = Some(tenure.term);
                self.events.push_back(Event::HandoverRequested { term: tenure.term, to: to.to_owned() });
            }
        }
    }

    fn publish_holder(&mut self) {
        let current = match self.observed_record() {
            Some(r) if !r.holder_identity.is_empty() => {
                (Some(r.holder_identity.clone()), Some(Term::from_count(r.leader_transitions)))
            }
            _ => (None, None),
        };
        if self.published_holder.as_ref() != Some(&current) {
            self.published_holder = Some(current.clone());
            self.events.push_back(Event::LeaderObserved { leader: current.0, term: current.1 });
        }
    }

    /// Makes the record ours if it is the acquisition this candidate could not confirm: its
    /// identity, term and lease, and its times to the second (the precision of the annotation
    /// records). Only a duplicate of this identity writing the same term within the same second
    /// could look alike, and two processes under one identity are already one leader to
    /// everybody else.
    fn recognise_unconfirmed(&mut self, stored: Option<&StoredRecord>) {
        let (Some(sent), Some(Ok(seen))) = (&self.unconfirmed, stored.map(|s| &s.record)) else { return };
        let second = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp());
        // A coordinator that named another preferred holder since decides otherwise: not ours.
        let preferred_elsewhere = seen.preferred_holder.as_deref().is_some_and(|p| p != self.identity);
        let same = !preferred_elsewhere
            && seen.holder_identity == sent.holder_identity
            && seen.leader_transitions == sent.leader_transitions
            && seen.lease_duration_seconds == sent.lease_duration_seconds
            && second(seen.acquire_time) == second(sent.acquire_time)
            && second(seen.renew_time) == second(sent.renew_time);
        if same {
            self.last_own_term = Some(Term::from_count(seen.leader_transitions));
            self.unconfirmed = None;
            self.confirming = true;
        }
    }

    fn is_own_tenure(&self, stored: Option<&StoredRecord>) -> bool {
        match (stored.map(|s| &s.record), self.last_own_term) {
            (Some(Ok(r)), Some(own)) => {
                r.holder_identity == self.identity && u64::try_from(r.leader_transitions).ok() == Some(own.0)
            }
            _ => false,
        }
    }

    fn classify(&self) -> Holder {
        let holder = self.classify_record();
        let strategy = self.observed_record().and_then(|r| r.coordination_strategy());
        match (self.coordinated, strategy, holder) {
            (_, _, Holder::Ours) => Holder::Ours,
            // A lease under a strategy this candidate does not know is not its to take, even if
            // named in it: another coordinator decides by rules it cannot follow.
            (true, Some(s), _) if s != Self::COORDINATED_STRATEGY => Holder::NotOurs,
            (true, _, _) if self.is_granted() => Holder::Granted,
            // A record that named this identity when first seen: waited out (a restart).
            (true, _, holder @ Holder::Other { .. }) if self.observed_leader() == Some(self.identity.as_str()) => holder,
            (true, _, _) => Holder::NotOurs,
            // A coordinated lease is not taken by candidates outside the coordination.
            (false, Some(_), Holder::Free | Holder::Other { .. }) => Holder::NotOurs,
            (false, _, holder) => holder,
        }
    }

    fn is_granted(&self) -> bool {
        let version = self.observed.as_ref().and_then(|o| o.stored.as_ref()).map(|s| &s.version);
        self.granted.is_some() && self.granted.as_ref() == version
    }

    fn classify_record(&self) -> Holder {
        let Some(observed) = &self.observed else { return Holder::Absent };
        let Some(stored) = &observed.stored else {
            return self.deleted_lease_until.map_or(Holder::Absent, |expires_at| Holder::Other { expires_at });
        };
        if self.is_own_tenure(Some(stored)) {
            return Holder::Ours;
        }
        match &stored.record {
            Ok(r) if r.holder_identity.is_empty() => Holder::Free,
            _ => Holder::Other { expires_at: observed.seen_at + self.lease_of(stored) },
        }
    }

    /// The lease of the record last observed, if there is one.
    fn observed_lease(&self) -> Option<Duration> {
        let stored = self.observed.as_ref()?.stored.as_ref()?;
        Some(self.lease_of(stored))
    }

    /// How long a record's holder may lead after it was seen.
    fn lease_of(&self, stored: &StoredRecord) -> Duration {
        match &stored.record {
            // A lease longer than any valid configuration is not honoured beyond that maximum.
            Ok(r) => Duration::from_secs(u64::try_from(r.lease_duration_seconds).unwrap_or(0)).min(MAX_LEASE),
            // Unknown holder: respect one full lease of our own configuration.
            Err(_) => self.timing.lease_duration,
        }
    }

    fn write(&mut self, now: MonotonicTime, kind: WriteKind, record: LeaderElectionRecord) -> Option<Action> {
        let expected = self.observed.as_ref().and_then(|o| o.stored.as_ref()).map(|s| s.version.clone());
        self.pending = Some(Pending::Write { started: now, kind, record: record.clone() });
        self.notified_while_pending = None;
        Some(match expected {
            Some(expected) => Action::Update { expected, record },
            None => Action::Create(record),
        })
    }

    fn acquired_record(&self, wall: DateTime<Utc>) -> LeaderElectionRecord {
        let observed = self.observed_record().map_or(0, |r| r.leader_transitions.max(0) as u64);
        self.own_record(wall, Term(observed.max(self.highest_term_seen.0)).next(), Some(wall))
    }

    fn renewed_record(&self, wall: DateTime<Utc>) -> LeaderElectionRecord {
        let tenure = self.tenure.as_ref();
        self.own_record(wall, tenure.map_or(Term(0), |t| t.term), tenure.and_then(|t| t.acquire_time))
    }

    fn own_record(&self, wall: DateTime<Utc>, term: Term, acquire_time: Option<DateTime<Utc>>) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: self.identity.clone(),
            lease_duration_seconds: i64::from(self.timing.lease_seconds()),
            acquire_time,
            renew_time: Some(wall),
            leader_transitions: i64::try_from(term.0).unwrap_or(i64::MAX),
            ..Default::default()
        }
    }

    fn released_record(&self, wall: DateTime<Utc>) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            leader_transitions: self.observed_record().map_or(0, |r| r.leader_transitions),
            ..Default::default()
        }
    }

    fn note_term(&mut self, term: Term) {
        self.highest_term_seen = self.highest_term_seen.max(term);
    }

    fn jittered_retry(&mut self) -> Duration {
        let spread = self.rng.random::<f64>() * self.timing.jitter_factor;
        self.timing.retry_period.mul_f64(1.0 + spread)
    }

    /// When to call again after a call started at `started` failed at `now`: a leader retries
    /// every retry period until its renew deadline; anyone else backs off exponentially from one
    /// jittered retry period, up to [`Timing::max_failure_backoff`] less up to a fifth (so that
    /// candidates started together do not probe in step). Counted from the start of the call:
    /// a call that timed out has waited already (see [`Timing::max_failure_backoff`]).
    fn after_failure(&mut self, started: MonotonicTime, now: MonotonicTime) -> MonotonicTime {
        let wait = if self.tenure.is_some() {
            self.timing.retry_period
        } else {
            let cap = self.timing.max_failure_backoff().mul_f64(1.0 - 0.2 * self.rng.random::<f64>());
            let first = self.jittered_retry().min(cap);
            crate::Backoff::new(first, cap).delay(self.consecutive_failures)
        };
        (started + wait).max(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::AfterRelease;

    /// No stop under way.
    const RUN: Stage = Stage::Campaigning;
    use crate::record::RecordError;

    const T0: MonotonicTime = MonotonicTime::ZERO;

    fn wall() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc()
    }

    fn held_by(holder: &str, version: &str, transitions: i64) -> Option<StoredRecord> {
        Some(StoredRecord {
            version: Version(version.into()),
            record: Ok(LeaderElectionRecord {
                holder_identity: holder.into(),
                lease_duration_seconds: 15,
                acquire_time: Some(wall()),
                renew_time: Some(wall()),
                leader_transitions: transitions,
                ..Default::default()
            }),
        })
    }

    /// Candidate `id` (default timing) whose first read, at T0, found `stored`.
    fn after_first_read(id: &str, stored: Option<StoredRecord>) -> Candidate {
        let mut c = Candidate::new(id, Timing::default(), true, 1);
        assert_eq!(c.poll_action(T0, wall(), RUN), Some(Action::Read));
        c.on_read(T0, Ok(stored));
        c
    }

    /// `a`, which created the lock at `T0` and leads under term 1.
    fn leading_from_t0() -> Candidate {
        let mut c = after_first_read("a", None);
        assert!(matches!(c.poll_action(T0, wall(), RUN), Some(Action::Create(_))));
        c.on_write(T0, Ok(Version("1".into())), RUN);
        c
    }

    fn events(c: &mut Candidate) -> Vec<Event> {
        std::iter::from_fn(|| c.poll_event()).collect()
    }

    /// Fails every read the candidate asks for from `start`, `count` times; the delays between them.
    fn failing_reads(c: &mut Candidate, start: MonotonicTime, count: usize) -> Vec<Duration> {
        let mut now = start;
        let mut delays = Vec::new();
        for _ in 0..count {
            assert_eq!(c.poll_action(now, wall(), RUN), Some(Action::Read));
            c.on_read(now, Err(LockError::Unavailable("connection refused".into())));
            let next = c.next_wakeup(RUN).unwrap();
            delays.push(next.0 - now.0);
            now = next;
        }
        delays
    }

    fn coordinated_lease(holder: &str, version: &str, transitions: i64, preferred: Option<&str>) -> Option<StoredRecord> {
        let mut stored = held_by(holder, version, transitions)?;
        if let Ok(record) = stored.record.as_mut() {
            record.strategy = Some(Candidate::COORDINATED_STRATEGY.into());
            record.preferred_holder = preferred.map(str::to_owned);
        }
        Some(stored)
    }

    #[test]
    fn a_coordinated_candidate_takes_only_what_the_coordinator_gives_it_and_hands_over_when_asked() {
        let timing = Timing::default();
        let mut c = Candidate::new("b", timing, true, 1).coordinated();
        assert_eq!(c.poll_action(T0, wall(), RUN), Some(Action::Read));
        c.on_read(T0, Ok(None));
        // Absent, then free, then another's expired lease: never taken, however long it waits.
        assert_eq!(c.poll_action(T0, wall(), RUN), None);
        assert_eq!(c.wait(T0, RUN).map(|w| w.0), Some(WaitReason::Coordinator));
        let later = T0 + Duration::from_secs(3600);
        c.on_change(later, coordinated_lease("", "2", 1, None));
        assert_eq!(c.poll_action(later, wall(), RUN), None);
        c.on_change(later, coordinated_lease("a", "3", 1, None));
        let expired = later + Duration::from_secs(3600);
        assert_eq!(c.poll_action(expired, wall(), RUN), None, "an expired lease is the coordinator's to give");

        // The coordinator names b: taken at once, under a new term.
        c.on_change(expired, coordinated_lease("b", "4", 2, None));
        let Some(Action::Update { expected, record }) = c.poll_action(expired, wall(), RUN) else {
            panic!("takes the grant")
        };
        assert_eq!((expected, record.holder_identity.as_str(), record.leader_transitions), (Version("4".into()), "b", 3));
        c.on_write(expired, Ok(Version("5".into())), RUN);
        assert_eq!(c.is_leader(expired), Some(Term(3)));
        events(&mut c);

        // It prefers a: one handover request for this term, however often it is seen.
        c.on_change(expired, coordinated_lease("b", "6", 3, Some("a")));
        c.on_change(expired, coordinated_lease("b", "7", 3, Some("a")));
        let asked: Vec<_> = events(&mut c).into_iter().filter(|e| matches!(e, Event::HandoverRequested { .. })).collect();
        assert_eq!(asked, vec![Event::HandoverRequested { term: Term(3), to: "a".into() }]);
    }

    #[test]
    fn a_coordinated_candidate_waits_out_a_renewed_record_naming_it_and_refuses_unknown_strategies() {
        let timing = Timing::default();
        // First seen naming b but renewed since it was given: perhaps a live duplicate's.
        let mut c = Candidate::new("b", timing, true, 1).coordinated();
        assert_eq!(c.poll_action(T0, wall(), RUN), Some(Action::Read));
        let mut renewed = coordinated_lease("b", "4", 2, None);
        if let Some(Ok(record)) = renewed.as_mut().map(|s| &mut s.record) {
            record.renew_time = Some(wall() + chrono::Duration::seconds(5));
        }
        c.on_read(T0, Ok(renewed));
        assert_eq!(c.poll_action(T0, wall(), RUN), None);
        let after_lease = T0 + timing.lease_duration;
        let taken = c.poll_action(after_lease, wall(), RUN);
        assert!(matches!(taken, Some(Action::Update { .. })), "taken after one lease");

        // A strategy it does not know: not even a grant is taken.
        let mut c = Candidate::new("b", timing, true, 1).coordinated();
        assert_eq!(c.poll_action(T0, wall(), RUN), Some(Action::Read));
        c.on_read(T0, Ok(coordinated_lease("a", "1", 1, None)));
        let mut other = coordinated_lease("b", "2", 2, None);
        if let Some(Ok(record)) = other.as_mut().map(|s| &mut s.record) {
            record.strategy = Some("example.com/Custom".into());
        }
        c.on_change(T0, other);
        assert_eq!(c.poll_action(T0 + Duration::from_secs(3600), wall(), RUN), None);
        assert_eq!(c.wait(T0, RUN).map(|w| w.0), Some(WaitReason::UnknownStrategy));
    }

    #[test]
    fn a_candidate_outside_the_coordination_never_takes_a_coordinated_lease() {
        let mut c = after_first_read("b", coordinated_lease("", "1", 1, None));
        assert_eq!(c.poll_action(T0 + Duration::from_secs(3600), wall(), RUN), None);
        assert_eq!(c.wait(T0, RUN).map(|w| w.0), Some(WaitReason::CoordinatedLease));
        // Without a strategy the same free lease is taken at once.
        c.on_change(T0, held_by("", "2", 1));
        assert!(matches!(c.poll_action(T0, wall(), RUN), Some(Action::Update { .. })));
    }

    #[test]
    fn a_follower_backs_off_exponentially_while_the_store_keeps_failing_up_to_the_outage_probe() {
        // A short retry period shows the doubling; the cap is the outage probe, less up to a fifth.
        let timing = Timing::new(Duration::from_secs(4), Duration::from_secs(2), Duration::from_millis(100)).unwrap();
        let mut c = Candidate::new("b", timing, true, 1);
        let delays = failing_reads(&mut c, T0, 8);
        let poll_max = timing.retry_period.mul_f64(1.0 + timing.jitter_factor);
        assert!(delays[0] >= timing.retry_period && delays[0] <= poll_max, "{delays:?}");
        assert!(delays[1] >= timing.retry_period * 2, "doubles: {delays:?}");
        assert_eq!(timing.max_failure_backoff(), crate::timing::OUTAGE_PROBE);
        let floor = crate::timing::OUTAGE_PROBE.mul_f64(0.8);
        assert!(delays.iter().all(|d| *d <= crate::timing::OUTAGE_PROBE), "{delays:?}");
        assert!(delays[6..].iter().all(|d| *d >= floor), "capped: {delays:?}");

        // One answer ends the streak: the next failure waits one retry period again.
        let now = T0 + Duration::from_secs(300);
        c.needs_read = true;
        c.next_attempt = now;
        assert_eq!(c.poll_action(now, wall(), RUN), Some(Action::Read));
        c.on_read(now, Ok(held_by("a", "7", 3)));
        c.needs_read = true;
        let again = failing_reads(&mut c, now, 1);
        assert!(again[0] <= poll_max, "{again:?}");

        // With client-go's timing (2 s retry) a store that keeps refusing is asked within the
        // outage probe, never at the same instants by two candidates.
        let mut d = Candidate::new("d", Timing::default(), true, 2);
        let delays = failing_reads(&mut d, T0, 6);
        assert!(delays.iter().all(|d| *d <= crate::timing::OUTAGE_PROBE && *d >= floor), "{delays:?}");
        let mut e = Candidate::new("e", Timing::default(), true, 3);
        assert_ne!(delays, failing_reads(&mut e, T0, 6), "jittered");
    }

    #[test]
    fn an_own_takeover_whose_watch_echo_came_before_its_failed_reply_is_recognised() {
        let timing = Timing::default();
        let mut c = after_first_read("b", held_by("a", "1", 4));
        let expired = T0 + timing.lease_duration;
        let Some(Action::Update { record, .. }) = c.poll_action(expired, wall(), RUN) else { panic!() };
        // The store applied it and the watch said so; then the reply failed.
        c.on_change(expired, Some(StoredRecord { version: Version("2".into()), record: Ok(record) }));
        let failed = expired + timing.call_timeout;
        c.on_write(failed, Err(LockError::Timeout(timing.call_timeout)), RUN);
        let mut now = failed;
        let written = loop {
            match c.poll_action(now, wall(), RUN) {
                Some(Action::Read) => c.on_read(now, Ok(Some(StoredRecord {
                    version: Version("2".into()),
                    record: c.observed_record().cloned().map(Ok).unwrap(),
                }))),
                Some(Action::Update { expected, record }) => break (expected, record),
                other => panic!("b confirms its own record at once, not {other:?}"),
            }
            now = c.next_wakeup(RUN).unwrap().max(now);
            assert!(now < failed + timing.lease_duration, "b waited out its own record");
        };
        assert_eq!(written.0, Version("2".into()));
        assert_eq!(written.1.holder_identity, "b");
    }

    #[test]
    fn a_call_that_timed_out_is_followed_at_once() {
        let mut c = Candidate::new("b", Timing::default(), true, 1);
        assert_eq!(c.poll_action(T0, wall(), RUN), Some(Action::Read));
        let timeout = Timing::default().call_timeout;
        c.on_read(T0 + timeout, Err(LockError::Timeout(timeout)));
        assert_eq!(c.next_wakeup(RUN), Some(T0 + timeout), "the timeout was the wait");
        assert_eq!(c.poll_action(T0 + timeout, wall(), RUN), Some(Action::Read));
    }

    #[test]
    fn an_acquisition_applied_after_its_call_timed_out_is_taken_over_at_once() {
        // The leader "a" is gone; "b" writes its takeover, the store freezes, the call times out.
        let timing = Timing::default();
        let mut c = after_first_read("b", held_by("a", "1", 4));
        let expired = T0 + timing.lease_duration;
        let Some(Action::Update { record, .. }) = c.poll_action(expired, wall(), RUN) else { panic!() };
        assert_eq!(record.leader_transitions, 5);
        let timed_out = expired + timing.call_timeout;
        c.on_write(timed_out, Err(LockError::Timeout(timing.call_timeout)), RUN);
        assert_eq!(c.is_leader(timed_out), None);

        // The store thaws and applied the write: the next read shows it. Not somebody else's
        // lease to wait out: b confirms it with a write at once, and leads.
        let thawed = timed_out + Duration::from_secs(100);
        assert_eq!(c.poll_action(thawed, wall(), RUN), Some(Action::Read));
        c.on_read(thawed, Ok(Some(StoredRecord { version: Version("2".into()), record: Ok(record.clone()) })));
        let Some(Action::Update { expected, record: confirmed }) = c.poll_action(thawed, wall(), RUN) else { panic!() };
        assert_eq!(expected, Version("2".into()));
        c.on_write(thawed, Ok(Version("3".into())), RUN);
        assert_eq!(c.is_leader(thawed), Some(Term::from_count(confirmed.leader_transitions)));

        // A slow link: b's confirmation also lands only after its call timed out. Not recognised
        // again: b waits out a lease like everybody else instead of rewriting the record under a
        // new term every call timeout (which would keep everybody else waiting forever).
        let mut slow = after_first_read("b", held_by("a", "1", 4));
        let Some(Action::Update { record: first, .. }) = slow.poll_action(expired, wall(), RUN) else { panic!() };
        slow.on_write(timed_out, Err(LockError::Timeout(timing.call_timeout)), RUN);
        assert_eq!(slow.poll_action(thawed, wall(), RUN), Some(Action::Read));
        slow.on_read(thawed, Ok(Some(StoredRecord { version: Version("2".into()), record: Ok(first) })));
        let Some(Action::Update { record: second, .. }) = slow.poll_action(thawed, wall(), RUN) else { panic!() };
        let late = thawed + timing.call_timeout;
        slow.on_write(late, Err(LockError::Timeout(timing.call_timeout)), RUN);
        let mut now = late;
        loop {
            match slow.poll_action(now, wall(), RUN) {
                Some(Action::Read) => {
                    let stored = StoredRecord { version: Version("3".into()), record: Ok(second.clone()) };
                    slow.on_read(now, Ok(Some(stored)));
                }
                Some(other) => panic!("b wrote again before a lease had passed: {other:?}"),
                None => break,
            }
            now = slow.next_wakeup(RUN).unwrap().max(now);
        }
        let next = slow.next_wakeup(RUN).unwrap();
        assert!(next >= late + timing.lease_duration, "b waits out its own unconfirmed record");

        // The same record written by another process under b's identity, without an own
        // unconfirmed write: a restart, waited out.
        let mut restarted = after_first_read("b", Some(StoredRecord { version: Version("2".into()), record: Ok(record) }));
        assert_eq!(restarted.poll_action(T0, wall(), RUN), None);
    }

    #[test]
    fn a_leader_never_backs_off_its_renews() {
        let timing = Timing::default();
        let mut c = leading_from_t0();
        let mut now = T0 + timing.retry_period;
        while c.is_leader(now).is_some() {
            let down = LockError::Unavailable("down".into());
            match c.poll_action(now, wall(), RUN) {
                Some(Action::Read) => c.on_read(now, Err(down)),
                Some(Action::Update { .. }) => c.on_write(now, Err(down), RUN),
                other => panic!("a leader renews or reads, not {other:?}"),
            }
            let next = c.next_wakeup(RUN).unwrap();
            assert!(next.0 - now.0 <= timing.retry_period, "a leader retries every retry period");
            now = next;
        }
    }

    #[test]
    fn waits_on_a_deleted_or_corrupt_record_say_why_and_until_when() {
        let timing = Timing::default();
        let mut long = held_by("a", "7", 3);
        if let Some(StoredRecord { record: Ok(r), .. }) = long.as_mut() {
            r.lease_duration_seconds = 86_400;
        }
        let mut c = after_first_read("b", long);
        assert_eq!(c.wait(T0, RUN), None, "a valid holder's lease is not a wait to report");
        let seen = T0 + Duration::from_secs(5);
        c.on_change(seen, None);
        assert_eq!(c.wait(seen, RUN), Some((WaitReason::DeletedWhileHeld, seen + Duration::from_secs(86_400))));

        let corrupt =
            StoredRecord { version: Version("9".into()), record: Err(RecordError::Malformed("empty".into())) };
        let later = seen + Duration::from_secs(1);
        c.on_change(later, Some(corrupt));
        assert_eq!(c.wait(later, RUN), Some((WaitReason::CorruptRecord, later + timing.lease_duration)));
        assert_eq!(c.wait(later + timing.lease_duration, RUN), None, "over once the lease has run out");
    }

    #[test]
    fn a_follower_that_shuts_down_never_reports_stopped_leading_and_writes_nothing() {
        let mut c = after_first_read("b", held_by("a", "7", 3));
        assert_eq!(c.poll_action(T0, wall(), RUN), None);
        c.release(T0);
        assert_eq!(c.poll_action(T0, wall(), Stage::Releasing(AfterRelease::Stop)), None);
        assert!(c.has_released());
        assert!(events(&mut c).iter().all(|e| matches!(e, Event::LeaderObserved { .. })));
    }

    /// The simulation's bug 1 (tests/simulation.rs): the shell spun until the drain ended.
    #[test]
    fn a_draining_candidate_facing_an_expired_lease_waits_instead_of_spinning() {
        let mut c = after_first_read("b", held_by("a", "7", 3));
        c.step_down(T0);
        let late = T0 + Duration::from_secs(60);
        let draining = Stage::Draining(AfterRelease::Campaign);
        assert_eq!(c.poll_action(late, wall(), draining), None);
        assert!(c.next_wakeup(draining).unwrap() > late, "scheduled in the past: the driver would spin");
    }

    /// Found by comparing the simulation's schedules before and after the stage moved into the
    /// lifecycle (seed 19100): a resign's release outlived its stop, a second stop began, and
    /// the late release finishing made the candidate campaign (and, once its hold-off ended,
    /// take the lock and lead) while the elector was still draining.
    #[test]
    fn a_release_that_outlives_its_stop_never_makes_a_draining_candidate_campaign() {
        let timing = Timing::default();
        let mut c = leading_from_t0();
        let resigning = Stage::Releasing(AfterRelease::Campaign);
        c.step_down(T0);
        c.release(T0);
        assert!(matches!(c.poll_action(T0, wall(), resigning), Some(Action::Update { .. })), "the release");
        // The stop gives up on the release at its deadline; a second stop starts draining.
        let draining = Stage::Draining(AfterRelease::Campaign);
        c.step_down(T0 + timing.renew_deadline);
        // The first release lands only now.
        let landed = T0 + timing.renew_deadline + Duration::from_millis(1);
        c.on_write(landed, Ok(Version("2".into())), draining);
        assert!(!c.holds_lock());
        let mut now = landed;
        while now < landed + timing.lease_duration * 4 {
            let action = c.poll_action(now, wall(), draining);
            assert!(matches!(action, None | Some(Action::Read)), "took the lock while draining: {action:?}");
            if action.is_some() {
                let released = StoredRecord { version: Version("2".into()), record: Ok(c.released_record(wall())) };
                c.on_read(now, Ok(Some(released)));
            }
            now = c.next_wakeup(draining).expect("a draining candidate wakes").max(now + Duration::from_millis(1));
        }
        assert_eq!(c.is_leader(now), None);
    }

    #[test]
    fn a_leader_renews_one_retry_period_after_the_start_of_its_last_renew() {
        let timing = Timing::default();
        let mut c = after_first_read("a", None);
        assert!(matches!(c.poll_action(T0, wall(), RUN), Some(Action::Create(_))));
        let replied = T0 + Duration::from_millis(300);
        c.on_write(replied, Ok(Version("1".into())), RUN);
        assert!(events(&mut c).contains(&Event::StartedLeading { term: Term(1) }));
        // Validity counts from the start of the write, not from its reply (S1).
        assert_eq!(c.leader_valid_until(), Some(T0 + timing.renew_deadline));
        assert_eq!(c.next_wakeup(RUN), Some(T0 + timing.retry_period));
        let renew_at = T0 + timing.retry_period;
        let Some(Action::Update { expected, record }) = c.poll_action(renew_at, wall(), RUN) else {
            panic!("no renew")
        };
        assert_eq!((expected, record.leader_transitions), (Version("1".into()), 1));
    }

    #[test]
    fn a_lock_deleted_while_held_is_created_only_one_lease_after_the_deletion_was_seen() {
        let mut c = after_first_read("b", held_by("a", "7", 3));
        let deleted = T0 + Duration::from_secs(4);
        c.on_change(deleted, None);
        assert_eq!(c.poll_action(deleted, wall(), RUN), None, "the holder may not know yet: no create");
        assert_eq!(c.next_wakeup(RUN), Some(deleted + Duration::from_secs(15)));
        let at_record_expiry = c.poll_action(T0 + Duration::from_secs(15), wall(), RUN);
        assert_eq!(at_record_expiry, None, "the record's own lease is not enough");
        let Some(Action::Create(record)) = c.poll_action(deleted + Duration::from_secs(15), wall(), RUN) else {
            panic!("a lease after the deletion: create")
        };
        assert_eq!(record.leader_transitions, 4, "the term still grows past the deleted record's");

        // The view may be stale (renews missed while reads failed): the wait counts from the
        // deletion, so a record that looks expired is still waited out once.
        let mut c = after_first_read("b", held_by("a", "7", 3));
        let late = T0 + Duration::from_secs(16);
        c.on_change(late, None);
        assert_eq!(c.poll_action(late, wall(), RUN), None);
        assert_eq!(c.next_wakeup(RUN), Some(late + Duration::from_secs(15)));

        // A lock that was free when deleted is created at once.
        let mut c = after_first_read("b", held_by("", "7", 3));
        c.on_change(late, None);
        assert!(matches!(c.poll_action(late, wall(), RUN), Some(Action::Create(_))));
    }

    #[test]
    fn a_restarted_process_with_the_same_identity_waits_out_its_previous_lease() {
        let mut c = after_first_read("a", held_by("a", "9", 4));
        assert_eq!(c.poll_action(T0, wall(), RUN), None);
        assert_eq!(c.next_wakeup(RUN), Some(T0 + Duration::from_secs(15)));
    }
}
