//! The partitions this member holds and the table write that moves them (assignment, revoke
//! before assign, releases, claims): where P1 is kept.

use std::hash::{Hash, Hasher};

use tenure::{MonotonicTime, Term};

use super::{Action, GroupEvent, MemberCore, Moves, WriteKind};
use crate::assignment::{assign, WeightedMember};
use crate::record::{Owner, PartitionTable, Slot};
use crate::store::{Key, Stored, Value};

/// How this member holds a partition it claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holding {
    /// Owned: the application works on it.
    Active,
    /// Revoked: the application finishes its work; still counted as working by the checker.
    /// Back to `Active` if the assignment changes back before the drain ends.
    Draining,
    /// The application stopped: the release may be written.
    Drained,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) term: u64,
    pub(super) state: Holding,
}

/// What an assignment is a function of.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AssignmentKey {
    table: crate::store::Version,
    members: Vec<(String, u32)>,
    current: Target,
}

/// An owner of each partition, as an index into the live members.
type Target = Vec<Option<usize>>;

/// The last assignment computed, and what it was computed from (it is asked for on every poll).
#[derive(Debug, Default)]
pub(super) struct AssignmentCache(Option<(AssignmentKey, Target)>);

impl AssignmentCache {
    /// The target owner of each partition, as an index into `live`.
    fn target(&mut self, table: &Stored<PartitionTable>, live: &[WeightedMember], current: Target) -> Target {
        let members = live.iter().map(|m| (m.identity.clone(), m.weight)).collect();
        let key = AssignmentKey { table: table.version, members, current };
        match &self.0 {
            Some((cached, target)) if *cached == key => target.clone(),
            _ => {
                let target = assign(table.value.partition_count, live, &key.current);
                self.0 = Some((key, target.clone()));
                target
            }
        }
    }
}

/// Our part of the target assignment.
struct Share {
    target: Target,
    /// Our index among the live members, while we are one.
    me: Option<usize>,
}

impl Share {
    fn mine(&self, partition: u32) -> bool {
        self.me.is_some() && self.target.get(partition as usize).copied().flatten() == self.me
    }
}

impl MemberCore {
    /// The table write to make now, if any: releases and, if `may_claim`, claims. In this order:
    /// create a missing table (report a corrupt one); step 2 [`MemberCore::share`] (unless its
    /// inputs are those of the last decision that wrote nothing); step 3
    /// [`MemberCore::revoke_and_restore`]; step 4 [`MemberCore::releases`],
    /// [`MemberCore::claims`]; then one compare-and-swap with them and the
    /// [`MemberCore::leaving_marks`].
    pub(super) fn table_action(&mut self, now: MonotonicTime, may_claim: bool) -> Option<Action> {
        let membership = self.membership().filter(|m| now < m.valid_until)?;
        let Some(table) = &self.view.table else {
            let value = Value::Table(PartitionTable::new(self.config.partition_count));
            let create = may_claim && self.may_write(&Key::Table, now);
            return create.then(|| self.start_write(now, Key::Table, None, value, WriteKind::CreateTable));
        };
        if !table.value.is_consistent() {
            self.report_once(GroupEvent::CorruptTable);
            return None;
        }
        let me = Owner { member: self.identity.clone(), epoch: membership.epoch };
        let live = self.live_members(now);
        let inputs = self.decision_inputs(now, may_claim, &live);
        if self.idle_decision == Some(inputs) {
            return None;
        }
        let (share, first) = self.share(&live, membership.epoch)?;
        self.revoke_and_restore(&share);
        let wanted = |p: u32| may_claim && !self.is_leaving() && share.mine(p);
        for (partition, term) in self.handed_to_us(now, &me, wanted) {
            self.hold(partition, term);
        }
        let table = self.view.table.as_ref()?;
        // After a conflict, the same write would only conflict again: wait for the newer table.
        if !self.may_write(&Key::Table, now) || !self.not_conflicted(&Key::Table, table.version) {
            return None;
        }
        let wanted = |p: u32| may_claim && !self.is_leaving() && share.mine(p);
        let releases = self.releases(&table.value, &me, wanted);
        let mut next = table.value.clone();
        for (partition, _) in &releases {
            next.slots[*partition as usize].owner = None;
        }
        let moves = if may_claim { self.moves(&next, now, &share, &live, &me, wanted) } else { Vec::new() };
        let tidy = may_claim && first && self.leaving_marks_to_tidy(&table.value, &me);
        if releases.is_empty() && moves.is_empty() && !tidy {
            self.idle_decision = Some(inputs);
            return None;
        }
        let mut claims = Moves::new();
        for (partition, owner) in moves {
            let slot = &mut next.slots[partition as usize];
            slot.term = slot.term.saturating_add(1);
            if owner == me {
                claims.push((partition, slot.term));
            }
            slot.owner = Some(owner);
        }
        // A leaver is marked in its first release: from then on everyone leaves it out of the
        // assignment as it does itself, so what it hands over is wanted where it goes (unmarked,
        // the others would hand its partitions back to it while it drains the rest).
        self.leaving_marks(&mut next, &me, self.is_leaving());
        let version = table.version;
        for (partition, term) in &releases {
            self.spend(*partition, *term);
        }
        let kind = WriteKind::Table { epoch: membership.epoch, claims, releases };
        Some(self.start_write(now, Key::Table, Some(version), Value::Table(next), kind))
    }

    /// A digest of everything a table decision depends on besides the clock's passing of
    /// deadlines that it also covers: the table, our epoch and holdings, every record's epoch and
    /// state, the live members (whose records' leases run out), owners absent for a lease.
    ///
    /// Why: at rest a member is told of every other member's renew, and each used to cost passes
    /// over every partition (the share, releases, claims): work growing with members x
    /// partitions, enough to saturate two cores with 50 members of 1,024 partitions in one
    /// process. A decision that wrote nothing is not made again until its inputs change. (Doing
    /// nothing is always safe; a collision of digests would only delay a move to the next change.)
    fn decision_inputs(&self, now: MonotonicTime, may_claim: bool, live: &[WeightedMember]) -> u64 {
        let mut digest = std::hash::DefaultHasher::new();
        (self.view.table.as_ref().map(|t| t.version), self.membership().map(|m| m.epoch)).hash(&mut digest);
        (may_claim, self.is_leaving(), self.conflicted.get(&Key::Table)).hash(&mut digest);
        for (partition, held) in &self.held {
            (partition, held.term, held.state as u8).hash(&mut digest);
        }
        for (identity, observed) in &self.view.members {
            let record = &observed.stored.value;
            (identity, record.epoch, record.state as u8, record.weight, observed.ended_here).hash(&mut digest);
        }
        live.iter().for_each(|m| m.identity.hash(&mut digest));
        let absent = self.view.absent_since.iter().filter(|(id, since)| now >= **since + self.absent_lease(id));
        absent.count().hash(&mut digest);
        self.ends_settle_at().filter(|at| now >= *at).count().hash(&mut digest);
        digest.finish()
    }

    /// Step 2: our share of the target assignment (from who owns what now, so that little moves),
    /// and whether we are the first live member.
    fn share(&mut self, live: &[WeightedMember], epoch: u64) -> Option<(Share, bool)> {
        let table = self.view.table.as_ref()?;
        let current = table.value.slots.iter().map(|slot| self.live_owner_index(slot, live, epoch)).collect();
        let target = self.assignment_cache.target(table, live, current);
        let me = live.iter().position(|m| m.identity == self.identity);
        Some((Share { target, me }, me == Some(0)))
    }

    /// The index in `live` of the owner of `slot`, if it is a live member at the epoch it claimed in.
    fn live_owner_index(&self, slot: &Slot, live: &[WeightedMember], epoch: u64) -> Option<usize> {
        let owner = slot.owner.as_ref()?;
        let index = live.iter().position(|m| m.identity == owner.member)?;
        let live_epoch = if owner.member == self.identity {
            epoch
        } else {
            self.view.members.get(&owner.member)?.stored.value.epoch
        };
        (owner.epoch == live_epoch).then_some(index)
    }

    /// Step 3: revoke what should move; keep what should stay after all and was not released
    /// yet. (Only a draining partition comes back: no release of it was ever sent. A drained one
    /// may have a release in the store whose reply was lost.)
    fn revoke_and_restore(&mut self, share: &Share) {
        for (partition, held) in self.held.iter_mut() {
            let (partition, term) = (*partition, Term(held.term));
            match (held.state, share.mine(partition)) {
                (Holding::Active, false) => {
                    held.state = Holding::Draining;
                    self.events.push_back(GroupEvent::Revoked { partition, term });
                }
                (Holding::Draining, true) => {
                    held.state = Holding::Active;
                    self.events.push_back(GroupEvent::Restored { partition, term });
                }
                _ => {}
            }
        }
    }

    /// Step 4a: drained partitions the table still gives us, then slots naming us that we neither
    /// hold nor want (claims whose reply was lost: nobody works on them).
    fn releases(&self, table: &PartitionTable, me: &Owner, wanted: impl Fn(u32) -> bool) -> Moves {
        let names_us = |p: u32, term: u64| {
            table.slots.get(p as usize).is_some_and(|s| s.owner.as_ref() == Some(me) && s.term == term)
        };
        let drained = self.held.iter().filter(|(p, h)| h.state == Holding::Drained && names_us(**p, h.term));
        let lost_replies = (0..table.partition_count).filter(|p| {
            !self.held.contains_key(p) && !wanted(*p) && table.slots[*p as usize].owner.as_ref() == Some(me)
        });
        drained.map(|(p, h)| (*p, h.term)).chain(lost_replies.map(|p| (p, table.slots[p as usize].term))).collect()
    }

    /// Slots of our share that the table gives us under our current epoch, at a term we never held
    /// nor released, and that we do not hold: handed to us in another member's table write (or
    /// our own claim, whose reply is still on its way or was lost). Taken up without a write: the
    /// writer found the slot free or its owner gone, as a claim of ours would have, and the
    /// compare-and-swap of the table made that term ours alone.
    fn handed_to_us(&self, now: MonotonicTime, me: &Owner, wanted: impl Fn(u32) -> bool) -> Moves {
        let Some(table) = self.view.table.as_ref().filter(|_| self.is_member(now)) else { return Moves::new() };
        let fresh = |p: u32, term: u64| self.spent.get(&p).is_none_or(|spent| term > *spent);
        (0..table.value.partition_count)
            .filter(|p| !self.held.contains_key(p) && wanted(*p))
            .filter_map(|p| {
                let slot = &table.value.slots[p as usize];
                (slot.owner.as_ref() == Some(me) && fresh(p, slot.term)).then_some((p, slot.term))
            })
            .collect()
    }

    /// Step 4b: every slot that may move now, free (`next` has our releases) or its owner gone,
    /// with the live member it goes to: to us, a claim (if `wanted`); to another member, a
    /// handover under the epoch its record shows, which that member takes up when it sees the
    /// table ([`MemberCore::handed_to_us`]). Why hand over: after a crash among many members the
    /// new owners each claimed their part with their own compare-and-swap of the one table, one
    /// round after another; and a graceful move was a release, then a claim. Now the first table
    /// write moves everything that can move, and P1 is kept the same way: the writer checks what
    /// a claimer would, and the new owner starts only once it sees the table.
    fn moves(
        &self,
        next: &PartitionTable,
        now: MonotonicTime,
        share: &Share,
        live: &[WeightedMember],
        me: &Owner,
        wanted: impl Fn(u32) -> bool,
    ) -> Vec<(u32, Owner)> {
        let released = |p: u32| next.slots[p as usize].owner.is_none();
        (0..next.partition_count)
            .filter(|p| !self.held.contains_key(p) || released(*p))
            .filter(|p| {
                let owner = next.slots[*p as usize].owner.as_ref();
                owner.is_none_or(|o| self.owner_is_gone(o, now) && self.end_is_settled(o, now))
            })
            .filter_map(|p| {
                let target = &live.get(share.target.get(p as usize).copied()??)?.identity;
                if *target == me.member {
                    return wanted(p).then(|| (p, me.clone()));
                }
                let record = &self.view.members.get(target)?.stored.value;
                Some((p, Owner { member: target.clone(), epoch: record.epoch }))
            })
            .collect()
    }

    /// Starts holding `partition` under `term` (claimed or handed to us).
    fn hold(&mut self, partition: u32, term: u64) {
        self.spend(partition, term);
        self.held.insert(partition, Held { term, state: Holding::Active });
        self.events.push_back(GroupEvent::Acquired { partition, term: Term(term) });
    }

    /// Remembers that `term` of `partition` was ours (see `MemberCore::spent`).
    fn spend(&mut self, partition: u32, term: u64) {
        let spent = self.spent.entry(partition).or_default();
        *spent = (*spent).max(term);
    }

    /// Our table write of `epoch` is in: releases are done, claims count if the epoch is valid.
    pub(super) fn on_table_written(&mut self, now: MonotonicTime, epoch: u64, claims: Moves, releases: Moves) {
        for (partition, term) in releases {
            // Only the ownership released: the watch may have brought this write first, and with
            // it our claim of the partition under the next term.
            if self.held.get(&partition).is_some_and(|h| h.term == term) {
                self.held.remove(&partition);
                self.events.push_back(GroupEvent::Released { partition, term: Term(term) });
            }
        }
        if self.membership().is_some_and(|m| m.epoch == epoch && now < m.valid_until) {
            // A claim the watch brought first was taken up already.
            for (partition, term) in claims {
                if !self.held.contains_key(&partition) {
                    self.hold(partition, term);
                }
            }
        }
        self.after_view_change(now);
    }

    /// After the view changed: a held partition whose slot no longer names us under its term is
    /// released (if drained) or lost.
    pub(super) fn drop_moved_partitions(&mut self) {
        let (Some(table), Some(membership)) = (&self.view.table, self.membership()) else { return };
        let me = Owner { member: self.identity.clone(), epoch: membership.epoch };
        let still_ours = |p: u32, h: &Held| {
            table.value.slots.get(p as usize).is_some_and(|s| s.owner.as_ref() == Some(&me) && s.term == h.term)
        };
        let gone: Vec<(u32, Held)> =
            self.held.iter().filter(|(p, h)| !still_ours(**p, h)).map(|(p, h)| (*p, *h)).collect();
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
}
