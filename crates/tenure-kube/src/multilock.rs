//! client-go's migration multi-locks (`endpointsleases`, `configmapsleases`): one record held
//! in two objects at once, an old-style Endpoints object or ConfigMap (the *primary*) and a Lease
//! of the same name (the *secondary*).
//!
//! Why they exist: a deployment whose replicas elect on an Endpoints object cannot switch to a
//! Lease in one rolling upgrade, because for a while old replicas (watching only the Endpoints)
//! and new ones (watching only the Lease) would run side by side with nothing in common, and each
//! side could elect its own leader. The multi-lock is the step in between:
//! `endpoints` → `endpointsleases` → `leases`, one rolling upgrade each. During the first, every
//! candidate writes the Endpoints object; during the second, every candidate writes the Lease.
//!
//! # Semantics (client-go's `MultiLock`, made compare-and-swap throughout)
//!
//! - **Get** reads both objects. With both present, the record is the primary's, except that if
//!   the holders differ, the holder reads as client-go's [`UNKNOWN_LEADER`], so nobody trusts
//!   either object alone and every candidate waits for a full lease without changes before taking
//!   over. The term (`leaderTransitions`) and lease duration are the larger of the two, so terms
//!   keep increasing across kinds (S2) and the longer claim is honoured. With one object present,
//!   its record is the record. A corrupt record in either object makes the whole record corrupt
//!   (held by an unknown holder for one lease, then taken over).
//! - **Version** combines both `resourceVersion`s (and their absence), so a change of either
//!   object is a change of the multi-lock's record and restarts followers' lease countdown.
//! - **Update** writes the primary with compare-and-swap on its version as read, then the
//!   secondary with compare-and-swap on *its* version as read (or creates it if it was absent).
//!   client-go instead re-reads the secondary right before writing it, which can overwrite a
//!   Lease that a `leases` candidate acquired after the decision was made; here that write fails
//!   with a conflict.
//! - **Create** (both absent when read) creates the primary, then the secondary. `AlreadyExists`
//!   on the primary is reported as usual. On the secondary it means a `leases` candidate created
//!   the Lease after our read, so it is reported as a conflict rather than "tolerated" by
//!   overwriting the Lease: overwriting would depose a leader that does not know it.
//!
//! # Why there are never two leaders during the migration
//!
//! A candidate leads only after a write succeeded, and every write is a compare-and-swap against
//! the versions the decision was based on; followers count a lease from the moment *they* saw the
//! last change (the core's rule S3), and leaders fence themselves after the renew deadline (S1).
//!
//! - `endpoints` + `endpointsleases` running together: every candidate writes the Endpoints object,
//!   each with compare-and-swap on its version, so at most one of any two conflicting acquisitions
//!   succeeds, exactly as on a single lock. A multi-lock candidate sees every change an Endpoints
//!   candidate makes (the combined version changes), so it waits out their leases.
//! - `endpointsleases` + `leases`: every candidate writes the Lease, each with compare-and-swap on
//!   the Lease's version as read. A multi-lock candidate's primary write may succeed while its
//!   Lease write then fails; the objects then disagree, the record reads as held by
//!   [`UNKNOWN_LEADER`], nobody (including the writer) treats itself as its holder, and the lock
//!   is taken over only after a full lease without changes. The Lease's own holder, renewing, keeps
//!   changing the combined version, so multi-lock candidates never take it from a live leader.
//! - Skipping the middle step (`endpoints` and `leases` candidates at once) is unsafe for any
//!   implementation: the two share no object. As in client-go, migrate in two rolling upgrades.
//!
//! A candidate's own write passes through an intermediate state (primary written, secondary not
//! yet): the watch of a multi-lock does not report that state to the candidate that is writing it,
//! or every renew would look like someone else's change and cost a read.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use tenure::{ChangeStream, LeaderElectionRecord, LockError, RecordError, RecordLock, StoredRecord, Version};
use tokio::sync::{mpsc, watch};

use crate::codec::RecordObject;
use crate::object::{stored, ObjectLock};

/// The holder a multi-lock reports when its two objects name different holders: client-go's
/// `UnknownLeader`. Nobody has this identity, so every candidate waits out its lease.
pub const UNKNOWN_LEADER: &str = "leaderelection.k8s.io/unknown";

/// The versions of both objects of a multi-lock (`None`: the object does not exist), which
/// together are the multi-lock's [`Version`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PairVersion {
    /// The primary's (Endpoints or ConfigMap) `resourceVersion`.
    pub primary: Option<String>,
    /// The secondary's (Lease) `resourceVersion`.
    pub secondary: Option<String>,
}

impl PairVersion {
    /// The opaque version string: a JSON pair such as `["41","42"]` (`null` for an absent object),
    /// unambiguous whatever characters the server's versions contain.
    pub fn encode(&self) -> Version {
        Version(serde_json::to_string(&(&self.primary, &self.secondary)).unwrap_or_default())
    }

    /// The pair a version from [`PairVersion::encode`] stands for; `None` for any other string.
    pub fn decode(version: &Version) -> Option<PairVersion> {
        let (primary, secondary) = serde_json::from_str(&version.0).ok()?;
        Some(PairVersion { primary, secondary })
    }

    fn of(primary: Option<&StoredRecord>, secondary: Option<&StoredRecord>) -> PairVersion {
        PairVersion { primary: primary.map(|s| s.version.0.clone()), secondary: secondary.map(|s| s.version.0.clone()) }
    }
}

/// What a multi-lock holds, given what each of its objects holds (`None`: absent). A pure
/// function: see the module documentation for the rules.
pub fn combine(primary: Option<StoredRecord>, secondary: Option<StoredRecord>) -> Option<StoredRecord> {
    let version = PairVersion::of(primary.as_ref(), secondary.as_ref()).encode();
    let record = match (primary, secondary) {
        (None, None) => return None,
        (Some(only), None) | (None, Some(only)) => only.record,
        (Some(primary), Some(secondary)) => merge_records(primary.record, secondary.record),
    };
    Some(StoredRecord { version, record })
}

/// The record of two objects that both exist: the primary's, with the holder replaced by
/// [`UNKNOWN_LEADER`] if the two disagree, and the larger term and lease of the two.
pub fn merge_records(
    primary: Result<LeaderElectionRecord, RecordError>,
    secondary: Result<LeaderElectionRecord, RecordError>,
) -> Result<LeaderElectionRecord, RecordError> {
    let (primary, secondary) = (primary?, secondary?);
    let mut merged = primary.clone();
    if primary.holder_identity != secondary.holder_identity {
        merged.holder_identity = UNKNOWN_LEADER.to_owned();
    }
    merged.leader_transitions = primary.leader_transitions.max(secondary.leader_transitions);
    merged.lease_duration_seconds = primary.lease_duration_seconds.max(secondary.lease_duration_seconds);
    Ok(merged)
}

/// This lock's own writes, for its watch: while one is under way, and for the intermediate state
/// of the last one, the watch holds its reports back (see the module documentation).
#[derive(Debug, Clone, Default)]
struct OwnWrites {
    in_flight: usize,
    /// The state the last successful write passed through: its primary written, the secondary
    /// still as it was.
    intermediate: Option<PairVersion>,
}

/// Counts a write as in flight until dropped (also when the elector's call timeout drops it).
struct InFlight<'a>(&'a watch::Sender<OwnWrites>);

impl<'a> InFlight<'a> {
    fn start(writes: &'a watch::Sender<OwnWrites>) -> Self {
        writes.send_modify(|w| w.in_flight += 1);
        InFlight(writes)
    }

    fn succeeded(self, intermediate: PairVersion) {
        self.0.send_modify(|w| w.intermediate = Some(intermediate));
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|w| w.in_flight = w.in_flight.saturating_sub(1));
    }
}

/// A record held in an old-style object `P` (Endpoints or ConfigMap) and a Lease of the same name,
/// for migrating from the former to the latter without two leaders. See the module documentation.
#[derive(Clone)]
pub struct MultiLock<P: RecordObject> {
    primary: ObjectLock<P>,
    secondary: ObjectLock<Lease>,
    own_writes: Arc<watch::Sender<OwnWrites>>,
}

impl<P: RecordObject> MultiLock<P> {
    /// The multi-lock on `primary` and `secondary` (normally the same name in one namespace).
    pub fn new(primary: ObjectLock<P>, secondary: ObjectLock<Lease>) -> Self {
        MultiLock { primary, secondary, own_writes: Arc::new(watch::channel(OwnWrites::default()).0) }
    }

    /// Bounds how long opening each object's watch may take.
    pub fn with_watch_open_timeout(self, timeout: std::time::Duration) -> Self {
        MultiLock {
            primary: self.primary.with_watch_open_timeout(timeout),
            secondary: self.secondary.with_watch_open_timeout(timeout),
            own_writes: self.own_writes,
        }
    }

    /// References to both objects, primary first, for Events (client-go records each event on both).
    pub fn object_references(&self) -> Vec<ObjectReference> {
        vec![self.primary.object_reference(), self.secondary.object_reference()]
    }

    /// Writes `record` into both objects, each with compare-and-swap on its part of `expected`
    /// (creating an object expected to be absent).
    async fn write(&self, expected: &PairVersion, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        let in_flight = InFlight::start(&self.own_writes);
        let primary = match &expected.primary {
            Some(version) => self.primary.update_object(&Version(version.clone()), record).await?,
            None => self.primary.create_object(record).await?,
        };
        let secondary = match &expected.secondary {
            Some(version) => self.secondary.update_object(&Version(version.clone()), record).await?,
            // Created by someone since it was read (a `leases` candidate acquiring): a conflict.
            None => self.secondary.create_object(record).await.map_err(|e| match e {
                LockError::AlreadyExists => LockError::Conflict,
                other => other,
            })?,
        };
        let written = PairVersion { primary: primary.resource_version(), secondary: secondary.resource_version() };
        in_flight.succeeded(PairVersion { primary: written.primary.clone(), secondary: expected.secondary.clone() });
        Ok(written.encode())
    }
}

#[async_trait]
impl<P: RecordObject> RecordLock for MultiLock<P> {
    fn describe(&self) -> String {
        format!("{}+{}", self.primary.describe(), self.secondary.describe())
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        let (primary, secondary) = futures::try_join!(self.primary.get_object(), self.secondary.get_object())?;
        Ok(combine(primary.as_ref().map(stored), secondary.as_ref().map(stored)))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.write(&PairVersion { primary: None, secondary: None }, record).await
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        // A version that is not a pair, or a pair of two absent objects, cannot be the current one.
        let expected = PairVersion::decode(expected)
            .filter(|pair| pair.primary.is_some() || pair.secondary.is_some())
            .ok_or(LockError::Conflict)?;
        // Creating an object expected absent is a compare-and-swap too: it existing now is a conflict.
        self.write(&expected, record).await.map_err(|e| match e {
            LockError::AlreadyExists => LockError::Conflict,
            other => other,
        })
    }

    fn watch(&self) -> Option<ChangeStream> {
        let primary = self.primary.object_changes()?.map(|r| r.map(|o| Side::Primary(o.as_ref().map(stored))));
        let secondary = self.secondary.object_changes()?.map(|r| r.map(|o| Side::Secondary(o.as_ref().map(stored))));
        let mut changes = futures::stream::select(primary, secondary);
        let mut own_writes = self.own_writes.subscribe();
        let (sender, receiver) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut merger = WatchMerger::default();
            let mut own_writes_open = true;
            loop {
                tokio::select! {
                    item = changes.next() => match item {
                        Some(Ok(side)) => merger.observe(side),
                        Some(Err(error)) => {
                            let _ = sender.send(Err(error)).await;
                            return;
                        }
                        None => return,
                    },
                    changed = own_writes.changed(), if own_writes_open => own_writes_open = changed.is_ok(),
                    _ = sender.closed() => return,
                }
                let writes = own_writes.borrow_and_update().clone();
                if let Some(state) = merger.next_report(&writes) {
                    if sender.send(Ok(state)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Some(Box::pin(futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        })))
    }
}

/// One object's new state, from its watch.
enum Side {
    Primary(Option<StoredRecord>),
    Secondary(Option<StoredRecord>),
}

/// The latest state of both objects, and which combined state was reported last.
#[derive(Default)]
struct WatchMerger {
    /// `None` until that object's watch reported its first state.
    primary: Option<Option<StoredRecord>>,
    secondary: Option<Option<StoredRecord>>,
    last_reported: Option<Option<Version>>,
}

impl WatchMerger {
    fn observe(&mut self, side: Side) {
        match side {
            Side::Primary(state) => self.primary = Some(state),
            Side::Secondary(state) => self.secondary = Some(state),
        }
    }

    /// The combined state to report now, if any: not before both objects are known, not while
    /// this lock is writing, not the intermediate state of its last write, and not twice.
    fn next_report(&mut self, writes: &OwnWrites) -> Option<Option<StoredRecord>> {
        let (Some(primary), Some(secondary)) = (&self.primary, &self.secondary) else { return None };
        let intermediate = writes.intermediate.as_ref() == Some(&PairVersion::of(primary.as_ref(), secondary.as_ref()));
        if writes.in_flight > 0 || intermediate {
            return None;
        }
        let state = combine(primary.clone(), secondary.clone());
        let version = state.as_ref().map(|s| s.version.clone());
        if self.last_reported.as_ref() == Some(&version) {
            return None;
        }
        self.last_reported = Some(version);
        Some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, transitions: i64, lease: i64) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: holder.into(),
            lease_duration_seconds: lease,
            acquire_time: None,
            renew_time: None,
            leader_transitions: transitions,
            ..Default::default()
        }
    }

    fn at(version: &str, record: LeaderElectionRecord) -> Option<StoredRecord> {
        Some(StoredRecord { version: Version(version.into()), record: Ok(record) })
    }

    fn pair(primary: Option<&str>, secondary: Option<&str>) -> Version {
        PairVersion { primary: primary.map(Into::into), secondary: secondary.map(Into::into) }.encode()
    }

    #[test]
    fn objects_naming_different_holders_read_as_client_go_unknown_leader() {
        let combined = combine(at("10", record("old-leader", 3, 15)), at("11", record("new-leader", 4, 15))).unwrap();
        let merged = combined.record.unwrap();
        assert_eq!(merged.holder_identity, "leaderelection.k8s.io/unknown");
        assert_eq!(merged.leader_transitions, 4, "the larger term, so terms keep increasing across kinds");
        assert_eq!(combined.version, pair(Some("10"), Some("11")));
        // A released object and a held one disagree too: nobody may trust the free one.
        let half_released = combine(at("1", record("", 3, 1)), at("2", record("a", 3, 15))).unwrap();
        assert_eq!(half_released.record.unwrap(), record(UNKNOWN_LEADER, 3, 15));
    }

    #[test]
    fn objects_naming_the_same_holder_read_as_the_primary_with_the_longer_claims() {
        let mut primary = record("a", 5, 15);
        primary.renew_time = Some(chrono::DateTime::UNIX_EPOCH);
        let merged = combine(at("1", primary.clone()), at("2", record("a", 4, 30))).unwrap().record.unwrap();
        assert_eq!(merged, LeaderElectionRecord { lease_duration_seconds: 30, ..primary });
    }

    #[test]
    fn one_object_alone_is_the_record_and_none_is_absent() {
        assert_eq!(combine(None, None), None);
        let only_primary = combine(at("7", record("a", 1, 15)), None).unwrap();
        assert_eq!(
            (only_primary.record.unwrap().holder_identity, only_primary.version),
            ("a".into(), pair(Some("7"), None))
        );
        let only_lease = combine(None, at("8", record("b", 2, 15))).unwrap();
        assert_eq!(
            (only_lease.record.unwrap().holder_identity, only_lease.version),
            ("b".into(), pair(None, Some("8")))
        );
    }

    #[test]
    fn a_corrupt_record_in_either_object_makes_the_whole_record_corrupt() {
        let corrupt =
            Some(StoredRecord { version: Version("9".into()), record: Err(RecordError::Malformed("x".into())) });
        assert!(combine(corrupt.clone(), at("1", record("a", 1, 15))).unwrap().record.is_err());
        assert!(combine(at("1", record("a", 1, 15)), corrupt).unwrap().record.is_err());
    }

    #[test]
    fn the_version_changes_when_either_object_changes_and_decodes_only_its_own_form() {
        let versions =
            [pair(Some("1"), Some("2")), pair(Some("1"), Some("3")), pair(Some("4"), Some("2")), pair(Some("1"), None)];
        for (i, a) in versions.iter().enumerate() {
            for b in &versions[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let odd = PairVersion { primary: Some("a\",\"b".into()), secondary: None };
        assert_eq!(PairVersion::decode(&odd.encode()), Some(odd));
        for garbage in ["", "12", "[1,2]", "[\"1\"]", "{}"] {
            assert_eq!(PairVersion::decode(&Version(garbage.into())), None, "{garbage}");
        }
    }

    #[test]
    fn the_watch_hides_the_intermediate_state_of_its_own_write_but_not_others_changes() {
        let mut merger = WatchMerger::default();
        let idle = OwnWrites::default();
        merger.observe(Side::Primary(at("1", record("a", 1, 15))));
        assert_eq!(merger.next_report(&idle), None, "not before both objects are known");
        merger.observe(Side::Secondary(at("2", record("a", 1, 15))));
        assert_eq!(merger.next_report(&idle).unwrap().unwrap().version, pair(Some("1"), Some("2")));
        assert_eq!(merger.next_report(&idle), None, "not twice");

        // Our renew: primary written (3), the Lease not yet.
        merger.observe(Side::Primary(at("3", record("a", 1, 15))));
        let writing = OwnWrites { in_flight: 1, intermediate: None };
        assert_eq!(merger.next_report(&writing), None);
        let written = OwnWrites {
            in_flight: 0,
            intermediate: Some(PairVersion { primary: Some("3".into()), secondary: Some("2".into()) }),
        };
        assert_eq!(merger.next_report(&written), None, "the intermediate state of our own write");
        merger.observe(Side::Secondary(at("4", record("a", 1, 15))));
        assert_eq!(merger.next_report(&written).unwrap().unwrap().version, pair(Some("3"), Some("4")));

        // Someone else's change of one object is reported at once.
        merger.observe(Side::Secondary(at("5", record("b", 2, 15))));
        let report = merger.next_report(&written).unwrap().unwrap();
        assert_eq!(report.record.unwrap().holder_identity, UNKNOWN_LEADER);
        merger.observe(Side::Primary(None));
        merger.observe(Side::Secondary(None));
        assert_eq!(merger.next_report(&written), Some(None), "both deleted");
    }
}
