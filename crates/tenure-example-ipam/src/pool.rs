//! The IP address pool, kept in etcd: one key per allocated address, every write fenced by the
//! election term.
//!
//! Why in etcd and fenced: the pool is the "external resource" of the example (Kuryr's Neutron
//! ports). Two leaders must never hand out the same address, and a paused ex-leader waking up must
//! not allocate or release anything: each write is one transaction comparing the leader key of
//! the writer's term ([`tenure_etcd::leader_compare`]), so etcd itself refuses a deposed term.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use tenure::Term;
use tenure_etcd::proto::etcdserverpb::{
    compare, request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use tenure_etcd::{leader_compare, EtcdElection, EtcdError};

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// etcd failed or could not be reached; nothing is known to have changed.
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    /// The writer's term no longer leads: etcd refused the write (fencing).
    #[error("term {0} no longer leads; the write was refused")]
    Fenced(Term),
    /// Every address of the pool is allocated.
    #[error("the pool of {0} addresses is exhausted")]
    Exhausted(u32),
    /// An allocation record in etcd does not parse (written by something else).
    #[error("allocation {key} is not an allocation record: {reason}")]
    BadRecord {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// What an allocation key holds: which Pod the address was allocated for, and by which term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// The Pod's uid (names are reused by churn; uids are not).
    pub pod_uid: String,
    /// The Pod's name, for humans.
    pub pod_name: String,
    /// The term that allocated it.
    pub term: u64,
}

/// One allocated address as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The address.
    pub ip: Ipv4Addr,
    /// For whom.
    pub record: AllocationRecord,
    /// etcd's create revision of the key: identifies this allocation among reuses of the address.
    pub create_revision: i64,
}

/// The pool: addresses `base + 1 ..= base + size` under `<prefix><address>` keys.
#[derive(Debug, Clone)]
pub struct IpPool {
    election: EtcdElection,
    prefix: String,
    base: Ipv4Addr,
    size: u32,
}

impl IpPool {
    /// A pool of `size` addresses after `base`, its keys under `prefix` (e.g. `ipam/ips/`).
    pub fn new(election: EtcdElection, prefix: impl Into<String>, base: Ipv4Addr, size: u32) -> IpPool {
        IpPool { election, prefix: prefix.into(), base, size }
    }

    fn key(&self, ip: Ipv4Addr) -> String {
        format!("{}{ip}", self.prefix)
    }

    /// Every allocation, read in one consistent range.
    pub async fn list(&self) -> Result<Vec<Allocation>, PoolError> {
        let range = RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: self.prefix.as_bytes().to_vec(),
                range_end: prefix_end(&self.prefix),
                ..Default::default()
            })),
        };
        let response =
            self.election.txn(TxnRequest { compare: Vec::new(), success: vec![range], failure: Vec::new() }).await?;
        let mut allocations = Vec::new();
        for op in response.responses {
            let Some(response_op::Response::ResponseRange(range)) = op.response else { continue };
            for kv in range.kvs {
                let key = String::from_utf8_lossy(&kv.key).into_owned();
                let bad = |reason: String| PoolError::BadRecord { key: key.clone(), reason };
                let ip: Ipv4Addr =
                    key.strip_prefix(&self.prefix).unwrap_or_default().parse().map_err(|e| bad(format!("{e}")))?;
                let record: AllocationRecord = serde_json::from_slice(&kv.value).map_err(|e| bad(e.to_string()))?;
                allocations.push(Allocation { ip, record, create_revision: kv.create_revision });
            }
        }
        Ok(allocations)
    }

    /// Allocates the lowest free address for the Pod, under `term`'s fence.
    pub async fn allocate(&self, term: Term, pod_uid: &str, pod_name: &str) -> Result<Allocation, PoolError> {
        let leader_key = self.election.leader_key(term).await?.ok_or(PoolError::Fenced(term))?;
        let record = AllocationRecord { pod_uid: pod_uid.to_owned(), pod_name: pod_name.to_owned(), term: term.0 };
        let value = serde_json::to_vec(&record)
            .map_err(|e| PoolError::BadRecord { key: self.prefix.clone(), reason: e.to_string() })?;
        // Only this leader allocates, so a collision means its own listing was stale: list again.
        for _ in 0..3 {
            let taken: std::collections::HashSet<Ipv4Addr> = self.list().await?.into_iter().map(|a| a.ip).collect();
            let base = u32::from(self.base);
            let Some(ip) = (1..=self.size).map(|i| Ipv4Addr::from(base + i)).find(|ip| !taken.contains(ip)) else {
                return Err(PoolError::Exhausted(self.size));
            };
            let key = self.key(ip);
            let put = RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.as_bytes().to_vec(),
                    value: value.clone(),
                    ..Default::default()
                })),
            };
            let request = TxnRequest {
                compare: vec![leader_compare(&leader_key, term), absent(&key)],
                success: vec![put],
                failure: Vec::new(),
            };
            let response = self.election.txn(request).await?;
            if response.succeeded {
                let create_revision = response.header.map(|h| h.revision).unwrap_or_default();
                return Ok(Allocation { ip, record, create_revision });
            }
            if self.election.leader_key(term).await?.is_none() {
                return Err(PoolError::Fenced(term));
            }
        }
        Err(PoolError::Exhausted(self.size))
    }

    /// Releases `ip` if it is still allocated as `create_revision` (not a later reuse), under
    /// `term`'s fence. Returns whether it was released now (false: already gone or reused).
    pub async fn release(&self, term: Term, ip: Ipv4Addr, create_revision: i64) -> Result<bool, PoolError> {
        let leader_key = self.election.leader_key(term).await?.ok_or(PoolError::Fenced(term))?;
        let key = self.key(ip);
        let delete = RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })),
        };
        let same = Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Create as i32,
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
            target_union: Some(compare::TargetUnion::CreateRevision(create_revision)),
        };
        let request = TxnRequest {
            compare: vec![leader_compare(&leader_key, term), same],
            success: vec![delete],
            failure: Vec::new(),
        };
        if self.election.txn(request).await?.succeeded {
            return Ok(true);
        }
        if self.election.leader_key(term).await?.is_none() {
            return Err(PoolError::Fenced(term));
        }
        Ok(false)
    }

    /// Releases every allocation made for the Pod `pod_uid` (its address, and any orphan a crashed
    /// leader left for it). Returns how many were released.
    pub async fn release_pod(&self, term: Term, pod_uid: &str) -> Result<usize, PoolError> {
        let mut released = 0;
        for allocation in self.list().await?.into_iter().filter(|a| a.record.pod_uid == pod_uid) {
            if self.release(term, allocation.ip, allocation.create_revision).await? {
                released += 1;
            }
        }
        Ok(released)
    }
}

/// `create_revision(key) == 0`: the key does not exist.
fn absent(key: &str) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(compare::TargetUnion::CreateRevision(0)),
    }
}

/// The end of etcd's range of keys starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
