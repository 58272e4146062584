//! Groups on a real ZooKeeper server, held to the scenarios every group store must pass
//! ([`tenure_group::conformance`]).

mod common;

use std::sync::Arc;

use std::future::Future;
use std::pin::Pin;

use tenure_group::conformance::{self, Joined};
use tenure_group::{Group, GroupConfig};
use tenure_zk::ZkGroupStore;

/// How the scenarios join a member: a store (and session) of its own per member; group `name`
/// lives at a path unique to this test process.
fn joiner(servers: &'static str) -> impl Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = Joined> + Send>> + Sync {
    move |name, identity, partitions| {
        let path = format!("/tenure-test/{}/group-{name}", std::process::id());
        let identity = identity.to_owned();
        Box::pin(async move {
            let store = ZkGroupStore::connect(servers, &path).await.unwrap();
            let config = GroupConfig { timing: conformance::timing(), partition_count: partitions, weight: 1 };
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
    // Per retry period a member renews once and reads (two requests: the member list and one
    // multi-read) once per change it is told of (its own renew and the other member's).
    let bound = 5.0 * 60_000.0 / conformance::timing().retry_period.as_millis() as f64 * 1.2;
    assert!(few <= bound && many <= bound, "{few:.0} or {many:.0} requests/min above {bound:.0}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_rest_a_member_reads_one_node_per_change_never_the_whole_group() {
    let Some(server) = common::server() else { return };
    let window = std::time::Duration::from_secs(3);
    let join = joiner(&server.servers);
    let three = conformance::requests_per_member_per_minute_at_rest(&join, "members3", 3, 16, window).await.unwrap();
    let ten = conformance::requests_per_member_per_minute_at_rest(&join, "members10", 10, 16, window).await.unwrap();
    println!(
        "ZooKeeper, retry 100 ms, 16 partitions: {three:.0} requests/member/min among 3 members, {ten:.0} among 10"
    );
    // ZooKeeper's watch events name the node but carry no data: per retry period a member renews
    // once and reads the one node of each renew it is told of (its own included), never the
    // group (a snapshot read per change cost 4078 and 11120 requests/member/min before).
    let per_minute = 60_000.0 / conformance::timing().retry_period.as_millis() as f64;
    for (members, measured) in [(3.0, three), (10.0, ten)] {
        let bound = (1.0 + members) * per_minute * 1.2;
        assert!(measured <= bound, "{measured:.0} requests/min among {members} members, above {bound:.0}");
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
