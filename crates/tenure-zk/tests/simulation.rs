//! A randomized, deterministic simulation of the ZooKeeper campaign ([`ZkLatch`]), the very core
//! the elector runs, against a model of ZooKeeper, under the shell's rules and checks of
//! `tenure::simulation` (S1: one leader at a time, judged on each process's clock; S2: growing
//! terms, no same-term revival).
//!
//! - **2 to 5 candidates**, clock rates within 0.9 x the drift bound of the latch's self-fencing
//!   (the leader stops 2/3 of the session timeout after the start of its last answered request on
//!   its clock; the server expires the session a timeout after the last request it received: 20 %),
//!   session timeouts of 1 to 10 s.
//! - **the server**: sessions it expires a timeout after the last request or ping it received
//!   (deleting their ephemeral nodes), sequential nodes found by the guid in their name (a create
//!   whose reply was lost is adopted, not repeated), one-shot watches on the own node, the
//!   predecessor and the leader's node. Each look at the election is applied atomically when it
//!   arrives; requests and replies take 0.1 to 20 ms each.
//! - **the client library**: pings every third of the timeout while the process runs; tells the
//!   process when the connection is lost (store down), back, or the session expired.
//! - **faults**: lost replies (applied, the caller times out), a store restart (down up to a
//!   timeout; back up, every session gets a full timeout again, as ZooKeeper restores sessions), a
//!   process paused up to two timeouts, a crash, a resign, a shutdown.
//! - **liveness**: after five timeouts without a disturbance, with the store up and a candidate
//!   up, somebody leads.
//!
//! Named schedules replay the cases real processes found: a reconnect after the store restarted
//! under the leader, and a leader paused past its session. The mutation check shows the checker
//! catching a shell that never fences (a late fence that revives the tenure under the same term).
//!
//! `TENURE_SIM_SCHEDULES` (default 10,000), `TENURE_SIM_BASE_SEED` and `TENURE_SIM_SEED` (replay).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tenure::simulation::{check_one_leader, delay, run_schedules, search, Clock, Process, Schedule};
use tenure::{AfterRelease, Term};
use tenure_zk::latch::{Look, OwnNode, SessionState, ZkCall, ZkInput, ZkLatch};
use tenure_zk::ZkError;
use zookeeper_client as zk;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Opening {
    Random,
    StoreRestartUnderLeader,
    LeaderPausedPastSession,
}

#[derive(Debug)]
enum Msg {
    Turn(usize),
    Request {
        from: usize,
        id: u64,
        call: ZkCall,
    },
    Answer {
        to: usize,
        id: u64,
        input: ZkInput,
    },
    TimeOut {
        to: usize,
        id: u64,
    },
    Notice {
        to: usize,
        input: ZkInput,
    },
    /// The client library's ping of session `session`.
    Ping {
        from: usize,
        session: u64,
    },
    CloseSession(u64),
    Fault,
    Named,
    Resume(usize),
    StoreUp,
}

struct Node {
    name: String,
    czxid: i64,
    data: String,
    session: u64,
}

struct Session {
    expires: u64,
    timeout: Duration,
    owner: usize,
}

struct Sim {
    rng: SmallRng,
    now: u64,
    events: Schedule<Msg>,
    procs: Vec<Process<ZkLatch>>,
    /// Per process: the session its library keeps (pings), once connected.
    sessions_of: Vec<Option<u64>>,
    nodes: BTreeMap<u64, Node>,
    next_seq: u64,
    zxid: i64,
    sessions: BTreeMap<u64, Session>,
    next_session: u64,
    /// Per process: when its last notice lands (the library delivers them in order).
    notice_fifo: Vec<u64>,
    /// One-shot watches: process -> (session, watched node names).
    watches: BTreeMap<usize, (u64, Vec<String>)>,
    store_up: bool,
    lost_replies: f64,
    timeout: Duration,
    opening: Opening,
    next_id: u64,
    highest_term: u64,
    settled_since: u64,
}

fn session_lost() -> ZkError {
    ZkError::Request(zk::Error::SessionExpired)
}

impl Sim {
    fn new(seed: u64, unfenced: bool, opening: Opening) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let timeout = Duration::from_millis(rng.random_range(1_000..=10_000));
        let n = rng.random_range(2..=5);
        let procs: Vec<_> = (0..n)
            .map(|i| {
                let mut process =
                    Process::new(ZkLatch::new(format!("c{i}"), timeout), Clock::drifting(&mut rng, 0.9 * 0.2));
                process.unfenced = unfenced;
                process
            })
            .collect();
        let mut sim = Sim {
            rng,
            now: 0,
            events: Schedule::default(),
            procs,
            sessions_of: vec![None; n],
            notice_fifo: vec![0; n],
            nodes: BTreeMap::new(),
            next_seq: 0,
            zxid: 1,
            sessions: BTreeMap::new(),
            next_session: 0,
            watches: BTreeMap::new(),
            store_up: true,
            lost_replies: 0.0,
            timeout,
            opening,
            next_id: 0,
            highest_term: 0,
            settled_since: 0,
        };
        for p in 0..n {
            sim.events.push(0, Msg::Turn(p));
        }
        let at = sim.timeout_ns() * if opening == Opening::Random { 1 } else { 4 };
        sim.events.push(at, if opening == Opening::Random { Msg::Fault } else { Msg::Named });
        sim
    }

    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos() as u64
    }

    fn send(&mut self, msg: Msg) {
        let mut at = self.now + delay(&mut self.rng);
        if let Msg::Notice { to, .. } = msg {
            at = at.max(self.notice_fifo[to]);
            self.notice_fifo[to] = at;
        }
        self.events.push(at, msg);
    }

    fn turn(&mut self, p: usize) -> Result<(), String> {
        let turn = self.procs[p].turn(self.now, &mut self.next_id, &mut self.highest_term, |call| match call {
            ZkCall::Connect => Some(self.timeout * 2),
            ZkCall::Close => None,
            ZkCall::Observe { limit, .. } | ZkCall::Heartbeat { limit, .. } | ZkCall::Delete { limit, .. } => {
                Some(*limit)
            }
        })?;
        for (id, call, deadline) in turn.calls {
            match call {
                ZkCall::Close => {
                    if let Some(session) = self.sessions_of[p].take() {
                        self.send(Msg::CloseSession(session));
                    }
                }
                call => {
                    self.send(Msg::Request { from: p, id, call });
                    self.events.push(deadline.unwrap_or(self.now), Msg::TimeOut { to: p, id });
                }
            }
        }
        if let Some(at) = turn.timer {
            self.events.push(at, Msg::Turn(p));
        }
        Ok(())
    }

    fn alive_session(&mut self, session: u64) -> bool {
        let now = self.now;
        match self.sessions.get_mut(&session) {
            Some(s) => {
                s.expires = now + s.timeout.as_nanos() as u64;
                true
            }
            None => false,
        }
    }

    fn delete_node(&mut self, seq: u64) {
        let Some(node) = self.nodes.remove(&seq) else { return };
        self.zxid += 1;
        let fired: Vec<(usize, u64)> = self
            .watches
            .iter()
            .filter(|(_, (_, names))| names.contains(&node.name))
            .map(|(p, (session, _))| (*p, *session))
            .collect();
        for (p, session) in fired {
            self.watches.remove(&p);
            self.send(Msg::Notice { to: p, input: ZkInput::Watched { session } });
        }
    }

    fn end_session(&mut self, session: u64) {
        let Some(s) = self.sessions.remove(&session) else { return };
        let owned: Vec<u64> = self.nodes.iter().filter(|(_, n)| n.session == session).map(|(seq, _)| *seq).collect();
        for seq in owned {
            self.delete_node(seq);
        }
        if self.sessions_of[s.owner] == Some(session) {
            self.send(Msg::Notice { to: s.owner, input: ZkInput::State { session, state: SessionState::Lost } });
        }
    }

    fn expire_sessions(&mut self) {
        let now = self.now;
        let expired: Vec<u64> = self.sessions.iter().filter(|(_, s)| s.expires <= now).map(|(id, _)| *id).collect();
        for session in expired {
            self.end_session(session);
        }
    }

    /// A request applied at the server; the answer.
    fn apply(&mut self, from: usize, call: ZkCall) -> ZkInput {
        match call {
            ZkCall::Connect => {
                self.next_session += 1;
                let session = self.next_session;
                let timeout = self.timeout;
                self.sessions
                    .insert(session, Session { expires: self.now + timeout.as_nanos() as u64, timeout, owner: from });
                ZkInput::Connected(Ok((session, timeout, format!("guid{session}"))))
            }
            ZkCall::Observe { session, own, guid, .. } => {
                if !self.alive_session(session) {
                    return ZkInput::Observed { session, result: Err(session_lost()) };
                }
                let ordered: Vec<(u64, &Node)> = self.nodes.iter().map(|(seq, n)| (*seq, n)).collect();
                let Some(index) = ordered.iter().position(|(_, n)| n.name.contains(&format!("_c_{guid}-"))) else {
                    self.next_seq += 1;
                    self.zxid += 1;
                    let name = format!("_c_{guid}-latch-{:010}", self.next_seq);
                    let node = Node { name: name.clone(), czxid: self.zxid, data: format!("c{from}"), session };
                    self.nodes.insert(self.next_seq, node);
                    let created = OwnNode { name, czxid: self.zxid };
                    return ZkInput::Observed {
                        session,
                        result: Ok(Look::Again { own: Some(created), own_gone: own.is_some() }),
                    };
                };
                let mine = ordered[index].1;
                let leader = ordered[0].1;
                let watched =
                    [mine, ordered[index.saturating_sub(1)].1, leader].iter().map(|n| n.name.clone()).collect();
                let look = Look::View {
                    own: OwnNode { name: mine.name.clone(), czxid: mine.czxid },
                    is_leader: index == 0,
                    leader_identity: leader.data.clone(),
                    leader_term: Term::from_count(leader.czxid),
                };
                self.watches.insert(from, (session, watched));
                ZkInput::Observed { session, result: Ok(look) }
            }
            ZkCall::Heartbeat { session, node, .. } => {
                let result = if self.alive_session(session) {
                    Ok(self.nodes.values().any(|n| n.name == node))
                } else {
                    Err(session_lost())
                };
                ZkInput::Heartbeat { session, result }
            }
            ZkCall::Delete { session, node, .. } => {
                let result = if self.alive_session(session) {
                    if let Some(seq) = self.nodes.iter().find(|(_, n)| n.name == node).map(|(seq, _)| *seq) {
                        self.delete_node(seq);
                    }
                    Ok(())
                } else {
                    Err(session_lost())
                };
                ZkInput::Deleted { session, node, result }
            }
            ZkCall::Close => unreachable!("handled by the client library"),
        }
    }

    fn leader(&self) -> Option<usize> {
        (0..self.procs.len()).find(|&p| self.procs[p].believes_leading(self.now))
    }

    fn restart_store(&mut self, down_for: u64) {
        self.store_up = false;
        self.watches.clear();
        for p in 0..self.procs.len() {
            if let Some(session) = self.sessions_of[p] {
                self.send(Msg::Notice { to: p, input: ZkInput::State { session, state: SessionState::Disconnected } });
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
        let timeout = self.timeout_ns();
        let p = match self.leader() {
            Some(leader) if self.rng.random_bool(0.5) => leader,
            _ => self.rng.random_range(0..n),
        };
        let up = self.procs.iter().filter(|q| q.alive).count();
        match self.rng.random_range(0..7) {
            0 if self.store_up => {
                let down = self.rng.random_range(0..timeout);
                self.restart_store(down);
            }
            1 if self.procs[p].runnable() => {
                let pause = self.rng.random_range(0..2 * timeout);
                self.pause(p, pause);
            }
            2 if self.procs[p].alive && up > 1 => {
                self.procs[p].alive = false;
                self.sessions_of[p] = None;
            }
            3 | 4 if self.procs[p].runnable() && self.procs[p].stopping.is_none() => {
                let after =
                    if up > 1 && self.rng.random_bool(0.3) { AfterRelease::Stop } else { AfterRelease::Campaign };
                self.procs[p].stop(self.now, after);
                self.turn(p)?;
            }
            _ => self.lost_replies = if self.lost_replies > 0.0 { 0.0 } else { self.rng.random_range(0.01..0.2) },
        }
        let next = self.now + self.rng.random_range(timeout / 2..4 * timeout);
        self.events.push(next, Msg::Fault);
        Ok(())
    }

    fn step(&mut self, msg: Msg) -> Result<(), String> {
        let target = match &msg {
            Msg::Turn(p) | Msg::Answer { to: p, .. } | Msg::TimeOut { to: p, .. } | Msg::Notice { to: p, .. } => {
                Some(*p)
            }
            Msg::Ping { from, .. } => Some(*from),
            _ => None,
        };
        if let Some(p) = target.filter(|&p| self.procs[p].paused_until.is_some()) {
            match msg {
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
                    self.expire_sessions();
                    let input = self.apply(from, call);
                    if !lost {
                        self.send(Msg::Answer { to: from, id, input });
                    }
                }
            }
            Msg::Answer { to, id, input } => {
                if let ZkInput::Connected(Ok((session, _, _))) = &input {
                    // The library keeps the session alive from now on.
                    self.sessions_of[to] = Some(*session);
                    let at = self.now + self.timeout_ns() / 3;
                    self.events.push(at, Msg::Ping { from: to, session: *session });
                }
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
                self.procs[to].notify(self.now, input);
                return self.turn(to);
            }
            Msg::Ping { from, session } => {
                if self.sessions_of[from] != Some(session) {
                    return Ok(());
                }
                if self.store_up {
                    self.expire_sessions();
                    if !self.alive_session(session) {
                        self.sessions_of[from] = None;
                        self.send(Msg::Notice {
                            to: from,
                            input: ZkInput::State { session, state: SessionState::Lost },
                        });
                        return Ok(());
                    }
                }
                let at = self.now + self.timeout_ns() / 3;
                self.events.push(at, Msg::Ping { from, session });
            }
            Msg::CloseSession(session) => {
                if self.store_up {
                    self.end_session(session);
                }
            }
            Msg::Fault => return self.fault(),
            Msg::Named => {
                self.settled_since = self.now;
                match self.opening {
                    Opening::StoreRestartUnderLeader => {
                        let down = self.timeout_ns() * 9 / 10;
                        self.restart_store(down);
                    }
                    _ => {
                        if let Some(leader) = self.leader() {
                            let pause = 2 * self.timeout_ns();
                            self.pause(leader, pause);
                        }
                    }
                }
                self.events.push(self.now + 2 * self.timeout_ns(), Msg::Fault);
            }
            Msg::Resume(p) => {
                self.procs[p].paused_until = None;
                self.settled_since = self.now;
                return self.turn(p);
            }
            Msg::StoreUp => {
                self.store_up = true;
                self.settled_since = self.now;
                for session in self.sessions.values_mut() {
                    session.expires = self.now + session.timeout.as_nanos() as u64;
                }
                for p in 0..self.procs.len() {
                    if let Some(session) = self.sessions_of[p] {
                        self.send(Msg::Notice {
                            to: p,
                            input: ZkInput::State { session, state: SessionState::Connected },
                        });
                    }
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
            let settled = self.now > self.settled_since + 5 * self.timeout_ns();
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

fn timed_out(call: ZkCall) -> ZkInput {
    let error = || ZkError::Timeout(Duration::from_secs(1));
    match call {
        ZkCall::Connect => ZkInput::Connected(Err(error())),
        ZkCall::Observe { session, .. } => ZkInput::Observed { session, result: Err(error()) },
        ZkCall::Heartbeat { session, .. } => ZkInput::Heartbeat { session, result: Err(error()) },
        ZkCall::Delete { session, node, .. } => ZkInput::Deleted { session, node, result: Err(error()) },
        ZkCall::Close => unreachable!("handled by the client library"),
    }
}

const EVENTS: usize = 2_000;

#[test]
fn randomized_schedules_keep_one_leader_growing_terms_and_liveness() {
    run_schedules(|seed| Sim::new(seed, false, Opening::Random).run(EVENTS));
}

#[test]
fn a_reconnect_after_a_store_restart_under_the_leader_never_gives_two_leaders() {
    run_schedules_of(500, Opening::StoreRestartUnderLeader);
}

#[test]
fn a_leader_paused_past_its_session_is_replaced_and_never_comes_back_as_leader() {
    run_schedules_of(500, Opening::LeaderPausedPastSession);
}

fn run_schedules_of(count: u64, opening: Opening) {
    let failures = search(0, count, |seed| Sim::new(seed, false, opening).run(EVENTS));
    assert!(failures.is_empty(), "{opening:?}: {} failed, first {:?}", failures.len(), failures.first());
}

#[test]
fn the_checker_catches_a_shell_that_fences_late_and_revives_the_tenure() {
    let failures = search(0, 300, |seed| Sim::new(seed, true, Opening::Random).run(EVENTS));
    assert!(failures.iter().any(|(_, why)| why.starts_with("S")), "an unfenced shell went unnoticed in 300 schedules");
}
