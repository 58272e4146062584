//! The fencing term: a number that grows with every new tenure of a lock.

use std::fmt;

/// A fencing token (invariant S2): every new tenure on a lock gets a term strictly greater than
/// every earlier one on that lock, also when the same identity acquires it again after losing it.
///
/// Why it exists: a leader can be paused (GC, SIGSTOP, a slow disk) past its lease and act on
/// stale belief. Pass the term along with every write to a resource you protect, and have the
/// resource reject writes carrying a term lower than the highest it has seen.
///
/// On record locks the term is the record's `leaderTransitions` (the first tenure is term 1);
/// on etcd it is the create revision of the leader's key, on ZooKeeper the creation zxid of the
/// leader's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Term(pub u64);

impl Term {
    /// The term that follows this one.
    pub fn next(self) -> Term {
        Term(self.0.saturating_add(1))
    }

    /// The term a store counts as a signed number (`leaderTransitions`, an etcd revision, a
    /// ZooKeeper zxid); a negative count, which no honest store sends, reads as term 0.
    pub fn from_count(count: impl TryInto<u64>) -> Term {
        Term(count.try_into().unwrap_or(0))
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
