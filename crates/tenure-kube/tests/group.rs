//! Groups on a real (in-process) Kubernetes API server, held to the scenarios every group store
//! must pass ([`tenure_group::conformance`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tenure_group::conformance::{self, Joined};
use tenure_group::{Group, GroupConfig};
use tenure_kube::KubeGroupStore;
use tenure_testkit::kube::Cluster;

/// How the scenarios join a member: a client and store of its own per member.
fn joiner(cluster: Arc<Cluster>) -> impl Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = Joined> + Send>> + Sync {
    move |name, identity, partitions| {
        let (cluster, name, identity) = (cluster.clone(), name.to_owned(), identity.to_owned());
        Box::pin(async move {
            let store = KubeGroupStore::new(cluster.client(&identity).await, "default", &name);
            let config = GroupConfig { timing: conformance::timing(), partition_count: partitions, weight: 1 };
            let group = Group::builder(identity, store.clone()).config(config).join().unwrap();
            let store2 = store.clone();
            Joined { group, requests: Box::new(move || store2.requests_sent()), store: Arc::new(store) }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_members_share_partitions_hand_over_at_once_on_leave_and_after_the_lease_on_crash() {
    let cluster = Arc::new(Cluster::start().await);
    let handovers = conformance::share_leave_and_crash(&joiner(cluster), "share").await.unwrap();
    println!("Kubernetes handover: leave {:?}, crash {:?}", handovers.leave, handovers.crash);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_the_same_identity_owns_nothing_while_the_first_lives() {
    let cluster = Arc::new(Cluster::start().await);
    conformance::duplicate_identity_owns_nothing(&joiner(cluster), "dup").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_partition_count() {
    let cluster = Arc::new(Cluster::start().await);
    let (few, many) =
        conformance::requests_at_rest_do_not_grow_with_partitions(&joiner(cluster), "rate").await.unwrap();
    println!("Kubernetes, 2 members, retry 100 ms: {few:.0} requests/member/min at 16 partitions, {many:.0} at 1024");
    // Per retry period a member renews once and reads (two requests: the ConfigMap and the
    // Lease list) once per change it is told of (its own renew and the other member's).
    let bound = 5.0 * 60_000.0 / conformance::timing().retry_period.as_millis() as f64 * 1.2;
    assert!(few <= bound && many <= bound, "{few:.0} or {many:.0} requests/min above {bound:.0}");
}

/// The watch carries the records, so a member at rest applies the others' renews without reading
/// (a snapshot read per change cost 4159 and 5814 requests/member/min among 3 and 10 members before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_member_at_rest_do_not_grow_with_the_member_count() {
    let cluster = Arc::new(Cluster::start().await);
    let (three, ten) =
        conformance::requests_at_rest_do_not_grow_with_members(&joiner(cluster), "members").await.unwrap();
    println!(
        "Kubernetes, retry 100 ms, 16 partitions: {three:.0} requests/member/min among 3 members, {ten:.0} among 10"
    );
    // One renew per retry period, and nothing else at rest.
    let bound = 60_000.0 / conformance::timing().retry_period.as_millis() as f64 * 1.2;
    assert!(three <= bound && ten <= bound, "{three:.0} or {ten:.0} requests/min above {bound:.0}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_records_of_members_that_left_or_crashed_are_deleted_once_nothing_can_name_them() {
    let cluster = Arc::new(Cluster::start().await);
    let cleanups = conformance::departed_members_records_are_deleted(&joiner(cluster), "cleanup").await.unwrap();
    println!(
        "Kubernetes: record of a leaver deleted after {:?}, of a crashed member after {:?}",
        cleanups.left, cleanups.crashed
    );
}
