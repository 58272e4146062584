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
use nix::unistd::{getpgid, Pid};

use crate::clock::Deadline;
use crate::ChaosError;

/// The most processes [`Process::signal_all`] walks (a bound on a tree that forks without end).
const MAX_DESCENDANTS: usize = 10_000;

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

    /// Sends `signal` to the process and every descendant, and to each process group one of
    /// them leads: all of what the process runs, as a frozen or killed container would be.
    ///
    /// Why every descendant and not the children only: `tenure run`'s command runs two levels
    /// down (tenure, its supervisor, the command), each in a group of its own; a freeze that
    /// missed it would leave the "frozen" command running all along. The tree is frozen top
    /// down before anything else is sent (each process is stopped before its children are
    /// listed, so it cannot add one unseen, and a parent killed first cannot hand its children
    /// to init unseen); SIGCONT goes top down too, the process itself first.
    pub fn signal_all(&self, signal: Signal) {
        let freeze = (signal != Signal::SIGCONT).then_some(Signal::SIGSTOP);
        let tree = self.tree(freeze);
        if signal != Signal::SIGSTOP {
            for &process in &tree {
                send(process, signal);
            }
        }
    }

    /// The process and its descendants, parents before children, each sent `on_the_way` (if
    /// any) before its children are listed.
    fn tree(&self, on_the_way: Option<Signal>) -> Vec<Pid> {
        let mut tree = Vec::new();
        let mut next = 0;
        tree.push(Pid::from_raw(self.pid()));
        while next < tree.len() && tree.len() <= MAX_DESCENDANTS {
            let process = tree[next];
            next += 1;
            if let Some(signal) = on_the_way {
                send(process, signal);
            }
            tree.extend(children(process.as_raw()).into_iter().map(Pid::from_raw));
        }
        tree
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

/// Sends `signal` to `process`, and to its process group as a whole when it leads one (what it
/// started there that is no longer its descendant).
fn send(process: Pid, signal: Signal) {
    if getpgid(Some(process)) == Ok(process) {
        let _ = killpg(process, signal);
    }
    let _ = kill(process, signal);
}

/// The children of `pid`, from `/proc` (all of its threads).
pub fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let texts = tasks.flatten().filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok());
    texts.flat_map(|text| text.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect::<Vec<_>>()).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The state letter of `pid` in `/proc` (`T` stopped, `Z` zombie), `None` once it is gone.
    fn state(pid: i32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().next()?.chars().next()
    }

    #[test]
    fn a_freeze_reaches_a_grandchild_that_leads_a_process_group_of_its_own() {
        // Shaped as `tenure run` runs: tenure, its supervisor and the command, each leading a
        // process group of its own, the command two levels down.
        let log = std::env::temp_dir().join(format!("tenure-chaos-freeze-{}.log", std::process::id()));
        let mut command = Command::new("sh");
        command.args(["-c", "setsid sh -c 'setsid sleep 60 & wait' & wait"]);
        let mut process = Process::start("tree", &mut command, &log).unwrap();
        let mut tree = Vec::new();
        let leads_its_group = |pid: i32| getpgid(Some(Pid::from_raw(pid))) == Ok(Pid::from_raw(pid));
        let found = wait_for(Duration::from_secs(5), || {
            let middle = children(process.pid());
            tree = middle.iter().copied().chain(middle.iter().flat_map(|&p| children(p))).collect();
            tree.len() == 2 && tree.iter().all(|&pid| leads_its_group(pid))
        });
        assert!(found, "the tree did not start: {tree:?}");
        let grandchild = tree[1];

        process.signal_all(Signal::SIGSTOP);
        let everyone = [process.pid(), tree[0], grandchild];
        let frozen = wait_for(Duration::from_secs(5), || everyone.iter().all(|&p| state(p) == Some('T')));
        assert!(frozen, "not all frozen: {:?}", everyone.map(state));

        process.signal_all(Signal::SIGCONT);
        let thawed = wait_for(Duration::from_secs(5), || everyone.iter().all(|&p| state(p) != Some('T')));
        assert!(thawed, "not all thawed: {:?}", everyone.map(state));

        process.kill();
        let gone = wait_for(Duration::from_secs(5), || matches!(state(grandchild), None | Some('Z')));
        assert!(gone, "the grandchild outlived the kill: {:?}", state(grandchild));
        let _ = std::fs::remove_file(log);
    }
}
