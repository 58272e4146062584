//! The HTTP API of `tenure elect` beyond `GET /`, checked as an application would use it:
//! real processes on one file lock (`--ttl 2s`), questions over HTTP only.

mod common;

use std::time::{Duration, Instant};

use common::{file_url, get, metric, wait_until, EventStream, TempDir, Tenure};
use serde_json::Value;

/// A candidate in election "test" on `lock_url`, with `extra` flags; returns it and its address.
fn start_candidate(id: &str, lock_url: &str, extra: &[&str]) -> (Tenure, String) {
    let mut args =
        vec!["elect", "--election", "test", "--id", id, "--lock", lock_url, "--ttl", "2s", "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let tenure = Tenure::start(id, &args);
    let address = tenure.http_address();
    (tenure, address)
}

fn status_code(address: &str, path: &str) -> u16 {
    get(address, path).map_or(0, |(code, _)| code)
}

fn status(address: &str) -> Value {
    let (code, body) = get(address, "/status").expect("an answer from /status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn is_leader(address: &str) -> bool {
    let (_, body) = get(address, "/isLeader").expect("an answer from /isLeader");
    serde_json::from_str::<Value>(&body).unwrap()["isLeader"].as_bool().unwrap()
}

/// Waits until exactly one of `addresses` says it leads and all name it in `/status`; returns
/// its index.
fn single_leader(addresses: &[&str], limit: Duration) -> usize {
    wait_until(limit, || {
        let leading: Vec<usize> = (0..addresses.len()).filter(|&i| is_leader(addresses[i])).collect();
        let [leader] = leading[..] else { return None };
        let name = status(addresses[leader])["identity"].clone();
        addresses.iter().all(|a| status(a)["leader"] == name).then_some(leader)
    })
    .expect("exactly one leader that all candidates name")
}

#[test]
fn is_leader_status_probes_and_metrics_match_the_election_and_follow_a_handover() {
    let dir = TempDir::new("sidecar-state");
    let lock_url = file_url(&dir.join("lock"));
    let mut candidates: Vec<(Tenure, String)> =
        ["a", "b", "c"].iter().map(|id| start_candidate(id, &lock_url, &["--ready-only-when-leader"])).collect();
    let addresses: Vec<&str> = candidates.iter().map(|(_, a)| a.as_str()).collect();
    let leader = single_leader(&addresses, Duration::from_secs(5));
    let leader_id = candidates[leader].0.name.clone();

    for (i, address) in addresses.iter().enumerate() {
        let state = status(address);
        let leads = i == leader;
        assert_eq!(state["identity"], candidates[i].0.name.as_str());
        assert_eq!(state["leader"], leader_id.as_str(), "{state}");
        assert_eq!(state["isLeader"], leads, "{state}");
        assert_eq!(state["role"], if leads { "leader" } else { "follower" }, "{state}");
        assert_eq!(state["term"], 1, "{state}");
        assert_eq!(state["leaseDurationSeconds"], 2.0);
        assert_eq!(state["renewDeadlineSeconds"], 1.0);
        assert_eq!(state["retryPeriodSeconds"], 0.5);
        assert_eq!(state["tenuresStarted"], u64::from(leads), "{state}");
        assert_eq!(state["validForSeconds"].is_number(), leads, "{state}");
        assert_eq!(status_code(address, "/healthz"), 200);
        assert_eq!(status_code(address, "/readyz"), if leads { 200 } else { 503 });
        assert_eq!(status_code(address, "/isLeader?strict"), if leads { 200 } else { 503 });
        let master_status = metric(address, "leader_election_master_status{name=\"test\"}");
        assert_eq!(master_status, Some(if leads { 1.0 } else { 0.0 }));
        assert_eq!(metric(address, "tenure_term{name=\"test\"}"), Some(1.0));
    }
    let renews = |address: &str| metric(address, "tenure_renews_total{name=\"test\"}").expect("tenure_renews_total");
    let renews_before = renews(addresses[leader]);
    wait_until(Duration::from_secs(3), || (renews(addresses[leader]) > renews_before).then_some(()))
        .expect("the leader keeps renewing");

    let (mut old_leader, _) = candidates.remove(leader);
    old_leader.signal(libc::SIGTERM);
    let survivors: Vec<&str> = candidates.iter().map(|(_, a)| a.as_str()).collect();
    let successor = single_leader(&survivors, Duration::from_secs(3));
    for (i, address) in survivors.iter().enumerate() {
        let leads = i == successor;
        assert_eq!(status_code(address, "/readyz"), if leads { 200 } else { 503 });
        assert_eq!(status(address)["term"], 2);
        let master_status = metric(address, "leader_election_master_status{name=\"test\"}");
        assert_eq!(master_status, Some(if leads { 1.0 } else { 0.0 }));
    }
    assert_eq!(old_leader.exit_code(Duration::from_secs(5)), 0, "{}", old_leader.log());
}

#[test]
fn a_follower_pushes_each_leadership_change_once_and_in_order() {
    let dir = TempDir::new("sidecar-events");
    let lock_url = file_url(&dir.join("lock"));
    let (mut first, first_address) = start_candidate("a", &lock_url, &[]);
    wait_until(Duration::from_secs(5), || is_leader(&first_address).then_some(())).expect("a leads alone");
    let (_b, b_address) = start_candidate("b", &lock_url, &[]);
    let (_c, c_address) = start_candidate("c", &lock_url, &[]);
    wait_until(Duration::from_secs(5), || (status(&c_address)["leader"] == "a").then_some(())).expect("c follows a");

    let mut events = EventStream::open(&c_address);
    let (mut last_id, current) = events.next();
    assert_eq!((current["leader"].as_str(), current["term"].as_u64()), (Some("a"), Some(1)), "{current}");
    assert_eq!(current["role"], "follower");

    first.signal(libc::SIGTERM);
    let mut seen = vec![current];
    while seen.last().unwrap()["term"] != 2 {
        let (id, event) = events.next();
        assert!(id > last_id, "ids increase: {id} after {last_id}");
        assert_ne!(Some(&event), seen.last(), "a change is pushed once");
        last_id = id;
        seen.push(event);
    }
    let terms: Vec<u64> = seen.iter().filter_map(|event| event["term"].as_u64()).collect();
    assert!(terms.windows(2).all(|pair| pair[0] <= pair[1]), "terms never go back: {seen:?}");
    let successor = seen.last().unwrap()["leader"].as_str().unwrap().to_owned();
    assert!(successor == "b" || successor == "c", "{seen:?}");
    assert!(seen.iter().skip_while(|event| event["leader"] == "a").all(|event| event["leader"] != "a"), "{seen:?}");
    wait_until(Duration::from_secs(2), || (status(&b_address)["leader"] == successor.as_str()).then_some(()))
        .expect("b names the same successor");
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0, "{}", first.log());
}

#[test]
fn a_status_long_poll_answers_on_a_change_or_after_the_wait() {
    let dir = TempDir::new("sidecar-long-poll");
    let lock_url = file_url(&dir.join("lock"));
    let (mut first, first_address) = start_candidate("a", &lock_url, &[]);
    wait_until(Duration::from_secs(5), || is_leader(&first_address).then_some(())).expect("a leads alone");
    let (_b, b_address) = start_candidate("b", &lock_url, &[]);
    let version = wait_until(Duration::from_secs(5), || {
        let state = status(&b_address);
        (state["leader"] == "a").then(|| state["version"].as_u64().unwrap())
    })
    .expect("b follows a");

    let asked = Instant::now();
    let (code, body) = get(&b_address, &format!("/status?since={version}&wait=1s")).unwrap();
    let waited = asked.elapsed();
    assert_eq!(code, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["version"], version);
    assert!(waited >= Duration::from_millis(950) && waited < Duration::from_secs(3), "waited {waited:?}");

    let poll_address = b_address.clone();
    let long_poll =
        std::thread::spawn(move || get(&poll_address, &format!("/status?since={version}&wait=20s")).unwrap());
    first.signal(libc::SIGTERM);
    let signalled = Instant::now();
    let (code, body) = long_poll.join().unwrap();
    let answered_after = signalled.elapsed();
    assert_eq!(code, 200);
    let state: Value = serde_json::from_str(&body).unwrap();
    assert!(state["version"].as_u64().unwrap() > version, "{state}");
    assert!(answered_after < Duration::from_secs(2), "the change took {answered_after:?} to be answered");
    assert_eq!(status_code(&b_address, "/status?since=1&wait=later"), 400);
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0, "{}", first.log());
}
