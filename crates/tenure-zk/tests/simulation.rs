//! A randomized, deterministic simulation of the ZooKeeper campaign ([`ZkLatch`]), the very core
//! the elector runs, against a model of ZooKeeper, under the shell's rules, faults and checks of
//! `tenure::simulation` (S1, S2, availability, busy loops, panics: see that module).
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
//!   process when the connection is lost (store down), back, or the session expired; answers and
//!   notifications arrive in order (one connection).
//! - **faults**, besides the harness's (crashes and restarts, pauses up to two timeouts, resigns,
//!   shutdowns): storms of lost replies (applied, the caller times out), a store restart (down up
//!   to a timeout; back up, every session gets a full timeout again, as ZooKeeper restores
//!   sessions).
//! - **availability**: after five timeouts without a disturbance, with the store up and a
//!   candidate up, somebody leads.
//!
//! Named schedules replay the cases real processes found: a reconnect after the store restarted
//! under the leader, and a leader paused past its session. Mutation checks show the checker
//! catching two leaders when the server expires sessions before the leader fences, and a shell
//! that never fences reviving a tenure under the same term (rare: the latch bounds every call by
//! its fencing deadline, so only an answer that came in while the process was paused revives).
//!
//! `TENURE_SIM_SCHEDULES` (default 10,000), `TENURE_SIM_BASE_SEED` and `TENURE_SIM_SEED` (replay).

use std::collections::BTreeMap;
use std::time::Duration;

use rand::RngExt;
use tenure::simulation::{assert_caught, run_schedules, Ev, Faults, Model, Opening, Stats, World};
use tenure::Term;
use tenure_zk::latch::{Look, OwnNode, SessionState, ZkCall, ZkInput, ZkLatch};
use tenure_zk::ZkError;
use zookeeper_client as zk;

#[derive(Debug)]
enum Msg {
    /// The client library pings: (process, session).
    Ping(usize, u64),
    CloseSession(u64),
}

#[derive(Debug)]
struct Node {
    name: String,
    czxid: i64,
    data: String,
    session: u64,
}

#[derive(Debug)]
struct Session {
    expires: u64,
    owner: usize,
}

#[derive(Debug)]
struct Zk {
    timeout: Duration,
    /// [`Mutation::EarlyExpiry`].
    early_expiry: bool,
    /// Per process: the session its library keeps (pings), once connected.
    sessions_of: Vec<Option<u64>>,
    nodes: BTreeMap<u64, Node>,
    next_seq: u64,
    zxid: i64,
    sessions: BTreeMap<u64, Session>,
    next_session: u64,
    /// One-shot watches: process -> (session, watched node names).
    watches: BTreeMap<usize, (u64, Vec<String>)>,
}

fn session_lost() -> ZkError {
    ZkError::Request(zk::Error::SessionExpired)
}

impl Zk {
    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos() as u64
    }

    /// How long the server keeps a session after the last request or ping it received.
    fn lifetime(&self) -> u64 {
        if self.early_expiry {
            self.timeout_ns() / 2
        } else {
            self.timeout_ns()
        }
    }

    /// The library tells process `to`, after the network's delay and in order.
    fn notify(&self, w: &mut World<Zk>, to: usize, input: ZkInput) {
        let at = w.now + w.delay();
        let at = w.in_order(to, at);
        w.push(at, Ev::Notice(to, input));
    }

    fn alive_session(&mut self, w: &World<Zk>, session: u64) -> bool {
        let expires = w.now + self.lifetime();
        self.sessions.get_mut(&session).map(|s| s.expires = expires).is_some()
    }

    fn delete_node(&mut self, w: &mut World<Zk>, seq: u64) {
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
            self.notify(w, p, ZkInput::Watched { session });
        }
    }

    fn end_session(&mut self, w: &mut World<Zk>, session: u64) {
        let Some(s) = self.sessions.remove(&session) else { return };
        let owned: Vec<u64> = self.nodes.iter().filter(|(_, n)| n.session == session).map(|(seq, _)| *seq).collect();
        for seq in owned {
            self.delete_node(w, seq);
        }
        if self.sessions_of[s.owner] == Some(session) {
            self.notify(w, s.owner, ZkInput::State { session, state: SessionState::Lost });
        }
    }

    fn expire_sessions(&mut self, w: &mut World<Zk>) {
        let now = w.now;
        let expired: Vec<u64> = self.sessions.iter().filter(|(_, s)| s.expires <= now).map(|(id, _)| *id).collect();
        for session in expired {
            self.end_session(w, session);
        }
    }

    /// What the process's library tells it about every session, now.
    fn tell_sessions(&mut self, w: &mut World<Zk>, state: SessionState) {
        for p in 0..self.sessions_of.len() {
            if let Some(session) = self.sessions_of[p] {
                self.notify(w, p, ZkInput::State { session, state });
            }
        }
    }
}

impl Model for Zk {
    type Call = ZkCall;
    type Input = ZkInput;
    type Core = ZkLatch;
    type Msg = Msg;

    fn core(&mut self, _w: &mut World<Zk>, p: usize) -> ZkLatch {
        self.sessions_of[p] = None;
        ZkLatch::new(format!("c{p}"), self.timeout)
    }

    fn limit(&self, call: &ZkCall) -> Option<Duration> {
        match call {
            ZkCall::Connect => Some(self.timeout * 2),
            ZkCall::Close => None,
            ZkCall::Observe { limit, .. } | ZkCall::Heartbeat { limit, .. } | ZkCall::Delete { limit, .. } => {
                Some(*limit)
            }
        }
    }

    fn start(&mut self, w: &mut World<Zk>, p: usize, _close: ZkCall) {
        if let Some(session) = self.sessions_of[p].take() {
            let at = w.now + w.delay();
            w.push(at, Ev::Model(Msg::CloseSession(session)));
        }
    }

    fn apply(&mut self, w: &mut World<Zk>, from: usize, call: ZkCall) -> Option<ZkInput> {
        if !w.store_up {
            return None;
        }
        self.expire_sessions(w);
        Some(match call {
            ZkCall::Connect => {
                self.next_session += 1;
                let session = self.next_session;
                self.sessions.insert(session, Session { expires: w.now + self.lifetime(), owner: from });
                ZkInput::Connected(Ok((session, self.timeout, format!("guid{session}"))))
            }
            ZkCall::Observe { session, own, guid, .. } => {
                if !self.alive_session(w, session) {
                    return Some(ZkInput::Observed { session, result: Err(session_lost()) });
                }
                let ordered: Vec<(u64, &Node)> = self.nodes.iter().map(|(seq, n)| (*seq, n)).collect();
                let Some(index) = ordered.iter().position(|(_, n)| n.name.contains(&format!("_c_{guid}-"))) else {
                    self.next_seq += 1;
                    self.zxid += 1;
                    let name = format!("_c_{guid}-latch-{:010}", self.next_seq);
                    let node = Node { name: name.clone(), czxid: self.zxid, data: format!("c{from}"), session };
                    self.nodes.insert(self.next_seq, node);
                    let created = OwnNode { name, czxid: self.zxid };
                    let again = Look::Again { own: Some(created), own_gone: own.is_some() };
                    return Some(ZkInput::Observed { session, result: Ok(again) });
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
                let result = if self.alive_session(w, session) {
                    Ok(self.nodes.values().any(|n| n.name == node))
                } else {
                    Err(session_lost())
                };
                ZkInput::Heartbeat { session, result }
            }
            ZkCall::Delete { session, node, .. } => {
                let result = if self.alive_session(w, session) {
                    if let Some(seq) = self.nodes.iter().find(|(_, n)| n.name == node).map(|(seq, _)| *seq) {
                        self.delete_node(w, seq);
                    }
                    Ok(())
                } else {
                    Err(session_lost())
                };
                ZkInput::Deleted { session, node, result }
            }
            ZkCall::Close => unreachable!("handled by the client library"),
        })
    }

    fn timed_out(&self, call: ZkCall) -> ZkInput {
        let error = || ZkError::Timeout(Duration::from_secs(1));
        match call {
            ZkCall::Connect => ZkInput::Connected(Err(error())),
            ZkCall::Observe { session, .. } => ZkInput::Observed { session, result: Err(error()) },
            ZkCall::Heartbeat { session, .. } => ZkInput::Heartbeat { session, result: Err(error()) },
            ZkCall::Delete { session, node, .. } => ZkInput::Deleted { session, node, result: Err(error()) },
            ZkCall::Close => unreachable!("handled by the client library"),
        }
    }

    fn answered(&mut self, w: &mut World<Zk>, p: usize, input: &ZkInput) {
        if let ZkInput::Connected(Ok((session, _, _))) = input {
            // The library keeps the session alive from now on.
            self.sessions_of[p] = Some(*session);
            let at = w.now + self.timeout_ns() / 3;
            w.push(at, Ev::Model(Msg::Ping(p, *session)));
        }
    }

    fn target(msg: &Msg) -> Option<(usize, bool)> {
        match msg {
            Msg::Ping(from, _) => Some((*from, false)),
            _ => None,
        }
    }

    fn handle(&mut self, w: &mut World<Zk>, msg: Msg) -> Result<(), String> {
        match msg {
            Msg::Ping(from, session) if self.sessions_of[from] == Some(session) => {
                if w.store_up {
                    self.expire_sessions(w);
                    if !self.alive_session(w, session) {
                        self.sessions_of[from] = None;
                        self.notify(w, from, ZkInput::State { session, state: SessionState::Lost });
                        return Ok(());
                    }
                }
                let at = w.now + self.timeout_ns() / 3;
                w.push(at, Ev::Model(Msg::Ping(from, session)));
            }
            Msg::Ping(..) => {}
            Msg::CloseSession(session) => {
                if w.store_up {
                    self.end_session(w, session);
                }
            }
        }
        Ok(())
    }

    fn outage(&mut self, w: &mut World<Zk>, up: bool) {
        if up {
            // ZooKeeper restores sessions: each gets a full timeout again.
            let expires = w.now + self.lifetime();
            for session in self.sessions.values_mut() {
                session.expires = expires;
            }
        } else {
            self.watches.clear();
        }
        self.tell_sessions(w, if up { SessionState::Connected } else { SessionState::Disconnected });
    }
}

/// How the run is broken on purpose, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mutation {
    None,
    /// The server expires sessions after half a timeout, before the leader fences (2/3 of it).
    EarlyExpiry,
    /// A shell that never fences (its core's clock stops at the deadline): a same-term revival.
    Unfenced,
}

fn schedule(seed: u64, mutation: Mutation, opening: Opening) -> Result<Stats, String> {
    let mut w = World::new(seed);
    let timeout = Duration::from_millis(w.rng.random_range(1_000..=10_000));
    let n = w.rng.random_range(2..=5);
    let mut zk = Zk {
        timeout,
        early_expiry: mutation == Mutation::EarlyExpiry,
        sessions_of: vec![None; n],
        nodes: BTreeMap::new(),
        next_seq: 0,
        zxid: 1,
        sessions: BTreeMap::new(),
        next_session: 0,
        watches: BTreeMap::new(),
    };
    let timeout = timeout.as_nanos() as u64;
    (w.unfenced, w.answers_in_order) = (mutation == Mutation::Unfenced, true);
    (w.lease, w.settle_bound, w.slow, w.storms_disturb) = (timeout, 5 * timeout, timeout, true);
    w.storm = Faults { lost: 0.2, ..Faults::default() };
    w.populate(&mut zk, n, 0.9 * 0.2, 0, opening);
    w.run(zk)
}

#[test]
fn randomized_schedules_keep_one_leader_growing_terms_and_liveness() {
    run_schedules(u64::MAX, |seed| schedule(seed, Mutation::None, Opening::Random));
}

#[test]
fn a_reconnect_after_a_store_restart_under_the_leader_never_gives_two_leaders() {
    run_schedules(500, |seed| schedule(seed, Mutation::None, Opening::StoreRestartUnderLeader));
}

#[test]
fn a_leader_paused_past_its_session_is_replaced_and_never_comes_back_as_leader() {
    run_schedules(500, |seed| schedule(seed, Mutation::None, Opening::LeaderPausedPastLease));
}

#[test]
fn the_checker_catches_a_server_that_expires_sessions_before_the_leader_fences() {
    assert_caught(300, "S1", |seed| schedule(seed, Mutation::EarlyExpiry, Opening::Random));
}

#[test]
fn the_checker_catches_a_shell_that_fences_late_and_revives_the_tenure() {
    assert_caught(3000, "S2: a tenure seen as over", |seed| schedule(seed, Mutation::Unfenced, Opening::Random));
}
