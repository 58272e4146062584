//! `tenure run -- CMD`: run a command only while this instance leads, like `consul lock` or
//! `etcdctl lock`, for anyone with a job that must run on one host at a time.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use tenure::{Elector, Timing};
use tokio::process::Command;

use crate::child::{describe_status, exit_code_of, SupervisedChild};
use crate::options::{parse_duration, CandidateOptions, ElectionOptions};
use crate::signals::{Termination, TerminationSignals};
use crate::{exit, logging, CliError};

/// Arguments of `tenure run`.
#[derive(Debug, Args)]
#[command(
    about = "Run a command only while this instance leads the election",
    long_about = "Run a command only while this instance leads the election.\n\n\
        Waits until this instance leads, then starts CMD with TENURE_TERM (the fencing term of this \
        tenure: pass it to what the command writes, and have it refuse lower terms) and \
        TENURE_ELECTION in its environment. CMD runs in its own process group (so it should not \
        read from the terminal), and the kernel kills it if tenure itself dies.\n\n\
        When CMD exits, the lock is released and tenure exits with CMD's status (its exit code, or \
        128 + the signal that killed it). If CMD cannot be started: 127 (not found) or 126.\n\n\
        Losing leadership (the lock could not be renewed within the renew deadline, or another \
        holder took it): CMD's process group gets SIGTERM, then SIGKILL after the grace period, \
        and tenure exits with status 75. It does not campaign again: a command killed in the \
        middle of its work must not silently start over; let your supervisor decide. If tenure \
        itself is paused (SIGSTOP, a frozen VM), CMD keeps running unsupervised meanwhile: that is \
        what TENURE_TERM is for.\n\n\
        Signals: SIGTERM, SIGINT and SIGHUP are passed on to CMD's process group as SIGTERM; after \
        the grace period (or at a second signal) it gets SIGKILL. Then the lock is released and \
        tenure exits with CMD's status. Stopped before it leads, tenure exits with 128 + the \
        signal without running CMD.",
    after_help = "Example:  tenure run --election nightly-backup --ttl 10s -- /usr/local/bin/backup --full"
)]
pub struct RunArgs {
    #[command(flatten)]
    election: ElectionOptions,

    #[command(flatten)]
    candidate: CandidateOptions,

    /// How long CMD gets to exit after SIGTERM before it is killed. Must be shorter than the
    /// renew deadline (TTL/2). [default: half the renew deadline, TTL/4]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    grace: Option<Duration>,

    /// The command to run while leading, and its arguments (after --).
    #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// How the command's run ended.
enum Ending {
    /// The command exited by itself.
    Exited(std::process::ExitStatus),
    /// Leadership ended while the command ran.
    LostLeadership,
    /// Tenure was asked to stop.
    Terminated(Termination),
}

/// Runs `tenure run`; returns the exit status.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    logging::init(args.candidate.log_format);
    let mut signals =
        TerminationSignals::install().map_err(|e| CliError::Failed(format!("cannot install signal handlers: {e}")))?;
    let timing = args.candidate.ttl.timing;
    let grace = checked_grace(args.grace, &timing)?;
    let (program, program_args) =
        args.command.split_first().ok_or_else(|| CliError::Usage("no command given after --".to_owned()))?;
    let identity = args.candidate.identity().map_err(CliError::Usage)?;
    let election = args.election.election.as_str();
    let url = args.election.lock_url()?;
    crate::lock_scope::LockScope::announce(&url, args.election.lock.is_none());
    let cluster = args.election.cluster.options().map_err(CliError::Usage)?;
    let campaign = url.campaign(&identity, timing, &cluster).await?;
    let events = campaign.kube.as_ref().map(|lock| lock.record_events(&campaign.elector));
    let elector = campaign.elector;
    tracing::info!(identity, election, lock = %url, "waiting for leadership before starting the command");

    let tenure = loop {
        let tenure = tokio::select! {
            tenure = elector.acquired() => tenure.map_err(|e| CliError::Failed(e.to_string()))?,
            termination = signals.recv() => {
                tracing::info!(signal = termination.name, "stopped before leading; the command never ran");
                release(elector, events).await;
                return Ok(termination.exit_status());
            }
        };
        // The tenure may have lapsed between its start and now; nothing has run yet, so waiting
        // for the next one is harmless.
        if tenure.is_valid() {
            break tenure;
        }
    };
    let term = tenure.term();
    let mut command = Command::new(program);
    command.args(program_args).env("TENURE_TERM", term.to_string()).env("TENURE_ELECTION", election);
    let mut child = match SupervisedChild::spawn(&mut command) {
        Ok(child) => child,
        Err(error) => {
            let status =
                if error.kind() == std::io::ErrorKind::NotFound { exit::NOT_FOUND } else { exit::CANNOT_EXECUTE };
            tracing::error!(command = %program.to_string_lossy(), %error, "cannot start the command");
            drop(tenure);
            release(elector, events).await;
            return Ok(status);
        }
    };
    tracing::info!(term = term.0, pid = child.pid(), command = %program.to_string_lossy(), "leading; started the command");

    let ending = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(error) => {
                tracing::error!(%error, "cannot wait for the command; killing it");
                let _ = child.kill().await;
                drop(tenure);
                release(elector, events).await;
                return Err(CliError::Failed(format!("lost track of the command: {error}")));
            }
        },
        () = tenure.ended() => Ending::LostLeadership,
        termination = signals.recv() => Ending::Terminated(termination),
    };

    let status = match ending {
        Ending::Exited(status) => {
            tracing::info!(outcome = describe_status(status), "the command ended; releasing the lock");
            child.kill_leftovers();
            Ok(status)
        }
        Ending::LostLeadership => {
            tracing::error!(term = term.0, grace = %humantime::format_duration(grace), "lost leadership; stopping the command");
            child.stop(grace, hurry(&mut signals)).await
        }
        Ending::Terminated(termination) => {
            tracing::info!(signal = termination.name, grace = %humantime::format_duration(grace), "stopping the command");
            child.stop(grace, hurry(&mut signals)).await
        }
    };
    drop(tenure);
    release(elector, events).await;
    let status = status.map_err(|e| CliError::Failed(format!("lost track of the command: {e}")))?;
    match ending {
        Ending::LostLeadership => {
            tracing::error!(
                outcome = describe_status(status),
                exit_status = exit::LOST_LEADERSHIP,
                "the command was stopped because leadership was lost; not restarting it"
            );
            Ok(exit::LOST_LEADERSHIP)
        }
        Ending::Exited(_) | Ending::Terminated(_) => {
            if matches!(ending, Ending::Terminated(_)) {
                tracing::info!(outcome = describe_status(status), "the command stopped");
            }
            Ok(exit_code_of(status))
        }
    }
}

/// The grace period between SIGTERM and SIGKILL, checked against self-fencing.
///
/// Why the bound: when renewals stop succeeding, this instance stops believing it leads at
/// `R + renew_deadline`, where `R` is the start of its last successful renew, and sends SIGTERM
/// at once. No other candidate may take the lock before `R + lease_duration`, because each
/// counts the lease from when it saw that renew, which is after `R`. The command is certainly
/// dead at `R + renew_deadline + grace`, so it never overlaps another leader when
/// `grace < lease_duration - renew_deadline`. With the `--ttl` mapping that margin equals the
/// renew deadline (TTL/2). The default, half of it, leaves the other half for clock-rate
/// differences between hosts, signal delivery and scheduling delays.
fn checked_grace(grace: Option<Duration>, timing: &Timing) -> Result<Duration, CliError> {
    let margin = timing.lease_duration.saturating_sub(timing.renew_deadline).min(timing.renew_deadline);
    let grace = grace.unwrap_or(margin / 2);
    if grace >= margin {
        return Err(CliError::Usage(format!(
            "--grace {} must be shorter than the renew deadline ({}): the command must be dead before another instance may lead",
            humantime::format_duration(grace),
            humantime::format_duration(margin),
        )));
    }
    Ok(grace)
}

/// Completes at the next termination signal: a second request to stop means "now".
async fn hurry(signals: &mut TerminationSignals) {
    signals.recv().await;
}

/// Releases the lock (if held) and stops the elector, logging a failed release; then lets the
/// last Kubernetes Event ("stopped leading") go out.
async fn release(elector: Elector, events: Option<tenure_kube::LeadershipEvents>) {
    if let Err(error) = elector.shutdown().await {
        tracing::warn!(%error, "could not release the lock");
    }
    if let Some(events) = events {
        events.finish().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_defaults_to_half_the_renew_deadline_and_must_stay_below_it() {
        let timing = Timing::from_ttl(Duration::from_secs(10)).unwrap();
        assert_eq!(checked_grace(None, &timing).unwrap(), Duration::from_millis(2500));
        assert_eq!(checked_grace(Some(Duration::from_millis(4999)), &timing).unwrap(), Duration::from_millis(4999));
        assert!(matches!(checked_grace(Some(Duration::from_secs(5)), &timing), Err(CliError::Usage(_))));
    }
}
