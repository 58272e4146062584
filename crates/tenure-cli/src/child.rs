//! Child processes that must not outlive tenure (the demo's replicas), and how a child's end is
//! reported (shared with `tenure run`, whose command runs under [`crate::command_tree`]).
//!
//! Why this needs care: a replica left running after the demo would keep a lock and a port. So
//! each child gets its own process group (signals reach everything it started), is killed by
//! the kernel if tenure itself dies (`PR_SET_PDEATHSIG`), and is stopped with SIGTERM, then
//! SIGKILL after a bounded grace period.

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::exit;

/// A running child in its own process group.
pub struct SupervisedChild {
    child: Child,
    /// The child's pid, which is also the id of its process group.
    group: Pid,
}

impl SupervisedChild {
    /// Starts `command` in a new process group that dies with tenure.
    pub fn spawn(command: &mut Command) -> io::Result<Self> {
        let parent = std::process::id();
        command.process_group(0);
        // SAFETY: the closure runs between fork and exec; `die_with` is made for that.
        unsafe { command.pre_exec(move || die_with(parent)) };
        let child = command.spawn()?;
        let pid =
            child.id().and_then(|id| i32::try_from(id).ok()).ok_or_else(|| io::Error::other("child has no pid"))?;
        Ok(SupervisedChild { child, group: Pid::from_raw(pid) })
    }

    /// The child's process id.
    pub fn pid(&self) -> i32 {
        self.group.as_raw()
    }

    /// Waits for the child to exit (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Sends `signal` to the child's whole process group. Returns false if nobody was left.
    pub fn signal_group(&self, signal: Signal) -> bool {
        killpg(self.group, signal).is_ok()
    }

    /// Stops the child: SIGTERM to its group, then SIGKILL once `grace` has passed or `hurry`
    /// completes (a second request to stop), whichever comes first.
    pub async fn stop(&mut self, grace: Duration, hurry: impl Future<Output = ()>) -> io::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.signal_group(Signal::SIGTERM);
        tokio::select! {
            status = self.child.wait() => return status,
            _ = tokio::time::sleep(grace) => {
                tracing::warn!(pid = self.pid(), grace = %humantime::format_duration(grace), "command did not stop within the grace period; killing it");
            }
            _ = hurry => {
                tracing::warn!(pid = self.pid(), "asked again to stop; killing the command");
            }
        }
        self.signal_group(Signal::SIGKILL);
        self.child.wait().await
    }
}

/// Between fork and exec (async-signal-safe, allocates nothing): has the kernel kill this child
/// when `parent` dies. Why: if tenure dies without stopping its child (SIGKILL, OOM), its lease
/// runs out and another instance leads; the child must be gone by then.
pub fn die_with(parent: u32) -> io::Result<()> {
    // SAFETY: prctl and getppid take no pointers.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // The parent may have died before the prctl took effect.
    if u32::try_from(unsafe { libc::getppid() }).ok() != Some(parent) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// The exit status tenure passes on for a child's status: its exit code, or `128 + signal` if a
/// signal ended it (the shell convention).
pub fn exit_code_of(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(exit::FAILURE);
    }
    match status.signal() {
        Some(signal) => u8::try_from(128 + signal).unwrap_or(u8::MAX),
        None => exit::FAILURE,
    }
}

/// A readable account of how a child ended, for log lines.
pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("killed by {signal}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        _ => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code_of(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code_of(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(exit_code_of(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(describe_status(ExitStatus::from_raw(libc::SIGKILL)), "killed by SIGKILL");
    }
}
