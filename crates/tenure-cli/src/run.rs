//! `tenure run -- CMD`: run a command only while this instance leads, like `consul lock` or
//! `etcdctl lock`, for anyone with a job that must run on one host at a time.

use std::ffi::OsString;
use std::future::Future;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use tenure::{Elector, Tenure};
use tokio::time::{sleep_until, Instant};

use crate::backend::{Campaign, CampaignEnd, CampaignRequest};
use crate::child::{describe_status, exit_code_of};
use crate::command_tree::{CommandTree, Containment, StartError, TreeOptions};
use crate::fencing::{self, checked_grace, tenure_kill_bound, CommandControl, KillReason};
use crate::options::{parse_duration, CandidateOptions, CoordinationOptions, ElectionOptions};
use crate::probe::Probe;
use crate::signals::{ResignRequests, Termination, TerminationSignals};
use crate::{error::CliError, exit, logging};

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
        with status 75. It does not campaign again unless --campaign-again is given: a command \
        killed in the middle of its work must not silently start over; let your supervisor \
        decide.\n\n\
        SIGUSR1 makes a leading instance step down without exiting (maintenance): CMD is stopped \
        as on a loss, the lock is released so the next candidate in line leads at once with a \
        higher term, and this instance stays a candidate and runs CMD again (with its new \
        TENURE_TERM) when it leads again. On file and Kubernetes locks it does not take the lock \
        back for one lease unless nobody else has; on etcd and ZooKeeper it queues up behind the \
        other candidates.\n\n\
        Exit statuses: CMD's own; 75 when leadership was lost; 124 when --timeout passed before \
        leading; 126 or 127 when CMD cannot be started; 128 + n when stopped by signal n before \
        leading; 1 on other failures, 2 on usage errors.\n\n\
        The bound: with V the self-fencing deadline (the start of the last successful renew + the \
        renew deadline; TTL/2 with --ttl), SIGTERM comes at V at the latest, even when the store \
        hangs, and SIGKILL at the latest at V + 3/4 (lease - renew deadline) (V + 3/8 TTL with \
        --ttl), whichever of that and the grace period ends first. No other candidate may lead \
        before V + (lease - renew deadline); the last quarter of that margin is left for the \
        kill itself and for clocks that run at different rates on different hosts. Where the \
        backend fences sooner than --ttl says (a ZooKeeper server that grants a shorter session), \
        the bound shrinks in proportion.\n\n\
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

    #[command(flatten)]
    coordination: CoordinationOptions,

    /// How long CMD gets to exit after SIGTERM before it is killed. At most 3/4 of (lease - renew
    /// deadline), i.e. 3/8 TTL with --ttl: SIGKILL must come before another instance may lead.
    /// [default: half of (lease - renew deadline), TTL/4]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    grace: Option<Duration>,

    /// Do not put CMD in a cgroup even where one can be created: contain it by its process group
    /// and the supervisor's descendants only (for hosts where another tool manages cgroups).
    #[arg(long)]
    no_cgroup: bool,

    /// Give up waiting for leadership after DURATION: exit with status 124 without running CMD.
    /// Applies to each wait (also after --campaign-again or SIGUSR1). [default: wait forever]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// After losing leadership (and stopping CMD), campaign again and run CMD anew when leading
    /// again, instead of exiting with status 75. For commands that are safe to restart.
    #[arg(long)]
    campaign_again: bool,

    /// A health probe of CMD: a shell command run every --probe-every while CMD runs (with
    /// CMD's environment); exit status 0 proves CMD makes progress. With --progress-timeout, a
    /// leader whose probe has not succeeded for that long gives way: CMD is stopped as on
    /// SIGUSR1, the lock is released (a healthy replica leads) and this instance stays a
    /// candidate. A probe that outlasts its interval is killed and counts as failed. HTTP:
    /// --probe 'curl -fsS http://127.0.0.1:PORT/healthz'.
    #[arg(long, value_name = "SHELL COMMAND", requires = "progress_timeout", value_parser = clap::value_parser!(OsString))]
    probe: Option<OsString>,

    /// How long CMD may go without a successful --probe before this leader gives way (from
    /// CMD's start). At least one renew interval (--ttl / 8).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "probe")]
    progress_timeout: Option<Duration>,

    /// How often --probe runs, and how long one run may take. [default: a quarter of
    /// --progress-timeout]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "probe")]
    probe_every: Option<Duration>,

    /// The command to run while leading, and its arguments (after --).
    #[arg(last = true, required = true, value_name = "CMD", value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// How the command's run ended.
enum Ending {
    /// The command exited by itself.
    Exited,
    /// Leadership ended (or lapsed on this instance's clock) while the command ran.
    LostLeadership,
    /// Tenure was asked to stop.
    Terminated(Termination),
    /// The operator asked the leader to step down (SIGUSR1).
    Resign,
    /// The command's probe has not succeeded for --progress-timeout.
    GiveWay,
}

/// What comes after one tenure.
enum Next {
    /// Release the lock and exit with this status.
    Exit(u8),
    /// Stay a candidate and run the command again when leading again.
    CampaignAgain,
}

/// What a wait for leadership gave.
enum Waited {
    /// This instance leads.
    Leading(Tenure),
    /// A termination signal came first.
    Stopped(Termination),
    /// `--timeout` passed first.
    TimedOut,
}

/// What a run needs beside the elector: its settings and the signals it answers.
struct Runner {
    args: RunArgs,
    probe: Option<Probe>,
    identity: String,
    lock: String,
    grace: Duration,
    requests: SignalRequests,
}

/// Runs `tenure run`; returns the exit status.
pub async fn run(args: RunArgs) -> Result<u8, CliError> {
    logging::init(args.candidate.log_format);
    let signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let resigns = ResignRequests::install().map_err(CliError::io("install signal handlers"))?;
    let timing = args.candidate.ttl.timing;
    checked_grace(args.grace, &timing)?;
    if args.command.is_empty() {
        return Err(CliError::NoCommand);
    }
    let probe = checked_probe(&args, &timing)?;
    let identity = args.candidate.identity()?;
    let url = args.election.lock_url()?;
    url.announce_scope(args.election.lock.is_none());
    let cluster = args.election.cluster.options()?;
    let coordinated = args.coordination.versions()?;
    let request = CampaignRequest { identity: &identity, timing, cluster: &cluster, coordinated, leader_label: None };
    let Campaign { elector, ending } = url.campaign(request).await?;
    // The timing in force may differ from the one asked for (a backend's session rules).
    let timing = *elector.timing();
    let grace = match checked_grace(args.grace, &timing) {
        Ok(grace) => grace,
        Err(error) => {
            release(elector, ending).await;
            return Err(error);
        }
    };
    let requests = SignalRequests { signals, resigns };
    let mut runner = Runner { args, probe, identity, lock: url.to_string(), grace, requests };
    let outcome = loop {
        match runner.one_tenure(&elector).await {
            Ok(Next::CampaignAgain) => continue,
            Ok(Next::Exit(status)) => break Ok(status),
            Err(error) => break Err(error),
        }
    };
    release(elector, ending).await;
    outcome
}

impl Runner {
    /// Waits for leadership, runs the command while leading and stops it when the tenure ends.
    async fn one_tenure(&mut self, elector: &Elector) -> Result<Next, CliError> {
        let election = self.args.election.election.clone();
        tracing::info!(
            identity = self.identity,
            election,
            lock = self.lock,
            "waiting for leadership before starting the command"
        );
        let tenure = match self.wait_for_leadership(elector).await? {
            Waited::Leading(tenure) => tenure,
            Waited::Stopped(termination) => {
                tracing::info!(signal = termination.name, "stopped before leading; the command never ran");
                return Ok(Next::Exit(termination.exit_status()));
            }
            Waited::TimedOut => {
                tracing::error!(exit_status = exit::TIMED_OUT, "not leading within --timeout; the command never ran");
                return Ok(Next::Exit(exit::TIMED_OUT));
            }
        };
        let term = tenure.term();
        let bound = tenure_kill_bound(elector.timing(), tenure.valid_until().saturating_duration_since(Instant::now()));
        let program = self.args.command[0].to_string_lossy().into_owned();
        let options = TreeOptions {
            no_cgroup: self.args.no_cgroup,
            environment: vec![
                ("TENURE_TERM".to_owned(), term.to_string()),
                ("TENURE_ELECTION".to_owned(), election),
                ("TENURE_IDENTITY".to_owned(), self.identity.clone()),
                ("TENURE_LOCK".to_owned(), self.lock.clone()),
            ],
        };
        let mut tree = match CommandTree::start(&self.args.command, &options).await {
            Ok(tree) => tree,
            Err(error) => {
                let status = match &error {
                    StartError::NotFound(_) => exit::NOT_FOUND,
                    StartError::CannotExecute(_) => exit::CANNOT_EXECUTE,
                    StartError::Supervisor(_) => exit::FAILURE,
                };
                tracing::error!(command = program, %error, "cannot start the command");
                return Ok(Next::Exit(status));
            }
        };
        match tree.containment() {
            Containment::Cgroup(path) => {
                tracing::info!(term = term.0, pid = tree.pid(), command = program, cgroup = %path.display(), kill_within = %humantime::format_duration(bound), "leading; started the command");
            }
            Containment::ProcessGroup(why) => {
                tracing::info!(term = term.0, pid = tree.pid(), command = program, no_cgroup = %why, kill_within = %humantime::format_duration(bound), "leading; started the command in its own process group");
            }
        }

        let started = Instant::now();
        let silence = async {
            match &self.probe {
                Some(probe) => probe.silence(started, &options.environment).await,
                None => std::future::pending().await,
            }
        };
        let supervised = supervise(&mut tree, &tenure, self.grace, bound, &mut self.requests, silence).await;
        let (ending, status) = match supervised {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::error!(%error, "lost track of the command");
                return Err(CliError::LostCommand(error));
            }
        };
        if let Ending::Exited = ending {
            tracing::info!(outcome = describe_status(status), "the command ended; releasing the lock");
            if tree.leftovers() > 0 {
                tracing::warn!(processes = tree.leftovers(), "killed processes the command left running");
            }
        }
        // The tenure's guard goes before the lock is released or resigned: a release waits for it.
        drop(tenure);
        match ending {
            Ending::Exited => Ok(Next::Exit(exit_code_of(status))),
            Ending::Terminated(_) => {
                tracing::info!(outcome = describe_status(status), "the command stopped");
                Ok(Next::Exit(exit_code_of(status)))
            }
            Ending::LostLeadership if self.args.coordination.coordinated => {
                tracing::info!(
                    outcome = describe_status(status),
                    "the command was stopped: the tenure ended (with --coordinated, the coordinator moves leadership, \
                     e.g. to an older version during an upgrade); campaigning again"
                );
                Ok(Next::CampaignAgain)
            }
            Ending::LostLeadership if self.args.campaign_again => {
                tracing::warn!(
                    outcome = describe_status(status),
                    "the command was stopped because leadership was lost; campaigning again (--campaign-again)"
                );
                Ok(Next::CampaignAgain)
            }
            Ending::LostLeadership => {
                tracing::error!(
                    outcome = describe_status(status),
                    exit_status = exit::LOST_LEADERSHIP,
                    "the command was stopped because leadership was lost; not restarting it"
                );
                Ok(Next::Exit(exit::LOST_LEADERSHIP))
            }
            Ending::Resign | Ending::GiveWay => {
                tracing::info!(
                    outcome = describe_status(status),
                    "the command stopped; stepping down and staying a candidate"
                );
                if let Err(error) = elector.resign().await {
                    tracing::warn!(%error, "could not step down");
                }
                Ok(Next::CampaignAgain)
            }
        }
    }

    /// Waits until this instance leads, a termination signal comes, or `--timeout` passes.
    /// SIGUSR1 while waiting has nothing to step down from.
    async fn wait_for_leadership(&mut self, elector: &Elector) -> Result<Waited, CliError> {
        let give_up = self.args.timeout.map(|timeout| Instant::now() + timeout);
        loop {
            let tenure = tokio::select! {
                tenure = elector.acquired() => tenure?,
                request = self.requests.next() => match request {
                    Request::Stop(termination) => return Ok(Waited::Stopped(termination)),
                    Request::Resign => {
                        tracing::info!("SIGUSR1: not leading, nothing to step down from");
                        continue;
                    }
                },
                () = until(give_up) => return Ok(Waited::TimedOut),
            };
            // The tenure may have lapsed between its start and now; nothing has run yet, so
            // waiting for the next one is harmless.
            if tenure.is_valid() {
                return Ok(Waited::Leading(tenure));
            }
        }
    }
}

/// Completes at `instant`, never if there is none (a `--timeout`, a drain deadline of `member`).
pub async fn until(instant: Option<Instant>) {
    match instant {
        Some(instant) => sleep_until(instant).await,
        None => std::future::pending().await,
    }
}

/// A request from outside while tenure runs.
enum Request {
    /// Stop (SIGTERM, SIGINT, SIGHUP).
    Stop(Termination),
    /// Step down and stay a candidate (SIGUSR1).
    Resign,
}

/// Where requests come from: signals in tenure, a script in tests.
trait Requests {
    /// The next request.
    fn next(&mut self) -> impl Future<Output = Request>;
}

/// The requests a running `tenure run` answers: termination signals and SIGUSR1.
struct SignalRequests {
    signals: TerminationSignals,
    resigns: ResignRequests,
}

impl Requests for SignalRequests {
    async fn next(&mut self) -> Request {
        tokio::select! {
            termination = self.signals.recv() => Request::Stop(termination),
            () = self.resigns.recv() => Request::Resign,
        }
    }
}

/// Runs the command until it exits, its tenure is over (ended, or past its self-fencing
/// deadline on this clock however late the elector says so), or a request comes; then stops it
/// (SIGTERM, SIGKILL at the first of the grace period, the kill deadline `bound` after the
/// self-fencing deadline, and a second request to stop). Returns why and the command's status.
async fn supervise<C: CommandControl>(
    command: &mut C,
    tenure: &Tenure,
    grace: Duration,
    bound: Duration,
    requests: &mut impl Requests,
    silence: impl Future<Output = ()>,
) -> std::io::Result<(Ending, ExitStatus)> {
    let ending = tokio::select! {
        status = command.wait() => return Ok((Ending::Exited, status?)),
        () = fencing::lapsed(tenure) => Ending::LostLeadership,
        () = silence => Ending::GiveWay,
        request = requests.next() => match request {
            Request::Stop(termination) => Ending::Terminated(termination),
            Request::Resign => Ending::Resign,
        },
    };
    let term = tenure.term().0;
    let grace_text = humantime::format_duration(grace);
    match ending {
        Ending::LostLeadership => tracing::error!(term, grace = %grace_text, "lost leadership; stopping the command"),
        Ending::GiveWay => tracing::warn!(
            term,
            grace = %grace_text,
            "giving way: the command's --probe has not succeeded for --progress-timeout; stopping the command and stepping down"
        ),
        Ending::Terminated(termination) => {
            tracing::info!(signal = termination.name, grace = %grace_text, "stopping the command")
        }
        _ => tracing::info!(term, grace = %grace_text, "SIGUSR1: stepping down; stopping the command"),
    }
    // A termination signal while the command stops hurries the stop (SIGKILL at once) and, after
    // a loss, a resign or giving way, turns the ending into a termination: tenure exits instead
    // of campaigning again.
    let mut asked_to_stop = None;
    let hurry = async {
        loop {
            if let Request::Stop(termination) = requests.next().await {
                asked_to_stop = Some(termination);
                return;
            }
        }
    };
    let (status, killed) = fencing::stop(command, grace, fencing::kill_deadline(tenure, bound), hurry).await?;
    let ending = match (ending, asked_to_stop) {
        (Ending::Terminated(first), _) => Ending::Terminated(first),
        (_, Some(termination)) => Ending::Terminated(termination),
        (ending, None) => ending,
    };
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
    Ok((ending, status))
}

/// The probe of --probe and --progress-timeout, checked before anything starts: a silence shorter
/// than one renew interval, or a probe that runs less often than that silence allows, is refused.
fn checked_probe(args: &RunArgs, timing: &tenure::Timing) -> Result<Option<Probe>, CliError> {
    let (Some(command), Some(allowed_silence)) = (args.probe.clone(), args.progress_timeout) else { return Ok(None) };
    if allowed_silence < timing.retry_period {
        return Err(CliError::SilenceTooShort { silence: allowed_silence, renew_interval: timing.retry_period });
    }
    let every = args.probe_every.unwrap_or(allowed_silence / 4);
    if every.is_zero() || every > allowed_silence {
        return Err(CliError::ProbeTooRare { every, silence: allowed_silence });
    }
    Ok(Some(Probe { command, every, allowed_silence }))
}

/// Releases the lock (if held) and stops the elector, logging a failed release, with the
/// backend's own steps around the release (a Kubernetes lock's last Event, "stopped leading").
async fn release(elector: Elector, ending: Box<dyn CampaignEnd>) {
    let shutdown = async move {
        let released = elector.shutdown().await;
        if let Err(error) = &released {
            tracing::warn!(%error, "could not release the lock");
        }
        released
    };
    let _ = ending.finish(Box::pin(shutdown)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::tests::{silent_tenure, ttl_2s, Stubborn};
    use crate::fencing::{checked_grace, kill_bound};

    /// Nobody asks anything.
    struct Silence;

    impl Requests for Silence {
        async fn next(&mut self) -> Request {
            std::future::pending().await
        }
    }

    /// Asks nothing until the command is being stopped, then to terminate (SIGTERM).
    struct TerminateWhileStopping(u32);

    impl Requests for TerminateWhileStopping {
        async fn next(&mut self) -> Request {
            self.0 += 1;
            if self.0 == 1 {
                std::future::pending::<()>().await;
            }
            Request::Stop(crate::signals::Termination { signal: libc::SIGTERM, name: "SIGTERM" })
        }
    }

    /// A SIGTERM that arrives while the command is stopped after a lost tenure (or a coordinated
    /// handover) is a termination, not only a hurry: tenure exits instead of campaigning again.
    #[tokio::test(start_paused = true)]
    async fn a_termination_while_the_command_stops_after_a_loss_ends_tenure_run() {
        let timing = ttl_2s();
        let bound = kill_bound(&timing);
        let grace = checked_grace(Some(bound), &timing).unwrap();
        let (publisher, tenure) = silent_tenure(timing.renew_deadline);
        let mut command = Stubborn::default();
        let never = std::future::pending();
        let mut requests = TerminateWhileStopping(0);
        let (ending, _) = supervise(&mut command, &tenure, grace, bound, &mut requests, never).await.unwrap();
        assert!(matches!(ending, Ending::Terminated(t) if t.signal == libc::SIGTERM));
        assert!(command.killed_at.is_some(), "the second request hurries the stop");
        drop(publisher);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapse_the_elector_never_reports_stops_the_command_at_the_deadline_and_kills_it_in_time() {
        let timing = ttl_2s();
        let bound = kill_bound(&timing);
        let grace = checked_grace(Some(bound), &timing).unwrap();
        // The elector is stuck (a store call that hangs): it never ends the tenure.
        let (publisher, tenure) = silent_tenure(timing.renew_deadline);
        let fence = tenure.valid_until();
        let mut command = Stubborn::default();
        let never = std::future::pending();
        let (ending, _) = supervise(&mut command, &tenure, grace, bound, &mut Silence, never).await.unwrap();
        assert!(matches!(ending, Ending::LostLeadership));
        assert_eq!(command.terminated_at, Some(fence), "SIGTERM at the self-fencing deadline");
        let others_may_lead = fence + (timing.lease_duration - timing.renew_deadline);
        let killed = command.killed_at.expect("killed");
        assert!(killed <= fence + bound && killed < others_may_lead, "SIGKILL {:?} after the deadline", killed - fence);
        drop(publisher);
    }
}
