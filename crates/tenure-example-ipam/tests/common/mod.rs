//! What the end-to-end tests of the example share: the controller binary, the etcd check, and
//! the checks every run must pass.
#![allow(dead_code)]

use std::path::PathBuf;

use tenure_example_ipam::checker::{self, Report, Scenario};
use tenure_example_ipam::etcd_server::etcd_installed;

/// The example's binary, as cargo built it for these tests.
pub fn controller() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tenure-example-ipam"))
}

/// Whether etcd is installed; without it the test is skipped, except under `CI=true`, where a
/// missing server is a failure.
pub fn etcd_or_skip() -> bool {
    if etcd_installed() {
        return true;
    }
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "etcd is not installed and CI=true");
    println!("skipped: etcd not installed");
    false
}

/// Runs `scenario` to its end and prints its summary; `None` where etcd is missing (see
/// [`etcd_or_skip`]).
pub async fn run(scenario: Scenario) -> Option<Report> {
    if !etcd_or_skip() {
        return None;
    }
    let report = checker::run(&scenario).await.expect("the run completes");
    println!("{}", report.summary());
    Some(report)
}

/// Fencing held: no address allocated twice, no Pod with two addresses, no address in use
/// collected as an orphan.
pub fn assert_fenced(report: &Report) {
    assert!(report.double_allocations.is_empty(), "{:?}", report.double_allocations);
    assert!(report.pods_with_two_ips.is_empty(), "{:?}", report.pods_with_two_ips);
    assert!(report.in_use_collected.is_empty(), "{:?}", report.in_use_collected);
}
