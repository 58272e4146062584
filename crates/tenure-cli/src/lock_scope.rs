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
