//! # Kubernetes locks for Tenure
//!
//! Leader election on a Kubernetes API server, on the same record and algorithm as client-go's
//! `tools/leaderelection`, so Tenure candidates and client-go candidates (kube-controller-manager,
//! leader-elector:0.5, operators) can share one lock:
//!
//! - `leases`: a `coordination.k8s.io/v1` Lease, the record in its spec (the default, and what
//!   new deployments should use);
//! - `endpoints`, `configmaps`: the JSON record in the annotation
//!   `control-plane.alpha.kubernetes.io/leader` of an Endpoints object or a ConfigMap, as
//!   leader-elector:0.5 and client-go before 1.17 wrote it;
//! - `endpointsleases`, `configmapsleases`: client-go's migration multi-locks, holding both an
//!   old object and a Lease of the same name, so a running deployment can move from the former to
//!   the latter with a rolling upgrade (see [`multilock`]).
//!
//! Every write is a compare-and-swap on `resourceVersion`; followers watch the one object and
//! make no other requests while they wait. [`events`] posts client-go's `LeaderElection` Events
//! on the lock object.
//!
//! For what a leader does with its tenure, [`resume`] is a watch that starts from a saved
//! `resourceVersion`, so a new leader learns every change its predecessor had not processed
//! (deletions included) instead of listing everything again, and [`write_gate`] wraps the
//! leader's own `kube::Client` so that it sends no write unless it leads (or, in a group, owns
//! the object's partition) at the moment the request leaves.
//!
//! [`KubeLockConfig`] builds the client from a kubeconfig or the pod's service account, as below;
//! a program that already has a `kube::Client` passes it to [`KubeLock::new`] instead.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use tenure::Elector;
//! use tenure_kube::KubeLockConfig;
//!
//! let identity = "pod-a";
//! let lock = KubeLockConfig::from_url("kube://default/leases/my-controller")?
//!     .kubeconfig("/etc/kubeconfig")       // else KUBECONFIG, ~/.kube/config, then in-cluster
//!     .connect(identity)
//!     .await?;
//! let elector = Elector::builder(identity, lock.clone()).spawn()?;
//! let events = lock.record_events(&elector);   // "pod-a became leader" on the Lease
//! let tenure = elector.acquired().await?;
//! // ... leader work, checking tenure.check()? before each side effect ...
//! drop(tenure);
//! elector.shutdown().await?;
//! events.finish().await;                       // posts "pod-a stopped leading"
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod codec;
pub mod config;
pub mod coordinated;
pub mod events;
pub mod group_store;
pub mod lock;
pub mod multilock;
pub mod object;
pub mod resume;
pub mod term_fenced;
pub mod write_gate;

pub use codec::RecordObject;
pub use config::{ClusterOptions, KubeError, KubeLockConfig, KubeLockRef, LockKind};
pub use events::{EventRecorder, LeadershipEvents};
pub use group_store::KubeGroupStore;
pub use lock::KubeLock;
pub use multilock::{MultiLock, UNKNOWN_LEADER};
pub use object::ObjectLock;
pub use resume::{ListCause, ResumableWatcher, ResumeConfig, ResumeError, ResumeEvent};
pub use write_gate::{RefusalReason, WriteGate, WriteGateMetrics, WriteRefused, WriteTarget};

/// The `User-Agent` every client built by this crate sends: `tenure/<version> (<identity>)`.
///
/// Why: the API server's audit log and request metrics (and the project's test API server, which
/// counts requests per client) can then tell the candidates apart. Characters a header may not
/// carry are replaced by `?`, so the value is always the one sent.
///
/// ```
/// assert_eq!(tenure_kube::user_agent("pod-a"), format!("tenure/{} (pod-a)", env!("CARGO_PKG_VERSION")));
/// ```
pub fn user_agent(identity: &str) -> String {
    let identity: String = identity.chars().map(|c| if (' '..='~').contains(&c) { c } else { '?' }).collect();
    format!("tenure/{} ({identity})", env!("CARGO_PKG_VERSION"))
}

/// The README's snippets, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeSnippets;
