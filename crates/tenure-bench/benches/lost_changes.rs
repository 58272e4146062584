//! `cargo bench --profile dev -p tenure-bench --bench lost_changes` (about 6 minutes)
//!
//! The dev profile is enough (and reuses the debug build CI makes): what is measured is whether a
//! change is lost, and the times are dominated by the lease and the handler's work.
//! `TENURE_BENCH_CELLS=warm-freeze,cold-kill` runs only those cells; `TENURE_BENCH_VERBOSE=1`
//! prints every round's events (a lost change's round is always printed, with its events).
//!
//! Issue 30's numbers to reach: no change is lost across a leader change. For each standby mode
//! (warm, cold) and each way leadership is lost (the Lease deleted, the leader frozen past the
//! lease, SIGKILL, SIGTERM), TENURE_BENCH_ROUNDS rounds (default 100) of: a ConfigMap is created,
//! its handler starts, the loss is injected while the handler is in flight, and the round waits
//! until every ConfigMap created so far is annotated by a handler. A round that does not complete
//! within its patience (TENURE_BENCH_PATIENCE_SECS, default 30 s) is a lost change: counted and
//! reported with its log lines, never waited on further.
//!
//! Method: the project's API server (what `tenure apiserver` runs) in this process on 127.0.0.1;
//! the replicas are processes (this program re-executed with `TENURE_LOSS_REPLICA` set), each an
//! elector on a Lease plus a `GatedWatch` of the ConfigMaps of its election's namespace with a
//! `KubeCheckpointStore` (ConfigMap annotation), in the mode of its cell; its handler writes
//! through `WriteGate::leader`. Each of the 8 cells (mode x loss) is an election in a namespace of
//! its own, and the cells run side by side. The handler skips a ConfigMap already annotated
//! (its own patch comes back as a change), else takes TENURE_BENCH_WORK_MS (default 300) while
//! watching its tenure (returns `Ok` at once if the tenure ends first: deposed, as the README's
//! handler once did), then fails with `Err` the first time this process handles a ConfigMap of
//! every third round (retried with back-off), then `tenure.check()` (deposed: `Err`) and patches
//! the annotation `<identity>/<pid>/<term>`. It prints what it does on standard output (`leading`,
//! `ended`, `start`, `end <name> <outcome>`, `stopping`, `stopped`), which the driver reads as it happens.
//!
//! Rounds alternate between a single replica (even rounds: after the loss only the same process,
//! or for SIGKILL and SIGTERM the same identity restarted, can lead next) and two replicas (odd
//! rounds: the other replica is running and may win). Losses: the Lease object is deleted; the
//! leader is SIGSTOPped for 1.5 leases, then SIGCONTed; the leader is SIGKILLed and restarted
//! with the same identity; the leader is SIGTERMed (it drains and releases) and restarted.
//! Timing: lease TENURE_BENCH_LEASE_MS (default 2000), renew deadline 70 % of it, retry
//! TENURE_BENCH_RETRY_MS (default 200).
//!
//! Reported per cell: rounds, who led next (the same process, the same identity in a restarted
//! process, the other replica), lost changes, the handler outcomes seen over the whole cell (ok,
//! err, deposed: returned after its tenure ended, interrupted: started and never returned, as when
//! aborted or killed), and the time from the new leader's start of leading to the end of the
//! successful handling of the round's ConfigMap (it includes the handler's own work time), for the
//! rounds in which the next leader handled it. Nothing here is timed against a goal but the count
//! of lost changes (goal: 0).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use nix::sys::signal::Signal;
use serde_json::json;
use tenure::{Elector, Tenure, Timing};
use tenure_apiserver::resources::{find_resource_type, namespaces, ResourceType};
use tenure_apiserver::selectors::Selectors;
use tenure_apiserver::store::DeletePreconditions;
use tenure_apiserver::{ApiServer, ApiServerConfig, Store};
use tenure_bench::kube_client::kube_client;
use tenure_bench::process::ChildGuard;
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize, ms};
use tenure_ha::checkpoint::kube::KubeCheckpointStore;
use tenure_ha::kube_watch::{Change, GatedWatch, Standby};
use tenure_kube::{KubeLock, KubeLockRef, LockKind, WriteGate};

/// Set in a replica's environment: run as a replica, not as the driver.
const REPLICA: &str = "TENURE_LOSS_REPLICA";
const LEASE: &str = "loss";
const CHECKPOINT: &str = "loss-checkpoint";
const HANDLED: &str = "tenure-bench/handled";
const IDENTITIES: [&str; 2] = ["a", "b"];

fn configmaps() -> &'static ResourceType {
    find_resource_type("", "v1", "configmaps").expect("configmaps")
}

fn leases() -> &'static ResourceType {
    find_resource_type("coordination.k8s.io", "v1", "leases").expect("leases")
}

// ---------------------------------------------------------------------------------------------
// The replica process.

struct ReplicaConfig {
    url: String,
    namespace: String,
    identity: String,
    standby: Standby,
    timing: Timing,
    work: Duration,
}

fn timing_from_env() -> Timing {
    let lease = Duration::from_millis(env_usize("TENURE_BENCH_LEASE_MS", 2000) as u64);
    let retry = Duration::from_millis(env_usize("TENURE_BENCH_RETRY_MS", 200) as u64);
    Timing::new(lease, lease * 7 / 10, retry).expect("a valid timing")
}

fn replica_main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set for a replica"));
    let standby = match var("TENURE_LOSS_STANDBY").as_str() {
        "warm" => Standby::Warm,
        _ => Standby::Cold,
    };
    let config = ReplicaConfig {
        url: var("TENURE_LOSS_URL"),
        namespace: var("TENURE_LOSS_NAMESPACE"),
        identity: var("TENURE_LOSS_IDENTITY"),
        standby,
        timing: timing_from_env(),
        work: Duration::from_millis(env_usize("TENURE_BENCH_WORK_MS", 300) as u64),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(replica(config));
}

async fn replica(config: ReplicaConfig) {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
    let ReplicaConfig { url, namespace, identity, standby, timing, work } = config;
    let reference = KubeLockRef { namespace: namespace.clone(), kind: LockKind::Leases, name: LEASE.into() };
    let lock = KubeLock::new(kube_client(&url, &tenure_kube::user_agent(&identity)), &reference, &identity);
    let elector = Elector::builder(&identity, lock.record_lock()).timing(timing).spawn().expect("an elector");
    let checkpoints =
        KubeCheckpointStore::new(kube_client(&url, &format!("{identity}-checkpoint")), &namespace, CHECKPOINT, LEASE);
    let watched: Api<ConfigMap> = Api::namespaced(kube_client(&url, &format!("{identity}-watch")), &namespace);
    let gated = WriteGate::leader(&elector).client(kube_client(&url, &format!("{identity}-handler")));
    let writes: Api<ConfigMap> = Api::namespaced(gated, &namespace);
    let failed_once = Arc::new(Mutex::new(HashSet::new()));
    let handled_as = format!("{identity}/{}", std::process::id());
    let watch = GatedWatch::new(watched, "configmaps", Arc::new(checkpoints))
        .standby(standby)
        .retry_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .run(&elector, move |change, tenure| {
            handle(change, tenure, writes.clone(), failed_once.clone(), work, handled_as.clone())
        });
    println!("ready");

    // Report each tenure's start and end as it happens.
    let mut leadership = elector.subscribe();
    let mut current: Option<Tenure> = None;
    loop {
        if current.as_ref().is_none_or(|tenure| tenure.check().is_err()) {
            if let Some(old) = current.take() {
                println!("ended {}", old.term());
            }
            if let Some(tenure) = elector.tenure() {
                println!("leading {}", tenure.term());
                current = Some(tenure);
            }
        }
        let ended = async {
            match &current {
                Some(tenure) => tenure.ended().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = terminate.recv() => break,
            changed = leadership.changed() => if changed.is_err() { break },
            () = ended => {}
        }
    }
    println!("stopping");
    drop(current); // a tenure held is one the elector's shutdown waits for
    watch.shutdown().await;
    println!("work-stopped");
    let released = elector.shutdown().await;
    println!("stopped {}", if released.is_ok() { "released" } else { "unreleased" });
}

/// The controller's handler (see the module documentation); prints `start` and `end` lines.
async fn handle(
    change: Change<ConfigMap>,
    tenure: Tenure,
    writes: Api<ConfigMap>,
    failed_once: Arc<Mutex<HashSet<String>>>,
    work: Duration,
    handled_as: String,
) -> Result<(), String> {
    let Change::Applied(object) = change else { return Ok(()) };
    let name = object.name_any();
    if object.annotations().contains_key(HANDLED) {
        return Ok(());
    }
    let term = tenure.term();
    println!("start {name} {term}");
    tokio::select! {
        () = tokio::time::sleep(work) => {}
        () = tenure.ended() => {
            println!("end {name} deposed-ok {term}");
            return Ok(()); // deposed: neither success nor failure, whatever it returns
        }
    }
    let fails = object.data.as_ref().and_then(|data| data.get("fail")).is_some_and(|value| value == "1");
    if fails && failed_once.lock().expect("not poisoned").insert(name.clone()) {
        let verdict = if tenure.check().is_ok() { "err" } else { "deposed-err" };
        println!("end {name} {verdict} {term}");
        return Err(format!("{name}: injected failure"));
    }
    if tenure.check().is_err() {
        println!("end {name} deposed-err {term}");
        return Err(format!("{name}: not leader"));
    }
    let patch = json!({"metadata": {"annotations": {HANDLED: format!("{handled_as}/{term}")}}});
    if let Err(error) = writes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        let verdict = if tenure.check().is_ok() { "err" } else { "deposed-err" };
        println!("end {name} {verdict} {term}");
        return Err(error.to_string());
    }
    let verdict = if tenure.check().is_ok() { "ok" } else { "deposed-ok" };
    println!("end {name} {verdict} {term}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The driver.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    Delete,
    Freeze,
    Kill,
    Term,
}

impl Loss {
    const ALL: [Loss; 4] = [Loss::Delete, Loss::Freeze, Loss::Kill, Loss::Term];

    fn name(self) -> &'static str {
        match self {
            Loss::Delete => "Lease deleted",
            Loss::Freeze => "freeze past the lease",
            Loss::Kill => "SIGKILL + restart",
            Loss::Term => "SIGTERM + restart",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Loss::Delete => "delete",
            Loss::Freeze => "freeze",
            Loss::Kill => "kill",
            Loss::Term => "term",
        }
    }
}

/// A line a replica printed, with when the driver read it.
#[derive(Debug, Clone)]
struct Event {
    pid: u32,
    identity: String,
    at: Instant,
    words: Vec<String>,
}

impl Event {
    fn is(&self, verb: &str) -> bool {
        self.words.first().is_some_and(|w| w == verb)
    }

    fn about(&self, verb: &str, name: &str) -> bool {
        self.is(verb) && self.words.get(1).is_some_and(|w| w == name)
    }
}

struct Running {
    guard: ChildGuard,
    pid: u32,
}

/// Who led first after the loss.
#[derive(Debug, Default, Clone, Copy)]
struct NextLeaders {
    same_process: usize,
    same_identity_restarted: usize,
    other: usize,
    none_seen: usize,
}

#[derive(Default)]
struct CellResult {
    rounds: usize,
    solo_rounds: usize,
    next: NextLeaders,
    lost: Vec<String>,
    late: Vec<String>,
    outcomes: BTreeMap<String, usize>,
    starts: usize,
    after_new_leader_ms: Vec<f64>,
    handled_by_old_tenure: usize,
    no_start: usize,
    round_ms: Vec<f64>,
}

struct Settings {
    url: String,
    rounds: usize,
    timing: Timing,
    patience: Duration,
    scratch: PathBuf,
}

struct Cell<'a> {
    store: &'a Store,
    settings: &'a Settings,
    standby: &'static str,
    loss: Loss,
    namespace: String,
    slots: [Option<Running>; 2],
    spawned: usize,
    sender: Sender<Event>,
    events: Receiver<Event>,
    /// Every event of the current round, for a report of a lost change.
    round_log: Vec<String>,
    /// The replicas' events of the current round.
    round_events: Vec<Event>,
    /// When the current round began (the log's time origin).
    round_began: Instant,
    /// Process id -> the term it leads under now.
    leading: BTreeMap<u32, String>,
    result: CellResult,
    kept_logs: Vec<PathBuf>,
}

impl<'a> Cell<'a> {
    fn new(store: &'a Store, settings: &'a Settings, standby: &'static str, loss: Loss) -> Cell<'a> {
        let namespace = format!("{standby}-{}", loss.key());
        store.create(namespaces(), "", json!({"metadata": {"name": namespace}})).expect("a namespace");
        let (sender, events) = mpsc::channel();
        Cell {
            store,
            settings,
            standby,
            loss,
            namespace,
            slots: [None, None],
            spawned: 0,
            sender,
            events,
            round_log: Vec::new(),
            round_events: Vec::new(),
            round_began: Instant::now(),
            leading: BTreeMap::new(),
            result: CellResult::default(),
            kept_logs: Vec::new(),
        }
    }

    fn log_path(&self, identity: &str, n: usize) -> PathBuf {
        self.settings.scratch.join(format!("{}-{identity}-{n}.log", self.namespace))
    }

    fn start(&mut self, slot: usize) {
        let identity = IDENTITIES[slot];
        self.spawned += 1;
        let log = self.log_path(identity, self.spawned);
        let (reader, writer) = std::io::pipe().expect("a pipe");
        let mut command = Command::new(std::env::current_exe().expect("this program"));
        command
            .env(REPLICA, "1")
            .env("TENURE_LOSS_URL", &self.settings.url)
            .env("TENURE_LOSS_NAMESPACE", &self.namespace)
            .env("TENURE_LOSS_IDENTITY", identity)
            .env("TENURE_LOSS_STANDBY", self.standby)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(std::fs::File::create(&log).expect("a log file"));
        let guard = ChildGuard::spawn(&format!("{}-{identity}", self.namespace), &mut command, Some(&log))
            .expect("start a replica");
        drop(command); // closes our copy of the pipe's write end
        let pid = guard.pid();
        let sender = self.sender.clone();
        let owner = identity.to_owned();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                let words = line.split_whitespace().map(str::to_owned).collect();
                let event = Event { pid, identity: owner.clone(), at: Instant::now(), words };
                if sender.send(event).is_err() {
                    break;
                }
            }
        });
        self.note(format!("driver: started {identity} pid {pid} (log {})", log.display()));
        self.slots[slot] = Some(Running { guard, pid });
    }

    /// Adds a line of the driver's own to the round's log.
    fn note(&mut self, text: String) {
        let at = ms(self.round_began.elapsed());
        self.round_log.push(format!("{at:8.1} ms {text}"));
    }

    /// Takes one event, waiting until `until` at most, and keeps the leadership state current.
    fn pump(&mut self, until: Instant) -> Option<Event> {
        let wait = until.saturating_duration_since(Instant::now());
        let event = match self.events.recv_timeout(wait) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
        };
        let at = ms(event.at.saturating_duration_since(self.round_began));
        self.round_log.push(format!("{at:8.1} ms {} pid {}: {}", event.identity, event.pid, event.words.join(" ")));
        self.round_events.push(event.clone());
        if event.is("leading") {
            self.leading.insert(event.pid, event.words.get(1).cloned().unwrap_or_default());
        } else if event.is("ended") || event.is("stopped") {
            self.leading.remove(&event.pid);
        } else if event.is("start") {
            self.result.starts += 1;
        } else if event.is("end") {
            let outcome = event.words.get(2).cloned().unwrap_or_default();
            *self.result.outcomes.entry(outcome).or_default() += 1;
        }
        Some(event)
    }

    fn running_pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].as_ref().map(|r| r.pid)
    }

    fn slot_of(&self, pid: u32) -> Option<usize> {
        (0..2).find(|&slot| self.running_pid(slot) == Some(pid))
    }

    /// The slot of a running process that leads, waiting for one until `until`.
    fn leader(&mut self, until: Instant) -> Option<usize> {
        loop {
            let leader = self.leading.keys().find_map(|&pid| self.slot_of(pid));
            if leader.is_some() {
                return leader;
            }
            if Instant::now() >= until {
                return None;
            }
            self.pump(until);
        }
    }

    /// Waits for the process in `slot` to exit (bounded), reading events meanwhile; SIGKILL after.
    fn reap(&mut self, slot: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let Some(mut running) = self.slots[slot].take() else { return };
        while running.guard.try_status().expect("a status").is_none() {
            if Instant::now() >= deadline {
                self.note(format!("driver: pid {} did not exit in {limit:?}; SIGKILL", running.pid));
                let _ = running.guard.kill_and_reap();
                break;
            }
            self.pump((Instant::now() + Duration::from_millis(5)).min(deadline));
        }
        self.leading.remove(&running.pid);
    }

    fn stop(&mut self, slot: usize) {
        if let Some(running) = &self.slots[slot] {
            let _ = running.guard.signal(Signal::SIGTERM);
            self.reap(slot, Duration::from_secs(15));
        }
    }

    /// The ConfigMaps of the rounds (not the checkpoint) that carry no annotation yet.
    fn unhandled(&self) -> BTreeSet<String> {
        let (items, _) = self.store.list(configmaps(), Some(&self.namespace), &Selectors::default());
        items
            .iter()
            .filter(|object| object["metadata"]["annotations"][HANDLED].as_str().is_none())
            .filter_map(|object| object["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|name| name != CHECKPOINT)
            .collect()
    }

    fn handled_by(&self, name: &str) -> Option<String> {
        let object = self.store.get(configmaps(), &self.namespace, name).ok()?;
        object["metadata"]["annotations"][HANDLED].as_str().map(str::to_owned)
    }

    fn run(mut self) -> (String, CellResult, Vec<PathBuf>) {
        let lease = self.settings.timing.lease_duration;
        self.start(0);
        let first = self.leader(Instant::now() + Duration::from_secs(60));
        assert!(first.is_some(), "{}: nobody leads at start:\n{}", self.namespace, self.round_log.join("\n"));
        for round in 0..self.settings.rounds {
            self.round(round, lease);
        }
        for slot in 0..2 {
            self.stop(slot);
        }
        let late: Vec<String> = self.result.lost.iter().filter(|n| self.handled_by(n).is_some()).cloned().collect();
        self.result.late = late;
        (self.namespace.clone(), self.result, self.kept_logs)
    }

    fn round(&mut self, round: usize, lease: Duration) {
        self.round_log.clear();
        self.round_events.clear();
        self.round_began = Instant::now();
        let began = self.round_began;
        let solo = round.is_multiple_of(2);
        self.result.rounds += 1;
        self.result.solo_rounds += usize::from(solo);
        let Some(leader) = self.leader(Instant::now() + self.settings.patience) else {
            self.note("driver: nobody leads before the round".into());
            self.lose(round, vec![format!("(round {round}: no leader)")]);
            return;
        };
        let other = 1 - leader;
        if solo {
            self.stop(other);
        } else if self.slots[other].is_none() {
            self.start(other);
        }

        // A change, and its handler in flight.
        let name = format!("r{round}");
        let fail = if round % 3 == 1 { "1" } else { "0" };
        let object = json!({"metadata": {"name": name}, "data": {"fail": fail}});
        self.store.create(configmaps(), &self.namespace, object).expect("a ConfigMap");
        let until = Instant::now() + self.settings.patience;
        let mut victim = None;
        while victim.is_none() && Instant::now() < until {
            if let Some(event) = self.pump(until) {
                if event.about("start", &name) {
                    victim = self.slot_of(event.pid).map(|slot| (slot, event.pid));
                }
            }
        }
        let Some((victim, victim_pid)) = victim else {
            self.result.no_start += 1;
            self.note(format!("driver: no handler of {name} started"));
            let unhandled = self.unhandled().into_iter().collect();
            self.lose(round, unhandled);
            return;
        };

        // The loss.
        let injected = Instant::now();
        match self.loss {
            Loss::Delete => {
                let deleted = self.store.delete(leases(), &self.namespace, LEASE, &DeletePreconditions::default());
                self.note(format!("driver: Lease deleted: {}", deleted.is_ok()));
            }
            Loss::Freeze => {
                let running = self.slots[victim].as_ref().expect("running");
                running.guard.signal(Signal::SIGSTOP).expect("SIGSTOP");
                self.note(format!("driver: SIGSTOP {victim_pid}"));
                let thaw = Instant::now() + lease * 3 / 2;
                while Instant::now() < thaw {
                    self.pump(thaw);
                }
                let running = self.slots[victim].as_ref().expect("running");
                running.guard.signal(Signal::SIGCONT).expect("SIGCONT");
                self.note(format!("driver: SIGCONT {victim_pid}"));
            }
            Loss::Kill => {
                let mut running = self.slots[victim].take().expect("running");
                running.guard.kill_and_reap().expect("SIGKILL");
                self.leading.remove(&victim_pid);
                self.note(format!("driver: SIGKILL {victim_pid}"));
                self.start(victim);
            }
            Loss::Term => {
                let running = self.slots[victim].as_ref().expect("running");
                running.guard.signal(Signal::SIGTERM).expect("SIGTERM");
                self.note(format!("driver: SIGTERM {victim_pid}"));
                self.reap(victim, Duration::from_secs(15));
                self.start(victim);
            }
        }

        // Every change so far handled, and who led next.
        let deadline = injected + self.settings.patience;
        let handled_ok = |event: &Event| event.about("end", &name) && event.words.get(2).is_some_and(|w| w == "ok");
        let mut grace: Option<Instant> = None;
        let (next, handled) = loop {
            let next = self.round_events.iter().find(|e| e.is("leading") && e.at > injected).cloned();
            let handled = self.round_events.iter().find(|e| handled_ok(e)).cloned();
            let now = Instant::now();
            if (next.is_some() && handled.is_some()) || now >= deadline || grace.is_some_and(|g| now >= g) {
                break (next, handled);
            }
            if next.is_some() && grace.is_none() && self.unhandled().is_empty() {
                // All annotated, but the handler's line may still be on the way (bounded).
                grace = Some((now + Duration::from_secs(1)).min(deadline));
            }
            self.pump((now + Duration::from_millis(20)).min(deadline));
        };
        let unhandled: Vec<String> = self.unhandled().into_iter().collect();
        match &next {
            None => {
                self.result.next.none_seen += 1;
                eprintln!(
                    "{} round {round}: no replica started leading after the loss; the round's events:\n  {}",
                    self.namespace,
                    self.round_log.join("\n  ")
                );
            }
            Some(event) if event.pid == victim_pid => self.result.next.same_process += 1,
            Some(event) if event.identity == IDENTITIES[victim] => self.result.next.same_identity_restarted += 1,
            Some(_) => self.result.next.other += 1,
        }
        if let (Some(next), Some(handled)) = (&next, &handled) {
            if handled.pid == next.pid && handled.at >= next.at {
                self.result.after_new_leader_ms.push(ms(handled.at - next.at));
            } else {
                self.result.handled_by_old_tenure += 1;
            }
        }
        if !unhandled.is_empty() {
            self.lose(round, unhandled);
        }
        self.result.round_ms.push(ms(began.elapsed()));
        if std::env::var_os("TENURE_BENCH_VERBOSE").is_some() {
            eprintln!("{} round {round}:\n  {}", self.namespace, self.round_log.join("\n  "));
        }
    }

    /// Counts the ConfigMaps not handled within the round's patience as lost (each once), prints
    /// the round's events and keeps the replicas' logs.
    fn lose(&mut self, round: usize, names: Vec<String>) {
        let new: Vec<String> = names.into_iter().filter(|n| !self.result.lost.contains(n)).collect();
        if new.is_empty() {
            return;
        }
        eprintln!(
            "LOST in {} round {round}: {new:?} not handled within {:?}; the round's events:\n  {}",
            self.namespace,
            self.settings.patience,
            self.round_log.join("\n  ")
        );
        self.result.lost.extend(new);
        let keep = std::env::temp_dir().join(format!("tenure-bench-lost-changes-{}", std::process::id()));
        std::fs::create_dir_all(&keep).expect("a directory for the kept logs");
        for n in 1..=self.spawned {
            for identity in IDENTITIES {
                let log = self.log_path(identity, n);
                if let Some(file) = log.file_name().filter(|_| log.exists()) {
                    let kept = keep.join(file);
                    if std::fs::copy(&log, &kept).is_ok() && !self.kept_logs.contains(&kept) {
                        self.kept_logs.push(kept);
                    }
                }
            }
        }
    }
}

fn summary_text(samples: &[f64]) -> String {
    Summary::of(samples).map_or_else(|| "-".into(), |s| format!("{:.0} / {:.0}", s.p50, s.p99))
}

fn print_table(results: &[(String, CellResult)]) {
    println!(
        "| mode | loss | rounds (single replica) | next leader: same process / same identity restarted / other / none | lost | outcomes seen | handled after the new leader started, p50 / p99 ms | round p50 / p99 ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (namespace, result) in results {
        let (standby, loss) = namespace.split_once('-').expect("mode-loss");
        let loss = Loss::ALL.iter().find(|l| l.key() == loss).map_or(loss, |l| l.name());
        let ended: usize = result.outcomes.values().sum();
        let mut outcomes: Vec<String> = result.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        outcomes.push(format!("interrupted {}", result.starts.saturating_sub(ended)));
        let n = result.next;
        let old = if result.handled_by_old_tenure > 0 {
            format!(" (+{} handled before the next leader)", result.handled_by_old_tenure)
        } else {
            String::new()
        };
        println!(
            "| {standby} | {loss} | {} ({}) | {} / {} / {} / {} | {} | {} | {}{old} | {} |",
            result.rounds,
            result.solo_rounds,
            n.same_process,
            n.same_identity_restarted,
            n.other,
            n.none_seen,
            result.lost.len(),
            outcomes.join(", "),
            summary_text(&result.after_new_leader_ms),
            summary_text(&result.round_ms),
        );
    }
}

async fn drive(report: &mut Report) {
    let timing = timing_from_env();
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 100);
    let patience = env_seconds("TENURE_BENCH_PATIENCE_SECS", Duration::from_secs(30));
    let server = ApiServer::start(ApiServerConfig::default()).await.expect("a server");
    let store: Arc<Store> = server.store().clone();
    let scratch = ScratchDir::new("lost-changes").expect("a scratch directory");
    let settings =
        Arc::new(Settings { url: server.url(), rounds, timing, patience, scratch: scratch.path().to_owned() });
    // TENURE_BENCH_CELLS=warm-freeze,cold-kill runs only those cells.
    let only: Option<Vec<String>> =
        std::env::var("TENURE_BENCH_CELLS").ok().map(|cells| cells.split(',').map(str::to_owned).collect());
    let started = Instant::now();
    let cells: Vec<_> = ["warm", "cold"]
        .into_iter()
        .flat_map(|standby| Loss::ALL.into_iter().map(move |loss| (standby, loss)))
        .filter(|(standby, loss)| only.as_ref().is_none_or(|only| only.contains(&format!("{standby}-{}", loss.key()))))
        .map(|(standby, loss)| {
            let (store, settings) = (store.clone(), settings.clone());
            tokio::task::spawn_blocking(move || Cell::new(&store, &settings, standby, loss).run())
        })
        .collect();
    let mut results = Vec::new();
    let mut kept = Vec::new();
    for cell in cells {
        let (namespace, result, logs) = cell.await.expect("a cell ran to its end");
        kept.extend(logs);
        results.push((namespace, result));
    }
    let elapsed = started.elapsed();
    print_table(&results);

    let total_rounds: usize = results.iter().map(|(_, r)| r.rounds).sum();
    let lost: usize = results.iter().map(|(_, r)| r.lost.len()).sum();
    let same: usize = results.iter().map(|(_, r)| r.next.same_process + r.next.same_identity_restarted).sum();
    report.info("rounds", "loss rounds, all cells", total_rounds as f64, "");
    report.info("lost_changes", "changes not handled within the patience (goal 0)", lost as f64, "");
    report.info("same_replica_leads_again", "rounds in which the same replica led next", same as f64, "");
    report.info("minutes", "wall time of the run", elapsed.as_secs_f64() / 60.0, "min");
    for (namespace, result) in &results {
        let key = namespace.replace('-', "_");
        let samples = &result.after_new_leader_ms;
        let summary = Summary::of(samples);
        report.extra(
            &key,
            json!({
                "rounds": result.rounds,
                "same_process": result.next.same_process,
                "same_identity_restarted": result.next.same_identity_restarted,
                "other": result.next.other,
                "none_seen": result.next.none_seen,
                "lost": result.lost,
                "late": result.late,
                "outcomes": result.outcomes,
                "starts": result.starts,
                "no_start": result.no_start,
                "handled_by_old_tenure": result.handled_by_old_tenure,
                "after_new_leader_ms_p50": summary.map(|s| s.p50),
                "after_new_leader_ms_p99": summary.map(|s| s.p99),
            }),
        );
    }
    report.note(format!(
        "lease {:.0} ms, renew deadline 70 %, retry {:.0} ms, handler work {} ms, patience {} s; the 8 cells ran side by side",
        ms(timing.lease_duration),
        ms(timing.retry_period),
        env_usize("TENURE_BENCH_WORK_MS", 300),
        patience.as_secs()
    ));
    if !kept.is_empty() {
        report.note(format!("logs of the cells with a lost change kept in {}", path_of(&kept)));
    }
    drop(scratch);
    server.shutdown().await;
}

fn path_of(kept: &[PathBuf]) -> String {
    kept.first().and_then(|p| p.parent()).map_or_else(String::new, |p: &Path| p.display().to_string())
}

fn main() {
    if std::env::var_os(REPLICA).is_some() {
        replica_main();
        return;
    }
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("lost_changes");
    runtime.block_on(drive(&mut report));
    report.print();
}
