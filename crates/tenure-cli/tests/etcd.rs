//! `tenure elect`, `run` and `status` on `etcd://` URLs against a real etcd server: the same
//! commands and answers as on the file lock, and `etcdctl elect -l` sees Tenure's leader.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tenure_testkit::etcd::EtcdCluster;

/// The first leader `etcdctl elect -l` (observation mode, which streams until killed) prints.
fn etcdctl_observed_leader(endpoint: &str, election: &str) -> Option<String> {
    let mut observer = Command::new("etcdctl")
        .args(["--endpoints", endpoint, "elect", "-l", election])
        .env("ETCDCTL_API", "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl runs");
    let stdout = observer.stdout.take().expect("piped stdout");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // It prints the key, then the proposal (the leader's identity).
    let mut seen = Vec::new();
    while let Ok(line) = received.recv_timeout(Duration::from_secs(5)) {
        if !line.contains('/') {
            seen.push(line);
            break;
        }
    }
    let _ = observer.kill();
    let _ = observer.wait();
    seen.pop()
}

#[tokio::test]
async fn elect_and_status_on_etcd_agree_with_etcdctl_and_hand_over_on_sigterm() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let endpoint = cluster.endpoint(0);
    let url = format!("etcd://{endpoint}/cli-elect");
    common::assert_status_agrees_and_sigterm_hands_over("e", &url, || {
        assert_eq!(etcdctl_observed_leader(&endpoint, "cli-elect").as_deref(), Some("one"), "etcdctl elect -l");
    });
}

#[tokio::test]
async fn run_on_etcd_passes_the_term_and_the_exit_status() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    common::assert_run_passes_the_term_and_the_exit_status("e", &format!("etcd://{}/cli-run", cluster.endpoint(0)));
}

#[tokio::test]
async fn status_watch_on_etcd_prints_the_handover() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let url = format!("etcd://{}/cli-watch", cluster.endpoint(0));
    common::assert_watch_follows_a_handover("e", &url);
}

#[tokio::test]
async fn tenure_write_on_etcd_puts_the_key_only_under_the_leaders_term() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let endpoint = cluster.endpoint(0);
    let read = || {
        let mut get = Command::new("etcdctl");
        get.args(["--endpoints", &endpoint, "get", "/app/state", "--print-value-only"]).env("ETCDCTL_API", "3");
        let output = get.output().ok()?;
        output.status.success().then(|| output.stdout.strip_suffix(b"\n").unwrap_or(&output.stdout).to_vec())
    };
    let url = format!("etcd://{endpoint}/cli-write");
    common::assert_write_is_fenced("w", &url, "/app/state", read);
}
