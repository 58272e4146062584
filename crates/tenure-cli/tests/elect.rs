//! `tenure elect`: candidates in separate processes on one file lock agree on one leader, fail
//! over after a crash, hand over on SIGTERM, and a paused leader never claims to lead after it
//! resumes. Real processes, real signals, `--ttl 2s` (lease 2 s, renew deadline 1 s).

mod common;

use std::time::{Duration, Instant};

use common::{file_url, get, http_get, http_leader, start_elect, wait_until, words, TempDir, Tenure};

const LEASE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);

fn start_candidate(id: &str, lock_url: &str) -> (Tenure, String) {
    common::start_elect(id, "test", lock_url, "2s")
}

/// Waits until every address answers the same non-empty leader; returns it.
fn agreed_leader(addresses: &[&str], limit: Duration) -> Option<String> {
    wait_until(limit, || {
        let first = http_leader(addresses[0])?;
        let all_agree = addresses.iter().all(|a| http_leader(a).as_deref() == Some(first.as_str()));
        (all_agree && !first.is_empty()).then_some(first)
    })
}

#[test]
fn three_candidates_agree_and_fail_over_within_the_lease_after_sigkill() {
    let dir = TempDir::new("elect-failover");
    let lock_url = file_url(&dir.join("lock"));
    let mut candidates: Vec<(Tenure, String)> =
        ["a", "b", "c"].iter().map(|id| start_candidate(id, &lock_url)).collect();
    let addresses: Vec<&str> = candidates.iter().map(|(_, a)| a.as_str()).collect();
    let leader = agreed_leader(&addresses, Duration::from_secs(5)).expect("all three agree on one leader");

    let victim = candidates.iter().position(|(t, _)| t.name == leader).unwrap();
    let (mut killed, _) = candidates.remove(victim);
    killed.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    killed.wait_exit(Duration::from_secs(5)).expect("the killed leader is gone");

    let survivors: Vec<&str> = candidates.iter().map(|(_, a)| a.as_str()).collect();
    let successor = wait_until(LEASE + Duration::from_secs(2), || {
        let name = agreed_leader(&survivors, Duration::ZERO)?;
        (name != leader).then_some(name)
    })
    .expect("the survivors agree on a new leader");
    let failover = killed_at.elapsed();
    assert!(failover <= LEASE + Duration::from_secs(1), "failover took {failover:?}");
    let record = common::status_json("test", &lock_url);
    assert_eq!(record["leader"], successor.as_str());
    assert_eq!(record["term"], 2);
}

#[test]
fn sigterm_hands_over_within_a_second_and_exits_zero() {
    let dir = TempDir::new("elect-handover");
    let lock_url = file_url(&dir.join("lock"));
    let (mut first, first_address) = start_candidate("a", &lock_url);
    wait_until(Duration::from_secs(5), || (http_leader(&first_address)? == "a").then_some(())).expect("a leads alone");
    let others = [start_candidate("b", &lock_url), start_candidate("c", &lock_url)];
    let other_addresses: Vec<&str> = others.iter().map(|(_, a)| a.as_str()).collect();
    let mut all = other_addresses.clone();
    all.push(&first_address);
    assert_eq!(agreed_leader(&all, Duration::from_secs(5)).as_deref(), Some("a"));

    first.signal(libc::SIGTERM);
    let terminated_at = Instant::now();
    let successor = wait_until(Duration::from_secs(3), || {
        let name = agreed_leader(&other_addresses, Duration::ZERO)?;
        (name != "a").then_some(name)
    })
    .expect("a new leader after the handover");
    let handover = terminated_at.elapsed();
    assert!(handover <= Duration::from_secs(1), "handover to {successor} took {handover:?}");
    assert_eq!(first.exit_code(Duration::from_secs(5)), 0, "{}", first.log());
    assert!(first.log().contains("released the lock"), "{}", first.log());
}

#[test]
fn a_paused_leader_is_replaced_and_never_claims_to_lead_after_resuming() {
    let dir = TempDir::new("elect-pause");
    let lock_url = file_url(&dir.join("lock"));
    let (mut paused, paused_address) = start_candidate("a", &lock_url);
    wait_until(Duration::from_secs(5), || (http_leader(&paused_address)? == "a").then_some(())).expect("a leads alone");
    let (mut other, other_address) = start_candidate("b", &lock_url);
    assert_eq!(agreed_leader(&[&paused_address, &other_address], Duration::from_secs(5)).as_deref(), Some("a"));

    paused.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();
    common::wait_for_leader(&other_address, "b", LEASE + Duration::from_secs(3), "b takes over from the paused leader");
    // a renewed at most one retry period (500 ms) before it was stopped; b counts the lease from
    // when it saw that renew.
    let taken_over_after = stopped_at.elapsed();
    assert!(
        taken_over_after >= LEASE - RETRY,
        "b took over {taken_over_after:?} after the stop, before a's lease ran out"
    );

    paused.signal(libc::SIGCONT);
    // From the first answer after resuming, `a` must never name itself again.
    let mut answers = Vec::new();
    let caught_up = wait_until(Duration::from_secs(5), || {
        let answer = http_leader(&paused_address)?;
        answers.push(answer.clone());
        (answer == "b").then_some(())
    });
    assert!(caught_up.is_some(), "a never reported b: {answers:?}\n{}", paused.log());
    assert!(!answers.iter().any(|a| a == "a"), "the resumed leader claimed to lead: {answers:?}");
    assert_eq!(http_leader(&other_address).as_deref(), Some("b"));

    let log = paused.log();
    let stopped = log.rfind("stopped leading").expect("a logged that it stopped leading");
    assert!(!log[stopped..].contains("started leading"), "a claimed leadership again:\n{log}");
    let record = common::status_json("test", &lock_url);
    assert_eq!((record["leader"].as_str(), record["term"].as_i64()), (Some("b"), Some(2)));

    for tenure in [&mut paused, &mut other] {
        tenure.signal(libc::SIGTERM);
        assert_eq!(tenure.exit_code(Duration::from_secs(5)), 0, "{}", tenure.log());
    }
}

#[test]
fn a_single_candidate_answers_its_name_on_any_path_and_releases_on_sigterm() {
    let command = "elect --election solo --id solo-1 --lock memory: --ttl 2s --http 127.0.0.1:0 --log-format json";
    let mut tenure = Tenure::start("solo", &words(command));
    let address = tenure.http_address();
    wait_until(Duration::from_secs(5), || (http_leader(&address)? == "solo-1").then_some(())).expect("solo-1 leads");
    assert_eq!(http_get(&address, "/any/path?x=1").as_deref(), Some(r#"{"name":"solo-1"}"#));
    tenure.signal(libc::SIGINT);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 0, "{}", tenure.log());
    let log = tenure.log();
    for line in log.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(event["message"].is_string(), "{line}");
    }
    assert!(log.contains(r#""message":"started leading""#), "{log}");
    assert!(log.contains(r#""message":"released the lock; exiting""#), "{log}");
}

#[test]
fn election_namespace_is_accepted_and_ignored_with_a_note() {
    let command = "elect --election ns --id x --lock memory: --ttl 2s --election-namespace kube-system";
    let mut tenure = Tenure::start("ns", &words(command));
    tenure.wait_for_log("only applies to Kubernetes locks", Duration::from_secs(5));
    tenure.wait_for_log("started leading", Duration::from_secs(5));
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 0, "{}", tenure.log());
}

#[test]
fn the_leader_elector_sidecar_command_line_of_the_kuryr_manifest_is_accepted() {
    // The flags of the seed's manifest, in its `--flag=value` form (HTTP on loopback here).
    let command = "elect --election=kuryr-controller --http=127.0.0.1:0 --election-namespace=kube-system --ttl=5s";
    let mut tenure = Tenure::start("sidecar", &words(&format!("{command} --id=kuryr-0 --lock=memory:")));
    let address = tenure.http_address();
    wait_until(Duration::from_secs(5), || (http_leader(&address)? == "kuryr-0").then_some(())).expect("kuryr-0 leads");
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 0, "{}", tenure.log());
}

#[test]
fn sigusr1_makes_the_leader_step_down_and_stay_a_candidate() {
    let dir = TempDir::new("elect-resign");
    let lock_url = file_url(&dir.join("lock"));
    let (mut a, a_address) = start_elect("a", "e", &lock_url, "2s");
    wait_until(Duration::from_secs(5), || (http_leader(&a_address)? == "a").then_some(())).expect("a leads");
    let (mut b, b_address) = start_elect("b", "e", &lock_url, "2s");
    wait_until(Duration::from_secs(5), || (http_leader(&b_address)? == "a").then_some(())).expect("b follows a");
    a.signal(libc::SIGUSR1);
    wait_until(Duration::from_secs(5), || (http_leader(&a_address)? == "b").then_some(()))
        .unwrap_or_else(|| panic!("b did not take over; a:\n{}\nb:\n{}", a.log(), b.log()));
    // a sees b's acquisition through its watch, possibly before b has handled its own write's reply.
    let term_of_b = || {
        let status: serde_json::Value = serde_json::from_str(&get(&b_address, "/status")?.1).ok()?;
        (status["isLeader"] == true).then(|| status["term"].clone())
    };
    let term = wait_until(Duration::from_secs(5), term_of_b).expect("b says it leads");
    assert_eq!(term, 2, "b leads under the next term");
    assert!(a.is_running(), "a stopped instead of staying a candidate");
    for elector in [&mut b, &mut a] {
        elector.signal(libc::SIGTERM);
        assert_eq!(elector.exit_code(Duration::from_secs(5)), 0, "{}", elector.log());
    }
}

/// Resident KiB of the mappings of the process's own executable (`/proc/<pid>/smaps`).
fn executable_resident_kib(pid: i32) -> Option<u64> {
    let executable = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let executable = executable.to_string_lossy();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut ours = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            ours = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) == Some(&*executable);
        } else if ours && first == "Rss:" {
            total += line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

#[test]
fn an_idle_leader_gives_back_the_binary_pages_only_start_up_used_and_keeps_working() {
    // --ttl 8s: the pages are released one retry period (2 s) after a leader is known, long after
    // the first reading below.
    let (mut tenure, address) = start_elect("lean-1", "lean", "memory:", "8s");
    let pid = tenure.pid();
    let after_start = executable_resident_kib(pid).expect("the executable's pages");
    let released = wait_until(Duration::from_secs(15), || {
        let now = executable_resident_kib(pid)?;
        (now * 2 < after_start).then_some(now)
    });
    let released =
        released.unwrap_or_else(|| panic!("still {after_start} KiB of the binary resident:\n{}", tenure.log()));
    assert_eq!(http_get(&address, "/").as_deref(), Some(r#"{"name":"lean-1"}"#), "{}", tenure.log());
    assert_eq!(get(&address, "/isLeader").map(|(code, _)| code), Some(200));
    tenure.signal(libc::SIGTERM);
    assert_eq!(tenure.exit_code(Duration::from_secs(5)), 0, "after {after_start} -> {released} KiB: {}", tenure.log());
}
