//! When another member's record may be judged dead: unchanged for its whole lease on this
//! process's monotonic clock, counted from when this process first saw that version (invariant
//! S3: never by comparing a remote timestamp with the local clock).
//!
//! Why a type of its own: `tenure coordinate` (the Tooz driver's groups) decides member expiry
//! outside the group's handoff core, and that decision must be as testable as every other one: a
//! pure function of what was seen and the time passed in, with no clock of its own, driven by
//! the simulation below with any schedule.

use std::collections::HashMap;
use std::hash::Hash;

use tenure::MonotonicTime;

use crate::config::record_lease;
use crate::store::Version;

/// The version of each record last seen, and since when (see the module documentation).
#[derive(Debug)]
pub struct Silences<K> {
    seen: HashMap<K, (Version, MonotonicTime)>,
}

impl<K> Default for Silences<K> {
    fn default() -> Self {
        Silences { seen: HashMap::new() }
    }
}

impl<K: Eq + Hash> Silences<K> {
    /// Notes that the record `key` is at `version` at `now`; true when this process has seen
    /// that version unchanged for the record's lease (`lease_millis`, bounded as
    /// [`record_lease`] bounds a foreign record: zero or more than a day counts as a day). A
    /// version seen for the first time counts from `now`, so a record this process never saw
    /// change before is never judged at once.
    pub fn lapsed(&mut self, key: K, version: Version, lease_millis: u64, now: MonotonicTime) -> bool {
        let seen = self.seen.entry(key).or_insert((version, now));
        if seen.0 != version {
            *seen = (version, now);
        }
        now >= seen.1 + record_lease(lease_millis)
    }

    /// Forgets `key` (its record was deleted): a record created again later counts afresh.
    pub fn forget(&mut self, key: &K) {
        self.seen.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    fn at(millis: u64) -> MonotonicTime {
        MonotonicTime(Duration::from_millis(millis))
    }

    #[test]
    fn a_record_lapses_exactly_a_lease_after_its_version_was_first_seen() {
        let mut silences = Silences::default();
        assert!(!silences.lapsed("m", Version(1), 1000, at(5000)), "first seen: counts from now");
        assert!(!silences.lapsed("m", Version(1), 1000, at(5999)));
        assert!(silences.lapsed("m", Version(1), 1000, at(6000)));
        assert!(!silences.lapsed("m", Version(2), 1000, at(6500)), "a renew starts the lease again");
        assert!(silences.lapsed("m", Version(2), 1000, at(7500)));
        silences.forget(&"m");
        assert!(!silences.lapsed("m", Version(2), 1000, at(9000)), "forgotten: seen afresh");
    }

    #[test]
    fn a_zero_or_huge_lease_counts_as_a_day() {
        let mut silences = Silences::default();
        let day = 24 * 3600 * 1000;
        for lease in [0, u64::MAX] {
            assert!(!silences.lapsed(lease, Version(1), lease, at(0)));
            assert!(!silences.lapsed(lease, Version(1), lease, at(day - 1)), "lease {lease}");
            assert!(silences.lapsed(lease, Version(1), lease, at(day)), "lease {lease}");
        }
    }

    /// The simulation: members renew (a new version) at random moments and stop renewing at a
    /// random one; the observer looks at random moments, on a clock that runs at its own rate
    /// and starts late. Checked on every look: a member that renewed within a lease of the look
    /// (on the observer's clock) is never judged lapsed, and a member silent for a lease plus the
    /// observer's looking interval always is by the next look.
    #[test]
    fn randomized_schedules_never_judge_a_renewing_member_dead_and_always_catch_a_silent_one() {
        for seed in 0..10_000u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let lease = rng.random_range(100..5_000u64);
            let members = rng.random_range(1..5usize);
            // Per member: renew times (global ms), the last of which is when it stops.
            let renews: Vec<Vec<u64>> = (0..members)
                .map(|_| {
                    let count = rng.random_range(1..30);
                    let mut t = rng.random_range(0..lease);
                    (0..count).map(|_| { t += rng.random_range(1..lease); t }).collect()
                })
                .collect();
            let rate = rng.random_range(0.999..1.001);
            let offset = rng.random_range(0..1_000_000u64) as f64;
            let local = |global: u64| at((offset + global as f64 * rate) as u64);
            let mut silences = Silences::default();
            // Per member: the version last noticed and the look that first noticed it.
            let mut noticed: Vec<Option<(u64, u64)>> = vec![None; members];
            let mut now = 0u64;
            let end = renews.iter().map(|r| r[r.len() - 1]).max().unwrap_or(0) + 3 * lease;
            while now < end {
                now += rng.random_range(1..lease / 4 + 2);
                for (member, times) in renews.iter().enumerate() {
                    let done = times.iter().filter(|&&t| t <= now).count() as u64;
                    if done == 0 {
                        continue; // not joined yet
                    }
                    let last = times[done as usize - 1];
                    let lapsed = silences.lapsed(member, Version(done), lease, local(now));
                    let since = match noticed[member] {
                        Some((version, look)) if version == done => look,
                        _ => {
                            noticed[member] = Some((done, now));
                            now
                        }
                    };
                    // Safety: a member that renewed within a lease of now (global time, the
                    // observer's clock drifting +-0.1 %) is never judged dead.
                    let renewed_recently = ((now - last) as f64) * rate < lease as f64 * 0.998;
                    assert!(!(lapsed && renewed_recently), "seed {seed}: member {member} judged dead {} ms after its renew", now - last);
                    // Liveness: a version unchanged for a lease on the observer's clock since it
                    // first noticed it is judged dead.
                    let silent = ((now - since) as f64) * rate >= lease as f64 * 1.002;
                    assert!(!silent || lapsed, "seed {seed}: member {member} unchanged {} ms since noticed, lease {lease}, not judged", now - since);
                }
            }
        }
    }
}
