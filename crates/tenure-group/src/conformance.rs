//! The scenarios every group store must pass, run against a real server by each backend's
//! integration tests (etcd, ZooKeeper, Kubernetes), so that all backends are held to the same
//! specification: members share the partitions, a leave hands over without waiting for a lease,
//! a crash hands over only after the crashed member's deadline, a duplicate identity owns nothing,
//! departed members' records are deleted, and the requests of a member at rest do not grow with
//! the partition count nor (where the watch carries the records) with the member count. Every wait checks
//! at every poll that no partition has two owners ([`crate::checks`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure::Timing;

use crate::checks::{all_owned_once, check_single_owners, wait_safely, TwoOwners};
use crate::store::{GroupStore, Snapshot};
use crate::Group;

/// A member joined by a backend's test: the group, and a counter of the requests its store sent.
pub struct Joined {
    /// The member.
    pub group: Group,
    /// Requests sent so far by this member's store.
    pub requests: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The member's store, to look at the records themselves.
    pub store: Arc<dyn GroupStore>,
}

/// How a backend's test joins a member: `(group name, identity, partition count)`, with
/// [`timing`] as the members' timing.
pub type Join<'a> = &'a (dyn Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = Joined> + Send>> + Sync);

/// The timing the scenarios assume: lease 1 s, renew deadline 500 ms, retry 100 ms.
pub fn timing() -> Timing {
    Timing::new(Duration::from_secs(1), Duration::from_millis(500), Duration::from_millis(100))
        .unwrap_or_else(|_| Timing::default())
}

/// A scenario that failed, and how.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The safety property broke.
    #[error(transparent)]
    TwoOwners(#[from] TwoOwners),
    /// The group did not reach the expected state within the time allowed.
    #[error("{0}")]
    Stuck(String),
    /// A handover was faster or slower than the rule allows.
    #[error("{0}")]
    Timing(String),
}

/// Times measured by [`share_leave_and_crash`].
#[derive(Debug, Clone, Copy)]
pub struct Handovers {
    /// From `leave()` until the others own every partition.
    pub leave: Duration,
    /// From the crash until the survivor owns every partition.
    pub crash: Duration,
}

const SETTLE: Duration = Duration::from_secs(20);

/// Three members share 16 partitions evenly; one leaves (the others own everything before a
/// lease could run out); one crashes (the survivor owns everything after the crashed member's
/// renew deadline, within three leases).
pub async fn share_leave_and_crash(join: Join<'_>, name: &str) -> Result<Handovers, ScenarioError> {
    const P: u32 = 16;
    let a = join(name, "a", P).await.group;
    let b = join(name, "b", P).await.group;
    let c = join(name, "c", P).await.group;
    let all = [&a, &b, &c];
    let balanced =
        || all_owned_once(&all, P) && all.iter().all(|g| (5..=6).contains(&g.assignment().borrow().owned.len()));
    wait_safely(&all, P, SETTLE, balanced).await?.ok_or_else(|| ScenarioError::Stuck("never settled".into()))?;
    if a.members() != ["a", "b", "c"] {
        return Err(ScenarioError::Stuck(format!("members seen: {:?}", a.members())));
    }
    let leave = tokio::spawn(a.leave());
    let leave_took = wait_safely(&[&b, &c], P, SETTLE, || all_owned_once(&[&b, &c], P))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("no handover after a leave".into()))?;
    if leave_took >= timing().lease_duration {
        return Err(ScenarioError::Timing(format!("a leave waited for a lease: {leave_took:?}")));
    }
    if let Ok(Err(error)) = leave.await {
        return Err(ScenarioError::Stuck(format!("leave failed: {error}")));
    }
    drop(c);
    let crash_took = wait_safely(&[&b], P, SETTLE, || all_owned_once(&[&b], P))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("no failover after a crash".into()))?;
    if crash_took < timing().renew_deadline || crash_took > timing().lease_duration * 3 {
        return Err(ScenarioError::Timing(format!("failover after {crash_took:?}")));
    }
    Ok(Handovers { leave: leave_took, crash: crash_took })
}

/// A second process with a live member's identity owns nothing for two leases, and the first
/// keeps every partition.
pub async fn duplicate_identity_owns_nothing(join: Join<'_>, name: &str) -> Result<(), ScenarioError> {
    const P: u32 = 8;
    let first = join(name, "same", P).await.group;
    wait_safely(&[&first], P, SETTLE, || all_owned_once(&[&first], P))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("the first member never owned everything".into()))?;
    let second = join(name, "same", P).await.group;
    wait_safely(&[&first, &second], P, timing().lease_duration * 2, || false).await?;
    if !all_owned_once(&[&first], P) || !second.assignment().borrow().owned.is_empty() {
        return Err(ScenarioError::Stuck("a duplicate identity took partitions from a live member".into()));
    }
    Ok(())
}

/// The requests per minute of a member at rest with 16 and with 1024 partitions (3 s each);
/// fails if 64 times the partitions cost more than 1.5 times the requests.
pub async fn requests_at_rest_do_not_grow_with_partitions(
    join: Join<'_>,
    name: &str,
) -> Result<(f64, f64), ScenarioError> {
    let window = Duration::from_secs(3);
    let few = requests_per_member_per_minute_at_rest(join, &format!("{name}16"), 2, 16, window).await?;
    let many = requests_per_member_per_minute_at_rest(join, &format!("{name}1024"), 2, 1024, window).await?;
    if many > few * 1.5 {
        return Err(ScenarioError::Stuck(format!("{few:.0} requests/min at 16 partitions, {many:.0} at 1024")));
    }
    Ok((few, many))
}

/// Requests per minute of one member among `members` settled members at rest over `window`, with
/// `partitions` partitions: the load a member puts on the store while nothing happens but renews.
pub async fn requests_per_member_per_minute_at_rest(
    join: Join<'_>,
    name: &str,
    members: usize,
    partitions: u32,
    window: Duration,
) -> Result<f64, ScenarioError> {
    let p = partitions;
    let first = join(name, "m00", p).await;
    let mut groups = vec![first.group];
    for index in 1..members {
        groups.push(join(name, &format!("m{index:02}"), p).await.group);
    }
    let all: Vec<&Group> = groups.iter().collect();
    let share = p as usize / members;
    let settled = || {
        all_owned_once(&all, p)
            && all.iter().all(|g| g.members().len() == members && g.assignment().borrow().owned.len() >= share)
    };
    wait_safely(&all, p, SETTLE, settled).await?.ok_or_else(|| ScenarioError::Stuck("never settled".into()))?;
    // Let the claims' and the joins' notifications die down before counting.
    wait_safely(&all, p, timing().retry_period * 5, || false).await?;
    let before = (first.requests)();
    let start = Instant::now();
    wait_safely(&all, p, window, || false).await?;
    let sent = (first.requests)() - before;
    Ok(sent as f64 * 60.0 / start.elapsed().as_secs_f64())
}

/// The requests per minute of a member at rest among 3 and among 10 members (3 s each); fails if
/// the 10-member figure is more than 1.5 times the 3-member one (at rest a member renews, and
/// applies the others' renews from its watch without reading the whole group).
pub async fn requests_at_rest_do_not_grow_with_members(
    join: Join<'_>,
    name: &str,
) -> Result<(f64, f64), ScenarioError> {
    let window = Duration::from_secs(3);
    let three = requests_per_member_per_minute_at_rest(join, &format!("{name}3"), 3, 16, window).await?;
    let ten = requests_per_member_per_minute_at_rest(join, &format!("{name}10"), 10, 16, window).await?;
    if ten > three * 1.5 {
        return Err(ScenarioError::Stuck(format!("{three:.0} requests/min among 3 members, {ten:.0} among 10")));
    }
    Ok((three, ten))
}

/// Polls `store` until `done` holds for a snapshot (`Ok(Some(elapsed))`) or `limit` passed,
/// checking at every poll that no partition of `groups` has two owners.
async fn wait_for_records(
    groups: &[&Group],
    partitions: u32,
    store: &dyn GroupStore,
    limit: Duration,
    done: impl Fn(&Snapshot) -> bool,
) -> Result<Option<Duration>, ScenarioError> {
    let start = Instant::now();
    loop {
        check_single_owners(groups, partitions)?;
        if store.read().await.is_ok_and(|snapshot| done(&snapshot)) {
            return Ok(Some(start.elapsed()));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Times measured by [`departed_members_records_are_deleted`].
#[derive(Debug, Clone, Copy)]
pub struct Cleanups {
    /// From `leave()` until the leaver's record is gone.
    pub left: Duration,
    /// From the crash until the crashed member's record is gone.
    pub crashed: Duration,
}

/// Three members; one leaves (its record is deleted once the others own its partitions, without
/// waiting for a lease); one crashes (its record is expired after its lease and deleted after
/// another stretched lease, never before the lease ran out). The survivor owns everything.
pub async fn departed_members_records_are_deleted(join: Join<'_>, name: &str) -> Result<Cleanups, ScenarioError> {
    const P: u32 = 8;
    let a = join(name, "a", P).await;
    let b = join(name, "b", P).await.group;
    let c = join(name, "c", P).await.group;
    let all = [&a.group, &b, &c];
    let settled = || all_owned_once(&all, P) && all.iter().all(|g| g.members().len() == 3);
    wait_safely(&all, P, SETTLE, settled).await?.ok_or_else(|| ScenarioError::Stuck("never settled".into()))?;
    let leave = tokio::spawn(b.leave());
    let left = wait_for_records(&[&a.group, &c], P, &*a.store, SETTLE, |s| !s.members.contains_key("b"))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("the record of a member that left was never deleted".into()))?;
    if let Ok(Err(error)) = leave.await {
        return Err(ScenarioError::Stuck(format!("leave failed: {error}")));
    }
    drop(c);
    let crashed = wait_for_records(&[&a.group], P, &*a.store, SETTLE, |s| !s.members.contains_key("c"))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("the record of a crashed member was never deleted".into()))?;
    if crashed < timing().lease_duration * 2 {
        return Err(ScenarioError::Timing(format!("a crashed member's record was deleted after {crashed:?}")));
    }
    wait_safely(&[&a.group], P, SETTLE, || all_owned_once(&[&a.group], P))
        .await?
        .ok_or_else(|| ScenarioError::Stuck("the survivor does not own everything".into()))?;
    let snapshot = a.store.read().await.map_err(|e| ScenarioError::Stuck(e.to_string()))?;
    if snapshot.members.keys().collect::<Vec<_>>() != ["a"] {
        return Err(ScenarioError::Stuck(format!("records left: {:?}", snapshot.members.keys())));
    }
    Ok(Cleanups { left, crashed })
}
