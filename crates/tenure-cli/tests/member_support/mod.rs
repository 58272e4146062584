//! What the `tenure member` tests ask a sidecar over HTTP, as an application would: its
//! partitions, what it owns, releases of what drains, and the single-owner check across members.
#![allow(dead_code)]

use std::collections::BTreeMap;

use crate::common::{get, post};

/// A member's partitions by state (`owned`, `draining`, `lost`) with their terms; `None`
/// while it does not answer.
pub fn partitions(address: &str) -> Option<BTreeMap<u32, (String, u64)>> {
    let (code, body) = get(address, "/assignment")?;
    assert_eq!(code, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).ok()?;
    let list = report["partitions"].as_array()?;
    list.iter()
        .map(|p| {
            let state = p["state"].as_str()?.to_owned();
            Some((u32::try_from(p["partition"].as_u64()?).ok()?, (state, p["term"].as_u64()?)))
        })
        .collect()
}

/// The partitions a member owns now.
pub fn owned(address: &str) -> Vec<u32> {
    partitions(address).unwrap_or_default().into_iter().filter(|(_, (s, _))| s == "owned").map(|(p, _)| p).collect()
}

/// What the application does: releases every partition the sidecar shows draining (one that
/// stopped draining meanwhile answers 409; a member that exited meanwhile does not answer).
pub fn release_draining(address: &str) {
    for (partition, (state, term)) in partitions(address).unwrap_or_default() {
        if state == "draining" {
            if let Some((code, body)) = post(address, &format!("/release?partition={partition}&term={term}")) {
                assert!(code == 200 || code == 409, "{code} {body}");
            }
        }
    }
}

/// Fails if a partition is owned by two of the members (as each reports it).
pub fn assert_single_owners(addresses: &[&str]) {
    let mut seen = BTreeMap::new();
    for address in addresses {
        for partition in owned(address) {
            if let Some(other) = seen.insert(partition, *address) {
                panic!("partition {partition} owned by {other} and {address}");
            }
        }
    }
}

/// A member's answer to `/owns?key=KEY`.
pub fn owns(address: &str, key: &str) -> serde_json::Value {
    let (code, body) = get(address, &format!("/owns?key={key}")).expect("/owns answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("/owns answers JSON")
}
