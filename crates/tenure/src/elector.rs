//! The [`Elector`] handle users hold, and its builder for record locks (whose core, a
//! [`Candidate`], [`crate::shell`] runs on tokio).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::candidate::Candidate;
pub use crate::command::{ElectorCommand, ElectorError};
use crate::leadership::{Leadership, Publisher, Subscriber, Tenure};
use crate::lock::RecordLock;
use crate::record_core::{RecordCore, RecordTransport};
use crate::term::Term;
use crate::timing::Timing;

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
#[must_use = "an elector starts only when spawned"]
pub struct ElectorBuilder {
    identity: String,
    lock: Arc<dyn RecordLock>,
    timing: Timing,
    /// `None`: the renew deadline of the timing in force when spawned.
    drain_timeout: Option<Duration>,
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
        self.drain_timeout = Some(drain_timeout);
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
        let transport = RecordTransport::new(self.lock, self.timing.call_timeout);
        let seed = self.seed.unwrap_or_else(rand::random);
        let mut candidate = Candidate::new(self.identity.clone(), self.timing, transport.is_watching(), seed);
        if self.coordinated {
            candidate = candidate.coordinated();
        }
        // The shell's clock starts when it runs, a moment later: a few microseconds off in the
        // record's informational times.
        let core = RecordCore::new(candidate, chrono::Utc::now());
        let drain_timeout = self.drain_timeout.unwrap_or(self.timing.renew_deadline);
        Ok(Elector::from_driver(self.identity, self.timing, move |publisher, commands| {
            crate::shell::run(core, transport, publisher, drain_timeout, commands)
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

impl Elector {
    /// Starts building a candidate named `identity` on `lock`.
    pub fn builder(identity: impl Into<String>, lock: impl RecordLock) -> ElectorBuilder {
        let (timing, identity, lock) = (Timing::default(), identity.into(), Arc::new(lock));
        ElectorBuilder { identity, lock, timing, drain_timeout: None, seed: None, coordinated: false }
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

    /// Gives up leadership if held: ends the tenure, waits for its guards (up to the drain
    /// timeout), releases the lock so another candidate takes over at once, and stays a candidate
    /// that will not take the lock back for one lease unless nobody else does.
    pub async fn resign(&self) -> Result<(), ElectorError> {
        resign_through(&self.commands).await
    }

    /// A cloneable view of this elector that does not keep it running: see [`ElectorView`].
    pub fn view(&self) -> ElectorView {
        let (identity, subscriber) = (self.identity.clone(), self.subscriber.clone());
        ElectorView { identity, timing: self.timing, subscriber, commands: self.commands.downgrade() }
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

/// The accessors an [`Elector`] and its [`ElectorView`]s share, written once.
macro_rules! shared_accessors {
    ($($handle:ty),*) => {$(
        impl $handle {
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

            /// Waits until this instance leads and returns the guard of its tenure;
            /// [`ElectorError::Stopped`] once the elector has stopped.
            pub async fn acquired(&self) -> Result<Tenure, ElectorError> {
                self.subscriber.acquired().await.ok_or(ElectorError::Stopped)
            }
        }
    )*};
}
shared_accessors!(Elector, ElectorView);

impl ElectorView {
    /// Resigns as [`Elector::resign`] does; [`ElectorError::Stopped`] if the elector is gone.
    pub async fn resign(&self) -> Result<(), ElectorError> {
        let commands = self.commands.upgrade().ok_or(ElectorError::Stopped)?;
        resign_through(&commands).await
    }
}
