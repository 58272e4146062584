//! Checkpoints in one JSON file next to a file lock, for services whose replicas share a host.
//!
//! Next to its election's lock ([`FileCheckpointStore::next_to`]), a save is a write fenced by
//! the lock itself ([`FileLock::write_fenced`]): it reads the stored term, refuses if it is newer
//! than the writer's, and replaces the file only while the lock still shows the writer's tenure,
//! in the lock's own compare-and-swap. A deposed leader's save never lands, even one held (a GC
//! pause, SIGSTOP) after its check.
//!
//! A store opened on a path alone ([`FileCheckpointStore::open`]) has no election to be fenced
//! by: a save is a compare-and-swap of the file itself ([`ClaimedFile`], the file lock's
//! protocol) from the state whose term it checked, so no older term lands after a newer one.
//! Either way no writer holds anything a stopped writer could keep from the others, and the file
//! is replaced by a rename: readers see the old or the new document, never a torn one. As with
//! the lock, no `fsync`: after a power loss a checkpoint may be older or unreadable, and the
//! controller then resumes from further back or relists; it never skips an event.
//!
//! Upgrading a path-only store from a release that saved under a `flock` on `<file>.lock`: stop
//! its writers first (the two kinds do not exclude each other); the `.lock` file may then go.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use tenure::locks::file::{ClaimedFile, FencedWriteError, FileLock};
use tenure::Term;

use super::{
    check_not_superseded, decode, encode, kept_changing, Checkpoint, CheckpointError, CheckpointStore, Document,
    StoredCheckpoint,
};

/// Documents larger than this are not read (a checkpoint is a few resourceVersions).
const MAX_DOCUMENT_BYTES: u64 = 1024 * 1024;
/// How many times a save reads again after another save landed between its read and its write.
const SAVE_ATTEMPTS: usize = 8;

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
    /// The file, opened at the first load or save (opening creates its directory).
    file: Arc<OnceLock<ClaimedFile>>,
    /// The election's lock that fences saves, when the store is next to it.
    fence: Option<FileLock>,
}

impl FileCheckpointStore {
    /// The store in the file `path` (created by the first save).
    pub fn open(path: impl Into<PathBuf>, controller: impl Into<String>) -> FileCheckpointStore {
        let (controller, path) = (controller.into(), Arc::new(path.into()));
        FileCheckpointStore { controller, path, file: Arc::default(), fence: None }
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

    fn file(&self) -> Result<&ClaimedFile, CheckpointError> {
        if let Some(file) = self.file.get() {
            return Ok(file);
        }
        let file = ClaimedFile::open(self.path.as_path()).map_err(|e| self.error("open", e))?;
        Ok(self.file.get_or_init(|| file.with_max_bytes(MAX_DOCUMENT_BYTES)))
    }

    /// The stored document's bytes (empty when unreadable: it reads as garbage) and its version.
    async fn stored(&self) -> Result<Option<(Vec<u8>, tenure::Version)>, CheckpointError> {
        let document = self.file()?.read().await.map_err(|e| self.error("read", e))?;
        Ok(document.map(|document| (document.content.unwrap_or_default(), document.version)))
    }
}

#[async_trait]
impl CheckpointStore for FileCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let source = self.path.display().to_string();
        Ok(self.stored().await?.and_then(|(bytes, _)| decode(&bytes, &self.controller, &source)))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        if let Some(lock) = &self.fence {
            let stored = self.stored().await?;
            check_not_superseded(stored.as_ref().map(|(bytes, _)| bytes.as_slice()), term)?;
            return match lock.write_fenced(term, self.path.as_path(), encode(term, checkpoint)).await {
                Ok(()) => Ok(()),
                Err(FencedWriteError::Deposed { .. }) => Err(CheckpointError::Superseded { ours: term, newer: None }),
                Err(FencedWriteError::Lock(error)) => Err(self.error("write", error)),
            };
        }
        let document = Document { term, checkpoint: std::borrow::Cow::Borrowed(checkpoint) };
        for _ in 0..SAVE_ATTEMPTS {
            let stored = self.stored().await?;
            check_not_superseded(stored.as_ref().map(|(bytes, _)| bytes.as_slice()), term)?;
            match self.file()?.write(stored.as_ref().map(|(_, version)| version), &document).await {
                Ok(_) => return Ok(()),
                // Another save landed since the read: check its term.
                Err(error) if error.is_conflict() => continue,
                Err(error) => return Err(self.error("write", error)),
            }
        }
        Err(kept_changing(self.describe()))
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
