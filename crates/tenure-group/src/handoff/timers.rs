//! The core's timers in one table (as in quinn-proto): what it does later without any input.

use std::collections::BTreeMap;

use tenure::MonotonicTime;

use crate::store::Key;

/// What a timer is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// The next renew of our record (set only while a member).
    Renew,
    /// The next read of the snapshot: every retry period without a watch, every lease with one.
    Poll,
    /// No read before this: the last one failed.
    ReadRetry,
    /// No write of this record before this: the last one failed other than by a conflict.
    WriteRetry(Key),
    /// From then a table a periodic read found ahead of the view counts as missed by the watch.
    /// Only a report: checked at the next poll, it never wakes the core.
    MissedChange,
}

/// Every timer of one core; a timer not in the table is not running.
#[derive(Debug, Default)]
pub(super) struct TimerTable(BTreeMap<Timer, MonotonicTime>);

impl TimerTable {
    pub(super) fn set(&mut self, timer: Timer, at: MonotonicTime) {
        self.0.insert(timer, at);
    }

    pub(super) fn stop(&mut self, timer: &Timer) {
        self.0.remove(timer);
    }

    /// True unless `timer` runs until after `now` (a timer that is not set has elapsed).
    pub(super) fn elapsed(&self, timer: &Timer, now: MonotonicTime) -> bool {
        self.0.get(timer).is_none_or(|at| now >= *at)
    }

    /// The earliest of the timers and `deadlines` after `now`.
    pub(super) fn next_after(
        &self,
        now: MonotonicTime,
        deadlines: impl Iterator<Item = MonotonicTime>,
    ) -> Option<MonotonicTime> {
        let timers = self.0.iter().filter(|(timer, _)| **timer != Timer::MissedChange).map(|(_, at)| *at);
        timers.chain(deadlines).filter(|at| *at > now).min()
    }
}
