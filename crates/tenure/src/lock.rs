//! The storage side of an election on a store with compare-and-swap but no server-side expiry
//! (Kubernetes objects, a file, memory). One elector serves them all through [`RecordLock`].

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;

use crate::record::{LeaderElectionRecord, RecordError};

/// An opaque version of the stored record, compared for equality only: Kubernetes'
/// `resourceVersion`, the file lock's generation counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(pub String);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a lock holds at one version: a record, or content that is not one (a corrupt or foreign
/// record, which the elector treats as held by an unknown holder).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRecord {
    /// The version to pass to [`RecordLock::update`].
    pub version: Version,
    /// The record, or why the content is not a record.
    pub record: Result<LeaderElectionRecord, RecordError>,
}

/// Why a call to a lock failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LockError {
    /// Compare-and-swap failed: the record changed (or was deleted) since the given version.
    #[error("the record changed since it was read (compare-and-swap failed)")]
    Conflict,
    /// Create failed because the record exists.
    #[error("the record already exists")]
    AlreadyExists,
    /// The store could not be reached or failed; the write may or may not have been applied.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The call did not finish within the call timeout; it may or may not have been applied.
    #[error("call timed out after {0:?}")]
    Timeout(Duration),
    /// The store refused the request for a reason retrying will not fix (permissions, a bad
    /// name); the elector keeps retrying anyway, but logs it loudly.
    #[error("store rejected the request: {0}")]
    Rejected(String),
}

impl LockError {
    /// True when the write certainly did not happen because somebody else's did.
    pub fn is_conflict(&self) -> bool {
        matches!(self, LockError::Conflict | LockError::AlreadyExists)
    }
}

/// Notifications of changes to the record: each item is the record as it is after a change
/// (`None` once deleted). A stream that fails or ends is re-opened by the elector after a retry
/// period; it may repeat a state it already delivered.
pub type ChangeStream = Pin<Box<dyn Stream<Item = Result<Option<StoredRecord>, LockError>> + Send>>;

/// A place that stores one leader election record with compare-and-swap.
///
/// Why a trait this small: the client-go algorithm needs exactly these four operations, so a new
/// store (a Kubernetes kind, a file, a test double) is a few dozen lines, and every correctness
/// rule lives once, in the elector.
#[async_trait]
pub trait RecordLock: Send + Sync + 'static {
    /// Where the lock lives, for logs and errors (`file:///run/tenure/x`, `kube://ns/leases/x`).
    fn describe(&self) -> String;

    /// Reads the record; `None` when it does not exist.
    async fn get(&self) -> Result<Option<StoredRecord>, LockError>;

    /// Creates the record; [`LockError::AlreadyExists`] if it exists.
    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError>;

    /// Replaces the record if it is still at `expected`; [`LockError::Conflict`] otherwise.
    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError>;

    /// Change notifications, if the store can push them. Followers then react to a release the
    /// moment it happens and make no requests while they wait. `None` makes them poll.
    fn watch(&self) -> Option<ChangeStream> {
        None
    }
}

#[async_trait]
impl<L: RecordLock + ?Sized> RecordLock for std::sync::Arc<L> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        (**self).get().await
    }
    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        (**self).create(record).await
    }
    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        (**self).update(expected, record).await
    }
    fn watch(&self) -> Option<ChangeStream> {
        (**self).watch()
    }
}
