//! Kubernetes watches that reconcile only while this replica leads (feature `kube`).
//!
//! Why it exists: the seed's loop ("start the watcher on gaining leadership, stop it on losing
//! it") loses what happens between two leaders. [`GatedWatch`] runs a handler on every change of
//! one kind of object, only under a valid [`Tenure`], checkpoints how far it got
//! ([`crate::checkpoint`]), and offers the two standby modes of issue 10:
//!
//! - [`Standby::Cold`] (Kuryr's): followers make no request. The new leader resumes the watch from
//!   the checkpoint with [`ResumableWatcher`], so a Pod deleted while nobody led reaches it as a
//!   [`Change::Deleted`]. If the server no longer keeps that version (`410 Gone`), it relists,
//!   reconciles every listed object, counts the failed resume
//!   ([`WatchMetrics::resume_failures`]), logs it (once per tenure) and triggers a garbage
//!   collection pass, which finds what the lost deletions left behind.
//! - [`Standby::Warm`]: every replica watches all the time and keeps a cache, but only the leader
//!   calls the handler. A follower remembers, per object, the last change it saw; on takeover
//!   the new leader hands the handler every change newer than the checkpoint at once, from
//!   memory, without a list request. A follower's own watch that must relist finds deletions by
//!   comparing the list with its cache, so they still arrive as [`Change::Deleted`].
//!
//!   A follower keeps at most one pending change per object, but a deleted object's entry stays
//!   until the replica next leads: memory grows with the objects deleted during a long standby.
//!   Versions are compared as numbers (as etcd-backed servers issue them); a version that is not
//!   a number is always treated as newer, so the change is reconciled rather than skipped.
//!
//! A kube-runtime `Controller` is gated by [`crate::kube_controller`]; this module is for
//! controllers that must not miss a deletion across a leader change, which `Controller`'s
//! always-relisting `watcher` cannot promise (kube-rs issue 1419).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tenure::{Elector, Tenure};
use tenure_kube::resume::{ResumableWatcher, ResumeConfig, ResumeError, ResumeEvent};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{CheckpointError, CheckpointStore, Checkpointer};
use crate::gate::{Gate, GateBuilder, GateHandle, LeaderContext};
use crate::gc::GcTrigger;

/// What followers do while they wait for leadership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// No watch, no cache: cheapest; the new leader resumes from the checkpoint.
    Cold,
    /// A live watch and cache: the new leader starts reconciling at once, without a request.
    Warm,
}

/// One change for the handler.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// The object exists in this state (created, changed, or listed).
    Applied(K),
    /// The object was deleted; its last known state.
    Deleted(K),
}

impl<K: Resource> Change<K> {
    /// The object the change is about.
    pub fn object(&self) -> &K {
        match self {
            Change::Applied(object) | Change::Deleted(object) => object,
        }
    }
}

/// Metrics of a [`GatedWatch`]. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct WatchMetrics {
    /// Resumes from a checkpoint that the server refused (`410 Gone` or an invalid version), each
    /// followed by a relist and a garbage collection pass.
    pub resume_failures: Counter,
    /// Changes handed to the handler.
    pub reconciles: Counter,
}

impl WatchMetrics {
    /// New metrics registered as `tenure_ha_watch_resume_failures_total` and
    /// `tenure_ha_watch_reconciles_total`.
    pub fn register(registry: &mut Registry) -> WatchMetrics {
        let metrics = WatchMetrics::default();
        registry.register(
            "tenure_ha_watch_resume_failures",
            "Resumes from a checkpoint the server no longer keeps (relisted, garbage collected)",
            metrics.resume_failures.clone(),
        );
        registry.register(
            "tenure_ha_watch_reconciles",
            "Changes handed to the leader's handler",
            metrics.reconciles.clone(),
        );
        metrics
    }
}

/// Why a gated watch's leader work stopped early (the gate restarts it with back-off).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The checkpoint could not be claimed (a newer term has written, or the store failed).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The watch could not be set up (an invalid configuration).
    #[error(transparent)]
    Watch(#[from] ResumeError),
}

type Handler<K> = Arc<dyn Fn(Change<K>, Tenure) -> BoxFuture<'static, ()> + Send + Sync>;

/// A watch of one kind of object whose changes are handled only by the leader.
///
/// ```no_run
/// # async fn f(client: kube::Client, elector: tenure::Elector) {
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::Pod;
/// use kube::{Api, ResourceExt};
/// use tenure_ha::checkpoint::kube::KubeCheckpointStore;
/// use tenure_ha::kube_watch::{Change, GatedWatch, Standby};
///
/// let store = Arc::new(KubeCheckpointStore::new(client.clone(), "default", "ipam-checkpoint", "ipam"));
/// let watch = GatedWatch::new(Api::<Pod>::namespaced(client, "default"), "pods", store)
///     .standby(Standby::Warm)
///     .run(&elector, |change, tenure| async move {
///         if tenure.check().is_err() { return; }            // fenced: no side effect
///         match change {
///             Change::Applied(pod) => println!("allocate for {}", pod.name_any()),
///             Change::Deleted(pod) => println!("release {}", pod.name_any()),
///         }
///     });
/// // ... on shutdown: stop the work, then release the lock
/// watch.shutdown().await;
/// # }
/// ```
pub struct GatedWatch<K: Resource> {
    api: Api<K>,
    resource: String,
    store: Arc<dyn CheckpointStore>,
    config: ResumeConfig,
    standby: Standby,
    gc: Option<GcTrigger>,
    metrics: WatchMetrics,
    gate: Option<Box<dyn FnOnce(GateBuilder) -> GateBuilder + Send>>,
}

impl<K> GatedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    /// Watches `api`, checkpointing its version under the name `resource` in `store`. Cold
    /// standby, all objects, no garbage collection trigger, unregistered metrics.
    pub fn new(api: Api<K>, resource: impl Into<String>, store: Arc<dyn CheckpointStore>) -> GatedWatch<K> {
        GatedWatch {
            api,
            resource: resource.into(),
            store,
            config: ResumeConfig::default(),
            standby: Standby::Cold,
            gc: None,
            metrics: WatchMetrics::default(),
            gate: None,
        }
    }

    /// Selectors, timeouts and back-off of the watch.
    #[must_use]
    pub fn config(mut self, config: ResumeConfig) -> Self {
        self.config = config;
        self
    }

    /// The standby mode (default [`Standby::Cold`]).
    #[must_use]
    pub fn standby(mut self, standby: Standby) -> Self {
        self.standby = standby;
        self
    }

    /// Runs a garbage collection pass through `trigger` after every failed resume.
    #[must_use]
    pub fn gc_trigger(mut self, trigger: GcTrigger) -> Self {
        self.gc = Some(trigger);
        self
    }

    /// Reports into these metrics.
    #[must_use]
    pub fn metrics(mut self, metrics: WatchMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Adjusts the gate the leader work runs in (drain timeout, back-off, gate metrics).
    #[must_use]
    pub fn gate(mut self, adjust: impl FnOnce(GateBuilder) -> GateBuilder + Send + 'static) -> Self {
        self.gate = Some(Box::new(adjust));
        self
    }

    /// Starts watching (warm) or waiting (cold) on the current tokio runtime; `handler` runs for
    /// each change, one at a time, only while `elector` leads, with the tenure it leads under.
    pub fn run<F, Fut>(self, elector: &Elector, handler: F) -> GatedWatchHandle
    where
        F: Fn(Change<K>, Tenure) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler: Handler<K> = Arc::new(move |change, tenure| handler(change, tenure).boxed());
        let mut builder = Gate::builder(elector);
        if let Some(adjust) = self.gate {
            builder = adjust(builder);
        }
        let stop = CancellationToken::new();
        let shared = Arc::new(Leader {
            api: self.api,
            resource: self.resource,
            store: self.store,
            config: self.config,
            gc: self.gc,
            metrics: self.metrics.clone(),
            handler,
        });
        let (gate, follower) = match self.standby {
            Standby::Cold => {
                let shared = shared.clone();
                (builder.spawn(move |ctx| shared.clone().lead_cold(ctx)), None)
            }
            Standby::Warm => {
                let cache = Arc::new(WarmCache::default());
                let follower = tokio::spawn(shared.clone().follow(cache.clone(), stop.clone()));
                let shared = shared.clone();
                (builder.spawn(move |ctx| shared.clone().lead_warm(ctx, cache.clone())), Some(follower))
            }
        };
        GatedWatchHandle { gate, follower, stop, metrics: self.metrics }
    }
}

/// A running [`GatedWatch`].
#[derive(Debug)]
pub struct GatedWatchHandle {
    gate: GateHandle,
    follower: Option<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
    metrics: WatchMetrics,
}

impl GatedWatchHandle {
    /// Stops the leader work (in-flight handling finishes, one last checkpoint is written) and the
    /// warm watch. Call before the elector's shutdown, so that the lock is released after it.
    pub async fn shutdown(self) {
        self.gate.shutdown().await;
        self.stop.cancel();
        if let Some(follower) = self.follower {
            let _ = follower.await;
        }
    }

    /// The watch's metrics.
    pub fn metrics(&self) -> &WatchMetrics {
        &self.metrics
    }

    /// The gate the leader work runs in (its metrics, whether it runs).
    pub fn gate(&self) -> &GateHandle {
        &self.gate
    }
}

/// What the leader work needs, shared by every tenure.
struct Leader<K: Resource> {
    api: Api<K>,
    resource: String,
    store: Arc<dyn CheckpointStore>,
    config: ResumeConfig,
    gc: Option<GcTrigger>,
    metrics: WatchMetrics,
    handler: Handler<K>,
}

impl<K> Leader<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    async fn handle(&self, change: Change<K>, tenure: &Tenure) {
        self.metrics.reconciles.inc();
        (self.handler)(change, tenure.clone()).await;
    }

    /// Cold standby: resume from the checkpoint, handle every change until leadership ends.
    async fn lead_cold(self: Arc<Self>, ctx: LeaderContext) -> Result<(), WatchError> {
        let checkpointer = Checkpointer::resume_for(self.store.clone(), &ctx).await?;
        let saved = checkpointer.resource_version(&self.resource);
        let mut watcher = ResumableWatcher::new(self.api.clone(), self.config.clone(), saved)?;
        let mut logged = false;
        loop {
            let event = tokio::select! {
                _ = ctx.cancelled() => return Ok(()),
                event = watcher.next_event() => event,
            };
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    tracing::warn!(resource = %self.resource, %error, "watch failed; retrying with back-off");
                    continue;
                }
            };
            let version = event.resource_version();
            match event {
                ResumeEvent::Applied(object) => self.handle(Change::Applied(object), ctx.tenure()).await,
                ResumeEvent::Deleted(object) => self.handle(Change::Deleted(object), ctx.tenure()).await,
                ResumeEvent::Progress(_) => {}
                ResumeEvent::Listed { objects, cause, .. } => {
                    if cause.resume_failed() {
                        self.metrics.resume_failures.inc();
                        if !logged {
                            tracing::warn!(
                                resource = %self.resource,
                                ?cause,
                                "resume from the checkpoint failed; relisted, deletions while nobody led are left to garbage collection"
                            );
                            logged = true;
                        }
                        if let Some(gc) = &self.gc {
                            gc.run_now();
                        }
                    }
                    for object in objects {
                        if ctx.is_cancelled() {
                            return Ok(());
                        }
                        self.handle(Change::Applied(object), ctx.tenure()).await;
                    }
                }
            }
            if let Some(version) = version {
                checkpointer.record(self.resource.clone(), version);
            }
        }
    }

    /// Warm standby, every replica: keep the cache and the per-object changes up to date.
    async fn follow(self: Arc<Self>, cache: Arc<WarmCache<K>>, stop: CancellationToken) {
        let watcher = ResumableWatcher::new(self.api.clone(), self.config.clone(), None);
        let mut watcher = match watcher {
            Ok(watcher) => watcher,
            Err(error) => {
                tracing::error!(resource = %self.resource, %error, "warm standby cannot watch");
                return;
            }
        };
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = watcher.next_event() => event,
            };
            match event {
                Ok(event) => cache.apply(event),
                Err(error) => {
                    tracing::warn!(resource = %self.resource, %error, "warm watch failed; retrying with back-off")
                }
            }
        }
    }

    /// Warm standby, the leader: hand over every change newer than the checkpoint at once, then
    /// every change as the watch delivers it.
    async fn lead_warm(self: Arc<Self>, ctx: LeaderContext, cache: Arc<WarmCache<K>>) -> Result<(), WatchError> {
        let checkpointer = Checkpointer::resume_for(self.store.clone(), &ctx).await?;
        let mut after = checkpointer.resource_version(&self.resource).and_then(|v| v.parse::<u64>().ok());
        loop {
            let notified = cache.changed.notified();
            let (changes, version) = cache.take_newer_than(after);
            let mut changes = changes.into_iter();
            while let Some((key, change)) = changes.next() {
                if ctx.is_cancelled() {
                    // Not handled: kept for this replica's next tenure, and for the next leader
                    // the checkpoint is not advanced past them.
                    cache.put_back(std::iter::once((key, change)).chain(changes));
                    return Ok(());
                }
                self.handle(change.1, ctx.tenure()).await;
            }
            if let Some(version) = version {
                checkpointer.record(self.resource.clone(), version.to_string());
                after = Some(version);
            }
            tokio::select! {
                _ = ctx.cancelled() => return Ok(()),
                _ = notified => {}
            }
        }
    }
}

/// A follower's view: the objects as last seen, and per object the newest change not yet known
/// to be handled.
struct WarmCache<K> {
    state: Mutex<WarmState<K>>,
    changed: Notify,
}

impl<K> Default for WarmCache<K> {
    fn default() -> Self {
        WarmCache {
            state: Mutex::new(WarmState { objects: BTreeMap::new(), changes: BTreeMap::new(), version: None }),
            changed: Notify::new(),
        }
    }
}

struct WarmState<K> {
    objects: BTreeMap<String, K>,
    /// Per object key: the version of its newest change and the change.
    changes: BTreeMap<String, (Option<u64>, Change<K>)>,
    /// The version the watch has delivered up to.
    version: Option<u64>,
}

fn key<K: Resource>(object: &K) -> String {
    format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
}

fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object.resource_version().and_then(|v| v.parse().ok())
}

impl<K: Resource + Clone> WarmCache<K> {
    fn state(&self) -> MutexGuard<'_, WarmState<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, event: ResumeEvent<K>) {
        let mut state = self.state();
        let reached = event.resource_version().and_then(|v| v.parse::<u64>().ok());
        match event {
            ResumeEvent::Applied(object) => {
                let key = key(&object);
                state.changes.insert(key.clone(), (version_of(&object), Change::Applied(object.clone())));
                state.objects.insert(key, object);
            }
            ResumeEvent::Deleted(object) => {
                let key = key(&object);
                state.objects.remove(&key);
                state.changes.insert(key, (reached, Change::Deleted(object)));
            }
            ResumeEvent::Progress(_) => {}
            ResumeEvent::Listed { objects, .. } => {
                let listed: BTreeMap<String, K> = objects.into_iter().map(|o| (key(&o), o)).collect();
                let gone: Vec<(String, K)> = state
                    .objects
                    .iter()
                    .filter(|(k, _)| !listed.contains_key(*k))
                    .map(|(k, o)| (k.clone(), o.clone()))
                    .collect();
                for (key, object) in gone {
                    // Deleted while this watch was away: the list's version is when it was seen gone.
                    state.changes.insert(key, (reached, Change::Deleted(object)));
                }
                for (key, object) in &listed {
                    let unchanged =
                        state.objects.get(key).map(|o| o.resource_version()) == Some(object.resource_version());
                    if !unchanged {
                        state.changes.insert(key.clone(), (version_of(object), Change::Applied(object.clone())));
                    }
                }
                state.objects = listed;
            }
        }
        if reached.is_some() {
            state.version = reached;
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// The changes newer than `after` (all when `None` or not comparable), oldest first, with
    /// their object keys, and the version they bring the leader to. Taken changes are forgotten.
    #[allow(clippy::type_complexity)]
    fn take_newer_than(&self, after: Option<u64>) -> (Vec<(String, (Option<u64>, Change<K>))>, Option<u64>) {
        let mut state = self.state();
        let mut taken: Vec<(String, (Option<u64>, Change<K>))> = std::mem::take(&mut state.changes)
            .into_iter()
            .filter(|(_, (version, _))| match (after, version) {
                (Some(after), Some(version)) => *version > after,
                _ => true,
            })
            .collect();
        taken.sort_by_key(|(_, (version, _))| *version);
        (taken, state.version)
    }

    /// Returns changes a leader took but did not handle, unless the watch has seen a newer change
    /// of the same object since.
    fn put_back(&self, changes: impl Iterator<Item = (String, (Option<u64>, Change<K>))>) {
        let mut state = self.state();
        for (key, change) in changes {
            state.changes.entry(key).or_insert(change);
        }
    }
}
