//! Exponential back-off with a cap: the one delay rule for every retry in the project.
//!
//! Why one type: electors, watches, leader work and checkpoint stores all retry, and the rule is
//! easy to get wrong (overflow, no cap, never resetting). Here it is a pure function of the number
//! of failures in a row, so a sans-IO core can use it with time passed in, and every caller counts
//! its own failures (and resets them on success).

use std::time::Duration;

/// The wait after consecutive failures: `initial` after the first, doubling with each further
/// failure, never above `max`.
///
/// ```
/// use std::time::Duration;
/// use tenure::Backoff;
/// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
/// let delays: Vec<_> = (1..=4).map(|failures| backoff.delay(failures).as_secs()).collect();
/// assert_eq!(delays, [1, 2, 4, 5]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    /// 500 ms, doubling to 30 s.
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// Starts at `initial` and is capped at `max` (a `max` below `initial` caps at `initial`).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max: max.max(initial) }
    }

    /// The wait after `failures` consecutive failures (zero counts as one).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max.max(self.initial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let delays: Vec<_> = (0..=4).map(|n| backoff.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 100, 200, 350, 350]);
    }

    #[test]
    fn huge_delays_and_counts_do_not_overflow() {
        let backoff = Backoff::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(backoff.delay(2), Duration::MAX - Duration::from_nanos(1));
        assert_eq!(backoff.delay(u32::MAX), Duration::MAX);
        let small = Backoff::new(Duration::from_millis(1), Duration::from_secs(1));
        assert_eq!(small.delay(u32::MAX), Duration::from_secs(1));
    }
}
