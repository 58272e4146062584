//! The campaign: sessions (a lease and a key), the queue in create-revision order, self-fencing,
//! and publishing through the core's [`Publisher`].
//!
//! One session = one lease + one key `<prefix><lease hex>`. A session ends when it is lost (the
//! key deleted, the lease expired or revoked, or the self-fencing deadline passed), on resign
//! (the key is deleted so that the next candidate leads at once) or on shutdown. After a lost
//! session or a resign the candidate starts a new one: a new lease and a new key at the back of
//! the queue (invariant L3).
//!
//! Followers keep a local copy of the election's keys, loaded by one range and kept current by
//! one watch of the prefix; the leader and the predecessor are computed from it without further
//! reads. A stale copy can only show *more* keys below ours than there are (revisions only grow),
//! so it can delay a claim but never cause a wrong one; before claiming, the candidate re-reads
//! its own key (etcd's `Campaign` does not: etcd issue #11777).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tenure::{ElectorCommand, ElectorError, FailureLog, Leadership, Publisher, Role, StatsRecorder, Term, Timing};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::client::{self, Connection, WatchStream};
use crate::proto::etcdserverpb::{response_op, RangeRequest, RangeResponse, TxnRequest};
use crate::proto::mvccpb::event::EventType;
use crate::{self_fencing_margin, EtcdError};

/// How many unrevoked leases of ended sessions to remember.
const MAX_STALE_LEASES: usize = 16;

type Reply = Option<oneshot::Sender<Result<(), ElectorError>>>;

/// What ended a session.
enum SessionEnd {
    /// Stop the driver; answer `reply` once the election is cleaned up, saying whether the key
    /// was released (or will only go when its lease expires).
    Stop(Reply, bool),
    /// Start a new session after `delay`.
    Again(Duration),
}

/// A command, as the driver handles it.
enum Command {
    Resign(oneshot::Sender<Result<(), ElectorError>>),
    Stop(Reply),
}

/// The command channel; a closed channel means shutdown, once.
struct Commands {
    receiver: mpsc::Receiver<ElectorCommand>,
    open: bool,
}

impl Commands {
    async fn next(&mut self) -> Command {
        if !self.open {
            return std::future::pending().await;
        }
        match self.receiver.recv().await {
            Some(ElectorCommand::Resign(reply)) => Command::Resign(reply),
            Some(ElectorCommand::Shutdown(reply)) => Command::Stop(Some(reply)),
            None => {
                self.open = false;
                Command::Stop(None)
            }
        }
    }

    /// Runs `work` while answering resigns (nothing to resign outside leadership); a shutdown
    /// interrupts it and is returned.
    async fn race<T>(&mut self, work: impl Future<Output = T>) -> Result<T, Reply> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                value = &mut work => return Ok(value),
                command = self.next() => match command {
                    Command::Resign(reply) => {
                        let _ = reply.send(Ok(()));
                    }
                    Command::Stop(reply) => return Err(reply),
                },
            }
        }
    }
}

/// What the keep-alive task knows about the session's lease.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LeaseState {
    /// The self-fencing deadline: start of the last successful keep-alive + TTL - margin.
    valid_until: Instant,
    /// The server said the lease is gone.
    expired: bool,
}

/// A store call of a session's loop, owned by the loop so that it is raced against the
/// self-fencing deadline rather than awaited on its own.
type Call = Pin<Box<dyn Future<Output = CallDone> + Send>>;

/// What a [`Call`] brings back.
enum CallDone {
    /// The election's keys and a watch from after them.
    Resync(Result<Box<Loaded>, EtcdError>),
    /// The re-read of the own key before claiming leadership.
    Claim(Result<RangeResponse, EtcdError>),
}

/// The election's keys: key -> (create revision, identity).
type Keys = BTreeMap<String, (i64, String)>;

/// A fresh copy of the election's keys and the watch that keeps it current.
struct Loaded {
    keys: Keys,
    watch: WatchStream,
}

/// Aborts the keep-alive task when the session ends.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The campaign of one identity.
pub(crate) struct Driver {
    conn: Arc<Connection>,
    prefix: String,
    identity: String,
    timing: Timing,
    drain_timeout: Duration,
    publisher: Publisher,
    commands: Commands,
    /// Leases of ended sessions not yet revoked (the cluster was unreachable).
    stale_leases: Vec<i64>,
    /// After a tenure was lost (self-fenced, keep-alive stopped): until when its lease may still
    /// be revoked only once the tenure's guards are dropped. Revoking deletes the key and lets
    /// the next candidate lead at once, while the work of the lost tenure (a `tenure run`
    /// command in its grace period) may still run; without the revoke, nobody else leads before
    /// the server expires the lease, no sooner than this instant.
    drain_before_revoking: Option<Instant>,
    /// The leader (identity, term) last logged, so that each change is logged once.
    observed: Option<Option<(String, i64)>>,
    /// Calls that keep failing: one warning, a summary a minute, the recovery.
    failures: FailureLog,
}

impl Driver {
    pub(crate) fn new(
        conn: Arc<Connection>,
        prefix: String,
        identity: String,
        timing: Timing,
        drain_timeout: Duration,
        publisher: Publisher,
        commands: mpsc::Receiver<ElectorCommand>,
    ) -> Driver {
        Driver {
            conn,
            prefix,
            identity,
            timing,
            drain_timeout,
            publisher,
            commands: Commands { receiver: commands, open: true },
            stale_leases: Vec::new(),
            drain_before_revoking: None,
            observed: None,
            failures: FailureLog::new(),
        }
    }

    /// How long to wait before a new session after calls kept failing: one retry period,
    /// doubling with each failure in a row up to [`Timing::max_failure_backoff`], so a cluster
    /// that stays down is not asked for a lease every retry period.
    fn failure_backoff(&self) -> Duration {
        let failures = self.publisher.recorder().stats_snapshot().consecutive_lock_errors;
        let doublings = u32::try_from(failures.saturating_sub(1)).unwrap_or(u32::MAX).min(16);
        self.timing.retry_period.saturating_mul(1 << doublings).min(self.timing.max_failure_backoff())
    }

    fn call_timeout(&self) -> Duration {
        self.timing.call_timeout
    }

    pub(crate) async fn run(mut self) {
        tracing::debug!(identity = %self.identity, election = %self.prefix, "campaigning on etcd");
        loop {
            if let Err(reply) = self.drain_lost_tenure().await {
                self.revoke_stale_leases().await;
                let released = self.stale_leases.is_empty();
                self.finish(reply, released);
                break;
            }
            self.revoke_stale_leases().await;
            let end = self.session().await;
            self.publisher.end_tenure();
            match end {
                SessionEnd::Stop(reply, released) => {
                    self.finish(reply, released);
                    break;
                }
                SessionEnd::Again(delay) => {
                    if let Err(reply) = self.commands.race(sleep(delay)).await {
                        self.revoke_stale_leases().await;
                        let released = self.stale_leases.is_empty();
                        self.finish(reply, released);
                        break;
                    }
                }
            }
        }
        tracing::debug!(identity = %self.identity, "stopped campaigning");
    }

    /// The last word: nobody leads as far as this stopped candidate knows; answer the shutdown.
    fn finish(&mut self, reply: Reply, released: bool) {
        self.publish(None, Role::Follower);
        if let Some(reply) = reply {
            let _ = reply.send(if released { Ok(()) } else { Err(ElectorError::ReleaseTimedOut) });
        }
    }

    /// Waits until the guards of a lost tenure are dropped, or until its lease could have run out
    /// on the server anyway, before its lease is revoked (invariant "work stops before the lock
    /// is released", on the loss path too). A shutdown asked for meanwhile is returned once the
    /// wait is over.
    async fn drain_lost_tenure(&mut self) -> Result<(), Reply> {
        let Some(until) = self.drain_before_revoking.take() else { return Ok(()) };
        let drained = tokio::time::timeout_at(until, self.publisher.wait_for_ended_tenures());
        tokio::pin!(drained);
        match self.commands.race(&mut drained).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                tracing::warn!(identity = %self.identity, "the lost tenure's guards were still held when its lease could have expired; revoking it");
                Ok(())
            }
            Err(reply) => {
                let _ = drained.await;
                Err(reply)
            }
        }
    }

    /// Revokes the leases of ended sessions, so that their keys (possibly ahead of ours in the
    /// queue) go now rather than when the server expires them. Bounded by one call timeout each.
    async fn revoke_stale_leases(&mut self) {
        let limit = self.call_timeout();
        let mut kept = Vec::new();
        for lease in std::mem::take(&mut self.stale_leases) {
            match self.conn.revoke(limit, lease).await {
                Ok(()) => tracing::debug!(identity = %self.identity, lease = format!("{lease:x}"), "revoked lease"),
                Err(error) => {
                    tracing::debug!(identity = %self.identity, %error, "revoking an old lease failed; retrying later");
                    kept.push(lease);
                }
            }
        }
        // Keep a bounded list: a lease not revoked expires on the server anyway.
        let excess = kept.len().saturating_sub(MAX_STALE_LEASES);
        kept.drain(..excess);
        self.stale_leases = kept;
    }

    fn publish(&mut self, leader: Option<(&str, i64)>, role: Role) {
        let observed = leader.map(|(identity, revision)| (identity.to_owned(), revision));
        if self.observed.as_ref() != Some(&observed) {
            // The same line, at the same level, as the record-lock elector's.
            tracing::info!(
                identity = %self.identity,
                leader = observed.as_ref().map_or("", |(identity, _)| identity.as_str()),
                term = observed.as_ref().map(|(_, revision)| *revision),
                "leader observed"
            );
            self.observed = Some(observed);
        }
        self.publisher.prune_ended();
        self.publisher.publish(Leadership {
            leader: leader.map(|(identity, _)| identity.to_owned()),
            term: leader.map(|(_, revision)| Term(u64::try_from(revision).unwrap_or(0))),
            role,
        });
    }

    /// One session: grant a lease, put the key, wait in the queue, lead, until it ends.
    async fn session(&mut self) -> SessionEnd {
        let limit = self.call_timeout();
        let retry = self.timing.retry_period;
        let ttl_secs = i64::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i64::MAX);

        // The lease. Its grant counts as the first keep-alive.
        let started = Instant::now();
        let granted = match self.commands.race(self.conn.grant(limit, ttl_secs)).await {
            Err(reply) => return SessionEnd::Stop(reply, true),
            Ok(Err(error)) => {
                self.failures.failed(self.publisher.recorder(), &self.identity, "granting a lease", &error);
                return SessionEnd::Again(self.failure_backoff());
            }
            Ok(Ok(granted)) => granted,
        };
        self.failures.reached(self.publisher.recorder(), &self.identity);
        let lease = granted.id;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl.max(1)).unwrap_or(1));
        let margin = self_fencing_margin(ttl);
        let (lease_tx, mut lease_rx) =
            watch::channel(LeaseState { valid_until: started + ttl - margin, expired: false });
        let _keep_alive = AbortOnDrop(tokio::spawn(keep_alive(
            self.conn.clone(),
            lease,
            ttl,
            margin,
            self.timing.retry_period,
            limit,
            KeepAliveReports { state: lease_tx, stats: self.publisher.recorder().clone() },
        )));

        // The key, created only if absent (a retried call must not move it in the queue).
        let key = format!("{}{:x}", self.prefix, lease);
        let create = TxnRequest {
            compare: vec![client::create_revision_is(&key, 0)],
            success: vec![client::put_op(&key, &self.identity, lease)],
            failure: vec![client::get_op(&key)],
        };
        let my_revision = match self.commands.race(self.conn.txn(limit, create)).await {
            Err(reply) => {
                self.stale_leases.push(lease);
                self.revoke_stale_leases().await;
                let released = self.stale_leases.is_empty();
                return SessionEnd::Stop(reply, released);
            }
            Ok(Err(error)) => {
                self.failures.failed(self.publisher.recorder(), &self.identity, "creating the candidate key", &error);
                self.stale_leases.push(lease);
                return SessionEnd::Again(retry);
            }
            Ok(Ok(response)) if response.succeeded => response.header.map(|h| h.revision).unwrap_or(0),
            Ok(Ok(response)) => existing_create_revision(&response).unwrap_or(0),
        };
        if my_revision <= 0 {
            tracing::warn!(identity = %self.identity, "etcd did not say where the candidate key is; retrying");
            self.stale_leases.push(lease);
            return SessionEnd::Again(retry);
        }
        tracing::debug!(identity = %self.identity, key = %key, revision = my_revision, "queued");

        let mut session = Session {
            key,
            lease,
            my_revision,
            margin,
            valid_until: lease_rx.borrow().valid_until,
            keys: BTreeMap::new(),
            loaded: false,
            watch: None,
            resync_at: Instant::now(),
            leading: false,
        };
        self.queue_and_lead(&mut session, &mut lease_rx).await
    }

    /// The main loop of a session. Everything it awaits (store calls included) is awaited in its
    /// one `select!`, next to the self-fencing deadline: a hanging call never delays the fence
    /// (invariant S1).
    async fn queue_and_lead(&mut self, s: &mut Session, lease_rx: &mut watch::Receiver<LeaseState>) -> SessionEnd {
        let limit = self.call_timeout();
        let mut call: Option<Call> = None;
        loop {
            // The latest keep-alive result, even if its change notice is not handled yet.
            let lease = *lease_rx.borrow_and_update();
            if let Some(end) = self.follow_lease(s, lease) {
                return end;
            }
            if call.is_none() && s.watch.is_none() && Instant::now() >= s.resync_at {
                call = Some(Box::pin(resync(self.conn.clone(), self.prefix.clone(), limit)));
            }
            if s.loaded {
                // Our key, as we created it (not a namesake put by someone else since).
                if s.keys.get(&s.key).map(|(revision, _)| *revision) != Some(s.my_revision) {
                    tracing::warn!(identity = %self.identity, key = %s.key, "own key deleted: the session is lost");
                    return self.lost(s, "own key deleted");
                }
                if call.is_none() && !s.leading && s.predecessor().is_none() {
                    // First in the queue: claim, once the key is confirmed to still be ours.
                    let conn = self.conn.clone();
                    let read = RangeRequest { key: s.key.as_bytes().to_vec(), ..Default::default() };
                    call = Some(Box::pin(async move { CallDone::Claim(conn.range(limit, read).await) }));
                }
                self.publish_view(s);
            }

            let watching = s.watch.is_some();
            let calling = call.is_some();
            let resync_at = s.resync_at;
            let valid_until = s.valid_until;
            let conn = self.conn.clone();
            tokio::select! {
                done = finish_call(&mut call) => {
                    call = None;
                    if let Some(end) = self.call_done(s, done) {
                        return end;
                    }
                }
                event = next_event(&mut s.watch, &conn) => match event {
                    Ok(response) => {
                        if response.canceled || response.compact_revision != 0 {
                            tracing::warn!(identity = %self.identity, reason = %response.cancel_reason, "watch cancelled; reloading");
                            s.watch = None;
                            s.resync_at = Instant::now();
                        }
                        for event in response.events {
                            let Some(kv) = event.kv else { continue };
                            let key = String::from_utf8_lossy(&kv.key).into_owned();
                            if event.r#type == EventType::Delete as i32 {
                                s.keys.remove(&key);
                            } else {
                                s.keys.insert(key, (kv.create_revision, String::from_utf8_lossy(&kv.value).into_owned()));
                            }
                        }
                    }
                    Err(error) => {
                        self.failures.failed(self.publisher.recorder(), &self.identity, "watching the election", &error);
                        s.watch = None;
                        s.resync_at = Instant::now() + self.timing.retry_period / 4;
                    }
                },
                changed = lease_rx.changed() => {
                    if changed.is_err() {
                        tracing::warn!(identity = %self.identity, lease = format!("{:x}", s.lease), "keep-alive stopped: the session is lost");
                        return self.lost(s, "keep-alive stopped");
                    }
                    // The new state is handled at the top of the loop.
                }
                _ = sleep_until(valid_until) => {}
                _ = sleep_until(resync_at), if !watching && !calling => {}
                command = self.commands.next() => match command {
                    Command::Resign(reply) => {
                        if !s.leading {
                            let _ = reply.send(Ok(()));
                            continue;
                        }
                        // Whatever call was out belongs to the tenure that ends here.
                        drop(call.take());
                        self.step_down(s.my_revision).await;
                        let result = match self.conn.delete(limit, &s.key).await {
                            Ok(_) => Ok(()),
                            Err(error) => {
                                tracing::warn!(identity = %self.identity, %error, "deleting the key on resign failed");
                                Err(ElectorError::ReleaseTimedOut)
                            }
                        };
                        self.stale_leases.push(s.lease);
                        s.leading = false;
                        // Released: no longer `Releasing`; the next session reports the new leader.
                        self.publish(None, Role::Follower);
                        let _ = reply.send(result);
                        return SessionEnd::Again(Duration::ZERO);
                    }
                    Command::Stop(reply) => {
                        drop(call.take());
                        return self.stop(s, reply).await;
                    }
                },
            }
        }
    }

    /// Applies the keep-alive task's latest news to the session: ends it if the lease is gone or
    /// the self-fencing deadline has passed, else moves the deadline (and the tenure's).
    ///
    /// The deadline is checked before any extension: once it has passed, the server may expire
    /// the lease at any moment and users may have seen the tenure end, so the session is over
    /// even if a keep-alive succeeded since. Leading again takes a new session: a new lease, a new
    /// key and so a greater term (invariant S2).
    fn follow_lease(&mut self, s: &mut Session, lease: LeaseState) -> Option<SessionEnd> {
        if lease.expired {
            tracing::warn!(identity = %self.identity, lease = format!("{:x}", s.lease), "lease expired: the session is lost");
            return Some(self.lost(s, "lease expired"));
        }
        if Instant::now() >= s.valid_until {
            tracing::warn!(identity = %self.identity, "no successful keep-alive in time: the session is lost (self-fenced)");
            return Some(self.lost(s, "renew deadline exceeded"));
        }
        if lease.valid_until > s.valid_until {
            s.valid_until = lease.valid_until;
            if s.leading && !self.publisher.extend_tenure(s.valid_until) {
                tracing::warn!(identity = %self.identity, "keep-alive handled after the deadline: the session is lost (self-fenced)");
                return Some(self.lost(s, "renew deadline exceeded"));
            }
        }
        None
    }

    /// Applies the answer of a store call made by the session's loop.
    fn call_done(&mut self, s: &mut Session, done: CallDone) -> Option<SessionEnd> {
        let retry_at = Instant::now() + self.timing.retry_period / 2;
        match done {
            CallDone::Resync(Ok(loaded)) => {
                self.failures.reached(self.publisher.recorder(), &self.identity);
                s.keys = loaded.keys;
                s.loaded = true;
                s.watch = Some(loaded.watch);
            }
            CallDone::Resync(Err(error)) => {
                self.failures.failed(self.publisher.recorder(), &self.identity, "reading the election", &error);
                s.resync_at = retry_at;
            }
            CallDone::Claim(Err(error)) => {
                self.failures.failed(self.publisher.recorder(), &self.identity, "checking the own key", &error);
                s.watch = None;
                s.resync_at = retry_at;
            }
            CallDone::Claim(Ok(response)) => {
                if !response.kvs.iter().any(|kv| kv.create_revision == s.my_revision) {
                    tracing::warn!(identity = %self.identity, key = %s.key, "own key gone before the claim: the session is lost");
                    return Some(self.lost(s, "own key gone"));
                }
                // A deadline passed meanwhile is handled at the top of the loop: no tenure then.
                if !s.leading && Instant::now() < s.valid_until {
                    s.leading = true;
                    let term = Term(u64::try_from(s.my_revision).unwrap_or(0));
                    self.publisher.start_tenure(term, s.valid_until);
                    tracing::info!(identity = %self.identity, term = term.0, key = %s.key, "started leading");
                }
            }
        }
        None
    }

    /// Publishes who leads according to the local copy, and our role.
    fn publish_view(&mut self, s: &Session) {
        let role = if s.leading { Role::Leader } else { Role::Follower };
        match s.leader() {
            // Our own key first but not (yet) claimed: say nobody rather than ourselves.
            Some((key, _, _)) if key == s.key && !s.leading => self.publish(None, role),
            Some((_, revision, identity)) => self.publish(Some((identity, revision)), role),
            None => self.publish(None, role),
        }
    }

    /// Ends the tenure at once and gives the session up (its lease is revoked before the next,
    /// once the tenure's guards are dropped).
    fn lost(&mut self, s: &mut Session, reason: &str) -> SessionEnd {
        if std::mem::take(&mut s.leading) {
            // The server keeps the lease for at least a TTL after the last keep-alive: the
            // self-fencing deadline + the margin.
            self.drain_before_revoking = Some(s.valid_until + s.margin);
            self.publisher.end_tenure();
            tracing::info!(identity = %self.identity, term = s.my_revision, reason, "stopped leading");
        }
        self.publish(None, Role::Follower);
        self.stale_leases.push(s.lease);
        SessionEnd::Again(Duration::ZERO)
    }

    /// Ends the tenure, says `Releasing` and waits for the tenure's guards (up to the drain timeout).
    async fn step_down(&mut self, my_revision: i64) {
        self.publisher.end_tenure();
        tracing::info!(identity = %self.identity, term = my_revision, reason = "stepped down", "stopped leading");
        self.publish(Some((&self.identity.clone(), my_revision)), Role::Releasing);
        let drained = self.publisher.wait_for_ended_tenures();
        if timeout(self.drain_timeout, drained).await.is_err() {
            tracing::warn!(identity = %self.identity, "tenure guards still held after the drain timeout; releasing anyway");
        }
    }

    /// Shutdown: step down if leading, delete the key, revoke the lease.
    async fn stop(&mut self, s: &mut Session, reply: Reply) -> SessionEnd {
        if s.leading {
            self.step_down(s.my_revision).await;
            s.leading = false;
        }
        let limit = self.call_timeout();
        let deleted = match self.conn.delete(limit, &s.key).await {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(identity = %self.identity, %error, "deleting the key on shutdown failed");
                false
            }
        };
        self.stale_leases.push(s.lease);
        self.revoke_stale_leases().await;
        SessionEnd::Stop(reply, deleted || !self.stale_leases.contains(&s.lease))
    }
}

/// The state of one session.
struct Session {
    key: String,
    lease: i64,
    my_revision: i64,
    /// The lease's TTL minus the time from a keep-alive to the self-fencing deadline.
    margin: Duration,
    valid_until: Instant,
    /// The election's keys.
    keys: Keys,
    loaded: bool,
    watch: Option<WatchStream>,
    resync_at: Instant,
    leading: bool,
}

impl Session {
    /// The key with the lowest create revision.
    fn leader(&self) -> Option<(&str, i64, &str)> {
        self.keys.iter().min_by_key(|(_, (revision, _))| *revision).map(|(k, (r, v))| (k.as_str(), *r, v.as_str()))
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

/// Loads every key of the election and opens a watch from the next revision.
async fn resync(conn: Arc<Connection>, prefix: String, limit: Duration) -> CallDone {
    let loaded = async {
        let response = conn.range(limit, client::prefix_range(&prefix)).await?;
        let revision = response.header.map(|h| h.revision).unwrap_or(0);
        let keys = response
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    (kv.create_revision, String::from_utf8_lossy(&kv.value).into_owned()),
                )
            })
            .collect();
        let watch = conn.watch_prefix(limit, &prefix, revision + 1).await?;
        Ok(Box::new(Loaded { keys, watch }))
    };
    CallDone::Resync(loaded.await)
}

/// The answer of the store call in flight; pending forever when there is none.
async fn finish_call(call: &mut Option<Call>) -> CallDone {
    match call {
        Some(call) => call.await,
        None => std::future::pending().await,
    }
}

async fn next_event(
    watch: &mut Option<WatchStream>,
    conn: &Connection,
) -> Result<crate::proto::etcdserverpb::WatchResponse, EtcdError> {
    match watch {
        Some(stream) => stream.next(conn).await,
        None => std::future::pending().await,
    }
}

fn existing_create_revision(response: &crate::proto::etcdserverpb::TxnResponse) -> Option<i64> {
    response.responses.iter().find_map(|op| match &op.response {
        Some(response_op::Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.create_revision),
        _ => None,
    })
}

/// Where the keep-alive task reports: the session's lease state, and the elector's counters.
struct KeepAliveReports {
    state: watch::Sender<LeaseState>,
    stats: StatsRecorder,
}

/// Keeps `lease` alive every `interval`, one request at a time, and publishes the self-fencing
/// deadline (start of the last successful keep-alive + TTL - margin) after each success.
async fn keep_alive(
    conn: Arc<Connection>,
    lease: i64,
    ttl: Duration,
    margin: Duration,
    interval: Duration,
    limit: Duration,
    reports: KeepAliveReports,
) {
    let KeepAliveReports { state, stats } = reports;
    loop {
        let started = Instant::now();
        let mut stream = match conn.keep_alive(limit, lease).await {
            Ok(stream) => stream,
            Err(error) => {
                stats.record_renew(started, Err(()));
                stats.record_lock_error();
                tracing::debug!(lease = format!("{lease:x}"), %error, "opening a keep-alive stream failed");
                sleep_until(started + interval / 4).await;
                continue;
            }
        };
        let mut sent = started;
        loop {
            match stream.renew(&conn, limit).await {
                Ok(response) if response.ttl <= 0 => {
                    state.send_modify(|s| s.expired = true);
                    return;
                }
                Ok(response) => {
                    stats.record_renew(sent, Ok(sent.elapsed()));
                    stats.record_lock_reached();
                    let granted = Duration::from_secs(u64::try_from(response.ttl).unwrap_or(0));
                    // A TTL other than ours (never expected) must not lengthen the deadline.
                    let ttl = ttl.min(granted);
                    state.send_modify(|s| s.valid_until = s.valid_until.max(sent + ttl.saturating_sub(margin)));
                }
                Err(error) => {
                    stats.record_renew(sent, Err(()));
                    stats.record_lock_error();
                    tracing::debug!(lease = format!("{lease:x}"), %error, "keep-alive failed; reopening");
                    break;
                }
            }
            // Between keep-alives the stream is idle: a broken connection (member killed) shows
            // up here at once rather than at the next keep-alive.
            let broken = tokio::select! {
                _ = sleep_until(sent + interval) => false,
                _ = stream.broken(&conn) => true,
            };
            if broken {
                tracing::debug!(lease = format!("{lease:x}"), "keep-alive stream broke; reopening");
                break;
            }
            sent = Instant::now();
        }
        sleep_until(Instant::now() + interval / 4).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(my_revision: i64, keys: &[(&str, i64, &str)]) -> Session {
        Session {
            key: "e/mine".into(),
            lease: 1,
            my_revision,
            margin: Duration::ZERO,
            valid_until: Instant::now(),
            keys: keys.iter().map(|(k, r, v)| (k.to_string(), (*r, v.to_string()))).collect(),
            loaded: true,
            watch: None,
            resync_at: Instant::now(),
            leading: false,
        }
    }

    #[test]
    fn the_leader_is_the_oldest_key_and_each_waits_for_the_next_older() {
        let s = session(30, &[("e/b", 20, "b"), ("e/mine", 30, "me"), ("e/a", 10, "a"), ("e/late", 40, "late")]);
        assert_eq!(s.leader(), Some(("e/a", 10, "a")));
        assert_eq!(s.predecessor(), Some("e/b"), "the greatest create revision below ours, not the leader");
    }

    #[test]
    fn without_older_keys_there_is_no_predecessor() {
        let s = session(30, &[("e/mine", 30, "me"), ("e/late", 40, "late")]);
        assert_eq!(s.predecessor(), None);
        assert_eq!(s.leader(), Some(("e/mine", 30, "me")));
    }
}
