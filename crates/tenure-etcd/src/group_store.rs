//! A [`GroupStore`] on etcd, so that the replicas of a service can share partitions
//! ([`tenure_group`]) with the etcd cluster they already elect on.
//!
//! Layout under the group's prefix `<group>/`: the key `<group>/table` holds the partition table,
//! and `<group>/members/<identity>` each member's record, both as JSON (`etcdctl get --prefix`
//! shows the group). The version of a record is its key's `mod_revision`, which etcd never reuses;
//! a write is a transaction comparing it (or, for a create, `create_revision == 0`) before the put;
//! a read is one range over the prefix, so a snapshot is consistent at one revision; changes come
//! from one prefix watch.
//!
//! Member keys are not bound to an etcd lease: a dead member's record must stay readable so that
//! the others end its epoch by compare-and-swap after its lease ran out on their own clocks (the
//! core's rule, the same on every backend). A key deleted by the server at lease expiry would let
//! a member claim partitions while the old owner's client-side deadline may still be running.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_group::record::{MemberRecord, PartitionTable};
use tenure_group::store::{ChangeStream, GroupStore, Key, Snapshot, StoreError, Stored, Value, Version};
use tonic::Code;

use crate::client::{self, Connection};
use crate::proto::etcdserverpb::{compare, request_op, Compare, PutRequest, RequestOp, TxnRequest};
use crate::EtcdError;

/// Time limit of one call of the store (a read, a write, opening the watch).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const TABLE: &str = "table";
const MEMBERS: &str = "members/";

/// A group's records on an etcd cluster; one per member process (each has its own connection, so
/// [`EtcdGroupStore::requests_sent`] counts one member's load).
#[derive(Debug, Clone)]
pub struct EtcdGroupStore {
    conn: Arc<Connection>,
    prefix: String,
}

impl EtcdGroupStore {
    /// Connects to the cluster at `endpoints` (`host:port`, several for failover), checks that one
    /// of them answers, and uses the keys under `<group>/`.
    pub async fn connect(endpoints: &[String], group: &str) -> Result<EtcdGroupStore, EtcdError> {
        if group.is_empty() {
            return Err(EtcdError::EmptyElection);
        }
        let options = crate::EtcdOptions::new();
        let store =
            EtcdGroupStore { conn: Arc::new(Connection::new(endpoints, &options)?), prefix: format!("{group}/") };
        let probe = crate::proto::etcdserverpb::RangeRequest {
            limit: 1,
            keys_only: true,
            ..client::prefix_range(&store.prefix)
        };
        store.conn.range(CALL_TIMEOUT, probe).await?;
        Ok(store)
    }

    /// How many requests this store has sent (reads, writes, watch creations): one member's load
    /// on the cluster.
    pub fn requests_sent(&self) -> u64 {
        self.conn.requests_sent()
    }

    /// The etcd key of a record.
    pub fn key_of(&self, key: &Key) -> String {
        match key {
            Key::Table => format!("{}{TABLE}", self.prefix),
            Key::Member(identity) => format!("{}{MEMBERS}{identity}", self.prefix),
        }
    }
}

/// The group store's view of an etcd failure.
fn store_error(error: EtcdError) -> StoreError {
    match error {
        EtcdError::Timeout(limit) => StoreError::Timeout(limit),
        EtcdError::Rpc {
            code: Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated | Code::FailedPrecondition,
            ..
        } => StoreError::Rejected(error.to_string()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn version_of(revision: i64) -> Result<Version, StoreError> {
    u64::try_from(revision)
        .map(Version)
        .map_err(|_| StoreError::Unavailable(format!("etcd returned a negative revision {revision}")))
}

#[async_trait]
impl GroupStore for EtcdGroupStore {
    fn describe(&self) -> String {
        format!("etcd prefix {:?}", self.prefix)
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let response = self.conn.range(CALL_TIMEOUT, client::prefix_range(&self.prefix)).await.map_err(store_error)?;
        let mut snapshot = Snapshot::default();
        for kv in response.kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some(name) = key.strip_prefix(&self.prefix) else { continue };
            let version = version_of(kv.mod_revision)?;
            if name == TABLE {
                let table = serde_json::from_slice::<PartitionTable>(&kv.value)
                    .map_err(|error| StoreError::Rejected(format!("corrupt partition table at {key}: {error}")))?;
                snapshot.table = Some(Stored { version, value: table });
            } else if let Some(identity) = name.strip_prefix(MEMBERS) {
                match serde_json::from_slice::<MemberRecord>(&kv.value) {
                    Ok(record) if record.identity == identity => {
                        snapshot.members.insert(identity.to_owned(), Stored { version, value: record });
                    }
                    Ok(record) => {
                        tracing::warn!(key = %key, identity = %record.identity, "member record under another identity's key; ignored");
                    }
                    Err(error) => tracing::warn!(key = %key, %error, "member record does not parse; ignored"),
                }
            }
        }
        Ok(snapshot)
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let document = match (key, value) {
            (Key::Table, Value::Table(table)) => serde_json::to_vec(table),
            (Key::Member(_), Value::Member(record)) => serde_json::to_vec(record),
            _ => return Err(StoreError::Rejected(format!("{key}: wrong kind of record"))),
        }
        .map_err(|error| StoreError::Rejected(format!("{key}: cannot encode: {error}")))?;
        let etcd_key = self.key_of(key);
        let condition = match expected {
            None => Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Create as i32,
                key: etcd_key.as_bytes().to_vec(),
                range_end: Vec::new(),
                target_union: Some(compare::TargetUnion::CreateRevision(0)),
            },
            Some(version) => Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Mod as i32,
                key: etcd_key.as_bytes().to_vec(),
                range_end: Vec::new(),
                target_union: Some(compare::TargetUnion::ModRevision(i64::try_from(version.0).unwrap_or(i64::MAX))),
            },
        };
        let put = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: etcd_key.into_bytes(),
                value: document,
                ..Default::default()
            })),
        };
        let request = TxnRequest { compare: vec![condition], success: vec![put], failure: Vec::new() };
        let response = self.conn.txn(CALL_TIMEOUT, request).await.map_err(store_error)?;
        if !response.succeeded {
            return Err(if expected.is_none() { StoreError::AlreadyExists } else { StoreError::Conflict });
        }
        let revision = response
            .header
            .map(|header| header.revision)
            .ok_or_else(|| StoreError::Unavailable("etcd answered a transaction without a header".into()))?;
        version_of(revision)
    }

    fn watch(&self) -> Option<ChangeStream> {
        let conn = self.conn.clone();
        let prefix = self.prefix.clone();
        // The watch opens on the first poll; every batch of events is one notification. An error
        // ends the stream (the driver re-opens it after a retry period and reads a snapshot).
        let stream = futures::stream::unfold(Some(None), move |state| {
            let conn = conn.clone();
            let prefix = prefix.clone();
            async move {
                let mut watch = match state? {
                    Some(watch) => watch,
                    None => match conn.watch_prefix(CALL_TIMEOUT, &prefix, 0).await {
                        Ok(watch) => watch,
                        Err(error) => return Some((Err(store_error(error)), None)),
                    },
                };
                loop {
                    match watch.next(&conn).await {
                        Ok(response) if response.canceled => {
                            let reason = format!("etcd cancelled the group watch: {}", response.cancel_reason);
                            return Some((Err(StoreError::Unavailable(reason)), None));
                        }
                        Ok(response) if response.events.is_empty() => continue,
                        Ok(_) => return Some((Ok(()), Some(Some(watch)))),
                        Err(error) => return Some((Err(store_error(error)), None)),
                    }
                }
            }
        });
        Some(Box::pin(stream))
    }
}
