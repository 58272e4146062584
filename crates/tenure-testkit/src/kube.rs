//! The Kubernetes test cluster: the project's in-memory API server with a kubeconfig for it,
//! candidates that run like separate processes (each elector on a runtime of its own, so a crash is
//! the runtime vanishing without a release), and a monitor that samples every elector's leadership
//! at every change.
//!
//! Why here: the Kubernetes lock tests and the HA runtime's Kubernetes tests run on the same
//! cluster (feature `kube`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tenure::{Elector, Leadership, Term, Timing};
use tenure_apiserver::resources::{find_resource_type, ResourceType};
use tenure_apiserver::store::DeletePreconditions;
use tenure_apiserver::{ApiServer, ApiServerConfig, Verb};
use tenure_kube::{user_agent, KubeLock, KubeLockConfig, LeadershipEvents};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long any single expected event may take before a test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// Every lock kind, as the URL names them.
pub const KINDS: [&str; 5] = ["leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases"];

/// Short election timing: 1 s lease, 600 ms renew deadline, 200 ms retry, 300 ms call timeout.
pub fn timing() -> Timing {
    Timing::new(Duration::from_secs(1), Duration::from_millis(600), Duration::from_millis(200)).unwrap()
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The resource types the lock objects are stored as.
pub fn resource(plural: &str) -> &'static ResourceType {
    let group = if plural == "leases" { "coordination.k8s.io" } else { "" };
    find_resource_type(group, "v1", plural).unwrap()
}

/// The object kinds (plurals) a lock kind keeps its record in.
pub fn objects_of(kind: &str) -> Vec<&'static str> {
    match kind {
        "endpointsleases" => vec!["endpoints", "leases"],
        "configmapsleases" => vec!["configmaps", "leases"],
        other => vec![KINDS.iter().copied().find(|k| *k == other).unwrap()],
    }
}

/// An API server and a kubeconfig pointing at it.
pub struct Cluster {
    /// The API server, for faults, request counts and direct reads of the store.
    pub server: ApiServer,
    kubeconfig: PathBuf,
}

impl Cluster {
    /// A cluster whose server runs with the default configuration.
    pub async fn start() -> Cluster {
        Cluster::start_with(ApiServerConfig::default()).await
    }

    /// A cluster whose server runs with `config` (a small event window, short bookmarks...).
    pub async fn start_with(config: ApiServerConfig) -> Cluster {
        init_logging();
        let server = ApiServer::start(config).await.unwrap();
        let kubeconfig = std::env::temp_dir().join(format!("tenure-kube-test-{}.kubeconfig", server.address().port()));
        server.write_kubeconfig(&kubeconfig).unwrap();
        Cluster { server, kubeconfig }
    }

    /// A client of this cluster for `identity` (its own connection and user agent).
    pub async fn client(&self, identity: &str) -> kube::Client {
        let options = tenure_kube::ClusterOptions { kubeconfig: Some(self.kubeconfig.clone()), ..Default::default() };
        options.client(identity).await.unwrap()
    }

    /// The configuration of the lock `kube://default/KIND/NAME` on this cluster.
    pub fn lock_config(&self, kind: &str, name: &str) -> KubeLockConfig {
        KubeLockConfig::from_url(&format!("kube://default/{kind}/{name}")).unwrap().kubeconfig(&self.kubeconfig)
    }

    /// A lock for direct calls, on the test's runtime.
    pub async fn lock(&self, kind: &str, name: &str, identity: &str) -> KubeLock {
        self.lock_config(kind, name).connect(identity).await.unwrap()
    }

    /// A candidate running an elector on `kube://default/KIND/NAME` in a runtime of its own, posting
    /// leader election events.
    pub async fn candidate(&self, kind: &str, name: &str, identity: &str) -> Candidate {
        Candidate::start(self.lock_config(kind, name), identity).await
    }

    /// A client that counts as nobody's candidate.
    pub async fn observer(&self) -> kube::Client {
        self.lock_config("leases", "x").cluster.client("test-observer").await.unwrap()
    }

    /// The stored object, as JSON.
    pub fn object(&self, plural: &str, name: &str) -> Option<Value> {
        self.server.store().get(resource(plural), "default", name).ok().map(|o| (*o).clone())
    }

    /// Replaces the stored object as another writer would (no compare-and-swap).
    pub fn overwrite(&self, plural: &str, name: &str, change: impl FnOnce(&mut Value)) {
        let mut object = self.object(plural, name).expect("the object to overwrite exists");
        object["metadata"].as_object_mut().unwrap().remove("resourceVersion");
        change(&mut object);
        self.server.store().update(resource(plural), "default", name, object).unwrap();
    }

    /// Creates an object as another writer would.
    pub fn create(&self, plural: &str, object: Value) {
        self.server.store().create(resource(plural), "default", object).unwrap();
    }

    /// Deletes the stored object, if there.
    pub fn delete(&self, plural: &str, name: &str) {
        let _ = self.server.store().delete(resource(plural), "default", name, &DeletePreconditions::default());
    }

    /// Requests of `verb` the candidate `identity` made since the counts were last reset.
    pub fn requests(&self, identity: &str, verb: Verb) -> u64 {
        self.server.faults().request_count(&user_agent(identity), verb)
    }
}

impl std::ops::Deref for Cluster {
    type Target = ApiServer;

    fn deref(&self) -> &ApiServer {
        &self.server
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// One candidate, as if it were a process of its own: its elector, lock client and event task run
/// on a runtime that [`Candidate::crash`] drops without letting anything finish.
pub struct Candidate {
    /// Its identity.
    pub identity: String,
    /// Its lock, for direct calls.
    pub lock: KubeLock,
    elector: Option<Arc<Elector>>,
    events: Option<LeadershipEvents>,
    runtime: Option<tokio::runtime::Runtime>,
    crashed: Arc<AtomicBool>,
}

impl Candidate {
    /// Starts a candidate on the lock `config` describes, as `identity`.
    pub async fn start(config: KubeLockConfig, identity: &str) -> Candidate {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("candidate-{identity}"))
            .enable_all()
            .build()
            .unwrap();
        let id = identity.to_owned();
        let lock = runtime.spawn(async move { config.connect(&id).await }).await.unwrap().unwrap();
        let (elector, events) = {
            let _inside = runtime.enter();
            let elector = Elector::builder(identity, lock.clone()).timing(timing()).spawn().unwrap();
            let events = lock.record_events(&elector);
            (elector, events)
        };
        Candidate {
            identity: identity.to_owned(),
            lock,
            elector: Some(Arc::new(elector)),
            events: Some(events),
            runtime: Some(runtime),
            crashed: Arc::new(AtomicBool::new(false)),
        }
    }

    fn elector(&self) -> &Elector {
        self.elector.as_ref().expect("the candidate is running")
    }

    /// Leadership as this candidate's elector publishes it.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.elector().subscribe()
    }

    /// Whether the candidate leads now, by its own clock (self-fencing deadline included).
    pub fn is_leader(&self) -> Option<Term> {
        self.elector().is_leader()
    }

    /// Its elector's counters.
    pub fn stats(&self) -> tenure::ElectorStats {
        self.elector().stats()
    }

    /// Resigns: releases the lock and stays a candidate.
    pub async fn resign(&self) {
        self.elector().resign().await.unwrap();
    }

    /// Shuts down gracefully: releases the lock, lets the last event go out.
    pub async fn shutdown(mut self) {
        let mut elector = self.elector.take().unwrap();
        // The monitor holds only weak references, upgraded for an instant while sampling.
        let elector = loop {
            match Arc::try_unwrap(elector) {
                Ok(elector) => break elector,
                Err(shared) => {
                    elector = shared;
                    tokio::task::yield_now().await;
                }
            }
        };
        elector.shutdown().await.unwrap();
        if let Some(events) = self.events.take() {
            events.finish().await;
        }
    }

    /// Stops at once, as a killed process does: nothing is released, nothing more is sent.
    pub fn crash(mut self) {
        self.crashed.store(true, Ordering::SeqCst);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

struct Watched {
    identity: String,
    elector: Weak<Elector>,
    leadership: watch::Receiver<Leadership>,
    crashed: Arc<AtomicBool>,
}

impl Watched {
    /// Whether it leads now: by its elector's clock while the handle exists, by its last published
    /// role while it shuts down, never once crashed.
    fn leading(&self) -> Option<Term> {
        if self.crashed.load(Ordering::SeqCst) {
            return None;
        }
        match self.elector.upgrade() {
            Some(elector) => elector.is_leader(),
            None => {
                let leadership = self.leadership.borrow();
                leadership.is_leader().then(|| leadership.term.unwrap_or(Term(0)))
            }
        }
    }
}

#[derive(Default)]
struct MonitorState {
    watched: Vec<Watched>,
    violations: Vec<String>,
    /// Every tenure seen, in order: (identity, term).
    tenures: Vec<(String, Term)>,
    samples: u64,
    unknown_leader_allowed: bool,
}

/// Samples the leadership of every candidate it watches whenever any of them changes, and records
/// a violation when two lead at once or a new tenure's term is not above every earlier one.
#[derive(Clone)]
pub struct Monitor {
    state: Arc<Mutex<MonitorState>>,
    changes: Arc<watch::Sender<u64>>,
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

impl Monitor {
    /// A monitor that watches nobody yet.
    pub fn new() -> Monitor {
        Monitor { state: Arc::default(), changes: Arc::new(watch::channel(0).0) }
    }

    /// A monitor for candidates of mixed kinds, where multi-lock candidates may name the leader
    /// [`tenure_kube::UNKNOWN_LEADER`] while the leader writes only the object of its own kind.
    pub fn for_mixed_kinds() -> Monitor {
        let monitor = Monitor::new();
        monitor.state.lock().unwrap().unknown_leader_allowed = true;
        monitor
    }

    /// Starts sampling at every change of `candidate`'s leadership.
    pub fn watch(&self, candidate: &Candidate) {
        let mut leadership = candidate.leadership();
        self.state.lock().unwrap().watched.push(Watched {
            identity: candidate.identity.clone(),
            elector: Arc::downgrade(candidate.elector.as_ref().unwrap()),
            leadership: leadership.clone(),
            crashed: candidate.crashed.clone(),
        });
        let monitor = self.clone();
        monitor.sample();
        tokio::spawn(async move {
            while leadership.changed().await.is_ok() {
                monitor.sample();
            }
            monitor.sample();
        });
    }

    /// Takes one sample now and wakes whoever waits for a condition.
    pub fn sample(&self) {
        let mut state = self.state.lock().unwrap();
        state.samples += 1;
        let leaders: Vec<(String, Term)> =
            state.watched.iter().filter_map(|w| w.leading().map(|t| (w.identity.clone(), t))).collect();
        if leaders.len() > 1 {
            state.violations.push(format!("two leaders at once: {leaders:?}"));
        }
        for (identity, term) in leaders {
            if state.tenures.last() != Some(&(identity.clone(), term)) {
                if let Some(highest) = state.tenures.iter().map(|(_, t)| *t).max() {
                    if term <= highest && !state.tenures.contains(&(identity.clone(), term)) {
                        state.violations.push(format!("{identity} leads with term {term}, not above {highest}"));
                    }
                }
                if !state.tenures.contains(&(identity.clone(), term)) {
                    state.tenures.push((identity, term));
                }
            }
        }
        drop(state);
        self.changes.send_modify(|n| *n += 1);
    }

    /// The candidates leading now.
    pub fn leaders(&self) -> Vec<(String, Term)> {
        let state = self.state.lock().unwrap();
        state.watched.iter().filter_map(|w| w.leading().map(|t| (w.identity.clone(), t))).collect()
    }

    /// What every live candidate publishes now.
    pub fn published(&self) -> Vec<(String, Leadership)> {
        let state = self.state.lock().unwrap();
        let live = state.watched.iter().filter(|w| !w.crashed.load(Ordering::SeqCst) && w.elector.strong_count() > 0);
        live.map(|w| (w.identity.clone(), w.leadership.borrow().clone())).collect()
    }

    /// Every tenure seen so far, in order.
    pub fn tenures(&self) -> Vec<(String, Term)> {
        self.state.lock().unwrap().tenures.clone()
    }

    /// Waits (at most [`PATIENCE`]) until `condition` holds, re-checking at every change and every
    /// 50 ms (a fencing deadline passes without a change). Returns when it held.
    pub async fn until(&self, what: &str, condition: impl Fn(&Monitor) -> bool) -> Instant {
        let deadline = Instant::now() + PATIENCE;
        let mut changes = self.changes.subscribe();
        loop {
            if condition(self) {
                return Instant::now();
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out waiting until {what}; leaders {:?}, tenures {:?}, published {:#?}",
                    self.leaders(),
                    self.tenures(),
                    self.published()
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), changes.changed()).await;
        }
    }

    /// Waits until exactly one candidate leads and every live candidate names it as the leader.
    pub async fn one_leader(&self) -> (String, Term) {
        self.until("one leader, known to all", |m| m.agreed_leader().is_some()).await;
        self.agreed_leader().unwrap()
    }

    fn agreed_leader(&self) -> Option<(String, Term)> {
        let leaders = self.leaders();
        let [(leader, term)] = leaders.as_slice() else { return None };
        let state = self.state.lock().unwrap();
        let live = state.watched.iter().filter(|w| !w.crashed.load(Ordering::SeqCst) && w.elector.strong_count() > 0);
        let agreed = live.map(|w| w.leadership.borrow().clone()).all(|l| {
            let knows = l.leader.as_deref() == Some(leader) && l.term == Some(*term);
            // Multi-lock candidates whose two objects disagree (the leader writes only one) say so.
            knows || (state.unknown_leader_allowed && l.leader.as_deref() == Some(tenure_kube::UNKNOWN_LEADER))
        });
        agreed.then(|| (leader.clone(), *term))
    }

    /// Fails the test if two candidates ever led at once or a term went backwards.
    pub fn assert_safe(&self) {
        let state = self.state.lock().unwrap();
        assert!(state.samples > 0);
        assert!(state.violations.is_empty(), "safety violated: {:#?}", state.violations);
    }
}

/// Starts candidates `a`, `b`, `c`... on one lock and a monitor watching them.
pub async fn candidates(cluster: &Cluster, kind: &str, name: &str, count: usize) -> (Vec<Candidate>, Monitor) {
    let monitor = Monitor::new();
    let mut all = Vec::new();
    for i in 0..count {
        let identity = format!("{kind}-{}", (b'a' + i as u8) as char);
        let candidate = cluster.candidate(kind, name, &identity).await;
        monitor.watch(&candidate);
        all.push(candidate);
    }
    (all, monitor)
}

/// Removes and returns the candidate named `identity`.
pub fn take(candidates: &mut Vec<Candidate>, identity: &str) -> Candidate {
    let index = candidates.iter().position(|c| c.identity == identity).unwrap();
    candidates.remove(index)
}
