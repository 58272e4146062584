//! # tenure-ha: what a controller does with leadership
//!
//! The election ([`tenure`]) decides who leads; this crate is the runtime above it, for any
//! backend (file, Kubernetes, etcd, ZooKeeper: it takes a [`tenure::Elector`]). It solves the
//! three problems the Kuryr HA design (the project's first seed) left open, one module each:
//!
//! | the seed's problem | module |
//! |---|---|
//! | start the watcher only while leading, stop it gracefully on losing leadership | [`gate`] |
//! | "New leader will not get the notification about the deletion": resume from the last seen `resourceVersion` | [`checkpoint`] |
//! | orphaned OpenStack resources after a crash between create and annotate | [`gc`] |
//!
//! and, for all three, fencing: every tenure has a [`tenure::Term`]; the gate hands it to the
//! work, checkpoints are written with it and rejected once a newer term has written, the collector
//! checks it before each delete and passes it to the delete. With the `etcd` feature,
//! `checkpoint::etcd` writes through a transaction guarded by the election key, and with the `zk`
//! feature `checkpoint::zk` through a multi-operation that checks the election node: stores that
//! refuse a deposed leader themselves. With the `kube` feature, `kube_controller` runs a
//! kube-runtime `Controller` only while leading, `kube_shard` runs one on every replica of a
//! `tenure_group::Group`, each reconciling the objects it owns (Active/Active), `kube_shard_watch`
//! gives each such replica a watch and cache of its own partitions' objects only (labels kept by
//! `kube_labeller`), and `kube_watch` gates a resumable watch.
//!
//! ```
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tenure::{locks::memory::MemoryStore, Elector};
//! use tenure_ha::{checkpoint::{memory::MemoryCheckpointStore, Checkpointer}, gate::Gate};
//!
//! let store = MemoryStore::new();
//! let elector = Elector::builder("replica-a", store.client("replica-a")).spawn()?;
//! let checkpoints = Arc::new(MemoryCheckpointStore::new("my-controller"));
//! let gate = Gate::builder(&elector).spawn(move |ctx| {
//!     let checkpoints = checkpoints.clone();
//!     async move {
//!         let checkpointer = Checkpointer::resume_for(checkpoints, &ctx).await?;
//!         // watch from checkpointer.resource_version("pods"), record() as events are handled,
//!         // until ctx.cancelled() completes
//!         ctx.cancelled().await;
//!         drop(checkpointer);                       // one last checkpoint write
//!         Ok::<_, tenure_ha::checkpoint::CheckpointError>(())
//!     }
//! });
//! gate.shutdown().await;
//! elector.shutdown().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

/// Builder methods that each set the field of their name: `name: Type` with its doc comment (and
/// attributes), or `name: Type => value` to store `value` made of the argument `name`, so that a
/// builder's plain options read as a list instead of a method each.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident: $type:ty $(=> $value:expr)?;)*) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $name: $type) -> Self {
            self.$name = setters!(@value $name $($value)?);
            self
        }
    )*};
    (@value $name:ident) => { $name };
    (@value $name:ident $value:expr) => { $value };
}

pub mod backoff;
pub mod checkpoint;
pub mod gate;
pub mod gc;
#[cfg(feature = "kube")]
pub mod kube_controller;
#[cfg(feature = "kube")]
pub mod kube_labeller;
#[cfg(feature = "kube")]
pub mod kube_shard;
#[cfg(feature = "kube")]
pub mod kube_shard_watch;
#[cfg(feature = "kube")]
pub mod kube_watch;
pub mod metrics;

pub use gate::{Gate, GateError, GateHandle, LeaderContext, Operation, StopReason};

/// What a [`kube_watch::GatedWatch`] user names, at the crate's root, so that a controller on a
/// gated watch depends on `tenure-ha` (and `tenure` for the elector) alone: the watch and its
/// handle, the changes the handler gets, the standby modes, the metrics, the watch's selectors
/// (`ResumeConfig`) and the checkpoint store in a ConfigMap.
#[cfg(feature = "kube")]
pub use kube_watch::{Change, GatedWatch, GatedWatchHandle, ResumeConfig, Standby, WatchError, WatchMetrics};

/// The checkpoint store a gated watch on Kubernetes uses, at the root with the watch.
#[cfg(feature = "kube")]
pub use checkpoint::kube::KubeCheckpointStore;

/// The Kubernetes lock the elector of a gated watch or controller runs on, so that a controller
/// needs no direct dependency on `tenure-kube` to elect on a Lease.
#[cfg(feature = "kube")]
pub use tenure_kube::KubeLockConfig;

/// The Kubernetes backend itself (locks, the resumable watcher and its `Backoff`), for what the
/// root re-exports do not cover, in the version this crate is built with.
#[cfg(feature = "kube")]
pub use tenure_kube;

/// The README's snippets, compiled and run as doc tests so that they stay true (the etcd and
/// Kubernetes ones need the `etcd` and `kube` features, which `scripts/test` enables).
#[cfg(all(doctest, feature = "etcd", feature = "kube"))]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;

/// Switches for the model test's mutation checks: each brings back one way issue 30 lost a change,
/// so that the model shows it catches it. Off unless a test on this thread turns one on.
#[cfg(all(test, feature = "kube"))]
pub(crate) mod mutation {
    use std::cell::Cell;

    /// The old behaviours.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Mutation {
        /// A warm leader's taken changes are forgotten when its task ends (aborted, panicked).
        ForgetTaken,
        /// A handler's `Ok` counts, and progress is recorded, after the tenure ended.
        DeposedOkHandled,
    }

    thread_local!(static ON: Cell<Option<Mutation>> = const { Cell::new(None) });

    /// Turns `mutation` on (or all off) for this thread.
    pub(crate) fn set(mutation: Option<Mutation>) {
        ON.with(|on| on.set(mutation));
    }

    /// Whether `mutation` is on for this thread.
    pub(crate) fn is(mutation: Mutation) -> bool {
        ON.with(|on| on.get() == Some(mutation))
    }
}
