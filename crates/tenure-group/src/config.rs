//! How one member takes part in a group: its timing, the partition count it expects, its weight.

use std::time::Duration;

use tenure::{Timing, TimingError};

use crate::assignment::DEFAULT_PARTITION_COUNT;

/// The most partitions a group may have: the table is written whole on every handoff, so its size
/// is bounded (65 536 slots are about 2.5 MiB of JSON, beyond what Kubernetes objects hold).
pub const MAX_PARTITION_COUNT: u32 = 16_384;

/// The most weight one member may have relative to a weight of 1.
pub const MAX_WEIGHT: u32 = 1_000;

/// One member's configuration.
///
/// Why the election's [`Timing`]: membership is a lease like leadership, with the same rule S1
/// (a member stops believing in its partitions `renew_deadline` after the start of its last
/// successful renew, before anyone may end its epoch `lease_duration` after seeing that renew), so
/// it has the same three numbers, the same validation and the same drift bound
/// ([`Timing::max_clock_drift`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupConfig {
    /// Lease, renew deadline, retry period, call timeout.
    pub timing: Timing,
    /// The partition count this member expects; the group's table decides (see
    /// [`crate::record::PartitionTable::partition_count`]).
    pub partition_count: u32,
    /// This member's relative share of partitions.
    pub weight: u32,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { timing: Timing::default(), partition_count: DEFAULT_PARTITION_COUNT, weight: 1 }
    }
}

/// Why a [`GroupConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The timing breaks the election's rules.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// The partition count is zero or too large.
    #[error("partition count {0} is out of range (1 to {MAX_PARTITION_COUNT})")]
    PartitionCount(u32),
    /// The weight is zero or too large.
    #[error("weight {0} is out of range (1 to {MAX_WEIGHT})")]
    Weight(u32),
}

impl GroupConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.timing.validate()?;
        if self.partition_count == 0 || self.partition_count > MAX_PARTITION_COUNT {
            return Err(ConfigError::PartitionCount(self.partition_count));
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(ConfigError::Weight(self.weight));
        }
        Ok(())
    }

    /// The lease in whole milliseconds, as written into the member record (rounded up).
    pub fn lease_millis(&self) -> u64 {
        u64::try_from(self.timing.lease_duration.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// The lease another member's record asks observers to wait, bounded like the elector bounds a
/// foreign record (a record claiming more is honoured for 24 hours, zero counts as a day too).
pub fn record_lease(lease_millis: u64) -> Duration {
    if lease_millis == 0 {
        return tenure::timing::MAX_LEASE;
    }
    Duration::from_millis(lease_millis).min(tenure::timing::MAX_LEASE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_partitions_zero_weight_and_bad_timing() {
        let good = GroupConfig::default();
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(GroupConfig { partition_count: 0, ..good }.validate(), Err(ConfigError::PartitionCount(0)));
        assert_eq!(GroupConfig { weight: 0, ..good }.validate(), Err(ConfigError::Weight(0)));
        let mut timing = good.timing;
        timing.renew_deadline = timing.lease_duration;
        assert!(matches!(GroupConfig { timing, ..good }.validate(), Err(ConfigError::Timing(_))));
    }

    #[test]
    fn a_record_without_a_lease_is_waited_out_for_a_day() {
        assert_eq!(record_lease(0), tenure::timing::MAX_LEASE);
        assert_eq!(record_lease(1500), Duration::from_millis(1500));
    }
}
