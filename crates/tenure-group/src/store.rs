//! The storage side of a group: a few keyed records with compare-and-swap and change
//! notification. Every backend implements [`GroupStore`]; every rule lives once, in the core.
//!
//! How the backends of the project map onto it (the keys are the member identities and one table):
//! - **memory** ([`crate::stores::memory`]) and **file** ([`crate::stores::file`]), in this crate;
//! - **etcd**: keys `<prefix>/members/<id>` and `<prefix>/table`, the version is the key's
//!   `mod_revision`, compare-and-swap is a transaction on it, `watch` a prefix watch;
//! - **ZooKeeper**: nodes under `/<group>`, the version is the node's data version, `setData`
//!   with a version, `watch` one persistent recursive watch;
//! - **Kubernetes**: a Lease per member (found by a label) and a ConfigMap for the table, the
//!   version is `resourceVersion`, `watch` a list-watch on the label.
//!
//! Session backends (etcd leases, ZooKeeper ephemeral nodes) could also expire member records on
//! the server; this trait does not need it, and the core's rule (a member ends another's epoch only
//! after its lease ran out on its own clock, by compare-and-swap) is correct on all of them.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;

use crate::record::{MemberRecord, PartitionTable};

/// The version of one stored record. Compare-and-swap compares it for equality; a store that
/// pushes records ([`GroupStore::watch_records`]) also promises that the versions of one record
/// increase while it exists, so that a member tells a late event from a newer one. Tenure deletes
/// only records of epochs that are over and that no table names (see [`GroupStore::delete`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Which record a write is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The partition table.
    Table,
    /// The record of the member with this identity.
    Member(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Table => f.write_str("table"),
            Key::Member(id) => write!(f, "member {id:?}"),
        }
    }
}

/// What a write stores.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// The partition table.
    Table(PartitionTable),
    /// A member record.
    Member(MemberRecord),
}

/// A record with its version.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    /// The version to pass to a compare-and-swap.
    pub version: Version,
    /// The record.
    pub value: T,
}

/// Everything a group's store holds, as one read returns it.
///
/// A store that cannot read all records atomically must read the table first and the members
/// after it: a member writes its record before it claims anything, so every owner named in the
/// table then has its record in the snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The table, `None` before the first member created it.
    pub table: Option<Stored<PartitionTable>>,
    /// The member records by identity (records that do not parse are left out and logged).
    pub members: BTreeMap<String, Stored<MemberRecord>>,
}

impl Snapshot {
    /// The snapshot of records kept by key (a key paired with the other kind of value is left out).
    pub(crate) fn of_records(records: &BTreeMap<Key, (Version, Value)>) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for (key, (version, value)) in records {
            match (key, value.clone()) {
                (Key::Table, Value::Table(value)) => snapshot.table = Some(Stored { version: *version, value }),
                (Key::Member(id), Value::Member(value)) => {
                    snapshot.members.insert(id.clone(), Stored { version: *version, value });
                }
                _ => {}
            }
        }
        snapshot
    }
}

/// Why a call to a store failed: the election's [`tenure::LockError`], with the same meaning
/// (`Conflict`, `AlreadyExists`, `Unavailable`, `Timeout`; `Rejected` also for a record that does
/// not parse where the table must be: nobody claims anything until an operator repairs it).
pub use tenure::LockError as StoreError;

/// Notifications that something in the group's store changed; the core then reads a snapshot.
/// A stream that fails or ends is re-opened by the driver after a retry period.
pub type ChangeStream = Pin<Box<dyn Stream<Item = Result<(), StoreError>> + Send>>;

/// One change pushed by [`GroupStore::watch_records`].
///
/// Why records and not only "something changed": a member that re-reads the whole group on every
/// other member's renew makes reads that grow with the member count; applying the changed record
/// itself keeps a member's load at rest to its own renew.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Something changed and the store cannot tell what: read a whole snapshot.
    Changed,
    /// Changes may have been missed (the watch was just established or re-established): read a
    /// whole snapshot, and decide nothing on the records seen so far until it is in (the view
    /// may name an owner whose newer record was among the lost changes).
    Resync,
    /// The record now holds this content, at this version.
    Put(Key, Stored<Value>),
    /// The record was deleted.
    Deleted(Key),
    /// The member record changed (one or more writes), content and version not read: ZooKeeper's
    /// watch events name the node without its data, and a `getData` per renew of every other
    /// member would make each member's requests at rest grow with the member count. The core
    /// takes it as a sign of life and reads the record only before acting on it (see
    /// [`crate::handoff::MemberCore::on_store_change`] for why that is safe). A store sends it
    /// only for member records that existed before (a created record comes as [`Change::Put`]);
    /// of the table it means [`Change::Changed`].
    Touched(Key),
}

/// The changes of a group's records, in the store's order (see [`GroupStore::watch_records`]).
pub type RecordStream = Pin<Box<dyn Stream<Item = Result<Change, StoreError>> + Send>>;

/// A place that keeps a group's records with compare-and-swap.
///
/// Why this small: the handoff protocol needs exactly a snapshot read, a conditional write per
/// record and a change notification, so a backend is a few dozen lines and every safety rule
/// lives once, in [`crate::handoff::MemberCore`].
#[async_trait]
pub trait GroupStore: Send + Sync + 'static {
    /// Where the group lives, for logs (`file:///run/user/1000/tenure/groups/g`).
    fn describe(&self) -> String;

    /// Reads every record of the group.
    async fn read(&self) -> Result<Snapshot, StoreError>;

    /// Creates the record (`expected == None`, [`StoreError::AlreadyExists`] if it exists) or
    /// replaces it if it is still at `expected` ([`StoreError::Conflict`] otherwise).
    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError>;

    /// Change notifications, if the store can push them; `None` makes members poll every retry
    /// period.
    fn watch(&self) -> Option<ChangeStream> {
        None
    }

    /// The changes of the records one by one, if the store can push them with their content; the
    /// default turns every notification of [`GroupStore::watch`] into [`Change::Changed`].
    ///
    /// A store that overrides it must: yield [`Change::Resync`] once the watch is established
    /// (and again after anything that may have lost changes: a reconnection); yield the changes
    /// after it in the order the store applied them, each after the write it announces; and give
    /// a record versions that increase while it exists. An error ends the stream; the driver
    /// re-opens it after a retry period.
    fn watch_records(&self) -> Option<RecordStream> {
        use futures::StreamExt;
        self.watch().map(|changes| changes.map(|change| change.map(|()| Change::Changed)).boxed())
    }

    /// Deletes the record if it is still at `expected` ([`StoreError::Conflict`] otherwise, also
    /// when it is gone). The core deletes only the records of members whose epoch is over (they
    /// left, or were expired after their lease ran out) and that the table no longer names, so
    /// that departed members do not accumulate. A store that cannot delete keeps them: the
    /// default refuses with [`StoreError::Rejected`], and the core then stops trying.
    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let _ = expected;
        Err(StoreError::Rejected(format!("{key}: {} cannot delete records", self.describe())))
    }
}

#[async_trait]
impl<S: GroupStore + ?Sized> GroupStore for std::sync::Arc<S> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    async fn read(&self) -> Result<Snapshot, StoreError> {
        (**self).read().await
    }
    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        (**self).write(key, expected, value).await
    }
    fn watch(&self) -> Option<ChangeStream> {
        (**self).watch()
    }
    fn watch_records(&self) -> Option<RecordStream> {
        (**self).watch_records()
    }
    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        (**self).delete(key, expected).await
    }
}
