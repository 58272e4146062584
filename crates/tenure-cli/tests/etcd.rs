//! `tenure elect`, `run` and `status` on `etcd://` URLs against a real etcd server: the same
//! commands and answers as on the file lock, and `etcdctl elect -l` sees Tenure's leader.

mod common;

// The etcd server harness of the tenure-etcd tests, shared rather than copied.
#[path = "../../tenure-etcd/tests/common/mod.rs"]
mod etcd_server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{http_leader, run_to_end, wait_until, Tenure};
use etcd_server::EtcdCluster;

fn start_candidate(id: &str, url: &str) -> (Tenure, String) {
    common::start_elect(id, "e", url, "3s")
}

fn status_json(url: &str) -> serde_json::Value {
    let (code, stdout, stderr) = run_to_end(&["status", "--election", "e", "--lock", url, "--output", "json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

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
    let (mut first, first_http) = start_candidate("one", &url);
    wait_until(Duration::from_secs(10), || (http_leader(&first_http)? == "one").then_some(()))
        .expect("the first candidate leads");
    let (_second, second_http) = start_candidate("two", &url);
    wait_until(Duration::from_secs(10), || (http_leader(&second_http)? == "one").then_some(()))
        .expect("the follower reports the leader");

    let status = status_json(&url);
    assert_eq!(status["leader"], "one");
    let first_term = status["term"].as_i64().expect("a revision term");
    assert_eq!(etcdctl_observed_leader(&endpoint, "cli-elect").as_deref(), Some("one"), "etcdctl elect -l");

    first.signal(libc::SIGTERM);
    let stopped = Instant::now();
    wait_until(Duration::from_secs(5), || (http_leader(&second_http)? == "two").then_some(()))
        .expect("the follower takes over");
    assert!(stopped.elapsed() < Duration::from_secs(1), "handover took {:?}", stopped.elapsed());
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0);
    let status = status_json(&url);
    assert_eq!(status["leader"], "two");
    assert!(status["term"].as_i64().unwrap() > first_term, "terms grow: {status}");
}

#[tokio::test]
async fn run_on_etcd_passes_the_term_and_the_exit_status() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let url = format!("etcd://{}/cli-run", cluster.endpoint(0));
    let (code, stdout, stderr) = run_to_end(&[
        "run",
        "--election",
        "e",
        "--lock",
        &url,
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        "echo term=$TENURE_TERM; exit 7",
    ]);
    assert_eq!(code, 7, "{stderr}");
    let term: u64 = stdout.trim().strip_prefix("term=").and_then(|t| t.parse().ok()).expect("a numeric term");
    assert!(term > 0);
}

#[tokio::test]
async fn status_watch_on_etcd_prints_the_handover() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let url = format!("etcd://{}/cli-watch", cluster.endpoint(0));
    common::assert_watch_follows_a_handover("e", &url);
}
