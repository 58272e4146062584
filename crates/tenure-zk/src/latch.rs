//! The campaign of one ZooKeeper candidate as a sans-IO core: sessions, an ephemeral sequential
//! node in the election (Curator's `LeaderLatch` names and order), self-fencing. Time is passed
//! in; [`crate::transport`] does the I/O and [`tenure::shell`] drives both, so the simulation
//! (tests/simulation.rs) runs this very code.
//!
//! The leader proves to itself that the server still hears it with a cheap read of its own node
//! every third of the session timeout; it leads until the start of the last answered request +
//! 2/3 of the session timeout the server granted, so it stops before the server can expire its
//! session (and so its node). A disconnection ends the tenure at once (Curator's advice: a
//! suspended connection means stop leading), even if the client reconnects. A tenure that ended
//! without a release leaves its node "spent": the node is deleted, so that this candidate queues
//! again with a new node and so a greater term (S2), once the tenure's guards are dropped (or at
//! the latest when the server could have expired the session anyway): the next leader never
//! starts while the lost tenure's work still runs.

use std::collections::VecDeque;
use std::time::Duration;

use tenure::backoff::Backoff;
use tenure::shell::{ElectionCore, Report};
use tenure::{AfterRelease, ElectorError, Event, Leadership, MonotonicTime, Role, Stage, StopReason, Term};
use zookeeper_client as zk;

use crate::ZkError;

/// The first retry within a session, doubling up to a quarter of the session timeout.
const FIRST_RETRY: Duration = Duration::from_millis(20);
/// The first wait after a failed connection attempt, doubling up to the session timeout or
/// [`tenure::timing::OUTAGE_PROBE`], whichever is shorter.
const FIRST_RECONNECT: Duration = Duration::from_millis(50);

/// This candidate's node in the election.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnNode {
    /// The node's name (a child of the election path).
    pub name: String,
    /// Its creation zxid: the term of a tenure on it.
    pub czxid: i64,
}

/// A call the core asks the transport to make. `session` tags what belongs to one session.
#[derive(Debug, Clone, PartialEq)]
pub enum ZkCall {
    /// Open a new session (closing any earlier one).
    Connect,
    /// Look at the election: list the children, find (or create, protected by `guid`) the own
    /// node, read and watch it, the predecessor and the leader. Each request within `limit`.
    Observe {
        /// The session.
        session: u64,
        /// The own node as known.
        own: Option<OwnNode>,
        /// The guid the own node's name carries.
        guid: String,
        /// The time limit of each request.
        limit: Duration,
    },
    /// The leader's heartbeat: does the own node still exist?
    Heartbeat {
        /// The session.
        session: u64,
        /// The own node's name.
        node: String,
        /// The time limit.
        limit: Duration,
    },
    /// Delete a node of this candidate (spent, or on release).
    Delete {
        /// The session.
        session: u64,
        /// The node's name.
        node: String,
        /// The time limit.
        limit: Duration,
    },
    /// Close the session (shutdown).
    Close,
}

/// What one look at the election found.
#[derive(Debug, Clone, PartialEq)]
pub enum Look {
    /// Where this candidate stands; the transport now watches the own node, the predecessor and
    /// the leader's node.
    View {
        /// The own node.
        own: OwnNode,
        /// The own node is first.
        is_leader: bool,
        /// The leader's identity (the data of the first node).
        leader_identity: String,
        /// The leader's term.
        leader_term: Term,
    },
    /// The children changed under our feet (a node vanished between two reads, or the own node
    /// was just created): look again at once.
    Again {
        /// The own node as it now is.
        own: Option<OwnNode>,
        /// The own node was known but is not among the children any more (deleted from outside).
        own_gone: bool,
    },
}

/// A session state change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SessionState {
    /// (Re)connected.
    Connected,
    /// The connection is lost; the session may come back.
    Disconnected,
    /// The session expired or was closed.
    Lost,
}

/// An answer or a notification.
#[derive(Debug)]
pub enum ZkInput {
    /// A session was opened: its number, the timeout the server granted and a fresh guid.
    Connected(Result<(u64, Duration, String), ZkError>),
    /// The answer to [`ZkCall::Observe`].
    Observed {
        /// The session.
        session: u64,
        /// What was found.
        result: Result<Look, ZkError>,
    },
    /// The answer to [`ZkCall::Heartbeat`]: whether the own node exists.
    Heartbeat {
        /// The session.
        session: u64,
        /// The answer.
        result: Result<bool, ZkError>,
    },
    /// The answer to [`ZkCall::Delete`] (a missing node counts as deleted).
    Deleted {
        /// The session.
        session: u64,
        /// The node.
        node: String,
        /// The answer.
        result: Result<(), ZkError>,
    },
    /// A watch set by the last look fired.
    Watched {
        /// The session.
        session: u64,
    },
    /// The session's state changed.
    State {
        /// The session.
        session: u64,
        /// The new state.
        state: SessionState,
    },
}

/// A session in use.
#[derive(Debug)]
struct Session {
    id: u64,
    /// The session timeout the server granted.
    timeout: Duration,
    guid: String,
    own: Option<OwnNode>,
    connected: bool,
    /// A look in flight, started then.
    looking: Option<MonotonicTime>,
    /// When to look next, unless a look is in flight (`None`: when a watch fires).
    look_at: Option<MonotonicTime>,
    /// A heartbeat in flight, started then.
    beating: Option<MonotonicTime>,
    next_heartbeat: MonotonicTime,
    /// A delete in flight.
    deleting: bool,
    /// Calls failed in a row within the session (the pause before the next doubles).
    failures: u32,
}

impl Session {
    fn fence_margin(&self) -> Duration {
        self.timeout * 2 / 3
    }

    fn call_timeout(&self) -> Duration {
        self.timeout / 2
    }

    /// Connected, with no call of its own in flight.
    fn idle(&self) -> bool {
        self.connected && self.looking.is_none() && self.beating.is_none() && !self.deleting
    }
}

#[derive(Debug)]
enum Phase {
    /// No session: connect at `at` (unless a connect is in flight).
    Connecting { at: MonotonicTime, in_flight: bool },
    InSession(Session),
    /// Done, with the shutdown's result.
    Stopped(Result<(), ElectorError>),
}

/// The campaign of one identity on one election path: a [`tenure::ElectionCore`].
#[derive(Debug)]
pub struct ZkLatch {
    identity: String,
    /// The session timeout asked for.
    session_timeout: Duration,
    phase: Phase,
    /// The term of the tenure held, and its self-fencing deadline.
    leading: Option<Term>,
    valid_until: MonotonicTime,
    /// The node of the tenure held.
    led_node: Option<String>,
    /// The node of a tenure that ended without a release: it goes before this candidate leads
    /// again, once the tenure's guards are dropped or at `spent_drain_until`.
    spent: Option<String>,
    spent_drain_until: MonotonicTime,
    guards_dropped: bool,
    connect_failures: u32,
    /// The own node a stop holds and its release deletes: the node of the tenure a step-down
    /// ended (it stays while the tenure's work stops, so nobody else leads, and is never led on
    /// again, S2), or on a shutdown the own node in any case.
    releasing_node: Option<String>,
    /// How the last resign's release ended, once it has (a shutdown's is in [`Phase::Stopped`]).
    released: Option<Result<(), ElectorError>>,
    shown: Leadership,
    observed: Option<Option<(String, Term)>>,
    queued: VecDeque<ZkCall>,
    reports: VecDeque<Report>,
}

impl ZkLatch {
    /// A campaign of `identity` asking for sessions of `session_timeout`.
    pub fn new(identity: String, session_timeout: Duration) -> ZkLatch {
        ZkLatch {
            identity, session_timeout, phase: Phase::Connecting { at: MonotonicTime::ZERO, in_flight: false },
            leading: None, valid_until: MonotonicTime::ZERO, led_node: None, spent: None,
            spent_drain_until: MonotonicTime::ZERO, guards_dropped: true, connect_failures: 0, releasing_node: None,
            released: None,
            shown: Leadership::unknown(), observed: None, queued: VecDeque::new(), reports: VecDeque::new(),
        }
    }

    fn session(&mut self) -> Option<&mut Session> {
        match &mut self.phase {
            Phase::InSession(s) => Some(s),
            _ => None,
        }
    }

    /// Publishes `leadership`, reporting each change of leader.
    fn show(&mut self, leadership: Leadership) {
        let observed = leadership.leader.clone().zip(leadership.term);
        if self.observed.as_ref() != Some(&observed) {
            let (leader, term) = observed.clone().unzip();
            self.reports.push_back(Report::Event(Event::LeaderObserved { leader, term }));
            self.observed = Some(observed);
        }
        self.shown = leadership;
    }

    /// Ends the tenure if one is held; its node is spent.
    fn stop_leading(&mut self, why: &str, reason: StopReason) {
        let Some(term) = self.leading.take() else { return };
        self.reports.push_back(Report::Event(Event::StoppedLeading { term, reason }));
        self.spent = self.led_node.take();
        self.guards_dropped = false;
        let timeout = self.session_timeout_granted();
        self.spent_drain_until = self.valid_until + (timeout - timeout * 2 / 3);
        tracing::debug!(identity = %self.identity, term = term.0, why, "tenure over");
    }

    fn session_timeout_granted(&self) -> Duration {
        match &self.phase {
            Phase::InSession(s) => s.timeout,
            _ => self.session_timeout,
        }
    }

    /// Ends the tenure if its self-fencing deadline has passed.
    fn fence_if_due(&mut self, now: MonotonicTime) {
        if self.leading.is_some() && now >= self.valid_until {
            self.stop_leading(
                "self-fenced: no answer from ZooKeeper within 2/3 of the session timeout",
                StopReason::RenewDeadlineExceeded,
            );
            self.show(Leadership::unknown());
        }
    }

    /// The session is gone: campaign again in a new one.
    fn session_lost(&mut self, now: MonotonicTime, stage: Stage) {
        self.stop_leading("session expired or closed", StopReason::LockLost);
        self.show(Leadership::unknown());
        // Whatever was to be deleted went with the session (and a node it held is deleted by
        // the next session, below, before this candidate leads again).
        if self.releasing_node.take().is_some() {
            if let Some(after) = release_after(stage) {
                self.finish_release(now, after, Ok(()));
            }
        }
        if !matches!(self.phase, Phase::Stopped(_)) {
            // The session is over for us, not necessarily for the server: requests of it queued
            // in a frozen server's sockets renew it when the server reads them as it thaws, and
            // its node would then stand in the queue one more session timeout, in front of
            // everybody. The next session deletes it (a node already gone counts as deleted).
            let own = self.session().and_then(|s| s.own.take()).map(|own| own.name);
            self.spent = self.spent.take().or(own);
            self.phase = Phase::Connecting { at: now, in_flight: false };
        }
    }

    /// Retries a failed call within the session after a growing pause.
    fn retry_later(&mut self, now: MonotonicTime) {
        if let Some(s) = self.session() {
            s.failures = s.failures.saturating_add(1);
            s.look_at = Some(now + Backoff::new(FIRST_RETRY, s.timeout / 4).delay(s.failures));
        }
    }

    /// Starts, extends or ends the tenure as a look says, and publishes it.
    fn apply(&mut self, now: MonotonicTime, stage: Stage, started: MonotonicTime, look: Look) {
        let (own, is_leader, leader_identity, leader_term) = match look {
            Look::View { own, is_leader, leader_identity, leader_term } => {
                (own, is_leader, leader_identity, leader_term)
            }
            Look::Again { own, own_gone } => {
                if own_gone {
                    tracing::warn!(identity = %self.identity, "own node is gone (deleted from outside); campaigning again");
                    self.stop_leading("own node deleted", StopReason::LockLost);
                }
                if let Some(s) = self.session() {
                    s.own = own;
                    s.look_at = Some(now);
                }
                return;
            }
        };
        let Some(s) = self.session() else { return };
        s.own = Some(own.clone());
        s.failures = 0;
        let margin = s.fence_margin();
        let heartbeat = s.timeout / 3;
        let connected = s.connected;
        let valid_until = started + margin;
        // A node whose tenure ended is never led on again (S2): it is deleted first. A look
        // answered after the connection was lost proves nothing about the session.
        let may_lead = connected && self.spent.is_none() && !self.holding(stage);
        let role = if is_leader && !may_lead && self.leading.is_none() {
            Role::Follower
        } else if is_leader && now >= valid_until {
            // The look took so long that a tenure would start (or go on) already fenced.
            self.stop_leading("self-fenced: ZooKeeper answered after the deadline", StopReason::RenewDeadlineExceeded);
            Role::Follower
        } else if is_leader {
            match self.leading {
                Some(term) if term == leader_term => self.valid_until = self.valid_until.max(valid_until),
                _ => {
                    self.leading = Some(leader_term);
                    self.led_node = Some(own.name.clone());
                    self.valid_until = valid_until;
                    if let Some(s) = self.session() {
                        s.next_heartbeat = started + heartbeat;
                    }
                    tracing::debug!(identity = %self.identity, node = %own.name, "first in the election");
                    self.reports.push_back(Report::Event(Event::StartedLeading { term: leader_term }));
                }
            }
            Role::Leader
        } else {
            self.stop_leading("another node is first", StopReason::LockLost);
            Role::Follower
        };
        let leadership = if is_leader && role != Role::Leader {
            // Fenced with our own node first: nobody leads as far as we know.
            Leadership::unknown()
        } else {
            Leadership { leader: Some(leader_identity), term: Some(leader_term), role }
        };
        self.show(leadership);
        // A spent node goes first; a look that came too late to lead is taken again.
        let again = self.spent.is_some() || (is_leader && self.leading.is_none() && connected);
        if let Some(s) = self.session().filter(|_| again) {
            // Otherwise a look asked for while this one was out (a watch that fired) stays.
            s.look_at = Some(now);
        }
    }

    fn look_now(&mut self, now: MonotonicTime) {
        if let Some(s) = self.session() {
            s.look_at = Some(now);
        }
    }

    /// True while a stop holds the own node: nothing is looked at, led on or deleted but the
    /// release's node (a release that outlived its stop's deadline still holds it).
    fn holding(&self, stage: Stage) -> bool {
        stage.is_stepping_down() || self.releasing_node.is_some()
    }

    fn finish_release(&mut self, now: MonotonicTime, after: AfterRelease, result: Result<(), ElectorError>) {
        self.releasing_node = None;
        if after == AfterRelease::Stop || self.shown.role == Role::Releasing {
            self.show(Leadership::unknown());
        }
        match after {
            AfterRelease::Campaign => {
                self.released = Some(result);
                self.look_now(now);
            }
            AfterRelease::Stop => {
                self.queued.push_back(ZkCall::Close);
                self.phase = Phase::Stopped(result);
            }
        }
    }
}

/// What a release under way in `stage` does once its node is deleted: `None` while draining
/// (the release has not started). A release that outlived its stop (the stage moved on at the
/// stop's deadline) still finishes as that stop would have.
fn release_after(stage: Stage) -> Option<AfterRelease> {
    match stage {
        Stage::Draining(_) => None,
        Stage::Releasing(after) => Some(after),
        Stage::Stopped => Some(AfterRelease::Stop),
        Stage::Campaigning => Some(AfterRelease::Campaign),
    }
}

/// True when `error` means the session is over.
pub fn is_session_lost(error: &ZkError) -> bool {
    matches!(
        error,
        ZkError::Request(
            zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed | zk::Error::AuthFailed
        )
    )
}

impl ElectionCore for ZkLatch {
    type Call = ZkCall;
    type Input = ZkInput;

    fn identity(&self) -> &str {
        &self.identity
    }

    fn renew_deadline(&self) -> Duration {
        self.session_timeout * 2 / 3
    }

    fn poll_call(&mut self, now: MonotonicTime, stage: Stage) -> Option<ZkCall> {
        if let Some(call) = self.queued.pop_front() {
            return Some(call);
        }
        self.fence_if_due(now);
        if self.spent.is_some() && !self.guards_dropped && now >= self.spent_drain_until {
            tracing::warn!(identity = %self.identity, "the ended tenure's guards were still held when its session could have expired; deleting its node");
            self.guards_dropped = true;
        }
        let holding = self.holding(stage);
        let spent = self.spent.clone().filter(|_| self.guards_dropped && !holding);
        let leading = self.leading.is_some();
        let has_spent = self.spent.is_some();
        let limit_leading = self.valid_until;
        match &mut self.phase {
            Phase::Connecting { at, in_flight } if !*in_flight && now >= *at => {
                *in_flight = true;
                Some(ZkCall::Connect)
            }
            Phase::InSession(s) if s.idle() => {
                // The call timeout, cut short at the self-fencing deadline while leading, so that
                // no call outlasts the tenure (S1).
                let limit = if leading { s.call_timeout().min(limit_leading - now) } else { s.call_timeout() };
                // A delete that failed waits for its retry (`retry_later`), even an instant failure.
                if let Some(node) = spent.filter(|_| s.look_at.is_none_or(|at| now >= at)) {
                    s.deleting = true;
                    return Some(ZkCall::Delete { session: s.id, node, limit });
                }
                if holding || has_spent {
                    return None;
                }
                if s.look_at.is_some_and(|at| now >= at) {
                    s.looking = Some(now);
                    s.look_at = None;
                    return Some(ZkCall::Observe { session: s.id, own: s.own.clone(), guid: s.guid.clone(), limit });
                }
                if leading && now >= s.next_heartbeat {
                    let node = s.own.as_ref()?.name.clone();
                    s.beating = Some(now);
                    s.next_heartbeat = now + s.timeout / 3;
                    return Some(ZkCall::Heartbeat { session: s.id, node, limit });
                }
                None
            }
            _ => None,
        }
    }

    fn handle(&mut self, now: MonotonicTime, stage: Stage, input: ZkInput) {
        let current = self.session().map(|s| s.id);
        match input {
            ZkInput::Connected(result) => {
                let Phase::Connecting { in_flight, .. } = &mut self.phase else { return };
                *in_flight = false;
                match result {
                    Ok((id, granted, guid)) => {
                        self.connect_failures = 0;
                        self.reports.push_back(Report::Reached);
                        let timeout = crate::granted_timeout(granted, self.session_timeout);
                        tracing::debug!(identity = %self.identity, session = id, ?timeout, "session established");
                        self.phase = Phase::InSession(Session {
                            id, timeout, guid, own: None, connected: true, looking: None, look_at: Some(now),
                            beating: None, next_heartbeat: now, deleting: false, failures: 0,
                        });
                    }
                    Err(error) => {
                        self.connect_failures = self.connect_failures.saturating_add(1);
                        self.reports
                            .push_back(Report::Failed { what: "connecting to ZooKeeper", error: error.to_string() });
                        let backoff =
                            Backoff::new(FIRST_RECONNECT, self.session_timeout.min(tenure::timing::OUTAGE_PROBE));
                        self.phase =
                            Phase::Connecting { at: now + backoff.delay(self.connect_failures), in_flight: false };
                    }
                }
            }
            ZkInput::State { session, state } if Some(session) == current => match state {
                SessionState::Connected => {
                    tracing::info!(identity = %self.identity, "reconnected to ZooKeeper; looking at the election again");
                    if let Some(s) = self.session() {
                        s.connected = true;
                        s.look_at = Some(now);
                    }
                }
                SessionState::Disconnected => {
                    // Stop at once, even if the client reconnects before we look again: the
                    // server may expire the session before we hear from it again.
                    self.stop_leading("connection to ZooKeeper lost", StopReason::RenewDeadlineExceeded);
                    self.show(Leadership::unknown());
                    if let Some(s) = self.session() {
                        s.connected = false;
                    }
                }
                SessionState::Lost => self.session_lost(now, stage),
            },
            ZkInput::Observed { session, result } if Some(session) == current => {
                let Some(started) = self.session().and_then(|s| s.looking.take()) else { return };
                match result {
                    Ok(look) => self.apply(now, stage, started, look),
                    Err(error) if is_session_lost(&error) => self.session_lost(now, stage),
                    Err(error) => {
                        tracing::debug!(identity = %self.identity, %error, "looking at the election failed; retrying");
                        self.retry_later(now);
                    }
                }
            }
            ZkInput::Watched { session } if Some(session) == current => {
                if let Some(s) = self.session() {
                    s.look_at = Some(s.look_at.map_or(now, |at| at.min(now)));
                }
            }
            ZkInput::Heartbeat { session, result } if Some(session) == current => {
                let Some(started) = self.session().and_then(|s| s.beating.take()) else { return };
                let margin = self.session().map_or(Duration::ZERO, |s| s.fence_margin());
                self.reports.push_back(Report::Renewed { started, latency: result.is_ok().then(|| now - started) });
                match result {
                    Ok(true) if self.leading.is_some() && now < self.valid_until => {
                        self.reports.push_back(Report::Reached);
                        self.valid_until = self.valid_until.max(started + margin);
                    }
                    Ok(true) => {
                        self.reports.push_back(Report::Reached);
                        // Answered, but after the deadline: the tenure is over for good.
                        self.stop_leading(
                            "self-fenced: ZooKeeper answered after the deadline",
                            StopReason::RenewDeadlineExceeded,
                        );
                        self.show(Leadership::unknown());
                        self.look_now(now);
                    }
                    Ok(false) => {
                        self.reports.push_back(Report::Reached);
                        self.look_now(now);
                    }
                    Err(error) if is_session_lost(&error) => self.session_lost(now, stage),
                    Err(error) => {
                        tracing::debug!(identity = %self.identity, %error, "heartbeat failed");
                        // Try again soon: the fencing deadline decides when we stop.
                        if let Some(s) = self.session() {
                            s.next_heartbeat = now + s.timeout / 12;
                        }
                    }
                }
            }
            ZkInput::Deleted { session, node, result } if Some(session) == current => {
                if let Some(s) = self.session() {
                    s.deleting = false;
                }
                let gone = result.is_ok();
                match &result {
                    Err(error) if is_session_lost(error) => return self.session_lost(now, stage),
                    Err(error) => {
                        tracing::debug!(identity = %self.identity, %error, node = %node, "deleting a node failed")
                    }
                    Ok(()) => tracing::debug!(identity = %self.identity, node = %node, "deleted node"),
                }
                if gone {
                    if let Some(s) = self.session().filter(|s| s.own.as_ref().is_some_and(|own| own.name == node)) {
                        s.own = None;
                    }
                    if self.spent.as_deref() == Some(node.as_str()) {
                        self.spent = None;
                    }
                }
                let release = release_after(stage).filter(|_| self.releasing_node.as_deref() == Some(node.as_str()));
                if let Some(after) = release {
                    if !gone {
                        tracing::warn!(identity = %self.identity, "could not delete own node; it goes with the session");
                        // Never lead on it again (S2): it is deleted before the next look.
                        self.spent = Some(node);
                        self.guards_dropped = true;
                    }
                    let result = if gone { Ok(()) } else { Err(ElectorError::ReleaseTimedOut) };
                    self.finish_release(now, after, result);
                } else if !gone {
                    self.retry_later(now);
                } else {
                    self.look_now(now);
                }
            }
            // Answers and notifications that outlived their session.
            _ => {}
        }
    }

    fn poll_timeout(&self, stage: Stage) -> Option<MonotonicTime> {
        let mut times = vec![];
        if self.leading.is_some() {
            times.push(self.valid_until);
        }
        if self.spent.is_some() && !self.guards_dropped {
            times.push(self.spent_drain_until);
        }
        let holding = self.holding(stage);
        match &self.phase {
            Phase::Connecting { at, in_flight: false } => times.push(*at),
            // What `poll_call` would start once its time comes; a call in flight, a spent node
            // still held by its work or a release under way wake the core by other means.
            Phase::InSession(s) if s.idle() && !holding && self.spent.is_none() => {
                times.extend(s.look_at);
                if self.leading.is_some() {
                    times.push(s.next_heartbeat);
                }
            }
            // A spent node whose delete failed: its retry.
            Phase::InSession(s) if s.idle() && !holding && self.guards_dropped => times.extend(s.look_at),
            _ => {}
        }
        times.into_iter().min()
    }

    fn poll_report(&mut self) -> Option<Report> {
        self.reports.pop_front()
    }

    fn step_down(&mut self, _now: MonotonicTime) {
        if let Some(term) = self.leading {
            self.stop_leading("stepped down", StopReason::SteppedDown);
            // The own node stays until the release: nobody else leads while the work stops.
            self.releasing_node = self.spent.take();
            self.guards_dropped = true;
            self.show(Leadership { leader: Some(self.identity.clone()), term: Some(term), role: Role::Releasing });
        }
    }

    fn release(&mut self, now: MonotonicTime, after: AfterRelease) {
        self.released = None;
        let (own, connected) = match &self.phase {
            Phase::InSession(s) => (s.own.as_ref().map(|own| own.name.clone()), s.connected),
            _ => (None, false),
        };
        // A resign releases only a node it led on; a shutdown deletes its node in any case.
        let node = match after {
            AfterRelease::Campaign => self.releasing_node.take(),
            AfterRelease::Stop => own,
        };
        match node {
            Some(node) if !connected && after == AfterRelease::Campaign => {
                // Cut off: the node goes before this candidate leads again (never the same term).
                self.spent = Some(node);
                self.guards_dropped = true;
                self.finish_release(now, after, Ok(()));
            }
            Some(node) if connected => {
                self.releasing_node = Some(node.clone());
                let Some(s) = self.session() else { return };
                let limit = s.call_timeout();
                let id = s.id;
                s.deleting = true;
                self.queued.push_back(ZkCall::Delete { session: id, node, limit });
            }
            _ => self.finish_release(now, after, Ok(())),
        }
    }

    fn release_result(&self) -> Option<Result<(), ElectorError>> {
        match &self.phase {
            Phase::Stopped(result) => Some(result.clone()),
            _ => self.released.clone(),
        }
    }

    fn awaits_guards(&self) -> bool {
        self.spent.is_some() && !self.guards_dropped
    }

    fn guards_dropped(&mut self, _now: MonotonicTime) {
        self.guards_dropped = true;
    }

    fn valid_until(&self) -> Option<MonotonicTime> {
        self.leading.map(|_| self.valid_until)
    }

    fn lapse(&mut self) {
        self.stop_leading("self-fenced: ZooKeeper answered after the deadline", StopReason::RenewDeadlineExceeded);
        self.show(Leadership::unknown());
    }

    fn leadership(&self, _now: MonotonicTime, _stage: Stage) -> Leadership {
        self.shown.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No stop under way.
    const RUN: Stage = Stage::Campaigning;

    const SESSION: Duration = Duration::from_secs(2);

    fn at(ms: u64) -> MonotonicTime {
        MonotonicTime(Duration::from_millis(ms))
    }

    /// Opens session `id` at `now` and answers its first look: the own node `node`, first or not.
    fn queued(latch: &mut ZkLatch, now: MonotonicTime, id: u64, node: &str, is_leader: bool) {
        assert_eq!(latch.poll_call(now, RUN), Some(ZkCall::Connect));
        latch.handle(now, RUN, ZkInput::Connected(Ok((id, SESSION, format!("guid-{id}")))));
        assert!(matches!(latch.poll_call(now, RUN), Some(ZkCall::Observe { session, .. }) if session == id));
        let own = OwnNode { name: node.into(), czxid: 7 };
        let (leader_identity, leader_term) = if is_leader { ("a", Term(7)) } else { ("b", Term(3)) };
        let look = Look::View { own, is_leader, leader_identity: leader_identity.into(), leader_term };
        latch.handle(now, RUN, ZkInput::Observed { session: id, result: Ok(look) });
    }

    /// The server may revive a session the client gave up (its queued requests reach a thawing
    /// server before the session tracker expires it): the next session deletes the old node
    /// before it looks at the election, or that node would stand in the queue one more session
    /// timeout.
    #[test]
    fn the_next_session_deletes_the_node_of_a_session_given_up() {
        let mut latch = ZkLatch::new("a".into(), SESSION);
        queued(&mut latch, at(0), 1, "n-0001", false);
        latch.handle(at(100), RUN, ZkInput::State { session: 1, state: SessionState::Lost });
        assert_eq!(latch.poll_call(at(100), RUN), Some(ZkCall::Connect));
        latch.handle(at(100), RUN, ZkInput::Connected(Ok((2, SESSION, "guid-2".into()))));
        let Some(ZkCall::Delete { session: 2, node, .. }) = latch.poll_call(at(100), RUN) else { panic!("no delete") };
        assert_eq!(node, "n-0001");
        latch.handle(at(110), RUN, ZkInput::Deleted { session: 2, node, result: Ok(()) });
        assert!(matches!(latch.poll_call(at(110), RUN), Some(ZkCall::Observe { session: 2, own: None, .. })));
    }

    /// A delete that fails at once is retried after a pause, not in a loop.
    #[test]
    fn a_failed_delete_of_a_spent_node_waits_before_it_is_tried_again() {
        let mut latch = ZkLatch::new("a".into(), SESSION);
        queued(&mut latch, at(0), 1, "n-0001", false);
        latch.handle(at(100), RUN, ZkInput::State { session: 1, state: SessionState::Lost });
        assert_eq!(latch.poll_call(at(100), RUN), Some(ZkCall::Connect));
        latch.handle(at(100), RUN, ZkInput::Connected(Ok((2, SESSION, "guid-2".into()))));
        let Some(ZkCall::Delete { node, .. }) = latch.poll_call(at(100), RUN) else { panic!("no delete") };
        let refused = Err(ZkError::Request(zk::Error::NoAuth));
        latch.handle(at(100), RUN, ZkInput::Deleted { session: 2, node, result: refused });
        assert_eq!(latch.poll_call(at(100), RUN), None, "no delete again at once");
        let retry = latch.poll_timeout(RUN).expect("a retry is due");
        assert!(retry > at(100), "{retry:?}");
        assert!(matches!(latch.poll_call(retry, RUN), Some(ZkCall::Delete { session: 2, .. })));
    }

    /// A leader's node goes the same way, once its tenure's guards are dropped.
    #[test]
    fn a_lost_leaders_node_is_deleted_by_the_next_session_once_its_work_stopped() {
        let mut latch = ZkLatch::new("a".into(), SESSION);
        queued(&mut latch, at(0), 1, "n-0001", true);
        assert!(latch.valid_until().is_some(), "leads");
        latch.handle(at(100), RUN, ZkInput::State { session: 1, state: SessionState::Lost });
        assert_eq!(latch.valid_until(), None, "the tenure ended with the session");
        assert_eq!(latch.poll_call(at(100), RUN), Some(ZkCall::Connect));
        latch.handle(at(100), RUN, ZkInput::Connected(Ok((2, SESSION, "guid-2".into()))));
        assert_eq!(latch.poll_call(at(100), RUN), None, "the work still runs: nothing is deleted or looked at");
        latch.guards_dropped(at(150));
        let call = latch.poll_call(at(150), RUN);
        assert!(matches!(call, Some(ZkCall::Delete { session: 2, node, .. }) if node == "n-0001"));
    }
}
