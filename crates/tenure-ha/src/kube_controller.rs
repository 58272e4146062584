//! A kube-runtime `Controller` that runs only while this replica leads (feature `kube`).
//!
//! Why it exists: most kube-rs operators are a [`Controller`], and controller-runtime's answer to
//! leader election (exit the process when leadership is lost) is the one its users keep asking to
//! be rid of. [`GateBuilder::spawn_controller`] builds a fresh `Controller` on every tenure, runs
//! it, and stops it with [`Controller::graceful_shutdown_on`] the moment leadership ends: no new
//! reconcile starts, the ones in flight finish (up to the gate's drain timeout, after which they
//! are aborted), and only then is the lock released. The replica keeps campaigning; on its next
//! tenure a new `Controller` starts (with a fresh list: kube-rs's `watcher` cannot resume from a
//! saved version, issue 1419; use [`crate::kube_watch::GatedWatch`] where a deletion made while
//! nobody led must reach the handler).
//!
//! **Fencing.** The reconciler's context is a [`Leading`]: the user's context plus the
//! [`Tenure`] the controller runs under. `ctx.check()?` before each side effect refuses to act
//! once the tenure has ended, and `ctx.term()` is the fencing token to pass to the store written
//! (e.g. `tenure_etcd::EtcdElection::guarded_txn`). Because the context holds the tenure guard,
//! the elector does not release the lock while any reconcile of this tenure still runs (even one
//! aborted after the drain timeout, until it has actually been dropped), so two leaders'
//! reconciles never overlap.
//!
//! **Writes (invariant W1).** Give the reconciler a client gated by the elector:
//! `tenure_kube::WriteGate::leader(&elector).client(client)` (or, a buffer hop cheaper, a client
//! built with the gate as a layer: `ClientBuilder::try_from(config)?.with_layer(&gate).build()`),
//! and put that client in your context (the `Controller`'s own watches may use it too: reads
//! always pass). Then no code path
//! of a replica that does not lead sends a write: a reconcile that finishes after leadership ended
//! (during the drain, or in a process resumed after a pause past its lease) gets
//! `tenure_kube::WriteRefused` from every `create`, `replace`, `patch` or `delete`, checked at the
//! moment the request leaves, and a write still in flight when the tenure ends is dropped
//! (`RefusalReason::Cancelled`), so it never holds up the release either. `ctx.check()?` stays
//! the way to skip work early, and the term stays the fencing token for stores outside
//! Kubernetes. Keep the elector's own lock client ungated: it must write to become leader.
//!
//! **A reconcile that never returns (invariant G1).** With [`GateBuilder::stuck_after`] every
//! reconcile is an operation of the gate: one still running after that bound makes the replica
//! give way (logged at WARN with the object, counted in `tenure_ha_work_stops_total` with
//! `reason="stuck"`): the controller is stopped as on a resign, the lock is released, and another
//! replica leads. Off by default (see there why).
//!
//! A raw kube-runtime `watcher` needs nothing of its own: run it in a [`crate::Gate`] and end
//! the stream with the context's cancellation.
//!
//! ```no_run
//! # async fn f(elector: tenure::Elector, client: kube::Client) {
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::runtime::{watcher, WatchStreamExt};
//! use kube::Api;
//! use tenure_ha::Gate;
//!
//! let pods: Api<Pod> = Api::default_namespaced(client);
//! let gate = Gate::builder(&elector).spawn(move |ctx| {
//!     let pods = pods.clone();
//!     async move {
//!         let mut events = watcher(pods, watcher::Config::default())
//!             .default_backoff()
//!             .take_until(ctx.cancellation_token().cancelled_owned())  // leadership ended
//!             .boxed();
//!         while let Some(event) = events.next().await {
//!             if ctx.tenure().check().is_err() { break; }              // fenced: no side effect
//!             println!("{:?}", event.map(|_| ()));
//!         }
//!         Ok::<_, std::convert::Infallible>(())
//!     }
//! });
//! # }
//! ```

use std::error::Error;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::controller::{Action, Controller, Error as ControllerError};
use kube::Resource;
use serde::de::DeserializeOwned;
use tenure::{NotLeader, Tenure, Term};

use crate::gate::{GateBuilder, GateHandle};

/// The context a gated controller's reconciler and error policy receive: the user's context and
/// the tenure this run of the controller belongs to.
///
/// Why it wraps the user's context rather than extending it: kube-runtime hands the reconciler
/// exactly one `Arc<Ctx>`, and the tenure changes with every run while the user's context does
/// not. It dereferences to the user's context, so `ctx.client` keeps working.
#[derive(Debug)]
pub struct Leading<Ctx> {
    tenure: Tenure,
    context: Arc<Ctx>,
}

impl<Ctx> Leading<Ctx> {
    /// The tenure guard of this run: holding it (any clone of this context) keeps the lock from
    /// being released, so keep it only while reconciling.
    pub fn tenure(&self) -> &Tenure {
        &self.tenure
    }

    /// The fencing term of this run: pass it to every write of a protected resource.
    pub fn term(&self) -> Term {
        self.tenure.term()
    }

    /// The term if this replica still leads: call before each side effect.
    pub fn check(&self) -> Result<Term, NotLeader> {
        self.tenure.check()
    }

    /// The user's context, shared by every run.
    pub fn context(&self) -> &Arc<Ctx> {
        &self.context
    }
}

impl<Ctx> Deref for Leading<Ctx> {
    type Target = Ctx;

    fn deref(&self) -> &Ctx {
        &self.context
    }
}

impl GateBuilder {
    /// Runs a kube-runtime [`Controller`] only while the elector leads: `build` makes a new one on
    /// every tenure (and on every restart after a panic), and it is run with `reconcile`,
    /// `error_policy` and `context` wrapped in a [`Leading`].
    ///
    /// When leadership ends gracefully (resign, elector shutdown), the controller is shut down
    /// with [`Controller::graceful_shutdown_on`]: reconciles in flight finish, up to the gate's
    /// drain timeout, and the lock is released after. When it is lost, the controller is dropped
    /// at once (its reconciles aborted). Reconcile errors and watch errors are logged; the
    /// controller's own retries (the error policy) handle them.
    ///
    /// With [`GateBuilder::stuck_after`], each reconcile counts as an operation in flight from
    /// its start until it returns (or is aborted): a reconcile still running after that bound
    /// makes this replica give way to another (`Gate::builder(&elector).stuck_after(d)?`).
    ///
    /// The reconciler's client is gated by the elector (see the module documentation), so a
    /// replica that no longer leads sends no write, whatever the reconcile still does:
    ///
    /// ```no_run
    /// # async fn f(elector: tenure::Elector, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::{sync::Arc, time::Duration};
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube::runtime::{controller::Action, watcher, Controller};
    /// use kube::api::{Patch, PatchParams};
    /// use kube::{Api, ResourceExt};
    /// use tenure_ha::{kube_controller::Leading, Gate};
    /// use tenure_kube::WriteGate;
    ///
    /// #[derive(Debug, thiserror::Error)]
    /// enum Error {
    ///     #[error("not leading: {0}")]
    ///     Deposed(#[from] tenure::NotLeader),
    ///     #[error(transparent)]
    ///     Kube(#[from] kube::Error),              // a WriteRefused arrives here once deposed
    /// }
    ///
    /// struct Context { client: kube::Client }     // the gated client
    ///
    /// async fn reconcile(pod: Arc<Pod>, ctx: Arc<Leading<Context>>) -> Result<Action, Error> {
    ///     let term = ctx.check()?;                              // fenced: skip the work early
    ///     let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    ///     let patch = Patch::Merge(serde_json::json!({"metadata": {"annotations": {"term": term.to_string()}}}));
    ///     pods.patch(&pod.name_any(), &PatchParams::default(), &patch).await?;  // sent only while leading
    ///     Ok(Action::await_change())
    /// }
    ///
    /// let client = WriteGate::leader(&elector).client(client);  // the lock keeps its own client
    /// let pods: Api<Pod> = Api::default_namespaced(client.clone());
    /// let controller = Gate::builder(&elector).drain_timeout(Duration::from_secs(5)).spawn_controller(
    ///     move |_tenure| Controller::new(pods.clone(), watcher::Config::default()),
    ///     reconcile,
    ///     |_pod, _error, _ctx| Action::requeue(Duration::from_secs(5)),
    ///     Arc::new(Context { client }),
    /// );
    /// // on SIGTERM: stop the controller (in-flight reconciles finish), then release the lock
    /// controller.shutdown().await;
    /// elector.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub fn spawn_controller<K, Ctx, Build, Reconcile, ReconcileFut, ReconcileError, ErrorPolicy>(
        self,
        build: Build,
        reconcile: Reconcile,
        error_policy: ErrorPolicy,
        context: Arc<Ctx>,
    ) -> GateHandle
    where
        K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
        Ctx: Send + Sync + 'static,
        Build: Fn(&Tenure) -> Controller<K> + Send + Sync + 'static,
        Reconcile: Fn(Arc<K>, Arc<Leading<Ctx>>) -> ReconcileFut + Send + Sync + 'static,
        ReconcileFut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
        ReconcileError: std::error::Error + Send + 'static,
        ErrorPolicy: Fn(Arc<K>, &ReconcileError, Arc<Leading<Ctx>>) -> Action + Send + Sync + 'static,
    {
        let (build, reconcile, error_policy) = (Arc::new(build), Arc::new(reconcile), Arc::new(error_policy));
        self.spawn(move |leader| {
            let controller = build(leader.tenure()).graceful_shutdown_on(leader.cancellation_token().cancelled_owned());
            let context = Arc::new(Leading { tenure: leader.tenure().clone(), context: context.clone() });
            let (reconcile, error_policy) = (reconcile.clone(), error_policy.clone());
            let term = leader.term();
            let operations = leader.operations();
            async move {
                controller
                    .run(
                        move |object, ctx| {
                            // In flight from now until the reconcile returns or is dropped.
                            let operation = operations.start(Reconcile(&*object));
                            let reconciling = reconcile(object, ctx);
                            async move {
                                let outcome = reconciling.await;
                                drop(operation);
                                outcome
                            }
                        },
                        move |object, error, ctx| error_policy(object, error, ctx),
                        context,
                    )
                    .for_each(|result| async move { log_outcome(term, result) })
                    .await;
                // Ended by the graceful shutdown (leadership ended), or by a shutdown trigger the
                // user added to the controller: the gate starts it again on the next tenure.
                drop(leader);
                Ok::<_, std::convert::Infallible>(())
            }
        })
    }
}

/// Names a reconcile in the log line of a give-way: `reconcile of <namespace>/<name>`.
struct Reconcile<'a, K>(&'a K);

impl<K: Resource> std::fmt::Display for Reconcile<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let meta = self.0.meta();
        let name = meta.name.as_deref().or(meta.generate_name.as_deref()).unwrap_or_default();
        match meta.namespace.as_deref() {
            Some(namespace) => write!(f, "reconcile of {namespace}/{name}"),
            None => write!(f, "reconcile of {name}"),
        }
    }
}

/// One item of a controller's output stream: the object reconciled and the action, or the error.
pub(crate) type Outcome<K, E, W> = Result<(kube::runtime::reflector::ObjectRef<K>, Action), ControllerError<E, W>>;

/// Logs one item of a controller's output stream: reconciles at debug, failures as warnings.
fn log_outcome<K: Resource<DynamicType: Debug>, E: Error, W: Error>(term: Term, result: Outcome<K, E, W>) {
    match result {
        Ok((object, action)) => tracing::debug!(term = term.0, %object, ?action, "reconciled"),
        Err(ControllerError::ReconcilerFailed(error, object)) => {
            tracing::warn!(term = term.0, %object, %error, "reconcile failed; the error policy decides the retry")
        }
        Err(error) => tracing::warn!(term = term.0, %error, "controller error"),
    }
}
