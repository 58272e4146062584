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
/// writes and the other way round:
///
/// ```
/// use tenure::LeaderElectionRecord;
/// let json = r#"{"holderIdentity":"a3e0","leaseDurationSeconds":15,"acquireTime":"2019-01-16T01:25:47Z","renewTime":"2019-01-16T07:30:31Z","leaderTransitions":0}"#;
/// let record = LeaderElectionRecord::from_json(json).unwrap();
/// assert_eq!(record.holder_identity, "a3e0");
/// assert_eq!(record.to_json(), json);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderElectionRecord {
    /// Identity of the holder; empty when nobody holds the lock (after a release).
    #[serde(default)]
    pub holder_identity: String,
    /// How long followers must wait after seeing a change before taking the lock over.
    #[serde(default)]
    pub lease_duration_seconds: i64,
    /// When the current holder acquired the lock (informational).
    #[serde(default, with = "record_time")]
    pub acquire_time: Option<DateTime<Utc>>,
    /// When the current holder last renewed (informational).
    #[serde(default, with = "record_time")]
    pub renew_time: Option<DateTime<Utc>>,
    /// How many times the lock changed hands; Tenure uses it as the fencing [`Term`](crate::Term).
    #[serde(default)]
    pub leader_transitions: i64,
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
/// Reading accepts fractional seconds and any offset, as other writers may produce them.
mod record_time {
    use super::*;

    pub fn serialize<S: Serializer>(time: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match time {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        match text {
            None => Ok(None),
            Some(t) if t.is_empty() => Ok(None),
            Some(t) => {
                DateTime::parse_from_rfc3339(&t).map(|t| Some(t.with_timezone(&Utc))).map_err(serde::de::Error::custom)
            }
        }
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
