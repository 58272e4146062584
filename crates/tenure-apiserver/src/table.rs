//! Server-side printing: the `Table` kubectl asks for (`Accept: ...;as=Table`) so that
//! `kubectl get lease` shows the holder, as it does against a real cluster.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::resources::ResourceType;

/// Whether an `Accept` header asks for a `Table`.
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

/// Age as kubectl prints it: `45s`, `12m`, `3h`, `2d`.
fn age(object: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let Some(created) =
        object["metadata"]["creationTimestamp"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    else {
        return "<unknown>".into();
    };
    let seconds = (now - created.with_timezone(&chrono::Utc)).num_seconds().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A column besides Name and Age: its title, its priority (0: always shown, before Age; 1: shown
/// by `kubectl get -o wide` only, after Age, as the real server lays out wide columns) and how to
/// fill it from an object.
type Column = (&'static str, u8, fn(&Value) -> Value);

fn spec_text(object: &Value, field: &str) -> Value {
    json!(object["spec"][field].as_str().unwrap_or(""))
}

/// The columns of one type besides Name and Age.
fn extra_columns(resource: &ResourceType) -> Vec<Column> {
    match resource.kind {
        "Lease" => vec![("Holder", 0, |o| spec_text(o, "holderIdentity"))],
        // The real server's columns, plus the two times a candidate's liveness is judged by.
        "LeaseCandidate" => vec![
            ("LeaseName", 0, |o| spec_text(o, "leaseName")),
            ("BinaryVersion", 0, |o| spec_text(o, "binaryVersion")),
            ("EmulationVersion", 0, |o| spec_text(o, "emulationVersion")),
            ("RenewTime", 1, |o| spec_text(o, "renewTime")),
            ("PingTime", 1, |o| spec_text(o, "pingTime")),
        ],
        "ConfigMap" => vec![("Data", 0, |o| json!(o["data"].as_object().map_or(0, |d| d.len())))],
        "Pod" => vec![("Status", 0, |o| json!(o["status"]["phase"].as_str().unwrap_or("Unknown")))],
        "Event" => vec![
            ("Type", 0, |o| o["type"].clone()),
            ("Reason", 0, |o| o["reason"].clone()),
            ("Object", 0, |o| {
                let kind = o["involvedObject"]["kind"].as_str().unwrap_or("").to_ascii_lowercase();
                json!(format!("{kind}/{}", o["involvedObject"]["name"].as_str().unwrap_or("")))
            }),
            ("Message", 0, |o| o["message"].clone()),
        ],
        _ => Vec::new(),
    }
}

/// The objects as a `meta.k8s.io/v1` Table at list version `resource_version`.
pub fn render(resource: &ResourceType, objects: &[Arc<Value>], resource_version: &str) -> Value {
    let extra = extra_columns(resource);
    let (before_age, after_age): (Vec<&Column>, Vec<&Column>) =
        extra.iter().partition(|(_, priority, _)| *priority == 0);
    let column = |name: &str, format: &str, priority: u8| json!({"name": name, "type": "string", "format": format, "description": name, "priority": priority});
    let mut columns = vec![column("Name", "name", 0)];
    columns.extend(before_age.iter().map(|(name, priority, _)| column(name, "", *priority)));
    columns.push(column("Age", "", 0));
    columns.extend(after_age.iter().map(|(name, priority, _)| column(name, "", *priority)));
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(before_age.iter().map(|(_, _, cell)| cell(object)));
            cells.push(json!(age(object, now)));
            cells.extend(after_age.iter().map(|(_, _, cell)| cell(object)));
            let metadata = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object["metadata"],
            });
            json!({"cells": cells, "object": metadata})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_table_shows_its_holder() {
        let lease = crate::resources::find_resource_type("coordination.k8s.io", "v1", "leases").unwrap();
        let object = Arc::new(
            json!({"metadata": {"name": "x", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"holderIdentity": "pod-a"}}),
        );
        let table = render(lease, &[object], "5");
        let names: Vec<&str> =
            table["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "Holder", "Age"]);
        assert_eq!(table["rows"][0]["cells"][1], "pod-a");
        assert!(wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn a_lease_candidate_table_shows_the_real_servers_columns_and_its_times_when_wide() {
        let candidates = crate::resources::lease_candidates();
        let object = Arc::new(json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {
            "leaseName": "l", "binaryVersion": "1.1.0", "emulationVersion": "1.0.0", "renewTime": "2020-01-01T00:00:01.000000Z"}}));
        let table = render(candidates, &[object], "5");
        let columns: Vec<(&str, u64)> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["name"].as_str().unwrap(), c["priority"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Name", 0),
                ("LeaseName", 0),
                ("BinaryVersion", 0),
                ("EmulationVersion", 0),
                ("Age", 0),
                ("RenewTime", 1),
                ("PingTime", 1)
            ]
        );
        let cells = &table["rows"][0]["cells"];
        assert_eq!(
            (&cells[1], &cells[3], &cells[5], &cells[6]),
            (&json!("l"), &json!("1.0.0"), &json!("2020-01-01T00:00:01.000000Z"), &json!(""))
        );
    }
}
