//! What the end-to-end tests of the example share: the controller binary and the etcd check.

use std::path::PathBuf;

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
