//! An in-process checkpoint store, for tests and simulations.
//!
//! Why it exists: the fencing rule (C1) and the write budget (one write per period) are properties
//! of the [`super::Checkpointer`] and the rule every store shares; checking them needs a store that
//! counts writes and can hold any bytes a test puts there.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tenure::Term;

use super::{check_not_superseded, decode, encode, Checkpoint, CheckpointError, CheckpointStore, StoredCheckpoint};

#[derive(Debug, Default)]
struct State {
    document: Option<Vec<u8>>,
    writes: u64,
}

/// Checkpoints kept in memory; clones share them.
///
/// ```
/// # async fn f() -> Result<(), tenure_ha::checkpoint::CheckpointError> {
/// use tenure::Term;
/// use tenure_ha::checkpoint::{memory::MemoryCheckpointStore, Checkpoint, CheckpointStore};
/// let store = MemoryCheckpointStore::new("ip-allocator");
/// store.save(Term(2), &Checkpoint::new("ip-allocator")).await?;
/// assert!(store.save(Term(1), &Checkpoint::new("ip-allocator")).await.is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryCheckpointStore {
    controller: String,
    state: Arc<Mutex<State>>,
}

impl MemoryCheckpointStore {
    /// An empty store for `controller`.
    pub fn new(controller: impl Into<String>) -> MemoryCheckpointStore {
        MemoryCheckpointStore { controller: controller.into(), state: Arc::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the stored document with arbitrary bytes, as a broken or foreign writer would.
    pub fn put_raw(&self, bytes: impl Into<Vec<u8>>) {
        self.state().document = Some(bytes.into());
    }

    /// The stored document, decoded, without logging or counting.
    pub fn peek(&self) -> Option<StoredCheckpoint> {
        let document = self.state().document.clone()?;
        decode(&document, &self.controller, "memory")
    }

    /// How many saves succeeded so far.
    pub fn writes(&self) -> u64 {
        self.state().writes
    }
}

#[async_trait]
impl CheckpointStore for MemoryCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let document = self.state().document.clone();
        Ok(document.and_then(|d| decode(&d, &self.controller, "memory")))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let mut state = self.state();
        check_not_superseded(state.document.as_deref(), term)?;
        state.document = Some(encode(term, checkpoint));
        state.writes += 1;
        Ok(())
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn describe(&self) -> String {
        format!("memory checkpoint of {}", self.controller)
    }
}
