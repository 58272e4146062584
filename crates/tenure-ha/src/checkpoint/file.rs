//! Checkpoints in one JSON file next to a file lock, for services whose replicas share a host.
//!
//! Next to its election's lock ([`FileCheckpointStore::next_to`]), a save is a write fenced by
//! the lock itself ([`FileLock::write_fenced`]): it reads the stored term, refuses if it is newer
//! than the writer's, and replaces the file only while the lock still shows the writer's tenure,
//! in the lock's own compare-and-swap. A deposed leader's save never lands, even one held (a GC
//! pause, SIGSTOP) after its check, and no lock is held that a frozen writer could keep.
//!
//! A store opened on a path alone ([`FileCheckpointStore::open`]) has no election to be fenced
//! by: a save takes an exclusive `flock` on a sidecar file (`<file>.lock`) around the same
//! comparison and write. Either way the file is replaced by a rename: readers see the old or the
//! new document, never a torn one.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure::locks::file::{FencedWriteError, FileLock};
use tenure::Term;

use super::{check_not_superseded, decode, encode, Checkpoint, CheckpointError, CheckpointStore, StoredCheckpoint};

/// How long a save waits for another writer's flock before it fails (a holder that long is
/// stopped or stuck on its disk).
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Pause between two attempts to take the flock.
const LOCK_RETRY: Duration = Duration::from_millis(1);
/// Documents larger than this are not read (a checkpoint is a few resourceVersions).
const MAX_DOCUMENT_BYTES: u64 = 1024 * 1024;

/// Checkpoints of one controller in a JSON file.
///
/// ```no_run
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use tenure::locks::file::FileLock;
/// use tenure_ha::checkpoint::file::FileCheckpointStore;
/// let lock = FileLock::open(FileLock::default_path("my-service")?)?;
/// let store = FileCheckpointStore::next_to(&lock, "my-service");   // my-service.json.checkpoint
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FileCheckpointStore {
    controller: String,
    path: Arc<PathBuf>,
    temp_counter: Arc<AtomicU64>,
    /// The election's lock that fences saves, when the store is next to it.
    fence: Option<FileLock>,
}

impl FileCheckpointStore {
    /// The store in the file `path` (created by the first save).
    pub fn open(path: impl Into<PathBuf>, controller: impl Into<String>) -> FileCheckpointStore {
        let (controller, path) = (controller.into(), Arc::new(path.into()));
        FileCheckpointStore { controller, path, temp_counter: Arc::default(), fence: None }
    }

    /// The store next to `lock`'s file: `<lock file>.checkpoint`, in the same (private) directory,
    /// so that replicas that meet at the lock also meet at the checkpoint; its saves are fenced
    /// by the lock (see the module documentation): a save under a term lands only while the lock
    /// shows that tenure.
    pub fn next_to(lock: &FileLock, controller: impl Into<String>) -> FileCheckpointStore {
        let mut name = lock.path().as_os_str().to_owned();
        name.push(".checkpoint");
        FileCheckpointStore { fence: Some(lock.clone()), ..FileCheckpointStore::open(PathBuf::from(name), controller) }
    }

    /// The checkpoint's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, action: &str, error: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Store { store: self.describe(), reason: format!("{action}: {error}") }
    }

    fn save_blocking(&self, term: Term, document: Vec<u8>) -> Result<(), CheckpointError> {
        let path = self.path.as_path();
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| self.error("create directory", e))?;
        }
        let mut sidecar = path.as_os_str().to_owned();
        sidecar.push(".lock");
        let sidecar = OpenOptions::new()
            .create(true)
            .append(true)
            .open(PathBuf::from(sidecar))
            .map_err(|e| self.error("open the lock file", e))?;
        // Released when `sidecar` is closed, at the end of the save.
        lock_exclusive(&sidecar, LOCK_WAIT).map_err(|e| self.error("flock", e))?;
        let stored = read_document(path).map_err(|e| self.error("read", e))?;
        check_not_superseded(stored.as_deref(), term)?;
        let counter = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let mut temp = path.as_os_str().to_owned();
        temp.push(format!(".tmp.{}.{counter}", std::process::id()));
        let temp = PathBuf::from(temp);
        let written = File::create(&temp)
            .and_then(|mut file| file.write_all(&document).and_then(|()| file.sync_all()))
            .and_then(|()| fs::rename(&temp, path));
        if let Err(error) = written {
            let _ = fs::remove_file(&temp);
            return Err(self.error("write", error));
        }
        Ok(())
    }
}

/// The stored bytes, `None` if there is no file; oversized files read as garbage (empty).
fn read_document(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::metadata(path) {
        Ok(meta) if meta.len() > MAX_DOCUMENT_BYTES => Ok(Some(Vec::new())),
        Ok(_) => fs::read(path).map(Some),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Takes an exclusive flock of `file` (`File::try_lock` is `flock` on Unix), polling for at most
/// `wait`; closing the file releases it.
fn lock_exclusive(file: &File, wait: Duration) -> io::Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::Error(error)) if error.kind() != io::ErrorKind::Interrupted => return Err(error),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("another writer held it for {wait:?}")));
        }
        std::thread::sleep(LOCK_RETRY);
    }
}

#[async_trait]
impl CheckpointStore for FileCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let path = self.path.clone();
        let bytes = tokio::task::spawn_blocking(move || read_document(&path))
            .await
            .map_err(|e| self.error("read", e))?
            .map_err(|e| self.error("read", e))?;
        let source = self.path.display().to_string();
        Ok(bytes.and_then(|b| decode(&b, &self.controller, &source)))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let document = encode(term, checkpoint);
        if let Some(lock) = &self.fence {
            let path = self.path.clone();
            let stored = tokio::task::spawn_blocking(move || read_document(&path))
                .await
                .map_err(|e| self.error("read", e))?
                .map_err(|e| self.error("read", e))?;
            check_not_superseded(stored.as_deref(), term)?;
            return match lock.write_fenced(term, self.path.as_path(), document).await {
                Ok(()) => Ok(()),
                Err(FencedWriteError::Deposed { .. }) => Err(CheckpointError::Superseded { ours: term, newer: None }),
                Err(FencedWriteError::Lock(error)) => Err(self.error("write", error)),
            };
        }
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.save_blocking(term, document))
            .await
            .map_err(|e| self.error("write", e))?
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
