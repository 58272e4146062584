//! What a backend brings to the [shell](crate::shell): a sans-IO [`ElectionCore`] that decides and
//! a [`Transport`] that performs its calls.
//!
//! Why a module of its own: the cores (record lock, etcd, ZooKeeper), the lifecycle's stop rules
//! and the simulation all speak this interface, and none of them needs the shell's loop; kept
//! apart, the cores sit below the shell instead of beside it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::candidate::Event;
use crate::clock::MonotonicTime;
use crate::command::ElectorError;
use crate::leadership::{Leadership, WaitReason};
use crate::stage::{AfterRelease, Stage};

/// A boxed future of the shell: a call in flight, or a wait for guards.
pub type ShellFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a core tells the shell besides leadership changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// A leadership change ([`Event`]): tenures start and end, a leader is observed, the
    /// coordinator asks for a handover.
    Event(Event),
    /// A store call failed (`what` says which, in the words of the log line).
    Failed {
        /// What was being done: "reading the lock", "granting a lease".
        what: &'static str,
        /// The error, as the log shows it.
        error: String,
    },
    /// The store answered (a compare-and-swap conflict counts): ends a failure streak.
    Reached,
    /// A renew (a record write while leading, an etcd keep-alive, a ZooKeeper heartbeat) that
    /// started at `started` succeeded after `latency`, or failed (`None`).
    Renewed {
        /// When the renew started, on the core's clock.
        started: MonotonicTime,
        /// How long it took; `None` when it failed.
        latency: Option<Duration>,
    },
}

/// The decision half of an elector: a state machine with time passed in and no I/O.
///
/// Why a trait: the record lock ([`crate::Candidate`]), an etcd session and a ZooKeeper session
/// decide differently, but are driven, fenced, drained and published the same way, by
/// [`crate::shell::run`]. Implementations must be deterministic functions of the inputs and times they are
/// given, so that a simulation can replay any schedule.
pub trait ElectionCore: Send + 'static {
    /// A store call the core wants made.
    type Call: Send + 'static;
    /// What comes back: a call's answer, or a notification from the store.
    type Input: Send + 'static;

    /// The candidate's identity.
    fn identity(&self) -> &str;
    /// The election timing (the renew deadline bounds the release).
    fn renew_deadline(&self) -> Duration;
    /// The next call to start at `now` in `stage`, if any; the shell asks until `None`.
    fn poll_call(&mut self, now: MonotonicTime, stage: Stage) -> Option<Self::Call>;
    /// Feeds an answer or a notification that arrived at `now`, in `stage`.
    fn handle(&mut self, now: MonotonicTime, stage: Stage, input: Self::Input);
    /// When the core must be polled again in `stage` if nothing else happens.
    fn poll_timeout(&self, stage: Stage) -> Option<MonotonicTime>;
    /// The next report to publish.
    fn poll_report(&mut self) -> Option<Report>;
    /// Ends the tenure now (the user resigns or shuts down); the lock stays held until
    /// [`ElectionCore::release`], so nobody else leads while the tenure's work stops. The stage
    /// is [`Stage::Draining`] from now on; the core never takes the lock or leads in it.
    fn step_down(&mut self, now: MonotonicTime);
    /// Starts releasing whatever this candidate holds (the stage is [`Stage::Releasing`] from now
    /// on); afterwards it stops or campaigns again as `after` says.
    fn release(&mut self, now: MonotonicTime, after: AfterRelease);
    /// `Some` once the release last asked for is over: `Ok` when released (or nothing was held),
    /// `Err` when the core gave up (the store will let the hold run out).
    fn release_result(&self) -> Option<Result<(), ElectorError>>;
    /// True while the core waits for the guards of ended tenures to be dropped before it lets
    /// go of what those tenures held (after a loss: the next leader must not start while the
    /// lost tenure's work still runs). The shell then calls [`ElectionCore::guards_dropped`].
    fn awaits_guards(&self) -> bool {
        false
    }
    /// Every guard of every tenure ended so far has been dropped.
    fn guards_dropped(&mut self, _now: MonotonicTime) {}
    /// The self-fencing deadline of the tenure held, if leading.
    fn valid_until(&self) -> Option<MonotonicTime>;
    /// The guards' deadline passed before the shell could extend it: end the tenure for good
    /// (the next one must have a new term, S2).
    fn lapse(&mut self);
    /// Who leads as far as this candidate knows, and its own role, at `now` in `stage`.
    fn leadership(&self, now: MonotonicTime, stage: Stage) -> Leadership;
    /// Why this candidate waits on a lock that no live leader holds, and until when.
    fn wait(&self, _now: MonotonicTime, _stage: Stage) -> Option<(WaitReason, MonotonicTime)> {
        None
    }
}

/// The I/O half of an elector: performs a core's calls and delivers the store's notifications.
pub trait Transport<C: ElectionCore>: Send + 'static {
    /// Learns the instant the shell's clock counts from ([`MonotonicTime::ZERO`]), for inputs
    /// that carry a time (when a keep-alive was sent). Called once, before any other method.
    fn attach(&mut self, _origin: Instant) {}
    /// Starts `call`; the future resolves with its answer (a transport applies its own call
    /// timeout). `None`: the call was done here and has no answer (stopping a keep-alive).
    fn start(&mut self, call: C::Call) -> Option<ShellFuture<C::Input>>;
    /// The next notification from the store; pending while there is none.
    fn notice(&mut self) -> impl Future<Output = C::Input> + Send + '_;
    /// The lock or election, for log lines.
    fn describe(&self) -> String;
}
