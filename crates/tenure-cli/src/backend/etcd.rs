//! `etcd://host:port[,host:port...]/name`: an etcd election (native elector: the protocol of
//! etcd's concurrency package, shared with `etcdctl elect name`). `--ttl` is the lease TTL.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tenure_etcd::{EtcdElection, EtcdGroupStore};
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;

use super::StatusSource;
use super::{Backend, Campaign, CampaignRequest, Fut, Leaders, LockUrl, LockUrlError, SessionLeader, SessionStatus};
use crate::error::BoxError;
use crate::lock_access::{self, ClusterAccess};
use crate::CliError;

/// An etcd election: the endpoints (tried in turn), the election name (a key prefix), and the
/// TLS files and user (`?cacert=&cert=&key=`, `USER@`).
#[derive(Debug)]
pub struct EtcdBackend {
    endpoints: Vec<String>,
    election: String,
    access: ClusterAccess,
}

/// Parses `etcd://[USER@]host:port[,host:port...]/name[?query]`.
pub(super) fn parse(text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    let (servers, election, access) = lock_access::parse_cluster_url(text, "etcd", rest, lock_access::Backend::Etcd)?;
    Ok(Arc::new(EtcdBackend { endpoints: servers.split(',').map(str::to_owned).collect(), election, access }))
}

impl fmt::Display for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock_access::write_cluster_url(f, "etcd", &self.endpoints.join(","), &self.election, &self.access)
    }
}

impl EtcdBackend {
    /// Connects to the election.
    async fn connect(&self) -> Result<EtcdElection, CliError> {
        let connected = EtcdElection::connect_with(&self.endpoints, &self.election, &self.access.etcd_options()?).await;
        connected.map_err(|e| CliError::Unreachable { store: "etcd", lock: self.to_string(), source: e.into() })
    }
}

impl Backend for EtcdBackend {
    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let election = self.connect().await?;
            let elector = election.campaign(request.identity, request.timing.lease_duration);
            Ok(Campaign { elector: elector.map_err(CliError::refused)?, ending: Box::new(()) })
        })
    }

    fn status_source<'a>(&'a self, _: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move { Ok(Box::new(SessionStatus(self.connect().await?, self.to_string())) as _) })
    }

    fn group_store<'a>(&'a self, group: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let options = self.access.etcd_options()?;
            super::group_store(
                "etcd",
                group,
                EtcdGroupStore::connect_with(&self.endpoints, &self.election, &options).await,
            )
        })
    }
}

impl Leaders for EtcdElection {
    const TERM_SOURCE: &'static str = "create revision of the leader's key";

    fn leader(&self) -> BoxFuture<'_, Result<Option<SessionLeader>, BoxError>> {
        Box::pin(async move { Ok(EtcdElection::leader(self).await?.map(|l| (l.identity, l.term, l.key))) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::parse_lock_url;

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
        assert!(matches!(
            error,
            LockUrlError::BadAccess { source: crate::lock_access::AccessError::PasswordInUrl, .. }
        ));
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(matches!(parse_lock_url("zk://h:1/x?tls=1"), Err(LockUrlError::BadAccess { .. })));
    }
}
