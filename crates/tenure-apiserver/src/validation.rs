//! The checks the real server makes on the fields we serve: values out of range answer
//! `422 Invalid`; a field of the wrong JSON type (which the real server fails to decode into its
//! Go struct) answers `400 BadRequest` on create and update, and `422 Invalid` on the `patch`
//! field for a patch, as the real server does.

use serde_json::Value;

use crate::errors::{ApiError, FieldCause};
use crate::resources::ResourceType;

const SUBDOMAIN_HELP: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_HELP: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
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
            WriteKind::Patch => ApiError::invalid(
                resource,
                name,
                vec![FieldCause {
                    field: "patch".into(),
                    message: format!("Invalid value: {:?}: {error}", object.to_string()),
                    reason: "FieldValueInvalid",
                }],
            ),
        });
    }
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(FieldCause {
            field: "metadata.name".into(),
            message: "Required value: name or generateName is required".into(),
            reason: "FieldValueRequired",
        });
    } else if resource.name_is_dns_label && !is_dns_label(name) {
        causes.push(FieldCause {
            field: "metadata.name".into(),
            message: format!("Invalid value: \"{name}\": {LABEL_HELP}"),
            reason: "FieldValueInvalid",
        });
    } else if !resource.name_is_dns_label && !is_dns_subdomain(name) {
        causes.push(FieldCause {
            field: "metadata.name".into(),
            message: format!("Invalid value: \"{name}\": {SUBDOMAIN_HELP}"),
            reason: "FieldValueInvalid",
        });
    }
    if resource.kind == "Lease" {
        let spec = &object["spec"];
        if let Some(duration) = spec.get("leaseDurationSeconds").and_then(Value::as_i64) {
            if duration <= 0 {
                causes.push(FieldCause {
                    field: "spec.leaseDurationSeconds".into(),
                    message: format!("Invalid value: {duration}: must be greater than 0"),
                    reason: "FieldValueInvalid",
                });
            }
        }
        if let Some(transitions) = spec.get("leaseTransitions").and_then(Value::as_i64) {
            if transitions < 0 {
                causes.push(FieldCause {
                    field: "spec.leaseTransitions".into(),
                    message: format!("Invalid value: {transitions}: must be greater than or equal to 0"),
                    reason: "FieldValueInvalid",
                });
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(resource, name, causes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("a.b-c.d1"));
        assert!(!is_dns_subdomain("Bad_Name"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("a.b"));
    }

    fn lease() -> &'static ResourceType {
        crate::resources::find_resource_type("coordination.k8s.io", "v1", "leases").unwrap()
    }

    #[test]
    fn a_typed_field_of_the_wrong_type_is_refused_as_the_real_server_refuses_it() {
        let bad = serde_json::json!({"metadata": {"name": "x"}, "spec": {"leaseDurationSeconds": "abc"}});
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
            serde_json::json!({"leaseDurationSeconds": 4_294_967_296u64}),
            serde_json::json!({"leaseTransitions": 1.5}),
            serde_json::json!({"renewTime": "yesterday"}),
            serde_json::json!({"holderIdentity": 7}),
            serde_json::json!("not an object"),
        ] {
            let object = serde_json::json!({"metadata": {"name": "x"}, "spec": spec});
            assert!(validate(lease(), "x", &object, WriteKind::Body).is_err(), "{object}");
        }
        let labels = serde_json::json!({"metadata": {"name": "x", "labels": {"a": 1}}});
        assert!(validate(lease(), "x", &labels, WriteKind::Body).is_err());
        let good = serde_json::json!({"metadata": {"name": "x", "labels": {"a": "b"}}, "spec": {
            "holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": "2024-05-01T10:00:00.000000Z",
            "acquireTime": null, "leaseTransitions": 3}});
        assert!(validate(lease(), "x", &good, WriteKind::Body).is_ok());
    }
}
