//! `tenure member`: a group member for applications in any language. The sidecar joins a group
//! ([`tenure_group`]), holds a [`PartitionGuard`] for every partition it owns, and answers over
//! HTTP whether a key is this member's now and under which term ([`routes`]).
//!
//! The drain rule: when a partition is revoked (a member joined, this one leaves), the sidecar
//! keeps its guard, so the group does not hand the partition over, until the application
//! acknowledges with `POST /release?partition=P&term=T` (its work on the partition has stopped) or
//! the drain timeout passed. From the revoke on, `/owns` answers false for the partition's keys,
//! so no new work starts; `/events` tells the application which partitions are draining.

mod routes;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use clap::Args;
use tenure::Term;
use tenure_group::{Assignment, Group, GroupConfig, GroupHealth, PartitionGuard};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::file::FileBackend;
use crate::backend::{LockUrl, LockUrlParser};
use crate::options::{
    parse_duration, parse_election_name, parse_http_address, CandidateOptions, ClusterArgs, HttpAddress,
};
use crate::run::until;
use crate::signals::TerminationSignals;
use crate::{error::CliError, http, logging};

/// Arguments of `tenure member`.
#[derive(Debug, Args)]
#[command(
    about = "Join a group and tell an application which keys it owns (Active/Active sidecar)",
    long_about = "Join a group and tell an application which keys it owns (Active/Active sidecar).\n\n\
        The group's key space is cut into partitions shared among the live members. Over --http:\n  \
        GET  /owns?key=K        200 {\"key\":K,\"owns\":true|false,\"partition\":P,\"term\":T|null}\n  \
        GET  /assignment        the members, and this member's partitions with their terms and state\n  \
        GET  /events            Server-Sent Events: the assignment, first the current one, then each change\n  \
        GET  /metrics           OpenMetrics: tenure_group_missed_changes_total (alert when > 0), owned partitions, members\n  \
        POST /release?partition=P&term=T  the application stopped work on a draining partition\n\n\
        Partition states, judged on this host's clock at each answer (also the first one after a \
        pause): owned (work on its keys may run), draining (revoked; the group waits for your \
        release: finish the work, then POST /release), lost (this member's membership may have run \
        out, after a pause past the lease or with the store unreachable, so another member may own \
        it already: stop the work at once, nothing to release; listed until the member caught up, \
        then absent).\n\n\
        Drain rule: a revoked partition is handed over only after the application released it or \
        --drain-timeout passed; /owns answers false for it from the revoke on. SIGTERM, SIGINT and \
        SIGHUP leave the group (every partition drains, then moves at once) and exit 0; SIGKILL \
        leaves the partitions to be taken over after the lease.\n\n\
        No --coordinated: Coordinated Leader Election chooses one leader among versions, and a \
        group has none (every member owns a share); during a rolling upgrade each member hands \
        its partitions over as it leaves.",
    after_help = "Example:  tenure member --group my-controller --http 127.0.0.1:4041 --lock file:///run/tenure/groups/my-controller"
)]
pub struct MemberArgs {
    /// The group's name; members with the same name on the same store share its partitions.
    #[arg(long, value_name = "NAME", value_parser = parse_election_name)]
    group: String,

    /// Serve the HTTP API on this address (host:port, or :port for all interfaces).
    #[arg(long, value_name = "ADDR", value_parser = parse_http_address)]
    http: HttpAddress,

    /// Where the group lives: file:///absolute/directory (members on one host),
    /// etcd://host:port[,host:port...]/prefix, zk://host:port[,host:port...]/path, or
    /// kube://NAMESPACE/leases/GROUP (a Lease per member labelled tenure.dev/group=GROUP and a
    /// ConfigMap GROUP-partitions). [default: the per-user directory
    /// $XDG_RUNTIME_DIR/tenure/GROUP.group]
    #[arg(long, value_name = "URL", value_parser = LockUrlParser)]
    lock: Option<LockUrl>,

    /// The number of partitions, fixed when the group is created (the group's count wins).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    partitions: u32,

    /// This member's share relative to the others' (1: an equal share).
    #[arg(long, value_name = "W", default_value_t = 1)]
    weight: u32,

    /// How long a revoked partition waits for the application's release before it is handed
    /// over anyway. [default: the renew deadline, TTL/2]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    drain_timeout: Option<Duration>,

    /// Leave the group (draining as on SIGTERM) when standard input reaches its end: a pipe from
    /// the application, which closes when it dies, however it dies.
    #[arg(long)]
    stdin_lifeline: bool,

    #[command(flatten)]
    candidate: CandidateOptions,

    #[command(flatten)]
    cluster: ClusterArgs,
}

/// One partition the sidecar holds a guard on.
#[derive(Debug)]
struct Held {
    guard: PartitionGuard,
    /// When the group revoked it; `None` while it is assigned.
    revoked_at: Option<Instant>,
}

/// What the HTTP routes see: the held guards and the group's shape, with a version per change.
#[derive(Debug)]
pub struct Sidecar {
    identity: String,
    group: String,
    health: GroupHealth,
    drain_timeout: Duration,
    state: Mutex<SidecarState>,
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct SidecarState {
    partition_count: u32,
    members: Vec<String>,
    held: BTreeMap<u32, Held>,
    version: u64,
}

/// Why a release request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The partition is still assigned to this member under that term: releasing it would stop
    /// nothing (the group hands over only revoked partitions).
    #[error("partition {partition} is still assigned to this member under term {term}; release it once /events shows it draining")]
    StillAssigned { partition: u32, term: Term },
}

impl Sidecar {
    fn state(&self) -> MutexGuard<'_, SidecarState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self, state: &mut SidecarState) {
        state.version += 1;
        self.changes.send_replace(state.version);
    }

    /// Follows the group's assignment: takes a guard for each newly owned partition (while the
    /// group is still joined), marks the others revoked, and keeps them until released.
    fn follow(&self, group: Option<&Group>, assignment: &Assignment, now: Instant) {
        let mut state = self.state();
        let mut changed = state.partition_count != assignment.partition_count || state.members != assignment.members;
        state.partition_count = assignment.partition_count;
        state.members.clone_from(&assignment.members);
        for (&partition, &term) in &assignment.owned {
            match state.held.get_mut(&partition) {
                Some(held) if held.guard.term() == term => {
                    changed |= held.revoked_at.take().is_some();
                }
                _ => {
                    if let Some(guard) = group.and_then(|group| group.guard(partition)).filter(|g| g.term() == term) {
                        // A guard of an older term is dropped here: that ownership is over.
                        state.held.insert(partition, Held { guard, revoked_at: None });
                        changed = true;
                    }
                }
            }
        }
        // A partition no longer owned under its guard's term is draining while the group waits
        // for its release; otherwise (the membership ran out on this clock, or the group moved it
        // without waiting) it is lost: its guard goes now, nothing is released.
        let before = state.held.len();
        state.held.retain(|&partition, held| {
            if assignment.owned.get(&partition) == Some(&held.guard.term()) {
                return true;
            }
            if !held.guard.is_draining() {
                tracing::warn!(partition, term = %held.guard.term(), "partition lost; its work must stop now");
                return false;
            }
            if held.revoked_at.is_none() {
                tracing::info!(partition, term = %held.guard.term(), "partition revoked; waiting for the application's release");
                held.revoked_at = Some(now);
                changed = true;
            }
            true
        });
        changed |= state.held.len() != before;
        if changed {
            self.changed(&mut state);
        }
    }

    /// Drops the guards whose drain timeout passed; returns the next drain deadline.
    fn expire_drains(&self, now: Instant) -> Option<Instant> {
        let mut state = self.state();
        let timeout = self.drain_timeout;
        let before = state.held.len();
        state.held.retain(|partition, held| match held.revoked_at {
            Some(at) if now >= at + timeout => {
                tracing::warn!(partition, term = %held.guard.term(), "drain timeout: handing the partition over without the application's release");
                false
            }
            _ => true,
        });
        if state.held.len() != before {
            self.changed(&mut state);
        }
        state.held.values().filter_map(|held| held.revoked_at).min().map(|at| at + timeout)
    }

    /// The application's acknowledgement that its work on `partition` under `term` stopped.
    /// `Ok(true)` if a draining guard was dropped, `Ok(false)` if none was held (already released
    /// or timed out: nothing to do).
    pub fn release(&self, partition: u32, term: Term) -> Result<bool, ReleaseError> {
        let mut state = self.state();
        match state.held.get(&partition) {
            Some(held) if held.guard.term() == term && held.revoked_at.is_none() => {
                Err(ReleaseError::StillAssigned { partition, term })
            }
            Some(held) if held.guard.term() == term => {
                state.held.remove(&partition);
                tracing::info!(partition, %term, "the application released the partition");
                self.changed(&mut state);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether `key` is this member's now: its partition, and the term if owned (assigned, not
    /// draining, membership valid on this host's clock).
    pub fn owns(&self, key: &str) -> (u32, Option<Term>) {
        let state = self.state();
        if state.partition_count == 0 {
            return (0, None);
        }
        let partition = tenure_group::assignment::partition_of(key.as_bytes(), state.partition_count);
        let term = state
            .held
            .get(&partition)
            .filter(|held| held.revoked_at.is_none())
            .and_then(|held| held.guard.check().ok());
        (partition, term)
    }

    /// The assignment as the routes report it.
    pub fn report(&self) -> routes::AssignmentReport {
        let state = self.state();
        let partitions = state
            .held
            .iter()
            .map(|(&partition, held)| routes::PartitionReport {
                partition,
                term: held.guard.term().0,
                // Judged on this host's clock now, not from the last change the group published:
                // the first answer after a pause is already right.
                state: if held.guard.is_valid() {
                    routes::PartitionState::Owned
                } else if held.guard.is_draining() {
                    routes::PartitionState::Draining
                } else {
                    routes::PartitionState::Lost
                },
            })
            .collect();
        routes::AssignmentReport {
            member: self.identity.clone(),
            version: state.version,
            partition_count: state.partition_count,
            members: state.members.clone(),
            partitions,
        }
    }

    /// `GET /metrics`: the member's health in OpenMetrics text, labelled `group`.
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let mut registry = prometheus_client::registry::Registry::with_labels(
            [(std::borrow::Cow::Borrowed("group"), std::borrow::Cow::Owned(self.group.clone()))].into_iter(),
        );
        let members = self.state().members.len();
        registry.register(
            "tenure_group_missed_changes",
            "Changes the group's watch lost that the once-per-lease read found (expected 0)",
            ConstCounter::new(self.health.missed_changes()),
        );
        registry.register(
            "tenure_group_owned_partitions",
            "Partitions this member owns now (judged on its own clock)",
            ConstGauge::new(i64::try_from(self.health.owned_partitions()).unwrap_or(i64::MAX)),
        );
        registry.register(
            "tenure_group_members",
            "Live members in this member's view",
            ConstGauge::new(i64::try_from(members).unwrap_or(i64::MAX)),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text)
    }

    /// Notifications of changes (the version), for `/events`.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The default store: a per-user directory beside the default file locks.
fn default_url(group: &str) -> Result<LockUrl, CliError> {
    let path = tenure::locks::file::FileLock::default_path(group)
        .map_err(|source| CliError::DefaultGroupDirectory { group: group.to_owned(), source })?;
    Ok(FileBackend::url(path.with_extension("group")))
}

/// Runs `tenure member` until a termination signal; returns the exit status.
pub async fn member(args: MemberArgs) -> Result<u8, CliError> {
    logging::init(args.candidate.log_format);
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let identity = args.candidate.identity()?;
    let url = args.lock.clone().map_or_else(|| default_url(&args.group), Ok)?;
    let timing = args.candidate.ttl.timing;
    let drain_timeout = args.drain_timeout.unwrap_or(timing.renew_deadline);
    let config = GroupConfig { timing, partition_count: args.partitions, weight: args.weight };
    config.validate().map_err(CliError::refused)?;
    let listener =
        TcpListener::bind(&args.http.0).await.map_err(CliError::io(format!("serve HTTP on {}", args.http.0)))?;
    let cluster = args.cluster.options()?;
    // The same user and TLS files as `tenure elect` on the same URL.
    let store = url.group_store(&args.group, &identity, &cluster).await?;
    let group = Group::builder(identity.clone(), store)
        .config(config)
        .drain_timeout(drain_timeout)
        .join()
        .map_err(CliError::refused)?;
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| args.http.0.clone());
    tracing::info!(identity, group = args.group, store = %url, partitions = args.partitions, "joined");
    tracing::info!(address, "serving the group's assignment over HTTP");

    let sidecar = Arc::new(Sidecar {
        identity,
        group: args.group.clone(),
        health: group.health(),
        drain_timeout,
        state: Mutex::new(SidecarState::default()),
        changes: watch::channel(0).0,
    });
    let stop_serving = CancellationToken::new();
    let server =
        tokio::spawn(http::serve(listener, routes::router(sidecar.clone()), stop_serving.clone().cancelled_owned()));

    let lifeline = CancellationToken::new();
    if args.stdin_lifeline {
        crate::signals::stop_when_stdin_closes(lifeline.clone());
    }
    let mut assignment = group.assignment();
    let termination = loop {
        sidecar.follow(Some(&group), &assignment.borrow_and_update(), Instant::now());
        let next_drain = sidecar.expire_drains(Instant::now());
        tokio::select! {
            termination = signals.recv() => break termination.name,
            () = lifeline.cancelled() => break "standard input closed",
            changed = assignment.changed() => {
                if changed.is_err() {
                    return Err(CliError::Ended("the group driver stopped"));
                }
            }
            () = until(next_drain) => {}
        }
    };
    tracing::info!(reason = termination, "leaving the group: draining every partition");
    let mut leaving = tokio::spawn(group.leave());
    // The HTTP API keeps answering while the partitions drain, so the application can release.
    let left = loop {
        sidecar.follow(None, &assignment.borrow_and_update(), Instant::now());
        let next_drain = sidecar.expire_drains(Instant::now());
        tokio::select! {
            left = &mut leaving => break left,
            _ = assignment.changed() => {}
            () = until(next_drain) => {}
        }
    };
    stop_serving.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    left.map_err(|e| CliError::LeaveGroup(e.into()))?.map_err(|e| CliError::LeaveGroup(e.into()))?;
    tracing::info!("left the group");
    Ok(crate::exit::SUCCESS)
}
