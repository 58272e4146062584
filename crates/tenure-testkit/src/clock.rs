//! The host's monotonic clock (CLOCK_MONOTONIC) in nanoseconds: one clock for every process on
//! the host, so that a test can compare the instants its candidate processes report.

/// The current CLOCK_MONOTONIC reading in nanoseconds.
pub fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// A tokio instant as a CLOCK_MONOTONIC reading (std's Instant is CLOCK_MONOTONIC on Linux).
pub fn instant_to_monotonic_ns(instant: tokio::time::Instant) -> u128 {
    let now_ns = monotonic_ns();
    let now = tokio::time::Instant::now();
    if instant >= now {
        now_ns + (instant - now).as_nanos()
    } else {
        now_ns.saturating_sub((now - instant).as_nanos())
    }
}
