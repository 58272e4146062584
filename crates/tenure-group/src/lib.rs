//! # Tenure groups: Active/Active with a safe handoff
//!
//! Replicas of a service join a named group; the key space is cut into a fixed number of
//! partitions, assigned to the live members in balanced shares ([`assignment`]), and a partition
//! moves only after its old owner stopped work on it and said so, or after the old owner's
//! membership lease ran out on the new owner's clock ([`handoff`]). Every ownership has a term that
//! strictly increases per partition: the fencing token of the work done under it.
#![warn(missing_docs)]

pub mod assignment;
pub mod checks;
pub mod codec;
pub mod config;
pub mod conformance;
pub mod handoff;
pub mod record;
pub mod silence;
pub mod store;

pub use config::{ConfigError, GroupConfig};
pub mod driver;
pub mod stores;

pub use driver::{Assignment, Group, GroupBuilder, GroupError, GroupHealth, NotOwner, Ownership, PartitionGuard};
