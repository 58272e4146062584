//! `cargo bench -p tenure-bench --bench fenced_writes`
//!
//! Do a deposed leader's writes land? Issue 34's fault test, on a real etcd, a real ZooKeeper and
//! the file lock, and what a fenced write costs next to a plain one.
//!
//! Method, per store and per mode (plain, fenced), all six side by side: two candidate processes
//! (this benchmark re-executed) campaign in one election, with the shortest lease the store
//! allows (etcd: TTL 2 s; ZooKeeper: session 1.5 s; file lock: lease 1 s). Each round the
//! leader is told to check its tenure (`Tenure::check`, the write gate's and self-fencing's
//! question); it answers "checked", then waits for its write. It is frozen there (SIGSTOP, seen
//! stopped through `waitpid`): the worst moment, after its last check, with its write queued.
//! The other candidate takes over once the lease ran out and writes the resource; then the
//! frozen leader is given its write and thawed (SIGCONT). The benchmark reads the resource: a
//! stale write landed if it holds the old leader's value. Plain mode writes as a gate alone
//! would: etcd `Put`, ZooKeeper `setData`, `fs::write`. Fenced mode writes with
//! `EtcdElection::fenced_txn`, `ZkElection::fenced_multi`, `FileLock::write_fenced`. On
//! ZooKeeper the writes go through a session of 10 s that outlives the candidate's (a data
//! session, or a client that opens a new one after an expiry, KAFKA-6082): through the
//! candidate's own expired session no write lands at all, fenced or not.
//!
//! Then the cost: TENURE_BENCH_COST_WRITES (default 2,000) plain and as many fenced writes of one
//! key, alternating, by a leader in this process, one server on loopback; medians compared.
//!
//! Settings: TENURE_BENCH_ROUNDS (fenced rounds per store, default 200),
//! TENURE_BENCH_PLAIN_ROUNDS (default 200), TENURE_BENCH_STORES (default etcd,zk,file).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tenure::locks::file::{FencedWriteError, FileLock};
use tenure::{Elector, Term, Timing};
use tenure_bench::report::Report;
use tenure_bench::scratch::ScratchDir;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};
use tenure_etcd::proto::etcdserverpb::kv_client::KvClient;
use tenure_etcd::proto::etcdserverpb::{request_op, PutRequest, RequestOp, TxnRequest};
use tenure_etcd::{EtcdElection, FencedTxnError};
use tenure_testkit::etcd::{EtcdCluster, EtcdConfig};
use tenure_testkit::zookeeper;
use tenure_zk::{zk, FencedMultiError, ZkElection};

const CHILD_ENV: &str = "TENURE_BENCH_FENCED_WRITES_CHILD";
const ETCD_TTL: Duration = Duration::from_secs(2);
const ZK_SESSION: Duration = Duration::from_millis(1500);
/// The session the ZooKeeper writers write through: it outlives the candidate's.
const ZK_DATA_SESSION: Duration = Duration::from_secs(10);
const FILE_LEASE: Duration = Duration::from_secs(1);
/// How long any one step of a round may take before the benchmark gives up (a takeover takes a
/// lease and a few round trips).
const STEP_LIMIT: Duration = Duration::from_secs(20);
/// The cost goal: a fenced write at most 10 % dearer than a plain one (median).
const GOAL_COST_RATIO: f64 = 1.10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Store {
    Etcd,
    Zk,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Mode {
    Plain,
    Fenced,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Etcd => "etcd",
            Store::Zk => "zk",
            Store::File => "file",
        }
    }
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Fenced => "fenced",
        }
    }
}

/// What a candidate process is told to be.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChildSpec {
    store: Store,
    mode: Mode,
    identity: String,
    /// etcd endpoint, ZooKeeper servers, or the lock file's path.
    address: String,
    /// Election name (etcd), path (ZooKeeper); unused for the file lock.
    election: String,
    /// The key, node or file the leaders write.
    resource: String,
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let spec: ChildSpec = serde_json::from_str(&spec).expect("a child spec");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(child_main(spec));
        return;
    }
    let fenced_rounds = env_usize("TENURE_BENCH_ROUNDS", 200);
    let plain_rounds = env_usize("TENURE_BENCH_PLAIN_ROUNDS", 200);
    let cost_writes = env_usize("TENURE_BENCH_COST_WRITES", 2000);
    let stores: Vec<Store> = std::env::var("TENURE_BENCH_STORES")
        .unwrap_or_else(|_| String::from("etcd,zk,file"))
        .split(',')
        .map(|name| match name.trim() {
            "etcd" => Store::Etcd,
            "zk" => Store::Zk,
            "file" => Store::File,
            other => panic!("TENURE_BENCH_STORES: unknown store {other:?} (etcd, zk, file)"),
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let etcd = stores.contains(&Store::Etcd).then(|| {
        runtime.block_on(EtcdCluster::start_with(EtcdConfig::new(1))).unwrap_or_else(|e| panic!("{e}"))
    });
    let zk_servers = stores.contains(&Store::Zk).then(|| {
        zookeeper::server().expect("a ZooKeeper server (Debian: zookeeper, libcurator-recipes-java)").servers.clone()
    });
    let scratch = ScratchDir::new("fenced-writes").expect("a scratch directory");
    let started = Instant::now();

    let mut results = Vec::new();
    std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for &store in &stores {
            for (mode, rounds) in [(Mode::Fenced, fenced_rounds), (Mode::Plain, plain_rounds)] {
                let address = match store {
                    Store::Etcd => etcd.as_ref().map(|e| e.endpoint(0)).unwrap_or_default(),
                    Store::Zk => zk_servers.clone().unwrap_or_default(),
                    Store::File => scratch.path().join(format!("{}.lock", mode.name())).display().to_string(),
                };
                let resource = match store {
                    Store::Etcd => format!("fenced-writes-resource-{}", mode.name()),
                    Store::Zk => format!("/fenced-writes-resource-{}-{}", mode.name(), std::process::id()),
                    Store::File => scratch.path().join(format!("resource-{}", mode.name())).display().to_string(),
                };
                let election = match store {
                    Store::Zk => format!("/fenced-writes-{}-{}", mode.name(), std::process::id()),
                    _ => format!("fenced-writes-{}", mode.name()),
                };
                let spec = ChildSpec { store, mode, identity: String::new(), address, election, resource };
                workers.push(scope.spawn(move || run_rounds(spec, rounds)));
            }
        }
        for worker in workers {
            results.push(worker.join().expect("a worker finished"));
        }
    });
    let fault_secs = started.elapsed().as_secs_f64();

    let mut costs = Vec::new();
    if let Some(etcd) = &etcd {
        costs.push(runtime.block_on(etcd_cost(&etcd.endpoint(0), cost_writes)));
    }
    if let Some(servers) = &zk_servers {
        costs.push(runtime.block_on(zk_cost(servers, cost_writes)));
    }

    let mut report = Report::new("fenced_writes");
    for tally in &results {
        let (store, mode) = (tally.store.name(), tally.mode.name());
        let label = format!("{store}, {mode} writes: stale writes landed (of {} rounds)", tally.rounds);
        match tally.mode {
            Mode::Fenced => report.goal(&format!("{store}_{mode}_stale"), &label, tally.landed as f64, "", 0.0),
            Mode::Plain => report.info(&format!("{store}_{mode}_stale"), &label, tally.landed as f64, ""),
        };
        report.info(
            &format!("{store}_{mode}_deposed"),
            &format!("{store}, {mode} writes: refused as deposed"),
            tally.deposed as f64,
            "",
        );
        if tally.failed > 0 {
            report.info(
                &format!("{store}_{mode}_failed"),
                &format!("{store}, {mode} writes: failed otherwise"),
                tally.failed as f64,
                "",
            );
        }
        if let Some(freeze) = Summary::of(&tally.freeze_ms) {
            report.info(&format!("{store}_{mode}_freeze_p50_ms"), &format!("{store}, {mode}: freeze p50"), freeze.p50, "ms");
        }
        report.extra(&format!("{store}_{mode}_rounds"), json!(tally.rounds));
        report.extra(&format!("{store}_{mode}_outcomes"), json!(tally.outcomes));
    }
    for cost in &costs {
        let store = cost.store.name();
        report.info(&format!("{store}_plain_write_p50_ms"), &format!("{store}: plain write p50"), cost.plain.p50, "ms");
        report.info(&format!("{store}_fenced_write_p50_ms"), &format!("{store}: fenced write p50"), cost.fenced.p50, "ms");
        report.goal(
            &format!("{store}_fenced_cost_ratio"),
            &format!("{store}: fenced / plain write p50"),
            cost.fenced.p50 / cost.plain.p50,
            "x",
            GOAL_COST_RATIO,
        );
        report.extra(&format!("{store}_cost_writes"), json!(cost.plain.count));
        report.extra(&format!("{store}_plain_write_p99_ms"), json!(cost.plain.p99));
        report.extra(&format!("{store}_fenced_write_p99_ms"), json!(cost.fenced.p99));
    }
    report
        .note(format!(
            "{fenced_rounds} fenced and {plain_rounds} plain freeze rounds per store, all side by side, in {fault_secs:.0} s"
        ))
        .note("round: the leader checks its tenure, is frozen (SIGSTOP) with its write queued, the other candidate takes over and writes, the old leader thaws and writes")
        .note("leases: etcd TTL 2 s, ZooKeeper session 1.5 s (writes through a 10 s session), file lock 1 s")
        .note("plain = etcd Put / ZooKeeper setData / fs::write after the check; fenced = fenced_txn / fenced_multi / write_fenced")
        .note(format!("cost: {cost_writes} plain and {cost_writes} fenced writes of one key, alternating, medians"));
    report.print();
}

// ---------------------------------------------------------------------------------------------
// The rounds, in the benchmark's process

/// The outcomes of one store's rounds in one mode.
#[derive(Debug)]
struct Tally {
    store: Store,
    mode: Mode,
    rounds: usize,
    /// Stale writes found in the resource after the round.
    landed: usize,
    /// Old leaders' writes refused as deposed.
    deposed: usize,
    /// Old leaders' writes that failed otherwise (and did not land).
    failed: usize,
    /// How long each old leader stayed frozen.
    freeze_ms: Vec<f64>,
    /// Each outcome the old leaders reported, with its count.
    outcomes: std::collections::BTreeMap<String, usize>,
}

/// A candidate process; killed when dropped.
struct Candidate {
    child: Child,
    stdin: ChildStdin,
}

impl Candidate {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("a pid"))
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").and_then(|()| self.stdin.flush()).expect("write to a candidate");
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_candidate(spec: &ChildSpec, index: usize, lines: mpsc::Sender<(usize, String)>) -> Candidate {
    let mut command = Command::new(std::env::current_exe().expect("this benchmark's path"));
    command
        .env(CHILD_ENV, serde_json::to_string(spec).expect("a spec"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = command.spawn().expect("start a candidate");
    let stdout = child.stdout.take().expect("its stdout");
    let stdin = child.stdin.take().expect("its stdin");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send((index, line)).is_err() {
                break;
            }
        }
    });
    Candidate { child, stdin }
}

/// The next line from candidate `from` (any, if `None`) that starts with one of `prefixes`.
fn expect(
    lines: &mpsc::Receiver<(usize, String)>, from: Option<usize>, prefixes: &[&str], what: &str,
) -> (usize, String) {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok((index, line)) if from.is_none_or(|f| f == index) && prefixes.iter().any(|p| line.starts_with(p)) => {
                return (index, line);
            }
            Ok(_) => {}
            Err(_) => panic!("no {what} within {STEP_LIMIT:?}"),
        }
    }
}

/// Reads the resource as the benchmark sees it (not through either candidate).
struct Reader {
    spec: ChildSpec,
    runtime: tokio::runtime::Runtime,
    etcd: Option<EtcdElection>,
    zk: Option<ZkElection>,
}

impl Reader {
    fn new(spec: &ChildSpec) -> Reader {
        // A worker thread of its own: the clients' connections (HTTP/2 keep-alive pings, ZooKeeper
        // heartbeats) are served between reads too, not only while a read blocks on the runtime.
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime");
        let (mut etcd, mut zk) = (None, None);
        match spec.store {
            Store::Etcd => {
                let connect = EtcdElection::connect(std::slice::from_ref(&spec.address), &spec.election);
                etcd = Some(runtime.block_on(connect).expect("connect to etcd"));
            }
            Store::Zk => {
                let election =
                    runtime.block_on(ZkElection::connect(&spec.address, &spec.election, ZK_DATA_SESSION)).expect("connect");
                let client = election.client();
                let options = zk::CreateMode::Persistent.with_acls(election.acls());
                runtime.block_on(client.create(&spec.resource, b"initial", &options)).expect("create the resource node");
                zk = Some(election);
            }
            Store::File => std::fs::write(&spec.resource, "initial").expect("create the resource file"),
        }
        Reader { spec: spec.clone(), runtime, etcd, zk }
    }

    fn read(&self) -> String {
        match self.spec.store {
            Store::Etcd => {
                let election = self.etcd.as_ref().expect("an etcd client");
                let kv = self.runtime.block_on(election.get(&self.spec.resource)).expect("read the resource");
                kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned()).unwrap_or_default()
            }
            Store::Zk => {
                let client = self.zk.as_ref().expect("a ZooKeeper client").client();
                let (data, _) = self.runtime.block_on(client.get_data(&self.spec.resource)).expect("read the resource");
                String::from_utf8_lossy(&data).into_owned()
            }
            Store::File => std::fs::read_to_string(&self.spec.resource).expect("read the resource"),
        }
    }
}

fn run_rounds(spec: ChildSpec, rounds: usize) -> Tally {
    let name = format!("{} {}", spec.store.name(), spec.mode.name());
    let reader = Reader::new(&spec);
    let (sender, lines) = mpsc::channel();
    let mut candidates: Vec<Candidate> = (0..2)
        .map(|index| {
            let spec = ChildSpec { identity: format!("c{index}"), ..spec.clone() };
            spawn_candidate(&spec, index, sender.clone())
        })
        .collect();
    let mut tally = Tally {
        store: spec.store,
        mode: spec.mode,
        rounds: 0,
        landed: 0,
        deposed: 0,
        failed: 0,
        freeze_ms: Vec::with_capacity(rounds),
        outcomes: Default::default(),
    };
    let (mut leader, _) = expect(&lines, None, &["took-over"], &format!("{name}: first leader"));
    let started = Instant::now();
    while tally.rounds < rounds {
        let round = tally.rounds + 1;
        candidates[leader].send("check");
        let (_, answer) = expect(&lines, Some(leader), &["checked", "not-leading"], &format!("{name}: check"));
        if answer.starts_with("not-leading") {
            // Lost its tenure on its own (a slow renew on a loaded machine): wait for whoever leads.
            leader = expect(&lines, None, &["took-over"], &format!("{name}: a leader")).0;
            continue;
        }
        // Frozen right after its check, its write queued.
        let pid = candidates[leader].pid();
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP the leader");
        match waitpid(pid, Some(WaitPidFlag::WUNTRACED)).expect("wait for the stop") {
            WaitStatus::Stopped(..) => {}
            other => panic!("{name}: the leader did not stop: {other:?}"),
        }
        let frozen = Instant::now();
        let next = 1 - leader;
        expect(&lines, Some(next), &["took-over"], &format!("{name}: takeover in round {round}"));
        let stale = format!("stale c{leader} round {round}");
        candidates[leader].send(&format!("write {stale}"));
        kill(pid, Signal::SIGCONT).expect("SIGCONT the old leader");
        tally.freeze_ms.push(ms(frozen.elapsed()));
        let (_, wrote) = expect(&lines, Some(leader), &["wrote"], &format!("{name}: the old leader's write"));
        let outcome = wrote.trim_start_matches("wrote ").to_owned();
        let landed = reader.read() == stale;
        if landed {
            tally.landed += 1;
        } else if outcome == "deposed" {
            tally.deposed += 1;
        } else {
            tally.failed += 1;
        }
        let kind = outcome.split(':').next().unwrap_or_default().to_owned();
        *tally.outcomes.entry(kind).or_default() += 1;
        tally.rounds += 1;
        leader = next;
        if round.is_multiple_of(25) {
            eprintln!(
                "fenced_writes: {name}: {round} rounds in {:.0} s, {} stale writes landed, {} refused as deposed",
                started.elapsed().as_secs_f64(),
                tally.landed,
                tally.deposed
            );
        }
    }
    drop(candidates);
    tally
}

// ---------------------------------------------------------------------------------------------
// The candidate processes

/// Where a candidate writes, and how.
enum Writer {
    Etcd { election: EtcdElection, kv: KvClient<tonic::transport::Channel> },
    Zk(ZkElection),
    File(FileLock),
}

impl Writer {
    /// Writes `value` to `resource`, plainly or fenced by the tenure of `term`: "landed" when the
    /// store took it, "deposed" when it refused it as a deposed leader's, or "failed: why".
    async fn write(&mut self, mode: Mode, term: Term, resource: &str, value: &str) -> String {
        let result: Result<(), String> = match (self, mode) {
            (Writer::Etcd { kv, .. }, Mode::Plain) => {
                kv.put(put_request(resource, value)).await.map(drop).map_err(|e| e.to_string())
            }
            (Writer::Etcd { election, .. }, Mode::Fenced) => {
                let put = RequestOp { request: Some(request_op::Request::RequestPut(put_request(resource, value))) };
                let request = TxnRequest { compare: Vec::new(), success: vec![put], failure: Vec::new() };
                match election.fenced_txn(term, request).await {
                    Ok(_) => Ok(()),
                    Err(FencedTxnError::Deposed { .. }) => return String::from("deposed"),
                    Err(error) => Err(error.to_string()),
                }
            }
            (Writer::Zk(election), Mode::Plain) => {
                election.client().set_data(resource, value.as_bytes(), None).await.map(drop).map_err(|e| e.to_string())
            }
            (Writer::Zk(election), Mode::Fenced) => {
                match election.fenced_multi(term, |multi| multi.add_set_data(resource, value.as_bytes(), None)).await {
                    Ok(_) => Ok(()),
                    Err(FencedMultiError::Deposed { .. }) => return String::from("deposed"),
                    Err(error) => Err(error.to_string()),
                }
            }
            (Writer::File(_), Mode::Plain) => std::fs::write(resource, value).map_err(|e| e.to_string()),
            (Writer::File(lock), Mode::Fenced) => match lock.write_fenced(term, resource, value).await {
                Ok(()) => Ok(()),
                Err(FencedWriteError::Deposed { .. }) => return String::from("deposed"),
                Err(error) => Err(error.to_string()),
            },
        };
        match result {
            Ok(()) => String::from("landed"),
            Err(error) => format!("failed: {error}"),
        }
    }
}

fn put_request(key: &str, value: &str) -> PutRequest {
    PutRequest { key: key.as_bytes().to_vec(), value: value.as_bytes().to_vec(), ..Default::default() }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A candidate: campaigns; writes the resource when it takes over ("took-over <term>"); on
/// "check", checks its tenure and answers "checked <term>", then waits for "write <value>",
/// writes it under that term and answers "wrote <outcome>".
async fn child_main(spec: ChildSpec) {
    let (elector, mut writer): (Elector, Writer) = match spec.store {
        Store::Etcd => {
            let election = EtcdElection::connect(std::slice::from_ref(&spec.address), &spec.election)
                .await
                .expect("connect to etcd");
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spec.address))
                .expect("an endpoint")
                .connect()
                .await
                .expect("a channel to etcd");
            let elector = election.campaign(spec.identity.clone(), ETCD_TTL).expect("campaign");
            (elector, Writer::Etcd { election, kv: KvClient::new(channel) })
        }
        Store::Zk => {
            let candidates =
                ZkElection::connect(&spec.address, &spec.election, ZK_SESSION).await.expect("connect to ZooKeeper");
            let writer =
                ZkElection::connect(&spec.address, &spec.election, ZK_DATA_SESSION).await.expect("connect to ZooKeeper");
            (candidates.campaign(spec.identity.clone()).expect("campaign"), Writer::Zk(writer))
        }
        Store::File => {
            let path = PathBuf::from(&spec.address);
            let timing = Timing::from_ttl(FILE_LEASE).expect("a valid timing");
            let elector = Elector::builder(spec.identity.clone(), FileLock::open(&path).expect("open the lock"))
                .timing(timing)
                .spawn()
                .expect("campaign");
            (elector, Writer::File(FileLock::open(&path).expect("open the lock")))
        }
    };
    let (sender, mut commands) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let mut leadership = elector.subscribe();
    let mut announced: Option<Term> = None;
    loop {
        if let Some(tenure) = elector.tenure() {
            if announced != Some(tenure.term()) {
                let term = tenure.term();
                announced = Some(term);
                let value = format!("{} took over at term {term}", spec.identity);
                let outcome = writer.write(spec.mode, term, &spec.resource, &value).await;
                say(&format!("took-over {term} {outcome}"));
            }
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { break },
            command = commands.recv() => match command.as_deref() {
                Some("check") => match elector.tenure().map(|tenure| tenure.check()) {
                    Some(Ok(term)) => {
                        say(&format!("checked {term}"));
                        let Some(write) = commands.recv().await else { break };
                        let value = write.trim_start_matches("write ");
                        let outcome = writer.write(spec.mode, term, &spec.resource, value).await;
                        say(&format!("wrote {outcome}"));
                    }
                    _ => say("not-leading"),
                },
                Some(other) => panic!("unknown command {other:?}"),
                None => break,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The cost of a fenced write

struct Cost {
    store: Store,
    plain: Summary,
    fenced: Summary,
}

async fn etcd_cost(endpoint: &str, writes: usize) -> Cost {
    let election = EtcdElection::connect(&[endpoint.to_owned()], "fenced-writes-cost").await.expect("connect");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("a channel");
    let mut kv = KvClient::new(channel);
    let elector = election.campaign("cost", Duration::from_secs(10)).expect("campaign");
    let tenure = tokio::time::timeout(STEP_LIMIT, elector.acquired()).await.expect("leads in time").expect("leads");
    let (mut plain, mut fenced) = (Vec::with_capacity(writes), Vec::with_capacity(writes));
    for i in 0..writes + 10 {
        let value = format!("write {i}");
        let started = Instant::now();
        kv.put(put_request("cost-resource", &value)).await.expect("a plain put");
        let plain_took = started.elapsed();
        let put = RequestOp { request: Some(request_op::Request::RequestPut(put_request("cost-resource", &value))) };
        let request = TxnRequest { compare: Vec::new(), success: vec![put], failure: Vec::new() };
        let started = Instant::now();
        let answer = election.fenced_txn(tenure.term(), request).await.expect("a fenced write");
        let fenced_took = started.elapsed();
        assert!(answer.succeeded);
        // The first few warm up the connections and find the election key.
        if i >= 10 {
            plain.push(ms(plain_took));
            fenced.push(ms(fenced_took));
        }
    }
    drop(tenure);
    elector.shutdown().await.expect("shutdown");
    Cost { store: Store::Etcd, plain: Summary::of(&plain).expect("writes"), fenced: Summary::of(&fenced).expect("writes") }
}

async fn zk_cost(servers: &str, writes: usize) -> Cost {
    let path = format!("/fenced-writes-cost-{}", std::process::id());
    let election = ZkElection::connect(servers, &path, Duration::from_secs(6)).await.expect("connect");
    let elector = election.campaign("cost").expect("campaign");
    let tenure = tokio::time::timeout(STEP_LIMIT, elector.acquired()).await.expect("leads in time").expect("leads");
    let resource = format!("{path}-resource");
    let client = election.client();
    client
        .create(&resource, b"", &zk::CreateMode::Persistent.with_acls(election.acls()))
        .await
        .expect("create the resource");
    let (mut plain, mut fenced) = (Vec::with_capacity(writes), Vec::with_capacity(writes));
    for i in 0..writes + 10 {
        let value = format!("write {i}");
        let started = Instant::now();
        client.set_data(&resource, value.as_bytes(), None).await.expect("a plain setData");
        let plain_took = started.elapsed();
        let started = Instant::now();
        election
            .fenced_multi(tenure.term(), |multi| multi.add_set_data(&resource, value.as_bytes(), None))
            .await
            .expect("a fenced write");
        let fenced_took = started.elapsed();
        if i >= 10 {
            plain.push(ms(plain_took));
            fenced.push(ms(fenced_took));
        }
    }
    drop(tenure);
    elector.shutdown().await.expect("shutdown");
    Cost { store: Store::Zk, plain: Summary::of(&plain).expect("writes"), fenced: Summary::of(&fenced).expect("writes") }
}
