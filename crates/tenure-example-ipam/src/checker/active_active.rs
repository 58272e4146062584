//! The checker's faults in Active/Active mode: the members are hit in turn (SIGKILL, SIGSTOP past
//! the lease then SIGCONT, SIGTERM, an injected crash between allocate and annotate), and after
//! each a new member joins. Each step waits, by polling the group's partition table in etcd with a
//! bounded deadline, until the group has settled: every partition owned by a running member that
//! was not hit, and every such member owning some.
//!
//! Why wait for the table rather than a fixed time: the handoff is what is under test; the next
//! fault must hit a group whose partitions have just moved (drained, fenced, reconciled), and a
//! group that never settles is a failure to report, not to sleep through.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use nix::sys::signal::Signal;
use tenure_etcd::EtcdGroupStore;
use tenure_group::store::GroupStore;
use tokio::time::Instant;

use super::{create_pod, signal, CheckerError, Harness, Observations, Report, LEADER_BOUND, SAMPLE_EVERY};
use crate::active_active::GROUP;
use crate::controller::CRASH_EXIT_CODE;
use crate::witness::{now_nanos, Frozen};

/// Runs the scenario's faults against the group's members.
pub(super) async fn member_faults(
    harness: &mut Harness,
    pods: &Api<Pod>,
    observer: &Arc<Mutex<Observations>>,
    report: &mut Report,
    frozen: &mut Frozen,
) -> Result<(), CheckerError> {
    let store = EtcdGroupStore::connect(std::slice::from_ref(&harness.etcd), GROUP).await?;
    settle(&store, harness, &[], "the start").await?;
    let took_over = |observer: &Arc<Mutex<Observations>>| {
        observer.lock().unwrap_or_else(|e| e.into_inner()).takeovers.push(Instant::now());
    };
    for fault in 0..harness.scenario.faults {
        tokio::time::sleep(harness.scenario.fault_spacing).await;
        // A different member each round of four faults.
        let index = (fault / 4) % harness.replicas.len();
        let identity = harness.replicas[index].identity.clone();
        let pid = harness.pid(index)?;
        match fault % 4 {
            0 => {
                frozen.entry(identity.clone()).or_default().push((now_nanos(), u128::MAX));
                signal(pid, Signal::SIGKILL)?;
                report.kills += 1;
                settle(&store, harness, &[identity], "SIGKILL").await?;
            }
            1 => {
                let from = now_nanos();
                signal(pid, Signal::SIGSTOP)?;
                report.pauses += 1;
                let settled = settle(&store, harness, std::slice::from_ref(&identity), "SIGSTOP").await;
                // Stay paused past the lease for sure, then let the old owner wake up and try.
                tokio::time::sleep(harness.scenario.ttl).await;
                signal(pid, Signal::SIGCONT)?;
                frozen.entry(identity).or_default().push((from, now_nanos()));
                settled?;
                took_over(observer);
                settle(&store, harness, &[], "SIGCONT (the member rejoins)").await?;
                report.membership_changes += 2;
                continue;
            }
            2 => {
                signal(pid, Signal::SIGTERM)?;
                report.stops += 1;
                wait_for_exit(harness, Some(&identity), "SIGTERM").await?;
                settle(&store, harness, &[identity], "SIGTERM").await?;
            }
            _ => {
                create_pod(pods, &format!("crash-{fault}"), true).await?;
                let crashed = wait_for_exit(harness, None, "an injected crash").await?;
                frozen.entry(crashed.clone()).or_default().push((now_nanos(), u128::MAX));
                settle(&store, harness, &[crashed], "an injected crash").await?;
            }
        }
        took_over(observer);
        harness.restart_exited(report)?;
        settle(&store, harness, &[], "a join").await?;
        report.membership_changes += 2;
    }
    Ok(())
}

/// Polls until the replica `identity` (or, if `None`, any replica) has exited; returns who.
async fn wait_for_exit(harness: &mut Harness, identity: Option<&str>, after: &str) -> Result<String, CheckerError> {
    let deadline = Instant::now() + LEADER_BOUND;
    loop {
        for replica in &mut harness.replicas {
            if identity.is_some_and(|wanted| wanted != replica.identity) {
                continue;
            }
            if let Ok(Some(status)) = replica.child.try_wait() {
                if identity.is_some() || status.code() == Some(CRASH_EXIT_CODE) {
                    return Ok(replica.identity.clone());
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(CheckerError::Process(format!("no replica exited within {LEADER_BOUND:?} after {after}")));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// Polls the partition table until every partition is owned by a running replica not in
/// `excluded` and every such replica owns at least one.
pub(crate) async fn settle(
    store: &EtcdGroupStore,
    harness: &mut Harness,
    excluded: &[String],
    after: &str,
) -> Result<(), CheckerError> {
    let deadline = Instant::now() + LEADER_BOUND;
    loop {
        let running: BTreeSet<String> = harness
            .replicas
            .iter_mut()
            .filter_map(|r| {
                let running = !excluded.contains(&r.identity) && matches!(r.child.try_wait(), Ok(None));
                running.then(|| r.identity.clone())
            })
            .collect();
        if let Ok(Some(table)) = store.read().await.map(|snapshot| snapshot.table) {
            let owners: Vec<Option<&str>> =
                table.value.slots.iter().map(|slot| slot.owner.as_ref().map(|o| o.member.as_str())).collect();
            let all_owned = owners.iter().all(|owner| owner.is_some_and(|member| running.contains(member)));
            let all_work = running.iter().all(|member| owners.contains(&Some(member.as_str())));
            if all_owned && all_work {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(CheckerError::NoLeader(LEADER_BOUND, format!("{after} (the group did not settle)")));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}
