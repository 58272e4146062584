//! Discovery documents (`/version`, `/api`, `/apis`, the resource lists): what kubectl and kube-rs
//! read to learn which resources exist, their kinds, scopes, verbs and short names.

use serde_json::{json, Value};

use crate::resources::{self, ResourceType};

/// The Kubernetes version this server claims: the API it imitates is that of 1.30.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "30",
        "gitVersion": concat!("v1.30.0-tenure.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_entry(group: &str) -> Value {
    let versions: Vec<Value> = resources::group_versions(group)
        .into_iter()
        .map(|version| json!({"groupVersion": format!("{group}/{version}"), "version": version}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or_default();
    json!({"name": group, "preferredVersion": preferred, "versions": versions})
}

/// `/apis`: every named group.
pub fn group_list() -> Value {
    let groups: Vec<Value> = resources::groups().into_iter().map(group_entry).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/GROUP`: one named group, if served.
pub fn group(group: &str) -> Option<Value> {
    resources::groups().contains(&group).then(|| {
        let mut entry = group_entry(group);
        entry["kind"] = json!("APIGroup");
        entry["apiVersion"] = json!("v1");
        entry
    })
}

fn resource_entry(resource: &ResourceType) -> Value {
    let mut verbs = vec!["create", "delete", "get", "list", "patch", "update", "watch"];
    if resource.plural != "namespaces" {
        verbs.push("deletecollection");
    }
    let mut entry = json!({
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": verbs,
    });
    if !resource.short_names.is_empty() {
        entry["shortNames"] = json!(resource.short_names);
    }
    entry
}

/// `/api/v1` or `/apis/GROUP/VERSION`: the resources of one group version, if served.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served = resources::in_group_version(group, version);
    if served.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let entries: Vec<Value> = served.into_iter().map(resource_entry).collect();
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}))
}

fn group_version_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where the document of each group version is.
///
/// Why served: kubectl (1.27+) fetches it before `apply` and `create` to learn whether the server
/// validates fields itself; without it kubectl refuses to send anything unless told `--validate=false`.
pub fn openapi_v3_index() -> Value {
    let mut paths = serde_json::Map::new();
    for resource in resources::RESOURCE_TYPES {
        let path = group_version_path(resource.group, resource.version);
        let url = format!("/openapi/v3/{path}?hash=tenure-{}", env!("CARGO_PKG_VERSION"));
        paths.entry(path).or_insert_with(|| json!({ "serverRelativeURL": url }));
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/api/v1` and `/openapi/v3/apis/GROUP/VERSION`: just enough of the OpenAPI document for
/// kubectl's query-parameter check: each object path with a PATCH operation naming its kind and the
/// `fieldValidation` parameter. Schemas are not described (the server does not validate unknown fields).
pub fn openapi_v3_group_version(path: &str) -> Option<Value> {
    let served: Vec<&ResourceType> =
        resources::RESOURCE_TYPES.iter().filter(|r| group_version_path(r.group, r.version) == path).collect();
    if served.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for resource in served {
        let collection = if resource.namespaced {
            format!("/{path}/namespaces/{{namespace}}/{}", resource.plural)
        } else {
            format!("/{path}/{}", resource.plural)
        };
        let gvk = json!({"group": resource.group, "version": resource.version, "kind": resource.kind});
        let operation = json!({
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(format!("{collection}/{{name}}"), json!({"patch": operation, "put": operation}));
        paths.insert(collection, json!({"post": operation}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.30.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_type_is_discoverable_where_kubectl_looks() {
        for resource in resources::RESOURCE_TYPES {
            let list = resource_list(resource.group, resource.version).expect("served group version");
            let names: Vec<&str> =
                list["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
            assert!(names.contains(&resource.plural), "{} missing from {names:?}", resource.plural);
            if !resource.group.is_empty() {
                assert!(group(resource.group).is_some());
                assert!(group_list()["groups"].as_array().unwrap().iter().any(|g| g["name"] == resource.group));
            }
        }
        let coordination = group("coordination.k8s.io").unwrap();
        assert_eq!(coordination["preferredVersion"]["version"], "v1");
        assert_eq!(coordination["versions"][1]["groupVersion"], "coordination.k8s.io/v1beta1");
        assert!(resource_list("nope", "v1").is_none());
        assert!(group("nope").is_none());
    }
}
