//! What Tenure's tests, benchmarks, fault-injection suite and examples start and share, written
//! once: real etcd and ZooKeeper servers on free loopback ports, a throw-away PKI for the TLS
//! tests, a proxy that stalls a store, candidates in child processes, a capture of the log, and
//! (feature `kube`) the in-memory Kubernetes cluster of the lock tests.
//!
//! Why a crate: these were copied between crates (etcd was started by four copies, ZooKeeper by
//! two) or included from another crate's tests by `#[path]`, so a fix to one copy (a port taken
//! between finding it free and the server binding it) missed the others. Not published: only the
//! workspace's tests, benchmarks and tools depend on it.
#![deny(missing_docs)]

pub mod certs;
pub mod clock;
pub mod etcd;
#[cfg(feature = "kube")]
pub mod kube;
pub mod leadership;
pub mod log_capture;
pub mod process;
pub mod stall_proxy;
pub mod zk_candidates;
pub mod zookeeper;
