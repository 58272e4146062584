//! Tidying after other members, so that a silent member's partitions move and departed members'
//! records do not pile up: ending silent epochs, deleting records, dropping stale leaving marks.

use std::time::Duration;

use tenure::MonotonicTime;

use super::{Action, MemberCore, PendingWrite, WriteKind};
use crate::config::record_lease;
use crate::record::{MemberRecord, MemberState, Owner, PartitionTable};
use crate::store::{Key, StoreError, Value};

impl MemberCore {
    /// Ends the epoch of a member whose record was seen unchanged for its whole lease (ours too,
    /// if another process wrote it), by writing it `Expired` at the version seen.
    pub(super) fn tombstone_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let (key, stored) = self.members.iter().find_map(|(id, observed)| {
            let record = &observed.stored.value;
            let ours = *id == self.identity && record.incarnation == self.incarnation;
            let key = Key::Member(id.clone());
            (record.state == MemberState::Alive && !ours && observed.expired(now) && self.may_write(&key, now))
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
                self.timers.stop(&super::Timer::WriteRetry(key.clone()));
                if let Key::Member(id) = key {
                    self.members.remove(id);
                }
                self.mark_changed(key);
                self.after_view_change(now);
            }
            Err(StoreError::Rejected(_)) => self.can_delete = false,
            Err(error) => self.write_failed(now, key, &error),
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
