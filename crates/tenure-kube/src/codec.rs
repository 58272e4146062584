//! How a leader election record is stored in each kind of object, as pure functions: the Lease's
//! own fields, and the annotation of Endpoints and ConfigMaps.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tenure::{LeaderElectionRecord, LockError, RecordError, LEADER_ANNOTATION};

/// A kind of object that can hold a record: how to read it, write it into an existing object
/// (keeping everything else), and make a new object holding it.
pub trait RecordObject:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The plural resource name, for descriptions and errors.
    const PLURAL: &'static str;

    /// The record the object holds. An object that holds none (a fresh Endpoints object of a
    /// Service, a Lease without holder) reads as a free lock, as client-go reads it.
    fn record(&self) -> Result<LeaderElectionRecord, RecordError>;

    /// Writes `record` into the object, leaving its other content alone.
    fn set_record(&mut self, record: &LeaderElectionRecord) -> Result<(), LockError>;

    /// A new object named `name` in `namespace` holding `record`.
    fn with_record(namespace: &str, name: &str, record: &LeaderElectionRecord) -> Result<Self, LockError> {
        let metadata = ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..Default::default() };
        let mut object = Self::empty(metadata);
        object.set_record(record)?;
        Ok(object)
    }

    /// An object with this metadata and nothing else.
    fn empty(metadata: ObjectMeta) -> Self;

    /// Marks the object as written at `now`, so that every write changes it. Nothing to do where
    /// the record itself always changes (a Lease's `renewTime` has microseconds).
    fn stamp_write(&mut self, _now: DateTime<Utc>) {}
}

/// The annotation Tenure sets beside the record on every write of an Endpoints object or a
/// ConfigMap: the time of the write, with microseconds.
///
/// Why: the record's times have whole seconds (client-go's format), so two renews within one
/// second write identical objects, which the API server applies as a no-op: same
/// `resourceVersion`, no watch event. Followers would not see such a renew, yet the leader would
/// count it, and followers' lease countdowns and the leader's self-fencing deadline would no
/// longer line up. client-go readers ignore other annotations.
pub const WRITE_TIME_ANNOTATION: &str = "tenure/written-at";

/// The checks [`LeaderElectionRecord::from_json`] makes, for records that do not come from JSON
/// (the Lease's fields): values no honest candidate writes are reported, not trusted.
pub fn validate(record: LeaderElectionRecord) -> Result<LeaderElectionRecord, RecordError> {
    if record.leader_transitions < 0 {
        return Err(RecordError::Invalid("leaseTransitions is negative"));
    }
    if !record.holder_identity.is_empty() && record.lease_duration_seconds <= 0 {
        return Err(RecordError::Invalid("a held lock has leaseDurationSeconds <= 0"));
    }
    Ok(record)
}

/// The record a Lease spec holds; a Lease without spec or holder is free.
pub fn record_from_lease_spec(spec: Option<&LeaseSpec>) -> Result<LeaderElectionRecord, RecordError> {
    let Some(spec) = spec else { return Ok(LeaderElectionRecord::default()) };
    validate(LeaderElectionRecord {
        holder_identity: spec.holder_identity.clone().unwrap_or_default(),
        lease_duration_seconds: spec.lease_duration_seconds.map_or(0, i64::from),
        acquire_time: spec.acquire_time.as_ref().map(|t| from_kube_time(t.0)),
        renew_time: spec.renew_time.as_ref().map(|t| from_kube_time(t.0)),
        leader_transitions: spec.lease_transitions.map_or(0, i64::from),
        strategy: spec.strategy.clone(),
        preferred_holder: spec.preferred_holder.clone(),
    })
}

/// The Lease spec for a record, field by field as client-go writes it (times as MicroTime, which
/// keeps microseconds; the holder written even when empty, after a release).
pub fn lease_spec_from_record(record: &LeaderElectionRecord) -> Result<LeaseSpec, LockError> {
    let too_large = |field: &str| LockError::Rejected(format!("{field} does not fit a Lease's 32-bit field"));
    Ok(LeaseSpec {
        holder_identity: Some(record.holder_identity.clone()),
        lease_duration_seconds: Some(
            i32::try_from(record.lease_duration_seconds).map_err(|_| too_large("leaseDurationSeconds"))?,
        ),
        acquire_time: record.acquire_time.map(|t| to_kube_time(t).map(MicroTime)).transpose()?,
        renew_time: record.renew_time.map(|t| to_kube_time(t).map(MicroTime)).transpose()?,
        lease_transitions: Some(i32::try_from(record.leader_transitions).map_err(|_| too_large("leaderTransitions"))?),
        strategy: record.strategy.clone(),
        preferred_holder: record.preferred_holder.clone(),
    })
}

/// A record's time as k8s-openapi holds it (jiff; the record keeps chrono, which `tenure` uses
/// without Kubernetes). Times a Kubernetes object cannot hold (outside the years -9999 to 9999)
/// are refused rather than written wrong.
pub(crate) fn to_kube_time(time: DateTime<Utc>) -> Result<k8s_openapi::jiff::Timestamp, LockError> {
    // `timestamp_subsec_nanos` is below 2 * 10^9 (a leap second), which fits an i32.
    let nanos = i32::try_from(time.timestamp_subsec_nanos()).unwrap_or(999_999_999);
    k8s_openapi::jiff::Timestamp::new(time.timestamp(), nanos.min(999_999_999))
        .map_err(|error| LockError::Rejected(format!("{time} cannot be written to Kubernetes: {error}")))
}

/// A Kubernetes time as the record holds it; every jiff timestamp is within chrono's range.
pub(crate) fn from_kube_time(time: k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    // jiff counts the fraction of a time before 1970 below zero, chrono above.
    let (seconds, nanos) = match time.subsec_nanosecond() {
        nanos if nanos < 0 => (time.as_second() - 1, nanos + 1_000_000_000),
        nanos => (time.as_second(), nanos),
    };
    DateTime::from_timestamp(seconds, nanos.unsigned_abs()).unwrap_or_default()
}

/// The record in the leader annotation; no annotation is a free lock (client-go reads it so).
pub fn record_from_annotations(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<LeaderElectionRecord, RecordError> {
    match annotations.and_then(|a| a.get(LEADER_ANNOTATION)) {
        Some(text) => LeaderElectionRecord::from_json(text),
        None => Ok(LeaderElectionRecord::default()),
    }
}

/// Writes the record into the leader annotation, keeping every other annotation.
pub fn set_annotation(metadata: &mut ObjectMeta, record: &LeaderElectionRecord) {
    metadata.annotations.get_or_insert_with(BTreeMap::new).insert(LEADER_ANNOTATION.to_owned(), record.to_json());
}

impl RecordObject for Lease {
    const PLURAL: &'static str = "leases";

    fn record(&self) -> Result<LeaderElectionRecord, RecordError> {
        record_from_lease_spec(self.spec.as_ref())
    }

    fn set_record(&mut self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        // The record's fields are replaced; the metadata (labels, annotations, owners) stays, and
        // so do the coordinator's `strategy` and `preferredHolder` when the record sets none (a
        // candidate renews or releases a coordinated lease without touching them).
        let mut spec = lease_spec_from_record(record)?;
        if let Some(old) = self.spec.take() {
            spec.strategy = spec.strategy.or(old.strategy);
            spec.preferred_holder = spec.preferred_holder.or(old.preferred_holder);
        }
        self.spec = Some(spec);
        Ok(())
    }

    fn empty(metadata: ObjectMeta) -> Self {
        Lease { metadata, spec: None }
    }
}

/// Endpoints objects and ConfigMaps hold the record alike: in the leader annotation, the rest of
/// the object untouched.
macro_rules! record_in_annotation {
    ($kind:ty, $plural:literal) => {
        impl RecordObject for $kind {
            const PLURAL: &'static str = $plural;

            fn record(&self) -> Result<LeaderElectionRecord, RecordError> {
                record_from_annotations(self.metadata.annotations.as_ref())
            }

            fn set_record(&mut self, record: &LeaderElectionRecord) -> Result<(), LockError> {
                set_annotation(&mut self.metadata, record);
                Ok(())
            }

            fn empty(metadata: ObjectMeta) -> Self {
                Self { metadata, ..Self::default() }
            }

            fn stamp_write(&mut self, now: DateTime<Utc>) {
                self.metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(WRITE_TIME_ANNOTATION.to_owned(), now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
            }
        }
    };
}

record_in_annotation!(Endpoints, "endpoints");
record_in_annotation!(ConfigMap, "configmaps");

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset};

    fn time(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc)
    }

    fn record(holder: &str, transitions: i64) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: holder.into(),
            lease_duration_seconds: 15,
            acquire_time: Some(time("2024-05-01T10:00:00.123456Z")),
            renew_time: Some(time("2024-05-01T10:00:30.654321Z")),
            leader_transitions: transitions,
            ..Default::default()
        }
    }

    #[test]
    fn lease_keeps_microseconds_and_maps_transitions() {
        let lease = Lease::with_record("ns", "lock", &record("a", 3)).unwrap();
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(json["metadata"]["name"], "lock");
        assert_eq!(json["metadata"]["namespace"], "ns");
        assert_eq!(json["spec"]["holderIdentity"], "a");
        assert_eq!(json["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(json["spec"]["acquireTime"], "2024-05-01T10:00:00.123456Z");
        assert_eq!(json["spec"]["renewTime"], "2024-05-01T10:00:30.654321Z");
        assert_eq!(json["spec"]["leaseTransitions"], 3);
        assert_eq!(lease.record().unwrap(), record("a", 3));
    }

    #[test]
    fn lease_written_by_client_go_reads_as_its_record() {
        let lease: Lease = serde_json::from_str(
            r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"x","namespace":"ns","resourceVersion":"42"},
                "spec":{"holderIdentity":"pod-1_1234","leaseDurationSeconds":15,"acquireTime":"2024-05-01T10:00:00.000001Z",
                        "renewTime":"2024-05-01T10:00:02.500000Z","leaseTransitions":7}}"#,
        )
        .unwrap();
        let r = lease.record().unwrap();
        assert_eq!(r.holder_identity, "pod-1_1234");
        assert_eq!(r.leader_transitions, 7);
        assert_eq!(r.acquire_time.unwrap().timestamp_subsec_micros(), 1);
        assert_eq!(r.renew_time.unwrap().timestamp_subsec_micros(), 500_000);
    }

    #[test]
    fn lease_without_spec_or_holder_is_free_and_dishonest_lease_is_invalid() {
        assert_eq!(Lease::empty(ObjectMeta::default()).record().unwrap().holder_identity, "");
        let spec = LeaseSpec { lease_transitions: Some(2), ..LeaseSpec::default() };
        let r = record_from_lease_spec(Some(&spec)).unwrap();
        assert_eq!((r.holder_identity.as_str(), r.leader_transitions), ("", 2));
        let held_forever =
            LeaseSpec { holder_identity: Some("x".into()), lease_duration_seconds: Some(0), ..LeaseSpec::default() };
        assert!(matches!(record_from_lease_spec(Some(&held_forever)), Err(RecordError::Invalid(_))));
        let negative = LeaseSpec { lease_transitions: Some(-1), ..LeaseSpec::default() };
        assert!(matches!(record_from_lease_spec(Some(&negative)), Err(RecordError::Invalid(_))));
    }

    #[test]
    fn lease_rejects_records_that_do_not_fit() {
        let mut r = record("a", 1);
        r.leader_transitions = i64::from(i32::MAX) + 1;
        assert!(matches!(lease_spec_from_record(&r), Err(LockError::Rejected(_))));
    }

    #[test]
    fn lease_update_keeps_fields_the_record_does_not_know() {
        let mut lease = Lease::with_record("ns", "lock", &record("a", 1)).unwrap();
        lease.metadata.labels = Some([("app".to_owned(), "x".to_owned())].into());
        lease.set_record(&record("b", 2)).unwrap();
        assert_eq!(lease.spec.as_ref().unwrap().holder_identity.as_deref(), Some("b"));
        assert!(lease.metadata.labels.is_some());
    }

    #[test]
    fn annotation_is_byte_compatible_with_client_go() {
        let seed = r#"{"holderIdentity":"a3e0b5e2-e869-488d-9c14-49a60f3878df_a69decf6-192d-11e9-8a88-e6202bae2e50","leaseDurationSeconds":15,"acquireTime":"2019-01-16T01:25:47Z","renewTime":"2019-01-16T07:30:31Z","leaderTransitions":0}"#;
        let ep: Endpoints = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kube-controller-manager", "namespace": "kube-system",
                         "annotations": {LEADER_ANNOTATION: seed}}
        }))
        .unwrap();
        let r = ep.record().unwrap();
        assert_eq!(r.holder_identity, "a3e0b5e2-e869-488d-9c14-49a60f3878df_a69decf6-192d-11e9-8a88-e6202bae2e50");
        let written = Endpoints::with_record("kube-system", "kube-controller-manager", &r).unwrap();
        assert_eq!(written.metadata.annotations.unwrap()[LEADER_ANNOTATION], seed);
    }

    #[test]
    fn annotation_update_keeps_other_annotations_and_subsets() {
        let mut ep = Endpoints {
            metadata: ObjectMeta {
                name: Some("svc".into()),
                annotations: Some([("other".to_owned(), "kept".to_owned())].into()),
                ..ObjectMeta::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(vec![EndpointAddress { ip: "10.0.0.1".into(), ..EndpointAddress::default() }]),
                ..EndpointSubset::default()
            }]),
        };
        assert_eq!(ep.record().unwrap().holder_identity, "", "no annotation reads as a free lock");
        ep.set_record(&record("a", 1)).unwrap();
        let annotations = ep.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["other"], "kept");
        assert_eq!(LeaderElectionRecord::from_json(&annotations[LEADER_ANNOTATION]).unwrap().holder_identity, "a");
        assert_eq!(ep.subsets.as_ref().unwrap().len(), 1);

        let mut cm = ConfigMap { data: Some([("k".to_owned(), "v".to_owned())].into()), ..ConfigMap::default() };
        cm.set_record(&record("b", 2)).unwrap();
        assert_eq!(cm.record().unwrap().holder_identity, "b");
        assert_eq!(cm.data.unwrap()["k"], "v");
    }

    #[test]
    fn garbage_annotation_is_a_malformed_record() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                annotations: Some([(LEADER_ANNOTATION.to_owned(), "hijacked!".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        assert!(matches!(cm.record(), Err(RecordError::Malformed(_))));
    }

    #[test]
    fn every_annotation_write_changes_the_object_even_within_one_second() {
        let mut ep = Endpoints::with_record("ns", "x", &record("a", 1)).unwrap();
        ep.stamp_write(time("2024-05-01T10:00:00.100000Z"));
        let first = ep.clone();
        ep.set_record(&record("a", 1)).unwrap();
        ep.stamp_write(time("2024-05-01T10:00:00.300000Z"));
        assert_ne!(ep, first, "a renew within the same second is still a change");
        assert_eq!(ep.metadata.annotations.as_ref().unwrap()[WRITE_TIME_ANNOTATION], "2024-05-01T10:00:00.300000Z");
        assert_eq!(
            ep.metadata.annotations.unwrap()[LEADER_ANNOTATION],
            first.metadata.annotations.unwrap()[LEADER_ANNOTATION]
        );
        let mut lease = Lease::with_record("ns", "x", &record("a", 1)).unwrap();
        let before = lease.clone();
        lease.stamp_write(time("2024-05-01T10:00:00.300000Z"));
        assert_eq!(lease, before, "a Lease's renewTime already changes");
    }
}
