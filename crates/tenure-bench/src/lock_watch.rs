//! Timestamps of every change of a file lock, seen through the library's own watch.
//!
//! Why: failover and handover are measured from outside the candidates, on the lock itself. The
//! file lock's watch reads the file on every inotify event, which the kernel delivers within
//! microseconds of the rename that publishes a write, so the instant a version is seen here is
//! the instant it was written, give or take the wake-up of this thread.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tenure::locks::file::FileLock;
use tenure::RecordLock;
use tokio::sync::oneshot;

/// One state of the lock and when this watcher saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// When the watcher received it.
    pub at: Instant,
    /// The version of the record, `None` when the file does not exist.
    pub version: Option<String>,
    /// The holder, `None` when the lock is free, absent or unreadable.
    pub holder: Option<String>,
    /// The holder's term (`leaderTransitions`), when the record is readable.
    pub term: Option<u64>,
}

/// A thread that watches a lock file and forwards every state it sees, timestamped.
///
/// Stops (and joins its thread) when dropped.
pub struct LockWatcher {
    seen: mpsc::Receiver<Result<Seen, String>>,
    last: Option<Seen>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LockWatcher {
    /// Starts watching the lock at `path`. The watch is armed before the current state is read,
    /// so no write after this call returns is missed; the current state is the first item.
    pub fn start(path: &Path) -> Result<LockWatcher, String> {
        let lock = FileLock::open(path).map_err(|e| e.to_string())?;
        let (sender, seen) = mpsc::channel();
        let (stop, stopped) = oneshot::channel();
        let (ready_tx, ready) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lock-watch".to_owned())
            .spawn(move || watch_thread(lock, sender, stopped, ready_tx))
            .map_err(|e| format!("cannot start the watcher thread: {e}"))?;
        ready.recv().map_err(|_| "the watcher thread ended at start".to_owned())??;
        Ok(LockWatcher { seen, last: None, stop: Some(stop), thread: Some(thread) })
    }

    /// The next state seen, waiting at most until `deadline`; `None` on timeout. Panics if the
    /// watch failed (the measurement would be meaningless).
    pub fn next_until(&mut self, deadline: Instant) -> Option<Seen> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.seen.recv_timeout(wait) {
            Ok(Ok(seen)) => Some(self.last.insert(seen).clone()),
            Ok(Err(error)) => panic!("the watch of the lock failed: {error}"),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the watcher thread stopped"),
        }
    }

    /// Waits until a state satisfies `wanted`, at most `limit`; every state seen on the way
    /// (including the one returned) is passed to `each` first.
    pub fn wait_for(
        &mut self, limit: Duration, mut each: impl FnMut(&Seen), mut wanted: impl FnMut(&Seen) -> bool,
    ) -> Option<Seen> {
        let deadline = Instant::now() + limit;
        while let Some(seen) = self.next_until(deadline) {
            each(&seen);
            if wanted(&seen) {
                return Some(seen);
            }
        }
        None
    }

    /// Waits at most `limit` for a renew: a state with the same holder and term as the state
    /// seen just before it. Returns it.
    ///
    /// Why: a leader's "last successful renew" is only defined once it has renewed, and waiting
    /// for a renew puts the next step at a known phase of the renew cycle.
    pub fn wait_for_renew(&mut self, limit: Duration) -> Option<Seen> {
        let deadline = Instant::now() + limit;
        loop {
            let previous = self.last.clone();
            let seen = self.next_until(deadline)?;
            if let Some(previous) = previous {
                if seen.holder.is_some() && seen.holder == previous.holder && seen.term == previous.term {
                    return Some(seen);
                }
            }
        }
    }
}

impl Drop for LockWatcher {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch_thread(
    lock: FileLock, sender: mpsc::Sender<Result<Seen, String>>, mut stopped: oneshot::Receiver<()>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(format!("cannot start a runtime for the watcher: {error}")));
            return;
        }
    };
    runtime.block_on(async move {
        let Some(mut changes) = lock.watch() else {
            let _ = ready.send(Err("the file lock offers no watch".to_owned()));
            return;
        };
        let current = lock.get().await;
        let _ = ready.send(Ok(()));
        let mut item = Some(current.map_err(|e| e.to_string()));
        loop {
            if let Some(result) = item.take() {
                let seen = result.map(|stored| describe(Instant::now(), stored));
                let failed = seen.is_err();
                if sender.send(seen).is_err() || failed {
                    return;
                }
            }
            tokio::select! {
                _ = &mut stopped => return,
                next = changes.next() => match next {
                    Some(result) => item = Some(result.map_err(|e| e.to_string())),
                    None => {
                        let _ = sender.send(Err("the watch ended".to_owned()));
                        return;
                    }
                },
            }
        }
    });
}

fn describe(at: Instant, stored: Option<tenure::StoredRecord>) -> Seen {
    let version = stored.as_ref().map(|s| s.version.0.clone());
    let record = stored.and_then(|s| s.record.ok());
    let term = record.as_ref().and_then(|r| u64::try_from(r.leader_transitions).ok());
    let holder = record.map(|r| r.holder_identity).filter(|h| !h.is_empty());
    Seen { at, version, holder, term }
}
