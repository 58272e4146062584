//! `cargo run --release -p tenure-bench --bin steady-state-layout [BINARY...]`
//!
//! Records which functions of `tenure` an idle `tenure elect` runs and writes
//! `crates/tenure-cli/steady-state.order`, the symbol ordering file that lays them out together
//! (why: `crates/tenure-cli/build.rs`). Run it again after a change of toolchain, of dependency
//! versions or of the steady-state code paths, then rebuild and check with the gate,
//! `cargo build --release -p tenure-cli && cargo bench -p tenure-bench --bench idle_rss`.
//!
//! Method: the release `tenure` (brought up to date first, as `tenure_binary` does) runs under
//! callgrind with instrumentation off, so start-up is not recorded; instrumentation is turned on
//! once the
//! candidate knows the leader (it gives back its start-up pages one retry period later, so a
//! little more than the steady state is recorded), then the steady state
//! runs for TENURE_LAYOUT_STEADY_SECS (default 15: several renews and watch events), then every
//! path of the HTTP API is asked a few times as probes would, and callgrind's counts are dumped.
//! The API server ends every watch after 4 s, so the re-watch a sidecar makes every few minutes
//! (its watches ask for 290 s) is recorded too.
//! Scenarios: a Kubernetes Lease on `tenure apiserver` (the sidecar as its image runs) and the
//! file lock (the embedded default), each with a leader and a follower serving `--http`.
//!
//! BINARY: builds to record besides the release build, such as the image's (static musl,
//! `--profile sidecar`: its C library and other inlining give other functions); the list holds
//! the functions of all of them, each build finding its own (only where that build is linked by
//! lld: see build.rs).
//!
//! Needs valgrind (`apt-get install valgrind`). `--rerender` writes the committed list again from
//! the symbols it holds, without recording (after a change of the file's form).

use std::collections::BTreeSet;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tenure_bench::binary::{free_loopback_address, tenure_binary};
use tenure_bench::env_seconds;
use tenure_bench::http_get::ok_body;
use tenure_bench::process::ChildGuard;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::steady_state_layout::{functions_run, ordering_file, parse_ordering_file};

/// Paths a probe or a client of the sidecar asks; each is asked [`ASKS`] times.
const PATHS: [&str; 8] = ["/", "/isLeader", "/healthz", "/readyz", "/status", "/metrics", "/hold", "/nope"];
const ASKS: usize = 5;
/// How long a candidate under valgrind may take to start and see a leader.
const START_LIMIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let list_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tenure-cli/steady-state.order");
    if std::env::args().nth(1).as_deref() == Some("--rerender") {
        let committed = std::fs::read_to_string(&list_path).expect("the committed steady-state.order");
        let Some((recorded_with, symbols)) = parse_ordering_file(&committed) else {
            eprintln!("steady-state-layout: {} is not a generated list", list_path.display());
            return ExitCode::FAILURE;
        };
        std::fs::write(&list_path, ordering_file(&symbols, &recorded_with)).expect("write steady-state.order");
        eprintln!("steady-state-layout: {} functions written again", symbols.len());
        return ExitCode::SUCCESS;
    }
    for tool in ["valgrind", "callgrind_control"] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            eprintln!("steady-state-layout: `{tool}` is missing (apt-get install valgrind)");
            return ExitCode::FAILURE;
        }
    }
    let steady = env_seconds("TENURE_LAYOUT_STEADY_SECS", Duration::from_secs(15));
    let mut binaries = vec![tenure_binary()];
    binaries.extend(std::env::args_os().skip(1).map(PathBuf::from));
    let scratch = ScratchDir::new("steady-state-layout").expect("a scratch directory");
    let mut symbols = BTreeSet::new();
    // One API server (the release build's) for every build recorded.
    let kubeconfig = scratch.path().join("kubeconfig");
    let server = start_apiserver(&binaries[0], scratch.path(), &kubeconfig);
    for binary in &binaries {
        let binary = std::fs::canonicalize(binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        eprintln!("steady-state-layout: recording {}", binary.display());
        symbols.extend(record_binary(&binary, scratch.path(), &kubeconfig, steady));
    }
    drop(server);

    let rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "rustc (version unknown)".to_owned());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workspace = std::fs::canonicalize(&workspace).unwrap_or(workspace);
    let relative = |b: &PathBuf| {
        let b = std::fs::canonicalize(b).unwrap_or_else(|_| b.clone());
        b.strip_prefix(&workspace).unwrap_or(&b).display().to_string()
    };
    let builds = binaries.iter().map(relative).collect::<Vec<_>>().join(" and ");
    let recorded_with = format!(
        "{rustc}, {}-{}, {builds}; Kubernetes Lease and file lock, leader and follower with --http, {} s steady state, {} paths x {ASKS}",
        std::env::consts::ARCH,
        std::env::consts::OS,
        steady.as_secs(),
        PATHS.len()
    );
    let list = ordering_file(&symbols, &recorded_with);
    std::fs::write(&list_path, list).unwrap_or_else(|e| panic!("cannot write {}: {e}", list_path.display()));
    eprintln!("steady-state-layout: {} functions recorded; wrote {}", symbols.len(), list_path.display());
    eprintln!("rebuild and check: cargo build --release -p tenure-cli && cargo bench -p tenure-bench --bench idle_rss");
    ExitCode::SUCCESS
}

/// The functions one build runs in the steady state of every scenario.
fn record_binary(binary: &Path, scratch: &Path, kubeconfig: &Path, steady: Duration) -> BTreeSet<String> {
    let mut symbols = BTreeSet::new();
    let kube = |id: &str| -> Vec<String> {
        ["elect", "--election", "layout", "--id", id, "--lock-type", "leases"].iter().map(|s| s.to_string()).collect()
    };
    symbols.extend(record(binary, scratch, "kube", &kube, Some(kubeconfig), steady));

    let lock = format!("file://{}", scratch.join("layout.json").display());
    let file = |id: &str| -> Vec<String> {
        ["elect", "--election", "layout", "--id", id, "--lock", &lock].iter().map(|s| s.to_string()).collect()
    };
    symbols.extend(record(binary, scratch, "file", &file, None, steady));
    symbols
}

/// A leader and a follower of one scenario under callgrind: the functions they ran from the
/// moment they knew the leader to the end of the probes.
fn record(
    binary: &Path, scratch: &Path, scenario: &str, arguments: &dyn Fn(&str) -> Vec<String>, kubeconfig: Option<&Path>,
    steady: Duration,
) -> BTreeSet<String> {
    let mut candidates = Vec::new();
    for id in ["leader", "follower"] {
        let address = free_loopback_address().expect("a free loopback port");
        let out = scratch.join(format!("{scenario}-{id}.callgrind"));
        let log = scratch.join(format!("{scenario}-{id}.log"));
        let mut command = Command::new("valgrind");
        command
            .args(["--tool=callgrind", "--demangle=no", "--instr-atstart=no"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(binary)
            .args(arguments(id))
            .args(["--http", &address.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file"));
        if let Some(kubeconfig) = kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        let child = ChildGuard::spawn(&format!("{scenario} {id}"), &mut command, Some(&log)).expect("start valgrind");
        let knows_leader = |body: &str| if id == "leader" { body.contains("true") } else { body.contains("leader") };
        let path = if id == "leader" { "/isLeader" } else { "/" };
        wait_until(START_LIMIT, &child, || ok_body(address, path).is_some_and(|b| knows_leader(&b)));
        callgrind_control(&child, &["--instr=on"]);
        eprintln!("  {scenario} {id}: knows the leader; recording");
        candidates.push((child, address, out));
    }
    std::thread::sleep(steady);
    let mut symbols = BTreeSet::new();
    for (mut child, address, out) in candidates {
        for path in PATHS {
            for _ in 0..ASKS {
                let _ = tenure_bench::http_get::get(address, path);
            }
        }
        callgrind_control(&child, &["--dump"]);
        let dump = PathBuf::from(format!("{}.1", out.display()));
        let text = std::fs::read_to_string(&dump).unwrap_or_else(|e| panic!("no dump {}: {e}", dump.display()));
        let run = functions_run(&text, &binary.to_string_lossy());
        eprintln!("  {}: {} functions of tenure ran", child.name(), run.len());
        assert!(!run.is_empty(), "callgrind recorded nothing for {}; log:\n{}", child.name(), child.log_tail(20));
        symbols.extend(run);
        child.signal(Signal::SIGTERM).expect("SIGTERM");
        let _ = child.wait_timeout(Duration::from_secs(30));
    }
    symbols
}

fn start_apiserver(binary: &Path, scratch: &Path, kubeconfig: &Path) -> ChildGuard {
    let log = scratch.join("apiserver.log");
    let mut command = Command::new(binary);
    command
        .args(["apiserver", "--listen", "127.0.0.1:0", "--max-watch-duration", "4s", "--kubeconfig"])
        .arg(kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"));
    let server = ChildGuard::spawn("apiserver", &mut command, Some(&log)).expect("start tenure apiserver");
    wait_until(Duration::from_secs(10), &server, || std::fs::metadata(kubeconfig).is_ok_and(|m| m.len() > 0));
    server
}

fn callgrind_control(child: &ChildGuard, arguments: &[&str]) {
    let mut command = Command::new("callgrind_control");
    command.args(arguments).arg(child.pid().to_string()).stdout(Stdio::null()).stderr(Stdio::null());
    let status = command.status().expect("run callgrind_control");
    assert!(status.success(), "callgrind_control {arguments:?} failed for {}", child.name());
}

/// Polls `done` every 20 ms until it holds; panics with the child's log after `limit`.
fn wait_until(limit: Duration, child: &ChildGuard, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{} did not get there; log:\n{}", child.name(), child.log_tail(20));
        std::thread::sleep(Duration::from_millis(20));
    }
}
