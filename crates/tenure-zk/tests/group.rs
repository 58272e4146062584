//! Groups on a real ZooKeeper server, held to the scenarios every group store must pass
//! ([`tenure_group::conformance`]).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::Future;
use std::pin::Pin;

use tenure::Timing;
use tenure_group::checks::{all_owned_once, wait_safely};
use tenure_group::conformance::{self, Joined};
use tenure_group::{Group, GroupConfig};
use tenure_zk::ZkGroupStore;

/// How the scenarios join a member: a store (and session) of its own per member; group `name`
/// lives at a path unique to this test process.
fn joiner(servers: &'static str) -> impl Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = Joined> + Send>> + Sync {
    joiner_with(servers, conformance::timing())
}

/// [`joiner`] with members of another timing.
fn joiner_with(
    servers: &'static str,
    timing: Timing,
) -> impl Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = Joined> + Send>> + Sync {
    move |name, identity, partitions| {
        let path = format!("/tenure-test/{}/group-{name}", std::process::id());
        let identity = identity.to_owned();
        Box::pin(async move {
            let store = ZkGroupStore::connect(servers, &path).await.unwrap();
            let config = GroupConfig { timing, partition_count: partitions, weight: 1 };
            let group = Group::builder(identity, store.clone()).config(config).join().unwrap();
            let store2 = store.clone();
            Joined { group, requests: Box::new(move || store2.requests_sent()), store: Arc::new(store) }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_members_share_partitions_hand_over_at_once_on_leave_and_after_the_lease_on_crash() {
    let Some(server) = common::server() else { return };
    let handovers = conformance::share_leave_and_crash(&joiner(&server.servers), "share").await.unwrap();
    println!("ZooKeeper handover: leave {:?}, crash {:?}", handovers.leave, handovers.crash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_owns_nothing_while_the_first_lives() {
    let Some(server) = common::server() else { return };
    conformance::duplicate_identity_owns_nothing(&joiner(&server.servers), "dup").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_partition_count() {
    let Some(server) = common::server() else { return };
    let (few, many) =
        conformance::requests_at_rest_do_not_grow_with_partitions(&joiner(&server.servers), "rate").await.unwrap();
    println!("ZooKeeper, 2 members, retry 100 ms: {few:.0} requests/member/min at 16 partitions, {many:.0} at 1024");
    assert!(few <= at_rest_bound() && many <= at_rest_bound(), "{few:.0} or {many:.0} requests/min");
}

/// What a member at rest may send per minute: a renew per retry period and a read of the group
/// (two requests: the member list and one multi-read) per lease, with a fifth more for load.
fn at_rest_bound() -> f64 {
    let timing = conformance::timing();
    let per_minute = |period: std::time::Duration| 60_000.0 / period.as_millis() as f64;
    (per_minute(timing.retry_period) + 2.0 * per_minute(timing.lease_duration)) * 1.2
}

/// ZooKeeper's watch events name the node but carry no data: the others' renews come as
/// `Touched`, a sign of life that costs no request (a `getData` per renew of every other member
/// cost 2518 and 6698 requests/member/min among 3 and 10 members before; a snapshot read per
/// change, 4078 and 11120).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_member_count() {
    let Some(server) = common::server() else { return };
    let (three, ten) =
        conformance::requests_at_rest_do_not_grow_with_members(&joiner(&server.servers), "members").await.unwrap();
    println!(
        "ZooKeeper, retry 100 ms, 16 partitions: {three:.0} requests/member/min among 3 members, {ten:.0} among 10"
    );
    assert!(three <= at_rest_bound() && ten <= at_rest_bound(), "{three:.0} or {ten:.0} requests/min");
}

/// The benchmark of the README's "Requests at rest": one member's requests per minute among 3,
/// 10 and 50 members at rest (lease 5 s, retry 1 s, 64 partitions; settled, then a lease of calm,
/// then 20 s counted). It prints numbers and checks nothing: `cargo nextest run -p tenure-zk
/// --test group --run-ignored ignored-only --no-capture requests_at_rest_by_member_count`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints numbers"]
async fn requests_at_rest_by_member_count() {
    let Some(server) = common::server() else { return };
    let lease = Duration::from_secs(5);
    let join =
        joiner_with(&server.servers, Timing::new(lease, Duration::from_secs(3), Duration::from_secs(1)).unwrap());
    const P: u32 = 64;
    for members in [3, 10, 50] {
        let mut joined = Vec::new();
        for index in 0..members {
            joined.push(join(&format!("bench{members}"), &format!("m{index:02}"), P).await);
        }
        let all: Vec<&Group> = joined.iter().map(|j| &j.group).collect();
        let settled = || all_owned_once(&all, P) && all.iter().all(|g| g.members().len() == members);
        wait_safely(&all, P, Duration::from_secs(120), settled).await.unwrap().expect("settled");
        wait_safely(&all, P, lease, || false).await.unwrap();
        let (before, start) = ((joined[0].requests)(), Instant::now());
        wait_safely(&all, P, Duration::from_secs(20), || false).await.unwrap();
        let rate = ((joined[0].requests)() - before) as f64 * 60.0 / start.elapsed().as_secs_f64();
        println!("ZooKeeper, lease 5 s, retry 1 s, {P} partitions, {members} members: {rate:.0} requests/member/min");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_of_members_that_left_or_crashed_are_deleted_once_nothing_can_name_them() {
    let Some(server) = common::server() else { return };
    let cleanups =
        conformance::departed_members_records_are_deleted(&joiner(&server.servers), "cleanup").await.unwrap();
    println!(
        "ZooKeeper: record of a leaver deleted after {:?}, of a crashed member after {:?}",
        cleanups.left, cleanups.crashed
    );
}
