//! Unit tests of the core against a tiny synchronous store.

use super::*;
use crate::record::{MemberRecord, MemberState, Owner};
use crate::store::{Change, Snapshot};
use std::time::Duration;

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
    /// The changes as ZooKeeper's watch gives them ([`deliver`]): a member record that changed
    /// as `Touched`, a created record and the table as records.
    changes: Vec<Change>,
    /// Snapshot reads answered.
    reads: u64,
}

impl Store {
    fn snapshot(&self) -> Snapshot {
        Snapshot::of_records(&self.records)
    }

    fn apply(&mut self, core: &mut MemberCore, now: MonotonicTime) {
        assert!(self.apply_holding(core, now, false).is_none());
    }

    fn write(&mut self, key: &Key, expected: Option<Version>, value: Value) -> Result<Version, StoreError> {
        if self.records.get(key).map(|(v, _)| *v) != expected {
            return Err(StoreError::Conflict);
        }
        self.next += 1;
        let version = Version(self.next);
        let touched = expected.is_some() && matches!(key, Key::Member(_));
        self.changes.push(if touched {
            Change::Touched(key.clone())
        } else {
            Change::Put(key.clone(), Stored { version, value: value.clone() })
        });
        self.records.insert(key.clone(), (version, value));
        Ok(version)
    }

    /// Applies every action at once; with `hold`, the first table write is committed but its
    /// reply is returned instead of handed to the core: a reply still on its way.
    fn apply_holding(
        &mut self,
        core: &mut MemberCore,
        now: MonotonicTime,
        hold: bool,
    ) -> Option<(Key, Result<Version, StoreError>)> {
        while let Some(action) = core.poll_action(now) {
            match action {
                Action::Read => {
                    self.reads += 1;
                    core.on_read(now, Ok(self.snapshot()));
                }
                Action::Write { key, expected, value } => {
                    let result = self.write(&key, expected, value);
                    if hold && key == Key::Table {
                        assert!(result.is_ok());
                        return Some((key, result));
                    }
                    core.on_write(now, &key, result);
                }
                Action::Delete { key, expected } => {
                    let result = if self.records.get(&key).map(|(v, _)| *v) == Some(expected) {
                        self.records.remove(&key);
                        self.changes.push(Change::Deleted(key.clone()));
                        Ok(())
                    } else {
                        Err(StoreError::Conflict)
                    };
                    core.on_delete(now, &key, result);
                }
            }
        }
        None
    }

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
/// the release), until a full read. (a's watch re-opened and its read is not in, so a releases
/// without handing the partitions to b: b claims them itself.)
#[test]
fn a_release_seen_before_the_reply_to_an_own_claim_is_claimed_at_once() {
    let (mut store, mut a, mut b) = a_and_b_at_zero();
    let revoked = revoked_partitions(&mut a);
    assert_eq!(revoked.len(), 2);
    a.on_store_change(at(5), Change::Resync);
    assert_eq!(a.poll_action(at(5)), Some(Action::Read), "the read a's resync asks for (its reply is slow)");
    let release = |store: &mut Store, a: &mut MemberCore, now: MonotonicTime, partition: u32| {
        a.on_drained(now, partition);
        let Some(Action::Write { key, expected, value }) = a.poll_action(now) else { panic!("a releases {partition}") };
        let Value::Table(table) = &value else { panic!("not a table write") };
        assert_eq!(table.slots[partition as usize].owner, None, "a handed over before its resync read");
        let result = store.write(&key, expected, value);
        a.on_write(now, &key, result);
    };
    // a releases the first; b claims it, and the claim commits; its reply is late.
    release(&mut store, &mut a, at(20), revoked[0]);
    b.on_change(at(30));
    let (key, reply) = store.apply_holding(&mut b, at(30), true).expect("b claims the released partition");
    let claim = store.table_event();
    // a's watch brings b's claim; a releases the second partition on top of it.
    a.on_store_change(at(40), claim.clone());
    release(&mut store, &mut a, at(40), revoked[1]);
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

/// a joins alone and owns everything (at time 0).
fn a_alone_at_zero() -> (Store, MemberCore) {
    let mut store = Store::default();
    let mut a = member("a");
    store.apply(&mut a, at(0));
    store.apply(&mut a, at(0));
    (store, a)
}

/// a joins and owns everything, then b joins and a revokes b's share (all at time 0).
fn a_and_b_at_zero() -> (Store, MemberCore, MemberCore) {
    let (mut store, mut a) = a_alone_at_zero();
    let mut b = member("b");
    store.apply(&mut b, at(0));
    a.on_change(at(0));
    store.apply(&mut a, at(0));
    (store, a, b)
}

#[test]
fn a_lone_member_owns_every_partition_and_stops_believing_at_its_renew_deadline() {
    let (_, a) = a_alone_at_zero();
    assert_eq!(a.owned(at(0)).len(), PARTITIONS as usize);
    assert_eq!(a.owns(0, at(0)), Some(Term(1)));
    // No renew reaches the store: at the renew deadline (2 s) every belief ends by itself.
    assert!(a.owns(0, at(1_999)).is_some());
    assert_eq!(a.owns(0, at(2_000)), None);
    assert_eq!(a.may_work_on(0, at(2_000)), None);
}

#[test]
fn a_newcomer_claims_only_after_the_owner_released_and_with_a_higher_term() {
    let (mut store, mut a) = a_alone_at_zero();
    let mut b = member("b");
    store.apply(&mut b, at(10));
    assert!(b.owned(at(10)).is_empty(), "b claimed partitions a still owns");
    // a sees b, revokes its share, and keeps owning nothing it gave up.
    a.on_change(at(20));
    store.apply(&mut a, at(20));
    let revoked = revoked_partitions(&mut a);
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

/// Hands `core` the store's changes since the last delivery, as ZooKeeper's watch gives them.
fn deliver(store: &mut Store, core: &mut MemberCore, now: MonotonicTime) {
    for change in std::mem::take(&mut store.changes) {
        core.on_store_change(now, change);
    }
}

/// a and b own two partitions each, all at time 0; from then on b learns of a's record only by
/// `Touched` ([`deliver`]).
fn a_and_b_settled() -> (Store, MemberCore, MemberCore) {
    let (mut store, mut a, mut b) = a_and_b_at_zero();
    for p in revoked_partitions(&mut a) {
        a.on_drained(at(0), p);
    }
    store.apply(&mut a, at(0));
    b.on_change(at(0));
    store.apply(&mut b, at(0));
    a.on_change(at(0));
    store.apply(&mut a, at(0));
    store.changes.clear();
    assert_eq!((a.owned(at(0)).len(), b.owned(at(0)).len()), (2, 2));
    (store, a, b)
}

/// a lapses and rejoins under a new epoch; b hears of it only by a touch of a's record, then the
/// table naming a's new epoch. b must not take the new epoch for a record gone missing (it would
/// claim a's partitions a lease later, while a owns them): it reads the record first.
#[test]
fn a_rejoin_seen_only_as_touches_is_read_before_anything_hangs_on_the_new_epoch() {
    let (mut store, mut a, mut b) = a_and_b_settled();
    let (old_epoch, partitions) = (a.epoch(), a.owned(at(0)));
    store.apply(&mut b, at(1000));
    store.apply(&mut b, at(2000));
    // a missed its renews past its deadline (2 s): it rejoins and claims its partitions again.
    store.apply(&mut a, at(2500));
    assert!(a.epoch() > old_epoch && a.owned(at(2500)).keys().eq(partitions.keys()), "a did not rejoin");
    let rejoined = Owner { member: "a".into(), epoch: a.epoch().unwrap() };
    deliver(&mut store, &mut b, at(2500));
    assert_eq!(b.poll_action(at(2500)), Some(Action::Read), "b did not read the record of a's new epoch");
    // The read is slow. a renews and b hears touches: a's new epoch never counts as gone.
    let lease = timing().lease_duration.as_millis() as u64;
    for t in (2600..=2500 + 2 * lease).step_by(100) {
        if t % 1000 == 500 {
            store.apply(&mut a, at(t));
        }
        deliver(&mut store, &mut b, at(t));
        assert!(!b.owner_is_gone(&rejoined, at(t)), "b took a's new epoch for over at {t} ms");
        assert!(b.live_members(at(t)).iter().any(|m| m.identity == "a"), "b lost a at {t} ms");
    }
    let end = at(2500 + 2 * lease);
    b.on_read(end, Ok(store.snapshot()));
    for p in partitions.keys() {
        assert_eq!(b.owner_of(*p, end).as_deref(), Some("a"), "partition {p} after the read");
    }
}

/// a leaves; b hears the table (a's partitions released, a marked leaving) and a touch of a's
/// record (its `Left`): b reads it at once, owns everything, and deletes a's record.
#[test]
fn a_leave_seen_only_as_a_touch_is_read_at_once() {
    let (mut store, mut a, mut b) = a_and_b_settled();
    a.leave(at(100));
    store.apply(&mut a, at(100));
    for p in revoked_partitions(&mut a) {
        a.on_drained(at(100), p);
    }
    store.apply(&mut a, at(100));
    assert!(a.has_left());
    deliver(&mut store, &mut b, at(110));
    assert_eq!(b.poll_action(at(110)), Some(Action::Read), "b did not read the record of a leaving member");
    b.on_read(at(110), Ok(store.snapshot()));
    store.apply(&mut b, at(110));
    assert_eq!(b.owned(at(110)).len(), PARTITIONS as usize);
    assert!(!store.records.contains_key(&Key::Member("a".into())), "a's record was not deleted");
}

/// At rest b reads nothing but its once-per-lease snapshot, whatever a's renews. a crashes right
/// after a renew: b reads a's record after two silent retry periods and ends a's epoch a lease
/// after that read, never earlier than a lease after the last touch.
#[test]
fn a_crash_seen_only_as_touches_is_read_after_two_silent_retry_periods_and_expired_a_lease_later() {
    let (mut store, mut a, mut b) = a_and_b_settled();
    let lease = timing().lease_duration.as_millis() as u64;
    let mut b_reads = 0;
    let mut step_b = |store: &mut Store, b: &mut MemberCore, t: u64| {
        deliver(store, b, at(t));
        let before = store.reads;
        store.apply(b, at(t));
        b_reads += store.reads - before;
        b_reads
    };
    // a renews every second until it crashes after its renew at 5 s.
    for t in (100..=5000).step_by(100) {
        if t % 1000 == 0 {
            store.apply(&mut a, at(t));
        }
        step_b(&mut store, &mut b, t);
    }
    assert_eq!(step_b(&mut store, &mut b, 5000), 1, "b read more than once a lease at rest");
    drop(a);
    let read_at = 5000 + 2 * timing().retry_period.as_millis() as u64;
    for t in (5100..read_at).step_by(100) {
        assert_eq!(step_b(&mut store, &mut b, t), 1, "b read a's record before it was silent at {t} ms");
    }
    assert_eq!(step_b(&mut store, &mut b, read_at), 2, "b did not read a's silent record");
    for t in (read_at + 100..read_at + lease).step_by(100) {
        step_b(&mut store, &mut b, t);
        assert_eq!(b.owned(at(t)).len(), 2, "b took a's partitions at {t} ms");
    }
    step_b(&mut store, &mut b, read_at + lease);
    assert_eq!(b.owned(at(read_at + lease)).len(), PARTITIONS as usize);
}

/// A renew that conflicted waits for a read showing our record; when the membership lapses
/// before such a read and the member rejoins, the join's compare-and-swap tells the record, so
/// the member renews again (with ZooKeeper's touches no event ever shows it its own record).
#[test]
fn a_member_whose_renew_conflicted_renews_again_after_it_rejoined() {
    let (mut store, mut a) = a_alone_at_zero();
    let Some(Action::Write { key, .. }) = a.poll_action(at(1000)) else { panic!("no renew at 1 s") };
    a.on_write(at(1000), &key, Err(StoreError::Conflict));
    assert_eq!(a.poll_action(at(1000)), Some(Action::Read));
    a.on_read(at(1000), Err(StoreError::Unavailable("dropped by the test".into())));
    // The membership lapses at 2 s; at 2.5 s a reads, rejoins, and renews from then on.
    store.apply(&mut a, at(2500));
    assert!(a.is_member(at(2500)), "a did not rejoin");
    store.apply(&mut a, at(3500));
    assert!(a.is_member(at(4600)), "a never renewed after it rejoined");
}

#[test]
fn after_a_conflict_the_table_is_not_written_again_until_a_newer_table_is_seen() {
    let (mut store, mut a) = a_alone_at_zero();
    let mut b = member("b");
    store.apply(&mut b, at(10));
    // Another write of the table that a does not hear of yet.
    let (version, table) = store.records[&Key::Table].clone();
    store.write(&Key::Table, Some(version), table).unwrap();
    let (version, record) = store.records[&Key::Member("b".into())].clone();
    a.on_store_change(at(20), Change::Put(Key::Member("b".into()), Stored { version, value: record }));
    assert_eq!(a.poll_action(at(20)), None);
    for p in revoked_partitions(&mut a) {
        a.on_drained(at(30), p);
    }
    let Some(Action::Write { key: Key::Table, expected, value }) = a.poll_action(at(30)) else {
        panic!("a releases what it drained")
    };
    let result = store.write(&Key::Table, expected, value);
    assert!(matches!(result, Err(StoreError::Conflict)));
    a.on_write(at(30), &Key::Table, result);
    // The watch brings the newer table: no read, and no write at the version that conflicted.
    assert_eq!(a.poll_action(at(30)), None, "a read, or wrote the table again at the version that conflicted");
    a.on_store_change(at(40), store.table_event());
    assert!(matches!(a.poll_action(at(40)), Some(Action::Write { key: Key::Table, .. })));
}

/// The table writes of [`Store::apply`]ing `core` at `now`.
fn table_writes(store: &mut Store, core: &mut MemberCore, now: MonotonicTime) -> usize {
    let before = store.changes.iter().filter(|c| matches!(c, Change::Put(Key::Table, _))).count();
    store.apply(core, now);
    store.changes.iter().filter(|c| matches!(c, Change::Put(Key::Table, _))).count() - before
}

/// a, b and c share 6 partitions; c crashes. The first survivor past c's lease ends c's epoch,
/// and its next table write hands every one of c's partitions to its new owner: the other
/// survivor takes its part up from the table under the next term, without a table write.
#[test]
fn a_crashed_members_partitions_move_to_all_their_new_owners_in_one_table_write() {
    let config = GroupConfig { timing: timing(), partition_count: 6, weight: 1 };
    let new = |id: &str| MemberCore::new(id, id.len() as u64 + 7, config, true).unwrap();
    let (mut store, mut members) = (Store::default(), vec![new("a"), new("b"), new("c")]);
    let step = |store: &mut Store, members: &mut [MemberCore], t: u64| {
        for m in members.iter_mut() {
            m.on_change(at(t));
            store.apply(m, at(t));
            for p in revoked_partitions(m) {
                m.on_drained(at(t), p);
            }
            store.apply(m, at(t));
        }
    };
    for t in (0..1000).step_by(100) {
        step(&mut store, &mut members, t);
    }
    let owned: Vec<usize> = members.iter().map(|m| m.owned(at(1000)).len()).collect();
    assert_eq!(owned, [2, 2, 2], "the group did not settle");
    let c = members.pop().unwrap();
    let c_partitions = c.owned(at(1000));
    drop(c);
    // b runs until it ended c's epoch and handed c's partitions over; a only renews meanwhile.
    let (mut a, mut b) = (members.remove(0), members.remove(0));
    let lease = timing().lease_duration.as_millis() as u64;
    let mut handover_at = None;
    for t in (1100..=1000 + 2 * lease).step_by(100) {
        b.on_change(at(t));
        if table_writes(&mut store, &mut b, at(t)) > 0 && handover_at.is_none() {
            handover_at = Some(t);
        }
        if t % 1000 == 0 {
            store.apply(&mut a, at(t)); // a's renew, nothing else
        }
    }
    let handover_at = handover_at.expect("b never wrote the table after c's lease");
    // c's last write was its join at 0 ms, which b saw at once.
    assert!(handover_at >= lease, "c's partitions moved at {handover_at} ms, before c's lease ran out");
    let Some((_, Value::Table(table))) = store.records.get(&Key::Table) else { panic!("no table") };
    for (p, term) in &c_partitions {
        let owner = table.slots[*p as usize].owner.as_ref().expect("a partition of c left free");
        assert_ne!(owner.member, "c");
        assert_eq!(table.slots[*p as usize].term, term.0 + 1, "partition {p}");
    }
    // a hears the table and takes up its part without writing the table.
    let now = at(1000 + 2 * lease);
    a.on_store_change(now, store.table_event());
    assert_eq!(table_writes(&mut store, &mut a, now), 0, "a wrote the table to take up what was handed to it");
    let total = a.owned(now).len() + b.owned(now).len();
    assert_eq!(total, 6, "a owns {:?}, b owns {:?}", a.owned(now), b.owned(now));
    assert!(a.owned(now).len() == 3 && b.owned(now).len() == 3);
}

/// A slot that names this member under a term it released is never taken up again: its
/// release (here a handover to b) may be in the store with its reply lost, and the view not
/// yet past it, while b already owns the next term.
#[test]
fn a_slot_named_under_a_term_this_member_released_is_never_taken_up() {
    let mut store = Store::default();
    let mut a = member("a");
    // a joins and creates the table; its claim of everything commits, and its reply is lost.
    let (key, created) = store.apply_holding(&mut a, at(0), true).expect("a creates the table");
    a.on_write(at(0), &key, created);
    let (key, _) = store.apply_holding(&mut a, at(0), true).expect("a claims");
    a.on_write(at(0), &key, Err(StoreError::Timeout(Duration::from_secs(1))));
    assert_eq!(a.owned(at(0)).len(), 0);
    // b joins. a hears of b, then of its own claim: it takes up its share and hands b's over
    // (a table write a retry period after the failed one); that write commits, its reply is lost.
    let mut b = member("b");
    store.apply(&mut b, at(1000));
    let (version, record) = store.records[&Key::Member("b".into())].clone();
    a.on_store_change(at(1010), Change::Put(Key::Member("b".into()), Stored { version, value: record.clone() }));
    a.on_store_change(at(1010), store.table_event());
    let (key, _) = store.apply_holding(&mut a, at(1010), true).expect("a hands b's share over");
    a.on_write(at(1010), &key, Err(StoreError::Timeout(Duration::from_secs(1))));
    let kept = a.owned(at(1010));
    assert_eq!(kept.len(), 2, "a did not take up its share of its own claim");
    let Some((_, Value::Table(table))) = store.records.get(&Key::Table) else { panic!("no table") };
    let handed: Vec<u32> = (0..PARTITIONS).filter(|p| !kept.contains_key(p)).collect();
    for p in &handed {
        assert_eq!(table.slots[*p as usize].owner.as_ref().map(|o| o.member.as_str()), Some("b"));
    }
    // a's view still names a in those slots (term 1); b leaves, which a hears.
    let Value::Member(record) = record else { unreachable!() };
    let left = MemberRecord { state: MemberState::Left, ..record };
    a.on_store_change(at(1050), Change::Put(Key::Member("b".into()), Stored { version: Version(version.0 + 1000), value: Value::Member(left) }));
    // (The read a wants after its failed write is slow.)
    while a.poll_action(at(1050)).is_some() {}
    for p in &handed {
        assert_eq!(a.owns(*p, at(1050)), None, "a took up partition {p} under the term it handed to b");
    }
}
