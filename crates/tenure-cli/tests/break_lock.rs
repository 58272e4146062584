//! `tenure break-lock`: frees what no live holder renews, refuses what one does, and says what it
//! overrode.

mod common;

use std::time::Duration;

use common::{file_url, http_get, http_leader, run_to_end, start_elect, wait_for_leader, wait_until, TempDir};

#[test]
fn a_corrupt_lock_that_candidates_wait_on_is_broken_and_taken_over_at_once() {
    let dir = TempDir::new("break-corrupt");
    let path = dir.join("lock");
    std::fs::write(&path, "{this is not a record").unwrap();
    let lock_url = file_url(&path);
    // A 30 s lease: without break-lock the candidate waits 30 s for the unknown holder.
    let (candidate, address) = start_elect("replica-a", "e", &lock_url, "30s");
    let status = wait_until(Duration::from_secs(5), || {
        let body = http_get(&address, "/status")?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        (json["waiting"]["reason"] == "corruptRecord").then_some(json)
    })
    .expect("the candidate publishes why it waits");
    assert!(status["waiting"]["remainingSeconds"].as_f64().unwrap() > 20.0, "{status}");
    // The log line comes through a pipe read on a thread of the test: wait for it, do not race it.
    candidate.wait_for_log("waiting before taking the lock", Duration::from_secs(5));

    let (code, stdout, stderr) = run_to_end(&["break-lock", "--election", "e", "--lock", &lock_url, "--observe", "1s"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("broke the lock: overrode unreadable record"), "{stdout}");
    let why = "the candidate takes the broken lock at once, long before its 30 s lease";
    wait_for_leader(&address, "replica-a", Duration::from_secs(5), why);
}

#[test]
fn a_lock_renewed_by_a_live_holder_is_never_broken() {
    let dir = TempDir::new("break-live");
    let lock_url = file_url(&dir.join("lock"));
    let (_holder, address) = start_elect("replica-a", "e", &lock_url, "2s");
    wait_for_leader(&address, "replica-a", Duration::from_secs(5), "replica-a leads");
    let (code, stdout, stderr) = run_to_end(&["break-lock", "--election", "e", "--lock", &lock_url, "--observe", "3s"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("held by \"replica-a\" with term 1"), "{stdout}");
    assert!(stderr.contains("refusing to break the lock"), "{stderr}");
    assert_eq!(http_leader(&address).as_deref(), Some("replica-a"));
}

#[test]
fn a_free_lock_needs_no_breaking_and_native_backends_are_refused_with_the_reason() {
    let dir = TempDir::new("break-free");
    let lock_url = file_url(&dir.join("lock"));
    let (code, stdout, _) = run_to_end(&["break-lock", "--election", "e", "--lock", &lock_url, "--observe", "1s"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("no lock object"),
        "an absent lock is watched, then a released record is written: {stdout}"
    );
    let (code, stdout, _) = run_to_end(&["break-lock", "--election", "e", "--lock", &lock_url]);
    assert_eq!(code, 0);
    assert!(stdout.contains("nothing to break"), "{stdout}");
    let (code, _, stderr) = run_to_end(&["break-lock", "--election", "e", "--lock", "etcd://127.0.0.1:1/e"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("ends a dead candidate's session itself"), "{stderr}");
}
