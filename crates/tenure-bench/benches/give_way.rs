//! `cargo bench -p tenure-bench --bench give_way`
//!
//! A leader whose work is dead gives way (issue 35, invariant G1): a hung application (SIGSTOP of
//! the application only, its sidecar running), a command that stops answering its probe, a
//! reconcile that never returns. Goal: the next replica leads within the allowed silence + one
//! lease + 100 ms (1 s + 1 s + 100 ms = 2100 ms), p99 over at least 50 rounds per case.
//!
//! Method, three cases, each with two replicas on a file lock with `--ttl 1s` (lease 1 s, renew
//! deadline 500 ms, renew every 250 ms), or the same timing in-process, and an allowed silence D
//! of 1 s:
//!
//! 1. **sidecar**: two `tenure elect --ttl 1s --http ADDR --progress-timeout 1s` processes, each
//!    with an application (this benchmark re-executed) that every 100 ms asks its sidecar `GET
//!    /status` and, while `isLeader`, calls `POST /progress?term=<term>`, printing each 204 it
//!    gets. Each round waits until the lock has a holder and that holder's application proved
//!    progress three times in this term, then a random part of its 100 ms period, sends SIGSTOP
//!    to that application alone (seen stopped through `waitpid`), and measures from just before
//!    `kill(2)` to the instant the lock watcher (inotify) sees a record of the other sidecar;
//!    then SIGCONT. The next round freezes the new leader's application.
//! 2. **probe**: two `tenure run --ttl 1s --probe 'test ! -e FLAG' --probe-every 100ms
//!    --progress-timeout 1s -- sleep 86400` processes, each with its own FLAG. Each round waits
//!    until the leader has led for 500 ms (its renews, seen on the lock), then a random part of
//!    the probe period, creates the leader's FLAG (its probe fails from then on) and measures
//!    from just before the file is created to the record of the other holder; then removes the
//!    FLAG. `tenure run` stays a candidate after giving way (it stops the command, resigns and
//!    campaigns again); a replica that exited anyway would be replaced by a fresh one and counted.
//! 3. **reconcile**: in this process, two electors on one memory lock with the same timing
//!    (`Timing::from_ttl(1 s)`), each with a `tenure_ha::Gate` built with `stuck_after(1 s)` and
//!    the default drain timeout (the renew deadline, 500 ms), on a multi-thread runtime in real
//!    time. The leader's work, told to, starts an operation (`LeaderContext::operation`) that never
//!    returns and never looks at its cancellation (a deadlock: the worst case, the gate has to
//!    abort it at its drain timeout). Measured from the operation's start to the other replica's
//!    work start, once the leader has worked for 500 ms and a random part of a renew period.
//!
//! Each case also reports the measured time minus D: what giving way added beyond the allowed
//! silence. Every new leader's term must be the old one plus one (counted otherwise).
//!
//! Settings: TENURE_BENCH_ROUNDS (rounds per case, default 50), TENURE_BENCH_CASES (default
//! sidecar,probe,reconcile), TENURE_BIN (the binary; see `tenure_binary`).

use std::convert::Infallible;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use rand::rngs::SmallRng;
use rand::RngExt;
use serde_json::json;
use tenure::locks::memory::MemoryStore;
use tenure::{Elector, Term, Timing};
use tenure_bench::binary::{free_loopback_address, tenure_binary, Elect};
use tenure_bench::http_get;
use tenure_bench::lock_watch::{LockWatcher, Seen};
use tenure_bench::process::ChildGuard;
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};
use tenure_ha::gate::Gate;
use tokio::sync::Notify;

/// Set in the application processes of the sidecar case: the address of their sidecar.
const APP_ENV: &str = "TENURE_BENCH_GIVE_WAY_APP";
/// `--ttl 1s`: lease 1 s, renew deadline 500 ms, renew every 250 ms.
const TTL: &str = "1s";
const LEASE: Duration = Duration::from_secs(1);
const RENEW_PERIOD: Duration = Duration::from_millis(250);
/// The allowed silence D (`--progress-timeout`, `stuck_after`).
const SILENCE_TEXT: &str = "1s";
const SILENCE: Duration = Duration::from_secs(1);
/// How often the application proves progress, and the probe runs.
const APP_PERIOD: Duration = Duration::from_millis(100);
const PROBE_EVERY: &str = "100ms";
/// The goal: D + one lease + 100 ms.
const GOAL: Duration = Duration::from_millis(2100);
/// Proofs of progress of the leader's application in its term before it is frozen.
const PROOFS_BEFORE_FREEZE: usize = 3;
/// How long a leader leads before its probe fails or its reconcile hangs.
const LEAD_BEFORE_FAULT: Duration = Duration::from_millis(500);
/// The longest any one step of a round may take before the benchmark gives up.
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// An application process stops by itself after this long (its parent also kills it).
const APP_LIFETIME: Duration = Duration::from_secs(3600);

/// What one case measured.
struct Case {
    name: &'static str,
    /// From the fault to the other replica leading, in ms.
    samples: Vec<f64>,
    /// New leaders whose term was not the old one plus one.
    term_errors: usize,
    /// Replicas that exited and were replaced (probe case).
    restarts: usize,
    /// From the last proof of progress seen before the fault to the other replica leading, in
    /// ms (sidecar case): the silence the sidecar measured, plus what giving way took.
    from_last_proof: Vec<f64>,
    started: Instant,
    elapsed: Duration,
}

impl Case {
    fn new(name: &'static str) -> Case {
        let (samples, from_last_proof) = (Vec::new(), Vec::new());
        let (started, elapsed) = (Instant::now(), Duration::ZERO);
        Case { name, samples, term_errors: 0, restarts: 0, from_last_proof, started, elapsed }
    }

    /// One round: `from` led under `old_term`, `to` leads under `new_term`, `took` after the fault.
    fn record(
        &mut self,
        round: usize,
        (from, old_term): (&str, u64),
        (to, new_term): (&str, Option<u64>),
        took: Duration,
    ) {
        self.samples.push(ms(took));
        if new_term != Some(old_term + 1) {
            self.term_errors += 1;
        }
        eprintln!("  {} round {round:>2}: {from} -> {to}: {:.1} ms", self.name, ms(took));
    }

    fn finish(mut self) -> Case {
        self.elapsed = self.started.elapsed();
        self
    }
}

fn main() {
    if let Ok(address) = std::env::var(APP_ENV) {
        application(address.parse().expect("the sidecar's address"));
        return;
    }
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 50);
    let cases: Vec<String> = std::env::var("TENURE_BENCH_CASES")
        .unwrap_or_else(|_| String::from("sidecar,probe,reconcile"))
        .split(',')
        .map(|name| name.trim().to_owned())
        .collect();
    if let Some(unknown) = cases.iter().find(|c| !["sidecar", "probe", "reconcile"].contains(&c.as_str())) {
        panic!("TENURE_BENCH_CASES: unknown case {unknown:?} (sidecar, probe, reconcile)");
    }
    let wants = |name: &str| cases.iter().any(|c| c == name);
    let binary = (wants("sidecar") || wants("probe")).then(tenure_binary);
    let scratch = ScratchDir::new("give-way").expect("a scratch directory");
    let mut rng = rand::make_rng::<SmallRng>();

    let mut report = Report::new("give_way");
    let mut measured = Vec::new();
    if let Some(binary) = binary.as_deref().filter(|_| wants("sidecar")) {
        eprintln!(
            "give_way sidecar: 2 x {} elect --ttl {TTL} --progress-timeout {SILENCE_TEXT}, {rounds} rounds",
            binary.display()
        );
        let case = sidecar_case(binary, scratch.path(), rounds, &mut rng);
        measured.push(("sidecar: app SIGSTOP -> other leads", case));
    }
    if let Some(binary) = binary.as_deref().filter(|_| wants("probe")) {
        eprintln!(
            "give_way probe: 2 x {} run --ttl {TTL} --probe ... --progress-timeout {SILENCE_TEXT}, {rounds} rounds",
            binary.display()
        );
        let case = probe_case(binary, scratch.path(), rounds, &mut rng);
        measured.push(("probe: probe fails -> other leads", case));
    }
    if wants("reconcile") {
        eprintln!("give_way reconcile: 2 electors + Gate::stuck_after({SILENCE:?}), memory lock, {rounds} rounds");
        let case = reconcile_case(rounds, &mut rng);
        measured.push(("reconcile: stuck op -> other works", case));
    }

    for (label, case) in &measured {
        let key = case.name;
        let summary = Summary::of(&case.samples).expect("at least one round");
        let beyond: Vec<f64> = case.samples.iter().map(|sample| sample - ms(SILENCE)).collect();
        let beyond = Summary::of(&beyond).expect("at least one round");
        report
            .distribution(&format!("{key}_ms"), label, &summary, "ms", Some(ms(GOAL)))
            .distribution(&format!("{key}_beyond_ms"), &format!("{key}: beyond the silence"), &beyond, "ms", None)
            .info(&format!("{key}_term_errors"), &format!("{key}: new term != old + 1"), case.term_errors as f64, "")
            .extra(&format!("{key}_seconds"), json!(case.elapsed.as_secs_f64()));
        if let Some(from_last_proof) = Summary::of(&case.from_last_proof) {
            let label = format!("{key}: last proof seen -> other leads");
            report.distribution(&format!("{key}_from_last_proof_ms"), &label, &from_last_proof, "ms", None);
        }
        if key == "probe" {
            report.info("probe_restarts", "probe: replicas that exited", case.restarts as f64, "");
        }
    }
    report
        .extra("rounds", json!(rounds))
        .extra("ttl", json!(TTL))
        .extra("silence", json!(SILENCE_TEXT))
        .extra("binary", json!(binary.map(|b| b.display().to_string())))
        .note(format!("{rounds} rounds per case; lease 1 s (`--ttl {TTL}`, or Timing::from_ttl(1 s)), allowed silence D = {SILENCE_TEXT}; goal p99 <= D + lease + 100 ms"))
        .note("sidecar: 2 x `tenure elect --progress-timeout 1s --http`, each app POSTs /progress?term=T every 100 ms while /status says isLeader; from just before SIGSTOP of the leader's app (its sidecar running) to the other holder's first record (inotify)")
        .note("probe: 2 x `tenure run --probe 'test ! -e FLAG' --probe-every 100ms --progress-timeout 1s -- sleep`; from just before the leader's FLAG is created to the other holder's first record")
        .note("reconcile: 2 electors on one memory lock, Gate::stuck_after(1 s), default drain (500 ms); the leader's work starts an operation that never returns and ignores its cancellation; from the operation's start to the other replica's work start")
        .note("'beyond the silence' = measured - D; the sidecar and probe faults come up to 100 ms after the last proof of progress, so they can end under D")
        .note("sidecar: 'last proof seen' is when this process read the app's line for its last 204 before the freeze: that silence + what giving way took")
        .note("p99 is nearest-rank: with fewer than 100 rounds it is the maximum");
    report.print();
}

// -- case 1: tenure elect --progress-timeout and a hung application -----------------------------

/// One replica of the sidecar case: the sidecar and its application.
struct SidecarReplica {
    id: String,
    sidecar: ChildGuard,
    app: ChildGuard,
}

fn sidecar_case(binary: &Path, dir: &Path, rounds: usize, rng: &mut SmallRng) -> Case {
    let lock = dir.join("sidecar.json");
    let mut watcher = LockWatcher::start(&lock).expect("a watch of the lock file");
    let (proofs_tx, proofs) = mpsc::channel::<Proof>();
    let mut replicas: Vec<SidecarReplica> =
        (0..2).map(|index| start_sidecar_replica(binary, dir, &lock, index, proofs_tx.clone())).collect();
    drop(proofs_tx);

    let mut current = first_holder(&mut watcher);
    let mut case = Case::new("sidecar");
    for round in 1..=rounds {
        let leader_id = current.holder.clone().expect("a holder");
        let term = Term(current.term.expect("a readable record"));
        let leader = replicas.iter().position(|r| r.id == leader_id).expect("the holder is one of the replicas");
        // Fresh proofs only: what is queued came before this round.
        while proofs.try_recv().is_ok() {}
        let deadline = Instant::now() + STEP_LIMIT;
        let (mut seen_proofs, mut last_proof) = (0, None);
        while seen_proofs < PROOFS_BEFORE_FREEZE {
            match proofs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(proof) if proof.replica == leader && proof.term == term => {
                    seen_proofs += 1;
                    last_proof = Some(proof.at);
                }
                Ok(_) => {}
                Err(_) => panic!(
                    "round {round}: the application of {leader_id} made no progress under term {term} within {STEP_LIMIT:?}; \
                     its sidecar's log ends with:\n{}",
                    replicas[leader].sidecar.log_tail(20)
                ),
            }
        }
        std::thread::sleep(rng.random_range(Duration::ZERO..APP_PERIOD));
        for replica in &mut replicas {
            check_running(&mut replica.sidecar);
            check_running(&mut replica.app);
        }

        let app = &replicas[leader].app;
        let frozen_at = Instant::now();
        app.signal(Signal::SIGSTOP).expect("SIGSTOP the leader's application");
        let pid = Pid::from_raw(i32::try_from(app.pid()).expect("a pid"));
        match waitpid(pid, Some(WaitPidFlag::WUNTRACED)) {
            Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {}
            other => panic!("round {round}: the application of {leader_id} did not stop: {other:?}"),
        }
        let new = takeover(&mut watcher, &current, round, &replicas[leader].sidecar);
        // The frozen application's proofs have all been read by now (it printed none since).
        let last_proof = proofs
            .try_iter()
            .filter(|proof| proof.replica == leader && proof.term == term)
            .fold(last_proof.expect("proofs were seen"), |last, proof| last.max(proof.at));
        app.signal(Signal::SIGCONT).expect("SIGCONT the application");
        let took = new.at.duration_since(frozen_at);
        case.from_last_proof.push(ms(new.at.duration_since(last_proof)));
        case.record(round, (&leader_id, term.0), (new.holder.as_deref().unwrap_or("?"), new.term), took);
        current = new;
    }
    case.finish()
}

/// A proof of progress the application of replica `replica` got a 204 for, and when this
/// process read its line.
struct Proof {
    replica: usize,
    term: Term,
    at: Instant,
}

fn start_sidecar_replica(
    binary: &Path,
    dir: &Path,
    lock: &Path,
    index: usize,
    proofs: mpsc::Sender<Proof>,
) -> SidecarReplica {
    let id = format!("s{}", index + 1);
    let address = free_loopback_address().expect("a free port");
    let log = dir.join(format!("{id}.log"));
    let elect = Elect { election: "give-way", id: &id, lock, ttl: Some(TTL), http: Some(address) };
    let mut command = elect.command(binary, &log).expect("a command line for tenure elect");
    command.args(["--progress-timeout", SILENCE_TEXT]);
    let sidecar = ChildGuard::spawn(&id, &mut command, Some(&log))
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));

    let mut command = Command::new(std::env::current_exe().expect("this benchmark's path"));
    command.env(APP_ENV, address.to_string()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut app = ChildGuard::spawn(&format!("app of {id}"), &mut command, None).expect("start an application");
    let stdout = app.take_stdout().expect("the application's stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let at = Instant::now();
            let term = line.strip_prefix("progress ").and_then(|t| t.parse().ok()).map(Term);
            if term.is_some_and(|term| proofs.send(Proof { replica: index, term, at }).is_err()) {
                break;
            }
        }
    });
    SidecarReplica { id, sidecar, app }
}

/// The application of the sidecar case: every [`APP_PERIOD`], while its sidecar says it leads,
/// proves progress with the term it leads with, and prints `progress <term>` for each 204.
/// Stops when its parent is gone, its output is closed, or after [`APP_LIFETIME`].
fn application(sidecar: SocketAddr) {
    let parent = std::os::unix::process::parent_id();
    let started = Instant::now();
    let mut next = started;
    let mut out = std::io::stdout().lock();
    while started.elapsed() < APP_LIFETIME && std::os::unix::process::parent_id() == parent {
        let status = http_get::ok_body(sidecar, "/status").and_then(|body| serde_json::from_str(&body).ok());
        let leading_term = status
            .filter(|status: &serde_json::Value| status["isLeader"] == json!(true))
            .and_then(|status| status["term"].as_u64());
        if let Some(term) = leading_term {
            let answer = http_get::post(sidecar, &format!("/progress?term={term}"));
            if answer.is_some_and(|answer| answer.code == 204)
                && writeln!(out, "progress {term}").and_then(|()| out.flush()).is_err()
            {
                return;
            }
        }
        // After a freeze, start the rhythm again from now.
        next = (next + APP_PERIOD).max(Instant::now());
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

// -- case 2: tenure run --probe ------------------------------------------------------------------

/// One replica of the probe case: a `tenure run` process and the file whose presence fails its
/// probe.
struct ProbeReplica {
    id: String,
    flag: PathBuf,
    process: ChildGuard,
}

fn probe_case(binary: &Path, dir: &Path, rounds: usize, rng: &mut SmallRng) -> Case {
    let lock = dir.join("probe.json");
    let mut watcher = LockWatcher::start(&lock).expect("a watch of the lock file");
    let mut next_id = 1;
    let mut replicas: Vec<ProbeReplica> =
        (0..2).map(|_| start_probe_replica(binary, dir, &lock, &mut next_id)).collect();

    let mut current = first_holder(&mut watcher);
    let mut case = Case::new("probe");
    for round in 1..=rounds {
        let leader_id = current.holder.clone().expect("a holder");
        let term = current.term.expect("a readable record");
        let leader = replicas.iter().position(|r| r.id == leader_id).expect("the holder is one of the replicas");
        // Let the leader's command run and its probe succeed for a while: its renews show it.
        let tenure_start = current.at;
        let led = watcher.wait_for(
            STEP_LIMIT,
            |_| {},
            |seen| seen.holder != current.holder || seen.at >= tenure_start + LEAD_BEFORE_FAULT,
        );
        match led {
            Some(seen) if seen.holder == current.holder && seen.term == current.term => {}
            other => panic!("round {round}: {leader_id} did not keep leading for {LEAD_BEFORE_FAULT:?}: {other:?}"),
        }
        std::thread::sleep(rng.random_range(Duration::ZERO..APP_PERIOD));
        for replica in &mut replicas {
            check_running(&mut replica.process);
        }

        let flag = replicas[leader].flag.clone();
        let failed_at = Instant::now();
        std::fs::write(&flag, b"").expect("create the flag that fails the probe");
        let new = takeover(&mut watcher, &current, round, &replicas[leader].process);
        std::fs::remove_file(&flag).expect("remove the flag");
        let took = new.at.duration_since(failed_at);
        case.record(round, (&leader_id, term), (new.holder.as_deref().unwrap_or("?"), new.term), took);
        current = new;
        // tenure run campaigns again after giving way; should it have exited, a fresh replica
        // (a new identity: the old one's record would make it wait out the lease) takes its place.
        if let Some(status) = replicas[leader].process.try_status().expect("the status of a replica") {
            eprintln!("  probe round {round}: {leader_id} exited ({status}); starting a fresh replica");
            case.restarts += 1;
            replicas[leader] = start_probe_replica(binary, dir, &lock, &mut next_id);
        }
    }
    case.finish()
}

fn start_probe_replica(binary: &Path, dir: &Path, lock: &Path, next_id: &mut usize) -> ProbeReplica {
    let id = format!("r{next_id}");
    *next_id += 1;
    let flag = dir.join(format!("{id}.stuck"));
    let log = dir.join(format!("{id}.log"));
    let (lock_url, flag_text) = (format!("file://{}", plain_path(lock)), plain_path(&flag));
    let mut command = Command::new(binary);
    command
        .args(["run", "--election", "give-way", "--id", &id, "--lock", &lock_url, "--ttl", TTL])
        .args(["--probe", &format!("test ! -e {flag_text}"), "--probe-every", PROBE_EVERY])
        .args(["--progress-timeout", SILENCE_TEXT, "--", "sleep", "86400"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log file"));
    let process = ChildGuard::spawn(&id, &mut command, Some(&log))
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    ProbeReplica { id, flag, process }
}

/// A path as text that needs no quoting in a shell command or a URL.
fn plain_path(path: &Path) -> &str {
    let text = path.to_str().filter(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b)));
    text.unwrap_or_else(|| panic!("the scratch path needs quoting: {}", path.display()))
}

// -- case 3: the HA runtime, a reconcile that never returns --------------------------------------

/// What the works of the reconcile case report.
enum Event {
    /// Replica `replica`'s gate started its work under `term`.
    Started { replica: usize, term: Term, at: Instant },
    /// Its work started the operation that never returns.
    Stuck { replica: usize, at: Instant },
}

fn reconcile_case(rounds: usize, rng: &mut SmallRng) -> Case {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let store = MemoryStore::new();
        let timing = Timing::from_ttl(LEASE).expect("a valid timing");
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let triggers: Vec<Arc<Notify>> = (0..2).map(|_| Arc::new(Notify::new())).collect();
        let mut replicas = Vec::new();
        for (replica, trigger) in triggers.iter().enumerate() {
            let id = format!("g{}", replica + 1);
            let elector = Elector::builder(&id, store.client(&id)).timing(timing).spawn().expect("an elector");
            let (events, trigger) = (events_tx.clone(), trigger.clone());
            let gate = Gate::builder(&elector).stuck_after(SILENCE).expect("a valid bound").spawn(move |ctx| {
                let (events, trigger) = (events.clone(), trigger.clone());
                async move {
                    let _ = events.send(Event::Started { replica, term: ctx.term(), at: Instant::now() });
                    tokio::select! {
                        () = trigger.notified() => {}
                        () = ctx.cancelled() => return Ok(()),
                    }
                    let _operation = ctx.operation("a reconcile that never returns");
                    let _ = events.send(Event::Stuck { replica, at: Instant::now() });
                    // Deaf to its cancellation, like a deadlock: the gate must abort it.
                    std::future::pending::<()>().await;
                    Ok::<_, Infallible>(())
                }
            });
            replicas.push((elector, gate));
        }
        drop(events_tx);

        let mut case = Case::new("reconcile");
        let Event::Started { replica: mut leader, mut term, .. } = next_event(&mut events).await else {
            panic!("the first event is a work start");
        };
        for round in 1..=rounds {
            tokio::time::sleep(LEAD_BEFORE_FAULT + rng.random_range(Duration::ZERO..RENEW_PERIOD)).await;
            triggers[leader].notify_one();
            let Event::Stuck { replica, at: stuck_at } = next_event(&mut events).await else {
                panic!("round {round}: a work started while g{} led", leader + 1);
            };
            assert_eq!(replica, leader, "round {round}: a follower's work hung");
            let Event::Started { replica: next, term: next_term, at } = next_event(&mut events).await else {
                panic!("round {round}: a second operation hung");
            };
            assert_ne!(next, leader, "round {round}: g{} led again before the other replica", leader + 1);
            let took = at.duration_since(stuck_at);
            let (from, to) = (format!("g{}", leader + 1), format!("g{}", next + 1));
            case.record(round, (&from, term.0), (&to, Some(next_term.0)), took);
            (leader, term) = (next, next_term);
        }
        let case = case.finish();
        for (elector, gate) in replicas {
            let stopped = tokio::time::timeout(STEP_LIMIT, async move {
                gate.shutdown().await;
                let _ = elector.shutdown().await;
            });
            stopped.await.expect("the gates and electors stop");
        }
        case
    })
}

/// The next event of the works, waiting at most [`STEP_LIMIT`].
async fn next_event(events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(STEP_LIMIT, events.recv())
        .await
        .unwrap_or_else(|_| panic!("no work started or hung within {STEP_LIMIT:?}"))
        .expect("the works report")
}

// -- shared --------------------------------------------------------------------------------------

/// Waits for the first record with a holder.
fn first_holder(watcher: &mut LockWatcher) -> Seen {
    watcher
        .wait_for(STEP_LIMIT, |_| {}, |seen| seen.holder.is_some())
        .unwrap_or_else(|| panic!("no replica led within {STEP_LIMIT:?}"))
}

/// Waits for the record of a holder other than `current`'s; panics with the end of the old
/// leader's log if none comes within [`STEP_LIMIT`].
fn takeover(watcher: &mut LockWatcher, current: &Seen, round: usize, leader: &ChildGuard) -> Seen {
    watcher.wait_for(STEP_LIMIT, |_| {}, |seen| seen.holder.is_some() && seen.holder != current.holder).unwrap_or_else(
        || {
            panic!(
                "round {round}: nobody took over from {} within {STEP_LIMIT:?}; its log ends with:\n{}",
                leader.name(),
                leader.log_tail(20)
            )
        },
    )
}

/// Panics, with the end of its log, if `child` has exited.
fn check_running(child: &mut ChildGuard) {
    if let Some(status) = child.try_status().expect("the status of a child") {
        panic!("{} exited ({status}); its log ends with:\n{}", child.name(), child.log_tail(20));
    }
}
