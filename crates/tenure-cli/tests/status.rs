//! `tenure status`: the state of a lock, read once, for people and for scripts.

mod common;

use std::time::Duration;

use common::{
    file_url, run_to_end, start_elect, wait_for_leader, wait_for_watched_leaders, wait_until, watch_election, watched,
    TempDir, Tenure,
};

#[test]
fn a_lock_nobody_took_says_so_and_exits_zero() {
    let dir = TempDir::new("status-empty");
    let lock_url = file_url(&dir.join("lock"));
    let (code, stdout, stderr) = run_to_end(&["status", "--election", "e", "--lock", &lock_url]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("nobody holds it"), "{stdout}");
    let json = common::status_json("e", &lock_url);
    assert_eq!(json["state"], "absent");
    assert_eq!(json["leader"], serde_json::Value::Null);
}

#[test]
fn a_held_lock_shows_leader_term_times_and_lease_and_a_released_one_is_free() {
    let dir = TempDir::new("status-held");
    let lock_url = file_url(&dir.join("lock"));
    let mut holder = Tenure::start(
        "holder",
        &["elect", "--election", "e", "--id", "replica-a", "--lock", &lock_url, "--ttl", "4s", "--http", "127.0.0.1:0"],
    );
    let address = holder.http_address();
    wait_for_leader(&address, "replica-a", Duration::from_secs(5), "replica-a leads");

    let (code, stdout, stderr) = run_to_end(&["status", "--election", "e", "--lock", &lock_url]);
    assert_eq!(code, 0, "{stderr}");
    for expected in
        ["leader:    replica-a", "state:     held", "term:      1", "acquired:  ", "renewed:   ", "lease:     4s"]
    {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
    let (code, stdout, _) = run_to_end(&["status", "--election", "e", "--lock", &lock_url, "-o", "json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["state"], "held");
    assert_eq!(json["leader"], "replica-a");
    assert_eq!(json["term"], 1);
    assert_eq!(json["leaseDurationSeconds"], 4);
    assert!(json["acquireTime"].is_string() && json["renewTime"].is_string(), "{json}");
    assert_eq!(json["record"]["holderIdentity"], "replica-a");

    holder.signal(libc::SIGTERM);
    assert_eq!(holder.exit_code(Duration::from_secs(5)), 0);
    let (_, stdout, _) = run_to_end(&["status", "--election", "e", "--lock", &lock_url, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["state"], "free", "{json}");
    assert_eq!(json["term"], 1, "the term survives the release: {json}");
}

#[test]
fn a_corrupt_record_is_reported_as_unreadable_with_the_reason() {
    let dir = TempDir::new("status-corrupt");
    let path = dir.join("lock");
    std::fs::write(&path, "this is not a leader election record").unwrap();
    let (code, stdout, stderr) = run_to_end(&["status", "--election", "e", "--lock", &file_url(&path)]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("unreadable"), "{stdout}");
    let (_, stdout, _) = run_to_end(&["status", "--election", "e", "--lock", &file_url(&path), "-o", "json"]);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["state"], "unreadable");
    assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{json}");
}

#[test]
fn an_unreachable_store_exits_one_with_a_one_line_error() {
    // A path below a regular file can never be opened, whoever runs the test.
    let dir = TempDir::new("status-unreachable");
    let file = dir.join("plain-file");
    std::fs::write(&file, "").unwrap();
    let lock_url = file_url(&file.join("lock"));
    let (code, stdout, stderr) = run_to_end(&["status", "--election", "e", "--lock", &lock_url]);
    assert_eq!(code, 1, "stdout: {stdout} stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("tenure: error: "), "{stderr}");
}

#[test]
fn watch_prints_every_change_of_leader_until_stopped() {
    let dir = TempDir::new("status-watch");
    let lock_url = file_url(&dir.join("lock"));
    let mut watch = watch_election("e", &lock_url);
    wait_until(Duration::from_secs(10), || (!watched(&watch).is_empty()).then_some(())).expect("a first line");
    assert_eq!(watched(&watch)[0], (None, None), "nobody held the lock yet");
    let (mut a, _) = start_elect("a", "e", &lock_url, "2s");
    wait_for_watched_leaders(&watch, &["a"]);
    let (mut b, _) = start_elect("b", "e", &lock_url, "2s");
    b.wait_for_log("leader=\"a\"", Duration::from_secs(5));
    a.signal(libc::SIGTERM);
    wait_for_watched_leaders(&watch, &["a", "b"]);
    b.signal(libc::SIGTERM);
    wait_until(Duration::from_secs(5), || (watched(&watch).last()?.0.is_none()).then_some(()))
        .expect("the release is printed");
    assert_eq!(a.exit_code(Duration::from_secs(5)), 0);
    assert_eq!(b.exit_code(Duration::from_secs(5)), 0);
    watch.signal(libc::SIGINT);
    assert_eq!(watch.exit_code(Duration::from_secs(5)), 0, "{}", watch.log());
}
