//! `tenure elect --progress-timeout`: a leader whose application makes no progress gives way, so a
//! replica whose application works leads (invariant G1); an application that proves progress
//! keeps its leadership.

mod common;

use std::time::Duration;

use common::{file_url, get, metric, request, run_to_end, wait_until, TempDir, Tenure};
use serde_json::Value;

fn start_candidate(id: &str, lock_url: &str) -> (Tenure, String) {
    let args = [
        "elect", "--election", "test", "--id", id, "--lock", lock_url, "--ttl", "2s", "--http", "127.0.0.1:0",
        "--progress-timeout", "2s",
    ];
    let tenure = Tenure::start(id, &args);
    let address = tenure.http_address();
    (tenure, address)
}

/// This instance's term while it leads.
fn leading_term(address: &str) -> Option<u64> {
    let (_, body) = get(address, "/status")?;
    let status: Value = serde_json::from_str(&body).ok()?;
    status["isLeader"].as_bool()?.then(|| status["term"].as_u64()).flatten()
}

fn progress(address: &str, query: &str) -> u16 {
    request(address, "POST", &format!("/progress{query}"), "").map_or(0, |(code, _)| code)
}

#[test]
fn a_leader_whose_application_is_silent_gives_way_to_one_whose_application_works() {
    let dir = TempDir::new("progress");
    let lock_url = file_url(&dir.join("lock"));
    let (silent, silent_address) = start_candidate("silent", &lock_url);
    let first = wait_until(Duration::from_secs(10), || leading_term(&silent_address)).expect("the first candidate leads");
    let (working, working_address) = start_candidate("working", &lock_url);
    // The working application proves progress whenever its sidecar leads; the silent one never.
    let term = wait_until(Duration::from_secs(15), || {
        let term = leading_term(&working_address)?;
        // 409: the term ended between the two calls; the next look finds the current one.
        (progress(&working_address, &format!("?term={term}")) == 204).then_some(term)
    })
    .expect("the replica whose application works leads");
    assert!(term > first);
    silent.wait_for_log("giving way: the application made no progress", Duration::from_secs(5));
    let gave_way = metric(&silent_address, "tenure_gave_way_total{name=\"test\"}");
    assert!(gave_way.is_some_and(|times| times >= 1.0), "{gave_way:?}");
    // Proving progress keeps the leadership: two silences' worth, one proof every 200 ms. The
    // application does what its handler must: on 409 its tenure ended (on a loaded machine a
    // renew can come after its 1 s deadline, and the sidecar leads again under a new term), so it
    // goes on under the term it leads with now. It never gives way for silence.
    let mut term = term;
    for _ in 0..20 {
        match progress(&working_address, &format!("?term={term}")) {
            204 => {}
            409 => {
                let next = wait_until(Duration::from_secs(15), || leading_term(&working_address));
                term = next.unwrap_or_else(|| panic!("the working replica leads again: {}", working.log()));
            }
            other => panic!("progress answered {other}: {}", working.log()),
        }
        std::thread::sleep(Duration::from_millis(200)); // the application's own pace, not a wait for a condition
    }
    assert!(wait_until(Duration::from_secs(15), || leading_term(&working_address)).is_some(), "{}", working.log());
    // A stale term is refused (the work must stop), as is a call without one.
    assert_eq!(progress(&silent_address, &format!("?term={first}")), 409);
    assert_eq!(progress(&working_address, &format!("?term={first}")), 409);
    assert_eq!(progress(&working_address, ""), 400);
    assert!(!working.log().contains("giving way"), "{}", working.log());
}

#[test]
fn progress_is_not_found_without_the_flag_and_a_silence_shorter_than_a_renew_is_refused() {
    let dir = TempDir::new("progress-flags");
    let lock_url = file_url(&dir.join("lock"));
    let args = ["elect", "--election", "test", "--id", "a", "--lock", &lock_url, "--ttl", "2s", "--http", "127.0.0.1:0"];
    let plain = Tenure::start("plain", &args);
    assert_eq!(progress(&plain.http_address(), "?term=1"), 404);
    let (code, _, stderr) = run_to_end(&[&args[..], &["--progress-timeout", "10ms"]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("shorter than one renew interval"), "{stderr}");
    let (code, _, stderr) = run_to_end(&["elect", "--election", "test", "--lock", &lock_url, "--progress-timeout", "5s"]);
    assert_eq!(code, 2, "needs --http: {stderr}");
}
