//! The fixed set of resource types this server serves, with the facts about each that paths,
//! discovery, validation and error messages need.

/// One served resource type: everything the server needs to route, validate and describe it.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core (`/api/v1`) group.
    pub group: &'static str,
    /// API version inside the group.
    pub version: &'static str,
    /// Lower-case plural used in paths (`leases`).
    pub plural: &'static str,
    /// Lower-case singular, as discovery reports it.
    pub singular: &'static str,
    /// The object kind (`Lease`); the list kind is this with `List` appended.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names (`ep`, `cm`...).
    pub short_names: &'static [&'static str],
    /// Whether a PUT to an absent object creates it, as the real registry allows for some types.
    pub create_on_update: bool,
    /// Whether names must be DNS labels (no dots) rather than DNS subdomains.
    pub name_is_dns_label: bool,
}

impl ResourceType {
    /// `apiVersion` of objects of this type (`v1`, `coordination.k8s.io/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as the real server names a resource in error messages (`leases.coordination.k8s.io`).
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Kind.group` as the real server names a kind in validation messages (`Lease.coordination.k8s.io`).
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

const CORE_V1: (&str, &str) = ("", "v1");

/// Every resource type served. Leader election and controllers need the first seven; service
/// accounts, deployments and RBAC roles are served (stored, not enforced) so that the manifests in
/// `deploy/` can be applied with kubectl.
pub static RESOURCE_TYPES: &[ResourceType] = &[
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        create_on_update: false,
        name_is_dns_label: false,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        short_names: &["ep"],
        create_on_update: true,
        name_is_dns_label: false,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        create_on_update: true,
        name_is_dns_label: false,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        create_on_update: false,
        name_is_dns_label: true,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        create_on_update: false,
        name_is_dns_label: false,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        create_on_update: false,
        name_is_dns_label: true,
    },
    ResourceType {
        group: CORE_V1.0,
        version: CORE_V1.1,
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        create_on_update: false,
        name_is_dns_label: false,
    },
    ResourceType {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        create_on_update: true,
        name_is_dns_label: false,
    },
    ResourceType {
        group: "apps",
        version: "v1",
        plural: "deployments",
        singular: "deployment",
        kind: "Deployment",
        namespaced: true,
        short_names: &["deploy"],
        create_on_update: false,
        name_is_dns_label: true,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        short_names: &[],
        create_on_update: true,
        name_is_dns_label: false,
    },
    ResourceType {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        short_names: &[],
        create_on_update: true,
        name_is_dns_label: false,
    },
];

/// Finds the resource type served at `group/version/plural`, if any.
pub fn find_resource_type(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCE_TYPES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The API groups served, other than the core group, in discovery order.
pub fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for resource in RESOURCE_TYPES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&resource.group) {
            groups.push(resource.group);
        }
    }
    groups
}

/// The resource types of one group and version.
pub fn in_group_version(group: &str, version: &str) -> Vec<&'static ResourceType> {
    RESOURCE_TYPES.iter().filter(|r| r.group == group && r.version == version).collect()
}

/// The resource type of namespaces, which deleting a namespace cascades from.
pub fn namespaces() -> &'static ResourceType {
    RESOURCE_TYPES.iter().find(|r| r.plural == "namespaces").expect("namespaces are always served")
}
