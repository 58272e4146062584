//! The one lifecycle every elector shares: a backend's sans-IO core, driven on tokio.
//!
//! Why one shell: what an elector does around its store is the same on every backend, and each
//! copy of it is a place for a safety defect to hide. The shell owns it once:
//!
//! - **commands**: resign and shutdown from the [`crate::Elector`] handle, answered when done;
//! - **drain, then release**: the tenure ends at once, its [`Tenure`](crate::Tenure) guards get
//!   up to the drain timeout to be dropped, then the core releases (bounded by the renew
//!   deadline): the rules of [`crate::lifecycle`], which the simulation drives too;
//! - **self-fencing**: every deadline the core reports is handed to the guards, and a deadline
//!   that passed before the shell could extend it ends the tenure for good ([`ElectionCore::lapse`]);
//! - **publishing**: tenure guards, [`crate::Leadership`] snapshots, why a candidate waits, and one log
//!   line per change of leader, in the same words on every backend;
//! - **the failure log** (one warning per streak of failed store calls) and the stats behind
//!   `/status`, `/metrics` and the probes.
//!
//! A backend brings only what differs: an [`ElectionCore`] that decides (time is passed in, so
//! the simulation can drive it with any interleaving) and a [`Transport`] that performs the
//! core's calls and delivers the store's notifications.
//!
//! Call order, each turn of the loop: [`ElectionCore::poll_call`] until `None` (every call is
//! started at once; calls run concurrently), then the core's reports ([`ElectionCore::poll_report`])
//! and its leadership are published; then the shell sleeps until a call answers, the transport
//! delivers a notification, [`ElectionCore::poll_timeout`] passes, a command arrives, or the guards
//! the shell waits for are dropped, and hands that to the core.

use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep_until, Instant};

use crate::candidate::{Event, StopReason};
use crate::stage::AfterRelease;
use crate::clock::MonotonicTime;
use crate::command::{ElectorCommand, ElectorError};
pub use crate::election_core::{ElectionCore, Report, ShellFuture, Transport};
use crate::failure_log::FailureLog;
use crate::leadership::{LockWait, Publisher};
use crate::lifecycle::{Lifecycle, StopAction};

/// "Never", far enough from `Instant`'s limits that adding it cannot overflow: caps the instants
/// derived from untrusted input (a foreign record's lease) and from user settings.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Runs `core` over `transport` until shutdown (or until every handle is dropped): the body of
/// every elector's background task.
pub async fn run<C: ElectionCore, T: Transport<C>>(
    core: C,
    transport: T,
    publisher: Publisher,
    drain_timeout: Duration,
    commands: mpsc::Receiver<ElectorCommand>,
) {
    tracing::debug!(identity = core.identity(), lock = %transport.describe(), "campaigning");
    let origin = Instant::now();
    let mut transport = transport;
    transport.attach(origin);
    let mut shell = Shell {
        origin,
        core,
        transport,
        publisher,
        drain_timeout,
        failures: FailureLog::new(),
        handover_requested: false,
        calls: FuturesUnordered::new(),
        guards: None,
        lifecycle: Lifecycle::default(),
        reply: None,
    };
    shell.run(commands).await;
    shell.publisher.end_tenure();
    let now = shell.now();
    shell.publish(now);
    tracing::debug!(identity = shell.core.identity(), "stopped");
}

type Reply = Option<oneshot::Sender<Result<(), ElectorError>>>;

/// Why the shell woke up.
enum Wake<I> {
    Input(I),
    Timer,
    Command(Option<ElectorCommand>),
    GuardsDropped,
}

struct Shell<C: ElectionCore, T> {
    origin: Instant,
    core: C,
    transport: T,
    publisher: Publisher,
    drain_timeout: Duration,
    failures: FailureLog,
    /// The coordinator asked for a graceful handover: step down as a resign would.
    handover_requested: bool,
    calls: FuturesUnordered<ShellFuture<C::Input>>,
    /// Completes once every guard of the tenures ended so far is dropped.
    guards: Option<ShellFuture<()>>,
    /// A resign, shutdown or handover in progress.
    lifecycle: Lifecycle,
    /// Who waits for the stop in progress to end.
    reply: Reply,
}

impl<C: ElectionCore, T: Transport<C>> Shell<C, T> {
    fn now(&self) -> MonotonicTime {
        MonotonicTime(self.origin.elapsed())
    }

    fn instant(&self, time: MonotonicTime) -> Instant {
        self.origin + time.0.min(FAR_FUTURE)
    }

    async fn run(&mut self, mut commands: mpsc::Receiver<ElectorCommand>) {
        let mut commands_open = true;
        loop {
            let now = self.now();
            self.start_calls(now);
            self.publish(now);
            if std::mem::take(&mut self.handover_requested) && self.lifecycle.stopping().is_none() {
                self.begin_stop(AfterRelease::Campaign, None);
            }
            match self.advance_stop() {
                Some(AfterRelease::Stop) => return,
                // Campaigning again: the core decides anew in its new stage before the shell sleeps.
                Some(AfterRelease::Campaign) => continue,
                None => {}
            }
            if self.core.awaits_guards() {
                self.wait_for_guards();
            }

            let stage = self.lifecycle.stage();
            let timer = self.core.poll_timeout(stage).into_iter().chain(self.lifecycle.deadline()).min();
            let timer = timer.map(|t| self.instant(t));
            let calling = !self.calls.is_empty();
            let stopping = self.lifecycle.stopping().is_some();
            let wake = tokio::select! {
                Some(input) = self.calls.next(), if calling => Wake::Input(input),
                input = self.transport.notice() => Wake::Input(input),
                _ = sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => Wake::Timer,
                command = commands.recv(), if commands_open && !stopping => Wake::Command(command),
                _ = async { self.guards.as_mut().expect("guarded by precondition").await }, if self.guards.is_some() => Wake::GuardsDropped,
            };
            let now = self.now();
            match wake {
                Wake::Input(input) => self.core.handle(now, self.lifecycle.stage(), input),
                Wake::Timer => {}
                Wake::Command(command) => {
                    // Commands are only received while the channel is open: None closes it.
                    commands_open = command.is_some();
                    let (after, reply) = match command {
                        Some(ElectorCommand::Resign(reply)) => (AfterRelease::Campaign, Some(reply)),
                        Some(ElectorCommand::Shutdown(reply)) => (AfterRelease::Stop, Some(reply)),
                        None => (AfterRelease::Stop, None),
                    };
                    self.begin_stop(after, reply);
                }
                Wake::GuardsDropped => {
                    self.guards = None;
                    self.core.guards_dropped(now);
                }
            }
        }
    }

    fn start_calls(&mut self, now: MonotonicTime) {
        while let Some(call) = self.core.poll_call(now, self.lifecycle.stage()) {
            self.calls.extend(self.transport.start(call));
        }
    }

    /// Steps down and starts draining: the tenure ends now, the core releases once the guards
    /// are dropped (or the drain timeout passes).
    fn begin_stop(&mut self, after: AfterRelease, reply: Reply) {
        let now = self.now();
        if self.lifecycle.begin(&mut self.core, now, after, self.drain_timeout) {
            self.reply = reply;
            self.publish(now);
            self.wait_for_guards();
        }
    }

    /// Moves a stop along ([`Lifecycle::poll`]). What the stop was for, once it is over.
    fn advance_stop(&mut self) -> Option<AfterRelease> {
        let now = self.now();
        while let Some(action) = self.lifecycle.poll(&mut self.core, now, self.guards.is_some()) {
            match action {
                StopAction::Released => {
                    self.start_calls(now);
                    self.publish(now);
                }
                StopAction::Finished { after, result } => {
                    if let Some(reply) = self.reply.take() {
                        let _ = reply.send(result);
                    }
                    return Some(after);
                }
            }
        }
        None
    }

    /// Arms the wait for the guards of the tenures ended so far, unless it is armed.
    fn wait_for_guards(&mut self) {
        if self.guards.is_none() {
            self.guards = Some(Box::pin(self.publisher.wait_for_ended_tenures()));
        }
    }

    /// Ends the current tenure; an armed wait for guards then waits for its guards too.
    fn end_tenure(&mut self) {
        self.publisher.end_tenure();
        if let Some(earlier) = self.guards.take() {
            let newly_ended = self.publisher.wait_for_ended_tenures();
            self.guards = Some(Box::pin(async move {
                earlier.await;
                newly_ended.await;
            }));
        }
    }

    /// Turns the core's reports into tenure guards, counters, log lines and a leadership snapshot.
    fn publish(&mut self, now: MonotonicTime) {
        self.publish_reports();
        self.publisher.prune_ended();
        if let Some(valid_until) = self.core.valid_until() {
            // The publisher refuses when the guards' deadline passed before this renew was
            // handled (a late wake-up): the tenure is over for good, and the core must lead
            // again only under a new term.
            if !self.publisher.extend_tenure(self.instant(valid_until)) {
                self.core.lapse();
                self.publish_reports();
            }
        }
        self.publisher.publish(self.core.leadership(now, self.lifecycle.stage()));
        self.publish_wait(now);
    }

    fn publish_reports(&mut self) {
        while let Some(report) = self.core.poll_report() {
            let identity = self.core.identity();
            let recorder = self.publisher.recorder();
            match report {
                Report::Failed { what, error } => self.failures.failed(recorder, identity, what, &error),
                Report::Reached => self.failures.reached(recorder, identity),
                Report::Renewed { started, latency } => recorder.record_renew(self.instant(started), latency.ok_or(())),
                Report::Event(event) => self.publish_event(event),
            }
        }
    }

    fn publish_event(&mut self, event: Event) {
        let identity = self.core.identity().to_owned();
        match event {
            Event::StartedLeading { term } => {
                let valid_until = self.core.valid_until().unwrap_or_default();
                self.publisher.start_tenure(term, self.instant(valid_until));
                tracing::info!(identity = %identity, term = term.0, "started leading");
            }
            Event::StoppedLeading { term, reason } => {
                self.end_tenure();
                let reason = match reason {
                    StopReason::RenewDeadlineExceeded => "renew deadline exceeded",
                    StopReason::LockLost => "lock taken by another holder or deleted",
                    StopReason::SteppedDown => "stepped down",
                };
                tracing::info!(identity = %identity, term = term.0, reason, "stopped leading");
            }
            Event::HandoverRequested { term, to } => {
                let message = "the coordinator prefers another candidate: handing over (drain, then release)";
                tracing::info!(identity = %identity, term = term.0, preferred = %to, "{message}");
                self.handover_requested = true;
            }
            Event::LeaderObserved { leader, term } => {
                let leader = leader.as_deref().unwrap_or("");
                tracing::info!(identity = %identity, leader, term = term.map(|t| t.0), "leader observed");
            }
        }
    }

    /// Publishes (and logs, when it changes) why this candidate waits on a lock that is not a
    /// live leader's, and until when.
    fn publish_wait(&mut self, now: MonotonicTime) {
        let wait = self.core.wait(now, self.lifecycle.stage()).map(|(reason, until)| {
            let remaining = until.0.saturating_sub(now.0);
            let until_wall =
                std::time::SystemTime::now().checked_add(remaining).unwrap_or_else(std::time::SystemTime::now);
            LockWait { reason, until: self.instant(until), until_wall }
        });
        if self.publisher.set_wait(wait) {
            let identity = self.core.identity();
            if let Some(wait) = wait.filter(|w| w.reason.is_open_ended()) {
                tracing::info!(identity, "not taking the lock: {}", wait.reason.describe());
            } else if let Some(wait) = wait {
                let until = chrono::DateTime::<chrono::Utc>::from(wait.until_wall);
                let until = until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let in_seconds = wait.until.saturating_duration_since(Instant::now()).as_secs_f64().round();
                let reason = wait.reason.describe();
                tracing::info!(identity, %until, in_seconds, "waiting before taking the lock: {reason}");
            }
        }
    }
}
