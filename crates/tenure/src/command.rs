//! What an [`Elector`](crate::Elector) handle asks of the task that runs its election, and why an
//! elector can fail.
//!
//! Why a module of its own: the handle, the shell that answers it, the lifecycle and every core
//! use these two types; below all of them, they tie none of them to another.

use tokio::sync::oneshot;

use crate::timing::TimingError;

/// Why an elector could not be built or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ElectorError {
    /// The identity is empty; candidates must be told apart.
    #[error("the identity of a candidate must not be empty")]
    EmptyIdentity,
    /// The timing breaks a rule (see [`crate::Timing::validate`]).
    #[error("invalid timing: {0}")]
    Timing(#[from] TimingError),
    /// The elector's task is gone (it was shut down).
    #[error("the elector has stopped")]
    Stopped,
    /// Shutdown gave up before the release was written; followers take over when the lease ends.
    #[error("the lock could not be released in time; followers take over when the lease runs out")]
    ReleaseTimedOut,
}

/// A request from an [`crate::Elector`] handle to the driver that runs the election. Public so that
/// native electors (etcd, ZooKeeper) can be driven by the same handle; see [`crate::Elector::from_driver`].
#[derive(Debug)]
pub enum ElectorCommand {
    /// Step down if leading (end the tenure, wait for its guards up to the drain timeout, release)
    /// and stay a candidate. Answer when done.
    Resign(oneshot::Sender<Result<(), ElectorError>>),
    /// Step down if leading, release, and stop the driver. Answer when done. A closed command
    /// channel (every handle dropped) means the same, with nobody to answer.
    Shutdown(oneshot::Sender<Result<(), ElectorError>>),
}
