//! Which member should own which partition: a balanced, sticky assignment over rendezvous scores.
//!
//! Why not plain rendezvous hashing or a ring: with either, a member's share is a random variable
//! whose spread shrinks only with the square root of the partitions per member; reaching a
//! max/mean of 1.05 at 50 members would take some 10^5 partitions (Tooz's ring with 32 virtual
//! nodes reaches about 1.27 at 11 members). Instead, every member gets between the floor and the
//! ceiling of its quota `P x weight / total weight`, and the rendezvous score of (member,
//! partition) only decides *which* partitions. What keeps movement minimal is stickiness: the
//! assignment is a function of the live members *and the current owners*. An owner keeps its
//! partitions up to its ceiling (its best-scored ones), and only partitions without a live owner or
//! above an owner's ceiling move, first to members below their floor. When one member joins, only
//! partitions moving to it move; when one leaves, only its own partitions move (see the tests).
//!
//! Every member computes the same assignment from the same view; views that differ for a while
//! cost nothing in safety (the handoff protocol never lets two members own a partition), only a
//! later move.
//!
//! The hash is XXH3 (64 bits) from the `xxhash-rust` crate: a specified, stable, portable
//! algorithm (same output on every platform and release, unlike `DefaultHasher` or `ahash`, whose
//! output may change and which are seeded per process), widely used, fast, and with good
//! avalanche on short inputs like member names.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The default number of partitions of a group: 1024.
///
/// Why: every member owns the floor or the ceiling of its quota, so max/mean is at most
/// `ceil(P/N) / (P/N)`, which is at most 1.05 once `P/N >= 20`: 1024 partitions keep that for up
/// to 51 members (1.025 at 50). A larger count costs a larger table (about 40 bytes per owned
/// partition, so ~40 KiB) in each handoff write, and nothing at rest.
pub const DEFAULT_PARTITION_COUNT: u32 = 1024;

/// A live member as the assignment sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedMember {
    /// Its identity.
    pub identity: String,
    /// Its relative share (>= 1).
    pub weight: u32,
}

/// The partition a key belongs to: XXH3 of the key, reduced to `[0, partition_count)` by
/// multiply-shift (unbiased enough for any count, no modulo bias towards low partitions).
///
/// ```
/// let p = tenure_group::assignment::partition_of(b"default/my-pod", 1024);
/// assert!(p < 1024);
/// assert_eq!(p, tenure_group::assignment::partition_of(b"default/my-pod", 1024));
/// ```
pub fn partition_of(key: &[u8], partition_count: u32) -> u32 {
    let hash = xxh3_64(key);
    ((u128::from(hash) * u128::from(partition_count.max(1))) >> 64) as u32
}

/// The rendezvous score of a member for a partition: members prefer the partitions they score
/// highest, and free partitions go to the highest-scoring member that has room.
pub fn score(identity: &str, partition: u32) -> u64 {
    xxh3_64_with_seed(identity.as_bytes(), u64::from(partition))
}

/// The target owner of every partition (an index into `members`), given the current owners
/// (`current[p]`: an index into `members`, `None` when the partition has no live owner).
///
/// `members` must be sorted by identity with positive weights; with no members every partition
/// is `None`. See the module documentation for the rules and why.
pub fn assign(partition_count: u32, members: &[WeightedMember], current: &[Option<usize>]) -> Vec<Option<usize>> {
    let count = partition_count as usize;
    let mut result: Vec<Option<usize>> = vec![None; count];
    if members.is_empty() {
        return result;
    }
    let total_weight: u64 = members.iter().map(|m| u64::from(m.weight.max(1))).sum();
    let quota = |m: usize| -> (usize, usize) {
        let numerator = u64::from(partition_count) * u64::from(members[m].weight.max(1));
        let floor = numerator / total_weight;
        let ceil = numerator.div_ceil(total_weight);
        (floor as usize, ceil as usize)
    };
    let bounds: Vec<(usize, usize)> = (0..members.len()).map(quota).collect();
    let mut loads = vec![0usize; members.len()];

    // Owners keep their best-scored partitions up to their ceiling.
    let mut owned: Vec<Vec<u32>> = vec![Vec::new(); members.len()];
    let mut pool: Vec<u32> = Vec::new();
    for p in 0..count {
        match current.get(p).copied().flatten() {
            Some(m) if m < members.len() => owned[m].push(p as u32),
            _ => pool.push(p as u32),
        }
    }
    for (m, partitions) in owned.iter_mut().enumerate() {
        let identity = &members[m].identity;
        partitions.sort_by_key(|&p| (std::cmp::Reverse(score(identity, p)), p));
        for (rank, &p) in partitions.iter().enumerate() {
            if rank < bounds[m].1 {
                result[p as usize] = Some(m);
                loads[m] += 1;
            } else {
                pool.push(p);
            }
        }
    }
    pool.sort_unstable();

    // Free partitions go to the best-scoring member below its floor, then below its ceiling.
    let best = |p: u32, loads: &[usize], limit: &dyn Fn(usize) -> usize| -> Option<usize> {
        (0..members.len())
            .filter(|&m| loads[m] < limit(m))
            .max_by_key(|&m| (score(&members[m].identity, p), std::cmp::Reverse(m)))
    };
    let mut deferred = Vec::new();
    for p in pool {
        match best(p, &loads, &|m| bounds[m].0) {
            Some(m) => {
                result[p as usize] = Some(m);
                loads[m] += 1;
            }
            None => deferred.push(p),
        }
    }
    for p in deferred {
        if let Some(m) = best(p, &loads, &|m| bounds[m].1) {
            result[p as usize] = Some(m);
            loads[m] += 1;
        }
    }

    // A member still below its floor (a newcomer when nobody was above the new ceiling) takes
    // partitions from the members furthest above their floor.
    while let Some(taker) = (0..members.len()).find(|&m| loads[m] < bounds[m].0) {
        let Some(donor) = (0..members.len())
            .filter(|&m| loads[m] > bounds[m].0)
            .max_by_key(|&m| (loads[m] - bounds[m].0, std::cmp::Reverse(m)))
        else {
            break;
        };
        let taker_identity = &members[taker].identity;
        let Some(p) = (0..count)
            .filter(|&p| result[p] == Some(donor))
            .max_by_key(|&p| (score(taker_identity, p as u32), std::cmp::Reverse(p)))
        else {
            break;
        };
        result[p] = Some(taker);
        loads[donor] -= 1;
        loads[taker] += 1;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<WeightedMember> {
        let mut list: Vec<WeightedMember> =
            (0..n).map(|i| WeightedMember { identity: format!("member-{i}"), weight: 1 }).collect();
        list.sort_by(|a, b| a.identity.cmp(&b.identity));
        list
    }

    fn loads(assignment: &[Option<usize>], n: usize) -> Vec<usize> {
        let mut loads = vec![0; n];
        for m in assignment.iter().flatten() {
            loads[*m] += 1;
        }
        loads
    }

    fn max_over_mean(assignment: &[Option<usize>], n: usize) -> f64 {
        let loads = loads(assignment, n);
        let max = *loads.iter().max().unwrap() as f64;
        max / (assignment.len() as f64 / n as f64)
    }

    /// The assignment of `after` members, given owners from `before` (by identity).
    fn reassign(
        count: u32,
        before: &[WeightedMember],
        owners: &[Option<usize>],
        after: &[WeightedMember],
    ) -> Vec<Option<usize>> {
        let current: Vec<Option<usize>> = owners
            .iter()
            .map(|o| o.and_then(|m| after.iter().position(|a| a.identity == before[m].identity)))
            .collect();
        assign(count, after, &current)
    }

    fn moved(before: &[WeightedMember], a: &[Option<usize>], after: &[WeightedMember], b: &[Option<usize>]) -> usize {
        a.iter().zip(b).filter(|(x, y)| x.map(|m| &before[m].identity) != y.map(|m| &after[m].identity)).count()
    }

    #[test]
    fn every_partition_is_assigned_and_balance_is_within_five_percent_for_3_to_50_members() {
        for n in 3..=50 {
            let list = members(n);
            let a = assign(DEFAULT_PARTITION_COUNT, &list, &vec![None; DEFAULT_PARTITION_COUNT as usize]);
            assert!(a.iter().all(Option::is_some), "{n} members: a partition has no owner");
            let ratio = max_over_mean(&a, n);
            assert!(ratio <= 1.05, "{n} members: max/mean {ratio}");
        }
    }

    #[test]
    fn a_join_or_a_leave_moves_at_most_ceil_p_over_n_plus_one_and_keeps_balance() {
        let count = DEFAULT_PARTITION_COUNT;
        for n in 3..=50 {
            let list = members(n);
            let settled = assign(count, &list, &vec![None; count as usize]);
            let bound = (count as usize).div_ceil(n) + 1;

            // Join.
            let mut joined = list.clone();
            joined.push(WeightedMember { identity: format!("newcomer-{n}"), weight: 1 });
            joined.sort_by(|a, b| a.identity.cmp(&b.identity));
            let after_join = reassign(count, &list, &settled, &joined);
            let moves = moved(&list, &settled, &joined, &after_join);
            assert!(moves <= bound, "{n} members, join: {moves} moves > {bound}");
            let newcomer = joined.iter().position(|m| m.identity.starts_with("newcomer")).unwrap();
            for (p, (x, y)) in settled.iter().zip(&after_join).enumerate() {
                if x.map(|m| &list[m].identity) != y.map(|m| &joined[m].identity) {
                    assert_eq!(*y, Some(newcomer), "{n} members, join: partition {p} moved between old members");
                }
            }
            assert!(max_over_mean(&after_join, n + 1) <= 1.05, "{n}+1 members after a join");

            // Leave of each member in turn would be slow; leave of three spread-out members.
            for leaver in [0, n / 2, n - 1] {
                let left: Vec<WeightedMember> =
                    list.iter().enumerate().filter(|(i, _)| *i != leaver).map(|(_, m)| m.clone()).collect();
                let after_leave = reassign(count, &list, &settled, &left);
                let moves = moved(&list, &settled, &left, &after_leave);
                assert!(moves <= bound, "{n} members, leave of {leaver}: {moves} moves > {bound}");
                for (p, x) in settled.iter().enumerate() {
                    if *x != Some(leaver) {
                        let before = x.map(|m| list[m].identity.clone());
                        let after = after_leave[p].map(|m| left[m].identity.clone());
                        assert_eq!(before, after, "{n} members, leave: partition {p} of a staying member moved");
                    }
                }
                assert!(max_over_mean(&after_leave, n - 1) <= 1.05, "{n}-1 members after a leave");
            }
        }
    }

    #[test]
    fn a_settled_assignment_is_a_fixed_point() {
        for n in [3, 7, 20, 50] {
            let list = members(n);
            let settled = assign(DEFAULT_PARTITION_COUNT, &list, &vec![None; DEFAULT_PARTITION_COUNT as usize]);
            assert_eq!(assign(DEFAULT_PARTITION_COUNT, &list, &settled), settled);
        }
    }

    #[test]
    fn weights_give_proportional_shares() {
        let list = vec![
            WeightedMember { identity: "big".into(), weight: 3 },
            WeightedMember { identity: "small".into(), weight: 1 },
        ];
        let a = assign(1024, &list, &[None; 1024]);
        assert_eq!(loads(&a, 2), vec![768, 256]);
    }

    #[test]
    fn no_members_means_no_owners_and_keys_spread_over_partitions() {
        assert!(assign(16, &[], &[None; 16]).iter().all(Option::is_none));
        let mut hits = vec![0u32; 16];
        for i in 0..16_000 {
            hits[partition_of(format!("ns/pod-{i}").as_bytes(), 16) as usize] += 1;
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }

    #[test]
    fn owners_that_are_not_members_any_more_are_ignored() {
        let list = members(3);
        let a = assign(8, &list, &[Some(7), Some(0), None, Some(99), None, None, None, None]);
        assert!(a.iter().all(|m| matches!(m, Some(i) if *i < 3)));
    }
}
