//! TEMPORARY stand-in with the API of `tenure::locks::file::FileLock`, which is being written on
//! another branch. Every call fails; deleted when the real file lock is merged.

use std::path::{Path, PathBuf};

/// Stand-in for the file lock.
pub struct FileLock;

/// Stand-in for the file lock's error.
#[derive(Debug, thiserror::Error)]
#[error("the file lock is not in this build yet")]
pub struct FileLockError;

impl FileLock {
    /// Always fails.
    pub fn open(_path: impl AsRef<Path>) -> Result<tenure::locks::memory::MemoryLock, FileLockError> {
        Err(FileLockError)
    }

    /// Always fails.
    pub fn default_path(_election: &str) -> Result<PathBuf, FileLockError> {
        Err(FileLockError)
    }
}
