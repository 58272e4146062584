//! ZooKeeper candidates in child processes (the test binary or example re-executed), which report
//! when they lead and their self-fencing deadline, so that a test can kill one as a crashed host.

use std::io::Write;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::instant_to_monotonic_ns;
use crate::process::ChildProcess;
use crate::zookeeper::SESSION_TIMEOUT;

/// Environment variable that turns a re-executed test binary into a candidate process.
pub const CHILD_ENV: &str = "TENURE_ZK_CHILD";

/// Starts this test binary again as a candidate process running `entry` (a test function that
/// calls [`child_candidate_main`]).
pub fn spawn_candidate(entry: &str, servers: &str, path: &str, identity: &str) -> ChildProcess {
    let mut command = Command::new(std::env::current_exe().expect("current exe"));
    command
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{servers}|{path}|{identity}|{}", SESSION_TIMEOUT.as_millis()));
    ChildProcess::spawn(identity, command)
}

/// The body of a candidate process: campaigns and prints `LEADING <term> <deadline_ns>` when
/// it starts leading, `DEADLINE <deadline_ns>` when its self-fencing deadline moves (a
/// CLOCK_MONOTONIC reading), and `FOLLOWING` when it stops. Returns at once when not a child.
pub fn child_candidate_main() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let parts: Vec<&str> = spec.split('|').collect();
    let (servers, path, identity) = (parts[0].to_owned(), parts[1].to_owned(), parts[2].to_owned());
    let timeout = Duration::from_millis(parts[3].parse().expect("timeout"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let election = tenure_zk::ZkElection::connect(&servers, &path, timeout).await.expect("connect");
        let elector = election.campaign(identity).expect("campaign");
        let mut leadership = elector.subscribe();
        let mut last_deadline = None;
        let out = Mutex::new(std::io::stdout());
        let say = |line: String| {
            let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        };
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        let mut was_leader = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = leadership.changed() => {}
            }
            match elector.tenure() {
                Some(tenure) => {
                    let valid_until = tenure.valid_until();
                    let deadline = instant_to_monotonic_ns(valid_until);
                    if !was_leader {
                        say(format!("LEADING {} {deadline}", tenure.term()));
                        was_leader = true;
                    } else if last_deadline != Some(valid_until) {
                        say(format!("DEADLINE {deadline}"));
                    }
                    last_deadline = Some(valid_until);
                }
                None => {
                    if was_leader {
                        say("FOLLOWING".to_owned());
                        was_leader = false;
                        last_deadline = None;
                    }
                }
            }
        }
    });
}
