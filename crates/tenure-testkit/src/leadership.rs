//! Bounded waits over what electors publish, for tests that run several candidates.

use std::time::Duration;

use tenure::{Elector, Leadership};

/// Waits (bounded) until `condition` holds over the electors' latest snapshots, waking on every
/// published change; panics with the last snapshots after `limit`.
pub async fn wait_until(
    electors: &[&Elector],
    limit: Duration,
    what: &str,
    mut condition: impl FnMut(&[Leadership]) -> bool,
) {
    let mut receivers: Vec<_> = electors.iter().map(|e| e.subscribe()).collect();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let snapshots: Vec<Leadership> = receivers.iter_mut().map(|r| r.borrow_and_update().clone()).collect();
        if condition(&snapshots) {
            return;
        }
        let changes = futures::future::select_all(receivers.iter_mut().map(|r| Box::pin(r.changed())));
        if tokio::time::timeout_at(deadline, changes).await.is_err() {
            panic!("timed out after {limit:?} waiting for {what}; last snapshots: {snapshots:?}");
        }
    }
}

/// Exactly one leader, and every candidate (named `identities`, in order) names it with the same
/// term.
pub fn one_agreed_leader(snapshots: &[Leadership], identities: &[&str]) -> bool {
    let leaders: Vec<usize> = (0..snapshots.len()).filter(|&i| snapshots[i].is_leader()).collect();
    if leaders.len() != 1 {
        return false;
    }
    let leader = identities[leaders[0]];
    let term = snapshots[leaders[0]].term;
    snapshots.iter().all(|s| s.leader.as_deref() == Some(leader) && s.term == term && term.is_some())
}
