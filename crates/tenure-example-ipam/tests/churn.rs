//! The end-to-end proof: three controller processes on etcd and the in-process API server, under
//! Pod churn, SIGKILL, SIGSTOP past the lease, SIGTERM and a crash between allocate and annotate.

mod common;

use common::{assert_fenced, controller, run};
use tenure_example_ipam::checker::Scenario;

/// Faults per run: one of each kind (kill, pause, graceful stop, injected crash).
const FAULTS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resume_no_address_is_doubled_no_deletion_is_missed_and_orphans_go_within_gc_period_plus_grace() {
    let Some(report) = run(Scenario::short(controller(), true, FAULTS)).await else { return };
    assert!(report.leader_changes >= FAULTS, "{}", report.summary());
    assert_eq!(report.injected_crashes, 1, "{}", report.summary());
    assert_eq!(report.failed_resumes, 0, "every takeover resumes from the checkpoint: {}", report.summary());
    assert!(report.pods_deleted > 0 && report.orphans_seen >= 1, "{}", report.summary());
    assert_fenced(&report);
    assert!(report.missed_deletions.is_empty(), "{:?}", report.missed_deletions);
    assert_eq!(report.unannotated_pods, 0, "{}", report.summary());
    assert_eq!(report.orphans_collected, report.orphans_seen, "{}", report.summary());
    assert!(report.orphan_latency_max <= report.orphan_bound, "{}", report.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resume_deletions_made_while_nobody_leads_are_missed_for_good_as_in_kuryr() {
    let Some(report) = run(Scenario::short(controller(), false, FAULTS)).await else { return };
    assert!(report.leader_changes >= FAULTS, "{}", report.summary());
    assert!(!report.missed_deletions.is_empty(), "Kuryr's watch-from-now must miss deletions: {}", report.summary());
    // Fencing still holds: what is lost is liveness (leaked addresses), not safety.
    assert_fenced(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_resume_has_expired_the_relist_and_the_collector_still_release_every_deleted_pods_address() {
    // The API server forgets events after 200 ms: every takeover (>= 2 s) gets 410 Expired.
    let scenario = Scenario {
        event_window: Some(std::time::Duration::from_millis(200)),
        ..Scenario::short(controller(), true, 2)
    };
    let Some(report) = run(scenario).await else { return };
    assert!(report.leader_changes >= 2, "{}", report.summary());
    assert!(report.failed_resumes >= 2, "the resumes must have expired: {}", report.summary());
    assert!(report.pods_deleted > 0, "{}", report.summary());
    assert!(report.missed_deletions.is_empty(), "{:?}", report.missed_deletions);
    assert_fenced(&report);
    assert_eq!(report.unannotated_pods, 0, "{}", report.summary());
}
