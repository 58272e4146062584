//! `cargo bench -p tenure-bench --bench sharded_controller`
//!
//! A sharded kube-rs controller on sharded watches (`tenure_ha::kube_shard_watch::ShardedWatch`,
//! with the `kube_labeller::Labeller`): throughput with 1 and 5 replicas, the time from an
//! object's change to the start of its reconcile at steady state, and what each replica caches
//! and receives with 1, 3 and 5 replicas.
//!
//! Method: the project's API server in this process, with TENURE_BENCH_OBJECTS ConfigMaps
//! (default 9,000) created without a partition label; a group of 120 partitions on the same
//! server (tenure-kube's `KubeGroupStore`); a labeller elected on a Lease, in a runtime of its
//! own; N replicas, each in a one-thread runtime of its own as if it were a process, each with
//! its own client. The reconcile stands for an external call: it sleeps TENURE_BENCH_CALL_MS
//! (default 20 ms); each replica runs at most TENURE_BENCH_CONCURRENCY reconciles at once (default
//! 10), so one replica's capacity is 10 / 20 ms = 500 reconciles/s. Per N (fresh server):
//! 1. start: the labeller labels every ConfigMap, the replicas share the partitions and
//!    reconcile every ConfigMap once (not timed as throughput: joins move partitions meanwhile);
//! 2. throughput: every ConfigMap is changed at once (written straight into the server's store),
//!    timed from the first write until every ConfigMap's change was reconciled;
//! 3. steady state: changes at TENURE_BENCH_LOAD (default 0.5) of the N replicas' capacity for
//!    TENURE_BENCH_STEADY_SECS (default 5 s), each to a different ConfigMap; latency = start of the
//!    reconcile that saw the change - the moment the change was written;
//! 4. what each replica cached (objects, and bytes as JSON) and received (watch events: listed
//!    objects and changes) over the whole run and during the throughput phase (one change per
//!    ConfigMap);
//! 5. one more replica joins while nothing changes: the time until the partitions are shared
//!    again, every cache holds its share and the joiner reconciled every object it took over, and
//!    what the replicas already there received meanwhile (their re-lists: the constant).
//!
//! Replicas share this process, so memory is the cache's content (object count and JSON bytes),
//! not RSS.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Api;
use serde_json::json;
use tenure::{Elector, Timing};
use tenure_apiserver::resources::find_resource_type;
use tenure_apiserver::{ApiServer, ApiServerConfig};
use tenure_bench::kube_client::kube_client;
use tenure_bench::report::Report;
use tenure_bench::stats::Summary;
use tenure_bench::{env_usize, ms};
use tenure_group::{Group, GroupConfig, NotOwner};
use tenure_ha::kube_labeller::Labeller;
use tenure_ha::kube_shard::{Owning, ShardController};
use tenure_ha::kube_shard_watch::{ShardedWatch, WatchCounters, PARTITION_LABEL};
use tenure_ha::{Gate, GateHandle};
use tenure_kube::{KubeGroupStore, KubeLock, KubeLockRef, LockKind};

const NAMESPACE: &str = "default";
const PARTITIONS: u32 = 120;
/// How long any phase may take before the benchmark gives up (it stops by itself).
const PATIENCE: Duration = Duration::from_secs(180);

fn timing() -> Timing {
    Timing::new(Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(200)).expect("a timing")
}

fn name(i: usize) -> String {
    format!("cm-{i:05}")
}

/// What every replica's reconciles record: when each (object, generation) started, and which
/// objects completed a reconcile of each generation.
#[derive(Default)]
struct Recorder {
    started: Mutex<HashMap<(String, u32), Instant>>,
    done: Mutex<HashMap<u32, HashSet<String>>>,
    /// Reconciles started per replica.
    by_replica: Mutex<HashMap<String, usize>>,
}

impl Recorder {
    fn done(&self, generation: u32) -> usize {
        self.done.lock().unwrap().get(&generation).map_or(0, HashSet::len)
    }
}

struct Probe {
    identity: String,
    recorder: Arc<Recorder>,
    call: Duration,
}

async fn reconcile(cm: Arc<ConfigMap>, ctx: Arc<Owning<Probe>>) -> Result<Action, NotOwner> {
    ctx.check()?;
    let now = Instant::now();
    let name = cm.metadata.name.clone().unwrap_or_default();
    let generation: u32 = cm.data.as_ref().and_then(|d| d.get("generation")).and_then(|g| g.parse().ok()).unwrap_or(0);
    ctx.recorder.started.lock().unwrap().entry((name.clone(), generation)).or_insert(now);
    *ctx.recorder.by_replica.lock().unwrap().entry(ctx.identity.clone()).or_default() += 1;
    tokio::time::sleep(ctx.call).await; // the external call
    ctx.recorder.done.lock().unwrap().entry(generation).or_default().insert(name);
    Ok(Action::await_change())
}

struct Replica {
    shard: Option<ShardController>,
    cache: Store<ConfigMap>,
    counters: Arc<WatchCounters>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Replica {
    fn owned(&self) -> usize {
        self.shard.as_ref().map_or(0, |s| s.group().assignment().borrow().owned.len())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        drop(self.shard.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn one_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a runtime")
}

struct Settings {
    objects: usize,
    call: Duration,
    concurrency: u16,
    load: f64,
    steady: Duration,
}

async fn start_replica(url: &str, identity: &str, settings: &Settings, recorder: &Arc<Recorder>) -> Replica {
    let runtime = one_thread_runtime();
    let url = url.to_owned();
    let (id, probe) = (
        identity.to_owned(),
        Arc::new(Probe { identity: identity.to_owned(), recorder: recorder.clone(), call: settings.call }),
    );
    let concurrency = settings.concurrency;
    let started = runtime.spawn(async move {
        // The client's connection tasks run in this replica's runtime.
        let client = kube_client(&url, &id);
        let store = KubeGroupStore::new(client.clone(), NAMESPACE, "bench");
        let config = GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 };
        let group = Group::builder(&id, store).config(config).join().expect("a member");
        let configmaps: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
        let watch = ShardedWatch::new(group, configmaps, watcher::Config::default().labels("app=bench"))
            .concurrency(concurrency);
        let (cache, counters) = (watch.store(), watch.counters());
        let policy = |_cm: Arc<ConfigMap>, _error: &NotOwner, _ctx: Arc<Owning<Probe>>| Action::await_change();
        (watch.run(reconcile, policy, probe).expect("a controller"), cache, counters)
    });
    let (shard, cache, counters) = started.await.expect("a replica");
    Replica { shard: Some(shard), cache, counters, runtime: Some(runtime) }
}

struct LabellerProcess {
    runtime: tokio::runtime::Runtime,
    elector: Elector,
    gate: GateHandle,
}

impl LabellerProcess {
    /// Stops labelling and releases the Lease, as on SIGTERM.
    async fn stop(self) {
        let LabellerProcess { runtime, elector, gate } = self;
        let stopped = runtime.spawn(async move {
            gate.shutdown().await;
            let _ = elector.shutdown().await;
        });
        let _ = stopped.await;
        runtime.shutdown_background();
    }
}

async fn start_labeller(url: &str) -> LabellerProcess {
    let runtime = one_thread_runtime();
    let url = url.to_owned();
    let started = runtime.spawn(async move {
        let client = kube_client(&url, "labeller");
        let lease = KubeLockRef { namespace: NAMESPACE.into(), kind: LockKind::Leases, name: "labeller".into() };
        let lock = KubeLock::new(client.clone(), &lease, "labeller");
        let elector = Elector::builder("labeller", lock).timing(timing()).spawn().expect("an elector");
        let client = tenure_kube::WriteGate::leader(&elector).client(client);
        let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, NAMESPACE);
        let gate = Labeller::new(metadata, watcher::Config::default().labels("app=bench"), PARTITIONS)
            .spawn(Gate::builder(&elector));
        (elector, gate)
    });
    let (elector, gate) = started.await.expect("a labeller");
    LabellerProcess { runtime, elector, gate }
}

/// Waits (polling) until `done` holds; gives up after [`PATIENCE`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes generation `generation` into the data of ConfigMap `i`, straight into the store.
fn change(server: &ApiServer, i: usize, generation: u32) {
    let configmaps = find_resource_type("", "v1", "configmaps").expect("configmaps");
    let store = server.store();
    let mut cm = (*store.get(configmaps, NAMESPACE, &name(i)).expect("the ConfigMap")).clone();
    cm["metadata"].as_object_mut().expect("metadata").remove("resourceVersion");
    cm["data"]["generation"] = json!(generation.to_string());
    store.update(configmaps, NAMESPACE, &name(i), cm).expect("an update");
}

/// One replica's numbers.
struct ReplicaNumbers {
    cached: usize,
    cached_bytes: usize,
    events: u64,
    events_throughput: u64,
    lists: u64,
}

/// One run with `replicas` replicas.
struct Run {
    replicas: usize,
    start: Duration,
    throughput_time: Duration,
    steady: Summary,
    steady_rate: f64,
    per_replica: Vec<ReplicaNumbers>,
    join: Join,
}

/// What one more replica joining cost.
struct Join {
    /// From its start until the partitions were shared again, every cache held its share and the
    /// joiner had reconciled every object in its cache.
    time: Duration,
    /// Objects the joiner took over.
    gained: usize,
    /// Watch events the replicas already there received meanwhile (mean): their re-lists.
    events_others: f64,
    /// Watches the replicas already there started meanwhile (mean).
    lists_others: f64,
}

async fn run(replica_count: usize, settings: &Settings) -> Run {
    let config = ApiServerConfig { event_log_capacity: 200_000, ..ApiServerConfig::default() };
    let server = ApiServer::start(config).await.expect("a server");
    let url = server.url();
    let configmaps = find_resource_type("", "v1", "configmaps").expect("configmaps");
    for i in 0..settings.objects {
        let cm = json!({"metadata": {"name": name(i), "labels": {"app": "bench"}}, "data": {"generation": "0"}});
        server.store().create(configmaps, NAMESPACE, cm).expect("a ConfigMap");
    }
    let recorder = Arc::new(Recorder::default());

    // 1. Start: labeller and replicas, until everything is labelled, shared and reconciled once.
    let started = Instant::now();
    let labeller = start_labeller(&url).await;
    let mut replicas = Vec::with_capacity(replica_count);
    for r in 0..replica_count {
        replicas.push(start_replica(&url, &format!("replica-{r}"), settings, &recorder).await);
    }
    let labelled = || {
        let store = server.store();
        (0..settings.objects).all(|i| {
            store
                .get(configmaps, NAMESPACE, &name(i))
                .is_ok_and(|cm| cm["metadata"]["labels"][PARTITION_LABEL].is_string())
        })
    };
    wait_until("every ConfigMap is labelled", labelled).await;
    let mut last_progress = Instant::now();
    wait_until("the replicas share the partitions and cache every ConfigMap once", || {
        let cached: usize = replicas.iter().map(|r| r.cache.state().len()).sum();
        let owned: usize = replicas.iter().map(Replica::owned).sum();
        if last_progress.elapsed() > Duration::from_secs(10) {
            last_progress = Instant::now();
            let each: Vec<(usize, usize, u64, u64)> = replicas
                .iter()
                .map(|r| (r.owned(), r.cache.state().len(), r.counters.events(), r.counters.lists()))
                .collect();
            eprintln!("waiting: (owned partitions, cached, events, lists) per replica: {each:?}");
        }
        replicas.iter().all(|r| r.owned() > 0) && owned == PARTITIONS as usize && cached == settings.objects
    })
    .await;
    wait_until("every ConfigMap was reconciled once", || recorder.done(0) == settings.objects).await;
    let start = started.elapsed();

    // 2. Throughput: every ConfigMap changes at once.
    let events_before: Vec<u64> = replicas.iter().map(|r| r.counters.events()).collect();
    let first_write = Instant::now();
    for i in 0..settings.objects {
        change(&server, i, 1);
    }
    wait_until("every change was reconciled", || recorder.done(1) == settings.objects).await;
    let throughput_time = first_write.elapsed();
    let events_throughput: Vec<u64> =
        replicas.iter().zip(&events_before).map(|(r, b)| r.counters.events() - b).collect();

    // 3. Steady state: a fixed rate of changes, each to another ConfigMap.
    let capacity = replica_count as f64 * f64::from(settings.concurrency) / settings.call.as_secs_f64();
    let rate = (capacity * settings.load).max(1.0);
    let count = ((rate * settings.steady.as_secs_f64()) as usize).min(settings.objects);
    let mut written: Vec<(String, Instant)> = Vec::with_capacity(count);
    let steady_start = Instant::now();
    for k in 0..count {
        let due = steady_start + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        change(&server, k, 2);
        written.push((name(k), Instant::now()));
    }
    wait_until("every steady-state change was reconciled", || recorder.done(2) == count).await;
    let latencies: Vec<f64> = {
        let started = recorder.started.lock().unwrap();
        written.iter().map(|(n, at)| ms(started[&(n.clone(), 2)].saturating_duration_since(*at))).collect()
    };
    let steady = Summary::of(&latencies).expect("latencies");

    // 4. What each replica cached and received.
    let per_replica = replicas
        .iter()
        .zip(events_throughput)
        .map(|(r, events_throughput)| {
            let state = r.cache.state();
            ReplicaNumbers {
                cached: state.len(),
                cached_bytes: state.iter().map(|cm| serde_json::to_vec(&**cm).map_or(0, |b| b.len())).sum(),
                events: r.counters.events(),
                events_throughput,
                lists: r.counters.lists(),
            }
        })
        .collect();

    // 5. One more replica joins, with nothing changing: its share moves into its cache (and out of
    // the others') and is reconciled because it was gained.
    let events_before: Vec<u64> = replicas.iter().map(|r| r.counters.events()).collect();
    let lists_before: Vec<u64> = replicas.iter().map(|r| r.counters.lists()).collect();
    let joiner = format!("replica-{replica_count}");
    let join_started = Instant::now();
    replicas.push(start_replica(&url, &joiner, settings, &recorder).await);
    wait_until("the joiner took its share and reconciled it", || {
        let cached: usize = replicas.iter().map(|r| r.cache.state().len()).sum();
        let owned: usize = replicas.iter().map(Replica::owned).sum();
        let joined = &replicas[replica_count];
        let reconciled = recorder.by_replica.lock().unwrap().get(&joiner).copied().unwrap_or(0);
        let share = joined.cache.state().len();
        replicas.iter().all(|r| r.owned() > 0)
            && owned == PARTITIONS as usize
            && cached == settings.objects
            && share > 0
            && reconciled >= share
    })
    .await;
    let others = &replicas[..replica_count];
    let join = Join {
        time: join_started.elapsed(),
        gained: replicas[replica_count].cache.state().len(),
        events_others: mean(others.iter().zip(&events_before).map(|(r, b)| (r.counters.events() - b) as f64)),
        lists_others: mean(others.iter().zip(&lists_before).map(|(r, b)| (r.counters.lists() - b) as f64)),
    };
    drop(replicas);
    labeller.stop().await;
    Run { replicas: replica_count, start, throughput_time, steady, steady_rate: rate, per_replica, join }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.collect();
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

fn max(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, f64::max)
}

fn main() {
    let settings = Settings {
        objects: env_usize("TENURE_BENCH_OBJECTS", 9000),
        call: Duration::from_millis(env_usize("TENURE_BENCH_CALL_MS", 20) as u64),
        concurrency: env_usize("TENURE_BENCH_CONCURRENCY", 10) as u16,
        load: std::env::var("TENURE_BENCH_LOAD").ok().and_then(|v| v.parse().ok()).unwrap_or(0.5),
        steady: Duration::from_secs(env_usize("TENURE_BENCH_STEADY_SECS", 5) as u64),
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let runs: Vec<Run> = [1, 3, 5].into_iter().map(|n| runtime.block_on(run(n, &settings))).collect();

    let mut report = Report::new("sharded_controller");
    let objects = settings.objects as f64;
    let singleton = &runs[0];
    for run in &runs {
        let n = run.replicas;
        let throughput = objects / run.throughput_time.as_secs_f64();
        report.info(
            &format!("n{n}_start_s"),
            &format!("N={n}: labelled, shared and reconciled once"),
            run.start.as_secs_f64(),
            "s",
        );
        report.info(
            &format!("n{n}_throughput"),
            &format!("N={n}: throughput, every ConfigMap changed"),
            throughput,
            "reconciles/s",
        );
        let label = format!("N={n}: change -> reconcile start at {:.0}/s", run.steady_rate);
        report.distribution(&format!("n{n}_latency_ms"), &label, &run.steady, "ms", Some(1000.0));
        let cached =
            |f: fn(&ReplicaNumbers) -> f64| (mean(run.per_replica.iter().map(f)), max(run.per_replica.iter().map(f)));
        let (objects_mean, objects_max) = cached(|r| r.cached as f64);
        let (bytes_mean, _) = cached(|r| r.cached_bytes as f64);
        let (events_mean, events_max) = cached(|r| r.events_throughput as f64);
        let (total_mean, _) = cached(|r| r.events as f64);
        let (lists_mean, _) = cached(|r| r.lists as f64);
        report.info(
            &format!("n{n}_cached"),
            &format!("N={n}: objects cached per replica (mean)"),
            objects_mean,
            "objects",
        );
        report.info(
            &format!("n{n}_cached_max"),
            &format!("N={n}: objects cached per replica (max)"),
            objects_max,
            "objects",
        );
        report.info(
            &format!("n{n}_cached_kb"),
            &format!("N={n}: cache per replica, JSON (mean)"),
            bytes_mean / 1e3,
            "KB",
        );
        report.info(
            &format!("n{n}_events"),
            &format!("N={n}: watch events per replica, {objects} changes (mean)"),
            events_mean,
            "events",
        );
        report.info(
            &format!("n{n}_events_max"),
            &format!("N={n}: watch events per replica, {objects} changes (max)"),
            events_max,
            "events",
        );
        report.info(
            &format!("n{n}_events_total"),
            &format!("N={n}: watch events per replica, whole run (mean)"),
            total_mean,
            "events",
        );
        report.info(&format!("n{n}_lists"), &format!("N={n}: watches started per replica (mean)"), lists_mean, "lists");
        let join = &run.join;
        let joined = format!("N={n}: one more replica joins: shared, cached and reconciled");
        report.info(&format!("n{n}_join_s"), &joined, join.time.as_secs_f64(), "s");
        report.info(
            &format!("n{n}_join_gained"),
            &format!("N={n}: objects the joiner took over"),
            join.gained as f64,
            "objects",
        );
        let relisted = format!("N={n}: events per replica already there, during the join (mean)");
        report.info(&format!("n{n}_join_events"), &relisted, join.events_others, "events");
        let restarts = format!("N={n}: watches started per replica already there, during the join (mean)");
        report.info(&format!("n{n}_join_lists"), &restarts, join.lists_others, "lists");
        if n > 1 {
            let singleton_cached = singleton.per_replica[0].cached as f64;
            report.info(
                &format!("n{n}_cached_share"),
                &format!("N={n}: cache max / singleton's"),
                objects_max / singleton_cached,
                "x",
            );
            let singleton_events = singleton.per_replica[0].events_throughput as f64;
            report.info(
                &format!("n{n}_events_share"),
                &format!("N={n}: events max / singleton's"),
                events_max / singleton_events,
                "x",
            );
        }
    }
    let five = &runs[2];
    let speedup = singleton.throughput_time.as_secs_f64() / five.throughput_time.as_secs_f64();
    report.info("speedup_5", "throughput N=5 / N=1", speedup, "x");
    report.goal("time_ratio_5", "time N=5 / time N=1 (goal: speedup >= 4.5x)", 1.0 / speedup, "x", 1.0 / 4.5);
    report.note(format!(
        "{} ConfigMaps, {PARTITIONS} partitions, reconcile = {} ms sleep, concurrency {} per replica \
         (capacity {:.0}/s per replica), steady load {:.0} % of capacity for {} s",
        settings.objects,
        settings.call.as_millis(),
        settings.concurrency,
        f64::from(settings.concurrency) / settings.call.as_secs_f64(),
        settings.load * 100.0,
        settings.steady.as_secs()
    ));
    report.note("replicas are in this process: memory is the cache's content (objects, JSON bytes), not RSS");
    report.extra("objects", json!(settings.objects));
    report.print();
}
