//! Scratch directories that remove themselves.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh directory under the system's temporary directory, removed with everything in it when
/// dropped (also while a panic unwinds).
///
/// Why: every benchmark puts lock files and logs somewhere; a run that fails must not leave them
/// behind on a machine shared with other engineers.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `<tmp>/tenure-bench-<label>-<pid>-<nanos>`.
    pub fn new(label: &str) -> io::Result<ScratchDir> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!("tenure-bench-{label}-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path)?;
        Ok(ScratchDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            eprintln!("warning: could not remove {}: {error}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_itself_with_its_content() {
        let dir = ScratchDir::new("unit").expect("scratch dir");
        let path = dir.path().to_owned();
        std::fs::write(path.join("f"), b"x").expect("write");
        drop(dir);
        assert!(!path.exists());
    }
}
