//! `etcd://host:port[,host:port...]/name`: an etcd election (native elector: the protocol of
//! etcd's concurrency package, shared with `etcdctl elect name`). `--ttl` is the lease TTL.

use std::fmt;
use std::sync::Arc;

use tenure_etcd::EtcdElection;
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;

use super::{
    read_failed, Backend, Campaign, CampaignRequest, Fut, LockUrl, LockUrlError, Observation, SessionLeader,
    StatusSource,
};
use crate::lock_access::{self, ClusterAccess};
use crate::CliError;

/// An etcd election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdBackend {
    /// The endpoints, `host:port`, tried in turn.
    pub endpoints: Vec<String>,
    /// The election name (etcd key prefix).
    pub election: String,
    /// TLS files and the etcd user (`?cacert=&cert=&key=`, `USER@`).
    pub access: ClusterAccess,
}

/// Parses `etcd://[USER@]host:port[,host:port...]/name[?query]`.
pub(super) fn parse(text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    let (servers, election, access) = lock_access::parse_cluster_url(text, "etcd", rest, lock_access::Backend::Etcd)?;
    Ok(LockUrl::new(EtcdBackend { endpoints: servers.split(',').map(str::to_owned).collect(), election, access }))
}

impl fmt::Display for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        lock_access::write_cluster_url(f, "etcd", &self.endpoints.join(","), &self.election, &self.access)
    }
}

impl EtcdBackend {
    /// Connects to the election.
    async fn connect(&self) -> Result<EtcdElection, CliError> {
        let options = self.access.etcd_options()?;
        EtcdElection::connect_with(&self.endpoints, &self.election, &options).await.map_err(|e| CliError::Unreachable {
            store: "etcd",
            lock: self.to_string(),
            source: e.into(),
        })
    }
}

impl Backend for EtcdBackend {
    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let election = self.connect().await?;
            let elector =
                election.campaign(request.identity, request.timing.lease_duration).map_err(CliError::refused)?;
            Ok(Campaign { elector, ending: Box::new(()) })
        })
    }

    fn status_source<'a>(&'a self, _: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move { Ok(Box::new(Status(self.connect().await?, self.to_string())) as Box<dyn StatusSource>) })
    }

    fn group_store<'a>(&'a self, group: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let options = self.access.etcd_options()?;
            let store = tenure_etcd::EtcdGroupStore::connect_with(&self.endpoints, &self.election, &options)
                .await
                .map_err(|e| CliError::GroupUnreachable { store: "etcd", group: group.to_owned(), source: e.into() })?;
            Ok(Arc::new(store) as Arc<dyn GroupStore>)
        })
    }
}

/// The status of an etcd election (and its URL): the oldest candidate key leads.
struct Status(EtcdElection, String);

impl StatusSource for Status {
    fn read(&self) -> Fut<'_, Observation> {
        Box::pin(async move {
            let leader = self.0.leader().await.map_err(|e| read_failed(&self.1, e.into()))?;
            Ok(Observation::Leader(leader.map(|leader| SessionLeader {
                identity: leader.identity,
                term: leader.term,
                key: leader.key,
                term_source: "create revision of the leader's key",
            })))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_url_names_endpoints_and_an_election() {
        let url: LockUrl = "etcd://127.0.0.1:2379,127.0.0.2:2379/my-app".parse().unwrap();
        assert_eq!(url.to_string(), "etcd://127.0.0.1:2379,127.0.0.2:2379/my-app");
        for bad in ["etcd://h:1", "etcd://h/x", "etcd:x", "etcd://:1/x"] {
            assert!(matches!(bad.parse::<LockUrl>(), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
    }

    #[test]
    fn cluster_urls_take_a_user_and_tls_files_but_no_password() {
        let text = "etcd://app@127.0.0.1:2379/my-app?cacert=/etc/ca.pem&cert=/c.pem&key=/k.pem";
        assert_eq!(text.parse::<LockUrl>().unwrap().to_string(), text);
        let zk: LockUrl = "zk://app@h:2181/a/b?password-file=/run/pw".parse().unwrap();
        assert_eq!(zk.to_string(), "zk://app@h:2181/a/b?password-file=/run/pw");
        let error = "etcd://app:hunter2@h:1/x".parse::<LockUrl>().unwrap_err();
        assert!(matches!(
            error,
            LockUrlError::BadAccess { source: crate::lock_access::AccessError::PasswordInUrl, .. }
        ));
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(matches!("zk://h:1/x?tls=1".parse::<LockUrl>(), Err(LockUrlError::BadAccess { .. })));
    }
}
