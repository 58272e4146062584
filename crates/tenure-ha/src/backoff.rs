//! Exponential back-off with a cap, for restarting leader work that keeps failing.
//!
//! Why its own module: the gate restarts failed work and the delay rule is easy to get wrong
//! (overflow, no cap, never resetting); here it is a pure value with its own tests.

use std::time::Duration;

/// The delays between restarts: `initial`, doubling after each failure, never above `max`.
///
/// ```
/// use std::time::Duration;
/// use tenure_ha::backoff::Backoff;
/// let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
/// let delays: Vec<_> = (0..4).map(|_| backoff.next_delay().as_secs()).collect();
/// assert_eq!(delays, [1, 2, 4, 5]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial` and is capped at `max` (a `max` below `initial` caps at `initial`).
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let max = max.max(initial);
        Backoff { initial, max, next: initial }
    }

    /// The delay before the next restart; doubles the one after it, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to `initial`, after a run that went well.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
        assert_eq!(backoff.next_delay(), Duration::from_millis(200));
        assert_eq!(backoff.next_delay(), Duration::from_millis(350));
        assert_eq!(backoff.next_delay(), Duration::from_millis(350));
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn huge_delays_do_not_overflow() {
        let mut backoff = Backoff::new(Duration::MAX / 2, Duration::MAX);
        backoff.next_delay();
        assert_eq!(backoff.next_delay(), Duration::MAX - Duration::from_nanos(1));
        assert_eq!(backoff.next_delay(), Duration::MAX);
    }
}
