//! `tenure run -- CMD`: the command runs only on the leader, its status is passed on, signals are
//! forwarded, and losing leadership kills it and exits with 75.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run_to_end, Tenure, TempDir};

const EXIT_LOST_LEADERSHIP: i32 = 75;

#[test]
fn exit_status_of_the_command_is_passed_on() {
    let (code, _, stderr) = run_to_end(&["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "sh", "-c", "exit 7"]);
    assert_eq!(code, 7, "{stderr}");
    let (code, _, stderr) = run_to_end(&["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(code, 128 + libc::SIGKILL, "{stderr}");
}

#[test]
fn command_gets_the_term_and_election_in_its_environment() {
    let dir = TempDir::new("run-env");
    let out = dir.join("env");
    let script = format!("echo \"$TENURE_TERM $TENURE_ELECTION\" > {}", out.display());
    let (code, _, stderr) = run_to_end(&["run", "--election", "nightly", "--lock", "memory:", "--ttl", "2s", "--", "sh", "-c", &script]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read_to_string(out).unwrap(), "1 nightly\n");
}

#[test]
fn a_command_that_cannot_be_found_exits_127() {
    let (code, _, stderr) = run_to_end(&["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "/nonexistent/command"]);
    assert_eq!(code, 127, "{stderr}");
    assert!(stderr.contains("cannot start the command"), "{stderr}");
}

#[test]
fn sigterm_is_forwarded_and_the_commands_status_is_passed_on() {
    let dir = TempDir::new("run-sigterm");
    let ready = dir.join("ready");
    let script = format!("trap 'exit 3' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut tenure = Tenure::start("runner", &["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "sh", "-c", &script]);
    common::wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 3, "{}", tenure.log());
    assert!(tenure.log().contains("stopping the command"), "{}", tenure.log());
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = TempDir::new("run-grace");
    let ready = dir.join("ready");
    let script = format!("trap '' TERM; touch {}; while :; do sleep 0.05; done", ready.display());
    let mut tenure = Tenure::start(
        "runner",
        &["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--grace", "200ms", "--", "sh", "-c", &script],
    );
    common::wait_until(Duration::from_secs(10), || ready.exists().then_some(())).expect("the command started");
    tenure.signal(libc::SIGINT);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 128 + libc::SIGKILL, "{}", tenure.log());
    assert!(tenure.log().contains("did not stop within the grace period"), "{}", tenure.log());
}

#[test]
fn nothing_the_command_started_survives_it() {
    let dir = TempDir::new("run-leftovers");
    let pid_file = dir.join("pid");
    // The shell leaves a background sleep behind and exits.
    let script = format!("sleep 30 & echo $! > {}", pid_file.display());
    let (code, _, stderr) = run_to_end(&["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "sh", "-c", &script]);
    assert_eq!(code, 0, "{stderr}");
    let pid: i32 = std::fs::read_to_string(pid_file).unwrap().trim().parse().unwrap();
    let gone = common::wait_until(Duration::from_secs(5), || {
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid);
        (!alive).then_some(())
    });
    assert!(gone.is_some(), "the background sleep {pid} outlived the command");
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

#[test]
fn a_command_killed_by_the_forwarded_sigterm_exits_143() {
    let mut tenure = Tenure::start_with(
        "runner",
        Command::new(common::TENURE).args(["run", "--election", "e", "--lock", "memory:", "--ttl", "2s", "--", "sleep", "30"]),
    );
    tenure.wait_for_log("leading; started the command", Duration::from_secs(10));
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 128 + libc::SIGTERM, "{}", tenure.log());
}
