//! `zk://host:port[,host:port...]/path`: a ZooKeeper election (native elector: ephemeral
//! sequential nodes, compatible with Curator's LeaderLatch). `--ttl` is the session timeout.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tenure::Term;
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;
use tenure_zk::{zk, FencedMultiError, ZkElection, ZkGroupStore};

use super::StatusSource;
use super::{lock_failed, Backend, Campaign, CampaignRequest, Fut, LockUrl, LockUrlError, Observation, SessionStatus};
use crate::error::CliError;
use crate::lock_access::{self, ClusterAccess};

/// A ZooKeeper election: the connection string (`host:port[,host:port...]`), the election path
/// (absolute), and the digest user (`USER@`, `?password-file=`).
#[derive(Debug, Clone)]
pub struct ZkBackend {
    servers: String,
    path: String,
    access: ClusterAccess,
}

/// Parses `zk://[USER@]host:port[,host:port...]/path[?query]`.
pub(super) fn parse(text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    let (servers, path, access) = lock_access::parse_cluster_url(text, "zk", rest, lock_access::Backend::Zk)?;
    Ok(Arc::new(ZkBackend { servers, path: format!("/{path}"), access }))
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
        let connected = ZkElection::connect_with(&self.servers, &self.path, session_timeout, options).await;
        connected.map_err(|e| CliError::Unreachable { store: "ZooKeeper", lock: self.to_string(), source: e.into() })
    }
}

impl Backend for ZkBackend {
    fn nested(&self, name: &str) -> Option<LockUrl> {
        Some(Arc::new(ZkBackend { path: format!("{}/{name}", self.path.trim_end_matches('/')), ..self.clone() }))
    }

    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let elector = self.connect(request.timing.lease_duration).await?.campaign(request.identity);
            Ok(Campaign { elector: elector.map_err(CliError::refused)?, ending: Box::new(()) })
        })
    }

    /// Sets the data of the node `target` (created, open to all, when missing) in a
    /// multi-operation ZooKeeper applies only while the node of `term` leads
    /// ([`ZkElection::fenced_multi`]).
    fn write_fenced<'a>(&'a self, term: Term, target: &'a Path, content: Vec<u8>) -> Fut<'a, ()> {
        Box::pin(async move {
            let Some(node) = target.to_str().filter(|path| path.starts_with('/')) else {
                return Err(CliError::Ended("on ZooKeeper the target is an absolute node path, such as /app/state"));
            };
            let election = self.connect(tenure_zk::timing_of(super::READ_TIMEOUT).lease_duration).await?;
            let set = |multi: &mut zk::MultiWriter<'_>| multi.add_set_data(node, &content, None);
            let mut written = election.fenced_multi(term, set).await;
            if matches!(written, Err(FencedMultiError::Operation { source: zk::Error::NoNode, .. })) {
                let create = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                written = election.fenced_multi(term, |multi| multi.add_create(node, &content, &create)).await;
            }
            match written {
                Ok(_) => Ok(()),
                Err(deposed @ FencedMultiError::Deposed { .. }) => Err(CliError::Deposed(deposed.to_string())),
                Err(error) => Err(lock_failed("write fenced by", &self.to_string())(error)),
            }
        })
    }

    fn status_source<'a>(&'a self, _: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move {
            let election = self.connect(tenure_zk::timing_of(super::READ_TIMEOUT).lease_duration).await?;
            Ok(Box::new(SessionStatus(election, self.to_string())) as _)
        })
    }

    fn group_store<'a>(&'a self, group: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let options = self.access.zk_options()?;
            super::group_store("ZooKeeper", group, ZkGroupStore::connect_with(&self.servers, &self.path, options).await)
        })
    }
}

impl StatusSource for SessionStatus<ZkElection> {
    fn read(&self) -> Fut<'_, Observation> {
        Box::pin(async move {
            let leader = self.0.leader().await.map_err(lock_failed("read", &self.1))?;
            let leader = leader.map(|l| (l.identity, l.term, l.node));
            Ok(Observation::Leader(leader, "creation zxid of the leader's node"))
        })
    }
}
