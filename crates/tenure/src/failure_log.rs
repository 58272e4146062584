//! How a driver reports calls to its store that keep failing: the first failure of a streak as a
//! warning, then one summary a minute, and the recovery, instead of one warning per retry.
//!
//! Why: a permanent error (an unreadable lock file, a read-only file system, an API server that
//! refuses connections) used to print a warning every second or two forever, burying everything
//! else in the log while the probes stayed green. The streak itself is published in
//! [`crate::ElectorStats`] (`consecutive_lock_errors`, `lock_unreachable_since`) through the
//! driver's [`StatsRecorder`] ([`crate::Publisher::recorder`]), for `/status`, metrics and probes.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::leadership::StatsRecorder;

/// How often a failure streak is summarised in the log after its first warning.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(60);

/// The log side of a failure streak, owned by a driver next to its [`crate::Publisher`] (or on
/// its own, for a driver without elector statistics such as a group member's).
#[derive(Debug)]
pub struct FailureLog {
    /// What the log calls the store in its summaries ("lock", "group store").
    store: &'static str,
    last_warning: Option<Instant>,
    /// Failed calls in a row, and since when.
    streak: u64,
    since: Option<SystemTime>,
}

impl Default for FailureLog {
    fn default() -> Self {
        FailureLog::new()
    }
}

impl FailureLog {
    /// A log with no streak, of an elector's calls to its lock.
    pub fn new() -> Self {
        FailureLog::of("lock")
    }

    /// A log with no streak, of calls to what its messages call `store`.
    pub fn of(store: &'static str) -> Self {
        FailureLog { store, last_warning: None, streak: 0, since: None }
    }

    /// Records a failed call (`what` failed with `error`) in the elector's counters and logs it
    /// as [`FailureLog::log_failed`] does.
    pub fn failed(&mut self, stats: &StatsRecorder, identity: &str, what: &str, error: &dyn std::fmt::Display) {
        stats.record_lock_error();
        self.log_failed(identity, what, error);
    }

    /// Logs a failed call: a warning for the first failure of a streak and at most once per
    /// [`SUMMARY_PERIOD`] after, debug otherwise.
    pub fn log_failed(&mut self, identity: &str, what: &str, error: &dyn std::fmt::Display) {
        self.streak += 1;
        self.since.get_or_insert_with(SystemTime::now);
        let now = Instant::now();
        let due = self.last_warning.is_none_or(|t| now.duration_since(t) >= SUMMARY_PERIOD);
        if self.streak == 1 {
            self.last_warning = Some(now);
            tracing::warn!(identity, %error, "{what} failed");
        } else if due {
            self.last_warning = Some(now);
            let since = self
                .since
                .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            tracing::warn!(
                identity,
                %error,
                failed_calls = self.streak,
                since = since.as_deref().unwrap_or(""),
                "the {} is still unreachable: {what} keeps failing",
                self.store
            );
        } else {
            tracing::debug!(identity, %error, failed_calls = self.streak, "{what} failed");
        }
    }

    /// Records a call that reached the store in the elector's counters; logs the end of a
    /// failure streak, if one ended.
    pub fn reached(&mut self, stats: &StatsRecorder, identity: &str) {
        stats.record_lock_reached();
        self.log_reached(identity);
    }

    /// Logs the end of a failure streak, if one ended.
    pub fn log_reached(&mut self, identity: &str) {
        let Some(since) = self.since.take() else { return };
        let failed_calls = std::mem::take(&mut self.streak);
        self.last_warning = None;
        let unreachable_for_seconds = since.elapsed().unwrap_or_default().as_secs_f64();
        tracing::info!(identity, failed_calls, unreachable_for_seconds, "the {} is reachable again", self.store);
    }
}
