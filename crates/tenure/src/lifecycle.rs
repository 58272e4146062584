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
//! [`StopAction::Released`] and again after [`StopAction::Finished`] (the stage changed).
//!
//! The stage is kept here only: the driver hands [`Lifecycle::stage`] to the core with every
//! call. The cores keep facts about what they hold (a tenure stepped down from and still held,
//! the node or key a release deletes, how a release ended), never a stage of their own, so a
//! core cannot believe it campaigns while the shell drains, nor go on releasing after the shell
//! has given up waiting (a release that outlives its deadline still ends, and is never led on).

use std::time::Duration;

use crate::clock::MonotonicTime;
use crate::command::ElectorError;
use crate::election_core::ElectionCore;
use crate::stage::{AfterRelease, Stage};

/// "Never", far enough from the clock's limits that adding it cannot overflow: caps a drain
/// timeout taken from user settings.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The stop under way, if any (see the module documentation).
#[derive(Debug, Clone, Copy, Default)]
pub struct Lifecycle {
    stage: Stage,
    /// When the current stage of a stop gives up.
    deadline: MonotonicTime,
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
    /// The stage to hand the core with each call.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// What the stop under way is for, if one is.
    pub fn stopping(&self) -> Option<AfterRelease> {
        match self.stage {
            Stage::Draining(after) | Stage::Releasing(after) => Some(after),
            Stage::Campaigning | Stage::Stopped => None,
        }
    }

    /// Starts a stop at `now`: the tenure ends at once, and the release waits for the guards
    /// at most `drain_timeout`. False (and nothing done) unless campaigning: a second stop is
    /// refused while one is under way, and nothing starts after a shutdown.
    pub fn begin<C: ElectionCore>(
        &mut self,
        core: &mut C,
        now: MonotonicTime,
        after: AfterRelease,
        drain_timeout: Duration,
    ) -> bool {
        if self.stage != Stage::Campaigning {
            return false;
        }
        core.step_down(now);
        self.stage = Stage::Draining(after);
        self.deadline = now + drain_timeout.min(FAR_FUTURE);
        true
    }

    /// Moves the stop along at `now`; `guards_held` is true while a guard of an ended tenure may
    /// still be dropped. `None` when there is nothing to do until the guards are dropped, the
    /// core answers, or [`Lifecycle::deadline`] passes.
    pub fn poll<C: ElectionCore>(&mut self, core: &mut C, now: MonotonicTime, guards_held: bool) -> Option<StopAction> {
        match self.stage {
            Stage::Draining(after) => {
                if guards_held && now < self.deadline {
                    return None;
                }
                self.stage = Stage::Releasing(after);
                self.deadline = now + core.renew_deadline();
                core.release(now, after);
                Some(StopAction::Released)
            }
            Stage::Releasing(after) => {
                let result = match core.release_result() {
                    Some(result) => result,
                    None if now >= self.deadline => Err(ElectorError::ReleaseTimedOut),
                    None => return None,
                };
                self.stage = match after {
                    AfterRelease::Stop => Stage::Stopped,
                    AfterRelease::Campaign => Stage::Campaigning,
                };
                Some(StopAction::Finished { after, result })
            }
            Stage::Campaigning | Stage::Stopped => None,
        }
    }

    /// When the current stage gives up, if a stop is under way: the driver polls again then.
    pub fn deadline(&self) -> Option<MonotonicTime> {
        self.stage.is_stepping_down().then_some(self.deadline)
    }
}
