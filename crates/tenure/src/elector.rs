//! The async driver: runs a [`Candidate`] against a [`RecordLock`] on tokio, and the [`Elector`]
//! handle users hold.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout, Instant};

use crate::candidate::{Action, AfterRelease, Candidate, Event, StopReason};
use crate::clock::MonotonicTime;
use crate::failure_log::FailureLog;
use crate::leadership::{Leadership, LockWait, Publisher, Role, Subscriber, Tenure};
use crate::lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
use crate::term::Term;
use crate::timing::{Timing, TimingError};

/// Why an elector could not be built or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ElectorError {
    /// The identity is empty; candidates must be told apart.
    #[error("the identity of a candidate must not be empty")]
    EmptyIdentity,
    /// The timing breaks a rule (see [`Timing::validate`]).
    #[error("invalid timing: {0}")]
    Timing(#[from] TimingError),
    /// The elector's task is gone (it was shut down).
    #[error("the elector has stopped")]
    Stopped,
    /// Shutdown gave up before the release was written; followers take over when the lease ends.
    #[error("the lock could not be released in time; followers take over when the lease runs out")]
    ReleaseTimedOut,
}

/// Builds an [`Elector`].
///
/// ```
/// # async fn f() -> Result<(), tenure::ElectorError> {
/// use std::time::Duration;
/// use tenure::{locks::memory::MemoryStore, Elector, Timing};
/// let store = MemoryStore::new();
/// let elector = Elector::builder("replica-a", store.client("replica-a"))
///     .timing(Timing::from_ttl(Duration::from_secs(5))?)
///     .drain_timeout(Duration::from_secs(3))
///     .spawn()?;
/// let tenure = elector.acquired().await?;
/// println!("leading with term {}", tenure.term());
/// drop(tenure);
/// elector.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct ElectorBuilder {
    identity: String,
    lock: Arc<dyn RecordLock>,
    timing: Timing,
    drain_timeout: Duration,
    seed: Option<u64>,
    coordinated: bool,
}

impl ElectorBuilder {
    /// Takes part in Kubernetes' Coordinated Leader Election: lead only when the API server's
    /// coordinator names this instance in the lease, and hand over gracefully (drain, then
    /// release) when it prefers another candidate. The lock must be a Lease whose candidacy is
    /// published (`tenure_kube::coordinated`); see [`Candidate::coordinated`].
    pub fn coordinated(mut self) -> Self {
        self.coordinated = true;
        self
    }

    /// The election timing; client-go's defaults if not set.
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// How long a resign or shutdown waits for the [`Tenure`] guards of the ending term to be
    /// dropped before it releases the lock anyway. Default: the renew deadline.
    pub fn drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = drain_timeout;
        self
    }

    /// Seeds the retry jitter, for reproducible tests.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Validates the configuration and starts campaigning on the current tokio runtime (like
    /// `tokio::spawn`, it panics when called outside one).
    pub fn spawn(self) -> Result<Elector, ElectorError> {
        if self.identity.is_empty() {
            return Err(ElectorError::EmptyIdentity);
        }
        self.timing.validate()?;
        let has_watch = self.lock.watch();
        let seed = self.seed.unwrap_or_else(rand::random);
        let mut candidate = Candidate::new(self.identity.clone(), self.timing, has_watch.is_some(), seed);
        if self.coordinated {
            candidate = candidate.coordinated();
        }
        let lock = self.lock;
        let drain_timeout = self.drain_timeout;
        Ok(Elector::from_driver(self.identity, self.timing, move |publisher, commands| {
            let driver = Driver {
                origin: Instant::now(),
                candidate,
                lock,
                publisher,
                drain_timeout,
                changes: has_watch,
                reopen_watch_at: None,
                failures: FailureLog::new(),
                watch_failures: 0,
                handover_requested: false,
            };
            driver.run(commands)
        }))
    }
}

/// A running candidate in one election.
///
/// Why a handle with a background task: leadership must be renewed on time whatever the user's
/// code is doing, and followers must react to changes the moment they happen. Dropping the handle
/// shuts the elector down (releasing the lock) in the background, which only completes if the
/// runtime keeps running: at the end of `main`, call [`Elector::shutdown`] and await it, or the
/// lock stays held until its lease runs out.
pub struct Elector {
    identity: String,
    timing: Timing,
    subscriber: Subscriber,
    commands: mpsc::Sender<ElectorCommand>,
    task: Option<JoinHandle<()>>,
}

/// A request from an [`Elector`] handle to the driver that runs the election. Public so that
/// native electors (etcd, ZooKeeper) can be driven by the same handle; see [`Elector::from_driver`].
#[derive(Debug)]
pub enum ElectorCommand {
    /// Step down if leading (end the tenure, wait for its guards up to the drain timeout, release)
    /// and stay a candidate. Answer when done.
    Resign(oneshot::Sender<Result<(), ElectorError>>),
    /// Step down if leading, release, and stop the driver. Answer when done. A closed command
    /// channel (every handle dropped) means the same, with nobody to answer.
    Shutdown(oneshot::Sender<Result<(), ElectorError>>),
}

impl Elector {
    /// Starts building a candidate named `identity` on `lock`.
    pub fn builder(identity: impl Into<String>, lock: impl RecordLock) -> ElectorBuilder {
        let timing = Timing::default();
        ElectorBuilder {
            identity: identity.into(),
            lock: Arc::new(lock),
            timing,
            drain_timeout: timing.renew_deadline,
            seed: None,
            coordinated: false,
        }
    }

    /// A handle around a native driver: `driver` receives the publishing half of the leadership
    /// channels and the command receiver, and returns the future that runs the election; it is
    /// spawned on the current tokio runtime. Backends with server-side sessions (etcd,
    /// ZooKeeper) use this so that users, the CLI and the HA runtime see one `Elector` type.
    ///
    /// `timing` describes the backend's session (lease = session TTL, renew deadline = the
    /// instant the driver fences itself, retry = keep-alive interval).
    pub fn from_driver<F>(
        identity: impl Into<String>,
        timing: Timing,
        driver: impl FnOnce(Publisher, mpsc::Receiver<ElectorCommand>) -> F,
    ) -> Elector
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (publisher, subscriber) = Publisher::new();
        let (commands, command_rx) = mpsc::channel(8);
        let task = tokio::spawn(driver(publisher, command_rx));
        Elector { identity: identity.into(), timing, subscriber, commands, task: Some(task) }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing it runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// A receiver that wakes on every change of leader, term or role.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.subscriber.leadership()
    }

    /// The latest leadership snapshot.
    pub fn leadership(&self) -> Leadership {
        self.subscriber.current()
    }

    /// The current term if this instance leads right now, checked against the self-fencing
    /// deadline on the local clock. Cheap: no I/O.
    pub fn is_leader(&self) -> Option<Term> {
        self.subscriber.tenure().map(|t| t.term())
    }

    /// Until when the current leadership is valid unless the next renew succeeds (the
    /// self-fencing deadline), if this instance leads.
    pub fn valid_until(&self) -> Option<Instant> {
        self.subscriber.tenure().map(|t| t.valid_until())
    }

    /// Counters of renews, failures and tenures, for metrics.
    pub fn stats(&self) -> crate::leadership::ElectorStats {
        self.subscriber.stats()
    }

    /// A guard for the current tenure, if this instance leads.
    pub fn tenure(&self) -> Option<Tenure> {
        self.subscriber.tenure()
    }

    /// Waits until this instance leads and returns the guard of its tenure.
    pub async fn acquired(&self) -> Result<Tenure, ElectorError> {
        self.subscriber.acquired().await.ok_or(ElectorError::Stopped)
    }

    /// Gives up leadership if held: ends the tenure, waits for its guards (up to the drain
    /// timeout), releases the lock so another candidate takes over at once, and stays a candidate
    /// that will not take the lock back for one lease unless nobody else does.
    pub async fn resign(&self) -> Result<(), ElectorError> {
        resign_through(&self.commands).await
    }

    /// A cloneable view of this elector that does not keep it running: see [`ElectorView`].
    pub fn view(&self) -> ElectorView {
        ElectorView {
            identity: self.identity.clone(),
            timing: self.timing,
            subscriber: self.subscriber.clone(),
            commands: self.commands.downgrade(),
        }
    }

    /// Stops: ends the tenure if leading, waits for its guards (up to the drain timeout), writes
    /// the release, and ends the background task.
    pub async fn shutdown(mut self) -> Result<(), ElectorError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(ElectorCommand::Shutdown(reply)).await.map_err(|_| ElectorError::Stopped)?;
        let result = answer.await.map_err(|_| ElectorError::Stopped)?;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        result
    }
}

async fn resign_through(commands: &mpsc::Sender<ElectorCommand>) -> Result<(), ElectorError> {
    let (reply, answer) = oneshot::channel();
    commands.send(ElectorCommand::Resign(reply)).await.map_err(|_| ElectorError::Stopped)?;
    answer.await.map_err(|_| ElectorError::Stopped)?
}

/// What runtimes layered on an elector (leader-gated work, garbage collection) need from it:
/// leadership, tenure guards and the ability to resign, without owning it.
///
/// Why not a clone of the [`Elector`]: the elector shuts down when its last handle is dropped,
/// and a runtime must never keep it campaigning behind its owner's back. A view holds only a weak
/// reference to the command channel and the receiving end of the leadership channels, so
/// [`ElectorView::acquired`] answers [`ElectorError::Stopped`] once the elector has stopped, and
/// whatever waits on it stops too.
///
/// ```
/// # async fn f() -> Result<(), tenure::ElectorError> {
/// use tenure::{locks::memory::MemoryStore, Elector};
/// let store = MemoryStore::new();
/// let elector = Elector::builder("a", store.client("a")).spawn()?;
/// let view = elector.view();
/// let tenure = view.acquired().await?;
/// drop(tenure);
/// elector.shutdown().await?;
/// assert!(view.acquired().await.is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ElectorView {
    identity: String,
    timing: Timing,
    subscriber: Subscriber,
    commands: mpsc::WeakSender<ElectorCommand>,
}

impl ElectorView {
    /// The candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timing the elector runs with (bounds how long work may outlive a lost tenure).
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// A receiver that wakes on every change of leader, term or role.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.subscriber.leadership()
    }

    /// A guard for the current tenure, if this instance leads.
    pub fn tenure(&self) -> Option<Tenure> {
        self.subscriber.tenure()
    }

    /// Waits until this instance leads; [`ElectorError::Stopped`] once the elector has stopped.
    pub async fn acquired(&self) -> Result<Tenure, ElectorError> {
        self.subscriber.acquired().await.ok_or(ElectorError::Stopped)
    }

    /// Resigns as [`Elector::resign`] does; [`ElectorError::Stopped`] if the elector is gone.
    pub async fn resign(&self) -> Result<(), ElectorError> {
        let commands = self.commands.upgrade().ok_or(ElectorError::Stopped)?;
        resign_through(&commands).await
    }
}

/// "Never", far enough from `Instant`'s limits that adding it cannot overflow: caps the instants
/// derived from untrusted input (a foreign record's lease) and from user settings.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

type OpFuture = Pin<Box<dyn Future<Output = OpResult> + Send>>;

enum OpResult {
    Read(Result<Option<StoredRecord>, LockError>),
    Write(Result<Version, LockError>),
}

type Reply = Option<oneshot::Sender<Result<(), ElectorError>>>;

/// A resign or shutdown in progress.
struct Stopping {
    after: AfterRelease,
    stage: StopStage,
    reply: Reply,
}

enum StopStage {
    /// Waiting for the guards of the ended tenure to be dropped.
    Draining { deadline: Instant },
    /// The release write is under way.
    Releasing { deadline: Instant },
}

/// Why the driver woke up.
enum Wake {
    Op(OpResult),
    Timer,
    Change(Option<Result<Option<StoredRecord>, LockError>>),
    ReopenWatch,
    Command(Option<ElectorCommand>),
    Drained,
}

struct Driver {
    origin: Instant,
    candidate: Candidate,
    lock: Arc<dyn RecordLock>,
    publisher: Publisher,
    drain_timeout: Duration,
    changes: Option<ChangeStream>,
    reopen_watch_at: Option<Instant>,
    failures: FailureLog,
    /// Watch streams that failed in a row (reset by the first change delivered).
    watch_failures: u32,
    /// The coordinator asked for a graceful handover: step down as a resign would.
    handover_requested: bool,
}

impl Driver {
    fn now(&self) -> MonotonicTime {
        MonotonicTime(self.origin.elapsed())
    }

    fn instant(&self, time: MonotonicTime) -> Instant {
        self.origin + time.0.min(FAR_FUTURE)
    }

    async fn run(mut self, mut commands: mpsc::Receiver<ElectorCommand>) {
        tracing::debug!(identity = self.candidate.identity(), lock = %self.lock.describe(), "campaigning");
        let mut op: Option<OpFuture> = None;
        let mut op_started = Instant::now();
        let mut stopping: Option<Stopping> = None;
        let mut commands_open = true;
        let mut drained: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = None;
        loop {
            let now = self.now();
            let action = self.candidate.poll_action(now, chrono::Utc::now());
            if let Some(action) = action {
                op = Some(self.start(action));
                op_started = Instant::now();
            }
            self.publish();
            if std::mem::take(&mut self.handover_requested) && stopping.is_none() {
                stopping = Some(self.begin_stop(AfterRelease::Campaign, None, &mut drained));
            }

            if let Some(stop) = stopping.as_mut() {
                if let StopStage::Releasing { deadline } = stop.stage {
                    let done = match stop.after {
                        AfterRelease::Stop => self.candidate.is_stopped(),
                        AfterRelease::Campaign => !self.candidate.is_releasing(),
                    };
                    if done || Instant::now() >= deadline {
                        let result = if done { Ok(()) } else { Err(ElectorError::ReleaseTimedOut) };
                        if let Some(reply) = stop.reply.take() {
                            let _ = reply.send(result);
                        }
                        if stop.after == AfterRelease::Stop {
                            break;
                        }
                        stopping = None;
                    }
                }
            }

            let mut timer = self.candidate.next_wakeup().map(|t| self.instant(t));
            if let Some(stop) = &stopping {
                let deadline = match stop.stage {
                    StopStage::Draining { deadline } | StopStage::Releasing { deadline } => deadline,
                };
                timer = Some(timer.map_or(deadline, |t| t.min(deadline)));
            }
            let reopen_at = self.reopen_watch_at;
            let wake = tokio::select! {
                result = async { op.as_mut().expect("guarded by precondition").await }, if op.is_some() => Wake::Op(result),
                _ = sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => Wake::Timer,
                item = next_change(&mut self.changes) => Wake::Change(item),
                _ = sleep_until(reopen_at.unwrap_or_else(Instant::now)), if reopen_at.is_some() => Wake::ReopenWatch,
                command = commands.recv(), if commands_open && stopping.is_none() => Wake::Command(command),
                _ = async { drained.as_mut().expect("guarded by precondition").await }, if drained.is_some() => Wake::Drained,
            };

            let now = self.now();
            match wake {
                Wake::Op(result) => {
                    op = None;
                    match result {
                        OpResult::Read(result) => {
                            let identity = self.candidate.identity();
                            match &result {
                                Err(error) => {
                                    self.failures.failed(self.publisher.recorder(), identity, "reading the lock", error)
                                }
                                Ok(_) => self.failures.reached(self.publisher.recorder(), identity),
                            }
                            self.candidate.on_read(now, result)
                        }
                        OpResult::Write(result) => {
                            // A write while holding a tenure is a renew (or the release).
                            if self.candidate.leader_valid_until().is_some() {
                                let outcome = result.as_ref().map(|_| op_started.elapsed()).map_err(|_| ());
                                self.publisher.record_renew(op_started, outcome);
                            }
                            let identity = self.candidate.identity();
                            match &result {
                                Err(error) if !error.is_conflict() => {
                                    self.failures.failed(self.publisher.recorder(), identity, "writing the lock", error)
                                }
                                // A conflict is an answer: the store is reachable.
                                _ => self.failures.reached(self.publisher.recorder(), identity),
                            }
                            self.candidate.on_write(now, result)
                        }
                    }
                }
                Wake::Timer => {}
                Wake::Change(Some(Ok(stored))) => {
                    self.watch_failures = 0;
                    self.failures.reached(self.publisher.recorder(), self.candidate.identity());
                    self.candidate.on_change(now, stored)
                }
                Wake::Change(Some(Err(error))) => {
                    let identity = self.candidate.identity();
                    self.failures.failed(self.publisher.recorder(), identity, "watching the lock", &error);
                    self.changes = None;
                    // Back off like the candidate's calls, so a store that stays down is not asked
                    // to open a watch every retry period.
                    self.watch_failures = self.watch_failures.saturating_add(1);
                    let timing = self.candidate.timing();
                    let delay = timing
                        .retry_period
                        .saturating_mul(1 << self.watch_failures.saturating_sub(1).min(16))
                        .min(timing.max_failure_backoff());
                    self.reopen_watch_at = Some(Instant::now() + delay);
                }
                Wake::Change(None) => {
                    self.changes = None;
                    self.reopen_watch_at = Some(Instant::now() + self.candidate.timing().retry_period);
                }
                Wake::ReopenWatch => {
                    self.changes = self.lock.watch();
                    // A lock that cannot watch right now is asked again later; meanwhile the
                    // resync below and the candidate's retries keep it informed.
                    self.reopen_watch_at =
                        self.changes.is_none().then(|| Instant::now() + self.candidate.timing().retry_period);
                    // Changes may have been missed while the watch was down.
                    self.candidate.resync(now);
                }
                Wake::Command(command) => {
                    let (after, reply) = match command {
                        Some(ElectorCommand::Resign(reply)) => (AfterRelease::Campaign, Some(reply)),
                        Some(ElectorCommand::Shutdown(reply)) => (AfterRelease::Stop, Some(reply)),
                        None => {
                            commands_open = false;
                            (AfterRelease::Stop, None)
                        }
                    };
                    stopping = Some(self.begin_stop(after, reply, &mut drained));
                }
                Wake::Drained => drained = None,
            }

            // Move from draining to releasing once the guards are gone or the drain timed out.
            if let Some(stop) = stopping.as_mut() {
                if let StopStage::Draining { deadline } = stop.stage {
                    if drained.is_none() || Instant::now() >= deadline {
                        drained = None;
                        self.candidate.release(self.now(), stop.after);
                        let deadline = Instant::now() + self.candidate.timing().renew_deadline;
                        stop.stage = StopStage::Releasing { deadline };
                    }
                }
            }
        }
        self.publisher.end_tenure();
        self.publish();
        tracing::debug!(identity = self.candidate.identity(), "stopped");
    }
}

impl Driver {
    /// Steps down and starts draining: the tenure ends now, the lock is released once its guards
    /// are dropped (or the drain timeout passes).
    fn begin_stop(
        &mut self,
        after: AfterRelease,
        reply: Reply,
        drained: &mut Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    ) -> Stopping {
        self.candidate.step_down(self.now());
        self.publish();
        *drained = Some(Box::pin(self.publisher.wait_for_ended_tenures()));
        let deadline = Instant::now() + self.drain_timeout.min(FAR_FUTURE);
        Stopping { after, stage: StopStage::Draining { deadline }, reply }
    }

    fn start(&self, action: Action) -> OpFuture {
        let lock = self.lock.clone();
        let limit = self.candidate.timing().call_timeout;
        match action {
            Action::Read => Box::pin(async move {
                OpResult::Read(timeout(limit, lock.get()).await.unwrap_or(Err(LockError::Timeout(limit))))
            }),
            Action::Create(record) => Box::pin(async move {
                OpResult::Write(timeout(limit, lock.create(&record)).await.unwrap_or(Err(LockError::Timeout(limit))))
            }),
            Action::Update { expected, record } => Box::pin(async move {
                OpResult::Write(
                    timeout(limit, lock.update(&expected, &record)).await.unwrap_or(Err(LockError::Timeout(limit))),
                )
            }),
        }
    }

    /// Turns the candidate's events into log lines, tenure guards and a leadership snapshot.
    fn publish(&mut self) {
        self.publish_events();
        self.publisher.prune_ended();
        if let Some(valid_until) = self.candidate.leader_valid_until() {
            // The publisher refuses when the guards' deadline passed before this renew was
            // handled (a late wake-up): the tenure is over for good, and the candidate must
            // acquire again under a new term rather than go on leading under the old one.
            if !self.publisher.extend_tenure(self.instant(valid_until)) {
                self.candidate.lapse();
                self.publish_events();
            }
        }
        let identity = self.candidate.identity().to_owned();
        let now = self.now();
        let role = if self.candidate.is_leader(now).is_some() {
            Role::Leader
        } else if self.candidate.is_releasing() && self.candidate.holds_lock() {
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
        self.publisher.publish(Leadership {
            leader: record.map(|r| r.holder_identity.clone()),
            term: record.map(|r| Term(u64::try_from(r.leader_transitions).unwrap_or(0))),
            role,
        });
        self.publish_wait(now);
    }

    /// Turns the candidate's pending events into tenure guards and log lines.
    fn publish_events(&mut self) {
        let identity = self.candidate.identity().to_owned();
        while let Some(event) = self.candidate.poll_event() {
            match event {
                Event::StartedLeading { term } => {
                    let valid_until = self.candidate.leader_valid_until().unwrap_or_default();
                    self.publisher.start_tenure(term, self.instant(valid_until));
                    tracing::info!(identity = %identity, term = term.0, "started leading");
                }
                Event::StoppedLeading { term, reason } => {
                    self.publisher.end_tenure();
                    let reason = match reason {
                        StopReason::RenewDeadlineExceeded => "renew deadline exceeded",
                        StopReason::LockLost => "lock taken by another holder or deleted",
                        StopReason::SteppedDown => "stepped down",
                    };
                    tracing::info!(identity = %identity, term = term.0, reason, "stopped leading");
                }
                Event::HandoverRequested { term, to } => {
                    tracing::info!(
                        identity = %identity,
                        term = term.0,
                        preferred = %to,
                        "the coordinator prefers another candidate: handing over (drain, then release)"
                    );
                    self.handover_requested = true;
                }
                Event::LeaderObserved { leader, term } => {
                    tracing::info!(
                        identity = %identity,
                        leader = leader.as_deref().unwrap_or(""),
                        term = term.map(|t| t.0),
                        "leader observed"
                    );
                }
            }
        }
    }

    /// Publishes (and logs, when it changes) why this candidate waits on a record that is not a
    /// live leader's, and until when.
    fn publish_wait(&mut self, now: MonotonicTime) {
        let wait = self.candidate.wait(now).map(|(reason, until)| {
            let remaining = until.0.saturating_sub(now.0);
            let until_wall =
                std::time::SystemTime::now().checked_add(remaining).unwrap_or_else(std::time::SystemTime::now);
            LockWait { reason, until: self.instant(until), until_wall }
        });
        if self.publisher.set_wait(wait) {
            if let Some(wait) = wait.filter(|w| w.reason.is_open_ended()) {
                tracing::info!(identity = self.candidate.identity(), "not taking the lock: {}", wait.reason.describe());
            } else if let Some(wait) = wait {
                let until = chrono::DateTime::<chrono::Utc>::from(wait.until_wall);
                tracing::info!(
                    identity = self.candidate.identity(),
                    until = %until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    in_seconds = wait.until.saturating_duration_since(Instant::now()).as_secs_f64().round(),
                    "waiting before taking the lock: {}",
                    wait.reason.describe()
                );
            }
        }
    }
}

/// The next change from the lock's watch; pending forever when there is no watch.
async fn next_change(changes: &mut Option<ChangeStream>) -> Option<Result<Option<StoredRecord>, LockError>> {
    match changes {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
