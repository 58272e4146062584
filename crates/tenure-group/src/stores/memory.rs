//! An in-process group store, with per-client request counts and outages on command.
//!
//! Why it exists: the driver's tests and the benchmark need a store whose every call can be
//! counted (requests per member per minute) and which can become unreachable for one member
//! exactly when a test says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::{broadcast, watch};

use crate::store::{Change, ChangeStream, GroupStore, Key, RecordStream, Snapshot, StoreError, Stored, Value, Version};

/// How many pushed changes a slow member may fall behind before it is told to read a snapshot.
const CHANGE_BACKLOG: usize = 1024;

/// How many calls one client made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Snapshot reads.
    pub reads: u64,
    /// Writes (creates and compare-and-swaps, successful or not).
    pub writes: u64,
}

#[derive(Debug, Default)]
struct State {
    records: BTreeMap<Key, (Version, Value)>,
    next_version: u64,
    counts: HashMap<String, RequestCounts>,
    unreachable: HashMap<String, bool>,
}

/// The shared store; [`MemoryGroupStore::client`] gives each member its own handle.
///
/// ```
/// # async fn f() {
/// use tenure_group::stores::memory::MemoryGroupStore;
/// use tenure_group::store::GroupStore;
/// let store = MemoryGroupStore::new();
/// let a = store.client("a");
/// assert!(a.read().await.unwrap().table.is_none());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryGroupStore {
    state: Arc<Mutex<State>>,
    changes: Arc<watch::Sender<u64>>,
    records: broadcast::Sender<Change>,
}

impl Default for MemoryGroupStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryGroupStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryGroupStore {
            state: Arc::default(),
            changes: Arc::new(watch::channel(0).0),
            records: broadcast::channel(CHANGE_BACKLOG).0,
        }
    }

    /// A handle whose calls are counted under `client` and fail while it is unreachable.
    pub fn client(&self, client: impl Into<String>) -> MemoryGroupClient {
        MemoryGroupClient { store: self.clone(), client: client.into() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes every call of `client` fail with [`StoreError::Unavailable`] (a network partition).
    pub fn set_unreachable(&self, client: &str, unreachable: bool) {
        self.state().unreachable.insert(client.to_owned(), unreachable);
    }

    /// The calls `client` made so far.
    pub fn requests(&self, client: &str) -> RequestCounts {
        self.state().counts.get(client).copied().unwrap_or_default()
    }

    /// The records as they are now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of_records(&self.state().records)
    }
}

/// One member's handle on a [`MemoryGroupStore`].
#[derive(Debug, Clone)]
pub struct MemoryGroupClient {
    store: MemoryGroupStore,
    client: String,
}

impl MemoryGroupClient {
    fn admit(&self, state: &mut State, write: bool) -> Result<(), StoreError> {
        let counts = state.counts.entry(self.client.clone()).or_default();
        if write {
            counts.writes += 1;
        } else {
            counts.reads += 1;
        }
        if state.unreachable.get(&self.client).copied().unwrap_or(false) {
            return Err(StoreError::Unavailable(format!("{} is cut off from the memory store", self.client)));
        }
        Ok(())
    }
}

#[async_trait]
impl GroupStore for MemoryGroupClient {
    fn describe(&self) -> String {
        format!("memory://{}", self.client)
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let mut state = self.store.state();
        self.admit(&mut state, false)?;
        Ok(Snapshot::of_records(&state.records))
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let version = {
            let mut state = self.store.state();
            self.admit(&mut state, true)?;
            if matches!((key, value), (Key::Table, Value::Member(_)) | (Key::Member(_), Value::Table(_))) {
                return Err(StoreError::Rejected(format!("{key}: wrong kind of record")));
            }
            let current = state.records.get(key).map(|(version, _)| *version);
            match (expected, current) {
                (None, Some(_)) => return Err(StoreError::AlreadyExists),
                (Some(_), None) => return Err(StoreError::Conflict),
                (Some(expected), Some(current)) if expected != current => return Err(StoreError::Conflict),
                _ => {}
            }
            state.next_version += 1;
            let version = Version(state.next_version);
            state.records.insert(key.clone(), (version, value.clone()));
            // Sent under the lock, so that changes reach the watchers in the store's order.
            let _ = self.store.records.send(Change::Put(key.clone(), Stored { version, value: value.clone() }));
            version
        };
        self.store.changes.send_replace(version.0);
        Ok(version)
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let version = {
            let mut state = self.store.state();
            self.admit(&mut state, true)?;
            if state.records.get(key).map(|(version, _)| *version) != Some(expected) {
                return Err(StoreError::Conflict);
            }
            state.records.remove(key);
            let _ = self.store.records.send(Change::Deleted(key.clone()));
            state.next_version += 1;
            state.next_version
        };
        self.store.changes.send_replace(version);
        Ok(())
    }

    fn watch_records(&self) -> Option<RecordStream> {
        // Subscribed at once: the stream's first item, `Resync`, comes after the subscription.
        let receiver = self.store.records.subscribe();
        let changes = futures::stream::unfold(receiver, |mut receiver| async move {
            let change = match receiver.recv().await {
                Ok(change) => change,
                // Fell behind: changes were lost, read a snapshot.
                Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(change), receiver))
        });
        Some(futures::stream::iter([Ok(Change::Resync)]).chain(changes).boxed())
    }

    fn watch(&self) -> Option<ChangeStream> {
        let receiver = self.store.changes.subscribe();
        Some(Box::pin(tokio_stream_of(receiver).map(|_| Ok(()))))
    }
}

/// The changes of a watch channel as a stream (coalescing, like a real watch that lags).
fn tokio_stream_of(receiver: watch::Receiver<u64>) -> impl futures::Stream<Item = u64> + Send {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.changed().await.ok()?;
        let value = *receiver.borrow_and_update();
        Some((value, receiver))
    })
}
