//! Who takes part in an election whose lock lives on this host, said once at start.
//!
//! Why: the default lock is a file private to the user who runs `tenure`, so two users who both
//! run `tenure run --election samejob` on one host each lead an election of their own. The file
//! lock cannot be shared across users anyway (the files it creates are private to their creator:
//! another user's candidate can at most read the record, and never leads). That must be
//! impossible to miss, so `elect` and `run` log one line naming the lock file and its scope
//! before they campaign. Locks on a server (Kubernetes, etcd, ZooKeeper) are shared by every
//! candidate that reaches the server; their URL in the "campaigning" line says enough.

use std::path::PathBuf;

use crate::backend::LockUrl;

/// The scope of a lock that lives on this host: the file lock or the memory lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockScope {
    /// The lock file; `None` for the memory lock.
    pub lock_file: Option<PathBuf>,
    /// Who shares the election, in two words: `this user`, `this process`.
    pub scope: &'static str,
    /// What that means for the operator, in one sentence.
    pub explanation: String,
}

impl LockScope {
    /// Logs the scope of `url` (nothing for locks on a server).
    pub fn announce(url: &LockUrl, defaulted: bool) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let Some(LockScope { lock_file, scope, explanation }) = url.scope(defaulted, uid) else { return };
        match lock_file {
            Some(path) => tracing::info!(lock_file = %path.display(), scope, "{explanation}"),
            None => tracing::info!(scope, "{explanation}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::file::FileBackend;
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
