//! Command-line options shared by several subcommands, and the parsers that turn their text into
//! checked values. Why here: a bad value must be refused the same way (one line, exit status 2)
//! whichever subcommand it was given to, before anything is started.

use std::time::Duration;

use clap::{Args, ValueEnum};
use tenure::Timing;

use tenure_kube::{ClusterOptions, LockKind};

use crate::backend::{default_lock, parse_lock_url, LockUrl, LockUrlParser};
use crate::error::CliError;

/// The options that name an election and its lock.
#[derive(Debug, Clone, Args)]
pub struct ElectionOptions {
    /// Name of the election; candidates with the same name on the same lock elect one leader.
    #[arg(long, value_name = "NAME", value_parser = parse_election_name)]
    pub election: String,

    /// Where the lock lives: file:///absolute/path, kube://NAMESPACE/KIND/NAME,
    /// etcd://host:port/name, zk://host:port/path, or memory: (this process only). Secured etcd
    /// and ZooKeeper: etcd://USER@host:port/name?cacert=CA&cert=CERT&key=KEY&password-file=FILE
    /// (password also from TENURE_LOCK_PASSWORD; never in the URL), zk://USER@host:port/path.
    /// A file lock serves one user on one host: the default file is private to the user who runs
    /// tenure (another user's candidates with the same --election elect a leader of their own),
    /// and any file lock's files are private to the user who creates them (a missing directory is
    /// created with mode 0700), so other users' candidates never lead on it. The lock file and its
    /// scope are logged at start.
    /// [default: in a pod, with KUBECONFIG set, or given a Kubernetes flag below, the --lock-type
    /// object named --election in --election-namespace; elsewhere the per-user file
    /// $XDG_RUNTIME_DIR/tenure/ELECTION.json, or TMPDIR/tenure-UID/ELECTION.json without a usable
    /// XDG_RUNTIME_DIR (an existing ~/.kube/config alone does not switch)]
    #[arg(long, value_name = "URL", value_parser = LockUrlParser)]
    pub lock: Option<LockUrl>,

    /// The Kubernetes lock object's kind, with client-go's names: leases, endpoints, configmaps,
    /// endpointsleases, configmapsleases. The default, endpointsleases, is safe beside
    /// leader-elector:0.5 replicas (which use endpoints) during a rolling upgrade; move to leases
    /// as deploy/README.md describes. Implies a Kubernetes lock. [default: endpointsleases]
    #[arg(long, value_name = "KIND", value_parser = parse_lock_type)]
    pub lock_type: Option<LockKind>,

    /// The namespace of the Kubernetes lock object. [default: default]
    #[arg(long, value_name = "NAMESPACE")]
    pub election_namespace: Option<String>,

    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// How to reach a Kubernetes API server, with the flags kubectl and leader-elector:0.5 took.
#[derive(Debug, Clone, Default, Args)]
pub struct ClusterArgs {
    /// Path to a kubeconfig file. [default: KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account]
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,

    /// The API server's URL, overriding the kubeconfig's.
    #[arg(long, visible_alias = "master", value_name = "URL")]
    pub server: Option<String>,

    /// Use the pod's service account (in-cluster configuration) rather than a kubeconfig, as
    /// leader-elector:0.5's flag of the same name did.
    #[arg(long)]
    pub use_cluster_credentials: bool,
}

impl ClusterArgs {
    /// Whether these flags or the environment point at a Kubernetes cluster: a flag given,
    /// `KUBECONFIG` set, or running in a pod (`KUBERNETES_SERVICE_HOST`).
    pub fn cluster_wanted(&self) -> bool {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        self.kubeconfig.is_some()
            || self.context.is_some()
            || self.server.is_some()
            || self.use_cluster_credentials
            || set("KUBECONFIG")
            || set("KUBERNETES_SERVICE_HOST")
    }

    /// The options of the Kubernetes client.
    pub fn options(&self) -> Result<ClusterOptions, CliError> {
        if self.use_cluster_credentials && (self.kubeconfig.is_some() || self.context.is_some()) {
            return Err(CliError::InClusterWithKubeconfig);
        }
        Ok(ClusterOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            server: self.server.clone(),
            in_cluster: self.use_cluster_credentials,
        })
    }
}

impl ElectionOptions {
    /// The lock to campaign on: `--lock`; else a Kubernetes lock when a cluster is at hand or a
    /// Kubernetes flag asks for one; else the default lock file.
    pub fn lock_url(&self) -> Result<LockUrl, CliError> {
        if let Some(url) = &self.lock {
            if self.lock_type.is_some() {
                return Err(CliError::LockAndLockType);
            }
            match (url.namespace(), &self.election_namespace) {
                (Some(own), Some(namespace)) if namespace != own => {
                    let (namespace, lock) = (namespace.clone(), url.to_string());
                    return Err(CliError::NamespaceMismatch { namespace, lock });
                }
                (Some(_), _) | (_, None) => {}
                (None, Some(namespace)) => {
                    tracing::info!(namespace, lock = %url, "--election-namespace only applies to Kubernetes locks; ignored");
                }
            }
            return Ok(url.clone());
        }
        if self.lock_type.is_some() || self.cluster.cluster_wanted() {
            let namespace = self.election_namespace.as_deref().unwrap_or("default");
            let kind = self.lock_type.unwrap_or(LockKind::EndpointsLeases);
            let url = format!("kube://{namespace}/{kind}/{}", self.election);
            return Ok(parse_lock_url(&url)?);
        }
        if let Some(namespace) = &self.election_namespace {
            tracing::info!(
                namespace,
                "no Kubernetes cluster configured: --election-namespace is ignored, the lock is a local file"
            );
        }
        default_lock(&self.election)
    }
}

/// Parses `--lock-type`.
pub fn parse_lock_type(text: &str) -> Result<LockKind, String> {
    text.parse().map_err(|_| {
        format!(
            "unknown lock type '{text}' (expected leases, endpoints, configmaps, endpointsleases or configmapsleases)"
        )
    })
}

/// Kubernetes' Coordinated Leader Election (KEP-4355), for every command that leads.
#[derive(Debug, Clone, Args)]
pub struct CoordinationOptions {
    /// Take part in Kubernetes' Coordinated Leader Election (1.33+, feature gate
    /// CoordinatedLeaderElection; a Lease lock only): publish a LeaseCandidate with
    /// --binary-version and --emulation-version, lead only when the API server's coordinator
    /// names this instance, and hand over gracefully (drain, then release) when it prefers
    /// another candidate, e.g. an older version during a rolling upgrade.
    #[arg(long)]
    pub coordinated: bool,

    /// With --coordinated: this instance's version, MAJOR.MINOR[.PATCH] (default: this build's).
    #[arg(long, value_name = "VERSION", requires = "coordinated")]
    pub binary_version: Option<String>,

    /// With --coordinated: the version this instance behaves as; the coordinator prefers the
    /// lowest (default: --binary-version).
    #[arg(long, value_name = "VERSION", requires = "coordinated")]
    pub emulation_version: Option<String>,
}

impl CoordinationOptions {
    /// The versions to publish when --coordinated, checked before anything starts.
    pub fn versions(&self) -> Result<Option<tenure_kube::coordinated::CandidateVersions>, CliError> {
        if !self.coordinated {
            return Ok(None);
        }
        let binary = self.binary_version.as_deref().unwrap_or(env!("CARGO_PKG_VERSION"));
        let emulation = self.emulation_version.as_deref().unwrap_or(binary);
        tenure_kube::coordinated::CandidateVersions::new(binary, emulation).map(Some).map_err(CliError::refused)
    }
}

/// The options of a candidate: who it is and how fast the election moves.
#[derive(Debug, Clone, Args)]
pub struct CandidateOptions {
    /// Identity of this candidate, as written into the lock and answered over HTTP.
    /// [default: the host name]
    #[arg(long, value_name = "ID", value_parser = parse_identity)]
    pub id: Option<String>,

    /// Lease time, as in leader-elector: the lease lasts TTL, the leader gives up if it cannot
    /// renew within TTL/2, and renews every TTL/4. Examples: 10s, 1500ms, 1m. The default is
    /// leader-elector:0.5's; the library's default (Timing::default) is client-go's 15 s lease.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_ttl)]
    pub ttl: Ttl,

    /// Format of the log lines on standard error. The level filter is read from RUST_LOG
    /// (default: info).
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl CandidateOptions {
    /// The identity to campaign with: `--id`, or else the host name (what leader-elector did,
    /// which makes it the pod name in Kubernetes).
    pub fn identity(&self) -> Result<String, CliError> {
        if let Some(id) = &self.id {
            return Ok(id.clone());
        }
        let hostname = nix::unistd::gethostname().map_err(CliError::Hostname)?;
        let hostname = hostname.into_string().map_err(|_| CliError::UnusableHostname("not UTF-8"))?;
        if hostname.is_empty() {
            return Err(CliError::UnusableHostname("empty"));
        }
        Ok(hostname)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// A `--ttl` together with the election timing it maps to, checked at parse time so that an
/// impossible timing is a usage error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ttl {
    /// The duration as given.
    pub ttl: Duration,
    /// lease = ttl, renew deadline = ttl/2, retry = ttl/4.
    pub timing: Timing,
}

/// Parses a human duration ("5s", "1500ms", "1m 30s").
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 5s, 1500ms, 1m)"))
}

/// Parses a human duration that must be longer than zero (a zero would make a loop spin).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be longer than zero".to_owned()),
        duration => Ok(duration),
    }
}

/// Parses `--ttl` and checks the timing it maps to.
pub fn parse_ttl(text: &str) -> Result<Ttl, String> {
    let ttl = parse_duration(text)?;
    let timing = Timing::from_ttl(ttl).map_err(|e| format!("ttl {text} gives an invalid timing: {e}"))?;
    Ok(Ttl { ttl, timing })
}

/// An election name becomes part of a file name and of Kubernetes object names: refuse what
/// could never work in either.
pub fn parse_election_name(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the election name must not be empty".to_owned());
    }
    if text == "." || text == ".." || text.contains('/') {
        return Err("the election name must not contain '/' or be '.' or '..'".to_owned());
    }
    if text.chars().any(char::is_control) {
        return Err("the election name must not contain control characters".to_owned());
    }
    Ok(text.to_owned())
}

/// An identity must be non-empty: the lock tells holders apart by it, and an empty holder means
/// "free".
pub fn parse_identity(text: &str) -> Result<String, String> {
    Some(text.to_owned()).filter(|id| !id.is_empty()).ok_or_else(|| "the identity must not be empty".to_owned())
}

/// An `--http` address: `host:port`, or `:port` for all interfaces (as leader-elector accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAddress(pub String);

/// Parses `--http`.
pub fn parse_http_address(text: &str) -> Result<HttpAddress, String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("expected host:port or :port, e.g. 127.0.0.1:4040".to_owned());
    };
    port.parse::<u16>().map_err(|_| format!("'{port}' is not a port number"))?;
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    Ok(HttpAddress(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_maps_like_leader_elector_and_rejects_impossible_timings() {
        let ttl = parse_ttl("2s").unwrap();
        assert_eq!(ttl.timing.renew_deadline, Duration::from_secs(1));
        assert_eq!(ttl.timing.retry_period, Duration::from_millis(500));
        assert_eq!(parse_ttl("1500ms").unwrap().ttl, Duration::from_millis(1500));
        assert!(parse_ttl("500ms").is_err());
        assert!(parse_ttl("five").is_err());
        assert!(parse_ttl("0s").is_err());
    }

    #[test]
    fn http_address_accepts_go_style_port_only() {
        assert_eq!(parse_http_address(":4040"), Ok(HttpAddress("0.0.0.0:4040".into())));
        assert_eq!(parse_http_address("127.0.0.1:0"), Ok(HttpAddress("127.0.0.1:0".into())));
        assert_eq!(parse_http_address("[::1]:80"), Ok(HttpAddress("[::1]:80".into())));
        assert!(parse_http_address("4040").is_err());
        assert!(parse_http_address("host:http").is_err());
    }

    #[test]
    fn election_names_that_cannot_be_files_are_refused() {
        assert!(parse_election_name("kuryr-controller").is_ok());
        for bad in ["", ".", "..", "a/b", "a\nb"] {
            assert!(parse_election_name(bad).is_err(), "{bad:?}");
        }
    }
}
