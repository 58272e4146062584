//! Monotonic time as the sans-IO core sees it.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on one candidate's monotonic clock, as a distance from an origin of its choosing.
///
/// Why a type of its own: the decision core never reads a clock; its driver passes the time in.
/// The async driver maps `tokio::time::Instant` onto it (so tests can pause time), and the
/// randomized simulation gives each candidate its own clock running at its own rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonotonicTime(pub Duration);

impl MonotonicTime {
    /// The origin of the clock.
    pub const ZERO: MonotonicTime = MonotonicTime(Duration::ZERO);

    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: MonotonicTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for MonotonicTime {
    type Output = MonotonicTime;
    fn add(self, rhs: Duration) -> MonotonicTime {
        MonotonicTime(self.0.saturating_add(rhs))
    }
}

impl Sub<MonotonicTime> for MonotonicTime {
    type Output = Duration;
    fn sub(self, rhs: MonotonicTime) -> Duration {
        self.saturating_since(rhs)
    }
}
