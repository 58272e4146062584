//! The checker: runs three controller processes against etcd and an in-process API server, under
//! Pod churn and leader faults, and verifies what a user of the allocator would notice.
//!
//! Why a separate, Jepsen-style observer: the controller's own logs cannot prove that nothing went
//! wrong. The checker samples the pool (etcd) and the Pods (API server) all the time and checks:
//!
//! - **no address given to two Pods**: no two live Pods annotated with the same address in one
//!   listing, and no allocation record (an etcd key version) rewritten for another Pod;
//! - **no Pod with two addresses**: a Pod's annotated address never changes;
//! - **nothing in use collected**: a Pod seen unchanged in two listings around a pool read, and
//!   annotated with an address, has that address allocated to it in that read;
//! - **no missed deletion**: after the run settles, nothing is allocated for a deleted Pod;
//! - **orphans collected in time**: an allocation whose Pod got another address (the leader died
//!   between allocate and annotate) is gone within one collection period plus the grace period,
//!   counted from when the orphan appeared or the current leader took over, whichever is later.
//!
//! Faults, in rotation, each followed by waiting for the next leader: SIGKILL of the leader,
//! SIGSTOP past the lease then SIGCONT, SIGTERM (graceful stop), and an injected crash between
//! allocate and annotate (a Pod labelled [`CRASH_LABEL`]). Exited replicas are restarted.
//!
//! In Active/Active mode ([`Mode::ActiveActive`]) the same faults hit the group's members in
//! turn (see [`active_active`]), every restart is a join, and one more check runs on the
//! replicas' witness files ([`crate::witness`]): no Pod handled by two replicas at overlapping
//! times.

pub(crate) mod active_active;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_etcd::EtcdElection;
use tenure_testkit::etcd::{EtcdCluster, EtcdConfig};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::controller::{annotated_ip, Mode, CRASH_EXIT_CODE, CRASH_LABEL, ELECTION, POOL_PREFIX, RESUME_FAILED_LINE};
use crate::pool::IpPool;
use crate::witness::{self, Frozen};

/// The pool the checker gives the controllers: 10.0.0.1 ..= 10.0.3.232.
const POOL_BASE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 0);
const POOL_SIZE: u32 = 1000;
/// How often the checker samples the pool and the Pods.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// The longest wait for a new leader after a fault.
const LEADER_BOUND: Duration = Duration::from_secs(30);

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The controller binary (it must understand the `controller` subcommand).
    pub controller: PathBuf,
    /// Controllers resume from the checkpoint (false: Kuryr's behaviour).
    pub resume: bool,
    /// How many faults to inject (each makes one leader change).
    pub faults: usize,
    /// Churn between a new leader and the next fault.
    pub fault_spacing: Duration,
    /// The election lease (etcd's minimum is 2 s).
    pub ttl: Duration,
    /// The controllers' collection period.
    pub gc_period: Duration,
    /// The controllers' grace period.
    pub gc_grace: Duration,
    /// About how many Pods live at once.
    pub live_pods: usize,
    /// A Pod is created or deleted this often.
    pub churn_every: Duration,
    /// The random seed of the churn.
    pub seed: u64,
    /// How long the API server keeps events for resuming watches (`None`: its default, 75 s).
    /// Shorter than a leader change, every resume fails with `410 Expired` and only the relist
    /// plus the collector can release the addresses of Pods deleted meanwhile.
    pub event_window: Option<Duration>,
    /// Active/Passive (a leader) or Active/Active (a group of members sharing partitions).
    pub mode: Mode,
    /// Active/Active: the group's partition count.
    pub partitions: u32,
    /// Active/Active, the control: replicas that ignore revocations (no drain); the checker must
    /// report overlapping handlers.
    pub ignore_revocation: bool,
    /// A delay before every pool call (the throughput benchmark's slow external IPAM).
    pub pool_delay: Duration,
}

impl Scenario {
    /// Short settings: a 2 s lease, collection every second with 1 s of grace, 20 Pods.
    pub fn short(controller: PathBuf, resume: bool, faults: usize) -> Scenario {
        Scenario {
            controller,
            resume,
            faults,
            fault_spacing: Duration::from_millis(1500),
            ttl: Duration::from_secs(2),
            gc_period: Duration::from_secs(1),
            gc_grace: Duration::from_secs(1),
            live_pods: 20,
            churn_every: Duration::from_millis(50),
            seed: 10,
            event_window: None,
            mode: Mode::ActivePassive,
            partitions: 64,
            ignore_revocation: false,
            pool_delay: Duration::ZERO,
        }
    }

    /// [`Scenario::short`] in Active/Active mode: three members sharing 64 partitions.
    pub fn active_active(controller: PathBuf, faults: usize) -> Scenario {
        Scenario { mode: Mode::ActiveActive, ..Scenario::short(controller, true, faults) }
    }

    /// The orphan collection bound the checker holds the controllers to.
    pub fn orphan_bound(&self) -> Duration {
        self.gc_period + self.gc_grace
    }
}

/// What a run observed.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Active/Passive: distinct leader terms seen, minus the first.
    pub leader_changes: usize,
    /// Active/Active: members that left (killed, paused past the lease, stopped, crashed) or
    /// joined, each followed by the group settling.
    pub membership_changes: usize,
    /// Active/Active: handlers in the witness files, and how many ended fenced.
    pub handlers: usize,
    /// See `handlers`.
    pub fenced_handlers: usize,
    /// Violations (Active/Active): one Pod handled by two replicas at overlapping times.
    pub handler_overlaps: Vec<String>,
    /// Faults injected, by kind.
    pub kills: usize,
    /// SIGSTOP/SIGCONT pauses.
    pub pauses: usize,
    /// SIGTERM stops.
    pub stops: usize,
    /// Crashes between allocate and annotate that happened.
    pub injected_crashes: usize,
    /// Samples taken.
    pub samples: usize,
    /// Pods created and deleted by the churn.
    pub pods_created: usize,
    /// Pods deleted.
    pub pods_deleted: usize,
    /// Violations: one address given to two Pods.
    pub double_allocations: Vec<String>,
    /// Violations: a Pod whose address changed.
    pub pods_with_two_ips: Vec<String>,
    /// Violations: an address in use that was released.
    pub in_use_collected: Vec<String>,
    /// Deleted Pods something is still allocated for after the run settled.
    pub missed_deletions: Vec<String>,
    /// Live Pods without an address after the run settled.
    pub unannotated_pods: usize,
    /// Orphans seen (allocations whose Pod was annotated with another address).
    pub orphans_seen: usize,
    /// Orphans gone by the end.
    pub orphans_collected: usize,
    /// The longest orphan collection latency (from the later of orphan appearance and takeover).
    pub orphan_latency_max: Duration,
    /// The bound it is held to: collection period + grace.
    pub orphan_bound: Duration,
    /// Resumes the API server refused (each followed by a relist), as the replicas reported.
    pub failed_resumes: usize,
    /// How long the run took.
    pub elapsed: Duration,
}

impl Report {
    /// True if no safety violation happened and every deletion and orphan was handled.
    pub fn is_clean(&self) -> bool {
        self.double_allocations.is_empty()
            && self.handler_overlaps.is_empty()
            && self.pods_with_two_ips.is_empty()
            && self.in_use_collected.is_empty()
            && self.missed_deletions.is_empty()
            && self.unannotated_pods == 0
            && self.orphans_collected == self.orphans_seen
    }

    /// The numbers, one per line.
    pub fn summary(&self) -> String {
        format!(
            "leader changes: {}, membership changes: {} (kills {}, pauses {}, stops {}, injected crashes {})\n\
             handlers witnessed: {} ({} fenced), overlapping on one pod: {}\n\
             samples: {}, pods created: {}, deleted: {}\n\
             double allocations: {}\npods with two IPs: {}\nlive resources collected: {}\n\
             missed deletions: {}\nunannotated live pods at the end: {}\n\
             orphans: {} seen, {} collected; latency max {:?} (bound: GC period + grace = {:?})\n\
             failed resumes (relists): {}\n\
             elapsed: {:?}",
            self.leader_changes,
            self.membership_changes,
            self.kills,
            self.pauses,
            self.stops,
            self.injected_crashes,
            self.handlers,
            self.fenced_handlers,
            self.handler_overlaps.len(),
            self.samples,
            self.pods_created,
            self.pods_deleted,
            self.double_allocations.len(),
            self.pods_with_two_ips.len(),
            self.in_use_collected.len(),
            self.missed_deletions.len(),
            self.unannotated_pods,
            self.orphans_seen,
            self.orphans_collected,
            self.orphan_latency_max,
            self.orphan_bound,
            self.failed_resumes,
            self.elapsed,
        )
    }
}

/// Why a run could not be carried out (not a verdict: violations are in the [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum CheckerError {
    /// etcd did not start.
    #[error("etcd did not start: {0}")]
    EtcdServer(String),
    /// etcd failed.
    #[error("etcd: {0}")]
    Etcd(#[from] tenure_etcd::EtcdError),
    /// The pool could not be read.
    #[error("pool: {0}")]
    Pool(#[from] crate::pool::PoolError),
    /// The API server or a client request failed.
    #[error("kubernetes: {0}")]
    Kube(String),
    /// A process could not be started or signalled.
    #[error("process: {0}")]
    Process(String),
    /// No new leader within the bound after a fault.
    #[error("no new leader within {0:?} after {1}")]
    NoLeader(Duration, String),
}

/// One controller process.
pub(crate) struct Replica {
    pub(crate) identity: String,
    pub(crate) child: Child,
}

/// Starts etcd, the API server and three controllers, runs the scenario, and reports.
pub async fn run(scenario: &Scenario) -> Result<Report, CheckerError> {
    let started = Instant::now();
    let etcd = EtcdCluster::start_with(EtcdConfig::new(1)).await.map_err(CheckerError::EtcdServer)?;
    let mut config = ApiServerConfig::default();
    if let Some(window) = scenario.event_window {
        config.event_window = window;
    }
    let apiserver = ApiServer::start(config).await.map_err(|e| CheckerError::Kube(format!("apiserver: {e}")))?;
    let election = EtcdElection::connect(&[etcd.endpoint(0)], ELECTION).await?;
    let pool = IpPool::new(election.clone(), POOL_PREFIX, POOL_BASE, POOL_SIZE);
    let client = kube_client(&apiserver.url())?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let logs = std::env::temp_dir().join(format!(
        "tenure-ipam-logs-{}-{}",
        std::process::id(),
        etcd.endpoint(0).replace([':', '.'], "-")
    ));
    std::fs::create_dir_all(&logs).map_err(|e| CheckerError::Process(format!("{}: {e}", logs.display())))?;
    let mut harness = Harness::new(logs.clone(), scenario.clone(), etcd.endpoint(0), apiserver.url());
    for _ in 0..3 {
        harness.spawn()?;
    }
    let observer = Arc::new(Mutex::new(Observations::new()));
    let stop_sampling = CancellationToken::new();
    let sampler =
        tokio::spawn(sample(pods.clone(), pool.clone(), election.clone(), observer.clone(), stop_sampling.clone()));
    let stop_churn = CancellationToken::new();
    let churn = tokio::spawn(churn(pods.clone(), scenario.clone(), observer.clone(), stop_churn.clone()));

    let mut report = Report { orphan_bound: scenario.orphan_bound(), ..Report::default() };
    let mut frozen = Frozen::new();
    let faults = match scenario.mode {
        Mode::ActivePassive => leader_faults(&mut harness, &election, &pods, &mut report).await,
        Mode::ActiveActive => {
            active_active::member_faults(&mut harness, &pods, &observer, &mut report, &mut frozen).await
        }
    };
    if let Err(error) = faults {
        if std::env::var_os("TENURE_IPAM_KEEP_LOGS").is_some() {
            eprintln!("replica logs kept in {}", logs.display());
        }
        return Err(error);
    }
    stop_churn.cancel();
    let _ = churn.await;

    // Settle: every deletion released and every orphan collected, or the bound passes.
    let settle = scenario.ttl * 2 + scenario.gc_period * 2 + scenario.gc_grace * 2 + Duration::from_secs(3);
    let deadline = Instant::now() + settle;
    loop {
        let done = observer.lock().unwrap_or_else(|e| e.into_inner()).settled();
        if (done && scenario.resume) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(SAMPLE_EVERY * 5).await;
    }
    harness.restart_exited(&mut report)?;
    stop_sampling.cancel();
    let _ = sampler.await;
    harness.stop().await;
    let observations = observer.lock().unwrap_or_else(|e| e.into_inner()).clone();
    observations.finish(&mut report);
    report.failed_resumes = count_lines(&logs, RESUME_FAILED_LINE);
    if scenario.mode == Mode::ActiveActive {
        let handled = witness::read_dir(&logs);
        report.handlers = handled.len();
        report.fenced_handlers = handled.iter().filter(|h| h.outcome == Some(witness::Outcome::Fenced)).count();
        report.handler_overlaps = witness::overlaps(&handled, &frozen);
        report.leader_changes = 0;
    }
    if std::env::var_os("TENURE_IPAM_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&logs);
    }
    report.elapsed = started.elapsed();
    apiserver.shutdown().await;
    drop(etcd);
    Ok(report)
}

/// Active/Passive faults: each hits the leader and waits for the next one.
async fn leader_faults(
    harness: &mut Harness,
    election: &EtcdElection,
    pods: &Api<Pod>,
    report: &mut Report,
) -> Result<(), CheckerError> {
    let mut term = wait_for_leader(election, None, "start").await?;
    for fault in 0..harness.scenario.faults {
        tokio::time::sleep(harness.scenario.fault_spacing).await;
        let leader = election.leader().await?.ok_or_else(|| CheckerError::NoLeader(LEADER_BOUND, "a fault".into()))?;
        let Some(index) = harness.replicas.iter().position(|r| r.identity == leader.identity) else {
            return Err(CheckerError::Process(format!("leader {} is not one of the replicas", leader.identity)));
        };
        let pid = harness.pid(index)?;
        let what = match fault % 4 {
            0 => {
                signal(pid, Signal::SIGKILL)?;
                report.kills += 1;
                "SIGKILL"
            }
            1 => {
                signal(pid, Signal::SIGSTOP)?;
                report.pauses += 1;
                let paused = wait_for_leader(election, Some(term), "SIGSTOP").await;
                // Stay paused past the lease for sure, then let the old leader wake up and try.
                tokio::time::sleep(harness.scenario.ttl).await;
                signal(pid, Signal::SIGCONT)?;
                term = paused?;
                harness.restart_exited(report)?;
                continue;
            }
            2 => {
                signal(pid, Signal::SIGTERM)?;
                report.stops += 1;
                "SIGTERM"
            }
            _ => {
                create_pod(pods, &format!("crash-{fault}"), true).await?;
                "an injected crash"
            }
        };
        term = wait_for_leader(election, Some(term), what).await?;
        harness.restart_exited(report)?;
    }
    Ok(())
}

/// A client of the API server at `url`.
pub fn kube_client(url: &str) -> Result<Client, CheckerError> {
    let uri = url.parse().map_err(|e| CheckerError::Kube(format!("{url}: {e}")))?;
    Client::try_from(kube::Config::new(uri)).map_err(|e| CheckerError::Kube(e.to_string()))
}

/// The controller processes of a run (the checker's, or the benchmark's).
pub(crate) struct Harness {
    /// Where each replica's stdout goes.
    logs: PathBuf,
    scenario: Scenario,
    pub(crate) etcd: String,
    url: String,
    pub(crate) replicas: Vec<Replica>,
    generation: usize,
}

impl Harness {
    pub(crate) fn new(logs: PathBuf, scenario: Scenario, etcd: String, url: String) -> Harness {
        Harness { logs, scenario, etcd, url, replicas: Vec::new(), generation: 0 }
    }

    /// Starts one more replica (a new identity).
    pub(crate) fn spawn(&mut self) -> Result<(), CheckerError> {
        self.generation += 1;
        let identity = format!("replica-{}", self.generation);
        let s = &self.scenario;
        let log = std::fs::File::create(self.logs.join(format!("{identity}.log")))
            .map_err(|e| CheckerError::Process(format!("{}: {e}", self.logs.display())))?;
        let mut command = Command::new(&s.controller);
        command
            .arg("controller")
            .args(["--identity", &identity, "--etcd", &self.etcd, "--apiserver", &self.url])
            .args(["--ttl", &format!("{}s", s.ttl.as_secs())])
            .args(["--gc-period", &format!("{}ms", s.gc_period.as_millis())])
            .args(["--gc-grace", &format!("{}ms", s.gc_grace.as_millis())])
            .args(["--crash-after-allocate", "--exit-with-parent"])
            .args(["--pool-delay", &format!("{}ms", s.pool_delay.as_millis())])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| CheckerError::Process(e.to_string()))?)
            .stderr(log)
            .kill_on_drop(true);
        if !s.resume {
            command.arg("--no-resume");
        }
        if s.mode == Mode::ActiveActive {
            command
                .args(["--mode", "active-active", "--partitions", &s.partitions.to_string()])
                .arg("--witness")
                .arg(self.logs.join(format!("{identity}.witness")));
            if s.ignore_revocation {
                command.arg("--unsafe-ignore-revocation");
            }
        }
        let child = command.spawn().map_err(|e| CheckerError::Process(format!("{}: {e}", s.controller.display())))?;
        self.replicas.push(Replica { identity, child });
        Ok(())
    }

    /// Stops every replica (SIGTERM) and waits up to 10 s for each to exit.
    pub(crate) async fn stop(&mut self) {
        for replica in &self.replicas {
            if let Some(pid) = replica.child.id() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
        for replica in &mut self.replicas {
            let _ = tokio::time::timeout(Duration::from_secs(10), replica.child.wait()).await;
        }
    }

    fn pid(&self, index: usize) -> Result<Pid, CheckerError> {
        let pid =
            self.replicas[index].child.id().ok_or_else(|| CheckerError::Process("the leader has exited".into()))?;
        Ok(Pid::from_raw(pid as i32))
    }

    /// Replaces every replica that has exited, counting the injected crashes.
    fn restart_exited(&mut self, report: &mut Report) -> Result<(), CheckerError> {
        let mut exited = 0;
        let mut index = 0;
        while index < self.replicas.len() {
            match self.replicas[index].child.try_wait() {
                Ok(Some(status)) => {
                    if status.code() == Some(CRASH_EXIT_CODE) {
                        report.injected_crashes += 1;
                    }
                    self.replicas.remove(index);
                    exited += 1;
                }
                _ => index += 1,
            }
        }
        for _ in 0..exited {
            self.spawn()?;
        }
        Ok(())
    }
}

/// How many lines of the replicas' logs in `dir` contain `needle`.
fn count_lines(dir: &std::path::Path, needle: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .map(|text| text.lines().filter(|line| line.contains(needle)).count())
        .sum()
}

pub(crate) fn signal(pid: Pid, signal: Signal) -> Result<(), CheckerError> {
    kill(pid, signal).map_err(|e| CheckerError::Process(format!("{signal} to {pid}: {e}")))
}

/// Polls until a leader with a term other than `old` exists; returns its term.
async fn wait_for_leader(election: &EtcdElection, old: Option<u64>, after: &str) -> Result<u64, CheckerError> {
    let deadline = Instant::now() + LEADER_BOUND;
    loop {
        if let Ok(Some(leader)) = election.leader().await {
            if Some(leader.term.0) != old {
                return Ok(leader.term.0);
            }
        }
        if Instant::now() >= deadline {
            return Err(CheckerError::NoLeader(LEADER_BOUND, after.to_owned()));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

pub(crate) async fn create_pod(pods: &Api<Pod>, name: &str, crash: bool) -> Result<Pod, CheckerError> {
    let mut labels = serde_json::Map::new();
    labels.insert("app".into(), "churn".into());
    if crash {
        labels.insert(CRASH_LABEL.into(), "true".into());
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": { "containers": [{ "name": "app", "image": "registry.k8s.io/pause:3.9" }] }
    }))
    .map_err(|e| CheckerError::Kube(e.to_string()))?;
    pods.create(&PostParams::default(), &pod).await.map_err(|e| CheckerError::Kube(format!("create {name}: {e}")))
}

/// Creates and deletes Pods until cancelled, keeping about `live_pods` alive.
async fn churn(pods: Api<Pod>, scenario: Scenario, observer: Arc<Mutex<Observations>>, stop: CancellationToken) {
    let mut rng = SmallRng::seed_from_u64(scenario.seed);
    let mut live: Vec<(String, String)> = Vec::new();
    let mut next = 0u64;
    while !stop.is_cancelled() {
        let create = live.len() < 2 || (live.len() < scenario.live_pods * 2 && rng.random_bool(0.5));
        if create {
            next += 1;
            let name = format!("pod-{next}");
            if let Ok(pod) = create_pod(&pods, &name, false).await {
                live.push((name, pod.uid().unwrap_or_default()));
                observer.lock().unwrap_or_else(|e| e.into_inner()).created += 1;
            }
        } else {
            let (name, uid) = live.swap_remove(rng.random_range(0..live.len()));
            if pods.delete(&name, &DeleteParams::default()).await.is_ok() {
                observer.lock().unwrap_or_else(|e| e.into_inner()).deleted.insert(uid);
            }
        }
        tokio::time::sleep(scenario.churn_every).await;
    }
}

/// What the sampler has seen so far.
#[derive(Debug, Clone, Default)]
struct Observations {
    samples: usize,
    created: usize,
    deleted: HashSet<String>,
    terms: Vec<(u64, Instant)>,
    /// Active/Active: when the group settled after each membership change (the moment the
    /// partitions of a departed member have a new owner).
    takeovers: Vec<Instant>,
    /// The first address each Pod was annotated with.
    annotated: HashMap<String, Ipv4Addr>,
    /// Who each allocation (address, create revision) was for.
    allocations: HashMap<(Ipv4Addr, i64), String>,
    /// Orphans: allocation -> when first seen as one; and when each one was gone.
    orphans: HashMap<(Ipv4Addr, i64), Instant>,
    collected: HashMap<(Ipv4Addr, i64), Instant>,
    /// Allocations of deleted Pods in the last sample.
    held_by_deleted: Vec<String>,
    unannotated: usize,
    double_allocations: Vec<String>,
    pods_with_two_ips: Vec<String>,
    in_use_collected: Vec<String>,
}

impl Observations {
    fn new() -> Observations {
        Observations::default()
    }

    fn settled(&self) -> bool {
        self.held_by_deleted.is_empty()
            && self.orphans.keys().all(|k| self.collected.contains_key(k))
            && self.unannotated == 0
    }

    /// One sample: Pods, then the pool, then Pods again.
    fn record(
        &mut self,
        before: &[Pod],
        allocations: &[crate::pool::Allocation],
        after: &[Pod],
        term: Option<u64>,
        now: Instant,
    ) {
        self.samples += 1;
        if let Some(term) = term {
            if self.terms.last().map(|(t, _)| *t) != Some(term) {
                self.terms.push((term, now));
            }
        }
        let by_uid = |pods: &[Pod]| -> HashMap<String, (Option<String>, Option<Ipv4Addr>)> {
            pods.iter()
                .map(|p| (p.uid().unwrap_or_default(), (p.resource_version(), annotated_ip(p.annotations()))))
                .collect()
        };
        let (first, second) = (by_uid(before), by_uid(after));
        let allocated: HashMap<Ipv4Addr, (&str, i64)> =
            allocations.iter().map(|a| (a.ip, (a.record.pod_uid.as_str(), a.create_revision))).collect();
        for allocation in allocations {
            let id = (allocation.ip, allocation.create_revision);
            let owner = self.allocations.entry(id).or_insert_with(|| allocation.record.pod_uid.clone());
            if *owner != allocation.record.pod_uid {
                self.double_allocations
                    .push(format!("{} rewritten from pod {owner} to {}", allocation.ip, allocation.record.pod_uid));
            }
        }
        // Live Pods in one listing: one address each, never two Pods per address, never changing.
        let mut holders: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
        let mut unannotated = 0;
        for (uid, (_, ip)) in &second {
            let Some(ip) = ip else {
                unannotated += 1;
                continue;
            };
            if let Some(other) = holders.insert(*ip, uid) {
                self.double_allocations.push(format!("{ip} annotated on pods {other} and {uid}"));
            }
            let first_ip = self.annotated.entry(uid.clone()).or_insert(*ip);
            if first_ip != ip {
                self.pods_with_two_ips.push(format!("pod {uid}: {first_ip} then {ip}"));
            }
        }
        self.unannotated = unannotated;
        // Unchanged across the pool read: its address must be allocated to it in that read.
        for (uid, (version, ip)) in &first {
            let (Some(ip), Some((version_after, _))) = (ip, second.get(uid)) else { continue };
            if version_after != version {
                continue;
            }
            if allocated.get(ip).map(|(owner, _)| *owner) != Some(uid.as_str()) {
                self.in_use_collected.push(format!("{ip} of pod {uid} not allocated to it while in use"));
            }
        }
        // Orphans: allocations for a Pod annotated with another address.
        let live: HashSet<(Ipv4Addr, i64)> = allocations.iter().map(|a| (a.ip, a.create_revision)).collect();
        for allocation in allocations {
            if let Some((_, Some(ip))) = second.get(&allocation.record.pod_uid) {
                if *ip != allocation.ip {
                    self.orphans.entry((allocation.ip, allocation.create_revision)).or_insert(now);
                }
            }
        }
        // An allocation seen earlier, gone now, whose Pod holds another address was an orphan
        // that was collected between two samples (before one sample could show both): counted,
        // with no latency.
        for (id, uid) in &self.allocations {
            if live.contains(id) || self.orphans.contains_key(id) {
                continue;
            }
            if let Some((_, Some(ip))) = second.get(uid) {
                if *ip != id.0 {
                    self.orphans.insert(*id, now);
                }
            }
        }
        for id in self.orphans.keys() {
            if !live.contains(id) {
                self.collected.entry(*id).or_insert(now);
            }
        }
        self.held_by_deleted = allocations
            .iter()
            .filter(|a| self.deleted.contains(&a.record.pod_uid))
            .map(|a| format!("{} of deleted pod {} ({})", a.ip, a.record.pod_name, a.record.pod_uid))
            .collect();
    }

    fn finish(&self, report: &mut Report) {
        report.leader_changes = self.terms.len().saturating_sub(1);
        report.samples = self.samples;
        report.pods_created = self.created;
        report.pods_deleted = self.deleted.len();
        report.double_allocations = self.double_allocations.clone();
        report.pods_with_two_ips = self.pods_with_two_ips.clone();
        report.in_use_collected = self.in_use_collected.clone();
        report.missed_deletions = self.held_by_deleted.clone();
        report.unannotated_pods = self.unannotated;
        report.orphans_seen = self.orphans.len();
        report.orphans_collected = self.collected.len();
        for (id, appeared) in &self.orphans {
            let Some(gone) = self.collected.get(id) else { continue };
            let takeover = self
                .terms
                .iter()
                .map(|(_, at)| *at)
                .chain(self.takeovers.iter().copied())
                .filter(|at| at <= gone)
                .max();
            let from = takeover.map_or(*appeared, |t| t.max(*appeared));
            report.orphan_latency_max = report.orphan_latency_max.max(gone.saturating_duration_since(from));
        }
    }
}

/// Samples until cancelled.
async fn sample(
    pods: Api<Pod>,
    pool: IpPool,
    election: EtcdElection,
    observer: Arc<Mutex<Observations>>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let sampled = async {
            let before = pods.list(&ListParams::default()).await.ok()?.items;
            let allocations = pool.list().await.ok()?;
            let after = pods.list(&ListParams::default()).await.ok()?.items;
            let term = election.leader().await.ok()?.map(|l| l.term.0);
            Some((before, allocations, after, term))
        }
        .await;
        if let Some((before, allocations, after, term)) = sampled {
            observer.lock().unwrap_or_else(|e| e.into_inner()).record(
                &before,
                &allocations,
                &after,
                term,
                Instant::now(),
            );
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Allocation, AllocationRecord};

    fn pod(uid: &str, version: &str, ip: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.into());
        pod.metadata.resource_version = Some(version.into());
        if let Some(ip) = ip {
            pod.annotations_mut().insert(crate::controller::IP_ANNOTATION.into(), ip.into());
        }
        pod
    }

    fn allocation(ip: &str, uid: &str, revision: i64) -> Allocation {
        Allocation {
            ip: ip.parse().expect("an address"),
            record: AllocationRecord { pod_uid: uid.into(), pod_name: uid.into(), term: 1 },
            create_revision: revision,
        }
    }

    #[test]
    fn two_pods_annotated_with_one_address_are_a_double_allocation() {
        let mut observations = Observations::new();
        let pods = [pod("a", "1", Some("10.0.0.1")), pod("b", "2", Some("10.0.0.1"))];
        observations.record(&pods, &[allocation("10.0.0.1", "a", 5)], &pods, Some(1), Instant::now());
        assert_eq!(observations.double_allocations.len(), 1, "{:?}", observations.double_allocations);
    }

    #[test]
    fn an_allocation_rewritten_for_another_pod_is_a_double_allocation() {
        let mut observations = Observations::new();
        observations.record(&[], &[allocation("10.0.0.1", "a", 5)], &[], Some(1), Instant::now());
        observations.record(&[], &[allocation("10.0.0.1", "b", 5)], &[], Some(1), Instant::now());
        assert_eq!(observations.double_allocations.len(), 1);
    }

    #[test]
    fn a_pod_whose_address_changes_has_two_addresses() {
        let mut observations = Observations::new();
        let first = [pod("a", "1", Some("10.0.0.1"))];
        observations.record(&first, &[allocation("10.0.0.1", "a", 5)], &first, Some(1), Instant::now());
        let second = [pod("a", "2", Some("10.0.0.2"))];
        observations.record(&second, &[allocation("10.0.0.2", "a", 6)], &second, Some(1), Instant::now());
        assert_eq!(observations.pods_with_two_ips.len(), 1);
    }

    #[test]
    fn an_address_released_while_its_unchanged_pod_holds_it_is_a_live_resource_collected() {
        let mut observations = Observations::new();
        let pods = [pod("a", "1", Some("10.0.0.1"))];
        observations.record(&pods, &[], &pods, Some(1), Instant::now());
        assert_eq!(observations.in_use_collected.len(), 1);
        // A Pod that changed (or went away) between the listings proves nothing.
        let mut other = Observations::new();
        other.record(&pods, &[], &[pod("a", "2", Some("10.0.0.1"))], Some(1), Instant::now());
        other.record(&pods, &[], &[], Some(1), Instant::now());
        assert!(other.in_use_collected.is_empty(), "{:?}", other.in_use_collected);
    }

    #[test]
    fn an_orphan_is_timed_from_the_later_of_its_appearance_and_the_takeover() {
        let mut observations = Observations::new();
        let start = Instant::now();
        let pods = [pod("a", "1", Some("10.0.0.2"))];
        let both = [allocation("10.0.0.1", "a", 5), allocation("10.0.0.2", "a", 6)];
        observations.record(&pods, &both, &pods, Some(1), start);
        observations.record(&pods, &both, &pods, Some(2), start + Duration::from_secs(3));
        observations.record(&pods, &both[1..], &pods, Some(2), start + Duration::from_secs(4));
        let mut report = Report::default();
        observations.finish(&mut report);
        assert_eq!((report.orphans_seen, report.orphans_collected), (1, 1));
        assert_eq!(report.orphan_latency_max, Duration::from_secs(1));
        assert_eq!(report.leader_changes, 1);
    }

    #[test]
    fn an_orphan_collected_before_a_sample_could_show_it_with_its_pods_new_address_still_counts() {
        let mut observations = Observations::new();
        let start = Instant::now();
        let pending = [pod("a", "1", None)];
        observations.record(&pending, &[allocation("10.0.0.1", "a", 5)], &pending, None, start);
        let annotated = [pod("a", "2", Some("10.0.0.2"))];
        let later = start + Duration::from_secs(1);
        observations.record(&annotated, &[allocation("10.0.0.2", "a", 6)], &annotated, None, later);
        let mut report = Report::default();
        observations.finish(&mut report);
        assert_eq!((report.orphans_seen, report.orphans_collected), (1, 1));
        assert_eq!(report.orphan_latency_max, Duration::ZERO);
    }

    #[test]
    fn an_address_still_held_by_a_deleted_pod_is_a_missed_deletion() {
        let mut observations = Observations::new();
        observations.deleted.insert("a".into());
        observations.record(&[], &[allocation("10.0.0.1", "a", 5)], &[], Some(1), Instant::now());
        let mut report = Report::default();
        observations.finish(&mut report);
        assert_eq!(report.missed_deletions.len(), 1);
        assert!(!observations.settled());
    }
}
