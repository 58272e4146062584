//! API errors and their rendering as Kubernetes `Status` objects, worded as the real server words them
//! because clients (kube-rs, client-go, kubectl) branch on `reason` and `code` and users read `message`.

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::resources::ResourceType;

/// One field-level validation failure inside a `422 Invalid` answer.
#[derive(Debug, Clone)]
pub struct FieldCause {
    /// Dotted path of the offending field (`spec.leaseDurationSeconds`).
    pub field: String,
    /// What is wrong, as the real server words it (`Invalid value: 0: must be greater than 0`).
    pub message: String,
    /// Kubernetes cause type (`FieldValueInvalid`, `FieldValueRequired`).
    pub reason: &'static str,
}

/// An error answer of the API, carrying everything its `Status` object needs.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code, repeated in the `Status` object.
    pub code: u16,
    /// Machine-readable reason (`Conflict`, `NotFound`...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// The `details` object, if the error concerns one object.
    pub details: Option<Value>,
}

fn object_details(resource: &ResourceType, name: &str, kind: &str) -> Value {
    let mut details = json!({ "name": name, "kind": kind });
    if !resource.group.is_empty() {
        details["group"] = json!(resource.group);
    }
    details
}

impl ApiError {
    /// An error with these parts, for answers that have no constructor of their own.
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>, details: Option<Value>) -> Self {
        ApiError { code, reason, message: message.into(), details }
    }

    /// `404 NotFound` for an absent object.
    pub fn not_found(resource: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{}\" not found", resource.qualified_plural(), name);
        ApiError::new(404, "NotFound", message, Some(object_details(resource, name, resource.plural)))
    }

    /// `404 NotFound` for a path that names no resource.
    pub fn no_such_path() -> Self {
        ApiError::new(404, "NotFound", "the server could not find the requested resource", Some(json!({})))
    }

    /// `409 AlreadyExists` for a create of a name already taken.
    pub fn already_exists(resource: &ResourceType, name: &str) -> Self {
        let message = format!("{} \"{}\" already exists", resource.qualified_plural(), name);
        ApiError::new(409, "AlreadyExists", message, Some(object_details(resource, name, resource.plural)))
    }

    /// `409 Conflict` for a write with a stale `resourceVersion`.
    pub fn conflict(resource: &ResourceType, name: &str) -> Self {
        Self::conflict_because(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `409 Conflict` with a specific explanation (failed delete preconditions).
    pub fn conflict_because(resource: &ResourceType, name: &str, why: &str) -> Self {
        let message = format!("Operation cannot be fulfilled on {} \"{}\": {}", resource.qualified_plural(), name, why);
        ApiError::new(409, "Conflict", message, Some(object_details(resource, name, resource.plural)))
    }

    /// `422 Invalid` listing the fields that failed validation.
    pub fn invalid(resource: &ResourceType, name: &str, causes: Vec<FieldCause>) -> Self {
        let summary: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        let summary = if summary.len() == 1 { summary.join("") } else { format!("[{}]", summary.join(", ")) };
        let mut details = object_details(resource, name, resource.kind);
        details["causes"] =
            causes.iter().map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field })).collect();
        let message = format!("{} \"{}\" is invalid: {}", resource.qualified_kind(), name, summary);
        ApiError::new(422, "Invalid", message, Some(details))
    }

    /// `400 BadRequest` for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message, None)
    }

    /// `405 MethodNotAllowed` for a verb the path does not support.
    pub fn method_not_allowed(method: &str) -> Self {
        let message = format!("the server does not allow this method on the requested resource ({method})");
        ApiError::new(405, "MethodNotAllowed", message, Some(json!({})))
    }

    /// `415 UnsupportedMediaType` for a patch type the server does not implement.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type})"),
            None,
        )
    }

    /// `410 Expired` for a watch from a version older than the event log keeps.
    pub fn expired(requested: u64, oldest_kept: u64) -> Self {
        ApiError::new(410, "Expired", format!("too old resource version: {requested} ({oldest_kept})"), None)
    }

    /// `504 Timeout`, for a request held by a partition that has healed since.
    pub fn timeout() -> Self {
        ApiError::new(504, "Timeout", "the request was cut off by a partition and not served", Some(json!({})))
    }

    /// `500 InternalError`, used by fault injection.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message, Some(json!({ "causes": [{ "message": "injected fault" }] })))
    }

    /// `429 TooManyRequests`, used by fault injection (the `Retry-After` header is added by the caller).
    pub fn too_many_requests(retry_after_seconds: u64) -> Self {
        let message = "the server has received too many requests and has asked us to try again later";
        ApiError::new(429, "TooManyRequests", message, Some(json!({ "retryAfterSeconds": retry_after_seconds })))
    }

    /// The HTTP status to answer with.
    pub fn http_status(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// This error as a Kubernetes `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
