//! `cargo bench -p tenure-bench --bench store_outage`
//!
//! Recovery without a restart (issue 35, item 2): after a store outage longer than the renew
//! deadline, how soon an HA-runtime controller reconciles again. Goal: the first reconcile at most
//! 1 s after the store answers again, for outages of 5 s, 30 s and 120 s on etcd, ZooKeeper and
//! Kubernetes.
//!
//! Method, per store: the store runs as a process of its own (etcd and ZooKeeper from the test kit,
//! Kubernetes as `tenure apiserver`), each in a process group of its own. Two replicas of a
//! controller run in this process, each on a tokio runtime of its own with its own store client: an
//! elector built with the library (`EtcdElection::campaign` with a 2 s lease TTL; `ZkElection` with
//! a 2 s session; a Lease lock with `tenure::Elector` and `Timing::from_ttl(2 s)`: lease 2 s, renew
//! deadline 1 s, retry 500 ms) and a `tenure_ha::Gate` whose work records when it starts (its
//! "first reconcile") and, through a guard it holds, when it stops. Per outage length, in order:
//! wait until one replica leads and its work has run for a second; SIGSTOP the store's process
//! group (seen stopped in `/proc`); wait the outage; check that the leader's work stopped during
//! the outage (the gate's stop reason: `fenced` when the renew deadline passed, `lost` when the
//! session broke), that no work started while the store was frozen and that both replicas still
//! run (their gates and electors: the controller paused, nothing exited); SIGCONT; measure from
//! just before SIGCONT to the first work start on either replica. Also recorded: which replica
//! leads after the outage (the same as before or the other), whether its elector's identity and
//! the leader it publishes are its own (unchanged: no new process, no new name), and the terms.
//!
//! What a round's time depends on:
//! - every store: where each replica was in its wait at the thaw. A replica whose calls keep
//!   failing calls again at most `tenure::timing::OUTAGE_PROBE` (0.9 s, jittered down to 0.72 s)
//!   after the *start* of its last call, so a call that timed out is followed at once: a frozen
//!   store always has a call of each replica waiting, answered as it thaws, unless the thaw falls
//!   in the gap between a timeout and the next probe. `*_answered_ms` (thaw -> the first call
//!   the store answered) shows which.
//! - ZooKeeper: requests of the old session queued in the frozen server's sockets can renew that
//!   session when the server reads them at the thaw; the next session of the same candidate
//!   deletes that session's node, so it does not stand in the queue one more session timeout.
//! - Kubernetes: a follower's takeover write, sent during the outage when the leader's lease ran
//!   out on its clock, times out at the client but may be applied at the thaw; the candidate
//!   recognises its own write when it reads it and takes it over at once (with a new term).
//!   TENURE_BENCH_TRACE_LEASE=1 shows the write landing. `tenure apiserver` accepts 4096 pending
//!   connections: with 128, the connections abandoned during a 120 s outage filled the queue and
//!   the next one waited for a SYN retransmission.
//!
//! One round per (store, outage length) by default: with 120 s outages a round costs minutes, so
//! the numbers are single samples, not percentiles; the whole run takes about (5 + 30 + 120) s x 3
//! stores plus a few seconds per round. TENURE_BENCH_ROUNDS asks for more (the goal then applies
//! to the slowest round; every round is in the JSON's `rounds`).
//!
//! Settings: TENURE_BENCH_OUTAGES (seconds, default "5,30,120"), TENURE_BENCH_ROUNDS (per store
//! and outage length, default 1), TENURE_BENCH_TRACE_LEASE=1 (Kubernetes: print every change of
//! the Lease a watch of this process sees, with the wall-clock time it arrived, to tell which
//! write landed when), TENURE_BENCH_FAULT (`freeze`, the default, or `restart`: the store is
//! killed with SIGKILL and started again on its ports and data after the outage, the clock
//! starting when it serves again; etcd and ZooKeeper only, since `tenure apiserver` keeps its
//! objects in memory), TENURE_BENCH_STORES (default
//! "etcd,zookeeper,kube"), TENURE_BIN (the binary that serves `tenure apiserver`; see
//! `tenure_binary`), RUST_LOG (e.g. `tenure=debug,tenure_etcd=debug`: what the electors do, on
//! standard error, to explain a slow recovery).

use std::convert::Infallible;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tenure::{Elector, Term, Timing};
use tenure_bench::binary::tenure_binary;
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::{env_usize, ms};
use tenure_etcd::EtcdElection;
use tenure_ha::gate::{Gate, GateHandle};
use tenure_ha::metrics::GateMetrics;
use tenure_kube::{KubeLock, KubeLockRef, LockKind};
use tenure_testkit::etcd::{EtcdCluster, EtcdConfig};
use tenure_testkit::process::ServerProcess;
use tenure_testkit::zookeeper::{ZkConfig, ZkServer};
use tenure_zk::ZkElection;
use tokio::sync::mpsc;

/// The lease: etcd's minimum TTL, the ZooKeeper session timeout, the Lease's `--ttl`.
const LEASE: Duration = Duration::from_secs(2);
/// The goal: the first reconcile at most this long after the store answers again.
const GOAL: Duration = Duration::from_secs(1);
/// How long the leader's work runs before the store is frozen.
const WORKING_BEFORE: Duration = Duration::from_secs(1);
/// The longest a replica may take to lead (first election, or after the thaw) before the
/// benchmark gives up.
const PATIENCE: Duration = Duration::from_secs(60);
/// The stop reasons of the gate's metric.
const STOP_REASONS: [&str; 7] = ["lost", "fenced", "resigned", "shutdown", "failed", "finished", "stuck"];

/// How the store goes away: frozen (SIGSTOP, then SIGCONT: requests queue in its sockets) or
/// killed and started again on the same ports and data (connections refused meanwhile).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Freeze,
    Restart,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StoreKind {
    Etcd,
    Zk,
    Kube,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Etcd => "etcd",
            StoreKind::Zk => "zookeeper",
            StoreKind::Kube => "kube",
        }
    }

    /// The short name in the report's keys.
    fn key(self) -> &'static str {
        match self {
            StoreKind::Etcd => "etcd",
            StoreKind::Zk => "zk",
            StoreKind::Kube => "kube",
        }
    }
}

/// A store server in a process group of its own, which this benchmark freezes and thaws.
enum Server {
    Etcd(Box<EtcdCluster>),
    Zk(ZkServer),
    /// `tenure apiserver` and its URL; the directory of its log goes after it.
    Kube {
        process: ServerProcess,
        url: String,
        _dir: ScratchDir,
    },
}

impl Server {
    async fn start(kind: StoreKind) -> Server {
        match kind {
            StoreKind::Etcd => {
                let cluster = EtcdCluster::start_with(EtcdConfig::new(1)).await.expect("an etcd server");
                Server::Etcd(Box::new(cluster))
            }
            StoreKind::Zk => {
                let server = tokio::task::spawn_blocking(|| ZkServer::start(&ZkConfig::default()))
                    .await
                    .expect("the start of ZooKeeper")
                    .expect("a ZooKeeper server");
                Server::Zk(server)
            }
            StoreKind::Kube => {
                let binary = tokio::task::spawn_blocking(tenure_binary).await.expect("the tenure binary");
                start_apiserver(&binary).await
            }
        }
    }

    /// The process group to signal (the server leads it).
    fn pgid(&self) -> i32 {
        let pid = match self {
            Server::Etcd(cluster) => cluster.pid(0).expect("etcd runs"),
            Server::Zk(server) => server.pid().expect("ZooKeeper runs"),
            Server::Kube { process, .. } => process.pid(),
        };
        i32::try_from(pid).expect("a pid")
    }

    fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(-self.pgid()), signal).unwrap_or_else(|e| panic!("{signal} the store's process group: {e}"));
    }

    /// SIGSTOP to the server's process group; returns once every thread of the server is stopped.
    fn freeze(&self) {
        self.signal(Signal::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(self.pgid()) {
            assert!(Instant::now() < deadline, "the store did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn thaw(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Takes the store away as `fault` says.
    fn stop(&mut self, fault: Fault) {
        match (fault, self) {
            (Fault::Freeze, server) => server.freeze(),
            (Fault::Restart, Server::Etcd(cluster)) => cluster.kill(0),
            (Fault::Restart, Server::Zk(server)) => server.kill(),
            (Fault::Restart, Server::Kube { .. }) => unreachable!("checked in main"),
        }
    }

    /// Brings the store back; returns once it serves.
    fn resume(&mut self, fault: Fault) {
        match (fault, self) {
            (Fault::Freeze, server) => server.thaw(),
            (Fault::Restart, Server::Etcd(cluster)) => {
                cluster.restart(0);
                cluster.wait_ready(PATIENCE, || false).expect("etcd serves again");
            }
            (Fault::Restart, Server::Zk(server)) => server.restart(),
            (Fault::Restart, Server::Kube { .. }) => unreachable!("checked in main"),
        }
    }
}

/// True when every thread of process `pid` is in the stopped state (`T`).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// `tenure apiserver` on a free port, in a process group of its own (a test kit server process:
/// killed when dropped and when this process dies); waits for the URL it prints.
async fn start_apiserver(binary: &Path) -> Server {
    let dir = ScratchDir::new("store-outage").expect("a scratch directory");
    let log = dir.path().join("apiserver.log");
    let mut command = Command::new(binary);
    command.args(["apiserver", "--listen", "127.0.0.1:0"]).env("RUST_LOG", "warn");
    // The URL is the first line of standard output, which goes to the log with standard error.
    let process = ServerProcess::spawn(command, &log).expect("start tenure apiserver");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(url) = text.lines().find(|line| line.starts_with("http://")) {
            return Server::Kube { process, url: url.trim().to_owned(), _dir: dir };
        }
        assert!(!process.exited(), "tenure apiserver exited:\n{text}");
        assert!(Instant::now() < deadline, "tenure apiserver printed no URL:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the works report: replica `replica` started its work under `term`, or (`None`) stopped.
#[derive(Debug)]
struct Event {
    replica: usize,
    started: Option<Term>,
    at: Instant,
}

type Events = mpsc::UnboundedSender<Event>;

/// Sends the work's stop when dropped: when the work returns and when the gate aborts it.
struct OnStop {
    replica: usize,
    events: Events,
}

impl Drop for OnStop {
    fn drop(&mut self) {
        let _ = self.events.send(Event { replica: self.replica, started: None, at: Instant::now() });
    }
}

/// One replica of the controller: its elector and gate on a runtime of its own.
struct Replica {
    identity: String,
    runtime: Option<tokio::runtime::Runtime>,
    elector: Option<Elector>,
    gate: Option<GateHandle>,
    metrics: GateMetrics,
}

impl Replica {
    async fn start(server: &Server, replica: usize, events: Events) -> Replica {
        let identity = format!("replica-{}", replica + 1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(identity.clone())
            .enable_all()
            .build()
            .expect("a runtime");
        let store = match server {
            Server::Etcd(cluster) => Store::Etcd(cluster.endpoint(0)),
            Server::Zk(server) => Store::Zk(server.servers.clone()),
            Server::Kube { url, .. } => Store::Kube(url.clone()),
        };
        let id = identity.clone();
        let (elector, gate) = runtime
            .spawn(async move {
                let elector = store.elector(&id).await;
                let gate = Gate::builder(&elector).spawn(move |ctx| {
                    let events = events.clone();
                    async move {
                        let _ = events.send(Event { replica, started: Some(ctx.term()), at: Instant::now() });
                        let _stopped = OnStop { replica, events };
                        ctx.cancelled().await;
                        Ok::<_, Infallible>(())
                    }
                });
                (elector, gate)
            })
            .await
            .expect("the replica starts");
        let metrics = gate.metrics().clone();
        Replica { identity, runtime: Some(runtime), elector: Some(elector), gate: Some(gate), metrics }
    }

    fn elector(&self) -> &Elector {
        self.elector.as_ref().expect("running")
    }

    /// Its gate runs and its elector publishes (neither has stopped).
    fn running(&self) -> bool {
        let gate = self.gate.as_ref().is_some_and(GateHandle::is_running);
        let elector = self.elector.as_ref().is_some_and(|e| e.subscribe().has_changed().is_ok());
        gate && elector
    }

    /// The elector's identity is the one it started with and, while it leads, it publishes itself
    /// as the leader.
    fn identity_unchanged(&self) -> bool {
        let elector = self.elector();
        let leadership = elector.leadership();
        elector.identity() == self.identity
            && (!leadership.is_leader() || leadership.leader.as_deref() == Some(self.identity.as_str()))
    }

    fn stops(&self) -> Vec<u64> {
        STOP_REASONS.iter().map(|reason| self.metrics.stops_for(reason)).collect()
    }
}

/// Stops the replica's runtime at once, as its process would end.
impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Where a replica's elector campaigns.
enum Store {
    Etcd(String),
    Zk(String),
    Kube(String),
}

impl Store {
    /// The store's elector, built with the library as a controller builds it.
    async fn elector(&self, identity: &str) -> Elector {
        match self {
            Store::Etcd(endpoint) => {
                let election = EtcdElection::connect(std::slice::from_ref(endpoint), "store-outage")
                    .await
                    .expect("connect to etcd");
                election.campaign(identity, LEASE).expect("campaign on etcd")
            }
            Store::Zk(servers) => {
                let election = ZkElection::connect(servers, "/tenure-bench/store-outage", LEASE)
                    .await
                    .expect("connect to ZooKeeper");
                election.campaign(identity).expect("campaign on ZooKeeper")
            }
            Store::Kube(url) => {
                let reference =
                    KubeLockRef { namespace: "default".into(), kind: LockKind::Leases, name: "store-outage".into() };
                let lock = KubeLock::new(kube_client(url, &tenure_kube::user_agent(identity)), &reference, identity);
                let timing = Timing::from_ttl(LEASE).expect("a valid timing");
                Elector::builder(identity, lock.record_lock()).timing(timing).spawn().expect("an elector")
            }
        }
    }
}

/// What one outage showed.
struct Round {
    /// From just before SIGCONT to the first work start, in ms.
    first_reconcile_ms: f64,
    /// Per replica, from just before SIGCONT to the first call the store answered, in ms (`None`:
    /// not before the first reconcile, or its calls were not failing at the thaw).
    answered_ms: [Option<f64>; 2],
    /// From SIGSTOP to the leader's work stop, in ms (`None`: it did not stop).
    stopped_after_ms: Option<f64>,
    /// Why the leader's work stopped (the gate's stop reasons counted during the outage).
    stop_reasons: Vec<&'static str>,
    /// Works started while the store was frozen (expected 0).
    started_while_frozen: usize,
    /// Both replicas ran (gate and elector) just before the thaw and after the first reconcile.
    both_running: bool,
    same_leader: bool,
    identity_unchanged: bool,
    leader_before: String,
    leader_after: String,
    term_before: Term,
    term_after: Term,
}

/// The works that run now (started and not stopped), by replica, with their terms.
#[derive(Default)]
struct Working {
    terms: [Option<Term>; 2],
}

impl Working {
    fn apply(&mut self, event: &Event) {
        self.terms[event.replica] = event.started;
    }

    fn leader(&self) -> Option<(usize, Term)> {
        self.terms.iter().enumerate().find_map(|(i, t)| t.map(|t| (i, t)))
    }
}

async fn outage_round(
    server: &mut Server,
    fault: Fault,
    replicas: &[Replica; 2],
    events: &mut mpsc::UnboundedReceiver<Event>,
    working: &mut Working,
    outage: Duration,
) -> Round {
    // One replica leads and its work has run for a while.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (leader, term_before) = loop {
        if let Some((leader, term)) = working.leader() {
            let quiet = tokio::time::timeout(WORKING_BEFORE, events.recv()).await;
            match quiet {
                Err(_) => break (leader, term),
                Ok(event) => working.apply(&event.expect("the works report")),
            }
        } else {
            let event = tokio::time::timeout_at(deadline, events.recv()).await;
            working.apply(&event.expect("a replica leads in time").expect("the works report"));
        }
    };
    assert_eq!(replicas[leader].elector().is_leader(), Some(term_before), "the working replica leads");
    let stops_before = replicas[leader].stops();

    let frozen_at = Instant::now();
    // Wall-clock times on standard error, to line up with the electors' logs (RUST_LOG).
    eprintln!("  {} SIGSTOP", chrono::Utc::now().format("%H:%M:%S%.6f"));
    server.stop(fault);
    tokio::time::sleep(outage).await;
    let mut stopped_after = None;
    let mut started_while_frozen = 0;
    while let Ok(event) = events.try_recv() {
        match event.started {
            Some(_) => started_while_frozen += 1,
            None if event.replica == leader && stopped_after.is_none() => stopped_after = Some(event.at - frozen_at),
            None => {}
        }
        working.apply(&event);
    }
    let stop_reasons: Vec<&'static str> = STOP_REASONS
        .iter()
        .zip(replicas[leader].stops().into_iter().zip(stops_before))
        .filter(|(_, (after, before))| after > before)
        .map(|(reason, _)| *reason)
        .collect();
    let running_frozen = replicas.iter().all(Replica::running);

    eprintln!("  {} SIGCONT", chrono::Utc::now().format("%H:%M:%S%.6f"));
    // Every replica's calls have been failing; the first of them the store answers after the
    // thaw shows when each replica heard from the store again (its failure back-off), apart from
    // what it waited for after that (a holder's lease, a session).
    let failing: Vec<bool> = replicas.iter().map(|r| r.elector().stats().consecutive_lock_errors > 0).collect();
    let mut answered: [Option<f64>; 2] = [None; 2];
    // A frozen store answers from the SIGCONT on, a restarted one once it serves again.
    let before = Instant::now();
    server.resume(fault);
    let thawed_at = if fault == Fault::Freeze { before } else { Instant::now() };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (next, term_after, at) = 'waiting: loop {
        let event = tokio::select! {
            event = events.recv() => Some(event.expect("the works report")),
            () = tokio::time::sleep(Duration::from_millis(1)) => None,
            () = tokio::time::sleep_until(deadline) => panic!("no work started within {PATIENCE:?} of the thaw"),
        };
        for (i, replica) in replicas.iter().enumerate() {
            if failing[i] && answered[i].is_none() && replica.elector().stats().consecutive_lock_errors == 0 {
                answered[i] = Some(ms(thawed_at.elapsed()));
            }
        }
        if let Some(event) = event {
            working.apply(&event);
            if let Some(term) = event.started {
                break 'waiting (event.replica, term, event.at);
            }
        }
    };
    Round {
        first_reconcile_ms: ms(at - thawed_at),
        answered_ms: answered,
        stopped_after_ms: stopped_after.map(ms),
        stop_reasons,
        started_while_frozen,
        both_running: running_frozen && replicas.iter().all(Replica::running),
        same_leader: next == leader,
        identity_unchanged: replicas.iter().all(Replica::identity_unchanged),
        leader_before: replicas[leader].identity.clone(),
        leader_after: replicas[next].identity.clone(),
        term_before,
        term_after,
    }
}

/// Prints every change of the election's Lease that a watch sees, with the wall-clock time it
/// arrived: who wrote which term, and when the writer says it acquired and renewed it.
async fn trace_lease(url: String) {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, WatchEvent, WatchParams};
    let leases: Api<Lease> = Api::namespaced(kube_client(&url, "bench-lease-trace"), "default");
    let params = WatchParams::default().fields("metadata.name=store-outage");
    loop {
        let Ok(stream) = leases.watch(&params, "0").await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease))) = stream.next().await {
            let spec = lease.spec.unwrap_or_default();
            let time = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>| {
                t.map_or_else(|| "-".to_owned(), |t| t.0.strftime("%H:%M:%S%.6f").to_string())
            };
            eprintln!(
                "  {} Lease: holder {:?} transitions {:?} acquired {} renewed {}",
                chrono::Utc::now().format("%H:%M:%S%.6f"),
                spec.holder_identity.unwrap_or_default(),
                spec.lease_transitions,
                time(spec.acquire_time),
                time(spec.renew_time),
            );
        }
    }
}

fn parse_list(name: &str, default: &str) -> Vec<String> {
    let text = std::env::var(name).unwrap_or_else(|_| default.to_owned());
    text.split(',').map(|item| item.trim().to_owned()).filter(|item| !item.is_empty()).collect()
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let outages: Vec<u64> = parse_list("TENURE_BENCH_OUTAGES", "5,30,120")
        .iter()
        .map(|s| {
            s.parse()
                .ok()
                .filter(|n| *n > 0)
                .unwrap_or_else(|| panic!("TENURE_BENCH_OUTAGES: {s:?} is not a positive number of seconds"))
        })
        .collect();
    let stores: Vec<StoreKind> = parse_list("TENURE_BENCH_STORES", "etcd,zookeeper,kube")
        .iter()
        .map(|s| match s.as_str() {
            "etcd" => StoreKind::Etcd,
            "zookeeper" | "zk" => StoreKind::Zk,
            "kube" | "kubernetes" => StoreKind::Kube,
            other => panic!("TENURE_BENCH_STORES: unknown store {other:?} (etcd, zookeeper, kube)"),
        })
        .collect();
    let rounds = env_usize("TENURE_BENCH_ROUNDS", 1);
    let fault = match std::env::var("TENURE_BENCH_FAULT").as_deref() {
        Err(_) | Ok("freeze") => Fault::Freeze,
        Ok("restart") => Fault::Restart,
        Ok(other) => panic!("TENURE_BENCH_FAULT: {other:?} is not freeze or restart"),
    };
    assert!(
        fault == Fault::Freeze || !stores.contains(&StoreKind::Kube),
        "TENURE_BENCH_FAULT=restart: etcd and zookeeper only (tenure apiserver keeps its objects in memory, so a restart \
         is a deletion of the Lease, not an outage; a real API server keeps them in etcd)"
    );
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
    let mut report = Report::new("store_outage");
    let mut details = Vec::new();
    let started = Instant::now();
    runtime.block_on(async {
        for &kind in &stores {
            let mut server = Server::start(kind).await;
            let (sink, mut events) = mpsc::unbounded_channel();
            let replicas = [Replica::start(&server, 0, sink.clone()).await, Replica::start(&server, 1, sink).await];
            let tracing = match &server {
                Server::Kube { url, .. } if std::env::var_os("TENURE_BENCH_TRACE_LEASE").is_some() => {
                    Some(tokio::spawn(trace_lease(url.clone())))
                }
                _ => None,
            };
            let mut working = Working::default();
            for &seconds in &outages {
                let mut measured = Vec::with_capacity(rounds);
                for round in 1..=rounds {
                    let how = if fault == Fault::Freeze { "frozen" } else { "down (killed, then restarted)" };
                    eprintln!("store_outage: {} {how} for {seconds} s (round {round} of {rounds})", kind.name());
                    let outage = Duration::from_secs(seconds);
                    let round = outage_round(&mut server, fault, &replicas, &mut events, &mut working, outage).await;
                    eprintln!(
                        "  {} -> {} (term {} -> {}): first reconcile {:.1} ms after the thaw (store answered: {:?} ms); the leader's work stopped {} after the freeze ({})",
                        round.leader_before,
                        round.leader_after,
                        round.term_before,
                        round.term_after,
                        round.first_reconcile_ms,
                        round.answered_ms.map(|a| a.map(|ms| ms.round())),
                        round.stopped_after_ms.map_or_else(|| "never".to_owned(), |ms| format!("{ms:.0} ms")),
                        round.stop_reasons.join(",")
                    );
                    measured.push(round);
                }
                record(&mut report, &mut details, kind, fault, seconds, &measured);
            }
            tracing.inspect(tokio::task::JoinHandle::abort);
            drop(replicas);
            drop(server);
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    report
        .extra("lease_ms", json!(ms(LEASE)))
        .extra("outages_s", json!(outages))
        .extra("fault", json!(if fault == Fault::Freeze { "freeze" } else { "restart" }))
        .extra("rounds_per_case", json!(rounds))
        .extra("rounds", json!(details))
        .extra("seconds", json!(elapsed))
        .note(format!("{rounds} round(s) per store and outage length (TENURE_BENCH_ROUNDS; 120 s outages make more costly): the goal applies to the slowest, no percentiles"))
        .note("2 replicas in this process, each an elector (etcd: EtcdElection::campaign, TTL 2 s; ZooKeeper: ZkElection, session 2 s; Kubernetes: Lease lock + Elector, Timing::from_ttl(2 s)) and a tenure_ha::Gate")
        .note(if fault == Fault::Freeze {
            "the store's process group is SIGSTOPped for the outage; first reconcile = from just before SIGCONT to the first work start on either replica"
        } else {
            "the store is killed (SIGKILL) for the outage and started again on its ports and data; first reconcile = from when it serves again to the first work start on either replica"
        })
        .note("stopped = from SIGSTOP to the leader's work stop (the gate's reason in `rounds`); running = both replicas' gates and electors still run (nothing exited)");
    report.print();
}

/// The rows of one store and outage length: the slowest first reconcile of its rounds (the goal
/// applies to it), the slowest stop of the leader's work, whether every round paused rather than
/// exited, and in how many rounds the same replica led again.
fn record(report: &mut Report, details: &mut Vec<Value>, kind: StoreKind, fault: Fault, seconds: u64, rounds: &[Round]) {
    let restart = if fault == Fault::Restart { "_restart" } else { "" };
    let (key, name) = (format!("{}{restart}_{seconds}s", kind.key()), kind.name());
    let max = |values: Vec<f64>| values.into_iter().fold(f64::NAN, f64::max);
    report.goal(
        &format!("{key}_first_reconcile_ms"),
        &format!("{name} {seconds} s: thaw -> first reconcile"),
        max(rounds.iter().map(|r| r.first_reconcile_ms).collect()),
        "ms",
        ms(GOAL),
    );
    // When the first replica heard from the store again: the rest of the first reconcile's delay
    // is what a replica waited for after that.
    let answered: Vec<f64> =
        rounds.iter().filter_map(|r| r.answered_ms.iter().flatten().copied().reduce(f64::min)).collect();
    if answered.len() == rounds.len() {
        report.info(
            &format!("{key}_answered_ms"),
            &format!("{name} {seconds} s: thaw -> the store answers a replica"),
            max(answered),
            "ms",
        );
    }
    let stopped: Vec<f64> = rounds.iter().filter_map(|r| r.stopped_after_ms).collect();
    if !stopped.is_empty() {
        report.info(
            &format!("{key}_stopped_ms"),
            &format!("{name} {seconds} s: freeze -> leader's work stopped"),
            max(stopped),
            "ms",
        );
    }
    // Paused rather than exited: the leader's work stopped while the store was frozen, nothing
    // started meanwhile, and both replicas (gates and electors) still ran.
    let paused =
        rounds.iter().filter(|r| r.stopped_after_ms.is_some() && r.started_while_frozen == 0 && r.both_running);
    let paused = paused.count() as f64 / rounds.len() as f64;
    report.info(
        &format!("{key}_paused"),
        &format!("{name} {seconds} s: paused, not exited (share of rounds)"),
        paused,
        "",
    );
    let same = rounds.iter().filter(|r| r.same_leader).count() as f64 / rounds.len() as f64;
    report.info(
        &format!("{key}_same_leader"),
        &format!("{name} {seconds} s: same replica leads again (share)"),
        same,
        "",
    );
    for round in rounds {
        details.push(json!({
            "store": name,
            "fault": if fault == Fault::Freeze { "freeze" } else { "restart" },
            "outage_s": seconds,
            "first_reconcile_ms": round.first_reconcile_ms,
            "store_answered_ms": round.answered_ms,
            "stopped_after_ms": round.stopped_after_ms,
            "stop_reasons": round.stop_reasons,
            "started_while_frozen": round.started_while_frozen,
            "both_running": round.both_running,
            "same_leader": round.same_leader,
            "identity_unchanged": round.identity_unchanged,
            "leader_before": round.leader_before,
            "leader_after": round.leader_after,
            "term_before": round.term_before.0,
            "term_after": round.term_after.0,
        }));
    }
}
