//! The leader election record, byte-compatible with client-go's `LeaderElectionRecord` as
//! stored in the annotation `control-plane.alpha.kubernetes.io/leader`.
//!
//! The wall-clock times in the record are for people and for other clients; Tenure never
//! compares them with its own clock (invariant S3): expiry is counted on the local monotonic
//! clock from the moment the record was seen to change.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The annotation key client-go and leader-elector:0.5 store the record under.
pub const LEADER_ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Who holds a lock, how long they claim it, and how often it changed hands.
///
/// Serialises exactly as client-go does (field names, field order, RFC 3339 times with whole
/// seconds, `null` for a missing time), so that a client-go candidate can read what Tenure
/// writes and the other way round. Reading is liberal, because other maintained clients share
/// the annotation record and write it their own way: the Kubernetes Python client writes
/// `leaseDurationSeconds` as a string (`"4"`), times as `2026-11-23 05:10:53.688865` (no `T`, no
/// zone) and no `leaderTransitions`. Numbers may be JSON numbers or decimal strings; a missing
/// or `null` field reads as its default; the times, which Tenure never uses to decide anything
/// (invariant S3), read as `None` when no known format fits. What stays corrupt is what no
/// honest writer produces: not a JSON object, a holder that is not a string, a count that is
/// not a whole number, negative, or at its maximum, a held lock without a lease.
///
/// ```
/// use tenure::LeaderElectionRecord;
/// let json = r#"{"holderIdentity":"a3e0","leaseDurationSeconds":15,"acquireTime":"2019-01-16T01:25:47Z","renewTime":"2019-01-16T07:30:31Z","leaderTransitions":0}"#;
/// let record = LeaderElectionRecord::from_json(json).unwrap();
/// assert_eq!(record.holder_identity, "a3e0");
/// assert_eq!(record.to_json(), json);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElectionRecord {
    /// Identity of the holder; empty when nobody holds the lock (after a release).
    #[serde(default, deserialize_with = "lenient::string")]
    pub holder_identity: String,
    /// How long followers must wait after seeing a change before taking the lock over.
    #[serde(default, deserialize_with = "lenient::whole_number")]
    pub lease_duration_seconds: i64,
    /// When the current holder acquired the lock (informational).
    #[serde(default, with = "record_time")]
    pub acquire_time: Option<DateTime<Utc>>,
    /// When the current holder last renewed (informational).
    #[serde(default, with = "record_time")]
    pub renew_time: Option<DateTime<Utc>>,
    /// How many times the lock changed hands; Tenure uses it as the fencing [`Term`](crate::Term).
    #[serde(default, deserialize_with = "lenient::whole_number")]
    pub leader_transitions: i64,
    /// Coordinated leader election (Kubernetes 1.33+, a Lease's `spec.strategy`): how the API
    /// server's coordinator picks the holder, e.g. `OldestEmulationVersion`. A lease with a
    /// strategy is the coordinator's to give: candidates that are not coordinated never take it.
    /// Written only by the coordinator; omitted from JSON when unset, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// Coordinated leader election (a Lease's `spec.preferredHolder`): the candidate the
    /// coordinator wants to lead next. The holder hands over gracefully (drains, then releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_holder: Option<String>,
}

impl LeaderElectionRecord {
    /// The coordination strategy, if the lease has a non-empty one.
    pub fn coordination_strategy(&self) -> Option<&str> {
        self.strategy.as_deref().filter(|s| !s.is_empty())
    }

    /// The preferred next holder, if the coordinator named one that is not `identity`.
    pub fn preferred_other_than(&self, identity: &str) -> Option<&str> {
        self.preferred_holder.as_deref().filter(|p| !p.is_empty() && *p != identity)
    }
}

/// Why the content of a lock could not be read as a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON, or JSON of the wrong shape.
    #[error("record is not a leader election record: {0}")]
    Malformed(String),
    /// Well-formed JSON with values no honest candidate writes.
    #[error("record has an invalid value: {0}")]
    Invalid(&'static str),
}

impl LeaderElectionRecord {
    /// Parses a record and checks the values that Tenure relies on.
    pub fn from_json(text: &str) -> Result<Self, RecordError> {
        let record: LeaderElectionRecord =
            serde_json::from_str(text).map_err(|e| RecordError::Malformed(e.to_string()))?;
        if record.leader_transitions < 0 {
            return Err(RecordError::Invalid("leaderTransitions is negative"));
        }
        if record.leader_transitions == i64::MAX {
            // No next term could be written: terms would repeat (S2).
            return Err(RecordError::Invalid("leaderTransitions is at its maximum"));
        }
        if !record.holder_identity.is_empty() && record.lease_duration_seconds <= 0 {
            return Err(RecordError::Invalid("a held lock has leaseDurationSeconds <= 0"));
        }
        Ok(record)
    }

    /// The record as client-go writes it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// Times as Kubernetes' `metav1.Time`: RFC 3339 in UTC with whole seconds, `null` when unset.
/// Reading accepts fractional seconds, any offset, and the shapes other clients write (see
/// [`lenient::time`]).
mod record_time {
    use super::*;

    pub fn serialize<S: Serializer>(time: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match time {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(value.as_str().and_then(lenient::time))
    }
}

/// Readers for the shapes other clients give the record's fields.
mod lenient {
    use chrono::{DateTime, NaiveDateTime, Utc};
    use serde::de::Error;
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    /// A string, with `null` as the empty string (nobody holds the lock).
    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(String::new()),
            Value::String(text) => Ok(text),
            other => Err(D::Error::custom(format!("expected a string, found {other}"))),
        }
    }

    /// A whole number written as a JSON number (`4`, `4.0`) or a decimal string (`"4"`), with
    /// `null` as 0. A fraction, a string that is no number, or a number beyond `i64` is an error.
    pub fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let value = Value::deserialize(d)?;
        let number = match &value {
            Value::Null => return Ok(0),
            Value::Number(n) => n.as_i64().or_else(|| n.as_f64().and_then(whole)),
            Value::String(text) => {
                let text = text.trim();
                text.parse::<i64>().ok().or_else(|| text.parse::<f64>().ok().and_then(whole))
            }
            _ => None,
        };
        number.ok_or_else(|| D::Error::custom(format!("expected a whole number, found {value}")))
    }

    fn whole(x: f64) -> Option<i64> {
        // 2^63 is exact in f64: [-2^63, 2^63) is exactly the range of i64.
        const TWO_TO_THE_63: f64 = 9_223_372_036_854_775_808.0;
        (x.fract() == 0.0 && (-TWO_TO_THE_63..TWO_TO_THE_63).contains(&x)).then_some(x as i64)
    }

    /// A time in any shape a maintained client writes: RFC 3339 (client-go, with or without
    /// fractions), or a date and time without a zone, separated by `T` or a space (Python's
    /// `str(datetime)` and `isoformat()`), read as UTC. `None` when nothing fits: the times are
    /// informational, so an unknown shape costs a display, not the record.
    pub fn time(text: &str) -> Option<DateTime<Utc>> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        if let Ok(t) = DateTime::parse_from_rfc3339(text) {
            return Some(t.with_timezone(&Utc));
        }
        ["%Y-%m-%d %H:%M:%S%.f%:z", "%Y-%m-%dT%H:%M:%S%.f%:z", "%Y-%m-%d %H:%M:%S%.f%z"]
            .iter()
            .find_map(|format| DateTime::parse_from_str(text, format).ok())
            .map(|t| t.with_timezone(&Utc))
            .or_else(|| {
                ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"]
                    .iter()
                    .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
                    .map(|t| t.and_utc())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_record_serialises_like_client_go() {
        let t = DateTime::parse_from_rfc3339("2024-05-01T10:00:00.123456Z").unwrap().with_timezone(&Utc);
        let record = LeaderElectionRecord {
            holder_identity: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(t),
            renew_time: Some(t),
            leader_transitions: 3,
            ..Default::default()
        };
        assert_eq!(
            record.to_json(),
            r#"{"holderIdentity":"","leaseDurationSeconds":1,"acquireTime":"2024-05-01T10:00:00Z","renewTime":"2024-05-01T10:00:00Z","leaderTransitions":3}"#
        );
    }

    #[test]
    fn reads_null_times_fractions_and_unknown_fields() {
        let r = LeaderElectionRecord::from_json(
            r#"{"holderIdentity":"x","leaseDurationSeconds":15,"acquireTime":null,"renewTime":"2024-05-01T10:00:00.5+02:00","leaderTransitions":2,"preferredHolder":""}"#,
        )
        .unwrap();
        assert_eq!(r.acquire_time, None);
        assert_eq!(r.renew_time.unwrap().to_rfc3339(), "2024-05-01T08:00:00.500+00:00");
    }

    #[test]
    fn reads_the_record_the_kubernetes_python_client_writes() {
        let r = LeaderElectionRecord::from_json(
            r#"{"holderIdentity": "py-1", "leaseDurationSeconds": "4", "acquireTime": "2026-11-23 05:10:53.688865", "renewTime": "2026-11-23 05:10:55.1"}"#,
        )
        .unwrap();
        assert_eq!(r.holder_identity, "py-1");
        assert_eq!(r.lease_duration_seconds, 4, "the record's own lease, not ours");
        assert_eq!(r.leader_transitions, 0);
        assert_eq!(r.acquire_time.unwrap().to_rfc3339(), "2026-11-23T05:10:53.688865+00:00");
        assert_eq!(r.renew_time.unwrap().to_rfc3339(), "2026-11-23T05:10:55.100+00:00");
    }

    #[test]
    fn reads_numbers_as_strings_floats_and_nulls_and_times_in_other_shapes() {
        let r = LeaderElectionRecord::from_json(
            r#"{"holderIdentity":null,"leaseDurationSeconds":15.0,"acquireTime":"2026-11-23T05:10:53","renewTime":"yesterday","leaderTransitions":" 7 "}"#,
        )
        .unwrap();
        assert_eq!((r.holder_identity.as_str(), r.lease_duration_seconds, r.leader_transitions), ("", 15, 7));
        assert_eq!(r.acquire_time.unwrap().to_rfc3339(), "2026-11-23T05:10:53+00:00");
        assert_eq!(r.renew_time, None, "an unknown time shape costs the display, not the record");
        let zoned = LeaderElectionRecord::from_json(
            r#"{"holderIdentity":"x","leaseDurationSeconds":"9","renewTime":"2026-11-23 05:10:53+02:00"}"#,
        )
        .unwrap();
        assert_eq!(zoned.renew_time.unwrap().to_rfc3339(), "2026-11-23T03:10:53+00:00");
    }

    #[test]
    fn what_no_honest_writer_produces_stays_corrupt() {
        for text in [
            r#"{"holderIdentity":"x","leaseDurationSeconds":"four"}"#,
            r#"{"holderIdentity":"x","leaseDurationSeconds":4.5}"#,
            r#"{"holderIdentity":"x","leaseDurationSeconds":1e300}"#,
            r#"{"holderIdentity":"x","leaseDurationSeconds":[4]}"#,
            r#"{"holderIdentity":7,"leaseDurationSeconds":4}"#,
            r#"{"holderIdentity":"x","leaseDurationSeconds":4,"leaderTransitions":"1.5"}"#,
        ] {
            assert!(matches!(LeaderElectionRecord::from_json(text), Err(RecordError::Malformed(_))), "{text}");
        }
        assert!(matches!(
            LeaderElectionRecord::from_json(r#"{"holderIdentity":"x","leaseDurationSeconds":"-4"}"#),
            Err(RecordError::Invalid(_))
        ));
    }

    #[test]
    fn rejects_garbage_and_dishonest_values() {
        assert!(matches!(LeaderElectionRecord::from_json("not json"), Err(RecordError::Malformed(_))));
        assert!(matches!(LeaderElectionRecord::from_json("[1,2]"), Err(RecordError::Malformed(_))));
        assert!(matches!(
            LeaderElectionRecord::from_json(r#"{"holderIdentity":"x","leaseDurationSeconds":0}"#),
            Err(RecordError::Invalid(_))
        ));
        assert!(matches!(
            LeaderElectionRecord::from_json(r#"{"holderIdentity":"","leaderTransitions":-1}"#),
            Err(RecordError::Invalid(_))
        ));
        assert!(matches!(
            LeaderElectionRecord::from_json(r#"{"holderIdentity":"","leaderTransitions":9223372036854775807}"#),
            Err(RecordError::Invalid(_))
        ));
    }
}
