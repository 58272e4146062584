//! Child processes the harness starts (candidates, stores) and the signals it sends them.
//!
//! Why a module: hygiene. Every child runs in its own process group (so a freeze or a kill
//! reaches everything it started), dies with the harness (`PR_SET_PDEATHSIG`, also on a panic
//! or a SIGKILL of the harness), and is killed and reaped when its guard is dropped.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::clock::{now, Deadline};
use crate::ChaosError;

/// A started child process; killed (with its whole process group) when dropped.
pub struct Process {
    /// A name for messages.
    pub name: String,
    child: Child,
    reaped: bool,
}

impl Process {
    /// Starts `command` in its own process group, tied to the harness's life, with its output
    /// appended to `log`.
    pub fn start(name: &str, command: &mut Command, log: &Path) -> Result<Process, ChaosError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| ChaosError::Io(format!("cannot open {}: {e}", log.display())))?;
        let err = file.try_clone().map_err(|e| ChaosError::Io(e.to_string()))?;
        command.stdin(Stdio::null()).stdout(file).stderr(err).process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| ChaosError::Start(format!("{name}: {e}")))?;
        Ok(Process { name: name.to_owned(), child, reaped: false })
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `signal` to the process alone.
    pub fn signal(&self, signal: Signal) {
        let _ = kill(Pid::from_raw(self.pid()), signal);
    }

    /// Sends `signal` to the process group and to the process groups of its children (what
    /// `tenure run` starts runs in a group of its own): all of what the process runs, as a frozen
    /// or killed container would be.
    pub fn signal_all(&self, signal: Signal) {
        let _ = killpg(Pid::from_raw(self.pid()), signal);
        for child in children(self.pid()) {
            let _ = killpg(Pid::from_raw(child), signal);
        }
    }

    /// Whether the process still runs (reaps it if it exited).
    pub fn running(&mut self) -> bool {
        !self.reaped && matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Deadline::after(limit);
        while self.running() {
            if deadline.passed() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.reaped = true;
        true
    }

    /// Kills the process group (and its children's) and reaps the process.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        self.signal_all(Signal::SIGCONT);
        self.signal_all(Signal::SIGKILL);
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The children of `pid`, from `/proc` (all of its threads).
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            found.extend(text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    found
}

/// A free TCP port on 127.0.0.1 (the kernel's choice; it may be taken again before use, which
/// the callers notice as a start failure).
pub fn free_port() -> Result<u16, ChaosError> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| ChaosError::Io(format!("no free port: {e}")))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| ChaosError::Io(e.to_string()))
}

/// Polls `probe` every few milliseconds until it is true or `limit` passed; false on timeout.
pub fn wait_for(limit: Duration, mut probe: impl FnMut() -> bool) -> bool {
    let deadline = Deadline::after(limit);
    loop {
        if probe() {
            return true;
        }
        if deadline.passed() || crate::interrupted() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Seconds since an arbitrary start, for messages.
pub fn stamp() -> String {
    format!("{:.3}", now())
}
