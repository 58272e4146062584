//! `tenure member`: sidecar processes on one file group store split the keys between them, a
//! leaving member hands partitions over only after the application released them, and a killed
//! member's partitions are taken over after its lease. Real processes, real signals, `--ttl 2s`
//! (lease 2 s, renew deadline 1 s); waits poll with bounded deadlines.

mod common;
mod member_support;

use std::time::{Duration, Instant};

use common::{file_url, get, post, wait_until, TempDir, Tenure};
use member_support::{assert_single_owners, owned, owns, partitions, release_draining};

const PARTITIONS: u32 = 16;
const LEASE: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: Duration = Duration::from_secs(1);

fn start_member(id: &str, dir: &TempDir, drain_timeout: &str) -> (Tenure, String) {
    let url = file_url(&dir.join("group"));
    let partitions = PARTITIONS.to_string();
    let args = [
        "member",
        "--group",
        "g",
        "--http",
        "127.0.0.1:0",
        "--id",
        id,
        "--ttl",
        "2s",
        "--lock",
        &url,
        "--partitions",
        &partitions,
        "--drain-timeout",
        drain_timeout,
    ];
    let member = Tenure::start(id, &args);
    let address = member.http_address();
    (member, address)
}

/// Waits (releasing draining partitions, checking single owners) until the members split the
/// partitions evenly.
fn settle(addresses: &[&str]) {
    let even = PARTITIONS as usize / addresses.len();
    let settled = wait_until(Duration::from_secs(20), || {
        addresses.iter().for_each(|a| release_draining(a));
        assert_single_owners(addresses);
        addresses.iter().all(|a| owned(a).len() == even).then_some(())
    });
    assert!(settled.is_some(), "members never split the partitions");
}

#[test]
fn two_members_split_the_keys_and_each_key_has_exactly_one_owner() {
    let dir = TempDir::new("member-split");
    let (_a, a) = start_member("a", &dir, "10s");
    let (_b, b) = start_member("b", &dir, "10s");
    settle(&[&a, &b]);
    let mut mine = [0, 0];
    for i in 0..64 {
        let key = format!("default/pod-{i}");
        let (from_a, from_b) = (owns(&a, &key), owns(&b, &key));
        assert_eq!(from_a["partition"], from_b["partition"], "{key}: the members map it to different partitions");
        let owners = [from_a["owns"].as_bool().unwrap(), from_b["owns"].as_bool().unwrap()];
        assert_eq!(owners.iter().filter(|o| **o).count(), 1, "{key}: {from_a} {from_b}");
        let owner = if owners[0] { &from_a } else { &from_b };
        assert!(owner["term"].as_u64().unwrap() >= 1, "{owner}");
        mine[usize::from(owners[1])] += 1;
    }
    assert!(mine[0] > 0 && mine[1] > 0, "one member owns every key: {mine:?}");
    let (code, _) = get(&a, "/owns").unwrap();
    assert_eq!(code, 400, "/owns without a key");
}

#[test]
fn a_leaving_member_hands_partitions_over_only_after_the_application_released_them() {
    let dir = TempDir::new("member-leave");
    let (mut a_process, a) = start_member("a", &dir, "60s");
    let (_b, b) = start_member("b", &dir, "60s");
    settle(&[&a, &b]);
    let leaving = owned(&a);
    let (code, _) = post(&a, &format!("/release?partition={}&term=1", leaving[0])).unwrap();
    assert_eq!(code, 409, "an assigned partition cannot be released");

    a_process.signal(libc::SIGTERM);
    let draining = wait_until(Duration::from_secs(10), || {
        let all = partitions(&a)?;
        (all.len() == leaving.len() && all.values().all(|(s, _)| s == "draining")).then_some(all)
    })
    .expect("the leaving member never showed its partitions draining");
    for key in 0..32 {
        assert!(!owns(&a, &format!("k{key}"))["owns"].as_bool().unwrap(), "a draining member still owns k{key}");
    }
    // Unreleased, they stay with the leaving member for longer than a lease (the drain timeout
    // is a minute), and the other member does not take them.
    let taken = wait_until(LEASE + Duration::from_secs(1), || {
        let b_owned = owned(&b);
        leaving.iter().find(|p| b_owned.contains(p)).copied()
    });
    assert_eq!(taken, None, "a partition moved before the application released it");

    // Released one by one: each moves right after its release.
    let start = Instant::now();
    for (partition, (_, term)) in &draining {
        let (code, body) = post(&a, &format!("/release?partition={partition}&term={term}")).unwrap();
        assert_eq!((code, body.contains("\"released\":true")), (200, true), "{body}");
    }
    let moved =
        wait_until(Duration::from_secs(10), || (owned(&b).len() == PARTITIONS as usize).then(|| start.elapsed()));
    let moved = moved.expect("the released partitions never reached the other member");
    assert!(moved < RENEW_DEADLINE, "handover after the release took {moved:?}");
    assert!(leaving.iter().all(|p| draining[p].1 < partitions(&b).unwrap()[p].1), "terms did not grow");
    assert_eq!(a_process.exit_code(Duration::from_secs(10)), 0, "{}", a_process.log());
}

#[test]
fn a_killed_member_partitions_are_taken_over_after_its_lease() {
    let dir = TempDir::new("member-kill");
    let (a_process, a) = start_member("a", &dir, "10s");
    let (_b, b) = start_member("b", &dir, "10s");
    settle(&[&a, &b]);
    let start = Instant::now();
    a_process.signal(libc::SIGKILL);
    let all = wait_until(Duration::from_secs(20), || (owned(&b).len() == PARTITIONS as usize).then(|| start.elapsed()));
    let took = all.expect("the survivor never owned the killed member's partitions");
    assert!(took >= RENEW_DEADLINE, "taken over after {took:?}, before the killed member's deadline");
    assert!(took <= LEASE + Duration::from_secs(1), "taken over after {took:?}, more than a lease");
}

#[test]
fn a_leaving_member_whose_application_never_releases_hands_over_after_the_drain_timeout() {
    let dir = TempDir::new("member-drain-timeout");
    let drain_timeout = Duration::from_millis(1500);
    let (mut a_process, a) = start_member("a", &dir, "1500ms");
    let (_b, b) = start_member("b", &dir, "1500ms");
    settle(&[&a, &b]);
    let start = Instant::now();
    a_process.signal(libc::SIGTERM);
    let moved = wait_until(Duration::from_secs(10), || {
        assert_single_owners(&[&a, &b]);
        (owned(&b).len() == PARTITIONS as usize).then(|| start.elapsed())
    });
    let moved = moved.expect("the partitions never moved after the drain timeout");
    assert!(moved >= drain_timeout, "handed over after {moved:?}, before the drain timeout");
    assert_eq!(a_process.exit_code(Duration::from_secs(10)), 0, "{}", a_process.log());
}
