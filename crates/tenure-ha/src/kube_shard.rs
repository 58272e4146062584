//! A kube-runtime `Controller` on every replica, each reconciling only the objects it owns
//! (Active/Active, feature `kube`).
//!
//! Why it exists: [`crate::kube_controller`] lets one replica do all the work; with a
//! [`tenure_group::Group`] the work is shared. [`shard_controller`] runs the user's `Controller`
//! on every replica and wraps its reconciler: the object's key (`namespace/name`, see
//! [`object_key`]) is mapped to its partition, and
//!
//! - **not owned here** (another member's, or in transit): the user's reconciler is not called,
//!   the object is skipped with [`Action::await_change`]. This also drops a requeue of an object
//!   whose partition has moved away since.
//! - **owned**: the user's reconciler runs with an [`Owning`] context that holds the partition's
//!   [`PartitionGuard`] until the reconcile (and the error policy) returned. The group releases a
//!   revoked partition only once its guards are gone (or its drain timeout passed), so the new
//!   owner starts on an object only after the old owner's reconcile of it finished: never two
//!   replicas on one object at once. `ctx.check()?` refuses to act once the partition was
//!   revoked, and `ctx.term()` is the fencing token to write with.
//!
//! Every replica here still watches and caches every object; [`crate::kube_shard_watch`] runs the
//! same reconciler and guards on a watch of this replica's partitions only.
//!
//! **Objects of gained partitions.** When this replica gains a partition, its objects are
//! reconciled at once, without waiting for a change: the assignment watch feeds
//! [`Controller::reconcile_all_on`] whenever the set of owned `(partition, term)` pairs grows. The
//! cost: on every gain, every object in the controller's cache is scheduled; those of other
//! members' partitions are skipped after a hash and a lock (no API request, no user code), but those
//! of partitions this replica already owned are reconciled again (kube-runtime's reconcilers must be
//! idempotent anyway). Gains happen only on membership changes, so that is one extra pass over this
//! replica's share per join or leave. Reconciling only the gained partitions' objects needs
//! `Controller::reconcile_on`, which kube exposes only behind its `unstable-runtime` feature; this
//! module stays on the stable API.
//!
//! **Writes (invariant W1).** Give the reconciler a client gated by the group member:
//! `tenure_kube::WriteGate::owner(group.ownership()).client(client)` (before the group is moved
//! into [`shard_controller`]; or, a buffer hop cheaper, the gate as a layer of a client built with
//! `kube::client::ClientBuilder`), and put it in your context. Every write then needs the partition of
//! its object's key (the same [`object_key`], from the request's path, or the body's name for a
//! create) to be this replica's at the moment it leaves: a reconcile on a partition that was just
//! revoked, or of an object the user's code reached by mistake, gets `tenure_kube::WriteRefused`
//! instead of writing over the new owner, and a write in flight when the partition is revoked is
//! dropped, so it never holds up the handover. A controller that writes objects related to the one
//! it reconciles (a child named after its parent) keys them by the parent with
//! `WriteGate::owner_keyed`. Keep the group store's client ungated.
//!
//! **Leaving.** [`ShardController::leave`] stops the controller (no new reconcile starts, the ones
//! in flight finish, up to a drain timeout after which they are aborted and their guards dropped),
//! then leaves the group, which hands every partition over in one write. Dropping the handle
//! aborts the controller and the membership like a crash: the others take over after the lease.
//!
//! ```no_run
//! # async fn f(client: kube::Client, store: tenure_group::stores::file::FileGroupStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::{controller::Action, watcher, Controller};
//! use kube::{Api, ResourceExt};
//! use kube::api::{Patch, PatchParams};
//! use tenure_group::{Group, NotOwner};
//! use tenure_ha::kube_shard::{shard_controller, Owning};
//! use tenure_kube::WriteGate;
//!
//! #[derive(Debug, thiserror::Error)]
//! enum Error {
//!     #[error(transparent)]
//!     Moved(#[from] NotOwner),
//!     #[error(transparent)]
//!     Kube(#[from] kube::Error),                     // a WriteRefused once the partition moved
//! }
//!
//! async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Owning<kube::Client>>) -> Result<Action, Error> {
//!     let term = ctx.check()?;                         // fenced: refuse once the partition moved
//!     let configmaps: Api<ConfigMap> = Api::namespaced((**ctx).clone(), &cm.namespace().unwrap_or_default());
//!     let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {"term": term.to_string()}}}));
//!     configmaps.patch(&cm.name_any(), &PatchParams::default(), &patch).await?;  // sent only while owned
//!     Ok(Action::await_change())
//! }
//!
//! let group = Group::builder("replica-a", store).join()?;
//! let gated = WriteGate::owner(group.ownership()).client(client.clone()); // the store keeps its own
//! let configmaps: Api<ConfigMap> = Api::all(gated.clone());
//! let shard = shard_controller(
//!     group,
//!     Controller::new(configmaps, watcher::Config::default()),
//!     reconcile,
//!     |_cm, _error, _ctx| Action::requeue(Duration::from_secs(5)),
//!     Arc::new(gated),
//! )?;
//! // on SIGTERM: finish the reconciles in flight, then hand every partition over
//! shard.leave(Duration::from_secs(10)).await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{Action, Controller, Error as ControllerError};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tenure::Term;
use tenure_group::{Group, GroupError, NotOwner, PartitionGuard};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::kube_controller::Outcome;

/// The key an object is sharded by: `namespace/name`, or `name` for a cluster-scoped object
/// (`tenure_kube::write_gate::object_key`, so the write gate keys a request for the object alike).
///
/// Why it is public: a replica that wants to ask the group about an object outside a reconcile
/// (`group.belongs_to_self(&object_key(&pod))`) must use the same key the controller does.
pub fn object_key<K: Resource>(object: &K) -> String {
    tenure_kube::write_gate::object_key(object.meta().namespace.as_deref(), &object.name_any())
}

/// The context a sharded reconciler and its error policy receive: the user's context and the
/// guard of the object's partition.
///
/// Why it wraps the user's context: kube-runtime hands the reconciler one `Arc<Ctx>`, and the
/// guard differs per object. It dereferences to the user's context. Holding it (any clone) keeps
/// a revoked partition from being handed over, so keep it only while reconciling.
#[derive(Debug)]
pub struct Owning<Ctx> {
    guard: PartitionGuard,
    context: Arc<Ctx>,
}

impl<Ctx> Owning<Ctx> {
    /// The guard of the object's partition.
    pub fn guard(&self) -> &PartitionGuard {
        &self.guard
    }

    /// The object's partition.
    pub fn partition(&self) -> u32 {
        self.guard.partition()
    }

    /// The fencing term of this ownership of the partition: pass it to every protected write.
    pub fn term(&self) -> Term {
        self.guard.term()
    }

    /// The term if this replica still owns the partition under it: call before each side effect.
    pub fn check(&self) -> Result<Term, NotOwner> {
        self.guard.check()
    }

    /// The user's context, shared by every reconcile.
    pub fn context(&self) -> &Arc<Ctx> {
        &self.context
    }
}

impl<Ctx> Deref for Owning<Ctx> {
    type Target = Ctx;

    fn deref(&self) -> &Ctx {
        &self.context
    }
}

/// Why a sharded controller could not be started or could not leave.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// `shard_controller` was called outside a tokio runtime.
    #[error("a sharded controller needs a tokio runtime (call shard_controller inside one)")]
    NoRuntime,
    /// Leaving the group failed.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The controller did not give the group back; it is dropped (the others take over after the
    /// lease).
    #[error("the controller's task still holds the group; dropping it (the others take over after the lease)")]
    GroupInUse,
}

/// A running sharded controller: this replica's membership and its `Controller`.
///
/// Why a handle: leaving must stop the controller before the group hands the partitions over, and
/// the group must outlive every reconcile that may take a guard. Dropping it aborts its tasks,
/// which stops the controller like a crash.
#[derive(Debug)]
pub struct ShardController {
    group: Arc<Group>,
    shutdown: CancellationToken,
    controller: AbortOnDropHandle<()>,
    gains: AbortOnDropHandle<()>,
}

impl ShardController {
    /// A handle on a running controller: `controller` runs the reconciles and ends (its
    /// in-flight reconciles drained) once `shutdown` is cancelled; `feeder` is the task that feeds
    /// it from the assignment (aborted after the drain).
    pub(crate) fn from_parts(
        group: Arc<Group>,
        shutdown: CancellationToken,
        controller: AbortOnDropHandle<()>,
        feeder: AbortOnDropHandle<()>,
    ) -> Self {
        ShardController { group, shutdown, controller, gains: feeder }
    }

    /// This replica's membership: its identity, the assignment watch, `belongs_to_self`.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Leaves gracefully: the controller starts no new reconcile, the ones in flight finish (those
    /// still running after `drain_timeout` are aborted, dropping their guards), then the group
    /// hands every partition over.
    pub async fn leave(self, drain_timeout: Duration) -> Result<(), ShardError> {
        let ShardController { group, shutdown, mut controller, gains } = self;
        shutdown.cancel();
        if tokio::time::timeout(drain_timeout, &mut controller).await.is_err() {
            tracing::warn!(?drain_timeout, "reconciles outlasted the drain timeout; aborting them");
            controller.abort();
            let _ = (&mut controller).await;
        }
        drop(gains);
        let group = Arc::into_inner(group).ok_or(ShardError::GroupInUse)?;
        group.leave().await?;
        Ok(())
    }
}

/// A user's reconcile error, with the action its error policy chose while the guard was held.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub(crate) struct Failed<E: std::error::Error + 'static> {
    error: E,
    pub(crate) action: Action,
}

/// What every reconcile shares: the user's parts. Not the group: kube-runtime runs each reconcile
/// in a task of its own, which outlives the controller's stream briefly when aborted, and the
/// group must be free to leave as soon as the stream is gone (the guards keep the drain rule).
pub(crate) struct Shared<Ctx, Reconcile, ErrorPolicy> {
    pub(crate) context: Arc<Ctx>,
    pub(crate) reconcile: Reconcile,
    pub(crate) error_policy: ErrorPolicy,
}

/// One reconcile of a sharded controller: skipped (and any requeue of it dropped) without `guard`
/// (the object is not this replica's now), else the user's reconciler with the guard held in its
/// [`Owning`] context, and on failure the user's error policy, before the guard is dropped.
pub(crate) async fn reconcile_owned<K, Ctx, Reconcile, ReconcileFut, ReconcileError, ErrorPolicy>(
    guard: Option<PartitionGuard>,
    object: Arc<K>,
    shared: Arc<Shared<Ctx, Reconcile, ErrorPolicy>>,
) -> Result<Action, Failed<ReconcileError>>
where
    Reconcile: Fn(Arc<K>, Arc<Owning<Ctx>>) -> ReconcileFut,
    ReconcileFut: Future<Output = Result<Action, ReconcileError>>,
    ReconcileError: std::error::Error + 'static,
    ErrorPolicy: Fn(Arc<K>, &ReconcileError, Arc<Owning<Ctx>>) -> Action,
{
    let Some(guard) = guard else { return Ok(Action::await_change()) };
    let owning = Arc::new(Owning { guard, context: shared.context.clone() });
    match (shared.reconcile)(object.clone(), owning.clone()).await {
        Ok(action) => Ok(action),
        Err(error) => {
            let action = (shared.error_policy)(object, &error, owning);
            Err(Failed { error, action })
        }
    }
}

/// Runs `controller` on this replica of `group`, reconciling only the objects whose key this
/// replica owns, with the drain rule (see the module documentation).
///
/// `reconcile` and `error_policy` receive an [`Owning`] context (the user's `context` and the
/// partition's guard); the error policy runs before the guard is dropped. Objects of partitions
/// this replica gains are reconciled at once. Must be called inside a tokio runtime.
pub fn shard_controller<K, Ctx, Reconcile, ReconcileFut, ReconcileError, ErrorPolicy>(
    group: Group,
    controller: Controller<K>,
    reconcile: Reconcile,
    error_policy: ErrorPolicy,
    context: Arc<Ctx>,
) -> Result<ShardController, ShardError>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Ctx: Send + Sync + 'static,
    Reconcile: Fn(Arc<K>, Arc<Owning<Ctx>>) -> ReconcileFut + Send + Sync + 'static,
    ReconcileFut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    ReconcileError: std::error::Error + Send + 'static,
    ErrorPolicy: Fn(Arc<K>, &ReconcileError, Arc<Owning<Ctx>>) -> Action + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ShardError::NoRuntime)?;
    let group = Arc::new(group);
    let shutdown = CancellationToken::new();

    // Gains of (partition, term) pairs, as a trigger to reconcile every cached object.
    let (gained, mut gains_rx) = mpsc::unbounded_channel::<()>();
    let mut assignment = group.assignment();
    let gains = runtime.spawn(async move {
        let mut seen: BTreeMap<u32, Term> = assignment.borrow_and_update().owned.clone();
        while assignment.changed().await.is_ok() {
            let owned = assignment.borrow_and_update().owned.clone();
            let grew = owned.iter().any(|(partition, term)| seen.get(partition) != Some(term));
            seen = owned;
            if grew && gained.send(()).is_err() {
                break;
            }
        }
    });
    let trigger = futures::stream::poll_fn(move |cx| gains_rx.poll_recv(cx));

    let shared = Arc::new(Shared { context, reconcile, error_policy });
    let owner = group.clone();
    let identity = group.identity().to_owned();
    let controller = controller.reconcile_all_on(trigger).graceful_shutdown_on(shutdown.clone().cancelled_owned());
    let task = runtime.spawn(async move {
        controller
            .run(
                move |object: Arc<K>, shared: Arc<Shared<Ctx, Reconcile, ErrorPolicy>>| {
                    // Not this replica's object (now): skipped, and any requeue of it dropped.
                    let guard = owner.guard_for_key(&object_key(object.as_ref()));
                    reconcile_owned(guard, object, shared)
                },
                |_object, failed: &Failed<ReconcileError>, _shared| failed.action.clone(),
                shared,
            )
            .for_each(|result| {
                log_outcome(&identity, result);
                futures::future::ready(())
            })
            .await;
    });
    let (controller, gains) = (AbortOnDropHandle::new(task), AbortOnDropHandle::new(gains));
    Ok(ShardController { group, shutdown, controller, gains })
}

/// Logs one item of the controller's output stream: reconciles (and skips) at debug, failures as
/// warnings.
pub(crate) fn log_outcome<K: Resource<DynamicType: Debug>, E: Error, W: Error>(
    identity: &str,
    result: Outcome<K, E, W>,
) {
    match result {
        Ok((object, action)) => tracing::debug!(identity, %object, ?action, "reconciled or skipped"),
        // A requeue of an object that has left the cache since: deleted, or (with sharded
        // watches) its partition moved away.
        Err(ControllerError::ObjectNotFound(object)) => {
            tracing::debug!(identity, %object, "not reconciled: no longer cached (deleted or moved away)")
        }
        Err(ControllerError::ReconcilerFailed(error, object)) => {
            tracing::warn!(identity, %object, %error, "reconcile failed; the error policy decides the retry")
        }
        Err(error) => tracing::warn!(identity, %error, "controller error"),
    }
}
