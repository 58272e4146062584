//! A Kuryr-like IP allocator for Pods on the Tenure HA runtime, and its checker.
//!
//! Why it exists: it is the end-to-end proof of `tenure-ha` (issue 10). Three replicas campaign on
//! etcd; the leader watches Pods from the fenced checkpoint, allocates an address per Pod in a
//! fenced etcd pool, annotates the Pod, releases the address when the Pod is deleted, and collects
//! orphans. The [`checker`] runs it under Pod churn, leader kills, pauses and graceful stops and
//! verifies that no address is ever given to two Pods, no deletion is missed, and every orphan
//! is collected while nothing in use is.
//!
//! In Active/Active mode ([`active_active`], issue 11) every replica joins a group on the same etcd
//! and handles the Pods of the partitions it owns, fencing each pool write with the partition's
//! term; each handler is recorded in a [`witness`] file, from which the checker proves that no Pod
//! was handled by two replicas at overlapping times; [`bench`] measures the throughput of 1 and 3
//! replicas.
#![warn(missing_docs)]

pub mod active_active;
pub mod bench;
pub mod checker;
pub mod controller;
pub mod pool;
pub mod witness;
