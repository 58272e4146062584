//! Where an election's lock lives, written as a URL on the command line (`--lock`).
//!
//! Why an enum behind one `FromStr`: every backend is named by its scheme, so adding one (the
//! Kubernetes, etcd and ZooKeeper locks of later issues) is one variant and one match arm, and
//! every subcommand reports a bad `--lock` the same way.
//!
//! A URL may carry `user:password@`: wherever it is shown (its `Display`, every error, clap's
//! message about a bad `--lock`) the password is `***`, so that logs, `/status` and `tenure
//! status` never repeat it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use tenure::locks::file::{FileLock, FileLockError};
use tenure::locks::memory::MemoryStore;
use tenure::{redact_credentials, Elector, RecordLock, Timing};

use crate::lock_access::{AccessError, Backend, ClusterAccess};

/// A parsed `--lock` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockUrl {
    /// `file:///abs/path`: the embedded file lock, for candidates on one host.
    File(PathBuf),
    /// `memory:`: a lock inside this process only. Useful to try `elect` or `run` without any
    /// file, and in tests; candidates in other processes never see it.
    Memory,
    /// `etcd://host:port[,host:port...]/name`: an etcd election (native elector: the protocol of
    /// etcd's concurrency package, shared with `etcdctl elect name`). `--ttl` is the lease TTL.
    Etcd {
        /// The endpoints, `host:port`, tried in turn.
        endpoints: Vec<String>,
        /// The election name (etcd key prefix).
        election: String,
        /// TLS files and the etcd user (`?cacert=&cert=&key=`, `USER@`).
        access: ClusterAccess,
    },
    /// `kube://NAMESPACE/KIND/NAME`: a Kubernetes lock object (Lease, Endpoints or ConfigMap
    /// annotation, or a migration pair), with client-go's record and algorithm.
    Kube(tenure_kube::KubeLockRef),
    /// `zk://host:port[,host:port...]/path`: a ZooKeeper election (native elector: ephemeral
    /// sequential nodes, compatible with Curator's LeaderLatch). `--ttl` is the session timeout.
    Zk {
        /// The connection string, `host:port[,host:port...]`.
        servers: String,
        /// The election path, absolute.
        path: String,
        /// The digest user (`USER@`, `?password-file=`).
        access: ClusterAccess,
    },
}

/// Why a `--lock` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockUrlError {
    /// Not a URL at all; most often a bare path.
    #[error("'{0}' is not a lock URL (expected file:///absolute/path, kube://namespace/kind/name, etcd://host:port/name, zk://host:port/path or memory:)")]
    NotAUrl(String),
    /// A scheme nobody knows.
    #[error("unknown lock scheme '{0}' (supported: file, kube, etcd, zk, memory)")]
    UnknownScheme(String),
    /// A `file:` URL that does not name an absolute local path.
    #[error("'{url}' is not a usable file lock URL: {reason}")]
    BadFileUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `etcd:` or `zk:` URL that does not name servers and an election.
    #[error("'{url}' is not a usable lock URL: {reason}")]
    BadClusterUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `kube:` URL that does not name a namespace, a lock kind and a name.
    #[error("{0}")]
    BadKubeUrl(String),
    /// The user or TLS part of an `etcd:` or `zk:` URL is unusable.
    #[error("{scheme}: lock URL: {source}")]
    BadAccess {
        /// The scheme (the URL itself is not repeated: it may hold a password).
        scheme: String,
        /// What is wrong.
        source: AccessError,
    },
    /// A `memory:` URL with something after the colon.
    #[error("'{0}' is not a memory lock URL: write just 'memory:'")]
    BadMemoryUrl(String),
}

impl FromStr for LockUrl {
    type Err = LockUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let shown = || redact_credentials(text).into_owned();
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(LockUrlError::NotAUrl(shown()));
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            return Err(LockUrlError::NotAUrl(shown()));
        }
        match scheme.as_str() {
            "file" => parse_file_url(text),
            "memory" if rest.is_empty() => Ok(LockUrl::Memory),
            "memory" => Err(LockUrlError::BadMemoryUrl(shown())),
            "zk" => {
                let (rest, access) = parse_access(&scheme, rest, Backend::Zk)?;
                parse_cluster_url(&rest)
                    .map(|(servers, path)| LockUrl::Zk { servers, path: format!("/{path}"), access })
                    .map_err(|reason| LockUrlError::BadClusterUrl { url: shown(), reason })
            }
            "etcd" => {
                let (rest, access) = parse_access(&scheme, rest, Backend::Etcd)?;
                parse_cluster_url(&rest)
                    .map(|(servers, election)| LockUrl::Etcd {
                        endpoints: servers.split(',').map(str::to_owned).collect(),
                        election,
                        access,
                    })
                    .map_err(|reason| LockUrlError::BadClusterUrl { url: shown(), reason })
            }
            "kube" => tenure_kube::KubeLockRef::from_url(&format!("kube:{rest}"))
                .map(LockUrl::Kube)
                .map_err(|e| LockUrlError::BadKubeUrl(redact_credentials(&e.to_string()).into_owned())),
            _ => Err(LockUrlError::UnknownScheme(scheme)),
        }
    }
}

/// Takes the user and the query off `//[USER@]servers/path[?query]`: what is left for
/// [`parse_cluster_url`], and the access they describe.
fn parse_access(scheme: &str, rest: &str, backend: Backend) -> Result<(String, ClusterAccess), LockUrlError> {
    let (rest, userinfo, query) = crate::lock_access::split_url(rest);
    let access = ClusterAccess::parse(userinfo, query, backend)
        .map_err(|source| LockUrlError::BadAccess { scheme: scheme.to_owned(), source })?;
    Ok((rest, access))
}

fn parse_file_url(text: &str) -> Result<LockUrl, LockUrlError> {
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
    Ok(LockUrl::File(path))
}

/// Splits `//host:port[,host:port...]/a/b` (after the scheme) into the servers and `a/b`.
fn parse_cluster_url(rest: &str) -> Result<(String, String), &'static str> {
    let Some(rest) = rest.strip_prefix("//") else {
        return Err("write SCHEME://host:port[,host:port]/name");
    };
    let Some((servers, path)) = rest.split_once('/') else {
        return Err("it has no election path after the servers");
    };
    if servers.is_empty() {
        return Err("it names no server");
    }
    for server in servers.split(',') {
        let Some((host, port)) = server.rsplit_once(':') else {
            return Err("every server needs a port (host:port)");
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err("every server must be host:port with a port from 1 to 65535");
        }
    }
    if path.is_empty() || path.ends_with('/') || path.contains("//") || path.contains(['?', '#']) {
        return Err("the election path must be /a/b with no empty part, query or fragment");
    }
    Ok((servers.to_owned(), path.to_owned()))
}

impl fmt::Display for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockUrl::File(path) => match url::Url::from_file_path(path) {
                Ok(url) => write!(f, "{url}"),
                Err(()) => write!(f, "file://{}", path.display()),
            },
            LockUrl::Memory => f.write_str("memory:"),
            LockUrl::Zk { servers, path, access } => {
                write!(f, "zk://{}{}{path}{}", user_prefix(access), redact_credentials(servers), access.query())
            }
            LockUrl::Kube(reference) => write!(f, "{reference}"),
            LockUrl::Etcd { endpoints, election, access } => {
                let endpoints = redact_credentials(&endpoints.join(",")).into_owned();
                write!(f, "etcd://{}{endpoints}/{election}{}", user_prefix(access), access.query())
            }
        }
    }
}

/// `USER@` for a URL with a user (never a password: URLs do not hold one).
fn user_prefix(access: &ClusterAccess) -> String {
    access.user.as_ref().map(|user| format!("{user}@")).unwrap_or_default()
}

/// Lets clap parse `--lock` with [`LockUrl`]'s own rules.
impl clap::builder::ValueParserFactory for LockUrl {
    type Parser = LockUrlParser;

    fn value_parser() -> LockUrlParser {
        LockUrlParser
    }
}

/// The parser of `--lock`. Why not clap's parser for `FromStr` types: its error repeats the
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
        text.parse().map_err(|error: LockUrlError| invalid(error.to_string()))
    }
}

/// Why a lock could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenLockError {
    /// The URL names a backend with its own elector (ZooKeeper), not a record lock.
    #[error("{0} is not a record lock")]
    NotARecordLock(String),
    /// The default lock path for the election could not be worked out.
    #[error("no default lock file for this election: {source}")]
    DefaultPath {
        /// The election name.
        election: String,
        /// What the file lock said.
        source: FileLockError,
    },
    /// The file lock could not be opened.
    #[error("cannot open the lock {path}: {source}")]
    File {
        /// The lock file.
        path: PathBuf,
        /// What the file lock said.
        source: FileLockError,
    },
}

impl From<OpenLockError> for crate::CliError {
    /// An election name the file lock cannot use is a usage error (exit status 2); anything else
    /// failed at run time (exit status 1).
    fn from(error: OpenLockError) -> Self {
        match error {
            OpenLockError::DefaultPath { source: FileLockError::InvalidElectionName { .. }, .. } => {
                crate::CliError::Usage(error.to_string())
            }
            _ => crate::CliError::Failed(error.to_string()),
        }
    }
}

impl LockUrl {
    /// The lock used when `--lock` is not given: the file lock of `election` in the per-user
    /// runtime directory, so that `tenure elect` works on one host with no setup.
    pub fn default_for(election: &str) -> Result<LockUrl, OpenLockError> {
        FileLock::default_path(election)
            .map(LockUrl::File)
            .map_err(|source| OpenLockError::DefaultPath { election: election.to_owned(), source })
    }

    /// Opens the lock for a candidate (or a reader) called `client`.
    pub fn open(&self, client: &str) -> Result<Arc<dyn RecordLock>, OpenLockError> {
        match self {
            LockUrl::File(path) => Ok(Arc::new(open_file_lock(path)?)),
            LockUrl::Memory => Ok(Arc::new(MemoryStore::new().client(client))),
            LockUrl::Zk { .. } | LockUrl::Etcd { .. } | LockUrl::Kube(_) => {
                Err(OpenLockError::NotARecordLock(self.to_string()))
            }
        }
    }
}

/// A campaign under way: the elector, and for a Kubernetes lock the lock itself, whose client the
/// sidecar's Kubernetes extras (Events, the leader label) use.
pub struct Campaign {
    /// The elector campaigning.
    pub elector: Elector,
    /// The Kubernetes lock, when the lock is one.
    pub kube: Option<tenure_kube::KubeLock>,
    /// The published LeaseCandidate of a coordinated campaign, to withdraw after the release.
    pub candidacy: Option<tenure_kube::coordinated::LeaseCandidacy>,
}

impl LockUrl {
    /// Starts campaigning as `identity` on the lock this URL names (reaching a Kubernetes cluster
    /// with `cluster`). One place builds electors, so that backends with their own electors (etcd,
    /// ZooKeeper) are one match arm each. With `coordinated` versions, the campaign takes part
    /// in Kubernetes' Coordinated Leader Election (a Lease lock only).
    pub async fn campaign(
        &self,
        identity: &str,
        timing: Timing,
        cluster: &tenure_kube::ClusterOptions,
        coordinated: Option<tenure_kube::coordinated::CandidateVersions>,
    ) -> Result<Campaign, crate::CliError> {
        let usage = |e: tenure::ElectorError| crate::CliError::Usage(e.to_string());
        match (self, coordinated) {
            (LockUrl::Kube(reference), coordinated) => {
                if coordinated.is_some() && reference.kind != tenure_kube::LockKind::Leases {
                    return Err(crate::CliError::Usage(format!(
                        "--coordinated needs a Lease lock (kube://NAMESPACE/leases/NAME), and the lock is {self}"
                    )));
                }
                let lock = self.kube_lock(reference, cluster, identity).await?;
                let mut builder = Elector::builder(identity, lock.record_lock()).timing(timing);
                if coordinated.is_some() {
                    builder = builder.coordinated();
                }
                let elector = builder.spawn().map_err(usage)?;
                let candidacy = coordinated.map(|versions| {
                    tenure_kube::coordinated::LeaseCandidacy::publish(
                        lock.client().clone(),
                        &reference.namespace,
                        &reference.name,
                        identity,
                        versions,
                    )
                });
                Ok(Campaign { elector, kube: Some(lock), candidacy })
            }
            (_, Some(_)) => Err(crate::CliError::Usage(format!(
                "--coordinated needs a Kubernetes Lease lock (kube://NAMESPACE/leases/NAME), and the lock is {self}"
            ))),
            (_, None) => {
                let elector = self.campaign_elsewhere(identity, timing).await?;
                Ok(Campaign { elector, kube: None, candidacy: None })
            }
        }
    }

    /// Connects to a Kubernetes lock as `identity`.
    pub async fn kube_lock(
        &self,
        reference: &tenure_kube::KubeLockRef,
        cluster: &tenure_kube::ClusterOptions,
        identity: &str,
    ) -> Result<tenure_kube::KubeLock, crate::CliError> {
        let config = tenure_kube::KubeLockConfig::new(reference.clone(), cluster.clone());
        config.connect(identity).await.map_err(|e| crate::CliError::Failed(format!("{self}: {e}")))
    }

    async fn campaign_elsewhere(&self, identity: &str, timing: Timing) -> Result<Elector, crate::CliError> {
        match self {
            LockUrl::Zk { servers, path, .. } => {
                let election = self.zk_election(servers, path, timing).await?;
                return election.campaign(identity).map_err(|e| crate::CliError::Usage(e.to_string()));
            }
            LockUrl::Etcd { endpoints, election, .. } => {
                let election = self.etcd_election(endpoints, election).await?;
                return election
                    .campaign(identity, timing.lease_duration)
                    .map_err(|e| crate::CliError::Usage(e.to_string()));
            }
            LockUrl::File(_) | LockUrl::Memory | LockUrl::Kube(_) => {}
        }
        let lock = self.open(identity)?;
        Elector::builder(identity, lock).timing(timing).spawn().map_err(|e| crate::CliError::Usage(e.to_string()))
    }
}

impl LockUrl {
    /// Connects to an etcd election.
    pub async fn etcd_election(
        &self,
        endpoints: &[String],
        election: &str,
    ) -> Result<tenure_etcd::EtcdElection, crate::CliError> {
        let options = self.access().etcd_options().map_err(|e| crate::CliError::Usage(e.to_string()))?;
        tenure_etcd::EtcdElection::connect_with(endpoints, election, &options)
            .await
            .map_err(|e| crate::CliError::Failed(format!("cannot reach etcd at {self}: {e}")))
    }

    /// Connects to a ZooKeeper election; the session timeout is the lease of `timing` (`--ttl`).
    pub async fn zk_election(
        &self,
        servers: &str,
        path: &str,
        timing: Timing,
    ) -> Result<tenure_zk::ZkElection, crate::CliError> {
        let options = self.access().zk_options().map_err(|e| crate::CliError::Usage(e.to_string()))?;
        tenure_zk::ZkElection::connect_with(servers, path, timing.lease_duration, options)
            .await
            .map_err(|e| crate::CliError::Failed(format!("cannot reach ZooKeeper at {self}: {e}")))
    }
}

impl LockUrl {
    /// The user and TLS files of an `etcd:` or `zk:` URL (none for other locks).
    pub fn access(&self) -> ClusterAccess {
        match self {
            LockUrl::Etcd { access, .. } | LockUrl::Zk { access, .. } => access.clone(),
            LockUrl::File(_) | LockUrl::Memory | LockUrl::Kube(_) => ClusterAccess::default(),
        }
    }
}

fn open_file_lock(path: &Path) -> Result<FileLock, OpenLockError> {
    FileLock::open(path).map_err(|source| OpenLockError::File { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_url_names_an_absolute_path() {
        assert_eq!("file:///run/tenure/x".parse(), Ok(LockUrl::File(PathBuf::from("/run/tenure/x"))));
        assert_eq!("file://localhost/tmp/a%20b".parse(), Ok(LockUrl::File(PathBuf::from("/tmp/a b"))));
    }

    #[test]
    fn file_url_must_be_local_absolute_and_plain() {
        for text in ["file:relative", "file:/tmp/x", "file://host/tmp/x", "file:///tmp/x?y", "file:///tmp/"] {
            assert!(matches!(text.parse::<LockUrl>(), Err(LockUrlError::BadFileUrl { .. })), "{text}");
        }
    }

    #[test]
    fn memory_url_has_nothing_after_the_colon() {
        assert_eq!("memory:".parse(), Ok(LockUrl::Memory));
        assert!(matches!("memory://x".parse::<LockUrl>(), Err(LockUrlError::BadMemoryUrl(_))));
    }

    #[test]
    fn planned_schemes_are_not_supported_yet_and_others_are_unknown() {
        assert_eq!(
            "zk://127.0.0.1:2181,[::1]:2182/services/a".parse(),
            Ok(LockUrl::Zk {
                servers: "127.0.0.1:2181,[::1]:2182".into(),
                path: "/services/a".into(),
                access: ClusterAccess::default()
            })
        );
        for bad in ["zk:/x", "zk://127.0.0.1:2181", "zk:///x", "zk://h/x", "zk://h:0/x", "zk://h:1/x/", "zk://h:1/a//b"]
        {
            assert!(matches!(bad.parse::<LockUrl>(), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
        assert_eq!(
            "kube://kube-system/endpointsleases/x".parse::<LockUrl>().unwrap().to_string(),
            "kube://kube-system/endpointsleases/x"
        );
        assert!(matches!("kube://ns/pods/x".parse::<LockUrl>(), Err(LockUrlError::BadKubeUrl(_))));
        assert_eq!("consul://x".parse::<LockUrl>(), Err(LockUrlError::UnknownScheme("consul".into())));
        assert!(matches!("/tmp/x".parse::<LockUrl>(), Err(LockUrlError::NotAUrl(_))));
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
            let error = text.parse::<LockUrl>().unwrap_err();
            assert!(matches!(error, LockUrlError::BadAccess { source: AccessError::PasswordInUrl, .. }), "{error:?}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let error = "file://admin:s3cret@host/tmp/x".parse::<LockUrl>().unwrap_err().to_string();
        assert!(!error.contains("s3cret") && error.contains("admin:***@"), "{error}");
        let error = "admin:s3cret@h".parse::<LockUrl>().unwrap_err().to_string();
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn a_bad_lock_option_is_reported_without_its_password() {
        #[derive(clap::Parser, Debug)]
        struct Args {
            #[arg(long, value_name = "URL")]
            lock: Option<LockUrl>,
        }
        use clap::Parser as _;
        let error = Args::try_parse_from(["tenure", "--lock", "etcd://admin:s3cret@h:0/x"]).unwrap_err().to_string();
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("password-file"), "{error}");
        assert!(error.contains("--lock <URL>"), "{error}");
        let parsed = Args::try_parse_from(["tenure", "--lock", "etcd://h:1/x"]).unwrap();
        let expected =
            LockUrl::Etcd { endpoints: vec!["h:1".into()], election: "x".into(), access: ClusterAccess::default() };
        assert_eq!(parsed.lock, Some(expected));
    }

    #[test]
    fn display_round_trips() {
        for text in ["file:///tmp/a%20b", "memory:"] {
            assert_eq!(text.parse::<LockUrl>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn etcd_url_names_endpoints_and_an_election() {
        assert_eq!(
            "etcd://127.0.0.1:2379,127.0.0.2:2379/my-app".parse(),
            Ok(LockUrl::Etcd {
                endpoints: vec!["127.0.0.1:2379".into(), "127.0.0.2:2379".into()],
                election: "my-app".into(),
                access: ClusterAccess::default()
            })
        );
        assert_eq!(
            "etcd://127.0.0.1:2379/my-app".parse::<LockUrl>().unwrap().to_string(),
            "etcd://127.0.0.1:2379/my-app"
        );
        for bad in ["etcd://h:1", "etcd://h/x", "etcd:x", "etcd://:1/x"] {
            assert!(matches!(bad.parse::<LockUrl>(), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn cluster_urls_take_a_user_and_tls_files_but_no_password() {
        let url: LockUrl =
            "etcd://app@127.0.0.1:2379/my-app?cacert=/etc/ca.pem&cert=/c.pem&key=/k.pem".parse().unwrap();
        let LockUrl::Etcd { endpoints, election, access } = &url else { panic!("{url:?}") };
        assert_eq!((endpoints.as_slice(), election.as_str()), (&["127.0.0.1:2379".to_owned()][..], "my-app"));
        assert_eq!(access.user.as_deref(), Some("app"));
        assert_eq!(access.ca.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(url.to_string(), "etcd://app@127.0.0.1:2379/my-app?cacert=/etc/ca.pem&cert=/c.pem&key=/k.pem");
        let zk: LockUrl = "zk://app@h:2181/a/b?password-file=/run/pw".parse().unwrap();
        assert_eq!(zk.to_string(), "zk://app@h:2181/a/b?password-file=/run/pw");

        let error = "etcd://app:hunter2@h:1/x".parse::<LockUrl>().unwrap_err();
        assert!(matches!(error, LockUrlError::BadAccess { source: AccessError::PasswordInUrl, .. }));
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(matches!("zk://h:1/x?tls=1".parse::<LockUrl>(), Err(LockUrlError::BadAccess { .. })));
    }
}
