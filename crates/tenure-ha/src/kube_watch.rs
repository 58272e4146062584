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
//! **A handler that fails** (returns `Err`, e.g. a `409 Conflict` from its own write) has its change
//! retried with back-off ([`GatedWatch::retry_backoff`], [`crate::backoff::Backoff`]) for as long as
//! the tenure lasts, while the changes of *other* objects go on being handled: one object that
//! keeps failing does not stop the controller (as with kube-runtime's `Controller`, which requeues
//! per object). Later changes of the failing object wait behind it, in order; a newer state of it
//! replaces a waiting older one (the handler sees the newest state, as a `Controller`'s
//! reconcile does), except that a deletion is never replaced, so each incarnation's deletion
//! reaches the handler. The checkpoint is a single resourceVersion, a watermark: it stays at the
//! version delivered *before* the oldest failed change until that change has been handled, so if
//! leadership ends first (retries stop with the tenure) the next leader resumes before it and
//! sees it again. The changes of other objects handled meanwhile are then handed to the next
//! leader once more: handlers must be idempotent, which they must be anyway (a relist hands every
//! object over again). A change that keeps failing keeps the watermark back, so after the server's
//! watch window (about 75 s) a new leader relists instead of resuming; failures are counted in
//! [`WatchMetrics`] and logged at WARN with the object and the error.
//!
//! **The checkpoint object itself is not watched**: when the watch includes the object the
//! checkpoint is kept in ([`CheckpointStore::object`], e.g. a watch of all ConfigMaps of the
//! checkpoint's namespace), its events are skipped: not handed to the handler and not recorded,
//! so a checkpoint write never causes the next one.
//!
//! **A handler that never returns** (invariant G1): with [`GatedWatch::stuck_after`], a handler
//! call still running after that bound makes the replica give way to another (see
//! [`GateBuilder::stuck_after`]); the change it was handling is not checkpointed, so the next
//! leader handles it again.
//!
//! A kube-runtime `Controller` is gated by [`crate::kube_controller`]; this module is for
//! controllers that must not miss a deletion across a leader change, which `Controller`'s
//! always-relisting `watcher` cannot promise (kube-rs issue 1419).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tenure::{Elector, Tenure};
use tenure_kube::resume::{ResumableWatcher, ResumeError, ResumeEvent};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::checkpoint::{CheckpointError, CheckpointObject, CheckpointStore, Checkpointer};
use crate::gate::{check_stuck_after, Gate, GateBuilder, GateError, GateHandle, LeaderContext};
use crate::gc::GcTrigger;

/// Selectors, timeouts and reconnection back-off of the watch ([`GatedWatch::config`]),
/// re-exported so that a `GatedWatch` user needs no direct dependency on `tenure-kube`.
pub use tenure_kube::resume::ResumeConfig;

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
    /// Calls of the handler (every attempt, retries included).
    pub reconciles: Counter,
    /// Calls of the handler that returned an error (first attempts and retries).
    pub handler_failures: Counter,
    /// Calls of the handler that returned (`Ok` or `Err`) after the tenure had ended: neither
    /// success nor failure; the change is left to the next leader.
    pub deposed: Counter,
    /// Calls of the handler that retried a change whose handling had failed before.
    pub retries: Counter,
    /// Objects whose change failed and waits for a retry now; while it is above 0 the checkpoint
    /// does not advance (an alert on it finds an object that keeps failing).
    pub retry_pending: Gauge,
}

impl WatchMetrics {
    /// New metrics registered as `tenure_ha_watch_resume_failures_total`,
    /// `tenure_ha_watch_reconciles_total`, `tenure_ha_watch_handler_failures_total`,
    /// `tenure_ha_watch_deposed_total`, `tenure_ha_watch_retries_total` and
    /// `tenure_ha_watch_retry_pending`.
    pub fn register(registry: &mut Registry) -> WatchMetrics {
        let metrics = WatchMetrics::default();
        for (name, help, counter) in [
            (
                "tenure_ha_watch_resume_failures",
                "Resumes from a checkpoint the server no longer keeps (relisted, garbage collected)",
                &metrics.resume_failures,
            ),
            ("tenure_ha_watch_reconciles", "Calls of the leader's handler, retries included", &metrics.reconciles),
            (
                "tenure_ha_watch_handler_failures",
                "Calls of the leader's handler that returned an error",
                &metrics.handler_failures,
            ),
            (
                "tenure_ha_watch_deposed",
                "Calls of the leader's handler that returned after its tenure ended (left to the next leader)",
                &metrics.deposed,
            ),
            ("tenure_ha_watch_retries", "Calls of the leader's handler that retried a failed change", &metrics.retries),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "tenure_ha_watch_retry_pending",
            "Objects whose failed change waits for a retry (the checkpoint holds before the oldest)",
            metrics.retry_pending.clone(),
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

/// The handler with its error type erased to the message that is logged.
type Handler<K> = Arc<dyn Fn(Change<K>, Tenure) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// Opens a watch from a saved version (`None`: list first): a [`ResumableWatcher`] in production,
/// a simulated server in the model test.
type OpenWatch<K> = Arc<dyn Fn(Option<String>) -> Result<Events<K>, ResumeError> + Send + Sync>;
type Events<K> = BoxStream<'static, Result<ResumeEvent<K>, ResumeError>>;

/// How one call of the handler ended, as the checkpoint sees it.
enum Outcome {
    /// `Ok` while the tenure was still valid: the change may be checkpointed.
    Handled,
    /// `Err` while the tenure was still valid: retried with back-off in this tenure.
    Failed(String),
    /// Returned (`Ok` or `Err`) after the tenure ended: neither. Whatever the handler did or
    /// refused, the change is left to the next leader (this process under a new term, or another).
    Deposed,
}

/// The default back-off between attempts of a failed change: 1 s, doubling up to 60 s.
const RETRY_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// A watch of one kind of object whose changes are handled only by the leader.
///
/// The handler returns `Result<(), E>` for any error that displays (your own error enum, as for
/// kube-runtime's `Controller`, `kube::Error`, `anyhow::Error`...): an `Err` is logged at WARN
/// and the change retried with back-off while the checkpoint waits before it (see the module
/// documentation).
///
/// **Deposed is neither.** The runtime judges a call when it returns: if the tenure it was given
/// is over by then (lost, fenced, resigned, or this process was paused past its deadline), the
/// result, `Ok` or `Err`, does not count: the change is not checkpointed and is handed to whoever
/// leads next, this process again under a new term included (counted in
/// [`WatchMetrics::deposed`], logged at INFO). So a handler that finds itself deposed may return
/// `Ok` or `Err`; `tenure.check()?` is the shortest. A call still running when leadership ends is
/// aborted at once if the lock was lost, or may finish cleanly for the gate's drain timeout on a
/// graceful step-down (default: the elector's renew deadline, see [`GatedWatch::gate`]), then
/// aborted; its tenure has ended either way, and an aborted or panicking call's change is handled
/// again too. [`GatedWatchHandle::shutdown`] before the elector's shutdown lets in-flight calls
/// finish while the tenure is still valid, so they count.
///
/// ```no_run
/// # async fn f(client: kube::Client, elector: tenure::Elector) {
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::Pod;
/// use kube::{Api, ResourceExt};
/// use tenure_ha::{Change, GatedWatch, KubeCheckpointStore, ResumeConfig, Standby};
///
/// let store = Arc::new(KubeCheckpointStore::new(client.clone(), "default", "ipam-checkpoint", "ipam"));
/// let watch = GatedWatch::new(Api::<Pod>::namespaced(client, "default"), "pods", store)
///     .config(ResumeConfig::default().labels("app=web"))
///     .standby(Standby::Warm)
///     .run(&elector, |change, tenure| async move {
///         let term = tenure.check()?;                        // deposed: left to the next leader
///         match change {
///             Change::Applied(pod) => println!("allocate for {} under term {term}", pod.name_any()),
///             Change::Deleted(pod) => println!("release {}", pod.name_any()),
///         }
///         Ok::<_, tenure::NotLeader>(())                     // an Err is retried with back-off
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
    retry: (Duration, Duration),
    stuck_after: Option<Duration>,
    gate: Box<dyn FnOnce(GateBuilder) -> GateBuilder + Send>,
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
            retry: RETRY_BACKOFF,
            stuck_after: None,
            gate: Box::new(|builder| builder),
        }
    }

    /// The back-off between attempts of a change whose handler failed: `initial` after the first
    /// failure, doubling up to `max`, for as long as the tenure lasts. Default: 1 s and 60 s.
    #[must_use]
    pub fn retry_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.retry = (initial, max);
        self
    }

    setters! {
        /// Selectors, timeouts and back-off of the watch.
        #[must_use]
        config: ResumeConfig;
        /// The standby mode (default [`Standby::Cold`]).
        #[must_use]
        standby: Standby;
        /// Reports into these metrics.
        #[must_use]
        metrics: WatchMetrics;
        /// Adjusts the gate the leader work runs in (drain timeout, back-off, gate metrics).
        #[must_use]
        gate: impl FnOnce(GateBuilder) -> GateBuilder + Send + 'static => Box::new(gate);
    }

    /// Gives way when one call of the handler has not returned after `limit`: the replica logs
    /// why, counts it (`tenure_ha_work_stops_total{reason="stuck"}` in the gate's metrics),
    /// stops the watch as on a resign and releases the lock, so another replica leads and handles
    /// the change again; this one stays a candidate. See [`GateBuilder::stuck_after`].
    ///
    /// Default: off, because the right bound depends on the handler (client-go and
    /// controller-runtime set none either). Checked against `elector`, the elector the watch will
    /// [`run`](GatedWatch::run) on (so that `run` itself cannot fail): refused with
    /// [`GateError::StuckAfterTooShort`] when zero or shorter than its renew period.
    pub fn stuck_after(mut self, limit: Duration, elector: &Elector) -> Result<Self, GateError> {
        self.stuck_after = Some(check_stuck_after(limit, elector.timing())?);
        Ok(self)
    }

    /// Runs a garbage collection pass through `trigger` after every failed resume.
    #[must_use]
    pub fn gc_trigger(mut self, trigger: GcTrigger) -> Self {
        self.gc = Some(trigger);
        self
    }

    /// Starts watching (warm) or waiting (cold) on the current tokio runtime; `handler` runs for
    /// each change, one at a time, only while `elector` leads, with the tenure it leads under.
    /// A change whose handler returns `Err` is retried with back-off, and the checkpoint does not
    /// move past it until it succeeds or the tenure ends.
    pub fn run<F, Fut, E>(self, elector: &Elector, handler: F) -> GatedWatchHandle
    where
        F: Fn(Change<K>, Tenure) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let handler: Handler<K> =
            Arc::new(move |change, tenure| handler(change, tenure).map(|r| r.map_err(|e| e.to_string())).boxed());
        let GatedWatch { api, resource, store, config, standby, gc, metrics, retry, stuck_after, gate } = self;
        let builder = gate(Gate::builder(elector).checked_stuck_after(stuck_after));
        let stop = CancellationToken::new();
        // The checkpoint's own object, when this watch can see it: its events are skipped.
        let own = store.object().filter(|object| object.is_in(api.resource_url()));
        let open: OpenWatch<K> =
            Arc::new(move |saved| Ok(ResumableWatcher::new(api.clone(), config.clone(), saved)?.into_stream().boxed()));
        let warm = (standby == Standby::Warm).then(|| Arc::new(WarmCache::new(own.clone())));
        let leader =
            Arc::new(Leader { open, resource, store, gc, metrics: metrics.clone(), retry, own, handler, warm });
        let follower = leader.warm.clone().map(|cache| tokio::spawn(leader.clone().follow(cache, stop.clone())));
        let gate = builder.spawn(move |ctx| leader.clone().lead(ctx));
        GatedWatchHandle { gate, follower, stop, metrics }
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
    open: OpenWatch<K>,
    resource: String,
    store: Arc<dyn CheckpointStore>,
    gc: Option<GcTrigger>,
    metrics: WatchMetrics,
    retry: (Duration, Duration),
    /// The checkpoint's own object if this watch sees it.
    own: Option<CheckpointObject>,
    handler: Handler<K>,
    /// Warm standby: the cache the follower keeps (`None`: cold standby).
    warm: Option<Arc<WarmCache<K>>>,
}

impl<K> Leader<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    /// One call of the handler, counted, judged by whether the tenure outlived it. A handled
    /// change leaves the warm cache; anything else stays there for this replica's next tenure.
    async fn attempt(&self, key: &str, change: &Queued<K>, ctx: &LeaderContext) -> Outcome {
        self.metrics.reconciles.inc();
        let tenure = ctx.tenure();
        let operation = ctx.operation(format_args!("handler of {} {key}", self.resource));
        let result = (self.handler)(change.change.clone(), tenure.clone()).await;
        drop(operation);
        #[cfg(test)]
        let deposed = !tenure.is_valid() && !crate::mutation::is(crate::mutation::Mutation::DeposedOkHandled);
        #[cfg(not(test))]
        let deposed = !tenure.is_valid();
        if deposed {
            self.metrics.deposed.inc();
            tracing::info!(
                resource = %self.resource,
                object = %key,
                term = tenure.term().0,
                ok = result.is_ok(),
                "handler returned after leadership ended; not checkpointed, the next leader handles the change again"
            );
            return Outcome::Deposed;
        }
        match result {
            Ok(()) => {
                if let Some(cache) = &self.warm {
                    cache.handled(key, change.version);
                }
                Outcome::Handled
            }
            Err(error) => {
                self.metrics.handler_failures.inc();
                Outcome::Failed(error)
            }
        }
    }

    /// Hands `change` to the handler, unless an earlier change of its object is still failing
    /// (then it waits behind it). A failure is kept for retry with the watermark `hold`: the
    /// version delivered before this change.
    async fn offer(&self, retries: &mut Retries<K>, change: Queued<K>, hold: Option<String>, ctx: &LeaderContext) {
        let key = key(change.change.object());
        if retries.pending.contains_key(&key) {
            retries.enqueue(&key, change);
            return;
        }
        if let Outcome::Failed(error) = self.attempt(&key, &change, ctx).await {
            let delay = retries.failed(key.clone(), change, hold, Instant::now());
            self.warn_failed(&key, &error, 1, delay);
        }
        self.metrics.retry_pending.set(i64::try_from(retries.len()).unwrap_or(i64::MAX));
    }

    /// Retries every failed change whose back-off has passed, oldest failure first.
    async fn retry_due(&self, retries: &mut Retries<K>, ctx: &LeaderContext) {
        for key in retries.due(Instant::now()) {
            if ctx.is_cancelled() {
                return;
            }
            let Some((change, attempts)) = retries.head(&key) else { continue };
            if attempts > 0 {
                self.metrics.retries.inc();
            }
            match self.attempt(&key, &change, ctx).await {
                Outcome::Deposed => return,
                Outcome::Handled => {
                    if attempts > 0 {
                        tracing::info!(resource = %self.resource, object = %key, attempts = attempts + 1, "handler succeeded on retry");
                    }
                    retries.succeeded(&key, Instant::now());
                }
                Outcome::Failed(error) => {
                    let (delay, attempts) = retries.failed_again(&key, Instant::now());
                    self.warn_failed(&key, &error, attempts, delay);
                }
            }
        }
        self.metrics.retry_pending.set(i64::try_from(retries.len()).unwrap_or(i64::MAX));
    }

    fn warn_failed(&self, key: &str, error: &str, attempts: u32, delay: Duration) {
        tracing::warn!(
            resource = %self.resource,
            object = %key,
            %error,
            attempts,
            retry_in = ?delay,
            "handler failed; retrying with back-off (the checkpoint stays before this change)"
        );
    }

    /// Records how far the checkpoint may go: the last delivered version, or, while changes are
    /// failing, the version before the oldest of them. Recording an unchanged version costs nothing.
    fn record(&self, checkpointer: &Checkpointer, retries: &Retries<K>, delivered: Option<&str>) {
        if let Some(version) = retries.watermark().unwrap_or(delivered) {
            checkpointer.record(self.resource.clone(), version);
        }
    }

    /// The tenure ended: retries stop; says what is left to the next leader.
    fn leaving(&self, retries: &Retries<K>) {
        if !retries.is_empty() {
            tracing::info!(
                resource = %self.resource,
                failing = retries.len(),
                checkpoint = retries.watermark().flatten().unwrap_or("none"),
                "leadership ended with changes still failing; the checkpoint stays before them, the next leader handles them again"
            );
        }
        self.metrics.retry_pending.set(0);
    }

    /// One tenure's work (one start of it, restarted by the gate after a failure or panic).
    async fn lead(self: Arc<Self>, ctx: LeaderContext) -> Result<(), WatchError> {
        match self.warm.clone() {
            Some(cache) => self.lead_warm(ctx, cache).await,
            None => self.lead_cold(ctx).await,
        }
    }

    /// Cold standby: resume from the checkpoint, handle every change until leadership ends.
    async fn lead_cold(self: Arc<Self>, ctx: LeaderContext) -> Result<(), WatchError> {
        let checkpointer = Checkpointer::resume_for(self.store.clone(), &ctx).await?;
        let saved = checkpointer.resource_version(&self.resource);
        let mut watcher = (self.open)(saved.clone())?;
        let mut retries = Retries::new(self.retry);
        // The version of the last event processed (handled, or failed and kept for a retry; the
        // checkpoint's own events do not count): where the checkpoint goes while nothing fails.
        let mut delivered = saved;
        let mut logged = false;
        'tenure: loop {
            // Also when the tenure lapsed on the clock before the gate said so (a thawed process).
            if ctx.is_cancelled() {
                break 'tenure;
            }
            let due = retries.next_due();
            let event = tokio::select! {
                _ = ctx.cancelled() => break 'tenure,
                _ = sleep_until(due) => {
                    self.retry_due(&mut retries, &ctx).await;
                    self.record(&checkpointer, &retries, delivered.as_deref());
                    continue;
                }
                event = watcher.next() => event,
            };
            let event = match event {
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    tracing::warn!(resource = %self.resource, %error, "watch failed; retrying with back-off");
                    continue;
                }
                None => break 'tenure,
            };
            let version = event.resource_version();
            let hold = delivered.clone();
            match event {
                ResumeEvent::Applied(object) | ResumeEvent::Deleted(object) if is_own(self.own.as_ref(), &object) => {
                    // The checkpoint's own write: neither handled nor recorded, or each write
                    // would cause the next.
                    continue;
                }
                ResumeEvent::Applied(o) => self.offer(&mut retries, Queued::applied(o), hold, &ctx).await,
                ResumeEvent::Deleted(o) => self.offer(&mut retries, Queued::deleted(o, None), hold, &ctx).await,
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
                    let objects: Vec<K> = objects.into_iter().filter(|o| !is_own(self.own.as_ref(), o)).collect();
                    retries.listed(&objects.iter().map(key).collect());
                    for object in objects {
                        if ctx.is_cancelled() {
                            break 'tenure;
                        }
                        self.offer(&mut retries, Queued::applied(object), hold.clone(), &ctx).await;
                    }
                }
            }
            delivered = version.or(delivered);
            self.record(&checkpointer, &retries, delivered.as_deref());
        }
        self.leaving(&retries);
        Ok(())
    }

    /// Warm standby, every replica: keep the cache and the per-object changes up to date.
    async fn follow(self: Arc<Self>, cache: Arc<WarmCache<K>>, stop: CancellationToken) {
        let mut watcher = match (self.open)(None) {
            Ok(watcher) => watcher,
            Err(error) => {
                tracing::error!(resource = %self.resource, %error, "warm standby cannot watch");
                return;
            }
        };
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = watcher.next() => event,
            };
            match event {
                Some(Ok(event)) => cache.apply(event),
                Some(Err(error)) => {
                    tracing::warn!(resource = %self.resource, %error, "warm watch failed; retrying with back-off")
                }
                None => return,
            }
        }
    }

    /// Warm standby, the leader: hand over every change newer than the checkpoint at once, then
    /// every change as the watch delivers it. What an earlier tenure (or start) of this replica
    /// took and did not handle, because it was aborted, deposed, failing or panicked, is taken
    /// up again first.
    async fn lead_warm(self: Arc<Self>, ctx: LeaderContext, cache: Arc<WarmCache<K>>) -> Result<(), WatchError> {
        let checkpointer = Checkpointer::resume_for(self.store.clone(), &ctx).await?;
        cache.reclaim();
        let mut after = checkpointer.resource_version(&self.resource).and_then(|v| v.parse::<u64>().ok());
        let mut retries = Retries::new(self.retry);
        'tenure: loop {
            // Also when the tenure lapsed on the clock before the gate said so (a thawed process).
            if ctx.is_cancelled() {
                break 'tenure;
            }
            let notified = cache.changed.notified();
            self.retry_due(&mut retries, &ctx).await;
            let (changes, version) = cache.take_newer_than(after);
            // Every change taken is newer than `after`: the watermark a failure holds.
            let hold = after.map(|v| v.to_string());
            for (_, change) in changes {
                if ctx.is_cancelled() {
                    // Not handled: the cache keeps them for this replica's next tenure, and the
                    // checkpoint is not advanced past them for the next leader.
                    break 'tenure;
                }
                self.offer(&mut retries, change, hold.clone(), &ctx).await;
            }
            after = version.or(after);
            self.record(&checkpointer, &retries, after.map(|v| v.to_string()).as_deref());
            let due = retries.next_due();
            tokio::select! {
                _ = ctx.cancelled() => break 'tenure,
                _ = notified => {}
                _ = sleep_until(due) => {}
            }
        }
        self.leaving(&retries);
        Ok(())
    }
}

/// Sleeps until `at`; never completes for `None` (a `select!` branch that is off).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A change as kept for the handler: the version it brings its object to (numeric versions only;
/// used to order a warm leader's takeover) and the change.
#[derive(Debug, Clone)]
struct Queued<K> {
    version: Option<u64>,
    change: Change<K>,
}

impl<K: Resource> Queued<K> {
    fn applied(object: K) -> Queued<K> {
        Queued { version: version_of(&object), change: Change::Applied(object) }
    }

    /// A deletion, at `version` if known (a deletion found by a relist has only the list's).
    fn deleted(object: K, version: Option<u64>) -> Queued<K> {
        Queued { version: version.or_else(|| version_of(&object)), change: Change::Deleted(object) }
    }
}

/// The changes whose handler failed, per object, while one tenure lasts: retried with back-off,
/// and holding the checkpoint's watermark before the oldest of them.
///
/// Why per object: one object that keeps failing must not stop the others (kube-runtime's
/// `Controller` requeues per object too); the single watermark of a resourceVersion checkpoint is
/// what ties them together, so it stays at the oldest failure's `hold`.
struct Retries<K> {
    pending: BTreeMap<String, Pending<K>>,
    backoff: Backoff,
    /// Orders the failures: the lowest is the oldest, whose hold is the watermark.
    next_order: u64,
}

struct Pending<K> {
    /// Oldest first: the front is retried, later changes of the object wait behind it.
    changes: VecDeque<Queued<K>>,
    /// The version delivered before the first failed change: the checkpoint may not pass it
    /// (`None`: nothing was delivered before it, so no version may be recorded).
    hold: Option<String>,
    order: u64,
    due: Instant,
    /// Failed attempts of the front change (0: not attempted yet, it waited behind another).
    attempts: u32,
}

impl<K: Clone> Retries<K> {
    fn new((initial, max): (Duration, Duration)) -> Retries<K> {
        Retries { pending: BTreeMap::new(), backoff: Backoff::new(initial, max), next_order: 0 }
    }

    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn len(&self) -> usize {
        self.pending.len()
    }

    /// A change of an object whose earlier change is failing: it waits behind it. A newer state
    /// replaces a waiting state (the handler sees the newest, as a `Controller` does); a deletion
    /// is never replaced, so every incarnation's deletion is handled.
    fn enqueue(&mut self, key: &str, change: Queued<K>) {
        if let Some(pending) = self.pending.get_mut(key) {
            match pending.changes.back_mut() {
                Some(last) if matches!(last.change, Change::Applied(_)) => *last = change,
                _ => pending.changes.push_back(change),
            }
        }
    }

    /// The first failure of a change of `key`; returns the delay before its retry.
    fn failed(&mut self, key: String, change: Queued<K>, hold: Option<String>, now: Instant) -> Duration {
        let delay = self.backoff.delay(1);
        let order = self.next_order;
        self.next_order += 1;
        let pending = Pending { changes: VecDeque::from([change]), hold, order, due: now + delay, attempts: 1 };
        self.pending.insert(key, pending);
        delay
    }

    /// When the next retry is due.
    fn next_due(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.due).min()
    }

    /// The objects whose retry is due at `now`, oldest failure first.
    fn due(&self, now: Instant) -> Vec<String> {
        let mut due: Vec<(u64, String)> =
            self.pending.iter().filter(|(_, p)| p.due <= now).map(|(k, p)| (p.order, k.clone())).collect();
        due.sort();
        due.into_iter().map(|(_, key)| key).collect()
    }

    /// The change to try for `key` and how often it failed so far.
    fn head(&self, key: &str) -> Option<(Queued<K>, u32)> {
        let pending = self.pending.get(key)?;
        pending.changes.front().map(|queued| (queued.clone(), pending.attempts))
    }

    /// The front change of `key` was handled: the next one waiting is tried at once; with none
    /// left the object no longer holds the watermark.
    fn succeeded(&mut self, key: &str, now: Instant) {
        let Some(pending) = self.pending.get_mut(key) else { return };
        pending.changes.pop_front();
        if pending.changes.is_empty() {
            self.pending.remove(key);
        } else {
            pending.attempts = 0;
            pending.due = now;
        }
    }

    /// The front change of `key` failed again: the delay before the next attempt, and the
    /// number of failed attempts.
    fn failed_again(&mut self, key: &str, now: Instant) -> (Duration, u32) {
        let Some(pending) = self.pending.get_mut(key) else { return (Duration::ZERO, 0) };
        pending.attempts += 1;
        let delay = self.backoff.delay(pending.attempts);
        pending.due = now + delay;
        (delay, pending.attempts)
    }

    /// `Some(hold)` of the oldest failure while any is pending: the checkpoint's limit.
    fn watermark(&self) -> Option<Option<&str>> {
        self.pending.values().min_by_key(|p| p.order).map(|p| p.hold.as_deref())
    }

    /// A relist: a failing object missing from it was deleted while the watch was away, so what
    /// waits for it becomes its deletion (its last known state).
    fn listed(&mut self, present: &BTreeSet<String>) {
        for (_, pending) in self.pending.iter_mut().filter(|(key, _)| !present.contains(*key)) {
            if let Some(last) = pending.changes.back_mut() {
                if let Change::Applied(object) = &last.change {
                    last.change = Change::Deleted(object.clone());
                }
            }
        }
    }
}

/// A follower's view: the objects as last seen, and per object the newest change not yet known
/// to be handled.
///
/// A change a leader takes stays in the cache (in `taken`) until its handler returned `Ok` under a
/// valid tenure: the leader's task may be aborted mid-handler (a lost lock allows no drain), and
/// what only its locals held would be lost while the checkpoint, written by this same replica's
/// next tenure, passes it (issue 30). Each tenure first takes back what is still in `taken`.
struct WarmCache<K> {
    state: Mutex<WarmState<K>>,
    changed: Notify,
    /// The checkpoint's own object if the watch sees it: its events are ignored, so a checkpoint
    /// write neither reaches the handler nor moves the version the leader records.
    own: Option<CheckpointObject>,
}

impl<K> WarmCache<K> {
    fn new(own: Option<CheckpointObject>) -> Self {
        let state = Mutex::new(WarmState {
            objects: BTreeMap::new(),
            changes: BTreeMap::new(),
            taken: BTreeMap::new(),
            version: None,
        });
        WarmCache { state, changed: Notify::new(), own }
    }
}

struct WarmState<K> {
    objects: BTreeMap<String, K>,
    /// Per object key: its newest change, with the version of that change.
    changes: BTreeMap<String, Queued<K>>,
    /// Per object key: the newest change a leader took and has not handled yet.
    taken: BTreeMap<String, Queued<K>>,
    /// The version the watch has delivered up to.
    version: Option<u64>,
}

fn key<K: Resource>(object: &K) -> String {
    format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any())
}

fn version_of<K: Resource>(object: &K) -> Option<u64> {
    object.resource_version().and_then(|v| v.parse().ok())
}

/// Whether `object` is the one the checkpoint is kept in (`own`, when the watch sees it).
fn is_own<K: Resource>(own: Option<&CheckpointObject>, object: &K) -> bool {
    own.is_some_and(|own| own.is(object.meta().namespace.as_deref(), &object.name_any()))
}

impl<K: Resource + Clone> WarmCache<K> {
    fn state(&self) -> MutexGuard<'_, WarmState<K>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, event: ResumeEvent<K>) {
        if matches!(&event, ResumeEvent::Applied(o) | ResumeEvent::Deleted(o) if is_own(self.own.as_ref(), o)) {
            return;
        }
        let mut state = self.state();
        let reached = event.resource_version().and_then(|v| v.parse::<u64>().ok());
        match event {
            ResumeEvent::Applied(object) => {
                let key = key(&object);
                state.changes.insert(key.clone(), Queued::applied(object.clone()));
                state.objects.insert(key, object);
            }
            ResumeEvent::Deleted(object) => {
                let key = key(&object);
                state.objects.remove(&key);
                state.changes.insert(key, Queued::deleted(object, reached));
            }
            ResumeEvent::Progress(_) => {}
            ResumeEvent::Listed { objects, .. } => {
                let listed: BTreeMap<String, K> =
                    objects.into_iter().filter(|o| !is_own(self.own.as_ref(), o)).map(|o| (key(&o), o)).collect();
                let state = &mut *state;
                for (key, object) in state.objects.iter().filter(|(k, _)| !listed.contains_key(*k)) {
                    // Deleted while this watch was away: the list's version is when it was seen gone.
                    let deleted = Queued { version: reached, change: Change::Deleted(object.clone()) };
                    state.changes.insert(key.clone(), deleted);
                }
                for (key, object) in &listed {
                    let unchanged =
                        state.objects.get(key).map(|o| o.resource_version()) == Some(object.resource_version());
                    if !unchanged {
                        state.changes.insert(key.clone(), Queued::applied(object.clone()));
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
    /// their object keys, and the version they bring the leader to. Older ones are dropped (a
    /// checkpoint vouches for them); the taken ones wait in `taken` until [`WarmCache::handled`].
    fn take_newer_than(&self, after: Option<u64>) -> (Vec<(String, Queued<K>)>, Option<u64>) {
        let mut state = self.state();
        let mut taken: Vec<(String, Queued<K>)> = std::mem::take(&mut state.changes)
            .into_iter()
            .filter(|(_, queued)| after.zip(queued.version).is_none_or(|(after, version)| version > after))
            .collect();
        taken.sort_by_key(|(_, queued)| queued.version);
        state.taken.extend(taken.iter().cloned());
        (taken, state.version)
    }

    /// The change of `key` at `version` was handled under a valid tenure: it is done (a newer
    /// change of the object taken since still waits).
    fn handled(&self, key: &str, version: Option<u64>) {
        let mut state = self.state();
        if state.taken.get(key).is_some_and(|taken| taken.version == version) {
            state.taken.remove(key);
        }
    }

    /// A new tenure (or restart) begins: what was taken and not handled is pending again, unless
    /// the watch has seen a newer change of the same object since.
    fn reclaim(&self) {
        let mut state = self.state();
        let taken = std::mem::take(&mut state.taken);
        #[cfg(test)]
        if crate::mutation::is(crate::mutation::Mutation::ForgetTaken) {
            return;
        }
        for (key, change) in taken {
            state.changes.entry(key).or_insert(change);
        }
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn configmap(name: &str, version: u64) -> ConfigMap {
        let metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: Some(version.to_string()),
            ..ObjectMeta::default()
        };
        ConfigMap { metadata, ..ConfigMap::default() }
    }

    fn describe(retries: &Retries<ConfigMap>, key: &str) -> Vec<String> {
        let pending = &retries.pending[key];
        let describe = |queued: &Queued<ConfigMap>| match &queued.change {
            Change::Applied(o) => format!("applied {}@{}", o.name_any(), o.resource_version().unwrap_or_default()),
            Change::Deleted(o) => format!("deleted {}@{}", o.name_any(), o.resource_version().unwrap_or_default()),
        };
        pending.changes.iter().map(describe).collect()
    }

    fn retries() -> Retries<ConfigMap> {
        Retries::new((Duration::from_millis(100), Duration::from_secs(1)))
    }

    #[test]
    fn a_newer_state_replaces_a_waiting_one_but_never_a_deletion() {
        let now = Instant::now();
        let mut retries = retries();
        retries.failed("default/a".into(), Queued::applied(configmap("a", 5)), Some("4".into()), now);
        retries.enqueue("default/a", Queued::applied(configmap("a", 7)));
        assert_eq!(describe(&retries, "default/a"), ["applied a@7"], "the newest state is what the retry handles");
        retries.enqueue("default/a", Queued::deleted(configmap("a", 9), None));
        retries.enqueue("default/a", Queued::applied(configmap("a", 11)));
        retries.enqueue("default/a", Queued::applied(configmap("a", 12)));
        assert_eq!(
            describe(&retries, "default/a"),
            ["deleted a@9", "applied a@12"],
            "a recreation waits behind the deletion"
        );
        retries.succeeded("default/a", now);
        assert_eq!(describe(&retries, "default/a"), ["applied a@12"]);
        assert_eq!(retries.due(now), ["default/a"], "the next waiting change is tried at once");
        assert_eq!(retries.head("default/a").map(|(_, attempts)| attempts), Some(0), "not a retry yet");
        retries.succeeded("default/a", now);
        assert!(retries.is_empty());
    }

    #[test]
    fn the_watermark_is_the_hold_of_the_oldest_failure_until_it_succeeds() {
        let now = Instant::now();
        let mut retries = retries();
        assert_eq!(retries.watermark(), None, "nothing failing: the checkpoint follows the watch");
        retries.failed("default/a".into(), Queued::applied(configmap("a", 5)), Some("4".into()), now);
        retries.failed("default/b".into(), Queued::applied(configmap("b", 8)), Some("7".into()), now);
        assert_eq!(retries.watermark(), Some(Some("4")));
        let (delay, attempts) = retries.failed_again("default/a", now);
        assert_eq!((delay, attempts), (Duration::from_millis(200), 2), "back-off doubles");
        assert_eq!(retries.next_due(), Some(now + Duration::from_millis(100)), "b is due first");
        retries.succeeded("default/a", now);
        assert_eq!(retries.watermark(), Some(Some("7")), "the next oldest failure holds it now");
        retries.succeeded("default/b", now);
        assert_eq!(retries.watermark(), None);

        retries.failed("default/c".into(), Queued::applied(configmap("c", 2)), None, now);
        assert_eq!(retries.watermark(), Some(None), "nothing before the failure: no version may be recorded");
    }

    #[test]
    fn a_relist_turns_a_failing_object_that_is_gone_into_its_deletion() {
        let now = Instant::now();
        let mut retries = retries();
        retries.failed("default/a".into(), Queued::applied(configmap("a", 5)), Some("4".into()), now);
        retries.failed("default/b".into(), Queued::applied(configmap("b", 6)), Some("4".into()), now);
        retries.listed(&BTreeSet::from(["default/b".to_owned()]));
        assert_eq!(describe(&retries, "default/a"), ["deleted a@5"]);
        assert_eq!(describe(&retries, "default/b"), ["applied b@6"]);
    }

    #[test]
    fn the_checkpoint_object_is_ignored_by_a_warm_cache() {
        let own = CheckpointObject {
            all_namespaces_url: "/api/v1/configmaps".into(),
            namespace_url: "/api/v1/namespaces/default/configmaps".into(),
            namespace: "default".into(),
            name: "checkpoint".into(),
        };
        let cache = WarmCache::<ConfigMap>::new(Some(own));
        cache.apply(ResumeEvent::Applied(configmap("a", 5)));
        cache.apply(ResumeEvent::Applied(configmap("checkpoint", 6)));
        let (changes, version) = cache.take_newer_than(None);
        assert_eq!(changes.into_iter().map(|(key, _)| key).collect::<Vec<_>>(), ["default/a"]);
        assert_eq!(version, Some(5), "the checkpoint's own write does not move the version");
        cache.apply(ResumeEvent::Listed {
            objects: vec![configmap("a", 5), configmap("checkpoint", 8)],
            version: "8".into(),
            cause: tenure_kube::resume::ListCause::Initial,
        });
        assert!(cache.take_newer_than(Some(5)).0.is_empty(), "a listed checkpoint object is no change");
    }
}
