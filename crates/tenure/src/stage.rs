//! Where an elector stands in its lifecycle ([`Stage`]) and what a stop is for ([`AfterRelease`]).
//!
//! Why a module of its own, at the bottom: the cores decide on the stage, the lifecycle
//! ([`crate::lifecycle`]) moves it and the drivers hand it over; kept here, none of them depends
//! on another for it.

/// What a candidate does once a stop has released the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRelease {
    /// Stop for good (shutdown).
    Stop,
    /// Stay a candidate, but leave the lock to others for one lease (resign).
    Campaign,
}

/// Where an elector stands: campaigning, or a stage of a stop. The lifecycle alone moves it, and
/// the driver hands it to the core with every call ([`crate::ElectionCore`]), so no core keeps a
/// copy that could disagree with the shell's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stage {
    /// No stop under way: campaign, take the lock when free, lead.
    #[default]
    Campaigning,
    /// The tenure ended; the lock stays held (and renewed) while the tenure's work stops. Never
    /// take the lock or lead in this stage.
    Draining(AfterRelease),
    /// Let go of what is held ([`crate::ElectionCore::release`] was called), then stop or
    /// campaign again.
    Releasing(AfterRelease),
    /// Shut down: released (or given up on); nothing more to do.
    Stopped,
}

impl Stage {
    /// True between a step-down and the end of its release: no new tenure may start.
    pub fn is_stepping_down(self) -> bool {
        matches!(self, Stage::Draining(_) | Stage::Releasing(_))
    }
}
