//! `cargo bench -p tenure-bench --bench group_scale`
//!
//! Groups rebalancing at scale (issue 20, part 2): joins, graceful leaves and crashes among 10 and
//! 50 members sharing 1,024 partitions, on a real etcd (Debian's `etcd-server`, started here on
//! loopback) and on Kubernetes (the project's in-process API server, `tenure apiserver`).
//!
//! Method: every member is a `tenure_group::Group` in this process with a store client of its own
//! (its own etcd connection, or its own kube-rs client), so each member's requests are its own.
//! Each member runs a simulated application: it takes a `PartitionGuard` for every partition it
//! owns and, when the partition is revoked (`guard.ended()`), takes 10 ms before it drops the
//! guard; drains of different partitions run concurrently, as an application's do. Timing: lease
//! 2 s, renew deadline 1 s, retry period 500 ms (`Timing::from_ttl(2 s)`). A watcher is woken by
//! every member's assignment change and checks, at each, that no partition has two owners and
//! whether the group settled: every partition owned by exactly one live member, every member
//! owning the floor or the ceiling of 1024 / N.
//!
//! Per size N, N members join one after another (each join settled before the next, as a rolling
//! deployment starts them), then their requests at rest are counted over a window; then
//! each run makes six changes, each timed from the call until the group settled again:
//! a crash of one of N (a `Group` dropped without leaving; timed until its partitions are owned
//! again), a join into N-1, a join into N (timed; the partitions whose owner changed are counted),
//! a leave of one of N+1, a graceful leave of one of N (timed), and a join back to N.
//!
//! Settings: GROUP_SCALE_RUNS (default 10), GROUP_SCALE_WINDOW_SECS (requests at rest, default
//! 20), GROUP_SCALE_SIZES (default "10,50"), GROUP_SCALE_BACKENDS (default "etcd,kube"),
//! GROUP_SCALE_TTL_SECS (default 2: the members' `Timing::from_ttl`); RUST_LOG
//! (e.g. `tenure_group=info`) logs what the members do, on standard error.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use serde_json::json;
use tenure::{Term, Timing};
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_bench::kube_client::kube_client;
use tenure_bench::procfs::{cpu_time, Target};
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_seconds, env_usize, ms};
use tenure_etcd::EtcdGroupStore;
use tenure_group::store::GroupStore;
use tenure_group::{Assignment, Group, GroupConfig, Ownership, PartitionGuard};
use tenure_kube::KubeGroupStore;
use tenure_testkit::etcd::{EtcdCluster, EtcdConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const PARTITIONS: u32 = 1024;
/// How long the simulated application takes to stop work on a revoked partition.
const APP_DRAIN: Duration = Duration::from_millis(10);
/// How long one change may take to settle before the scenario gives up.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// `Timing::from_ttl` of GROUP_SCALE_TTL_SECS (default 2 s: lease 2 s, renew deadline 1 s,
/// retry period 500 ms).
fn timing() -> Timing {
    Timing::from_ttl(env_seconds("GROUP_SCALE_TTL_SECS", Duration::from_secs(2))).expect("a valid timing")
}

enum Backend {
    Etcd(Box<EtcdCluster>),
    Kube(ApiServer),
}

type Requests = Arc<dyn Fn() -> u64 + Send + Sync>;

impl Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Etcd(_) => "etcd",
            Backend::Kube(_) => "kube",
        }
    }

    /// A store of the group with a client of its own, and its request counter.
    async fn store(&self, group: &str, identity: &str) -> (Arc<dyn GroupStore>, Requests) {
        match self {
            Backend::Etcd(server) => {
                let store = EtcdGroupStore::connect(&[server.endpoint(0)], group).await.expect("etcd");
                let counter = store.clone();
                (Arc::new(store), Arc::new(move || counter.requests_sent()))
            }
            Backend::Kube(server) => {
                let client = kube_client(&server.url(), &tenure_kube::user_agent(identity));
                let store = KubeGroupStore::new(client, "default", group);
                let counter = store.clone();
                (Arc::new(store), Arc::new(move || counter.requests_sent()))
            }
        }
    }
}

/// The simulated application of one member: a guard per owned partition, dropped 10 ms after the
/// partition was revoked. Pokes `changed` after each assignment it handled.
async fn application(
    ownership: Ownership,
    mut assignment: watch::Receiver<Assignment>,
    changed: Arc<watch::Sender<u64>>,
) {
    let mut held: BTreeMap<u32, Term> = BTreeMap::new();
    loop {
        let owned = assignment.borrow_and_update().owned.clone();
        held.retain(|partition, term| owned.get(partition) == Some(term));
        for partition in owned.keys() {
            if held.contains_key(partition) {
                continue;
            }
            if let Some(guard) = ownership.guard(*partition) {
                held.insert(*partition, guard.term());
                tokio::spawn(work(guard));
            }
        }
        changed.send_modify(|n| *n += 1);
        if assignment.changed().await.is_err() {
            return;
        }
    }
}

async fn work(guard: PartitionGuard) {
    guard.ended().await;
    tokio::time::sleep(APP_DRAIN).await;
    drop(guard);
}

struct Member {
    identity: String,
    group: Group,
    assignment: watch::Receiver<Assignment>,
    app: JoinHandle<()>,
    requests: Requests,
}

/// The members of one group, and a watcher of their assignments.
struct Fleet<'a> {
    backend: &'a Backend,
    name: String,
    members: Vec<Member>,
    joined: usize,
    changed: Arc<watch::Sender<u64>>,
    /// Instants at which a partition had two owners (expected: none).
    violations: usize,
}

/// Owner of each partition by identity, as the members publish it.
type Owners = Vec<Option<String>>;

impl<'a> Fleet<'a> {
    fn new(backend: &'a Backend, name: String) -> Fleet<'a> {
        let (changed, _) = watch::channel(0);
        Fleet { backend, name, members: Vec::new(), joined: 0, changed: Arc::new(changed), violations: 0 }
    }

    /// Joins a fresh member (its store connected first); returns the instant of the join.
    async fn join(&mut self) -> Instant {
        self.joined += 1;
        let identity = format!("member-{:03}", self.joined);
        let (store, requests) = self.backend.store(&self.name, &identity).await;
        let config = GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 };
        let at = Instant::now();
        let group = Group::builder(identity.clone(), store).config(config).join().expect("join");
        let assignment = group.assignment();
        let app = tokio::spawn(application(group.ownership(), group.assignment(), self.changed.clone()));
        self.members.push(Member { identity, group, assignment, app, requests });
        at
    }

    fn take_random(&mut self) -> Member {
        let index = rand::rng().random_range(0..self.members.len());
        self.members.remove(index)
    }

    /// Drops a member without leaving (a crash); returns the instant.
    fn crash(&mut self) -> Instant {
        let member = self.take_random();
        member.app.abort();
        let at = Instant::now();
        drop(member.group);
        at
    }

    /// A graceful leave of a member: the time until the others settled (the leaver's assignment
    /// is checked too until its leave completed).
    async fn leave_and_settle(&mut self) -> Option<Duration> {
        let member = self.take_random();
        let assignment = member.assignment.clone();
        let at = Instant::now();
        let leaving = tokio::spawn(async move {
            member.group.leave().await.expect("leave");
            member.app.abort();
        });
        let settled = self.settled(at, &[assignment]).await;
        let _ = leaving.await;
        settled
    }

    fn owners(&self) -> Owners {
        let mut owners = vec![None; PARTITIONS as usize];
        for member in &self.members {
            for partition in member.assignment.borrow().owned.keys() {
                owners[*partition as usize] = Some(member.identity.clone());
            }
        }
        owners
    }

    /// Owners per partition among the members, and the load of each member.
    fn counts(&self) -> (Vec<u32>, Vec<usize>) {
        let mut per_partition = vec![0u32; PARTITIONS as usize];
        let loads = self.members.iter().map(|m| count_into(&m.assignment, &mut per_partition)).collect();
        (per_partition, loads)
    }

    /// Max/mean of the members' loads.
    fn balance(&self) -> f64 {
        let (_, loads) = self.counts();
        let mean = f64::from(PARTITIONS) / loads.len() as f64;
        *loads.iter().max().unwrap_or(&0) as f64 / mean
    }

    /// Waits until every partition has exactly one owner among the members and every member owns
    /// the floor or the ceiling of its share; checks at every change of any member that no
    /// partition has two owners (counting the members in `also` too). The time since `from`, or
    /// `None` after [`SETTLE_LIMIT`].
    async fn settled(&mut self, from: Instant, also: &[watch::Receiver<Assignment>]) -> Option<Duration> {
        let n = self.members.len();
        let (floor, ceil) = (PARTITIONS as usize / n, (PARTITIONS as usize).div_ceil(n));
        let mut changes = self.changed.subscribe();
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            changes.borrow_and_update();
            let (per_partition, loads) = self.counts();
            let mut with_also = per_partition.clone();
            also.iter().for_each(|assignment| _ = count_into(assignment, &mut with_also));
            if with_also.iter().any(|owners| *owners > 1) {
                self.violations += 1;
            }
            let done = per_partition.iter().all(|owners| *owners == 1)
                && loads.iter().all(|load| (floor..=ceil).contains(load));
            if done {
                return Some(from.elapsed());
            }
            if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                let loads: Vec<usize> = self.counts().1;
                eprintln!("  {} did not settle within {SETTLE_LIMIT:?}: loads {loads:?}", self.name);
                return None;
            }
        }
    }

    /// Requests per member per minute over `window` once the group has been at rest for a lease,
    /// and the process's CPU use over the window (% of one core).
    async fn requests_at_rest(&self, window: Duration) -> (f64, f64) {
        tokio::time::sleep(timing().lease_duration).await;
        let total = || self.members.iter().map(|m| (m.requests)()).sum::<u64>();
        let (before, cpu_before, start) = (total(), cpu_time(Target::This).expect("cpu time"), Instant::now());
        tokio::time::sleep(window).await;
        let elapsed = start.elapsed();
        let (sent, cpu) = (total() - before, cpu_time(Target::This).expect("cpu time") - cpu_before);
        let per_member = sent as f64 / self.members.len() as f64 * 60.0 / elapsed.as_secs_f64();
        (per_member, cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0)
    }
}

/// Adds the partitions `assignment` owns to `per_partition`; returns how many.
fn count_into(assignment: &watch::Receiver<Assignment>, per_partition: &mut [u32]) -> usize {
    let current = assignment.borrow();
    current.owned.keys().for_each(|p| per_partition[*p as usize] += 1);
    current.owned.len()
}

/// What one (backend, size) measured.
#[derive(Default)]
struct Measured {
    joins: Vec<f64>,
    moved: Vec<f64>,
    crashes: Vec<f64>,
    leaves: Vec<f64>,
    balance: f64,
    requests_per_min: f64,
    cpu_percent: f64,
    stuck: usize,
    violations: usize,
}

/// Books one change: the balance of the settled state, or one more change that did not settle.
fn step(took: Option<Duration>, fleet: &Fleet<'_>, measured: &mut Measured) -> Option<f64> {
    match took {
        Some(took) => {
            measured.balance = measured.balance.max(fleet.balance());
            Some(ms(took))
        }
        None => {
            measured.stuck += 1;
            None
        }
    }
}

async fn scenario(backend: &Backend, n: usize, runs: usize, window: Duration) -> Measured {
    let mut fleet = Fleet::new(backend, format!("scale{n}"));
    let mut measured = Measured::default();
    // One after another, each join settled before the next, as a rolling deployment starts
    // them (50 members joining at the same instant is a thundering herd, not measured here).
    let start = Instant::now();
    for _ in 0..n {
        let at = fleet.join().await;
        if fleet.settled(at, &[]).await.is_none() {
            measured.stuck += 1;
            return measured;
        }
    }
    eprintln!("  {} members joined one by one in {:.0} ms", n, ms(start.elapsed()));
    measured.balance = fleet.balance();
    (measured.requests_per_min, measured.cpu_percent) = fleet.requests_at_rest(window).await;
    eprintln!("  at rest: {:.0} requests/member/min, {:.0} % CPU", measured.requests_per_min, measured.cpu_percent);
    for run in 1..=runs {
        let at = fleet.crash();
        let Some(crash) = step(fleet.settled(at, &[]).await, &fleet, &mut measured) else { break };
        let at = fleet.join().await;
        if step(fleet.settled(at, &[]).await, &fleet, &mut measured).is_none() {
            break;
        }
        let before = fleet.owners();
        let at = fleet.join().await;
        let Some(join) = step(fleet.settled(at, &[]).await, &fleet, &mut measured) else { break };
        let moved = before.iter().zip(fleet.owners()).filter(|(old, new)| **old != *new).count();
        if step(fleet.leave_and_settle().await, &fleet, &mut measured).is_none() {
            break;
        }
        let Some(leave) = step(fleet.leave_and_settle().await, &fleet, &mut measured) else { break };
        let at = fleet.join().await;
        if step(fleet.settled(at, &[]).await, &fleet, &mut measured).is_none() {
            break;
        }
        eprintln!("  run {run}: crash {crash:.0} ms, join {join:.0} ms ({moved} moved), leave {leave:.0} ms");
        measured.crashes.push(crash);
        measured.joins.push(join);
        measured.moved.push(moved as f64);
        measured.leaves.push(leave);
    }
    measured.violations = fleet.violations;
    for member in fleet.members {
        member.app.abort();
    }
    measured
}

fn record(report: &mut Report, backend: &str, n: usize, measured: &Measured) {
    let key = |what: &str| format!("{backend}_n{n}_{what}");
    let lease_ms = ms(timing().lease_duration);
    let label = |what: &str| format!("{backend}, {n} members: {what}");
    if let Some(joins) = Summary::of(&measured.joins) {
        let goal = (n == 10).then_some(1000.0);
        report.distribution(&key("join_ms"), &label("a member joins, until settled"), &joins, "ms", goal);
    }
    if let Some(moved) = Summary::of(&measured.moved) {
        let bound = (PARTITIONS as usize).div_ceil(n + 1) + 1;
        report.goal(&key("join_moved_max"), &label("partitions moved by a join, max"), moved.max, "", bound as f64);
    }
    if let Some(crashes) = Summary::of(&measured.crashes) {
        let goal = (n == 50).then_some(lease_ms + 100.0);
        report.distribution(
            &key("crash_ms"),
            &label("a member crashes, until its partitions are owned"),
            &crashes,
            "ms",
            goal,
        );
    }
    if let Some(leaves) = Summary::of(&measured.leaves) {
        report.distribution(
            &key("leave_ms"),
            &label("a member leaves, until its partitions are owned"),
            &leaves,
            "ms",
            None,
        );
    }
    report.goal(&key("balance"), &label("balance max/mean, worst settled state"), measured.balance, "", 1.05);
    report.info(
        &key("requests_per_member_per_min"),
        &label("requests per member per minute at rest"),
        measured.requests_per_min,
        "/min",
    );
    report.info(
        &key("cpu_percent_at_rest"),
        &label("this process's CPU at rest (% of a core)"),
        measured.cpu_percent,
        "%",
    );
    report.goal(&key("stuck"), &label("changes that did not settle within 60 s"), measured.stuck as f64, "", 0.0);
    report.goal(
        &key("two_owners"),
        &label("checks that found a partition with two owners"),
        measured.violations as f64,
        "",
        0.0,
    );
}

fn list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name).unwrap_or_else(|_| default.to_owned()).split(',').map(|s| s.trim().to_owned()).collect()
}

async fn start(backend: &str) -> Backend {
    match backend {
        "etcd" => {
            let etcd = EtcdCluster::start_with(EtcdConfig::new(1)).await.unwrap_or_else(|e| panic!("{e}"));
            Backend::Etcd(Box::new(etcd))
        }
        "kube" => Backend::Kube(ApiServer::start(ApiServerConfig::default()).await.expect("an API server")),
        other => panic!("GROUP_SCALE_BACKENDS: unknown backend {other:?} (etcd, kube)"),
    }
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let runs = env_usize("GROUP_SCALE_RUNS", 10);
    let window = env_seconds("GROUP_SCALE_WINDOW_SECS", Duration::from_secs(20));
    let sizes: Vec<usize> =
        list("GROUP_SCALE_SIZES", "10,50").iter().map(|s| s.parse().expect("GROUP_SCALE_SIZES: numbers")).collect();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut report = Report::new("group_scale");
    runtime.block_on(async {
        for name in list("GROUP_SCALE_BACKENDS", "etcd,kube") {
            let backend = start(&name).await;
            let mut rates = Vec::new();
            for &n in &sizes {
                eprintln!("group_scale: {name}, {n} members, {PARTITIONS} partitions, {runs} runs");
                let measured = scenario(&backend, n, runs, window).await;
                record(&mut report, backend.name(), n, &measured);
                rates.push(measured.requests_per_min);
            }
            if let [first, .., last] = rates[..] {
                let label =
                    format!("{name}: requests at rest, {} members / {} members", sizes[sizes.len() - 1], sizes[0]);
                report.goal(&format!("{name}_requests_growth"), &label, last / first, "", 1.1);
            }
            if let Backend::Kube(server) = backend {
                server.shutdown().await;
            }
        }
    });
    report.extra("partitions", json!(PARTITIONS));
    report.extra("runs", json!(runs));
    let t = timing();
    report.note(format!(
        "lease {:?}, renew deadline {:?}, retry period {:?}; the application drains each revoked partition in 10 ms, concurrently",
        t.lease_duration, t.renew_deadline, t.retry_period
    ));
    report.note("members, their applications (and the Kubernetes API server) share one 2-worker runtime in this process; etcd is a child process");
    report.note("crash: from dropping the member until the others own its partitions (its last renew was up to a retry period before)");
    report.print();
}
