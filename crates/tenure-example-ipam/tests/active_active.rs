//! Active/Active end to end: three members of a group on etcd share the Pods by partition, under
//! Pod churn, SIGKILL, SIGSTOP past the lease, SIGTERM, an injected crash and a join after each;
//! and the control: members that ignore revocations must be caught by the same checker.

mod common;

use common::{assert_fenced, controller, run};
use tenure_example_ipam::checker::Scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_never_handle_one_pod_at_once_never_double_allocate_and_miss_no_deletion_across_kills_pauses_stops_and_joins(
) {
    // One fault of each kind (kill, pause past the lease, graceful stop, injected crash), each
    // followed by a join: 8 membership changes.
    let Some(report) = run(Scenario::active_active(controller(), 4)).await else { return };
    assert_eq!(report.membership_changes, 8, "{}", report.summary());
    assert_eq!((report.kills, report.pauses, report.stops, report.injected_crashes), (1, 1, 1, 1));
    assert!(report.handlers > 0 && report.pods_deleted > 0 && report.orphans_seen >= 1, "{}", report.summary());
    assert!(report.handler_overlaps.is_empty(), "{:?}", report.handler_overlaps);
    assert_fenced(&report);
    assert!(report.missed_deletions.is_empty(), "{:?}", report.missed_deletions);
    assert_eq!(report.unannotated_pods, 0, "{}", report.summary());
    assert_eq!(report.orphans_collected, report.orphans_seen, "{}", report.summary());
    assert!(report.orphan_latency_max <= report.orphan_bound, "{}", report.summary());
    assert!(report.is_clean(), "{}", report.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_that_ignore_revocations_are_reported_handling_one_pod_at_once() {
    // Partitions move as members join (at the start, after a kill, after a pause); the broken ones keep
    // handling the Pods of partitions they gave away, without draining them.
    let scenario = Scenario { ignore_revocation: true, ..Scenario::active_active(controller(), 2) };
    let Some(report) = run(scenario).await else { return };
    assert!(!report.handler_overlaps.is_empty(), "the checker missed the broken drain: {}", report.summary());
    assert!(!report.is_clean());
}
