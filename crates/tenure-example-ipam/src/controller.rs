//! The controller: one replica of the Kuryr-like IP allocator.
//!
//! Why it is shaped so: it is the end-to-end proof of the HA runtime. Every replica campaigns on
//! etcd; only the leader works ([`tenure_ha::gate`]). The leader watches Pods with a
//! [`ResumableWatcher`] started from the fenced etcd checkpoint, so Pods deleted while nobody led
//! still arrive as deletions; it allocates addresses in the fenced etcd pool, recording an intent
//! on the Pod first (Crossplane's "create pending" mark), and an orphan collector removes what a
//! crash between allocate and annotate left behind.
//!
//! With `resume` off it behaves as Kuryr did: no checkpoint, each new leader watches from "now"
//! (it lists to allocate for existing Pods, but never compares its allocations with that list),
//! so deletions that happened while nobody led are missed for good.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tenure::Term;
use tenure_etcd::EtcdElection;
use tenure_ha::checkpoint::etcd::EtcdCheckpointStore;
use tenure_ha::checkpoint::{CheckpointError, CheckpointStore, Checkpointer};
use tenure_ha::gc::{ExternalResource, ExternalResources, GarbageCollector};
use tenure_ha::{Gate, LeaderContext};
use tenure_kube::resume::Backoff;
use tenure_kube::{ResumableWatcher, ResumeConfig, ResumeError, ResumeEvent};

use crate::pool::{IpPool, PoolError};

/// The annotation holding a Pod's address.
pub const IP_ANNOTATION: &str = "ipam.tenure.dev/ip";
/// The intent mark: the term that is allocating for the Pod (set before allocating, removed when
/// the address is annotated).
pub const PENDING_ANNOTATION: &str = "ipam.tenure.dev/pending";
/// Test hook: with [`ControllerConfig::crash_after_allocate`], a Pod with this label makes the
/// leader exit right after allocating its address, before annotating it (an injected orphan).
pub const CRASH_LABEL: &str = "ipam.tenure.dev/crash-after-allocate";
/// The exit code of that injected crash.
pub const CRASH_EXIT_CODE: i32 = 86;
/// What a replica prints on stdout when its resume was refused and it relisted.
pub const RESUME_FAILED_LINE: &str = "relisted after a failed resume";
/// The etcd election all replicas campaign in.
pub const ELECTION: &str = "ipam/election";
/// The prefix of the pool's keys.
pub const POOL_PREFIX: &str = "ipam/ips/";
/// The checkpoint key.
pub const CHECKPOINT_KEY: &str = "ipam/checkpoint";

/// How the replicas share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// One leader (elected on etcd) handles every Pod; the others stand by (Kuryr's design).
    #[default]
    ActivePassive,
    /// Every replica joins a group on etcd and handles the Pods of the partitions it owns
    /// ([`crate::active_active`]).
    ActiveActive,
}

/// Everything one replica needs; also the options of the `controller` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerConfig {
    /// This replica's name in the election.
    #[arg(long)]
    pub identity: String,
    /// etcd endpoints, host:port, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379")]
    pub etcd: Vec<String>,
    /// The API server URL (e.g. from `tenure apiserver`).
    #[arg(long, default_value = "http://127.0.0.1:6443")]
    pub apiserver: String,
    /// The namespace whose Pods get addresses.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The election lease.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// Resume from the checkpoint (false: Kuryr's behaviour, to show the missed deletions).
    #[arg(
        long = "no-resume",
        action = clap::ArgAction::SetFalse,
        help = "Do not resume from the checkpoint: watch from now, as Kuryr did (misses deletions)"
    )]
    pub resume: bool,
    /// How often the orphan collector runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub gc_period: Duration,
    /// The orphan collector's grace period.
    // Also the least time between the two passes that must both see an allocation unused.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub gc_grace: Duration,
    /// Test hook: exit right after allocating for a Pod labelled
    /// ipam.tenure.dev/crash-after-allocate (before annotating it).
    #[arg(long)]
    pub crash_after_allocate: bool,
    /// Exit when the parent process dies (the checker starts replicas with it, so that a
    /// killed checker leaves no replicas behind).
    #[arg(long)]
    pub exit_with_parent: bool,
    /// The pool: addresses after this one.
    #[arg(long, default_value = "10.0.0.0")]
    pub pool_base: Ipv4Addr,
    /// The pool's size.
    #[arg(long, default_value_t = 1000)]
    pub pool_size: u32,
    /// active-passive (one leader works) or active-active (every replica works on the Pods of
    /// its partitions).
    #[arg(long, value_enum, default_value_t = Mode::ActivePassive)]
    pub mode: Mode,
    /// Active/Active: the group's partition count.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
    /// Active/Active: append a line per handler start and end to this file (for the checker).
    #[arg(long)]
    pub witness: Option<std::path::PathBuf>,
    /// A delay before every call to the pool, modelling a slow external IPAM.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub pool_delay: Duration,
    /// Deliberately broken Active/Active (the checker's control): keep handling the partitions
    /// this replica once owned and do not drain them on a handoff.
    #[arg(long = "unsafe-ignore-revocation")]
    pub ignore_revocation: bool,
}

/// Why a replica or a tenure's work failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// etcd could not be reached or refused the campaign.
    #[error("etcd: {0}")]
    Etcd(#[from] tenure_etcd::EtcdError),
    /// The API server URL or client is unusable.
    #[error("kubernetes client: {0}")]
    Kube(String),
    /// A pool operation failed (fenced writes end the tenure's work).
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    /// The checkpoint could not be loaded or saved.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The watch failed.
    #[error("watch: {0}")]
    Watch(#[from] ResumeError),
    /// The elector stopped unexpectedly.
    #[error("elector: {0}")]
    Elector(#[from] tenure::ElectorError),
    /// Installing the signal handler failed.
    #[error("signals: {0}")]
    Signals(#[from] std::io::Error),
    /// The group could not be joined or its configuration is invalid.
    #[error("group: {0}")]
    Group(String),
    /// The witness file could not be opened.
    #[error("witness {0}: {1}")]
    Witness(String, std::io::Error),
}

/// What every tenure's work shares.
struct Shared {
    config: ControllerConfig,
    pods: Api<Pod>,
    pool: IpPool,
    store: Arc<dyn CheckpointStore>,
}

/// Runs one Active/Passive replica until SIGTERM/SIGINT, then stops its work and releases the
/// lock (`--mode active-active` runs [`crate::active_active::run`] instead).
pub async fn run(config: ControllerConfig) -> Result<(), ControllerError> {
    let election = EtcdElection::connect(&config.etcd, ELECTION).await?.with_drain_timeout(config.ttl / 4);
    let client = client(&config)?;
    let shared = Arc::new(Shared {
        pods: Api::namespaced(client, &config.namespace),
        pool: IpPool::new(election.clone(), POOL_PREFIX, config.pool_base, config.pool_size)
            .with_call_delay(config.pool_delay),
        store: Arc::new(EtcdCheckpointStore::new(election.clone(), CHECKPOINT_KEY, "ipam")),
        config: config.clone(),
    });
    let elector = election.campaign(config.identity.clone(), config.ttl)?;
    let gate = Gate::builder(&elector)
        .drain_timeout(config.ttl / 4)
        .backoff(Duration::from_millis(200), Duration::from_secs(2))
        .spawn(move |ctx| lead(ctx, shared.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping: work first, then the lock");
    gate.shutdown().await;
    elector.shutdown().await?;
    Ok(())
}

/// A client of the configured API server.
pub(crate) fn client(config: &ControllerConfig) -> Result<Client, ControllerError> {
    let uri = config.apiserver.parse().map_err(|e| ControllerError::Kube(format!("{}: {e}", config.apiserver)))?;
    let mut kube_config = kube::Config::new(uri);
    kube_config.default_namespace = config.namespace.clone();
    Client::try_from(kube_config).map_err(|e| ControllerError::Kube(e.to_string()))
}

/// One tenure's work: resume (or not), watch, allocate and release, collect orphans.
async fn lead(ctx: LeaderContext, shared: Arc<Shared>) -> Result<(), ControllerError> {
    let term = ctx.term();
    println!("leading term {}", term.0);
    let checkpointer = match shared.config.resume {
        true => Some(Checkpointer::resume_for(shared.store.clone(), &ctx).await?),
        false => None,
    };
    let saved = checkpointer.as_ref().and_then(|c| c.resource_version("pods"));
    let watch = ResumeConfig::default()
        .timeout_seconds(30)
        .backoff(Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(2) });
    let mut watcher = ResumableWatcher::new(shared.pods.clone(), watch, saved)?;
    let resources = PoolResources { shared: shared.clone() };
    let gc = GarbageCollector::builder(resources, Default::default)
        .grace(shared.config.gc_grace)
        .confirm_after(shared.config.gc_grace)
        .build();
    let trigger = gc.trigger();
    let (tenure, cancel, period) = (ctx.tenure().clone(), ctx.cancellation_token(), shared.config.gc_period);
    let collector = tokio::spawn(async move { gc.run(&tenure, &cancel, period).await });
    let result = async {
        loop {
            let event = tokio::select! {
                _ = ctx.cancelled() => return Ok(()),
                event = watcher.next_event() => event,
            };
            match event {
                Ok(ResumeEvent::Applied(pod)) => reconcile(&shared, term, pod).await?,
                Ok(ResumeEvent::Deleted(pod)) => release(&shared, term, &pod).await?,
                Ok(ResumeEvent::Listed { objects, cause, .. }) => {
                    if cause.resume_failed() {
                        // A line the checker counts (stdout), and the log line.
                        println!("{RESUME_FAILED_LINE}");
                        tracing::warn!(?cause, "resume failed: relisted; the collector recovers missed deletions");
                    }
                    for pod in objects {
                        reconcile(&shared, term, pod).await?;
                    }
                    trigger.run_now();
                }
                Ok(ResumeEvent::Progress(_)) => {}
                Err(error) => tracing::warn!(%error, "watch failed; retrying"),
            }
            if let (Some(checkpointer), Some(version)) = (&checkpointer, watcher.last_delivered_version()) {
                checkpointer.record("pods", version);
            }
        }
    }
    .await;
    if let Some(checkpointer) = &checkpointer {
        if let Err(error) = checkpointer.flush().await {
            tracing::info!(%error, "final checkpoint not written");
        }
    }
    collector.abort();
    result
}

/// Gives an unannotated Pod an address: intent, allocate, annotate.
async fn reconcile(shared: &Shared, term: Term, mut pod: Pod) -> Result<(), ControllerError> {
    if pod.metadata.deletion_timestamp.is_some() || pod.annotations().contains_key(IP_ANNOTATION) {
        return Ok(());
    }
    let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
    let retried = pod.annotations().contains_key(PENDING_ANNOTATION);
    pod.annotations_mut().insert(PENDING_ANNOTATION.into(), term.0.to_string());
    let Some(mut pod) = replace_pod(&shared.pods, &name, &pod).await? else { return Ok(()) };
    let allocation = shared.pool.allocate(term, &uid, &name).await?;
    if shared.config.crash_after_allocate && pod.labels().contains_key(CRASH_LABEL) && !retried {
        println!("injected crash after allocating {} for {name}", allocation.ip);
        std::process::exit(CRASH_EXIT_CODE);
    }
    let annotations = pod.annotations_mut();
    annotations.remove(PENDING_ANNOTATION);
    annotations.insert(IP_ANNOTATION.into(), allocation.ip.to_string());
    if replace_pod(&shared.pods, &name, &pod).await?.is_none() {
        // The Pod changed or went away since the intent: give the address back at once.
        shared.pool.release(term, allocation.ip, allocation.create_revision).await?;
    }
    Ok(())
}

/// Writes `pod` if it is unchanged since read (its resourceVersion); `None` if it changed or is gone.
pub(crate) async fn replace_pod(pods: &Api<Pod>, name: &str, pod: &Pod) -> Result<Option<Pod>, ControllerError> {
    match pods.replace(name, &PostParams::default(), pod).await {
        Ok(pod) => Ok(Some(pod)),
        Err(kube::Error::Api(response)) if response.code == 409 || response.code == 404 => Ok(None),
        Err(error) => Err(ControllerError::Kube(error.to_string())),
    }
}

/// Releases everything allocated for a deleted Pod.
async fn release(shared: &Shared, term: Term, pod: &Pod) -> Result<(), ControllerError> {
    let released = shared.pool.release_pod(term, &pod.uid().unwrap_or_default()).await?;
    tracing::debug!(pod = %pod.name_any(), released, "pod deleted");
    Ok(())
}

/// The pool as the orphan collector sees it: allocations not in use, by `<ip>@<create revision>`.
struct PoolResources {
    shared: Arc<Shared>,
}

#[async_trait]
impl ExternalResources for PoolResources {
    /// Lists the pool, then the Pods (in that order: an allocation annotated in between is seen in
    /// use), and returns the allocations no existing Pod is annotated with. Without resume
    /// (Kuryr), allocations of Pods that no longer exist are not its business: it never knew.
    async fn list(&self) -> Result<Vec<ExternalResource>, String> {
        let allocations = self.shared.pool.list().await.map_err(|e| e.to_string())?;
        let pods = self.shared.pods.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let in_use: HashMap<String, Option<String>> = pods
            .items
            .iter()
            .map(|pod| (pod.uid().unwrap_or_default(), pod.annotations().get(IP_ANNOTATION).cloned()))
            .collect();
        Ok(allocations
            .into_iter()
            .filter(|a| match in_use.get(&a.record.pod_uid) {
                Some(annotated) => annotated.as_deref() != Some(a.ip.to_string().as_str()),
                None => self.shared.config.resume,
            })
            .map(|a| ExternalResource::new(format!("{}@{}", a.ip, a.create_revision)))
            .collect())
    }

    async fn delete(&self, id: &str, term: Term) -> Result<(), String> {
        let (ip, revision) = id.split_once('@').ok_or_else(|| format!("bad id {id}"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("bad id {id}: {e}"))?;
        let revision: i64 = revision.parse().map_err(|e| format!("bad id {id}: {e}"))?;
        self.shared.pool.release(term, ip, revision).await.map_err(|e| e.to_string())?;
        println!("collected orphan {ip}");
        Ok(())
    }
}

/// The annotations of a Pod, for the checker.
pub fn annotated_ip(annotations: &BTreeMap<String, String>) -> Option<Ipv4Addr> {
    annotations.get(IP_ANNOTATION).and_then(|ip| ip.parse().ok())
}
