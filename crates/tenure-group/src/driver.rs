//! The thin async driver: runs a [`MemberCore`] against a [`GroupStore`] on the tokio clock, and
//! gives a controller author the API it wants.
//!
//! - "Do I own this key now, and under which term?": [`Group::belongs_to_self`].
//! - A per-partition guard like `tenure::Tenure`: [`Group::guard`]. Its term is the fencing token;
//!   the partition is released (revoke, drain, release) only once every guard of it is dropped
//!   (or the drain timeout passed), so a new owner never overlaps the old owner's work.
//! - A `tokio::sync::watch` of the assignment: [`Group::assignment`].
//! - A cloneable view for code that runs beside the controller (a write gate on its API client):
//!   [`Group::ownership`], and [`PartitionGuard::ended`] to stop work the moment ownership ends.
//! - Tooz's vocabulary: [`Group::builder`]`(..).join()`, [`Group::leave`], [`Group::members`],
//!   [`Group::members_for_object`], [`Group::belongs_to_self`].

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{Future, StreamExt};
use tenure::{MonotonicTime, Term, Timing};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::assignment::partition_of;
use crate::config::GroupConfig;
use crate::handoff::{Action, CoreError, GroupEvent, MemberCore};
use crate::store::{Change, GroupStore, Key, RecordStream, Snapshot, StoreError, Version};

/// Why a group could not be joined or left.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The identity or the configuration is invalid.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// `join` was called outside a tokio runtime.
    #[error("joining a group needs a tokio runtime (call join inside one)")]
    NoRuntime,
    /// The driver task ended abnormally.
    #[error("the group driver stopped: {0}")]
    DriverStopped(String),
}

/// Why a [`PartitionGuard`] no longer allows work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition} is no longer owned under term {term}")]
pub struct NotOwner {
    /// The partition.
    pub partition: u32,
    /// The term the guard was taken under.
    pub term: Term,
}

/// The assignment as this member sees it, published whenever it changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The group's partition count (the table's; the configured one before the first read).
    pub partition_count: u32,
    /// Live members in this member's view, sorted, this one included while it is a member.
    pub members: Vec<String>,
    /// The partitions this member owns, with their terms.
    pub owned: BTreeMap<u32, Term>,
    /// This member's epoch while it is a member.
    pub epoch: Option<u64>,
}

#[derive(Debug, Default)]
struct SharedState {
    identity: String,
    partition_count: u32,
    active: BTreeMap<u32, Term>,
    /// The partitions work may still run on: `active`, and those revoked and not yet released.
    working: BTreeMap<u32, Term>,
    owners: Vec<Option<String>>,
    members: Vec<String>,
    valid_until: Option<Instant>,
    guards: BTreeMap<(u32, Term), usize>,
    /// The revoked partitions the driver waits on for their guards (its `draining`): dropping the
    /// last guard of one of these, and only these, wakes the driver.
    draining: BTreeSet<(u32, Term)>,
    missed_changes: u64,
}

impl SharedState {
    /// True while the membership is valid on this host's clock now.
    fn valid(&self) -> bool {
        self.valid_until.is_some_and(|until| Instant::now() < until)
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<SharedState>,
    guard_dropped: Notify,
    /// Woken when what guards are judged by may have shrunk: the owned partitions changed or the
    /// membership deadline moved earlier (or went). Extensions do not wake it: a waiter sleeping
    /// until the old deadline re-reads the state then.
    ownership_changed: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The term of `partition` in `map`, judged with the membership on this host's clock now.
    fn while_member(&self, map: impl Fn(&SharedState) -> &BTreeMap<u32, Term>, partition: u32) -> Option<Term> {
        let state = self.state();
        map(&state).get(&partition).copied().filter(|_| state.valid())
    }

    fn owns(&self, partition: u32) -> Option<Term> {
        self.while_member(|s| &s.active, partition)
    }

    fn is_member(&self) -> bool {
        self.state().valid()
    }

    fn partition_of(&self, key: &str) -> u32 {
        partition_of(key.as_bytes(), self.state().partition_count)
    }

    fn guard(self: &Arc<Self>, partition: u32) -> Option<PartitionGuard> {
        self.guard_in(&mut self.state(), partition)
    }

    /// One lock for both the partition count and the guard: a write gate takes a guard per write.
    fn guard_for_key(self: &Arc<Self>, key: &str) -> Option<PartitionGuard> {
        let mut state = self.state();
        let partition = partition_of(key.as_bytes(), state.partition_count);
        self.guard_in(&mut state, partition)
    }

    fn guard_in(self: &Arc<Self>, state: &mut SharedState, partition: u32) -> Option<PartitionGuard> {
        let term = state.active.get(&partition).copied().filter(|_| state.valid())?;
        *state.guards.entry((partition, term)).or_default() += 1;
        Some(PartitionGuard { shared: self.clone(), partition, term })
    }

    /// Completes once `over` holds, judged again whenever the ownership may have shrunk and when
    /// the membership deadline passes on this host's clock (so also after the driver stopped).
    async fn until(&self, over: impl Fn(&Shared) -> bool) {
        loop {
            let changed = self.ownership_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if over(self) {
                return;
            }
            let deadline = self.state().valid_until;
            let Some(deadline) = deadline else {
                changed.await;
                continue;
            };
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// Permission to work on one partition under one term, like `tenure::Tenure` for a partition.
///
/// Check it ([`PartitionGuard::check`]) before every side effect and pass the term to the
/// resources you write. While any guard of a partition lives, a revoked partition is not released
/// (up to the drain timeout), so the next owner starts only after this work ended.
#[derive(Debug)]
pub struct PartitionGuard {
    shared: Arc<Shared>,
    partition: u32,
    term: Term,
}

impl PartitionGuard {
    /// The partition.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The fencing term of this ownership.
    pub fn term(&self) -> Term {
        self.term
    }

    /// True while this member still owns the partition under this term (membership valid on the
    /// local clock, not revoked).
    pub fn is_valid(&self) -> bool {
        self.shared.owns(self.partition) == Some(self.term)
    }

    /// True while the group waits for this guard's work to end before it hands the partition
    /// over: the partition was revoked under this term and this member's membership is still
    /// valid on the local clock. Once the membership may have run out (a pause past the lease, an
    /// unreachable store), this is false at once: the partition may be another member's already,
    /// and the work must stop without waiting for anything.
    pub fn is_draining(&self) -> bool {
        !self.is_valid() && self.shared.while_member(|s| &s.working, self.partition) == Some(self.term)
    }

    /// The term if the guard is still valid.
    pub fn check(&self) -> Result<Term, NotOwner> {
        if self.is_valid() {
            Ok(self.term)
        } else {
            Err(NotOwner { partition: self.partition, term: self.term })
        }
    }

    /// Completes when [`PartitionGuard::is_valid`] turns false: the partition was revoked (also
    /// while it drains), lost, or the membership may have run out on this host's clock (the
    /// deadline passing counts even if the driver never runs again).
    ///
    /// Why it exists: work that cannot check before each step, such as an API request already
    /// sent, is raced against it and dropped the moment the ownership ends (a write gate cancels
    /// its in-flight writes this way), instead of finding out at its next check.
    pub async fn ended(&self) {
        self.shared.until(|shared| shared.owns(self.partition) != Some(self.term)).await
    }
}

impl Drop for PartitionGuard {
    /// Wakes the driver only when this was the last guard of a partition it drains: guards come
    /// and go with every reconcile (and every gated write), and a driver pass costs far more.
    /// Race-free: the driver marks a partition draining, under the same lock, before it looks at
    /// the partition's guards.
    fn drop(&mut self) {
        let key = (self.partition, self.term);
        let mut state = self.shared.state();
        let Some(count) = state.guards.get_mut(&key) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        state.guards.remove(&key);
        let drained = state.draining.contains(&key);
        drop(state);
        if drained {
            self.shared.guard_dropped.notify_one();
        }
    }
}

/// Reads a member's health counters (see [`Group::health`]).
#[derive(Debug, Clone)]
pub struct GroupHealth {
    shared: Arc<Shared>,
}

impl GroupHealth {
    /// See [`Group::missed_changes`].
    pub fn missed_changes(&self) -> u64 {
        self.shared.state().missed_changes
    }

    /// How many partitions the member owns now, judged on this host's clock.
    pub fn owned_partitions(&self) -> usize {
        let state = self.shared.state();
        if state.valid() {
            state.active.len()
        } else {
            0
        }
    }
}

/// A cloneable view of a member's ownership: guards for keys and partitions, and whether the
/// membership is valid, judged on this host's clock like [`Group`]'s own answers.
///
/// Why apart from [`Group`]: the group is moved into what runs it (a sharded controller, or
/// [`Group::leave`]), while code beside it (a write gate wrapping an API client, shared by every
/// reconcile) needs to ask "do I own this key now?" from many tasks. It does not keep the driver
/// running: once the [`Group`] is dropped or has left, the membership runs out on the clock and
/// the view owns nothing.
#[derive(Debug, Clone)]
pub struct Ownership {
    shared: Arc<Shared>,
}

impl Ownership {
    /// See [`Group::partition_of`].
    pub fn partition_of(&self, key: &str) -> u32 {
        self.shared.partition_of(key)
    }

    /// See [`Group::belongs_to_self`].
    pub fn belongs_to_self(&self, key: &str) -> Option<Term> {
        self.shared.owns(self.shared.partition_of(key))
    }

    /// See [`Group::guard_for_key`].
    pub fn guard_for_key(&self, key: &str) -> Option<PartitionGuard> {
        self.shared.guard_for_key(key)
    }

    /// See [`Group::guard`].
    pub fn guard(&self, partition: u32) -> Option<PartitionGuard> {
        self.shared.guard(partition)
    }

    /// True while this member's membership is valid on this host's clock (whether or not it owns
    /// any partition). Work that touches no particular partition may run while this holds.
    pub fn is_member(&self) -> bool {
        self.shared.is_member()
    }

    /// Completes when [`Ownership::is_member`] turns false (the membership lapsed, ran out on this
    /// host's clock, or the member left), so work allowed by the membership alone can be dropped
    /// at that moment.
    pub async fn membership_ended(&self) {
        self.shared.until(|shared| !shared.is_member()).await
    }
}

/// Builds and joins a [`Group`].
#[derive(Debug)]
#[must_use = "a member joins its group only when `join` is called"]
pub struct GroupBuilder<S> {
    identity: String,
    store: S,
    config: GroupConfig,
    drain_timeout: Duration,
}

impl<S: GroupStore> GroupBuilder<S> {
    /// The whole configuration at once.
    pub fn config(mut self, config: GroupConfig) -> Self {
        self.config = config;
        self
    }

    /// The partition count (default [`crate::assignment::DEFAULT_PARTITION_COUNT`]).
    pub fn partition_count(mut self, count: u32) -> Self {
        self.config.partition_count = count;
        self
    }

    /// This member's relative share (default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.config.weight = weight;
        self
    }

    /// Lease, renew deadline and retry period (default client-go's 15/10/2 s).
    pub fn timing(mut self, timing: Timing) -> Self {
        self.config.timing = timing;
        self
    }

    /// How long a revoked partition waits for its guards before it is released anyway (default:
    /// the renew deadline). Work still running then was told by its guard that it lost the
    /// partition.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Joins the group: starts the driver task (needs a tokio runtime).
    pub fn join(self) -> Result<Group, GroupError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| GroupError::NoRuntime)?;
        let watch = self.store.watch_records();
        let core = MemberCore::new(self.identity.clone(), rand::random(), self.config, watch.is_some())?;
        let shared = Arc::new(Shared::default());
        {
            let mut state = shared.state();
            state.identity = self.identity.clone();
            state.partition_count = self.config.partition_count;
        }
        let (assignment_tx, assignment) =
            watch::channel(Assignment { partition_count: self.config.partition_count, ..Assignment::default() });
        let (commands, command_rx) = mpsc::unbounded_channel();
        let driver = Driver {
            identity: self.identity.clone(),
            core,
            store: Arc::new(self.store),
            shared: shared.clone(),
            assignment: assignment_tx,
            commands: command_rx,
            origin: Instant::now(),
            timing: self.config.timing,
            drain_timeout: self.drain_timeout,
            draining: BTreeMap::new(),
            owners_from: None,
        };
        let task = runtime.spawn(driver.run(watch));
        Ok(Group { identity: self.identity, shared, assignment, commands, task: Some(task) })
    }
}

/// This process's membership in a group. Dropping it stops the driver without releasing anything
/// (like a crash: others take over after the lease); call [`Group::leave`] to hand over at once.
#[derive(Debug)]
pub struct Group {
    identity: String,
    shared: Arc<Shared>,
    assignment: watch::Receiver<Assignment>,
    commands: mpsc::UnboundedSender<Command>,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug)]
enum Command {
    Leave,
}

impl Group {
    /// Starts building the membership of `identity` in the group kept in `store`.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use tenure_group::{stores::file::FileGroupStore, Group};
    /// let store = FileGroupStore::open("/run/user/1000/tenure/groups/my-controller")?;
    /// let group = Group::builder("replica-a", store).join()?;
    /// if let Some(guard) = group.guard_for_key("default/my-pod") {
    ///     // ... reconcile, passing guard.term() to what you write, checking guard.check()? ...
    /// }
    /// group.leave().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder<S: GroupStore>(identity: impl Into<String>, store: S) -> GroupBuilder<S> {
        let config = GroupConfig::default();
        GroupBuilder { identity: identity.into(), store, drain_timeout: config.timing.renew_deadline, config }
    }

    /// This member's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// A watch of this member's view of the assignment.
    pub fn assignment(&self) -> watch::Receiver<Assignment> {
        self.assignment.clone()
    }

    /// The live members in this member's view (Tooz: `get_members`).
    pub fn members(&self) -> Vec<String> {
        self.shared.state().members.clone()
    }

    /// How many changes the group's watch lost that the once-per-lease read found since this
    /// member joined. Why it exists: the read bounds the damage of a lost change (a handoff
    /// waits a lease at most), so a store or watch that loses events would otherwise go
    /// unnoticed; it is expected to stay 0, and worth an alert when it does not.
    pub fn missed_changes(&self) -> u64 {
        self.shared.state().missed_changes
    }

    /// A cloneable view of this member's ownership, for code beside the controller (such as a
    /// write gate on its API client) that must ask about keys after the `Group` was moved.
    pub fn ownership(&self) -> Ownership {
        Ownership { shared: self.shared.clone() }
    }

    /// A handle that reads this member's health counters after the `Group` itself was moved
    /// (into [`Group::leave`]), for a metrics endpoint.
    pub fn health(&self) -> GroupHealth {
        GroupHealth { shared: self.shared.clone() }
    }

    /// The partition of a key (`namespace/name` for Kubernetes objects).
    pub fn partition_of(&self, key: &str) -> u32 {
        self.shared.partition_of(key)
    }

    /// The member that owns the key's partition in this member's view, if any (Tooz:
    /// `members_for_object`; one member, or none while the partition moves).
    pub fn members_for_object(&self, key: &str) -> Vec<String> {
        let partition = self.partition_of(key);
        self.shared.state().owners.get(partition as usize).cloned().flatten().into_iter().collect()
    }

    /// The term under which this member owns the key now, if it does (Tooz: `belongs_to_self`).
    pub fn belongs_to_self(&self, key: &str) -> Option<Term> {
        self.shared.owns(self.partition_of(key))
    }

    /// A guard for the key's partition, if this member owns it now.
    pub fn guard_for_key(&self, key: &str) -> Option<PartitionGuard> {
        self.shared.guard_for_key(key)
    }

    /// A guard for a partition, if this member owns it now.
    pub fn guard(&self, partition: u32) -> Option<PartitionGuard> {
        self.shared.guard(partition)
    }

    /// Leaves the group: revokes every partition, waits for their guards (up to the drain
    /// timeout), releases them in one write, and marks the member record `Left`.
    pub async fn leave(mut self) -> Result<(), GroupError> {
        let _ = self.commands.send(Command::Leave);
        let Some(task) = self.task.take() else { return Ok(()) };
        task.await.map_err(|error| GroupError::DriverStopped(error.to_string()))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

type Completion = Pin<Box<dyn Future<Output = Done> + Send>>;

enum Done {
    Read(Result<Snapshot, StoreError>),
    Write(Key, Result<Version, StoreError>),
    Delete(Key, Result<(), StoreError>),
}

struct Driver<S> {
    identity: String,
    core: MemberCore,
    store: Arc<S>,
    shared: Arc<Shared>,
    assignment: watch::Sender<Assignment>,
    commands: mpsc::UnboundedReceiver<Command>,
    origin: Instant,
    timing: Timing,
    drain_timeout: Duration,
    /// Revoked partitions waiting for their guards, with the drain deadline.
    draining: BTreeMap<u32, (Term, Instant)>,
    /// What the published owners were computed from (see `publish`).
    owners_from: Option<OwnersFrom>,
}

/// The table version, live members and own partitions the owner of every partition follows from.
type OwnersFrom = (Option<Version>, Vec<String>, BTreeMap<u32, Term>);

impl<S: GroupStore> Driver<S> {
    fn mono(&self, at: Instant) -> MonotonicTime {
        MonotonicTime(at.saturating_duration_since(self.origin))
    }

    fn instant(&self, at: MonotonicTime) -> Instant {
        self.origin + at.0
    }

    async fn run(mut self, mut watch: Option<RecordStream>) {
        let mut inflight: FuturesUnordered<Completion> = FuturesUnordered::new();
        let mut reopen_watch_at: Option<Instant> = None;
        let store_name = self.store.describe();
        // A store that keeps failing: one warning per streak and a summary a minute, as for an
        // elector's lock, not one per retry.
        let mut failures = tenure::FailureLog::of("group store");
        let identity = self.identity.clone();
        loop {
            let now = Instant::now();
            let mono = self.mono(now);
            if reopen_watch_at.is_some_and(|at| now >= at) {
                reopen_watch_at = None;
                // A record stream starts with a resync once its watch is established; a plain
                // change stream does not, so read now too (changes during the outage are missed).
                watch = self.store.watch_records();
                self.core.on_change(mono);
            }
            // Until nothing changes: a revoke may be drained at once (no guards), which lets the
            // core write the release right away.
            loop {
                let mut progressed = self.handle_events(now);
                progressed |= self.finish_drains(now);
                while let Some(action) = self.core.poll_action(mono) {
                    inflight.push(self.start(action));
                    progressed = true;
                }
                progressed |= self.handle_events(now);
                if !progressed {
                    break;
                }
            }
            self.publish(now);
            if self.core.has_left() {
                return;
            }

            let drains = self.draining.values().map(|(_, deadline)| *deadline);
            let wake = self
                .core
                .next_wakeup(mono)
                .map(|t| self.instant(t))
                .into_iter()
                .chain(drains)
                .chain(reopen_watch_at)
                .min();
            let sleep = tokio::time::sleep_until(wake.unwrap_or_else(|| now + self.timing.retry_period));
            tokio::select! {
                Some(done) = inflight.next(), if !inflight.is_empty() => {
                    let mono = self.mono(Instant::now());
                    match done {
                        Done::Read(result) => {
                            match &result {
                                Err(error) => failures.log_failed(&identity, &format!("reading the group in {store_name}"), error),
                                Ok(_) => failures.log_reached(&identity),
                            }
                            self.core.on_read(mono, result);
                        }
                        Done::Write(key, result) => {
                            match result.as_ref().err().filter(|e| !e.is_conflict()) {
                                Some(error) => failures.log_failed(&identity, &format!("writing {key} to the group in {store_name}"), error),
                                None => failures.log_reached(&identity),
                            }
                            self.core.on_write(mono, &key, result);
                        }
                        Done::Delete(key, result) => {
                            match &result {
                                Err(StoreError::Rejected(error)) => tracing::warn!(store = %store_name, %key, %error, "the store cannot delete the records of departed members; they stay"),
                                Err(error) if !error.is_conflict() => failures.log_failed(&identity, &format!("deleting the departed member's record {key} in {store_name}"), error),
                                Err(_) => failures.log_reached(&identity),
                                Ok(()) => {
                                    failures.log_reached(&identity);
                                    tracing::debug!(store = %store_name, %key, "deleted a departed member's record");
                                }
                            }
                            self.core.on_delete(mono, &key, result);
                        }
                    }
                }
                change = next_change(&mut watch), if watch.is_some() => {
                    match change {
                        Some(Ok(change)) => self.core.on_store_change(self.mono(Instant::now()), change),
                        other => {
                            if let Some(Err(error)) = other {
                                failures.log_failed(&identity, &format!("watching the group in {store_name}"), &error);
                            }
                            watch = None;
                            reopen_watch_at = Some(Instant::now() + self.timing.retry_period);
                        }
                    }
                }
                command = self.commands.recv() => {
                    match command {
                        Some(Command::Leave) => self.core.leave(self.mono(Instant::now())),
                        // The `Group` was dropped: it aborts this task; nothing to do until then.
                        None => std::future::pending::<()>().await,
                    }
                }
                _ = self.shared.guard_dropped.notified() => {}
                _ = sleep => {}
            }
        }
    }

    fn start(&self, action: Action) -> Completion {
        let (store, timeout) = (self.store.clone(), self.timing.call_timeout);
        match action {
            Action::Read => Box::pin(async move { Done::Read(timed(timeout, store.read()).await) }),
            Action::Write { key, expected, value } => Box::pin(async move {
                let result = timed(timeout, store.write(&key, expected, &value)).await;
                Done::Write(key, result)
            }),
            Action::Delete { key, expected } => Box::pin(async move {
                let result = timed(timeout, store.delete(&key, expected)).await;
                Done::Delete(key, result)
            }),
        }
    }

    /// Logs the core's events and starts drains; true if there was any.
    fn handle_events(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(event) = self.core.poll_event() {
            any = true;
            match &event {
                GroupEvent::Revoked { partition, term } => {
                    self.set_draining(*partition, Some((*term, now + self.drain_timeout)));
                    tracing::info!(partition, %term, "partition revoked; draining");
                }
                GroupEvent::Acquired { partition, term } => tracing::debug!(partition, %term, "partition acquired"),
                GroupEvent::Restored { partition, term } => {
                    self.set_draining(*partition, None);
                    tracing::info!(partition, %term, "revoked partition stays after all");
                }
                GroupEvent::Released { partition, term } => tracing::debug!(partition, %term, "partition released"),
                GroupEvent::Lost { partition, term } => {
                    self.set_draining(*partition, None);
                    tracing::warn!(partition, %term, "partition lost without a release");
                }
                GroupEvent::MembershipLost { epoch } => {
                    tracing::warn!(epoch, "membership lapsed (no renew within the renew deadline); rejoining")
                }
                GroupEvent::Joined { epoch } => tracing::info!(epoch, "joined the group"),
                GroupEvent::DuplicateIdentity { other_incarnation } => tracing::error!(
                    other_incarnation,
                    "another process is a member under this identity; waiting until its lease runs out"
                ),
                GroupEvent::PartitionCountMismatch { configured, group } => tracing::error!(
                    configured,
                    group,
                    "this member is configured with another partition count than the group's; using the group's"
                ),
                GroupEvent::CorruptTable => {
                    tracing::error!(
                        "the group's partition table is inconsistent; nothing is claimed until it is repaired"
                    )
                }
                GroupEvent::Left => tracing::info!("left the group"),
                GroupEvent::MissedChange { version } => tracing::error!(
                    %version,
                    "the group's watch lost a change (found by the once-per-lease read); please report this"
                ),
            }
        }
        any
    }

    /// Tells the core about revoked partitions whose guards are gone or whose drain timed out;
    /// true if there was any.
    fn finish_drains(&mut self, now: Instant) -> bool {
        let mono = self.mono(now);
        let done: Vec<(u32, bool)> = {
            let state = self.shared.state();
            self.draining
                .iter()
                .filter_map(|(partition, (term, deadline))| {
                    let idle = !state.guards.contains_key(&(*partition, *term));
                    (idle || now >= *deadline).then_some((*partition, idle))
                })
                .collect()
        };
        let any = !done.is_empty();
        for (partition, idle) in done {
            if !idle {
                tracing::warn!(partition, "drain timeout: releasing a partition whose guards are still held");
            }
            self.set_draining(partition, None);
            self.core.on_drained(mono, partition);
        }
        any
    }

    /// Starts (`Some`) or ends (`None`) the drain of a partition, here and in the shared state.
    fn set_draining(&mut self, partition: u32, drain: Option<(Term, Instant)>) {
        let mut state = self.shared.state();
        if let Some((term, _)) = self.draining.remove(&partition) {
            state.draining.remove(&(partition, term));
        }
        if let Some((term, deadline)) = drain {
            state.draining.insert((partition, term));
            self.draining.insert(partition, (term, deadline));
        }
    }

    fn publish(&mut self, now: Instant) {
        let mono = self.mono(now);
        let count = self.core.partition_count();
        let owned = self.core.owned(mono);
        let members: Vec<String> = self.core.live_members(mono).into_iter().map(|m| m.identity).collect();
        // The owner of each partition (a pass over all of them) only when what it follows from
        // changed: a member at rest publishes after every other member's renew.
        let from = (self.core.table_version(), members.clone(), owned.clone());
        let owners: Option<Vec<Option<String>>> = (self.owners_from.as_ref() != Some(&from)).then(|| {
            self.owners_from = Some(from);
            (0..count).map(|p| self.core.owner_of(p, mono)).collect()
        });
        let shrunk = {
            let mut state = self.shared.state();
            let valid_until = self.core.valid_until().filter(|_| self.core.is_member(mono)).map(|t| self.instant(t));
            let shrunk =
                state.active != owned || state.valid_until.is_some_and(|old| valid_until.is_none_or(|new| new < old));
            state.partition_count = count;
            state.active = owned.clone();
            state.working = self.core.working(mono).collect();
            state.missed_changes = self.core.missed_changes();
            state.valid_until = valid_until;
            if let Some(owners) = owners {
                state.owners = owners;
            }
            state.members = members.clone();
            shrunk
        };
        if shrunk {
            self.shared.ownership_changed.notify_waiters();
        }
        let assignment = Assignment { partition_count: count, members, owned, epoch: self.core.epoch() };
        self.assignment.send_if_modified(|current| std::mem::replace(current, assignment.clone()) != assignment);
    }
}

/// `call`, failing with [`StoreError::Timeout`] after `timeout`.
async fn timed<T>(timeout: Duration, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call).await.unwrap_or(Err(StoreError::Timeout(timeout)))
}

async fn next_change(watch: &mut Option<RecordStream>) -> Option<Result<Change, StoreError>> {
    match watch {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::memory::MemoryGroupStore;

    const PARTITIONS: u32 = 8;

    fn timing() -> Timing {
        // lease 4 s, renew deadline 2 s, retry 1 s
        Timing::from_ttl(Duration::from_secs(4)).unwrap()
    }

    fn join(store: &MemoryGroupStore, identity: &str) -> Group {
        Group::builder(identity, store.client(identity))
            .config(GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 })
            .drain_timeout(Duration::from_secs(60))
            .join()
            .unwrap()
    }

    /// Waits in virtual time until `done` holds, failing the test after a minute.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn owned(group: &Group) -> Vec<u32> {
        group.assignment().borrow().owned.keys().copied().collect()
    }

    /// When the guard's `ended()` completed, recorded by a task that holds the guard.
    fn watch_end(guard: PartitionGuard) -> Arc<Mutex<Option<Instant>>> {
        let ended = Arc::new(Mutex::new(None));
        let record = ended.clone();
        tokio::spawn(async move {
            guard.ended().await;
            *record.lock().unwrap() = Some(Instant::now());
            // The guard is dropped here, after the record: the drain waited for it until then.
        });
        ended
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_ends_the_moment_its_partition_is_revoked_and_not_before() {
        let store = MemoryGroupStore::new();
        let a = join(&store, "a");
        until("a owns every partition", || owned(&a).len() == PARTITIONS as usize).await;
        let ownership = a.ownership();
        let ends: Vec<(u32, Arc<Mutex<Option<Instant>>>)> =
            (0..PARTITIONS).map(|p| (p, watch_end(ownership.guard(p).expect("a owns it")))).collect();
        // When each partition left a's published assignment.
        let revoked_at = Arc::new(Mutex::new(BTreeMap::<u32, Instant>::new()));
        let mut assignment = a.assignment();
        let record = revoked_at.clone();
        tokio::spawn(async move {
            while assignment.changed().await.is_ok() {
                let now = Instant::now();
                let owned = assignment.borrow_and_update().owned.clone();
                let mut revoked = record.lock().unwrap();
                for partition in (0..PARTITIONS).filter(|p| !owned.contains_key(p)) {
                    revoked.entry(partition).or_insert(now);
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(ends.iter().all(|(_, ended)| ended.lock().unwrap().is_none()), "no guard ended while owned");

        let b = join(&store, "b");
        until("b owns half", || owned(&b).len() == PARTITIONS as usize / 2).await;
        let kept = owned(&a);
        assert_eq!(kept.len(), PARTITIONS as usize / 2);
        let revoked_at = revoked_at.lock().unwrap().clone();
        for (partition, ended) in &ends {
            let ended = *ended.lock().unwrap();
            if kept.contains(partition) {
                assert_eq!(ended, None, "partition {partition} is still a's");
            } else {
                let (ended, revoked) = (ended.expect("the guard ended"), revoked_at[partition]);
                // At once, not at the next deadline or renew: the drain waits for nothing else.
                assert!(ended <= revoked + Duration::from_millis(5), "partition {partition}: {ended:?} vs {revoked:?}");
            }
        }
        assert!(ownership.is_member());
    }

    #[tokio::test(start_paused = true)]
    async fn guards_and_the_membership_end_at_the_deadline_on_the_local_clock_when_the_driver_is_gone() {
        let store = MemoryGroupStore::new();
        let a = join(&store, "a");
        until("a owns every partition", || owned(&a).len() == PARTITIONS as usize).await;
        let ownership = a.ownership();
        let guard = ownership.guard_for_key("default/x").expect("a owns every key");
        let deadline = a.shared.state().valid_until.expect("a member");

        // The driver stops without a word (a crash of the task); nothing is published again.
        drop(a);
        tokio::time::timeout(Duration::from_secs(60), guard.ended()).await.expect("the guard ends at the deadline");
        assert!(Instant::now() >= deadline && Instant::now() < deadline + Duration::from_millis(10));
        assert!(!guard.is_valid());
        assert!(!ownership.is_member());
        tokio::time::timeout(Duration::from_millis(1), ownership.membership_ended()).await.expect("ended already");
        assert!(ownership.guard_for_key("default/x").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_membership_ends_when_the_member_leaves() {
        let store = MemoryGroupStore::new();
        let a = join(&store, "a");
        until("a is a member", || a.ownership().is_member()).await;
        let ownership = a.ownership();
        let ended = tokio::spawn(async move { ownership.membership_ended().await });
        a.leave().await.unwrap();
        tokio::time::timeout(Duration::from_millis(1), ended).await.expect("ended at the leave").unwrap();
    }
}
