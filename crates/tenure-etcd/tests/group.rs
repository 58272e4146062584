//! Groups on a real etcd server, held to the scenarios every group store must pass
//! ([`tenure_group::conformance`]).

use std::sync::Arc;

use tenure_etcd::EtcdGroupStore;
use tenure_group::conformance::{self, Joined};
use tenure_group::{Group, GroupConfig};
use tenure_testkit::etcd::EtcdCluster;

/// How the scenarios join a member: a store (and connection) of its own per member.
fn joiner(
    endpoints: Vec<String>,
) -> impl Fn(&str, &str, u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = Joined> + Send>> + Sync {
    move |name, identity, partitions| {
        let (endpoints, name, identity) = (endpoints.clone(), name.to_owned(), identity.to_owned());
        Box::pin(async move {
            let store = EtcdGroupStore::connect(&endpoints, &name).await.unwrap();
            let config = GroupConfig { timing: conformance::timing(), partition_count: partitions, weight: 1 };
            let group = Group::builder(identity, store.clone()).config(config).join().unwrap();
            let store2 = store.clone();
            Joined { group, requests: Box::new(move || store2.requests_sent()), store: Arc::new(store) }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_members_share_partitions_hand_over_at_once_on_leave_and_after_the_lease_on_crash() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let handovers = conformance::share_leave_and_crash(&joiner(cluster.endpoints()), "share").await.unwrap();
    println!("etcd handover: leave {:?}, crash {:?}", handovers.leave, handovers.crash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_owns_nothing_while_the_first_lives() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    conformance::duplicate_identity_owns_nothing(&joiner(cluster.endpoints()), "dup").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_partition_count() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let (few, many) =
        conformance::requests_at_rest_do_not_grow_with_partitions(&joiner(cluster.endpoints()), "rate").await.unwrap();
    println!("etcd, 2 members, retry 100 ms: {few:.0} requests/member/min at 16 partitions, {many:.0} at 1024");
    // Per retry period a member renews once and reads once per change it is told of (its own
    // renew and the other member's): at most 3 requests, whatever the partition count.
    let bound = 3.0 * 60_000.0 / conformance::timing().retry_period.as_millis() as f64 * 1.2;
    assert!(few <= bound && many <= bound, "{few:.0} or {many:.0} requests/min above {bound:.0}");
}

/// The watch carries the records, so a member at rest applies the others' renews without reading
/// (a snapshot read per change cost 2379 and 3947 requests/member/min among 3 and 10 members before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_member_count() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let (three, ten) =
        conformance::requests_at_rest_do_not_grow_with_members(&joiner(cluster.endpoints()), "members").await.unwrap();
    println!("etcd, retry 100 ms, 16 partitions: {three:.0} requests/member/min among 3 members, {ten:.0} among 10");
    // One renew per retry period, and nothing else at rest.
    let bound = 60_000.0 / conformance::timing().retry_period.as_millis() as f64 * 1.2;
    assert!(three <= bound && ten <= bound, "{three:.0} or {ten:.0} requests/min above {bound:.0}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_of_members_that_left_or_crashed_are_deleted_once_nothing_can_name_them() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let cleanups =
        conformance::departed_members_records_are_deleted(&joiner(cluster.endpoints()), "cleanup").await.unwrap();
    println!(
        "etcd: record of a leaver deleted after {:?}, of a crashed member after {:?}",
        cleanups.left, cleanups.crashed
    );
}
