//! A model of the gated watch and its checkpoint under virtual time (issue 30, invariant C2).
//!
//! The real leader work ([`Leader::lead`], warm or cold, with its retries, warm cache and
//! [`Checkpointer`]) runs against a simulated API server and two processes whose tenures the
//! model starts and ends the way the gate does ([`crate::gate`]): a lost lock aborts the work at
//! once; a freeze (or a renew that fails until the deadline) lets the tenure lapse on the clock
//! while the work runs on until the elector and the gate notice, then aborts it by the time a
//! follower may lead; a resign ends the tenure and drains; a shutdown cancels, drains, then ends
//! the tenure. A failed or panicking work is restarted while the tenure lasts. Either process
//! leads next (the same one in about half of the changes of leader), and each call of the
//! handler takes a while and then returns `Ok` (after checking its tenure, as the README's old
//! example did: deposed means no effect), returns `Ok` after an effect made in time but returns
//! late, fails, panics or never returns. A last tenure with a handler that always succeeds ends
//! every schedule.
//!
//! Checked: no checkpoint write names a version past a change that no leader handled yet
//! (at every write, in the store), every change is handled by some leader in the end, and the
//! checkpoint then reaches the newest version. The mutation tests bring back the two ways the
//! old code lost a change ([`crate::mutation`]) and require the model to catch each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use tenure::leadership::{Publisher, Subscriber};
use tenure::{Term, Timing};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

use super::*;
use crate::checkpoint::memory::MemoryCheckpointStore;
use crate::checkpoint::{Checkpoint, StoredCheckpoint};
use crate::mutation::{self, Mutation};

const RESOURCE: &str = "configmaps";
const PANIC: &str = "injected handler panic";
const DRAIN: Duration = Duration::from_millis(1500);
/// After a freeze, the earliest another process may lead (lease minus renew deadline).
const FENCE_GRACE: Duration = Duration::from_millis(500);
const RESTART: Duration = Duration::from_millis(50);

/// A small deterministic generator (xorshift*), so that a seed names a schedule.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }

    fn ms(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max + 1))
    }
}

/// The simulated API server: an ordered log of changes, version = position + 1.
struct Server {
    log: Mutex<Vec<ResumeEvent<ConfigMap>>>,
    newest: watch::Sender<u64>,
}

fn configmap(name: &str, version: u64) -> ConfigMap {
    let metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        resource_version: Some(version.to_string()),
        ..ObjectMeta::default()
    };
    ConfigMap { metadata, ..ConfigMap::default() }
}

impl Server {
    fn log(&self) -> MutexGuard<'_, Vec<ResumeEvent<ConfigMap>>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn change(&self, name: &str, deleted: bool) {
        let mut log = self.log();
        let version = log.len() as u64 + 1;
        let object = configmap(name, version);
        log.push(if deleted { ResumeEvent::Deleted(object) } else { ResumeEvent::Applied(object) });
        self.newest.send_replace(version);
    }

    /// A watch from `saved`, or a list (of the live objects) and a watch from the list's version.
    fn open(self: &Arc<Self>, saved: Option<String>) -> Events<ConfigMap> {
        let newest = *self.newest.borrow();
        let (from, list) = match saved.and_then(|v| v.parse::<u64>().ok()) {
            Some(from) => (from, None),
            None => {
                let mut live = BTreeMap::new();
                for event in self.log().iter() {
                    match event {
                        ResumeEvent::Applied(o) => live.insert(key(o), o.clone()),
                        _ => live.remove(&key(event_object(event))),
                    };
                }
                let objects = live.into_values().collect();
                let cause = tenure_kube::resume::ListCause::Initial;
                (newest, Some(ResumeEvent::Listed { objects, version: newest.to_string(), cause }))
            }
        };
        let state = (self.clone(), self.newest.subscribe(), from, list);
        futures::stream::unfold(state, |(server, mut newest, cursor, list)| async move {
            if let Some(listed) = list {
                return Some((Ok(listed), (server, newest, cursor, None)));
            }
            newest.wait_for(|v| *v > cursor).await.ok()?;
            let event = server.log()[cursor as usize].clone();
            Some((Ok(event), (server, newest, cursor + 1, None)))
        })
        .boxed()
    }
}

fn event_object(event: &ResumeEvent<ConfigMap>) -> &ConfigMap {
    match event {
        ResumeEvent::Applied(o) | ResumeEvent::Deleted(o) => o,
        _ => unreachable!("the log holds changes only"),
    }
}

/// What really happened: the changes handled (an effect made under a valid tenure), and every
/// broken rule.
#[derive(Default)]
struct Truth {
    handled: Mutex<Vec<(String, u64)>>,
    violations: Mutex<Vec<String>>,
    trace: Mutex<Vec<String>>,
}

impl Truth {
    fn note(&self, line: String) {
        self.trace.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    fn violate(&self, line: String) {
        self.note(format!("VIOLATION: {line}"));
        self.violations.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    /// The first change up to `version` that no leader has handled: a handled later state of the
    /// same object covers it (the handler always sees the newest state).
    fn first_unhandled(&self, server: &Server, version: u64) -> Option<String> {
        let handled = self.handled.lock().unwrap_or_else(|e| e.into_inner());
        let log = server.log();
        log.iter().zip(1..).take_while(|(_, v)| *v <= version).find_map(|(event, v)| {
            let key = key(event_object(event));
            let covered = handled.iter().any(|(k, h)| *k == key && *h >= v);
            (!covered).then(|| format!("{key}@{v}"))
        })
    }
}

/// The shared checkpoint store, checking C2 at every write that lands.
struct Checked {
    inner: MemoryCheckpointStore,
    server: Arc<Server>,
    truth: Arc<Truth>,
}

#[async_trait]
impl CheckpointStore for Checked {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        self.inner.load().await
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        self.inner.save(term, checkpoint).await?;
        let version = checkpoint.resource_version(RESOURCE).and_then(|v| v.parse().ok()).unwrap_or(0);
        self.truth.note(format!("checkpoint {version} written under term {term}"));
        if let Some(change) = self.truth.first_unhandled(&self.server, version) {
            self.truth.violate(format!("term {term} checkpointed {version}, past unhandled {change}"));
        }
        Ok(())
    }

    fn controller(&self) -> &str {
        self.inner.controller()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// How a call of the handler ends, after its delay.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Checks the tenure: effect and `Ok` if valid, else no effect and `Ok` (deposed).
    Ok,
    /// The effect in time, then `Ok` some time later (perhaps after the tenure ended).
    OkLate,
    Err,
    Panic,
    Hang,
}

/// How a tenure ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Deleted or taken: the gate aborts the work at once.
    Lost,
    /// Frozen (or renews failing) past the deadline: the work runs on until the gate notices.
    Fenced,
    Resigned,
    Shutdown,
}

struct Process {
    name: &'static str,
    leader: Arc<Leader<ConfigMap>>,
    publisher: Publisher,
    subscriber: Subscriber,
}

struct World {
    rng: Mutex<Rng>,
    truth: Arc<Truth>,
    /// The last tenure's handler always succeeds at once.
    reliable: AtomicBool,
}

impl World {
    fn handler(self: &Arc<Self>, process: &'static str) -> Handler<ConfigMap> {
        let world = self.clone();
        Arc::new(move |change, tenure| {
            let world = world.clone();
            let (delay, ending, late) = if world.reliable.load(Ordering::SeqCst) {
                (Duration::ZERO, Ending::Ok, Duration::ZERO)
            } else {
                let mut rng = world.rng.lock().unwrap_or_else(|e| e.into_inner());
                let ending = [Ending::Ok, Ending::Ok, Ending::OkLate, Ending::Err, Ending::Panic, Ending::Hang]
                    [rng.below(6) as usize];
                (rng.ms(400), ending, rng.ms(400))
            };
            let (key, version) = (key(change.object()), version_of(change.object()).unwrap_or(0));
            async move {
                let truth = &world.truth;
                let term = tenure.term().0;
                truth.note(format!("{process} t{term} handles {key}@{version}: {ending:?} after {delay:?}"));
                sleep(delay).await;
                let effect = || {
                    let valid = tenure.check().is_ok();
                    if valid {
                        truth.handled.lock().unwrap_or_else(|e| e.into_inner()).push((key.clone(), version));
                    }
                    truth.note(format!(
                        "{process} t{term} {key}@{version}: effect {}",
                        if valid { "made" } else { "refused (deposed)" }
                    ));
                };
                match ending {
                    Ending::Ok => effect(),
                    Ending::OkLate => {
                        effect();
                        sleep(late).await;
                    }
                    Ending::Err => return Err("injected failure".to_owned()),
                    Ending::Panic => panic!("{}", PANIC),
                    Ending::Hang => std::future::pending::<()>().await,
                }
                Ok(())
            }
            .boxed()
        })
    }
}

/// Leads one tenure of `process` as the gate would, until `end` after `length`.
async fn lead(process: &mut Process, term: u64, end: End, length: Duration, timing: Timing, rng: &Mutex<Rng>) {
    let now = Instant::now();
    let ends_at = now + length;
    // A freeze: the tenure lapses on the clock at the end; nobody has told the work yet.
    let valid_until = if end == End::Fenced { ends_at } else { now + Duration::from_secs(3600) };
    process.publisher.start_tenure(Term(term), valid_until);
    let tenure = process.subscriber.tenure().expect("a tenure just started");
    let start = |cancel: &CancellationToken| {
        let ctx = LeaderContext::new(tenure.clone(), cancel.clone(), timing);
        tokio::spawn(process.leader.clone().lead(ctx))
    };
    let mut cancel = CancellationToken::new();
    let mut work: Option<JoinHandle<Result<(), WatchError>>> = Some(start(&cancel));
    loop {
        let running = async {
            match work.as_mut() {
                Some(task) => drop(task.await),
                None => std::future::pending().await,
            }
        };
        let stopped = tokio::select! {
            biased;
            _ = tokio::time::sleep_until(ends_at) => false,
            _ = running => true,
        };
        if !stopped {
            break;
        }
        // Failed or panicked: restarted after a back-off while the tenure lasts.
        work = None;
        if tokio::time::timeout_at(ends_at, sleep(RESTART)).await.is_err() {
            break;
        }
        if tenure.is_valid() {
            cancel = CancellationToken::new();
            work = Some(start(&cancel));
        }
    }
    let mut drain = DRAIN;
    match end {
        End::Lost => drain = Duration::ZERO,
        End::Fenced => {
            // Thawed: whatever was ready runs before the elector and the gate see the lapse.
            let lag = rng.lock().unwrap_or_else(|e| e.into_inner()).ms(300);
            if let Some(task) = work.as_mut() {
                if timeout(lag, task).await.is_ok() {
                    work = None;
                }
            }
            drain = FENCE_GRACE.saturating_sub(lag);
        }
        End::Resigned | End::Shutdown => {}
    }
    if end != End::Shutdown {
        process.publisher.end_tenure();
    }
    cancel.cancel();
    if let Some(mut task) = work {
        if timeout(drain, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
    }
    process.publisher.end_tenure();
}

/// One schedule; `Err` describes the broken rule and the trace.
async fn schedule(seed: u64, standby: Standby) -> Result<(), String> {
    let rng = Mutex::new(Rng::new(seed));
    let draw = |n: u64| rng.lock().unwrap_or_else(|e| e.into_inner()).below(n);
    let truth = Arc::new(Truth::default());
    let server = Arc::new(Server { log: Mutex::default(), newest: watch::Sender::new(0) });
    let inner = MemoryCheckpointStore::new("model");
    let mut start = Checkpoint::new("model");
    start.resource_versions.insert(RESOURCE.into(), "0".into());
    inner.save(Term(0), &start).await.map_err(|e| e.to_string())?;
    let store: Arc<dyn CheckpointStore> =
        Arc::new(Checked { inner: inner.clone(), server: server.clone(), truth: truth.clone() });
    let world = Arc::new(World {
        rng: Mutex::new(Rng::new(seed ^ 0xA5A5)),
        truth: truth.clone(),
        reliable: AtomicBool::new(false),
    });
    let timing = Timing::new(Duration::from_secs(2), DRAIN, Duration::from_millis(100)).map_err(|e| e.to_string())?;
    let stop = CancellationToken::new();
    let mut processes: Vec<Process> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let open_on = server.clone();
            let open: OpenWatch<ConfigMap> = Arc::new(move |saved| Ok(open_on.open(saved)));
            let warm = (standby == Standby::Warm).then(|| Arc::new(WarmCache::new(None)));
            let leader = Arc::new(Leader {
                open,
                resource: RESOURCE.into(),
                store: store.clone(),
                gc: None,
                metrics: WatchMetrics::default(),
                retry: (Duration::from_millis(20), Duration::from_millis(100)),
                own: None,
                handler: world.handler(name),
                warm,
            });
            if let Some(cache) = leader.warm.clone() {
                tokio::spawn(leader.clone().follow(cache, stop.clone()));
            }
            let (publisher, subscriber) = Publisher::new();
            Process { name, leader, publisher, subscriber }
        })
        .collect();

    // One to four changes of three objects while leadership moves; a deleted object stays gone.
    let changes = draw(4) + 1;
    let mut plan: Vec<(Duration, &str, bool)> = Vec::new();
    let mut gone = BTreeSet::new();
    for _ in 0..changes {
        let name = ["x", "y", "z"][draw(3) as usize];
        if gone.contains(name) {
            continue;
        }
        let deleted = draw(4) == 0;
        if deleted {
            gone.insert(name);
        }
        plan.push((Duration::from_millis(1 + draw(1200)), name, deleted));
    }
    plan.sort_by_key(|(at, _, _)| *at);
    let changer = {
        let (server, truth) = (server.clone(), truth.clone());
        tokio::spawn(async move {
            let begun = Instant::now();
            for (at, name, deleted) in plan {
                tokio::time::sleep_until(begun + at).await;
                truth.note(format!("{at:?}: {} {name}", if deleted { "delete" } else { "apply" }));
                server.change(name, deleted);
            }
        })
    };

    let tenures = draw(3) + 1;
    let mut holder = draw(2) as usize;
    for term in 1..=tenures {
        sleep(Duration::from_millis(draw(100))).await;
        let end = [End::Lost, End::Fenced, End::Resigned, End::Shutdown][draw(4) as usize];
        let length = Duration::from_millis(1 + draw(600));
        truth.note(format!("{} leads term {term} for {length:?}, then {end:?}", processes[holder].name));
        lead(&mut processes[holder], term, end, length, timing, &rng).await;
        holder = if draw(2) == 0 { holder } else { 1 - holder };
    }
    world.reliable.store(true, Ordering::SeqCst);
    let _ = changer.await;
    truth.note(format!("{} leads the last term {}", processes[holder].name, tenures + 1));
    lead(&mut processes[holder], tenures + 1, End::Shutdown, Duration::from_secs(2), timing, &rng).await;
    stop.cancel();
    // Virtual time: the last flush (a detached task) has run once the runtime is idle.
    sleep(Duration::from_secs(1)).await;

    let newest = *server.newest.borrow();
    if let Some(change) = truth.first_unhandled(&server, newest) {
        truth.violate(format!("{change} was never handled"));
    }
    let stored = inner.peek().and_then(|s| s.checkpoint.resource_version(RESOURCE).and_then(|v| v.parse().ok()));
    if stored != Some(newest) {
        truth.violate(format!("the last checkpoint is {stored:?}, not the newest version {newest}"));
    }
    if truth.violations.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
        return Ok(());
    }
    let trace = truth.trace.lock().unwrap_or_else(|e| e.into_inner()).join("\n  ");
    Err(format!("seed {seed} ({standby:?}):\n  {trace}"))
}

/// Runs `schedules` seeds on fresh paused runtimes; the first failure, if any.
fn run(standby: Standby, seeds: std::ops::Range<u64>, mutation: Option<Mutation>) -> Option<String> {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<String>().map(String::as_str) != Some(PANIC) {
                default(info);
            }
        }));
    });
    mutation::set(mutation);
    let failure = seeds.into_iter().find_map(|seed| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
        runtime.expect("a runtime").block_on(schedule(seed, standby)).err()
    });
    mutation::set(None);
    failure
}

/// Schedules per standby mode (10,000 in all); `TENURE_MODEL_SCHEDULES` runs more (or fewer).
fn schedules() -> u64 {
    std::env::var("TENURE_MODEL_SCHEDULES").ok().and_then(|n| n.parse().ok()).unwrap_or(5_000)
}

#[test]
fn no_change_is_lost_across_leader_changes_in_warm_standby() {
    if let Some(failure) = run(Standby::Warm, 0..schedules(), None) {
        panic!("{failure}");
    }
}

#[test]
fn no_change_is_lost_across_leader_changes_in_cold_standby() {
    if let Some(failure) = run(Standby::Cold, 0..schedules(), None) {
        panic!("{failure}");
    }
}

/// Runs schedules under `mutation` until one fails; the failure names its seed and trace.
fn caught(standby: Standby, mutation: Mutation) -> String {
    let failure = run(standby, 0..schedules(), Some(mutation));
    let failure = failure.unwrap_or_else(|| panic!("the model does not catch {mutation:?} in {standby:?} standby"));
    eprintln!("{mutation:?} caught: {failure}");
    failure
}

/// Issue 30's first schedule: a warm leader aborted mid-handler leads again and forgets the change.
#[test]
fn the_model_catches_a_warm_leader_that_forgets_what_it_took() {
    caught(Standby::Warm, Mutation::ForgetTaken);
}

/// Issue 30's second schedule: a handler that returns `Ok` when deposed moves the checkpoint.
#[test]
fn the_model_catches_an_ok_returned_when_deposed() {
    caught(Standby::Cold, Mutation::DeposedOkHandled);
    caught(Standby::Warm, Mutation::DeposedOkHandled);
}
