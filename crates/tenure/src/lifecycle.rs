//! How an elector stops: the stages of a resign, a shutdown or a handover, as a sans-IO state
//! machine that both the tokio shell ([`crate::shell`]) and the simulation
//! ([`crate::simulation`]) drive, so that the simulation checks the rules that ship, not a copy.
//!
//! A stop goes through two stages, each with a deadline on the elector's monotonic clock:
//!
//! 1. **draining**: the tenure ends at once ([`ElectionCore::step_down`]) while the lock stays
//!    held, so nobody else leads while the tenure's work stops; the stage ends when every guard
//!    of the tenure is dropped, or at the drain timeout;
//! 2. **releasing**: the core lets go of the lock ([`ElectionCore::release`]); the stage ends
//!    when the core says it is done, or at the renew deadline (then the store lets the hold run
//!    out, [`ElectorError::ReleaseTimedOut`]).
//!
//! A second stop is refused while one is under way. Call order for a driver: [`Lifecycle::begin`]
//! when a command (or the coordinator) asks to stop; after every input and at
//! [`Lifecycle::deadline`], [`Lifecycle::poll`] until `None`, starting the core's calls after
//! [`StopAction::Released`].

use std::time::Duration;

use crate::candidate::AfterRelease;
use crate::clock::MonotonicTime;
use crate::command::ElectorError;
use crate::election_core::ElectionCore;

/// "Never", far enough from the clock's limits that adding it cannot overflow: caps a drain
/// timeout taken from user settings.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The stop under way, if any (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Lifecycle {
    stop: Option<Stop>,
}

#[derive(Debug, Clone, Copy)]
struct Stop {
    after: AfterRelease,
    stage: Stage,
    /// When the current stage gives up.
    deadline: MonotonicTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Draining,
    Releasing,
}

/// What [`Lifecycle::poll`] did that its driver must act on.
#[derive(Debug, PartialEq)]
pub enum StopAction {
    /// The core was just asked to release: start the calls it wants.
    Released,
    /// The stop is over: answer the command with `result`, then stop for good or campaign again
    /// as `after` says.
    Finished {
        /// What the stop was for.
        after: AfterRelease,
        /// `Ok` when released (or nothing was held), else why not.
        result: Result<(), ElectorError>,
    },
}

impl Lifecycle {
    /// What the stop under way is for, if one is.
    pub fn stopping(&self) -> Option<AfterRelease> {
        self.stop.map(|stop| stop.after)
    }

    /// Starts a stop at `now`: the tenure ends at once, and the release waits for the guards
    /// at most `drain_timeout`. False (and nothing done) while another stop is under way.
    pub fn begin<C: ElectionCore>(
        &mut self,
        core: &mut C,
        now: MonotonicTime,
        after: AfterRelease,
        drain_timeout: Duration,
    ) -> bool {
        if self.stop.is_some() {
            return false;
        }
        core.step_down(now);
        self.stop = Some(Stop { after, stage: Stage::Draining, deadline: now + drain_timeout.min(FAR_FUTURE) });
        true
    }

    /// Moves the stop along at `now`; `guards_held` is true while a guard of an ended tenure may
    /// still be dropped. `None` when there is nothing to do until the guards are dropped, the
    /// core answers, or [`Lifecycle::deadline`] passes.
    pub fn poll<C: ElectionCore>(&mut self, core: &mut C, now: MonotonicTime, guards_held: bool) -> Option<StopAction> {
        let stop = self.stop.as_mut()?;
        if stop.stage == Stage::Draining {
            if guards_held && now < stop.deadline {
                return None;
            }
            stop.stage = Stage::Releasing;
            stop.deadline = now + core.renew_deadline();
            core.release(now, stop.after);
            return Some(StopAction::Released);
        }
        let result = match core.release_result(stop.after) {
            Some(result) => result,
            None if now >= stop.deadline => Err(ElectorError::ReleaseTimedOut),
            None => return None,
        };
        let after = stop.after;
        self.stop = None;
        Some(StopAction::Finished { after, result })
    }

    /// When the current stage gives up, if a stop is under way: the driver polls again then.
    pub fn deadline(&self) -> Option<MonotonicTime> {
        self.stop.map(|stop| stop.deadline)
    }
}
