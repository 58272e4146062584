//! Which endpoint a request path names, parsed the way the real server lays its paths out:
//! `/api/v1/...` for the core group, `/apis/GROUP/VERSION/...` for the others, namespaced objects
//! under `namespaces/NS/`.

use crate::resources::{self, ResourceType};

/// What a request path addresses.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// `/version`.
    Version,
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// `/api`.
    CoreVersions,
    /// `/openapi/v3`.
    OpenApiIndex,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION`.
    OpenApiGroupVersion(String),
    /// `/apis`.
    GroupList,
    /// `/apis/GROUP`.
    Group(String),
    /// `/api/v1`, `/apis/GROUP/VERSION`.
    ResourceList {
        /// API group (empty for core).
        group: String,
        /// API version.
        version: String,
    },
    /// A collection or one object of a served type.
    Resource(ResourcePath),
    /// Nothing served here.
    Unknown,
}

/// A path to a collection or an object of a served type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourcePath {
    /// The type.
    pub resource: &'static ResourceType,
    /// The namespace in the path; `None` for cluster-scoped types and for lists across namespaces.
    pub namespace: Option<String>,
    /// The object's name; `None` for the collection.
    pub name: Option<String>,
    /// A subresource (`status`), served as the object itself.
    pub subresource: Option<String>,
}

/// Parses a request path (without query).
pub fn parse(path: &str) -> Route {
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["openapi", "v3"] => Route::OpenApiIndex,
        ["openapi", "v3", rest @ ..] => Route::OpenApiGroupVersion(rest.join("/")),
        ["apis"] => Route::GroupList,
        ["apis", group] => Route::Group(group.to_string()),
        ["api", version, rest @ ..] => resource_route("", version, rest),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let found = |plural: &str| resources::find_resource_type(group, version, plural);
    let path = |resource, namespace: Option<&str>, name: Option<&str>, subresource: Option<&str>| {
        Route::Resource(ResourcePath {
            resource,
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        })
    };
    match rest {
        [] => Route::ResourceList { group: group.to_string(), version: version.to_string() },
        // A namespaced collection or object: namespaces/NS/PLURAL[/NAME[/SUB]].
        ["namespaces", namespace, plural, tail @ ..] if found(plural).is_some_and(|r| r.namespaced) => {
            let resource = found(plural).unwrap_or_else(resources::namespaces);
            match tail {
                [] => path(resource, Some(namespace), None, None),
                [name] => path(resource, Some(namespace), Some(name), None),
                [name, sub @ "status"] => path(resource, Some(namespace), Some(name), Some(sub)),
                _ => Route::Unknown,
            }
        }
        // A cluster-scoped collection or object, or a collection across all namespaces.
        [plural, tail @ ..] => match (found(plural), tail) {
            (Some(resource), []) => path(resource, None, None, None),
            (Some(resource), [name]) if !resource.namespaced => path(resource, None, Some(name), None),
            (Some(resource), [name, sub @ ("status" | "finalize")]) if !resource.namespaced => {
                path(resource, None, Some(name), Some(sub))
            }
            _ => Route::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(path: &str) -> (&'static str, Option<String>, Option<String>, Option<String>) {
        match parse(path) {
            Route::Resource(p) => (p.resource.plural, p.namespace, p.name, p.subresource),
            other => panic!("{path} parsed as {other:?}"),
        }
    }

    #[test]
    fn paths_as_the_real_server_lays_them_out() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            resource("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"),
            ("leases", s("kube-system"), s("x"), None)
        );
        assert_eq!(resource("/api/v1/namespaces/default/endpoints"), ("endpoints", s("default"), None, None));
        assert_eq!(resource("/api/v1/namespaces/default/pods/p/status"), ("pods", s("default"), s("p"), s("status")));
        assert_eq!(resource("/api/v1/namespaces/default"), ("namespaces", None, s("default"), None));
        assert_eq!(resource("/api/v1/namespaces"), ("namespaces", None, None, None));
        assert_eq!(resource("/api/v1/configmaps"), ("configmaps", None, None, None));
        assert_eq!(parse("/api/v1/configmaps/x"), Route::Unknown);
        assert_eq!(parse("/apis/coordination.k8s.io/v1/leases/x"), Route::Unknown);
        assert_eq!(parse("/api/v1/namespaces/default/widgets"), Route::Unknown);
        assert_eq!(parse("/api/v1"), Route::ResourceList { group: String::new(), version: "v1".into() });
        assert_eq!(parse("/apis/apps"), Route::Group("apps".into()));
        assert_eq!(parse("/version"), Route::Version);
        assert_eq!(parse("/nope"), Route::Unknown);
    }
}
