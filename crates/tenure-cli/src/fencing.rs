//! When `tenure run` must have stopped its command, and the stop that keeps that promise.
//!
//! Why: a leader stops believing it leads at its self-fencing deadline `V` (the start of its
//! last successful renew `R` + the renew deadline), and no other candidate may take the lock
//! before `R + lease_duration`, because each counts the lease from when it saw that renew, which
//! is after `R`. So the command must be dead by `V + (lease_duration - renew_deadline)`, whatever
//! the backend and however late the elector notices the loss. `run` therefore
//!
//! - sends SIGTERM when the tenure ends or, at the latest, at `V` on its own clock (a store call
//!   that hangs, or a driver that notices late, does not delay it), and
//! - sends SIGKILL at the earlier of SIGTERM + grace and `V + KILL_BOUND`, where `KILL_BOUND` is
//!   3/4 of `lease_duration - renew_deadline`. The last quarter is the safety margin for the kill
//!   itself (the supervisor's reaction, the kernel ending the processes) and for clocks that run
//!   at different rates on different hosts.

use std::future::Future;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use tenure::{Tenure, Timing};
use tokio::time::{sleep, sleep_until};

use crate::error::CliError;

/// What the stop needs from a running command (a trait so that the timing is tested on virtual
/// time with a fake command).
pub trait CommandControl {
    /// Sends SIGTERM to the whole command tree.
    fn terminate(&mut self) -> impl Future<Output = ()>;
    /// Sends SIGKILL to the whole command tree, until it is gone.
    fn kill(&mut self) -> impl Future<Output = ()>;
    /// Completes once the whole tree is gone, with the command's status. Cancel-safe.
    fn wait(&mut self) -> impl Future<Output = io::Result<ExitStatus>>;
}

/// How long after the self-fencing deadline the command may still run at most: 3/4 of
/// `lease_duration - renew_deadline` (the --ttl mapping: TTL/8 * 3).
pub fn kill_bound(timing: &Timing) -> Duration {
    timing.lease_duration.saturating_sub(timing.renew_deadline) * 3 / 4
}

/// The kill bound for one tenure, given how long it was valid for when it started (`remaining`,
/// at most the renew deadline in force): [`kill_bound`], scaled down in proportion when the
/// tenure shows a shorter renew deadline than `timing` says. Why: a backend may fence sooner than
/// asked (a ZooKeeper server grants a shorter session than requested and the driver fences on
/// it), and then other candidates may also lead sooner; the proportions of lease and renew
/// deadline stay those of the timing.
pub fn tenure_kill_bound(timing: &Timing, remaining: Duration) -> Duration {
    let full = kill_bound(timing);
    if remaining >= timing.renew_deadline || timing.renew_deadline.is_zero() {
        return full;
    }
    full.mul_f64(remaining.as_secs_f64() / timing.renew_deadline.as_secs_f64())
}

/// The grace period between SIGTERM and SIGKILL: `--grace`, or by default half of `lease_duration
/// - renew_deadline` (TTL/4 with the --ttl mapping); refused when longer than [`kill_bound`],
///   since the SIGKILL would then have to come before the grace ends anyway.
pub fn checked_grace(grace: Option<Duration>, timing: &Timing) -> Result<Duration, CliError> {
    let bound = kill_bound(timing);
    let grace = grace.unwrap_or(timing.lease_duration.saturating_sub(timing.renew_deadline) / 2);
    if grace > bound {
        return Err(CliError::GraceTooLong { grace, bound });
    }
    Ok(grace)
}

/// Completes when the tenure is over: ended by the elector, or past its self-fencing deadline on
/// the local clock even if the elector has not said so (yet). The deadline is re-read after each
/// wake, since every successful renew moves it.
pub async fn lapsed(tenure: &Tenure) {
    while tenure.is_valid() {
        tokio::select! {
            () = tenure.ended() => return,
            () = sleep_until(tenure.valid_until()) => {}
        }
    }
}

/// Completes at the instant by which the command must be dead: `bound` after the self-fencing
/// deadline. While the tenure lasts, each renew moves that deadline (a stop asked for by a signal
/// while still leading); once the tenure has lapsed on this clock it is frozen, so a driver that
/// later extends a lapsed tenure cannot postpone the kill. (An ended tenure is never extended.)
pub async fn kill_deadline(tenure: &Tenure, bound: Duration) {
    let mut fence = tenure.valid_until();
    while tenure.is_valid() {
        fence = tenure.valid_until();
        tokio::select! {
            () = sleep_until(fence) => {}
            () = tenure.ended() => {
                fence = tenure.valid_until();
                break;
            }
        }
    }
    sleep_until(fence + bound).await;
}

/// Why SIGKILL was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The grace period passed.
    Grace,
    /// The kill deadline came before the end of the grace period.
    Deadline,
    /// A second request to stop arrived.
    Hurry,
}

/// Stops `command`: SIGTERM now, SIGKILL at the first of `grace`, `deadline` and `hurry`. Returns
/// the command's status and why it was killed, if it was.
pub async fn stop<C: CommandControl>(
    command: &mut C,
    grace: Duration,
    deadline: impl Future<Output = ()>,
    hurry: impl Future<Output = ()>,
) -> io::Result<(ExitStatus, Option<KillReason>)> {
    command.terminate().await;
    let reason = tokio::select! {
        status = command.wait() => return Ok((status?, None)),
        () = sleep(grace) => KillReason::Grace,
        () = deadline => KillReason::Deadline,
        () = hurry => KillReason::Hurry,
    };
    command.kill().await;
    Ok((command.wait().await?, Some(reason)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use tenure::leadership::Publisher;
    use tenure::Term;
    use tokio::time::Instant;

    /// A command that ignores SIGTERM and records when it was signalled.
    #[derive(Default)]
    pub(crate) struct Stubborn {
        pub(crate) terminated_at: Option<Instant>,
        pub(crate) killed_at: Option<Instant>,
    }

    impl CommandControl for Stubborn {
        async fn terminate(&mut self) {
            self.terminated_at = Some(Instant::now());
        }
        async fn kill(&mut self) {
            self.killed_at = Some(Instant::now());
        }
        async fn wait(&mut self) -> io::Result<ExitStatus> {
            if self.killed_at.is_none() {
                std::future::pending::<()>().await;
            }
            Ok(ExitStatus::from_raw(libc::SIGKILL))
        }
    }

    pub(crate) fn ttl_2s() -> Timing {
        Timing::from_ttl(Duration::from_secs(2)).unwrap()
    }

    #[test]
    fn grace_defaults_to_half_the_margin_and_may_not_exceed_the_kill_bound() {
        let timing = Timing::from_ttl(Duration::from_secs(10)).unwrap();
        assert_eq!(kill_bound(&timing), Duration::from_millis(3750));
        assert_eq!(checked_grace(None, &timing).unwrap(), Duration::from_millis(2500));
        assert_eq!(checked_grace(Some(Duration::from_millis(3750)), &timing).unwrap(), Duration::from_millis(3750));
        assert!(matches!(
            checked_grace(Some(Duration::from_millis(3751)), &timing),
            Err(CliError::GraceTooLong { .. })
        ));
    }

    /// A tenure whose elector never reports the end (a driver stuck in a store call).
    pub(crate) fn silent_tenure(valid_for: Duration) -> (Publisher, Tenure) {
        let (mut publisher, subscriber) = Publisher::new();
        publisher.start_tenure(Term(4), Instant::now() + valid_for);
        let tenure = subscriber.tenure().expect("valid");
        (publisher, tenure)
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenure_that_lapses_unnoticed_ends_exactly_at_its_fencing_deadline() {
        let start = Instant::now();
        let (mut publisher, tenure) = silent_tenure(Duration::from_secs(1));
        // A renew half-way moves the deadline.
        tokio::time::sleep(Duration::from_millis(500)).await;
        publisher.extend_tenure(Instant::now() + Duration::from_secs(1));
        lapsed(&tenure).await;
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
        drop(publisher);
    }

    #[test]
    fn a_tenure_fenced_sooner_than_the_timing_says_gets_a_proportionally_shorter_kill_bound() {
        let timing = ttl_2s();
        assert_eq!(tenure_kill_bound(&timing, Duration::from_secs(1)), Duration::from_millis(750));
        assert_eq!(tenure_kill_bound(&timing, Duration::from_millis(500)), Duration::from_millis(375));
    }

    #[tokio::test(start_paused = true)]
    async fn sigkill_comes_before_others_may_lead_when_the_backend_fences_sooner_than_asked() {
        // Asked for a 2 s lease; the server granted a session half as long, and the tenure shows
        // it: valid for 0.5 s, not 1 s. Others may then lead 0.5 s after its deadline.
        let timing = ttl_2s();
        let (publisher, tenure) = silent_tenure(timing.renew_deadline / 2);
        let bound = tenure_kill_bound(&timing, tenure.valid_until() - Instant::now());
        let fence = tenure.valid_until();
        let mut command = Stubborn::default();
        lapsed(&tenure).await;
        let grace = checked_grace(None, &timing).unwrap();
        stop(&mut command, grace, kill_deadline(&tenure, bound), std::future::pending()).await.unwrap();
        let others_may_lead = fence + (timing.lease_duration - timing.renew_deadline) / 2;
        assert!(command.killed_at.unwrap() < others_may_lead, "{:?}", command.killed_at.unwrap() - fence);
        drop(publisher);
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_of_a_lapsed_tenure_does_not_postpone_the_kill() {
        let timing = ttl_2s();
        let bound = kill_bound(&timing);
        let (mut publisher, tenure) = silent_tenure(timing.renew_deadline);
        let fence = tenure.valid_until();
        let deadline = kill_deadline(&tenure, bound);
        let revive = async {
            // A keep-alive answered after the deadline extends the lapsed tenure.
            sleep_until(fence + Duration::from_millis(100)).await;
            publisher.extend_tenure(Instant::now() + timing.renew_deadline);
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = deadline => {}
            () = revive => unreachable!(),
        }
        assert_eq!(Instant::now(), fence + bound);
    }

    #[tokio::test(start_paused = true)]
    async fn renews_while_leading_move_the_kill_deadline() {
        let timing = ttl_2s();
        let bound = kill_bound(&timing);
        let (mut publisher, tenure) = silent_tenure(timing.renew_deadline);
        let deadline = kill_deadline(&tenure, bound);
        let renew = async {
            sleep(timing.renew_deadline / 2).await;
            publisher.extend_tenure(Instant::now() + timing.renew_deadline);
            std::future::pending::<()>().await;
        };
        let start = Instant::now();
        tokio::select! {
            () = deadline => {}
            () = renew => unreachable!(),
        }
        assert_eq!(start.elapsed(), timing.renew_deadline / 2 + timing.renew_deadline + bound);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_that_starts_late_kills_at_the_deadline_not_after_the_full_grace() {
        let timing = ttl_2s();
        let bound = kill_bound(&timing);
        let (publisher, tenure) = silent_tenure(timing.renew_deadline);
        let fence = tenure.valid_until();
        // Whatever made the notice late (a blocked thread, a signal handled late), the stop
        // begins half-way through the margin.
        sleep_until(fence + bound / 2).await;
        let mut command = Stubborn::default();
        let (_, reason) =
            stop(&mut command, bound, kill_deadline(&tenure, bound), std::future::pending()).await.unwrap();
        assert_eq!(reason, Some(KillReason::Deadline));
        assert_eq!(command.killed_at, Some(fence + bound));
        drop(publisher);
    }
}
