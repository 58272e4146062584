//! A log that cannot be written loses log lines, nothing else: tenure keeps its election, stops
//! gracefully and releases the lock whether standard error is full, closed, or never read.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use common::{file_url, wait_until, without_cluster, TempDir, TENURE};
use tenure::locks::file::FileLock;
use tenure::{LeaderElectionRecord, RecordLock};

/// The record in the lock file, `None` before there is one.
fn record_of(lock_path: &Path) -> Option<LeaderElectionRecord> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { FileLock::open(lock_path).ok()?.get().await.ok()??.record.ok() })
}

/// The holder named in the lock file, `""` after a release, `None` before any record.
fn holder_of(lock_path: &Path) -> Option<String> {
    record_of(lock_path).map(|record| record.holder_identity)
}

/// Waits until `id` holds the lock and has renewed it `renews` times since first seen.
fn wait_for_renews(lock_path: &Path, id: &str, renews: usize) {
    let mut seen = Vec::new();
    let renewed = wait_until(Duration::from_secs(10), || {
        let record = record_of(lock_path).filter(|record| record.holder_identity == id)?;
        if seen.last() != Some(&record.renew_time) {
            seen.push(record.renew_time);
        }
        (seen.len() > renews).then_some(())
    });
    assert!(renewed.is_some(), "{id} did not lead and renew {renews} times");
}

/// A `tenure` process that is killed if the test ends before it exits.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl std::ops::Deref for Started {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Started {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn start(args: &[&str], stderr: Stdio) -> Started {
    Started(
        without_cluster(Command::new(TENURE).args(args))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start tenure"),
    )
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, signal) };
}

fn exit_code(child: &mut Child) -> i32 {
    let status = wait_until(Duration::from_secs(10), || child.try_wait().unwrap()).expect("tenure exits");
    status.code().unwrap_or_else(|| panic!("tenure ended by {status:?}"))
}

/// Reads standard error until a line containing `needle`, then closes the pipe (the log reader
/// dies).
fn read_until_then_close(stderr: ChildStderr, needle: &str) {
    let mut lines = BufReader::new(stderr).lines();
    let found = lines.by_ref().map_while(Result::ok).any(|line| line.contains(needle));
    assert!(found, "no log line with {needle:?}");
}

fn elect_args(lock_url: &str) -> Vec<&str> {
    vec!["elect", "--election", "e", "--id", "a", "--lock", lock_url, "--ttl", "2s"]
}

#[test]
fn elect_with_standard_error_on_a_full_device_leads_and_releases_on_sigterm() {
    let dir = TempDir::new("log-full");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    let mut tenure = start(&elect_args(&lock_url), Stdio::from(File::create("/dev/full").unwrap()));
    wait_for_renews(&lock_path, "a", 3);
    assert!(tenure.try_wait().unwrap().is_none(), "tenure died while its log could not be written");
    signal(&tenure, libc::SIGTERM);
    assert_eq!(exit_code(&mut tenure), 0);
    assert_eq!(holder_of(&lock_path).as_deref(), Some(""), "the lock was not released");
}

#[test]
fn elect_keeps_leading_after_its_log_reader_died() {
    let dir = TempDir::new("log-closed");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    let mut tenure = start(&elect_args(&lock_url), Stdio::piped());
    read_until_then_close(tenure.stderr.take().unwrap(), "started leading");
    // The next log lines (none are due while it leads quietly) must not matter either: SIGTERM
    // makes it log "stopping" into the closed pipe.
    signal(&tenure, libc::SIGTERM);
    assert_eq!(exit_code(&mut tenure), 0);
    assert_eq!(holder_of(&lock_path).as_deref(), Some(""), "the lock was not released");
}

#[test]
fn run_with_a_dead_log_reader_gives_its_command_the_grace_period_and_releases_the_lock() {
    let dir = TempDir::new("log-run");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    // The command's own standard error goes elsewhere: the shell reports its killed `sleep` on
    // it, and would die of SIGPIPE on the dead pipe, which is the command's business.
    let ready = dir.join("ready");
    let script =
        format!("exec 2>/dev/null; trap 'exit 3' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut args = elect_args(&lock_url);
    args[0] = "run";
    args.extend(["--", "sh", "-c", &script]);
    let mut tenure = start(&args, Stdio::piped());
    read_until_then_close(tenure.stderr.take().unwrap(), "started the command");
    wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command is ready");
    signal(&tenure, libc::SIGTERM);
    assert_eq!(exit_code(&mut tenure), 3, "the command did not get to handle SIGTERM");
    assert_eq!(holder_of(&lock_path).as_deref(), Some(""), "the lock was not released");
}

/// A pipe of the smallest capacity the kernel allows (one page); returns (read end, write end).
fn small_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array; fcntl only changes the capacity.
    unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
        libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096);
        (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1]))
    }
}

/// How many bytes wait in a pipe.
fn pending_bytes(read_end: &std::os::fd::OwnedFd) -> usize {
    use std::os::fd::AsRawFd;
    let mut pending: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    unsafe { libc::ioctl(read_end.as_raw_fd(), libc::FIONREAD, &mut pending) };
    usize::try_from(pending).unwrap_or(0)
}

#[test]
fn a_log_nobody_reads_does_not_stop_a_follower_from_taking_over() {
    let dir = TempDir::new("log-unread");
    let lock_path = dir.join("lock");
    let lock_url = file_url(&lock_path);
    let mut a = start(&elect_args(&lock_url), Stdio::null());
    wait_for_renews(&lock_path, "a", 1);
    let (read_end, write_end) = small_pipe();
    let mut b_args = elect_args(&lock_url);
    b_args[4] = "b";
    let mut b = start(&b_args, Stdio::from(write_end));
    // Its first log line ("campaigning") comes after its signal handlers are installed.
    wait_until(Duration::from_secs(10), || (pending_bytes(&read_end) > 0).then_some(())).expect("b logs");
    // Each SIGUSR1 to a follower logs a line; nobody reads them, so the pipe fills up.
    let full = wait_until(Duration::from_secs(10), || {
        signal(&b, libc::SIGUSR1);
        (pending_bytes(&read_end) > 4096 - 200).then_some(())
    });
    assert!(full.is_some(), "the log pipe did not fill up ({} bytes)", pending_bytes(&read_end));
    signal(&a, libc::SIGTERM);
    assert_eq!(exit_code(&mut a), 0);
    wait_for_renews(&lock_path, "b", 2);
    signal(&b, libc::SIGTERM);
    assert_eq!(exit_code(&mut b), 0);
    assert_eq!(holder_of(&lock_path).as_deref(), Some(""), "b did not release the lock");
    drop(read_end);
}
