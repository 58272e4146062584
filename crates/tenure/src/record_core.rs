//! The record-lock elector as the shell runs it: [`Candidate`] (client-go's algorithm) plus the
//! lock's watch, and the transport over a [`RecordLock`].
//!
//! Why beside the candidate rather than in it: the candidate decides on records; whether the
//! lock's watch is open, and when to try again after it broke, is about this one transport. Both
//! stay pure here (time passed in), so the shell is the only async code.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::timeout;

use crate::backoff::Backoff;
use crate::candidate::{Action, Candidate};
use crate::clock::MonotonicTime;
use crate::command::ElectorError;
use crate::election_core::{ElectionCore, Report, ShellFuture, Transport};
use crate::leadership::{Leadership, Role, WaitReason};
use crate::stage::{AfterRelease, Stage};
use crate::lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
use crate::term::Term;

/// A call on a record lock.
#[derive(Debug, Clone)]
pub enum RecordCall {
    /// A read or write the candidate asked for, started at the given time.
    Lock(Action, MonotonicTime),
    /// Open the lock's watch (again).
    OpenWatch,
}

/// What comes back from a record lock.
#[derive(Debug)]
pub enum RecordInput {
    /// The answer to [`Action::Read`].
    Read(Result<Option<StoredRecord>, LockError>),
    /// The answer to a create or update, with the time the write started.
    Write(Result<Version, LockError>, MonotonicTime),
    /// A change delivered by the watch.
    Changed(Option<StoredRecord>),
    /// The watch failed (it is closed).
    WatchFailed(LockError),
    /// The watch ended (it is closed).
    WatchEnded,
    /// The watch was opened (true) or the lock cannot watch right now (false).
    WatchOpened(bool),
}

/// [`Candidate`] with the lock's watch, as an [`ElectionCore`].
pub struct RecordCore {
    candidate: Candidate,
    /// The wall-clock time at the core's [`MonotonicTime::ZERO`]: the record's informational times
    /// (`acquireTime`, `renewTime`) are this plus the monotonic time passed in, so the core reads
    /// no clock of its own (the simulation gives it a virtual one).
    wall_at_zero: chrono::DateTime<chrono::Utc>,
    /// When to open the watch again, when it is closed and the lock can watch.
    reopen_watch_at: Option<MonotonicTime>,
    /// Watch streams that failed in a row (reset by the first change delivered).
    watch_failures: u32,
    reports: std::collections::VecDeque<Report>,
}

impl RecordCore {
    /// Wraps `candidate` (built knowing whether the transport's watch is open); `wall_at_zero` is
    /// the wall-clock time when the driver's monotonic clock reads zero (`Utc::now()` when the
    /// shell starts).
    pub fn new(candidate: Candidate, wall_at_zero: chrono::DateTime<chrono::Utc>) -> RecordCore {
        RecordCore { candidate, wall_at_zero, reopen_watch_at: None, watch_failures: 0, reports: Default::default() }
    }
}

impl ElectionCore for RecordCore {
    type Call = RecordCall;
    type Input = RecordInput;

    fn identity(&self) -> &str {
        self.candidate.identity()
    }

    fn renew_deadline(&self) -> Duration {
        self.candidate.timing().renew_deadline
    }

    fn poll_call(&mut self, now: MonotonicTime, stage: Stage) -> Option<RecordCall> {
        if self.reopen_watch_at.is_some_and(|at| now >= at) {
            self.reopen_watch_at = None;
            return Some(RecordCall::OpenWatch);
        }
        let wall = chrono::Duration::from_std(now.0).map_or(self.wall_at_zero, |since| self.wall_at_zero + since);
        self.candidate.poll_action(now, wall, stage).map(|action| RecordCall::Lock(action, now))
    }

    fn handle(&mut self, now: MonotonicTime, stage: Stage, input: RecordInput) {
        let timing = *self.candidate.timing();
        match input {
            RecordInput::Read(result) => {
                self.reports.push_back(match &result {
                    Err(error) => Report::Failed { what: "reading the lock", error: error.to_string() },
                    Ok(_) => Report::Reached,
                });
                self.candidate.on_read(now, result)
            }
            RecordInput::Write(result, started) => {
                // A write while holding a tenure is a renew (or the release).
                if self.candidate.leader_valid_until().is_some() {
                    let latency = result.as_ref().ok().map(|_| now.saturating_since(started));
                    self.reports.push_back(Report::Renewed { started, latency });
                }
                self.reports.push_back(match &result {
                    Err(e) if !e.is_conflict() => Report::Failed { what: "writing the lock", error: e.to_string() },
                    // A conflict is an answer: the store is reachable.
                    _ => Report::Reached,
                });
                self.candidate.on_write(now, result, stage)
            }
            RecordInput::Changed(stored) => {
                self.watch_failures = 0;
                self.reports.push_back(Report::Reached);
                self.candidate.on_change(now, stored)
            }
            RecordInput::WatchFailed(error) => {
                self.reports.push_back(Report::Failed { what: "watching the lock", error: error.to_string() });
                // Back off like the candidate's calls, so a store that stays down is not asked
                // to open a watch every retry period.
                self.watch_failures = self.watch_failures.saturating_add(1);
                let backoff = Backoff::new(timing.retry_period, timing.max_failure_backoff());
                self.reopen_watch_at = Some(now + backoff.delay(self.watch_failures));
            }
            RecordInput::WatchEnded => self.reopen_watch_at = Some(now + timing.retry_period),
            RecordInput::WatchOpened(open) => {
                // A lock that cannot watch right now is asked again later; meanwhile the resync
                // below and the candidate's retries keep it informed.
                self.reopen_watch_at = (!open).then_some(now + timing.retry_period);
                // Changes may have been missed while the watch was down.
                self.candidate.resync(now);
            }
        }
    }

    fn poll_timeout(&self, stage: Stage) -> Option<MonotonicTime> {
        self.candidate.next_wakeup(stage).into_iter().chain(self.reopen_watch_at).min()
    }

    fn poll_report(&mut self) -> Option<Report> {
        self.reports.pop_front().or_else(|| self.candidate.poll_event().map(Report::Event))
    }

    fn step_down(&mut self, now: MonotonicTime) {
        self.candidate.step_down(now)
    }

    fn release(&mut self, now: MonotonicTime, _after: AfterRelease) {
        self.candidate.release(now)
    }

    fn release_result(&self) -> Option<Result<(), ElectorError>> {
        self.candidate.has_released().then_some(Ok(()))
    }

    fn valid_until(&self) -> Option<MonotonicTime> {
        self.candidate.leader_valid_until()
    }

    fn lapse(&mut self) {
        self.candidate.lapse()
    }

    fn leadership(&self, now: MonotonicTime, stage: Stage) -> Leadership {
        let identity = self.candidate.identity();
        let role = if self.candidate.is_leader(now).is_some() {
            Role::Leader
        } else if self.candidate.is_releasing(stage) {
            Role::Releasing
        } else {
            Role::Follower
        };
        // A record that still names this instance after it stopped leading (fenced, or lost and
        // not yet re-read) names nobody who leads: say so rather than report ourselves.
        let record = self.candidate.observed_record().filter(|r| {
            let fenced_self = r.holder_identity == identity && role == Role::Follower;
            !r.holder_identity.is_empty() && !fenced_self
        });
        let term = record.map(|r| Term::from_count(r.leader_transitions));
        Leadership { leader: record.map(|r| r.holder_identity.clone()), term, role }
    }

    fn wait(&self, now: MonotonicTime, stage: Stage) -> Option<(WaitReason, MonotonicTime)> {
        self.candidate.wait(now, stage)
    }
}

/// The transport over a [`RecordLock`]: its calls, each bounded by the call timeout, and its watch.
pub struct RecordTransport {
    lock: Arc<dyn RecordLock>,
    call_timeout: Duration,
    changes: Option<ChangeStream>,
}

impl RecordTransport {
    /// The transport over `lock`, with its watch opened (if it has one).
    pub fn new(lock: Arc<dyn RecordLock>, call_timeout: Duration) -> RecordTransport {
        let changes = lock.watch();
        RecordTransport { lock, call_timeout, changes }
    }

    /// Whether the watch is open: the candidate polls less often when it is.
    pub fn is_watching(&self) -> bool {
        self.changes.is_some()
    }
}

impl Transport<RecordCore> for RecordTransport {
    fn start(&mut self, call: RecordCall) -> Option<ShellFuture<RecordInput>> {
        let lock = self.lock.clone();
        let limit = self.call_timeout;
        Some(match call {
            RecordCall::OpenWatch => {
                self.changes = self.lock.watch();
                let open = self.changes.is_some();
                Box::pin(async move { RecordInput::WatchOpened(open) })
            }
            RecordCall::Lock(Action::Read, _) => Box::pin(async move {
                RecordInput::Read(timeout(limit, lock.get()).await.unwrap_or(Err(LockError::Timeout(limit))))
            }),
            RecordCall::Lock(Action::Create(record), started) => Box::pin(async move {
                let written = timeout(limit, lock.create(&record)).await;
                RecordInput::Write(written.unwrap_or(Err(LockError::Timeout(limit))), started)
            }),
            RecordCall::Lock(Action::Update { expected, record }, started) => Box::pin(async move {
                let written = timeout(limit, lock.update(&expected, &record)).await;
                RecordInput::Write(written.unwrap_or(Err(LockError::Timeout(limit))), started)
            }),
        })
    }

    async fn notice(&mut self) -> RecordInput {
        let Some(changes) = self.changes.as_mut() else { return std::future::pending().await };
        let input = match changes.next().await {
            Some(Ok(stored)) => return RecordInput::Changed(stored),
            Some(Err(error)) => RecordInput::WatchFailed(error),
            None => RecordInput::WatchEnded,
        };
        self.changes = None;
        input
    }

    fn describe(&self) -> String {
        self.lock.describe()
    }
}
