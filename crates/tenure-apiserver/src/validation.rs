//! The checks the real server makes on the fields we serve, answered as `422 Invalid`.

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

/// Validates an object about to be stored; `name` is its (already defaulted) name.
pub fn validate(resource: &ResourceType, name: &str, object: &Value) -> Result<(), ApiError> {
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
}
