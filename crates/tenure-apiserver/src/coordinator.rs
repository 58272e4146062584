//! The coordinator of Coordinated Leader Election (KEP-4355), running inside the server as
//! kube-apiserver runs its leader-election controller, so that clients of LeaseCandidates can be
//! tested without a cluster.
//!
//! It watches LeaseCandidates and Leases in the store, decides with [`crate::election::decide`] for
//! every Lease that has candidates (again when a ping's deadline passes, the Lease expires or a
//! candidate is due for collection) and carries the decision out on the store itself: every write
//! is a compare-and-swap on the `resourceVersion` the decision was made on, so a concurrent client
//! write is never overwritten; on a conflict it decides again from the newer state.
//!
//! What a candidate sees: its LeaseCandidate's `spec.pingTime` set when the coordinator needs to
//! know it is alive (it must answer by setting `spec.renewTime` to a time at or after the ping
//! within [`CoordinatorConfig::ping_timeout`]); the Lease written with `holderIdentity` = its
//! LeaseCandidate's name when it is elected; `spec.preferredHolder` set on the Lease it holds when a
//! better candidate is alive, after which it is expected to release the Lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::election::{self, Action, Candidate, LeaseState, Timers, OLDEST_EMULATION_VERSION};
use crate::errors::ApiError;
use crate::resources;
use crate::store::{ChangeType, DeletePreconditions, Store, WatchMessage, WatchStart};

/// How the in-server coordinator runs; part of [`crate::ApiServerConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Whether the coordinator runs. It acts only on Leases that have LeaseCandidates, so it changes
    /// nothing for clients that do not create any.
    pub enabled: bool,
    /// The `leaseDurationSeconds` of the term it gives an elected candidate, who then renews with
    /// its own (whole seconds, at least one).
    pub lease_duration: Duration,
    /// A candidate renewed longer ago than this is pinged before it can be elected (upstream: 5 s).
    pub ping_after: Duration,
    /// How long a pinged candidate has to answer by renewing (upstream: 5 s).
    pub ping_timeout: Duration,
    /// A candidate not renewed for this long is deleted (upstream: 30 min); one quiet for half of it
    /// is pinged first.
    pub candidate_expiry: Duration,
}

impl Default for CoordinatorConfig {
    /// Enabled, with upstream's timings and a 15 s term (the lease duration Kubernetes components
    /// default to; upstream's controller writes 5 s).
    fn default() -> Self {
        CoordinatorConfig {
            enabled: true,
            lease_duration: Duration::from_secs(15),
            ping_after: Duration::from_secs(5),
            ping_timeout: Duration::from_secs(5),
            candidate_expiry: Duration::from_secs(30 * 60),
        }
    }
}

impl CoordinatorConfig {
    fn timers(&self) -> Timers {
        Timers { ping_after: self.ping_after, ping_timeout: self.ping_timeout, candidate_expiry: self.candidate_expiry }
    }

    fn lease_duration_seconds(&self) -> i64 {
        i64::try_from(self.lease_duration.as_secs()).unwrap_or(i64::from(i32::MAX)).clamp(1, i64::from(i32::MAX))
    }
}

/// What the coordinator has done so far, for tests and operators: the server has no metrics
/// endpoint, so these are read through [`crate::ApiServer::coordinator_metrics`] and named, in
/// [`CoordinatorMetrics::samples`], as upstream exports them where upstream has an equivalent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CoordinatorMetrics {
    /// Leases queued for a decision (deduplicated while queued), as upstream's
    /// `workqueue_adds_total{name="leader-election-controller"}` counts them.
    pub queue_adds: u64,
    /// Decisions made again because a write lost a compare-and-swap, as upstream's
    /// `workqueue_retries_total{name="leader-election-controller"}` counts requeues.
    pub retries: u64,
    /// Leases given to a candidate in a new term.
    pub elections: u64,
    /// Pings written to candidates.
    pub pings: u64,
    /// Writes of a Lease's `preferredHolder` (set or cleared).
    pub preferred_holder_updates: u64,
    /// Candidates deleted after [`CoordinatorConfig::candidate_expiry`].
    pub candidates_collected: u64,
    /// Warnings about candidates (or Leases) left out: unknown strategy, unparseable versions,
    /// conflicting strategies.
    pub candidates_ignored: u64,
}

impl CoordinatorMetrics {
    /// The counters as Prometheus samples. Upstream's controller exports nothing of its own, only
    /// its work queue's metrics (the first two); the others are named after its controller,
    /// `leader-election-controller`.
    pub fn samples(&self) -> Vec<(&'static str, u64)> {
        vec![
            (r#"workqueue_adds_total{name="leader-election-controller"}"#, self.queue_adds),
            (r#"workqueue_retries_total{name="leader-election-controller"}"#, self.retries),
            ("leader_election_controller_elections_total", self.elections),
            ("leader_election_controller_pings_total", self.pings),
            ("leader_election_controller_preferred_holder_updates_total", self.preferred_holder_updates),
            ("leader_election_controller_candidates_collected_total", self.candidates_collected),
            ("leader_election_controller_candidates_ignored_total", self.candidates_ignored),
        ]
    }
}

/// The live counters behind [`CoordinatorMetrics`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    queue_adds: AtomicU64,
    retries: AtomicU64,
    elections: AtomicU64,
    pings: AtomicU64,
    preferred_holder_updates: AtomicU64,
    candidates_collected: AtomicU64,
    candidates_ignored: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> CoordinatorMetrics {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CoordinatorMetrics {
            queue_adds: read(&self.queue_adds),
            retries: read(&self.retries),
            elections: read(&self.elections),
            pings: read(&self.pings),
            preferred_holder_updates: read(&self.preferred_holder_updates),
            candidates_collected: read(&self.candidates_collected),
            candidates_ignored: read(&self.candidates_ignored),
        }
    }
}

/// A Lease by namespace and name.
type LeaseKey = (String, String);

/// `MicroTime` as Kubernetes writes it.
fn micro_time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The Lease after an election of `holder` at `now`: a new term, with the coordinator's strategy,
/// without a preferred holder; `leaseTransitions` counts changes of holder.
pub(crate) fn elected_lease(
    existing: Option<&Value>,
    namespace: &str,
    name: &str,
    holder: &str,
    now: DateTime<Utc>,
    duration_seconds: i64,
) -> Value {
    let mut lease = existing.cloned().unwrap_or_else(|| json!({"metadata": {"name": name, "namespace": namespace}}));
    if !lease["spec"].is_object() {
        lease["spec"] = json!({});
    }
    let spec = &mut lease["spec"];
    let changed = i64::from(spec["holderIdentity"].as_str() != Some(holder));
    let transitions = existing.map_or(0, |_| spec["leaseTransitions"].as_i64().unwrap_or(0) + changed);
    spec["holderIdentity"] = json!(holder);
    spec["leaseDurationSeconds"] = json!(duration_seconds);
    spec["acquireTime"] = json!(micro_time(now));
    spec["renewTime"] = json!(micro_time(now));
    spec["leaseTransitions"] = json!(transitions);
    spec["strategy"] = json!(OLDEST_EMULATION_VERSION);
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("preferredHolder");
    }
    lease
}

/// The coordinator's state: a cache of the candidates (as an informer keeps one), the Leases due
/// for a decision and when each must be looked at again.
struct Coordinator {
    store: Arc<Store>,
    config: CoordinatorConfig,
    counters: Arc<Counters>,
    /// Candidates by the Lease they compete for, then by name.
    candidates: BTreeMap<LeaseKey, BTreeMap<String, Arc<Value>>>,
    /// The Lease each candidate (by namespace and name) competes for.
    lease_of: HashMap<(String, String), String>,
    dirty: BTreeSet<LeaseKey>,
    rechecks: BTreeMap<LeaseKey, DateTime<Utc>>,
    /// What was last warned about, per candidate (its resourceVersion) or Lease (the reason), so that
    /// a warning is logged once, not at every decision.
    warned: HashMap<(String, String), String>,
}

/// Starts the coordinator on the current Tokio runtime, if enabled; it stops with `shutdown` or
/// when the store closes.
pub(crate) fn spawn(
    store: Arc<Store>,
    config: CoordinatorConfig,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) -> Option<JoinHandle<()>> {
    if !config.enabled {
        return None;
    }
    let coordinator = Coordinator {
        store,
        config,
        counters,
        candidates: BTreeMap::new(),
        lease_of: HashMap::new(),
        dirty: BTreeSet::new(),
        rechecks: BTreeMap::new(),
        warned: HashMap::new(),
    };
    Some(tokio::spawn(coordinator.run(shutdown)))
}

impl Coordinator {
    async fn run(mut self, shutdown: CancellationToken) {
        let candidates = self.store.watch(resources::lease_candidates(), None, WatchStart::CurrentState, false);
        let leases = self.store.watch(resources::leases(), None, WatchStart::CurrentState, false);
        let ((first_candidates, mut candidate_changes), (first_leases, mut lease_changes)) = match (candidates, leases)
        {
            (Ok(candidates), Ok(leases)) => (candidates, leases),
            (Err(error), _) | (_, Err(error)) => {
                tracing::warn!(%error, "the leader-election coordinator cannot watch; it does not run");
                return;
            }
        };
        first_candidates.iter().for_each(|message| self.candidate_changed(message));
        first_leases.iter().for_each(|message| self.lease_changed(message));
        loop {
            // Decide on the newest state: take in every change already committed first.
            while let Ok(message) = candidate_changes.try_recv() {
                self.candidate_changed(&message);
            }
            while let Ok(message) = lease_changes.try_recv() {
                self.lease_changed(&message);
            }
            if self.decide_dirty() {
                // A write lost a race: the change that beat it is queued, take it in and decide again.
                tokio::task::yield_now().await;
                continue;
            }
            let wake = self.next_recheck();
            let recheck = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                message = candidate_changes.recv() => match message {
                    Some(message) => self.candidate_changed(&message),
                    None => return,
                },
                message = lease_changes.recv() => match message {
                    Some(message) => self.lease_changed(&message),
                    None => return,
                },
                () = recheck => self.queue_due(),
            }
        }
    }

    fn queue(&mut self, key: LeaseKey) {
        if self.dirty.insert(key) {
            bump(&self.counters.queue_adds);
        }
    }

    fn candidate_changed(&mut self, message: &WatchMessage) {
        let WatchMessage::Change(change) = message else { return };
        let namespace = change.namespace.clone();
        let name = change.object["metadata"]["name"].as_str().unwrap_or("").to_string();
        let id = (namespace.clone(), name.clone());
        // leaseName is immutable, but a candidate moving to another Lease must leave the first.
        if let Some(previous) = self.lease_of.remove(&id) {
            let key = (namespace.clone(), previous);
            if let Some(group) = self.candidates.get_mut(&key) {
                group.remove(&name);
                if group.is_empty() {
                    self.candidates.remove(&key);
                }
            }
            self.queue(key);
        }
        if change.change_type == ChangeType::Deleted {
            self.warned.remove(&id);
            return;
        }
        let lease = change.object["spec"]["leaseName"].as_str().unwrap_or("").to_string();
        let key = (namespace, lease.clone());
        self.candidates.entry(key.clone()).or_default().insert(name, change.object.clone());
        self.lease_of.insert(id, lease);
        self.queue(key);
    }

    fn lease_changed(&mut self, message: &WatchMessage) {
        let WatchMessage::Change(change) = message else { return };
        let name = change.object["metadata"]["name"].as_str().unwrap_or("").to_string();
        let key = (change.namespace.clone(), name);
        if self.candidates.contains_key(&key) {
            self.queue(key);
        }
    }

    /// When the earliest recheck is due, on Tokio's clock (a millisecond late, to be past it; at
    /// most a day ahead, as far-off times are "never").
    fn next_recheck(&self) -> Option<tokio::time::Instant> {
        let earliest = *self.rechecks.values().min()?;
        let wait = (earliest - Utc::now()).to_std().unwrap_or_default().min(Duration::from_secs(86_400));
        let wait = wait + Duration::from_millis(1);
        Some(tokio::time::Instant::now() + wait)
    }

    fn queue_due(&mut self) {
        let now = Utc::now();
        let due: Vec<LeaseKey> =
            self.rechecks.iter().filter(|(_, at)| **at <= now).map(|(key, _)| key.clone()).collect();
        for key in due {
            self.rechecks.remove(&key);
            self.queue(key);
        }
    }

    /// Decides for every queued Lease; true if a write lost a race and its Lease is queued again.
    fn decide_dirty(&mut self) -> bool {
        let mut raced = false;
        while let Some(key) = self.dirty.pop_first() {
            if self.decide(&key) {
                bump(&self.counters.retries);
                raced = true;
                self.queue(key);
                break;
            }
        }
        raced
    }

    /// Decides for one Lease and carries the decision out; true if a write lost a race.
    fn decide(&mut self, key: &LeaseKey) -> bool {
        let (namespace, lease_name) = key;
        self.rechecks.remove(key);
        let lease = match self.store.get(resources::leases(), namespace, lease_name) {
            Ok(lease) => Some(lease),
            Err(error) if error.code == 404 => None,
            Err(error) => {
                tracing::warn!(%error, namespace, lease = lease_name, "cannot read the Lease");
                return false;
            }
        };
        let objects = self.candidates.get(key).cloned().unwrap_or_default();
        let candidates: Vec<Candidate> = objects.values().map(|object| Candidate::from_object(object)).collect();
        let state = lease.as_deref().map(LeaseState::from_object);
        let now = Utc::now();
        let step = election::decide(state.as_ref(), &candidates, now, &self.config.timers());
        for (candidate, why) in &step.ignored {
            self.warn_once(namespace, lease_name, candidate, why, &objects);
        }
        if let Some(at) = step.recheck_at {
            self.rechecks.insert(key.clone(), at);
        }
        for action in &step.actions {
            let result = self.carry_out(action, namespace, lease_name, lease.as_deref(), &objects, now);
            match result {
                Ok(()) => {}
                Err(error) if error.code == 409 => {
                    tracing::debug!(%error, namespace, lease = lease_name, ?action, "lost a race; deciding again");
                    return true;
                }
                // Gone meanwhile (its deletion is queued and brings a new decision), or refused:
                // either way the remaining actions were decided on a state that is no more.
                Err(error) => {
                    tracing::warn!(%error, namespace, lease = lease_name, ?action, "could not carry out");
                    return false;
                }
            }
        }
        false
    }

    fn carry_out(
        &self,
        action: &Action,
        namespace: &str,
        lease_name: &str,
        lease: Option<&Value>,
        candidates: &BTreeMap<String, Arc<Value>>,
        now: DateTime<Utc>,
    ) -> Result<(), ApiError> {
        let candidate_type = resources::lease_candidates();
        let lease_type = resources::leases();
        match action {
            Action::Ping(name) => {
                let Some(object) = candidates.get(name) else { return Ok(()) };
                let mut pinged = (**object).clone();
                pinged["spec"]["pingTime"] = json!(micro_time(now));
                self.store.update(candidate_type, namespace, name, pinged)?;
                bump(&self.counters.pings);
                tracing::debug!(namespace, candidate = name, "pinged");
            }
            Action::Collect(name) => {
                let Some(object) = candidates.get(name) else { return Ok(()) };
                let version = object["metadata"]["resourceVersion"].as_str().map(str::to_string);
                let preconditions = DeletePreconditions { resource_version: version, uid: None };
                self.store.delete(candidate_type, namespace, name, &preconditions)?;
                bump(&self.counters.candidates_collected);
                tracing::info!(namespace, candidate = name, "deleted a LeaseCandidate that stopped renewing");
            }
            Action::Elect(holder) => {
                let duration = self.config.lease_duration_seconds();
                let elected = elected_lease(lease, namespace, lease_name, holder, now, duration);
                match lease {
                    Some(_) => drop(self.store.update(lease_type, namespace, lease_name, elected)?),
                    None => drop(self.store.create(lease_type, namespace, elected)?),
                }
                bump(&self.counters.elections);
                tracing::info!(namespace, lease = lease_name, holder, "elected");
            }
            Action::SetPreferredHolder(preferred) => {
                let Some(lease) = lease else { return Ok(()) };
                let mut marked = lease.clone();
                if !marked["spec"].is_object() {
                    marked["spec"] = json!({});
                }
                match preferred {
                    Some(preferred) => {
                        marked["spec"]["preferredHolder"] = json!(preferred);
                        marked["spec"]["strategy"] = json!(OLDEST_EMULATION_VERSION);
                    }
                    None => {
                        if let Some(spec) = marked["spec"].as_object_mut() {
                            spec.remove("preferredHolder");
                        }
                    }
                }
                self.store.update(lease_type, namespace, lease_name, marked)?;
                bump(&self.counters.preferred_holder_updates);
                tracing::info!(namespace, lease = lease_name, ?preferred, "preferred holder");
            }
        }
        Ok(())
    }

    /// Logs why a candidate (or, with an empty name, the Lease) is left out, once per version of it.
    fn warn_once(
        &mut self,
        namespace: &str,
        lease_name: &str,
        candidate: &str,
        why: &str,
        objects: &BTreeMap<String, Arc<Value>>,
    ) {
        let (id, fingerprint) = if candidate.is_empty() {
            ((namespace.to_string(), format!("lease/{lease_name}")), why.to_string())
        } else {
            let version = objects.get(candidate).and_then(|o| o["metadata"]["resourceVersion"].as_str()).unwrap_or("");
            ((namespace.to_string(), candidate.to_string()), version.to_string())
        };
        if self.warned.get(&id) == Some(&fingerprint) {
            return;
        }
        self.warned.insert(id, fingerprint);
        bump(&self.counters.candidates_ignored);
        if candidate.is_empty() {
            tracing::warn!(namespace, lease = lease_name, "the coordinator leaves the Lease alone: {why}");
        } else {
            tracing::warn!(namespace, lease = lease_name, candidate, "the coordinator ignores a LeaseCandidate: {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_election_starts_a_new_term_and_counts_changes_of_holder() {
        let now = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap();
        let created = elected_lease(None, "ns", "l", "a", now, 15);
        assert_eq!(created["metadata"], json!({"name": "l", "namespace": "ns"}));
        assert_eq!(
            created["spec"],
            json!({"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": "2023-11-14T22:13:20.123456Z",
                "renewTime": "2023-11-14T22:13:20.123456Z", "leaseTransitions": 0, "strategy": "OldestEmulationVersion"})
        );
        let existing = json!({"metadata": {"name": "l", "resourceVersion": "7", "labels": {"k": "v"}},
            "spec": {"holderIdentity": "b", "leaseTransitions": 3, "preferredHolder": "a", "strategy": "OldestEmulationVersion"}});
        let moved = elected_lease(Some(&existing), "ns", "l", "a", now, 15);
        assert_eq!(moved["spec"]["leaseTransitions"], 4);
        assert_eq!(moved["spec"].get("preferredHolder"), None);
        assert_eq!(moved["metadata"]["resourceVersion"], "7", "a compare-and-swap on the version decided on");
        assert_eq!(moved["metadata"]["labels"]["k"], "v");
        let again = elected_lease(Some(&moved), "ns", "l", "a", now, 15);
        assert_eq!(again["spec"]["leaseTransitions"], 4, "the same holder in a new term is no transition");
        let garbled = elected_lease(Some(&json!({"spec": null})), "ns", "l", "a", now, 15);
        assert_eq!(garbled["spec"]["holderIdentity"], "a");
    }

    #[test]
    fn metrics_are_named_as_upstream_exports_its_controllers() {
        let counters = Counters::default();
        bump(&counters.retries);
        let samples = counters.snapshot().samples();
        assert_eq!(samples[1], (r#"workqueue_retries_total{name="leader-election-controller"}"#, 1));
        assert!(samples
            .iter()
            .all(|(name, _)| name.starts_with("workqueue_") || name.starts_with("leader_election_controller_")));
    }
}
