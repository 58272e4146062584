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
//! the ConfigMap first, then the Leases by label. Changes come from two label watches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kube::Api;
use tenure_group::record::{MemberRecord, PartitionTable};
use tenure_group::store::{ChangeStream, GroupStore, Key, Snapshot, StoreError, Stored, Value, Version};

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

fn hex(identity: &str) -> String {
    identity.bytes().map(|b| format!("{b:02x}")).collect()
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
}

#[async_trait]
impl GroupStore for KubeGroupStore {
    fn describe(&self) -> String {
        format!("kube://{}/group/{}", self.namespace, self.group)
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let mut snapshot = Snapshot::default();
        self.count();
        let table_name = self.table_name();
        if let Some(map) = self.config_maps.get_opt(&table_name).await.map_err(|e| lock_error(Call::Get, e))? {
            let text = map.data.as_ref().and_then(|data| data.get(TABLE_KEY)).cloned().unwrap_or_default();
            let table = serde_json::from_str::<PartitionTable>(&text)
                .map_err(|e| StoreError::Rejected(format!("corrupt partition table in ConfigMap {table_name}: {e}")))?;
            snapshot.table = Some(Stored { version: version_of(&map.metadata)?, value: table });
        }
        self.count();
        let leases = self
            .leases
            .list(&ListParams::default().labels(&self.selector()))
            .await
            .map_err(|e| lock_error(Call::Get, e))?;
        for lease in leases.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let text = lease.metadata.annotations.as_ref().and_then(|a| a.get(MEMBER_ANNOTATION));
            match text.map(|text| serde_json::from_str::<MemberRecord>(text)) {
                Some(Ok(record)) if name == self.member_name(&record.identity) => {
                    let version = version_of(&lease.metadata)?;
                    snapshot.members.insert(record.identity.clone(), Stored { version, value: record });
                }
                Some(Ok(record)) => {
                    tracing::warn!(lease = %name, identity = %record.identity, "member record under another identity's Lease; ignored")
                }
                Some(Err(error)) => tracing::warn!(lease = %name, %error, "member record does not parse; ignored"),
                None => tracing::warn!(lease = %name, "a Lease of the group without a member record; ignored"),
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
                let map = ConfigMap {
                    metadata: self.meta(self.table_name(), expected),
                    data: Some(BTreeMap::from([(TABLE_KEY.to_owned(), text)])),
                    ..ConfigMap::default()
                };
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
                let lease = Lease {
                    metadata,
                    spec: Some(LeaseSpec {
                        holder_identity: Some(identity.clone()),
                        lease_duration_seconds: i32::try_from(record.lease_millis.div_ceil(1000)).ok(),
                        ..LeaseSpec::default()
                    }),
                };
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

    fn watch(&self) -> Option<ChangeStream> {
        // Two label watches from "now" (resourceVersion 0: the server may first replay what
        // exists, which only costs a read); every event is one notification, an error ends the
        // stream (the driver re-opens it after a retry period).
        let params = WatchParams::default().labels(&self.selector()).timeout(290);
        let (leases, maps) = (self.leases.clone(), self.config_maps.clone());
        let store = self.clone();
        let opened = async move {
            store.count();
            let lease_events = leases.watch(&params, "0").await.map_err(|e| lock_error(Call::Watch, e))?;
            store.count();
            let map_events = maps.watch(&params, "0").await.map_err(|e| lock_error(Call::Watch, e))?;
            let lease_events = lease_events.map_ok(|event| matches!(event, WatchEvent::Bookmark(_))).boxed();
            let map_events = map_events.map_ok(|event| matches!(event, WatchEvent::Bookmark(_))).boxed();
            Ok::<_, StoreError>(futures::stream::select(lease_events, map_events))
        };
        let stream = futures::stream::once(opened)
            .map(|opened| match opened {
                Ok(events) => events.map_err(|e| lock_error(Call::Watch, e)).boxed(),
                Err(error) => futures::stream::once(async move { Err(error) }).boxed(),
            })
            .flatten()
            .try_filter(|bookmark| futures::future::ready(!*bookmark))
            .map_ok(|_| ());
        Some(Box::pin(stream))
    }
}
