//! A deterministic simulation harness for [`ElectionCore`]s: the shell's rules with virtual time,
//! so that every backend's core runs under the same checks (feature `simulation`).
//!
//! Why in the library: a backend's core (etcd's campaign, ZooKeeper's latch) is tested against a
//! model of its store, in the backend's crate; what is the same for all of them lives here once:
//! clocks that drift, the event queue, the shell's rules (calls started as soon as asked, each
//! bounded by its time limit; a timer at `poll_timeout`; the publisher's refusal to extend a
//! tenure whose deadline has passed; drain, then release) and the checks:
//!
//! - **S1**: at every event at most one process believes it leads, judged as a [`crate::Tenure`]
//!   guard judges, on the process's own clock against the deadline the shell published. Paused
//!   processes count (their clock runs).
//! - **S2**: every tenure's term is greater than every earlier one, and a tenure seen as over never
//!   comes back (no same-term revival).
//!
//! A store model drives the [`Process`]es: it delivers answers and notifications, injects faults,
//! and checks liveness (it knows when the system has settled).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::RngExt;

use crate::candidate::{AfterRelease, Event};
use crate::clock::MonotonicTime;
use crate::shell::{ElectionCore, Report};

/// One process's clock: `local = offset + global x rate` (nanoseconds).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Where the clock starts.
    pub offset: f64,
    /// How fast it runs against global time.
    pub rate: f64,
}

impl Clock {
    /// A clock running at a rate within `drift` of 1 (half of the draws at the extremes).
    pub fn drifting(rng: &mut SmallRng, drift: f64) -> Clock {
        let rate = match rng.random_range(0..4) {
            0 => 1.0 + drift,
            1 => 1.0 - drift,
            _ => rng.random_range(1.0 - drift..=1.0 + drift),
        };
        Clock { offset: rng.random_range(0.0..1e9), rate }
    }

    /// The local time at global instant `global`.
    pub fn local(&self, global: u64) -> MonotonicTime {
        MonotonicTime(Duration::from_nanos((self.offset + global as f64 * self.rate) as u64))
    }

    /// The first global instant at which the local clock reads `local` or more.
    pub fn global(&self, local: MonotonicTime) -> u64 {
        ((local.0.as_nanos() as f64 - self.offset) / self.rate).ceil().max(0.0) as u64
    }
}

/// Events in global time order (ties in insertion order).
#[derive(Debug)]
pub struct Schedule<M> {
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, M>,
    seq: u64,
}

impl<M> Default for Schedule<M> {
    fn default() -> Self {
        Schedule { queue: BinaryHeap::new(), events: HashMap::new(), seq: 0 }
    }
}

impl<M> Schedule<M> {
    /// Schedules `event` at global time `at`.
    pub fn push(&mut self, at: u64, event: M) {
        self.seq += 1;
        self.events.insert(self.seq, event);
        self.queue.push(Reverse((at, self.seq)));
    }

    /// The next event and its time.
    pub fn pop(&mut self) -> Option<(u64, M)> {
        let Reverse((at, seq)) = self.queue.pop()?;
        self.events.remove(&seq).map(|event| (at, event))
    }
}

/// A network delay: 0.1 to 20 ms, log-uniform, in nanoseconds.
pub fn delay(rng: &mut SmallRng) -> u64 {
    let log = rng.random_range((0.1f64).ln()..(20.0f64).ln());
    (log.exp() * 1e6) as u64
}

/// What a turn of the shell asks of the store model.
#[derive(Debug)]
pub struct Turn<Call> {
    /// Calls to deliver: (id, call, global instant its time limit passes; `None`: no limit, the
    /// model handles it locally).
    pub calls: Vec<(u64, Call, Option<u64>)>,
    /// When to run the next turn if nothing else happens, if that changed (one timer is armed
    /// at a time; see [`Process::timer_fired`]).
    pub timer: Option<u64>,
}

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
    /// A resign or shutdown in progress.
    pub stopping: Option<AfterRelease>,
    /// Calls in flight.
    calls: HashMap<u64, C::Call>,
    /// The armed timer.
    timer: Option<u64>,
    /// The deadline the tenure's guards judge by (the publisher's), while a tenure is held.
    guard_deadline: Option<MonotonicTime>,
    /// A tenure of this process was seen over, and none started since.
    lapsed: bool,
    /// Break the shell on purpose: while leading, the core is handed a clock that stops just
    /// before its deadline, and the publisher extends a tenure whatever its deadline. A renew that
    /// succeeds after the deadline then revives the lapsed tenure under the same term.
    pub unfenced: bool,
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
            stopping: None,
            calls: HashMap::new(),
            timer: Some(0),
            guard_deadline: None,
            lapsed: false,
            unfenced: false,
        }
    }

    /// True when a timer event at global `at` is the armed timer (others are stale); disarms it.
    /// A paused process's timer fires on resume: call this when it would have fired, and turn
    /// the process when it resumes.
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
    pub fn believes_leading(&self, now: u64) -> bool {
        self.alive && self.guard_deadline.is_some_and(|deadline| self.clock.local(now) < deadline)
    }

    /// The shell's turn at global `now`: start calls (`limit` gives each call's time limit, `None`
    /// for calls the model handles locally), publish reports (checking S2 against `highest_term`),
    /// drop guards at once, move a stop along, and arm the timer.
    pub fn turn(
        &mut self,
        now: u64,
        next_id: &mut u64,
        highest_term: &mut u64,
        limit: impl Fn(&C::Call) -> Option<Duration>,
    ) -> Result<Turn<C::Call>, String> {
        let mut turn = Turn { calls: Vec::new(), timer: None };
        if !self.runnable() {
            return Ok(turn);
        }
        let local = self.local(now);
        let real = self.clock.local(now);
        // What the shell does in one wake-up; publishing may change the core (a lapse), and a
        // core that asks to be woken now is polled again at once, as the shell's loop would.
        for round in 0.. {
            let started = turn.calls.len();
            while let Some(call) = self.core.poll_call(local) {
                *next_id += 1;
                let deadline = limit(&call).map(|limit| self.clock.global(local + limit).max(now + 1));
                if deadline.is_some() {
                    self.calls.insert(*next_id, call.clone());
                }
                turn.calls.push((*next_id, call, deadline));
            }
            self.publish(local, highest_term)?;
            if self.core.awaits_guards() {
                self.core.guards_dropped(local);
            }
            if let Some(after) = self.stopping {
                if self.core.release_result(after).is_some() {
                    self.stopping = None;
                    self.alive = after == AfterRelease::Campaign;
                }
            }
            let due = self.core.poll_timeout().is_some_and(|at| at <= real) && !self.unfenced;
            if !due || !self.alive {
                break;
            }
            if round > 0 && turn.calls.len() == started {
                // Asked to be woken in the past, twice, with nothing to do: the shell would spin.
                return Err(format!(
                    "busy loop: woken at {:?}, which is not after now ({real:?})",
                    self.core.poll_timeout()
                ));
            }
        }
        let timer = match self.core.poll_timeout() {
            // The unfenced shell's clock stops before the deadline: no wake-up can be due.
            Some(at) if at <= real => None,
            at => at.map(|at| self.clock.global(at).max(now + 1)),
        };
        if timer != self.timer {
            self.timer = timer;
            turn.timer = timer;
        }
        Ok(turn)
    }

    fn publish(&mut self, local: MonotonicTime, highest_term: &mut u64) -> Result<(), String> {
        loop {
            while let Some(report) = self.core.poll_report() {
                match report {
                    Report::Event(Event::StartedLeading { term }) => {
                        if term.0 <= *highest_term {
                            return Err(format!("S2: term {} started after term {highest_term}", term.0));
                        }
                        *highest_term = term.0;
                        self.guard_deadline = self.core.valid_until();
                        self.lapsed = false;
                    }
                    Report::Event(Event::StoppedLeading { .. }) => self.guard_deadline = None,
                    _ => {}
                }
            }
            let (Some(deadline), Some(valid_until)) = (self.guard_deadline, self.core.valid_until()) else {
                return Ok(());
            };
            if local >= deadline && !self.unfenced {
                // The publisher refuses: the tenure is over for good.
                self.guard_deadline = None;
                self.core.lapse();
                continue;
            }
            self.guard_deadline = Some(deadline.max(valid_until));
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
        if self.calls.remove(&id).is_some() {
            self.core.handle(self.local(now), input);
        }
    }

    /// Call `id`'s time limit passed: the call, for the model to fail it, if it was in flight.
    pub fn time_out(&mut self, id: u64) -> Option<C::Call> {
        self.calls.remove(&id)
    }

    /// A notification (or a failed call's error) arrives at global `now`.
    pub fn notify(&mut self, now: u64, input: C::Input) {
        self.core.handle(self.local(now), input);
    }

    /// Starts a resign (`Campaign`) or a shutdown (`Stop`): step down, guards dropped at once,
    /// release.
    pub fn stop(&mut self, now: u64, after: AfterRelease) {
        let local = self.local(now);
        self.core.step_down(local);
        self.core.release(local, after);
        self.stopping = Some(after);
    }

    /// S2's revival check at global `now`: a tenure seen as over must not be believed again.
    pub fn check_revival(&mut self, now: u64) -> Result<(), String> {
        let believes = self.believes_leading(now);
        if self.guard_deadline.is_some() && !believes {
            self.lapsed = true;
        } else if believes && self.lapsed {
            return Err("S2: a tenure seen as over is believed again under the same term".into());
        }
        Ok(())
    }
}

/// S1 at global `now`: at most one of `processes` believes it leads.
pub fn check_one_leader<C: ElectionCore>(processes: &[Process<C>], now: u64) -> Result<(), String>
where
    C::Call: Clone,
{
    let leaders: Vec<usize> = (0..processes.len()).filter(|&p| processes[p].believes_leading(now)).collect();
    if leaders.len() > 1 {
        return Err(format!("S1: processes {leaders:?} lead at once at {} ms", now / 1_000_000));
    }
    Ok(())
}

/// Runs `schedule(seed)` for `count` seeds from `base` on every core; the failures, in seed order.
pub fn search(base: u64, count: u64, schedule: impl Fn(u64) -> Result<(), String> + Sync) -> Vec<(u64, String)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let schedule = &schedule;
    let mut failures: Vec<(u64, String)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (base + t..base + count)
                        .step_by(threads as usize)
                        .filter_map(|seed| schedule(seed).err().map(|why| (seed, why)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    });
    failures.sort();
    failures
}

/// A number from the environment (`TENURE_SIM_SCHEDULES`, `TENURE_SIM_SEED`...).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Runs a simulation test: one seed when `TENURE_SIM_SEED` is set, else `TENURE_SIM_SCHEDULES`
/// (default 10,000) seeds from `TENURE_SIM_BASE_SEED`; panics with the first failure's seed.
pub fn run_schedules(schedule: impl Fn(u64) -> Result<(), String> + Sync) {
    if let Some(seed) = env_u64("TENURE_SIM_SEED") {
        if let Err(why) = schedule(seed) {
            panic!("seed {seed}: {why}");
        }
        return;
    }
    let count = env_u64("TENURE_SIM_SCHEDULES").unwrap_or(10_000);
    let failures = search(env_u64("TENURE_SIM_BASE_SEED").unwrap_or(0), count, schedule);
    if let Some((seed, why)) = failures.first() {
        panic!(
            "{} of {count} schedules failed; first: seed {seed}: {why} (replay with TENURE_SIM_SEED={seed})",
            failures.len()
        );
    }
}
