//! `tenure-chaos` end to end on the file lock: real `tenure elect` processes, a real SIGKILL of the
//! leader, and the broken configuration that the checker must report.

use std::path::PathBuf;
use std::process::Command;

const CHAOS: &str = env!("CARGO_BIN_EXE_tenure-chaos");

/// The `tenure` binary next to `tenure-chaos` (built by `cargo build --workspace`); `None` (after
/// saying so) when it is missing outside CI, a failure in CI.
fn tenure_binary() -> Option<PathBuf> {
    let path = PathBuf::from(CHAOS).with_file_name("tenure");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{} is missing and CI=true: build it with `cargo build -p tenure-cli`", path.display());
    }
    println!("skipped: {} is missing (cargo build -p tenure-cli)", path.display());
    None
}

fn out_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tenure-chaos-test-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_killed_leader_is_replaced_without_overlap_and_a_split_lock_is_caught_as_dual_leaders() {
    let Some(tenure) = tenure_binary() else { return };
    let out = out_dir("e2e");
    let status = Command::new(CHAOS)
        .args(["--backends", "file", "--modes", "elect", "--faults", "sigkill,split-lock", "--rounds", "2"])
        .arg("--tenure")
        .arg(&tenure)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("run tenure-chaos");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).expect("results.json")).expect("JSON");
    let rows = results["rows"].as_array().expect("rows");
    let row =
        |fault: &str| rows.iter().find(|r| r["fault"].as_str().is_some_and(|f| f.starts_with(fault))).expect(fault);

    let kill = row("sigkill");
    assert_eq!(kill["rounds"], 2);
    assert_eq!(kill["dual_leaders"], 0, "{kill}");
    assert_eq!(kill["term_regressions"], 0, "{kill}");
    assert_eq!(kill["without_takeover"], 0, "{kill}");
    // A follower takes over when the lease (1 s) of the last renew it saw runs out.
    let max = kill["failover_ms"]["max"].as_f64().expect("failover measured");
    assert!((500.0..3000.0).contains(&max), "failover {max} ms");

    let split = row("split lock");
    assert_eq!(split["control"], true);
    assert!(split["dual_leaders"].as_u64().expect("count") > 0, "two locks, two leaders: {split}");

    assert!(
        status.success(),
        "every row as it must be: {}",
        std::fs::read_to_string(out.join("results.txt")).unwrap_or_default()
    );
    let svg = std::fs::read_to_string(out.join("timelines").join("file-split-lock.svg")).expect("timeline");
    assert!(svg.contains("dual leader"), "the timeline marks the dual leader");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_missing_tenure_binary_is_a_clear_error_not_a_run() {
    let out = out_dir("missing");
    let output = Command::new(CHAOS)
        .args(["--backends", "file", "--tenure", "/nonexistent/tenure", "--out"])
        .arg(&out)
        .output()
        .expect("run tenure-chaos");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cargo build -p tenure-cli"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The processes whose command line mentions `needle` (the run's own directory).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|line| line.contains(needle) && !line.starts_with(CHAOS))
        .collect()
}

#[test]
fn an_interrupted_run_stops_everything_it_started_and_says_so() {
    let Some(tenure) = tenure_binary() else { return };
    let out = out_dir("interrupt");
    let mut chaos = Command::new(CHAOS)
        .args(["--backends", "file", "--modes", "run", "--faults", "sigstop", "--rounds", "50"])
        .arg("--tenure")
        .arg(&tenure)
        .arg("--out")
        .arg(&out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tenure-chaos");
    // Wait (bounded) until a round froze a leader: its command was started, so a whole process
    // tree is out there.
    let witness = out.join("logs/file/file-run-sigstop/witness.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_to_string(&witness).is_ok_and(|w| w.lines().count() > 20) {
        assert!(std::time::Instant::now() < deadline, "no witness lines within 20 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!processes_mentioning(out.to_str().unwrap()).is_empty(), "candidates are running");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(chaos.id() as i32, libc::SIGINT) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = chaos.try_wait().expect("wait") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "tenure-chaos did not stop within 20 s of SIGINT");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut chaos.stderr.take().expect("piped"), &mut stderr).expect("stderr");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = processes_mentioning(out.to_str().unwrap());
    assert!(left.is_empty(), "left running: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
}
