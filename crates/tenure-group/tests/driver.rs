//! The async driver over the memory store, on tokio's paused clock: what a controller author sees.

use std::time::Duration;

use tenure::Timing;
use tenure_group::stores::memory::MemoryGroupStore;
use tenure_group::{Group, GroupConfig};
use tokio::time::Instant;

const PARTITIONS: u32 = 12;

fn timing() -> Timing {
    // lease 4 s, renew deadline 2 s, retry 1 s
    Timing::from_ttl(Duration::from_secs(4)).unwrap()
}

fn join(store: &MemoryGroupStore, identity: &str) -> Group {
    Group::builder(identity, store.client(identity))
        .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
        .drain_timeout(Duration::from_secs(60))
        .join()
        .unwrap()
}

/// Waits (in virtual time) until `done` holds, at most `limit`; returns how long it took.
async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Some(start.elapsed())
}

fn owners_of(groups: &[&Group], partition: u32) -> Vec<String> {
    groups.iter().filter(|g| g.guard(partition).is_some()).map(|g| g.identity().to_owned()).collect()
}

fn settled(groups: &[&Group]) -> bool {
    let share = PARTITIONS as usize / groups.len();
    (0..PARTITIONS).all(|p| owners_of(groups, p).len() == 1)
        && groups.iter().all(|g| g.assignment().borrow().owned.len() == share)
}

#[tokio::test(start_paused = true)]
async fn three_members_split_the_partitions_and_every_key_has_exactly_one_owner() {
    let store = MemoryGroupStore::new();
    let (a, b, c) = (join(&store, "a"), join(&store, "b"), join(&store, "c"));
    let groups = [&a, &b, &c];
    assert!(wait_until(Duration::from_secs(10), || settled(&groups)).await.is_some(), "never settled");
    for i in 0..200 {
        let key = format!("default/pod-{i}");
        let owners: Vec<_> = groups.iter().filter(|g| g.belongs_to_self(&key).is_some()).collect();
        assert_eq!(owners.len(), 1, "{key}");
        for g in groups {
            assert_eq!(g.members_for_object(&key), vec![owners[0].identity().to_owned()]);
        }
    }
    assert_eq!(a.members(), vec!["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leave_waits_for_the_guards_then_hands_over_at_once() {
    let store = MemoryGroupStore::new();
    let (a, b) = (join(&store, "a"), join(&store, "b"));
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a, &b])).await.is_some());
    let partition = *a.assignment().borrow().owned.keys().next().unwrap();
    let guard = a.guard(partition).unwrap();
    let old_term = guard.term();

    let leaving = tokio::spawn(a.leave());
    // While the guard is held, nobody else takes the partition, however long it takes.
    assert!(wait_until(Duration::from_secs(30), || b.guard(partition).is_some()).await.is_none());
    assert!(guard.check().is_err(), "a revoked partition's guard must fail its check");
    drop(guard);
    let handover = wait_until(Duration::from_secs(5), || (0..PARTITIONS).all(|p| b.guard(p).is_some())).await;
    let handover = handover.expect("b never got a's partitions");
    // The release hands the partition over: one store round trip, instant on the memory store.
    assert!(handover < Duration::from_millis(50), "handover took {handover:?}");
    assert!(b.guard(partition).unwrap().term() > old_term);
    leaving.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn after_a_crash_the_survivors_own_everything_within_the_lease() {
    let store = MemoryGroupStore::new();
    let (a, b, c) = (join(&store, "a"), join(&store, "b"), join(&store, "c"));
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a, &b, &c])).await.is_some());
    drop(a); // a crash: nothing released
    let took = wait_until(Duration::from_secs(30), || settled(&[&b, &c])).await.expect("never recovered");
    let lease = timing().lease_duration;
    assert!(took >= timing().renew_deadline, "took over after {took:?}, before a could have stopped");
    assert!(took <= lease + Duration::from_millis(50), "took over after {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_member_cut_off_from_the_store_stops_owning_before_anyone_takes_over() {
    let store = MemoryGroupStore::new();
    let (a, b) = (join(&store, "a"), join(&store, "b"));
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a, &b])).await.is_some());
    let first_epoch = a.assignment().borrow().epoch;
    store.set_unreachable("a", true);
    // At every millisecond until b owns everything, no partition has two owners.
    let mut b_owns_all = false;
    for _ in 0..20_000 {
        for p in 0..PARTITIONS {
            assert!(owners_of(&[&a, &b], p).len() <= 1, "partition {p} has two owners");
        }
        if (0..PARTITIONS).all(|p| b.guard(p).is_some()) {
            b_owns_all = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(b_owns_all, "b never took over a's partitions");
    assert!(a.assignment().borrow().owned.is_empty());
    // Once reachable again, a rejoins with a new epoch and gets its share back.
    store.set_unreachable("a", false);
    assert!(wait_until(Duration::from_secs(30), || settled(&[&a, &b])).await.is_some());
    assert!(a.assignment().borrow().epoch > first_epoch);
}

#[tokio::test(start_paused = true)]
async fn two_processes_with_one_identity_never_both_own_and_the_second_waits() {
    let store = MemoryGroupStore::new();
    let first = join(&store, "same");
    assert!(wait_until(Duration::from_secs(10), || settled(&[&first])).await.is_some());
    let second = Group::builder("same", store.client("same-2"))
        .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
        .join()
        .unwrap();
    for _ in 0..10_000 {
        assert!(second.assignment().borrow().owned.is_empty(), "the duplicate owns partitions");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(settled(&[&first]));
    // When the first goes away, the second takes the identity over (after the lease).
    drop(first);
    assert!(wait_until(Duration::from_secs(30), || settled(&[&second])).await.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_member_configured_with_another_partition_count_uses_the_groups() {
    let store = MemoryGroupStore::new();
    let a = join(&store, "a");
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a])).await.is_some());
    let b = Group::builder("b", store.client("b"))
        .config(GroupConfig { timing: timing(), partition_count: 64, weight: 1 })
        .join()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a, &b])).await.is_some());
    assert_eq!(b.assignment().borrow().partition_count, PARTITIONS);
    for i in 0..100 {
        let key = format!("ns/obj-{i}");
        assert_eq!(a.partition_of(&key), b.partition_of(&key));
    }
}

#[tokio::test(start_paused = true)]
async fn at_rest_a_member_writes_once_per_retry_period_whatever_the_partition_count() {
    for partitions in [8, 1024] {
        let store = MemoryGroupStore::new();
        let config = GroupConfig { timing: timing(), partition_count: partitions, weight: 1 };
        let groups: Vec<Group> = ["a", "b", "c"]
            .iter()
            .map(|id| Group::builder(*id, store.client(*id)).config(config).join().unwrap())
            .collect();
        let refs: Vec<&Group> = groups.iter().collect();
        let settled = wait_until(Duration::from_secs(10), || {
            (0..partitions).all(|p| refs.iter().filter(|g| g.guard(p).is_some()).count() == 1)
        });
        assert!(settled.await.is_some());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let before = store.requests("a");
        tokio::time::sleep(Duration::from_secs(60)).await;
        let after = store.requests("a");
        // One renew per retry period (1 s): 60 a minute.
        assert_eq!(after.writes - before.writes, 60, "{partitions} partitions");
    }
}

#[tokio::test(start_paused = true)]
async fn at_rest_a_member_reads_once_per_lease_whatever_the_member_count() {
    for members in [3, 10] {
        let store = MemoryGroupStore::new();
        let groups: Vec<Group> = (0..members).map(|i| join(&store, &format!("m{i:02}"))).collect();
        let refs: Vec<&Group> = groups.iter().collect();
        let settled = wait_until(Duration::from_secs(10), || {
            (0..PARTITIONS).all(|p| refs.iter().filter(|g| g.guard(p).is_some()).count() == 1)
                && refs.iter().all(|g| g.members().len() == members)
        });
        assert!(settled.await.is_some(), "{members} members never settled");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let before = store.requests("m00");
        tokio::time::sleep(Duration::from_secs(60)).await;
        let after = store.requests("m00");
        // The others' renews arrive with the watch; the only read is the safety-net read once per
        // lease (4 s), and one renew per retry period.
        let reads = after.reads - before.reads;
        assert!((14..=16).contains(&reads), "{members} members: {reads} reads in 60 s");
        assert_eq!(after.writes - before.writes, 60, "{members} members");
        // And the view stays live: every member still sees all the others.
        assert!(refs.iter().all(|g| g.members().len() == members));
    }
}

#[tokio::test(start_paused = true)]
async fn a_leave_without_guards_hands_over_without_waiting_for_a_retry_period() {
    let store = MemoryGroupStore::new();
    let (a, b) = (join(&store, "a"), join(&store, "b"));
    assert!(wait_until(Duration::from_secs(10), || settled(&[&a, &b])).await.is_some());
    let leaving = tokio::spawn(a.leave());
    let handover = wait_until(Duration::from_secs(5), || (0..PARTITIONS).all(|p| b.guard(p).is_some())).await;
    // Revoke, drain (nothing to wait for), release with the handover: store calls only, no timer (retry 1 s).
    assert!(handover.expect("no handover") < Duration::from_millis(10), "handover took {handover:?}");
    leaving.await.unwrap().unwrap();
}

#[test]
fn joining_outside_a_runtime_is_an_error_not_a_panic() {
    let store = MemoryGroupStore::new();
    let result = Group::builder("a", store.client("a")).join();
    assert!(matches!(result, Err(tenure_group::GroupError::NoRuntime)));
}

#[tokio::test]
async fn an_empty_identity_or_a_zero_partition_count_is_refused() {
    let store = MemoryGroupStore::new();
    assert!(Group::builder("", store.client("x")).join().is_err());
    assert!(Group::builder("a", store.client("a")).partition_count(0).join().is_err());
    assert!(Group::builder("a", store.client("a")).weight(0).join().is_err());
}
