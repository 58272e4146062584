//! An in-process lock for tests, simulations and benchmarks, with faults on command.
//!
//! Why it exists: the properties that matter (self-fencing, takeover at the exact expiry, no two
//! leaders under lost writes and partitions) can only be tested if a store misbehaves exactly when
//! a test says so. Every client of a [`MemoryStore`] has its own name, so faults and request counts
//! are per client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream;
use tokio::sync::watch;

use crate::lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
use crate::record::LeaderElectionRecord;

/// How many calls of each kind one client made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Reads.
    pub get: u64,
    /// Creates.
    pub create: u64,
    /// Updates.
    pub update: u64,
    /// Watches opened.
    pub watch: u64,
}

impl RequestCounts {
    /// All calls, watches included.
    pub fn total(&self) -> u64 {
        self.get + self.create + self.update + self.watch
    }
}

#[derive(Debug, Default, Clone)]
struct Faults {
    delay: Duration,
    partitioned: bool,
    fail_next: u32,
    lose_next_replies: u32,
}

#[derive(Debug, Default)]
struct State {
    /// The stored content and its version; content is raw text so tests can store garbage.
    content: Option<(u64, String)>,
    last_version: u64,
    faults: HashMap<String, Faults>,
    counts: HashMap<String, RequestCounts>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

/// One shared record and the faults of each of its clients.
///
/// ```
/// # async fn f() {
/// use tenure::{locks::memory::MemoryStore, RecordLock};
/// let store = MemoryStore::new();
/// let lock = store.client("a");
/// store.partition("a", true);
/// assert!(lock.get().await.is_err());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        let (changed, _) = watch::channel(0);
        MemoryStore { shared: Arc::new(Shared { state: Mutex::new(State::default()), changed }) }
    }

    /// A lock handle for the client named `client`.
    pub fn client(&self, client: impl Into<String>) -> MemoryLock {
        MemoryLock { shared: self.shared.clone(), client: client.into() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock_state(&self.shared)
    }

    /// Delays every call of `client` by `delay` before it takes effect.
    pub fn set_delay(&self, client: &str, delay: Duration) {
        self.state().faults.entry(client.to_owned()).or_default().delay = delay;
    }

    /// Cuts `client` off (calls fail, its watch breaks) or heals it.
    pub fn partition(&self, client: &str, partitioned: bool) {
        self.state().faults.entry(client.to_owned()).or_default().partitioned = partitioned;
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// Makes the next `calls` calls of `client` fail without effect.
    pub fn fail_next(&self, client: &str, calls: u32) {
        self.state().faults.entry(client.to_owned()).or_default().fail_next = calls;
    }

    /// Makes the next `writes` writes of `client` take effect but report failure (a lost reply).
    pub fn lose_next_replies(&self, client: &str, writes: u32) {
        self.state().faults.entry(client.to_owned()).or_default().lose_next_replies = writes;
    }

    /// Overwrites the record with arbitrary content, as a foreign or broken writer would.
    pub fn put_raw(&self, content: &str) {
        let mut state = self.state();
        state.last_version += 1;
        state.content = Some((state.last_version, content.to_owned()));
        drop(state);
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// Deletes the record.
    pub fn delete(&self) {
        self.state().content = None;
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// The record as stored now, without counting a request.
    pub fn peek(&self) -> Option<StoredRecord> {
        current(&self.state())
    }

    /// The calls `client` made so far.
    pub fn requests(&self, client: &str) -> RequestCounts {
        self.state().counts.get(client).copied().unwrap_or_default()
    }
}

fn lock_state(shared: &Shared) -> MutexGuard<'_, State> {
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

fn current(state: &State) -> Option<StoredRecord> {
    state.content.as_ref().map(|(version, content)| StoredRecord {
        version: Version(version.to_string()),
        record: LeaderElectionRecord::from_json(content),
    })
}

/// One client's handle on a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryLock {
    shared: Arc<Shared>,
    client: String,
}

enum Fate {
    Apply,
    ApplyAndLoseReply,
}

impl MemoryLock {
    /// Counts the call, waits the client's delay, and applies the client's faults.
    async fn admit(&self, count: impl FnOnce(&mut RequestCounts), is_write: bool) -> Result<Fate, LockError> {
        let delay = {
            let mut state = lock_state(&self.shared);
            count(state.counts.entry(self.client.clone()).or_default());
            state.faults.get(&self.client).map_or(Duration::ZERO, |f| f.delay)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = lock_state(&self.shared);
        let faults = state.faults.entry(self.client.clone()).or_default();
        if faults.partitioned {
            return Err(LockError::Unavailable(format!("client {} is partitioned", self.client)));
        }
        if faults.fail_next > 0 {
            faults.fail_next -= 1;
            return Err(LockError::Unavailable("injected failure".into()));
        }
        if is_write && faults.lose_next_replies > 0 {
            faults.lose_next_replies -= 1;
            return Ok(Fate::ApplyAndLoseReply);
        }
        Ok(Fate::Apply)
    }

    fn write(
        &self,
        fate: Fate,
        expected: Option<&Version>,
        record: &LeaderElectionRecord,
    ) -> Result<Version, LockError> {
        let mut state = lock_state(&self.shared);
        match (&state.content, expected) {
            (Some(_), None) => return Err(LockError::AlreadyExists),
            (None, Some(_)) => return Err(LockError::Conflict),
            (Some((version, _)), Some(expected)) if version.to_string() != expected.0 => {
                return Err(LockError::Conflict)
            }
            _ => {}
        }
        state.last_version += 1;
        let version = state.last_version;
        state.content = Some((version, record.to_json()));
        drop(state);
        self.shared.changed.send_modify(|v| *v += 1);
        match fate {
            Fate::Apply => Ok(Version(version.to_string())),
            Fate::ApplyAndLoseReply => Err(LockError::Unavailable("injected lost reply".into())),
        }
    }
}

#[async_trait]
impl RecordLock for MemoryLock {
    fn describe(&self) -> String {
        format!("memory:{}", self.client)
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        self.admit(|c| c.get += 1, false).await?;
        Ok(current(&lock_state(&self.shared)))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        let fate = self.admit(|c| c.create += 1, true).await?;
        self.write(fate, None, record)
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        let fate = self.admit(|c| c.update += 1, true).await?;
        self.write(fate, Some(expected), record)
    }

    fn watch(&self) -> Option<ChangeStream> {
        lock_state(&self.shared).counts.entry(self.client.clone()).or_default().watch += 1;
        let mut changes = self.shared.changed.subscribe();
        changes.mark_unchanged();
        let lock = self.clone();
        Some(Box::pin(stream::unfold(Some(changes), move |changes| {
            let lock = lock.clone();
            async move {
                let mut changes = changes?;
                if changes.changed().await.is_err() {
                    return None;
                }
                let state = lock_state(&lock.shared);
                if state.faults.get(&lock.client).is_some_and(|f| f.partitioned) {
                    let error = LockError::Unavailable(format!("client {} is partitioned", lock.client));
                    return Some((Err(error), None));
                }
                Some((Ok(current(&state)), Some(changes)))
            }
        })))
    }
}
