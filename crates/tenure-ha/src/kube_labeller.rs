//! The labeller of sharded watches: keeps every object's [`PARTITION_LABEL`] equal to the
//! partition of its key, on one replica at a time (feature `kube`).
//!
//! Why it exists: a replica of a [`crate::kube_shard_watch::ShardedWatch`] sees only the objects
//! labelled with its partitions, so an object without the label (new, or the label removed) or
//! with a wrong one (edited by hand, out of range) is seen by the wrong replica or by none. The
//! labeller watches the objects' metadata only (`PartialObjectMetadata`: no object body is
//! received or cached) and patches the label of every object whose label is missing or wrong,
//! with a log line saying why. It never reconciles.
//!
//! **One at a time.** It runs in a [`crate::Gate`] of an elector (Active/Passive): only while
//! this replica leads. Two labellers would not conflict (the label is a pure function of the key,
//! and a merge patch of the same value is idempotent), but one halves the watch traffic. Give it a
//! client gated by the elector (`tenure_kube::WriteGate::leader(&elector).client(client)`) so that
//! a replica that no longer leads sends no patch (W1); it also checks its tenure before each patch.
//!
//! **A lagging labeller delays, never duplicates.** Until an object is labelled right, no replica
//! reconciles it (each skips an object whose label disagrees with its key's partition); ownership
//! is the group's guard on the key's partition either way.
//!
//! ```no_run
//! # async fn f(client: kube::Client, elector: tenure::Elector) {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::{core::PartialObjectMeta, runtime::watcher, Api};
//! use tenure_ha::{kube_labeller::Labeller, Gate};
//!
//! let client = tenure_kube::WriteGate::leader(&elector).client(client);
//! let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, "default");
//! let labeller = Labeller::new(metadata, watcher::Config::default().labels("app=web"), 64)
//!     .spawn(Gate::builder(&elector));
//! // on SIGTERM
//! labeller.shutdown().await;
//! # }
//! ```

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::core::{PartialObjectMeta, Request};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tenure::{NotLeader, Tenure};
use tokio_util::sync::CancellationToken;

use crate::gate::{GateBuilder, GateHandle, LeaderContext};
use crate::kube_shard::object_key;
use crate::kube_shard_watch::{check_label, partition_label, PARTITION_LABEL};

/// How long a failed patch waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

/// What the labeller did, for tests, benchmarks and metrics.
#[derive(Debug, Default)]
pub struct LabellerCounters {
    seen: AtomicU64,
    patched: AtomicU64,
    failed: AtomicU64,
}

impl LabellerCounters {
    /// Objects (metadata) the labeller's watch received.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }

    /// Labels set or corrected.
    pub fn patched(&self) -> u64 {
        self.patched.load(Ordering::Relaxed)
    }

    /// Patches that failed (each is retried).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// Keeps the partition labels of the objects of one `Api` (see the module documentation).
#[must_use = "a Labeller does nothing until spawned"]
pub struct Labeller<K> {
    api: Api<PartialObjectMeta<K>>,
    watcher_config: watcher::Config,
    partition_count: u32,
    concurrency: usize,
    counters: Arc<LabellerCounters>,
}

impl<K> Labeller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Default + Unpin + Send + Sync,
{
    /// A labeller of the objects of `api` that pass `watcher_config`, for a group of
    /// `partition_count` partitions (the group's: the label is the partition of the object's key).
    pub fn new(api: Api<PartialObjectMeta<K>>, watcher_config: watcher::Config, partition_count: u32) -> Self {
        Labeller { api, watcher_config, partition_count, concurrency: 16, counters: Arc::default() }
    }

    /// How many patches may be in flight at once (default 16).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// What the labeller did.
    pub fn counters(&self) -> Arc<LabellerCounters> {
        self.counters.clone()
    }

    /// Runs the labeller while `gate`'s elector leads; it stops when leadership ends (and starts
    /// again, with a fresh list, on the next tenure).
    pub fn spawn(self, gate: GateBuilder) -> GateHandle {
        let labeller = Arc::new(self);
        gate.spawn(move |leader| labeller.clone().label(leader))
    }

    /// One tenure of labelling.
    async fn label(self: Arc<Self>, leader: LeaderContext) -> Result<(), NotLeader> {
        let mut events = watcher(self.api.clone(), self.watcher_config.clone()).default_backoff().boxed();
        let mut patches = FuturesUnordered::new();
        loop {
            tokio::select! {
                () = leader.cancelled() => return Ok(()),
                Some(result) = patches.next(), if !patches.is_empty() => result?,
                event = events.next(), if patches.len() < self.concurrency => match event {
                    None => return Ok(()),
                    Some(Err(error)) => tracing::warn!(%error, "the labeller's watch failed; retrying"),
                    Some(Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                        self.counters.seen.fetch_add(1, Ordering::Relaxed);
                        let key = object_key(&object);
                        let partition = tenure_group::assignment::partition_of(key.as_bytes(), self.partition_count);
                        if let Err(why) = check_label(object.meta(), partition, self.partition_count) {
                            tracing::info!(key, partition, %why, "relabelling the object with its key's partition");
                            let (tenure, cancel) = (leader.tenure().clone(), leader.cancellation_token());
                            patches.push(self.clone().patch(object, partition, tenure, cancel));
                        }
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    /// Sets the label of `object` to `partition`, retrying until it is set, the object is gone, or
    /// this replica no longer leads.
    async fn patch(
        self: Arc<Self>,
        object: PartialObjectMeta<K>,
        partition: u32,
        tenure: Tenure,
        cancel: CancellationToken,
    ) -> Result<(), NotLeader> {
        let url = <PartialObjectMeta<K>>::url_path(&K::DynamicType::default(), object.namespace().as_deref());
        let patch = Patch::Merge(serde_json::json!({
            "metadata": {"labels": {PARTITION_LABEL: partition_label(partition)}}
        }));
        let name = object.name_any();
        loop {
            tenure.check()?;
            let request = Request::new(url.as_str())
                .patch_metadata(&name, &PatchParams::default(), &patch)
                .map_err(kube::Error::BuildRequest);
            let outcome = match request {
                Ok(request) => self.api.clone().into_client().request::<PartialObjectMeta<K>>(request).await,
                Err(error) => Err(error),
            };
            match outcome {
                Ok(_) => {
                    self.counters.patched.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // Deleted since: nothing to label.
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(error) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(name, %error, "labelling failed; retrying");
                    tokio::select! {
                        () = cancel.cancelled() => return Ok(()),
                        () = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        }
    }
}
