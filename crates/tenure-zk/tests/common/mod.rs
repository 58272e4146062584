//! What the ZooKeeper tests use: the server, candidate processes and waits of tenure-testkit, and
//! a Curator LeaderLatch probe, which only these tests run.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub use tenure_testkit::certs;
pub use tenure_testkit::clock::{instant_to_monotonic_ns, monotonic_ns};
pub use tenure_testkit::leadership::{one_agreed_leader, wait_until};
pub use tenure_testkit::process::ChildProcess;
pub use tenure_testkit::zk_candidates::{child_candidate_main, spawn_candidate, CHILD_ENV};
pub use tenure_testkit::zookeeper::{
    classpath, four_letter_word, server, tls_server, unique_path, ZkServer, SESSION_TIMEOUT,
};

/// A Curator `LeaderLatch` in a JVM, driven over stdin and stdout (see tests/java/LatchProbe.java).
pub fn spawn_latch_probe(servers: &str, path: &str, id: &str) -> ChildProcess {
    static COMPILED: OnceLock<PathBuf> = OnceLock::new();
    let classes = COMPILED.get_or_init(|| {
        let out = std::env::temp_dir().join(format!("tenure-zk-test-{}-latch-probe", std::process::id()));
        std::fs::create_dir_all(&out).expect("class dir");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/LatchProbe.java");
        let status = Command::new("javac")
            .args(["-nowarn", "-cp", &classpath(), "-d"])
            .arg(&out)
            .arg(source)
            .status()
            .expect("run javac (Debian package openjdk-17-jdk-headless)");
        assert!(status.success(), "javac failed on LatchProbe.java (Debian package libcurator-recipes-java?)");
        out
    });
    let mut command = Command::new("java");
    command
        .args(["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(format!("{}:{}", classes.display(), classpath()))
        .args(["LatchProbe", servers, path, id]);
    ChildProcess::spawn(id, command)
}
