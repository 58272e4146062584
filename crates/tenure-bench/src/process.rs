//! Child processes that cannot outlive the benchmark.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A running child process, killed (SIGKILL) and reaped when dropped unless it has already
/// exited, also while a panic unwinds.
///
/// Why: a benchmark that fails half-way must not leave `tenure elect` processes running on a
/// machine shared with other engineers, nor zombies behind.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    name: String,
    log: Option<PathBuf>,
}

impl ChildGuard {
    /// Starts `command`; `name` identifies the child in messages, `log` is where its standard
    /// error goes (shown by [`ChildGuard::log_tail`] when something goes wrong).
    pub fn spawn(name: &str, command: &mut Command, log: Option<&Path>) -> io::Result<ChildGuard> {
        let child = command.spawn()?;
        Ok(ChildGuard { child, name: name.to_owned(), log: log.map(Path::to_owned) })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's standard output, if it was piped and not taken yet (to read it on a thread).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: Signal) -> nix::Result<()> {
        let pid = i32::try_from(self.child.id()).map_err(|_| nix::Error::ESRCH)?;
        kill(Pid::from_raw(pid), signal)
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs.
    pub fn try_status(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits up to `limit` for the child to exit, polling every millisecond.
    pub fn wait_timeout(&mut self, limit: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill_and_reap(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.child.kill()?;
        self.child.wait()
    }

    /// The last `lines` lines of the child's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let Some(log) = &self.log else { return String::from("(no log)") };
        match std::fs::read_to_string(log) {
            Ok(text) => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(error) => format!("(cannot read {}: {error})", log.display()),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(error) = self.kill_and_reap() {
            eprintln!("warning: could not stop child {} (pid {}): {error}", self.name, self.child.id());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_kills_and_reaps() {
        let mut command = Command::new("sleep");
        command.arg("60");
        let guard = ChildGuard::spawn("sleep", &mut command, None).expect("spawn sleep");
        let pid = guard.pid();
        drop(guard);
        // Reaped: the pid no longer names our child (kill reports ESRCH or a reused pid).
        let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!status.contains("(sleep)"), "{status}");
    }

    #[test]
    fn waits_for_an_exit() {
        let mut command = Command::new("true");
        let mut guard = ChildGuard::spawn("true", &mut command, None).expect("spawn true");
        let status = guard.wait_timeout(Duration::from_secs(10)).expect("wait").expect("exited");
        assert!(status.success());
    }
}
