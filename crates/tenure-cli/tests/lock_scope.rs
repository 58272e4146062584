//! The scope of a file lock is impossible to miss: `run` and `elect` log, before they campaign,
//! the lock file and who shares it (the default file is per user, so two users running the same
//! `--election` on one host each elect their own leader), and say when they create its directory.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{file_url, without_cluster, TempDir, Tenure, TENURE};

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[test]
fn run_on_the_default_lock_logs_the_lock_file_and_that_only_this_user_shares_it() {
    let runtime = TempDir::new("scope-runtime");
    let output = without_cluster(Command::new(TENURE).args(["run", "--election", "samejob", "--", "true"]))
        .env("XDG_RUNTIME_DIR", &runtime.0)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .expect("run tenure");
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{log}");
    let line =
        log.lines().find(|line| line.contains("lock_file=")).unwrap_or_else(|| panic!("no lock_file line:\n{log}"));
    let lock_file = runtime.join("tenure").join("samejob.json");
    assert!(line.contains(&format!("lock_file={}", lock_file.display())), "{line}");
    assert!(line.contains(r#"scope="this user""#), "{line}");
    assert!(line.contains(&format!("private to uid {}", uid())), "{line}");
    assert!(line.contains("another user's candidates with the same --election elect a leader of their own"), "{line}");
    let before_campaign = log.find("lock_file=").unwrap() < log.find("waiting for leadership").unwrap_or(usize::MAX);
    assert!(before_campaign, "the scope comes before the campaign:\n{log}");
}

#[test]
fn elect_on_a_file_in_a_missing_directory_says_it_creates_the_directory_privately() {
    let root = TempDir::new("scope-missing");
    let lock = root.join("not").join("yet").join("job.json");
    let tenure = Tenure::start("a", &["elect", "--election", "job", "--id", "a", "--lock", &file_url(&lock)]);
    let line = tenure.wait_for_log("lock_file=", Duration::from_secs(10));
    assert!(line.contains(&format!("lock_file={}", lock.display())), "{line}");
    assert!(line.contains("cannot be shared across users"), "{line}");
    let created = format!(
        "its directory {} does not exist yet and is created private to uid {}",
        lock.parent().unwrap().display(),
        uid()
    );
    assert!(line.contains(&created), "{line}");
}

#[test]
fn elect_on_the_memory_lock_says_no_other_process_takes_part() {
    let tenure = Tenure::start("a", &["elect", "--election", "job", "--id", "a", "--lock", "memory:"]);
    let line = tenure.wait_for_log(r#"scope="this process""#, Duration::from_secs(10));
    assert!(line.contains("no other process takes part in the election"), "{line}");
}
