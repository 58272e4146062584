//! What the end-to-end tests of the example share: the controller binary, the etcd check, and
//! the checks every run must pass.
#![allow(dead_code)]

use std::path::PathBuf;

use tenure_example_ipam::checker::{self, Report, Scenario};
use tenure_testkit::etcd::etcd_available;

/// The example's binary, as cargo built it for these tests.
pub fn controller() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tenure-example-ipam"))
}

/// Runs `scenario` to its end and prints its summary; `None` where etcd is missing (see
/// [`etcd_available`]).
pub async fn run(scenario: Scenario) -> Option<Report> {
    if !etcd_available() {
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
