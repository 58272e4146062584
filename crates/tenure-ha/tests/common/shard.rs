//! What the tests of sharded controllers share (`tests/shard.rs`, `tests/shard_watch.rs`): the
//! ConfigMaps they shard, a replica in a runtime of its own, and the checks on who reconciled what.

use std::collections::BTreeSet;
use std::ops::Deref;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use tenure_group::Group;
use tenure_ha::kube_shard::{object_key, ShardController};

use super::{until, Journal};

/// A drain timeout no test reaches: a handover that depends on it hangs and the test fails.
pub const FOREVER: Duration = Duration::from_secs(3600);
/// The ConfigMaps the tests shard.
pub const OBJECTS: usize = 30;
/// The group's partitions.
pub const PARTITIONS: u32 = 12;

/// The names of the ConfigMaps the tests shard: `cm-00`...
pub fn names() -> Vec<String> {
    (0..OBJECTS).map(|i| format!("cm-{i:02}")).collect()
}

/// The key the controller shards a ConfigMap of the tests by.
pub fn key(name: &str) -> String {
    let mut cm = ConfigMap::default();
    cm.metadata.namespace = Some("default".into());
    cm.metadata.name = Some(name.into());
    object_key(&cm)
}

/// One replica of a sharded controller, in a runtime of its own as if it were a process.
pub struct ShardReplica {
    pub identity: String,
    pub shard: Option<ShardController>,
    pub runtime: Option<tokio::runtime::Runtime>,
}

impl ShardReplica {
    pub fn group(&self) -> &Group {
        self.shard.as_ref().unwrap().group()
    }

    /// The term under which this replica owns the object now, if it does.
    pub fn owns(&self, name: &str) -> Option<u64> {
        self.shard.as_ref().and_then(|s| s.group().belongs_to_self(&key(name))).map(|t| t.0)
    }

    pub fn owned_partitions(&self) -> BTreeSet<u32> {
        self.group().assignment().borrow().owned.keys().copied().collect()
    }

    /// The names of the test's ConfigMaps whose key's partition this replica owns.
    pub fn owned_objects(&self) -> BTreeSet<String> {
        names().into_iter().filter(|n| self.owns(n).is_some()).collect()
    }

    /// A graceful leave as on SIGTERM: the reconciles in flight finish (or are aborted after
    /// `drain`), then the partitions go.
    pub fn leave(&mut self, drain: Duration) -> tokio::task::JoinHandle<()> {
        let shard = self.shard.take().unwrap();
        self.runtime.as_ref().unwrap().spawn(async move { shard.leave(drain).await.unwrap() })
    }
}

impl Drop for ShardReplica {
    fn drop(&mut self) {
        drop(self.shard.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// True once each of `objects` has exactly one owner among `replicas` and that owner has
/// completed a reconcile of it under its current term, started at or after `since`.
pub fn reconciled_by_current_owners<R: Deref<Target = ShardReplica>>(
    journal: &Journal,
    replicas: &[&R],
    objects: &[String],
    since: Instant,
) -> bool {
    let spans = journal.spans();
    objects.iter().all(|name| {
        let owners: Vec<(&str, u64)> =
            replicas.iter().filter_map(|r| r.owns(name).map(|t| (r.identity.as_str(), t))).collect();
        let [(owner, term)] = owners[..] else { return false };
        spans
            .iter()
            .any(|s| s.name == *name && s.replica == owner && s.term == term && s.started >= since && s.ended.is_some())
    })
}

/// Waits until `replicas` share the partitions: each owns some, together all.
pub async fn share_the_partitions<R: Deref<Target = ShardReplica>>(replicas: &[&R]) {
    until("the replicas share the partitions", || {
        let shares: Vec<usize> = replicas.iter().map(|r| r.owned_partitions().len()).collect();
        shares.iter().all(|n| *n > 0) && shares.iter().sum::<usize>() == PARTITIONS as usize
    })
    .await;
}
