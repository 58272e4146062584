//! The campaign of one candidate as a sans-IO core: sessions (a lease and a key), the queue in
//! create-revision order, self-fencing. Time is passed in; [`crate::transport`] does the I/O and
//! [`tenure::shell`] drives both, so the simulation (tests/simulation.rs) runs this very code.
//!
//! One session = one lease + one key `<prefix><lease hex>`. A session ends when it is lost (the
//! key deleted, the lease expired, or the self-fencing deadline passed), on resign (the key is
//! deleted so that the next candidate leads at once) or on shutdown. After a lost session or a
//! resign the candidate starts a new one: a new lease and a new key at the back of the queue
//! (invariant L3), so a new tenure always has a greater term (S2).
//!
//! Followers keep a local copy of the election's keys, loaded by one range and kept current by
//! one watch of the prefix; the leader and the predecessor are computed from it without further
//! reads. A stale copy can only show *more* keys below ours than there are (revisions only grow),
//! so it can delay a claim but never cause a wrong one; before claiming, the candidate re-reads
//! its own key (etcd's `Campaign` does not: etcd issue #11777).
//!
//! After a lost tenure, its lease is revoked (which deletes the key and lets the next candidate
//! lead at once) only once the tenure's guards are dropped, or at the latest when the server could
//! have expired the lease anyway: the lost tenure's work (a `tenure run` command in its grace
//! period) never overlaps the next leader's.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tenure::backoff::Backoff;
use tenure::shell::{ElectionCore, Report};
use tenure::{AfterRelease, ElectorError, Event, Leadership, MonotonicTime, Role, Stage, StopReason, Term, Timing};

use crate::{self_fencing_margin, EtcdError};

/// How many unrevoked leases of ended sessions to remember.
const MAX_STALE_LEASES: usize = 16;

/// The election's keys: key -> (create revision, identity).
pub type Keys = BTreeMap<String, (i64, String)>;

/// A call the campaign asks the transport to make. `session` tags what belongs to one session,
/// so that answers that outlive their session are recognised and ignored.
#[derive(Debug, Clone, PartialEq)]
pub enum EtcdCall {
    /// Grant a lease of `ttl_secs`.
    Grant {
        /// The session the lease is for.
        session: u64,
        /// The TTL asked for.
        ttl_secs: i64,
    },
    /// Keep `lease` alive from now on, reporting each keep-alive (and stop keeping any other).
    KeepAlive {
        /// The session of the lease.
        session: u64,
        /// The lease.
        lease: i64,
    },
    /// Stop keeping any lease alive.
    StopKeepAlive,
    /// Put `key` bound to `lease` with the identity as value, only if the key is absent.
    Create {
        /// The session of the key.
        session: u64,
        /// The key.
        key: String,
        /// Its lease.
        lease: i64,
    },
    /// Load the election's keys and watch them from the revision after.
    Resync {
        /// The session that asks.
        session: u64,
    },
    /// Read the create revision of `key` (our own, before claiming).
    Claim {
        /// The session of the key.
        session: u64,
        /// The key.
        key: String,
    },
    /// Delete `key` (release).
    Delete {
        /// The session of the key.
        session: u64,
        /// The key.
        key: String,
    },
    /// Revoke `lease` (its key goes with it).
    Revoke {
        /// The lease.
        lease: i64,
    },
}

/// An answer or a notification for the campaign.
#[derive(Debug)]
pub enum EtcdInput {
    /// The answer to [`EtcdCall::Grant`]: the lease and the TTL granted.
    Granted {
        /// The session it was for.
        session: u64,
        /// The lease id and TTL.
        result: Result<(i64, Duration), EtcdError>,
    },
    /// A keep-alive of the session's lease, sent at `sent`: the TTL the server gave (zero: the
    /// lease is gone).
    KeptAlive {
        /// The session of the lease.
        session: u64,
        /// When the keep-alive was sent, on the campaign's clock.
        sent: MonotonicTime,
        /// The TTL, or why the keep-alive failed.
        result: Result<Duration, EtcdError>,
    },
    /// The answer to [`EtcdCall::Create`]: the key's create revision (ours, or the existing
    /// key's when a retried create found it).
    Created {
        /// The session of the key.
        session: u64,
        /// The create revision (0 when etcd did not say).
        result: Result<i64, EtcdError>,
    },
    /// The answer to [`EtcdCall::Resync`]: the keys; the watch now delivers what follows.
    Loaded {
        /// The session that asked.
        session: u64,
        /// The keys.
        result: Result<Keys, EtcdError>,
    },
    /// Changes from the watch: a key put (with its create revision and value) or deleted (`None`).
    Watched {
        /// The session whose watch delivered them.
        session: u64,
        /// The changes, in order.
        changes: Vec<(String, Option<(i64, String)>)>,
        /// The server cancelled the watch (compaction, or another reason): reload.
        cancelled: Option<String>,
    },
    /// The watch failed; it is closed.
    WatchFailed {
        /// The session whose watch failed.
        session: u64,
        /// Why.
        error: EtcdError,
    },
    /// The answer to [`EtcdCall::Claim`]: the own key's create revision, `None` if absent.
    Claimed {
        /// The session of the key.
        session: u64,
        /// The create revision.
        result: Result<Option<i64>, EtcdError>,
    },
    /// The answer to [`EtcdCall::Delete`].
    Deleted {
        /// The session of the key.
        session: u64,
        /// Whether it was deleted.
        result: Result<(), EtcdError>,
    },
    /// The answer to [`EtcdCall::Revoke`].
    Revoked {
        /// The lease.
        lease: i64,
        /// Whether it was revoked.
        result: Result<(), EtcdError>,
    },
}

/// The session's lease as the campaign knows it.
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    /// The TTL granted.
    ttl: Duration,
    /// The TTL minus the time from a keep-alive to the self-fencing deadline.
    margin: Duration,
    /// The self-fencing deadline: start of the last successful keep-alive + TTL - margin.
    valid_until: MonotonicTime,
}

/// A queued session: the key is in the election.
#[derive(Debug)]
struct Queued {
    key: String,
    lease: Lease,
    my_revision: i64,
    keys: Keys,
    loaded: bool,
    watching: bool,
    /// A watch failed or was cancelled, or delivered changes, since the last resync started: it
    /// may be the one that resync opened (the transport hands it over before the keys arrive),
    /// so the keys it loads are not followed by a watch (or miss those changes), and the next
    /// resync comes soon.
    watch_lost: bool,
    /// When to load the keys again, while not watching.
    resync_at: MonotonicTime,
    /// A resync or claim in flight.
    calling: bool,
    leading: bool,
    /// This session's tenure was stepped down from (a resign or shutdown): it never claims again
    /// (a new tenure needs a new key, S2), and the release deletes its key.
    resigned: bool,
}

#[derive(Debug)]
enum Phase {
    /// Between sessions: revoke what is stale, then grant a lease at `at`.
    Idle { at: MonotonicTime },
    /// The grant in flight, started at `started`.
    Granting { started: MonotonicTime },
    /// The key's create in flight.
    Creating { lease: Lease },
    /// In the queue, or leading.
    Queued(Queued),
    /// Shutdown: deleting the key (if any) and revoking leases.
    Stopping { deleting: bool, released: Released },
    /// Done; the result of the shutdown.
    Stopped(Result<(), ElectorError>),
}

/// How a shutdown tells whether it released what it held.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Released {
    /// Nothing was held yet (the grant was in flight): the lease, if granted, expires.
    Nothing,
    /// No key was in the queue: released once no stale lease is left.
    LeasesRevoked,
    /// The key was queued: released once deleted, or its lease revoked.
    KeyDeleted { deleted: bool, lease: i64 },
}

/// The campaign of one identity in one election: a [`tenure::ElectionCore`].
#[derive(Debug)]
pub struct EtcdCampaign {
    identity: String,
    prefix: String,
    timing: Timing,
    /// The current session's number; answers tagged with another are stale.
    session: u64,
    phase: Phase,
    /// Leases of ended sessions not yet revoked (the cluster was unreachable).
    stale_leases: Vec<i64>,
    /// Stale leases still to try in this pass (each once per pass).
    revoke_queue: Vec<i64>,
    /// A revoke is in flight.
    revoking: bool,
    /// Calls to make once each (keep-alive, create, delete), in order.
    queued_calls: VecDeque<EtcdCall>,
    /// A lease is being kept alive.
    keeping_alive: bool,
    /// After a tenure was lost: until when its lease is revoked only once its guards are dropped.
    drain_before_revoking: Option<MonotonicTime>,
    /// Calls failed in a row, for the back-off before a new session.
    failures: u32,
    /// How the last resign's release ended, once it has (a shutdown's is in [`Phase::Stopped`]).
    released: Option<Result<(), ElectorError>>,
    /// The leader (identity, term) last reported, so that each change is reported once.
    observed: Option<Option<(String, i64)>>,
    reports: VecDeque<Report>,
}

impl EtcdCampaign {
    /// A campaign of `identity` in the election whose keys start with `prefix`; `timing` is the
    /// session's ([`crate::session_timing`]).
    pub fn new(identity: String, prefix: String, timing: Timing) -> EtcdCampaign {
        EtcdCampaign {
            identity, prefix, timing, session: 0, phase: Phase::Idle { at: MonotonicTime::ZERO }, stale_leases: vec![],
            revoke_queue: vec![], revoking: false, queued_calls: VecDeque::new(), keeping_alive: false,
            drain_before_revoking: None, failures: 0, released: None, observed: None,
            reports: VecDeque::new(),
        }
    }

    /// The key prefix of the election.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn failed(&mut self, what: &'static str, error: &EtcdError) {
        self.failures = self.failures.saturating_add(1);
        self.reports.push_back(Report::Failed { what, error: error.to_string() });
    }

    fn reached(&mut self) {
        self.failures = 0;
        self.reports.push_back(Report::Reached);
    }

    /// Ends the session and goes back to idle, to start a new one at `at`.
    fn end_session(&mut self, at: MonotonicTime, lease: Option<i64>) {
        if std::mem::take(&mut self.keeping_alive) {
            self.queued_calls.push_back(EtcdCall::StopKeepAlive);
        }
        self.stale_leases.extend(lease);
        let excess = self.stale_leases.len().saturating_sub(MAX_STALE_LEASES);
        self.stale_leases.drain(..excess);
        self.revoke_queue = self.stale_leases.clone();
        self.phase = Phase::Idle { at };
    }

    /// Ends the tenure at once and gives the session up; a new one starts at once (its lease is
    /// revoked before, once the tenure's guards are dropped).
    fn lost(&mut self, now: MonotonicTime, why: &str, reason: StopReason) {
        let Phase::Queued(s) = &mut self.phase else { return };
        let lease = s.lease;
        if s.resigned {
            // Nothing left to release: the session (and its key) is gone.
            self.released = Some(Ok(()));
        }
        if std::mem::take(&mut s.leading) {
            // The server keeps the lease for at least a TTL after the last keep-alive: the
            // self-fencing deadline + the margin.
            self.drain_before_revoking = Some(lease.valid_until + lease.margin);
            let term = Term::from_count(s.my_revision);
            self.reports.push_back(Report::Event(Event::StoppedLeading { term, reason }));
        }
        tracing::warn!(identity = %self.identity, lease = format!("{:x}", lease.id), "{why}: the session is lost");
        self.end_session(now, Some(lease.id));
    }

    /// Reports the leader when it changed since the last report.
    fn observe(&mut self) {
        let leadership = self.view();
        let observed = leadership.leader.zip(leadership.term).map(|(l, t)| (l, i64::try_from(t.0).unwrap_or(0)));
        if self.observed.as_ref() != Some(&observed) {
            let (leader, term) = observed.clone().map_or((None, None), |(l, t)| (Some(l), Some(Term::from_count(t))));
            self.reports.push_back(Report::Event(Event::LeaderObserved { leader, term }));
            self.observed = Some(observed);
        }
    }

    fn view(&self) -> Leadership {
        let Phase::Queued(s) = &self.phase else { return Leadership::unknown() };
        if s.resigned {
            let (leader, term) = (Some(self.identity.clone()), Some(Term::from_count(s.my_revision)));
            return Leadership { leader, term, role: Role::Releasing };
        }
        let role = if s.leading { Role::Leader } else { Role::Follower };
        // Our own key first but not (yet) claimed: say nobody rather than ourselves.
        let leader = s.leader().filter(|(key, _, _)| s.loaded && (*key != s.key || s.leading));
        let term = leader.map(|(_, revision, _)| Term::from_count(revision));
        Leadership { leader: leader.map(|(_, _, identity)| identity.to_owned()), term, role }
    }

    /// Ends the session if the lease is gone, the self-fencing deadline has passed, or the own
    /// key was deleted.
    fn check_session(&mut self, now: MonotonicTime) {
        let Phase::Queued(s) = &self.phase else { return };
        if now >= s.lease.valid_until {
            self.lost(now, "no successful keep-alive in time (self-fenced)", StopReason::RenewDeadlineExceeded);
        } else if s.loaded && s.keys.get(&s.key).map(|(revision, _)| *revision) != Some(s.my_revision) {
            // Our key, as we created it (not a namesake put by someone else since).
            self.lost(now, "own key deleted", StopReason::LockLost);
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(self.timing.retry_period, self.timing.max_failure_backoff())
    }

    /// A shutdown is over once the key's delete and every revoke have been answered.
    fn stop_finished(&mut self) {
        let Phase::Stopping { deleting: false, released } = self.phase else { return };
        if self.revoking || !self.revoke_queue.is_empty() || !self.queued_calls.is_empty() {
            return;
        }
        let released = match released {
            Released::Nothing => true,
            Released::LeasesRevoked => self.stale_leases.is_empty(),
            Released::KeyDeleted { deleted, lease } => deleted || !self.stale_leases.contains(&lease),
        };
        self.phase = Phase::Stopped(if released { Ok(()) } else { Err(ElectorError::ReleaseTimedOut) });
    }
}

impl Queued {
    /// The key with the lowest create revision.
    fn leader(&self) -> Option<(&str, i64, &str)> {
        self.keys.iter().min_by_key(|(_, (revision, _))| *revision).map(|(k, (r, v))| (k.as_str(), *r, v.as_str()))
    }

    /// True when this session may claim (or start) a tenure in `stage`: not leading already, not
    /// stepped down from one, and no stop under way.
    fn may_claim(&self, stage: Stage) -> bool {
        !self.leading && !self.resigned && !stage.is_stepping_down()
    }

    /// The key with the greatest create revision below ours: the one this candidate waits for.
    fn predecessor(&self) -> Option<&str> {
        self.keys
            .iter()
            .filter(|(_, (revision, _))| *revision < self.my_revision)
            .max_by_key(|(_, (revision, _))| *revision)
            .map(|(k, _)| k.as_str())
    }
}

impl ElectionCore for EtcdCampaign {
    type Call = EtcdCall;
    type Input = EtcdInput;

    fn identity(&self) -> &str {
        &self.identity
    }

    fn renew_deadline(&self) -> Duration {
        self.timing.renew_deadline
    }

    fn poll_call(&mut self, now: MonotonicTime, stage: Stage) -> Option<EtcdCall> {
        self.check_session(now);
        if self.drain_before_revoking.is_some_and(|until| now >= until) {
            tracing::warn!(identity = %self.identity, "the lost tenure's guards were still held when its lease could have expired; revoking it");
            self.drain_before_revoking = None;
        }
        if let Some(call) = self.queued_calls.pop_front() {
            return Some(call);
        }
        let call = match &mut self.phase {
            Phase::Idle { .. } | Phase::Queued(_) | Phase::Stopping { deleting: false, .. }
                if !self.revoking && self.drain_before_revoking.is_none() && !self.revoke_queue.is_empty() =>
            {
                self.revoking = true;
                Some(EtcdCall::Revoke { lease: self.revoke_queue.remove(0) })
            }
            Phase::Idle { at } if !self.revoking && self.drain_before_revoking.is_none() && now >= *at => {
                self.session += 1;
                self.phase = Phase::Granting { started: now };
                let ttl_secs = i64::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i64::MAX);
                Some(EtcdCall::Grant { session: self.session, ttl_secs })
            }
            Phase::Queued(s) if !s.calling && !s.watching && now >= s.resync_at => {
                s.calling = true;
                s.watch_lost = false;
                Some(EtcdCall::Resync { session: self.session })
            }
            Phase::Queued(s)
                if !s.calling && s.loaded && s.may_claim(stage) && s.predecessor().is_none() =>
            {
                // First in the queue: claim, once the key is confirmed to still be ours.
                s.calling = true;
                Some(EtcdCall::Claim { session: self.session, key: s.key.clone() })
            }
            _ => None,
        };
        self.stop_finished();
        self.observe();
        call
    }

    fn handle(&mut self, now: MonotonicTime, stage: Stage, input: EtcdInput) {
        let session = self.session;
        let retry = self.timing.retry_period;
        match input {
            EtcdInput::Granted { session: s, result } if s == session => {
                let Phase::Granting { started } = self.phase else { return };
                match result {
                    Err(error) => {
                        self.failed("granting a lease", &error);
                        // Counted from the start of the grant: one that timed out waited already.
                        self.phase = Phase::Idle { at: (started + self.backoff().delay(self.failures)).max(now) };
                    }
                    Ok((id, ttl)) => {
                        self.reached();
                        // The store answers again: the stale leases whose revokes failed while it
                        // did not are revoked beside the new session (a restarted etcd extends
                        // every lease it had by its election timeout, so their keys would stand
                        // before the new one for a TTL and more).
                        self.revoke_queue = self.stale_leases.clone();
                        // The grant counts as the first keep-alive.
                        let margin = self_fencing_margin(ttl);
                        let lease = Lease { id, ttl, margin, valid_until: started + (ttl - margin) };
                        self.phase = Phase::Creating { lease };
                        self.keeping_alive = true;
                        self.queued_calls.push_back(EtcdCall::KeepAlive { session, lease: id });
                        // Created only if absent: a retried call must not move the key in the queue.
                        let key = format!("{}{:x}", self.prefix, id);
                        self.queued_calls.push_back(EtcdCall::Create { session, key, lease: id });
                    }
                }
            }
            EtcdInput::Created { session: s, result } if s == session => {
                let Phase::Creating { lease } = self.phase else { return };
                match result {
                    Err(error) => {
                        self.failed("creating the candidate key", &error);
                        self.end_session(now + retry, Some(lease.id));
                    }
                    Ok(revision) if revision <= 0 => {
                        tracing::warn!(identity = %self.identity, "etcd did not say where the candidate key is; retrying");
                        self.end_session(now + retry, Some(lease.id));
                    }
                    Ok(my_revision) => {
                        let key = format!("{}{:x}", self.prefix, lease.id);
                        tracing::debug!(identity = %self.identity, key = %key, revision = my_revision, "queued");
                        self.phase = Phase::Queued(Queued {
                            key, lease, my_revision, keys: Keys::new(), loaded: false, watching: false, watch_lost: false, resync_at: now,
                            calling: false, leading: false, resigned: false,
                        });
                    }
                }
            }
            EtcdInput::KeptAlive { session: s, sent, result } if s == session => {
                let lease = match &mut self.phase {
                    Phase::Creating { lease } => lease,
                    Phase::Queued(q) => &mut q.lease,
                    _ => return,
                };
                match result {
                    Ok(ttl) if ttl.is_zero() => {
                        let id = lease.id;
                        self.reports.push_back(Report::Renewed { started: sent, latency: None });
                        if let Phase::Queued(_) = self.phase {
                            self.lost(now, "lease expired", StopReason::LockLost);
                        } else {
                            self.end_session(now, Some(id));
                        }
                    }
                    Ok(granted) => {
                        // The deadline is checked before any extension: once it has passed, the
                        // server may expire the lease at any moment and users may have seen the
                        // tenure end, so the session is over even if a keep-alive succeeded.
                        if now < lease.valid_until {
                            // A TTL other than ours (never expected) must not lengthen the deadline.
                            let ttl = lease.ttl.min(granted);
                            lease.valid_until = lease.valid_until.max(sent + ttl.saturating_sub(lease.margin));
                        }
                        self.reports.push_back(Report::Renewed { started: sent, latency: Some(now - sent) });
                        self.reached();
                    }
                    Err(error) => {
                        self.reports.push_back(Report::Renewed { started: sent, latency: None });
                        self.failed("keeping the lease alive", &error);
                    }
                }
                self.check_session(now);
            }
            EtcdInput::Loaded { session: s, result } if s == session => {
                let Phase::Queued(q) = &mut self.phase else { return };
                q.calling = false;
                match result {
                    Ok(keys) => {
                        q.keys = keys;
                        q.loaded = true;
                        q.watching = !q.watch_lost;
                        if q.watch_lost {
                            q.resync_at = now + retry / 4;
                        }
                        self.reached();
                    }
                    Err(error) => {
                        q.resync_at = now + retry / 2;
                        self.failed("reading the election", &error);
                    }
                }
                self.check_session(now);
            }
            EtcdInput::Watched { session: s, changes, cancelled } if s == session => {
                let Phase::Queued(q) = &mut self.phase else { return };
                if q.calling {
                    // Changes that reach us before the keys of the resync in flight (its watch
                    // is handed over first) would be overwritten by that older snapshot: a key
                    // deleted now would stand before ours for good. Load again after it.
                    q.watch_lost = true;
                }
                if let Some(reason) = cancelled {
                    tracing::warn!(identity = %self.identity, %reason, "watch cancelled; reloading");
                    q.watching = false;
                    q.watch_lost = true;
                    q.resync_at = now;
                }
                for (key, value) in changes {
                    match value {
                        Some(value) => q.keys.insert(key, value),
                        None => q.keys.remove(&key),
                    };
                }
                self.check_session(now);
            }
            EtcdInput::WatchFailed { session: s, error } if s == session => {
                let Phase::Queued(q) = &mut self.phase else { return };
                q.watching = false;
                q.watch_lost = true;
                q.resync_at = now + retry / 4;
                self.failed("watching the election", &error);
            }
            EtcdInput::Claimed { session: s, result } if s == session => {
                let Phase::Queued(q) = &mut self.phase else { return };
                q.calling = false;
                match result {
                    Err(error) => {
                        q.watching = false;
                        q.resync_at = now + retry / 2;
                        self.failed("checking the own key", &error);
                    }
                    Ok(revision) if revision != Some(q.my_revision) => {
                        self.lost(now, "own key gone before the claim", StopReason::LockLost);
                    }
                    // A deadline passed meanwhile ends the session instead: no tenure then.
                    Ok(_) if q.may_claim(stage) && now < q.lease.valid_until => {
                        q.leading = true;
                        let term = Term::from_count(q.my_revision);
                        tracing::debug!(identity = %self.identity, key = %q.key, "claimed");
                        self.reports.push_back(Report::Event(Event::StartedLeading { term }));
                    }
                    Ok(_) => {}
                }
                self.check_session(now);
            }
            EtcdInput::Deleted { session: s, result } if s == session => {
                if let Err(error) = &result {
                    tracing::warn!(identity = %self.identity, %error, "deleting the key on release failed");
                }
                let ok = result.is_ok();
                if let Phase::Stopping { deleting, released } = &mut self.phase {
                    *deleting = false;
                    if let Released::KeyDeleted { deleted, .. } = released {
                        *deleted = ok;
                    }
                } else if let Phase::Queued(Queued { resigned: true, lease, .. }) = &self.phase {
                    self.released = Some(if ok { Ok(()) } else { Err(ElectorError::ReleaseTimedOut) });
                    // Released: a new session, at the back of the queue.
                    let lease = lease.id;
                    self.end_session(now, Some(lease));
                }
            }
            EtcdInput::Revoked { lease, result } => {
                self.revoking = false;
                match result {
                    Ok(()) => {
                        tracing::debug!(identity = %self.identity, lease = format!("{lease:x}"), "revoked lease");
                        self.stale_leases.retain(|l| *l != lease);
                    }
                    Err(error) => {
                        tracing::debug!(identity = %self.identity, %error, "revoking an old lease failed; retrying later")
                    }
                }
            }
            // Answers that outlived their session.
            _ => {}
        }
        self.stop_finished();
        self.observe();
    }

    fn poll_timeout(&self, _stage: Stage) -> Option<MonotonicTime> {
        let phase = match &self.phase {
            // A revoke in flight, or a drain, comes first: its answer (or deadline) wakes us.
            Phase::Idle { at } if !self.revoking && self.drain_before_revoking.is_none() => Some(*at),
            Phase::Queued(q) if !q.calling && !q.watching => Some(q.lease.valid_until.min(q.resync_at)),
            Phase::Queued(q) => Some(q.lease.valid_until),
            _ => None,
        };
        phase.into_iter().chain(self.drain_before_revoking).min()
    }

    fn poll_report(&mut self) -> Option<Report> {
        self.reports.pop_front()
    }

    fn step_down(&mut self, _now: MonotonicTime) {
        if let Phase::Queued(q) = &mut self.phase {
            if std::mem::take(&mut q.leading) {
                let term = Term::from_count(q.my_revision);
                self.reports.push_back(Report::Event(Event::StoppedLeading { term, reason: StopReason::SteppedDown }));
                // Keep the key (and renew its lease) while the tenure's work stops.
                q.resigned = true;
            }
        }
        self.observe();
    }

    fn release(&mut self, now: MonotonicTime, after: AfterRelease) {
        self.released = None;
        match after {
            AfterRelease::Campaign => match &self.phase {
                Phase::Queued(q) if q.resigned => {
                    self.queued_calls.push_back(EtcdCall::Delete { session: self.session, key: q.key.clone() });
                }
                // Nothing was led: nothing to release, campaign on.
                _ => self.released = Some(Ok(())),
            },
            AfterRelease::Stop => {
                let (key, released, lease) = match &self.phase {
                    Phase::Queued(q) => {
                        let lease = q.lease.id;
                        (Some(q.key.clone()), Released::KeyDeleted { deleted: false, lease }, Some(lease))
                    }
                    Phase::Creating { lease } => (None, Released::LeasesRevoked, Some(lease.id)),
                    Phase::Idle { .. } => (None, Released::LeasesRevoked, None),
                    _ => (None, Released::Nothing, None),
                };
                self.end_session(now, lease);
                self.phase = Phase::Stopping { deleting: key.is_some(), released };
                if let Some(key) = key {
                    self.queued_calls.push_back(EtcdCall::Delete { session: self.session, key });
                }
                self.stop_finished();
            }
        }
        self.observe();
    }

    fn release_result(&self) -> Option<Result<(), ElectorError>> {
        match &self.phase {
            Phase::Stopped(result) => Some(result.clone()),
            _ => self.released.clone(),
        }
    }

    fn awaits_guards(&self) -> bool {
        self.drain_before_revoking.is_some()
    }

    fn guards_dropped(&mut self, _now: MonotonicTime) {
        self.drain_before_revoking = None;
    }

    fn valid_until(&self) -> Option<MonotonicTime> {
        match &self.phase {
            Phase::Queued(q) if q.leading => Some(q.lease.valid_until),
            _ => None,
        }
    }

    fn lapse(&mut self) {
        if let Some(now) = self.valid_until() {
            self.lost(now, "keep-alive handled after the deadline (self-fenced)", StopReason::RenewDeadlineExceeded);
        }
    }

    fn leadership(&self, _now: MonotonicTime, _stage: Stage) -> Leadership {
        self.view()
    }
}
