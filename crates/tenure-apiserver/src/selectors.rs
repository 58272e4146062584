//! Label and field selectors, as the `labelSelector` and `fieldSelector` query parameters carry them,
//! so that lists and watches return only what a client asked for (a lock watcher asks for one name).

use serde_json::Value;

use crate::errors::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed `labelSelector`: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b`).
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn parse_set(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    /// Parses the `labelSelector` syntax: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let bad =
            |part: &str| ApiError::bad_request(format!("unable to parse requirement: invalid label selector: {part}"));
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let requirement = if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(key.trim().to_string())
            } else if let Some((key, value)) = part.split_once("!=") {
                LabelRequirement::NotEquals(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
                LabelRequirement::Equals(key.trim().to_string(), value.trim().to_string())
            } else if let Some((key, set)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(key.trim().to_string(), parse_set(set).ok_or_else(|| bad(part))?)
            } else if let Some((key, set)) = part.split_once(" in ") {
                LabelRequirement::In(key.trim().to_string(), parse_set(set).ok_or_else(|| bad(part))?)
            } else if part.contains(char::is_whitespace) || part.contains('(') {
                return Err(bad(part));
            } else {
                LabelRequirement::Exists(part.to_string())
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |key: &str| labels.get(key).and_then(Value::as_str);
        self.requirements.iter().all(|requirement| match requirement {
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => label(k).is_some_and(|l| set.iter().any(|v| v == l)),
            LabelRequirement::NotIn(k, set) => !label(k).is_some_and(|l| set.iter().any(|v| v == l)),
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: equality or inequality on dotted field paths (`metadata.name=x`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses `path=value`, `path==value` and `path!=value` terms separated by commas.
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let (path, value, equal) = if let Some((p, v)) = part.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (p, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: '{part}' is not a valid field selector: must be in the form of key=value"
                )));
            };
            requirements.push((path.trim().to_string(), value.trim().to_string(), equal));
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether the object's fields satisfy every requirement; an absent field reads as the empty string.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(path, expected, equal)| {
            let actual = path
                .split('.')
                .try_fold(object, |node, key| node.get(key))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (actual == *expected) == *equal
        })
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    /// The `labelSelector` parameter.
    pub labels: LabelSelector,
    /// The `fieldSelector` parameter.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Whether an object passes both selectors.
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let object = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let matches = |s: &str| LabelSelector::parse(s).map(|sel| sel.matches(&object));
        assert_eq!(matches("app=web").ok(), Some(true));
        assert_eq!(matches("app==web,tier=front").ok(), Some(true));
        assert_eq!(matches("app!=web").ok(), Some(false));
        assert_eq!(matches("app").ok(), Some(true));
        assert_eq!(matches("!app").ok(), Some(false));
        assert_eq!(matches("!missing").ok(), Some(true));
        assert_eq!(matches("app in (db,web)").ok(), Some(true));
        assert_eq!(matches("app notin (db,web)").ok(), Some(false));
        assert_eq!(matches("").ok(), Some(true));
    }

    #[test]
    fn field_selector_paths() {
        let object = json!({"metadata": {"name": "a", "namespace": "ns"}, "involvedObject": {"kind": "Lease"}});
        let matches = |s: &str| FieldSelector::parse(s).map(|sel| sel.matches(&object));
        assert_eq!(matches("metadata.name=a").ok(), Some(true));
        assert_eq!(matches("metadata.name=b").ok(), Some(false));
        assert_eq!(matches("metadata.namespace!=x,involvedObject.kind=Lease").ok(), Some(true));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
