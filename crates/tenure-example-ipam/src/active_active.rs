//! Active/Active: every replica joins a group on etcd and handles only the Pods whose key
//! (`namespace/name`) falls in a partition it owns.
//!
//! Why it is shaped so:
//!
//! - **The group is on etcd** (`tenure_etcd::EtcdGroupStore`), the cluster the pool is kept in: one
//!   system to run and to lose. If etcd is unreachable, no pool write can succeed anyway, and
//!   membership lapsing at the same moment stops the work cleanly instead of letting it fail call
//!   after call.
//! - **Fencing per partition**: a handler holds the partition's [`PartitionGuard`] and writes to the
//!   pool under [`Fence::Partition`] with the guard's term. When this replica gains a partition it
//!   first raises the partition's fence in etcd to its term ([`IpPool::open_partition`]), so a paused
//!   former owner's late write under the older term is refused by etcd itself. The group table is
//!   one JSON document that an etcd comparison cannot look into, hence a fence key per partition.
//! - **Drain**: handlers run one at a time and hold their guard until their last write is done
//!   (and witnessed); tenure-group releases a revoked partition only once its guards are dropped,
//!   so the next owner starts after this one stopped.
//! - **Resume by relist of the owned share, not by checkpoints**: each replica runs one watch of
//!   all Pods from "now" and filters by ownership. When it gains partitions it lists the pool and
//!   the Pods and reconciles those partitions: addresses of Pods that no longer exist are released
//!   (deletions made while nobody owned the partition are not missed), unannotated Pods get one,
//!   orphans are released. The same pass runs every collection period for all owned partitions
//!   (it is the orphan collector) and after every relist of the watch. Why not a checkpoint per
//!   partition: all partitions share one stream of resourceVersions, so resuming partition P from
//!   its own version needs a watch per acquired batch, still bounded by the server's event window,
//!   with the relist as fallback; the pass above is needed for orphans anyway and costs one list of
//!   Pods and one of the pool per batch of acquired partitions.
//! - **No grace period for orphans**: within a replica, handlers and the collection pass run one
//!   at a time, and across replicas partitions are exclusive, so an allocation of an owned
//!   partition that its Pod does not hold (the Pod is gone, or annotated with another address)
//!   has no handler in flight: it is an orphan at once. A paused former owner's late annotate is
//!   refused by the Pod's resourceVersion, which this owner changed when it re-marked the Pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tenure::{Term, Timing};
use tenure_etcd::{EtcdElection, EtcdGroupStore};
use tenure_group::{Group, GroupConfig, PartitionGuard};
use tenure_kube::resume::Backoff;
use tenure_kube::{ResumableWatcher, ResumeConfig, ResumeEvent};

use crate::controller::{
    annotated_ip, client, replace_pod, ControllerConfig, ControllerError, CRASH_EXIT_CODE, CRASH_LABEL, ELECTION,
    IP_ANNOTATION, PENDING_ANNOTATION, POOL_PREFIX,
};
use crate::pool::{Allocation, Fence, IpPool, PoolError};
use crate::witness::{HandlerKind, Outcome, Witness};

/// The group all Active/Active replicas join (its keys are under `ipam/group/`).
pub const GROUP: &str = "ipam/group";

/// What a replica prints (stdout) once its watch has listed and the pass over that list is done:
/// from then on it handles Pod events as they come (the benchmark waits for it).
pub const WATCHING_LINE: &str = "watching Pods";

/// At most this many fences are raised at once when partitions are gained.
const PARALLEL_FENCE_RAISES: usize = 16;

/// Permission to handle one Pod: the partition guard, or (broken mode only) a remembered
/// ownership that was never given back.
enum Permit {
    Guard(PartitionGuard),
    Stale { partition: u32, term: Term },
}

impl Permit {
    fn partition(&self) -> u32 {
        match self {
            Permit::Guard(guard) => guard.partition(),
            Permit::Stale { partition, .. } => *partition,
        }
    }

    fn term(&self) -> Term {
        match self {
            Permit::Guard(guard) => guard.term(),
            Permit::Stale { term, .. } => *term,
        }
    }

    fn fence(&self) -> Fence {
        Fence::Partition { partition: self.partition(), term: self.term() }
    }

    fn check(&self) -> Result<(), Step> {
        match self {
            Permit::Guard(guard) => guard.check().map(|_| ()).map_err(|_| Step::Fenced),
            Permit::Stale { .. } => Ok(()),
        }
    }
}

/// Why a handler stopped early.
enum Step {
    /// The ownership ended (guard invalid, or etcd refused the term).
    Fenced,
    /// The Pod changed or went away.
    Conflict,
    /// A store failed.
    Failed(String),
}

impl From<PoolError> for Step {
    fn from(error: PoolError) -> Step {
        match error {
            PoolError::Fenced(_) | PoolError::NotOpened { .. } => Step::Fenced,
            other => Step::Failed(other.to_string()),
        }
    }
}

impl From<ControllerError> for Step {
    fn from(error: ControllerError) -> Step {
        Step::Failed(error.to_string())
    }
}

/// One Active/Active replica.
struct Replica {
    config: ControllerConfig,
    pods: Api<Pod>,
    pool: IpPool,
    group: Group,
    witness: Witness,
    /// Owned partitions whose fence this replica raised, with the term: work starts only then.
    opened: BTreeMap<u32, Term>,
    /// Broken mode: every partition ever opened, never forgotten.
    remembered: BTreeMap<u32, Term>,
}

/// Runs one Active/Active replica until SIGTERM/SIGINT; then finishes the handler in flight and
/// leaves the group (its partitions are handed over at once).
pub async fn run(config: ControllerConfig) -> Result<(), ControllerError> {
    let connection = EtcdElection::connect(&config.etcd, ELECTION).await?;
    let pool =
        IpPool::new(connection, POOL_PREFIX, config.pool_base, config.pool_size).with_call_delay(config.pool_delay);
    let store = EtcdGroupStore::connect(&config.etcd, GROUP).await?;
    let timing = Timing::from_ttl(config.ttl).map_err(|e| ControllerError::Group(e.to_string()))?;
    let group_config = GroupConfig { timing, partition_count: config.partitions, weight: 1 };
    group_config.validate().map_err(|e| ControllerError::Group(e.to_string()))?;
    let group = Group::builder(config.identity.clone(), store)
        .config(group_config)
        .join()
        .map_err(|e| ControllerError::Group(e.to_string()))?;
    let witness = Witness::open(&config.identity, config.witness.as_deref())
        .map_err(|e| ControllerError::Witness(format!("{:?}", config.witness), e))?;
    let pods: Api<Pod> = Api::namespaced(client(&config)?, &config.namespace);
    let mut replica = Replica {
        pods: pods.clone(),
        pool,
        group,
        witness,
        opened: BTreeMap::new(),
        remembered: BTreeMap::new(),
        config,
    };
    let watch = ResumeConfig::default()
        .timeout_seconds(30)
        .backoff(Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2) });
    let mut watcher = ResumableWatcher::new(pods, watch, None)?;
    // The watch runs on its own task, so that a long handler or pass never stalls or restarts its
    // requests; events wait in order in the channel.
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let watch_task = tokio::spawn(async move {
        loop {
            if events_tx.send(watcher.next_event().await).is_err() {
                return;
            }
        }
    });
    let mut assignment = replica.group.assignment();
    let mut resync =
        tokio::time::interval_at(tokio::time::Instant::now() + replica.config.gc_period, replica.config.gc_period);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    println!("joined group {GROUP} as {}", replica.config.identity);
    loop {
        tokio::select! {
            biased;
            _ = sigterm.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            changed = assignment.changed() => {
                if changed.is_err() {
                    tracing::error!("the group driver stopped");
                    break;
                }
                replica.follow_assignment().await;
            }
            Some(event) = events.recv() => match event {
                Ok(ResumeEvent::Applied(pod)) => {
                    if let Some(permit) = replica.permit(&replica.key_of(&pod.name_any())) {
                        // The echo of this replica's own intent write: that handler has ended
                        // (annotated, or failed and left to the next pass).
                        let own_intent = pod.annotations().get(PENDING_ANNOTATION) == Some(&permit.term().0.to_string());
                        if !own_intent {
                            replica.reconcile(permit, pod).await;
                        }
                    }
                }
                Ok(ResumeEvent::Deleted(pod)) => {
                    tracing::debug!(pod = %pod.name_any(), "deleted");
                    if let Some(permit) = replica.permit(&replica.key_of(&pod.name_any())) {
                        replica.release_pod(permit, &pod).await;
                    }
                }
                Ok(ResumeEvent::Listed { cause, .. }) => {
                    tracing::debug!(?cause, "the watch listed");
                    replica.resync(None).await;
                    println!("{WATCHING_LINE}");
                }
                Ok(ResumeEvent::Progress(_)) => {}
                Err(error) => tracing::warn!(%error, "watch failed; retrying"),
            },
            _ = resync.tick() => {
                replica.follow_assignment().await;
                replica.resync(None).await;
            }
        }
    }
    watch_task.abort();
    tracing::info!("stopping: the handler in flight has finished; leaving the group");
    let Replica { group, .. } = replica;
    group.leave().await.map_err(|e| ControllerError::Group(e.to_string()))?;
    Ok(())
}

impl Replica {
    fn key_of(&self, name: &str) -> String {
        format!("{}/{name}", self.config.namespace)
    }

    /// The permit to handle the Pod with this key now, if this replica may.
    fn permit(&self, key: &str) -> Option<Permit> {
        if self.config.ignore_revocation {
            let partition = self.group.partition_of(key);
            return self.remembered.get(&partition).map(|term| Permit::Stale { partition, term: *term });
        }
        let guard = self.group.guard_for_key(key)?;
        // Owned, but the fence is not raised yet: the acquisition's pass will handle the Pod.
        (self.opened.get(&guard.partition()) == Some(&guard.term())).then_some(Permit::Guard(guard))
    }

    /// Raises the fences of newly gained partitions and runs the pass over them.
    async fn follow_assignment(&mut self) {
        let owned = self.group.assignment().borrow().owned.clone();
        self.opened.retain(|partition, term| owned.get(partition) == Some(term));
        let gained: Vec<(u32, Term)> =
            owned.into_iter().filter(|(partition, term)| self.opened.get(partition) != Some(term)).collect();
        if gained.is_empty() {
            return;
        }
        let pool = &self.pool;
        let raised: Vec<(u32, Term, Result<(), PoolError>)> = futures::stream::iter(gained)
            .map(|(partition, term)| async move { (partition, term, pool.open_partition(partition, term).await) })
            .buffer_unordered(PARALLEL_FENCE_RAISES)
            .collect()
            .await;
        let mut acquired = BTreeSet::new();
        for (partition, term, result) in raised {
            match result {
                Ok(()) => {
                    self.opened.insert(partition, term);
                    self.remembered.insert(partition, term);
                    acquired.insert(partition);
                }
                Err(error) => tracing::warn!(partition, %term, %error, "cannot raise the partition's fence; retrying"),
            }
        }
        if !acquired.is_empty() {
            tracing::info!(count = acquired.len(), "partitions gained; reconciling their Pods");
            self.resync(Some(&acquired)).await;
        }
    }

    /// The pass over the partitions in `scope` (all owned if `None`): release what Pods that no
    /// longer exist hold, release orphans, give unannotated Pods an address.
    async fn resync(&mut self, scope: Option<&BTreeSet<u32>>) {
        tracing::debug!(partitions = ?scope.map(BTreeSet::len), "resync pass");
        // The pool first, then the Pods: an allocation is made only after its Pod exists, so one
        // whose Pod is missing from the later listing belongs to a deleted Pod.
        let allocations = match self.pool.list().await {
            Ok(allocations) => allocations,
            Err(error) => return tracing::warn!(%error, "listing the pool failed; the next pass retries"),
        };
        let pods = match self.pods.list(&ListParams::default()).await {
            Ok(pods) => pods.items,
            Err(error) => return tracing::warn!(%error, "listing the Pods failed; the next pass retries"),
        };
        let in_scope = |replica: &Replica, key: &str| {
            scope.is_none_or(|partitions| partitions.contains(&replica.group.partition_of(key)))
        };
        let by_uid: HashMap<String, &Pod> = pods.iter().map(|pod| (pod.uid().unwrap_or_default(), pod)).collect();
        for allocation in allocations {
            let key = self.key_of(&allocation.record.pod_name);
            if !in_scope(self, &key) {
                continue;
            }
            let kind = match by_uid.get(&allocation.record.pod_uid) {
                None => HandlerKind::Release,
                Some(pod) => match annotated_ip(pod.annotations()) {
                    Some(ip) if ip != allocation.ip => HandlerKind::Collect,
                    _ => continue,
                },
            };
            if let Some(permit) = self.permit(&key) {
                self.release_allocation(permit, kind, &key, &allocation).await;
            }
        }
        for pod in pods {
            let key = self.key_of(&pod.name_any());
            if in_scope(self, &key) && !pod.annotations().contains_key(IP_ANNOTATION) {
                if let Some(permit) = self.permit(&key) {
                    self.reconcile(permit, pod).await;
                }
            }
        }
    }

    /// Gives an unannotated Pod an address (intent, allocate, annotate), as one witnessed handler.
    async fn reconcile(&self, permit: Permit, pod: Pod) {
        if pod.metadata.deletion_timestamp.is_some() || pod.annotations().contains_key(IP_ANNOTATION) {
            return;
        }
        let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
        let key = self.key_of(&name);
        let id = self.witness.start(HandlerKind::Reconcile, permit.partition(), permit.term().0, &uid, &key);
        let outcome = outcome_of(self.allocate_and_annotate(&permit, pod, &id).await);
        self.witness.end(&id, outcome);
        drop(permit);
    }

    async fn allocate_and_annotate(
        &self,
        permit: &Permit,
        mut pod: Pod,
        id: &crate::witness::HandlerId,
    ) -> Result<(), Step> {
        let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
        let retried = pod.annotations().contains_key(PENDING_ANNOTATION);
        permit.check()?;
        pod.annotations_mut().insert(PENDING_ANNOTATION.into(), permit.term().0.to_string());
        let mut pod = replace_pod(&self.pods, &name, &pod).await?.ok_or(Step::Conflict)?;
        permit.check()?;
        let allocation = self.pool.allocate(permit.fence(), &uid, &name).await?;
        if self.config.crash_after_allocate && pod.labels().contains_key(CRASH_LABEL) && !retried {
            println!("injected crash after allocating {} for {name}", allocation.ip);
            self.witness.end(id, Outcome::Crashed);
            std::process::exit(CRASH_EXIT_CODE);
        }
        // A guard lost here leaves the allocation to the next owner's collector.
        permit.check()?;
        let annotations = pod.annotations_mut();
        annotations.remove(PENDING_ANNOTATION);
        annotations.insert(IP_ANNOTATION.into(), allocation.ip.to_string());
        if replace_pod(&self.pods, &name, &pod).await?.is_none() {
            // The Pod changed or went away since the intent: give the address back at once.
            self.pool.release(permit.fence(), allocation.ip, allocation.create_revision).await?;
            return Err(Step::Conflict);
        }
        Ok(())
    }

    /// Releases everything allocated for a deleted Pod, as one witnessed handler.
    async fn release_pod(&self, permit: Permit, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        let key = self.key_of(&pod.name_any());
        let id = self.witness.start(HandlerKind::Release, permit.partition(), permit.term().0, &uid, &key);
        let result = async {
            permit.check()?;
            self.pool.release_pod(permit.fence(), &uid).await?;
            Ok(())
        }
        .await;
        self.witness.end(&id, outcome_of(result));
        drop(permit);
    }

    /// Releases one allocation its Pod does not hold, as one witnessed handler.
    async fn release_allocation(&self, permit: Permit, kind: HandlerKind, key: &str, allocation: &Allocation) {
        let uid = &allocation.record.pod_uid;
        let id = self.witness.start(kind, permit.partition(), permit.term().0, uid, key);
        let result = async {
            permit.check()?;
            if self.pool.release(permit.fence(), allocation.ip, allocation.create_revision).await?
                && kind == HandlerKind::Collect
            {
                println!("collected orphan {}", allocation.ip);
            }
            Ok(())
        }
        .await;
        self.witness.end(&id, outcome_of(result));
        drop(permit);
    }
}

fn outcome_of(result: Result<(), Step>) -> Outcome {
    match result {
        Ok(()) => Outcome::Done,
        Err(Step::Fenced) => Outcome::Fenced,
        Err(Step::Conflict) => Outcome::Conflict,
        Err(Step::Failed(error)) => {
            tracing::warn!(%error, "a handler failed; the next pass retries");
            Outcome::Error
        }
    }
}
