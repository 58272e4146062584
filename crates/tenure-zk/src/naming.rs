//! Node names shared with Apache Curator's `LeaderLatch`.
//!
//! A latch candidate creates an ephemeral sequential node named
//! `<path>/_c_<guid>-latch-<sequence>`: `_c_<guid>-` is Curator's "protected mode" prefix (it lets
//! a client find its own node when the reply to its create was lost), `latch-` is LeaderLatch's
//! node name, and ZooKeeper appends a ten-digit sequence number. The leader is the node with the
//! lowest sequence; the node's data is the candidate's identity (UTF-8 bytes). Tenure uses the
//! same names and order so that Tenure candidates and Java `LeaderLatch`es on one path agree on
//! one leader.

use rand::Rng;

/// LeaderLatch's node name; the sequence number follows it.
pub const LATCH_NAME: &str = "latch-";

/// Curator's protected-mode prefix, followed by the creating client's guid and a dash.
pub const PROTECTED_PREFIX: &str = "_c_";

/// A fresh random guid in the textual form of a version-4 UUID, as Curator writes it.
pub fn new_guid() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// The path prefix to create an ephemeral sequential node with (ZooKeeper appends the sequence).
pub fn node_prefix(path: &str, guid: &str) -> String {
    format!("{path}/{PROTECTED_PREFIX}{guid}-{LATCH_NAME}")
}

/// True when `name` (a child of the election path) was created by the client with `guid`.
pub fn is_own(name: &str, guid: &str) -> bool {
    name.strip_prefix(PROTECTED_PREFIX)
        .and_then(|rest| rest.strip_prefix(guid))
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The sequence number of a latch node, `None` for a child that is not a latch node.
///
/// Curator orders children by the text after the last `latch-`; ZooKeeper pads sequences to ten
/// digits, so ordering by the number is the same order.
pub fn sequence_of(name: &str) -> Option<u64> {
    let at = name.rfind(LATCH_NAME)?;
    let digits = &name[at + LATCH_NAME.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The latch nodes among `children`, leader first.
pub fn in_election_order(children: Vec<String>) -> Vec<String> {
    let mut nodes: Vec<(u64, String)> =
        children.into_iter().filter_map(|name| sequence_of(&name).map(|seq| (seq, name))).collect();
    nodes.sort();
    nodes.into_iter().map(|(_, name)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curator_protected_names_are_recognised_and_ordered_by_sequence() {
        let children = vec![
            "_c_b1d5c1f2-0000-4000-8000-000000000002-latch-0000000012".to_owned(),
            "_c_a0000000-0000-4000-8000-000000000001-latch-0000000003".to_owned(),
            "lock-0000000001".to_owned(),
            "_c_ffffffff-0000-4000-8000-000000000003-latch-0000000007".to_owned(),
        ];
        let ordered = in_election_order(children);
        assert_eq!(ordered.len(), 3);
        assert!(ordered[0].ends_with("latch-0000000003"));
        assert!(ordered[1].ends_with("latch-0000000007"));
        assert!(ordered[2].ends_with("latch-0000000012"));
    }

    #[test]
    fn own_node_is_found_by_guid() {
        let guid = new_guid();
        assert_eq!(guid.len(), 36);
        let name = format!("{PROTECTED_PREFIX}{guid}-{LATCH_NAME}0000000005");
        assert!(is_own(&name, &guid));
        assert!(!is_own(&name, &new_guid()));
        assert_eq!(sequence_of(&name), Some(5));
        assert_eq!(node_prefix("/a/b", &guid), format!("/a/b/_c_{guid}-latch-"));
    }

    #[test]
    fn foreign_children_have_no_sequence() {
        assert_eq!(sequence_of("latch-"), None);
        assert_eq!(sequence_of("latch-12a"), None);
        assert_eq!(sequence_of("foo"), None);
    }
}
