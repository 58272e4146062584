//! The patch formats clients send: JSON merge patch (RFC 7386), strategic merge patch (treated as a merge
//! patch, its `$` directives dropped: enough for the metadata and scalar fields we serve), and JSON patch
//! (RFC 6902).

use serde_json::Value;

use crate::errors::ApiError;

/// Which patch format a request body is in, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchFormat {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    StrategicMerge,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (server-side apply), accepted when the body is JSON.
    Apply,
}

impl PatchFormat {
    /// The format named by a `Content-Type` header, if it is one we implement.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(PatchFormat::Merge),
            "application/strategic-merge-patch+json" => Some(PatchFormat::StrategicMerge),
            "application/json-patch+json" => Some(PatchFormat::Json),
            "application/apply-patch+yaml" => Some(PatchFormat::Apply),
            _ => None,
        }
    }
}

/// Applies an RFC 7386 merge patch: objects merge recursively, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value, drop_directives: bool) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if drop_directives && key.starts_with('$') {
                continue;
            }
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value, drop_directives);
            }
        }
    }
}

fn unescape_pointer_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn pointer_parent<'a>(document: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), ApiError> {
    let (parent, last) =
        path.rsplit_once('/').ok_or_else(|| ApiError::bad_request(format!("invalid JSON patch path {path:?}")))?;
    let parent = document
        .pointer_mut(parent)
        .ok_or_else(|| ApiError::bad_request(format!("JSON patch path {path:?} does not exist")))?;
    Ok((parent, unescape_pointer_token(last)))
}

fn add_at(document: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *document = value;
        return Ok(());
    }
    let (parent, last) = pointer_parent(document, path)?;
    match parent {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) => {
            let index = if last == "-" {
                items.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= items.len())
                    .ok_or_else(|| ApiError::bad_request(format!("invalid array index in {path:?}")))?
            };
            items.insert(index, value);
            Ok(())
        }
        _ => Err(ApiError::bad_request(format!("JSON patch path {path:?} does not name a container"))),
    }
}

fn remove_at(document: &mut Value, path: &str) -> Result<Value, ApiError> {
    let (parent, last) = pointer_parent(document, path)?;
    let removed = match parent {
        Value::Object(map) => map.remove(&last),
        Value::Array(items) => last.parse::<usize>().ok().filter(|i| *i < items.len()).map(|i| items.remove(i)),
        _ => None,
    };
    removed.ok_or_else(|| ApiError::bad_request(format!("JSON patch path {path:?} does not exist")))
}

/// Applies an RFC 6902 JSON patch (`add`, `remove`, `replace`, `move`, `copy`, `test`).
pub fn json_patch(document: &mut Value, operations: &Value) -> Result<(), ApiError> {
    let operations =
        operations.as_array().ok_or_else(|| ApiError::bad_request("a JSON patch must be an array of operations"))?;
    for operation in operations {
        let op = operation["op"].as_str().unwrap_or("");
        let path = operation["path"].as_str().unwrap_or("");
        let from = operation["from"].as_str().unwrap_or("");
        match op {
            "add" => add_at(document, path, operation["value"].clone())?,
            "remove" => drop(remove_at(document, path)?),
            "replace" => {
                remove_at(document, path)?;
                add_at(document, path, operation["value"].clone())?;
            }
            "move" => {
                let value = remove_at(document, from)?;
                add_at(document, path, value)?;
            }
            "copy" => {
                let value = document
                    .pointer(from)
                    .cloned()
                    .ok_or_else(|| ApiError::bad_request(format!("JSON patch path {from:?} does not exist")))?;
                add_at(document, path, value)?;
            }
            "test" => {
                if document.pointer(path) != Some(&operation["value"]) {
                    let message = format!(
                        "the server rejected our request due to an error in our request: testing value {path} failed"
                    );
                    return Err(ApiError::new(422, "Invalid", message, None));
                }
            }
            other => return Err(ApiError::bad_request(format!("unknown JSON patch operation {other:?}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_merges_removes_and_replaces() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "d": 3}, "l": [3], "$setElementOrder/x": []}), true);
        assert_eq!(doc, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_operations() {
        let mut doc = json!({"a": 1, "l": [1]});
        let ops = json!([
            {"op": "replace", "path": "/a", "value": 2},
            {"op": "add", "path": "/l/-", "value": 5},
            {"op": "test", "path": "/a", "value": 2},
            {"op": "remove", "path": "/l/0"}
        ]);
        assert!(json_patch(&mut doc, &ops).is_ok());
        assert_eq!(doc, json!({"a": 2, "l": [5]}));
        assert!(json_patch(&mut doc, &json!([{"op": "test", "path": "/a", "value": 3}])).is_err());
    }
}
