//! `tenure coordinate`, the process behind the Python Tooz driver: real processes on a file store.
//! What a Tooz user relies on: a silent (frozen) application loses its locks and leaderships after
//! the session timeout and never hears otherwise; a dead application's locks are free at once;
//! groups, members and capabilities behave as Tooz's API says; bad names are refused.

mod common;

use std::time::{Duration, Instant};

use common::{request, wait_until, TempDir, Tenure};
use serde_json::Value;

fn start(id: &str, base: &TempDir, ttl: &str) -> (Tenure, String) {
    let url = format!("file://{}", base.join("tooz").display());
    let args = ["coordinate", "--lock", &url, "--id", id, "--ttl", ttl, "--http", "127.0.0.1:0", "--stdin-lifeline"];
    let tenure = Tenure::start_piped(id, &args);
    let address = tenure.http_address();
    (tenure, address)
}

fn call(address: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (code, body) = request(address, method, path, body).unwrap_or_else(|| panic!("{method} {path}: no answer"));
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn kind(answer: &(u16, Value)) -> (u16, &str) {
    (answer.0, answer.1["kind"].as_str().unwrap_or(""))
}

#[test]
fn a_silent_application_loses_its_lock_and_leadership_after_the_timeout_and_is_told_so() {
    let base = TempDir::new("coordinate-silent");
    let (a_process, a) = start("a", &base, "2s");
    let (b_process, b) = start("b", &base, "2s");
    let (_, taken) = call(&a, "POST", "/locks/l1?wait_ms=0", "");
    assert_eq!(taken["acquired"], true, "{taken}");
    assert!(taken["valid_ms"].as_u64().unwrap() <= 2000, "valid never past the session: {taken}");
    call(&a, "PUT", "/elections/g", "");
    let leads = wait_until(Duration::from_secs(10), || {
        let (_, beat) = call(&a, "POST", "/heartbeat", "");
        (beat["elections"]["g"]["leading"] == true).then_some(beat)
    });
    // a says nothing from now on (a frozen application); b waits for the lock and the election.
    let silent_since = Instant::now();
    assert!(leads.is_some(), "a leads the election");
    call(&b, "PUT", "/elections/g", "");
    assert_eq!(call(&b, "POST", "/locks/l1?wait_ms=0", "").1["acquired"], false);

    let acquired = wait_until(Duration::from_secs(20), || {
        let (_, answer) = call(&b, "POST", "/locks/l1?wait_ms=1000", "");
        (answer["acquired"] == true).then_some(answer)
    })
    .unwrap_or_else(|| panic!("b never got the lock; a:\n{}\nb:\n{}", a_process.log(), b_process.log()));
    let waited = silent_since.elapsed();
    assert!(waited >= Duration::from_secs(2), "not before a's session could end: {waited:?}");
    assert_eq!(acquired["term"], 2, "a new term: {acquired}");
    let leads = wait_until(Duration::from_secs(10), || {
        let (_, election) = call(&b, "GET", "/elections/g", "");
        (election["leading"] == true).then_some(election)
    });
    assert!(leads.is_some(), "b leads the election once a's session ended");

    // a's first request after the silence: refused, never a stale answer.
    assert_eq!(kind(&call(&a, "POST", "/heartbeat", "")), (410, "session_expired"));
    assert_eq!(kind(&call(&a, "GET", "/elections/g", "")), (410, "session_expired"));
}

#[test]
fn a_dead_application_frees_its_lock_at_once() {
    let base = TempDir::new("coordinate-lifeline");
    let (mut a_process, a) = start("a", &base, "30s");
    let (_b, b) = start("b", &base, "30s");
    assert_eq!(call(&a, "POST", "/locks/l1?wait_ms=0", "").1["acquired"], true);
    assert_eq!(call(&b, "POST", "/locks/l1?wait_ms=0", "").1["acquired"], false);
    // The application's end of the pipe closes (as when it dies, however it dies).
    drop(a_process.stdin.take());
    let (_, answer) = call(&b, "POST", "/locks/l1?wait_ms=10000", "");
    assert_eq!(answer["acquired"], true, "b gets the lock long before a's 30 s session: {answer}");
    assert_eq!(a_process.exit_code(Duration::from_secs(10)), 0, "a released and exited");
}

#[test]
fn groups_members_and_capabilities_follow_tooz() {
    let base = TempDir::new("coordinate-groups");
    let (_a, a) = start("a", &base, "10s");
    let (_b, b) = start("b", &base, "10s");
    assert_eq!(kind(&call(&a, "PUT", "/groups/g1/members/a", "")), (404, "group_not_created"));
    assert_eq!(call(&a, "PUT", "/groups/g1", "").0, 201);
    assert_eq!(kind(&call(&b, "PUT", "/groups/g1", "")), (409, "group_exists"));
    assert_eq!(call(&b, "GET", "/groups", "").1["groups"], serde_json::json!(["g1"]));
    assert_eq!(call(&a, "PUT", "/groups/g1/members/a", r#"{"capabilities": {"zone": "z1"}}"#).0, 201);
    assert_eq!(kind(&call(&a, "PUT", "/groups/g1/members/a", "")), (409, "member_exists"));
    assert_eq!(call(&b, "PUT", "/groups/g1/members/b", "").0, 201);
    let members = call(&b, "GET", "/groups/g1/members", "").1;
    assert_eq!(members["members"], serde_json::json!({"a": {"zone": "z1"}, "b": null}));
    assert_eq!(call(&a, "PUT", "/groups/g1/members/a/capabilities", r#"[1, 2]"#).0, 204);
    assert_eq!(call(&b, "GET", "/groups/g1/members", "").1["members"]["a"], serde_json::json!([1, 2]));
    assert_eq!(kind(&call(&a, "DELETE", "/groups/g1", "")), (409, "group_not_empty"));
    assert_eq!(call(&b, "DELETE", "/groups/g1/members/b", "").0, 204);
    assert_eq!(kind(&call(&b, "DELETE", "/groups/g1/members/b", "")), (404, "member_not_joined"));
    assert_eq!(call(&a, "DELETE", "/groups/g1/members/a", "").0, 204);
    assert_eq!(call(&a, "DELETE", "/groups/g1", "").0, 204);
    assert_eq!(kind(&call(&a, "DELETE", "/groups/g1", "")), (404, "group_not_created"));

    // Names a store cannot hold are refused before they reach it.
    for bad in ["/groups/Upper", "/groups/a..b", "/groups/-x", "/groups/%2Fetc", &format!("/groups/{}", "x".repeat(41))] {
        assert_eq!(kind(&call(&a, "PUT", bad, "")), (400, "bad_name"), "{bad}");
    }
    assert_eq!(kind(&call(&a, "POST", "/locks/UPPER", "")), (400, "bad_name"));
    call(&a, "PUT", "/groups/g2", "");
    assert_eq!(kind(&call(&a, "PUT", "/groups/g2/members/a", "not json")), (400, "bad_body"));
}

#[test]
fn a_member_that_stopped_renewing_is_left_out_after_its_lease() {
    let base = TempDir::new("coordinate-expiry");
    let (a_process, a) = start("a", &base, "2s");
    let (_b, b) = start("b", &base, "2s");
    call(&a, "PUT", "/groups/g", "");
    call(&a, "PUT", "/groups/g/members/a", "");
    call(&b, "PUT", "/groups/g/members/b", "");
    assert_eq!(call(&b, "GET", "/groups/g/members", "").1["members"].as_object().unwrap().len(), 2);
    // Killed outright: nothing is released, the record stays until b has seen it unchanged for a lease.
    a_process.signal(libc::SIGKILL);
    let killed = Instant::now();
    let members = wait_until(Duration::from_secs(20), || {
        let (_, answer) = call(&b, "GET", "/groups/g/members", "");
        let members = answer["members"].as_object().cloned().unwrap_or_default();
        (!members.contains_key("a")).then_some(members)
    })
    .expect("a is left out");
    assert!(killed.elapsed() >= Duration::from_secs(1), "not before its record could lapse");
    assert!(members.contains_key("b"), "b stays: it renews while its application talks");
}

#[test]
fn stop_releases_everything_and_exits_while_the_lifeline_is_still_open() {
    let base = TempDir::new("coordinate-stop");
    let (mut a_process, a) = start("a", &base, "30s");
    let (_b, b) = start("b", &base, "30s");
    assert_eq!(call(&a, "POST", "/locks/l1?wait_ms=0", "").1["acquired"], true);
    assert_eq!(call(&a, "POST", "/stop", "").0, 200);
    assert_eq!(a_process.exit_code(Duration::from_secs(10)), 0, "exits with its standard input still open");
    assert!(a_process.stdin.is_some());
    assert_eq!(call(&b, "POST", "/locks/l1?wait_ms=0", "").1["acquired"], true, "released on the way out");
}
