//! `etcd://host:port[,host:port...]/name`: an etcd election (native elector: the protocol of
//! etcd's concurrency package, shared with `etcdctl elect name`). `--ttl` is the lease TTL.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tenure::Term;
use tenure_etcd::proto::etcdserverpb::{request_op, PutRequest, RequestOp, TxnRequest};
use tenure_etcd::{EtcdElection, EtcdGroupStore, FencedTxnError};
use tenure_group::store::GroupStore;
use tenure_kube::ClusterOptions;

use super::StatusSource;
use super::{lock_failed, Backend, Campaign, CampaignRequest, Fut, LockUrl, LockUrlError, Observation, SessionStatus};
use crate::error::CliError;
use crate::lock_access::{self, ClusterAccess};

/// An etcd election: the endpoints (tried in turn), the election name (a key prefix), and the
/// TLS files and user (`?cacert=&cert=&key=`, `USER@`).
#[derive(Debug, Clone)]
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
    fn nested(&self, name: &str) -> Option<LockUrl> {
        Some(Arc::new(EtcdBackend { election: format!("{}/{name}", self.election), ..self.clone() }))
    }

    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            request.refuse_coordinated(self)?;
            let election = self.connect().await?;
            let elector = election.campaign(request.identity, request.timing.lease_duration);
            Ok(Campaign { elector: elector.map_err(CliError::refused)?, ending: Box::new(()) })
        })
    }

    /// Puts `content` at the etcd key `target` in a transaction etcd applies only while the
    /// election key of `term` leads ([`EtcdElection::fenced_txn`]).
    fn write_fenced<'a>(&'a self, term: Term, target: &'a Path, content: Vec<u8>) -> Fut<'a, ()> {
        Box::pin(async move {
            let key = target.as_os_str().as_encoded_bytes().to_vec();
            let put = PutRequest { key, value: content, ..Default::default() };
            let success = vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }];
            let request = TxnRequest { success, ..Default::default() };
            match self.connect().await?.fenced_txn(term, request).await {
                Ok(_) => Ok(()),
                Err(deposed @ FencedTxnError::Deposed { .. }) => Err(CliError::Deposed(deposed.to_string())),
                Err(error) => Err(lock_failed("write fenced by", &self.to_string())(error)),
            }
        })
    }

    fn status_source<'a>(&'a self, _: &'a ClusterOptions) -> Fut<'a, Box<dyn StatusSource>> {
        Box::pin(async move { Ok(Box::new(SessionStatus(self.connect().await?, self.to_string())) as _) })
    }

    fn group_store<'a>(&'a self, group: &'a str, _: &'a str, _: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            let options = self.access.etcd_options()?;
            let connected = EtcdGroupStore::connect_with(&self.endpoints, &self.election, &options).await;
            super::group_store("etcd", group, connected)
        })
    }
}

impl StatusSource for SessionStatus<EtcdElection> {
    fn read(&self) -> Fut<'_, Observation> {
        Box::pin(async move {
            let leader = self.0.leader().await.map_err(lock_failed("read", &self.1))?;
            let leader = leader.map(|l| (l.identity, l.term, l.key));
            Ok(Observation::Leader(leader, "create revision of the leader's key"))
        })
    }
}
