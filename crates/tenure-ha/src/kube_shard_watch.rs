//! Sharded watches: each replica of a sharded controller watches and caches only the objects of
//! the partitions it owns, selected by the API server (feature `kube`).
//!
//! Why it exists: with [`crate::kube_shard::shard_controller`] every replica watches and caches
//! every object and skips those it does not own, so N replicas cost N times a singleton's memory
//! and watch traffic. [`ShardedWatch`] runs the same reconciler with the same guards, but on a
//! watch of its own: `labelSelector=tenure.dev/partition in (<owned partitions>)` (the user's
//! selector, if any, and'ed in front).
//!
//! **The label.** Every object carries [`PARTITION_LABEL`] = the partition of its key
//! ([`crate::kube_shard::object_key`] hashed over the group's partition count): a pure function of
//! the key, so it never changes when members come and go, and a rebalance relabels nothing. The
//! [`crate::kube_labeller::Labeller`] (on one replica, leader-gated) sets it on objects that lack it
//! or carry a wrong one. A client that creates objects may set it itself ([`partition_label`]) so
//! that they are seen before the labeller gets to them.
//!
//! **The watch follows the assignment.** Whenever the owned `(partition, term)` pairs change, the
//! watch is restarted with the new selector: the re-list replaces the cache at once (kube-runtime's
//! `Writer` swaps it in on `InitDone`), so objects of lost partitions leave it and those of gained
//! partitions enter it. Reconciles are queued for an object of the re-list when its partition's
//! current term has not been listed yet (the partition was gained: its objects are reconciled
//! without a change), when it is new to the cache, or when its `resourceVersion` differs from the
//! cached one (it changed while the watch was restarting); the others are not reconciled again.
//! Changes between re-lists are reconciled as they arrive, as with `Controller`.
//!
//! **Ownership is still the guard's.** The label only decides what a replica *sees*; whether it
//! reconciles an object is decided as in `shard_controller`: by the group's guard on the
//! partition of the object's key, held until the reconcile and the error policy return (the
//! revoke-before-assign rule P1 is unchanged). An object whose label disagrees with its key's
//! partition is skipped with a log line saying why (the labeller corrects it, and the correction
//! is a change that reaches the owner's watch). A wrong or missing label can therefore delay an
//! object's reconcile until the labeller fixed it, never make two replicas reconcile it at once.
//!
//! **One watch per replica.** The selector names each owned partition (`in (0,3,7,...)`): about 4
//! bytes per partition, so 1,024 partitions held by one replica make a 4 KiB query string, well
//! within the API server's limits. A restart costs one list of this replica's share; restarts
//! happen only when the assignment changes (joins, leaves), not at steady state.
//!
//! ```no_run
//! # async fn f(client: kube::Client, group: tenure_group::Group) -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::{controller::Action, watcher};
//! use kube::Api;
//! use tenure_ha::kube_shard::Owning;
//! use tenure_ha::kube_shard_watch::ShardedWatch;
//!
//! async fn reconcile(_cm: Arc<ConfigMap>, ctx: Arc<Owning<()>>) -> Result<Action, tenure_group::NotOwner> {
//!     ctx.check()?;                                  // fenced, as with shard_controller
//!     Ok(Action::await_change())
//! }
//!
//! let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
//! let shard = ShardedWatch::new(group, configmaps, watcher::Config::default().labels("app=web"))
//!     .concurrency(16)
//!     .run(reconcile, |_cm, _error, _ctx| Action::requeue(Duration::from_secs(5)), Arc::new(()))?;
//! shard.leave(Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::{self, Debug};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::ObjectMeta;
use kube::runtime::controller::{self, applier, Action};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup as _, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tenure::Term;
use tenure_group::{Assignment, Group, Ownership};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::kube_shard::{
    log_outcome, object_key, reconcile_owned, Failed, Owning, ShardController, ShardError, Shared,
};

/// The label that carries an object's partition: the partition of its key, in decimal.
pub const PARTITION_LABEL: &str = "tenure.dev/partition";

/// The value of [`PARTITION_LABEL`] for `partition`.
pub fn partition_label(partition: u32) -> String {
    partition.to_string()
}

/// The label selector of the objects of `partitions`: `tenure.dev/partition in (0,3,7)`.
///
/// Why it is public: a controller outside Rust (`tenure member`) selects its objects with the same
/// selector, built from the partitions its `/assignment` lists.
pub fn partition_selector(partitions: impl IntoIterator<Item = u32>) -> String {
    let values: Vec<String> = partitions.into_iter().map(partition_label).collect();
    format!("{PARTITION_LABEL} in ({})", values.join(","))
}

/// Why an object's [`PARTITION_LABEL`] is not the partition of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mislabel {
    /// The object has no partition label (new, or the label was removed).
    Missing,
    /// The label is not a partition number.
    NotANumber(String),
    /// The label names a partition the group does not have.
    OutOfRange {
        /// The label's partition.
        label: u32,
        /// The group's partition count.
        partition_count: u32,
    },
    /// The label names another partition than its key's (edited by hand, or copied).
    OtherPartition {
        /// The label's partition.
        label: u32,
    },
}

impl fmt::Display for Mislabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mislabel::Missing => write!(f, "the label {PARTITION_LABEL} is missing"),
            Mislabel::NotANumber(value) => write!(f, "the label {PARTITION_LABEL}={value:?} is not a partition number"),
            Mislabel::OutOfRange { label, partition_count } => {
                write!(f, "the label {PARTITION_LABEL}={label} is out of range (partition count {partition_count})")
            }
            Mislabel::OtherPartition { label } => {
                write!(f, "the label {PARTITION_LABEL}={label} names another partition than the key's")
            }
        }
    }
}

/// Checks an object's partition label against `partition`, its key's partition in a group of
/// `partition_count` partitions.
pub fn check_label(meta: &ObjectMeta, partition: u32, partition_count: u32) -> Result<(), Mislabel> {
    let Some(value) = meta.labels.as_ref().and_then(|labels| labels.get(PARTITION_LABEL)) else {
        return Err(Mislabel::Missing);
    };
    // Only the canonical spelling counts: "07" would not match the selector `in (7)`.
    let label: u32 = match value.parse() {
        Ok(label) if partition_label(label) == *value => label,
        _ => return Err(Mislabel::NotANumber(value.clone())),
    };
    match label {
        label if label == partition => Ok(()),
        label if label >= partition_count => Err(Mislabel::OutOfRange { label, partition_count }),
        label => Err(Mislabel::OtherPartition { label }),
    }
}

/// What a replica's sharded watch received and did, for tests, benchmarks and metrics.
#[derive(Debug, Default)]
pub struct WatchCounters {
    events: AtomicU64,
    lists: AtomicU64,
    mislabelled: AtomicU64,
}

impl WatchCounters {
    /// Objects the watch received: listed ones and changes (added, modified, deleted).
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Watches started (one per change of the owned partitions, and the first): each lists this
    /// replica's share once. Restarts by kube-runtime's watcher itself (an expired version) are
    /// not counted.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }

    /// Reconciles skipped because the object's label disagreed with its key's partition.
    pub fn mislabelled(&self) -> u64 {
        self.mislabelled.load(Ordering::Relaxed)
    }
}

/// A sharded controller on a watch of its owned partitions only (see the module documentation).
///
/// Why a builder: the cache ([`ShardedWatch::store`]) and the counters are handed out before the
/// controller starts, as `Controller::store` does.
#[must_use = "a ShardedWatch does nothing until run"]
pub struct ShardedWatch<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    group: Group,
    api: Api<K>,
    watcher_config: watcher::Config,
    controller_config: controller::Config,
    writer: Writer<K>,
    counters: Arc<WatchCounters>,
}

impl<K> ShardedWatch<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Default + Unpin + Send + Sync,
{
    /// A sharded controller of `group`'s replica over the objects of `api` that pass
    /// `watcher_config` (its label selector is kept and the partitions' added to it).
    pub fn new(group: Group, api: Api<K>, watcher_config: watcher::Config) -> Self {
        ShardedWatch {
            group,
            api,
            watcher_config,
            controller_config: controller::Config::default(),
            writer: Writer::default(),
            counters: Arc::default(),
        }
    }

    /// How many reconciles run at once on this replica (kube-runtime's `Config::concurrency`;
    /// 0, the default, means no limit).
    pub fn concurrency(mut self, concurrency: u16) -> Self {
        self.controller_config = self.controller_config.concurrency(concurrency);
        self
    }

    /// kube-runtime's controller configuration (debounce, concurrency), whole.
    pub fn controller_config(mut self, config: controller::Config) -> Self {
        self.controller_config = config;
        self
    }

    /// The cache of this replica: the objects of its owned partitions (as last listed and watched).
    pub fn store(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// What the watch received and did.
    pub fn counters(&self) -> Arc<WatchCounters> {
        self.counters.clone()
    }

    /// Starts the watch and the reconciles: `reconcile` and `error_policy` receive an [`Owning`]
    /// context, as with [`crate::kube_shard::shard_controller`], and only for objects whose key's
    /// partition this replica owns and whose label agrees. Must be called inside a tokio runtime.
    pub fn run<Ctx, Reconcile, ReconcileFut, ReconcileError, ErrorPolicy>(
        self,
        reconcile: Reconcile,
        error_policy: ErrorPolicy,
        context: Arc<Ctx>,
    ) -> Result<ShardController, ShardError>
    where
        Ctx: Send + Sync + 'static,
        Reconcile: Fn(Arc<K>, Arc<Owning<Ctx>>) -> ReconcileFut + Send + Sync + 'static,
        ReconcileFut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
        ReconcileError: std::error::Error + Send + 'static,
        ErrorPolicy: Fn(Arc<K>, &ReconcileError, Arc<Owning<Ctx>>) -> Action + Send + Sync + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ShardError::NoRuntime)?;
        let ShardedWatch { group, api, watcher_config, controller_config, writer, counters } = self;
        let group = Arc::new(group);
        let shutdown = CancellationToken::new();
        let identity = group.identity().to_owned();
        let store = writer.as_reader();

        let (queue_tx, mut queue_rx) = mpsc::unbounded_channel::<ObjectRef<K>>();
        let feeder = Feeder {
            api,
            base: watcher_config,
            ownership: group.ownership(),
            assignment: group.assignment(),
            writer,
            queue: queue_tx,
            counters: counters.clone(),
            identity: identity.clone(),
        };
        let feeder = runtime.spawn(feeder.run());

        // Ending the queue is the graceful shutdown: no new reconcile starts, the ones in flight
        // finish (kube-runtime's applier drains its runner once its input ends).
        let queue = futures::stream::poll_fn(move |cx| queue_rx.poll_recv(cx))
            .map(Ok::<_, Infallible>)
            .take_until(shutdown.clone().cancelled_owned());
        let shared = Arc::new(Shared { context, reconcile, error_policy });
        let ownership = group.ownership();
        let assignment = group.assignment();
        let skipper = identity.clone();
        let reconciles = applier(
            move |object: Arc<K>, shared: Arc<Shared<Ctx, Reconcile, ErrorPolicy>>| {
                let key = object_key(object.as_ref());
                let partition = ownership.partition_of(&key);
                let partition_count = assignment.borrow().partition_count;
                let guard = match check_label(object.meta(), partition, partition_count) {
                    Ok(()) => ownership.guard(partition),
                    Err(why) => {
                        counters.mislabelled.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            identity = skipper.as_str(),
                            key,
                            partition,
                            %why,
                            "skipped: the object's partition label disagrees with its key's partition; \
                             the labeller corrects it"
                        );
                        None
                    }
                };
                reconcile_owned(guard, object, shared).boxed()
            },
            |_object, failed: &Failed<ReconcileError>, _shared| failed.action.clone(),
            shared,
            store,
            queue,
            controller_config,
        );
        let controller = runtime.spawn(reconciles.for_each(move |result| {
            log_outcome(&identity, result);
            futures::future::ready(())
        }));
        Ok(ShardController::from_parts(
            group,
            shutdown,
            AbortOnDropHandle::new(controller),
            AbortOnDropHandle::new(feeder),
        ))
    }
}

/// The task that keeps a replica's watch on its owned partitions: it restarts the watch when the
/// assignment changes, applies the events to the cache, and queues the objects to reconcile.
struct Feeder<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    api: Api<K>,
    base: watcher::Config,
    ownership: Ownership,
    assignment: watch::Receiver<Assignment>,
    writer: Writer<K>,
    queue: mpsc::UnboundedSender<ObjectRef<K>>,
    counters: Arc<WatchCounters>,
    identity: String,
}

impl<K> Feeder<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Default + Unpin + Send + Sync,
{
    async fn run(mut self) {
        // The term under which each partition's objects were all listed (and queued): a partition
        // whose current term is not here was gained since.
        let mut listed: BTreeMap<u32, Term> = BTreeMap::new();
        loop {
            let owned = self.assignment.borrow_and_update().owned.clone();
            if owned.is_empty() {
                // Nothing to watch: an empty cache (and a ready one, so that the runner starts).
                self.writer.apply_watcher_event(&watcher::Event::Init);
                self.writer.apply_watcher_event(&watcher::Event::InitDone);
                listed.clear();
                if self.assignment.changed().await.is_err() {
                    return;
                }
                continue;
            }
            match self.watch(&owned, &mut listed).await {
                Restart::Assignment => continue,
                Restart::GroupGone => return,
            }
        }
    }

    /// Watches the objects of `owned` until the owned pairs change.
    async fn watch(&mut self, owned: &BTreeMap<u32, Term>, listed: &mut BTreeMap<u32, Term>) -> Restart {
        let selector = partition_selector(owned.keys().copied());
        let mut config = self.base.clone();
        config.label_selector = Some(match config.label_selector.take().filter(|s| !s.is_empty()) {
            Some(users) => format!("{users},{selector}"),
            None => selector,
        });
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(identity = self.identity.as_str(), partitions = owned.len(), "watching the owned partitions");
        let mut events = watcher(self.api.clone(), config).default_backoff().boxed();
        let cache = self.writer.as_reader();
        let mut pending: Vec<ObjectRef<K>> = Vec::new();
        loop {
            tokio::select! {
                changed = self.assignment.changed() => {
                    if changed.is_err() {
                        return Restart::GroupGone;
                    }
                    if self.assignment.borrow_and_update().owned != *owned {
                        return Restart::Assignment;
                    }
                }
                event = events.next() => match event {
                    // kube-runtime's watcher never ends; if it did, start over.
                    None => return Restart::Assignment,
                    Some(Err(error)) => tracing::warn!(
                        identity = self.identity.as_str(), %error, "the watch of the owned partitions failed; retrying"
                    ),
                    Some(Ok(event)) => self.apply(event, owned, listed, &cache, &mut pending),
                },
            }
        }
    }

    /// Applies one event to the cache and queues what it asks to reconcile.
    fn apply(
        &mut self,
        event: watcher::Event<K>,
        owned: &BTreeMap<u32, Term>,
        listed: &mut BTreeMap<u32, Term>,
        cache: &Store<K>,
        pending: &mut Vec<ObjectRef<K>>,
    ) {
        let dynamic_type = K::DynamicType::default();
        match &event {
            watcher::Event::Apply(object) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
                self.writer.apply_watcher_event(&event);
                let _ = self.queue.send(object.to_object_ref(dynamic_type));
            }
            watcher::Event::Delete(_) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
                self.writer.apply_watcher_event(&event);
            }
            watcher::Event::Init => {
                pending.clear();
                self.writer.apply_watcher_event(&event);
            }
            watcher::Event::InitApply(object) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
                let reference = object.to_object_ref(dynamic_type);
                let partition = self.ownership.partition_of(&object_key(object));
                let gained = owned.get(&partition).is_some() && owned.get(&partition) != listed.get(&partition);
                let version = &object.meta().resource_version;
                let changed = cache.get(&reference).is_none_or(|cached| cached.meta().resource_version != *version);
                if gained || changed {
                    pending.push(reference);
                }
                self.writer.apply_watcher_event(&event);
            }
            watcher::Event::InitDone => {
                // The listed objects are in the cache only now: queue them after the swap, so that
                // the runner finds every one.
                self.writer.apply_watcher_event(&event);
                listed.clone_from(owned);
                for reference in pending.drain(..) {
                    let _ = self.queue.send(reference);
                }
            }
        }
    }
}

/// Why a watch of the owned partitions ended.
enum Restart {
    /// The owned pairs changed: watch the new ones.
    Assignment,
    /// The group's assignment watch ended (the group was dropped).
    GroupGone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(value: Option<&str>) -> ObjectMeta {
        let labels = value.map(|v| [(PARTITION_LABEL.to_owned(), v.to_owned())].into_iter().collect());
        ObjectMeta { labels, ..ObjectMeta::default() }
    }

    #[test]
    fn the_selector_names_every_owned_partition() {
        assert_eq!(partition_selector([0, 3, 7]), "tenure.dev/partition in (0,3,7)");
    }

    #[test]
    fn one_selector_of_all_1024_partitions_is_about_4_kib() {
        // Why one watch per replica is enough (see the module documentation).
        assert_eq!(partition_selector(0..1024).len(), 4035);
    }

    #[test]
    fn a_label_agrees_only_when_it_is_the_canonical_number_of_the_keys_partition() {
        assert_eq!(check_label(&labelled(Some("3")), 3, 12), Ok(()));
        assert_eq!(check_label(&labelled(None), 3, 12), Err(Mislabel::Missing));
        assert_eq!(check_label(&labelled(Some("5")), 3, 12), Err(Mislabel::OtherPartition { label: 5 }));
        assert_eq!(
            check_label(&labelled(Some("99")), 3, 12),
            Err(Mislabel::OutOfRange { label: 99, partition_count: 12 })
        );
        assert_eq!(check_label(&labelled(Some("03")), 3, 12), Err(Mislabel::NotANumber("03".into())));
        assert_eq!(check_label(&labelled(Some("x")), 3, 12), Err(Mislabel::NotANumber("x".into())));
    }
}
