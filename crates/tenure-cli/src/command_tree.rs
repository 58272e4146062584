//! `tenure run`'s handle on its command: the whole process tree the command starts, held by a
//! supervisor process ([`crate::supervisor`]) that kills it when asked or when tenure dies.
//!
//! Why a tree and not a child: the command's own process is only the start of the work (a shell
//! and its pipeline, a server and its workers, a daemon that detached); "the command is dead"
//! must mean all of it, or another leader's run overlaps this one.

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::containment::Cgroup;
use crate::fencing::CommandControl;
use crate::supervisor::CONTROL_FD;

/// How long tenure waits for a cgroup to empty after killing it itself (the supervisor died).
const CGROUP_EMPTY_WAIT: Duration = Duration::from_secs(1);

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The command does not exist (exit status 127, as shells report it).
    #[error("command not found: {0}")]
    NotFound(io::Error),
    /// The command exists but cannot be executed (exit status 126).
    #[error("cannot execute the command: {0}")]
    CannotExecute(io::Error),
    /// The supervisor process could not be started or did not answer.
    #[error("cannot start the supervisor process: {0}")]
    Supervisor(io::Error),
}

/// How the command's processes are held together, as the supervisor reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup: every process the command starts, whatever it does with sessions.
    Cgroup(PathBuf),
    /// The command's process group and the supervisor's descendants; the reason no cgroup was
    /// used.
    ProcessGroup(String),
}

/// What the supervisor says after the start.
#[derive(Debug, Clone, Copy)]
enum Report {
    /// The whole tree is gone: the command's status and how many processes it had left behind.
    Exited(ExitStatus, usize),
    /// The supervisor went away without a report.
    Lost,
}

/// A running command tree.
pub struct CommandTree {
    supervisor: tokio::process::Child,
    control: OwnedWriteHalf,
    reports: mpsc::Receiver<Report>,
    received: Option<Report>,
    pid: Pid,
    containment: Containment,
    ended: Option<(ExitStatus, usize)>,
}

/// Options of the start.
#[derive(Debug, Clone, Default)]
pub struct TreeOptions {
    /// Never use a cgroup (`tenure run --no-cgroup`).
    pub no_cgroup: bool,
    /// Variables added to the command's environment.
    pub environment: Vec<(String, String)>,
}

impl CommandTree {
    /// Starts `command` (program and arguments) under a supervisor; returns once the command
    /// runs, or why it could not start.
    pub async fn start(command: &[OsString], options: &TreeOptions) -> Result<CommandTree, StartError> {
        let supervisor_error = StartError::Supervisor;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(supervisor_error)?;
        let theirs_fd = theirs.as_raw_fd();
        let mut supervisor = std::process::Command::new("/proc/self/exe");
        supervisor.arg0("tenure").arg("supervise");
        if options.no_cgroup {
            supervisor.arg("--no-cgroup");
        }
        supervisor.arg("--cgroup-name").arg(format!("tenure-run-{}", std::process::id()));
        supervisor.arg("--").args(command).envs(options.environment.iter().map(|(k, v)| (k, v)));
        // Its own process group: a Ctrl-C meant for tenure must not reach it (tenure decides).
        supervisor.process_group(0);
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (dup2, fcntl).
        unsafe {
            supervisor.pre_exec(move || {
                if theirs_fd == CONTROL_FD {
                    // dup2 onto itself keeps close-on-exec set: clear it instead.
                    if libc::fcntl(CONTROL_FD, libc::F_SETFD, 0) == -1 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(theirs_fd, CONTROL_FD) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let supervisor = tokio::process::Command::from(supervisor).spawn().map_err(supervisor_error)?;
        drop(theirs);
        ours.set_nonblocking(true).map_err(supervisor_error)?;
        let (read_half, control) = UnixStream::from_std(ours).map_err(supervisor_error)?.into_split();
        let mut lines = BufReader::new(read_half).lines();

        let first = lines.next_line().await.map_err(supervisor_error)?;
        let (pid, containment) = match first.as_deref().map(|line| line.split_once(' ')) {
            Some(Some(("started", rest))) => parse_started(rest).ok_or_else(|| {
                StartError::Supervisor(io::Error::other(format!("unexpected answer {rest:?} from the supervisor")))
            })?,
            Some(Some(("failed", errno))) => {
                let error = io::Error::from_raw_os_error(errno.trim().parse().unwrap_or(libc::EIO));
                return Err(if error.kind() == io::ErrorKind::NotFound {
                    StartError::NotFound(error)
                } else {
                    StartError::CannotExecute(error)
                });
            }
            _ => return Err(StartError::Supervisor(io::Error::other("the supervisor ended without starting it"))),
        };

        let (sender, reports) = mpsc::channel(1);
        tokio::spawn(async move {
            let line = lines.next_line().await.ok().flatten();
            let exited = line.and_then(|line| parse_exited(&line));
            let report = exited.map_or(Report::Lost, |(status, left)| Report::Exited(status, left));
            let _ = sender.send(report).await;
        });
        Ok(CommandTree { supervisor, control, reports, received: None, pid, containment, ended: None })
    }

    /// The command's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// How the tree is held together.
    pub fn containment(&self) -> &Containment {
        &self.containment
    }

    /// How many processes the command left running when it exited by itself (they were killed).
    pub fn leftovers(&self) -> usize {
        self.ended.map_or(0, |(_, left)| left)
    }

    async fn send(&mut self, request: &str) {
        // A failure means the supervisor is gone; `wait` reports that.
        let _ = self.control.write_all(request.as_bytes()).await;
    }

    /// The last resort when the supervisor died: kill what tenure itself can reach, and remove
    /// the cgroup once the kernel has emptied it (waiting at most [`CGROUP_EMPTY_WAIT`]).
    async fn kill_without_supervisor(&self) {
        let _ = killpg(self.pid, Signal::SIGKILL);
        let Containment::Cgroup(path) = &self.containment else { return };
        let Some(cgroup) = Cgroup::at(path) else { return };
        cgroup.signal(Signal::SIGKILL);
        let give_up = tokio::time::Instant::now() + CGROUP_EMPTY_WAIT;
        while !cgroup.members().is_empty() && tokio::time::Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cgroup.remove();
    }
}

impl CommandControl for CommandTree {
    async fn terminate(&mut self) {
        self.send("term\n").await;
    }

    async fn kill(&mut self) {
        self.send("kill\n").await;
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some((status, _)) = self.ended {
            return Ok(status);
        }
        let report = match self.received {
            Some(report) => report,
            None => self.reports.recv().await.unwrap_or(Report::Lost),
        };
        // Kept until the supervisor is reaped, in case this future is cancelled meanwhile.
        self.received = Some(report);
        // The supervisor exits right after its report (or is gone already): reap it.
        let _ = self.supervisor.wait().await;
        match report {
            Report::Exited(status, left) => {
                self.ended = Some((status, left));
                Ok(status)
            }
            Report::Lost => {
                self.kill_without_supervisor().await;
                Err(io::Error::other("the supervisor process died; killed what was left of the command"))
            }
        }
    }
}

fn parse_started(rest: &str) -> Option<(Pid, Containment)> {
    let mut words = rest.splitn(3, ' ');
    let pid = Pid::from_raw(words.next()?.parse().ok()?);
    let kind = words.next()?;
    let detail = words.next().unwrap_or_default().to_owned();
    let containment = match kind {
        "cgroup" => Containment::Cgroup(PathBuf::from(detail)),
        "group" => Containment::ProcessGroup(detail),
        _ => return None,
    };
    Some((pid, containment))
}

fn parse_exited(line: &str) -> Option<(ExitStatus, usize)> {
    let mut words = line.strip_prefix("exited ")?.split(' ');
    let status = ExitStatus::from_raw(words.next()?.parse().ok()?);
    let leftovers = words.next()?.parse().ok()?;
    Some((status, leftovers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supervisor_reports_are_parsed() {
        assert_eq!(
            parse_started("42 cgroup /sys/fs/cgroup/x y"),
            Some((Pid::from_raw(42), Containment::Cgroup("/sys/fs/cgroup/x y".into())))
        );
        assert_eq!(
            parse_started("7 group no cgroup v2"),
            Some((Pid::from_raw(7), Containment::ProcessGroup("no cgroup v2".into())))
        );
        assert_eq!(parse_started("x group"), None);
        assert_eq!(parse_exited("exited 768 2"), Some((ExitStatus::from_raw(3 << 8), 2)));
        assert_eq!(parse_exited("exited"), None);
    }
}
