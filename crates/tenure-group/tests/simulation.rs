//! A randomized, deterministic simulation of the handoff core ([`MemberCore`]).
//!
//! A discrete-event scheduler over one global virtual time (nanoseconds) drives 2 to 5 members of
//! one group, the way the real driver does (`src/driver.rs`): several calls in flight, at most one
//! per record, each wrapped in the call timeout (an error at `started + call_timeout` on the
//! member's clock; a late reply is dropped, but a late *write* still lands), `poll_action` after
//! everything that happens, a timer at `next_wakeup`, a drain after every revoke.
//!
//! - **Clocks**: each member's monotonic clock runs at a rate in `[1 - d, 1 + d]` (half of the
//!   draws at the extremes), `d = 0.9 x Timing::max_clock_drift()`.
//! - **Store**: member records and the table with versions and compare-and-swap. Requests and
//!   replies take 0.1 to 20 ms each way; in *storm* phases requests are dropped, replies lost
//!   (the write applied), and both delayed up to 3 call timeouts (writes that land after their
//!   caller gave up). A watch (in half of the schedules; the others poll) notifies every member
//!   after each write, with a delay, coalescing like a real watch; in half of the watched
//!   schedules it pushes the changed records themselves instead (etcd, Kubernetes), in the
//!   store's order, each after a delay, and in storms it loses what was queued and says `Resync`
//!   (a watch that broke and re-opened); in half of those (odd seeds) a member record that
//!   changed comes as `Touched`, without content (ZooKeeper), and only created records and the
//!   table as records. Departed members'
//!   records are deleted by the members (compare-and-swap on the version).
//! - **Faults**, one per phase: a crash (requests in flight still land) with a later restart under
//!   the same identity (a new incarnation: it must wait the old one's lease out), a pause of up to
//!   2 leases (the clock runs, nothing is handled; on resume everything due is handled), a
//!   network isolation of one member up to 2 leases (its requests are dropped, its watch is
//!   silent; a resync on heal), a graceful leave, a new member joining, a duplicate process with
//!   a live member's identity.
//!
//! Checked after every event:
//! 1. **P1 safety**: no partition has two members that may work on it
//!    ([`MemberCore::may_work_on`] at each member's own local time: owned or revoked-but-not-yet-
//!    drained, while its membership is valid). Paused members count (they act on their belief the
//!    moment they resume).
//! 2. **Terms**: every `Acquired { partition, term }` has a term strictly greater than every term
//!    of that partition acquired before it.
//! 3. **Liveness**: at the end of every schedule a calm period of 4 leases; then every partition
//!    must be owned by exactly one live member, and each member's share must be within the floor
//!    and ceiling of its quota (the assignment settled). Then the member owning most partitions
//!    crashes, and every partition must be owned again within `lease / slowest rate + 8 round
//!    trips + the longest watch delay + the longest drain` (with polling, plus a poll period).
//!
//! Negative tests show that the checker can fail: clock drift 1.5 x beyond the bound gives two
//! owners, a store that ignores compare-and-swap gives two owners or a repeated term.
//!
//! Replay one schedule with its trace: `TENURE_GROUP_SIM_SEED=<seed> cargo test -p tenure-group
//! --test simulation randomized_schedules_never -- --nocapture`; `TENURE_GROUP_SIM_SCHEDULES=<n>`
//! changes the count of each of the two halves (default 5 000 each, 10 000 per run),
//! `TENURE_GROUP_SIM_DRIFT_FRACTION` the clock drift as a fraction of the bound (default 0.9).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tenure::{MonotonicTime, Timing};
use tenure_group::handoff::{Action, GroupEvent, MemberCore};
use tenure_group::record::{MemberRecord, MemberState, PartitionTable};
use tenure_group::store::{Change, Key, Snapshot, StoreError, Stored, Value, Version};
use tenure_group::GroupConfig;

const MS: u64 = 1_000_000;
const MIN_DELAY: u64 = MS / 10;
const MAX_DELAY: u64 = 20 * MS;
const MAX_WATCH_DELAY: u64 = 20 * MS;
const MAX_DRAIN: u64 = 30 * MS;
const MAX_EVENTS: u64 = 3_000_000;
/// Schedules per run of each of the two halves (10 000 in all).
const DEFAULT_SCHEDULES: u64 = 5_000;
const BASE_SEED: u64 = 11_000_000;
const TRACE_TAIL: usize = 60;

/// Adds a line to the trace, formatting it only when a trace is kept.
macro_rules! trace {
    ($world:expr, $($arg:tt)*) => {
        if $world.params.keep_trace {
            let line = format!($($arg)*);
            $world.log(line);
        }
    };
}

#[derive(Debug, Clone, Copy)]
struct Params {
    drift_fraction: f64,
    ignore_cas: bool,
    print_trace: bool,
    /// Keep a trace (replays only: formatting every step costs most of the run time).
    keep_trace: bool,
}

impl Params {
    const REAL: Params = Params { drift_fraction: 0.9, ignore_cas: false, print_trace: false, keep_trace: false };
}

#[derive(Debug, Clone, Copy)]
struct Clock {
    offset: u64,
    rate_ppb: u64,
}

impl Clock {
    fn local(&self, global: u64) -> MonotonicTime {
        let scaled = u128::from(global) * u128::from(self.rate_ppb) / 1_000_000_000;
        MonotonicTime(Duration::from_nanos(self.offset + scaled as u64))
    }
    /// The first global instant at which the local clock reads at least `local`.
    fn global_at(&self, local: MonotonicTime) -> u64 {
        let local = local.0.as_nanos() as u64;
        if local <= self.offset {
            return 0;
        }
        let scaled = u128::from(local - self.offset) * 1_000_000_000;
        scaled.div_ceil(u128::from(self.rate_ppb)) as u64
    }
}

#[derive(Debug)]
enum Ev {
    /// A request reaches the store.
    Arrive {
        node: usize,
        gen: u32,
        req: u64,
        action: Action,
        drop: bool,
        lose_reply: bool,
        reply_delay: u64,
        /// When the caller gives up, if no timeout event was queued (the reply was due first).
        unqueued_timeout: Option<u64>,
    },
    /// A reply reaches its member.
    Reply {
        node: usize,
        gen: u32,
        req: u64,
        result: Reply,
    },
    /// The call timeout of a request passes.
    Timeout {
        node: usize,
        gen: u32,
        req: u64,
    },
    Timer {
        node: usize,
        gen: u32,
    },
    Notify {
        node: usize,
        gen: u32,
    },
    /// The first pushed record change queued for a member reaches it.
    Push {
        node: usize,
        gen: u32,
    },
    Drained {
        node: usize,
        gen: u32,
        partition: u32,
    },
    Resume {
        node: usize,
        gen: u32,
    },
    Heal {
        node: usize,
        gen: u32,
    },
    Phase,
}

#[derive(Debug, Clone)]
enum Reply {
    Read(Result<Snapshot, StoreError>),
    Write(Key, Result<Version, StoreError>),
    Delete(Key, Result<(), StoreError>),
}

#[derive(Debug, Clone)]
enum Outstanding {
    Read,
    Write(Key),
    Delete(Key),
}

struct Node {
    identity: String,
    gen: u32,
    core: Option<MemberCore>,
    clock: Clock,
    outstanding: BTreeMap<u64, Outstanding>,
    paused: bool,
    isolated: bool,
    notify_pending: bool,
    /// Record changes pushed to this member and not delivered yet, in the store's order.
    pushed: VecDeque<Change>,
    timers: BTreeSet<u64>,
    crashed: bool,
    gone: bool,
    /// Events that arrived while paused, handled on resume.
    deferred: Vec<Ev>,
}

struct Failure {
    seed: u64,
    message: String,
    trace: Vec<String>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    events: u64,
    acquisitions: u64,
    failovers: u64,
    longest_failover_over_lease: f64,
}

struct World {
    seed: u64,
    params: Params,
    rng: SmallRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Ev>,
    nodes: Vec<Node>,
    store: BTreeMap<Key, (Version, Value)>,
    next_version: u64,
    next_req: u64,
    timing: Timing,
    partitions: u32,
    has_watch: bool,
    /// The watch pushes records ([`Change`]) rather than "something changed".
    record_watch: bool,
    /// The record watch says only `Touched` of a member record that changed (ZooKeeper).
    touch_watch: bool,
    drift: f64,
    storm: bool,
    phases_left: u32,
    last_term: Vec<u64>,
    trace: VecDeque<String>,
    failure: Option<String>,
    stats: Stats,
    identities: u32,
    /// In the final checks drains are short: the failover bound counts one drain of at most
    /// `MAX_DRAIN` (a user's drain adds to the handoff time).
    final_phase: bool,
}

impl World {
    fn new(seed: u64, params: Params) -> World {
        let mut rng = SmallRng::seed_from_u64(seed);
        let timing = match rng.random_range(0..4) {
            0 => Timing::default(),
            _ => Timing::from_ttl(Duration::from_secs(rng.random_range(1..=4))).expect("valid ttl"),
        };
        let partitions = [1, 3, 4, 8, 16][rng.random_range(0..5)];
        let has_watch = rng.random_bool(0.5);
        let record_watch = has_watch && rng.random_bool(0.5);
        let drift = (params.drift_fraction * timing.max_clock_drift()).min(0.8);
        let phases_left = rng.random_range(2..=6);
        let mut world = World {
            seed,
            params,
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            nodes: Vec::new(),
            store: BTreeMap::new(),
            next_version: 1,
            next_req: 1,
            timing,
            partitions,
            has_watch,
            record_watch,
            touch_watch: record_watch && seed % 2 == 1,
            drift,
            storm: false,
            phases_left,
            last_term: vec![0; partitions as usize],
            trace: VecDeque::new(),
            failure: None,
            stats: Stats::default(),
            identities: 0,
            final_phase: false,
        };
        let members = world.rng.random_range(2..=5);
        for _ in 0..members {
            world.add_node(None);
        }
        world.push(0, Ev::Phase);
        world
    }

    fn log(&mut self, line: String) {
        let line = format!("{:>10.3} ms {line}", self.now as f64 / 1e6);
        if self.params.print_trace {
            println!("{line}");
        }
        self.trace.push_back(line);
        if self.trace.len() > TRACE_TAIL {
            self.trace.pop_front();
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn delay(&mut self) -> u64 {
        let long = self.storm && self.rng.random_bool(0.2);
        if long {
            self.rng.random_range(0..3 * self.timing.call_timeout.as_nanos() as u64)
        } else {
            // Log-uniform between MIN_DELAY and MAX_DELAY.
            let low = (MIN_DELAY as f64).ln();
            let high = (MAX_DELAY as f64).ln();
            self.rng.random_range(low..high).exp() as u64
        }
    }

    fn lease_ns(&self) -> u64 {
        self.timing.lease_duration.as_nanos() as u64
    }

    fn config(&self) -> GroupConfig {
        GroupConfig { timing: self.timing, partition_count: self.partitions, weight: 1 }
    }

    fn add_node(&mut self, identity: Option<String>) -> usize {
        let identity = identity.unwrap_or_else(|| {
            self.identities += 1;
            format!("m{}", self.identities)
        });
        let rate = if self.rng.random_bool(0.5) {
            if self.rng.random_bool(0.5) {
                1.0 - self.drift
            } else {
                1.0 + self.drift
            }
        } else {
            self.rng.random_range(1.0 - self.drift..=1.0 + self.drift)
        };
        let clock = Clock { offset: self.rng.random_range(0..1_000_000 * MS), rate_ppb: (rate * 1e9) as u64 };
        let core = MemberCore::new(identity.clone(), self.rng.random(), self.config(), self.has_watch).expect("valid");
        self.nodes.push(Node {
            identity: identity.clone(),
            gen: 1,
            core: Some(core),
            clock,
            outstanding: BTreeMap::new(),
            paused: false,
            isolated: false,
            notify_pending: false,
            pushed: VecDeque::new(),
            timers: BTreeSet::new(),
            crashed: false,
            gone: false,
            deferred: Vec::new(),
        });
        let node = self.nodes.len() - 1;
        trace!(self, "{identity} (node {node}) starts, rate {rate:.3}");
        self.drive(node);
        node
    }

    fn local(&self, node: usize) -> MonotonicTime {
        self.nodes[node].clock.local(self.now)
    }

    fn run(mut self) -> Result<Stats, Failure> {
        let mut events = 0u64;
        while let Some(Reverse((at, seq))) = self.queue.pop() {
            let ev = self.events.remove(&seq).expect("queued event");
            self.now = at;
            events += 1;
            if events > MAX_EVENTS {
                self.failure = Some("too many events: a busy loop".into());
            }
            let stop = self.handle(ev);
            self.check_safety();
            if let Some(message) = self.failure.take() {
                return Err(Failure { seed: self.seed, message, trace: self.trace.into_iter().collect() });
            }
            if stop {
                break;
            }
        }
        self.stats.events = events;
        Ok(self.stats)
    }

    fn alive(&self, node: usize, gen: u32) -> bool {
        let n = &self.nodes[node];
        n.gen == gen && !n.crashed && !n.gone
    }

    /// Returns true to end the schedule.
    fn handle(&mut self, ev: Ev) -> bool {
        if let Some((node, gen)) = ev_node(&ev) {
            if !self.alive(node, gen) {
                if let Ev::Arrive { .. } = ev {
                } else {
                    return false;
                }
            } else if self.nodes[node].paused && !matches!(ev, Ev::Resume { .. } | Ev::Arrive { .. }) {
                // Handled on resume, in order.
                self.nodes[node].deferred.push(ev);
                return false;
            }
        }
        match ev {
            Ev::Arrive { node, gen, req, action, drop, lose_reply, reply_delay, unqueued_timeout } => {
                let isolated = self.nodes[node].isolated && self.nodes[node].gen == gen;
                if drop || isolated {
                    if let Some(at) = unqueued_timeout {
                        self.push(at.max(self.now), Ev::Timeout { node, gen, req });
                    }
                    return false;
                }
                let result = self.apply(node, action);
                if lose_reply {
                    return false;
                }
                self.push(self.now + reply_delay, Ev::Reply { node, gen, req, result });
            }
            Ev::Reply { node, gen: _, req, result } => {
                if self.nodes[node].outstanding.remove(&req).is_none() {
                    return false;
                }
                let now = self.local(node);
                let core = self.nodes[node].core.as_mut().expect("alive");
                match result {
                    Reply::Read(r) => core.on_read(now, r),
                    Reply::Write(key, r) => core.on_write(now, &key, r),
                    Reply::Delete(key, r) => core.on_delete(now, &key, r),
                }
                self.drive(node);
            }
            Ev::Timeout { node, gen: _, req } => {
                let Some(outstanding) = self.nodes[node].outstanding.remove(&req) else { return false };
                let now = self.local(node);
                let error = StoreError::Timeout(self.timing.call_timeout);
                let core = self.nodes[node].core.as_mut().expect("alive");
                match outstanding {
                    Outstanding::Read => core.on_read(now, Err(error)),
                    Outstanding::Write(key) => core.on_write(now, &key, Err(error)),
                    Outstanding::Delete(key) => core.on_delete(now, &key, Err(error)),
                }
                self.drive(node);
            }
            Ev::Timer { node, gen: _ } => {
                self.nodes[node].timers.remove(&self.now);
                self.drive(node);
            }
            Ev::Notify { node, gen: _ } => {
                self.nodes[node].notify_pending = false;
                let now = self.local(node);
                self.nodes[node].core.as_mut().expect("alive").on_change(now);
                self.drive(node);
            }
            Ev::Push { node, gen } => {
                let Some(change) = self.nodes[node].pushed.pop_front() else { return false };
                if !self.nodes[node].pushed.is_empty() {
                    let delay = self.rng.random_range(0..MAX_WATCH_DELAY / 4);
                    self.push(self.now + delay, Ev::Push { node, gen });
                }
                let now = self.local(node);
                self.nodes[node].core.as_mut().expect("alive").on_store_change(now, change);
                self.drive(node);
            }
            Ev::Drained { node, gen: _, partition } => {
                let now = self.local(node);
                self.nodes[node].core.as_mut().expect("alive").on_drained(now, partition);
                self.drive(node);
            }
            Ev::Resume { node, gen: _ } => {
                self.nodes[node].paused = false;
                trace!(self, "{} resumes", self.nodes[node].identity);
                for ev in std::mem::take(&mut self.nodes[node].deferred) {
                    self.push(self.now, ev);
                }
                self.drive(node);
            }
            Ev::Heal { node, gen: _ } => {
                self.nodes[node].isolated = false;
                trace!(self, "{} reachable again", self.nodes[node].identity);
                let now = self.local(node);
                self.nodes[node].core.as_mut().expect("alive").on_change(now);
                self.drive(node);
            }
            Ev::Phase => return self.on_phase(),
        }
        false
    }

    fn apply(&mut self, node: usize, action: Action) -> Reply {
        match action {
            Action::Read => {
                let mut snapshot = Snapshot::default();
                for (key, (version, value)) in &self.store {
                    match (key, value) {
                        (Key::Table, Value::Table(t)) => {
                            snapshot.table = Some(Stored { version: *version, value: t.clone() })
                        }
                        (Key::Member(id), Value::Member(m)) => {
                            snapshot.members.insert(id.clone(), Stored { version: *version, value: m.clone() });
                        }
                        _ => unreachable!("keys and values match"),
                    }
                }
                Reply::Read(Ok(snapshot))
            }
            Action::Write { key, expected, value } => {
                let current = self.store.get(&key).map(|(v, _)| *v);
                let ok = self.params.ignore_cas || current == expected;
                let result = if ok {
                    let version = Version(self.next_version);
                    self.next_version += 1;
                    trace!(self, "store: {} writes {key} = {}", self.nodes[node].identity, describe(&value));
                    self.store.insert(key.clone(), (version, value.clone()));
                    let touched = self.touch_watch && current.is_some() && matches!(key, Key::Member(_));
                    self.notify_all(if touched {
                        Change::Touched(key.clone())
                    } else {
                        Change::Put(key.clone(), Stored { version, value })
                    });
                    Ok(version)
                } else if expected.is_none() {
                    Err(StoreError::AlreadyExists)
                } else {
                    Err(StoreError::Conflict)
                };
                Reply::Write(key, result)
            }
            Action::Delete { key, expected } => {
                let current = self.store.get(&key).map(|(v, _)| *v);
                let result = if self.params.ignore_cas || current == Some(expected) {
                    trace!(self, "store: {} deletes {key}", self.nodes[node].identity);
                    self.store.remove(&key);
                    self.notify_all(Change::Deleted(key.clone()));
                    Ok(())
                } else {
                    Err(StoreError::Conflict)
                };
                Reply::Delete(key, result)
            }
        }
    }

    /// Tells every watching member about `change`: the change itself, queued in order, with a
    /// record watch; a coalesced "something changed" otherwise.
    fn notify_all(&mut self, change: Change) {
        if !self.has_watch {
            return;
        }
        if self.record_watch {
            for node in 0..self.nodes.len() {
                let n = &self.nodes[node];
                if n.crashed || n.gone || n.isolated {
                    continue;
                }
                let gap = self.storm && self.rng.random_bool(0.05);
                let delay = if self.storm && self.rng.random_bool(0.2) {
                    self.rng.random_range(0..self.lease_ns() / 2)
                } else {
                    self.rng.random_range(0..MAX_WATCH_DELAY)
                };
                let n = &mut self.nodes[node];
                if gap {
                    // The watch broke: what was queued is lost, and the re-opened watch resyncs.
                    n.pushed.clear();
                    n.pushed.push_back(Change::Resync);
                } else {
                    n.pushed.push_back(change.clone());
                }
                if n.pushed.len() == 1 {
                    let gen = n.gen;
                    self.push(self.now + delay, Ev::Push { node, gen });
                }
            }
            return;
        }
        for node in 0..self.nodes.len() {
            let n = &self.nodes[node];
            if n.crashed || n.gone || n.isolated || n.notify_pending {
                continue;
            }
            let delay = if self.storm && self.rng.random_bool(0.2) {
                self.rng.random_range(0..self.lease_ns() / 2)
            } else {
                self.rng.random_range(0..MAX_WATCH_DELAY)
            };
            self.nodes[node].notify_pending = true;
            let gen = self.nodes[node].gen;
            self.push(self.now + delay, Ev::Notify { node, gen });
        }
    }

    /// Feeds the core's events and actions to the world, then arms the timer.
    fn drive(&mut self, node: usize) {
        if self.nodes[node].paused || self.nodes[node].crashed || self.nodes[node].gone {
            return;
        }
        let now = self.local(node);
        let mut actions = Vec::new();
        let mut events = Vec::new();
        {
            let core = self.nodes[node].core.as_mut().expect("alive");
            loop {
                while let Some(event) = core.poll_event() {
                    events.push(event);
                }
                match core.poll_action(now) {
                    Some(action) => actions.push(action),
                    None => break,
                }
                if actions.len() > 100 {
                    break;
                }
            }
            while let Some(event) = core.poll_event() {
                events.push(event);
            }
        }
        if actions.len() > 100 {
            self.failure = Some(format!("{} asks for more than 100 actions at one instant", self.nodes[node].identity));
            return;
        }
        for event in events {
            self.on_event(node, event);
        }
        for action in actions {
            self.send(node, action);
        }
        let gen = self.nodes[node].gen;
        if self.nodes[node].gone {
            return;
        }
        if let Some(wake) = self.nodes[node].core.as_ref().expect("alive").next_wakeup(now) {
            if wake <= now {
                self.failure = Some(format!("{} asks to be woken in the past", self.nodes[node].identity));
                return;
            }
            let at = self.nodes[node].clock.global_at(wake).max(self.now + 1);
            if self.nodes[node].timers.insert(at) {
                self.push(at, Ev::Timer { node, gen });
            }
        }
    }

    fn on_event(&mut self, node: usize, event: GroupEvent) {
        let identity = self.nodes[node].identity.clone();
        trace!(self, "{identity}: {event:?}");
        match event {
            GroupEvent::Acquired { partition, term } => {
                self.stats.acquisitions += 1;
                let last = &mut self.last_term[partition as usize];
                if term.0 <= *last {
                    self.failure =
                        Some(format!("terms: {identity} acquired partition {partition} with term {term} after {last}"));
                }
                *last = (*last).max(term.0);
            }
            GroupEvent::Revoked { partition, .. } => {
                let drain = if !self.final_phase && self.rng.random_bool(0.1) {
                    self.rng.random_range(0..self.lease_ns())
                } else {
                    self.rng.random_range(0..MAX_DRAIN)
                };
                let gen = self.nodes[node].gen;
                self.push(self.now + drain, Ev::Drained { node, gen, partition });
            }
            GroupEvent::Left => {
                self.nodes[node].gone = true;
            }
            _ => {}
        }
    }

    fn send(&mut self, node: usize, action: Action) {
        let req = self.next_req;
        self.next_req += 1;
        let outstanding = match &action {
            Action::Read => Outstanding::Read,
            Action::Write { key, .. } => Outstanding::Write(key.clone()),
            Action::Delete { key, .. } => Outstanding::Delete(key.clone()),
        };
        trace!(self, "{} sends {}", self.nodes[node].identity, describe_action(&action));
        self.nodes[node].outstanding.insert(req, outstanding);
        let gen = self.nodes[node].gen;
        let drop = self.storm && self.rng.random_bool(0.05);
        let lose_reply = self.storm && self.rng.random_bool(0.05);
        let there = self.delay();
        let back = self.delay();
        let local = self.local(node);
        let timeout = self.nodes[node].clock.global_at(local + self.timing.call_timeout).max(self.now + 1);
        // A reply that comes first makes the timeout event moot: queue it only if the request is
        // dropped on the way (decided at arrival: isolation) or the reply is late or lost (speed).
        let queue_timeout = drop || lose_reply || self.now + there + back >= timeout;
        let unqueued_timeout = (!queue_timeout).then_some(timeout);
        let arrive = Ev::Arrive { node, gen, req, action, drop, lose_reply, reply_delay: back, unqueued_timeout };
        self.push(self.now + there, arrive);
        if queue_timeout {
            self.push(timeout, Ev::Timeout { node, gen, req });
        }
    }

    fn live_nodes(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&n| !self.nodes[n].crashed && !self.nodes[n].gone).collect()
    }

    fn on_phase(&mut self) -> bool {
        if self.phases_left == 0 {
            self.final_checks();
            return true;
        }
        self.phases_left -= 1;
        self.storm = self.rng.random_bool(0.4);
        let lease = self.lease_ns();
        let length = self.rng.random_range(lease / 2..=2 * lease);
        trace!(self, "phase: {} for {:.0} ms", if self.storm { "storm" } else { "calm" }, length as f64 / 1e6);
        let live = self.live_nodes();
        match self.rng.random_range(0..10) {
            0 | 1 if live.len() > 1 => {
                let node = live[self.rng.random_range(0..live.len())];
                self.crash(node);
            }
            2 if !live.is_empty() => {
                let node = live[self.rng.random_range(0..live.len())];
                self.nodes[node].paused = true;
                let until = self.now + self.rng.random_range(0..2 * lease);
                let gen = self.nodes[node].gen;
                trace!(self, "{} paused", self.nodes[node].identity);
                self.push(until, Ev::Resume { node, gen });
            }
            3 if !live.is_empty() => {
                let node = live[self.rng.random_range(0..live.len())];
                self.nodes[node].isolated = true;
                // Its watch breaks: what was queued is lost (the heal resyncs).
                self.nodes[node].pushed.clear();
                let until = self.now + self.rng.random_range(0..2 * lease);
                let gen = self.nodes[node].gen;
                trace!(self, "{} isolated", self.nodes[node].identity);
                self.push(until, Ev::Heal { node, gen });
            }
            4 if live.len() > 1 => {
                let node = live[self.rng.random_range(0..live.len())];
                let now = self.local(node);
                trace!(self, "{} leaves", self.nodes[node].identity);
                self.nodes[node].core.as_mut().expect("alive").leave(now);
                self.drive(node);
            }
            5 if live.len() < 6 => {
                self.add_node(None);
            }
            6 => {
                // A crashed member comes back (a new process, same identity).
                if let Some(node) = (0..self.nodes.len()).find(|&n| self.nodes[n].crashed) {
                    self.restart(node);
                }
            }
            7 if !live.is_empty() && live.len() < 6 => {
                // A second process with a live member's identity.
                let node = live[self.rng.random_range(0..live.len())];
                let identity = self.nodes[node].identity.clone();
                trace!(self, "a duplicate of {identity} starts");
                self.add_node(Some(identity));
            }
            _ => {}
        }
        self.push(self.now + length, Ev::Phase);
        false
    }

    fn crash(&mut self, node: usize) {
        trace!(self, "{} crashes", self.nodes[node].identity);
        let n = &mut self.nodes[node];
        n.crashed = true;
        n.core = None;
        n.outstanding.clear();
        n.timers.clear();
        n.notify_pending = false;
        n.pushed.clear();
        n.deferred.clear();
        n.paused = false;
    }

    fn restart(&mut self, node: usize) {
        let core = MemberCore::new(self.nodes[node].identity.clone(), self.rng.random(), self.config(), self.has_watch)
            .expect("valid");
        let n = &mut self.nodes[node];
        n.crashed = false;
        n.paused = false;
        n.isolated = false;
        n.gen += 1;
        n.core = Some(core);
        trace!(self, "{} restarts", self.nodes[node].identity);
        self.drive(node);
    }

    fn check_safety(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let mut worker: [Option<(usize, tenure::Term)>; 16] = [None; 16];
        for (node, n) in self.nodes.iter().enumerate() {
            let (Some(core), false, false) = (&n.core, n.crashed, n.gone) else { continue };
            for (partition, term) in core.working(n.clock.local(self.now)) {
                if let Some((other, other_term)) = worker[partition as usize] {
                    self.failure = Some(format!(
                        "P1: partition {partition} has two owners: {} (node {other}, term {other_term}) and {} (node \
                         {node}, term {term})",
                        self.nodes[other].identity, n.identity
                    ));
                    return;
                }
                worker[partition as usize] = Some((node, term));
            }
        }
    }

    /// Runs the queue (with no faults) until `deadline` or until `done` holds.
    fn run_until(&mut self, deadline: u64, done: &dyn Fn(&World) -> bool) -> bool {
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if done(self) {
                return true;
            }
            if at > deadline {
                break;
            }
            self.queue.pop();
            let ev = self.events.remove(&seq).expect("queued event");
            self.now = at;
            if matches!(ev, Ev::Phase) {
                continue;
            }
            self.handle(ev);
            self.check_safety();
            if self.failure.is_some() {
                return false;
            }
        }
        self.now = self.now.max(deadline);
        done(self)
    }

    fn owners(&self) -> Vec<Vec<usize>> {
        (0..self.partitions)
            .map(|p| {
                self.live_nodes()
                    .into_iter()
                    .filter(|&n| {
                        let now = self.local(n);
                        self.nodes[n].core.as_ref().and_then(|c| c.owns(p, now)).is_some()
                    })
                    .collect()
            })
            .collect()
    }

    fn all_owned(&self) -> bool {
        self.owners().iter().all(|o| o.len() == 1)
    }

    fn final_checks(&mut self) {
        self.storm = false;
        self.final_phase = true;
        // End the faults: resume, heal; then a calm period.
        for node in self.live_nodes() {
            if self.nodes[node].paused {
                let gen = self.nodes[node].gen;
                self.push(self.now, Ev::Resume { node, gen });
            }
            if self.nodes[node].isolated {
                let gen = self.nodes[node].gen;
                self.push(self.now, Ev::Heal { node, gen });
            }
        }
        if self.live_nodes().is_empty() {
            return;
        }
        trace!(self, "final: calm for 4 leases");
        let slowest = 1.0 - self.drift;
        let settle = (4.0 * self.lease_ns() as f64 / slowest) as u64;
        let end = self.now + settle;
        self.run_until(end, &|_| false);
        if self.failure.is_some() {
            return;
        }
        let owners = self.owners();
        if let Some(p) = owners.iter().position(|o| o.len() != 1) {
            self.failure =
                Some(format!("liveness: partition {p} has {} owners after a calm of 4 leases", owners[p].len()));
            return;
        }
        // Balanced shares among the members (by identity).
        let live: BTreeSet<String> = self
            .live_nodes()
            .into_iter()
            .filter(|&n| self.nodes[n].core.as_ref().is_some_and(|c| c.is_member(self.local(n))))
            .map(|n| self.nodes[n].identity.clone())
            .collect();
        let mut shares: BTreeMap<String, u32> = live.iter().map(|id| (id.clone(), 0)).collect();
        for o in &owners {
            *shares.entry(self.nodes[o[0]].identity.clone()).or_default() += 1;
        }
        let count = shares.len() as u32;
        let (floor, ceil) = (self.partitions / count, self.partitions.div_ceil(count));
        if shares.values().any(|s| *s < floor || *s > ceil) {
            self.failure = Some(format!("balance: shares {shares:?} outside [{floor}, {ceil}] after the calm"));
            return;
        }
        // Records of members that left are deleted by then (they need no lease to pass).
        let left: Vec<&String> = self
            .store
            .iter()
            .filter_map(|(key, (_, value))| match (key, value) {
                (Key::Member(id), Value::Member(record)) if record.state == MemberState::Left => Some(id),
                _ => None,
            })
            .collect();
        if !left.is_empty() {
            self.failure = Some(format!("cleanup: records of members that left remain after the calm: {left:?}"));
            return;
        }
        // Crash the member with the most partitions; everything must be owned again in time.
        let members: Vec<usize> = self
            .live_nodes()
            .into_iter()
            .filter(|&n| self.nodes[n].core.as_ref().is_some_and(|c| c.is_member(self.local(n))))
            .collect();
        if members.len() < 2 {
            return;
        }
        let victim =
            *members.iter().max_by_key(|&&n| owners.iter().filter(|o| o[0] == n).count()).expect("two members");
        self.crash(victim);
        let start = self.now;
        let round_trip = 2 * MAX_DELAY;
        let poll = if self.has_watch { 0 } else { (self.timing.retry_period.as_nanos() as f64 / slowest) as u64 };
        // With touches, a silent record is read after two retry periods and expired a lease after that read.
        let unread = (self.timing.retry_period * 2).min(self.timing.renew_deadline).as_nanos() as f64 / slowest;
        let touch = if self.touch_watch { unread as u64 + 2 * round_trip } else { 0 };
        let bound =
            (self.lease_ns() as f64 / slowest) as u64 + 8 * round_trip + MAX_WATCH_DELAY + MAX_DRAIN + 2 * poll + touch;
        if !self.run_until(start + bound, &|w| w.all_owned()) {
            if self.failure.is_none() {
                let owners = self.owners();
                self.failure = Some(format!(
                    "liveness: partitions not all owned {:.0} ms after the crash of a settled member (bound {:.0} \
                     ms); owners by partition: {owners:?}",
                    (self.now - start) as f64 / 1e6,
                    bound as f64 / 1e6
                ));
            }
            return;
        }
        self.stats.failovers += 1;
        self.stats.longest_failover_over_lease = (self.now - start) as f64 / self.lease_ns() as f64;
    }
}

fn ev_node(ev: &Ev) -> Option<(usize, u32)> {
    match ev {
        Ev::Arrive { node, gen, .. }
        | Ev::Reply { node, gen, .. }
        | Ev::Timeout { node, gen, .. }
        | Ev::Timer { node, gen }
        | Ev::Notify { node, gen }
        | Ev::Push { node, gen }
        | Ev::Drained { node, gen, .. }
        | Ev::Resume { node, gen }
        | Ev::Heal { node, gen } => Some((*node, *gen)),
        Ev::Phase => None,
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Member(m) => describe_member(m),
        Value::Table(t) => describe_table(t),
    }
}

fn describe_member(m: &MemberRecord) -> String {
    format!("{}#{} inc {:x} {:?} r{}", m.identity, m.epoch, m.incarnation & 0xffff, m.state, m.renewals)
}

fn describe_table(t: &PartitionTable) -> String {
    let slots: Vec<String> = t
        .slots
        .iter()
        .map(|s| match &s.owner {
            Some(o) => format!("{}#{}@{}", o.member, o.epoch, s.term),
            None => format!("-@{}", s.term),
        })
        .collect();
    format!(
        "[{}] leaving {:?}",
        slots.join(" "),
        t.leaving.iter().map(|o| format!("{}#{}", o.member, o.epoch)).collect::<Vec<_>>()
    )
}

fn describe_action(action: &Action) -> String {
    match action {
        Action::Read => "read".into(),
        Action::Write { key, expected, value } => format!("write {key} if {expected:?}: {}", describe(value)),
        Action::Delete { key, expected } => format!("delete {key} if {expected}"),
    }
}

fn run_one(seed: u64, params: Params) -> Result<Stats, Failure> {
    World::new(seed, params).run()
}

struct Summary {
    schedules: u64,
    failures: Vec<Failure>,
    stats: Stats,
}

/// Runs the seeds `base..base + count` on every core (each schedule is deterministic on its own).
fn run_many(base: u64, count: u64, params: Params) -> Summary {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8) as u64;
    let results: Vec<Result<Stats, Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (base + t..base + count)
                        .step_by(threads as usize)
                        .map(|seed| run_one(seed, params))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a simulation thread panicked")).collect()
    });
    let mut summary = Summary { schedules: 0, failures: Vec::new(), stats: Stats::default() };
    for result in results {
        summary.schedules += 1;
        match result {
            Ok(stats) => {
                summary.stats.events += stats.events;
                summary.stats.acquisitions += stats.acquisitions;
                summary.stats.failovers += stats.failovers;
                summary.stats.longest_failover_over_lease =
                    summary.stats.longest_failover_over_lease.max(stats.longest_failover_over_lease);
            }
            Err(failure) => summary.failures.push(failure),
        }
    }
    summary
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn explain(failure: &Failure) -> String {
    format!(
        "seed {}: {}\n  replay: TENURE_GROUP_SIM_SEED={} cargo test -p tenure-group --test simulation \
         randomized_schedules_never -- --nocapture\n{}",
        failure.seed,
        failure.message,
        failure.seed,
        failure.trace.join("\n")
    )
}

/// Runs `count` schedules from `base` and fails with the first failing seed.
fn check_schedules(base: u64) {
    if let Some(seed) = env_u64("TENURE_GROUP_SIM_SEED") {
        let result = run_one(seed, Params { print_trace: true, keep_trace: true, ..Params::REAL });
        if let Err(failure) = result {
            panic!("{}", explain(&failure));
        }
        return;
    }
    let count = env_u64("TENURE_GROUP_SIM_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
    let drift_fraction = std::env::var("TENURE_GROUP_SIM_DRIFT_FRACTION").ok().and_then(|v| v.parse().ok());
    let params = Params { drift_fraction: drift_fraction.unwrap_or(Params::REAL.drift_fraction), ..Params::REAL };
    let summary = run_many(base, count, params);
    println!(
        "{} schedules, {} events, {} acquisitions, {} failovers checked, longest failover {:.2} leases",
        summary.schedules,
        summary.stats.events,
        summary.stats.acquisitions,
        summary.stats.failovers,
        summary.stats.longest_failover_over_lease
    );
    if let Some(failure) = summary.failures.first() {
        panic!("{} of {} schedules failed; first: {}", summary.failures.len(), summary.schedules, explain(failure));
    }
    assert!(summary.stats.failovers > count / 2, "too few schedules reached the failover check");
}

// Two halves of 5 000 schedules each, so that each test stays well within the CI's time limit per
// test; a replay (`TENURE_GROUP_SIM_SEED`) runs in either.
#[test]
fn randomized_schedules_never_give_a_partition_two_owners_and_settle_after_crashes() {
    check_schedules(BASE_SEED);
}

#[test]
fn randomized_schedules_second_half() {
    check_schedules(BASE_SEED + DEFAULT_SCHEDULES);
}

#[test]
fn checker_finds_two_owners_when_clock_drift_exceeds_the_bound() {
    let params = Params { drift_fraction: 1.5, ..Params::REAL };
    let summary = run_many(BASE_SEED + 1_000_000, 3000, params);
    let p1 = summary.failures.iter().filter(|f| f.message.starts_with("P1")).count();
    println!("1.5 x the drift bound: {p1} of {} schedules had two owners", summary.schedules);
    assert!(p1 > 0, "1.5 x the drift bound never gave two owners in 3000 schedules");
}

#[test]
fn checker_finds_two_owners_or_a_repeated_term_when_the_store_ignores_compare_and_swap() {
    let params = Params { ignore_cas: true, ..Params::REAL };
    let summary = run_many(BASE_SEED + 2_000_000, 500, params);
    let caught =
        summary.failures.iter().filter(|f| f.message.starts_with("P1") || f.message.starts_with("terms")).count();
    println!("store without compare-and-swap: {caught} of {} schedules failed P1 or terms", summary.schedules);
    assert!(caught > 0, "a store without compare-and-swap never gave two owners or a repeated term");
}
