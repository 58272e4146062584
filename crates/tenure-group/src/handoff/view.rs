//! The view: the table and the other members' records as this member knows them, kept from reads
//! and pushed changes without going back to an older state, and the judgements made on them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tenure::MonotonicTime;

use super::{Action, GroupEvent, MemberCore, Timer};
use crate::assignment::WeightedMember;
use crate::config::record_lease;
use crate::record::{MemberRecord, MemberState, Owner, PartitionTable};
use crate::store::{Change, Key, Snapshot, StoreError, Stored, Value, Version};

/// Another member's record, and when this version of it first arrived here.
#[derive(Debug, Clone)]
pub(super) struct ObservedMember {
    pub(super) stored: Stored<MemberRecord>,
    /// Local time at which this version was first seen.
    pub(super) seen_at: MonotonicTime,
}

impl ObservedMember {
    /// When the record's lease runs out on our clock, if it is alive.
    pub(super) fn alive_until(&self) -> Option<MonotonicTime> {
        let record = &self.stored.value;
        (record.state == MemberState::Alive).then(|| self.seen_at + record_lease(record.lease_millis))
    }

    pub(super) fn expired(&self, now: MonotonicTime) -> bool {
        now >= self.seen_at + record_lease(self.stored.value.lease_millis)
    }
}

/// A read of the snapshot and the write counter when it was issued: records written after that
/// are newer in this member's view than in the read's reply.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingRead {
    issued_at_write: u64,
    /// Issued because the once-per-lease read was due, not because a change asked for it.
    periodic: bool,
    /// [`MemberCore::resyncs_requested`] when it was issued.
    resyncs: u64,
}

impl MemberCore {
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
            .filter(|(id, o)| **id != self.identity && o.stored.value.state == MemberState::Alive && !o.expired(now))
            .filter(|(id, o)| {
                !leaving.is_some_and(|l| l.contains(&Owner { member: (*id).clone(), epoch: o.stored.value.epoch }))
            })
            .map(|(id, o)| WeightedMember { identity: id.clone(), weight: o.stored.value.weight.max(1) })
            .collect();
        if self.is_member(now) && !self.is_leaving() {
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
        (record.state == MemberState::Alive && record.epoch == owner.epoch && !observed.expired(now))
            .then(|| owner.member.clone())
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
            Change::Put(key, Stored { version, value }) => {
                if key == Key::Table && self.unconfirmed_table.is_some_and(|v| v <= version) {
                    self.unconfirmed_table = None;
                    self.timers.stop(&Timer::MissedChange);
                }
                let applied = match (&key, value) {
                    (Key::Table, Value::Table(table)) => self.adopt_table(version, table),
                    (Key::Member(id), Value::Member(record))
                        if record.identity == *id
                            && self.members.get(id).is_none_or(|o| o.stored.version < version) =>
                    {
                        self.observe_member(now, id.clone(), Stored { version, value: record });
                        true
                    }
                    _ => false,
                };
                if !applied {
                    return;
                }
                key
            }
            Change::Deleted(Key::Member(id)) => {
                if self.members.remove(&id).is_none() {
                    return;
                }
                Key::Member(id)
            }
            // `Changed`; `Resync` (the watch lost changes); the table deleted (by hand: see what is left).
            other => {
                self.read_wanted = true;
                self.resyncs_requested += u64::from(matches!(other, Change::Resync));
                return;
            }
        };
        self.mark_changed(&key);
        if key == Key::Member(self.identity.clone()) {
            self.check_own_record();
        }
        self.after_view_change(now);
    }

    /// Records that `key` changed in this member's view now (a read issued earlier is older).
    pub(super) fn mark_changed(&mut self, key: &Key) {
        self.writes_completed += 1;
        self.written_at.insert(key.clone(), self.writes_completed);
    }

    /// A read, if one is wanted or the poll is due, and none is in flight or waiting for a retry.
    pub(super) fn read_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let poll_due = self.timers.elapsed(&Timer::Poll, now);
        if self.pending_read.is_some()
            || !self.timers.elapsed(&Timer::ReadRetry, now)
            || !(self.read_wanted || poll_due)
        {
            return None;
        }
        let periodic = !self.read_wanted;
        self.read_wanted = false;
        self.pending_read =
            Some(PendingRead { issued_at_write: self.writes_completed, periodic, resyncs: self.resyncs_requested });
        Some(Action::Read)
    }

    /// Reports a table a periodic read found that the watch did not deliver in time.
    pub(super) fn check_missed_change(&mut self, now: MonotonicTime) {
        if let Some(version) = self.unconfirmed_table.filter(|_| self.timers.elapsed(&Timer::MissedChange, now)) {
            self.unconfirmed_table = None;
            self.timers.stop(&Timer::MissedChange);
            self.missed_changes += 1;
            self.events.push_back(GroupEvent::MissedChange { version });
        }
    }

    /// The reply to [`Action::Read`].
    pub fn on_read(&mut self, now: MonotonicTime, result: Result<Snapshot, StoreError>) {
        self.check_lapse(now);
        let Some(read) = self.pending_read.take() else { return };
        let timing = self.config.timing;
        let Ok(snapshot) = result else {
            self.read_wanted = true;
            self.timers.set(Timer::ReadRetry, now + timing.retry_period);
            return;
        };
        self.resyncs_read = Some(read.resyncs);
        // Without a watch, reading is how changes are seen: every retry period. With one, a read
        // per lease is the safety net for a change the watch lost without saying so (a watch
        // that ends quietly, an event dropped between two connections): such a loss then
        // delays a handoff by a lease at most instead of stalling it until the next change.
        let poll_period = if self.has_watch { timing.lease_duration } else { timing.retry_period };
        self.timers.set(Timer::Poll, now + poll_period);
        let newer_here =
            |key: &Key, written_at: &BTreeMap<Key, u64>| written_at.get(key).is_some_and(|w| *w > read.issued_at_write);
        if !newer_here(&Key::Table, &self.written_at) {
            let known = self.table.as_ref().map(|t| t.version);
            let found = snapshot.table.as_ref().map(|t| t.version);
            if let Some(found) = found.filter(|found| read.periodic && self.has_watch && Some(*found) > known) {
                // The watch may still bring it (an event on its way, a driver slowed by load):
                // judged a lease on.
                self.unconfirmed_table = Some(found);
                self.timers.set(Timer::MissedChange, now + timing.lease_duration);
            }
            self.table = snapshot.table;
        }
        let mut seen = BTreeSet::new();
        for (id, stored) in snapshot.members {
            seen.insert(id.clone());
            if !newer_here(&Key::Member(id.clone()), &self.written_at) {
                self.observe_member(now, id, stored);
            }
        }
        let written_at = &self.written_at;
        self.members.retain(|id, _| seen.contains(id) || newer_here(&Key::Member(id.clone()), written_at));
        if !newer_here(&Key::Member(self.identity.clone()), &self.written_at) {
            self.check_own_record();
        }
        self.after_view_change(now);
    }

    /// Takes the table this member wrote as its view, unless the view already holds a newer one.
    ///
    /// Why: the reply to a write and the watch's events come on different streams, in either
    /// order. When another member wrote on top of ours (a release right after our claim) and its
    /// event came before our reply, going back to the table we wrote would undo that release in
    /// this view; the watch never repeats it, so the released partitions stayed unclaimed until
    /// the next full read (the "lost release"). Our claims and releases are in the newer table
    /// too, as it was written on top of ours; if not, `after_view_change` reports them lost.
    /// The same rule takes a pushed table. True if taken.
    pub(super) fn adopt_table(&mut self, version: Version, table: PartitionTable) -> bool {
        let newer = self.table.as_ref().is_none_or(|known| known.version < version);
        if newer {
            self.table = Some(Stored { version, value: table });
        }
        newer
    }

    pub(super) fn observe_member(&mut self, now: MonotonicTime, id: String, stored: Stored<MemberRecord>) {
        let known = self.known_leases.entry(id.clone()).or_default();
        *known = (*known).max(record_lease(stored.value.lease_millis));
        match self.members.get_mut(&id) {
            Some(observed) if observed.stored.version == stored.version => observed.stored = stored,
            _ => {
                self.members.insert(id, ObservedMember { stored, seen_at: now });
            }
        }
    }

    /// Bookkeeping after the view changed: absences, count mismatch, slots that moved under us.
    pub(super) fn after_view_change(&mut self, now: MonotonicTime) {
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
        for id in named.keys().filter(|id| behind(id)) {
            self.absent_since.entry(id.clone()).or_insert(now);
        }
        if table.is_consistent() && table.partition_count != self.config.partition_count {
            let (configured, group) = (self.config.partition_count, table.partition_count);
            self.report_once(GroupEvent::PartitionCountMismatch { configured, group });
        }
        self.drop_moved_partitions();
    }

    /// How long an absent owner is waited out: the longest lease seen in its records, at least ours.
    pub(super) fn absent_lease(&self, identity: &str) -> Duration {
        self.known_leases.get(identity).copied().unwrap_or_default().max(self.config.timing.lease_duration)
    }

    fn absent_for_a_lease(&self, identity: &str, now: MonotonicTime) -> bool {
        self.absent_since.get(identity).is_some_and(|since| now >= *since + self.absent_lease(identity))
    }

    /// May a slot owned by `owner` be claimed now (its owner certainly stopped working on it)?
    pub(super) fn owner_is_gone(&self, owner: &Owner, now: MonotonicTime) -> bool {
        if owner.member == self.identity {
            // An epoch of ours: the current one (a claim whose reply was lost, adopted with a new
            // term) or an earlier one, over since we rejoined.
            return self.membership().is_some_and(|m| owner.epoch <= m.epoch);
        }
        match self.members.get(&owner.member).map(|o| &o.stored.value) {
            Some(record) if record.epoch > owner.epoch => true,
            Some(record) if record.epoch == owner.epoch => record.state != MemberState::Alive,
            // No record, or one older than the ownership (replaced by hand, or a view that has not
            // caught up yet): wait a lease from when this member first saw it so.
            _ => self.absent_for_a_lease(&owner.member, now),
        }
    }

    /// True when `owner`'s record shows another epoch, or that epoch not alive (the epoch is over).
    pub(super) fn epoch_over(&self, owner: &Owner) -> bool {
        self.members.get(&owner.member).is_some_and(|observed| {
            observed.stored.value.epoch != owner.epoch || observed.stored.value.state != MemberState::Alive
        })
    }
}
