//! The view: the table and the other members' records as this member knows them, kept from reads
//! and pushed changes without going back to an older state, the judgements made on them, and the
//! tidying after other members (ending silent epochs, deleting records, dropping leaving marks).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tenure::MonotonicTime;

use super::{Action, GroupEvent, MemberCore, PendingWrite, Timer, WriteKind};
use crate::assignment::WeightedMember;
use crate::config::record_lease;
use crate::record::{MemberRecord, MemberState, Owner, PartitionTable};
use crate::store::{Change, Key, Snapshot, StoreError, Stored, Value, Version};

/// Another member's record, and when it was last seen changing.
#[derive(Debug, Clone)]
pub(super) struct ObservedMember {
    pub(super) stored: Stored<MemberRecord>,
    /// Local time at which this record was last seen changing: when this version first arrived,
    /// or a later [`Change::Touched`] of it. Its lease counts from here.
    pub(super) seen_at: MonotonicTime,
    /// A [`Change::Touched`] came after `stored` was read: the record is probably at a later
    /// version, whose content this member has not read. Only what no later write can undo is
    /// judged on such a record (see [`MemberCore::on_store_change`]).
    pub(super) unread: bool,
    /// This version is our own end of the member's epoch (our `Expired` write): we move its
    /// partitions at once, others a retry period after they saw it (see `end_is_settled`).
    pub(super) ended_here: bool,
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

/// What this member knows of the group and how it came to know it.
#[derive(Debug, Default)]
pub(super) struct View {
    /// Set only by [`View::set_table`], which keeps `named` in step.
    pub(super) table: Option<Stored<PartitionTable>>,
    /// The highest epoch the table names of each member (in a slot), computed once per table:
    /// [`MemberCore::after_view_change`] needs it after every change, and a pass over 1,024
    /// slots per other member's renew was half of what 50 members cost at rest.
    named: BTreeMap<String, u64>,
    pub(super) members: BTreeMap<String, ObservedMember>,
    /// Identities named as owners in the table without a record, since when (local time).
    pub(super) absent_since: BTreeMap<String, MonotonicTime>,
    /// The longest lease seen in a record of each identity (to wait out one that disappeared).
    pub(super) known_leases: BTreeMap<String, Duration>,
    pub(super) pending_read: Option<PendingRead>,
    /// Counts completed writes and applied pushed changes; `written_at[key]` is the count when
    /// `key` last changed in this member's view by either (a read issued before is older there).
    pub(super) writes_completed: u64,
    pub(super) written_at: BTreeMap<Key, u64>,
    /// Counts [`Change::Resync`]s received, and the last one a completed read was
    /// issued after (`None` before the first read): while they differ nothing is decided.
    pub(super) resyncs_requested: u64,
    pub(super) resyncs_read: Option<u64>,
    /// A table version a periodic read found ahead of the view (see [`Timer::MissedChange`]).
    pub(super) unconfirmed_table: Option<Version>,
    /// Changes the watch lost that the periodic read found (see [`GroupEvent::MissedChange`]).
    pub(super) missed_changes: u64,
}

impl View {
    pub(super) fn set_table(&mut self, table: Option<Stored<PartitionTable>>) {
        self.named.clear();
        for owner in table.iter().flat_map(|t| &t.value.slots).filter_map(|s| s.owner.as_ref()) {
            // Cloning the name only for its first slot.
            match self.named.get_mut(&owner.member) {
                Some(epoch) => *epoch = (*epoch).max(owner.epoch),
                None => _ = self.named.insert(owner.member.clone(), owner.epoch),
            }
        }
        self.table = table;
    }
}

/// A read of the snapshot and the write counter when it was issued: records written after that
/// are newer in this member's view than in the read's reply.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingRead {
    issued_at_write: u64,
    /// Issued because the once-per-lease read was due, not because a change asked for it.
    periodic: bool,
    /// [`View::resyncs_requested`] when it was issued.
    resyncs: u64,
}

impl MemberCore {
    /// The group's partition count as this member uses it: the table's once read, else the
    /// configured one.
    pub fn partition_count(&self) -> u32 {
        self.view
            .table
            .as_ref()
            .filter(|t| t.value.is_consistent())
            .map_or(self.config.partition_count, |t| t.value.partition_count)
    }

    /// The live members in this member's view at `now` (records renewed within their lease, not
    /// leaving), this member included while it is one; sorted by identity.
    pub fn live_members(&self, now: MonotonicTime) -> Vec<WeightedMember> {
        let leaving = self.view.table.as_ref().map(|t| &t.value.leaving);
        let mut list: Vec<WeightedMember> = self
            .view
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
        let table = self.view.table.as_ref()?;
        let owner = table.value.slots.get(partition as usize)?.owner.as_ref()?;
        if owner.member == self.identity {
            return self.owns(partition, now).map(|_| self.identity.clone());
        }
        let observed = self.view.members.get(&owner.member)?;
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
    ///
    /// A [`Change::Touched`] member record (ZooKeeper: the event names the node, not its data)
    /// is a liveness observation without content: the record's lease counts again from now (a
    /// touch comes after the write it announces, so never too early), and the record is marked
    /// unread. Why that is enough, and as safe:
    /// - **Ending an epoch** compares and swaps at a version whose content was read, and only
    ///   once the record was seen unchanged for its whole lease since the later of that read and
    ///   the last touch: if the record is still at that version, no renew came after it, which
    ///   is the rule; if it moved, the write fails. An unread record silent for two retry
    ///   periods (a renew missed) is read first (`read_action`), so a crashed
    ///   member is expired about one lease after its last renew, not two.
    /// - **Claiming from an epoch that is over** uses only what no later write undoes: a record
    ///   showing a later epoch, or the same epoch `Left`/`Expired` (a record goes back to
    ///   `Alive` only at a new epoch). A record older than the table's owner counts as absent
    ///   only once read (`after_view_change`): unread, it is the rejoin the
    ///   table names, and it is read.
    /// - **The other state changes** a member record carries: a leave (also in the table, which
    ///   is always applied: the leaver's partitions are released and it is out of every
    ///   assignment at once; its record is read when the table marks it leaving), an expiry by
    ///   another member and a rejoin (read when the rejoined member claims, as the table then
    ///   names an epoch the view lacks; a touch of a record not `Alive` is read at once), a new
    ///   weight (only with a new process, so a rejoin) are read before anything hangs on them;
    ///   until then they only delay a handoff or tilt an assignment, within a lease (the
    ///   periodic read).
    /// - **Our own record** is known from our writes' replies: its touches are ignored while we
    ///   are a member (a write by anyone else makes our next renew conflict, and the read after
    ///   it ends our epoch; S1 never depended on seeing it).
    pub fn on_store_change(&mut self, now: MonotonicTime, change: Change) {
        self.check_lapse(now);
        let key = match change {
            Change::Put(key, Stored { version, value }) => {
                if key == Key::Table && self.view.unconfirmed_table.is_some_and(|v| v <= version) {
                    self.view.unconfirmed_table = None;
                    self.timers.stop(&Timer::MissedChange);
                }
                let applied = match (&key, value) {
                    (Key::Table, Value::Table(table)) => self.adopt_table(version, table),
                    (Key::Member(id), Value::Member(record))
                        if record.identity == *id
                            && self.view.members.get(id).is_none_or(|o| o.stored.version < version) =>
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
                if self.view.members.remove(&id).is_none() {
                    return;
                }
                Key::Member(id)
            }
            Change::Touched(Key::Member(id)) => return self.touch_member(now, id),
            // `Changed`; `Resync` (the watch lost changes); the table deleted (by hand: see what is left).
            other => {
                self.read_wanted = true;
                self.view.resyncs_requested += u64::from(matches!(other, Change::Resync));
                return;
            }
        };
        self.mark_changed(&key);
        if key == Key::Member(self.identity.clone()) {
            self.check_own_record();
        }
        self.after_view_change(now);
    }

    /// A [`Change::Touched`] of `id`'s record (see [`MemberCore::on_store_change`]).
    fn touch_member(&mut self, now: MonotonicTime, id: String) {
        if id == self.identity && self.membership().is_some() {
            return;
        }
        let leaving = self.view.table.as_ref().is_some_and(|t| t.value.leaving.iter().any(|o| o.member == id));
        let behind = self.view.absent_since.remove(&id).is_some();
        let silence = self.unread_silence();
        match self.view.members.get_mut(&id) {
            Some(observed) => {
                // Read at once what the change probably decides: a record that was not alive (a
                // rejoin), one silent for two retry periods (its member missed a renew: most
                // likely its end written by another member, which the touch must not pass off as
                // a sign of life for another lease), one the table marks leaving (its `Left`),
                // one behind the table (the rejoin the table names).
                let silent = now >= observed.seen_at + silence;
                let decisive = observed.stored.value.state != MemberState::Alive || silent;
                self.read_wanted |= decisive || leaving || behind;
                observed.seen_at = now;
                observed.unread = true;
            }
            None => self.read_wanted = true,
        }
        // A read issued before this touch may be older than the record: it does not mark it read.
        self.mark_changed(&Key::Member(id));
    }

    /// How long an unread record may stay silent before this member reads the group: two retry
    /// periods (its member missed a renew), at most the renew deadline. Its lease then counts
    /// from that read, so the touches save every read at rest for about this much failover time.
    fn unread_silence(&self) -> Duration {
        let timing = self.config.timing;
        (timing.retry_period * 2).min(timing.renew_deadline)
    }

    /// When the first unread record will have been silent for [`MemberCore::unread_silence`].
    pub(super) fn unread_silent_at(&self) -> Option<MonotonicTime> {
        self.view.members.values().filter(|o| o.unread).map(|o| o.seen_at + self.unread_silence()).min()
    }

    pub(super) fn mark_changed(&mut self, key: &Key) {
        self.conflicted.remove(key);
        self.view.writes_completed += 1;
        self.view.written_at.insert(key.clone(), self.view.writes_completed);
    }

    /// A read, if one is wanted or the poll is due, and none is in flight or waiting for a retry.
    /// An unread record silent for [`MemberCore::unread_silence`] is read (with the whole group).
    pub(super) fn read_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let poll_due = self.timers.elapsed(&Timer::Poll, now);
        if self.view.pending_read.is_some() || !self.timers.elapsed(&Timer::ReadRetry, now) {
            return None;
        }
        self.read_wanted |= self.unread_silent_at().is_some_and(|at| now >= at);
        if !(self.read_wanted || poll_due) {
            return None;
        }
        let periodic = !self.read_wanted;
        self.read_wanted = false;
        self.view.pending_read = Some(PendingRead {
            issued_at_write: self.view.writes_completed,
            periodic,
            resyncs: self.view.resyncs_requested,
        });
        Some(Action::Read)
    }

    pub(super) fn check_missed_change(&mut self, now: MonotonicTime) {
        if let Some(version) = self.view.unconfirmed_table.filter(|_| self.timers.elapsed(&Timer::MissedChange, now)) {
            self.view.unconfirmed_table = None;
            self.timers.stop(&Timer::MissedChange);
            self.view.missed_changes += 1;
            self.events.push_back(GroupEvent::MissedChange { version });
        }
    }

    /// The reply to [`Action::Read`].
    pub fn on_read(&mut self, now: MonotonicTime, result: Result<Snapshot, StoreError>) {
        self.check_lapse(now);
        let Some(read) = self.view.pending_read.take() else { return };
        let timing = self.config.timing;
        let Ok(snapshot) = result else {
            self.read_wanted = true;
            self.timers.set(Timer::ReadRetry, now + timing.retry_period);
            return;
        };
        self.view.resyncs_read = Some(read.resyncs);
        self.conflicted.clear();
        // Without a watch, reading is how changes are seen: every retry period. With one, a read
        // per lease is the safety net for a change the watch lost without saying so (a watch
        // that ends quietly, an event dropped between two connections): such a loss then
        // delays a handoff by a lease at most instead of stalling it until the next change.
        let poll_period = if self.has_watch { timing.lease_duration } else { timing.retry_period };
        self.timers.set(Timer::Poll, now + poll_period);
        let newer_here =
            |key: &Key, written_at: &BTreeMap<Key, u64>| written_at.get(key).is_some_and(|w| *w > read.issued_at_write);
        if !newer_here(&Key::Table, &self.view.written_at) {
            let known = self.view.table.as_ref().map(|t| t.version);
            let found = snapshot.table.as_ref().map(|t| t.version);
            if let Some(found) = found.filter(|found| read.periodic && self.has_watch && Some(*found) > known) {
                // The watch may still bring it (an event on its way, a driver slowed by load):
                // judged a lease on.
                self.view.unconfirmed_table = Some(found);
                self.timers.set(Timer::MissedChange, now + timing.lease_duration);
            }
            self.view.set_table(snapshot.table);
        }
        let mut seen = BTreeSet::new();
        for (id, stored) in snapshot.members {
            seen.insert(id.clone());
            // A record touched since the read was issued may be newer still: its content is
            // taken if newer than the view's, and stays unread.
            let unread = self.view.members.get(&id).filter(|o| o.unread).map(|o| o.stored.version);
            if !newer_here(&Key::Member(id.clone()), &self.view.written_at) {
                self.observe_member(now, id, stored);
            } else if unread.is_some_and(|version| version < stored.version) {
                self.observe_member(now, id.clone(), stored);
                self.view.members.entry(id).and_modify(|o| o.unread = true);
            }
        }
        let written_at = &self.view.written_at;
        self.view.members.retain(|id, _| seen.contains(id) || newer_here(&Key::Member(id.clone()), written_at));
        if !newer_here(&Key::Member(self.identity.clone()), &self.view.written_at) {
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
        let newer = self.view.table.as_ref().is_none_or(|known| known.version < version);
        if newer {
            self.view.set_table(Some(Stored { version, value: table }));
        }
        newer
    }

    pub(super) fn observe_member(&mut self, now: MonotonicTime, id: String, stored: Stored<MemberRecord>) {
        let known = self.view.known_leases.entry(id.clone()).or_default();
        *known = (*known).max(record_lease(stored.value.lease_millis));
        match self.view.members.get_mut(&id) {
            Some(observed) if observed.stored.version == stored.version => {
                observed.stored = stored;
                observed.unread = false;
            }
            _ => {
                self.view.members.insert(id, ObservedMember { stored, seen_at: now, unread: false, ended_here: false });
            }
        }
    }

    /// Bookkeeping after the view changed: absences, count mismatch, slots that moved under us.
    pub(super) fn after_view_change(&mut self, now: MonotonicTime) {
        let Some(table) = &self.view.table else { return };
        let table = &table.value;
        // Owners without a record, or with a record older than the ownership: since when.
        let named = &self.view.named;
        let members = &self.view.members;
        let behind =
            |id: &String| named.get(id).is_some_and(|e| members.get(id).is_none_or(|o| o.stored.value.epoch < *e));
        // A record behind the table but not read since it changed is most likely the rejoin the
        // table names: read it; an absence counts only on what was read.
        let unread = |id: &String| members.get(id).is_some_and(|o| o.unread);
        self.read_wanted |= named.keys().any(|id| behind(id) && unread(id));
        let absent = |id: &String| behind(id) && !unread(id);
        self.view.absent_since.retain(|id, _| absent(id));
        for id in named.keys().filter(|id| absent(id)) {
            self.view.absent_since.entry(id.clone()).or_insert(now);
        }
        if table.is_consistent() && table.partition_count != self.config.partition_count {
            let (configured, group) = (self.config.partition_count, table.partition_count);
            self.report_once(GroupEvent::PartitionCountMismatch { configured, group });
        }
        self.drop_moved_partitions();
    }

    /// How long an absent owner is waited out: the longest lease seen in its records, at least ours.
    pub(super) fn absent_lease(&self, identity: &str) -> Duration {
        self.view.known_leases.get(identity).copied().unwrap_or_default().max(self.config.timing.lease_duration)
    }

    fn absent_for_a_lease(&self, identity: &str, now: MonotonicTime) -> bool {
        self.view.absent_since.get(identity).is_some_and(|since| now >= *since + self.absent_lease(identity))
    }

    /// May a slot owned by `owner` be claimed now (its owner certainly stopped working on it)?
    pub(super) fn owner_is_gone(&self, owner: &Owner, now: MonotonicTime) -> bool {
        if owner.member == self.identity {
            // An epoch of ours: the current one (a claim whose reply was lost, adopted with a new
            // term) or an earlier one, over since we rejoined.
            return self.membership().is_some_and(|m| owner.epoch <= m.epoch);
        }
        match self.view.members.get(&owner.member).map(|o| &o.stored.value) {
            Some(record) if record.epoch > owner.epoch => true,
            Some(record) if record.epoch == owner.epoch => record.state != MemberState::Alive,
            // No record, or one older than the ownership (replaced by hand, or a view that has not
            // caught up yet): wait a lease from when this member first saw it so.
            _ => self.absent_for_a_lease(&owner.member, now),
        }
    }

    /// May the partitions of `owner`, whose epoch is over ([`MemberCore::owner_is_gone`]), move in
    /// our table write now? At once if we ended the epoch (our `Expired` write) or by anything
    /// but another member's end of it; a retry period after we saw that end otherwise. Why:
    /// after a crash among 50 members every survivor saw the end within milliseconds and wrote
    /// the table (some 40 KiB at 1,024 partitions) to move the same partitions; all writes but
    /// one conflicted, and that burst was most of the time from the end to the new owners. The
    /// member that ended the epoch moves them all; if it fails to, the others do.
    pub(super) fn end_is_settled(&self, owner: &Owner, now: MonotonicTime) -> bool {
        self.view.members.get(&owner.member).filter(|_| owner.member != self.identity).is_none_or(|observed| {
            let record = &observed.stored.value;
            let ended_by_another = record.epoch == owner.epoch && record.state == MemberState::Expired;
            !ended_by_another || observed.ended_here || now >= observed.seen_at + self.config.timing.retry_period
        })
    }

    /// When the first deferred end of an epoch ([`MemberCore::end_is_settled`]) settles.
    pub(super) fn ends_settle_at(&self) -> impl Iterator<Item = MonotonicTime> + '_ {
        let expired = self.view.members.values().filter(|o| o.stored.value.state == MemberState::Expired && !o.ended_here);
        expired.map(|o| o.seen_at + self.config.timing.retry_period)
    }

    /// True when `owner`'s record shows another epoch, or that epoch not alive (the epoch is over);
    /// of a record not read since it changed, only a later epoch or that epoch not alive counts.
    pub(super) fn epoch_over(&self, owner: &Owner) -> bool {
        self.view.members.get(&owner.member).is_some_and(|observed| {
            let record = &observed.stored.value;
            match record.epoch.cmp(&owner.epoch) {
                std::cmp::Ordering::Less => !observed.unread,
                std::cmp::Ordering::Equal => record.state != MemberState::Alive,
                std::cmp::Ordering::Greater => true,
            }
        })
    }

    /// Ends the epoch of a member whose record was seen unchanged for its whole lease (ours too,
    /// if another process wrote it), by writing it `Expired` at the version seen (read, not only
    /// touched: an unread record is read first).
    ///
    /// Another member's epoch is ended only by a member (which then moves its partitions at once,
    /// see [`MemberCore::end_is_settled`]); a process not yet a member ends only its own
    /// identity's (another incarnation's), which it waits out before it joins.
    pub(super) fn tombstone_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let member = self.is_member(now);
        let (key, stored) = self.view.members.iter().find_map(|(id, observed)| {
            let record = &observed.stored.value;
            if !member && *id != self.identity {
                return None;
            }
            let ours = *id == self.identity && record.incarnation == self.incarnation;
            let key = Key::Member(id.clone());
            let known = !observed.unread;
            let fresh = self.not_conflicted(&key, observed.stored.version);
            (record.state == MemberState::Alive && !ours && known && fresh && observed.expired(now) && self.may_write(&key, now))
                .then(|| (key, observed.stored.clone()))
        })?;
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
    pub(super) fn cleanup_action(&mut self, now: MonotonicTime) -> Option<Action> {
        if !self.can_delete || self.is_leaving() || !self.is_member(now) {
            return None;
        }
        if self.live_members(now).first().is_none_or(|m| m.identity != self.identity) {
            return None;
        }
        let table = &self.view.table.as_ref()?.value;
        let stretch = 1.0 + self.config.timing.max_clock_drift();
        let (key, stored) = self.view.members.iter().find_map(|(id, observed)| {
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
            let fresh = self.not_conflicted(&key, observed.stored.version);
            (!named && !observed.unread && fresh && now >= observed.seen_at + wait && self.may_write(&key, now))
                .then(|| (key, observed.stored.clone()))
        })?;
        let expected = Some(stored.version);
        let pending = PendingWrite { started: now, kind: WriteKind::Delete, value: Value::Member(stored.value), expected };
        self.pending.insert(key.clone(), pending);
        Some(Action::Delete { key, expected: stored.version })
    }

    /// The reply to [`Action::Delete`] for `key`.
    pub fn on_delete(&mut self, now: MonotonicTime, key: &Key, result: Result<(), StoreError>) {
        self.check_lapse(now);
        let Some(pending) = self.pending.remove(key) else { return };
        match result {
            Ok(()) => {
                self.timers.stop(&Timer::WriteRetry(key.clone()));
                if let Key::Member(id) = key {
                    self.view.members.remove(id);
                }
                self.mark_changed(key);
                self.after_view_change(now);
            }
            Err(StoreError::Rejected(_)) => self.can_delete = false,
            Err(error) => self.write_failed(now, key, pending.expected, &error),
        }
    }

    /// Whether the first live member should write the table only to drop leaving marks of epochs
    /// that are over, so that a member that left is not named forever (and can be deleted).
    pub(super) fn leaving_marks_to_tidy(&self, table: &PartitionTable, me: &Owner) -> bool {
        table.leaving.iter().any(|o| o != me && self.epoch_over(o))
    }

    /// The leaving marks of a table we write: ours added if `mark_ours`, those of epochs over dropped.
    pub(super) fn leaving_marks(&self, next: &mut PartitionTable, me: &Owner, mark_ours: bool) {
        if mark_ours {
            next.leaving.insert(me.clone());
        }
        next.leaving.retain(|o| o == me || !self.epoch_over(o));
    }
}
