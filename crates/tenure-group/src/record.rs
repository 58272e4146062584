//! What a group keeps in its store: one record per member (its liveness) and one partition table
//! (who owns which partition, under which term).
//!
//! Why this split: a member's liveness must cost one write per retry period whatever the number of
//! partitions, so the renew touches only the member's own small record. Ownership changes only on
//! a handoff, and a handoff of many partitions is one compare-and-swap of the table, so a
//! rebalance costs a couple of writes, not one per partition.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// A member's state in its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MemberState {
    /// The member renews this record; its epoch is alive while it does.
    Alive,
    /// The member left gracefully: the epoch is over, and it owns nothing.
    Left,
    /// Another member saw the record unchanged for a whole lease and ended the epoch by
    /// compare-and-swap, so that a renew the member had in flight can no longer succeed.
    Expired,
}

/// One member's record, renewed every retry period (the only write a member makes at rest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    /// The member's identity, also the record's key.
    pub identity: String,
    /// A random number drawn when the process started: tells two processes that claim the same
    /// identity apart.
    pub incarnation: u64,
    /// Grows every time the identity (re)joins. An ownership is recorded as (identity, epoch), so
    /// an ownership from an epoch that is over is known to be dead.
    pub epoch: u64,
    /// Whether the epoch is alive.
    pub state: MemberState,
    /// How long others wait, from when they saw this record change, before they may end the epoch.
    pub lease_millis: u64,
    /// The member's share of partitions relative to the others' (1 for an equal share).
    pub weight: u32,
    /// The partition count this member was configured with (to detect a mismatch).
    pub partition_count: u32,
    /// Counts renews, so that every renew changes the record.
    pub renewals: u64,
    /// What the member says about itself, for others to read (Tooz's capabilities, written by
    /// `tenure coordinate`); absent in the records of older members, which read alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<serde_json::Value>,
}

/// Who owns a partition: a member during one of its epochs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// The member's identity.
    pub member: String,
    /// The member's epoch when it claimed the partition.
    pub epoch: u64,
}

/// One partition in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    /// The term of the latest ownership (0: never owned). Every claim writes `term + 1`, by
    /// compare-and-swap of the whole table, so terms strictly increase per partition.
    pub term: u64,
    /// The current owner; `None` once the owner released the partition (after it stopped work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// The partition table of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionTable {
    /// The group's partition count, fixed by the member that created the table. A member
    /// configured otherwise adopts this one, so all members map keys to partitions alike.
    pub partition_count: u32,
    /// One slot per partition.
    pub slots: Vec<Slot>,
    /// Members (with their epoch) that are leaving, marked in their first release (each release
    /// hands what it drained to the next owners): left out of the assignment by everyone at
    /// once, so that what a leaver hands over stays where it goes.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub leaving: BTreeSet<Owner>,
}

impl PartitionTable {
    /// A table with every partition free and never owned.
    pub fn new(partition_count: u32) -> Self {
        PartitionTable { partition_count, slots: vec![Slot::default(); partition_count as usize], ..Self::default() }
    }

    /// The table's slots if it is consistent (as many slots as partitions).
    pub fn is_consistent(&self) -> bool {
        self.slots.len() == self.partition_count as usize && self.partition_count > 0
    }
}
