//! Leader-gated work: run a future only while this replica leads.
//!
//! The seed's loop, done with push instead of polling: Kuryr's controller asked the sidecar every
//! 5 s who led, started its watcher on gaining leadership and stopped it gracefully on losing it.
//! A [`Gate`] starts the user's work on every new tenure, with that tenure's term in hand, tells it
//! to stop the moment the tenure ends, and keeps the replica campaigning afterwards (invariant L3;
//! controller-runtime's manager exits the process instead).
//!
//! How stopping works, per reason (see [`StopReason`]):
//!
//! - **resigned** (`Elector::resign`, `Elector::shutdown`, the elector handle dropped): the
//!   elector still holds the lock and waits for [`Tenure`] guards before releasing it. The work
//!   holds one (in its [`LeaderContext`]), so the lock is released only after the work stopped.
//!   The gate lets it finish for up to its drain timeout, then aborts it; it also aborts it the
//!   moment the elector stops holding the lock (which the elector does after its *own* drain
//!   timeout). The gate's default drain timeout is the elector's default (the renew deadline): the
//!   abort then happens when the elector starts its release write, so the work is gone before any
//!   follower can see the release. Set the gate's drain timeout no longer than the elector's.
//! - **lost** (the lock was taken or deleted, or the session broke): another candidate may lead
//!   already. The work is cancelled and aborted at once.
//! - **fenced** (the renew deadline passed, S1): nobody else can lead before
//!   `valid_until + (lease_duration - renew_deadline)` on this clock, so the work is cancelled and
//!   aborted at the latest then (or at the drain timeout, if earlier).
//! - **shutdown**: [`GateHandle::shutdown`] was called: cancelled, drained, aborted.
//! - **failed** / **finished**: the work returned an error (or panicked) / `Ok(())` while the
//!   tenure was still valid. A failure is restarted after an exponential back-off; after
//!   [`GateBuilder::resign_after_failures`] consecutive failures the replica resigns so another one
//!   tries (Kuryr stepped down on any error). A finished work is started again on the next tenure.
//! - **stuck** (invariant G1, issue 35): with [`GateBuilder::stuck_after`], an operation the work
//!   marked in flight ([`LeaderContext::operation`]: each reconcile of `spawn_controller`, each
//!   handler call of a `GatedWatch`) has not returned within that bound. A renewing leader whose work is dead is
//!   the failure users report most (Cilium's operator kept its lease while its work had stopped).
//!   The gate logs why (WARN, with the term, the operation and how long it has been in flight)
//!   and resigns, the same step-down as after repeated failures: the tenure ends at once, the
//!   work is cancelled and drained as on a resign, the lock is released, and another replica
//!   leads. This replica stays a candidate (L3), and its next tenure starts with no operation in
//!   flight. Only operations count: an idle work (nothing in flight) never gives way, and the
//!   elector's own renews are not measured, so a slow renew never makes a leader give way.
//!
//! The gate holds only an [`ElectorView`], so it never keeps the elector running and ends when the
//! elector stops.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tenure::{Elector, ElectorView, Role, Tenure, Term, Timing};
use tokio::sync::Notify;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{sleep, timeout_at, Instant};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backoff::Backoff;
use crate::metrics::GateMetrics;

/// Why the leader work stopped; the `reason` label of `tenure_ha_work_stops_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The lock was taken by another candidate, deleted, or the session broke.
    Lost,
    /// The self-fencing deadline passed without a successful renew.
    Fenced,
    /// This replica stepped down gracefully (resign, elector shutdown) while holding the lock.
    Resigned,
    /// The gate was shut down through its handle.
    Shutdown,
    /// The work returned an error or panicked while the tenure was valid.
    Failed,
    /// The work returned `Ok(())` while the tenure was valid.
    Finished,
    /// An operation of the work was in flight for [`GateBuilder::stuck_after`]: this replica gave
    /// way (resigned) so that a healthy one leads.
    Stuck,
}

impl StopReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Lost => "lost",
            StopReason::Fenced => "fenced",
            StopReason::Resigned => "resigned",
            StopReason::Shutdown => "shutdown",
            StopReason::Failed => "failed",
            StopReason::Finished => "finished",
            StopReason::Stuck => "stuck",
        }
    }
}

/// What the work gets on each start: the tenure (term, guard) and a token that is cancelled the
/// moment leadership ends.
///
/// Why a guard inside: holding the context holds the [`Tenure`], so a graceful release waits for
/// the work; drop the context (return) when the work has stopped.
#[derive(Debug)]
pub struct LeaderContext {
    tenure: Tenure,
    cancel: CancellationToken,
    timing: Timing,
    attempt: u32,
    operations: Operations,
}

impl LeaderContext {
    /// The fencing term of this tenure: pass it to every write of a protected resource.
    pub fn term(&self) -> Term {
        self.tenure.term()
    }

    /// The tenure guard: `check()` it before each side effect.
    pub fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// Completes when the work must stop (leadership ended, or the gate shuts down).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// True once the work must stop: cancelled, or the tenure is over on this clock although the
    /// gate has not said so yet (a process that was paused past its deadline sees it at once, F1).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled() || !self.tenure.is_valid()
    }

    /// A token cancelled when the work must stop, for sub-tasks.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The elector's timing (e.g. its retry period as a checkpoint flush period).
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// 0 on the first start of this tenure, then the number of restarts after failures.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Marks one operation of the work (a reconcile, a handler call, a sync pass) in flight until
    /// the returned guard is dropped; `what` names it in the log line of a give-way.
    ///
    /// Why: with [`GateBuilder::stuck_after`], an operation still in flight that long means the
    /// work is stuck (a deadlock, a call without a timeout), and the replica gives way so that a
    /// healthy one leads. Only marked operations count, so a work that waits for events with
    /// nothing in flight is idle, not stuck. Without the setting the guard does nothing (and
    /// `what` is not even formatted). The guard may be moved into a sub-task; operations started
    /// in one tenure never count against the next.
    pub fn operation(&self, what: impl Display) -> Operation {
        self.operations.start(what)
    }

    /// Starts operations from where the context is not at hand (a reconciler closure).
    #[cfg(feature = "kube")]
    pub(crate) fn operations(&self) -> Operations {
        self.operations.clone()
    }
}

#[cfg(all(test, feature = "kube"))]
impl LeaderContext {
    /// A context as the gate makes one, for models that play the gate's part.
    pub(crate) fn new(tenure: Tenure, cancel: CancellationToken, timing: Timing) -> LeaderContext {
        LeaderContext { tenure, cancel, timing, attempt: 0, operations: Operations::default() }
    }
}

/// One operation of the leader work in flight, from [`LeaderContext::operation`]: it ends when
/// the guard is dropped (returned, failed, or aborted with the work).
#[derive(Debug)]
#[must_use = "the operation ends when this guard is dropped"]
pub struct Operation {
    tracked: Option<(Arc<InFlight>, u64)>,
}

impl Drop for Operation {
    fn drop(&mut self) {
        if let Some((in_flight, id)) = self.tracked.take() {
            in_flight.end(id);
        }
    }
}

/// Where the operations of one tenure are counted: nowhere without [`GateBuilder::stuck_after`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Operations(Option<Arc<InFlight>>);

impl Operations {
    /// Marks an operation in flight until the guard drops.
    pub(crate) fn start(&self, what: impl Display) -> Operation {
        Operation { tracked: self.0.as_ref().map(|in_flight| (in_flight.clone(), in_flight.start(what.to_string()))) }
    }
}

/// The operations in flight in one tenure, oldest first, and a wake-up for the stuck watch when
/// one starts.
#[derive(Debug, Default)]
struct InFlight {
    state: Mutex<InFlightState>,
    started: Notify,
}

#[derive(Debug, Default)]
struct InFlightState {
    next: u64,
    /// By start order, so the first is the oldest: when it started and what it is.
    operations: BTreeMap<u64, (Instant, String)>,
}

impl InFlight {
    fn state(&self) -> std::sync::MutexGuard<'_, InFlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self, what: String) -> u64 {
        let mut state = self.state();
        let id = state.next;
        state.next += 1;
        state.operations.insert(id, (Instant::now(), what));
        drop(state);
        self.started.notify_one();
        id
    }

    fn end(&self, id: u64) {
        self.state().operations.remove(&id);
    }

    /// Completes once the oldest operation still in flight has been so for `limit`: what it is
    /// and how long it has been in flight. Never while nothing is in flight (an idle work).
    async fn stuck(&self, limit: Duration) -> (String, Duration) {
        loop {
            // Taken before looking, so that an operation started meanwhile wakes us.
            let started = self.started.notified();
            let oldest = self.state().operations.first_key_value().map(|(_, (at, what))| (*at, what.clone()));
            match oldest {
                // A limit past the end of the clock never passes.
                Some((at, what)) => match at.checked_add(limit) {
                    Some(due) if Instant::now() >= due => return (what, at.elapsed()),
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                },
                None => started.await,
            }
        }
    }
}

/// Why a [`GateBuilder`] (or `GatedWatch`) setting was refused when it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// [`GateBuilder::stuck_after`] shorter than the elector's renew period (zero included).
    #[error(
        "stuck_after ({stuck_after:?}) must be at least the elector's renew period ({renew_period:?}): a shorter \
         bound counts ordinary operations as stuck and makes the replica give way tenure after tenure"
    )]
    StuckAfterTooShort {
        /// The bound given.
        stuck_after: Duration,
        /// The elector's renew period ([`Timing::retry_period`]), the shortest bound accepted.
        renew_period: Duration,
    },
}

/// Checks a [`GateBuilder::stuck_after`] bound against the elector's timing.
pub(crate) fn check_stuck_after(stuck_after: Duration, timing: &Timing) -> Result<Duration, GateError> {
    let renew_period = timing.retry_period;
    if stuck_after.is_zero() || stuck_after < renew_period {
        return Err(GateError::StuckAfterTooShort { stuck_after, renew_period });
    }
    Ok(stuck_after)
}

/// The work a gate runs: a function from a [`LeaderContext`] to a future.
type Work<E> = Arc<dyn Fn(LeaderContext) -> futures::future::BoxFuture<'static, Result<(), E>> + Send + Sync>;

/// Builds a [`Gate`]; see [`Gate::builder`].
#[derive(Debug, Clone)]
#[must_use = "a gate runs nothing until it is built"]
pub struct GateBuilder {
    view: ElectorView,
    drain_timeout: Duration,
    backoff: Backoff,
    resign_after_failures: Option<u32>,
    stuck_after: Option<Duration>,
    metrics: GateMetrics,
}

impl GateBuilder {
    setters! {
        /// How long work may finish in-flight handlers after a graceful step-down (resign, shutdown)
        /// before it is aborted. Default: the elector's renew deadline, which is every elector's
        /// default drain timeout; keep it no longer than the elector's.
        drain_timeout: Duration;
        /// Resign after this many consecutive failures in one tenure, so that another replica tries
        /// (and this one campaigns again). Default: never; `0` is treated as 1.
        resign_after_failures: u32 => Some(resign_after_failures.max(1));
        /// Reports into these metrics (e.g. from [`GateMetrics::register`]); default: unregistered.
        metrics: GateMetrics;
    }

    /// Gives way when an operation of the work ([`LeaderContext::operation`]; each reconcile of
    /// `spawn_controller`, each handler call of a `GatedWatch`) has been in flight for `limit`:
    /// the gate logs why at WARN (term, operation, how long), counts a stop with reason `stuck`
    /// (`tenure_ha_work_stops_total{reason="stuck"}`), and resigns as after
    /// [`GateBuilder::resign_after_failures`]: the work is cancelled and drained as on a resign
    /// (up to the drain timeout), the lock is released, another replica leads, and this one stays
    /// a candidate whose next tenure starts with nothing in flight. Another replica leads at the
    /// latest `limit` + the drain timeout (default: the renew deadline, below one lease) + one
    /// release after the operation started.
    ///
    /// Only marked operations are timed: an idle work never gives way, and the elector's renews
    /// are not measured, so a slow renew alone never makes a leader give way (G1).
    ///
    /// Default: off. Why no default: the right bound depends on the work (a reconcile that
    /// provisions a cloud volume may take minutes, a label patch a second), and client-go and
    /// controller-runtime set no such bound either; a bound too short for the slowest healthy
    /// operation would move leadership around for nothing.
    ///
    /// Refused with [`GateError::StuckAfterTooShort`] when `limit` is zero or shorter than the
    /// elector's renew period ([`Timing::retry_period`]), as `tenure elect --progress-timeout`
    /// refuses a silence shorter than one renew interval.
    pub fn stuck_after(mut self, limit: Duration) -> Result<Self, GateError> {
        self.stuck_after = Some(check_stuck_after(limit, self.view.timing())?);
        Ok(self)
    }

    /// Sets a bound already checked against the elector it will run on (`GatedWatch`).
    #[cfg(feature = "kube")]
    pub(crate) fn checked_stuck_after(mut self, limit: Option<Duration>) -> Self {
        self.stuck_after = limit.or(self.stuck_after);
        self
    }

    /// The delay before the first restart after a failure, and the cap of its doubling.
    /// Default: 1 s and 60 s.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(initial, max);
        self
    }

    /// Starts the gate on the current tokio runtime (like `tokio::spawn`, it panics outside one).
    /// `work` is called on every tenure (and every restart); its error type only needs to display.
    pub fn spawn<F, Fut, E>(self, work: F) -> GateHandle
    where
        F: Fn(LeaderContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let work: Work<E> = Arc::new(move |ctx| work(ctx).boxed());
        let stop = CancellationToken::new();
        let metrics = self.metrics.clone();
        let runner = Runner { config: self, work, stop: stop.clone() };
        let task = tokio::spawn(runner.run());
        GateHandle { stop, task: Some(task), metrics }
    }
}

/// Runs a user's future only while this replica leads.
///
/// ```
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::{locks::memory::MemoryStore, Elector};
/// use tenure_ha::gate::Gate;
/// let store = MemoryStore::new();
/// let elector = Elector::builder("replica-a", store.client("replica-a")).spawn()?;
/// let gate = Gate::builder(&elector).spawn(|ctx| async move {
///     println!("leading with term {}", ctx.term());
///     ctx.cancelled().await;            // the watcher would run here, until leadership ends
///     Ok::<_, std::io::Error>(())
/// });
/// // ... later: stop the work, then release the lock (the next replica leads at once)
/// gate.shutdown().await;
/// elector.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Gate;

/// The gate's task: the configuration, the work and the stop signal of its handle.
struct Runner<E> {
    config: GateBuilder,
    work: Work<E>,
    stop: CancellationToken,
}

/// Controls a running gate. Dropping it stops the gate too (in the background).
#[derive(Debug)]
pub struct GateHandle {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
    metrics: GateMetrics,
}

impl GateHandle {
    /// Stops the work (cancel, drain up to the drain timeout, abort) and the gate; the elector
    /// keeps running. Returns when the work has stopped.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        self.stopped().await;
    }

    /// Waits until the gate stops on its own (its elector stopped), without stopping it.
    pub async fn stopped(&mut self) {
        if let Some(task) = self.task.as_mut() {
            if let Err(error) = task.await {
                tracing::error!(%error, "the gate's task failed");
            }
            self.task = None;
        }
    }

    /// The gate's metrics.
    pub fn metrics(&self) -> &GateMetrics {
        &self.metrics
    }

    /// True until the gate has stopped (shut down, or its elector stopped).
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for GateHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What the gate does after a tenure's work stopped.
enum Next {
    /// Wait for the next tenure.
    Campaign,
    /// Resign, then wait for the next tenure.
    Resign,
    /// The gate was shut down.
    Stop,
}

/// How one start of the work ended.
enum Ended {
    Returned(Result<Result<(), String>, JoinError>),
    TenureOver,
    Shutdown,
    /// An operation has been in flight for `stuck_after`: what it is and how long.
    Stuck(String, Duration),
}

impl Gate {
    /// Starts building a gate on `elector`. The gate holds an [`ElectorView`] only: it does not keep
    /// the elector running, and stops when the elector stops.
    pub fn builder(elector: &Elector) -> GateBuilder {
        Gate::builder_on(elector.view())
    }

    /// As [`Gate::builder`], from a view (e.g. one a library was handed).
    pub fn builder_on(view: ElectorView) -> GateBuilder {
        let drain_timeout = view.timing().renew_deadline;
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let metrics = GateMetrics::default();
        GateBuilder { view, drain_timeout, backoff, resign_after_failures: None, stuck_after: None, metrics }
    }
}

impl<E: std::fmt::Display + Send + 'static> Runner<E> {
    async fn run(self) {
        let view = self.config.view.clone();
        loop {
            let tenure = tokio::select! {
                tenure = view.acquired() => match tenure {
                    Ok(tenure) => tenure,
                    Err(_) => break, // the elector stopped: so does the gate
                },
                _ = self.stop.cancelled() => break,
            };
            match self.lead(tenure).await {
                Next::Campaign => {}
                Next::Resign => step_down(view.clone(), StopReason::Failed).await,
                Next::Stop => break,
            }
        }
        tracing::debug!(identity = view.identity(), "gate stopped");
    }

    /// Runs the work for one tenure, restarting it after failures, until the tenure ends.
    async fn lead(&self, tenure: Tenure) -> Next {
        let config = &self.config;
        let metrics = &config.metrics;
        let mut failures = 0u32;
        let mut attempt = 0u32;
        // The operations of this tenure only: the next one starts with nothing in flight.
        let in_flight = config.stuck_after.map(|_| Arc::new(InFlight::default()));
        loop {
            let cancel = CancellationToken::new();
            let timing = *config.view.timing();
            let operations = Operations(in_flight.clone());
            let ctx = LeaderContext { tenure: tenure.clone(), cancel: cancel.clone(), timing, attempt, operations };
            tracing::info!(term = tenure.term().0, attempt, "starting leader work");
            metrics.starts.inc();
            metrics.running.set(1);
            let started = Instant::now();
            let work = (self.work)(ctx).map(|result| result.map_err(|e| e.to_string()));
            let mut task = tokio::spawn(work);
            let stuck = async {
                match (&in_flight, config.stuck_after) {
                    (Some(in_flight), Some(limit)) => in_flight.stuck(limit).await,
                    _ => std::future::pending().await,
                }
            };
            let ended = tokio::select! {
                biased;
                result = &mut task => Ended::Returned(result),
                _ = tenure.ended() => Ended::TenureOver,
                _ = self.stop.cancelled() => Ended::Shutdown,
                (what, age) = stuck => Ended::Stuck(what, age),
            };
            let (ended, gave_way) = match ended {
                Ended::Stuck(what, age) if tenure.is_valid() => {
                    self.give_way(tenure.term(), &what, age);
                    // The resign ends the tenure at once; from here on the work stops as on a
                    // resign (cancelled, drained, aborted, and then the lock is released).
                    let ended = tokio::select! {
                        _ = tenure.ended() => Ended::TenureOver,
                        _ = self.stop.cancelled() => Ended::Shutdown,
                    };
                    (ended, true)
                }
                // Past its deadline on this clock (a paused process): the tenure's end is what
                // happened, not a stuck operation.
                Ended::Stuck(..) => (Ended::TenureOver, false),
                ended => (ended, false),
            };
            let outcome = match ended {
                Ended::Returned(result) if tenure.is_valid() => result,
                Ended::Returned(result) => {
                    // The work ended because the tenure did (it checked its term and returned):
                    // count the tenure's end, not a failure.
                    metrics.running.set(0);
                    let reason = self.why_it_ended(&tenure).await;
                    if let Err(message) = flatten(result) {
                        tracing::info!(term = tenure.term().0, %message, "leader work returned after leadership ended");
                    }
                    self.stopped(tenure.term(), reason, Duration::ZERO, false);
                    return self.wait_for_end(tenure).await;
                }
                Ended::TenureOver | Ended::Shutdown | Ended::Stuck(..) => {
                    cancel.cancel();
                    let reason = match ended {
                        Ended::Shutdown => StopReason::Shutdown,
                        _ => self.why_it_ended(&tenure).await,
                    };
                    let deadline = self.abort_deadline(reason, &tenure);
                    let term = tenure.term();
                    drop(tenure); // the work's guard is the one the elector waits for
                    let (drained, aborted) = self.drain(task, deadline, reason).await;
                    // Counted once, as why the work stopped: the give-way, whichever way the
                    // resign it started ended the tenure.
                    let counted = if gave_way && reason != StopReason::Shutdown { StopReason::Stuck } else { reason };
                    self.stopped(term, counted, drained, aborted);
                    return if reason == StopReason::Shutdown { Next::Stop } else { Next::Campaign };
                }
            };
            match flatten(outcome) {
                Ok(()) => {
                    tracing::info!(term = tenure.term().0, "leader work finished; it starts again on the next tenure");
                    self.stopped(tenure.term(), StopReason::Finished, Duration::ZERO, false);
                    return self.wait_for_end(tenure).await;
                }
                Err(message) => {
                    tracing::error!(term = tenure.term().0, attempt, error = %message, "leader work failed");
                    self.stopped(tenure.term(), StopReason::Failed, Duration::ZERO, false);
                    // A run longer than the back-off cap went well for a while: start over.
                    failures = if started.elapsed() >= config.backoff.max { 1 } else { failures + 1 };
                    if config.resign_after_failures.is_some_and(|limit| failures >= limit) {
                        tracing::warn!(term = tenure.term().0, failures, "resigning so that another replica tries");
                        return Next::Resign;
                    }
                    let delay = config.backoff.delay(failures);
                    tracing::info!(term = tenure.term().0, ?delay, "restarting leader work after back-off");
                    tokio::select! {
                        _ = sleep(delay) => {}
                        _ = tenure.ended() => return Next::Campaign,
                        _ = self.stop.cancelled() => return Next::Stop,
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// After the work finished early: hold no guard, wait until the tenure ends (or shutdown).
    async fn wait_for_end(&self, tenure: Tenure) -> Next {
        let ended = tenure.cancellation_token();
        drop(tenure);
        tokio::select! {
            _ = ended.cancelled() => Next::Campaign,
            _ = self.stop.cancelled() => Next::Stop,
        }
    }

    /// An operation has been in flight for `stuck_after`: says why at WARN, and resigns in the
    /// background (the resign completes only once the work's guards are gone, which the caller
    /// sees to).
    fn give_way(&self, term: Term, what: &str, age: Duration) {
        let stuck_after = self.config.stuck_after.unwrap_or_default();
        tracing::warn!(
            term = term.0,
            operation = what,
            in_flight_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
            stuck_after_ms = u64::try_from(stuck_after.as_millis()).unwrap_or(u64::MAX),
            "giving way: an operation of the leader work has not returned within stuck_after; stopping the work and \
             resigning so that another replica leads"
        );
        tokio::spawn(step_down(self.config.view.clone(), StopReason::Stuck));
    }

    /// Counts a stop and logs it at INFO, the counterpart of "starting leader work": the term,
    /// why (`lost`, `fenced`, `resigned`, `shutdown`, `failed`, `finished`, `stuck`), how long the
    /// work took to stop and whether it had to be aborted (it outlived its drain deadline).
    fn stopped(&self, term: Term, reason: StopReason, drained: Duration, aborted: bool) {
        tracing::info!(
            term = term.0,
            reason = reason.as_str(),
            drained_ms = u64::try_from(drained.as_millis()).unwrap_or(u64::MAX),
            aborted,
            "leader work stopped"
        );
        let metrics = &self.config.metrics;
        metrics.running.set(0);
        metrics.stops.get_or_create(&[("reason", reason.as_str())]).inc();
        if !drained.is_zero()
            || matches!(reason, StopReason::Lost | StopReason::Fenced | StopReason::Resigned | StopReason::Stuck)
        {
            metrics.drain_seconds.observe(drained.as_secs_f64());
        }
    }

    /// Classifies the end of `tenure`: past its deadline it fenced itself; otherwise the elector's
    /// snapshot says whether it is releasing the lock (a graceful step-down) or lost it.
    async fn why_it_ended(&self, tenure: &Tenure) -> StopReason {
        if Instant::now() >= tenure.valid_until() {
            return StopReason::Fenced;
        }
        let term = tenure.term();
        let mut leadership = self.config.view.subscribe();
        // The elector ends the tenure and publishes the snapshot in one step; on a multi-threaded
        // runtime this task may wake in between, so wait (briefly) for the snapshot.
        let limit = Instant::now() + self.config.view.timing().retry_period;
        let seen = timeout_at(limit, leadership.wait_for(|l| l.role != Role::Leader || l.term != Some(term))).await;
        let releasing = matches!(seen, Ok(Ok(snapshot)) if snapshot.role == Role::Releasing);
        if releasing { StopReason::Resigned } else { StopReason::Lost }
    }

    /// When the work must be gone at the latest, by the reason the tenure ended.
    fn abort_deadline(&self, reason: StopReason, tenure: &Tenure) -> Instant {
        let now = Instant::now();
        let drain = now + self.config.drain_timeout;
        let timing = self.config.view.timing();
        match reason {
            StopReason::Lost => now,
            // The earliest another candidate may take over: one lease after our last renew, which
            // started `renew_deadline` before `valid_until`.
            StopReason::Fenced => {
                drain.min(tenure.valid_until() + timing.lease_duration.saturating_sub(timing.renew_deadline))
            }
            _ => drain,
        }
    }

    /// Waits for the cancelled work until `deadline`, then aborts it; on a graceful step-down it
    /// also aborts it the moment the elector no longer holds the lock. Returns how long it took
    /// and whether the work was aborted.
    async fn drain(
        &self,
        mut task: JoinHandle<Result<(), String>>,
        deadline: Instant,
        reason: StopReason,
    ) -> (Duration, bool) {
        let started = Instant::now();
        let mut leadership = self.config.view.subscribe();
        let released = async {
            if reason == StopReason::Resigned {
                let _ = leadership.wait_for(|l| l.role != Role::Releasing).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let finished = tokio::select! {
            result = &mut task => Some(result),
            _ = tokio::time::sleep_until(deadline) => None,
            _ = released => None,
        };
        let aborted = finished.is_none();
        match finished {
            Some(result) => {
                if let Err(message) = flatten(result) {
                    tracing::info!(reason = reason.as_str(), %message, "leader work stopped with an error");
                }
            }
            None => {
                // A lost tenure allows no drain: aborting at once is the rule, not a late work.
                if deadline > started {
                    tracing::warn!(reason = reason.as_str(), "leader work did not stop in time; aborting it");
                }
                task.abort();
                let _ = task.await; // completes once the work's future (and its guard) is dropped
            }
        }
        (started.elapsed(), aborted)
    }
}

/// Resigns so that another replica leads (after repeated failures, or a stuck operation): the one
/// way the gate gives up leadership. The elector ends the tenure, waits for the work's guards (up
/// to its drain timeout), releases the lock and campaigns again after one lease (L3).
async fn step_down(view: ElectorView, why: StopReason) {
    if let Err(error) = view.resign().await {
        tracing::warn!(%error, why = why.as_str(), "resigning so that another replica leads did not complete");
    }
}

/// One error message for a work's error or panic.
fn flatten(result: Result<Result<(), String>, JoinError>) -> Result<(), String> {
    match result {
        Ok(outcome) => outcome,
        Err(error) if error.is_panic() => {
            let panic = error.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            Err(format!("panicked: {message}"))
        }
        Err(error) => Err(format!("task failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tenure::locks::memory::MemoryStore;
    use tokio::time::timeout;

    use super::*;

    /// The log lines written while a test runs (this thread's subscriber only).
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        /// Captures this thread's log lines until the returned guard is dropped.
        fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
            let lines = Lines::default();
            let writer = lines.clone();
            let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
            (lines, tracing::subscriber::set_default(subscriber))
        }

        /// Waits until `count` lines contain every one of `parts`.
        async fn until(&self, count: usize, parts: &[&str]) {
            let found = || {
                let text = String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
                text.lines().filter(|line| parts.iter().all(|part| line.contains(part))).count() >= count
            };
            let waited = timeout(Duration::from_secs(10), async {
                while !found() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            assert!(
                waited.await.is_ok(),
                "no log line with {parts:?}:\n{}",
                String::from_utf8_lossy(&self.0.lock().unwrap())
            );
        }
    }

    #[tokio::test]
    async fn leader_work_stopping_is_logged_at_info_with_its_term_and_reason() {
        let (lines, _logging) = Lines::capture();
        let store = MemoryStore::new();
        let elector = Elector::builder("replica-a", store.client("replica-a")).spawn().expect("an elector");
        let work = |ctx: LeaderContext| async move {
            ctx.cancelled().await;
            Ok::<_, std::io::Error>(())
        };

        let gate = Gate::builder(&elector).spawn(work);
        lines.until(1, &["INFO", "starting leader work", "term=1"]).await;
        gate.shutdown().await;
        lines.until(1, &["INFO", "leader work stopped", "term=1", "reason=\"shutdown\"", "aborted=false"]).await;

        let gate = Gate::builder(&elector).spawn(work);
        lines.until(2, &["INFO", "starting leader work", "term=1"]).await;
        elector.resign().await.expect("resigned");
        lines.until(1, &["INFO", "leader work stopped", "term=1", "reason=\"resigned\""]).await;
        gate.shutdown().await;
        elector.shutdown().await.expect("stopped");
    }

    /// Issue 35 (G1): giving way says why at WARN, with the term, the operation and how long it
    /// was in flight, and the stop it causes is counted as `stuck`.
    #[tokio::test(start_paused = true)]
    async fn giving_way_is_logged_at_warn_with_the_term_the_operation_and_how_long() {
        let (lines, _logging) = Lines::capture();
        let store = MemoryStore::new();
        let elector = Elector::builder("replica-a", store.client("replica-a")).spawn().expect("an elector");
        let work = |ctx: LeaderContext| async move {
            let _sync = ctx.operation(format_args!("sync of term {}", ctx.term()));
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        };
        // Both within the log wait's 10 s (of virtual time).
        let gate = Gate::builder(&elector)
            .drain_timeout(Duration::from_secs(1))
            .stuck_after(Duration::from_secs(5))
            .expect("a valid bound")
            .spawn(work);
        let warning = ["WARN", "giving way", "term=1", "operation=\"sync of term 1\"", "in_flight_ms=5000"];
        lines.until(1, &[&warning[..], &["stuck_after_ms=5000"]].concat()).await;
        lines.until(1, &["INFO", "leader work stopped", "term=1", "reason=\"stuck\"", "aborted=true"]).await;
        assert_eq!(gate.metrics().stops_for("stuck"), 1);
        assert_eq!(gate.metrics().stops_for("resigned"), 0, "one stop, counted as the give-way");
        gate.shutdown().await;
        elector.shutdown().await.expect("stopped");
    }

    #[test]
    fn operations_without_a_bound_are_not_tracked() {
        let guard = Operations::default().start("anything");
        assert!(guard.tracked.is_none());
    }

    /// Issue 30: a lost tenure's work is aborted at once by design; that is no late work to warn of.
    #[tokio::test]
    async fn an_abort_at_once_after_a_loss_is_not_warned_of_as_a_work_that_did_not_stop() {
        let (lines, _logging) = Lines::capture();
        let store = MemoryStore::new();
        let elector = Elector::builder("replica-a", store.client("replica-a")).spawn().expect("an elector");
        // A handler in flight, deaf to the cancellation: it must be aborted.
        let work = |_ctx: LeaderContext| async move {
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(())
        };
        let gate = Gate::builder(&elector).drain_timeout(Duration::from_millis(10)).spawn(work);
        lines.until(1, &["INFO", "starting leader work", "term=1"]).await;
        store.delete();
        lines.until(1, &["INFO", "leader work stopped", "term=1", "reason=\"lost\"", "aborted=true"]).await;
        let text = String::from_utf8_lossy(&lines.0.lock().unwrap()).into_owned();
        assert!(!text.contains("did not stop in time"), "{text}");
        gate.shutdown().await;
        elector.shutdown().await.expect("stopped");
    }
}
