//! A [`GroupStore`] on Kubernetes, so that the replicas of a controller can share partitions
//! ([`tenure_group`]) with nothing but the API server they already talk to.
//!
//! Layout in one namespace, every object labelled `tenure.dev/group=<group>`: a Lease per member
//! (as Kubernetes' own LeaseCandidate objects are), named `<group>-member-<hex of identity>`, with
//! the member's record as JSON in the annotation `tenure.dev/member` and its identity as
//! `holderIdentity` (so `kubectl get leases -l tenure.dev/group=G` lists the members); and a
//! ConfigMap `<group>-partitions` whose `table` key holds the partition table. The version of a
//! record is the object's `resourceVersion` (read as a number, as every API server backed by etcd
//! writes it); a compare-and-swap is an update carrying it (409 on a conflict); a create that
//! finds the object answers 409 AlreadyExists. A read is two requests whatever the group's size:
//! the ConfigMap first, then the Leases by label. Changes come from two label watches whose events
//! carry the objects, so a member at rest reads nothing (it applies the others' renews from the
//! watch). A departed member's Lease is deleted with a `resourceVersion` precondition.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions, WatchEvent, WatchParams};
use kube::Api;
use tenure_group::codec::{self, hex};
use tenure_group::record::{MemberRecord, PartitionTable};
use tenure_group::store::{Change, GroupStore, Key, RecordStream, Snapshot, StoreError, Stored, Value, Version};

use crate::object::{lock_error, Call};

/// The label every object of a group carries.
pub const GROUP_LABEL: &str = "tenure.dev/group";
/// The annotation of a member's Lease that holds its record.
pub const MEMBER_ANNOTATION: &str = "tenure.dev/member";
const TABLE_KEY: &str = "table";

/// A group's records in one namespace; one per member process (its request count is one
/// member's load on the API server).
#[derive(Clone)]
pub struct KubeGroupStore {
    leases: Api<Lease>,
    config_maps: Api<ConfigMap>,
    namespace: String,
    group: String,
    requests: Arc<AtomicU64>,
}

impl std::fmt::Debug for KubeGroupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeGroupStore").field("namespace", &self.namespace).field("group", &self.group).finish()
    }
}

fn version_of(meta: &ObjectMeta) -> Result<Version, StoreError> {
    let text = meta.resource_version.as_deref().unwrap_or_default();
    text.parse::<u64>()
        .map(Version)
        .map_err(|_| StoreError::Unavailable(format!("resourceVersion {text:?} is not a number")))
}

impl KubeGroupStore {
    /// The group `group` in `namespace`, through `client` (one client per member process).
    pub fn new(client: kube::Client, namespace: &str, group: &str) -> KubeGroupStore {
        KubeGroupStore {
            leases: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            requests: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many requests this store has sent (reads count two, watches one per opening).
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn table_name(&self) -> String {
        format!("{}-partitions", self.group)
    }

    fn member_name(&self, identity: &str) -> String {
        format!("{}-member-{}", self.group, hex(identity))
    }

    fn meta(&self, name: String, version: Option<Version>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([(GROUP_LABEL.to_owned(), self.group.clone())])),
            resource_version: version.map(|v| v.to_string()),
            ..ObjectMeta::default()
        }
    }

    fn selector(&self) -> String {
        format!("{GROUP_LABEL}={}", self.group)
    }

    /// The partition table a ConfigMap of the group holds.
    fn table_of(&self, map: &ConfigMap) -> Result<Stored<PartitionTable>, StoreError> {
        let text = map.data.as_ref().and_then(|data| data.get(TABLE_KEY)).map(String::as_str).unwrap_or_default();
        codec::decode_table(&format!("ConfigMap {}", self.table_name()), text.as_bytes(), version_of(&map.metadata)?)
    }

    /// The member record a Lease of the group holds, if it holds a valid one under its name.
    fn member_of(&self, lease: &Lease) -> Result<Option<Stored<MemberRecord>>, StoreError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let Some(text) = lease.metadata.annotations.as_ref().and_then(|a| a.get(MEMBER_ANNOTATION)) else {
            tracing::warn!(lease = %name, "a Lease of the group without a member record; ignored");
            return Ok(None);
        };
        let version = version_of(&lease.metadata)?;
        let location = format!("Lease {name}");
        Ok(codec::decode_member(&location, text.as_bytes(), version, |r| name == self.member_name(&r.identity)))
    }

    /// The identity whose Lease this is, from its name.
    fn identity_of(&self, lease: &Lease) -> Option<String> {
        let name = lease.metadata.name.as_deref()?;
        codec::unhex(name.strip_prefix(&format!("{}-member-", self.group))?)
    }

    /// The change a Lease event stands for (`None` for a bookmark or a Lease that is no record).
    fn lease_change(&self, event: WatchEvent<Lease>) -> Result<Option<Change>, StoreError> {
        match event {
            WatchEvent::Added(lease) | WatchEvent::Modified(lease) => Ok(self.member_of(&lease)?.map(|stored| {
                let key = Key::Member(stored.value.identity.clone());
                Change::Put(key, Stored { version: stored.version, value: Value::Member(stored.value) })
            })),
            WatchEvent::Deleted(lease) => Ok(self.identity_of(&lease).map(|id| Change::Deleted(Key::Member(id)))),
            WatchEvent::Bookmark(_) => Ok(None),
            WatchEvent::Error(status) => Err(StoreError::Unavailable(format!("Lease watch: {status}"))),
        }
    }

    /// The change a ConfigMap event stands for (only the group's table counts).
    fn map_change(&self, event: WatchEvent<ConfigMap>) -> Result<Option<Change>, StoreError> {
        let is_table = |map: &ConfigMap| map.metadata.name.as_deref() == Some(self.table_name().as_str());
        match event {
            WatchEvent::Added(map) | WatchEvent::Modified(map) if is_table(&map) => {
                let table = self.table_of(&map)?;
                Ok(Some(Change::Put(Key::Table, Stored { version: table.version, value: Value::Table(table.value) })))
            }
            WatchEvent::Deleted(map) if is_table(&map) => Ok(Some(Change::Deleted(Key::Table))),
            WatchEvent::Error(status) => Err(StoreError::Unavailable(format!("ConfigMap watch: {status}"))),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl GroupStore for KubeGroupStore {
    fn describe(&self) -> String {
        format!("kube://{}/group/{}", self.namespace, self.group)
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let mut snapshot = Snapshot::default();
        self.count();
        if let Some(map) = self.config_maps.get_opt(&self.table_name()).await.map_err(|e| lock_error(Call::Get, e))? {
            snapshot.table = Some(self.table_of(&map)?);
        }
        self.count();
        let leases = self
            .leases
            .list(&ListParams::default().labels(&self.selector()))
            .await
            .map_err(|e| lock_error(Call::Get, e))?;
        for lease in &leases.items {
            if let Some(stored) = self.member_of(lease)? {
                snapshot.members.insert(stored.value.identity.clone(), stored);
            }
        }
        Ok(snapshot)
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let params = PostParams::default();
        let call = if expected.is_some() { Call::Update } else { Call::Create };
        self.count();
        let meta = match (key, value) {
            (Key::Table, Value::Table(table)) => {
                let text = serde_json::to_string(table).map_err(|e| StoreError::Rejected(e.to_string()))?;
                let data = Some(BTreeMap::from([(TABLE_KEY.to_owned(), text)]));
                let map = ConfigMap { metadata: self.meta(self.table_name(), expected), data, ..ConfigMap::default() };
                let written = match expected {
                    None => self.config_maps.create(&params, &map).await,
                    Some(_) => self.config_maps.replace(&self.table_name(), &params, &map).await,
                };
                written.map_err(|e| lock_error(call, e))?.metadata
            }
            (Key::Member(identity), Value::Member(record)) => {
                let text = serde_json::to_string(record).map_err(|e| StoreError::Rejected(e.to_string()))?;
                let name = self.member_name(identity);
                let mut metadata = self.meta(name.clone(), expected);
                metadata.annotations = Some(BTreeMap::from([(MEMBER_ANNOTATION.to_owned(), text)]));
                let spec = LeaseSpec {
                    holder_identity: Some(identity.clone()),
                    lease_duration_seconds: i32::try_from(record.lease_millis.div_ceil(1000)).ok(),
                    ..LeaseSpec::default()
                };
                let lease = Lease { metadata, spec: Some(spec) };
                let written = match expected {
                    None => self.leases.create(&params, &lease).await,
                    Some(_) => self.leases.replace(&name, &params, &lease).await,
                };
                written.map_err(|e| lock_error(call, e))?.metadata
            }
            _ => return Err(StoreError::Rejected(format!("{key}: wrong kind of record"))),
        };
        version_of(&meta)
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let Key::Member(identity) = key else {
            return Err(StoreError::Rejected("the partition table is never deleted".into()));
        };
        self.count();
        let preconditions = Preconditions { resource_version: Some(expected.to_string()), uid: None };
        let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
        match self.leases.delete(&self.member_name(identity), &params).await {
            Ok(_) => Ok(()),
            // A changed or vanished Lease: the compare-and-swap failed.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Err(StoreError::Conflict),
            Err(error) => Err(lock_error(Call::Update, error)),
        }
    }

    fn watch_records(&self) -> Option<RecordStream> {
        // Two label watches from "now" (resourceVersion 0: the server may first replay what
        // exists, versions the member already has, which it ignores). Once both are open:
        // `Resync` (the member reads once, after the watches exist); then every event is a record.
        // An error (410 Gone after a compaction, the watch timeout) ends the stream; the driver
        // re-opens it after a retry period.
        let params = WatchParams::default().labels(&self.selector()).timeout(290);
        let store = self.clone();
        let opened = async move {
            store.count();
            let lease_events = store.leases.watch(&params, "0").await.map_err(|e| lock_error(Call::Watch, e))?;
            store.count();
            let map_events = store.config_maps.watch(&params, "0").await.map_err(|e| lock_error(Call::Watch, e))?;
            let (leases, maps) = (store.clone(), store);
            let lease_changes = lease_events
                .map(move |event| event.map_err(|e| lock_error(Call::Watch, e)).and_then(|e| leases.lease_change(e)));
            let map_changes = map_events
                .map(move |event| event.map_err(|e| lock_error(Call::Watch, e)).and_then(|e| maps.map_change(e)));
            Ok::<_, StoreError>(futures::stream::select(lease_changes.boxed(), map_changes.boxed()))
        };
        let stream = futures::stream::once(opened)
            .map(|opened| match opened {
                Ok(changes) => futures::stream::once(async { Ok(Some(Change::Resync)) }).chain(changes).boxed(),
                Err(error) => futures::stream::once(async move { Err(error) }).boxed(),
            })
            .flatten()
            .try_filter_map(|change| futures::future::ready(Ok(change)));
        Some(Box::pin(stream))
    }
}
