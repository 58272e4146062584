//! Where an election's lock lives, written as a URL on the command line (`--lock`).
//!
//! Why an enum behind one `FromStr`: every backend is named by its scheme, so adding one (the
//! Kubernetes, etcd and ZooKeeper locks of later issues) is one variant and one match arm, and
//! every subcommand reports a bad `--lock` the same way.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use tenure::locks::file::{FileLock, FileLockError};
use tenure::locks::memory::MemoryStore;
use tenure::{Elector, RecordLock, Timing};

/// A parsed `--lock` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockUrl {
    /// `file:///abs/path`: the embedded file lock, for candidates on one host.
    File(PathBuf),
    /// `memory:`: a lock inside this process only. Useful to try `elect` or `run` without any
    /// file, and in tests; candidates in other processes never see it.
    Memory,
}

/// Why a `--lock` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockUrlError {
    /// Not a URL at all; most often a bare path.
    #[error("'{0}' is not a lock URL (expected file:///absolute/path or memory:)")]
    NotAUrl(String),
    /// A scheme this project knows but this build cannot open yet.
    #[error("scheme '{0}' is not supported by this build (supported: file, memory)")]
    NotSupported(String),
    /// A scheme nobody knows.
    #[error("unknown lock scheme '{0}' (supported: file, memory)")]
    UnknownScheme(String),
    /// A `file:` URL that does not name an absolute local path.
    #[error("'{url}' is not a usable file lock URL: {reason}")]
    BadFileUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `memory:` URL with something after the colon.
    #[error("'{0}' is not a memory lock URL: write just 'memory:'")]
    BadMemoryUrl(String),
}

/// Schemes that later issues implement in other crates; named here so that users get "not
/// supported by this build" rather than "unknown".
const PLANNED_SCHEMES: &[&str] = &["kube", "etcd", "zk"];

impl FromStr for LockUrl {
    type Err = LockUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(LockUrlError::NotAUrl(text.to_owned()));
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) {
            return Err(LockUrlError::NotAUrl(text.to_owned()));
        }
        match scheme.as_str() {
            "file" => parse_file_url(text),
            "memory" if rest.is_empty() => Ok(LockUrl::Memory),
            "memory" => Err(LockUrlError::BadMemoryUrl(text.to_owned())),
            planned if PLANNED_SCHEMES.contains(&planned) => Err(LockUrlError::NotSupported(scheme)),
            _ => Err(LockUrlError::UnknownScheme(scheme)),
        }
    }
}

fn parse_file_url(text: &str) -> Result<LockUrl, LockUrlError> {
    let bad = |reason| LockUrlError::BadFileUrl { url: text.to_owned(), reason };
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

impl fmt::Display for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockUrl::File(path) => match url::Url::from_file_path(path) {
                Ok(url) => write!(f, "{url}"),
                Err(()) => write!(f, "file://{}", path.display()),
            },
            LockUrl::Memory => f.write_str("memory:"),
        }
    }
}

/// Why a lock could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenLockError {
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

    /// `--lock` if given, the default lock of the election otherwise.
    pub fn given_or_default(given: Option<&LockUrl>, election: &str) -> Result<LockUrl, OpenLockError> {
        match given {
            Some(url) => Ok(url.clone()),
            None => LockUrl::default_for(election),
        }
    }

    /// Opens the lock for a candidate (or a reader) called `client`.
    pub fn open(&self, client: &str) -> Result<Arc<dyn RecordLock>, OpenLockError> {
        match self {
            LockUrl::File(path) => Ok(Arc::new(open_file_lock(path)?)),
            LockUrl::Memory => Ok(Arc::new(MemoryStore::new().client(client))),
        }
    }
}

impl LockUrl {
    /// Starts campaigning as `identity` on the lock this URL names. One place builds electors, so
    /// that backends with their own electors (etcd, ZooKeeper) are one match arm each.
    pub async fn campaign(&self, identity: &str, timing: Timing) -> Result<Elector, crate::CliError> {
        let lock = self.open(identity)?;
        Elector::builder(identity, lock).timing(timing).spawn().map_err(|e| crate::CliError::Usage(e.to_string()))
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
        assert_eq!("etcd://127.0.0.1:2379/x".parse::<LockUrl>(), Err(LockUrlError::NotSupported("etcd".into())));
        assert_eq!("kube://default/leases/x".parse::<LockUrl>(), Err(LockUrlError::NotSupported("kube".into())));
        assert_eq!("consul://x".parse::<LockUrl>(), Err(LockUrlError::UnknownScheme("consul".into())));
        assert!(matches!("/tmp/x".parse::<LockUrl>(), Err(LockUrlError::NotAUrl(_))));
    }

    #[test]
    fn display_round_trips() {
        for text in ["file:///tmp/a%20b", "memory:"] {
            assert_eq!(text.parse::<LockUrl>().unwrap().to_string(), text);
        }
    }
}
