//! The sans-IO core of one group member: membership lease, partition claims and the safe handoff,
//! driven by explicit time.
//!
//! [`MemberCore`] never reads a clock and never does I/O. Its driver asks it what to do
//! ([`MemberCore::poll_action`]; several actions may be in flight, at most one per record),
//! performs them on a [`crate::store::GroupStore`], and feeds the results back with the local
//! monotonic time of each step. What the application must do comes out as [`GroupEvent`]s.
//!
//! # The rules (invariant P1 of DESIGN.md)
//!
//! - **Membership is a lease (S1).** A member renews its own record every retry period (its only
//!   write at rest). It treats itself as a member, and believes in its partitions, only while
//!   `now < start of the last successful renew + renew_deadline` on its own clock. Past that it
//!   drops every partition at once ([`GroupEvent::Lost`]) and later rejoins with a new epoch.
//! - **An epoch ends by compare-and-swap.** Another member ends an epoch only after it saw the
//!   member's record unchanged for the record's whole lease on its own clock (S3), by writing the
//!   record as `Expired` at the version it saw. A renew the member still had in flight then fails,
//!   so the member cannot extend its belief past that moment; and because `renew_deadline <
//!   lease_duration`, it stopped believing before (up to the drift bound of
//!   [`tenure::Timing::max_clock_drift`]).
//! - **Revoke before assign.** Every ownership is recorded in the table as (member, epoch) with a
//!   term. A member claims a partition by compare-and-swap of the table, writing `term + 1`, and
//!   only if the slot is free (its owner stopped work and released it), or its owner's epoch is
//!   certainly over (its record is `Left`/`Expired` at that epoch, or shows a later epoch), or the
//!   owner's record has been absent or inconsistent for a whole lease on the claimer's clock.
//!   An owner that should give a partition away first stops believing ([`GroupEvent::Revoked`]),
//!   waits for the application to drain ([`MemberCore::on_drained`]), and only then releases it.
//! - **Belief starts with a successful claim**, and only if the membership epoch the claim was
//!   made in is still valid when the reply arrives.
//! - **Identity.** A record of this identity written by another process (another incarnation) is
//!   waited out like any other member's: the running process keeps the identity, the newcomer
//!   reports [`GroupEvent::DuplicateIdentity`] and joins only after the other's lease ran out.
//! - **Partition count.** The table fixes the group's count; a member configured otherwise adopts
//!   it and reports [`GroupEvent::PartitionCountMismatch`], so all members map keys alike.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tenure::{MonotonicTime, Term};

use crate::assignment::{assign, WeightedMember};
use crate::config::{record_lease, GroupConfig};
use crate::record::{MemberRecord, MemberState, Owner, PartitionTable, Slot};
use crate::store::{Change, Key, Snapshot, StoreError, Stored, Value, Version};

/// What the driver must do next on the store.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Read a snapshot ([`crate::store::GroupStore::read`]), then call [`MemberCore::on_read`].
    Read,
    /// Write a record ([`crate::store::GroupStore::write`]), then call [`MemberCore::on_write`]
    /// with the same key.
    Write {
        /// Which record.
        key: Key,
        /// The version it must still have (`None`: create it).
        expected: Option<Version>,
        /// The new content.
        value: Value,
    },
    /// Delete a record ([`crate::store::GroupStore::delete`]) if it is still at `expected`, then
    /// call [`MemberCore::on_delete`] with the same key.
    Delete {
        /// Which record (the record of a member whose epoch is over).
        key: Key,
        /// The version it must still have.
        expected: Version,
    },
}

/// What happened, for the driver and the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// This member joined (or rejoined) the group with this epoch.
    Joined {
        /// The new epoch.
        epoch: u64,
    },
    /// The membership lapsed (no renew within the renew deadline, or the record was taken):
    /// every partition was dropped at that instant.
    MembershipLost {
        /// The epoch that ended.
        epoch: u64,
    },
    /// This member owns the partition from now on, under this term.
    Acquired {
        /// The partition.
        partition: u32,
        /// Its term: the fencing token of work done under this ownership.
        term: Term,
    },
    /// The partition should move: stop starting work on it, finish what runs, then call
    /// [`MemberCore::on_drained`]. The ownership no longer counts from this instant.
    Revoked {
        /// The partition.
        partition: u32,
        /// The term that ends.
        term: Term,
    },
    /// A revoked partition that was still draining stays after all (the assignment changed
    /// back before it was released): the same ownership, under the same term, goes on.
    Restored {
        /// The partition.
        partition: u32,
        /// Its term, unchanged.
        term: Term,
    },
    /// The release of a drained partition is in the store: others may claim it.
    Released {
        /// The partition.
        partition: u32,
        /// The term that ended.
        term: Term,
    },
    /// The ownership ended without a release (membership lapsed, or the table shows another
    /// owner).
    Lost {
        /// The partition.
        partition: u32,
        /// The term that ended.
        term: Term,
    },
    /// Another process holds this identity; this one waits until that one's lease ran out.
    DuplicateIdentity {
        /// The other process's incarnation.
        other_incarnation: u64,
    },
    /// The once-per-lease read found a table the watch did not deliver within a retry period
    /// after (a lease): the watch lost a change without saying so. Never expected (the read has made up
    /// for it; a handoff waited a lease at most); counted in [`MemberCore::missed_changes`].
    MissedChange {
        /// The table version the watch did not deliver.
        version: Version,
    },
    /// The group's table has another partition count than this member's configuration: this
    /// member uses the group's.
    PartitionCountMismatch {
        /// This member's configuration.
        configured: u32,
        /// The group's.
        group: u32,
    },
    /// The table in the store is not consistent (slots and count differ): nothing is claimed.
    CorruptTable,
    /// This member left the group (after releasing everything).
    Left,
}

/// How this member holds a partition it claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// Owned: the application works on it.
    Active,
    /// Revoked: the application finishes its work; still counted as working by the checker.
    /// Back to `Active` if the assignment changes back before the drain ends.
    Draining,
    /// The application stopped: the release may be written.
    Drained,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    term: u64,
    state: Holding,
}

#[derive(Debug, Clone)]
struct ObservedMember {
    stored: Stored<MemberRecord>,
    /// Local time at which this version was first seen.
    seen_at: MonotonicTime,
}

#[derive(Debug, Clone, Copy)]
struct Membership {
    epoch: u64,
    version: Version,
    valid_until: MonotonicTime,
    next_renew: MonotonicTime,
    renewals: u64,
}

#[derive(Debug, Clone)]
enum WriteKind {
    Join { epoch: u64 },
    Renew { epoch: u64 },
    Leave,
    Tombstone,
    Delete,
    CreateTable,
    Table { epoch: u64, claims: Vec<(u32, u64)>, releases: Vec<(u32, u64)> },
}

#[derive(Debug, Clone)]
struct PendingWrite {
    started: MonotonicTime,
    kind: WriteKind,
    value: Value,
}

/// A read of the snapshot and the write counter when it was issued: records written after that
/// are newer in this member's view than in the read's reply.
#[derive(Debug, Clone, Copy)]
struct PendingRead {
    issued_at_write: u64,
    /// Issued because the once-per-lease read was due, not because a change asked for it.
    periodic: bool,
    /// [`MemberCore::resyncs_requested`] when it was issued.
    resyncs: u64,
}

/// The decision state of one member of one group. See the module documentation.
///
/// ```
/// use tenure::MonotonicTime;
/// use tenure_group::handoff::{Action, MemberCore};
/// use tenure_group::GroupConfig;
/// let config = GroupConfig { partition_count: 4, ..GroupConfig::default() };
/// let mut core = MemberCore::new("a", 1, config, true).unwrap();
/// assert_eq!(core.poll_action(MonotonicTime::ZERO), Some(Action::Read));
/// ```
#[derive(Debug)]
pub struct MemberCore {
    identity: String,
    incarnation: u64,
    config: GroupConfig,
    has_watch: bool,
    table: Option<Stored<PartitionTable>>,
    members: BTreeMap<String, ObservedMember>,
    /// Identities named as owners in the table without a record, since when (local time).
    absent_since: BTreeMap<String, MonotonicTime>,
    /// The longest lease seen in a record of each identity (to wait out one that disappeared).
    known_leases: BTreeMap<String, Duration>,
    membership: Option<Membership>,
    held: BTreeMap<u32, Held>,
    pending: BTreeMap<Key, PendingWrite>,
    pending_read: Option<PendingRead>,
    read_wanted: bool,
    has_read: bool,
    next_poll: MonotonicTime,
    retry_at: BTreeMap<Key, MonotonicTime>,
    read_retry_at: MonotonicTime,
    /// Counts completed writes and applied pushed changes; `written_at[key]` is the count when
    /// `key` last changed in this member's view by either (a read issued before is older there).
    writes_completed: u64,
    written_at: BTreeMap<Key, u64>,
    leaving: bool,
    left: bool,
    /// A renew met a conflict: renew again only after a read showed the record.
    renew_after_read: bool,
    events: VecDeque<GroupEvent>,
    reported_mismatch: Option<u32>,
    reported_duplicate: Option<u64>,
    reported_corrupt: bool,
    /// The last assignment computed, and what it was computed from.
    assignment_cache: Option<(AssignmentKey, Vec<Option<usize>>)>,
    /// False once the store refused a deletion: departed members' records are then kept.
    can_delete: bool,
    /// The highest epoch this process has joined with.
    last_epoch: u64,
    /// Counts [`Change::Resync`]s received, and the last one a completed read was issued after:
    /// while they differ the view may miss changes, and nothing is decided on it.
    resyncs_requested: u64,
    resyncs_read: u64,
    /// A table version a periodic read found ahead of the view, and until when the watch may
    /// still deliver it (it may have been on its way) before it counts as missed.
    unconfirmed_table: Option<(Version, MonotonicTime)>,
    /// Changes the watch lost that the periodic read found (see [`GroupEvent::MissedChange`]).
    missed_changes: u64,
}

/// What an assignment is a function of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AssignmentKey {
    table: Version,
    members: Vec<(String, u32)>,
    current: Vec<Option<usize>>,
}

/// Why a [`MemberCore`] could not be created.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The identity is empty or longer than 253 bytes (a Kubernetes object name).
    #[error("invalid member identity {0:?}: must be 1 to 253 bytes")]
    Identity(String),
}

impl MemberCore {
    /// A member named `identity`. `incarnation` tells this process apart from another one with the
    /// same identity (draw it at random); `has_watch` says whether the store pushes changes (then
    /// the member does not poll).
    pub fn new(
        identity: impl Into<String>,
        incarnation: u64,
        config: GroupConfig,
        has_watch: bool,
    ) -> Result<Self, CoreError> {
        let identity = identity.into();
        if identity.is_empty() || identity.len() > 253 {
            return Err(CoreError::Identity(identity));
        }
        config.validate()?;
        Ok(MemberCore {
            identity,
            incarnation,
            config,
            has_watch,
            table: None,
            members: BTreeMap::new(),
            absent_since: BTreeMap::new(),
            known_leases: BTreeMap::new(),
            membership: None,
            held: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_read: None,
            read_wanted: true,
            has_read: false,
            next_poll: MonotonicTime::ZERO,
            retry_at: BTreeMap::new(),
            read_retry_at: MonotonicTime::ZERO,
            writes_completed: 0,
            written_at: BTreeMap::new(),
            leaving: false,
            left: false,
            renew_after_read: false,
            events: VecDeque::new(),
            reported_mismatch: None,
            reported_duplicate: None,
            reported_corrupt: false,
            assignment_cache: None,
            can_delete: true,
            last_epoch: 0,
            resyncs_requested: 0,
            unconfirmed_table: None,
            missed_changes: 0,
            resyncs_read: 0,
        })
    }

    /// This member's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The term under which this member owns `partition` at local time `now`, if it does: the
    /// membership is valid and the partition is claimed and not revoked.
    pub fn owns(&self, partition: u32, now: MonotonicTime) -> Option<Term> {
        self.membership.as_ref().filter(|m| now < m.valid_until)?;
        match self.held.get(&partition) {
            Some(Held { term, state: Holding::Active }) => Some(Term(*term)),
            _ => None,
        }
    }

    /// The term of `partition` if work on it may still be running at `now`: owned, or revoked but
    /// not yet drained, while the membership is valid. The simulation's checker counts these.
    pub fn may_work_on(&self, partition: u32, now: MonotonicTime) -> Option<Term> {
        self.membership.as_ref().filter(|m| now < m.valid_until)?;
        match self.held.get(&partition) {
            Some(Held { term, state: Holding::Active | Holding::Draining }) => Some(Term(*term)),
            _ => None,
        }
    }

    /// Every partition work may still run on at `now` (see [`MemberCore::may_work_on`]).
    pub fn working(&self, now: MonotonicTime) -> impl Iterator<Item = (u32, Term)> + '_ {
        let member = self.is_member(now);
        self.held
            .iter()
            .filter(move |(_, h)| member && matches!(h.state, Holding::Active | Holding::Draining))
            .map(|(p, h)| (*p, Term(h.term)))
    }

    /// Every partition this member owns at `now`, with its term.
    pub fn owned(&self, now: MonotonicTime) -> BTreeMap<u32, Term> {
        if !self.is_member(now) {
            return BTreeMap::new();
        }
        self.held.iter().filter(|(_, h)| h.state == Holding::Active).map(|(p, h)| (*p, Term(h.term))).collect()
    }

    /// True while the membership is valid at `now`.
    pub fn is_member(&self, now: MonotonicTime) -> bool {
        self.membership.as_ref().is_some_and(|m| now < m.valid_until)
    }

    /// Until when the membership is valid, if it is.
    pub fn valid_until(&self) -> Option<MonotonicTime> {
        self.membership.map(|m| m.valid_until)
    }

    /// The current epoch, while a member.
    pub fn epoch(&self) -> Option<u64> {
        self.membership.map(|m| m.epoch)
    }

    /// True once this member left for good.
    pub fn has_left(&self) -> bool {
        self.left
    }

    /// The group's partition count as this member uses it: the table's once read, else the
    /// configured one.
    pub fn partition_count(&self) -> u32 {
        self.table
            .as_ref()
            .filter(|t| t.value.is_consistent())
            .map_or(self.config.partition_count, |t| t.value.partition_count)
    }

    /// The live members in this member's view at `now` (records renewed within their lease, not
    /// leaving), this member included while it is one; sorted by identity.
    pub fn live_members(&self, now: MonotonicTime) -> Vec<WeightedMember> {
        let leaving = self.table.as_ref().map(|t| &t.value.leaving);
        let mut list: Vec<WeightedMember> = self
            .members
            .iter()
            .filter(|(id, _)| **id != self.identity)
            .filter(|(_, o)| o.stored.value.state == MemberState::Alive && !self.expired(o, now))
            .filter(|(id, o)| {
                !leaving.is_some_and(|l| l.contains(&Owner { member: (*id).clone(), epoch: o.stored.value.epoch }))
            })
            .map(|(id, o)| WeightedMember { identity: id.clone(), weight: o.stored.value.weight.max(1) })
            .collect();
        if self.is_member(now) && !self.leaving {
            list.push(WeightedMember { identity: self.identity.clone(), weight: self.config.weight });
        }
        list.sort_by(|a, b| a.identity.cmp(&b.identity));
        list
    }

    /// The owner of `partition` in this member's view: a live member the table names at its
    /// current epoch.
    pub fn owner_of(&self, partition: u32, now: MonotonicTime) -> Option<String> {
        let table = self.table.as_ref()?;
        let owner = table.value.slots.get(partition as usize)?.owner.as_ref()?;
        if owner.member == self.identity {
            return self.owns(partition, now).map(|_| self.identity.clone());
        }
        let observed = self.members.get(&owner.member)?;
        let record = &observed.stored.value;
        (record.state == MemberState::Alive && record.epoch == owner.epoch && !self.expired(observed, now))
            .then(|| owner.member.clone())
    }

    /// How many changes the watch lost that the once-per-lease read found: 0 unless a store's
    /// watch (or this member's handling of it) loses events. Exported for an alert.
    pub fn missed_changes(&self) -> u64 {
        self.missed_changes
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<GroupEvent> {
        self.events.pop_front()
    }

    /// Leave the group: revoke every partition, release them after the drain, then mark the record
    /// `Left`. [`GroupEvent::Left`] comes once done.
    pub fn leave(&mut self, now: MonotonicTime) {
        self.check_lapse(now);
        self.leaving = true;
    }

    /// The store reported a change (or the watch was re-opened): read again.
    pub fn on_change(&mut self, now: MonotonicTime) {
        self.check_lapse(now);
        self.read_wanted = true;
    }

    /// A change pushed by the store's record watch ([`crate::store::GroupStore::watch_records`]):
    /// applied to this member's view like the same record in a snapshot, without reading the
    /// group. A record at a version no newer than the one in the view is a late event and is
    /// ignored; a change applied while a read is in flight wins over that read's reply.
    ///
    /// Why this is as safe as a snapshot: every decision that ends someone's ownership is a
    /// compare-and-swap at the version this member saw, so a view that lags only makes a write
    /// fail and a read follow; a record's lease is counted from when its version arrived here,
    /// which is never earlier than when it was written.
    pub fn on_store_change(&mut self, now: MonotonicTime, change: Change) {
        self.check_lapse(now);
        let key = match change {
            Change::Changed => {
                self.read_wanted = true;
                return;
            }
            Change::Resync => {
                self.read_wanted = true;
                self.resyncs_requested += 1;
                return;
            }
            Change::Put(key, stored) => {
                if key == Key::Table && self.unconfirmed_table.is_some_and(|(v, _)| v <= stored.version) {
                    self.unconfirmed_table = None;
                }
                let known = match &key {
                    Key::Table => self.table.as_ref().map(|t| t.version),
                    Key::Member(id) => self.members.get(id).map(|o| o.stored.version),
                };
                if known.is_some_and(|known| stored.version <= known) {
                    return;
                }
                match (&key, stored.value) {
                    (Key::Table, Value::Table(table)) => {
                        self.table = Some(Stored { version: stored.version, value: table })
                    }
                    (Key::Member(id), Value::Member(record)) if record.identity == *id => {
                        self.observe_member(now, id.clone(), Stored { version: stored.version, value: record })
                    }
                    _ => return,
                }
                key
            }
            Change::Deleted(Key::Table) => {
                // Tenure never deletes the table: someone did by hand; see what is left.
                self.read_wanted = true;
                return;
            }
            Change::Deleted(key) => {
                if let Key::Member(id) = &key {
                    if self.members.remove(id).is_none() {
                        return;
                    }
                }
                key
            }
        };
        self.mark_changed(&key);
        if key == Key::Member(self.identity.clone()) {
            self.check_own_record();
        }
        self.after_view_change(now);
    }

    /// Records that `key` changed in this member's view now (a read issued earlier is older).
    fn mark_changed(&mut self, key: &Key) {
        self.writes_completed += 1;
        self.written_at.insert(key.clone(), self.writes_completed);
    }

    /// The application finished its work on a revoked partition.
    pub fn on_drained(&mut self, now: MonotonicTime, partition: u32) {
        self.check_lapse(now);
        if let Some(held) = self.held.get_mut(&partition) {
            if held.state == Holding::Draining {
                held.state = Holding::Drained;
            }
        }
    }

    /// The earliest local time at which [`MemberCore::poll_action`] may have something new to do
    /// without any input (a renew, an expiry, a retry, a poll).
    pub fn next_wakeup(&self, now: MonotonicTime) -> Option<MonotonicTime> {
        let mut times: Vec<MonotonicTime> = Vec::new();
        if let Some(m) = &self.membership {
            times.push(m.next_renew);
            times.push(m.valid_until);
        }
        for observed in self.members.values() {
            if observed.stored.value.state == MemberState::Alive {
                times.push(observed.seen_at + record_lease(observed.stored.value.lease_millis));
            }
        }
        for (id, since) in &self.absent_since {
            times.push(*since + self.absent_lease(id));
        }
        times.extend(self.retry_at.values().copied());
        times.push(self.read_retry_at);
        times.push(self.next_poll);
        times.into_iter().filter(|t| *t > now).min()
    }

    fn expired(&self, observed: &ObservedMember, now: MonotonicTime) -> bool {
        now >= observed.seen_at + record_lease(observed.stored.value.lease_millis)
    }

    fn absent_lease(&self, identity: &str) -> Duration {
        self.known_leases.get(identity).copied().unwrap_or_default().max(self.config.timing.lease_duration)
    }

    /// Ends the membership if its deadline passed: every partition is dropped at that instant.
    fn check_lapse(&mut self, now: MonotonicTime) {
        if let Some(membership) = self.membership {
            if now >= membership.valid_until {
                self.lose_membership(membership.epoch);
            }
        }
    }

    fn lose_membership(&mut self, epoch: u64) {
        self.membership = None;
        for (partition, held) in std::mem::take(&mut self.held) {
            if held.state != Holding::Drained {
                self.events.push_back(GroupEvent::Lost { partition, term: Term(held.term) });
            }
        }
        self.events.push_back(GroupEvent::MembershipLost { epoch });
        self.read_wanted = true;
    }

    /// What to do next on the store, if anything; call again until `None`, then again after
    /// every input and at [`MemberCore::next_wakeup`].
    pub fn poll_action(&mut self, now: MonotonicTime) -> Option<Action> {
        self.check_lapse(now);
        if self.left {
            return None;
        }
        if let Some((version, _)) = self.unconfirmed_table.filter(|(_, deadline)| now >= *deadline) {
            self.unconfirmed_table = None;
            self.missed_changes += 1;
            self.events.push_back(GroupEvent::MissedChange { version });
        }
        let poll_due = now >= self.next_poll;
        if self.pending_read.is_none() && now >= self.read_retry_at && (self.read_wanted || poll_due) {
            let periodic = !self.read_wanted;
            self.read_wanted = false;
            self.pending_read = Some(PendingRead {
                issued_at_write: self.writes_completed,
                periodic,
                resyncs: self.resyncs_requested,
            });
            return Some(Action::Read);
        }
        if !self.has_read {
            return None;
        }
        if let Some(action) = self.own_record_action(now) {
            return Some(action);
        }
        if self.resyncs_read < self.resyncs_requested {
            // Changes were lost: until the read is in, only release what this member owns.
            return self.table_action(now, false);
        }
        if let Some(action) = self.tombstone_action(now) {
            return Some(action);
        }
        if let Some(action) = self.table_action(now, true) {
            return Some(action);
        }
        self.cleanup_action(now)
    }

    fn may_write(&self, key: &Key, now: MonotonicTime) -> bool {
        !self.pending.contains_key(key) && self.retry_at.get(key).is_none_or(|t| now >= *t)
    }

    fn start_write(
        &mut self,
        now: MonotonicTime,
        key: Key,
        expected: Option<Version>,
        value: Value,
        kind: WriteKind,
    ) -> Action {
        self.pending.insert(key.clone(), PendingWrite { started: now, kind, value: value.clone() });
        Action::Write { key, expected, value }
    }

    fn own_record(&self, epoch: u64, state: MemberState, renewals: u64) -> MemberRecord {
        MemberRecord {
            identity: self.identity.clone(),
            incarnation: self.incarnation,
            epoch,
            state,
            lease_millis: self.config.lease_millis(),
            weight: self.config.weight,
            partition_count: self.config.partition_count,
            renewals,
        }
    }

    /// The highest epoch of this identity named anywhere in the view.
    fn highest_own_epoch(&self) -> u64 {
        let in_record = self.members.get(&self.identity).map_or(0, |o| o.stored.value.epoch);
        let in_table = self.table.as_ref().map_or(0, |t| {
            t.value
                .slots
                .iter()
                .filter_map(|s| s.owner.as_ref())
                .chain(t.value.leaving.iter())
                .filter(|o| o.member == self.identity)
                .map(|o| o.epoch)
                .max()
                .unwrap_or(0)
        });
        in_record.max(in_table)
    }

    fn own_record_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let key = Key::Member(self.identity.clone());
        if !self.may_write(&key, now) {
            return None;
        }
        if let Some(membership) = self.membership {
            if self.leaving {
                let table_pending = self.pending.contains_key(&Key::Table);
                if self.held.is_empty() && !table_pending && !self.names_own_epoch() {
                    let record = self.own_record(membership.epoch, MemberState::Left, membership.renewals + 1);
                    let value = Value::Member(record);
                    return Some(self.start_write(now, key, Some(membership.version), value, WriteKind::Leave));
                }
            }
            if now >= membership.next_renew && !self.renew_after_read {
                let record = self.own_record(membership.epoch, MemberState::Alive, membership.renewals + 1);
                let kind = WriteKind::Renew { epoch: membership.epoch };
                return Some(self.start_write(now, key, Some(membership.version), Value::Member(record), kind));
            }
            return None;
        }
        if self.leaving {
            // Not a member: nothing to release (every belief ended with the membership).
            self.left = true;
            self.events.push_back(GroupEvent::Left);
            return None;
        }
        let epoch = self.highest_own_epoch() + 1;
        match self.members.get(&self.identity).cloned() {
            None => {
                if self.highest_own_epoch() > 0 {
                    // The table names this identity but its record is gone (deleted by hand, or a
                    // store that lost it): a process with it may still believe; wait a lease.
                    let since = *self.absent_since.entry(self.identity.clone()).or_insert(now);
                    if now < since + self.absent_lease(&self.identity) {
                        return None;
                    }
                }
                // No record: a first join, or one after the record of an earlier epoch of this
                // identity was deleted (departed members' records are). A process of that epoch
                // may still have writes in flight that name it, so the new epoch must differ from
                // every earlier one: it starts at a point drawn from this process's incarnation
                // (and above every epoch this process had), so two processes never share one.
                let drawn = u64::from(self.incarnation as u32);
                let epoch = epoch.max(self.last_epoch + 1).saturating_add(drawn);
                let record = self.own_record(epoch, MemberState::Alive, 0);
                Some(self.start_write(now, key, None, Value::Member(record), WriteKind::Join { epoch }))
            }
            Some(observed) => {
                let record = &observed.stored.value;
                if record.state == MemberState::Alive && record.incarnation != self.incarnation {
                    if self.reported_duplicate != Some(record.incarnation) {
                        self.reported_duplicate = Some(record.incarnation);
                        self.events.push_back(GroupEvent::DuplicateIdentity { other_incarnation: record.incarnation });
                    }
                    // Ended by `tombstone_action` once its lease ran out; then this process joins.
                    return None;
                }
                let value = Value::Member(self.own_record(epoch, MemberState::Alive, 0));
                Some(self.start_write(now, key, Some(observed.stored.version), value, WriteKind::Join { epoch }))
            }
        }
    }

    /// True when the table names this member's current epoch in a slot or as leaving.
    fn names_own_epoch(&self) -> bool {
        let (Some(table), Some(membership)) = (&self.table, &self.membership) else { return false };
        let me = Owner { member: self.identity.clone(), epoch: membership.epoch };
        table.value.slots.iter().any(|s| s.owner.as_ref() == Some(&me))
    }

    fn tombstone_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let target = self.members.iter().find_map(|(id, observed)| {
            let record = &observed.stored.value;
            let ours = *id == self.identity && record.incarnation == self.incarnation;
            let key = Key::Member(id.clone());
            (record.state == MemberState::Alive && !ours && self.expired(observed, now) && self.may_write(&key, now))
                .then(|| (key, observed.stored.clone()))
        })?;
        let (key, stored) = target;
        let record = MemberRecord { state: MemberState::Expired, ..stored.value };
        Some(self.start_write(now, key, Some(stored.version), Value::Member(record), WriteKind::Tombstone))
    }

    /// Deletes the record of a departed member, so that records do not accumulate as members
    /// come and go. The rule: only a record whose epoch is over (`Left`: it released everything
    /// itself; `Expired`: another member saw it silent for its whole lease), that the table names
    /// in no slot and no leaving mark (so no partition can be believed owned under any epoch of
    /// that identity, and no claim needs the record to decide), and, for an expired one, only
    /// once it has been seen expired for another lease stretched by the drift bound on this
    /// member's clock. One member deletes: the live member with the smallest identity, by
    /// compare-and-swap at the version it saw.
    fn cleanup_action(&mut self, now: MonotonicTime) -> Option<Action> {
        if !self.can_delete || self.leaving || !self.is_member(now) {
            return None;
        }
        let live = self.live_members(now);
        if live.first().map(|m| m.identity.as_str()) != Some(self.identity.as_str()) {
            return None;
        }
        let table = &self.table.as_ref()?.value;
        let stretch = 1.0 + self.config.timing.max_clock_drift();
        let (key, stored) = self.members.iter().find_map(|(id, observed)| {
            let record = &observed.stored.value;
            if *id == self.identity || record.state == MemberState::Alive {
                return None;
            }
            let named =
                table.slots.iter().filter_map(|s| s.owner.as_ref()).chain(&table.leaving).any(|o| o.member == *id);
            let wait = match record.state {
                MemberState::Left => Duration::ZERO,
                _ => record_lease(record.lease_millis).mul_f64(stretch),
            };
            let key = Key::Member(id.clone());
            (!named && now >= observed.seen_at + wait && self.may_write(&key, now))
                .then(|| (key, observed.stored.clone()))
        })?;
        let pending = PendingWrite { started: now, kind: WriteKind::Delete, value: Value::Member(stored.value) };
        self.pending.insert(key.clone(), pending);
        Some(Action::Delete { key, expected: stored.version })
    }

    /// The reply to [`Action::Delete`] for `key`.
    pub fn on_delete(&mut self, now: MonotonicTime, key: &Key, result: Result<(), StoreError>) {
        self.check_lapse(now);
        if self.pending.remove(key).is_none() {
            return;
        }
        match result {
            Ok(()) => {
                self.retry_at.remove(key);
                if let Key::Member(id) = key {
                    self.members.remove(id);
                }
                self.mark_changed(key);
                self.after_view_change(now);
            }
            Err(StoreError::Rejected(_)) => self.can_delete = false,
            Err(error) => {
                self.read_wanted = true;
                if !error.is_conflict() {
                    self.retry_at.insert(key.clone(), now + self.config.timing.retry_period);
                }
            }
        }
    }

    /// May a slot owned by `owner` be claimed now (its owner certainly stopped working on it)?
    fn owner_is_gone(&self, owner: &Owner, now: MonotonicTime) -> bool {
        if owner.member == self.identity {
            // An epoch of ours: the current one (a claim whose reply was lost, adopted with a new
            // term) or an earlier one, over since we rejoined.
            return self.membership.is_some_and(|m| owner.epoch <= m.epoch);
        }
        match self.members.get(&owner.member) {
            Some(observed) => {
                let record = &observed.stored.value;
                if record.epoch > owner.epoch {
                    true
                } else if record.epoch == owner.epoch {
                    record.state != MemberState::Alive
                } else {
                    // A record older than the ownership (replaced by hand, or a view that has not
                    // caught up yet): wait a lease from when this member first saw it so.
                    self.absent_since
                        .get(&owner.member)
                        .is_some_and(|since| now >= *since + self.absent_lease(&owner.member))
                }
            }
            None => self
                .absent_since
                .get(&owner.member)
                .is_some_and(|since| now >= *since + self.absent_lease(&owner.member)),
        }
    }

    /// The table write to make now, if any: releases of drained partitions and, if `may_claim`,
    /// claims.
    fn table_action(&mut self, now: MonotonicTime, may_claim: bool) -> Option<Action> {
        let membership = self.membership.filter(|m| now < m.valid_until)?;
        if !self.may_write(&Key::Table, now) {
            return None;
        }
        let Some(table) = self.table.as_ref() else {
            if !may_claim {
                return None;
            }
            let value = Value::Table(PartitionTable::new(self.config.partition_count));
            return Some(self.start_write(now, Key::Table, None, value, WriteKind::CreateTable));
        };
        if !table.value.is_consistent() {
            if !self.reported_corrupt {
                self.reported_corrupt = true;
                self.events.push_back(GroupEvent::CorruptTable);
            }
            return None;
        }
        let me = Owner { member: self.identity.clone(), epoch: membership.epoch };
        let live = self.live_members(now);
        let my_index = live.iter().position(|m| m.identity == self.identity);
        let current: Vec<Option<usize>> = table
            .value
            .slots
            .iter()
            .map(|slot| {
                let owner = slot.owner.as_ref()?;
                let index = live.iter().position(|m| m.identity == owner.member)?;
                if owner.member == self.identity {
                    return (owner.epoch == membership.epoch).then_some(index);
                }
                let observed = self.members.get(&owner.member)?;
                (observed.stored.value.epoch == owner.epoch).then_some(index)
            })
            .collect();
        let cache_key = AssignmentKey {
            table: table.version,
            members: live.iter().map(|m| (m.identity.clone(), m.weight)).collect(),
            current: current.clone(),
        };
        let target = match &self.assignment_cache {
            Some((key, target)) if *key == cache_key => target.clone(),
            _ => {
                let target = assign(table.value.partition_count, &live, &current);
                self.assignment_cache = Some((cache_key, target.clone()));
                target
            }
        };
        let mine = |p: u32| my_index.is_some() && target.get(p as usize).copied().flatten() == my_index;

        // Revoke what should move; keep what should stay after all and was not released yet.
        // (Only a draining partition comes back: no release of it was ever sent. A drained one
        // may have a release in the store whose reply was lost.)
        for (partition, held) in self.held.iter_mut() {
            if held.state == Holding::Active && !mine(*partition) {
                held.state = Holding::Draining;
                self.events.push_back(GroupEvent::Revoked { partition: *partition, term: Term(held.term) });
            } else if held.state == Holding::Draining && mine(*partition) {
                held.state = Holding::Active;
                self.events.push_back(GroupEvent::Restored { partition: *partition, term: Term(held.term) });
            }
        }
        let mut releases = Vec::new();
        let mut claims = Vec::new();
        for (partition, held) in &self.held {
            if held.state == Holding::Drained {
                let slot = &table.value.slots[*partition as usize];
                if slot.owner.as_ref() == Some(&me) && slot.term == held.term {
                    releases.push((*partition, held.term));
                }
            }
        }
        for (p, slot) in table.value.slots.iter().enumerate() {
            let partition = p as u32;
            if self.held.contains_key(&partition) {
                continue;
            }
            if mine(partition) && !self.leaving && may_claim {
                let claimable = match &slot.owner {
                    None => true,
                    Some(owner) => self.owner_is_gone(owner, now),
                };
                if claimable {
                    claims.push((partition, slot.term.saturating_add(1)));
                }
            } else if slot.owner.as_ref() == Some(&me) {
                // A claim of ours whose reply was lost: nobody works on it; free it.
                releases.push((partition, slot.term));
            }
        }
        let mark_leaving =
            self.leaving && !releases.is_empty() && self.held.values().all(|h| h.state == Holding::Drained);
        // Leaving marks of epochs that are over are dropped by the next table write; when no other
        // write comes, the live member with the smallest identity makes one, so that the record of
        // a member that left is not named forever (and can be deleted).
        let over = |o: &Owner| {
            self.members.get(&o.member).is_some_and(|observed| {
                observed.stored.value.epoch != o.epoch || observed.stored.value.state != MemberState::Alive
            })
        };
        let first = live.first().is_some_and(|m| m.identity == self.identity);
        let tidy = may_claim && first && table.value.leaving.iter().any(|o| *o != me && over(o));
        if releases.is_empty() && claims.is_empty() && !tidy {
            return None;
        }
        let version = table.version;
        let mut next = table.value.clone();
        for (partition, _) in &releases {
            next.slots[*partition as usize].owner = None;
        }
        for (partition, term) in &claims {
            next.slots[*partition as usize] = Slot { term: *term, owner: Some(me.clone()) };
        }
        if mark_leaving {
            next.leaving.insert(me.clone());
        }
        // Forget leaving marks of epochs that are over.
        let members = &self.members;
        next.leaving.retain(|o| {
            *o == me
                || !members.get(&o.member).is_some_and(|obs| {
                    obs.stored.value.epoch != o.epoch || obs.stored.value.state != MemberState::Alive
                })
        });
        let kind = WriteKind::Table { epoch: membership.epoch, claims, releases };
        Some(self.start_write(now, Key::Table, Some(version), Value::Table(next), kind))
    }

    /// The reply to [`Action::Read`].
    pub fn on_read(&mut self, now: MonotonicTime, result: Result<Snapshot, StoreError>) {
        self.check_lapse(now);
        let Some(read) = self.pending_read.take() else { return };
        let snapshot = match result {
            Ok(snapshot) => snapshot,
            Err(_) => {
                self.read_wanted = true;
                self.read_retry_at = now + self.config.timing.retry_period;
                return;
            }
        };
        self.has_read = true;
        self.resyncs_read = read.resyncs;
        // Without a watch, reading is how changes are seen: every retry period. With one, a read
        // per lease is the safety net for a change the watch lost without saying so (a watch
        // that ends quietly, an event dropped between two connections): such a loss then
        // delays a handoff by a lease at most instead of stalling it until the next change.
        let poll_period =
            if self.has_watch { self.config.timing.lease_duration } else { self.config.timing.retry_period };
        self.next_poll = now + poll_period;
        let newer_here =
            |key: &Key, written_at: &BTreeMap<Key, u64>| written_at.get(key).is_some_and(|w| *w > read.issued_at_write);
        if !newer_here(&Key::Table, &self.written_at) {
            let known = self.table.as_ref().map(|t| t.version);
            let found = snapshot.table.as_ref().map(|t| t.version);
            if read.periodic && self.has_watch && found > known {
                // The watch may still bring it (an event on its way, a driver slowed by load):
                // judged a lease on.
                self.unconfirmed_table = found.map(|v| (v, now + self.config.timing.lease_duration));
            }
            self.table = snapshot.table;
        }
        let mut seen = BTreeSet::new();
        for (id, stored) in snapshot.members {
            seen.insert(id.clone());
            if newer_here(&Key::Member(id.clone()), &self.written_at) {
                continue;
            }
            self.observe_member(now, id, stored);
        }
        let written_at = &self.written_at;
        self.members.retain(|id, _| seen.contains(id) || newer_here(&Key::Member(id.clone()), written_at));
        if !newer_here(&Key::Member(self.identity.clone()), &self.written_at) {
            self.check_own_record();
        }
        self.after_view_change(now);
    }

    /// After a read: is our record still ours? A renew whose reply was lost moved its version
    /// (adopt it: the validity is not extended, only later renews extend it); anything else
    /// (expired by others, another incarnation, another epoch, gone) ends our epoch.
    fn check_own_record(&mut self) {
        let Some(membership) = self.membership else { return };
        if self.pending.contains_key(&Key::Member(self.identity.clone())) {
            return;
        }
        let record = self.members.get(&self.identity).map(|o| (o.stored.version, o.stored.value.clone()));
        match record {
            Some((version, record))
                if record.incarnation == self.incarnation
                    && record.epoch == membership.epoch
                    && record.state == MemberState::Alive =>
            {
                if let Some(m) = self.membership.as_mut() {
                    m.version = version;
                    m.renewals = m.renewals.max(record.renewals);
                }
                self.renew_after_read = false;
            }
            _ => {
                self.renew_after_read = false;
                self.lose_membership(membership.epoch);
            }
        }
    }

    /// Takes the table this member wrote as its view, unless the view already holds a newer one.
    ///
    /// Why: the reply to a write and the watch's events come on different streams, in either
    /// order. When another member wrote on top of ours (a release right after our claim) and its
    /// event came before our reply, going back to the table we wrote would undo that release in
    /// this view; the watch never repeats it, so the released partitions stayed unclaimed until
    /// the next full read (the "lost release"). Our claims and releases are in the newer table
    /// too, as it was written on top of ours; if not, `after_view_change` reports them lost.
    fn adopt_written_table(&mut self, version: Version, table: PartitionTable) {
        if self.table.as_ref().is_none_or(|known| known.version < version) {
            self.table = Some(Stored { version, value: table });
        }
    }

    fn observe_member(&mut self, now: MonotonicTime, id: String, stored: Stored<MemberRecord>) {
        let lease = record_lease(stored.value.lease_millis);
        let known = self.known_leases.entry(id.clone()).or_default();
        *known = (*known).max(lease);
        match self.members.get_mut(&id) {
            Some(observed) if observed.stored.version == stored.version => observed.stored = stored,
            _ => {
                self.members.insert(id, ObservedMember { stored, seen_at: now });
            }
        }
    }

    /// Bookkeeping after the view changed: absences, count mismatch, slots that moved under us.
    fn after_view_change(&mut self, now: MonotonicTime) {
        let Some(table) = &self.table else { return };
        let table = &table.value;
        // Owners without a record, or with a record older than the ownership: since when.
        let mut named: BTreeMap<String, u64> = BTreeMap::new();
        for owner in table.slots.iter().filter_map(|s| s.owner.as_ref()) {
            let epoch = named.entry(owner.member.clone()).or_default();
            *epoch = (*epoch).max(owner.epoch);
        }
        let members = &self.members;
        let behind =
            |id: &String| named.get(id).is_some_and(|e| members.get(id).is_none_or(|o| o.stored.value.epoch < *e));
        self.absent_since.retain(|id, _| behind(id));
        for id in named.keys() {
            if behind(id) {
                self.absent_since.entry(id.clone()).or_insert(now);
            }
        }
        if table.is_consistent()
            && table.partition_count != self.config.partition_count
            && self.reported_mismatch != Some(table.partition_count)
        {
            self.reported_mismatch = Some(table.partition_count);
            self.events.push_back(GroupEvent::PartitionCountMismatch {
                configured: self.config.partition_count,
                group: table.partition_count,
            });
        }
        let Some(membership) = self.membership else { return };
        let me = Owner { member: self.identity.clone(), epoch: membership.epoch };
        let mut gone = Vec::new();
        for (partition, held) in &self.held {
            let slot = table.slots.get(*partition as usize);
            let still_ours = slot.is_some_and(|s| s.owner.as_ref() == Some(&me) && s.term == held.term);
            if !still_ours {
                gone.push((*partition, *held));
            }
        }
        for (partition, held) in gone {
            self.held.remove(&partition);
            let term = Term(held.term);
            if held.state == Holding::Drained {
                self.events.push_back(GroupEvent::Released { partition, term });
            } else {
                // Only possible outside the guarantee (clock drift beyond the bound, a store
                // without compare-and-swap): stop at once.
                tracing::error!(partition, %term, "the table shows another owner of a partition this member owns");
                self.events.push_back(GroupEvent::Lost { partition, term });
            }
        }
    }

    /// The reply to [`Action::Write`] for `key`.
    pub fn on_write(&mut self, now: MonotonicTime, key: &Key, result: Result<Version, StoreError>) {
        self.check_lapse(now);
        let Some(pending) = self.pending.remove(key) else { return };
        let version = match result {
            Ok(version) => version,
            Err(error) => {
                self.read_wanted = true;
                if !error.is_conflict() {
                    self.retry_at.insert(key.clone(), now + self.config.timing.retry_period);
                }
                if let WriteKind::Renew { epoch } = pending.kind {
                    self.retry_at.remove(key);
                    if let Some(m) = self.membership.as_mut().filter(|m| m.epoch == epoch) {
                        if error.is_conflict() {
                            // Our record changed: an earlier renew whose reply was lost, or the
                            // end of our epoch. The next read tells (`check_own_record`); no
                            // renew until then.
                            self.renew_after_read = true;
                        } else {
                            m.next_renew = now + self.config.timing.retry_period;
                        }
                    }
                }
                return;
            }
        };
        self.retry_at.remove(key);
        self.writes_completed += 1;
        self.written_at.insert(key.clone(), self.writes_completed);
        let timing = self.config.timing;
        match (pending.kind, pending.value) {
            (WriteKind::Join { epoch }, Value::Member(record)) => {
                let renewals = record.renewals;
                self.observe_member(now, self.identity.clone(), Stored { version, value: record });
                self.absent_since.remove(&self.identity);
                self.last_epoch = self.last_epoch.max(epoch);
                self.membership = Some(Membership {
                    epoch,
                    version,
                    valid_until: pending.started + timing.renew_deadline,
                    next_renew: pending.started + timing.retry_period,
                    renewals,
                });
                if now < pending.started + timing.renew_deadline {
                    self.events.push_back(GroupEvent::Joined { epoch });
                } else {
                    self.lose_membership(epoch);
                }
            }
            (WriteKind::Renew { epoch }, Value::Member(record)) => {
                let renewals = record.renewals;
                self.observe_member(now, self.identity.clone(), Stored { version, value: record });
                if let Some(m) = self.membership.as_mut().filter(|m| m.epoch == epoch) {
                    m.version = version;
                    m.renewals = renewals;
                    m.valid_until = m.valid_until.max(pending.started + timing.renew_deadline);
                    m.next_renew = pending.started + timing.retry_period;
                }
            }
            (WriteKind::Leave, Value::Member(record)) => {
                self.observe_member(now, self.identity.clone(), Stored { version, value: record });
                self.membership = None;
                self.held.clear();
                self.left = true;
                self.events.push_back(GroupEvent::Left);
            }
            (WriteKind::Tombstone, Value::Member(record)) => {
                if let Key::Member(id) = key {
                    self.observe_member(now, id.clone(), Stored { version, value: record });
                }
            }
            (WriteKind::CreateTable, Value::Table(table)) => {
                self.adopt_written_table(version, table);
                self.after_view_change(now);
            }
            (WriteKind::Table { epoch, claims, releases }, Value::Table(table)) => {
                self.adopt_written_table(version, table);
                for (partition, term) in releases {
                    if self.held.remove(&partition).is_some() {
                        self.events.push_back(GroupEvent::Released { partition, term: Term(term) });
                    }
                }
                if self.membership.is_some_and(|m| m.epoch == epoch && now < m.valid_until) {
                    for (partition, term) in claims {
                        self.held.insert(partition, Held { term, state: Holding::Active });
                        self.events.push_back(GroupEvent::Acquired { partition, term: Term(term) });
                    }
                }
                self.after_view_change(now);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTITIONS: u32 = 4;

    fn timing() -> tenure::Timing {
        // lease 4 s, renew deadline 2 s, retry 1 s
        tenure::Timing::from_ttl(Duration::from_secs(4)).unwrap()
    }

    fn at(millis: u64) -> MonotonicTime {
        MonotonicTime(Duration::from_millis(millis))
    }

    /// A tiny synchronous store: applies every action at once.
    #[derive(Default)]
    struct Store {
        records: BTreeMap<Key, (Version, Value)>,
        next: u64,
    }

    impl Store {
        fn snapshot(&self) -> Snapshot {
            let mut snapshot = Snapshot::default();
            for (key, (version, value)) in &self.records {
                match (key, value) {
                    (Key::Table, Value::Table(t)) => {
                        snapshot.table = Some(Stored { version: *version, value: t.clone() })
                    }
                    (Key::Member(id), Value::Member(m)) => {
                        snapshot.members.insert(id.clone(), Stored { version: *version, value: m.clone() });
                    }
                    _ => unreachable!(),
                }
            }
            snapshot
        }

        fn apply(&mut self, core: &mut MemberCore, now: MonotonicTime) {
            while let Some(action) = core.poll_action(now) {
                match action {
                    Action::Read => core.on_read(now, Ok(self.snapshot())),
                    Action::Write { key, expected, value } => {
                        let current = self.records.get(&key).map(|(v, _)| *v);
                        let result = if current == expected {
                            self.next += 1;
                            self.records.insert(key.clone(), (Version(self.next), value));
                            Ok(Version(self.next))
                        } else {
                            Err(StoreError::Conflict)
                        };
                        core.on_write(now, &key, result);
                    }
                    Action::Delete { key, expected } => {
                        let result = if self.records.get(&key).map(|(v, _)| *v) == Some(expected) {
                            self.records.remove(&key);
                            Ok(())
                        } else {
                            Err(StoreError::Conflict)
                        };
                        core.on_delete(now, &key, result);
                    }
                }
            }
        }
    }

    impl Store {
        /// Like [`Store::apply`], except that the first table write is committed but its reply
        /// is returned instead of handed to the core: a reply still on its way.
        fn apply_holding_table_reply(
            &mut self,
            core: &mut MemberCore,
            now: MonotonicTime,
        ) -> Option<(Key, Result<Version, StoreError>)> {
            while let Some(action) = core.poll_action(now) {
                match action {
                    Action::Write { key: Key::Table, expected, value } => {
                        assert_eq!(self.records.get(&Key::Table).map(|(v, _)| *v), expected);
                        self.next += 1;
                        self.records.insert(Key::Table, (Version(self.next), value));
                        return Some((Key::Table, Ok(Version(self.next))));
                    }
                    Action::Read => core.on_read(now, Ok(self.snapshot())),
                    Action::Write { key, value, .. } => {
                        self.next += 1;
                        self.records.insert(key.clone(), (Version(self.next), value));
                        core.on_write(now, &key, Ok(Version(self.next)));
                    }
                    Action::Delete { .. } => unreachable!("nothing to delete here"),
                }
            }
            None
        }

        /// The table as a watch event.
        fn table_event(&self) -> Change {
            let (version, value) = self.records[&Key::Table].clone();
            Change::Put(Key::Table, Stored { version, value })
        }
    }

    fn revoked_partitions(core: &mut MemberCore) -> Vec<u32> {
        std::iter::from_fn(|| core.poll_event())
            .filter_map(|e| match e {
                GroupEvent::Revoked { partition, .. } => Some(partition),
                _ => None,
            })
            .collect()
    }

    /// The "lost release": the reply to b's claim comes after the watch brought a's release made
    /// on top of that claim. The reply must not take b's view back to the table it wrote, where
    /// the released partition is still a's: b would never claim it (the watch does not repeat
    /// the release), until a full read.
    #[test]
    fn a_release_seen_before_the_reply_to_an_own_claim_is_claimed_at_once() {
        let (mut store, mut a, mut b) = a_and_b_at_zero();
        a.on_change(at(10));
        store.apply(&mut a, at(10));
        let revoked = revoked_partitions(&mut a);
        assert_eq!(revoked.len(), 2);
        // a releases the first; b claims it, and the claim commits; its reply is late.
        a.on_drained(at(20), revoked[0]);
        store.apply(&mut a, at(20));
        b.on_change(at(30));
        let (key, reply) = store.apply_holding_table_reply(&mut b, at(30)).expect("b claims the released partition");
        let claim = store.table_event();
        // a's watch brings b's claim; a releases the second partition on top of it.
        a.on_store_change(at(40), claim.clone());
        a.on_drained(at(40), revoked[1]);
        store.apply(&mut a, at(40));
        // b's watch brings both tables, then the reply to its claim comes.
        b.on_store_change(at(50), claim);
        b.on_store_change(at(50), store.table_event());
        b.on_write(at(60), &key, reply);
        store.apply(&mut b, at(60));
        for p in &revoked {
            assert_eq!(b.owns(*p, at(60)).map(|t| t > Term(1)), Some(true), "partition {p} not claimed at once");
        }
    }

    fn member(identity: &str) -> MemberCore {
        let config = GroupConfig { timing: timing(), partition_count: PARTITIONS, weight: 1 };
        MemberCore::new(identity, identity.len() as u64, config, true).unwrap()
    }

    /// a joins and owns everything, then b joins and a revokes b's share (all at time 0).
    fn a_and_b_at_zero() -> (Store, MemberCore, MemberCore) {
        let mut store = Store::default();
        let mut a = member("a");
        store.apply(&mut a, at(0));
        store.apply(&mut a, at(0));
        let mut b = member("b");
        store.apply(&mut b, at(0));
        a.on_change(at(0));
        store.apply(&mut a, at(0));
        (store, a, b)
    }

    #[test]
    fn a_lone_member_owns_every_partition_and_stops_believing_at_its_renew_deadline() {
        let mut store = Store::default();
        let mut a = member("a");
        store.apply(&mut a, at(0));
        store.apply(&mut a, at(0));
        assert_eq!(a.owned(at(0)).len(), PARTITIONS as usize);
        assert_eq!(a.owns(0, at(0)), Some(Term(1)));
        // No renew reaches the store: at the renew deadline (2 s) every belief ends by itself.
        assert!(a.owns(0, at(1_999)).is_some());
        assert_eq!(a.owns(0, at(2_000)), None);
        assert_eq!(a.may_work_on(0, at(2_000)), None);
    }

    #[test]
    fn a_newcomer_claims_only_after_the_owner_released_and_with_a_higher_term() {
        let mut store = Store::default();
        let mut a = member("a");
        store.apply(&mut a, at(0));
        store.apply(&mut a, at(0));
        let mut b = member("b");
        store.apply(&mut b, at(10));
        assert!(b.owned(at(10)).is_empty(), "b claimed partitions a still owns");
        // a sees b, revokes its share, and keeps owning nothing it gave up.
        a.on_change(at(20));
        store.apply(&mut a, at(20));
        let revoked: Vec<u32> = std::iter::from_fn(|| a.poll_event())
            .filter_map(|e| match e {
                GroupEvent::Revoked { partition, .. } => Some(partition),
                _ => None,
            })
            .collect();
        assert_eq!(revoked.len(), 2);
        b.on_change(at(30));
        store.apply(&mut b, at(30));
        assert!(b.owned(at(30)).is_empty(), "b claimed before a drained and released");
        for p in &revoked {
            a.on_drained(at(40), *p);
        }
        store.apply(&mut a, at(40));
        b.on_change(at(50));
        store.apply(&mut b, at(50));
        for p in &revoked {
            assert_eq!(b.owns(*p, at(50)), Some(Term(2)), "partition {p}");
            assert_eq!(a.may_work_on(*p, at(50)), None);
        }
    }

    #[test]
    fn a_crashed_members_partitions_are_claimed_only_after_its_lease_on_the_claimers_clock() {
        let (mut store, _a, mut b) = a_and_b_at_zero();
        // a crashes now (no more calls); b renews and watches.
        let lease = timing().lease_duration.as_millis() as u64;
        for t in (100..lease).step_by(100) {
            b.on_change(at(t));
            store.apply(&mut b, at(t));
            assert!(b.owned(at(t)).len() <= 2, "b took a's partitions at {t} ms, before a's lease ran out");
        }
        store.apply(&mut b, at(lease));
        b.on_change(at(lease));
        store.apply(&mut b, at(lease));
        assert_eq!(b.owned(at(lease)).len(), PARTITIONS as usize);
        assert!(matches!(
            store.records.get(&Key::Member("a".into())),
            Some((_, Value::Member(MemberRecord { state: MemberState::Expired, .. })))
        ));
    }

    #[test]
    fn after_a_resync_a_member_claims_nothing_until_the_snapshot_read_is_in() {
        let (mut store, _a, mut b) = a_and_b_at_zero();
        // a crashes; b renews; b's watch breaks and re-opens exactly when a's lease runs out.
        let lease = timing().lease_duration.as_millis() as u64;
        for t in (100..lease).step_by(100) {
            store.apply(&mut b, at(t));
        }
        b.on_store_change(at(lease), Change::Resync);
        let mut actions = Vec::new();
        while let Some(action) = b.poll_action(at(lease)) {
            actions.push(action);
        }
        assert!(actions.contains(&Action::Read));
        let decisions: Vec<&Action> = actions
            .iter()
            .filter(|action| matches!(action, Action::Write { key, .. } if *key != Key::Member("b".into())))
            .collect();
        assert!(decisions.is_empty(), "b acted on a view that may miss changes: {decisions:?}");
        b.on_read(at(lease), Ok(store.snapshot()));
        for action in actions.into_iter().filter(|action| *action != Action::Read) {
            if let Action::Write { key, .. } = action {
                b.on_write(at(lease), &key, Err(StoreError::Unavailable("dropped by the test".into())));
            }
        }
        store.apply(&mut b, at(lease + 1));
        assert_eq!(b.owned(at(lease + 1)).len(), PARTITIONS as usize, "b never took over after the read");
    }

    #[test]
    fn a_pushed_record_older_than_the_view_is_ignored_and_a_newer_one_applied() {
        let (store, _a, mut b) = a_and_b_at_zero();
        let (version, Value::Member(record)) = store.records[&Key::Member("a".into())].clone() else { unreachable!() };
        // A late event of an earlier version of a's record, in which a has left: ignored.
        let stale = Stored {
            version: Version(version.0 - 1),
            value: Value::Member(MemberRecord { state: MemberState::Left, ..record.clone() }),
        };
        b.on_store_change(at(100), Change::Put(Key::Member("a".into()), stale));
        assert!(b.live_members(at(100)).iter().any(|m| m.identity == "a"), "a late event ended a's membership");
        // The same at a newer version: applied, a is gone from b's view at once.
        let newer = Stored {
            version: Version(version.0 + 100),
            value: Value::Member(MemberRecord { state: MemberState::Left, ..record }),
        };
        b.on_store_change(at(200), Change::Put(Key::Member("a".into()), newer));
        assert!(b.live_members(at(200)).iter().all(|m| m.identity != "a"), "a newer record was not applied");
        // A deletion removes the record from the view.
        b.on_store_change(at(300), Change::Deleted(Key::Member("a".into())));
        assert!(b.live_members(at(300)).iter().all(|m| m.identity != "a"));
    }
}
