//! The stores of this crate: [`memory`] for tests, simulations and benchmarks, [`file`](mod@file) for the
//! members of a group on one host. Backends with servers (etcd, ZooKeeper, Kubernetes) implement
//! [`crate::store::GroupStore`] in their own crates.

pub mod file;
pub mod memory;
