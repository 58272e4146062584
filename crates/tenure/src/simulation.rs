//! A deterministic simulation harness for [`ElectionCore`]s: the shell's rules with virtual time,
//! so that every backend's core runs under the same faults and checks (feature `simulation`).
//!
//! Why in the library: a backend's core (the record lock's, etcd's campaign, ZooKeeper's latch)
//! is tested against a model of its store, in the backend's crate; what is the same for all of
//! them lives here once. A backend implements [`Model`] (its store: what a call does when it
//! arrives, its notifications, its own faults and checks); [`World`] runs the rest:
//!
//! - **processes** ([`Process`]), each a core under the shell's rules on its own drifting clock:
//!   calls started as soon as asked, each bounded by its time limit; a timer at `poll_timeout`;
//!   the publisher's refusal to extend a tenure whose deadline has passed; a stop runs the
//!   shell's own [`Lifecycle`]: it steps down, drains (the user holds the tenure's guards a
//!   while, sometimes past the drain timeout) and releases, bounded by the renew deadline;
//! - **the network**: requests and answers delayed (0.1 ms to [`World::max_delay`], log-uniform);
//! - **faults in phases**: calm phases, and storms that drop requests, lose replies (applied) or
//!   slow calls down; each phase but the first and last opens with at most one process fault:
//!   a crash (and later a restart as a new core), a pause of up to two leases (the clock runs,
//!   nothing is handled; on resume what became ready is handled in an order tokio's `select!`
//!   could pick), a shutdown, a resign, or one of the model's own;
//! - **the checks**, at every event:
//!   - **S1**: at most one process believes it leads, judged as a [`crate::Tenure`] guard judges,
//!     on the process's own clock against the deadline the shell published (paused processes
//!     count: their clock runs); a tenure starts only after the previous one ended;
//!   - **S2**: every tenure's term is greater than every earlier one, and a tenure seen as over
//!     never comes back (no same-term revival);
//!   - **availability**: once nothing disturbed the system for the model's bound `B`, somebody
//!     leads whenever anybody could; **L1**: when the leader of a settled system goes away,
//!     somebody starts leading within the model's failover bound `F` (if it has one);
//!   - **progress**: no busy loop (a process turned a thousand times at one instant, or asking
//!     twice to be woken in the past with nothing to do), no runaway schedule, no panic.
//!
//! [`run_schedules`] runs many seeds on every core; a failure names its seed and the tail of its
//! trace, and `TENURE_SIM_SEED` replays one seed printing every event.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::candidate::Event;
use crate::stage::AfterRelease;
use crate::clock::MonotonicTime;
use crate::election_core::{ElectionCore, Report};
use crate::lifecycle::{Lifecycle, StopAction};

/// A millisecond of global time, which counts nanoseconds.
pub const MS: u64 = 1_000_000;
/// A schedule that needs more events than this is stuck in a loop.
const MAX_EVENTS: u64 = 2_000_000;
/// A process turned more often than this at one instant is busy-looping.
const MAX_TURNS_AT_ONE_INSTANT: u32 = 1000;
const TRACE_TAIL: usize = 80;

thread_local! {
    /// Whether the worlds built on this thread keep a trace (a failure's rerun), and print it
    /// (a replay). Off on the fast path: describing every event costs more than running it.
    static TRACE: Cell<(bool, bool)> = const { Cell::new((false, false)) };
}

/// One process's clock: `local = offset + global x rate` (nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Where the clock starts.
    pub offset: f64,
    /// How fast it runs against global time.
    pub rate: f64,
}

impl Clock {
    /// A clock running at a rate within `drift` of 1 (half of the draws at the extremes, where
    /// drift bites).
    pub fn drifting(rng: &mut SmallRng, drift: f64) -> Clock {
        let rate = match rng.random_range(0..4) {
            0 => 1.0 + drift,
            1 => 1.0 - drift,
            _ => rng.random_range(1.0 - drift..=1.0 + drift),
        };
        Clock { offset: rng.random_range(0.0..1e9), rate }
    }

    /// The local time at global instant `global` (monotonic: rounding is).
    pub fn local(&self, global: u64) -> MonotonicTime {
        MonotonicTime(Duration::from_nanos((self.offset + global as f64 * self.rate) as u64))
    }

    /// The first global instant at which the local clock reads `local` or more.
    pub fn global(&self, local: MonotonicTime) -> u64 {
        let mut global = ((local.0.as_nanos() as f64 - self.offset) / self.rate).ceil().max(0.0) as u64;
        while self.local(global) < local {
            global += 1;
        }
        while global > 0 && self.local(global - 1) >= local {
            global -= 1;
        }
        global
    }
}

/// What a turn of the shell asks of the run loop: calls to start (id, call, global instant its
/// time limit passes; `None`: no limit, the model performs it at once), and when to turn again if
/// nothing else happens, if that changed (one timer is armed at a time: [`Process::timer_fired`]).
pub type Turn<Call> = (Vec<(u64, Call, Option<u64>)>, Option<u64>);

/// A core run under the shell's rules, with its own clock.
#[derive(Debug)]
pub struct Process<C: ElectionCore> {
    /// The core.
    pub core: C,
    /// Its clock.
    pub clock: Clock,
    /// False once crashed or shut down.
    pub alive: bool,
    /// Paused (SIGSTOP) until this global instant.
    pub paused_until: Option<u64>,
    /// A resign (`Campaign`) or shutdown (`Stop`) in progress: the shell's stop rules.
    pub lifecycle: Lifecycle,
    /// The user still holds a guard of the tenure a stop ended (until [`Process::drained`]).
    guards_held: bool,
    /// Break the shell on purpose: while leading, the core is handed a clock that stops just
    /// before its deadline, and the publisher extends a tenure whatever its deadline. A renew that
    /// succeeds after the deadline then revives the lapsed tenure under the same term.
    pub unfenced: bool,
    /// Calls in flight (a few: a list beats a hash map).
    calls: Vec<(u64, C::Call)>,
    timer: Option<u64>,
    /// The term of the tenure the guards hold and the deadline they judge by (the publisher's).
    guard: Option<(u64, MonotonicTime)>,
    /// The tenure started and not yet reported stopped.
    published: Option<u64>,
    /// A tenure of this process was seen over, and none started since.
    lapsed: bool,
    /// It led once: a stop then drains (the user may hold guards).
    led: bool,
    /// The instant of the last turn and how many turns it had.
    turns: (u64, u32),
}

impl<C: ElectionCore> Process<C>
where
    C::Call: Clone,
{
    /// A process running `core` on `clock`.
    pub fn new(core: C, clock: Clock) -> Self {
        Process {
            core,
            clock,
            alive: true,
            paused_until: None,
            lifecycle: Lifecycle::default(),
            guards_held: false,
            unfenced: false,
            calls: Vec::new(),
            timer: Some(0),
            guard: None,
            published: None,
            lapsed: false,
            led: false,
            turns: (u64::MAX, 0),
        }
    }

    /// True when a timer event at global `at` is the armed timer (others are stale); disarms it.
    pub fn timer_fired(&mut self, at: u64) -> bool {
        if self.timer == Some(at) {
            self.timer = None;
            return true;
        }
        false
    }

    /// Alive and not paused.
    pub fn runnable(&self) -> bool {
        self.alive && self.paused_until.is_none()
    }

    /// The term of the tenure this process believes it holds at global `now`, as its guards judge.
    pub fn tenure(&self, now: u64) -> Option<u64> {
        match self.guard {
            Some((term, deadline)) if self.alive && self.clock.local(now) < deadline => Some(term),
            _ => None,
        }
    }

    /// The call `id`, while it is in flight.
    pub fn call(&self, id: u64) -> Option<&C::Call> {
        self.calls.iter().find(|(i, _)| *i == id).map(|(_, call)| call)
    }

    /// The shell's turn at global `now`: start calls (`limit` gives each call's time limit, `None`
    /// for calls the model performs at once), publish reports (checking S1 and S2 against
    /// `highest_term`), drop guards at once, move a stop along, and arm the timer.
    pub fn turn(
        &mut self,
        now: u64,
        next_id: &mut u64,
        highest_term: &mut u64,
        limit: impl Fn(&C::Call) -> Option<Duration>,
    ) -> Result<Turn<C::Call>, String> {
        let mut calls = Vec::new();
        if !self.runnable() {
            return Ok((calls, None));
        }
        self.turns = if self.turns.0 == now { (now, self.turns.1 + 1) } else { (now, 1) };
        if self.turns.1 > MAX_TURNS_AT_ONE_INSTANT {
            return Err(format!("busy loop: turned {MAX_TURNS_AT_ONE_INSTANT} times at one instant"));
        }
        let local = self.local(now);
        let real = self.clock.local(now);
        // What the shell does in one wake-up; publishing may change the core (a lapse), and a
        // core that asks to be woken now is polled again at once, as the shell's loop would.
        for round in 0.. {
            let started = calls.len();
            while let Some(call) = self.core.poll_call(local, self.lifecycle.stage()) {
                *next_id += 1;
                let deadline = limit(&call).map(|limit| self.clock.global(local + limit).max(now + 1));
                if deadline.is_some() {
                    self.calls.push((*next_id, call.clone()));
                }
                calls.push((*next_id, call, deadline));
            }
            self.publish(local, highest_term)?;
            // Guards are dropped at once; the shell's loop then goes round again, as it does
            // when the stop moves on (a release asked for starts its calls in the next round).
            let dropped = self.core.awaits_guards();
            if dropped {
                self.core.guards_dropped(local);
            }
            let stop = self.lifecycle.poll(&mut self.core, local, self.guards_held);
            if let Some(StopAction::Finished { after, .. }) = stop {
                self.alive = after == AfterRelease::Campaign;
            }
            let moved_on = dropped || stop.is_some();
            let due = self.core.poll_timeout(self.lifecycle.stage()).is_some_and(|at| at <= real) && !self.unfenced;
            if !(due || moved_on) || !self.alive {
                break;
            }
            if round > 0 && calls.len() == started && !moved_on {
                // Asked to be woken in the past, twice, with nothing to do: the shell would spin.
                return Err(format!(
                    "busy loop: woken at {:?}, which is not after now ({real:?})",
                    self.core.poll_timeout(self.lifecycle.stage())
                ));
            }
        }
        let wake = match self.core.poll_timeout(self.lifecycle.stage()) {
            // The unfenced shell's clock stops before the deadline: no wake-up can be due.
            Some(at) if at <= real => None,
            at => at,
        };
        let wake = wake.into_iter().chain(self.lifecycle.deadline()).min();
        let timer = wake.map(|at| self.clock.global(at).max(now + 1));
        let changed = (timer != self.timer).then_some(timer).flatten();
        self.timer = timer;
        Ok((calls, changed))
    }

    fn publish(&mut self, local: MonotonicTime, highest_term: &mut u64) -> Result<(), String> {
        loop {
            while let Some(report) = self.core.poll_report() {
                match report {
                    Report::Event(Event::StartedLeading { term }) => {
                        if let Some(previous) = self.published {
                            return Err(format!("S1: term {} started before term {previous} ended", term.0));
                        }
                        if term.0 <= *highest_term {
                            return Err(format!("S2: term {} started after term {highest_term}", term.0));
                        }
                        *highest_term = term.0;
                        self.published = Some(term.0);
                        self.guard = self.core.valid_until().map(|deadline| (term.0, deadline));
                        self.lapsed = false;
                        self.led = true;
                    }
                    Report::Event(Event::StoppedLeading { term, .. }) => {
                        if self.published != Some(term.0) {
                            return Err(format!("S1: term {} stopped, but {:?} was started", term.0, self.published));
                        }
                        self.published = None;
                        self.guard = None;
                    }
                    _ => {}
                }
            }
            let (Some((term, deadline)), Some(valid_until)) = (self.guard, self.core.valid_until()) else {
                return Ok(());
            };
            if local >= deadline && !self.unfenced {
                // The publisher refuses: the tenure is over for good.
                self.guard = None;
                self.core.lapse();
                continue;
            }
            self.guard = Some((term, deadline.max(valid_until)));
            return Ok(());
        }
    }

    /// The time handed to the core at global `now`.
    fn local(&self, now: u64) -> MonotonicTime {
        let local = self.clock.local(now);
        match self.core.valid_until() {
            Some(deadline) if self.unfenced => {
                local.min(MonotonicTime(deadline.0.saturating_sub(Duration::from_nanos(1))))
            }
            _ => local,
        }
    }

    /// An answer to call `id` arrives at global `now`; ignored if the call timed out already.
    pub fn answer(&mut self, now: u64, id: u64, input: C::Input) {
        if self.time_out(id).is_some() {
            self.core.handle(self.local(now), self.lifecycle.stage(), input);
        }
    }

    /// Call `id`'s time limit passed: the call, for the model to fail it, if it was in flight.
    pub fn time_out(&mut self, id: u64) -> Option<C::Call> {
        let index = self.calls.iter().position(|(i, _)| *i == id)?;
        Some(self.calls.swap_remove(index).1)
    }

    /// A notification (or a failed call's error) arrives at global `now`.
    pub fn notify(&mut self, now: u64, input: C::Input) {
        self.core.handle(self.local(now), self.lifecycle.stage(), input);
    }

    /// Starts a resign (`Campaign`) or a shutdown (`Stop`) at global `now` with the shell's
    /// default drain timeout (the renew deadline): the tenure ends now, the user holds its guards
    /// until [`Process::drained`]. False while another stop is under way (the shell takes no
    /// command then).
    pub fn step_down(&mut self, now: u64, after: AfterRelease) -> bool {
        let drain_timeout = self.core.renew_deadline();
        let local = self.local(now);
        let begun = self.lifecycle.begin(&mut self.core, local, after, drain_timeout);
        self.guards_held |= begun;
        begun
    }

    /// The user dropped the guards of the tenure a stop ended; the next turn releases.
    pub fn drained(&mut self) {
        self.guards_held = false;
    }

    /// S2's revival check at global `now`: a tenure seen as over must not be believed again.
    pub fn check_revival(&mut self, now: u64) -> Result<(), String> {
        if self.guard.is_none() {
            return Ok(());
        }
        let believes = self.tenure(now).is_some();
        if !believes {
            self.lapsed = true;
        } else if believes && self.lapsed {
            return Err("S2: a tenure seen as over is believed again under the same term".into());
        }
        Ok(())
    }
}

/// The faults a storm injects: each call is dropped, has its reply lost, or is slowed with these
/// probabilities.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// A request dropped before the store (the caller gets [`Model::lost`]).
    pub drop: f64,
    /// A request applied whose reply is lost (the caller gets [`Model::lost`]).
    pub lost: f64,
    /// A request, or its reply, delayed 0.5 to 3 of [`World::slow`].
    pub slow: f64,
}

/// The faults drawn for one call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fate {
    drop: bool,
    lose: bool,
    slow_request: bool,
    slow_reply: bool,
}

/// An event of the run loop; `Call`, `Input` and `Msg` are the [`Model`]'s.
#[derive(Debug)]
pub enum Ev<Call, Input, Msg> {
    /// A process's timer.
    Turn(usize),
    /// A call reaches the store: (caller, call id, call, its faults).
    Request(usize, u64, Call, Fate),
    /// An answer reaches its caller: (caller, call id, answer, whether a fault touched the call).
    Answer(usize, u64, Input, bool),
    /// A call's time limit passes: (caller, call id).
    TimeOut(usize, u64),
    /// A notification reaches a process (in order: see [`World::in_order`]).
    Notice(usize, Input),
    /// A stopping process's guards are gone: it releases.
    Drained(usize),
    /// A paused process resumes (the pause that ends at this instant).
    Resume(usize, u64),
    /// A dead process starts again, as a new core.
    Restart(usize),
    /// The next fault phase.
    Phase,
    /// The availability bound may have passed.
    Probe,
    /// Nothing: the checks run at this instant (a deadline of the model's).
    Check,
    /// The named fault a schedule opens with.
    Opening(Opening),
    /// The store is back up after an outage.
    StoreUp,
    /// The model's own event.
    Model(Msg),
}

/// How a schedule opens: with random faults at once, or with a named fault 4 leases in (once
/// somebody leads) that replays a case real processes found, and random faults 2 leases later.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Opening {
    /// Random faults from the start.
    Random,
    /// The store restarts under the leader, down for most of a lease.
    StoreRestartUnderLeader,
    /// The leader is paused for two leases, past its lease.
    LeaderPausedPastLease,
}

/// The [`Ev`] of a model.
pub type EvOf<M> = Ev<<M as Model>::Call, <M as Model>::Input, <M as Model>::Msg>;

/// A store model: what differs between backends. The rest is [`World`]'s.
pub trait Model: Sized + Debug {
    /// The core's calls.
    type Call: Clone + Debug;
    /// The core's answers and notifications.
    type Input: Debug;
    /// The core under test.
    type Core: ElectionCore<Call = Self::Call, Input = Self::Input>;
    /// The model's own events.
    type Msg: Debug;

    /// A fresh core for process `p`, at its start and at every restart (which also resets what
    /// the model keeps of the process).
    fn core(&mut self, w: &mut World<Self>, p: usize) -> Self::Core;
    /// A call's time limit; `None`: the model performs it at once in [`Model::start`].
    fn limit(&self, call: &Self::Call) -> Option<Duration>;
    /// Performs a call that has no time limit.
    fn start(&mut self, _w: &mut World<Self>, _p: usize, _call: Self::Call) {}
    /// A call with a time limit leaves process `p` (for what its transport does at once).
    fn sending(&mut self, _p: usize, _call: &Self::Call) {}
    /// A call from `from` arrives at the store: applied; its answer (`None`: none, the caller
    /// times out).
    fn apply(&mut self, w: &mut World<Self>, from: usize, call: Self::Call) -> Option<Self::Input>;
    /// The answer to a dropped request or a lost reply (`None`: none, the caller times out).
    fn lost(&self, _call: Self::Call) -> Option<Self::Input> {
        None
    }
    /// The error the shell hands the core when a call's time limit passes.
    fn timed_out(&self, call: Self::Call) -> Self::Input;
    /// An answer to a call in flight is handed to process `p` next.
    fn answered(&mut self, _w: &mut World<Self>, _p: usize, _input: &Self::Input) {}
    /// The process a model event is for, and whether it is a notification: it waits while that
    /// process is paused (notifications in order) and is dropped once that process died.
    fn target(_msg: &Self::Msg) -> Option<(usize, bool)> {
        None
    }
    /// Handles a model event.
    fn handle(&mut self, w: &mut World<Self>, msg: Self::Msg) -> Result<(), String>;
    /// Whether process `p` can reach the store now (it counts as up for the liveness checks).
    fn reachable(&self, _p: usize) -> bool {
        true
    }
    /// The store went down (`up` false: a restart, [`World::outage`]) or came back: what its
    /// clients see.
    fn outage(&mut self, _w: &mut World<Self>, _up: bool) {}
    /// The model's own fault on process `p` (`kind` 0 or 1: two slots of the fault menu); by
    /// default a store restart, down for up to a lease.
    fn fault(&mut self, w: &mut World<Self>, _p: usize, _kind: u8) {
        let down = w.rng.random_range(0..w.lease);
        w.outage(self, down);
    }
    /// The model's own checks, after every event.
    fn check(&mut self, _w: &mut World<Self>) -> Result<(), String> {
        Ok(())
    }
}

/// Counters of what the schedules exercised: a checker that never looks proves nothing.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Schedules run.
    pub schedules: u64,
    /// Events handled.
    pub events: u64,
    /// Tenures started.
    pub tenures: u64,
    /// Processes crashed.
    pub crashes: u64,
    /// Processes paused.
    pub pauses: u64,
    /// Pauses longer than a lease.
    pub long_pauses: u64,
    /// Quiet windows after which availability was checked.
    pub windows_checked: u64,
    /// Clean failovers checked against `F`.
    pub failovers_checked: u64,
    /// The slowest clean failover, as a fraction of `F`.
    pub slowest_failover: f64,
    /// Handovers checked (a model's).
    pub handovers_checked: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.schedules += o.schedules;
        self.events += o.events;
        self.tenures += o.tenures;
        self.crashes += o.crashes;
        self.pauses += o.pauses;
        self.long_pauses += o.long_pauses;
        self.windows_checked += o.windows_checked;
        self.failovers_checked += o.failovers_checked;
        self.slowest_failover = self.slowest_failover.max(o.slowest_failover);
        self.handovers_checked += o.handovers_checked;
    }
}

/// One schedule: the processes, the event queue in global time, the fault phases and the
/// liveness bookkeeping, driven by a [`Model`] of the store.
pub struct World<M: Model> {
    /// The schedule's randomness (everything is drawn from it: same seed, same run).
    pub rng: SmallRng,
    /// Global time, in nanoseconds.
    pub now: u64,
    /// The processes.
    pub procs: Vec<Process<M::Core>>,
    /// The unit of the fault menu (pauses up to two, phases of 0.3 to 4): a lease, a TTL, a
    /// session timeout.
    pub lease: u64,
    /// `B`: after this long without a disturbance somebody must lead (if anybody could).
    pub settle_bound: u64,
    /// `F`: when the leader of a settled system goes away, somebody must start leading within
    /// this (`None`: not checked).
    pub failover_bound: Option<u64>,
    /// The longest one-way delay of a request, an answer or a notification outside faults.
    pub max_delay: u64,
    /// Slowed calls take 0.5 to 3 of this (a call timeout).
    pub slow: u64,
    /// The most a storm injects of each fault.
    pub storm: Faults,
    /// The faults of the current phase.
    pub faults: Faults,
    /// Whether calls a storm touched disturb (the liveness checks then wait for their effects
    /// to end) or not (availability must hold through them).
    pub storms_disturb: bool,
    /// Break the shell on purpose in every process ([`Process::unfenced`]).
    pub unfenced: bool,
    /// Whether a stop drains (the user holds the tenure's guards a while before the release) or
    /// releases at once.
    pub drains: bool,
    /// Answers share the order of a process's notifications (one connection carries both).
    pub answers_in_order: bool,
    /// False during a store outage: nobody reaches the store.
    pub store_up: bool,
    /// When the last tenure started.
    pub last_start: u64,
    /// The process that believes it leads after the event handled last, and its term (S1: one).
    pub believed: Option<(usize, u64)>,
    /// What this schedule exercised.
    pub stats: Stats,
    /// (instant, sequence number): the earliest first, ties in order.
    events: BinaryHeap<Reverse<(u64, u64)>>,
    /// By sequence number, the events and the process (high half) and incarnation (low half)
    /// they are for (`u64::MAX`: none). Boxed and apart: the heap moves its entries.
    slab: Vec<Option<(u64, Box<EvOf<M>>)>>,
    incarnations: Vec<u32>,
    deferred: Vec<Vec<Box<EvOf<M>>>>,
    notices: Vec<u64>,
    next_id: u64,
    highest_term: u64,
    last_disturbance: u64,
    disturbances: u64,
    fault_until: u64,
    probe_pending: bool,
    /// The leader of a settled system went away at `.0`: somebody starts leading by `.1`, unless
    /// the disturbance count moves on from `.2`.
    failover: Option<(u64, u64, u64)>,
    phase: u32,
    phases: u32,
    horizon: u64,
    trace: Option<VecDeque<String>>,
    print: bool,
}

impl<M: Model> World<M> {
    /// An empty world for `seed`; the model sets the bounds and spawns the processes.
    pub fn new(seed: u64) -> Self {
        let (keep, print) = TRACE.get();
        World {
            rng: SmallRng::seed_from_u64(seed),
            now: 0,
            procs: Vec::new(),
            lease: 10_000 * MS,
            settle_bound: u64::MAX,
            failover_bound: None,
            max_delay: 20 * MS,
            slow: 1000 * MS,
            storm: Faults::default(),
            faults: Faults::default(),
            storms_disturb: true,
            unfenced: false,
            answers_in_order: false,
            drains: true,
            store_up: true,
            last_start: 0,
            believed: None,
            stats: Stats { schedules: 1, ..Stats::default() },
            events: BinaryHeap::new(),
            slab: Vec::new(),
            incarnations: Vec::new(),
            deferred: Vec::new(),
            notices: Vec::new(),
            next_id: 0,
            highest_term: 0,
            last_disturbance: 0,
            disturbances: 0,
            fault_until: 0,
            probe_pending: false,
            failover: None,
            phase: 0,
            phases: 0,
            horizon: u64::MAX,
            trace: keep.then(VecDeque::new),
            print,
        }
    }

    /// Starts `n` processes of `m`'s cores, on clocks within `drift` of real time, each at a
    /// random instant up to `stagger`; then the `opening`, 6 to 14 fault phases, a long calm tail,
    /// and the end.
    pub fn populate(&mut self, m: &mut M, n: usize, drift: f64, stagger: u64, opening: Opening) {
        for p in 0..n {
            let clock = Clock::drifting(&mut self.rng, drift);
            let at = self.rng.random_range(0..=stagger);
            self.incarnations.push(0);
            self.deferred.push(Vec::new());
            self.notices.push(0);
            let mut process = Process::new(m.core(self, p), clock);
            (process.unfenced, process.timer) = (self.unfenced, Some(at));
            self.procs.push(process);
            self.push(at, Ev::Turn(p));
        }
        self.phases = self.rng.random_range(6..=14);
        if opening == Opening::Random {
            self.push(0, Ev::Phase);
        } else {
            self.push(4 * self.lease, Ev::Opening(opening));
            self.push(6 * self.lease, Ev::Phase);
        }
    }

    /// Takes the store down for `down_for` (a restart); back up, it is as it was.
    pub fn outage(&mut self, m: &mut M, down_for: u64) {
        if self.store_up {
            self.log(|| format!("store down for {} ms", down_for / MS));
            self.store_up = false;
            self.disturb();
            m.outage(self, false);
            self.push(self.now + down_for, Ev::StoreUp);
        }
    }

    /// Schedules `event` at global `at`; an event for a process is for its current incarnation.
    pub fn push(&mut self, at: u64, event: EvOf<M>) {
        self.push_boxed(at, Box::new(event));
    }

    fn push_boxed(&mut self, at: u64, event: Box<EvOf<M>>) {
        let to = match &*event {
            Ev::Turn(p) | Ev::Answer(p, ..) | Ev::TimeOut(p, _) | Ev::Notice(p, _) | Ev::Drained(p) => Some(*p),
            Ev::Model(msg) => M::target(msg).map(|(p, _)| p),
            _ => None,
        };
        let to = to.map_or(u64::MAX, |p| (p as u64) << 32 | u64::from(self.incarnations[p]));
        self.events.push(Reverse((at, self.slab.len() as u64)));
        self.slab.push(Some((to, event)));
    }

    /// The global instant at which a notification for `p` sent to arrive at `at` arrives: not
    /// before the ones sent earlier (a watch, a session, delivers in order).
    pub fn in_order(&mut self, p: usize, at: u64) -> u64 {
        self.notices[p] = self.notices[p].max(at);
        self.notices[p]
    }

    /// A network delay: 0.1 ms to [`World::max_delay`], log-uniform.
    pub fn delay(&mut self) -> u64 {
        let (low, high) = ((0.1 * MS as f64).ln(), (self.max_delay as f64).ln());
        (self.rng.random_range(low..=high).exp() as u64).clamp(MS / 10, self.max_delay)
    }

    fn slow_delay(&mut self) -> u64 {
        (self.slow as f64 * self.rng.random_range(0.5..3.0)) as u64
    }

    /// Something happened that liveness cannot be expected to ride through.
    pub fn disturb(&mut self) {
        self.last_disturbance = self.now;
        self.disturbances += 1;
        if !self.probe_pending && self.settle_bound != u64::MAX {
            self.probe_pending = true;
            self.push(self.quiet_since() + self.settle_bound, Ev::Probe);
        }
    }

    /// An injected fault whose effects can last until global `until`.
    pub fn inject_fault(&mut self, until: u64) {
        self.fault_until = self.fault_until.max(until);
        self.disturb();
    }

    /// The disturbances so far, or `u64::MAX` while an injected fault still acts: an obligation
    /// taken now holds while [`World::undisturbed_since`] this mark.
    pub fn mark(&self) -> u64 {
        if self.fault_until > self.now {
            u64::MAX
        } else {
            self.disturbances
        }
    }

    /// Nothing disturbed the system since [`World::mark`] gave `mark`.
    pub fn undisturbed_since(&self, mark: u64) -> bool {
        mark == self.disturbances
    }

    fn quiet_since(&self) -> u64 {
        self.last_disturbance.max(self.fault_until)
    }

    /// Whether process `p` could lead: alive, running, not shutting down, reaching the store.
    pub fn is_up(&self, m: &M, p: usize) -> bool {
        let q = &self.procs[p];
        let stopping = q.lifecycle.stopping() == Some(AfterRelease::Stop);
        q.runnable() && !stopping && self.store_up && m.reachable(p)
    }

    /// The process that believes it leads, if any, before the event at hand changes anything:
    /// between events time only ends tenures, so it is the last event's leader, if still one.
    pub fn leader(&self) -> Option<usize> {
        self.believed.map(|(p, _)| p).filter(|&p| self.procs[p].tenure(self.now).is_some())
    }

    /// Adds a line to the trace, when one is kept (a failure's rerun, a replay).
    pub fn log(&mut self, line: impl FnOnce() -> String) {
        let Some(trace) = self.trace.as_mut() else { return };
        let line = format!("{:>12.6}s  {}", self.now as f64 / 1e9, line());
        if self.print {
            println!("{line}");
        }
        if trace.len() == TRACE_TAIL {
            trace.pop_front();
        }
        trace.push_back(line);
    }

    /// The shell's turn of process `p`: its calls go out, its timer is armed.
    pub fn turn(&mut self, m: &mut M, p: usize) -> Result<(), String> {
        let (highest, was_alive) = (self.highest_term, self.procs[p].alive);
        let (calls, timer) = self.procs[p].turn(self.now, &mut self.next_id, &mut self.highest_term, |c| m.limit(c))?;
        if self.highest_term != highest {
            self.started(p);
        }
        for (id, call, deadline) in calls {
            self.log(|| format!("{p} calls {id}: {call:?}"));
            let Some(deadline) = deadline else {
                m.start(self, p, call);
                continue;
            };
            m.sending(p, &call);
            let fate = self.fate();
            let at = self.now + if fate.slow_request { self.slow_delay() } else { self.delay() };
            self.push(at, Ev::Request(p, id, call, fate));
            self.push(deadline, Ev::TimeOut(p, id));
            if fate != Fate::default() && self.storms_disturb {
                // The caller is done with it by its answer or its time limit.
                let done = if fate.slow_request || fate.slow_reply { deadline } else { at + self.max_delay };
                self.inject_fault(at.max(done));
            }
        }
        if let Some(at) = timer {
            self.log(|| format!("{p} timer at {at}"));
            self.push(at, Ev::Turn(p));
        }
        if was_alive && !self.procs[p].alive {
            // Shut down; perhaps started again later.
            self.log(|| format!("{p} exits"));
            if self.rng.random_bool(0.5) {
                let at = self.now + (self.lease as f64 * self.rng.random_range(0.0..2.0)) as u64;
                self.push(at, Ev::Restart(p));
            }
        }
        Ok(())
    }

    fn started(&mut self, p: usize) {
        let term = self.highest_term;
        self.log(|| format!("{p} started leading (term {term})"));
        self.stats.tenures += 1;
        self.last_start = self.now;
        if let Some((from, _, mark)) = self.failover.take() {
            if mark == self.disturbances {
                // Nothing else happened since the leader went away: a clean failover.
                let ratio = (self.now - from) as f64 / self.failover_bound.unwrap_or(u64::MAX) as f64;
                self.stats.slowest_failover = self.stats.slowest_failover.max(ratio);
                self.stats.failovers_checked += 1;
            }
        }
    }

    fn fate(&mut self) -> Fate {
        let f = self.faults;
        if f == Faults::default() {
            return Fate::default();
        }
        let rng = &mut self.rng;
        Fate {
            drop: rng.random_bool(f.drop),
            lose: rng.random_bool(f.lost),
            slow_request: rng.random_bool(f.slow),
            slow_reply: rng.random_bool(f.slow),
        }
    }

    /// Crashes process `p`: its state is lost; its requests in flight still land.
    pub fn crash(&mut self, p: usize) {
        self.log(|| format!("{p} crashes"));
        self.stats.crashes += 1;
        self.procs[p].alive = false;
        self.procs[p].paused_until = None;
        self.deferred[p].clear();
        self.disturb();
    }

    /// Pauses process `p` for `length` (SIGSTOP): nothing is handled, its clock runs.
    pub fn pause(&mut self, p: usize, length: u64) {
        self.log(|| format!("{p} pauses for {} ms", length / MS));
        self.stats.pauses += 1;
        self.stats.long_pauses += u64::from(length > self.lease);
        let until = self.now + length;
        self.procs[p].paused_until = Some(until);
        self.push(until, Ev::Resume(p, until));
        self.disturb();
    }

    /// Resigns (`Campaign`) or shuts down (`Stop`) process `p` as the shell does: step down now,
    /// release once the user's guards are gone (at once for a process that never led).
    pub fn stop(&mut self, m: &mut M, p: usize, after: AfterRelease) -> Result<(), String> {
        if self.procs[p].lifecycle.stopping().is_some() {
            return Ok(()); // the shell takes no command while a stop is under way
        }
        self.log(|| format!("{p} steps down ({after:?})"));
        self.disturb();
        // How long the user holds the tenure's guards: mostly less than the drain timeout (the
        // renew deadline), sometimes more (the shell then releases at the timeout).
        let renew_deadline = self.procs[p].core.renew_deadline().as_nanos() as f64;
        let drain = if !self.procs[p].led || !self.drains {
            0
        } else if self.rng.random_bool(0.6) {
            self.delay()
        } else {
            (renew_deadline * self.rng.random_range(0.0..1.3)) as u64
        };
        self.procs[p].step_down(self.now, after);
        self.push(self.now + drain, Ev::Drained(p));
        self.turn(m, p)
    }

    fn restart(&mut self, m: &mut M, p: usize) -> Result<(), String> {
        self.log(|| format!("{p} starts again"));
        self.incarnations[p] += 1;
        let core = m.core(self, p);
        self.procs[p] = Process::new(core, self.procs[p].clock);
        self.procs[p].unfenced = self.unfenced;
        self.disturb();
        self.turn(m, p)
    }

    /// Runs the schedule to its end: the statistics, or what failed, with the processes and the
    /// trace tail.
    pub fn run(mut self, mut m: M) -> Result<Stats, String> {
        while let Some(Reverse((at, seq))) = self.events.pop() {
            let Some((to, event)) = self.slab[seq as usize].take().filter(|_| at <= self.horizon) else { break };
            self.now = at;
            if to != u64::MAX {
                let p = (to >> 32) as usize;
                if u64::from(self.incarnations[p]) != to & 0xffff_ffff || !self.procs[p].alive {
                    continue;
                }
                if self.procs[p].paused_until.is_some() {
                    // Its timer fires on resume (the resume turns it); the rest waits.
                    if let Ev::Turn(_) = *event {
                        self.procs[p].timer_fired(self.now);
                    } else {
                        self.deferred[p].push(event);
                    }
                    continue;
                }
            }
            self.stats.events += 1;
            if let Err(why) = self.event(&mut m, event) {
                return Err(self.failure(&m, why));
            }
        }
        Ok(self.stats)
    }

    fn event(&mut self, m: &mut M, event: Box<EvOf<M>>) -> Result<(), String> {
        if self.stats.events > MAX_EVENTS {
            return Err(format!("progress: more than {MAX_EVENTS} events"));
        }
        self.check_liveness(m)?;
        self.log(|| format!("{event:?}"));
        self.step(m, *event)?;
        self.believed = None;
        for p in 0..self.procs.len() {
            if self.procs[p].guard.is_none() {
                continue; // not in a tenure: no need to read its clock
            }
            if let Some(term) = self.procs[p].tenure(self.now) {
                if let Some((other, _)) = self.believed.replace((p, term)) {
                    return Err(format!("S1: processes {other} and {p} lead at once"));
                }
            }
            self.procs[p].check_revival(self.now)?;
        }
        m.check(self)
    }

    fn step(&mut self, m: &mut M, event: EvOf<M>) -> Result<(), String> {
        match event {
            Ev::Turn(p) if self.procs[p].timer_fired(self.now) => self.turn(m, p)?,
            Ev::Request(from, id, call, fate) => {
                if fate != Fate::default() && self.storms_disturb {
                    self.disturb();
                }
                let answer = if fate.drop {
                    m.lost(call)
                } else if fate.lose {
                    let lost = m.lost(call.clone());
                    m.apply(self, from, call);
                    lost
                } else {
                    m.apply(self, from, call)
                };
                if let Some(input) = answer {
                    let mut at = self.now + if fate.slow_reply { self.slow_delay() } else { self.delay() };
                    if self.answers_in_order {
                        at = self.in_order(from, at);
                    }
                    self.push(at, Ev::Answer(from, id, input, fate != Fate::default()));
                }
            }
            Ev::Answer(to, id, input, faulty) => {
                if faulty && self.storms_disturb {
                    self.disturb();
                }
                if self.procs[to].call(id).is_some() {
                    m.answered(self, to, &input);
                }
                self.procs[to].answer(self.now, id, input);
                self.turn(m, to)?;
            }
            Ev::TimeOut(to, id) => {
                if let Some(call) = self.procs[to].time_out(id) {
                    if self.storms_disturb {
                        self.disturb();
                    }
                    self.procs[to].notify(self.now, m.timed_out(call));
                    self.turn(m, to)?;
                }
            }
            Ev::Notice(to, input) => {
                self.procs[to].notify(self.now, input);
                self.turn(m, to)?;
            }
            Ev::Drained(p) if self.procs[p].guards_held => {
                // When the user lets go is up to the user: like a command, a disturbance.
                self.disturb();
                self.procs[p].drained();
                self.turn(m, p)?;
            }
            Ev::Resume(p, at) if self.procs[p].paused_until == Some(at) => self.resume(m, p)?,
            Ev::Restart(p) if !self.procs[p].alive => self.restart(m, p)?,
            Ev::Phase => self.phase(m)?,
            Ev::Probe => {
                self.probe_pending = false;
                let due = self.quiet_since() + self.settle_bound;
                if self.now < due {
                    self.probe_pending = true;
                    self.push(due, Ev::Probe);
                } else if self.leader().is_some() {
                    self.stats.windows_checked += 1;
                }
            }
            Ev::Opening(opening) => match (opening, self.leader()) {
                (Opening::StoreRestartUnderLeader, _) => self.outage(m, self.lease * 9 / 10),
                (Opening::LeaderPausedPastLease, Some(leader)) => self.pause(leader, 2 * self.lease),
                _ => {}
            },
            Ev::StoreUp => {
                self.store_up = true;
                self.disturb();
                m.outage(self, true);
            }
            Ev::Model(msg) => m.handle(self, msg)?,
            _ => {}
        }
        Ok(())
    }

    /// Everything that became ready while `p` was paused is handled now. tokio's `select!` picks
    /// among ready branches at random: notifications (in order among themselves) interleave at
    /// random with answers and time-outs; an answer beats its own time-out (`timeout` polls the
    /// call first); expired timers collapse into the one turn after.
    fn resume(&mut self, m: &mut M, p: usize) -> Result<(), String> {
        self.log(|| format!("{p} resumes"));
        self.procs[p].paused_until = None;
        self.disturb();
        let deferred = std::mem::take(&mut self.deferred[p]);
        let answered: Vec<u64> =
            deferred.iter().filter_map(|e| if let Ev::Answer(_, id, ..) = **e { Some(id) } else { None }).collect();
        let (mut notices, mut others) = (VecDeque::new(), VecDeque::new());
        for event in deferred {
            match &*event {
                Ev::TimeOut(_, id) if answered.contains(id) => {}
                Ev::Notice(..) => notices.push_back(event),
                Ev::Model(msg) if M::target(msg).is_some_and(|(_, notice)| notice) => notices.push_back(event),
                _ => others.push_back(event),
            }
        }
        while !notices.is_empty() || !others.is_empty() {
            // The guards judge the tenure between any two of these (its clock ran meanwhile).
            self.procs[p].check_revival(self.now)?;
            let notice = others.is_empty() || (!notices.is_empty() && self.rng.random_bool(0.5));
            let event = if notice { notices.pop_front() } else { others.pop_front() };
            if !self.procs[p].alive {
                return Ok(());
            }
            if let Some(event) = &event {
                self.log(|| format!("(deferred) {event:?}"));
            }
            self.step(m, *event.expect("not empty"))?;
        }
        if self.procs[p].alive {
            self.turn(m, p)?;
        }
        Ok(())
    }

    fn phase(&mut self, m: &mut M) -> Result<(), String> {
        self.phase += 1;
        let last = self.phase > self.phases;
        let storm = !last && self.phase > 1 && self.rng.random_bool(0.4);
        self.faults = Faults::default();
        if storm {
            let (s, rng) = (self.storm, &mut self.rng);
            self.faults = Faults {
                drop: rng.random_range(0.0..=s.drop),
                lost: rng.random_range(0.0..=s.lost),
                slow: rng.random_range(0.0..=s.slow),
            };
        }
        let lease = self.lease as f64;
        let length = if last {
            // A long calm tail, so that the last fault is followed by checked liveness.
            (2 * self.settle_bound.min(100 * self.lease)) as f64 + lease
        } else if storm {
            lease * self.rng.random_range(0.3..1.5)
        } else {
            lease * self.rng.random_range(0.8..4.0)
        } as u64;
        let faults = self.faults;
        self.log(|| format!("phase: {faults:?} for {} ms", length / MS));
        if last {
            self.horizon = self.now + length;
        } else {
            self.push(self.now + length, Ev::Phase);
        }
        if !last && self.phase > 1 && self.rng.random_bool(0.8) {
            self.process_fault(m)?;
        }
        Ok(())
    }

    /// At most one process fault, the leader the preferred target; when the leader of a settled
    /// system goes away, somebody must start leading within `F`.
    fn process_fault(&mut self, m: &mut M) -> Result<(), String> {
        let n = self.procs.len();
        let leader = self.leader();
        let up: Vec<usize> = (0..n).filter(|&p| self.is_up(m, p)).collect();
        let dead: Vec<usize> = (0..n).filter(|&p| !self.procs[p].alive).collect();
        if (up.len() <= 1 || self.rng.random_bool(0.15)) && !dead.is_empty() {
            let p = dead[self.rng.random_range(0..dead.len())];
            return self.restart(m, p);
        }
        if up.is_empty() {
            return Ok(());
        }
        let target = match leader {
            Some(l) if self.rng.random_bool(0.7) && up.contains(&l) => l,
            _ => up[self.rng.random_range(0..up.len())],
        };
        // A tight failover check needs a settled system: nothing disturbed it for `B`.
        let settled = self.now >= self.quiet_since().saturating_add(self.settle_bound);
        let lease = self.lease as f64;
        match self.rng.random_range(0..100) {
            0..=34 => {
                self.crash(target);
                if self.rng.random_bool(0.6) {
                    let at = self.now + (lease * self.rng.random_range(0.0..2.0)) as u64;
                    self.push(at, Ev::Restart(target));
                }
            }
            35..=59 => {
                let length = (lease * self.rng.random_range(0.05..2.0)) as u64;
                self.pause(target, length);
            }
            60..=69 => m.fault(self, target, 0),
            70..=84 => self.stop(m, target, AfterRelease::Stop)?,
            85..=92 => self.stop(m, target, AfterRelease::Campaign)?,
            _ => m.fault(self, target, 1),
        }
        let still_leading = self.is_up(m, target) && self.procs[target].tenure(self.now).is_some();
        if let (true, Some(bound), false) = (settled && leader == Some(target), self.failover_bound, still_leading) {
            let deadline = self.now + bound;
            self.failover = Some((self.now, deadline, self.disturbances));
            self.push(deadline, Ev::Check);
        }
        Ok(())
    }

    fn check_liveness(&mut self, m: &M) -> Result<(), String> {
        let settled = self.now >= self.quiet_since().saturating_add(self.settle_bound);
        let failover = self.failover.filter(|f| self.now >= f.1);
        if !settled && failover.is_none() {
            return Ok(());
        }
        let anyone_up = |w: &Self| (0..w.procs.len()).any(|p| w.is_up(m, p));
        if settled && self.leader().is_none() && anyone_up(self) {
            return Err(format!(
                "availability: nobody leads {} ms after the last disturbance at {} ms (B = {} ms)",
                (self.now - self.quiet_since()) / MS,
                self.quiet_since() / MS,
                self.settle_bound / MS
            ));
        }
        if let Some((from, _, mark)) = failover {
            self.failover = None;
            if mark == self.disturbances && anyone_up(self) {
                return Err(format!(
                    "L1: the leader went away at {} ms and nobody started leading within F = {} ms",
                    from / MS,
                    self.failover_bound.unwrap_or_default() / MS
                ));
            }
        }
        Ok(())
    }

    fn failure(&self, m: &M, why: String) -> String {
        let mut text = format!(
            "{why}\n  at {} ms, B = {} ms, F = {:?}\n  {m:?}",
            self.now / MS,
            self.settle_bound / MS,
            self.failover_bound
        );
        for (p, q) in self.procs.iter().enumerate() {
            let (alive, paused, stopping, tenure) =
                (q.alive, q.paused_until, q.lifecycle, (q.guard, q.published, q.core.valid_until()));
            let rate = q.clock.rate;
            text += &format!("\n  {p}: rate {rate:.4} alive {alive} paused {paused:?} stopping {stopping:?}");
            text += &format!(" (guard, published, valid until) {tenure:?}");
        }
        for line in self.trace.iter().flatten() {
            text += &format!("\n  {line}");
        }
        text
    }
}

/// A number from the environment (`TENURE_SIM_SCHEDULES`, `TENURE_SIM_SEED`...).
fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name} must be a number, got {value:?}")))
}

/// Runs one schedule, a panic being a failure, with its trace kept and printed as `trace` says.
fn run_one(
    seed: u64,
    trace: (bool, bool),
    schedule: &(impl Fn(u64) -> Result<Stats, String> + Sync),
) -> Result<Stats, String> {
    TRACE.set(trace);
    let result = catch_unwind(AssertUnwindSafe(|| schedule(seed))).unwrap_or_else(|panic| {
        let text =
            panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(format!("panic: {}", text.unwrap_or_default()))
    });
    TRACE.set((false, false));
    result
}

/// Runs `schedule(seed)` for `count` seeds from `base` on every core: the failures, in seed
/// order, and what the schedules exercised.
fn search(
    base: u64,
    count: u64,
    schedule: &(impl Fn(u64) -> Result<Stats, String> + Sync),
) -> (Vec<(u64, String)>, Stats) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let (mut failures, mut stats) = (Vec::new(), Stats::default());
    std::thread::scope(|scope| {
        let seeds = move |t| (base + t..base + count).step_by(threads as usize);
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    seeds(t).map(|seed| (seed, run_one(seed, (false, false), schedule))).collect::<Vec<_>>()
                })
            })
            .collect();
        for (seed, result) in workers.into_iter().flat_map(|w| w.join().expect("schedules catch their panics")) {
            match result {
                Ok(s) => stats.add(&s),
                Err(why) => failures.push((seed, why)),
            }
        }
    });
    failures.sort();
    (failures, stats)
}

/// Runs a simulation test: one seed with its trace printed when `TENURE_SIM_SEED` is set, else
/// `TENURE_SIM_SCHEDULES` (default 10,000; at most `max`) seeds from `TENURE_SIM_BASE_SEED`;
/// panics with the first failure's seed and trace tail. What the schedules exercised, for the
/// caller to check that the checks had something to look at.
pub fn run_schedules(max: u64, schedule: impl Fn(u64) -> Result<Stats, String> + Sync) -> Stats {
    if let Some(seed) = env_u64("TENURE_SIM_SEED") {
        match run_one(seed, (true, true), &schedule) {
            Ok(stats) => return stats,
            Err(why) => panic!("seed {seed}: {why}"),
        }
    }
    let count = env_u64("TENURE_SIM_SCHEDULES").unwrap_or(10_000).min(max);
    let (failures, stats) = search(env_u64("TENURE_SIM_BASE_SEED").unwrap_or(0), count, &schedule);
    println!("{stats:?}");
    if let Some((seed, _)) = failures.first() {
        let why = run_one(*seed, (true, false), &schedule).err().unwrap_or_default();
        panic!(
            "{} of {count} schedules failed; first: seed {seed}: {why}\n  replay: TENURE_SIM_SEED={seed} cargo test \
             --test simulation -- --nocapture",
            failures.len()
        );
    }
    stats
}

/// Runs `count` schedules of a run broken on purpose and asserts that the check named `check`
/// (the start of its message) catches it: a checker that cannot fail proves nothing. How many
/// schedules it caught.
pub fn assert_caught(count: u64, check: &str, schedule: impl Fn(u64) -> Result<Stats, String> + Sync) -> usize {
    let (failures, _) = search(0, count, &schedule);
    let caught = failures.iter().filter(|(_, why)| why.starts_with(check)).count();
    println!("{check}: {caught} of {count} broken schedules caught ({} failed in all)", failures.len());
    assert!(caught > 0, "the broken run went unnoticed by {check} in {count} schedules: {:?}", failures.first());
    caught
}
