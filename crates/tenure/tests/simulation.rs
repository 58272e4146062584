//! A randomized, deterministic simulation of the record-lock elector's core, [`RecordCore`] (the
//! candidate plus the lock's watch, as the shell runs it), against a model of a record store,
//! under `tenure::simulation`'s shell rules, faults and checks (S1, S2, availability, L1
//! failover, busy loops, panics: see that module).
//!
//! - **2 to 7 candidates**, clock rates within `d = 0.9 x Timing::max_clock_drift()` of 1 (18 %
//!   for client-go's defaults, 30 % for the `--ttl` mapping; `TENURE_SIM_DRIFT_FRACTION` changes
//!   the 0.9). Timings: client-go's defaults (15/10/2 s) in a third of the schedules,
//!   `Timing::from_ttl(2..=10 s)` in the rest.
//! - **the store**: one record, a version counter and the compare-and-swap of `locks/memory.rs`
//!   (create: `AlreadyExists` if present; update: `Conflict` at another version). Every write is
//!   stamped with its writer's wall clock, skewed by up to an hour, which the cores must ignore
//!   (S3). Requests and replies take 0.1 to 50 ms each; a request is applied when it arrives;
//!   dropped requests and lost replies answer `Unavailable`. In half of the schedules a watch
//!   notifies every change within 50 ms, in order; half of these coalesce like
//!   `MemoryLock::watch` (they deliver the record as it is on delivery).
//! - **faults**, besides the harness's (storms, crashes, pauses up to 2 leases, shutdowns and
//!   resigns): a partition of one process (its requests fail, its watch breaks and cannot reopen)
//!   and a broken watch.
//! - **checks**, besides the harness's:
//!   - **S1 from the outside**: a process that believes it leads with term `t` received the
//!     answer to a write of `t` that started less than the renew deadline ago on its clock;
//!   - **availability** within `B = (lease + Q) / r + W + 4 RTT` of the last disturbance, with
//!     `r` the slowest clock rate, `RTT = 100 ms`, `W = 50 ms` with a watch (else 0), `P =
//!     retry_period x (1 + jitter_factor)` and `Q = Timing::max_failure_backoff()` (a process
//!     whose calls kept failing backs off that long before it reads again);
//!   - **L1 failover** within `F = lease / r + W + 2 RTT` with a watch (the leader's last write
//!     in flight, its notification, the lease on the followers' clocks, the acquire), else
//!     `F = (lease + P) / r + 4 RTT` (followers see the last write at their next poll);
//!   - **L2 handover** (with a watch): after a release lands, if nothing disturbs and another
//!     process could take over (up, watching, not stopping nor holding off after a resign),
//!     somebody starts leading within `W + RTT`.
//!
//! The mutation checks show the checker failing: 10 % more drift than `max_clock_drift` allows
//! gives two leaders, a store that ignores compare-and-swap a repeated term, and a failover bound
//! of half a lease is broken. Last, minimal reproductions of bugs the simulation found in the
//! candidate.
//!
//! `TENURE_SIM_SCHEDULES` (default 10,000), `TENURE_SIM_BASE_SEED`, `TENURE_SIM_DRIFT_FRACTION`,
//! and `TENURE_SIM_SEED=<seed> cargo test -p tenure --test simulation -- --nocapture` (replay,
//! printing the trace).

use std::time::Duration;

use chrono::DateTime;
use rand::RngExt;
use tenure::record_core::{RecordCall, RecordCore, RecordInput};
use tenure::simulation::{assert_caught, run_schedules, Ev, Model, Opening, Stats, World, MS};
use tenure::{
    Action, AfterRelease, Candidate, ElectionCore, Event, LeaderElectionRecord, LockError, MonotonicTime, Role, Stage,
    StoredRecord, Timing, Version,
};

/// The longest one-way delay of a request, a reply or a notification outside faults.
const MAX_DELAY: u64 = 50 * MS;
/// Wall clock at global time zero (2024-01-01T00:00:00Z), in nanoseconds.
const WALL_EPOCH: i64 = 1_704_067_200 * 1_000_000_000;

/// What the checker runs with; the mutation checks break one thing each.
#[derive(Debug, Clone, Copy)]
struct Params {
    /// Clock-rate spread as a fraction of `Timing::max_clock_drift()`.
    drift_fraction: f64,
    /// A store that applies every write whatever its version.
    broken_cas: bool,
    /// A failover bound of this fraction of the lease instead of `F`.
    failover_of_lease: Option<f64>,
}

const REAL: Params = Params { drift_fraction: 0.9, broken_cas: false, failover_of_lease: None };

#[derive(Debug)]
struct Store {
    timing: Timing,
    has_watch: bool,
    coalescing: bool,
    broken_cas: bool,
    record: Option<(u64, LeaderElectionRecord)>,
    /// Per process: its wall clock's skew (ns), whether it is cut off, its open watch.
    skew: Vec<i64>,
    partitioned: Vec<bool>,
    watch: Vec<Option<u64>>,
    watches_opened: u64,
    /// The term of each version written by its holder (0: by another), and per process the term
    /// and start of the last such write whose answer it received.
    terms: Vec<u64>,
    last_ok_write: Vec<Option<(u64, MonotonicTime)>>,
    /// A release landed at `.0`, by `.2`: somebody starts leading by `.1`, unless the
    /// disturbance mark moves on from `.3`.
    handover: Option<(u64, u64, usize, u64)>,
}

#[derive(Debug)]
enum Msg {
    /// A watch notification: (process, watch, record (`None`: coalescing, the record as it is on
    /// delivery), whether a fault delayed it).
    Watch(usize, u64, Option<StoredRecord>, bool),
    Heal(usize),
}

impl Store {
    fn current(&self) -> Option<StoredRecord> {
        let (version, record) = self.record.as_ref()?;
        Some(StoredRecord { version: Version(version.to_string()), record: Ok(record.clone()) })
    }

    fn error(call: RecordCall, error: LockError) -> RecordInput {
        match call {
            RecordCall::Lock(Action::Read, _) => RecordInput::Read(Err(error)),
            RecordCall::Lock(_, started) => RecordInput::Write(Err(error), started),
            RecordCall::OpenWatch => unreachable!("opening the watch has no time limit"),
        }
    }

    fn write(&mut self, w: &mut World<Store>, from: usize, mut record: LeaderElectionRecord) -> Version {
        // Taken before this write's notifications are scheduled: a slow one voids L2.
        let mark = w.mark();
        let version = self.record.as_ref().map_or(1, |(v, _)| v + 1);
        let wall = Some(DateTime::from_timestamp_nanos(WALL_EPOCH + w.now as i64 + self.skew[from]));
        if record.acquire_time == record.renew_time {
            record.acquire_time = wall;
        }
        record.renew_time = wall;
        let own = record.holder_identity == w.procs[from].core.identity();
        self.terms.push(if own { record.leader_transitions as u64 } else { 0 });
        let released = record.holder_identity.is_empty();
        self.record = Some((version, record));
        for to in 0..w.procs.len() {
            let Some(watch) = self.watch[to].filter(|_| w.procs[to].alive) else { continue };
            let delay = if w.rng.random_bool(w.faults.slow) {
                (w.lease as f64 * w.rng.random_range(0.1..1.0)) as u64
            } else {
                w.delay()
            };
            let at = w.in_order(to, w.now + delay);
            let faulty = at > w.now + MAX_DELAY;
            if faulty {
                w.inject_fault(at);
            }
            let record = if self.coalescing { None } else { self.current() };
            w.push(at, Ev::Model(Msg::Watch(to, watch, record, faulty)));
        }
        if released && self.has_watch {
            let deadline = w.now + 3 * MAX_DELAY + MS;
            self.handover = Some((w.now, deadline, from, mark));
            w.push(deadline, Ev::Check);
        }
        Version(version.to_string())
    }

    fn break_watch(&mut self, w: &mut World<Store>, p: usize) {
        if self.watch[p].take().is_some() {
            let input = RecordInput::WatchFailed(LockError::Unavailable("watch broken".into()));
            w.push(w.now, Ev::Notice(p, input));
        }
    }
}

impl Model for Store {
    type Call = RecordCall;
    type Input = RecordInput;
    type Core = RecordCore;
    type Msg = Msg;

    fn core(&mut self, w: &mut World<Store>, p: usize) -> RecordCore {
        self.last_ok_write[p] = None;
        self.watch[p] = None;
        if self.has_watch {
            // The transport opens the watch as it starts; cut off, the watch fails at once.
            self.watches_opened += 1;
            self.watch[p] = Some(self.watches_opened);
            if self.partitioned[p] {
                self.break_watch(w, p);
            }
        }
        // A virtual wall clock: the records of a seed are the same on every run.
        let wall_at_zero = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default();
        RecordCore::new(Candidate::new(format!("c{p}"), self.timing, self.has_watch, w.rng.random()), wall_at_zero)
    }

    fn limit(&self, call: &RecordCall) -> Option<Duration> {
        matches!(call, RecordCall::Lock(..)).then_some(self.timing.call_timeout)
    }

    fn start(&mut self, w: &mut World<Store>, p: usize, _open_watch: RecordCall) {
        let open = !self.partitioned[p];
        if open {
            self.watches_opened += 1;
            self.watch[p] = Some(self.watches_opened);
            w.disturb();
        }
        w.push(w.now, Ev::Notice(p, RecordInput::WatchOpened(open)));
    }

    fn apply(&mut self, w: &mut World<Store>, from: usize, call: RecordCall) -> Option<RecordInput> {
        if self.partitioned[from] {
            return Some(Store::error(call, LockError::Unavailable("partitioned".into())));
        }
        let RecordCall::Lock(action, started) = call else { unreachable!("no time limit") };
        let version = self.record.as_ref().map(|(v, _)| Version(v.to_string()));
        Some(match action {
            Action::Read => RecordInput::Read(Ok(self.current())),
            Action::Create(_) if version.is_some() && !self.broken_cas => {
                RecordInput::Write(Err(LockError::AlreadyExists), started)
            }
            Action::Update { expected, .. } if version.as_ref() != Some(&expected) && !self.broken_cas => {
                RecordInput::Write(Err(LockError::Conflict), started)
            }
            Action::Create(record) | Action::Update { record, .. } => {
                RecordInput::Write(Ok(self.write(w, from, record)), started)
            }
        })
    }

    fn lost(&self, call: RecordCall) -> Option<RecordInput> {
        Some(Store::error(call, LockError::Unavailable("connection reset".into())))
    }

    fn timed_out(&self, call: RecordCall) -> RecordInput {
        Store::error(call, LockError::Timeout(self.timing.call_timeout))
    }

    fn answered(&mut self, _w: &mut World<Store>, p: usize, input: &RecordInput) {
        if let RecordInput::Write(Ok(version), started) = input {
            if let Some(&term) = version.0.parse().ok().and_then(|v: usize| self.terms.get(v)).filter(|t| **t > 0) {
                self.last_ok_write[p] = Some((term, *started));
            }
        }
    }

    fn target(msg: &Msg) -> Option<(usize, bool)> {
        match msg {
            Msg::Watch(to, ..) => Some((*to, true)),
            Msg::Heal(_) => None,
        }
    }

    fn handle(&mut self, w: &mut World<Store>, msg: Msg) -> Result<(), String> {
        match msg {
            Msg::Watch(to, watch, record, faulty) => {
                if faulty {
                    w.disturb();
                }
                if self.watch[to] == Some(watch) {
                    let record = record.or_else(|| self.current());
                    w.procs[to].notify(w.now, RecordInput::Changed(record));
                    w.turn(self, to)?;
                }
            }
            Msg::Heal(p) => {
                self.partitioned[p] = false;
                w.disturb();
            }
        }
        Ok(())
    }

    fn reachable(&self, p: usize) -> bool {
        !self.partitioned[p]
    }

    fn fault(&mut self, w: &mut World<Store>, p: usize, kind: u8) {
        if kind == 0 && !self.partitioned[p] {
            let length = (w.lease as f64 * w.rng.random_range(0.5..2.5)) as u64;
            self.partitioned[p] = true;
            w.push(w.now + length, Ev::Model(Msg::Heal(p)));
        }
        self.break_watch(w, p);
        w.disturb();
    }

    fn check(&mut self, w: &mut World<Store>) -> Result<(), String> {
        let renew_deadline = self.timing.renew_deadline;
        if let Some((p, term)) = w.believed {
            let local = w.procs[p].clock.local(w.now);
            match self.last_ok_write[p] {
                Some((t, started)) if t == term && local < started + renew_deadline => {}
                last => {
                    return Err(format!(
                        "S1: {p} believes it leads with term {term} at {local:?}, but its last successful write \
                         of its tenure was {last:?} (renew deadline {renew_deadline:?})"
                    ))
                }
            }
        }
        let Some((released_at, deadline, releaser, mark)) = self.handover else { return Ok(()) };
        let satisfied = w.last_start >= released_at;
        if w.now < deadline && !satisfied {
            return Ok(());
        }
        self.handover = None;
        let could_take_over = |q: usize| {
            let (core, local) = (&w.procs[q].core, w.procs[q].clock.local(w.now));
            let stage = w.procs[q].lifecycle.stage();
            q != releaser
                && w.is_up(self, q)
                && self.watch[q].is_some()
                && stage == Stage::Campaigning
                && core.leadership(local, stage).role != Role::Releasing
                && core.wait(local, stage).is_none()
        };
        if !w.undisturbed_since(mark) || !(0..w.procs.len()).any(could_take_over) {
            return Ok(());
        }
        w.stats.handovers_checked += 1;
        if satisfied {
            return Ok(());
        }
        Err(format!(
            "L2: nobody started leading within {} ms of the release landing at {} ms",
            (deadline - released_at) / MS,
            released_at / MS
        ))
    }
}

fn schedule(seed: u64, params: Params) -> Result<Stats, String> {
    let mut w = World::new(seed);
    let n = w.rng.random_range(2..=7);
    let timing = match w.rng.random_range(0..3) {
        0 => Timing::default(),
        _ => Timing::from_ttl(Duration::from_secs(w.rng.random_range(2..=10))).expect("valid ttl"),
    };
    let has_watch = w.rng.random_bool(0.5);
    let mut store = Store {
        timing,
        has_watch,
        coalescing: has_watch && w.rng.random_bool(0.5),
        broken_cas: params.broken_cas,
        record: None,
        skew: (0..n).map(|_| w.rng.random_range(-3_600_000 * MS as i64..=3_600_000 * MS as i64)).collect(),
        partitioned: vec![false; n],
        watch: vec![None; n],
        watches_opened: 0,
        terms: vec![0],
        last_ok_write: vec![None; n],
        handover: None,
    };
    let lease = timing.lease_duration.as_nanos() as u64;
    let drift = (params.drift_fraction * timing.max_clock_drift()).min(0.8);
    w.populate(&mut store, n, drift, lease / 2, Opening::Random);
    (w.lease, w.max_delay, w.slow, w.storms_disturb) = (lease, MAX_DELAY, timing.call_timeout.as_nanos() as u64, true);
    w.storm = tenure::simulation::Faults { drop: 0.3, lost: 0.3, slow: 0.15 };
    // The bounds `B` and `F` (see the module documentation).
    let slowest = w.procs.iter().map(|p| p.clock.rate).fold(f64::MAX, f64::min);
    let scaled = |d: Duration| (d.as_nanos() as f64 / slowest).ceil() as u64;
    let lease_r = scaled(Duration::from_secs(timing.lease_seconds().into()));
    let poll = scaled(timing.retry_period.mul_f64(1.0 + timing.jitter_factor));
    let (rtt, watch) = (2 * MAX_DELAY, if has_watch { MAX_DELAY } else { 0 });
    w.settle_bound = lease_r + poll.max(scaled(timing.max_failure_backoff())) + watch + 4 * rtt + MS;
    w.failover_bound = Some(match params.failover_of_lease {
        Some(fraction) => (lease as f64 * fraction) as u64,
        None if has_watch => lease_r + MAX_DELAY + 2 * rtt + MS,
        None => lease_r + poll + 4 * rtt + MS,
    });
    w.run(store)
}

#[test]
fn randomized_schedules_keep_safety_terms_and_liveness() {
    let drift_fraction = std::env::var("TENURE_SIM_DRIFT_FRACTION")
        .map_or(REAL.drift_fraction, |v| v.trim().parse().expect("TENURE_SIM_DRIFT_FRACTION must be a number"));
    let stats = run_schedules(u64::MAX, |seed| schedule(seed, Params { drift_fraction, ..REAL }));
    // A checker that never looks is worthless: the interesting cases must have been exercised.
    let n = stats.schedules;
    assert!(n < 100 || stats.failovers_checked > n / 4, "too few failovers checked: {stats:?}");
    assert!(n < 100 || stats.long_pauses > n / 10, "too few long pauses: {stats:?}");
    assert!(n < 100 || stats.handovers_checked > n / 10, "too few handovers checked: {stats:?}");
}

/// With clock rates spread 10 % beyond `Timing::max_clock_drift()`, a paused or cut-off leader
/// with a slow clock still believes it leads when a follower with a fast clock takes over.
#[test]
fn checker_finds_two_leaders_when_drift_exceeds_the_bound() {
    assert_caught(400, "S1: processes", |seed| schedule(seed, Params { drift_fraction: 1.1, ..REAL }));
}

/// A store that applies every write whatever its version lets two candidates take the same term.
#[test]
fn checker_finds_repeated_terms_when_the_store_ignores_compare_and_swap() {
    assert_caught(400, "S2", |seed| schedule(seed, Params { broken_cas: true, ..REAL }));
}

/// Nobody may take over before the lease runs out, so a failover bound of half a lease must fail.
#[test]
fn checker_finds_slow_failover_against_a_bound_below_the_lease() {
    assert_caught(400, "L1", |seed| schedule(seed, Params { failover_of_lease: Some(0.5), ..REAL }));
}

// ------------------------------------------------------------------------------------------------
// Minimal reproductions of bugs the simulation found in the candidate: each drives one
// `Candidate` against a store that answers at once, and states the property the schedules check
// in its smallest form. Bug 1 (a draining candidate facing an expired lease asked to be woken in
// the past: the shell spun) is candidate.rs's unit test
// `a_draining_candidate_facing_an_expired_lease_waits_instead_of_spinning`.

fn at(ms: u64) -> MonotonicTime {
    MonotonicTime(Duration::from_millis(ms))
}

fn stored(version: u64, holder: &str, term: i64, lease_seconds: i64) -> StoredRecord {
    let record = LeaderElectionRecord {
        holder_identity: holder.into(),
        lease_duration_seconds: lease_seconds,
        leader_transitions: term,
        ..Default::default()
    };
    StoredRecord { version: Version(version.to_string()), record: Ok(record) }
}

/// One candidate and the store's record (compare-and-swap of `locks/memory.rs`); time jumps to
/// the candidate's next wake-up.
struct Bench {
    cand: Candidate,
    /// The elector's stage, moved as the lifecycle would: back to campaigning once released.
    stage: Stage,
    store: Option<StoredRecord>,
    now: MonotonicTime,
}

impl Bench {
    fn new(has_watch: bool) -> Bench {
        let cand = Candidate::new("a", Timing::default(), has_watch, 1);
        Bench { cand, stage: Stage::Campaigning, store: None, now: at(0) }
    }

    /// Runs until `limit`: the instant of the first `StartedLeading`, if any.
    fn run_until_leading(&mut self, limit: MonotonicTime) -> Option<MonotonicTime> {
        for _ in 0..100_000 {
            if let Some(action) = self.cand.poll_action(self.now, chrono::Utc::now(), self.stage) {
                self.perform(action);
            }
            if matches!(self.stage, Stage::Releasing(_)) && self.cand.has_released() {
                self.stage = Stage::Campaigning;
                continue;
            }
            if std::iter::from_fn(|| self.cand.poll_event()).any(|e| matches!(e, Event::StartedLeading { .. })) {
                return Some(self.now);
            }
            if !self.cand.is_busy() {
                self.now = self.now.max(self.cand.next_wakeup(self.stage)?);
            }
            if self.now > limit {
                return None;
            }
        }
        panic!("busy loop at {:?}", self.now)
    }

    fn perform(&mut self, action: Action) {
        let version = self.store.as_ref().map(|s| s.version.clone());
        let next = version.as_ref().map_or(1, |v| v.0.parse::<u64>().unwrap() + 1);
        let result = match action {
            Action::Read => return self.cand.on_read(self.now, Ok(self.store.clone())),
            Action::Create(_) if version.is_some() => Err(LockError::AlreadyExists),
            Action::Update { expected, .. } if version.as_ref() != Some(&expected) => Err(LockError::Conflict),
            Action::Create(record) | Action::Update { record, .. } => {
                self.store = Some(StoredRecord { version: Version(next.to_string()), record: Ok(record) });
                Ok(Version(next.to_string()))
            }
        };
        self.cand.on_write(self.now, result, self.stage);
    }

    /// Resigns now: the stop's release stage (the tenure's guards are dropped at once).
    fn resign(&mut self) {
        self.cand.step_down(self.now);
        self.cand.release(self.now);
        self.stage = Stage::Releasing(AfterRelease::Campaign);
    }
}

/// Bug 2: without a watch, a candidate that resigned did not read the lock during its one-lease
/// hold-off; if another took the lock meanwhile and died, the resigned one saw it only when its
/// hold-off ended and waited a full lease from then: failover took up to two leases.
#[test]
fn resigned_polling_candidate_counts_a_new_holders_lease_from_its_takeover() {
    let mut bench = Bench::new(false);
    assert_eq!(bench.run_until_leading(at(1000)), Some(at(0)));
    // a resigns at 1 s; its release lands at once. b takes the free lock at 1.5 s and dies.
    bench.now = at(1000);
    bench.resign();
    assert_eq!(bench.run_until_leading(bench.now), None);
    assert_eq!(bench.stage, Stage::Campaigning, "released");
    bench.store = Some(stored(3, "b", 2, 15));
    // a must see b's record within one jittered poll and take over one lease after that.
    let timing = Timing::default();
    let bound = at(1500) + timing.retry_period.mul_f64(1.0 + timing.jitter_factor) + timing.lease_duration;
    let started = bench.run_until_leading(bound + Duration::from_secs(60));
    assert!(started.is_some_and(|t| t <= bound), "a started leading at {started:?}, bound {bound:?}");
}

/// Bug 3: a watching follower with a read in flight is notified of the release; then the read's
/// reply, which left the store before the release, overwrote the newer observation with the old
/// holder's record: it waited a full lease on a free lock (L2 wants one round trip).
#[test]
fn stale_read_reply_does_not_hide_a_release_seen_through_the_watch() {
    let mut bench = Bench::new(true);
    assert_eq!(bench.cand.poll_action(at(0), chrono::Utc::now(), bench.stage), Some(Action::Read));
    // The read reaches the store while l holds the lock; l releases it; the notification of the
    // release arrives first, the read's reply second.
    bench.store = Some(stored(2, "", 1, 1));
    bench.cand.on_change(at(10), bench.store.clone());
    bench.now = at(20);
    bench.cand.on_read(bench.now, Ok(Some(stored(1, "l", 1, 15))));
    let started = bench.run_until_leading(at(60_000));
    assert!(started.is_some_and(|t| t <= at(1000)), "started leading at {started:?} on a free lock");
}

/// Bug 4: the same stale overwrite through a write's reply. a resigns; its release lands, a
/// watching b takes the free lock at once and dies, and b's record reaches a before the reply to
/// the release, which made a believe the lock free at the released version: when its hold-off
/// ended it conflicted, waited, read, and only then counted b's lease.
#[test]
fn release_reply_does_not_hide_a_takeover_seen_through_the_watch() {
    let mut bench = Bench::new(true);
    assert_eq!(bench.run_until_leading(at(0)), Some(at(0)));
    bench.now = at(1000);
    bench.resign();
    let release = bench.cand.poll_action(bench.now, chrono::Utc::now(), bench.stage);
    let Some(Action::Update { expected, record: released }) = release else {
        panic!("expected the release write")
    };
    assert_eq!(expected, Version("1".into()));
    // The release lands (v2), b takes the lock (v3); a's watch reports both before the reply.
    bench.store = Some(stored(3, "b", 2, 15));
    bench.cand.on_change(at(1010), Some(StoredRecord { version: Version("2".into()), record: Ok(released) }));
    bench.cand.on_change(at(1010), bench.store.clone());
    bench.now = at(1020);
    bench.cand.on_write(bench.now, Ok(Version("2".into())), bench.stage);
    let started = bench.run_until_leading(at(120_000));
    // b's lease counts from the notification (or a read right after the reply).
    let bound = at(1010) + Timing::default().lease_duration + Duration::from_millis(100);
    assert!(started.is_some_and(|t| t <= bound), "a started leading at {started:?}, bound {bound:?}");
}
