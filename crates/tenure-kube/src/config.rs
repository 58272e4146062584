//! Where a Kubernetes lock lives (`kube://NAMESPACE/KIND/NAME`) and how to reach the cluster.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why a lock reference or a client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The lock URL is not `kube://NAMESPACE/KIND/NAME`.
    #[error("invalid Kubernetes lock URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The lock kind is not one of client-go's names.
    #[error(
        "unknown Kubernetes lock kind {0:?} (expected leases, endpoints, configmaps, endpointsleases or configmapsleases)"
    )]
    UnknownKind(String),
    /// The kubeconfig file could not be read or used.
    #[error("cannot use the kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// `--use-cluster-credentials` outside a pod (no service account token or API server address).
    #[error("cannot use the in-cluster service account: {0}")]
    InCluster(kube::config::InClusterError),
    /// Neither the in-cluster service account nor a kubeconfig gave a configuration.
    #[error("cannot find a Kubernetes configuration (in-cluster or KUBECONFIG): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration was found but a client could not be built from it (TLS, proxy).
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// The `--server` override is not a URL.
    #[error("invalid Kubernetes API server URL {url:?}: {reason}")]
    InvalidServer {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The identity cannot be used on a Kubernetes lock.
    #[error("invalid candidate identity: {0}")]
    InvalidIdentity(String),
}

/// Which Kubernetes object holds the record, with client-go's names for them.
///
/// Why several: `leases` is what new deployments should use; `endpoints` and `configmaps` are what
/// leader-elector:0.5 and older client-go wrote; the two multi-locks hold an old object and a
/// Lease at once so a running cluster can move from the former to the latter without a moment
/// with two leaders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// A `coordination.k8s.io/v1` Lease; the record in its spec.
    Leases,
    /// A core `v1` Endpoints object; the record in the leader annotation.
    Endpoints,
    /// A core `v1` ConfigMap; the record in the leader annotation.
    ConfigMaps,
    /// Migration: an Endpoints object (primary) and a Lease (secondary) of the same name.
    EndpointsLeases,
    /// Migration: a ConfigMap (primary) and a Lease (secondary) of the same name.
    ConfigMapsLeases,
}

impl LockKind {
    /// client-go's name for the kind, as used in `--leader-elect-resource-lock` and lock URLs.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Leases => "leases",
            LockKind::Endpoints => "endpoints",
            LockKind::ConfigMaps => "configmaps",
            LockKind::EndpointsLeases => "endpointsleases",
            LockKind::ConfigMapsLeases => "configmapsleases",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LockKind {
    type Err = KubeError;

    /// Accepts client-go's names; also the singular and capitalised forms people type
    /// (`lease`, `Endpoints`, `configmap`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "leases" | "lease" => Ok(LockKind::Leases),
            "endpoints" | "endpoint" | "ep" => Ok(LockKind::Endpoints),
            "configmaps" | "configmap" | "cm" => Ok(LockKind::ConfigMaps),
            "endpointsleases" => Ok(LockKind::EndpointsLeases),
            "configmapsleases" => Ok(LockKind::ConfigMapsLeases),
            _ => Err(KubeError::UnknownKind(text.to_owned())),
        }
    }
}

/// One lock object in a cluster: what `kube://NAMESPACE/KIND/NAME` names.
///
/// ```
/// use tenure_kube::{KubeLockRef, LockKind};
/// let lock: KubeLockRef = "kube://kube-system/leases/my-controller".parse().unwrap();
/// assert_eq!(lock.kind, LockKind::Leases);
/// assert_eq!(lock.to_string(), "kube://kube-system/leases/my-controller");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KubeLockRef {
    /// The namespace of the object (of both objects, for a multi-lock).
    pub namespace: String,
    /// Which kind of object holds the record.
    pub kind: LockKind,
    /// The object's name (of both objects, for a multi-lock).
    pub name: String,
}

impl KubeLockRef {
    /// Parses `kube://NAMESPACE/KIND/NAME`; same as [`str::parse`].
    pub fn from_url(url: &str) -> Result<Self, KubeError> {
        url.parse()
    }
}

impl fmt::Display for KubeLockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kube://{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// A DNS-1123 subdomain, as Kubernetes requires of namespaces (labels) and of these objects' names.
fn is_dns_subdomain(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl FromStr for KubeLockRef {
    type Err = KubeError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| KubeError::InvalidUrl { url: url.to_owned(), reason: reason.to_owned() };
        let rest = url.strip_prefix("kube://").ok_or_else(|| invalid("it must start with kube://"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [namespace, kind, name] = parts.as_slice() else {
            return Err(invalid("expected kube://NAMESPACE/KIND/NAME"));
        };
        if !is_dns_subdomain(namespace, 63) || namespace.contains('.') {
            return Err(invalid("the namespace must be a DNS label (lower case letters, digits, '-')"));
        }
        if !is_dns_subdomain(name, 253) {
            return Err(invalid("the name must be a DNS subdomain (lower case letters, digits, '-', '.')"));
        }
        Ok(KubeLockRef { namespace: (*namespace).to_owned(), kind: kind.parse()?, name: (*name).to_owned() })
    }
}

/// How to reach the cluster: the usual ways in, in kubectl's order, and the overrides a command
/// line offers (`--kubeconfig`, `--context`, `--server`).
///
/// Why a struct of options rather than a `kube::Config`: every candidate needs its own client
/// carrying its own `User-Agent` ([`crate::user_agent`]), so the configuration is loaded per
/// identity by [`ClusterOptions::client`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterOptions {
    /// A kubeconfig file to use. Without it: the `KUBECONFIG` variable (a list of files, merged),
    /// else `~/.kube/config`, else the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current context.
    pub context: Option<String>,
    /// The API server's URL, replacing the kubeconfig's. With no configuration found at all, a
    /// plain client for this URL (no credentials), as for a local test server.
    pub server: Option<String>,
    /// Use only the in-cluster service account (leader-elector's `--use-cluster-credentials`),
    /// ignoring `KUBECONFIG` and `~/.kube/config`.
    pub in_cluster: bool,
}

impl ClusterOptions {
    /// The client configuration for the candidate `identity`: loaded as described on the fields,
    /// with the `User-Agent` set to [`crate::user_agent`]`(identity)`.
    pub async fn config(&self, identity: &str) -> Result<kube::Config, KubeError> {
        let options = KubeConfigOptions { context: self.context.clone(), ..KubeConfigOptions::default() };
        let server = self
            .server
            .as_deref()
            .map(|url| {
                url.parse::<http::Uri>()
                    .map_err(|e| KubeError::InvalidServer { url: url.to_owned(), reason: e.to_string() })
            })
            .transpose()?;
        let mut config = match (&self.kubeconfig, &self.context, &server) {
            _ if self.in_cluster => kube::Config::incluster().map_err(KubeError::InCluster)?,
            (Some(path), _, _) => kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?,
            // A context names a kubeconfig entry: the in-cluster account has none.
            (None, Some(_), _) => kube::Config::from_kubeconfig(&options).await?,
            (None, None, None) => kube::Config::infer().await?,
            (None, None, Some(server)) => match kube::Config::infer().await {
                Ok(config) => config,
                Err(error) => {
                    tracing::debug!(%error, "no Kubernetes configuration found; using the server URL alone");
                    kube::Config::new(server.clone())
                }
            },
        };
        if let Some(server) = server {
            config.cluster_url = server;
        }
        // kube 5 retries 429, 503 and 504 by itself (with back-off, honouring Retry-After). An
        // elector retries on its own schedule, bounded by its renew deadline, and logs each
        // failure; a retry hidden inside one call would hold a renew past that deadline unseen.
        config.default_retry = false;
        let agent = crate::user_agent(identity);
        let value = http::HeaderValue::from_str(&agent).map_err(|e| KubeError::InvalidIdentity(e.to_string()))?;
        config.headers.retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
        Ok(config)
    }

    /// A client for the candidate `identity` (see [`ClusterOptions::config`]).
    pub async fn client(&self, identity: &str) -> Result<kube::Client, KubeError> {
        Ok(kube::Client::try_from(self.config(identity).await?)?)
    }
}

/// Everything needed to open a Kubernetes lock: which object, how to reach the cluster, and the
/// lock's own settings. The entry point for the CLI and for programs that take a lock URL.
///
/// ```
/// use tenure_kube::{KubeLockConfig, LockKind};
/// let config = KubeLockConfig::from_url("kube://kube-system/endpointsleases/my-controller")
///     .unwrap()
///     .kubeconfig("/etc/kubernetes/admin.conf")
///     .context("prod");
/// assert_eq!(config.lock.kind, LockKind::EndpointsLeases);
/// // let lock = config.connect("pod-a").await?;   // a KubeLock: a RecordLock for the elector
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeLockConfig {
    /// The lock object.
    pub lock: KubeLockRef,
    /// How to reach the cluster.
    pub cluster: ClusterOptions,
    /// How long opening a watch (its initial list, then the watch request) may take before the
    /// watch reports an error; the elector's own calls are bounded by its call timeout.
    pub watch_open_timeout: Duration,
}

impl KubeLockConfig {
    /// A configuration for the lock at `kube://NAMESPACE/KIND/NAME`, reaching the cluster as
    /// kubectl does.
    pub fn from_url(url: &str) -> Result<Self, KubeError> {
        Ok(KubeLockConfig::new(url.parse()?, ClusterOptions::default()))
    }

    /// A configuration for the lock `lock`, reaching the cluster as `cluster` says.
    pub fn new(lock: KubeLockRef, cluster: ClusterOptions) -> Self {
        KubeLockConfig { lock, cluster, watch_open_timeout: Duration::from_secs(5) }
    }

    /// Uses this kubeconfig file (`--kubeconfig`).
    #[must_use]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.cluster.kubeconfig = Some(path.into());
        self
    }

    /// Uses this kubeconfig context (`--context`).
    #[must_use]
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.cluster.context = Some(context.into());
        self
    }

    /// Talks to this API server URL (`--server`).
    #[must_use]
    pub fn server(mut self, url: impl Into<String>) -> Self {
        self.cluster.server = Some(url.into());
        self
    }

    /// Connects as candidate `identity`: builds its client (with its `User-Agent`) and the lock.
    /// No request is made yet; an unreachable cluster shows in the elector's lock errors.
    pub async fn connect(&self, identity: &str) -> Result<crate::KubeLock, KubeError> {
        if identity == crate::UNKNOWN_LEADER {
            return Err(KubeError::InvalidIdentity(format!("{identity:?} is reserved for an unknown holder")));
        }
        let client = self.cluster.client(identity).await?;
        Ok(crate::KubeLock::new(client, &self.lock, identity).with_watch_open_timeout(self.watch_open_timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_under_client_go_names() {
        for (text, kind) in [
            ("leases", LockKind::Leases),
            ("endpoints", LockKind::Endpoints),
            ("configmaps", LockKind::ConfigMaps),
            ("endpointsleases", LockKind::EndpointsLeases),
            ("configmapsleases", LockKind::ConfigMapsLeases),
        ] {
            let parsed: LockKind = text.parse().unwrap();
            assert_eq!(parsed, kind);
            assert_eq!(parsed.as_str(), text);
        }
        assert!(matches!("pods".parse::<LockKind>(), Err(KubeError::UnknownKind(_))));
    }

    #[test]
    fn lock_urls_round_trip() {
        let url = "kube://kube-system/endpointsleases/kube-controller-manager";
        let lock = KubeLockRef::from_url(url).unwrap();
        assert_eq!(lock.namespace, "kube-system");
        assert_eq!(lock.kind, LockKind::EndpointsLeases);
        assert_eq!(lock.name, "kube-controller-manager");
        assert_eq!(lock.to_string(), url);
        let config = KubeLockConfig::from_url("kube://ns/lease/a.b").unwrap();
        assert_eq!(config.lock.kind, LockKind::Leases);
        assert_eq!(config.lock.name, "a.b");
    }

    #[test]
    fn rejects_malformed_lock_urls() {
        for url in [
            "http://ns/leases/x",
            "kube://ns/leases",
            "kube://ns/leases/x/y",
            "kube:///leases/x",
            "kube://ns/leases/",
            "kube://Ns/leases/x",
            "kube://n.s/leases/x",
            "kube://ns/leases/-x",
            "kube://ns/leases/X",
        ] {
            assert!(KubeLockRef::from_url(url).is_err(), "{url} should be rejected");
        }
        assert!(matches!(KubeLockRef::from_url("kube://ns/secrets/x"), Err(KubeError::UnknownKind(_))));
    }

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: a
clusters:
- name: ca
  cluster: {server: "http://127.0.0.1:6443"}
- name: cb
  cluster: {server: "http://127.0.0.2:7443"}
users:
- name: u
  user: {}
contexts:
- name: a
  context: {cluster: ca, user: u, namespace: default}
- name: b
  context: {cluster: cb, user: u, namespace: default}
"#;

    fn kubeconfig_file(test: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("tenure-kube-{}-{test}.yaml", std::process::id()));
        std::fs::write(&path, KUBECONFIG).unwrap();
        path
    }

    fn user_agent_of(config: &kube::Config) -> Vec<&str> {
        config.headers.iter().filter(|(n, _)| n == http::header::USER_AGENT).map(|(_, v)| v.to_str().unwrap()).collect()
    }

    #[tokio::test]
    async fn a_kubeconfig_context_and_server_override_choose_the_cluster_and_the_user_agent_names_the_candidate() {
        let path = kubeconfig_file("context");
        let mut options = ClusterOptions { kubeconfig: Some(path.clone()), ..ClusterOptions::default() };
        let config = options.config("pod-a").await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:6443/");
        assert_eq!(user_agent_of(&config), [crate::user_agent("pod-a").as_str()]);

        options.context = Some("b".into());
        assert_eq!(options.config("pod-a").await.unwrap().cluster_url.to_string(), "http://127.0.0.2:7443/");

        options.server = Some("http://127.0.0.3:8080".into());
        assert_eq!(options.config("pod-a").await.unwrap().cluster_url.to_string(), "http://127.0.0.3:8080/");

        options.context = Some("missing".into());
        assert!(matches!(options.config("pod-a").await, Err(KubeError::Kubeconfig(_))));
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn bad_options_are_typed_errors() {
        let missing =
            ClusterOptions { kubeconfig: Some("/nonexistent/kubeconfig".into()), ..ClusterOptions::default() };
        assert!(matches!(missing.config("a").await, Err(KubeError::Kubeconfig(_))));
        let path = kubeconfig_file("server");
        let bad_server = ClusterOptions {
            kubeconfig: Some(path.clone()),
            server: Some("not a url".into()),
            ..ClusterOptions::default()
        };
        assert!(matches!(bad_server.config("a").await, Err(KubeError::InvalidServer { .. })));
        std::fs::remove_file(path).unwrap();
        let config = KubeLockConfig::from_url("kube://ns/endpointsleases/x").unwrap().server("http://127.0.0.1:1");
        assert!(matches!(config.connect(crate::UNKNOWN_LEADER).await, Err(KubeError::InvalidIdentity(_))));
        // Identities a header cannot carry are still sent, readably.
        assert_eq!(crate::user_agent("pod\nä"), format!("tenure/{} (pod??)", env!("CARGO_PKG_VERSION")));
    }
}
