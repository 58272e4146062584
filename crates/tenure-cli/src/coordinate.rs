//! `tenure coordinate`: one process that holds a Tooz coordinator's elections, locks and group
//! memberships, for the Python Tooz driver (`python/tenure/tooz_driver.py`) that runs it as a child.
//!
//! Why a child process and not bindings in the interpreter: the elections and locks keep Tenure's
//! guarantees (compare-and-swap on every write, self-fencing, a term per tenure) whatever the
//! interpreter does, with the code the fault suite checks; one wheel serves every Python version.
//! Why one child for all of a coordinator's elections, locks and groups: Tooz code takes many
//! locks; an elector is a task here, not a process.
//!
//! The session follows Tooz's heartbeat model: every request of the application is a sign of
//! life, and a request in flight (a long poll) counts for as long as it lasts. When the
//! application said nothing for the session timeout (`--ttl`), as when it is frozen, the child
//! ends the session as a graceful stop would (locks released, leaderships resigned, groups left)
//! and answers 410 from then on, so another replica takes over while this one cannot act. What
//! the child reports as valid is never longer than the session, so a driver that counts validity
//! from when it sent its request stops trusting a tenure before the child releases it.
//!
//! Every election, lock and group lives at a URL nested in `--lock` ([`Backend::nested`]): one
//! election per Tooz group (`election-GROUP`), one per lock (`lock-NAME`), one group store per Tooz
//! group (`group-GROUP`, a member record per member, with its capabilities), and the registry of
//! groups (`groups`: one record per group, so that `get_groups`, creation and deletion work
//! alike on every store).

mod routes;
mod session;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use tenure::{Elector, Term, Timing};
use tenure_group::record::{MemberRecord, MemberState};
use tenure_group::silence::Silences;
use tenure_group::store::{GroupStore, Key, Snapshot, StoreError, Stored, Value, Version};
use tenure_kube::coordinated::CandidateVersions;
use tenure_kube::ClusterOptions;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::{CampaignEnd, CampaignRequest, LockUrl, LockUrlParser, Observation, StatusSource};
use crate::options::{parse_http_address, CandidateOptions, ClusterArgs, CoordinationOptions, HttpAddress};
use crate::signals::TerminationSignals;
use crate::error::CliError;
use crate::{exit, http, logging};


/// Arguments of `tenure coordinate`.
#[derive(Debug, Args)]
#[command(
    about = "Hold a Tooz coordinator's elections, locks and groups (run by the Python Tooz driver)",
    long_about = "Holds the elections, locks and group memberships of one Tooz coordinator under one \
        store URL and serves them over HTTP to the Python Tooz driver that runs this process. Every \
        request is a sign of life of the application; after --ttl without one, everything is released.",
    after_help = "Example:  tenure coordinate --lock etcd://127.0.0.1:2379/tooz --id worker-1 --http 127.0.0.1:0"
)]
pub struct CoordinateArgs {
    /// Where everything lives: file:///absolute/directory, etcd://host:port/prefix,
    /// zk://host:port/path or kube://NAMESPACE/leases/PREFIX.
    #[arg(long, value_name = "URL", value_parser = LockUrlParser)]
    lock: LockUrl,

    /// Serve the HTTP API on this address (host:port; port 0 picks a free one).
    #[arg(long, value_name = "ADDR", value_parser = parse_http_address)]
    http: HttpAddress,

    /// Stop (releasing everything) when standard input reaches its end: the driver's pipe, which
    /// closes when the application dies, however it dies.
    #[arg(long)]
    stdin_lifeline: bool,

    /// The identity written as the holder of elections and locks (default: --id). Why apart
    /// from --id: --id names store objects, so it must be a short safe name (the Tooz driver
    /// hashes a long member id into one), while the holder is data that leaders are reported
    /// by, so it can carry the member id's full reversible form. Visible ASCII, at most 4,200
    /// characters.
    #[arg(long, value_name = "NAME")]
    holder: Option<String>,

    #[command(flatten)]
    candidate: CandidateOptions,

    /// Coordinated Leader Election for the elections (a Kubernetes base only). Not for the
    /// locks: a lock goes to whoever asks first, and a version preference would make a holder
    /// wait for a coordinator instead.
    #[command(flatten)]
    coordination: CoordinationOptions,

    #[command(flatten)]
    cluster: ClusterArgs,
}

/// Why a request could not be served; each maps to one HTTP status and a `kind` clients test.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A name outside the safe alphabet, or one the store cannot hold.
    #[error("{0}")]
    BadName(String),
    /// A request body that is not JSON.
    #[error("the body is not JSON: {0}")]
    BadBody(String),
    /// The group is not in the registry.
    #[error("group {0:?} does not exist")]
    GroupNotCreated(String),
    /// The group is in the registry already.
    #[error("group {0:?} already exists")]
    GroupExists(String),
    /// The group still has live members.
    #[error("group {0:?} still has members")]
    GroupNotEmpty(String),
    /// A live member with this identity is in the group already.
    #[error("member {1:?} is already in group {0:?}")]
    MemberExists(String, String),
    /// The member is not in the group (left, expired, or never joined).
    #[error("member {1:?} is not in group {0:?}")]
    MemberNotJoined(String, String),
    /// The lock is held by this coordinator already.
    #[error("lock {0:?} is held by this coordinator already")]
    HeldHere(String),
    /// The application was silent for the session timeout: everything was released.
    #[error("the session ended: no request from the application for {0:?}, so every lock, leadership and membership was released")]
    SessionExpired(Duration),
    /// The store could not be reached in time, or failed; retrying is safe.
    #[error("{0}")]
    Unavailable(String),
    /// A fenced write was refused by the store: the tenure of its term is over.
    #[error("{0}")]
    Deposed(String),
    /// A fenced write this store cannot make (a Kubernetes base, a relative ZooKeeper path).
    #[error("{0}")]
    CannotWrite(String),
}

/// The longest `--holder`: a 2,048-byte Tooz member id in hex with its `x-` prefix, and room.
pub const LONGEST_HOLDER: usize = 4200;

/// Checks a `--holder`: non-empty visible ASCII (it travels in records and request headers).
pub fn check_holder(holder: &str) -> Answer<()> {
    let fits = !holder.is_empty() && holder.len() <= LONGEST_HOLDER && holder.bytes().all(|b| b.is_ascii_graphic());
    fits.then_some(()).ok_or_else(|| {
        Refusal::BadName(format!("the holder {holder:?} is not 1 to {LONGEST_HOLDER} visible ASCII characters"))
    })
}

/// A lock or leadership held through an elector of this process.
struct Campaigning {
    elector: Elector,
    ending: Box<dyn CampaignEnd>,
    /// For a lock: the term an answer told the application it holds (a campaign that won between
    /// two of the application's requests is still to be told).
    told: Option<Term>,
}

/// This coordinator's membership of one Tooz group.
struct Joined {
    version: Version,
    record: MemberRecord,
}

/// What the coordinator holds; behind a mutex never held across an await.
#[derive(Default)]
struct Held {
    elections: HashMap<String, Campaigning>,
    locks: HashMap<String, Campaigning>,
    joined: HashMap<String, Joined>,
    /// When this process first saw each member record at its current version (group, member):
    /// a record unchanged for its lease on this clock belongs to a member that stopped renewing
    /// (the sans-IO rule of [`Silences`], on the clock of [`Coordinator::clock_origin`]).
    seen: Silences<(String, String)>,
    /// Group stores by group, connected once.
    stores: HashMap<String, Arc<dyn GroupStore>>,
    /// Readers of elections by URL, connected once (a fresh answer reads the store each time).
    sources: HashMap<String, Arc<dyn StatusSource>>,
    /// Per election: the gap epoch ([`session::Pulse`]) in which its view last caught up with a
    /// read of the store, and its elector's count of failed calls to the store then (see
    /// [`Coordinator::view_is_fresh`]).
    confirmed: HashMap<String, (u64, u64)>,
}

/// One Tooz coordinator's state.
pub struct Coordinator {
    identity: String,
    /// Who this coordinator is in election and lock records (`--holder`, else the identity).
    holder: String,
    base: LockUrl,
    cluster: ClusterOptions,
    timing: Timing,
    /// `--coordinated`: the versions the elections' candidates publish (Kubernetes' Coordinated
    /// Leader Election).
    versions: Option<CandidateVersions>,
    incarnation: u64,
    /// Where this process's monotonic clock, as the sans-IO decisions see it, reads zero.
    clock_origin: Instant,
    held: Mutex<Held>,
    session: session::Session,
    /// This process's own turns: whether it was frozen since a view was proven fresh.
    pulse: session::Pulse,
    /// Counts changes a driver waits for (`GET /changes`): leaderships, lost locks, the session.
    changes: watch::Sender<u64>,
    /// Cancelled to stop the process (POST /stop, stdin closed, a signal).
    stop: CancellationToken,
}

type Answer<T> = Result<T, Refusal>;

/// Maps a store failure to a refusal (every one of them is safe to retry).
fn unavailable(what: &str) -> impl FnOnce(StoreError) -> Refusal + '_ {
    move |error| Refusal::Unavailable(format!("cannot {what}: {error}"))
}

/// Checks that `name` is a safe name: `[a-z0-9]([a-z0-9-]*[a-z0-9])?`, 1 to 40 characters.
pub fn check_name(name: &str) -> Answer<()> {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let safe = (1..=40).contains(&name.len())
        && name.chars().all(|c| alphanumeric(c) || c == '-')
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric);
    safe.then_some(()).ok_or_else(|| {
        Refusal::BadName(format!(
            "{name:?} is not a safe name (1 to 40 lower-case letters, digits and '-', starting and ending with a letter or digit)"
        ))
    })
}

impl Coordinator {
    fn new(
        identity: String, holder: String, base: LockUrl, cluster: ClusterOptions, timing: Timing,
        versions: Option<CandidateVersions>,
    ) -> Arc<Self> {
        Arc::new(Coordinator {
            identity,
            holder,
            base,
            cluster,
            timing,
            versions,
            incarnation: rand::random(),
            clock_origin: Instant::now(),
            held: Mutex::default(),
            session: session::Session::new(timing.lease_duration),
            pulse: session::Pulse::new(),
            changes: watch::channel(0).0,
            stop: CancellationToken::new(),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|version| *version += 1);
    }

    /// The URL of `kind-name` under the base URL.
    fn nested(&self, kind: &str, name: &str) -> Answer<LockUrl> {
        let nested = if name.is_empty() { kind.to_owned() } else { format!("{kind}-{name}") };
        self.base.nested(&nested).ok_or_else(|| Refusal::BadName(format!("{} cannot hold {nested:?}", self.base)))
    }

    /// Bounds a store call by the renew deadline (a call that does not answer fails as a time-out).
    async fn within<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let limit = self.timing.renew_deadline;
        tokio::time::timeout(limit, call).await.unwrap_or(Err(StoreError::Timeout(limit)))
    }

    /// The store of `group` (`""`: the registry of groups), connected on first use.
    async fn store(&self, group: &str) -> Answer<Arc<dyn GroupStore>> {
        if let Some(store) = self.held().stores.get(group) {
            return Ok(store.clone());
        }
        let url = if group.is_empty() { self.nested("groups", "")? } else { self.nested("group", group)? };
        let connect = url.group_store(group, &self.identity, &self.cluster);
        let store = match tokio::time::timeout(self.timing.renew_deadline, connect).await {
            Ok(Ok(store)) => store,
            Ok(Err(error)) => return Err(Refusal::Unavailable(error.to_string())),
            Err(_) => return Err(Refusal::Unavailable(format!("cannot reach {url} within {:?}", self.timing.renew_deadline))),
        };
        Ok(self.held().stores.entry(group.to_owned()).or_insert(store).clone())
    }

    async fn read(&self, group: &str) -> Answer<Snapshot> {
        let store = self.store(group).await?;
        self.within(store.read()).await.map_err(unavailable("read the group"))
    }

    /// A record that says `identity` is alive, with capabilities.
    fn record(&self, identity: &str, capabilities: Option<serde_json::Value>) -> MemberRecord {
        MemberRecord {
            identity: identity.to_owned(),
            incarnation: self.incarnation,
            epoch: 1,
            state: MemberState::Alive,
            lease_millis: u64::try_from(self.timing.lease_duration.as_millis()).unwrap_or(u64::MAX),
            weight: 1,
            partition_count: 0,
            renewals: 0,
            capabilities,
        }
    }

    async fn require_group(&self, group: &str) -> Answer<Stored<MemberRecord>> {
        let registry = self.read("").await?;
        registry.members.get(group).cloned().ok_or_else(|| Refusal::GroupNotCreated(group.to_owned()))
    }

    // ----- groups -----

    /// The groups in the registry, each with what its creator recorded with it (the Tooz
    /// driver's full group id, where the name is a hash of it).
    pub async fn groups(&self) -> Answer<Vec<(String, serde_json::Value)>> {
        let registry = self.read("").await?.members.into_iter();
        Ok(registry.map(|(group, stored)| (group, stored.value.capabilities.unwrap_or_default())).collect())
    }

    /// Adds `group` to the registry, with `about` in its record (returned by [`Self::groups`]).
    pub async fn create_group(&self, group: &str, about: serde_json::Value) -> Answer<()> {
        let store = self.store("").await?;
        let about = (!about.is_null()).then_some(about);
        let record = Value::Member(self.record(group, about));
        match self.within(store.write(&Key::Member(group.to_owned()), None, &record)).await {
            Ok(_) => Ok(()),
            Err(StoreError::AlreadyExists) => Err(Refusal::GroupExists(group.to_owned())),
            Err(error) => Err(unavailable("create the group")(error)),
        }
    }

    /// Removes `group` from the registry if it has no live member.
    pub async fn delete_group(&self, group: &str) -> Answer<()> {
        let entry = self.require_group(group).await?;
        if !self.members(group).await?.is_empty() {
            return Err(Refusal::GroupNotEmpty(group.to_owned()));
        }
        let store = self.store("").await?;
        match self.within(store.delete(&Key::Member(group.to_owned()), entry.version)).await {
            Ok(()) => Ok(()),
            Err(StoreError::Conflict) => Err(Refusal::GroupNotCreated(group.to_owned())),
            Err(error) => Err(unavailable("delete the group")(error)),
        }
    }

    /// Joins `group` as this coordinator's identity.
    pub async fn join(&self, group: &str, capabilities: serde_json::Value) -> Answer<()> {
        self.require_group(group).await?;
        let store = self.store(group).await?;
        let key = Key::Member(self.identity.clone());
        let existing = self.read(group).await?.members.remove(&self.identity);
        let expected = match existing {
            Some(stored) if stored.value.state == MemberState::Alive && !self.lapsed(group, &stored) => {
                return Err(Refusal::MemberExists(group.to_owned(), self.identity.clone()));
            }
            Some(stored) => Some(stored.version),
            None => None,
        };
        let record = self.record(&self.identity, Some(capabilities));
        let version = self.within(store.write(&key, expected, &Value::Member(record.clone()))).await.map_err(|error| {
            match error {
                StoreError::AlreadyExists | StoreError::Conflict => {
                    Refusal::MemberExists(group.to_owned(), self.identity.clone())
                }
                error => unavailable("join the group")(error),
            }
        })?;
        self.held().joined.insert(group.to_owned(), Joined { version, record });
        Ok(())
    }

    /// Removes `member` from `group` (Tooz lets a coordinator with the same id boot a member out).
    pub async fn leave(&self, group: &str, member: &str) -> Answer<()> {
        self.require_group(group).await?;
        let not_joined = || Refusal::MemberNotJoined(group.to_owned(), member.to_owned());
        let own = member == self.identity;
        if own {
            self.held().joined.remove(group);
        }
        let store = self.store(group).await?;
        // This member's own renew may still be in flight and land between the read and the
        // delete: then the record moved on, and the delete is tried again from it.
        let mut attempts = if own { 3 } else { 1 };
        loop {
            attempts -= 1;
            let stored = self.read(group).await?.members.remove(member).filter(|s| s.value.state == MemberState::Alive);
            let stored = stored.ok_or_else(not_joined)?;
            match self.within(store.delete(&Key::Member(member.to_owned()), stored.version)).await {
                Ok(()) => return Ok(()),
                Err(StoreError::Conflict) if attempts > 0 => continue,
                Err(StoreError::Conflict) => return Err(not_joined()),
                Err(error) => return Err(unavailable("leave the group")(error)),
            }
        }
    }

    /// Whether a member record was unchanged for its lease on this process's clock (seen from
    /// its first read here: a record never seen before counts from now).
    fn lapsed(&self, group: &str, stored: &Stored<MemberRecord>) -> bool {
        let now = tenure::MonotonicTime(self.clock_origin.elapsed());
        let key = (group.to_owned(), stored.value.identity.clone());
        self.held().seen.lapsed(key, stored.version, stored.value.lease_millis, now)
    }

    /// The live members of `group` and their capabilities. A member whose record did not change
    /// for its lease is left out, and its record deleted by compare-and-swap (a renew that
    /// arrives first wins).
    pub async fn members(&self, group: &str) -> Answer<HashMap<String, serde_json::Value>> {
        self.require_group(group).await?;
        let snapshot = self.read(group).await?;
        let mut members = HashMap::new();
        for (id, stored) in snapshot.members {
            let ours = id == self.identity && self.held().joined.contains_key(group);
            if stored.value.state != MemberState::Alive || (!ours && self.lapsed(group, &stored)) {
                let store = self.store(group).await?;
                tracing::info!(group, member = id, "left out a member whose record stopped changing for its lease");
                let _ = self.within(store.delete(&Key::Member(id.clone()), stored.version)).await;
                self.held().seen.forget(&(group.to_owned(), id));
                continue;
            }
            members.insert(id, stored.value.capabilities.unwrap_or(serde_json::Value::Null));
        }
        Ok(members)
    }

    /// Replaces this member's capabilities in `group`.
    pub async fn update_capabilities(&self, group: &str, capabilities: serde_json::Value) -> Answer<()> {
        self.require_group(group).await?;
        let joined = self.held().joined.get(group).map(|j| (j.version, j.record.clone()));
        let Some((version, mut record)) = joined else {
            return Err(Refusal::MemberNotJoined(group.to_owned(), self.identity.clone()));
        };
        record.capabilities = Some(capabilities);
        record.renewals += 1;
        self.write_own(group, version, record).await
    }

    /// Writes this member's record in `group` at `version`; a conflict means it was booted out.
    async fn write_own(&self, group: &str, version: Version, record: MemberRecord) -> Answer<()> {
        let store = self.store(group).await?;
        let key = Key::Member(self.identity.clone());
        match self.within(store.write(&key, Some(version), &Value::Member(record.clone()))).await {
            Ok(version) => {
                if let Some(joined) = self.held().joined.get_mut(group) {
                    *joined = Joined { version, record };
                }
                Ok(())
            }
            Err(StoreError::Conflict) => {
                tracing::info!(group, "this member's record was removed by another coordinator: not in the group any more");
                self.held().joined.remove(group);
                Err(Refusal::MemberNotJoined(group.to_owned(), self.identity.clone()))
            }
            Err(error) => Err(unavailable("write this member's record")(error)),
        }
    }

    /// Renews every membership once (every retry period while the session lives).
    async fn renew_memberships(&self) {
        let joined: Vec<_> = self.held().joined.iter().map(|(g, j)| (g.clone(), j.version, j.record.clone())).collect();
        for (group, version, mut record) in joined {
            record.renewals += 1;
            if let Err(error) = self.write_own(&group, version, record).await {
                tracing::debug!(group, %error, "renew of the membership failed");
            }
        }
    }

    // ----- elections and locks -----

    async fn campaign(&self, url: LockUrl, coordinated: Option<CandidateVersions>) -> Answer<Campaigning> {
        let request = CampaignRequest {
            identity: &self.holder,
            timing: self.timing,
            cluster: &self.cluster,
            coordinated,
            leader_label: None,
        };
        let campaign = url.campaign(request).await.map_err(|e| Refusal::Unavailable(e.to_string()))?;
        self.forward_changes(campaign.elector.subscribe());
        Ok(Campaigning { elector: campaign.elector, ending: campaign.ending, told: None })
    }

    /// Bumps the change counter on every leadership change, until the elector is gone.
    fn forward_changes(&self, mut leadership: watch::Receiver<tenure::Leadership>) {
        let changes = self.changes.clone();
        tokio::spawn(async move {
            while leadership.changed().await.is_ok() {
                changes.send_modify(|version| *version += 1);
            }
        });
    }

    /// Starts campaigning in `group`'s election (nothing if it already does).
    pub async fn run_for_election(&self, group: &str) -> Answer<()> {
        if self.held().elections.contains_key(group) {
            return Ok(());
        }
        let campaigning = self.campaign(self.nested("election", group)?, self.versions.clone()).await?;
        let replaced = {
            let mut held = self.held();
            held.confirmed.remove(group);
            held.elections.insert(group.to_owned(), campaigning)
        };
        if let Some(other) = replaced {
            release(other).await;
        }
        Ok(())
    }

    /// Stops campaigning in `group`'s election, releasing the leadership if held.
    pub async fn withdraw(&self, group: &str) {
        let campaigning = {
            let mut held = self.held();
            held.confirmed.remove(group);
            held.elections.remove(group)
        };
        if let Some(campaigning) = campaigning {
            release(campaigning).await;
        }
    }

    /// Steps down in `group`'s election if leading (and stays a candidate).
    pub async fn stand_down(&self, group: &str) {
        let view = self.held().elections.get(group).map(|c| c.elector.view());
        if let Some(view) = view {
            if let Err(error) = view.resign().await {
                tracing::warn!(group, %error, "could not stand down");
            }
        }
    }

    /// Who leads `group`'s election now. Why not simply this process's view: the view follows the
    /// store through a watch and may lag it (a view that a freeze of this process left behind, a
    /// watch that broke), and a Tooz application acts on the answer at once. So: while this
    /// process leads (judged on its clock now, S1), the view. Else the view too where it is
    /// proven fresh (see [`Self::view_is_fresh`]): no request to the store, which is what keeps
    /// an application that asks ten times a second as cheap at rest as an idle one. Else one
    /// read of the store, and where the view is behind that read, a wait (up to the renew
    /// deadline) for the elector to catch up, so that a leadership this process won is reported
    /// as such. Where nobody leads (after a release, or before the first election), the wait is
    /// for the next tenure, up to a lease (candidates that just stood down wait that long before
    /// taking it back).
    ///
    /// `fresh`: read the store even if the view is proven fresh. The driver asks so after
    /// another coordinator of its process changed the store (a stand-down, a stop): the view of
    /// this one follows that change only as fast as its watch, and the application, which made
    /// both calls, expects the second to see the first.
    pub async fn election(&self, group: &str, fresh: bool) -> Answer<routes::ElectionReport> {
        let asked = Instant::now();
        let epoch = self.pulse.turn();
        let view = self.held().elections.get(group).map(|c| {
            let stats = c.elector.stats();
            // Every failed call counts: one that failed and healed between two requests too.
            let errors = (stats.consecutive_lock_errors == 0 && stats.lock_unreachable_since.is_none())
                .then_some(stats.lock_errors);
            (c.elector.subscribe(), self.validity(&c.elector), errors)
        });
        let url = self.nested("election", group)?;
        let Some((mut view, valid, errors)) = view else {
            let (leader, term) = self.read_election(url).await?;
            return Ok(routes::ElectionReport { leader, term, leading: false, valid_ms: None });
        };
        if valid.is_none() {
            let fresh = !fresh && self.view_is_fresh(group, epoch, errors);
            let (leader, term) = if fresh {
                let seen = view.borrow().clone();
                (seen.leader, seen.term.map(|t| t.0))
            } else {
                self.read_election(url).await?
            };
            let shown = leader.is_some();
            let caught_up = |seen: &tenure::Leadership| {
                let seen_term = seen.term.map(|t| t.0);
                if shown {
                    seen_term >= term
                } else {
                    seen.leader.is_some() && seen_term > term
                }
            };
            let limit = if shown { self.timing.renew_deadline } else { self.timing.lease_duration };
            if tokio::time::timeout(limit, view.wait_for(caught_up)).await.is_err() {
                return Ok(routes::ElectionReport { leader, term: term.filter(|_| shown), leading: false, valid_ms: None });
            }
            if let (false, Some(errors)) = (fresh, errors) {
                // The view caught up with a read made in this epoch: it is proof from now on,
                // for as long as no call to the store fails and this process runs without a gap.
                self.held().confirmed.insert(group.to_owned(), (epoch, errors));
            }
        }
        let leadership = view.borrow().clone();
        // Counted from when the request came, as the driver counts it from when it sent it: a
        // wait above must not shorten the validity the driver sees.
        let valid = self.held().elections.get(group).and_then(|c| self.validity_from(&c.elector, asked));
        Ok(routes::ElectionReport {
            leader: leadership.leader,
            term: leadership.term.map(|t| t.0),
            leading: valid.is_some(),
            valid_ms: valid,
        })
    }

    /// Whether this process's view of `group`'s election may answer for the store without a read.
    /// Proof, all of: the view caught up with a read of the store made since this process last
    /// had a gap in its event loop (`epoch`: [`session::Pulse`]; a freeze of this process, its
    /// own or with the application's, voids every proof), none of its elector's calls to the
    /// store failed since (`errors`: its count of failed calls, `None` while the store is
    /// unreachable; the watch that feeds the view stayed open), and the store pushes changes
    /// through a server's watch (etcd, ZooKeeper, Kubernetes). A file store is always read: a
    /// read is a local file read there, with no server to load, and inotify events come in
    /// bursts. So the store is read on the first request about an election, after a freeze of
    /// this process, and after a watch broke; the session's own end covers an application that
    /// was silent for its timeout.
    fn view_is_fresh(&self, group: &str, epoch: u64, errors: Option<u64>) -> bool {
        let watched = !self.base.to_string().starts_with("file:");
        let mut held = self.held();
        let proof = errors.map(|errors| (epoch, errors));
        if !watched || proof.is_none() || held.confirmed.get(group) != proof.as_ref() {
            held.confirmed.remove(group);
            return false;
        }
        true
    }

    /// Every election this coordinator campaigns in, each answered as [`Self::election`] does,
    /// at once: what `run_watchers` needs in one request.
    pub async fn elections(&self, fresh: bool) -> Answer<HashMap<String, routes::ElectionReport>> {
        let groups: Vec<String> = self.held().elections.keys().cloned().collect();
        let answers = futures::future::join_all(groups.iter().map(|group| self.election(group, fresh))).await;
        groups.into_iter().zip(answers).map(|(group, answer)| Ok((group, answer?))).collect()
    }

    /// How long this process's tenure stays valid from now, if it leads: the elector's renew
    /// deadline, never past the session's end.
    fn validity(&self, elector: &Elector) -> Option<u64> {
        self.validity_from(elector, Instant::now())
    }

    /// As [`Self::validity`], if it leads now, but counted from `from` (an earlier instant).
    fn validity_from(&self, elector: &Elector, from: Instant) -> Option<u64> {
        let now = Instant::now();
        elector.is_leader()?;
        let until = elector.valid_until()?.into_std().min(self.session.ends());
        until.checked_duration_since(now)?;
        u64::try_from(until.checked_duration_since(from)?.as_millis()).ok()
    }

    /// Takes the lock `name`: waits up to `wait` for the leadership of its election. With no
    /// wait, answers once the first look at the lock is done and stops campaigning if it lost;
    /// with a wait, keeps campaigning after a miss (the next request goes on from there) until
    /// `DELETE /locks/NAME`.
    pub async fn acquire(&self, name: &str, wait: Duration) -> Answer<Option<(Term, u64)>> {
        let existing = self.held().locks.get(name).map(|c| {
            let told = c.told.is_some() && c.told == c.elector.is_leader();
            (c.elector.subscribe(), told)
        });
        let mut leadership = match existing {
            Some((_, true)) => return Err(Refusal::HeldHere(name.to_owned())),
            Some((leadership, false)) => leadership,
            None => {
                let campaigning = self.campaign(self.nested("lock", name)?, None).await?;
                let leadership = campaigning.elector.subscribe();
                if let Some(raced) = self.held().locks.insert(name.to_owned(), campaigning) {
                    tokio::spawn(release(raced));
                }
                leadership
            }
        };
        // Without a wait: until the lock's holder is known (this process or another), bounded by
        // the renew deadline.
        let limit = if wait.is_zero() { self.timing.renew_deadline } else { wait };
        let decided = leadership.wait_for(|l| l.is_leader() || (wait.is_zero() && l.leader.is_some()));
        let _ = tokio::time::timeout(limit, decided).await;
        let acquired = self.held().locks.get_mut(name).and_then(|c| {
            let acquired = (c.elector.is_leader()?, self.validity(&c.elector)?);
            c.told = Some(acquired.0);
            Some(acquired)
        });
        if acquired.is_none() && wait.is_zero() {
            self.release_lock(name).await;
        }
        Ok(acquired)
    }

    /// Writes `content` to `target` (a file beside the lock, an etcd key, a ZooKeeper node)
    /// through the store of the lock or election `kind-name`, which refuses it once the tenure of
    /// `term` is over ([`crate::backend::Backend::write_fenced`]): the Tooz driver's fenced
    /// writes, whose lock or leadership term the application holds.
    pub async fn write_fenced(&self, kind: &str, name: &str, term: Term, target: &str, content: Vec<u8>) -> Answer<()> {
        let url = self.nested(kind, name)?;
        match url.write_fenced(term, std::path::Path::new(target), content).await {
            Ok(()) => Ok(()),
            Err(CliError::Deposed(why)) => Err(Refusal::Deposed(why)),
            Err(error @ (CliError::LockCannot { .. } | CliError::Ended(_))) => Err(Refusal::CannotWrite(error.to_string())),
            Err(error) => Err(Refusal::Unavailable(error.to_string())),
        }
    }

    /// Releases the lock `name`; true if this process held it until now.
    pub async fn release_lock(&self, name: &str) -> bool {
        let campaigning = self.held().locks.remove(name);
        let Some(campaigning) = campaigning else { return false };
        let held = campaigning.elector.is_leader().is_some();
        release(campaigning).await;
        held
    }

    /// Who holds the lock `name`, as this process's elector sees it or as a read finds it.
    pub async fn lock_holder(&self, name: &str) -> Answer<Option<String>> {
        let campaigning = self.held().locks.get(name).map(|c| c.elector.leadership().leader);
        match campaigning {
            Some(leader) => Ok(leader),
            None => Ok(self.read_election(self.nested("lock", name)?).await?.0),
        }
    }

    /// Who holds the election at `url`, and the term, as one read of the store finds it (the
    /// term of the last tenure when the record was released: nobody holds it, term given).
    async fn read_election(&self, url: LockUrl) -> Answer<(Option<String>, Option<u64>)> {
        let key = url.to_string();
        let cached = self.held().sources.get(&key).cloned();
        let read = async {
            let source = match cached {
                Some(source) => source,
                None => {
                    let source: Arc<dyn StatusSource> = Arc::from(url.status_source(&self.cluster).await?);
                    self.held().sources.entry(key.clone()).or_insert(source).clone()
                }
            };
            source.read().await
        };
        let observation = match tokio::time::timeout(self.timing.renew_deadline, read).await {
            Ok(Ok(observation)) => observation,
            Ok(Err(error)) => {
                self.held().sources.remove(&key);
                return Err(Refusal::Unavailable(error.to_string()));
            }
            Err(_) => return Err(Refusal::Unavailable(format!("cannot read {url} in time"))),
        };
        Ok(match observation {
            Observation::Record(Some(tenure::StoredRecord { record: Ok(record), .. })) => {
                let term = Some(Term::from_count(record.leader_transitions).0);
                ((!record.holder_identity.is_empty()).then_some(record.holder_identity), term)
            }
            Observation::Record(_) => (None, None),
            Observation::Leader(leader, _) => (leader.as_ref().map(|l| l.0.clone()), leader.map(|l| l.1 .0)),
        })
    }

    /// What a heartbeat answers: the session, and every leadership and lock held with how long
    /// it stays valid.
    pub fn report(&self) -> routes::HeartbeatReport {
        let held = self.held();
        let elections = held
            .elections
            .iter()
            .map(|(group, c)| {
                let leadership = c.elector.leadership();
                let valid = self.validity(&c.elector);
                let report = routes::ElectionReport {
                    leader: leadership.leader,
                    term: leadership.term.map(|t| t.0),
                    leading: valid.is_some(),
                    valid_ms: valid,
                };
                (group.clone(), report)
            })
            .collect();
        let locks = held
            .locks
            .iter()
            .filter_map(|(name, c)| {
                let term = c.elector.is_leader()?;
                Some((name.clone(), routes::LockReport { term: term.0, valid_ms: self.validity(&c.elector)? }))
            })
            .collect();
        routes::HeartbeatReport {
            timeout_ms: millis(self.timing.lease_duration),
            retry_ms: millis(self.timing.retry_period),
            version: *self.changes.borrow(),
            elections,
            locks,
        }
    }

    /// Releases everything: locks, leaderships, memberships (a graceful stop, or the session's end).
    async fn release_everything(&self) {
        let (elections, locks, joined) = {
            let mut held = self.held();
            (std::mem::take(&mut held.elections), std::mem::take(&mut held.locks), std::mem::take(&mut held.joined))
        };
        let releases = elections.into_values().chain(locks.into_values()).map(release);
        futures::future::join_all(releases).await;
        for (group, joined) in joined {
            if let Ok(store) = self.store(&group).await {
                let key = Key::Member(self.identity.clone());
                let _ = self.within(store.delete(&key, joined.version)).await;
            }
        }
        self.changed();
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Ends a campaign: the elector's release, within the backend's own steps.
async fn release(campaigning: Campaigning) {
    let Campaigning { elector, ending, .. } = campaigning;
    if let Err(error) = ending.finish(Box::pin(elector.shutdown())).await {
        tracing::warn!(%error, "release not confirmed");
    }
}

/// Runs `tenure coordinate` until stopped; returns the exit status.
pub async fn coordinate(args: CoordinateArgs) -> Result<u8, CliError> {
    logging::init(args.candidate.log_format);
    let mut signals = TerminationSignals::install().map_err(CliError::io("install signal handlers"))?;
    let identity = args.candidate.identity()?;
    check_name(&identity).map_err(CliError::refused)?;
    let holder = args.holder.clone().unwrap_or_else(|| identity.clone());
    check_holder(&holder).map_err(CliError::refused)?;
    if args.lock.nested("groups").is_none() {
        return Err(CliError::LockCannot {
            needs: "tenure coordinate needs a store shared by processes: file:///DIR, etcd://, zk:// or kube://NS/leases/PREFIX",
            lock: args.lock.to_string(),
        });
    }
    let cluster = args.cluster.options()?;
    let listener =
        TcpListener::bind(&args.http.0).await.map_err(CliError::io(format!("serve HTTP on {}", args.http.0)))?;
    let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| args.http.0.clone());
    let versions = args.coordination.versions()?;
    // Coordinated Leader Election is Kubernetes' (LeaseCandidates in the Leases' namespace): a
    // base without a namespace cannot take part, said before anything starts.
    if versions.is_some() && args.lock.namespace().is_none() {
        let needs = "--coordinated needs a Kubernetes base (kube://NAMESPACE/leases/PREFIX)";
        return Err(CliError::LockCannot { needs, lock: args.lock.to_string() });
    }
    let timing = args.candidate.ttl.timing;
    let coordinator = Coordinator::new(identity.clone(), holder, args.lock.clone(), cluster, timing, versions);
    tracing::info!(identity, store = %args.lock, timeout = ?coordinator.timing.lease_duration, "coordinating");
    tracing::info!(address, "serving the coordinator over HTTP");

    let stop_serving = CancellationToken::new();
    let server =
        tokio::spawn(http::serve(listener, routes::router(coordinator.clone()), stop_serving.clone().cancelled_owned()));
    if args.stdin_lifeline {
        crate::signals::stop_when_stdin_closes(coordinator.stop.clone());
    }
    tokio::spawn(session::keep(coordinator.clone()));
    tokio::spawn(session::keep_pulse(coordinator.clone()));

    tokio::select! {
        termination = signals.recv() => tracing::info!(signal = termination.name, "stopping: releasing everything"),
        () = coordinator.stop.cancelled() => tracing::info!("stopping: releasing everything"),
    }
    coordinator.stop.cancel();
    coordinator.release_everything().await;
    stop_serving.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    tracing::info!("released everything; exiting");
    Ok(exit::SUCCESS)
}
