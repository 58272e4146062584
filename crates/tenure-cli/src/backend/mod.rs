//! Where an election's lock lives, written as a URL on the command line (`--lock`), and all that
//! differs between the stores that can hold it: one module per backend behind [`Backend`].
//!
//! Why a trait object behind one URL type: `elect`, `run`, `status`, `break-lock` and `member`
//! speak to the lock through [`Backend`] only, so a backend lives in one place, and every
//! subcommand reports a bad `--lock` the same way.
//!
//! A URL may carry `user:password@`: wherever it is shown (its `Display`, every error, clap's
//! message about a bad `--lock`) the password is `***`, so that logs, `/status` and `tenure
//! status` never repeat it.

pub mod etcd;
pub mod file;
pub mod kube;
pub mod memory;
pub mod zk;

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tenure::{redact_credentials, ChangeStream, Elector, ElectorError, RecordLock, StoredRecord, Term, Timing};
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;

use crate::error::CliError;
use crate::error::{BoxError, LockUrlError};
use crate::lock_scope::LockScope;

/// How long one read of the store may take before the store counts as unreachable (`tenure
/// status`, whose reads the caller bounds; a ZooKeeper reader's session is sized by it).
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a backend's asynchronous steps return (boxed: [`Backend`] is used as a trait object).
pub type Fut<'a, T> = BoxFuture<'a, Result<T, CliError>>;

/// The elector's release, handed to [`CampaignEnd::finish`].
pub type Release<'a> = BoxFuture<'a, Result<(), ElectorError>>;

/// A backend's parser, given the whole URL and what follows `scheme:`.
type Parse = fn(text: &str, rest: &str) -> Result<LockUrl, LockUrlError>;

/// Every backend: its scheme, the form error messages show, its parser; in the order error
/// messages list them.
const BACKENDS: &[(&str, &str, Parse)] = &[
    ("file", "file:///absolute/path", file::parse),
    ("kube", "kube://namespace/kind/name", kube::parse),
    ("etcd", "etcd://host:port/name", etcd::parse),
    ("zk", "zk://host:port/path", zk::parse),
    ("memory", "memory:", memory::parse),
];

/// A store that can hold an election's lock, parsed from `--lock`; its `Display` is the URL, any
/// password as `***`.
///
/// Adding a backend: a module with a type that implements this trait and a `parse` function,
/// and one line in `BACKENDS` (above, in `backend/mod.rs`). A store of compare-and-swap records
/// implements [`Backend::record_store`] and gets campaigning and `status` from the defaults
/// (client-go's algorithm); a store with sessions and its own elector (etcd, ZooKeeper)
/// implements [`Backend::campaign`] and [`Backend::status_source`] instead.
pub trait Backend: fmt::Debug + fmt::Display + Send + Sync {
    /// The store as compare-and-swap records (for `break-lock` and the defaults below); `None`
    /// for a store whose server ends dead sessions itself.
    fn record_store(&self) -> Option<&dyn RecordStore> {
        None
    }

    /// Starts campaigning: by default client-go's elector on the record lock.
    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let Some(store) = self.record_store() else { return Err(CliError::NotARecordLock(self.to_string())) };
            let lock = store.open(request.identity, request.cluster).await?;
            let elector =
                Elector::builder(request.identity, lock).timing(request.timing).spawn().map_err(CliError::refused)?;
            Ok(Campaign { elector, ending: Box::new(()) })
        })
    }

    /// Opens what `tenure status` reads (writing nothing): by default the record lock.
    fn status_source<'a>(&'a self, cluster: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move {
            let Some(store) = self.record_store() else { return Err(CliError::NotARecordLock(self.to_string())) };
            let lock = store.open("tenure-status", cluster).await?;
            Ok(Box::new(RecordStatus(lock, self.to_string())) as Box<dyn StatusSource>)
        })
    }

    /// The store of `tenure member`'s group (given the group, the member's identity and the
    /// Kubernetes cluster); by default none.
    fn group_store<'a>(&'a self, _: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move { Err(CliError::NoGroupStore { lock: self.to_string() }) })
    }

    /// Who shares a lock that lives on this host, said once at start ([`LockScope`]); `None` for
    /// a lock on a server, which every candidate reaching the server shares.
    fn scope(&self, _defaulted: bool, _uid: u32) -> Option<LockScope> {
        None
    }

    /// Logs who shares this lock ([`LockScope`]) once, before campaigning; nothing for a lock on
    /// a server.
    fn announce_scope(&self, defaulted: bool) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let Some(LockScope { lock_file, scope, explanation }) = self.scope(defaulted, uid) else { return };
        match lock_file {
            Some(path) => tracing::info!(lock_file = %path.display(), scope, "{explanation}"),
            None => tracing::info!(scope, "{explanation}"),
        }
    }

    /// The namespace the lock lives in, for stores with namespaces (`--election-namespace`).
    fn namespace(&self) -> Option<&str> {
        None
    }

    /// The URL of a lock or group named `name` beside this one, for `tenure coordinate`, which
    /// keeps many elections, locks and groups under one base URL: a file in the base directory,
    /// a key or node under the base prefix, a Lease named after the base. `name` is a safe name
    /// (lower-case letters, digits, `-`); `None` where the store cannot hold it (the memory lock,
    /// a Kubernetes name over 63 characters).
    fn nested(&self, _name: &str) -> Option<LockUrl> {
        None
    }

    /// Whether `elect --leader-label` can label this candidate's Pod (a Kubernetes lock only).
    /// Replaces `target` with `content` only while the lock shows the tenure of `term`
    /// (`tenure write`); `CliError::Deposed` when it no longer does.
    fn write_fenced<'a>(&'a self, _term: Term, _target: &'a std::path::Path, _content: Vec<u8>) -> Fut<'a, ()> {
        Box::pin(async move {
            let needs = "tenure write needs a file, etcd or ZooKeeper lock (a Kubernetes object: tenure_kube::term_fenced)";
            Err(CliError::LockCannot { needs, lock: self.to_string() })
        })
    }

    fn check_leader_label(&self) -> Result<(), CliError> {
        Err(CliError::LockCannot { needs: "--leader-label needs a Kubernetes lock", lock: self.to_string() })
    }
}

/// A store of compare-and-swap records (file, memory, Kubernetes object).
pub trait RecordStore: Send + Sync {
    /// Opens the record lock for a candidate (or a reader) called `client`.
    fn open<'a>(&'a self, client: &'a str, cluster: &'a ClusterOptions) -> Fut<'a, Arc<dyn RecordLock>>;
}

/// A parsed `--lock` value: the backend it names (shared: clap clones option values).
pub type LockUrl = Arc<dyn Backend>;

/// The lock used when `--lock` is not given: the file lock of `election` in the per-user runtime
/// directory, so that `tenure elect` works on one host with no setup.
pub fn default_lock(election: &str) -> Result<LockUrl, CliError> {
    tenure::locks::file::FileLock::default_path(election)
        .map(file::FileBackend::url)
        .map_err(|source| CliError::DefaultLock { election: election.to_owned(), source })
}

/// "a, b or c": the forms of every backend's URL.
fn forms() -> String {
    let forms: Vec<_> = BACKENDS.iter().map(|b| b.1).collect();
    forms.split_last().map_or_else(String::new, |(last, rest)| format!("{} or {last}", rest.join(", ")))
}

/// Parses a `--lock` value with the parser its scheme names.
pub fn parse_lock_url(text: &str) -> Result<LockUrl, LockUrlError> {
    let not_a_url = || LockUrlError::NotAUrl { text: redact_credentials(text).into_owned(), forms: forms() };
    let (scheme, rest) = text.split_once(':').ok_or_else(not_a_url)?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
        return Err(not_a_url());
    }
    let Some((_, _, parse)) = BACKENDS.iter().find(|backend| backend.0 == scheme) else {
        let supported = BACKENDS.iter().map(|b| b.0).collect::<Vec<_>>().join(", ");
        return Err(LockUrlError::UnknownScheme { scheme, supported });
    };
    parse(text, rest)
}

/// The parser of `--lock`. Why not clap's parser of strings: its error repeats the
/// value as given, password included; this one says only what [`LockUrlError`] says (redacted).
#[derive(Debug, Clone, Copy)]
pub struct LockUrlParser;

impl clap::builder::TypedValueParser for LockUrlParser {
    type Value = LockUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<LockUrl, clap::Error> {
        let arg = arg.map_or_else(|| "--lock <URL>".to_owned(), ToString::to_string);
        let invalid = |reason: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("invalid value for '{arg}': {reason}\n"))
                .with_cmd(cmd)
        };
        let text = value.to_str().ok_or_else(|| invalid("the lock URL is not valid UTF-8".to_owned()))?;
        parse_lock_url(text).map_err(|error| invalid(error.to_string()))
    }
}

/// What a candidate asks of its lock: who it is, how fast the election moves, how to reach a
/// Kubernetes cluster, and `elect`'s Kubernetes flags (refused by backends that cannot serve them).
pub struct CampaignRequest<'a> {
    /// The candidate's identity.
    pub identity: &'a str,
    /// The election's timing (`--ttl`).
    pub timing: Timing,
    /// How to reach a Kubernetes API server.
    pub cluster: &'a ClusterOptions,
    /// `--coordinated`: the versions to publish in Kubernetes' Coordinated Leader Election.
    pub coordinated: Option<tenure_kube::coordinated::CandidateVersions>,
    /// `--leader-label`: the label to keep on this candidate's Pod while it leads.
    pub leader_label: Option<crate::pod_label::LeaderLabel>,
}

impl CampaignRequest<'_> {
    /// For backends without Coordinated Leader Election: refuses `--coordinated`.
    pub fn refuse_coordinated(&self, lock: &(impl fmt::Display + ?Sized)) -> Result<(), CliError> {
        let needs = "--coordinated needs a Kubernetes Lease lock (kube://NAMESPACE/leases/NAME)";
        self.coordinated.as_ref().map_or(Ok(()), |_| Err(CliError::LockCannot { needs, lock: lock.to_string() }))
    }
}

/// A campaign under way: the elector, and what its backend must do when the campaign ends.
pub struct Campaign {
    /// The elector campaigning.
    pub elector: Elector,
    /// The backend's part of the end (see [`CampaignEnd`]).
    pub ending: Box<dyn CampaignEnd>,
}

/// What a backend keeps for the end of a campaign. Why: some of it must happen before the
/// elector's release (a Kubernetes candidate withdraws its LeaseCandidate first, so that the
/// coordinator does not name it again meanwhile) and some after it (the last Event, the leader
/// label's removal); the backend owns that order.
pub trait CampaignEnd: Send {
    /// Runs `release` (the elector's shutdown) at the right moment among the backend's steps.
    fn finish<'a>(self: Box<Self>, release: Release<'a>) -> Release<'a>;
}

/// Nothing to do but the release.
impl CampaignEnd for () {
    fn finish<'a>(self: Box<Self>, release: Release<'a>) -> Release<'a> {
        release
    }
}

/// Where `tenure status` reads the election, opened once so that `--watch` reads it again and
/// again over the same connection. Reads are not bounded here: the caller times them out.
pub trait StatusSource: Send + Sync {
    /// Who holds the lock now.
    fn read(&self) -> Fut<'_, Observation>;

    /// Notifications of changes, where the store pushes them (file and Kubernetes locks).
    fn changes(&self) -> Option<ChangeStream> {
        None
    }
}

/// What one read of a lock found.
pub enum Observation {
    /// A record lock's record, if there is one.
    Record(Option<StoredRecord>),
    /// The leader of a store with sessions, if any, and what its term is made of, in words.
    Leader(Option<SessionLeader>, &'static str),
}

/// The leader of a store with sessions: its identity, its term (the fencing token), and its key
/// or node.
pub type SessionLeader = (String, Term, String);

/// A store with sessions (etcd, ZooKeeper) as `status` asks it who leads: its election, and its
/// URL for errors. Its backend implements [`StatusSource`] for it.
pub struct SessionStatus<L>(pub L, pub String);

/// The status of a record lock, and its URL for errors.
struct RecordStatus(Arc<dyn RecordLock>, String);

impl StatusSource for RecordStatus {
    fn read(&self) -> Fut<'_, Observation> {
        Box::pin(
            async move { Ok(Observation::Record(self.0.get().await.map_err(lock_failed("read the lock", &self.1))?)) },
        )
    }

    fn changes(&self) -> Option<ChangeStream> {
        self.0.watch()
    }
}

/// A group's store on servers (`store`: etcd, ZooKeeper), or why they could not be reached.
pub fn group_store<S: GroupStore + 'static>(
    store: &'static str,
    group: &str,
    connected: Result<S, impl Into<BoxError>>,
) -> Result<Arc<dyn GroupStore>, CliError> {
    let store =
        connected.map_err(|e| CliError::GroupUnreachable { store, group: group.to_owned(), source: e.into() })?;
    Ok(Arc::new(store))
}

/// A failed read or write of the lock at `url`, for `map_err`: `cannot {what} {url}: {error}`.
pub fn lock_failed<E: Into<BoxError>>(what: &'static str, url: &str) -> impl FnOnce(E) -> CliError {
    let url = url.to_owned();
    move |error| CliError::Lock { what, lock: Some(url), source: error.into() }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::error::AccessError;

    #[test]
    fn unknown_schemes_and_bare_paths_are_refused_naming_every_backend() {
        let forms = "file:///absolute/path, kube://namespace/kind/name, etcd://host:port/name, zk://host:port/path";
        let error = parse_lock_url("/tmp/x").unwrap_err().to_string();
        assert_eq!(error, format!("'/tmp/x' is not a lock URL (expected {forms} or memory:)"));
        let error = parse_lock_url("consul://x").unwrap_err().to_string();
        assert_eq!(error, "unknown lock scheme 'consul' (supported: file, kube, etcd, zk, memory)");
    }

    #[test]
    fn passwords_never_show_in_the_url_or_its_errors() {
        // A password in an etcd or ZooKeeper URL is refused, without repeating it.
        for text in [
            "etcd://admin:s3cret@127.0.0.1:2379,admin:s3cret@127.0.0.2:2379/job",
            "zk://admin:s3cret@127.0.0.1:2181/a/b",
            "etcd://admin:s3cret@h:0/x",
            "zk://admin:s3cret@h:1/",
        ] {
            let error = parse_lock_url(text).unwrap_err();
            assert!(matches!(error, LockUrlError::BadAccess { source: AccessError::PasswordInUrl, .. }), "{error:?}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let error = parse_lock_url("file://admin:s3cret@host/tmp/x").unwrap_err().to_string();
        assert!(!error.contains("s3cret") && error.contains("admin:***@"), "{error}");
        let error = parse_lock_url("admin:s3cret@h").unwrap_err().to_string();
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn a_bad_lock_option_is_reported_without_its_password() {
        #[derive(clap::Parser, Debug)]
        struct Args {
            #[arg(long, value_name = "URL", value_parser = LockUrlParser)]
            lock: Option<LockUrl>,
        }
        use clap::Parser as _;
        let error = Args::try_parse_from(["tenure", "--lock", "etcd://admin:s3cret@h:0/x"]).unwrap_err().to_string();
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("password-file"), "{error}");
        assert!(error.contains("--lock <URL>"), "{error}");
        let parsed = Args::try_parse_from(["tenure", "--lock", "etcd://h:1/x"]).unwrap();
        assert_eq!(parsed.lock.map(|url| url.to_string()).as_deref(), Some("etcd://h:1/x"));
    }

    fn path_of(text: &str) -> PathBuf {
        let url = parse_lock_url(text).unwrap();
        url.scope(false, 0).and_then(|scope| scope.lock_file).unwrap()
    }

    #[test]
    fn file_url_names_an_absolute_path() {
        assert_eq!(path_of("file:///run/tenure/x"), PathBuf::from("/run/tenure/x"));
        assert_eq!(path_of("file://localhost/tmp/a%20b"), PathBuf::from("/tmp/a b"));
        assert_eq!(parse_lock_url("file:///tmp/a%20b").unwrap().to_string(), "file:///tmp/a%20b");
    }

    #[test]
    fn file_url_must_be_local_absolute_and_plain() {
        for text in ["file:relative", "file:/tmp/x", "file://host/tmp/x", "file:///tmp/x?y", "file:///tmp/"] {
            assert!(matches!(parse_lock_url(text), Err(LockUrlError::BadFileUrl { .. })), "{text}");
        }
    }

    #[test]
    fn kube_url_names_a_namespace_a_kind_and_a_name() {
        let url = parse_lock_url("kube://kube-system/endpointsleases/x").unwrap();
        assert_eq!(url.to_string(), "kube://kube-system/endpointsleases/x");
        assert_eq!(url.namespace(), Some("kube-system"));
        assert!(matches!(parse_lock_url("kube://ns/pods/x"), Err(LockUrlError::BadKubeUrl(_))));
    }

    #[test]
    fn etcd_url_names_endpoints_and_an_election() {
        let url = parse_lock_url("etcd://127.0.0.1:2379,127.0.0.2:2379/my-app").unwrap();
        assert_eq!(url.to_string(), "etcd://127.0.0.1:2379,127.0.0.2:2379/my-app");
        for bad in ["etcd://h:1", "etcd://h/x", "etcd:x", "etcd://:1/x"] {
            assert!(matches!(parse_lock_url(bad), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn cluster_urls_take_a_user_and_tls_files_but_no_password() {
        let text = "etcd://app@127.0.0.1:2379/my-app?cacert=/etc/ca.pem&cert=/c.pem&key=/k.pem";
        assert_eq!(parse_lock_url(text).unwrap().to_string(), text);
        let zk = parse_lock_url("zk://app@h:2181/a/b?password-file=/run/pw").unwrap();
        assert_eq!(zk.to_string(), "zk://app@h:2181/a/b?password-file=/run/pw");
        let error = parse_lock_url("etcd://app:hunter2@h:1/x").unwrap_err();
        assert!(matches!(error, LockUrlError::BadAccess { source: AccessError::PasswordInUrl, .. }));
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(matches!(parse_lock_url("zk://h:1/x?tls=1"), Err(LockUrlError::BadAccess { .. })));
    }

    #[test]
    fn zk_url_names_servers_and_an_absolute_path() {
        let url = parse_lock_url("zk://127.0.0.1:2181,[::1]:2182/services/a").unwrap();
        assert_eq!(url.to_string(), "zk://127.0.0.1:2181,[::1]:2182/services/a");
        for bad in ["zk:/x", "zk://127.0.0.1:2181", "zk:///x", "zk://h/x", "zk://h:0/x", "zk://h:1/x/", "zk://h:1/a//b"]
        {
            assert!(matches!(parse_lock_url(bad), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn memory_url_has_nothing_after_the_colon() {
        assert_eq!(parse_lock_url("memory:").unwrap().to_string(), "memory:");
        assert!(matches!(parse_lock_url("memory://x"), Err(LockUrlError::BadMemoryUrl(_))));
    }
}
