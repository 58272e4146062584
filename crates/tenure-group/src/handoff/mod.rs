//! The sans-IO core of one group member: membership lease, partition claims and the safe handoff,
//! driven by explicit time.
//!
//! [`MemberCore`] never reads a clock and never does I/O. Its driver asks it what to do
//! ([`MemberCore::poll_action`]; several actions may be in flight, at most one per record),
//! performs them on a [`crate::store::GroupStore`], and feeds the results back with the local
//! monotonic time of each step. What the application must do comes out as [`GroupEvent`]s.
//!
//! # Call order
//!
//! 1. Inputs, whenever they happen: the replies [`MemberCore::on_read`], [`MemberCore::on_write`],
//!    [`MemberCore::on_delete`]; the store's news [`MemberCore::on_change`],
//!    [`MemberCore::on_store_change`]; the application's [`MemberCore::on_drained`],
//!    [`MemberCore::leave`].
//! 2. Then [`MemberCore::poll_action`] until `None`, performing each action, and
//!    [`MemberCore::poll_event`] until `None`.
//! 3. Then sleep until the next input or [`MemberCore::next_wakeup`], and start again at 2.
//!
//! The queries ([`MemberCore::owns`], [`MemberCore::is_member`], ...) may be called at any time;
//! each judges at the time it is given (F1).
//!
//! The state is split by concern: `membership` (our record and [`Phase`](membership::Phase)),
//! `view` (the others' records, the table as seen, and tidying after other members' ends),
//! `table` (what we hold and the table write); the timers are in `TimerTable`.
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
//!   term. A partition moves by compare-and-swap of the table, writing `term + 1` and its new
//!   owner, and only if the slot is free (its owner stopped work and released it, maybe in this
//!   same write), or its owner's epoch is certainly over (its record is `Left`/`Expired` at that
//!   epoch, or shows a later epoch), or the owner's record has been absent or inconsistent for a
//!   whole lease on the writer's clock. Whoever writes the table moves every partition that may
//!   move to the live member its assignment names (a claim when that is itself, a handover
//!   otherwise), so that one write does what each new owner's own claim did one after another.
//!   An owner that should give a partition away first stops believing ([`GroupEvent::Revoked`]),
//!   waits for the application to drain ([`MemberCore::on_drained`]), and only then releases it.
//! - **Belief starts with a successful claim, or with a table that hands the partition over**,
//!   and only while the membership epoch it names is still valid: a claim counts when its reply
//!   arrives, a handover when this member sees the table name it under its current epoch at a
//!   term it never held nor released (a term it released may still be in a view its release has
//!   not reached).
//! - **Identity.** A record of this identity written by another process (another incarnation) is
//!   waited out like any other member's: the running process keeps the identity, the newcomer
//!   reports [`GroupEvent::DuplicateIdentity`] and joins only after the other's lease ran out.
//! - **Partition count.** The table fixes the group's count; a member configured otherwise adopts
//!   it and reports [`GroupEvent::PartitionCountMismatch`], so all members map keys alike.

mod membership;
mod table;
#[cfg(test)]
mod tests;
mod view;

use std::collections::{BTreeMap, VecDeque};

use tenure::{MonotonicTime, Term};

use crate::config::GroupConfig;
use crate::store::{Key, StoreError, Stored, Value, Version};
use membership::Phase;
use table::{AssignmentCache, Held, Holding};
use view::{ObservedMember, View};

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

// The core's timers in one table (as in quinn-proto): what it does later without any input.
/// What a timer is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The next renew of our record (set only while a member).
    Renew,
    /// The next read of the snapshot: every retry period without a watch, every lease with one.
    Poll,
    /// No read before this: the last one failed.
    ReadRetry,
    /// No write of this record before this: the last one failed other than by a conflict.
    WriteRetry(Key),
    /// From then a table a periodic read found ahead of the view counts as missed by the watch.
    /// Only a report: checked at the next poll, it never wakes the core.
    MissedChange,
}

/// Every timer of one core; a timer not in the table is not running.
#[derive(Debug, Default)]
struct TimerTable(BTreeMap<Timer, MonotonicTime>);

impl TimerTable {
    fn set(&mut self, timer: Timer, at: MonotonicTime) {
        self.0.insert(timer, at);
    }

    fn stop(&mut self, timer: &Timer) {
        self.0.remove(timer);
    }

    /// True unless `timer` runs until after `now` (a timer that is not set has elapsed).
    fn elapsed(&self, timer: &Timer, now: MonotonicTime) -> bool {
        self.0.get(timer).is_none_or(|at| now >= *at)
    }

    /// The earliest of the timers and `deadlines` after `now`.
    fn next_after(&self, now: MonotonicTime, deadlines: impl Iterator<Item = MonotonicTime>) -> Option<MonotonicTime> {
        let timers = self.0.iter().filter(|(timer, _)| **timer != Timer::MissedChange).map(|(_, at)| *at);
        timers.chain(deadlines).filter(|at| *at > now).min()
    }
}

/// A write in flight, and what it means once it succeeds (`base` of a table write: the version
/// it replaces).
#[derive(Debug, Clone)]
enum WriteKind {
    Join { epoch: u64 },
    Renew { epoch: u64 },
    Leave,
    Tombstone,
    Delete,
    CreateTable,
    Table { epoch: u64, claims: Moves, releases: Moves },
}

/// Partitions with a term each: the claims or the releases of a table write.
type Moves = Vec<(u32, u64)>;

#[derive(Debug, Clone)]
struct PendingWrite {
    started: MonotonicTime,
    kind: WriteKind,
    value: Value,
    /// The version the write expects (`None`: a create or a deletion).
    expected: Option<Version>,
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
    phase: Phase,
    /// A renew met a conflict: renew again only after a read showed the record (not reset by a lapse).
    renew_after_read: bool,
    /// The highest epoch this process has joined with.
    last_epoch: u64,
    view: View,
    read_wanted: bool,
    held: BTreeMap<u32, Held>,
    assignment_cache: AssignmentCache,
    /// False once the store refused a deletion: departed members' records are then kept.
    can_delete: bool,
    pending: BTreeMap<Key, PendingWrite>,
    /// The version each record's last write conflicted at: no write of it at that version again
    /// (it would only conflict again) until the view holds another (cleared on every change of the
    /// record in the view and by every read; ZooKeeper reuses versions after a re-creation).
    conflicted: BTreeMap<Key, Version>,
    /// The highest term of each partition this process held or released: a slot naming us at such
    /// a term is never taken up as handed to us (our release of it may be in the store already, its
    /// reply lost, with a later owner after it).
    spent: BTreeMap<u32, u64>,
    /// The inputs of the last table decision that wrote nothing (see `decision_inputs`).
    idle_decision: Option<u64>,
    timers: TimerTable,
    events: VecDeque<GroupEvent>,
    /// The last event reported of each kind that is reported once (a mismatch, a duplicate, a
    /// corrupt table), so that a condition that lasts is not reported again and again.
    reported: Vec<GroupEvent>,
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
            phase: Phase::Joining,
            renew_after_read: false,
            last_epoch: 0,
            view: View::default(),
            read_wanted: true,
            held: BTreeMap::new(),
            assignment_cache: AssignmentCache::default(),
            can_delete: true,
            pending: BTreeMap::new(),
            conflicted: BTreeMap::new(),
            spent: BTreeMap::new(),
            idle_decision: None,
            timers: TimerTable::default(),
            events: VecDeque::new(),
            reported: Vec::new(),
        })
    }

    /// This member's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The term of `partition` if held in one of `states` while the membership is valid at `now`.
    fn held_in(&self, partition: u32, now: MonotonicTime, states: &[Holding]) -> Option<Term> {
        let held = self.held.get(&partition).filter(|h| states.contains(&h.state) && self.is_member(now))?;
        Some(Term(held.term))
    }

    /// The term under which this member owns `partition` at local time `now`, if it does: the
    /// membership is valid and the partition is claimed and not revoked.
    pub fn owns(&self, partition: u32, now: MonotonicTime) -> Option<Term> {
        self.held_in(partition, now, &[Holding::Active])
    }

    /// The term of `partition` if work on it may still be running at `now`: owned, or revoked but
    /// not yet drained, while the membership is valid. The simulation's checker counts these.
    pub fn may_work_on(&self, partition: u32, now: MonotonicTime) -> Option<Term> {
        self.held_in(partition, now, &[Holding::Active, Holding::Draining])
    }

    /// Every partition work may still run on at `now` (see [`MemberCore::may_work_on`]).
    pub fn working(&self, now: MonotonicTime) -> impl Iterator<Item = (u32, Term)> + '_ {
        self.held.keys().filter_map(move |p| Some((*p, self.may_work_on(*p, now)?)))
    }

    /// Every partition this member owns at `now`, with its term.
    pub fn owned(&self, now: MonotonicTime) -> BTreeMap<u32, Term> {
        self.held.keys().filter_map(|p| Some((*p, self.owns(*p, now)?))).collect()
    }

    /// The version of the table in this member's view, if it has read one: what the owners of
    /// the partitions ([`MemberCore::owner_of`]) are judged from, besides the live members.
    pub fn table_version(&self) -> Option<Version> {
        self.view.table.as_ref().map(|t| t.version)
    }

    /// True while the membership is valid at `now`.
    pub fn is_member(&self, now: MonotonicTime) -> bool {
        self.membership().is_some_and(|m| now < m.valid_until)
    }

    /// Until when the membership is valid, if it is.
    pub fn valid_until(&self) -> Option<MonotonicTime> {
        self.membership().map(|m| m.valid_until)
    }

    /// The current epoch, while a member.
    pub fn epoch(&self) -> Option<u64> {
        self.membership().map(|m| m.epoch)
    }

    /// True once this member left for good.
    pub fn has_left(&self) -> bool {
        matches!(self.phase, Phase::Left)
    }

    /// How many changes the watch lost that the once-per-lease read found: 0 unless a store's
    /// watch (or this member's handling of it) loses events. Exported for an alert.
    pub fn missed_changes(&self) -> u64 {
        self.view.missed_changes
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<GroupEvent> {
        self.events.pop_front()
    }

    /// The store reported a change (or the watch was re-opened): read again.
    pub fn on_change(&mut self, now: MonotonicTime) {
        self.check_lapse(now);
        self.read_wanted = true;
    }

    /// The application finished its work on a revoked partition.
    pub fn on_drained(&mut self, now: MonotonicTime, partition: u32) {
        self.check_lapse(now);
        if let Some(held) = self.held.get_mut(&partition).filter(|h| h.state == Holding::Draining) {
            held.state = Holding::Drained;
        }
    }

    /// The earliest local time at which [`MemberCore::poll_action`] may have something new to do
    /// without any input: a timer (`Timer`), the end of our membership, the lease of a live
    /// member's record or of an owner's absence, the silence of a record not read since it changed.
    pub fn next_wakeup(&self, now: MonotonicTime) -> Option<MonotonicTime> {
        let lapse = self.membership().map(|m| m.valid_until);
        let expiries = self.view.members.values().filter_map(ObservedMember::alive_until);
        let absences = self.view.absent_since.iter().map(|(id, since)| *since + self.absent_lease(id));
        let unread = self.unread_silent_at();
        let deadlines = lapse.into_iter().chain(expiries).chain(absences).chain(unread).chain(self.ends_settle_at());
        self.timers.next_after(now, deadlines)
    }

    /// What to do next on the store, if anything; call again until `None`, then again after
    /// every input and at [`MemberCore::next_wakeup`]. In this order: a read if one is due; after
    /// the first read, our own record (join, renew, leave); then, unless a resync is not read
    /// yet, ending silent members' epochs, the table write, and deleting departed records.
    pub fn poll_action(&mut self, now: MonotonicTime) -> Option<Action> {
        self.check_lapse(now);
        if self.has_left() {
            return None;
        }
        self.check_missed_change(now);
        if let Some(read) = self.read_action(now) {
            return Some(read);
        }
        let resyncs_read = self.view.resyncs_read?;
        if let Some(action) = self.own_record_action(now) {
            return Some(action);
        }
        if resyncs_read < self.view.resyncs_requested {
            // Changes were lost: until the read is in, only release what this member owns.
            return self.table_action(now, false);
        }
        self.tombstone_action(now).or_else(|| self.table_action(now, true)).or_else(|| self.cleanup_action(now))
    }

    /// Reports `event` unless the last report of its kind was the same.
    fn report_once(&mut self, event: GroupEvent) {
        let kind = std::mem::discriminant(&event);
        match self.reported.iter_mut().find(|e| std::mem::discriminant(*e) == kind) {
            Some(last) if *last == event => return,
            Some(last) => *last = event.clone(),
            None => self.reported.push(event.clone()),
        }
        self.events.push_back(event);
    }

    fn may_write(&self, key: &Key, now: MonotonicTime) -> bool {
        !self.pending.contains_key(key) && self.timers.elapsed(&Timer::WriteRetry(key.clone()), now)
    }

    fn start_write(
        &mut self,
        now: MonotonicTime,
        key: Key,
        expected: Option<Version>,
        value: Value,
        kind: WriteKind,
    ) -> Action {
        self.pending.insert(key.clone(), PendingWrite { started: now, kind, value: value.clone(), expected });
        Action::Write { key, expected, value }
    }

    /// After a failed write or delete: retry a retry period later unless it conflicted; read again,
    /// unless it conflicted over another member's record or the table and a watch will bring the
    /// newer version (after a crash among many members, every survivor's end of its epoch but one
    /// conflicts, as do all but one table write: a read of the whole group each cost more than
    /// the handoff). Our own record's conflicts are always read (`renew_failed`).
    fn write_failed(&mut self, now: MonotonicTime, key: &Key, expected: Option<Version>, error: &StoreError) {
        let own = *key == Key::Member(self.identity.clone());
        self.read_wanted |= !(error.is_conflict() && self.has_watch) || own;
        match expected {
            Some(version) if error.is_conflict() => _ = self.conflicted.insert(key.clone(), version),
            _ if !error.is_conflict() => {
                self.timers.set(Timer::WriteRetry(key.clone()), now + self.config.timing.retry_period);
            }
            _ => {}
        }
    }

    /// True unless a write of `key` at `version` already conflicted (see `conflicted`).
    fn not_conflicted(&self, key: &Key, version: Version) -> bool {
        self.conflicted.get(key) != Some(&version)
    }

    /// The reply to [`Action::Write`] for `key`.
    pub fn on_write(&mut self, now: MonotonicTime, key: &Key, result: Result<Version, StoreError>) {
        self.check_lapse(now);
        let Some(pending) = self.pending.remove(key) else { return };
        let version = match result {
            Ok(version) => version,
            Err(error) => {
                self.write_failed(now, key, pending.expected, &error);
                if let WriteKind::Renew { epoch } = pending.kind {
                    self.renew_failed(now, epoch, &error);
                }
                return;
            }
        };
        self.timers.stop(&Timer::WriteRetry(key.clone()));
        self.mark_changed(key);
        match (pending.kind, pending.value, key) {
            (kind, Value::Member(record), Key::Member(id)) if !matches!(kind, WriteKind::Delete) => {
                let renewals = record.renewals;
                self.observe_member(now, id.clone(), Stored { version, value: record });
                if let (WriteKind::Tombstone, Some(observed)) = (&kind, self.view.members.get_mut(id)) {
                    observed.ended_here = observed.stored.version == version;
                }
                self.on_member_written(now, kind, pending.started, version, renewals);
            }
            (WriteKind::Table { epoch, claims, releases, .. }, Value::Table(table), _) => {
                self.adopt_table(version, table);
                self.on_table_written(now, epoch, claims, releases);
            }
            (WriteKind::CreateTable, Value::Table(table), _) => {
                self.adopt_table(version, table);
                self.after_view_change(now);
            }
            _ => {}
        }
    }
}
