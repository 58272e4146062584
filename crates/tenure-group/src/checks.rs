//! Checks of the one-owner rule across the members of a group in one process, for integration
//! tests of every backend and for benchmarks.
//!
//! Why in the library: each backend's tests (etcd, ZooKeeper, Kubernetes, file) must check the
//! same property the same way, at every poll while they wait for the group to settle.

use std::time::{Duration, Instant};

use crate::Group;

/// A partition that two members may work on at once: the safety property is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition} has {owners} members that may work on it")]
pub struct TwoOwners {
    /// The partition.
    pub partition: u32,
    /// How many of the members hold a valid guard on it.
    pub owners: usize,
}

/// Fails with the first partition below `partitions` that more than one of `groups` may work on now.
pub fn check_single_owners(groups: &[&Group], partitions: u32) -> Result<(), TwoOwners> {
    for partition in 0..partitions {
        let owners = groups.iter().filter(|group| group.guard(partition).is_some()).count();
        if owners > 1 {
            return Err(TwoOwners { partition, owners });
        }
    }
    Ok(())
}

/// True if each of the first `partitions` partitions is owned by exactly one of `groups`.
pub fn all_owned_once(groups: &[&Group], partitions: u32) -> bool {
    (0..partitions).all(|partition| groups.iter().filter(|group| group.guard(partition).is_some()).count() == 1)
}

/// Polls every millisecond until `done` holds (`Ok(Some(elapsed))`) or `limit` passed
/// (`Ok(None)`), checking at every poll that no partition has two owners.
pub async fn wait_safely(
    groups: &[&Group],
    partitions: u32,
    limit: Duration,
    done: impl Fn() -> bool,
) -> Result<Option<Duration>, TwoOwners> {
    let start = Instant::now();
    loop {
        check_single_owners(groups, partitions)?;
        if done() {
            return Ok(Some(start.elapsed()));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
