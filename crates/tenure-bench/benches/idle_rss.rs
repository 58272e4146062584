//! `cargo build --release -p tenure-cli && cargo bench -p tenure-bench --bench idle_rss`
//!
//! Footprint of `tenure elect`: resident memory of an idle leader and follower (goal: VmRSS <=
//! 10 MB each on a file lock, <= 5.6 MB on a Kubernetes Lease with `--http`, issue 13) and the time
//! from starting it to its first HTTP answer (goal: median <= 100 ms).
//!
//! The footprint gate (issues 19 and 31): the program exits 1 when the Kubernetes leader's or
//! follower's VmRSS after 200 `GET /` and 30 s idle is over 5.6 MB. Only resident memory decides,
//! never a time: the machines this runs on are shared and noisy. It measures the release binary as
//! built (`<target-dir>/release/tenure`, the profile `cargo build --release` uses, or
//! `TENURE_BIN`) and builds nothing itself. CI runs it on every change (`scripts/footprint`,
//! beside the tests): a release build of `tenure-cli` as `cargo build --release` makes it, then
//! this program with one start-up timing. CI also checks that the mechanism that keeps the idle
//! code small still applies (`startup_pages`' test
//! `after_releasing_the_executables_mappings_are_read_a_page_at_a_time`); that mechanism holds no
//! list of names, so a toolchain or lock-file change cannot make it stale the way it made the
//! symbol-ordering list this gate used to guard.
//!
//! Method, memory: a leader (`tenure elect --election idle --id leader --lock file://<tmp>/...`,
//! default --ttl 10s) is started; once the lock file names it (seen through the library's
//! watch), a follower is started; after 10 s of idling (one lease: start-up is over, the pages
//! only start-up used are released, and the steady state has run), VmRSS, VmHWM and RssAnon of
//! each are read from /proc/<pid>/status, and their CPU use over those 10 s from
//! /proc/<pid>/task/*/schedstat (nanoseconds; utime+stime would round an idle process to zero
//! ticks).
//!
//! Method, start-up: `tenure elect ... --http 127.0.0.1:<free port>` is started 10 times (each
//! stopped with SIGTERM before the next); from just before spawning the process, a loop tries
//! every millisecond to connect and send `GET /`, and stops at the first HTTP status line
//! received. The median of the 10 starts is the number.
//!
//! Method, on Kubernetes (the gate): the same leader and follower with `--lock-type leases` and
//! `--http` against a `tenure apiserver` process (in-memory API server on loopback), found through
//! KUBECONFIG: the sidecar as it runs in a pod, with the Kubernetes client, TLS stack and watch
//! loaded; the server ends watches after 4 s, so the idle period includes re-watches (which a
//! sidecar makes every 290 s). Once the follower knows the leader, both idle for
//! TENURE_BENCH_IDLE_SECS (start-up is over and its pages given back: probes that came earlier
//! would be dropped with them and never counted), VmRSS is read, then 200 `GET /` one after the
//! other on each (a new connection each, as probes make them: latency p50 and p99, VmRSS right
//! after), then TENURE_BENCH_AFTER_PROBES_SECS (30) idle; in its last 5 s VmRSS is read once a
//! second, and the median of those 5 readings is the gated number.
//!
//! Where the memory is: for every idle process, the Rss of its mappings (`/proc/<pid>/smaps`)
//! split into the executable's clean file pages, its relocated pages, shared libraries, `[heap]`,
//! glibc's other malloc arenas, the stacks of its threads (found through each thread's stack
//! pointer in `/proc/<pid>/task/<tid>/syscall`), other anonymous memory and the kernel's pages.
//!
//! Anchor: the idle RSS of small programs built on the Rust peer crates (kubert 5.6 MB,
//! kube-coordinate 5.8, kube-leader-election 7.0, kube-lease-manager 7.2), as measured by others
//! and quoted in issue 13; printed as fixed rows, not measured here.
//!
//! Settings: TENURE_BENCH_STARTS (default 10), TENURE_BENCH_IDLE_SECS (default 10),
//! TENURE_BENCH_AFTER_PROBES_SECS (default 30), TENURE_BIN.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;
use tenure_bench::binary::{built_release_binary, free_loopback_address, Elect};
use tenure_bench::http_get::{get, ok_body, Answer};
use tenure_bench::lock_watch::LockWatcher;
use tenure_bench::process::ChildGuard;
use tenure_bench::procfs::{self, Target};
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::smaps;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize, ms};

const GOAL_RSS_MB: f64 = 10.0;
/// Issue 13: the Kubernetes sidecar as light as the lightest Rust peer (kubert's lease, 5.6 MB).
const GOAL_KUBE_RSS_MB: f64 = 5.6;
const GOAL_FIRST_ANSWER_MS: f64 = 100.0;
/// The longest a start may take to answer before the benchmark gives up.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);
/// How many VmRSS readings, a second apart, end the idle period after the probes (their median is
/// gated: one reading could fall on a renew's or re-watch's transient allocation).
const READINGS: usize = 5;

fn main() {
    let starts = env_usize("TENURE_BENCH_STARTS", 10);
    let idle = env_seconds("TENURE_BENCH_IDLE_SECS", Duration::from_secs(10));
    let binary = built_release_binary();
    let scratch = ScratchDir::new("idle-rss").expect("a scratch directory");
    eprintln!(
        "idle_rss: {}: leader and follower idle for {} s, then {starts} starts",
        binary.display(),
        idle.as_secs()
    );
    let mut report = Report::new("idle_rss");

    // Idle leader and follower.
    let lock = scratch.path().join("idle.json");
    let mut watcher = LockWatcher::start(&lock).expect("a watch of the lock file");
    let leader =
        start(&binary, scratch.path(), Elect { election: "idle", id: "leader", lock: &lock, ttl: None, http: None });
    watcher
        .wait_for(Duration::from_secs(10), |_| {}, |seen| seen.holder.as_deref() == Some("leader"))
        .unwrap_or_else(|| panic!("the leader did not take the lock; its log ends with:\n{}", leader.log_tail(20)));
    let mut follower =
        start(&binary, scratch.path(), Elect { election: "idle", id: "follower", lock: &lock, ttl: None, http: None });
    let cpu_before = [cpu(&leader), cpu(&follower)];
    std::thread::sleep(idle);
    for (role, child) in [("leader", &leader), ("follower", &follower)] {
        let memory = procfs::memory(Target::Pid(child.pid()))
            .unwrap_or_else(|e| panic!("cannot read the memory of the {role}: {e}; log:\n{}", child.log_tail(20)));
        report.goal(&format!("{role}_rss_mb"), &format!("{role} VmRSS"), megabytes(memory.rss_kib), "MB", GOAL_RSS_MB);
        report.info(&format!("{role}_hwm_mb"), &format!("{role} VmHWM"), megabytes(memory.hwm_kib), "MB");
        report.info(&format!("{role}_anon_mb"), &format!("{role} RssAnon"), megabytes(memory.anon_kib), "MB");
        where_it_is(&mut report, role, role, child);
    }
    for (role, child, before) in [("leader", &leader, cpu_before[0]), ("follower", &follower, cpu_before[1])] {
        let used = cpu(child).saturating_sub(before);
        report.info(
            &format!("{role}_idle_cpu_percent"),
            &format!("{role} CPU while idle"),
            used.as_secs_f64() / idle.as_secs_f64() * 100.0,
            "%",
        );
    }
    assert!(
        follower.try_status().expect("the follower's status").is_none(),
        "the follower exited early:\n{}",
        follower.log_tail(20)
    );
    drop((leader, follower, watcher));

    let after_probes = env_seconds("TENURE_BENCH_AFTER_PROBES_SECS", Duration::from_secs(30));
    let kube_within_goal = kube_idle(&binary, scratch.path(), idle, after_probes, &mut report);

    // Start to first HTTP answer.
    let lock = scratch.path().join("start.json");
    let mut answers = Vec::with_capacity(starts);
    for i in 1..=starts {
        let id = format!("s{i}");
        let address = free_loopback_address().expect("a free loopback port");
        let elect = Elect { election: "start", id: &id, lock: &lock, ttl: None, http: Some(address) };
        let log = scratch.path().join(format!("{id}.log"));
        let mut command = elect.command(&binary, &log).expect("a command line for tenure elect");
        let spawned_at = Instant::now();
        let mut child = ChildGuard::spawn(&id, &mut command, Some(&log)).expect("start tenure elect");
        let (answered_at, body) = first_answer(address, &mut child);
        let elapsed = answered_at.duration_since(spawned_at);
        answers.push(ms(elapsed));
        eprintln!("  start {i:>2}: first answer after {:.2} ms: {}", ms(elapsed), body.trim());
        child.signal(Signal::SIGTERM).expect("SIGTERM tenure elect");
        let status = child.wait_timeout(Duration::from_secs(5)).expect("wait for tenure elect");
        assert!(status.is_some_and(|s| s.success()), "{id} did not exit 0 after SIGTERM: {status:?}");
    }
    let first = Summary::of(&answers).expect("at least one start");
    report
        .goal("first_answer_ms_p50", "start -> first HTTP answer p50", first.p50, "ms", GOAL_FIRST_ANSWER_MS)
        .info("first_answer_ms_max", "start -> first HTTP answer max", first.max, "ms")
        .extra("starts", json!(starts))
        .extra("idle_s", json!(idle.as_secs()))
        .extra("binary", json!(binary.display().to_string()))
        .note(format!("memory after {} s idle, default --ttl (10s); MB = 10^6 bytes", idle.as_secs()))
        .note("idle CPU: run time of all threads (schedstat, ns) over the idle period / its length")
        .note(format!(
            "first answer: from spawn to the first HTTP status line, polling connect+GET every 1 ms, {starts} starts"
        ));
    report.print();
    if !kube_within_goal {
        eprintln!("idle_rss: FAIL: an idle Kubernetes sidecar is over {GOAL_KUBE_RSS_MB} MB (see the table)");
        std::process::exit(1);
    }
}

fn start(binary: &Path, dir: &Path, elect: Elect<'_>) -> ChildGuard {
    let log = dir.join(format!("{}.log", elect.id));
    let mut command = elect.command(binary, &log).expect("a command line for tenure elect");
    ChildGuard::spawn(elect.id, &mut command, Some(&log)).expect("start tenure elect")
}

fn cpu(child: &ChildGuard) -> Duration {
    procfs::cpu_time_of_threads(Target::Pid(child.pid())).expect("the CPU time of a child")
}

/// Polls `address` every millisecond until an HTTP response arrives; returns when its status
/// line was received, and the body.
fn first_answer(address: SocketAddr, child: &mut ChildGuard) -> (Instant, String) {
    let deadline = Instant::now() + ANSWER_LIMIT;
    loop {
        if let Some(Answer { answered_at, body, .. }) = get(address, "/") {
            return (answered_at, body);
        }
        if let Some(status) = child.try_status().expect("the status of tenure elect") {
            panic!("tenure elect exited ({status}) before answering; its log ends with:\n{}", child.log_tail(20));
        }
        assert!(Instant::now() < deadline, "no HTTP answer on {address} within {ANSWER_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn megabytes(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}

/// The leader and follower of a Kubernetes election (Lease lock) against a `tenure apiserver`;
/// true when both are within [`GOAL_KUBE_RSS_MB`] after the probes and `after_probes` idle.
fn kube_idle(binary: &Path, scratch: &Path, idle: Duration, after_probes: Duration, report: &mut Report) -> bool {
    let kubeconfig = scratch.join("kubeconfig");
    let log = scratch.join("apiserver.log");
    // The API server runs from a copy of the binary: in a cluster it is another program, while
    // processes of one file share its page cache, and the kernel maps the cached pages around
    // every page a process faults in (fault-around), so a busy server started from the same file
    // would keep its code in the sidecars' resident memory.
    let server_binary = scratch.join("tenure-for-apiserver");
    std::fs::copy(binary, &server_binary).expect("a copy of tenure for the API server");
    let mut command = std::process::Command::new(&server_binary);
    // Watches end after 4 s (a sidecar's ask for 290 s), so the idle period holds the re-watches
    // a long-running sidecar makes, not only what the first minutes run.
    command
        .args(["apiserver", "--listen", "127.0.0.1:0", "--max-watch-duration", "4s", "--kubeconfig"])
        .arg(&kubeconfig);
    logged(&mut command, &log);
    let server = ChildGuard::spawn("apiserver", &mut command, Some(&log)).expect("start tenure apiserver");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&kubeconfig).map_or(true, |m| m.len() == 0) {
        assert!(Instant::now() < deadline, "the API server wrote no kubeconfig; log:\n{}", server.log_tail(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    let elect = |id: &str| {
        let address = free_loopback_address().expect("a free loopback port");
        let mut command = std::process::Command::new(binary);
        command
            .args(["elect", "--election", "idle", "--id", id, "--lock-type", "leases", "--http"])
            .arg(address.to_string())
            .env("KUBECONFIG", &kubeconfig);
        let log = scratch.join(format!("kube-{id}.log"));
        logged(&mut command, &log);
        let child = ChildGuard::spawn(id, &mut command, Some(&log)).expect("start tenure elect");
        (child, address)
    };
    let (leader, leader_http) = elect("leader");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok_body(leader_http, "/isLeader").is_some_and(|b| b.contains("true")) {
        assert!(Instant::now() < deadline, "the Kubernetes leader did not lead; log:\n{}", leader.log_tail(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    let (follower, follower_http) = elect("follower");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok_body(follower_http, "/").is_some_and(|b| b.contains("leader")) {
        assert!(Instant::now() < deadline, "the Kubernetes follower saw no leader; log:\n{}", follower.log_tail(20));
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(idle);
    let candidates = [("leader", &leader, leader_http), ("follower", &follower, follower_http)];
    for (role, child, _) in candidates {
        let label = format!("Kubernetes {role} VmRSS before the GETs ({} s idle)", idle.as_secs());
        report.info(&format!("kube_{role}_rss_before_gets_mb"), &label, rss_mb(child), "MB");
    }
    for (role, child, address) in candidates {
        let latencies: Vec<f64> = (0..GETS).map(|_| get_latency(address, child)).collect();
        let summary = Summary::of(&latencies).expect("at least one GET");
        let label = format!("Kubernetes {role} GET / latency");
        report.info(&format!("kube_{role}_get_ms_p50"), &format!("{label} p50"), summary.p50, "ms");
        report.info(&format!("kube_{role}_get_ms_p99"), &format!("{label} p99"), summary.p99, "ms");
        let label = format!("Kubernetes {role} VmRSS right after the GETs");
        report.info(&format!("kube_{role}_rss_after_gets_mb"), &label, rss_mb(child), "MB");
    }
    std::thread::sleep(after_probes.saturating_sub(Duration::from_secs(READINGS as u64 - 1)));
    let mut readings: [Vec<f64>; 2] = Default::default();
    for reading in 0..READINGS {
        if reading > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        for (i, (_, child, _)) in candidates.iter().enumerate() {
            readings[i].push(rss_mb(child));
        }
    }
    let mut within_goal = true;
    for ((role, child, _), readings) in candidates.into_iter().zip(&readings) {
        let rss = Summary::of(readings).expect("readings").p50;
        within_goal &= rss <= GOAL_KUBE_RSS_MB;
        let label = format!("Kubernetes {role} VmRSS, {GETS} GETs + {} s idle (gate)", after_probes.as_secs());
        report.goal(&format!("kube_{role}_rss_mb"), &label, rss, "MB", GOAL_KUBE_RSS_MB);
        let memory = procfs::memory(Target::Pid(child.pid())).expect("the memory of tenure elect");
        let label = format!("Kubernetes {role} RssAnon");
        report.info(&format!("kube_{role}_anon_mb"), &label, megabytes(memory.anon_kib), "MB");
        where_it_is(report, &format!("kube_{role}"), &format!("Kubernetes {role}"), child);
    }
    for (key, label, value) in PEERS {
        report.info(&format!("anchor_{key}_rss_mb"), &format!("anchor, measured by others: {label}"), value, "MB");
    }
    report
        .note(format!("GET / latency: {GETS} GETs one after the other, each on a new connection (as probes make them), after {} s idle", idle.as_secs()))
        .note(format!("Kubernetes gate: median of {READINGS} VmRSS readings, 1 s apart, ending {} s after the GETs; the program exits 1 above {GOAL_KUBE_RSS_MB} MB", after_probes.as_secs()))
        .note("anchors: idle RSS of small programs on the Rust peer crates, release builds, Lease lock, measured by others (issue 13), not by this run");
    within_goal
}

/// The VmRSS of a candidate, in MB.
fn rss_mb(child: &ChildGuard) -> f64 {
    let memory = procfs::memory(Target::Pid(child.pid()))
        .unwrap_or_else(|e| panic!("cannot read the memory of {}: {e}; log:\n{}", child.name(), child.log_tail(20)));
    megabytes(memory.rss_kib)
}

/// How many `GET /` are timed on each Kubernetes candidate.
const GETS: usize = 200;

/// The idle resident memory of programs built on the Rust peer crates (Lease lock, leader and
/// follower alike), as issue 13 quotes them: the anchor the sidecar is compared with.
const PEERS: [(&str, &str, f64); 4] = [
    ("kubert", "kubert's lease", 5.6),
    ("kube_coordinate", "kube-coordinate", 5.8),
    ("kube_leader_election", "kube-leader-election", 7.0),
    ("kube_lease_manager", "kube-lease-manager", 7.2),
];

/// One `GET /` on a new connection, from connecting to the end of the answer, in ms.
fn get_latency(address: SocketAddr, child: &ChildGuard) -> f64 {
    let started = Instant::now();
    let answer = get(address, "/");
    let elapsed = ms(started.elapsed());
    assert!(answer.is_some_and(|a| a.code == 200), "GET / on {address} failed; log:\n{}", child.log_tail(20));
    elapsed
}

/// Rows saying where the resident memory of `child` is (see `tenure_bench::smaps`).
fn where_it_is(report: &mut Report, key: &str, label: &str, child: &ChildGuard) {
    let parts = smaps::breakdown(Target::Pid(child.pid()))
        .unwrap_or_else(|e| panic!("cannot read the mappings of the {label}: {e}; log:\n{}", child.log_tail(20)));
    let rows = [
        ("binary_file", "executable's file pages", parts.binary_file_kib),
        ("binary_private", "executable's relocated/written pages", parts.binary_private_kib),
        ("libraries", "shared libraries (libc, ld.so)", parts.libraries_kib),
        ("heap", "[heap] (main malloc arena)", parts.heap_kib),
        ("arenas", &format!("{} other malloc arena(s)", parts.arenas), parts.arenas_kib),
        ("stacks", &format!("stacks of {} thread(s)", parts.threads), parts.stacks_kib),
        ("other_anon", "other anonymous (mmap'd blocks, TLS, .bss)", parts.other_anon_kib),
        ("kernel", "[vdso], [vvar]", parts.kernel_kib),
    ];
    for (part, what, kib) in rows {
        report.info(&format!("{key}_{part}_mb"), &format!("  {label}: {what}"), megabytes(kib), "MB");
    }
    report.extra(&format!("{key}_threads"), json!(parts.threads)).extra(&format!("{key}_arenas"), json!(parts.arenas));
}

/// Sends the command's standard error to `log` (read back by `ChildGuard::log_tail`).
fn logged(command: &mut std::process::Command, log: &Path) {
    let file = std::fs::File::create(log).expect("a log file");
    command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(file);
}
