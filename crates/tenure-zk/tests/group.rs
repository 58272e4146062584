//! Groups on a real ZooKeeper server, held to the scenarios every group store must pass
//! ([`tenure_group::conformance`]).

mod common;

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
            Joined { group, requests: Box::new(move || store.requests_sent()) }
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
