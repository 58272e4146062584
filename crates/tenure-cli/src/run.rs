//! `tenure run -- CMD`: run a command only while this instance leads, like `consul lock` or
//! `etcdctl lock`, for anyone with a job that must run on one host at a time.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use tenure::Elector;

use crate::child::{describe_status, exit_code_of};
use crate::command_tree::{CommandTree, Containment, StartError, TreeOptions};
use crate::fencing::{self, checked_grace, kill_bound, CommandControl, KillReason};
use crate::options::{parse_duration, CandidateOptions, ElectionOptions};
use crate::signals::{Termination, TerminationSignals};
use crate::{exit, logging, CliError};

/// Arguments of `tenure run`.
#[derive(Debug, Args)]
#[command(
    about = "Run a command only while this instance leads the election",
    long_about = "Run a command only while this instance leads the election.\n\n\
        Waits until this instance leads, then starts CMD with TENURE_TERM (the fencing term of this \
        tenure: pass it to what the command writes, and have it refuse lower terms), TENURE_ELECTION, \
        TENURE_IDENTITY and TENURE_LOCK in its environment. CMD should not read from the terminal.\n\n\
        When CMD exits, whatever it left running is killed, the lock is released and tenure exits \
        with CMD's status (its exit code, or 128 + the signal that killed it). If CMD cannot be \
        started: 127 (not found) or 126.\n\n\
        Losing leadership (the lock could not be renewed within the renew deadline, or another \
        holder took it): CMD gets SIGTERM, then SIGKILL after the grace period, and tenure exits \
        with status 75. It does not campaign again: a command killed in the middle of its work \
        must not silently start over; let your supervisor decide.\n\n\
        The bound: with V the self-fencing deadline (the start of the last successful renew + the \
        renew deadline; TTL/2 with --ttl), SIGTERM comes at V at the latest, even when the store \
        hangs, and SIGKILL at the latest at V + 3/4 (lease - renew deadline) (V + 3/8 TTL with \
        --ttl), whichever of that and the grace period ends first. No other candidate may lead \
        before V + (lease - renew deadline); the last quarter of that margin is left for the \
        kill itself and for clocks that run at different rates on different hosts.\n\n\
        What is killed: CMD runs under a small supervisor process (tenure itself, re-executed), \
        in a new cgroup (v2) below tenure's own when one can be created there (the cgroup is \
        writable and the kernel has cgroup.kill, Linux 5.14+), so that processes that call setsid \
        or detach are killed too; otherwise in a process group of its own, with the supervisor as \
        a child subreaper, so that every process CMD starts remains its descendant and is killed \
        with it. The supervisor kills the whole tree when tenure dies, even by SIGKILL. Not \
        covered: processes started outside the tree on CMD's behalf (systemd-run, a container \
        runtime, ssh to another host); without a cgroup, a process that escapes by being \
        re-parented in the instant between two kill rounds; processes stuck in the kernel \
        (uninterruptible I/O), which die only when the I/O ends; and a supervisor that is itself \
        killed by SIGKILL (then only CMD's own process is killed, by the kernel). If tenure is \
        paused (SIGSTOP, a frozen VM), CMD keeps running unsupervised meanwhile: that is what \
        TENURE_TERM is for.\n\n\
        Signals: SIGTERM, SIGINT and SIGHUP are passed on to CMD as SIGTERM; after the grace \
        period (or at a second signal) it gets SIGKILL. Then the lock is released and tenure exits \
        with CMD's status. Stopped before it leads, tenure exits with 128 + the signal without \
        running CMD.",
    after_help = "Example:  tenure run --election nightly-backup --ttl 10s -- /usr/local/bin/backup --full"
)]
pub struct RunArgs {
    #[command(flatten)]
    election: ElectionOptions,

    #[command(flatten)]
    candidate: CandidateOptions,

    /// How long CMD gets to exit after SIGTERM before it is killed. At most 3/4 of (lease - renew
    /// deadline), i.e. 3/8 TTL with --ttl: SIGKILL must come before another instance may lead.
    /// [default: half of (lease - renew deadline), TTL/4]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    grace: Option<Duration>,

    /// Do not put CMD in a cgroup even where one can be created: contain it by its process group
    /// and the supervisor's descendants only (for hosts where another tool manages cgroups).
    #[arg(long)]
    no_cgroup: bool,

    /// The command to run while leading, and its arguments (after --).
    #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// How the command's run ended.
enum Ending {
    /// The command exited by itself.
    Exited(std::process::ExitStatus),
    /// Leadership ended (or lapsed on this instance's clock) while the command ran.
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
    checked_grace(args.grace, &timing)?;
    let program = args.command.first().ok_or_else(|| CliError::Usage("no command given after --".to_owned()))?;
    let identity = args.candidate.identity().map_err(CliError::Usage)?;
    let election = args.election.election.as_str();
    let url = args.election.lock_url()?;
    let cluster = args.election.cluster.options().map_err(CliError::Usage)?;
    let campaign = url.campaign(&identity, timing, &cluster).await?;
    let events = campaign.kube.as_ref().map(|lock| lock.record_events(&campaign.elector));
    let elector = campaign.elector;
    // The timing in force may differ from the one asked for (a backend's session rules).
    let timing = *elector.timing();
    let grace = match checked_grace(args.grace, &timing) {
        Ok(grace) => grace,
        Err(error) => {
            release(elector, events).await;
            return Err(error);
        }
    };
    let bound = kill_bound(&timing);
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
    let options = TreeOptions {
        no_cgroup: args.no_cgroup,
        environment: vec![
            ("TENURE_TERM".to_owned(), term.to_string()),
            ("TENURE_ELECTION".to_owned(), election.to_owned()),
            ("TENURE_IDENTITY".to_owned(), identity.clone()),
            ("TENURE_LOCK".to_owned(), url.to_string()),
        ],
    };
    let mut tree = match CommandTree::start(&args.command, &options).await {
        Ok(tree) => tree,
        Err(error) => {
            let status = match &error {
                StartError::NotFound(_) => exit::NOT_FOUND,
                StartError::CannotExecute(_) => exit::CANNOT_EXECUTE,
                StartError::Supervisor(_) => exit::FAILURE,
            };
            tracing::error!(command = %program.to_string_lossy(), %error, "cannot start the command");
            drop(tenure);
            release(elector, events).await;
            return Ok(status);
        }
    };
    match tree.containment() {
        Containment::Cgroup(path) => {
            tracing::info!(term = term.0, pid = tree.pid(), command = %program.to_string_lossy(), cgroup = %path.display(), "leading; started the command");
        }
        Containment::ProcessGroup(why) => {
            tracing::info!(term = term.0, pid = tree.pid(), command = %program.to_string_lossy(), no_cgroup = %why, "leading; started the command in its own process group");
        }
    }

    let ending = tokio::select! {
        status = tree.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(error) => {
                tracing::error!(%error, "lost track of the command");
                drop(tenure);
                release(elector, events).await;
                return Err(CliError::Failed(format!("lost track of the command: {error}")));
            }
        },
        () = fencing::lapsed(&tenure) => Ending::LostLeadership,
        termination = signals.recv() => Ending::Terminated(termination),
    };

    let grace_text = humantime::format_duration(grace);
    let stopped = match ending {
        Ending::Exited(status) => {
            tracing::info!(outcome = describe_status(status), "the command ended; releasing the lock");
            if tree.leftovers() > 0 {
                tracing::warn!(processes = tree.leftovers(), "killed processes the command left running");
            }
            Ok((status, None))
        }
        Ending::LostLeadership => {
            tracing::error!(term = term.0, grace = %grace_text, "lost leadership; stopping the command");
            fencing::stop(&mut tree, grace, fencing::kill_deadline(&tenure, bound), hurry(&mut signals)).await
        }
        Ending::Terminated(termination) => {
            tracing::info!(signal = termination.name, grace = %grace_text, "stopping the command");
            fencing::stop(&mut tree, grace, fencing::kill_deadline(&tenure, bound), hurry(&mut signals)).await
        }
    };
    drop(tenure);
    release(elector, events).await;
    let (status, killed) = stopped.map_err(|e| CliError::Failed(format!("lost track of the command: {e}")))?;
    match killed {
        Some(KillReason::Grace) => {
            tracing::warn!(grace = %grace_text, "the command did not stop within the grace period; it was killed")
        }
        Some(KillReason::Deadline) => {
            tracing::warn!("the command was killed before the end of its grace period: another instance may lead soon")
        }
        Some(KillReason::Hurry) => tracing::warn!("asked again to stop; the command was killed"),
        None => {}
    }
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
