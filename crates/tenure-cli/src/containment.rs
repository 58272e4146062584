//! Finding and killing every process a command started: a cgroup (v2) where one can be made,
//! and otherwise the command's process group plus every descendant of the supervisor.
//!
//! Why: signalling the command's process group misses whatever left it (`setsid`, a daemon that
//! double-forks), and a command still running after tenure lost the lock is the split brain
//! leader election exists to prevent. A cgroup holds every process the command starts, whatever
//! it does with sessions and groups, and `cgroup.kill` kills them all at once. Without a cgroup,
//! the supervisor is a child subreaper, so everything the command starts stays its descendant
//! (orphans are re-parented to it, not to init) and can be found through `/proc`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Why no cgroup could be used; the command then runs contained by its process group and the
/// supervisor's descendants only.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup v2 hierarchy is mounted (cgroup v1 only, or none visible in a container).
    #[error("no cgroup v2 file system is mounted")]
    NotMounted,
    /// This process's cgroup v2 membership could not be read.
    #[error("cannot tell this process's cgroup: {0}")]
    Membership(String),
    /// The kernel is older than 5.14 and has no `cgroup.kill`.
    #[error("the kernel has no cgroup.kill (Linux 5.14 or later is needed)")]
    NoKill,
    /// The cgroup could not be created or entered in `dir`, typically because this cgroup is not
    /// delegated to this user, or controllers are enabled below it.
    #[error("cannot create a cgroup in {dir}: {source}")]
    Create { dir: PathBuf, source: io::Error },
}

/// A cgroup made for one command: every process the command starts is in it.
#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Creates a new cgroup named `name` below this process's own cgroup v2. Fails when cgroup
    /// v2 is not mounted, the directory is not writable (not delegated to this user, a
    /// read-only mount in a container) or the kernel lacks `cgroup.kill`.
    pub fn create(name: &str) -> Result<Cgroup, CgroupError> {
        let parent = own_cgroup_dir()?;
        let path = parent.join(name);
        fs::create_dir(&path).map_err(|source| CgroupError::Create { dir: parent.clone(), source })?;
        let cgroup = Cgroup { path };
        // (The root cgroup has no cgroup.kill of its own, so look in the new one.)
        if !cgroup.path.join("cgroup.kill").exists() {
            cgroup.remove();
            return Err(CgroupError::NoKill);
        }
        // Entering it needs write access to the parent's cgroup.procs too (the common ancestor of
        // the two cgroups): find out now rather than in the child between fork and exec.
        if let Err(source) = OpenOptions::new().write(true).open(parent.join("cgroup.procs")) {
            cgroup.remove();
            return Err(CgroupError::Create { dir: parent, source });
        }
        Ok(cgroup)
    }

    /// Re-opens a cgroup made by [`Cgroup::create`] from its path (for the process that did not
    /// create it). The path must be a directory with a `cgroup.kill` file.
    pub fn at(path: &Path) -> Option<Cgroup> {
        path.join("cgroup.kill").exists().then(|| Cgroup { path: path.to_owned() })
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its `cgroup.procs`, open for writing: a process that writes `0` to it enters the cgroup.
    /// Opened before a fork so that the child only has to write.
    pub fn procs_for_entering(&self) -> io::Result<File> {
        OpenOptions::new().write(true).open(self.path.join("cgroup.procs"))
    }

    /// The processes in the cgroup now.
    pub fn members(&self) -> Vec<Pid> {
        read_pids(&self.path.join("cgroup.procs"))
    }

    /// Sends `signal` to every process in the cgroup; SIGKILL goes through `cgroup.kill`, which
    /// the kernel applies to all of them at once, including processes being forked.
    pub fn signal(&self, signal: Signal) {
        if signal == Signal::SIGKILL && fs::write(self.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for pid in self.members() {
            let _ = kill(pid, signal);
        }
    }

    /// Removes the (empty) cgroup; a failure only leaves an empty directory behind.
    pub fn remove(&self) {
        let _ = fs::remove_dir(&self.path);
    }
}

/// This process's cgroup v2 directory: the cgroup2 mount point joined with the `0::` line of
/// `/proc/self/cgroup`.
fn own_cgroup_dir() -> Result<PathBuf, CgroupError> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").map_err(|e| CgroupError::Membership(e.to_string()))?;
    // mountinfo: id parent major:minor root mount-point options ... - fstype source options
    let (root, mount_point) = mounts
        .lines()
        .find_map(|line| {
            let (fields, tail) = line.split_once(" - ")?;
            if tail.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut fields = fields.split_whitespace();
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            Some((unescape_mountinfo(root), unescape_mountinfo(mount_point)))
        })
        .ok_or(CgroupError::NotMounted)?;
    let membership = fs::read_to_string("/proc/self/cgroup").map_err(|e| CgroupError::Membership(e.to_string()))?;
    let own = membership
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or_else(|| CgroupError::Membership("no cgroup v2 line in /proc/self/cgroup".to_owned()))?;
    // The mount shows the hierarchy from `root` on; the membership is relative to the top.
    let relative = own.strip_prefix(root.trim_end_matches('/')).ok_or_else(|| {
        CgroupError::Membership(format!("this process's cgroup {own} is outside the mounted part {root}"))
    })?;
    Ok(Path::new(&mount_point).join(relative.trim_start_matches('/')))
}

/// mountinfo escapes spaces, tabs, newlines and backslashes as octal `\NNN`.
fn unescape_mountinfo(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let value = bytes[i + 1..i + 4].iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_pids(path: &Path) -> Vec<Pid> {
    let Ok(text) = fs::read_to_string(path) else { return Vec::new() };
    text.lines().filter_map(|line| line.trim().parse().ok()).map(Pid::from_raw).collect()
}

/// Every living descendant of `root`, found by following parent links in `/proc`. Zombies are
/// left out (they run nothing and only wait to be reaped).
pub fn descendants(root: Pid) -> Vec<Pid> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let mut parents = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else { continue };
        // The command name may contain anything, so parse after its closing parenthesis.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let Some(ppid) = fields.next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        parents.push((pid, ppid, state != "Z" && state != "X"));
    }
    let mut found = vec![root.as_raw()];
    let mut alive = Vec::new();
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        for &(pid, ppid, is_alive) in &parents {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
                if is_alive {
                    alive.push(Pid::from_raw(pid));
                }
            }
        }
        index += 1;
    }
    alive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo(r"/sys/fs/cgroup\040x"), "/sys/fs/cgroup x");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"\"), r"\");
    }

    #[test]
    fn descendants_include_grandchildren_and_not_the_root() {
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 30 & wait"]).spawn().unwrap();
        let me = Pid::this();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let found = loop {
            let found = descendants(me);
            if found.len() >= 2 || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::yield_now();
        };
        assert!(found.contains(&Pid::from_raw(child.id() as i32)), "{found:?}");
        assert!(!found.contains(&me));
        for pid in found {
            let _ = kill(pid, Signal::SIGKILL);
        }
        child.wait().unwrap();
    }
}
