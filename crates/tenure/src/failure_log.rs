//! How a driver reports calls to its store that keep failing: the first failure of a streak as a
//! warning, then one summary a minute, and the recovery, instead of one warning per retry.
//!
//! Why: a permanent error (an unreadable lock file, a read-only file system, an API server that
//! refuses connections) used to print a warning every second or two forever, burying everything
//! else in the log while the probes stayed green. The streak itself is published in
//! [`crate::ElectorStats`] (`consecutive_lock_errors`, `lock_unreachable_since`) through the
//! driver's [`StatsRecorder`] ([`crate::Publisher::recorder`]), for `/status`, metrics and probes.

use std::time::Duration;

use tokio::time::Instant;

use crate::leadership::StatsRecorder;

/// How often a failure streak is summarised in the log after its first warning.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(60);

/// The log side of a failure streak, owned by a driver next to its [`crate::Publisher`].
#[derive(Debug, Default)]
pub struct FailureLog {
    last_warning: Option<Instant>,
}

impl FailureLog {
    /// A log with no streak.
    pub fn new() -> Self {
        FailureLog::default()
    }

    /// Records a failed call (`what` failed with `error`) in the elector's counters and logs it:
    /// a warning for the first failure of a streak and at most once per [`SUMMARY_PERIOD`] after,
    /// debug otherwise.
    pub fn failed(&mut self, stats: &StatsRecorder, identity: &str, what: &str, error: &dyn std::fmt::Display) {
        let streak = stats.record_lock_error();
        let now = Instant::now();
        let due = self.last_warning.is_none_or(|t| now.duration_since(t) >= SUMMARY_PERIOD);
        if streak == 1 {
            self.last_warning = Some(now);
            tracing::warn!(identity, %error, "{what} failed");
        } else if due {
            self.last_warning = Some(now);
            let since = stats
                .stats_snapshot()
                .lock_unreachable_since
                .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            tracing::warn!(
                identity,
                %error,
                failed_calls = streak,
                since = since.as_deref().unwrap_or(""),
                "the lock is still unreachable: {what} keeps failing"
            );
        } else {
            tracing::debug!(identity, %error, failed_calls = streak, "{what} failed");
        }
    }

    /// Records a call that reached the store; logs the end of a failure streak, if one ended.
    pub fn reached(&mut self, stats: &StatsRecorder, identity: &str) {
        if let Some((failed_calls, since)) = stats.record_lock_reached() {
            self.last_warning = None;
            let unreachable_for_seconds = since.elapsed().unwrap_or_default().as_secs_f64();
            tracing::info!(identity, failed_calls, unreachable_for_seconds, "the lock is reachable again");
        }
    }
}
