//! The leader's side of checkpoints: cheap in-memory updates, few writes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tenure::{Tenure, Term};
use tokio::sync::oneshot;
use tokio::time::{timeout, MissedTickBehavior};

use super::{Checkpoint, CheckpointError, CheckpointStore};

#[derive(Debug)]
struct State {
    checkpoint: Checkpoint,
    /// Changed since the last successful save.
    dirty: bool,
    /// A newer term has written: never write again.
    superseded: bool,
}

struct Shared {
    state: Mutex<State>,
    store: Arc<dyn CheckpointStore>,
    term: Term,
    /// The tenure the checkpoint is written under: nothing is recorded once it is over (C2), and
    /// the guard keeps a graceful release waiting for the last write.
    tenure: Tenure,
    /// The term of the checkpoint resumed from, `None` when there was none (relist).
    resumed_from: Option<Term>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("store", &self.store.describe())
            .field("term", &self.term)
            .field("state", &*self.state())
            .finish()
    }
}

/// What the leader's work records its progress into.
///
/// Why not write on every event: a controller sees thousands of events a minute; the checkpoint
/// only needs to be fresh enough that the next leader replays little. [`Checkpointer::record`] and
/// [`Checkpointer::set_user_value`] only touch memory; a background flusher writes at most once per
/// period (default: the elector's retry period, so at most one write per renew), and once more
/// when the last clone is dropped, that is, when the work stops. The flusher holds a [`Tenure`]
/// guard, so on a resign or shutdown the elector releases the lock only after that last write.
///
/// Every write carries the tenure's term; the store rejects it once a newer term has written
/// (invariant C1), after which this checkpointer stops writing (see [`Checkpointer::is_superseded`]).
///
/// Progress is recorded only while the tenure is valid (invariant C2): whatever a handler did
/// after its tenure ended was refused or may be redone by the next leader, so a
/// [`Checkpointer::record`] made after the end, by a work that has not noticed it yet (a paused
/// process, a handler that returned `Ok` when deposed), is ignored, and the next leader resumes
/// before that change.
///
/// ```
/// # async fn f(tenure: tenure::Tenure) -> Result<(), tenure_ha::checkpoint::CheckpointError> {
/// use std::{sync::Arc, time::Duration};
/// use tenure_ha::checkpoint::{memory::MemoryCheckpointStore, Checkpointer};
/// let store = Arc::new(MemoryCheckpointStore::new("ip-allocator"));
/// let checkpointer = Checkpointer::resume(store, &tenure, Duration::from_secs(2)).await?;
/// match checkpointer.resource_version("pods") {
///     Some(rv) => println!("watch pods from resourceVersion {rv}"),
///     None => println!("no checkpoint: list pods, then watch"),
/// }
/// checkpointer.record("pods", "4712");   // after handling the event with that resourceVersion
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Checkpointer {
    shared: Arc<Shared>,
    /// Dropped with the last clone: tells the flusher to write one last time.
    _last: Arc<oneshot::Sender<()>>,
}

impl Checkpointer {
    /// Loads the newest checkpoint and claims it for `tenure`: writes it back under this term at
    /// once, so from now on no older term can write (a paused old leader's late flush is
    /// rejected). Then flushes changes every `period` while the tenure is valid.
    ///
    /// Fails with [`CheckpointError::Superseded`] if a newer term has written already (this
    /// tenure is over), or with the store's error.
    pub async fn resume(
        store: Arc<dyn CheckpointStore>,
        tenure: &Tenure,
        period: Duration,
    ) -> Result<Checkpointer, CheckpointError> {
        let term = tenure.term();
        let loaded = store.load().await?;
        let resumed_from = loaded.as_ref().map(|stored| stored.term);
        let checkpoint = loaded.map(|stored| stored.checkpoint).unwrap_or_else(|| Checkpoint::new(store.controller()));
        store.save(term, &checkpoint).await?;
        let described = store.describe();
        match resumed_from {
            Some(previous) => {
                tracing::info!(store = %described, term = term.0, previous_term = previous.0, "resuming from checkpoint")
            }
            None => tracing::info!(store = %described, term = term.0, "no usable checkpoint; the controller relists"),
        }
        let state = Mutex::new(State { checkpoint, dirty: false, superseded: false });
        let shared = Arc::new(Shared { state, store, term, tenure: tenure.clone(), resumed_from });
        let (last, dropped) = oneshot::channel();
        tokio::spawn(flush_periodically(shared.clone(), period, dropped));
        Ok(Checkpointer { shared, _last: Arc::new(last) })
    }

    /// [`Checkpointer::resume`] for gated work: the context's tenure, flushing once per the
    /// elector's retry period (so checkpoints cost at most one write per renew period).
    pub async fn resume_for(
        store: Arc<dyn CheckpointStore>,
        ctx: &crate::gate::LeaderContext,
    ) -> Result<Checkpointer, CheckpointError> {
        Checkpointer::resume(store, ctx.tenure(), ctx.timing().retry_period).await
    }

    /// The term of the checkpoint this tenure resumed from; `None` means there was none (or it was
    /// unusable): list everything, then watch.
    pub fn resumed_from(&self) -> Option<Term> {
        self.shared.resumed_from
    }

    /// The last resourceVersion recorded for `resource` (resumed or recorded since).
    pub fn resource_version(&self, resource: &str) -> Option<String> {
        self.shared.state().checkpoint.resource_version(resource).map(str::to_owned)
    }

    /// The user value (resumed or set since); `null` when never set.
    pub fn user_value(&self) -> serde_json::Value {
        self.shared.state().checkpoint.user_value.clone()
    }

    /// The checkpoint as it stands in memory.
    pub fn checkpoint(&self) -> Checkpoint {
        self.shared.state().checkpoint.clone()
    }

    /// Records that everything of `resource` up to `resource_version` has been processed. Memory
    /// only; written by the next flush. Recording the version already recorded changes nothing
    /// and costs no write. Ignored once the tenure is over (see above): call it after the
    /// handling it vouches for returned, never before.
    pub fn record(&self, resource: impl Into<String>, resource_version: impl Into<String>) {
        let (resource, resource_version) = (resource.into(), resource_version.into());
        let Some(mut state) = self.shared.state_while_valid() else { return };
        if state.checkpoint.resource_versions.get(&resource) != Some(&resource_version) {
            state.checkpoint.resource_versions.insert(resource, resource_version);
            state.dirty = true;
        }
    }

    /// Replaces the user value. Memory only; written by the next flush (none if it is unchanged).
    /// Ignored once the tenure is over, as [`Checkpointer::record`].
    pub fn set_user_value(&self, value: serde_json::Value) {
        let Some(mut state) = self.shared.state_while_valid() else { return };
        if state.checkpoint.user_value != value {
            state.checkpoint.user_value = value;
            state.dirty = true;
        }
    }

    /// Writes now if anything changed (for a caller that must know its progress is stored, e.g.
    /// before acknowledging something outside).
    pub async fn flush(&self) -> Result<(), CheckpointError> {
        self.shared.flush().await
    }

    /// True once the store rejected a write because a newer term has written: this replica's
    /// tenure is over, whatever it believes.
    pub fn is_superseded(&self) -> bool {
        self.shared.state().superseded
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state to record into, `None` once the tenure is over (checked under the lock, so a
    /// record never lands after the end was seen).
    fn state_while_valid(&self) -> Option<MutexGuard<'_, State>> {
        let state = self.state();
        #[cfg(all(test, feature = "kube"))]
        if crate::mutation::is(crate::mutation::Mutation::DeposedOkHandled) {
            return Some(state);
        }
        if self.tenure.is_valid() {
            return Some(state);
        }
        tracing::debug!(store = %self.store.describe(), term = self.term.0, "tenure over: progress not recorded");
        None
    }

    async fn flush(&self) -> Result<(), CheckpointError> {
        let snapshot = {
            let mut state = self.state();
            if state.superseded {
                return Err(CheckpointError::Superseded { ours: self.term, newer: None });
            }
            if !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            state.checkpoint.clone()
        };
        let result = self.store.save(self.term, &snapshot).await;
        let mut state = self.state();
        match &result {
            Ok(()) => {}
            Err(CheckpointError::Superseded { newer, .. }) => {
                if !state.superseded {
                    tracing::warn!(
                        store = %self.store.describe(),
                        term = self.term.0,
                        newer = newer.map(|t| t.0),
                        "checkpoint write rejected: a newer leader has written; not writing again"
                    );
                }
                state.superseded = true;
            }
            Err(error) => {
                tracing::warn!(store = %self.store.describe(), %error, "checkpoint write failed; retrying next period");
                state.dirty = true;
            }
        }
        result
    }
}

/// Writes changes every `period` while the tenure is valid, and once more when the last
/// [`Checkpointer`] is dropped; holds a [`Tenure`] guard until then so that a graceful release
/// waits for the last write (up to the elector's drain timeout).
async fn flush_periodically(shared: Arc<Shared>, period: Duration, mut dropped: oneshot::Receiver<()>) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut dropped => break,
            _ = ticker.tick() => {
                if shared.tenure.is_valid() && !shared.state().superseded {
                    let _ = shared.flush().await;
                }
            }
        }
    }
    // The work has stopped: one last write, bounded so that a hung store cannot hold the guard
    // (and with it the release) longer than one period. A late write still carries the term,
    // which the store rejects once a newer leader has claimed the checkpoint.
    if timeout(period, shared.flush()).await.is_err() {
        tracing::warn!(store = %shared.store.describe(), "last checkpoint write timed out");
    }
}

#[cfg(test)]
mod tests {
    use tenure::locks::memory::MemoryStore;
    use tenure::Elector;

    use super::*;
    use crate::checkpoint::memory::MemoryCheckpointStore;

    #[tokio::test]
    async fn recording_what_is_already_recorded_costs_no_write() {
        let lock = MemoryStore::new();
        let elector = Elector::builder("a", lock.client("a")).spawn().expect("an elector");
        let tenure = elector.acquired().await.expect("leads");
        let store = Arc::new(MemoryCheckpointStore::new("c"));
        let checkpointer =
            Checkpointer::resume(store.clone(), &tenure, Duration::from_secs(3600)).await.expect("resumed");
        checkpointer.record("pods", "7");
        checkpointer.set_user_value(serde_json::json!(1));
        checkpointer.flush().await.expect("written");
        let writes = store.writes();
        // A bookmark at the same version, a retry holding the same watermark: nothing new.
        checkpointer.record("pods", "7");
        checkpointer.set_user_value(serde_json::json!(1));
        checkpointer.flush().await.expect("nothing to write");
        assert_eq!(store.writes(), writes);
        checkpointer.record("pods", "8");
        checkpointer.flush().await.expect("written");
        assert_eq!(store.writes(), writes + 1);
        drop((checkpointer, tenure));
        elector.shutdown().await.expect("stopped");
    }
}
