//! Groups on a real etcd server: members share the partitions, hand them over on a leave at once
//! and after a crash only once the crashed member's lease ran out, never with two owners, and at
//! rest each member sends a number of requests that does not depend on the partition count.
//! Waits poll the members' state with a bounded deadline; no sleep orders events.

mod common;

use std::time::{Duration, Instant};

use common::EtcdCluster;
use tenure::Timing;
use tenure_etcd::EtcdGroupStore;
use tenure_group::{checks, Group, GroupConfig};

fn timing() -> Timing {
    Timing::new(Duration::from_secs(1), Duration::from_millis(500), Duration::from_millis(100)).unwrap()
}

async fn join(cluster: &EtcdCluster, group: &str, identity: &str, partitions: u32) -> (Group, EtcdGroupStore) {
    let store = EtcdGroupStore::connect(&cluster.endpoints(), group).await.unwrap();
    let group = Group::builder(identity, store.clone())
        .config(GroupConfig { timing: timing(), partition_count: partitions, weight: 1 })
        .join()
        .unwrap();
    (group, store)
}

async fn wait_safely(groups: &[&Group], partitions: u32, limit: Duration, done: impl Fn() -> bool) -> Option<Duration> {
    checks::wait_safely(groups, partitions, limit, done).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_members_share_partitions_hand_over_at_once_on_leave_and_after_the_lease_on_crash() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    const P: u32 = 16;
    let (a, _) = join(&cluster, "share", "a", P).await;
    let (b, _) = join(&cluster, "share", "b", P).await;
    let (c, _) = join(&cluster, "share", "c", P).await;
    let all = [&a, &b, &c];
    let balanced = || {
        checks::all_owned_once(&all, P) && all.iter().all(|g| (5..=6).contains(&g.assignment().borrow().owned.len()))
    };
    assert!(wait_safely(&all, P, Duration::from_secs(20), balanced).await.is_some(), "never settled");
    assert_eq!(a.members(), vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]);

    // Graceful leave: the others own everything well before a lease could have run out.
    let leave = tokio::spawn(a.leave());
    let handover = wait_safely(&[&b, &c], P, Duration::from_secs(20), || checks::all_owned_once(&[&b, &c], P)).await;
    let handover = handover.expect("no handover after a leave");
    assert!(handover < timing().lease_duration, "a leave waited for a lease: {handover:?}");
    leave.await.unwrap().unwrap();

    // Crash (the driver stops, nothing is released): the survivor owns everything only after the
    // crashed member's deadline, and within a lease plus round trips.
    drop(c);
    let failover = wait_safely(&[&b], P, Duration::from_secs(20), || checks::all_owned_once(&[&b], P)).await;
    let failover = failover.expect("no failover after a crash");
    assert!(failover >= timing().renew_deadline, "took over before the crashed member could have stopped");
    assert!(failover < timing().lease_duration * 3, "failover took {failover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_owns_nothing_while_the_first_lives() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    const P: u32 = 8;
    let (first, _) = join(&cluster, "dup", "same", P).await;
    assert!(wait_safely(&[&first], P, Duration::from_secs(20), || checks::all_owned_once(&[&first], P))
        .await
        .is_some());
    let (second, _) = join(&cluster, "dup", "same", P).await;
    // For two leases: never two owners, and the first keeps everything.
    let limit = timing().lease_duration * 2;
    assert!(wait_safely(&[&first, &second], P, limit, || false).await.is_none());
    assert!(checks::all_owned_once(&[&first], P), "the live first process lost partitions to a duplicate");
    assert!(second.assignment().borrow().owned.is_empty());
}

/// Requests one member sends per minute once the group settled, measured over `window`.
async fn requests_per_minute_at_rest(cluster: &EtcdCluster, group: &str, partitions: u32, window: Duration) -> f64 {
    let (a, store_a) = join(cluster, group, "a", partitions).await;
    let (b, _) = join(cluster, group, "b", partitions).await;
    let settled = || {
        checks::all_owned_once(&[&a, &b], partitions) && a.assignment().borrow().owned.len() == partitions as usize / 2
    };
    assert!(wait_safely(&[&a, &b], partitions, Duration::from_secs(20), settled).await.is_some(), "never settled");
    let before = store_a.requests_sent();
    let start = Instant::now();
    assert!(wait_safely(&[&a, &b], partitions, window, || false).await.is_none());
    let sent = store_a.requests_sent() - before;
    sent as f64 * 60.0 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_partition_count() {
    let Some(cluster) = EtcdCluster::start(1).await else { return };
    let window = Duration::from_secs(3);
    let few = requests_per_minute_at_rest(&cluster, "rate16", 16, window).await;
    let many = requests_per_minute_at_rest(&cluster, "rate1024", 1024, window).await;
    println!("etcd, 2 members, retry 100 ms: {few:.0} requests/member/min at 16 partitions, {many:.0} at 1024");
    // Per retry period a member renews once and reads once per change it is told of (its own
    // renew and the other member's): at most 3 requests, whatever the partition count.
    let bound = 3.0 * 60_000.0 / timing().retry_period.as_millis() as f64 * 1.2;
    assert!(few <= bound && many <= bound, "{few:.0} or {many:.0} requests/min above {bound:.0}");
    assert!(many <= few * 1.5, "64x the partitions cost {:.2}x the requests", many / few);
}
