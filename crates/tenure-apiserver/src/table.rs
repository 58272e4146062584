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

/// A column between Name and Age: its title and how to fill it from an object.
type Column = (&'static str, fn(&Value) -> Value);

/// The columns of one type between Name and Age.
fn extra_columns(resource: &ResourceType) -> Vec<Column> {
    match resource.kind {
        "Lease" => vec![("Holder", |o| json!(o["spec"]["holderIdentity"].as_str().unwrap_or("")))],
        "ConfigMap" => vec![("Data", |o| json!(o["data"].as_object().map_or(0, |d| d.len())))],
        "Pod" => vec![("Status", |o| json!(o["status"]["phase"].as_str().unwrap_or("Unknown")))],
        "Event" => vec![
            ("Type", |o| o["type"].clone()),
            ("Reason", |o| o["reason"].clone()),
            ("Object", |o| {
                let kind = o["involvedObject"]["kind"].as_str().unwrap_or("").to_ascii_lowercase();
                json!(format!("{kind}/{}", o["involvedObject"]["name"].as_str().unwrap_or("")))
            }),
            ("Message", |o| o["message"].clone()),
        ],
        _ => Vec::new(),
    }
}

/// The objects as a `meta.k8s.io/v1` Table at list version `resource_version`.
pub fn render(resource: &ResourceType, objects: &[Arc<Value>], resource_version: &str) -> Value {
    let extra = extra_columns(resource);
    let column = |name: &str, format: &str| json!({"name": name, "type": "string", "format": format, "description": name, "priority": 0});
    let mut columns = vec![column("Name", "name")];
    columns.extend(extra.iter().map(|(name, _)| column(name, "")));
    columns.push(column("Age", ""));
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(extra.iter().map(|(_, cell)| cell(object)));
            cells.push(json!(age(object, now)));
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
}
