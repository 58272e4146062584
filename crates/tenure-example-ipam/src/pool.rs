//! The IP address pool, kept in etcd: one key per allocated address, every write fenced.
//!
//! Why in etcd and fenced: the pool is the "external resource" of the example (Kuryr's Neutron
//! ports). Two owners must never hand out the same address, and a paused ex-owner waking up must
//! not allocate or release anything: each write is one transaction that also compares a fencing
//! token ([`Fence`]), so etcd itself refuses a deposed writer:
//!
//! - Active/Passive: the leader key of the writer's election term must still exist
//!   ([`tenure_etcd::leader_compare`]);
//! - Active/Active: the partition's fence key must hold the writer's partition term. A partition's
//!   terms strictly increase (tenure-group), so each partition keeps its own latest term, not a
//!   global one: a new owner raises its partition's fence ([`IpPool::open_partition`]) before it
//!   works on it, and from then on every write under an older term of that partition is refused,
//!   while writes to other partitions are untouched.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenure::Term;
use tenure_etcd::proto::etcdserverpb::{
    compare, request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    TxnResponse,
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
    /// A partition write under a term the partition's fence has not been raised to
    /// ([`IpPool::open_partition`] was not called for this ownership).
    #[error("partition {partition} was not opened under term {term}")]
    NotOpened {
        /// The partition.
        partition: u32,
        /// The writer's term.
        term: Term,
    },
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

/// Who may write to the pool, and what etcd compares to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Active/Passive: the election's leader key created at this term must still exist.
    Leader(Term),
    /// Active/Active: the partition's fence key must hold exactly this term.
    Partition {
        /// The partition of the Pod's key (`namespace/name`).
        partition: u32,
        /// The term under which the writer owns the partition.
        term: Term,
    },
}

impl Fence {
    fn term(&self) -> Term {
        match self {
            Fence::Leader(term) | Fence::Partition { term, .. } => *term,
        }
    }
}

impl From<Term> for Fence {
    fn from(term: Term) -> Fence {
        Fence::Leader(term)
    }
}

/// The pool: addresses `base + 1 ..= base + size` under `<prefix><address>` keys; partition fences
/// under `<prefix without its last '/'>-fences/<partition>`.
#[derive(Debug, Clone)]
pub struct IpPool {
    election: EtcdElection,
    prefix: String,
    fence_prefix: String,
    base: Ipv4Addr,
    size: u32,
    call_delay: Duration,
}

/// A fence value: the term as 20 zero-padded digits, so that etcd's byte order of values is the
/// numeric order of terms.
fn encode_term(term: Term) -> Vec<u8> {
    format!("{:020}", term.0).into_bytes()
}

impl IpPool {
    /// A pool of `size` addresses after `base`, its keys under `prefix` (e.g. `ipam/ips/`).
    pub fn new(election: EtcdElection, prefix: impl Into<String>, base: Ipv4Addr, size: u32) -> IpPool {
        let prefix = prefix.into();
        let fence_prefix = format!("{}-fences/", prefix.trim_end_matches('/'));
        IpPool { election, prefix, fence_prefix, base, size, call_delay: Duration::ZERO }
    }

    /// Adds `delay` before every call to etcd. Why: a real IPAM (Neutron) answers in tens of
    /// milliseconds, not in the loopback etcd's fraction of one; the throughput benchmark models a
    /// controller whose handling is dominated by such calls.
    #[must_use]
    pub fn with_call_delay(mut self, delay: Duration) -> IpPool {
        self.call_delay = delay;
        self
    }

    fn key(&self, ip: Ipv4Addr) -> String {
        format!("{}{ip}", self.prefix)
    }

    /// The etcd key of a partition's fence.
    pub fn fence_key(&self, partition: u32) -> String {
        format!("{}{partition}", self.fence_prefix)
    }

    async fn delay(&self) {
        if !self.call_delay.is_zero() {
            tokio::time::sleep(self.call_delay).await;
        }
    }

    async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, PoolError> {
        self.delay().await;
        Ok(self.election.txn(request).await?)
    }

    /// The comparison that holds while `fence` may write.
    async fn fence_compare(&self, fence: Fence) -> Result<Compare, PoolError> {
        match fence {
            Fence::Leader(term) => {
                self.delay().await;
                let leader_key = self.election.leader_key(term).await?.ok_or(PoolError::Fenced(term))?;
                Ok(leader_compare(&leader_key, term))
            }
            Fence::Partition { partition, term } => Ok(equal(
                &self.fence_key(partition),
                compare::CompareTarget::Value,
                compare::TargetUnion::Value(encode_term(term)),
            )),
        }
    }

    /// After a refused transaction: the error if the fence no longer lets `fence` write, `Ok` if
    /// it does (so another comparison failed).
    async fn check_fence(&self, fence: Fence) -> Result<(), PoolError> {
        self.delay().await;
        match fence {
            Fence::Leader(term) => self.election.leader_key(term).await?.map(|_| ()).ok_or(PoolError::Fenced(term)),
            Fence::Partition { partition, term } => {
                let current = self.election.get(&self.fence_key(partition)).await?.map(|kv| kv.value);
                match current {
                    Some(value) if value == encode_term(term) => Ok(()),
                    Some(value) if value > encode_term(term) => Err(PoolError::Fenced(term)),
                    _ => Err(PoolError::NotOpened { partition, term }),
                }
            }
        }
    }

    /// Raises the fence of `partition` to `term`, so that every later write under an older term of
    /// this partition is refused by etcd. Call it when an ownership starts, before any work on the
    /// partition. Fails with [`PoolError::Fenced`] if the fence already holds a newer term.
    pub async fn open_partition(&self, partition: u32, term: Term) -> Result<(), PoolError> {
        let key = self.fence_key(partition);
        let value = encode_term(term);
        loop {
            self.delay().await;
            let current = self.election.get(&key).await?;
            let condition = match &current {
                Some(kv) if kv.value == value => return Ok(()),
                Some(kv) if kv.value > value => return Err(PoolError::Fenced(term)),
                Some(kv) => {
                    equal(&key, compare::CompareTarget::Mod, compare::TargetUnion::ModRevision(kv.mod_revision))
                }
                None => absent(&key),
            };
            let request =
                TxnRequest { compare: vec![condition], success: vec![put(&key, value.clone())], failure: Vec::new() };
            if self.txn(request).await?.succeeded {
                return Ok(());
            }
            // Someone else moved the fence meanwhile: read it again.
        }
    }

    /// The term a partition's fence holds, if it was ever opened.
    pub async fn fence_of(&self, partition: u32) -> Result<Option<Term>, PoolError> {
        let Some(kv) = self.election.get(&self.fence_key(partition)).await? else { return Ok(None) };
        let text = String::from_utf8_lossy(&kv.value).into_owned();
        let term = text
            .parse::<u64>()
            .map_err(|e| PoolError::BadRecord { key: self.fence_key(partition), reason: format!("{text:?}: {e}") })?;
        Ok(Some(Term(term)))
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
        let response = self.txn(TxnRequest { compare: Vec::new(), success: vec![range], failure: Vec::new() }).await?;
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

    /// Allocates a free address for the Pod, under `fence`. A leader takes the lowest free
    /// address (it is the only writer); partition owners write concurrently, so each starts its
    /// search at a random address to make collisions rare.
    pub async fn allocate(
        &self,
        fence: impl Into<Fence>,
        pod_uid: &str,
        pod_name: &str,
    ) -> Result<Allocation, PoolError> {
        let fence = fence.into();
        let condition = self.fence_compare(fence).await?;
        let term = fence.term();
        let record = AllocationRecord { pod_uid: pod_uid.to_owned(), pod_name: pod_name.to_owned(), term: term.0 };
        let value = serde_json::to_vec(&record)
            .map_err(|e| PoolError::BadRecord { key: self.prefix.clone(), reason: e.to_string() })?;
        let attempts = match fence {
            Fence::Leader(_) => 3,
            Fence::Partition { .. } => 8,
        };
        // A collision means the listing was stale (another owner, or this one's own earlier write
        // not yet listed): list again.
        for _ in 0..attempts {
            let taken: std::collections::HashSet<Ipv4Addr> = self.list().await?.into_iter().map(|a| a.ip).collect();
            let base = u32::from(self.base);
            let start = match fence {
                Fence::Leader(_) => 0,
                Fence::Partition { .. } => rand::random::<u32>() % self.size.max(1),
            };
            let Some(ip) = (0..self.size)
                .map(|i| Ipv4Addr::from(base + 1 + (start + i) % self.size))
                .find(|ip| !taken.contains(ip))
            else {
                return Err(PoolError::Exhausted(self.size));
            };
            let key = self.key(ip);
            let (compare, success) = (vec![condition.clone(), absent(&key)], vec![put(&key, value.clone())]);
            let request = TxnRequest { compare, success, failure: Vec::new() };
            let response = self.txn(request).await?;
            if response.succeeded {
                let create_revision = response.header.map(|h| h.revision).unwrap_or_default();
                return Ok(Allocation { ip, record, create_revision });
            }
            self.check_fence(fence).await?;
        }
        Err(PoolError::Exhausted(self.size))
    }

    /// Releases `ip` if it is still allocated as `create_revision` (not a later reuse), under
    /// `fence`. Returns whether it was released now (false: already gone or reused).
    pub async fn release(
        &self,
        fence: impl Into<Fence>,
        ip: Ipv4Addr,
        create_revision: i64,
    ) -> Result<bool, PoolError> {
        let fence = fence.into();
        let condition = self.fence_compare(fence).await?;
        let key = self.key(ip);
        let delete = RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })),
        };
        let same = equal(&key, compare::CompareTarget::Create, compare::TargetUnion::CreateRevision(create_revision));
        let request = TxnRequest { compare: vec![condition, same], success: vec![delete], failure: Vec::new() };
        if self.txn(request).await?.succeeded {
            return Ok(true);
        }
        self.check_fence(fence).await?;
        Ok(false)
    }

    /// Releases every allocation made for the Pod `pod_uid` (its address, and any orphan a crashed
    /// owner left for it). Returns how many were released.
    pub async fn release_pod(&self, fence: impl Into<Fence>, pod_uid: &str) -> Result<usize, PoolError> {
        let fence = fence.into();
        let mut released = 0;
        for allocation in self.list().await?.into_iter().filter(|a| a.record.pod_uid == pod_uid) {
            if self.release(fence, allocation.ip, allocation.create_revision).await? {
                released += 1;
            }
        }
        Ok(released)
    }
}

/// The comparison that `key`'s `target` equals `value`.
fn equal(key: &str, target: compare::CompareTarget, value: compare::TargetUnion) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(value),
    }
}

/// `create_revision(key) == 0`: the key does not exist.
fn absent(key: &str) -> Compare {
    equal(key, compare::CompareTarget::Create, compare::TargetUnion::CreateRevision(0))
}

/// The operation that writes `value` at `key`.
fn put(key: &str, value: Vec<u8>) -> RequestOp {
    let put = PutRequest { key: key.as_bytes().to_vec(), value, ..Default::default() };
    RequestOp { request: Some(request_op::Request::RequestPut(put)) }
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
