//! Members of one group on one host through the file store: real files, the file lock's
//! compare-and-swap, inotify, real time.
//! Waits poll the members' state with a bounded deadline; no sleep is used to order events.

use std::path::PathBuf;
use std::time::Duration;

use tenure::Timing;
use tenure_group::stores::file::FileGroupStore;
use tenure_group::{checks, Group, GroupConfig};

const PARTITIONS: u32 = 16;

fn timing() -> Timing {
    Timing::new(Duration::from_secs(1), Duration::from_millis(500), Duration::from_millis(100)).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenure-group-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn join(dir: &PathBuf, identity: &str) -> Group {
    Group::builder(identity, FileGroupStore::open(dir).unwrap())
        .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
        .join()
        .unwrap()
}

async fn wait_safely(groups: &[&Group], limit: Duration, done: impl Fn() -> bool) -> Option<Duration> {
    checks::wait_safely(groups, PARTITIONS, limit, done).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_one_host_share_the_partitions_and_hand_over_on_leave_and_crash() {
    let dir = scratch("share");
    let (a, b, c) = (join(&dir, "a"), join(&dir, "b"), join(&dir, "c"));
    let all = [&a, &b, &c];
    let balanced = || {
        checks::all_owned_once(&all, PARTITIONS)
            && all.iter().all(|g| (5..=6).contains(&g.assignment().borrow().owned.len()))
    };
    assert!(wait_safely(&all, Duration::from_secs(20), balanced).await.is_some(), "never settled");

    // Graceful leave: the others own everything without waiting for a lease.
    let leave = tokio::spawn(a.leave());
    let handover =
        wait_safely(&[&b, &c], Duration::from_secs(20), || checks::all_owned_once(&[&b, &c], PARTITIONS)).await;
    assert!(handover.is_some(), "no handover after a leave");
    leave.await.unwrap().unwrap();

    // Crash (the driver stops, nothing is released): the survivor owns everything after the lease.
    drop(c);
    let failover = wait_safely(&[&b], Duration::from_secs(20), || checks::all_owned_once(&[&b], PARTITIONS)).await;
    assert!(failover.is_some(), "no failover after a crash");
    assert!(failover.unwrap() >= timing().renew_deadline, "took over before the crashed member could have stopped");
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}
