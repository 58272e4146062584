//! # Tenure: leader election for replicated services
//!
//! Run several replicas of a service and let exactly one of them lead, with a clean handover when
//! it dies or steps down. This crate is the core: the client-go algorithm as a sans-IO decision
//! core ([`Candidate`]) under a thin async driver ([`Elector`]), the shared leadership types every
//! backend publishes ([`Leadership`], [`Tenure`], [`Term`]), and the record locks that need no
//! server: [`locks::file`] (the embedded default) and [`locks::memory`] (tests and simulation).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use tenure::{locks::file::FileLock, Elector};
//! let lock = FileLock::open("/run/user/1000/tenure/my-service")?;
//! let elector = Elector::builder("replica-a", lock).spawn()?;
//! let tenure = elector.acquired().await?;          // waits until this replica leads
//! // ... leader work, calling tenure.check()? before each side effect ...
//! drop(tenure);
//! elector.shutdown().await?;                        // releases the lock: instant handover
//! # Ok(()) }
//! ```
//!
//! ## Backends
//!
//! The locks that need a server live in crates of their own, so that a program builds only the
//! client it uses. Every one hands out the same [`Elector`], [`Tenure`] and [`Term`]:
//!
//! - **`tenure-kube`**: Kubernetes Lease, Endpoints and ConfigMap locks and client-go's migration
//!   multi-locks, on kube-rs, with client-go's record so Go and Rust candidates share a lock.
//!   `KubeLock::new(client, &reference, identity)` takes the `kube::Client` a controller already
//!   has; `KubeLockConfig::from_url("kube://NAMESPACE/leases/NAME")?.connect(identity)` builds one.
//!   The lock goes to [`Elector::builder`] like a [`locks::file::FileLock`].
//! - **`tenure-etcd`**: a native elector on etcd leases, one election with `etcdctl elect`:
//!   `EtcdElection::connect(endpoints, name)`, then `.campaign(identity, ttl)` returns the
//!   [`Elector`]; `guarded_txn` makes an etcd write conditional on the term.
//! - **`tenure-zk`**: a native elector on ZooKeeper ephemeral sequential nodes, one election with
//!   Curator's `LeaderLatch`: `ZkElection::connect(servers, path, session_timeout)`, then
//!   `.campaign(identity)`.
//!
//! Whole programs for each: `crates/*/examples/` in the repository, shown in its README.
//!
//! ## Default timing
//!
//! [`Timing::default`] is client-go's (15 s lease, 10 s renew deadline, 2 s retry), so a Rust
//! controller behaves like a Go one on a shared lock. The `tenure` command defaults to `--ttl 10s`
//! mapped as leader-elector:0.5 did, [`Timing::from_ttl`] (10 s, 5 s, 2.5 s), so that it stays a
//! drop-in for that image.
#![warn(missing_docs)]

pub mod backoff;
pub mod candidate;
pub mod clock;
pub mod command;
pub mod election_core;
pub mod elector;
pub mod failure_log;
pub mod leadership;
pub mod lifecycle;
pub mod lock;
pub mod locks;
pub mod record;
pub mod record_core;
pub mod redact;
pub mod shell;
#[cfg(feature = "simulation")]
pub mod simulation;
pub mod stage;
pub mod term;
pub mod timing;

pub use backoff::Backoff;
pub use candidate::{Action, Candidate, Event, StopReason};
pub use clock::MonotonicTime;
pub use elector::{Elector, ElectorBuilder, ElectorCommand, ElectorError, ElectorView};
pub use failure_log::FailureLog;
pub use leadership::{
    ElectorStats, Leadership, LockWait, NotLeader, Publisher, Role, StatsRecorder, Subscriber, Tenure, WaitReason,
};
pub use lock::{ChangeStream, LockError, RecordLock, StoredRecord, Version};
pub use record::{LeaderElectionRecord, RecordError, LEADER_ANNOTATION};
pub use redact::redact_credentials;
pub use shell::{ElectionCore, Report, Transport};
pub use stage::{AfterRelease, Stage};
pub use term::Term;
pub use timing::{Timing, TimingError};
