//! One scenario: a backend, a fault and a mode, round after round on the current leader, judged
//! by the checker.
//!
//! Why rounds on the *current* leader: a fault on a follower proves little; the interesting
//! moment is when the holder of the lock dies, freezes, is cut off or runs on a wrong clock, and
//! another candidate must take over without ever overlapping it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Serialize;
use tenure_testkit::process::free_port;

use crate::checker::{check, tenures, CheckTiming, Tenure, Verdict};
use crate::clock::{now, Deadline};
use crate::history::{Answer, FaultSpan, Sample};
use crate::observer::{Poller, Recorder, POLL_INTERVAL};
use crate::process::{wait_for, Process};
use crate::proxy::Proxy;
use crate::report::Row;
use crate::stores::{Backend, Store};
use crate::{interrupted, witness, ChaosError};

/// Where libfaketime lives on Debian (package `faketime`): `/usr/lib/<multiarch>/faketime/`.
pub fn libfaketime() -> Option<PathBuf> {
    let entries = std::fs::read_dir("/usr/lib").ok()?;
    entries.flatten().map(|e| e.path().join("faketime/libfaketime.so.1")).find(|p| p.is_file())
}
/// The interpreter of the witness command (not a shim on `PATH`: its start-up is part of every
/// failover the witness measures).
const PYTHON: &str = "/usr/bin/python3";

/// The clock rate of the leader inside the drift bound: 30 % slow, against a bound of 1/3 for
/// `--ttl` timings (lease = ttl, renew deadline = ttl/2).
pub const RATE_INSIDE: f64 = 0.7;
/// The clock rate of the control run far outside the bound: the leader's renew deadline lasts
/// 2.5 leases of real time.
pub const RATE_OUTSIDE: f64 = 0.2;

/// The faults the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL the leader (its whole process group).
    Sigkill,
    /// SIGSTOP the leader's process groups past the lease, then SIGCONT: a frozen container.
    Sigstop,
    /// SIGTERM the leader: a graceful handover.
    Sigterm,
    /// Kill the store and start it again on its data.
    StoreRestart,
    /// Cut the leader from the store past the lease, then heal.
    Partition,
    /// The leader's clock runs slow inside the drift bound (cut from networked stores too).
    ClockInside,
    /// Control: the leader's clock runs far outside the drift bound. Must show dual leaders.
    ClockOutside,
    /// Control: a broken configuration, each candidate on a lock of its own. Must show dual
    /// leaders.
    SplitLock,
}

impl Fault {
    /// Its name in tables.
    pub fn name(self) -> String {
        match self {
            Fault::ClockInside => format!("clock x{RATE_INSIDE}"),
            Fault::ClockOutside => format!("clock x{RATE_OUTSIDE} (control)"),
            Fault::SplitLock => "split lock (control)".into(),
            other => other.slug().into(),
        }
    }

    /// Its name in file and election names.
    pub fn slug(self) -> &'static str {
        match self {
            Fault::Sigkill => "sigkill",
            Fault::Sigstop => "sigstop",
            Fault::Sigterm => "sigterm",
            Fault::StoreRestart => "store-restart",
            Fault::Partition => "partition",
            Fault::ClockInside => "clock-inside",
            Fault::ClockOutside => "clock-outside",
            Fault::SplitLock => "split-lock",
        }
    }

    /// Whether it means something on `backend` in `mode`.
    pub fn applies(self, backend: Backend, mode: Mode) -> bool {
        match self {
            Fault::StoreRestart | Fault::Partition => backend.networked(),
            // On a file lock the old leader's own watch (inotify) demotes it within a millisecond
            // of the takeover whatever its clock says, so no overlap can be provoked or
            // measured; the clock control needs a store the leader can be cut from.
            Fault::ClockOutside => mode == Mode::Elect && backend.networked(),
            Fault::ClockInside | Fault::SplitLock => mode == Mode::Elect,
            Fault::Sigkill | Fault::Sigstop | Fault::Sigterm => true,
        }
    }

    /// A control run that must find violations.
    pub fn is_control(self) -> bool {
        matches!(self, Fault::ClockOutside | Fault::SplitLock)
    }
}

/// How candidates run and are observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Mode {
    /// `tenure elect --http`, judged by its `/status` answers.
    Elect,
    /// `tenure run -- witness`, judged by the command's own lines.
    Run,
}

impl Mode {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Elect => "elect",
            Mode::Run => "run",
        }
    }
}

/// What every scenario shares.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `tenure` binary.
    pub tenure: PathBuf,
    /// Where logs and witness files go.
    pub dir: PathBuf,
    /// Faults per scenario.
    pub rounds: usize,
    /// Candidates per election.
    pub candidates: usize,
}

/// The `--ttl` used on a backend: as short as the store allows (etcd's leases have whole
/// seconds and a minimum of about 2 s).
pub fn ttl(backend: Backend) -> Duration {
    match backend {
        Backend::File => Duration::from_secs(1),
        Backend::Apiserver | Backend::Etcd | Backend::Zookeeper => Duration::from_secs(2),
    }
}

/// Everything one scenario produced.
pub struct Outcome {
    /// Its line of the table.
    pub row: Row,
    /// The candidates' names, for the timeline's lanes.
    pub candidates: Vec<String>,
    /// Their tenures.
    pub tenures: Vec<Tenure>,
    /// The faults.
    pub faults: Vec<FaultSpan>,
    /// The checker's findings.
    pub verdict: Verdict,
    /// Answers that were not a valid status.
    pub protocol_errors: Vec<String>,
}

/// One candidate process and how it reaches the store.
struct Candidate {
    id: String,
    /// The election name it is started with, which names its lock: the same as `election`,
    /// except in the broken configuration.
    lock: String,
    http: Option<SocketAddr>,
    proxy: Option<Proxy>,
    clock_rate: Option<f64>,
    process: Option<Process>,
    poller: Option<Poller>,
}

/// A scenario in progress.
struct Run<'a> {
    settings: &'a Settings,
    store: &'a mut Store,
    mode: Mode,
    timing: CheckTiming,
    lease: Duration,
    dir: PathBuf,
    witness_out: PathBuf,
    script: PathBuf,
    recorder: Recorder,
    candidates: Vec<Candidate>,
    spawned: usize,
}

/// Runs one scenario on a started store.
pub fn run(settings: &Settings, store: &mut Store, fault: Fault, mode: Mode) -> Result<Outcome, ChaosError> {
    let ttl = ttl(store.backend);
    let label = format!("{}-{}-{}", store.backend.name(), mode.name(), fault.slug());
    let dir = settings.dir.join(&label);
    std::fs::create_dir_all(&dir).map_err(|e| ChaosError::Io(format!("{}: {e}", dir.display())))?;
    if mode == Mode::Run && !std::path::Path::new(PYTHON).is_file() {
        return Err(ChaosError::Missing(format!("{PYTHON}, which runs the witness command (Debian package python3)")));
    }
    let script = witness::install(&dir)?;
    let mut run = Run {
        settings,
        store,
        mode,
        timing: CheckTiming { renew_deadline: ttl.as_secs_f64() / 2.0, drift: 1.0 / 3.0 },
        lease: ttl,
        witness_out: dir.join("witness.log"),
        script,
        dir,
        recorder: Recorder::default(),
        candidates: Vec::new(),
        spawned: 0,
    };
    let mut faults = Vec::new();
    let mut stuck = 0;
    let result = match fault {
        Fault::ClockInside | Fault::ClockOutside | Fault::SplitLock => {
            run.special_rounds(fault, &mut faults, &mut stuck)
        }
        _ => run.rounds(fault, &mut faults, &mut stuck),
    };
    let candidates: BTreeSet<String> = run.candidates.iter().map(|c| c.id.clone()).collect();
    run.candidates.clear();
    result?;
    let samples: Vec<Sample> = run.recorder.samples();
    let lines = witness::read(&run.witness_out)?;
    let verdict = check(&samples, &lines, &faults, run.timing);
    let findings = serde_json::json!({
        "dual_leaders": verdict.dual_leaders,
        "term_regressions": verdict.term_regressions,
        "command_overlaps": verdict.command_overlaps,
        "possible_overlaps": verdict.possible_overlaps,
        "rounds": verdict.rounds,
    });
    let findings = serde_json::to_string_pretty(&findings).unwrap_or_default();
    std::fs::write(run.dir.join("verdict.json"), findings).map_err(|e| ChaosError::Io(e.to_string()))?;
    let samples_text: String = samples.iter().filter_map(|s| serde_json::to_string(s).ok()).map(|l| l + "\n").collect();
    std::fs::write(run.dir.join("samples.jsonl"), samples_text).map_err(|e| ChaosError::Io(e.to_string()))?;
    let limitation = mode == Mode::Run && fault == Fault::Sigstop;
    let (backend, control) = (run.store.backend.name(), fault.is_control());
    let mut row = Row::from_verdict(backend, &fault.name(), mode.name(), &verdict, control, limitation);
    row.without_takeover += stuck;
    Ok(Outcome {
        row,
        candidates: candidates.into_iter().collect(),
        tenures: tenures(&samples, run.timing),
        faults,
        verdict,
        protocol_errors: run.recorder.protocol_errors(),
    })
}

impl Run<'_> {
    fn election_name(&self) -> String {
        format!("chaos-{}-{}", std::process::id(), self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("e"))
    }

    /// Adds a candidate and starts it.
    fn add(&mut self, id: &str, election: &str, lock: &str, clock_rate: Option<f64>) -> Result<(), ChaosError> {
        let proxy = if self.store.backend.networked() { Some(Proxy::start(&self.store.address)?) } else { None };
        let http = match self.mode {
            // The port is chosen by `spawn`, afresh at every start.
            Mode::Elect => Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            Mode::Run => None,
        };
        let (name, lock) = (id.to_owned(), lock.to_owned());
        self.candidates.push(Candidate { id: name, lock, http, proxy, clock_rate, process: None, poller: None });
        let index = self.candidates.len() - 1;
        self.spawn(index)?;
        if let Some(address) = self.candidates[index].http {
            self.candidates[index].poller = Some(Poller::start(id, election, address, self.recorder.clone()));
        }
        Ok(())
    }

    /// (Re)starts candidate `index`'s process, on a fresh HTTP port: the old one may have been
    /// taken by another process meanwhile.
    fn spawn(&mut self, index: usize) -> Result<(), ChaosError> {
        self.spawned += 1;
        if self.candidates[index].http.is_some() {
            let port = free_port().map_err(|e| ChaosError::Io(format!("no free port: {e}")))?;
            let address = SocketAddr::from(([127, 0, 0, 1], port));
            self.candidates[index].http = Some(address);
            if let Some(poller) = self.candidates[index].poller.as_ref() {
                poller.set_address(address);
            }
        }
        let ttl = format!("{}ms", self.lease.as_millis());
        let candidate = &self.candidates[index];
        let via = candidate.proxy.as_ref().map(|p| format!("127.0.0.1:{}", p.port)).unwrap_or_default();
        let mut command = Command::new(&self.settings.tenure);
        command.arg(self.mode.name());
        command.args(["--election", &candidate.lock, "--id", &candidate.id, "--ttl", &ttl]);
        command.args(self.store.lock_args(&candidate.lock, &via));
        command.env_remove("KUBECONFIG").env_remove("KUBERNETES_SERVICE_HOST").env("RUST_LOG", "info");
        if let Some(address) = candidate.http {
            command.args(["--http", &address.to_string()]);
        }
        if self.mode == Mode::Run {
            let grace = self.lease.mul_f64(witness::GRACE_SHARE_OF_TTL);
            command.args(["--grace", &format!("{}ms", grace.as_millis())]);
            command.arg("--").arg(PYTHON).arg(&self.script).arg(&self.witness_out);
            let linger = witness::GRACE_SHARE_OF_TTL * self.lease.as_secs_f64() * witness::GRACE_USED;
            command.args([
                candidate.id.as_str(),
                &witness::ALIVE_PERIOD_MS.to_string(),
                &format!("{}", (linger * 1000.0) as u64),
            ]);
        }
        if let Some(rate) = candidate.clock_rate {
            let Some(library) = libfaketime() else {
                return Err(ChaosError::Missing(
                    "/usr/lib/*/faketime/libfaketime.so.1 (Debian package faketime)".to_owned(),
                ));
            };
            command.env("LD_PRELOAD", library).env("FAKETIME", format!("+0 x{rate}"));
        }
        let log = self.dir.join(format!("{}.log", candidate.id));
        let process = Process::start(&candidate.id, &mut command, &log)?;
        self.candidates[index].process = Some(process);
        Ok(())
    }

    /// Starts candidates that exited (killed, stepped down and exited, released on SIGTERM).
    fn respawn_exited(&mut self) -> Result<(), ChaosError> {
        for index in 0..self.candidates.len() {
            let exited = self.candidates[index].process.as_mut().is_none_or(|p| !p.running());
            if exited {
                self.spawn(index)?;
            }
        }
        Ok(())
    }

    /// The one candidate that leads now, and its term, as the evidence shows it.
    fn leader_now(&self) -> Option<(usize, u64)> {
        let fresh = now() - 4.0 * POLL_INTERVAL.as_secs_f64() - 0.3;
        match self.mode {
            Mode::Elect => {
                let leaders: Vec<(usize, u64)> = self
                    .candidates
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.process.is_some())
                    .filter_map(|(i, c)| match self.recorder.latest(&c.id) {
                        Some((at, Answer::Leader { term, .. })) if at >= fresh => Some((i, term)),
                        _ => None,
                    })
                    .collect();
                (leaders.len() == 1).then(|| leaders[0])
            }
            Mode::Run => {
                let lines = witness::read(&self.witness_out).ok()?;
                let last = lines.iter().filter(|l| l.accepted).max_by(|a, b| a.at.total_cmp(&b.at))?;
                let index = self.candidates.iter().position(|c| c.id == last.candidate)?;
                (last.at >= fresh && last.kind != crate::history::WitnessKind::Stop).then_some((index, last.term))
            }
        }
    }

    fn wait_leader(&self, limit: Duration) -> Option<(usize, u64)> {
        let mut found = None;
        wait_for(limit, || {
            found = self.leader_now();
            found.is_some()
        });
        found
    }

    fn wait_takeover(&self, old_term: u64, limit: Duration) -> bool {
        wait_for(limit, || self.leader_now().is_some_and(|(_, term)| term > old_term))
    }

    fn takeover_limit(&self) -> Duration {
        self.lease * 4 + Duration::from_secs(10)
    }

    /// The usual rounds: a fault on the current leader, then recovery.
    fn rounds(&mut self, fault: Fault, faults: &mut Vec<FaultSpan>, stuck: &mut usize) -> Result<(), ChaosError> {
        let election = self.election_name();
        for i in 0..self.settings.candidates {
            self.add(&format!("c{}", i + 1), &election, &election, None)?;
        }
        for _ in 0..self.settings.rounds {
            if interrupted() {
                return Err(ChaosError::Interrupted);
            }
            let Some((leader, term)) = self.wait_leader(self.takeover_limit()) else {
                *stuck += 1;
                self.respawn_exited()?;
                continue;
            };
            let span = self.inject(fault, leader, term)?;
            faults.push(span);
            self.respawn_exited()?;
        }
        // Let the last round's takeover be recorded before the candidates stop.
        if !faults.is_empty() {
            let _ = self.wait_leader(self.takeover_limit());
        }
        Ok(())
    }

    /// Injects `fault` on candidate `leader` (in `term`); returns when it is undone.
    fn inject(&mut self, fault: Fault, leader: usize, term: u64) -> Result<FaultSpan, ChaosError> {
        let target = self.candidates[leader].id.clone();
        let start = now();
        let mut takeover_expected = true;
        // When the fault was undone: taken just before the thaw or heal, since the processes it
        // wakes compete with the harness for the CPU and may run for a while before it does.
        let mut undone = None;
        match fault {
            Fault::Sigkill => {
                if let Some(process) = self.candidates[leader].process.as_mut() {
                    process.kill();
                }
                self.wait_takeover(term, self.takeover_limit());
            }
            Fault::Sigterm => {
                if let Some(process) = self.candidates[leader].process.as_ref() {
                    process.signal(Signal::SIGTERM);
                }
                self.wait_takeover(term, self.takeover_limit());
                let limit = self.lease * 2;
                if let Some(process) = self.candidates[leader].process.as_mut() {
                    if !process.wait_exit(limit) {
                        process.kill();
                    }
                }
            }
            Fault::Sigstop | Fault::Partition => {
                let past_lease = Deadline::after(self.lease.mul_f64(1.5));
                // Freezes the leader (SIGSTOP) or cuts it from the store; undone with `false`.
                let hold = |candidate: &Candidate, on: bool| {
                    if fault == Fault::Partition {
                        candidate.proxy.iter().for_each(|proxy| proxy.set_cut(on));
                    } else if let Some(process) = candidate.process.as_ref() {
                        process.signal_all(if on { Signal::SIGSTOP } else { Signal::SIGCONT });
                    }
                };
                hold(&self.candidates[leader], true);
                self.wait_takeover(term, self.takeover_limit());
                wait_for(self.lease * 2, || past_lease.passed());
                undone = Some(now());
                hold(&self.candidates[leader], false);
            }
            Fault::StoreRestart => {
                takeover_expected = false;
                self.store.restart(&self.settings.tenure)?;
                for candidate in &self.candidates {
                    if let Some(proxy) = candidate.proxy.as_ref() {
                        proxy.set_upstream(&self.store.address);
                    }
                }
            }
            Fault::ClockInside | Fault::ClockOutside | Fault::SplitLock => {}
        }
        Ok(FaultSpan { kind: fault.name(), target, start, end: undone.unwrap_or_else(now), takeover_expected })
    }

    /// Rounds of the clock faults and of the broken configuration: each round a fresh election.
    fn special_rounds(
        &mut self,
        fault: Fault,
        faults: &mut Vec<FaultSpan>,
        stuck: &mut usize,
    ) -> Result<(), ChaosError> {
        for round in 0..self.settings.rounds {
            if interrupted() {
                return Err(ChaosError::Interrupted);
            }
            let election = format!("{}-{round}", self.election_name());
            let first = self.candidates.len();
            let (target, start, takeover_expected) = if fault == Fault::SplitLock {
                for i in 0..2 {
                    let id = format!("r{round}-c{}", i + 1);
                    self.add(&id, &election, &format!("{election}-lock{i}"), None)?;
                }
                let start = now();
                let both = wait_for(self.takeover_limit(), || {
                    self.candidates[first..]
                        .iter()
                        .all(|c| matches!(self.recorder.latest(&c.id), Some((at, Answer::Leader { .. })) if at > start))
                });
                if !both {
                    *stuck += 1;
                }
                // Let several answers of both be recorded.
                let seen = Deadline::after(POLL_INTERVAL * 8);
                wait_for(POLL_INTERVAL * 10, || seen.passed());
                (String::new(), start, false)
            } else {
                let rate = if fault == Fault::ClockInside { RATE_INSIDE } else { RATE_OUTSIDE };
                self.add(&format!("r{round}-slow"), &election, &election, Some(rate))?;
                let Some((_, term)) = self.wait_leader(self.takeover_limit()) else {
                    *stuck += 1;
                    self.stop_from(first);
                    continue;
                };
                for i in 1..self.settings.candidates {
                    self.add(&format!("r{round}-c{i}"), &election, &election, None)?;
                }
                let followers = self.candidates[first + 1..].iter().map(|c| c.id.clone()).collect::<Vec<_>>();
                wait_for(self.takeover_limit(), || {
                    followers.iter().all(|id| matches!(self.recorder.latest(id), Some((_, Answer::Follower))))
                });
                let start = now();
                let networked = self.store.backend.networked();
                if let Some(proxy) = self.candidates[first].proxy.as_ref() {
                    proxy.set_cut(true);
                }
                let expected = networked || fault == Fault::ClockOutside;
                if expected {
                    self.wait_takeover(term, self.takeover_limit());
                } else {
                    let watched = Deadline::after(self.lease * 3);
                    wait_for(self.lease * 4, || watched.passed());
                }
                // Until the slow leader itself says it no longer leads (bounded by its renew
                // deadline in real time), so that its whole belief is on record.
                let slow = self.candidates[first].id.clone();
                if expected {
                    let limit = self.lease.mul_f64(0.5 / rate) + Duration::from_secs(5);
                    wait_for(limit, || !matches!(self.recorder.latest(&slow), Some((_, Answer::Leader { .. }))));
                }
                if let Some(proxy) = self.candidates[first].proxy.as_ref() {
                    proxy.set_cut(false);
                }
                (slow, start, expected)
            };
            faults.push(FaultSpan { kind: fault.name(), target, start, end: now(), takeover_expected });
            self.stop_from(first);
        }
        Ok(())
    }

    /// Stops the candidates from `first` on (they stay listed for the timeline).
    fn stop_from(&mut self, first: usize) {
        for candidate in &mut self.candidates[first..] {
            candidate.poller = None;
            if let Some(mut process) = candidate.process.take() {
                process.kill();
            }
        }
    }
}
