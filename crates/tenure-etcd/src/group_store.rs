//! A [`GroupStore`] on etcd, so that the replicas of a service can share partitions
//! ([`tenure_group`]) with the etcd cluster they already elect on.
//!
//! Layout under the group's prefix `<group>/`: the key `<group>/table` holds the partition table,
//! and `<group>/members/<identity>` each member's record, both as JSON (`etcdctl get --prefix`
//! shows the group). The version of a record is its key's `mod_revision`, which etcd never reuses;
//! a write is a transaction comparing it (or, for a create, `create_revision == 0`) before the put;
//! a read is one range over the prefix, so a snapshot is consistent at one revision; changes come
//! from one prefix watch, whose events carry the records (so a member at rest reads nothing: it
//! applies the others' renews from the watch). A departed member's record is deleted by a
//! transaction comparing its `mod_revision`.
//!
//! Member keys are not bound to an etcd lease: a dead member's record must stay readable so that
//! the others end its epoch by compare-and-swap after its lease ran out on their own clocks (the
//! core's rule, the same on every backend). A key deleted by the server at lease expiry would let
//! a member claim partitions while the old owner's client-side deadline may still be running.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_group::codec;
use tenure_group::store::{Change, GroupStore, Key, RecordStream, Snapshot, StoreError, Value, Version};
use tonic::Code;

use crate::client::{self, Connection};
use crate::proto::etcdserverpb::{compare, request_op, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
use crate::proto::mvccpb::event::EventType;
use crate::{EtcdError, EtcdOptions};

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
        Self::connect_with(endpoints, group, &EtcdOptions::new()).await
    }

    /// Connects like [`EtcdGroupStore::connect`] with TLS and a user as `options` say: the same
    /// access as an election's ([`crate::EtcdElection::connect_with`]), so a group can live on a
    /// secured cluster.
    pub async fn connect_with(
        endpoints: &[String], group: &str, options: &EtcdOptions,
    ) -> Result<EtcdGroupStore, EtcdError> {
        if group.is_empty() {
            return Err(EtcdError::EmptyElection);
        }
        let store =
            EtcdGroupStore { conn: Arc::new(Connection::new(endpoints, options)?), prefix: format!("{group}/") };
        let prefix = client::prefix_range(&store.prefix);
        let probe = crate::proto::etcdserverpb::RangeRequest { limit: 1, keys_only: true, ..prefix };
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

    /// The record an etcd key holds, if it is one of the group's.
    fn record_key(&self, etcd_key: &[u8]) -> Option<Key> {
        let name = std::str::from_utf8(etcd_key).ok()?.strip_prefix(&self.prefix)?;
        if name == TABLE {
            return Some(Key::Table);
        }
        name.strip_prefix(MEMBERS).map(|identity| Key::Member(identity.to_owned()))
    }

    /// A transaction that runs `then` only if the record at `etcd_key` is at `expected` (`None`:
    /// does not exist).
    fn if_at(etcd_key: &str, expected: Option<Version>, then: request_op::Request) -> TxnRequest {
        let condition = match expected {
            None => client::create_revision_is(etcd_key, 0),
            Some(version) => {
                let revision = i64::try_from(version.0).unwrap_or(i64::MAX);
                client::revision_is(etcd_key, compare::CompareTarget::Mod, compare::TargetUnion::ModRevision(revision))
            }
        };
        TxnRequest { compare: vec![condition], success: vec![RequestOp { request: Some(then) }], failure: Vec::new() }
    }

    /// The changes of one watch response, in order.
    fn changes_of(&self, events: Vec<crate::proto::mvccpb::Event>) -> Result<Vec<Change>, StoreError> {
        let mut changes = Vec::new();
        for event in events {
            let Some(kv) = event.kv else { continue };
            let Some(key) = self.record_key(&kv.key) else { continue };
            if event.r#type == EventType::Delete as i32 {
                changes.push(Change::Deleted(key));
                continue;
            }
            let location = String::from_utf8_lossy(&kv.key).into_owned();
            if let Some(stored) = codec::decode(&key, &location, &kv.value, version_of(kv.mod_revision)?)? {
                changes.push(Change::Put(key, stored));
            }
        }
        Ok(changes)
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
            let location = String::from_utf8_lossy(&kv.key);
            let version = version_of(kv.mod_revision)?;
            match self.record_key(&kv.key) {
                Some(Key::Table) => snapshot.table = Some(codec::decode_table(&location, &kv.value, version)?),
                Some(Key::Member(identity)) => {
                    if let Some(stored) =
                        codec::decode_member(&location, &kv.value, version, |record| record.identity == identity)
                    {
                        snapshot.members.insert(identity, stored);
                    }
                }
                None => {}
            }
        }
        Ok(snapshot)
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let document = codec::encode(key, value)?;
        let etcd_key = self.key_of(key);
        let put = PutRequest { key: etcd_key.clone().into_bytes(), value: document, ..Default::default() };
        let put = request_op::Request::RequestPut(put);
        let response = self.conn.txn(CALL_TIMEOUT, Self::if_at(&etcd_key, expected, put)).await.map_err(store_error)?;
        if !response.succeeded {
            return Err(if expected.is_none() { StoreError::AlreadyExists } else { StoreError::Conflict });
        }
        let no_header = || StoreError::Unavailable("etcd answered a transaction without a header".into());
        version_of(response.header.ok_or_else(no_header)?.revision)
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let etcd_key = self.key_of(key);
        let delete = DeleteRangeRequest { key: etcd_key.clone().into_bytes(), ..Default::default() };
        let delete = request_op::Request::RequestDeleteRange(delete);
        let response =
            self.conn.txn(CALL_TIMEOUT, Self::if_at(&etcd_key, Some(expected), delete)).await.map_err(store_error)?;
        response.succeeded.then_some(()).ok_or(StoreError::Conflict)
    }

    fn watch_records(&self) -> Option<RecordStream> {
        let store = self.clone();
        // The watch opens on the first poll and then says `Resync` (the member reads once, after
        // the watch is in place, so nothing falls between the two); every event after that is a
        // record. An error ends the stream (the driver re-opens it after a retry period).
        let stream = futures::stream::unfold(Some((None, VecDeque::new())), move |state| {
            let store = store.clone();
            async move {
                let (watch, mut ready) = state?;
                if let Some(change) = ready.pop_front() {
                    return Some((Ok(change), Some((watch, ready))));
                }
                let mut watch = match watch {
                    Some(watch) => watch,
                    None => match store.conn.watch_prefix(CALL_TIMEOUT, &store.prefix, 0).await {
                        Ok(watch) => return Some((Ok(Change::Resync), Some((Some(watch), ready)))),
                        Err(error) => return Some((Err(store_error(error)), None)),
                    },
                };
                loop {
                    match watch.next(&store.conn).await {
                        Ok(response) if response.canceled => {
                            let reason = format!("etcd cancelled the group watch: {}", response.cancel_reason);
                            return Some((Err(StoreError::Unavailable(reason)), None));
                        }
                        Ok(response) => match store.changes_of(response.events) {
                            Ok(changes) => {
                                ready.extend(changes);
                                if let Some(change) = ready.pop_front() {
                                    return Some((Ok(change), Some((Some(watch), ready))));
                                }
                            }
                            Err(error) => return Some((Err(error), None)),
                        },
                        Err(error) => return Some((Err(store_error(error)), None)),
                    }
                }
            }
        });
        Some(Box::pin(stream))
    }
}
