//! `zk://host:port[,host:port...]/path`: a ZooKeeper election (native elector: ephemeral
//! sequential nodes, compatible with Curator's LeaderLatch). `--ttl` is the session timeout.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;
use tenure_zk::ZkElection;

use super::{
    read_failed, Backend, Campaign, CampaignRequest, Fut, LockUrl, LockUrlError, Observation, SessionLeader,
    StatusSource,
};
use crate::lock_access::{self, ClusterAccess};
use crate::CliError;

/// A ZooKeeper election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkBackend {
    /// The connection string, `host:port[,host:port...]`.
    pub servers: String,
    /// The election path, absolute.
    pub path: String,
    /// The digest user (`USER@`, `?password-file=`).
    pub access: ClusterAccess,
}

/// Parses `zk://[USER@]host:port[,host:port...]/path[?query]`.
pub(super) fn parse(text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    let (servers, path, access) = lock_access::parse_cluster_url(text, "zk", rest, lock_access::Backend::Zk)?;
    Ok(LockUrl::new(ZkBackend { servers, path: format!("/{path}"), access }))
}

impl fmt::Display for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.strip_prefix('/').unwrap_or(&self.path);
        lock_access::write_cluster_url(f, "zk", &self.servers, path, &self.access)
    }
}

impl ZkBackend {
    /// Connects to the election with this session timeout.
    async fn connect(&self, session_timeout: Duration) -> Result<ZkElection, CliError> {
        let options = self.access.zk_options()?;
        ZkElection::connect_with(&self.servers, &self.path, session_timeout, options)
            .await
            .map_err(|e| CliError::Unreachable { store: "ZooKeeper", lock: self.to_string(), source: e.into() })
    }
}

impl Backend for ZkBackend {
    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let election = self.connect(request.timing.lease_duration).await?;
            let elector = election.campaign(request.identity).map_err(CliError::refused)?;
            Ok(Campaign { elector, ending: Box::new(()) })
        })
    }

    fn status_source<'a>(&'a self, _: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move {
            let session_timeout = tenure_zk::timing_of(crate::status::READ_TIMEOUT).lease_duration;
            Ok(Box::new(Status(self.connect(session_timeout).await?, self.to_string())) as Box<dyn StatusSource>)
        })
    }

    fn group_store<'a>(&'a self, group: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let options = self.access.zk_options()?;
            let store =
                tenure_zk::ZkGroupStore::connect_with(&self.servers, &self.path, options).await.map_err(|e| {
                    CliError::GroupUnreachable { store: "ZooKeeper", group: group.to_owned(), source: e.into() }
                })?;
            Ok(Arc::new(store) as Arc<dyn GroupStore>)
        })
    }
}

/// The status of a ZooKeeper election (and its URL): the lowest latch node leads.
struct Status(ZkElection, String);

impl StatusSource for Status {
    fn read(&self) -> Fut<'_, Observation> {
        Box::pin(async move {
            let leader = self.0.leader().await.map_err(|e| read_failed(&self.1, e.into()))?;
            Ok(Observation::Leader(leader.map(|leader| SessionLeader {
                identity: leader.identity,
                term: leader.term,
                key: leader.node,
                term_source: "creation zxid of the leader's node",
            })))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zk_url_names_servers_and_an_absolute_path() {
        let url: LockUrl = "zk://127.0.0.1:2181,[::1]:2182/services/a".parse().unwrap();
        assert_eq!(url.to_string(), "zk://127.0.0.1:2181,[::1]:2182/services/a");
        for bad in ["zk:/x", "zk://127.0.0.1:2181", "zk:///x", "zk://h/x", "zk://h:0/x", "zk://h:1/x/", "zk://h:1/a//b"]
        {
            assert!(matches!(bad.parse::<LockUrl>(), Err(LockUrlError::BadClusterUrl { .. })), "{bad}");
        }
    }
}
