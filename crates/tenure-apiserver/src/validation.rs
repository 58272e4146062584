//! The checks the real server makes on the fields we serve: values out of range answer
//! `422 Invalid`; a field of the wrong JSON type (which the real server fails to decode into its
//! Go struct) answers `400 BadRequest` on create and update, and `422 Invalid` on the `patch`
//! field for a patch, as the real server does.

use serde_json::Value;

use crate::election::{Version, OLDEST_EMULATION_VERSION};
use crate::errors::{ApiError, FieldCause};
use crate::resources::{NameRule, ResourceType};

const SUBDOMAIN_HELP: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_HELP: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// The label regex `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_shaped(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn is_dns_label(text: &str) -> bool {
    text.len() <= 63 && is_label_shaped(text)
}

/// As the real server checks a subdomain: 253 characters at most and the regex, whose dotted parts
/// have no length limit of their own (a Lease may be named with a 100-character part).
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_label_shaped)
}

const CONFIG_MAP_KEY_HELP: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

/// What is wrong with a name that must be a ConfigMap key, as the real server words it.
fn config_map_key_errors(text: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if text.len() > 253 {
        errors.push("must be no more than 253 characters".to_string());
    }
    if !text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        errors.push(CONFIG_MAP_KEY_HELP.to_string());
    }
    match text {
        "." => errors.push("must not be '.'".to_string()),
        ".." => errors.push("must not be '..'".to_string()),
        _ if text.starts_with("..") => errors.push("must not start with '..'".to_string()),
        _ => {}
    }
    errors
}

const QUALIFIED_NAME_HELP: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// What is wrong with a qualified name (`[prefix/]name`, as label keys and third-party strategies
/// are), as the real server words it.
fn qualified_name_errors(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_HELP} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )]
        }
    };
    let mut errors = Vec::new();
    match prefix {
        Some("") => errors.push("prefix part must be non-empty".to_string()),
        Some(prefix) if !is_dns_subdomain(prefix) => errors.push(format!("prefix part {SUBDOMAIN_HELP}")),
        _ => {}
    }
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else {
        if bytes.len() > 63 {
            errors.push("name part must be no more than 63 characters".to_string());
        }
        let inner_ok = bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !inner_ok || !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
            errors.push(format!("name part {QUALIFIED_NAME_HELP}"));
        }
    }
    errors
}

fn cause(field: &str, reason: &'static str, message: String) -> FieldCause {
    FieldCause { field: field.into(), message, reason }
}

fn invalid(field: &str, value: &str, why: &str) -> FieldCause {
    cause(field, "FieldValueInvalid", format!("Invalid value: {value:?}: {why}"))
}

fn required(field: &str, detail: &str) -> FieldCause {
    let message = if detail.is_empty() { "Required value".to_string() } else { format!("Required value: {detail}") };
    cause(field, "FieldValueRequired", message)
}

/// The checks of a `CoordinatedLeaseStrategy` (a Lease's or a LeaseCandidate's): the built-in
/// name, or a third-party qualified name with a `/`. (Upstream reports these at
/// `spec.strategy.strategy`, a doubled path; the field is named once here.)
fn strategy_causes(field: &str, strategy: &str, causes: &mut Vec<FieldCause>) {
    if strategy.contains('/') {
        causes.extend(qualified_name_errors(strategy).iter().map(|why| invalid(field, strategy, why)));
    } else if strategy != OLDEST_EMULATION_VERSION {
        let message = format!("Unsupported value: {strategy:?}: supported values: \"{OLDEST_EMULATION_VERSION}\"");
        causes.push(cause(field, "FieldValueNotSupported", message));
    }
}

/// The Lease fields of Coordinated Leader Election: a valid strategy, and a preferred holder only
/// with a strategy (a holder told to hand over must know who coordinates).
fn lease_causes(spec: &Value, causes: &mut Vec<FieldCause>) {
    let strategy = spec.get("strategy").and_then(Value::as_str);
    if let Some(strategy) = strategy {
        strategy_causes("spec.strategy", strategy, causes);
    }
    let preferred = spec.get("preferredHolder").and_then(Value::as_str).unwrap_or("");
    if !preferred.is_empty() && strategy.unwrap_or("").is_empty() {
        let message = "Forbidden: may only be specified if `strategy` is defined".into();
        causes.push(cause("spec.preferredHolder", "FieldValueForbidden", message));
    }
}

/// A LeaseCandidate's spec: what it competes for, its versions and its strategy, as upstream checks them.
fn lease_candidate_causes(spec: &Value, causes: &mut Vec<FieldCause>) {
    let text = |field: &str| spec.get(field).and_then(Value::as_str).unwrap_or("");
    if text("leaseName").is_empty() {
        causes.push(required("spec.leaseName", ""));
    }
    let mut parse = |field: &str| {
        let value = text(field);
        let parsed = Version::parse(value);
        if !value.is_empty() && parsed.is_none() {
            causes.push(invalid(&format!("spec.{field}"), value, "must be a valid semantic version"));
        }
        parsed
    };
    let emulation = parse("emulationVersion");
    let binary = parse("binaryVersion");
    if text("binaryVersion").is_empty() {
        causes.push(required("spec.binaryVersion", ""));
    }
    if let (Some(binary), Some(emulation)) = (&binary, &emulation) {
        if binary < emulation {
            let why = "must be greater than or equal to `emulationVersion`";
            causes.push(invalid("spec.binaryVersion", text("binaryVersion"), why));
        }
    }
    let strategy = text("strategy");
    if strategy.is_empty() {
        causes.push(required("spec.strategy", ""));
        return;
    }
    let no_emulation = text("emulationVersion").is_empty() || emulation.as_ref().is_some_and(Version::is_zero);
    if strategy == OLDEST_EMULATION_VERSION && no_emulation {
        let why = "must be specified when `strategy` is 'OldestEmulationVersion'";
        causes.push(required("spec.emulationVersion", why));
    }
    strategy_causes("spec.strategy", strategy, causes);
}

/// How an object about to be stored arrived: the real server reports a field it cannot decode
/// differently for a whole body and for a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// A create (POST) or an update (PUT): the body is the object.
    Body,
    /// A patch: the object is the stored one with the patch applied.
    Patch,
}

/// What the Go type of a typed field accepts.
#[derive(Debug, Clone, Copy)]
enum FieldType {
    String,
    Int32,
    /// `metav1.Time` / `metav1.MicroTime`: an RFC 3339 string.
    Time,
    /// `map[string]string`.
    StringMap,
    /// A nested struct.
    Object,
}

impl FieldType {
    fn go_name(self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Int32 => "int32",
            FieldType::Time => "v1.MicroTime",
            FieldType::StringMap => "map[string]string",
            FieldType::Object => "struct",
        }
    }

    /// Whether `value` decodes as this type; `null` decodes as the zero value of every type.
    fn accepts(self, value: &Value) -> bool {
        match (self, value) {
            (_, Value::Null) => true,
            (FieldType::String, Value::String(_)) => true,
            (FieldType::Int32, Value::Number(n)) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            (FieldType::Time, Value::String(t)) => chrono::DateTime::parse_from_rfc3339(t).is_ok(),
            (FieldType::StringMap, Value::Object(map)) => map.values().all(|v| v.is_string() || v.is_null()),
            (FieldType::Object, Value::Object(_)) => true,
            _ => false,
        }
    }
}

/// The typed fields checked for every kind: (JSON path, Go struct holding it, type).
const METADATA_FIELDS: &[(&str, &str, FieldType)] = &[
    ("metadata", "", FieldType::Object),
    ("metadata.name", "ObjectMeta", FieldType::String),
    ("metadata.generateName", "ObjectMeta", FieldType::String),
    ("metadata.namespace", "ObjectMeta", FieldType::String),
    ("metadata.labels", "ObjectMeta", FieldType::StringMap),
    ("metadata.annotations", "ObjectMeta", FieldType::StringMap),
];

/// The typed fields of the kinds whose content Tenure relies on.
fn kind_fields(kind: &str) -> &'static [(&'static str, &'static str, FieldType)] {
    match kind {
        "Lease" => &[
            ("spec", "Lease", FieldType::Object),
            ("spec.holderIdentity", "LeaseSpec", FieldType::String),
            ("spec.leaseDurationSeconds", "LeaseSpec", FieldType::Int32),
            ("spec.acquireTime", "LeaseSpec", FieldType::Time),
            ("spec.renewTime", "LeaseSpec", FieldType::Time),
            ("spec.leaseTransitions", "LeaseSpec", FieldType::Int32),
            ("spec.preferredHolder", "LeaseSpec", FieldType::String),
            ("spec.strategy", "LeaseSpec", FieldType::String),
        ],
        "LeaseCandidate" => &[
            ("spec", "LeaseCandidate", FieldType::Object),
            ("spec.leaseName", "LeaseCandidateSpec", FieldType::String),
            ("spec.pingTime", "LeaseCandidateSpec", FieldType::Time),
            ("spec.renewTime", "LeaseCandidateSpec", FieldType::Time),
            ("spec.binaryVersion", "LeaseCandidateSpec", FieldType::String),
            ("spec.emulationVersion", "LeaseCandidateSpec", FieldType::String),
            ("spec.strategy", "LeaseCandidateSpec", FieldType::String),
        ],
        "ConfigMap" => {
            &[("data", "ConfigMap", FieldType::StringMap), ("binaryData", "ConfigMap", FieldType::StringMap)]
        }
        _ => &[],
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The first typed field that does not decode, worded as Go's JSON decoder words it.
fn decode_error(resource: &ResourceType, object: &Value) -> Option<String> {
    METADATA_FIELDS.iter().chain(kind_fields(resource.kind)).find_map(|(path, go_struct, field_type)| {
        let value = path.split('.').try_fold(object, |value, part| value.get(part))?;
        if field_type.accepts(value) {
            return None;
        }
        let (json, go) = (json_type(value), field_type.go_name());
        Some(match field_type {
            FieldType::Time => format!("parsing time {value} as RFC 3339 for field {path}: not a valid time"),
            _ if go_struct.is_empty() => format!("json: cannot unmarshal {json} into Go value of type {go} ({path})"),
            _ => format!("json: cannot unmarshal {json} into Go struct field {go_struct}.{path} of type {go}"),
        })
    })
}

/// Validates an object about to be stored; `name` is its (already defaulted) name.
pub fn validate(resource: &ResourceType, name: &str, object: &Value, write: WriteKind) -> Result<(), ApiError> {
    if let Some(error) = decode_error(resource, object) {
        return Err(match write {
            WriteKind::Body => ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {error}",
                resource.kind, resource.version, resource.kind
            )),
            WriteKind::Patch => ApiError::invalid(resource, name, vec![invalid("patch", &object.to_string(), &error)]),
        });
    }
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(required("metadata.name", "name or generateName is required"));
    } else {
        let errors = match resource.names {
            NameRule::Label if !is_dns_label(name) => vec![LABEL_HELP.to_string()],
            NameRule::Subdomain if !is_dns_subdomain(name) => vec![SUBDOMAIN_HELP.to_string()],
            NameRule::ConfigMapKey => config_map_key_errors(name),
            _ => Vec::new(),
        };
        causes.extend(errors.iter().map(|why| invalid("metadata.name", name, why)));
    }
    if resource.kind == "Lease" {
        let spec = &object["spec"];
        let bounds =
            [("leaseDurationSeconds", 1, "greater than 0"), ("leaseTransitions", 0, "greater than or equal to 0")];
        for (field, least, rule) in bounds {
            if let Some(value) = spec.get(field).and_then(Value::as_i64).filter(|value| *value < least) {
                let message = format!("Invalid value: {value}: must be {rule}");
                causes.push(cause(&format!("spec.{field}"), "FieldValueInvalid", message));
            }
        }
        lease_causes(spec, &mut causes);
    }
    if resource.kind == "LeaseCandidate" {
        lease_candidate_causes(&object["spec"], &mut causes);
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(resource, name, causes))
    }
}

/// Validates a replacement of `old` by `new` beyond what [`validate`] checks of `new` alone: the
/// fields that cannot change once set.
pub fn validate_update(resource: &ResourceType, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    if resource.kind == "LeaseCandidate" {
        let (before, after) = (&old["spec"]["leaseName"], &new["spec"]["leaseName"]);
        if before != after {
            let shown = after.as_str().unwrap_or("");
            let causes = vec![invalid("spec.leaseName", shown, "field is immutable")];
            return Err(ApiError::invalid(resource, name, causes));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("a.b-c.d1"));
        assert!(!is_dns_subdomain("Bad_Name"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(is_dns_subdomain(&"a".repeat(100)), "no per-part limit, as in Kubernetes");
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("a.b"));
    }

    fn lease() -> &'static ResourceType {
        crate::resources::find_resource_type("coordination.k8s.io", "v1", "leases").unwrap()
    }

    #[test]
    fn a_typed_field_of_the_wrong_type_is_refused_as_the_real_server_refuses_it() {
        let bad = json!({"metadata": {"name": "x"}, "spec": {"leaseDurationSeconds": "abc"}});
        let body = validate(lease(), "x", &bad, WriteKind::Body).unwrap_err();
        assert_eq!(body.http_status().as_u16(), 400);
        assert!(body.to_status()["message"]
            .as_str()
            .unwrap()
            .contains("LeaseSpec.spec.leaseDurationSeconds of type int32"));
        let patch = validate(lease(), "x", &bad, WriteKind::Patch).unwrap_err();
        assert_eq!(patch.http_status().as_u16(), 422);
        assert_eq!(patch.to_status()["details"]["causes"][0]["field"], "patch");
    }

    #[test]
    fn typed_fields_are_checked_for_range_time_format_and_maps() {
        for spec in [
            json!({"leaseDurationSeconds": 4_294_967_296u64}),
            json!({"leaseTransitions": 1.5}),
            json!({"renewTime": "yesterday"}),
            json!({"holderIdentity": 7}),
            json!("not an object"),
        ] {
            let object = json!({"metadata": {"name": "x"}, "spec": spec});
            assert!(validate(lease(), "x", &object, WriteKind::Body).is_err(), "{object}");
        }
        let labels = json!({"metadata": {"name": "x", "labels": {"a": 1}}});
        assert!(validate(lease(), "x", &labels, WriteKind::Body).is_err());
        let good = json!({"metadata": {"name": "x", "labels": {"a": "b"}}, "spec": {
            "holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2024-05-01T10:00:00.000000Z",
            "acquireTime": null, "leaseTransitions": 3}});
        assert!(validate(lease(), "x", &good, WriteKind::Body).is_ok());
    }

    /// What the server says is wrong with `object`: "field: message" per cause.
    fn causes(resource: &ResourceType, object: serde_json::Value) -> Vec<String> {
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_string();
        let Err(error) = validate(resource, &name, &object, WriteKind::Body) else { return Vec::new() };
        assert_eq!((error.code, error.reason), (422, "Invalid"), "{error}");
        let status = error.to_status();
        let causes = status["details"]["causes"].as_array().unwrap().iter();
        causes.map(|c| format!("{}: {}", c["field"].as_str().unwrap(), c["message"].as_str().unwrap())).collect()
    }

    #[test]
    fn a_preferred_holder_needs_a_strategy_and_strategies_are_built_in_or_qualified() {
        let lease_with = |spec: serde_json::Value| json!({"metadata": {"name": "x"}, "spec": spec});
        assert_eq!(
            causes(lease(), lease_with(json!({"preferredHolder": "b"}))),
            ["spec.preferredHolder: Forbidden: may only be specified if `strategy` is defined"]
        );
        assert!(causes(lease(), lease_with(json!({"preferredHolder": "", "holderIdentity": "a"}))).is_empty());
        for good in ["OldestEmulationVersion", "example.com/Custom", "example.com/my.strategy_2"] {
            let spec = json!({"strategy": good, "preferredHolder": "b"});
            assert!(causes(lease(), lease_with(spec)).is_empty(), "{good}");
        }
        assert_eq!(
            causes(lease(), lease_with(json!({"strategy": "Youngest"}))),
            ["spec.strategy: Unsupported value: \"Youngest\": supported values: \"OldestEmulationVersion\""]
        );
        for bad in ["", "/x", "Example.com/x", "example.com/-x", "a/b/c"] {
            assert!(!causes(lease(), lease_with(json!({"strategy": bad}))).is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn lease_candidates_need_a_lease_name_versions_and_a_strategy() {
        let candidates = crate::resources::lease_candidates();
        let candidate = |spec: serde_json::Value| json!({"metadata": {"name": "Pod_A.1"}, "spec": spec});
        let good = json!({"leaseName": "l", "binaryVersion": "1.31.0", "emulationVersion": "1.30",
            "strategy": "OldestEmulationVersion", "renewTime": "2024-05-01T10:00:00.000000Z"});
        assert!(causes(candidates, candidate(good)).is_empty());
        let fields = |spec| causes(candidates, candidate(spec));
        assert_eq!(
            fields(json!({})),
            ["spec.leaseName: Required value", "spec.binaryVersion: Required value", "spec.strategy: Required value"]
        );
        assert_eq!(
            fields(json!({"leaseName": "l", "binaryVersion": "1.30.0", "strategy": "OldestEmulationVersion"})),
            ["spec.emulationVersion: Required value: must be specified when `strategy` is 'OldestEmulationVersion'"]
        );
        assert_eq!(
            fields(json!({"leaseName": "l", "binaryVersion": "1.x", "emulationVersion": "v1",
                "strategy": "OldestEmulationVersion"})),
            [
                "spec.emulationVersion: Invalid value: \"v1\": must be a valid semantic version",
                "spec.binaryVersion: Invalid value: \"1.x\": must be a valid semantic version"
            ]
        );
        assert_eq!(
            fields(json!({"leaseName": "l", "binaryVersion": "1.29.0", "emulationVersion": "1.30.0",
                "strategy": "OldestEmulationVersion"})),
            ["spec.binaryVersion: Invalid value: \"1.29.0\": must be greater than or equal to `emulationVersion`"]
        );
        // A third-party strategy needs no emulation version.
        assert!(fields(json!({"leaseName": "l", "binaryVersion": "1.29.0", "strategy": "example.com/x"})).is_empty());
        let bad_name = json!({"metadata": {"name": "a/b"}, "spec": {"leaseName": "l", "binaryVersion": "1.0.0",
            "emulationVersion": "1.0.0", "strategy": "OldestEmulationVersion"}});
        assert!(causes(candidates, bad_name)[0].starts_with("metadata.name: "));
        let wrong_type = json!({"metadata": {"name": "a"}, "spec": {"pingTime": "now"}});
        assert_eq!(validate(candidates, "a", &wrong_type, WriteKind::Body).unwrap_err().code, 400);
        let old = json!({"spec": {"leaseName": "l"}});
        let moved = json!({"spec": {"leaseName": "m"}});
        let error = validate_update(candidates, "a", &old, &moved).unwrap_err().message;
        assert!(error.contains("spec.leaseName: Invalid value: \"m\": field is immutable"), "{error}");
        assert!(validate_update(candidates, "a", &old, &old).is_ok());
    }
}
