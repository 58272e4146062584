//! A randomized, deterministic simulation of the etcd campaign ([`EtcdCampaign`]), the very core
//! the elector runs, against a model of etcd, under the shell's rules, faults and checks of
//! `tenure::simulation` (S1, S2, availability, busy loops, panics: see that module).
//!
//! - **2 to 5 candidates**, clock rates within 0.9 x the drift bound of etcd's self-fencing (the
//!   leader stops `TTL - TTL/3` after a keep-alive on its clock, the server expires the lease a TTL
//!   after it on its own: 20 %), TTLs of 2 to 10 s.
//! - **the store**: revisions, keys bound to leases, leases the *server* expires a TTL after the
//!   last keep-alive it received (deleting their keys), create-if-absent, delete, revoke, range, a
//!   watch per candidate, opened by its last range, delivering every change after it in order
//!   (with the answers: one connection). Requests and replies take 0.1 to 20 ms each; a request
//!   is applied atomically when it arrives.
//! - **the keep-alive pump** of the transport: one keep-alive per interval, stamped with the
//!   instant it was sent; nothing is sent while the process is paused.
//! - **faults**, besides the harness's (crashes and restarts, pauses up to two TTLs, resigns,
//!   shutdowns): storms of lost replies (applied, the caller times out), a store restart (down up
//!   to a TTL; watches break; back up, every lease gets a full TTL again, as after a new raft
//!   leader).
//! - **availability**: after four TTLs without a disturbance, with the store up and a candidate
//!   up, somebody leads.
//!
//! Named schedules replay what real processes found: a store restart under a leader, and a leader
//! paused past its lease. Mutation checks show the checker catching a late fence (keep-alives
//! stamped a margin after they were sent) and a same-term revival (a shell that never fences).
//!
//! `TENURE_SIM_SCHEDULES` (default 10,000), `TENURE_SIM_BASE_SEED` and `TENURE_SIM_SEED` (replay).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::RngExt;
use tenure::simulation::{assert_caught, run_schedules, Ev, Faults, Model, Opening, Stats, World};
use tenure::{MonotonicTime, Timing};
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

#[derive(Debug)]
enum Msg {
    /// A notification for a process, dropped if its watch or pump is gone.
    Notice(usize, EtcdInput),
    /// A process's pump sends a keep-alive: (process, session, lease, when sent).
    KeepAlive(usize, u64, i64, MonotonicTime),
}

#[derive(Debug)]
struct Lease {
    expires: u64,
    ttl: Duration,
}

#[derive(Debug)]
struct Etcd {
    timing: Timing,
    mutation: Mutation,
    /// Per process: the pump's session and lease, the session its watch serves, and the session
    /// of the last resync it sent.
    pumps: Vec<Option<(u64, i64)>>,
    watches: Vec<Option<u64>>,
    resyncs: Vec<Option<u64>>,
    revision: i64,
    keys: BTreeMap<String, (i64, String, i64)>,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
}

impl Etcd {
    /// Deletes `gone` keys and tells every watcher.
    fn delete_keys(&mut self, w: &mut World<Etcd>, gone: Vec<String>) {
        for key in &gone {
            self.keys.remove(key);
        }
        if !gone.is_empty() {
            self.revision += 1;
            self.notify(w, gone.into_iter().map(|k| (k, None)).collect());
        }
    }

    fn notify(&mut self, w: &mut World<Etcd>, changes: Vec<(String, Option<(i64, String)>)>) {
        for to in 0..self.watches.len() {
            let Some(session) = self.watches[to] else { continue };
            let at = w.now + w.delay();
            let at = w.in_order(to, at);
            let input = EtcdInput::Watched { session, changes: changes.clone(), cancelled: None };
            w.push(at, Ev::Model(Msg::Notice(to, input)));
        }
    }

    fn keys_of(&self, lease: i64) -> Vec<String> {
        self.keys.iter().filter(|(_, v)| v.2 == lease).map(|(k, _)| k.clone()).collect()
    }

    fn expire_leases(&mut self, w: &mut World<Etcd>) {
        let now = w.now;
        let expired: Vec<i64> = self.leases.iter().filter(|(_, l)| l.expires <= now).map(|(id, _)| *id).collect();
        for lease in expired {
            self.leases.remove(&lease);
            let keys = self.keys_of(lease);
            self.delete_keys(w, keys);
        }
    }
}

impl Model for Etcd {
    type Call = EtcdCall;
    type Input = EtcdInput;
    type Core = EtcdCampaign;
    type Msg = Msg;

    fn core(&mut self, _w: &mut World<Etcd>, p: usize) -> EtcdCampaign {
        (self.pumps[p], self.watches[p], self.resyncs[p]) = (None, None, None);
        EtcdCampaign::new(format!("c{p}"), "e/".into(), self.timing)
    }

    fn limit(&self, call: &EtcdCall) -> Option<Duration> {
        (!matches!(call, EtcdCall::KeepAlive { .. } | EtcdCall::StopKeepAlive)).then_some(self.timing.call_timeout)
    }

    fn start(&mut self, w: &mut World<Etcd>, p: usize, call: EtcdCall) {
        self.pumps[p] = None;
        if let EtcdCall::KeepAlive { session, lease } = call {
            self.pumps[p] = Some((session, lease));
            let sent = w.procs[p].clock.local(w.now);
            let at = w.now + w.delay();
            w.push(at, Ev::Model(Msg::KeepAlive(p, session, lease, sent)));
        }
    }

    fn sending(&mut self, p: usize, call: &EtcdCall) {
        if let EtcdCall::Resync { session } = call {
            self.resyncs[p] = Some(*session);
        }
    }

    fn apply(&mut self, w: &mut World<Etcd>, from: usize, call: EtcdCall) -> Option<EtcdInput> {
        if !w.store_up {
            return None;
        }
        self.expire_leases(w);
        Some(match call {
            EtcdCall::Grant { session, ttl_secs } => {
                self.next_lease += 1;
                let ttl = Duration::from_secs(ttl_secs.unsigned_abs());
                self.leases.insert(self.next_lease, Lease { expires: w.now + ttl.as_nanos() as u64, ttl });
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
                        self.notify(w, vec![(key, Some((self.revision, value)))]);
                        Ok(self.revision)
                    }
                };
                EtcdInput::Created { session, result }
            }
            EtcdCall::Resync { session } => {
                // The watch opens after the range (it delivers what follows), for the session
                // that asked last.
                if self.resyncs[from] == Some(session) {
                    self.watches[from] = Some(session);
                }
                let keys: Keys = self.keys.iter().map(|(k, (r, v, _))| (k.clone(), (*r, v.clone()))).collect();
                EtcdInput::Loaded { session, result: Ok(keys) }
            }
            EtcdCall::Claim { session, key } => {
                EtcdInput::Claimed { session, result: Ok(self.keys.get(&key).map(|(r, _, _)| *r)) }
            }
            EtcdCall::Delete { session, key } => {
                if self.keys.contains_key(&key) {
                    self.delete_keys(w, vec![key]);
                }
                EtcdInput::Deleted { session, result: Ok(()) }
            }
            EtcdCall::Revoke { lease } => {
                self.leases.remove(&lease);
                let keys = self.keys_of(lease);
                self.delete_keys(w, keys);
                EtcdInput::Revoked { lease, result: Ok(()) }
            }
            EtcdCall::KeepAlive { .. } | EtcdCall::StopKeepAlive => unreachable!("the pump is modelled apart"),
        })
    }

    fn timed_out(&self, call: EtcdCall) -> EtcdInput {
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

    fn target(msg: &Msg) -> Option<(usize, bool)> {
        match msg {
            Msg::Notice(to, _) => Some((*to, true)),
            Msg::KeepAlive(from, ..) => Some((*from, false)),
        }
    }

    fn handle(&mut self, w: &mut World<Etcd>, msg: Msg) -> Result<(), String> {
        match msg {
            Msg::Notice(to, input) => {
                match &input {
                    EtcdInput::Watched { session, .. } if Some(*session) != self.watches[to] => return Ok(()),
                    EtcdInput::KeptAlive { session, .. } if self.pumps[to].is_some_and(|p| p.0 != *session) => {
                        return Ok(())
                    }
                    EtcdInput::KeptAlive { sent, result, .. } if !matches!(result, Ok(ttl) if ttl.is_zero()) => {
                        // The pump sends the next keep-alive an interval after this one.
                        if let Some((session, lease)) = self.pumps[to] {
                            let at = w.procs[to].clock.global(*sent + self.timing.retry_period).max(w.now);
                            let sent = w.procs[to].clock.local(at);
                            w.push(at, Ev::Model(Msg::KeepAlive(to, session, lease, sent)));
                        }
                    }
                    _ => {}
                }
                w.procs[to].notify(w.now, input);
                w.turn(self, to)?;
            }
            Msg::KeepAlive(from, session, lease, sent) => {
                if self.pumps[from] != Some((session, lease)) {
                    return Ok(());
                }
                let result = if w.store_up {
                    self.expire_leases(w);
                    Ok(self.leases.get_mut(&lease).map_or(Duration::ZERO, |l| {
                        l.expires = w.now + l.ttl.as_nanos() as u64;
                        l.ttl
                    }))
                } else {
                    Err(EtcdError::Protocol("store down".into()))
                };
                let stamp =
                    if self.mutation == Mutation::LateFence { sent + self.timing.lease_duration / 3 } else { sent };
                let input = EtcdInput::KeptAlive { session, sent: stamp, result };
                let at = w.now + w.delay();
                w.push(at, Ev::Model(Msg::Notice(from, input)));
            }
        }
        Ok(())
    }

    fn outage(&mut self, w: &mut World<Etcd>, up: bool) {
        if up {
            // Every lease gets a full TTL again, as after a new raft leader.
            for lease in self.leases.values_mut() {
                lease.expires = w.now + lease.ttl.as_nanos() as u64;
            }
            return;
        }
        for to in 0..self.watches.len() {
            if let Some(session) = self.watches[to].take() {
                let input = EtcdInput::WatchFailed { session, error: EtcdError::Protocol("store down".into()) };
                let at = w.now + w.delay();
                w.push(at, Ev::Model(Msg::Notice(to, input)));
            }
        }
    }
}

fn schedule(seed: u64, mutation: Mutation, opening: Opening) -> Result<Stats, String> {
    let mut w = World::new(seed);
    let ttl = Duration::from_secs(w.rng.random_range(2..=10));
    let n = w.rng.random_range(2..=5);
    let timing = session_timing(ttl).expect("valid ttl");
    let mut etcd = Etcd {
        timing,
        mutation,
        pumps: vec![None; n],
        watches: vec![None; n],
        resyncs: vec![None; n],
        revision: 1,
        keys: BTreeMap::new(),
        leases: BTreeMap::new(),
        next_lease: 0x100,
    };
    let ttl = ttl.as_nanos() as u64;
    // One connection carries a candidate's answers and its watch, in order.
    (w.unfenced, w.answers_in_order) = (mutation == Mutation::Unfenced, true);
    (w.lease, w.settle_bound, w.slow, w.storms_disturb) = (ttl, 4 * ttl, ttl, true);
    w.storm = Faults { lost: 0.2, ..Faults::default() };
    w.populate(&mut etcd, n, 0.9 * 0.2, 0, opening);
    w.run(etcd)
}

#[test]
fn randomized_schedules_keep_one_leader_growing_terms_and_liveness() {
    run_schedules(u64::MAX, |seed| schedule(seed, Mutation::None, Opening::Random));
}

#[test]
fn a_store_restart_under_a_leader_never_gives_two_leaders() {
    run_schedules(500, |seed| schedule(seed, Mutation::None, Opening::StoreRestartUnderLeader));
}

#[test]
fn a_leader_paused_past_its_lease_is_replaced_and_never_comes_back_as_leader() {
    run_schedules(500, |seed| schedule(seed, Mutation::None, Opening::LeaderPausedPastLease));
}

#[test]
fn the_checker_catches_a_leader_that_fences_late() {
    assert_caught(300, "S1", |seed| schedule(seed, Mutation::LateFence, Opening::Random));
}

#[test]
fn the_checker_catches_a_same_term_revival() {
    assert_caught(300, "S2: a tenure seen as over", |seed| schedule(seed, Mutation::Unfenced, Opening::Random));
}
