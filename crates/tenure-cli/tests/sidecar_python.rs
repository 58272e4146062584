//! The seed's controller loop for sidecar users, in Python with the `tenure` package (python/,
//! standard library only; `examples/sidecar-python/leader_worker.py`): the worker starts on gaining leadership, stops on
//! losing it, and two workers never run at once, across a kill -9 of the leader's sidecar and a
//! graceful handover (SIGTERM).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{file_url, start_elect, wait_until, TempDir, Tenure};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sidecar-python/leader_worker.py")
}

/// The `tenure` Python package, as a checkout has it.
fn package() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

/// A replica: a `tenure elect` sidecar and the Python worker next to it.
struct Replica {
    sidecar: Tenure,
    worker: Child,
}

impl Replica {
    fn start(id: &str, lock_url: &str, witness: &Path) -> Replica {
        let (sidecar, address) = start_elect(id, "py", lock_url, "2s");
        let worker = Command::new("python3")
            .arg(example())
            .env("PYTHONPATH", package())
            .args(["--sidecar", &format!("http://{address}"), "--name", id, "--item-seconds", "0.05"])
            .arg("--witness")
            .arg(witness)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 runs");
        Replica { sidecar, worker }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.worker.kill();
        let _ = self.worker.wait();
    }
}

/// One line of the witness: event, term, monotonic seconds, replica.
#[derive(Debug, Clone)]
struct Line {
    event: String,
    term: u64,
    at: f64,
    name: String,
}

fn witness(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [event, term, at, name] = parts.as_slice() else { return None };
            Some(Line {
                event: event.to_string(),
                term: term.parse().ok()?,
                at: at.parse().ok()?,
                name: name.to_string(),
            })
        })
        .collect()
}

fn started(path: &Path, name: &str) -> Option<u64> {
    witness(path).iter().rev().find(|l| l.event == "start" && l.name == name).map(|l| l.term)
}

#[test]
fn workers_start_on_gaining_stop_on_losing_and_never_overlap() {
    let dir = TempDir::new("sidecar-python");
    let lock_url = file_url(&dir.join("lock"));
    let log = dir.join("witness");
    let a = Replica::start("a", &lock_url, &log);
    wait_until(Duration::from_secs(10), || started(&log, "a")).expect("a's worker starts once a leads");
    let mut b = Replica::start("b", &lock_url, &log);

    // kill -9 of the leader's sidecar: its worker stops at once (the event stream closed), and
    // b's starts once the lease has run out.
    a.sidecar.signal(libc::SIGKILL);
    let term_b = wait_until(Duration::from_secs(10), || started(&log, "b")).expect("b's worker takes over");
    assert!(term_b > started(&log, "a").unwrap(), "a new tenure has a new term");

    // Graceful handover: SIGTERM to b's sidecar; b's worker finishes its item and lets go of its
    // hold before c's worker may start.
    let c = Replica::start("c", &lock_url, &log);
    wait_until(Duration::from_secs(10), || {
        witness(&log).iter().any(|l| l.name == "b" && l.event == "work").then_some(())
    })
    .expect("b works");
    b.sidecar.signal(libc::SIGTERM);
    let term_c = wait_until(Duration::from_secs(10), || started(&log, "c")).expect("c's worker takes over");
    assert!(term_c > term_b);
    assert_eq!(b.sidecar.exit_code(Duration::from_secs(10)), 0, "b released the lock and exited");
    wait_until(Duration::from_secs(5), || {
        witness(&log).iter().any(|l| l.name == "c" && l.event == "work").then_some(())
    })
    .expect("c works");

    // Never two workers at once: each worker's [start, stop] (or its last line while running)
    // lies entirely before the next worker's start.
    let lines = witness(&log);
    let mut runs: Vec<(String, u64, f64, f64)> = Vec::new();
    for line in &lines {
        match runs.iter_mut().find(|r| r.0 == line.name && r.1 == line.term) {
            Some(run) => run.3 = run.3.max(line.at),
            None => runs.push((line.name.clone(), line.term, line.at, line.at)),
        }
    }
    runs.sort_by(|x, y| x.2.total_cmp(&y.2));
    assert_eq!(runs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["a", "b", "c"], "{lines:?}");
    for pair in runs.windows(2) {
        assert!(
            pair[0].3 < pair[1].2,
            "{} worked until {} after {} started at {}: {lines:?}",
            pair[0].0,
            pair[0].3,
            pair[1].0,
            pair[1].2
        );
    }
    let b_stop = lines.iter().find(|l| l.name == "b" && l.event == "stop").expect("b's worker stopped gracefully");
    assert_eq!(b_stop.term, term_b);
    drop((a, c));
}
