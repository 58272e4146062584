//! A randomized, deterministic simulation of the etcd campaign ([`EtcdCampaign`]), the very core
//! the elector runs, against a model of etcd, under the shell's rules and checks of
//! `tenure::simulation` (S1: one leader at a time, guards judged on each process's clock; S2:
//! growing terms, no same-term revival).
//!
//! - **2 to 5 candidates**, clock rates within 0.9 x the drift bound of etcd's self-fencing (the
//!   leader stops `TTL - TTL/3` after a keep-alive on its clock, the server expires the lease a TTL
//!   after it on its own: 20 %), TTLs of 2 to 10 s.
//! - **the store**: revisions, keys bound to leases, leases the *server* expires a TTL after the
//!   last keep-alive it received (deleting their keys), create-if-absent, delete, revoke, range, a
//!   watch per candidate delivering every change in order. Requests and replies take 0.1 to 20 ms
//!   each; a request is applied atomically when it arrives.
//! - **the keep-alive pump** of the transport: one keep-alive per interval, stamped with the
//!   instant it was sent; nothing is sent while the process is paused.
//! - **faults**: lost replies (applied, the caller times out) and dropped requests in phases, a
//!   store restart (down up to a TTL; watches break; back up, every lease gets a full TTL again, as
//!   after a new raft leader), a process paused up to two TTLs, a crash, a resign, a shutdown.
//! - **liveness**: after four TTLs without a disturbance, with the store up and a candidate up,
//!   somebody leads.
//!
//! Named schedules replay what real processes found: a store restart under a leader, and a leader
//! paused past its lease. Mutation checks show the checker catching a late fence (keep-alives
//! stamped a margin after they were sent) and a same-term revival (a shell that hands answers to
//! the core with the time their call started, and extends tenures past their deadline).
//!
//! `TENURE_SIM_SCHEDULES` (default 10,000), `TENURE_SIM_BASE_SEED` and `TENURE_SIM_SEED` (replay).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tenure::simulation::{check_one_leader, delay, run_schedules, search, Clock, Process, Schedule};
use tenure::{AfterRelease, MonotonicTime};
use tenure_etcd::campaign::{EtcdCall, EtcdCampaign, EtcdInput, Keys};
use tenure_etcd::{session_timing, EtcdError};

/// How the run is broken on purpose, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mutation {
    None,
    /// Keep-alives stamped a margin after they were sent: the leader fences late.
    LateFence,
    /// A shell that never fences (its core's clock stops at the deadline): a same-term revival.
    Unfenced,
}

/// A fault to start the schedule with (the named schedules), before the random ones.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Opening {
    Random,
    StoreRestartUnderLeader,
    LeaderPausedPastLease,
}

#[derive(Debug)]
enum Msg {
    Turn(usize),
    Request {
        from: usize,
        id: u64,
        call: EtcdCall,
    },
    Answer {
        to: usize,
        id: u64,
        input: EtcdInput,
    },
    TimeOut {
        to: usize,
        id: u64,
    },
    Notice {
        to: usize,
        input: EtcdInput,
    },
    /// The pump of `session` sends a keep-alive, stamped `sent`.
    KeepAlive {
        from: usize,
        session: u64,
        lease: i64,
        sent: MonotonicTime,
    },
    Fault,
    Resume(usize),
    StoreUp,
}

struct Lease {
    expires: u64,
    ttl: Duration,
}

struct Sim {
    rng: SmallRng,
    now: u64,
    events: Schedule<Msg>,
    procs: Vec<Process<EtcdCampaign>>,
    /// Per process: the pump's session and lease.
    pumps: Vec<Option<(u64, i64)>>,
    /// Per process: the session its watch serves, and when its last notice lands (FIFO).
    watches: Vec<Option<u64>>,
    watch_fifo: Vec<u64>,
    revision: i64,
    keys: BTreeMap<String, (i64, String, i64)>,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
    store_up: bool,
    lost_replies: f64,
    ttl: Duration,
    mutation: Mutation,
    next_id: u64,
    highest_term: u64,
    settled_since: u64,
}

impl Sim {
    fn new(seed: u64, mutation: Mutation, opening: Opening) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let ttl = Duration::from_secs(rng.random_range(2..=10));
        let timing = session_timing(ttl).expect("valid ttl");
        let n = rng.random_range(2..=5);
        let procs: Vec<_> = (0..n)
            .map(|i| {
                let core = EtcdCampaign::new(format!("c{i}"), "e/".into(), timing);
                let mut process = Process::new(core, Clock::drifting(&mut rng, 0.9 * 0.2));
                process.unfenced = mutation == Mutation::Unfenced;
                process
            })
            .collect();
        let mut sim = Sim {
            rng,
            now: 0,
            events: Schedule::default(),
            procs,
            pumps: vec![None; n],
            watches: vec![None; n],
            watch_fifo: vec![0; n],
            revision: 1,
            keys: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: 0x100,
            store_up: true,
            lost_replies: 0.0,
            ttl,
            mutation,
            next_id: 0,
            highest_term: 0,
            settled_since: 0,
        };
        for p in 0..n {
            sim.events.push(0, Msg::Turn(p));
        }
        let ttl_ns = ttl.as_nanos() as u64;
        match opening {
            Opening::Random => sim.events.push(ttl_ns, Msg::Fault),
            // Once someone leads (3 TTLs in), the store goes down for most of a TTL.
            Opening::StoreRestartUnderLeader => {
                sim.events.push(3 * ttl_ns, Msg::StoreUp);
                sim.store_up = true;
            }
            Opening::LeaderPausedPastLease => sim.events.push(3 * ttl_ns, Msg::Resume(usize::MAX)),
        }
        sim
    }

    fn ttl_ns(&self) -> u64 {
        self.ttl.as_nanos() as u64
    }

    fn send(&mut self, at: u64, msg: Msg) {
        let delay = delay(&mut self.rng);
        self.events.push(at + delay, msg);
    }

    fn turn(&mut self, p: usize) -> Result<(), String> {
        let limit = session_timing(self.ttl).expect("ttl").call_timeout;
        let turn = self.procs[p].turn(self.now, &mut self.next_id, &mut self.highest_term, |call| {
            (!matches!(call, EtcdCall::KeepAlive { .. } | EtcdCall::StopKeepAlive)).then_some(limit)
        })?;
        for (id, call, deadline) in turn.calls {
            match call {
                EtcdCall::KeepAlive { session, lease } => {
                    self.pumps[p] = Some((session, lease));
                    let sent = self.procs[p].clock.local(self.now);
                    self.send(self.now, Msg::KeepAlive { from: p, session, lease, sent });
                }
                EtcdCall::StopKeepAlive => self.pumps[p] = None,
                call => {
                    if let EtcdCall::Resync { session } = call {
                        self.watches[p] = Some(session);
                    }
                    self.send(self.now, Msg::Request { from: p, id, call });
                    self.events.push(deadline.unwrap_or(self.now), Msg::TimeOut { to: p, id });
                }
            }
        }
        if let Some(at) = turn.timer {
            self.events.push(at, Msg::Turn(p));
        }
        Ok(())
    }

    /// Deletes `gone` keys and tells every watcher.
    fn delete_keys(&mut self, gone: Vec<String>) {
        for key in &gone {
            self.keys.remove(key);
        }
        if !gone.is_empty() {
            self.revision += 1;
            self.notify(gone.into_iter().map(|k| (k, None)).collect());
        }
    }

    fn notify(&mut self, changes: Vec<(String, Option<(i64, String)>)>) {
        for p in 0..self.procs.len() {
            let Some(session) = self.watches[p] else { continue };
            let at = (self.now + delay(&mut self.rng)).max(self.watch_fifo[p]);
            self.watch_fifo[p] = at;
            let input = EtcdInput::Watched { session, changes: changes.clone(), cancelled: None };
            self.events.push(at, Msg::Notice { to: p, input });
        }
    }

    fn keys_of(&self, lease: i64) -> Vec<String> {
        self.keys.iter().filter(|(_, v)| v.2 == lease).map(|(k, _)| k.clone()).collect()
    }

    fn expire_leases(&mut self) {
        let now = self.now;
        let expired: Vec<i64> = self.leases.iter().filter(|(_, l)| l.expires <= now).map(|(id, _)| *id).collect();
        for lease in expired {
            self.leases.remove(&lease);
            self.delete_keys(self.keys_of(lease));
        }
    }

    /// A request applied at the store; the answer.
    fn apply(&mut self, from: usize, call: EtcdCall) -> EtcdInput {
        match call {
            EtcdCall::Grant { session, ttl_secs } => {
                self.next_lease += 1;
                let ttl = Duration::from_secs(ttl_secs.unsigned_abs());
                self.leases.insert(self.next_lease, Lease { expires: self.now + ttl.as_nanos() as u64, ttl });
                EtcdInput::Granted { session, result: Ok((self.next_lease, ttl)) }
            }
            EtcdCall::Create { session, key, lease } => {
                let result = match self.keys.get(&key) {
                    Some((create, _, _)) => Ok(*create),
                    None if !self.leases.contains_key(&lease) => Err(EtcdError::Protocol("lease not found".into())),
                    None => {
                        self.revision += 1;
                        let value = format!("c{from}");
                        self.keys.insert(key.clone(), (self.revision, value.clone(), lease));
                        self.notify(vec![(key, Some((self.revision, value)))]);
                        Ok(self.revision)
                    }
                };
                EtcdInput::Created { session, result }
            }
            EtcdCall::Resync { session } => {
                let keys: Keys = self.keys.iter().map(|(k, (r, v, _))| (k.clone(), (*r, v.clone()))).collect();
                EtcdInput::Loaded { session, result: Ok(keys) }
            }
            EtcdCall::Claim { session, key } => {
                EtcdInput::Claimed { session, result: Ok(self.keys.get(&key).map(|(r, _, _)| *r)) }
            }
            EtcdCall::Delete { session, key } => {
                if self.keys.contains_key(&key) {
                    self.delete_keys(vec![key]);
                }
                EtcdInput::Deleted { session, result: Ok(()) }
            }
            EtcdCall::Revoke { lease } => {
                self.leases.remove(&lease);
                self.delete_keys(self.keys_of(lease));
                EtcdInput::Revoked { lease, result: Ok(()) }
            }
            EtcdCall::KeepAlive { .. } | EtcdCall::StopKeepAlive => unreachable!("the pump is modelled apart"),
        }
    }

    fn leader(&self) -> Option<usize> {
        (0..self.procs.len()).find(|&p| self.procs[p].believes_leading(self.now))
    }

    fn restart_store(&mut self, down_for: u64) {
        self.store_up = false;
        for p in 0..self.procs.len() {
            if let Some(session) = self.watches[p].take() {
                let input = EtcdInput::WatchFailed { session, error: EtcdError::Protocol("store down".into()) };
                self.send(self.now, Msg::Notice { to: p, input });
            }
        }
        self.events.push(self.now + down_for, Msg::StoreUp);
    }

    fn pause(&mut self, p: usize, for_ns: u64) {
        self.procs[p].paused_until = Some(self.now + for_ns);
        self.events.push(self.now + for_ns, Msg::Resume(p));
    }

    fn fault(&mut self) -> Result<(), String> {
        self.settled_since = self.now;
        let n = self.procs.len();
        let ttl = self.ttl_ns();
        // The leader is the preferred target.
        let p = match self.leader() {
            Some(leader) if self.rng.random_bool(0.5) => leader,
            _ => self.rng.random_range(0..n),
        };
        let up = self.procs.iter().filter(|q| q.alive).count();
        match self.rng.random_range(0..7) {
            0 if self.store_up => {
                let down = self.rng.random_range(0..ttl);
                self.restart_store(down);
            }
            1 if self.procs[p].runnable() => {
                let pause = self.rng.random_range(0..2 * ttl);
                self.pause(p, pause);
            }
            2 if self.procs[p].alive && up > 1 => self.procs[p].alive = false,
            3 | 4 if self.procs[p].runnable() && self.procs[p].stopping.is_none() => {
                let after =
                    if up > 1 && self.rng.random_bool(0.3) { AfterRelease::Stop } else { AfterRelease::Campaign };
                self.procs[p].stop(self.now, after);
                self.turn(p)?;
            }
            _ => self.lost_replies = if self.lost_replies > 0.0 { 0.0 } else { self.rng.random_range(0.01..0.2) },
        }
        let next = self.now + self.rng.random_range(ttl / 2..4 * ttl);
        self.events.push(next, Msg::Fault);
        Ok(())
    }

    fn step(&mut self, msg: Msg) -> Result<(), String> {
        // A paused process handles and sends nothing: what arrives waits for its resume.
        let target = match &msg {
            Msg::Turn(p) | Msg::Answer { to: p, .. } | Msg::TimeOut { to: p, .. } | Msg::Notice { to: p, .. } => {
                Some(*p)
            }
            Msg::KeepAlive { from, .. } => Some(*from),
            _ => None,
        };
        if let Some(p) = target.filter(|&p| self.procs[p].paused_until.is_some()) {
            match msg {
                // Its timer fires on resume (the resume turns it).
                Msg::Turn(_) => {
                    self.procs[p].timer_fired(self.now);
                }
                msg => self.events.push(self.procs[p].paused_until.unwrap_or(self.now) + 1, msg),
            }
            return Ok(());
        }
        if target.is_some_and(|p| !self.procs[p].alive) {
            return Ok(());
        }
        match msg {
            Msg::Turn(p) if self.procs[p].timer_fired(self.now) => return self.turn(p),
            Msg::Turn(_) => {}
            Msg::Request { from, id, call } => {
                let lost = self.rng.random_bool(self.lost_replies);
                if self.store_up {
                    self.expire_leases();
                    let input = self.apply(from, call);
                    if !lost {
                        self.send(self.now, Msg::Answer { to: from, id, input });
                    }
                }
            }
            Msg::Answer { to, id, input } => {
                self.procs[to].answer(self.now, id, input);
                return self.turn(to);
            }
            Msg::TimeOut { to, id } => {
                if let Some(call) = self.procs[to].time_out(id) {
                    self.procs[to].notify(self.now, timed_out(call));
                    return self.turn(to);
                }
            }
            Msg::Notice { to, input } => {
                let watch_session = match &input {
                    EtcdInput::Watched { session, .. } => Some(*session),
                    _ => None,
                };
                if watch_session.is_some() && watch_session != self.watches[to] {
                    return Ok(());
                }
                let next_keep_alive = match (&input, self.pumps[to]) {
                    (EtcdInput::KeptAlive { session, sent, result }, Some((pump, lease)))
                        if *session == pump && !matches!(result, Ok(ttl) if ttl.is_zero()) =>
                    {
                        let interval = session_timing(self.ttl).expect("ttl").retry_period;
                        let at = self.procs[to].clock.global(*sent + interval).max(self.now);
                        Some((at, pump, lease))
                    }
                    _ => None,
                };
                if let (EtcdInput::KeptAlive { session, .. }, Some((pump, _))) = (&input, self.pumps[to]) {
                    if *session != pump {
                        return Ok(());
                    }
                }
                self.procs[to].notify(self.now, input);
                if let Some((at, session, lease)) = next_keep_alive {
                    let sent = self.procs[to].clock.local(at);
                    self.events.push(at, Msg::KeepAlive { from: to, session, lease, sent });
                }
                return self.turn(to);
            }
            Msg::KeepAlive { from, session, lease, sent } => {
                if self.pumps[from] != Some((session, lease)) {
                    return Ok(());
                }
                let result = if !self.store_up {
                    Err(EtcdError::Protocol("store down".into()))
                } else {
                    self.expire_leases();
                    Ok(self.leases.get_mut(&lease).map_or(Duration::ZERO, |l| {
                        l.expires = self.now + l.ttl.as_nanos() as u64;
                        l.ttl
                    }))
                };
                let stamp = match self.mutation {
                    Mutation::LateFence => sent + self.ttl / 3,
                    _ => sent,
                };
                let input = EtcdInput::KeptAlive { session, sent: stamp, result };
                self.send(self.now, Msg::Notice { to: from, input });
            }
            Msg::Fault => return self.fault(),
            Msg::Resume(usize::MAX) => {
                // The named pause: the leader, past its lease.
                self.settled_since = self.now;
                if let Some(leader) = self.leader() {
                    let pause = 2 * self.ttl_ns();
                    self.pause(leader, pause);
                }
                self.events.push(self.now + 2 * self.ttl_ns(), Msg::Fault);
            }
            Msg::Resume(p) => {
                self.procs[p].paused_until = None;
                self.settled_since = self.now;
                return self.turn(p);
            }
            Msg::StoreUp if self.store_up => {
                // The named restart: the store goes down under the leader, for most of a TTL.
                self.settled_since = self.now;
                let down = self.ttl_ns() * 9 / 10;
                self.restart_store(down);
                self.events.push(self.now + 2 * self.ttl_ns(), Msg::Fault);
            }
            Msg::StoreUp => {
                self.store_up = true;
                self.settled_since = self.now;
                for lease in self.leases.values_mut() {
                    lease.expires = self.now + lease.ttl.as_nanos() as u64;
                }
            }
        }
        Ok(())
    }

    fn run(mut self, events: usize) -> Result<(), String> {
        for _ in 0..events {
            let Some((at, msg)) = self.events.pop() else { break };
            self.now = at;
            self.step(msg)?;
            check_one_leader(&self.procs, self.now)?;
            for p in &mut self.procs {
                p.check_revival(self.now)?;
            }
            let settled = self.now > self.settled_since + 4 * self.ttl_ns();
            let someone_up = self.procs.iter().any(|p| p.runnable() && p.stopping.is_none());
            if settled && someone_up && self.store_up && self.leader().is_none() {
                return Err(format!(
                    "liveness: nobody leads at {} ms, settled since {} ms",
                    self.now / 1_000_000,
                    self.settled_since / 1_000_000
                ));
            }
        }
        Ok(())
    }
}

fn timed_out(call: EtcdCall) -> EtcdInput {
    let error = || EtcdError::Timeout(Duration::from_secs(1));
    match call {
        EtcdCall::Grant { session, .. } => EtcdInput::Granted { session, result: Err(error()) },
        EtcdCall::Create { session, .. } => EtcdInput::Created { session, result: Err(error()) },
        EtcdCall::Resync { session } => EtcdInput::Loaded { session, result: Err(error()) },
        EtcdCall::Claim { session, .. } => EtcdInput::Claimed { session, result: Err(error()) },
        EtcdCall::Delete { session, .. } => EtcdInput::Deleted { session, result: Err(error()) },
        EtcdCall::Revoke { lease } => EtcdInput::Revoked { lease, result: Err(error()) },
        EtcdCall::KeepAlive { .. } | EtcdCall::StopKeepAlive => unreachable!("the pump is modelled apart"),
    }
}

const EVENTS: usize = 2_000;

#[test]
fn randomized_schedules_keep_one_leader_growing_terms_and_liveness() {
    run_schedules(|seed| Sim::new(seed, Mutation::None, Opening::Random).run(EVENTS));
}

#[test]
fn a_store_restart_under_a_leader_never_gives_two_leaders() {
    run_schedules_of(500, Opening::StoreRestartUnderLeader);
}

#[test]
fn a_leader_paused_past_its_lease_is_replaced_and_never_comes_back_as_leader() {
    run_schedules_of(500, Opening::LeaderPausedPastLease);
}

fn run_schedules_of(count: u64, opening: Opening) {
    let failures = search(0, count, |seed| Sim::new(seed, Mutation::None, opening).run(EVENTS));
    assert!(failures.is_empty(), "{opening:?}: {} failed, first {:?}", failures.len(), failures.first());
}

#[test]
fn the_checker_catches_a_leader_that_fences_late() {
    let failures = search(0, 300, |seed| Sim::new(seed, Mutation::LateFence, Opening::Random).run(EVENTS));
    assert!(failures.iter().any(|(_, why)| why.starts_with("S1")), "a late fence went unnoticed in 300 schedules");
}

#[test]
fn the_checker_catches_a_same_term_revival() {
    let failures = search(0, 300, |seed| Sim::new(seed, Mutation::Unfenced, Opening::Random).run(EVENTS));
    assert!(
        failures.iter().any(|(_, why)| why.starts_with("S2: a tenure seen as over")),
        "a shell that revives lapsed tenures went unnoticed in 300 schedules: {:?}",
        failures.first()
    );
}
