//! `cargo bench -p tenure-bench --bench many_elections`
//!
//! Steady-state cost of many concurrent elections in one process on the memory lock, at
//! client-go's default timing (15 s lease, 10 s renew deadline, 2 s retry). Goal: 10,000
//! elections in at most 10 % of one core and 100 MB resident.
//!
//! Method: each election is its own `MemoryStore`; each candidate is
//! `Elector::builder(id, store.client(id)).spawn()`. Each variant runs in a fresh child process
//! (this same binary, re-executed), so that its RSS and CPU are its own: it spawns the electors,
//! waits until every election has a leader, lets the start-up burst settle, then reads
//! utime+stime from /proc/self/stat before and after a window of at least 20 s (CPU % of one core
//! = CPU time / wall time), and VmRSS / VmHWM from /proc/self/status at the end. The window is
//! also cut into 2 s slices (one renew period), whose CPU % (from /proc/self/task/*/schedstat,
//! in nanoseconds) shows how steady the load is: their median is robust to a noisy neighbour. Variants:
//! 10,000 x 1 candidate on a current-thread and on a multi-thread tokio runtime, then 3,333 x 3
//! candidates on whichever of the two was cheaper.
//!
//! Settings: TENURE_BENCH_WINDOW_SECS (default 20), TENURE_BENCH_ELECTIONS (default 10000).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tenure::locks::memory::MemoryStore;
use tenure::Elector;
use tenure_bench::process::ChildGuard;
use tenure_bench::procfs::{self, Target};
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize};

/// Set in a child process: which variant to run.
const VARIANT_ENV: &str = "TENURE_BENCH_MANY_ELECTIONS_VARIANT";
/// Marks the line of a child's standard output that carries its result.
const RESULT_PREFIX: &str = "RESULT ";
/// After every election has a leader: time for the acquisition burst to die down.
const SETTLE: Duration = Duration::from_secs(3);
/// The most a variant may take to have a leader in every election.
const ALL_LEAD_LIMIT: Duration = Duration::from_secs(60);
/// The window is cut into slices of one renew period (client-go's retry period) to show how
/// steady the load is.
const SLICE: Duration = Duration::from_secs(2);
const GOAL_CPU_PERCENT: f64 = 10.0;
const GOAL_RSS_MB: f64 = 100.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Flavor {
    CurrentThread,
    MultiThread,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Variant {
    flavor: Flavor,
    elections: usize,
    candidates: usize,
    window_secs: u64,
}

impl Variant {
    fn label(&self) -> String {
        let flavor = match self.flavor {
            Flavor::CurrentThread => "current-thread",
            Flavor::MultiThread => "multi-thread",
        };
        format!("{} x {} ({flavor})", self.elections, self.candidates)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    variant: Variant,
    /// From the first spawn until every election had a leader.
    all_lead_ms: f64,
    window_s: f64,
    cpu_percent: f64,
    /// CPU % of the 2 s slices of the window (schedstat): the median and the worst.
    slice_cpu_p50: f64,
    slice_cpu_max: f64,
    rss_mb: f64,
    hwm_mb: f64,
    anon_mb: f64,
    /// RSS of the process before any elector existed.
    baseline_rss_mb: f64,
    /// Elections whose leader or term changed during the window (should be 0).
    leader_changes: usize,
    /// Lock calls per second during the window, all elections together.
    reads_per_s: f64,
    writes_per_s: f64,
    worker_threads: usize,
}

fn main() {
    if let Ok(spec) = std::env::var(VARIANT_ENV) {
        let variant: Variant = serde_json::from_str(&spec).expect("a variant description from the parent");
        let outcome = run_variant(variant);
        println!("{RESULT_PREFIX}{}", serde_json::to_string(&outcome).expect("serialisable outcome"));
        return;
    }

    let window = env_seconds("TENURE_BENCH_WINDOW_SECS", Duration::from_secs(20));
    let elections = env_usize("TENURE_BENCH_ELECTIONS", 10_000);
    let scratch = ScratchDir::new("many-elections").expect("a scratch directory");
    let window_secs = window.as_secs();
    let current = in_child(&scratch, Variant { flavor: Flavor::CurrentThread, elections, candidates: 1, window_secs });
    let multi = in_child(&scratch, Variant { flavor: Flavor::MultiThread, elections, candidates: 1, window_secs });
    let cheaper = if current.cpu_percent <= multi.cpu_percent { &current } else { &multi };
    let three = in_child(
        &scratch,
        Variant { flavor: cheaper.variant.flavor, elections: elections / 3, candidates: 3, window_secs },
    );

    let mut report = Report::new("many_elections");
    for (key, outcome) in [("current", &current), ("multi", &multi), ("three", &three)] {
        let label = outcome.variant.label();
        let headline = std::ptr::eq(outcome, cheaper);
        if headline {
            report.goal(
                &format!("{key}_cpu_percent"),
                &format!("{label}: CPU"),
                outcome.cpu_percent,
                "%",
                GOAL_CPU_PERCENT,
            );
            report.goal(&format!("{key}_rss_mb"), &format!("{label}: VmRSS"), outcome.rss_mb, "MB", GOAL_RSS_MB);
        } else {
            report.info(&format!("{key}_cpu_percent"), &format!("{label}: CPU"), outcome.cpu_percent, "%");
            report.info(&format!("{key}_rss_mb"), &format!("{label}: VmRSS"), outcome.rss_mb, "MB");
        }
        report.info(
            &format!("{key}_slice_cpu_p50"),
            &format!("{label}: CPU, median 2 s slice"),
            outcome.slice_cpu_p50,
            "%",
        );
        report.info(
            &format!("{key}_slice_cpu_max"),
            &format!("{label}: CPU, worst 2 s slice"),
            outcome.slice_cpu_max,
            "%",
        );
        report.info(&format!("{key}_hwm_mb"), &format!("{label}: VmHWM"), outcome.hwm_mb, "MB");
        report.info(
            &format!("{key}_all_lead_ms"),
            &format!("{label}: spawn to all leading"),
            outcome.all_lead_ms,
            "ms",
        );
        report.info(&format!("{key}_writes_per_s"), &format!("{label}: lock writes"), outcome.writes_per_s, "/s");
        report.info(
            &format!("{key}_leader_changes"),
            &format!("{label}: leader changes"),
            outcome.leader_changes as f64,
            "",
        );
    }
    report.extra("outcomes", json!([current, multi, three]));
    report.extra("runtime_used", json!(cheaper.variant.flavor));
    report.note(format!(
        "CPU = (utime+stime) / wall over a {window_secs} s window after all lead (+{} s settle); 100 % = one core",
        SETTLE.as_secs()
    ));
    report.note("MB = 10^6 bytes here and in the goals; each variant runs in its own process");
    report.note(format!(
        "per election: {:.1} KB resident (current-thread, 1 candidate, RSS minus the {:.1} MB baseline)",
        (current.rss_mb - current.baseline_rss_mb) * 1e3 / elections as f64,
        current.baseline_rss_mb
    ));
    report.note(format!(
        "cheaper runtime: {:?} ({:.2} % vs {:.2} %); the goals apply to it",
        cheaper.variant.flavor,
        cheaper.cpu_percent,
        if std::ptr::eq(cheaper, &current) { multi.cpu_percent } else { current.cpu_percent }
    ));
    report.print();
}

/// Runs one variant in a fresh process and returns what it measured.
fn in_child(scratch: &ScratchDir, variant: Variant) -> Outcome {
    eprintln!("many_elections: running {} for a {} s window", variant.label(), variant.window_secs);
    let output_path = scratch.path().join(format!("{:?}-{}.out", variant.flavor, variant.candidates));
    let output = std::fs::File::create(&output_path).expect("a file for the child's output");
    let exe = std::env::current_exe().expect("the path of this benchmark");
    let mut command = Command::new(exe);
    command
        .env(VARIANT_ENV, serde_json::to_string(&variant).expect("serialisable variant"))
        .stdin(Stdio::null())
        .stdout(output);
    let mut child = ChildGuard::spawn("variant", &mut command, None).expect("start the variant's process");
    let limit = ALL_LEAD_LIMIT + SETTLE + Duration::from_secs(variant.window_secs + 30);
    let status = child.wait_timeout(limit).expect("wait for the variant").expect("the variant finished in time");
    assert!(status.success(), "the variant {} failed: {status}", variant.label());
    parse_outcome(&output_path)
}

fn parse_outcome(path: &Path) -> Outcome {
    let text = std::fs::read_to_string(path).expect("the child's output");
    let line = text.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX)).expect("a result line from the child");
    serde_json::from_str(line).expect("a well-formed result")
}

/// In the child process: spawns the electors and measures.
fn run_variant(variant: Variant) -> Outcome {
    let baseline = procfs::memory(Target::This).expect("read /proc/self/status");
    let runtime = match variant.flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
    }
    .expect("a tokio runtime");
    let worker_threads = runtime.metrics().num_workers();
    runtime.block_on(async move {
        let started = Instant::now();
        let mut elections = Vec::with_capacity(variant.elections);
        for e in 0..variant.elections {
            let store = MemoryStore::new();
            let electors: Vec<(String, Elector)> = (0..variant.candidates)
                .map(|c| {
                    let id = format!("e{e}-c{c}");
                    let elector =
                        Elector::builder(id.clone(), store.client(id.clone())).spawn().expect("valid elector");
                    (id, elector)
                })
                .collect();
            elections.push((store, electors));
        }
        loop {
            let led = elections.iter().filter(|(_, electors)| leader_of(electors).is_some()).count();
            if led == elections.len() {
                break;
            }
            assert!(started.elapsed() < ALL_LEAD_LIMIT, "only {led} of {} elections have a leader", elections.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let all_lead = started.elapsed();
        tokio::time::sleep(SETTLE).await;

        let leaders_before: Vec<_> = elections.iter().map(|(_, electors)| leader_of(electors)).collect();
        let (reads_before, writes_before) = lock_calls(&elections);
        let cpu_before = procfs::cpu_time(Target::This).expect("read /proc/self/stat");
        let window_start = Instant::now();
        let mut slices = Vec::new();
        let mut slice_start = (window_start, procfs::cpu_time_of_threads(Target::This).expect("read schedstat"));
        let window_end = window_start + Duration::from_secs(variant.window_secs);
        while slice_start.0 < window_end {
            tokio::time::sleep_until((slice_start.0 + SLICE).min(window_end).into()).await;
            let now = (Instant::now(), procfs::cpu_time_of_threads(Target::This).expect("read schedstat"));
            slices.push((now.1 - slice_start.1).as_secs_f64() / (now.0 - slice_start.0).as_secs_f64() * 100.0);
            slice_start = now;
        }
        let cpu_after = procfs::cpu_time(Target::This).expect("read /proc/self/stat");
        let window = window_start.elapsed();
        let slices = Summary::of(&slices).expect("at least one slice");
        let memory = procfs::memory(Target::This).expect("read /proc/self/status");
        let (reads_after, writes_after) = lock_calls(&elections);
        let leader_changes = elections
            .iter()
            .zip(&leaders_before)
            .filter(|((_, electors), before)| leader_of(electors) != **before)
            .count();

        let window_s = window.as_secs_f64();
        Outcome {
            variant,
            all_lead_ms: all_lead.as_secs_f64() * 1e3,
            window_s,
            cpu_percent: (cpu_after - cpu_before).as_secs_f64() / window_s * 100.0,
            slice_cpu_p50: slices.p50,
            slice_cpu_max: slices.max,
            rss_mb: megabytes(memory.rss_kib),
            hwm_mb: megabytes(memory.hwm_kib),
            anon_mb: megabytes(memory.anon_kib),
            baseline_rss_mb: megabytes(baseline.rss_kib),
            leader_changes,
            reads_per_s: (reads_after - reads_before) as f64 / window_s,
            writes_per_s: (writes_after - writes_before) as f64 / window_s,
            worker_threads,
        }
    })
}

/// The index and term of the one candidate that leads, if exactly one does.
fn leader_of(electors: &[(String, Elector)]) -> Option<(usize, u64)> {
    let mut leaders = electors.iter().enumerate().filter_map(|(i, (_, e))| e.is_leader().map(|t| (i, t.0)));
    let first = leaders.next()?;
    leaders.next().is_none().then_some(first)
}

/// Reads and writes made so far by all candidates of all elections.
fn lock_calls(elections: &[(MemoryStore, Vec<(String, Elector)>)]) -> (u64, u64) {
    let mut totals = (0, 0);
    for (store, electors) in elections {
        for (id, _) in electors {
            let counts = store.requests(id);
            totals.0 += counts.get;
            totals.1 += counts.create + counts.update;
        }
    }
    totals
}

fn megabytes(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}
