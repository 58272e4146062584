//! `tenure elect`, `run` and `status` on `zk://` URLs against a real ZooKeeper server: the same
//! commands, the same answers as on the file lock.

mod common;

// The ZooKeeper server harness of the tenure-zk tests, shared rather than copied.
#[path = "../../tenure-zk/tests/common/mod.rs"]
mod zk_server;

use std::time::{Duration, Instant};

use common::{http_leader, run_to_end, wait_until, Tenure};

fn start_candidate(id: &str, url: &str) -> (Tenure, String) {
    common::start_elect(id, "z", url, "3s")
}

#[test]
fn elect_and_status_on_zookeeper_agree_and_hand_over_on_sigterm() {
    let Some(server) = zk_server::server() else { return };
    let url = format!("zk://127.0.0.1:{}{}", server.port, zk_server::unique_path("cli-elect"));
    let (mut first, first_http) = start_candidate("one", &url);
    wait_until(Duration::from_secs(10), || (http_leader(&first_http)? == "one").then_some(()))
        .expect("the first candidate leads");
    let (_second, second_http) = start_candidate("two", &url);
    wait_until(Duration::from_secs(10), || (http_leader(&second_http)? == "one").then_some(()))
        .expect("the follower reports the leader");

    let (code, stdout, stderr) = run_to_end(&["status", "--election", "z", "--lock", &url, "--output", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["leader"], "one");
    let first_term = status["term"].as_i64().expect("a zxid term");

    first.signal(libc::SIGTERM);
    let stopped = Instant::now();
    wait_until(Duration::from_secs(5), || (http_leader(&second_http)? == "two").then_some(()))
        .expect("the follower takes over");
    assert!(stopped.elapsed() < Duration::from_secs(1), "handover took {:?}", stopped.elapsed());
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0);
    let (_, stdout, _) = run_to_end(&["status", "--election", "z", "--lock", &url, "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["leader"], "two");
    assert!(status["term"].as_i64().unwrap() > first_term, "terms grow: {status}");
}

#[test]
fn run_on_zookeeper_passes_the_term_and_the_exit_status() {
    let Some(server) = zk_server::server() else { return };
    let url = format!("zk://127.0.0.1:{}{}", server.port, zk_server::unique_path("cli-run"));
    let (code, stdout, stderr) = run_to_end(&[
        "run",
        "--election",
        "z",
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

#[test]
fn a_malformed_zookeeper_url_is_a_one_line_usage_error() {
    let (code, _, stderr) = run_to_end(&["status", "--election", "z", "--lock", "zk://127.0.0.1/x"]);
    assert_eq!(code, 2);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("every server needs a port"), "{stderr}");
}

#[test]
fn status_watch_on_zookeeper_prints_the_handover() {
    let Some(server) = zk_server::server() else { return };
    let url = format!("zk://127.0.0.1:{}{}", server.port, zk_server::unique_path("cli-watch"));
    common::assert_watch_follows_a_handover("z", &url);
}
