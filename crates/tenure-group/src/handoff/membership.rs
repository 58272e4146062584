//! Our own record: the lease every belief hangs on (S1), and the phases of our life in the group.

use tenure::{MonotonicTime, Term};

use super::{Action, GroupEvent, Holding, MemberCore, Timer, WriteKind};
use crate::record::{MemberRecord, MemberState, Owner};
use crate::store::{Key, StoreError, Value, Version};

/// One epoch of our membership, from a successful join.
#[derive(Debug, Clone, Copy)]
pub(super) struct Membership {
    pub(super) epoch: u64,
    /// The version of our record as we last wrote or saw it.
    pub(super) version: Version,
    /// The start of the last successful renew + renew deadline (S1).
    pub(super) valid_until: MonotonicTime,
    pub(super) renewals: u64,
}

/// Where this member is in its life in the group. Illegal mixes (left but still a member,
/// a member without an epoch) cannot be written down.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// Not a member: joins as soon as the view allows (the first join, a rejoin after a lapse, or
    /// after another process with our identity was waited out).
    Joining,
    /// A member: renews its record, claims its share.
    Member(Membership),
    /// [`MemberCore::leave`] was called: revokes and releases everything, then writes its record
    /// `Left`. `None` while no membership is valid (then nothing is left to release).
    Leaving(Option<Membership>),
    /// Left for good: nothing more to do.
    Left,
}

impl MemberCore {
    /// The membership of the current epoch, valid or not yet found to have lapsed.
    pub(super) fn membership(&self) -> Option<Membership> {
        match self.phase {
            Phase::Member(m) | Phase::Leaving(Some(m)) => Some(m),
            _ => None,
        }
    }

    fn membership_mut(&mut self, epoch: u64) -> Option<&mut Membership> {
        match &mut self.phase {
            Phase::Member(m) | Phase::Leaving(Some(m)) => Some(m).filter(|m| m.epoch == epoch),
            _ => None,
        }
    }

    pub(super) fn is_leaving(&self) -> bool {
        matches!(self.phase, Phase::Leaving(_))
    }

    /// Leave the group: revoke every partition, release them after the drain, then mark the record
    /// `Left`. [`GroupEvent::Left`] comes once done.
    pub fn leave(&mut self, now: MonotonicTime) {
        self.check_lapse(now);
        self.phase = match self.phase {
            Phase::Joining => Phase::Leaving(None),
            Phase::Member(m) => Phase::Leaving(Some(m)),
            other => other,
        };
    }

    /// Ends the membership if its deadline passed: every partition is dropped at that instant.
    pub(super) fn check_lapse(&mut self, now: MonotonicTime) {
        if let Some(membership) = self.membership().filter(|m| now >= m.valid_until) {
            self.lose_membership(membership.epoch);
        }
    }

    pub(super) fn lose_membership(&mut self, epoch: u64) {
        self.end_membership(match self.phase {
            Phase::Member(_) => Phase::Joining,
            Phase::Leaving(_) => Phase::Leaving(None),
            other => other,
        });
        for (partition, held) in std::mem::take(&mut self.held) {
            if held.state != Holding::Drained {
                self.events.push_back(GroupEvent::Lost { partition, term: Term(held.term) });
            }
        }
        self.events.push_back(GroupEvent::MembershipLost { epoch });
        self.read_wanted = true;
    }

    fn end_membership(&mut self, phase: Phase) {
        self.phase = phase;
        self.timers.stop(&Timer::Renew);
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
            capabilities: None,
        }
    }

    fn highest_own_epoch(&self) -> u64 {
        let in_record = self.view.members.get(&self.identity).map_or(0, |o| o.stored.value.epoch);
        let in_table = self.view.table.as_ref().map_or(0, |t| {
            let named = t.value.slots.iter().filter_map(|s| s.owner.as_ref()).chain(t.value.leaving.iter());
            named.filter(|o| o.member == self.identity).map(|o| o.epoch).max().unwrap_or(0)
        });
        in_record.max(in_table)
    }

    pub(super) fn own_record_action(&mut self, now: MonotonicTime) -> Option<Action> {
        let key = Key::Member(self.identity.clone());
        if !self.may_write(&key, now) {
            return None;
        }
        let membership = match self.phase {
            Phase::Member(m) => m,
            Phase::Leaving(Some(m)) => {
                if self.held.is_empty() && !self.pending.contains_key(&Key::Table) && !self.names_own_epoch(m.epoch) {
                    let value = Value::Member(self.own_record(m.epoch, MemberState::Left, m.renewals + 1));
                    return Some(self.start_write(now, key, Some(m.version), value, WriteKind::Leave));
                }
                m
            }
            Phase::Leaving(None) => {
                // Not a member: nothing to release (every belief ended with the membership).
                self.phase = Phase::Left;
                self.events.push_back(GroupEvent::Left);
                return None;
            }
            Phase::Joining => return self.join_action(now, key),
            Phase::Left => return None,
        };
        if !self.timers.elapsed(&Timer::Renew, now) || self.renew_after_read {
            return None;
        }
        let value = Value::Member(self.own_record(membership.epoch, MemberState::Alive, membership.renewals + 1));
        let kind = WriteKind::Renew { epoch: membership.epoch };
        Some(self.start_write(now, key, Some(membership.version), value, kind))
    }

    fn join_action(&mut self, now: MonotonicTime, key: Key) -> Option<Action> {
        let epoch = self.highest_own_epoch() + 1;
        let Some(observed) = self.view.members.get(&self.identity) else {
            if self.highest_own_epoch() > 0 {
                // The table names this identity but its record is gone (deleted by hand, or a
                // store that lost it): a process with it may still believe; wait a lease.
                let since = *self.view.absent_since.entry(self.identity.clone()).or_insert(now);
                if now < since + self.absent_lease(&self.identity) {
                    return None;
                }
            }
            // No record: a first join, or one after the record of an earlier epoch of this
            // identity was deleted (departed members' records are). A process of that epoch may
            // still have writes in flight that name it, so the new epoch must differ from every
            // earlier one: it starts at a point drawn from this process's incarnation (and above
            // every epoch this process had), so two processes never share one.
            let drawn = u64::from(self.incarnation as u32);
            let epoch = epoch.max(self.last_epoch + 1).saturating_add(drawn);
            let value = Value::Member(self.own_record(epoch, MemberState::Alive, 0));
            return Some(self.start_write(now, key, None, value, WriteKind::Join { epoch }));
        };
        let record = &observed.stored.value;
        if record.state == MemberState::Alive && record.incarnation != self.incarnation {
            self.report_once(GroupEvent::DuplicateIdentity { other_incarnation: record.incarnation });
            // Ended by `tombstone_action` once its lease ran out; then this process joins.
            return None;
        }
        let version = observed.stored.version;
        let value = Value::Member(self.own_record(epoch, MemberState::Alive, 0));
        Some(self.start_write(now, key, Some(version), value, WriteKind::Join { epoch }))
    }

    fn names_own_epoch(&self, epoch: u64) -> bool {
        let me = Owner { member: self.identity.clone(), epoch };
        self.view.table.as_ref().is_some_and(|t| t.value.slots.iter().any(|s| s.owner.as_ref() == Some(&me)))
    }

    /// After our record was read or pushed: is it still ours? A renew whose reply was lost moved
    /// its version (adopt it: the validity is not extended, only later renews extend it); anything
    /// else (expired by others, another incarnation, another epoch, gone) ends our epoch.
    pub(super) fn check_own_record(&mut self) {
        let Some(membership) = self.membership() else { return };
        if self.pending.contains_key(&Key::Member(self.identity.clone())) {
            return;
        }
        self.renew_after_read = false;
        match self.view.members.get(&self.identity).map(|o| (o.stored.version, o.stored.value.clone())) {
            Some((version, record))
                if record.incarnation == self.incarnation
                    && record.epoch == membership.epoch
                    && record.state == MemberState::Alive =>
            {
                self.adopt_own_version(membership.epoch, version, record.renewals);
            }
            _ => self.lose_membership(membership.epoch),
        }
    }

    fn adopt_own_version(&mut self, epoch: u64, version: Version, renewals: u64) {
        if let Some(m) = self.membership_mut(epoch) {
            m.version = version;
            m.renewals = m.renewals.max(renewals);
        }
    }

    pub(super) fn renew_failed(&mut self, now: MonotonicTime, epoch: u64, error: &StoreError) {
        self.timers.stop(&Timer::WriteRetry(Key::Member(self.identity.clone())));
        if self.membership_mut(epoch).is_none() {
            return;
        }
        if error.is_conflict() {
            // Our record changed: an earlier renew whose reply was lost, or the end of our epoch.
            // The next read tells (`check_own_record`); no renew until then.
            self.renew_after_read = true;
        } else {
            self.timers.set(Timer::Renew, now + self.config.timing.retry_period);
        }
    }

    pub(super) fn on_member_written(
        &mut self,
        now: MonotonicTime,
        kind: WriteKind,
        started: MonotonicTime,
        version: Version,
        renewals: u64,
    ) {
        let timing = self.config.timing;
        match kind {
            WriteKind::Join { epoch } => {
                // Our record is at the version we just wrote: a renew conflict before the join
                // is settled (the watch may never bring our own record: ZooKeeper's touches).
                self.renew_after_read = false;
                self.view.absent_since.remove(&self.identity);
                self.last_epoch = self.last_epoch.max(epoch);
                let membership = Membership { epoch, version, valid_until: started + timing.renew_deadline, renewals };
                self.phase = match self.phase {
                    Phase::Leaving(_) => Phase::Leaving(Some(membership)),
                    _ => Phase::Member(membership),
                };
                self.timers.set(Timer::Renew, started + timing.retry_period);
                if now < membership.valid_until {
                    self.events.push_back(GroupEvent::Joined { epoch });
                } else {
                    self.lose_membership(epoch);
                }
            }
            WriteKind::Renew { epoch } => {
                if let Some(m) = self.membership_mut(epoch) {
                    m.version = version;
                    m.renewals = renewals;
                    m.valid_until = m.valid_until.max(started + timing.renew_deadline);
                    self.timers.set(Timer::Renew, started + timing.retry_period);
                }
            }
            WriteKind::Leave => {
                self.end_membership(Phase::Left);
                self.held.clear();
                self.events.push_back(GroupEvent::Left);
            }
            _ => {}
        }
    }
}
