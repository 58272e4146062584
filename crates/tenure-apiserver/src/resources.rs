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
    /// Which names the real server accepts for objects of this type.
    pub names: NameRule,
}

/// The rule an object's name must follow, as the real server's validation for its type applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS subdomain (RFC 1123): lower-case alphanumerics, `-` and `.`; most types.
    Subdomain,
    /// A DNS label: a subdomain without dots (namespaces, services, deployments).
    Label,
    /// A ConfigMap key: alphanumerics, `-`, `_` and `.` (LeaseCandidates, named after their
    /// holder identity, which may contain upper case and underscores).
    ConfigMapKey,
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
        self.qualified(self.plural)
    }

    /// `Kind.group` as the real server names a kind in validation messages (`Lease.coordination.k8s.io`).
    pub fn qualified_kind(&self) -> String {
        self.qualified(self.kind)
    }

    fn qualified(&self, name: &str) -> String {
        if self.group.is_empty() {
            name.to_string()
        } else {
            format!("{name}.{}", self.group)
        }
    }

    /// This type with a PUT to an absent object creating it.
    const fn created_on_update(mut self) -> Self {
        self.create_on_update = true;
        self
    }

    /// This type with its objects outside any namespace.
    const fn cluster_scoped(mut self) -> Self {
        self.namespaced = false;
        self
    }
}

const CORE_V1: (&str, &str) = ("", "v1");
const RBAC_V1: (&str, &str) = ("rbac.authorization.k8s.io", "v1");

/// A namespaced type whose absent objects a PUT does not create: most of them.
const fn served(
    (group, version): (&'static str, &'static str),
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short_names: &'static [&'static str],
    names: NameRule,
) -> ResourceType {
    let (namespaced, create_on_update) = (true, false);
    ResourceType { group, version, plural, singular, kind, namespaced, short_names, create_on_update, names }
}

/// Every resource type served. Leader election and controllers need the first seven; service
/// accounts, deployments and RBAC roles are served (stored, not enforced) so that the manifests in
/// `deploy/` can be applied with kubectl; LeaseCandidates (`coordination.k8s.io/v1beta1`) are the
/// candidates of Coordinated Leader Election, which [`crate::coordinator`] elects from.
pub static RESOURCE_TYPES: &[ResourceType] = &[
    served(CORE_V1, "configmaps", "configmap", "ConfigMap", &["cm"], NameRule::Subdomain),
    served(CORE_V1, "endpoints", "endpoints", "Endpoints", &["ep"], NameRule::Subdomain).created_on_update(),
    served(CORE_V1, "events", "event", "Event", &["ev"], NameRule::Subdomain).created_on_update(),
    served(CORE_V1, "namespaces", "namespace", "Namespace", &["ns"], NameRule::Label).cluster_scoped(),
    served(CORE_V1, "pods", "pod", "Pod", &["po"], NameRule::Subdomain),
    served(CORE_V1, "services", "service", "Service", &["svc"], NameRule::Label),
    served(CORE_V1, "serviceaccounts", "serviceaccount", "ServiceAccount", &["sa"], NameRule::Subdomain),
    served(("coordination.k8s.io", "v1"), "leases", "lease", "Lease", &[], NameRule::Subdomain).created_on_update(),
    served(
        ("coordination.k8s.io", "v1beta1"),
        "leasecandidates",
        "leasecandidate",
        "LeaseCandidate",
        &[],
        NameRule::ConfigMapKey,
    ),
    served(("apps", "v1"), "deployments", "deployment", "Deployment", &["deploy"], NameRule::Label),
    served(RBAC_V1, "roles", "role", "Role", &[], NameRule::Subdomain).created_on_update(),
    served(RBAC_V1, "rolebindings", "rolebinding", "RoleBinding", &[], NameRule::Subdomain).created_on_update(),
];

/// Finds the resource type served at `group/version/plural`, if any.
pub fn find_resource_type(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCE_TYPES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The type stored under `group` and `plural`, whatever its version (the store keys objects by
/// group and plural only, as each type is served in one version).
pub fn find_stored_type(group: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCE_TYPES.iter().find(|r| r.group == group && r.plural == plural)
}

/// The versions of one group, preferred (`v1`, else the first served) first.
pub fn group_versions(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for resource in RESOURCE_TYPES.iter().filter(|r| r.group == group) {
        if !versions.contains(&resource.version) {
            versions.push(resource.version);
        }
    }
    if let Some(v1) = versions.iter().position(|v| *v == "v1") {
        let preferred = versions.remove(v1);
        versions.insert(0, preferred);
    }
    versions
}

/// The type of LeaseCandidates, which the coordinator watches and pings.
pub fn lease_candidates() -> &'static ResourceType {
    RESOURCE_TYPES.iter().find(|r| r.kind == "LeaseCandidate").expect("lease candidates are always served")
}

/// The type of Leases, which the coordinator writes.
pub fn leases() -> &'static ResourceType {
    RESOURCE_TYPES.iter().find(|r| r.kind == "Lease").expect("leases are always served")
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
