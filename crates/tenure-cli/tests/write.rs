//! `tenure write`: a script's write that the lock itself refuses once its tenure is over.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{file_url, run_to_end, TempDir, TENURE};
use tenure::locks::file::FileLock;
use tenure::{LeaderElectionRecord, RecordLock};

/// `tenure write` with `args`, `content` on its standard input: its exit code and standard error.
fn write(args: &[&str], content: &[u8]) -> (i32, String) {
    let mut child = Command::new(TENURE)
        .arg("write")
        .args(args)
        .env_remove("TENURE_TERM")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tenure write");
    child.stdin.take().expect("stdin").write_all(content).expect("write stdin");
    let output = child.wait_with_output().expect("tenure write ends");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The command of `tenure run` writes through the lock with the term it was given.
#[test]
fn a_command_run_by_tenure_run_writes_under_its_term() {
    let dir = TempDir::new("write-run");
    let lock = file_url(&dir.join("lock.json"));
    let target = dir.join("state.json");
    let script = format!(
        "echo '{{\"backup\": 7}}' | {TENURE} write --election nightly --lock \"$TENURE_LOCK\" {}",
        target.display()
    );
    let (code, _, stderr) = run_to_end(&["run", "--election", "nightly", "--lock", &lock, "--ttl", "2s", "--", "sh", "-c", &script]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "{\"backup\": 7}\n");
}

/// Under a term whose tenure is over (another holder, a release), nothing is written, and the
/// exit status (3) says so, distinct from a failure (1) and a usage error (2).
#[test]
fn a_deposed_write_is_refused_with_exit_3_and_nothing_is_written() {
    let dir = TempDir::new("write-deposed");
    let path = dir.join("lock.json");
    let lock_url = file_url(&path);
    let target = dir.join("state.json");
    std::fs::write(&target, "before").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let lock = FileLock::open(&path).unwrap();
    let record = |holder: &str, term| LeaderElectionRecord {
        holder_identity: holder.into(),
        lease_duration_seconds: 15,
        leader_transitions: term,
        ..Default::default()
    };
    let version = runtime.block_on(lock.create(&record("old", 1))).unwrap();
    let target_arg = target.to_str().unwrap();
    let args = ["--election", "e", "--lock", &lock_url, "--term", "1", target_arg];
    assert_eq!(write(&args, b"while leading").0, 0);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "while leading");
    runtime.block_on(lock.update(&version, &record("new", 2))).unwrap();
    let (code, stderr) = write(&args, b"late");
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("deposed") && stderr.contains("\"new\" at term 2") && stderr.contains("nothing was written"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "while leading");
}

#[test]
fn a_write_on_a_lock_that_cannot_fence_it_is_a_usage_error() {
    let dir = TempDir::new("write-memory");
    let target = dir.join("state.json");
    let (code, stderr) = write(&["--election", "e", "--lock", "memory:", "--term", "1", target.to_str().unwrap()], b"x");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("needs a file, etcd or ZooKeeper lock"), "{stderr}");
    assert!(!target.exists());
}
