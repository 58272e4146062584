//! `tenure supervise` (hidden): the small process between `tenure run` and its command, which
//! outlives tenure just long enough to kill everything the command started.
//!
//! Why a process of its own: if tenure is killed (SIGKILL, the OOM killer), its lease runs out
//! and another instance starts the command; nothing in tenure can act any more, and
//! `PR_SET_PDEATHSIG` only reaches tenure's direct child, not the grandchildren. The supervisor
//! notices tenure's death as the end of their control socket, and then kills the whole tree:
//!
//! - the command runs in a new cgroup (v2) when one can be made below tenure's own, so that
//!   processes that call `setsid` or double-fork are still found, and `cgroup.kill` ends them
//!   all at once;
//! - otherwise in its own process group, with the supervisor as a child subreaper
//!   (`PR_SET_CHILD_SUBREAPER`): orphans are re-parented to the supervisor, not to init, so every
//!   process the command started remains a descendant that can be found and killed.
//!
//! The protocol on the control socket (file descriptor 3), one line per message:
//!
//! - from tenure: `term` (SIGTERM to the whole tree), `kill` (SIGKILL to the whole tree, until
//!   it is gone); end of file: tenure is gone, kill the tree and exit.
//! - to tenure: `started <pid> cgroup <path>` or `started <pid> group <why no cgroup>`, or
//!   `failed <errno>` when the command cannot be started; at the end `exited <wait status>
//!   <leftovers>`, written only once no process of the tree is left (after the command's own
//!   process ended, whatever it left behind is killed and counted as leftovers).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgid, Pid};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};

use crate::containment::{descendants, Cgroup};
use crate::{error::CliError, exit, output};

/// The file descriptor on which the supervisor finds its control socket.
pub const CONTROL_FD: RawFd = 3;

/// How often the supervisor repeats SIGKILL while processes of the tree are still there (each
/// round also catches processes forked while the previous one was delivered).
const KILL_ROUND: Duration = Duration::from_millis(2);

/// Arguments of the hidden `tenure supervise`, started only by `tenure run`.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// Run the command without a cgroup even where one can be made.
    #[arg(long)]
    no_cgroup: bool,

    /// The name of the cgroup to create below tenure's own (the supervisor's pid is appended).
    #[arg(long, default_value = "tenure-run")]
    cgroup_name: String,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// How the command's processes are held together.
enum Tree {
    Cgroup(Cgroup),
    Group,
}

/// Runs the supervisor; returns its exit status (0 once the tree is gone).
pub async fn supervise(args: SuperviseArgs) -> Result<u8, CliError> {
    let control = control_socket().map_err(CliError::NotSupervised)?;
    let (read_half, mut write_half) = control.into_split();
    let mut lines = BufReader::new(read_half).lines();
    // SAFETY: prctl with these arguments has no memory-safety preconditions.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } == -1 {
        return Err(CliError::io("become a subreaper")(io::Error::last_os_error()));
    }
    // Installed before the command starts, so that no exit goes unnoticed.
    let mut children = signal(SignalKind::child()).map_err(CliError::io("watch child processes"))?;
    // Caught and left unanswered: a service manager that signals every process of tenure's
    // cgroup at once (systemd's default) must not kill the supervisor, which would kill the
    // command without its grace period; tenure decides, and the supervisor acts when tenure
    // asks or is gone. (Caught, not ignored, so that the command starts with the defaults.)
    let _caught = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::hangup(), SignalKind::quit()]
        .into_iter()
        .map(signal)
        .collect::<io::Result<Vec<_>>>()
        .map_err(CliError::io("install signal handlers"))?;

    let (mut tree, mut why_no_cgroup) = if args.no_cgroup {
        (Tree::Group, "disabled by --no-cgroup".to_owned())
    } else {
        // Named after this process too: unique even when one tenure runs its command again. The
        // random part keeps apart supervisors of other PID namespaces (containers that are each
        // PID 1) under one parent cgroup, where the pids alone would meet and the second would
        // run its command without a cgroup.
        let nonce: u32 = rand::random();
        match Cgroup::create(&format!("{}-{}-{nonce:08x}", args.cgroup_name, std::process::id())) {
            Ok(cgroup) => (Tree::Cgroup(cgroup), String::new()),
            Err(error) => (Tree::Group, error.to_string()),
        }
    };
    let mut spawned = spawn(&args.command, &tree);
    if let (Err(error), Tree::Cgroup(_)) = (&spawned, &tree) {
        // Entering the cgroup may have failed between fork and exec (and an exec failure looks
        // the same from here): try once more without it, so that only the command's own
        // failure is reported.
        why_no_cgroup = format!("the command could not start in a cgroup ({error})");
        remove(&tree);
        tree = Tree::Group;
        spawned = spawn(&args.command, &tree);
    }
    let pid = match spawned {
        Ok(pid) => pid,
        Err(error) => {
            let _ = write_half.write_all(format!("failed {}\n", error.raw_os_error().unwrap_or(0)).as_bytes()).await;
            remove(&tree);
            return Ok(exit::SUCCESS);
        }
    };
    let started = match &tree {
        Tree::Cgroup(cgroup) => format!("started {pid} cgroup {}\n", cgroup.path().display()),
        Tree::Group => format!("started {pid} group {why_no_cgroup}\n"),
    };
    // If tenure is already gone, the next read says so and the tree is killed.
    let _ = write_half.write_all(started.as_bytes()).await;

    let mut status: Option<ExitStatus> = None;
    let mut killing = false;
    let mut tenure_gone = false;
    let mut leftovers = 0;
    loop {
        reap(pid, &mut status);
        if status.is_some() && !killing {
            // The command's own process ended: whatever it left running must not outlive it.
            leftovers = members(&tree).len();
            killing = true;
        }
        if killing {
            signal_tree(&tree, pid, Signal::SIGKILL);
            reap(pid, &mut status);
            if status.is_some() && members(&tree).is_empty() {
                break;
            }
        }
        tokio::select! {
            _ = children.recv() => {}
            line = lines.next_line(), if !tenure_gone => match line {
                Ok(Some(line)) if line == "term" => signal_tree(&tree, pid, Signal::SIGTERM),
                Ok(Some(line)) if line == "kill" => killing = true,
                Ok(Some(other)) => output::error_line(&format!("tenure supervise: unknown request {other:?}")),
                // tenure is gone (or closed the socket): nobody may run the command any more.
                Ok(None) | Err(_) => {
                    tenure_gone = true;
                    killing = true;
                }
            },
            () = tokio::time::sleep(KILL_ROUND), if killing => {}
        }
    }
    remove(&tree);
    let raw = status.map_or(0, ExitStatusExt::into_raw);
    let _ = write_half.write_all(format!("exited {raw} {leftovers}\n").as_bytes()).await;
    Ok(exit::SUCCESS)
}

/// The control socket on [`CONTROL_FD`], made close-on-exec so that the command does not get it.
fn control_socket() -> io::Result<UnixStream> {
    // SAFETY: fstat and fcntl only inspect the descriptor.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(CONTROL_FD, &mut stat) == -1 {
            return Err(io::Error::last_os_error());
        }
        if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(io::Error::other("file descriptor 3 is not a socket"));
        }
        if libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: descriptor 3 is a socket (checked above) that nothing else in this process owns.
    let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(CONTROL_FD) };
    socket.set_nonblocking(true)?;
    UnixStream::from_std(socket)
}

/// Starts the command in a process group of its own, in the cgroup if there is one, killed by
/// the kernel if the supervisor dies.
fn spawn(command: &[OsString], tree: &Tree) -> io::Result<Pid> {
    let (program, arguments) = command.split_first().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    let procs = match tree {
        Tree::Cgroup(cgroup) => Some(cgroup.procs_for_entering()?),
        Tree::Group => None,
    };
    let procs_fd = procs.as_ref().map(AsRawFd::as_raw_fd);
    let supervisor = std::process::id();
    let mut command = std::process::Command::new(program);
    command.args(arguments).process_group(0);
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (write, prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // Writing 0 moves the writing process into the cgroup; its children follow.
            if procs_fd.is_some_and(|fd| libc::write(fd, b"0".as_ptr().cast(), 1) != 1) {
                return Err(io::Error::last_os_error());
            }
            crate::child::die_with(supervisor)
        });
    }
    let child = command.spawn()?;
    drop(procs);
    // The child is reaped with waitpid below, not through `child`.
    i32::try_from(child.id()).map(Pid::from_raw).map_err(|_| io::Error::other("child pid out of range"))
}

/// Reaps every exited child (the command, and orphans re-parented to this subreaper), keeping the
/// command's status.
fn reap(command: Pid, status: &mut Option<ExitStatus>) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                *status = Some(ExitStatus::from_raw((code & 0xff) << 8))
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                *status = Some(ExitStatus::from_raw(signal as i32))
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Every living process of the tree: the cgroup's members and the supervisor's descendants.
fn members(tree: &Tree) -> Vec<Pid> {
    let mut pids = descendants(Pid::this());
    if let Tree::Cgroup(cgroup) = tree {
        for pid in cgroup.members() {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Sends `signal` to every process of the tree exactly once: to the command's process group as
/// a whole, then to each member that left the group (`setsid`, `setpgid`).
fn signal_tree(tree: &Tree, command: Pid, signal: Signal) {
    if let (Tree::Cgroup(cgroup), Signal::SIGKILL) = (tree, signal) {
        cgroup.signal(Signal::SIGKILL);
    }
    let _ = killpg(command, signal);
    for pid in members(tree) {
        if getpgid(Some(pid)).ok() != Some(command) {
            let _ = kill(pid, signal);
        }
    }
}

fn remove(tree: &Tree) {
    if let Tree::Cgroup(cgroup) = tree {
        cgroup.remove();
    }
}
