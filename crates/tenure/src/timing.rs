//! Timing of an election: how long a lease lasts, when a leader gives up renewing, how often
//! candidates retry. The defaults and the validation rules are client-go's, so a Tenure
//! candidate and a client-go candidate configured alike behave alike on the same lock.

use std::time::Duration;

/// client-go's `JitterFactor`: a polling candidate waits between `retry` and `(1 + 1.2) * retry`.
pub const DEFAULT_JITTER_FACTOR: f64 = 1.2;

/// The longest wait between two calls of a candidate to a store that keeps failing (see
/// [`Timing::max_failure_backoff`]): a store that answers again is asked within this, so that a
/// replica leads within a second of the end of an outage.
pub const OUTAGE_PROBE: Duration = Duration::from_millis(900);

/// The longest lease a configuration may have; a foreign record claiming more is honoured only
/// this long, so a hostile or broken record cannot freeze an election indefinitely.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// The timing rules of one election.
///
/// Why these three numbers: a follower may take the lock `lease_duration` after it saw the
/// record change; the leader stops believing it leads `renew_deadline` after the *start* of
/// its last successful renew (self-fencing, invariant S1). Because `renew_deadline <
/// lease_duration`, the old leader has stopped before anybody may take over, as long as the two
/// clocks run at rates within [`Timing::max_clock_drift`] of each other.
///
/// ```
/// use std::time::Duration;
/// use tenure::Timing;
/// let timing = Timing::from_ttl(Duration::from_secs(5)).unwrap();
/// assert_eq!(timing.renew_deadline, Duration::from_millis(2500));
/// assert!(Timing::new(Duration::from_secs(5), Duration::from_secs(6), Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// How long followers wait, from the moment they see the record change, before they may
    /// take the lock from a holder that stopped renewing.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renew, counted from the start of
    /// its last successful renew.
    pub renew_deadline: Duration,
    /// How often the leader renews, and how often a candidate retries after a failure or polls a
    /// lock that cannot notify it of changes.
    pub retry_period: Duration,
    /// Spread of the polling interval of candidates (client-go's `JitterFactor`).
    pub jitter_factor: f64,
    /// Time limit of one call to the store. A hanging call must never hold up a step-down, so it
    /// is shorter than the renew deadline.
    pub call_timeout: Duration,
}

/// Why a [`Timing`] was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimingError {
    /// A duration is zero.
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    /// The leader would keep leading after followers may take over.
    #[error("lease duration ({lease:?}) must be greater than the renew deadline ({renew:?})")]
    LeaseNotAboveRenewDeadline {
        /// The lease duration given.
        lease: Duration,
        /// The renew deadline given.
        renew: Duration,
    },
    /// The leader would not get a second renew attempt before its deadline.
    #[error("renew deadline ({renew:?}) must be greater than {jitter} x retry period ({retry:?})")]
    RenewDeadlineTooShort {
        /// The renew deadline given.
        renew: Duration,
        /// The retry period given.
        retry: Duration,
        /// The jitter factor given.
        jitter: f64,
    },
    /// Jitter must be a finite, non-negative factor.
    #[error("jitter factor must be finite and >= 0, got {0}")]
    BadJitter(f64),
    /// A single call could outlast the renew deadline.
    #[error("call timeout ({call:?}) must be shorter than the renew deadline ({renew:?})")]
    CallTimeoutTooLong {
        /// The call timeout given.
        call: Duration,
        /// The renew deadline given.
        renew: Duration,
    },
    /// The lease is written in whole seconds; anything above a day is a typo.
    #[error("lease duration {0:?} is out of range (1 s to 24 h)")]
    LeaseOutOfRange(Duration),
}

impl Default for Timing {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry, jitter 1.2.
    ///
    /// Why not the `tenure` command's default (`--ttl 10s`, [`Timing::from_ttl`]): a library user
    /// shares locks with Go controllers and expects their timing; the command keeps
    /// leader-elector:0.5's default so that it stays a drop-in for that image.
    fn default() -> Self {
        Timing::new(Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
            .expect("client-go's defaults are valid")
    }
}

impl Timing {
    /// Timing from the three client-go durations, with the default jitter and a call timeout of
    /// half the renew deadline.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingError> {
        let (jitter_factor, call_timeout) = (DEFAULT_JITTER_FACTOR, renew_deadline / 2);
        let timing = Timing { lease_duration, renew_deadline, retry_period, jitter_factor, call_timeout };
        timing.validate()?;
        Ok(timing)
    }

    /// leader-elector:0.5's `--ttl` mapping: lease = ttl, renew deadline = ttl/2, retry = ttl/4.
    pub fn from_ttl(ttl: Duration) -> Result<Self, TimingError> {
        Timing::new(ttl, ttl / 2, ttl / 4)
    }

    /// Checks client-go's rules (lease > renew deadline > jitter x retry, all positive) and
    /// ours (call timeout < renew deadline, lease between 1 s and 24 h).
    pub fn validate(&self) -> Result<(), TimingError> {
        for (name, value) in [
            ("lease duration", self.lease_duration),
            ("renew deadline", self.renew_deadline),
            ("retry period", self.retry_period),
            ("call timeout", self.call_timeout),
        ] {
            if value.is_zero() {
                return Err(TimingError::NotPositive(name));
            }
        }
        if !self.jitter_factor.is_finite() || self.jitter_factor < 0.0 {
            return Err(TimingError::BadJitter(self.jitter_factor));
        }
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration > Duration::from_secs(24 * 3600) {
            return Err(TimingError::LeaseOutOfRange(self.lease_duration));
        }
        let (lease, renew) = (self.lease_duration, self.renew_deadline);
        let (retry, jitter) = (self.retry_period, self.jitter_factor);
        if lease <= renew {
            return Err(TimingError::LeaseNotAboveRenewDeadline { lease, renew });
        }
        if renew.as_secs_f64() <= jitter * retry.as_secs_f64() {
            return Err(TimingError::RenewDeadlineTooShort { renew, retry, jitter });
        }
        if self.call_timeout >= renew {
            return Err(TimingError::CallTimeoutTooLong { call: self.call_timeout, renew });
        }
        Ok(())
    }

    /// The longest a candidate that does not lead waits before calling a store again after
    /// calls kept failing: back-off doubles from one jittered retry period up to this cap, the
    /// longer of the longest jittered poll and half a lease, but never more than
    /// [`OUTAGE_PROBE`]. Why that bound: after an outage the first candidate that asks the store
    /// again gets the election going, so the probe interval is the recovery time (issue 35 asks
    /// for the first reconcile within 1 s of the store answering). Every caller counts its wait
    /// from the *start* of the failed call, so a call that timed out is followed at once and a
    /// frozen store always has one call of each candidate waiting for it, answered as it thaws;
    /// a store that refuses at once is asked about once a second. A leader never backs off: it
    /// retries every retry period until its renew deadline.
    pub fn max_failure_backoff(&self) -> Duration {
        let poll = self.retry_period.mul_f64(1.0 + self.jitter_factor.max(0.0));
        poll.max(self.lease_duration / 2).min(OUTAGE_PROBE)
    }

    /// The lease as written into the record: whole seconds, rounded up so that followers never
    /// wait less than this candidate's configured lease.
    pub fn lease_seconds(&self) -> u32 {
        let secs = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// The largest relative clock-rate difference between two candidates for which self-fencing
    /// still guarantees a single leader.
    ///
    /// The old leader stops at `renew_deadline` on its clock; a follower may take over at
    /// `lease_duration` on its own clock, counted from a later moment. With rates `1 + d` and
    /// `1 - d` the old leader stops first while `renew_deadline / (1 - d) < lease_duration /
    /// (1 + d)`, that is `d < (lease - renew) / (lease + renew)`: 20 % for client-go's
    /// defaults, 33 % for the `--ttl` mapping.
    pub fn max_clock_drift(&self) -> f64 {
        let lease = self.lease_duration.as_secs_f64();
        let renew = self.renew_deadline.as_secs_f64();
        (lease - renew) / (lease + renew)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_client_go_defaults() {
        let t = Timing::default();
        assert_eq!(t.lease_duration, Duration::from_secs(15));
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(2));
        assert_eq!(t.jitter_factor, 1.2);
        assert_eq!(t.lease_seconds(), 15);
    }

    #[test]
    fn rejects_lease_not_above_renew_deadline() {
        let err = Timing::new(Duration::from_secs(10), Duration::from_secs(10), Duration::from_secs(2));
        assert!(matches!(err, Err(TimingError::LeaseNotAboveRenewDeadline { .. })));
    }

    #[test]
    fn rejects_renew_deadline_within_jittered_retry() {
        let err = Timing::new(Duration::from_secs(15), Duration::from_secs(2), Duration::from_secs(2));
        assert!(matches!(err, Err(TimingError::RenewDeadlineTooShort { .. })));
    }

    #[test]
    fn rejects_zero_and_tiny_durations() {
        assert!(matches!(
            Timing::new(Duration::ZERO, Duration::from_secs(1), Duration::from_secs(1)),
            Err(TimingError::NotPositive("lease duration"))
        ));
        assert!(matches!(Timing::from_ttl(Duration::from_millis(500)), Err(TimingError::LeaseOutOfRange(_))));
    }

    #[test]
    fn ttl_mapping_matches_leader_elector() {
        let t = Timing::from_ttl(Duration::from_secs(10)).unwrap();
        assert_eq!(
            (t.lease_duration, t.renew_deadline, t.retry_period),
            (Duration::from_secs(10), Duration::from_secs(5), Duration::from_millis(2500))
        );
    }

    #[test]
    fn fractional_lease_rounds_up_in_record() {
        let t = Timing::new(Duration::from_millis(1500), Duration::from_secs(1), Duration::from_millis(300)).unwrap();
        assert_eq!(t.lease_seconds(), 2);
    }

    #[test]
    fn drift_bound_for_defaults_is_twenty_percent() {
        assert!((Timing::default().max_clock_drift() - 0.2).abs() < 1e-9);
    }
}
