//! The pool's fencing on a real etcd: a deposed term can neither allocate nor release.

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use tenure_etcd::EtcdElection;
use tenure_example_ipam::pool::{IpPool, PoolError};
use tenure_testkit::etcd::EtcdCluster;
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_deposed_leader_can_neither_allocate_nor_release_and_the_new_one_gets_the_next_free_address() {
    let Some(etcd) = EtcdCluster::start(1).await else { return };
    let election = EtcdElection::connect(&[etcd.endpoint(0)], "pool-test").await.expect("connected");
    let election = election.with_drain_timeout(Duration::from_millis(100));
    let pool = IpPool::new(election.clone(), "pool-test-ips/", Ipv4Addr::new(10, 0, 0, 0), 2);
    let a = election.campaign("a", TTL).expect("campaign");
    let tenure_a = timeout(BOUND, a.acquired()).await.expect("a leads in time").expect("a leads");
    let first = pool.allocate(tenure_a.term(), "uid-1", "pod-1").await.expect("allocated");
    assert_eq!(first.ip, Ipv4Addr::new(10, 0, 0, 1));

    let b = election.campaign("b", TTL).expect("campaign");
    let term_a = tenure_a.term();
    drop(tenure_a);
    a.resign().await.expect("resigned");
    let tenure_b = timeout(BOUND, b.acquired()).await.expect("b leads in time").expect("b leads");

    let late = pool.allocate(term_a, "uid-2", "pod-2").await;
    assert!(matches!(late, Err(PoolError::Fenced(term)) if term == term_a), "{late:?}");
    let late = pool.release(term_a, first.ip, first.create_revision).await;
    assert!(matches!(late, Err(PoolError::Fenced(_))), "{late:?}");
    let second = pool.allocate(tenure_b.term(), "uid-2", "pod-2").await.expect("allocated");
    assert_eq!(second.ip, Ipv4Addr::new(10, 0, 0, 2));
    let exhausted = pool.allocate(tenure_b.term(), "uid-3", "pod-3").await;
    assert!(matches!(exhausted, Err(PoolError::Exhausted(2))), "{exhausted:?}");
    assert_eq!(pool.release_pod(tenure_b.term(), "uid-1").await.expect("released"), 1);
    let owners: Vec<String> = pool.list().await.expect("listed").into_iter().map(|a| a.record.pod_uid).collect();
    assert_eq!(owners, vec!["uid-2".to_owned()]);
    drop(tenure_b);
    b.shutdown().await.expect("shut down");
    let _ = a.shutdown().await;
}

#[tokio::test]
async fn a_partition_write_under_an_older_term_is_refused_once_the_next_owner_opened_the_partition() {
    use tenure::Term;
    use tenure_example_ipam::pool::Fence;
    let Some(etcd) = EtcdCluster::start(1).await else { return };
    let connection = EtcdElection::connect(&[etcd.endpoint(0)], "unused-election").await.expect("connected");
    let pool = IpPool::new(connection, "partitioned-ips/", Ipv4Addr::new(10, 0, 0, 0), 50);
    let old = Fence::Partition { partition: 3, term: Term(4) };
    let new = Fence::Partition { partition: 3, term: Term(5) };

    let unopened = pool.allocate(old, "uid-1", "pod-1").await;
    assert!(matches!(unopened, Err(PoolError::NotOpened { partition: 3, .. })), "{unopened:?}");
    pool.open_partition(3, Term(4)).await.expect("opened under term 4");
    let first = pool.allocate(old, "uid-1", "pod-1").await.expect("term 4 allocates");

    pool.open_partition(3, Term(5)).await.expect("the next owner opens under term 5");
    let late = pool.allocate(old, "uid-2", "pod-2").await;
    assert!(matches!(late, Err(PoolError::Fenced(Term(4)))), "{late:?}");
    let late = pool.release(old, first.ip, first.create_revision).await;
    assert!(matches!(late, Err(PoolError::Fenced(Term(4)))), "{late:?}");
    let reopen = pool.open_partition(3, Term(4)).await;
    assert!(matches!(reopen, Err(PoolError::Fenced(Term(4)))), "a fence never goes back: {reopen:?}");
    assert_eq!(pool.fence_of(3).await.expect("read"), Some(Term(5)));

    // Another partition's fence is its own: term 1 there is not older than term 5 here.
    pool.open_partition(7, Term(1)).await.expect("opened");
    pool.allocate(Fence::Partition { partition: 7, term: Term(1) }, "uid-3", "pod-3").await.expect("allocates");
    assert!(pool.release(new, first.ip, first.create_revision).await.expect("term 5 releases"));
    let owners: Vec<String> = pool.list().await.expect("listed").into_iter().map(|a| a.record.pod_uid).collect();
    assert_eq!(owners, vec!["uid-3".to_owned()]);
}
