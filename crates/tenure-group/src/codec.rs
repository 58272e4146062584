//! How every store keeps a record: one JSON document per record, the same on every backend
//! (`etcdctl get`, `zkCli.sh get` and `kubectl get` show the same documents).
//!
//! Why in the core crate: every backend encodes, decodes and checks records alike (a member record
//! found under another identity's key is ignored, a table that does not parse stops claims), and
//! both a snapshot read and a pushed change decode them, so the rules live once.

use crate::record::{MemberRecord, PartitionTable};
use crate::store::{Key, StoreError, Stored, Value, Version};

/// The document stored for `value` at `key`.
pub fn encode(key: &Key, value: &Value) -> Result<Vec<u8>, StoreError> {
    match (key, value) {
        (Key::Table, Value::Table(table)) => serde_json::to_vec(table),
        (Key::Member(_), Value::Member(record)) => serde_json::to_vec(record),
        _ => return Err(StoreError::Rejected(format!("{key}: wrong kind of record"))),
    }
    .map_err(|error| StoreError::Rejected(format!("{key}: cannot encode: {error}")))
}

/// The partition table stored at `location` (named in the error): a table that does not parse is
/// [`StoreError::Rejected`], so that nobody claims anything until an operator repairs it.
pub fn decode_table(location: &str, data: &[u8], version: Version) -> Result<Stored<PartitionTable>, StoreError> {
    serde_json::from_slice::<PartitionTable>(data)
        .map(|value| Stored { version, value })
        .map_err(|error| StoreError::Rejected(format!("corrupt partition table at {location}: {error}")))
}

/// The member record stored at `location`, if it parses and `belongs` to the place it was found
/// at (its identity names that key); otherwise `None`, with a warning.
pub fn decode_member(
    location: &str,
    data: &[u8],
    version: Version,
    belongs: impl Fn(&MemberRecord) -> bool,
) -> Option<Stored<MemberRecord>> {
    match serde_json::from_slice::<MemberRecord>(data) {
        Ok(record) if belongs(&record) => Some(Stored { version, value: record }),
        Ok(record) => {
            tracing::warn!(%location, identity = %record.identity, "member record under another identity's key; ignored");
            None
        }
        Err(error) => {
            tracing::warn!(%location, %error, "member record does not parse; ignored");
            None
        }
    }
}

/// The record stored at `key` (at `location`) as a pushed change: `Ok(None)` for a member
/// record that is ignored (see [`decode_member`]).
pub fn decode(key: &Key, location: &str, data: &[u8], version: Version) -> Result<Option<Stored<Value>>, StoreError> {
    match key {
        Key::Table => {
            decode_table(location, data, version).map(|t| Some(Stored { version, value: Value::Table(t.value) }))
        }
        Key::Member(identity) => Ok(decode_member(location, data, version, |r| r.identity == *identity)
            .map(|m| Stored { version, value: Value::Member(m.value) })),
    }
}

/// The hexadecimal form of an identity, for stores whose names cannot hold every byte (a `/` in a
/// ZooKeeper node name, upper case in a Kubernetes object name).
pub fn hex(identity: &str) -> String {
    identity.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The identity whose [`hex`] form is `name`, if it is one.
pub fn unhex(name: &str) -> Option<String> {
    if !name.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..name.len()).step_by(2).map(|i| name.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_survives_hex_and_back_and_junk_is_refused() {
        for identity in ["a", "ns/pod-0", "é"] {
            assert_eq!(unhex(&hex(identity)).as_deref(), Some(identity));
        }
        assert_eq!(unhex("6"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_member_record_under_another_key_is_ignored_and_a_bad_table_is_rejected() {
        let record = MemberRecord {
            identity: "a".into(),
            incarnation: 1,
            epoch: 1,
            state: crate::record::MemberState::Alive,
            lease_millis: 1000,
            weight: 1,
            partition_count: 4,
            renewals: 0,
            capabilities: None,
        };
        let data = encode(&Key::Member("a".into()), &Value::Member(record)).unwrap();
        assert!(decode(&Key::Member("a".into()), "here", &data, Version(1)).unwrap().is_some());
        assert!(decode(&Key::Member("b".into()), "here", &data, Version(1)).unwrap().is_none());
        assert!(matches!(decode(&Key::Table, "here", b"{", Version(1)), Err(StoreError::Rejected(_))));
    }
}
