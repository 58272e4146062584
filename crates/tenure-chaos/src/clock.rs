//! The harness's clock: `CLOCK_MONOTONIC` in seconds, the same clock the witness commands read,
//! so that both kinds of evidence are on one time axis.

use std::time::Duration;

/// Seconds on `CLOCK_MONOTONIC`.
pub fn now() -> f64 {
    let mut time = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `time` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut time) };
    time.tv_sec as f64 + time.tv_nsec as f64 / 1e9
}

/// A point in time after which a bounded wait gives up.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(f64);

impl Deadline {
    /// The deadline `limit` from now.
    pub fn after(limit: Duration) -> Deadline {
        Deadline(now() + limit.as_secs_f64())
    }

    /// Whether it has passed.
    pub fn passed(&self) -> bool {
        now() >= self.0
    }
}
