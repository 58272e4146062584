//! `file:///abs/path`: the embedded file lock, for candidates on one host (and, for `tenure
//! member`, a directory holding a group).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tenure::locks::file::{FencedWriteError, FileLock};
use tenure::{redact_credentials, RecordLock, Term};
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;

use super::{lock_failed, Backend, Fut, LockUrl, LockUrlError, RecordStore};
use crate::error::CliError;
use crate::lock_scope::LockScope;

/// A lock file (or a group's directory) on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBackend {
    /// The lock file.
    pub path: PathBuf,
}

impl FileBackend {
    /// The URL of the file lock at `path`.
    pub fn url(path: PathBuf) -> LockUrl {
        Arc::new(FileBackend { path })
    }
}

/// Opens the file lock at `path`.
pub fn open(path: &Path) -> Result<Arc<dyn RecordLock>, CliError> {
    let lock = FileLock::open(path).map_err(|source| CliError::OpenFile { path: path.to_owned(), source })?;
    Ok(Arc::new(lock))
}

/// Parses `file:///abs/path`.
pub(super) fn parse(text: &str, _rest: &str) -> Result<LockUrl, LockUrlError> {
    let bad = |reason| LockUrlError::BadFileUrl { url: redact_credentials(text).into_owned(), reason };
    // The url crate would quietly turn `file:relative` into `file:///relative`; insist on the
    // authority form so that what runs is what was written.
    if !text.get(..7).is_some_and(|prefix| prefix.eq_ignore_ascii_case("file://")) {
        return Err(bad("write file:///absolute/path (three slashes)"));
    }
    let url = url::Url::parse(text).map_err(|_| bad("it does not parse as a URL"))?;
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("it must not have a query or fragment"));
    }
    match url.host_str() {
        None | Some("") | Some("localhost") => {}
        Some(_) => return Err(bad("only local files are supported (no host name)")),
    }
    if url.path().ends_with('/') {
        return Err(bad("it names a directory, not a file"));
    }
    let path = url.to_file_path().map_err(|()| bad("it does not name an absolute local path"))?;
    Ok(FileBackend::url(path))
}

impl fmt::Display for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match url::Url::from_file_path(&self.path) {
            Ok(url) => write!(f, "{url}"),
            Err(()) => write!(f, "file://{}", self.path.display()),
        }
    }
}

impl RecordStore for FileBackend {
    fn open<'a>(&'a self, _client: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn RecordLock>> {
        Box::pin(async move { open(&self.path) })
    }
}

impl Backend for FileBackend {
    fn record_store(&self) -> Option<&dyn RecordStore> {
        Some(self)
    }

    fn write_fenced<'a>(&'a self, term: Term, target: &'a Path, content: Vec<u8>) -> Fut<'a, ()> {
        Box::pin(async move {
            let lock =
                FileLock::open(&self.path).map_err(|source| CliError::OpenFile { path: self.path.clone(), source })?;
            match lock.write_fenced(term, target, content).await {
                Ok(()) => Ok(()),
                Err(deposed @ FencedWriteError::Deposed { .. }) => Err(CliError::Deposed(deposed.to_string())),
                Err(FencedWriteError::Lock(error)) => Err(lock_failed("write fenced by", &self.to_string())(error)),
            }
        })
    }

    fn group_store<'a>(&'a self, _: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let store = tenure_group::stores::file::FileGroupStore::open(&self.path)
                .map_err(|e| CliError::Connect { lock: None, source: e.into() })?;
            Ok(Arc::new(store) as Arc<dyn GroupStore>)
        })
    }

    fn nested(&self, name: &str) -> Option<LockUrl> {
        Some(FileBackend::url(self.path.join(name)))
    }

    fn scope(&self, defaulted: bool, uid: u32) -> Option<LockScope> {
        let mut explanation = if defaulted {
            format!(
                "the default lock file is private to uid {uid}: only this user's candidates on this host share \
                 the election, and another user's candidates with the same --election elect a leader of their \
                 own; for one election per host run every candidate as the same user, or use etcd, ZooKeeper or \
                 Kubernetes"
            )
        } else {
            format!(
                "the lock file is shared by uid {uid}'s candidates on this host that use this path; it cannot be \
                 shared across users (its files are private to the user that creates them)"
            )
        };
        // The file lock creates a missing directory.
        if let Some(missing) = self.path.parent().filter(|dir| !dir.exists()) {
            explanation.push_str(&format!(
                "; its directory {} does not exist yet and is created private to uid {uid} (mode 0700)",
                missing.display()
            ));
        }
        Some(LockScope { lock_file: Some(self.path.clone()), scope: "this user", explanation })
    }
}

#[cfg(test)]
mod tests {
    use super::FileBackend;
    use crate::backend::parse_lock_url;

    #[test]
    fn the_default_lock_file_says_it_is_per_user_and_what_other_users_get() {
        let dir = std::env::temp_dir();
        let url = FileBackend::url(dir.join("samejob.json"));
        let scope = url.scope(true, 1000).unwrap();
        assert_eq!(scope.lock_file.as_deref(), Some(dir.join("samejob.json").as_path()));
        assert_eq!(scope.scope, "this user");
        assert!(scope.explanation.contains("private to uid 1000"), "{}", scope.explanation);
        assert!(scope.explanation.contains("elect a leader of their own"), "{}", scope.explanation);
        assert!(!scope.explanation.contains("does not exist"), "{}", scope.explanation);
    }

    #[test]
    fn an_explicit_lock_file_says_it_cannot_span_users_and_that_a_missing_directory_is_created() {
        let missing = std::env::temp_dir().join(format!("tenure-scope-missing-{}", std::process::id()));
        let url = FileBackend::url(missing.join("job.json"));
        let scope = url.scope(false, 0).unwrap();
        assert_eq!(scope.scope, "this user");
        assert!(scope.explanation.contains("cannot be shared across users"), "{}", scope.explanation);
        let created = format!("its directory {} does not exist yet and is created private to uid 0", missing.display());
        assert!(scope.explanation.contains(&created), "{}", scope.explanation);
    }

    #[test]
    fn the_memory_lock_is_this_process_only_and_server_locks_need_no_line() {
        let memory = parse_lock_url("memory:").unwrap().scope(false, 1000).unwrap();
        assert_eq!((memory.lock_file, memory.scope), (None, "this process"));
        let etcd = parse_lock_url("etcd://127.0.0.1:2379/job").unwrap();
        assert_eq!(etcd.scope(false, 1000), None);
    }
}
