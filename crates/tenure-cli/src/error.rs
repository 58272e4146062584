//! Why a subcommand ended without doing what it was asked. Why an enum with context rather than
//! strings: the variant decides the exit status (2: the command line cannot work, 1: a failure at
//! run time) and carries the flag, lock, store or source error; `Display` is the line users read.

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

use tenure::locks::file::FileLockError;

use crate::exit;

/// Any error of a library, kept as the source of a variant that says what was being done.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a subcommand failed; [`CliError::exit_status`] sorts usage errors from run-time failures.
/// A variant whose `#[error]` line says what happened has no doc comment of its own.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    // Usage errors (exit status 2): nothing was started.
    /// A `--lock` URL, or the Kubernetes lock the flags describe, that cannot be used.
    #[error(transparent)]
    LockUrl(#[from] LockUrlError),
    /// The user or TLS files of an etcd or ZooKeeper lock URL are unusable.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// A library refused the settings (timing, identity, group configuration, versions).
    #[error(transparent)]
    Refused(BoxError),
    #[error("give either --lock or --lock-type, not both")]
    LockAndLockType,
    #[error("--use-cluster-credentials cannot be combined with --kubeconfig or --context")]
    InClusterWithKubeconfig,
    #[error("--election-namespace {namespace} differs from the namespace of --lock {lock}")]
    NamespaceMismatch { namespace: String, lock: String },
    /// A flag the lock's backend cannot serve (`--coordinated`, `--leader-label`).
    #[error("{needs}, and the lock is {lock}")]
    LockCannot { needs: &'static str, lock: String },
    #[error("nothing to break on {lock}: the server ends a dead candidate's session itself when its TTL runs out")]
    NothingToBreak { lock: String },
    #[error("tenure member supports file:///directory, etcd://host:port/prefix, zk://host:port/path and kube://NAMESPACE/leases/GROUP stores, not {lock}")]
    NoGroupStore { lock: String },
    /// No default lock file for the election (an unusable name is a usage error).
    #[error("no default lock file for this election: {source}")]
    DefaultLock { election: String, source: FileLockError },
    #[error("no default directory for group {group}: {source}")]
    DefaultGroupDirectory { group: String, source: FileLockError },
    #[error("cannot read the host name for --id: {0}")]
    Hostname(nix::errno::Errno),
    #[error("the host name is {0}; pass --id")]
    UnusableHostname(&'static str),
    #[error("--grace {} is longer than {}, the longest the command may outlive this instance's leadership \
             (3/4 of lease - renew deadline): it must be dead before another instance may lead",
            humantime::format_duration(*.grace), humantime::format_duration(*.bound))]
    GraceTooLong { grace: Duration, bound: Duration },
    #[error("no command given after --")]
    NoCommand,
    #[error("--progress-timeout {} is shorter than one renew interval ({}): give the application at least that long",
            humantime::format_duration(*.silence), humantime::format_duration(*.renew_interval))]
    SilenceTooShort { silence: Duration, renew_interval: Duration },
    #[error("--probe-every {} must be above zero and at most --progress-timeout {}",
            humantime::format_duration(*.every), humantime::format_duration(*.silence))]
    ProbeTooRare { every: Duration, silence: Duration },
    #[error("'tenure supervise' is started by 'tenure run' only (no control socket: {0})")]
    NotSupervised(std::io::Error),

    // Failures at run time (exit status 1).
    /// A step on this host failed: a signal handler, a port, a file, standard output.
    #[error("cannot {action}: {source}")]
    Io { action: Cow<'static, str>, source: std::io::Error },
    #[error("cannot open the lock {}: {source}", path.display())]
    OpenFile { path: PathBuf, source: FileLockError },
    #[error("{0} is not a record lock")]
    NotARecordLock(String),
    #[error("cannot reach {store} at {lock}: {source}")]
    Unreachable { store: &'static str, lock: String, source: BoxError },
    #[error("cannot reach {store} for group {group}: {source}")]
    GroupUnreachable { store: &'static str, group: String, source: BoxError },
    /// Connecting to a store failed (a Kubernetes client, a group directory).
    #[error("{}{source}", lock.as_ref().map(|lock| format!("{lock}: ")).unwrap_or_default())]
    Connect { lock: Option<String>, source: BoxError },
    /// Reading or writing the lock failed; `what` is "read the lock", "read" or "write the lock".
    #[error("cannot {what}{}: {source}", lock.as_ref().map(|lock| format!(" {lock}")).unwrap_or_default())]
    Lock { what: &'static str, lock: Option<String>, source: BoxError },
    #[error("refusing to break the lock: it changed while watched (now {now}); a live holder is renewing it")]
    Renewed { now: String },
    #[error("refusing to break the lock: it changed just before the write")]
    ChangedBeforeWrite,
    /// A fenced write was refused by the lock: the tenure of its term is over.
    #[error("{0}")]
    Deposed(String),
    #[error("cannot format the status: {0}")]
    Format(#[from] serde_json::Error),
    /// The elector ended the campaign.
    #[error(transparent)]
    Elector(#[from] tenure::ElectorError),
    /// What should have gone on, or completed, ended early (the elector, the API server, the
    /// group driver, the demo).
    #[error("{0}")]
    Ended(&'static str),
    #[error("the HTTP server failed: {0}")]
    HttpServer(String),
    #[error("lost track of the command: {0}")]
    LostCommand(std::io::Error),
    #[error("leaving the group failed: {0}")]
    LeaveGroup(BoxError),
}

impl CliError {
    /// The exit status: 2 when the command line cannot work (nothing was started), else 1.
    pub fn exit_status(&self) -> u8 {
        use CliError::*;
        match self {
            DefaultLock { source: FileLockError::InvalidElectionName { .. }, .. } => exit::USAGE,
            LockUrl(_) | Access(_) | Refused(_) | LockAndLockType | InClusterWithKubeconfig => exit::USAGE,
            NamespaceMismatch { .. } | LockCannot { .. } | NothingToBreak { .. } | NoGroupStore { .. } => exit::USAGE,
            DefaultGroupDirectory { .. } | Hostname(_) | UnusableHostname(_) | GraceTooLong { .. } => exit::USAGE,
            NoCommand | NotSupervised(_) | SilenceTooShort { .. } | ProbeTooRare { .. } => exit::USAGE,
            _ => exit::FAILURE,
        }
    }

    /// A failed step on this host, for `map_err`: `cannot {action}: {error}`.
    pub fn io(action: impl Into<Cow<'static, str>>) -> impl FnOnce(std::io::Error) -> CliError {
        let action = action.into();
        move |source| CliError::Io { action, source }
    }

    /// A library's refusal of the settings, for `map_err`.
    pub fn refused(error: impl std::error::Error + Send + Sync + 'static) -> CliError {
        CliError::Refused(Box::new(error))
    }
}

/// Why a `--lock` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockUrlError {
    /// Not a URL at all; most often a bare path (`forms`: every backend's form, from the backend
    /// table).
    #[error("'{text}' is not a lock URL (expected {forms})")]
    NotAUrl { text: String, forms: String },
    /// A scheme nobody knows (`supported`: every scheme, from the backend table).
    #[error("unknown lock scheme '{scheme}' (supported: {supported})")]
    UnknownScheme { scheme: String, supported: String },
    /// A `file:` URL that does not name an absolute local path.
    #[error("'{url}' is not a usable file lock URL: {reason}")]
    BadFileUrl { url: String, reason: &'static str },
    /// An `etcd:` or `zk:` URL that does not name servers and an election.
    #[error("'{url}' is not a usable lock URL: {reason}")]
    BadClusterUrl { url: String, reason: &'static str },
    /// A `kube:` URL that does not name a namespace, a lock kind and a name.
    #[error("{0}")]
    BadKubeUrl(String),
    /// The user or TLS part of an `etcd:` or `zk:` URL is unusable (the URL itself is not
    /// repeated: it may hold a password).
    #[error("{scheme}: lock URL: {source}")]
    BadAccess { scheme: String, source: AccessError },
    /// A `memory:` URL with something after the colon.
    #[error("'{0}' is not a memory lock URL: write just 'memory:'")]
    BadMemoryUrl(String),
}

/// The environment variable a password is read from when the URL names a user but no
/// `password-file`.
pub const PASSWORD_ENV: &str = "TENURE_LOCK_PASSWORD";

/// Why the access part of a lock URL, or a file it names, is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A password written into the URL.
    #[error("a password in a lock URL shows in `ps` and in logs: write only USER@ and put the password in a file (password-file=PATH) or in ${PASSWORD_ENV}")]
    PasswordInUrl,
    /// A query parameter `name` this backend does not know, or one given twice or empty: `reason`.
    #[error("lock URL parameter {name:?}: {reason}")]
    BadParameter { name: String, reason: String },
    /// Parameters that only make sense together.
    #[error("lock URL: {0}")]
    Inconsistent(&'static str),
    /// A file named by the URL (`what`: CA bundle, client certificate, ...) could not be read.
    #[error("cannot read the {what} {path}: {reason}")]
    File { what: &'static str, path: PathBuf, reason: String },
    /// A user without a password source.
    #[error("lock URL user {user:?} needs a password: add password-file=PATH or set {PASSWORD_ENV}")]
    NoPassword { user: String },
    /// The backend client refused the TLS material.
    #[error("{0}")]
    Tls(String),
}
