//! Metadata-only answers: the `PartialObjectMetadata` a client asks for with
//! `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1` (one object, a watch's
//! events, a patch's answer) or `as=PartialObjectMetadataList` (a list), as kube-rs's
//! `Api<PartialObjectMeta<K>>` and client-go's metadata informers do.
//!
//! Why the server needs it: a component that only reads labels and names (a labeller, a garbage
//! collector) then caches and receives only `metadata`, not every object's whole body; a test
//! of such a component against this server measures what it would cost against a real one.

use serde_json::{json, Value};

/// Whether an `Accept` header asks for metadata only (`PartialObjectMetadata` or its list). Only
/// its first media type counts, as for `Table`.
pub fn wants_metadata(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

/// An object reduced to its metadata.
pub fn partial(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
}

/// A list of objects reduced to their metadata, at `version`.
pub fn partial_list<'a>(items: impl Iterator<Item = &'a Value>, version: u64) -> Value {
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": version.to_string()},
        "items": items.map(partial).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_media_type_asks_for_metadata() {
        assert!(wants_metadata("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"));
        assert!(wants_metadata("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"));
        assert!(!wants_metadata("application/json, application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"));
        assert!(!wants_metadata("application/json"));
    }

    #[test]
    fn a_partial_object_keeps_the_metadata_and_drops_the_rest() {
        let object = json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "a", "labels": {"k": "v"}},
            "data": {"big": "x"}});
        let expected = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"name": "a", "labels": {"k": "v"}}});
        assert_eq!(partial(&object), expected);
        let list = partial_list([&object].into_iter(), 7);
        assert_eq!(list["kind"], "PartialObjectMetadataList");
        assert_eq!(list["metadata"]["resourceVersion"], "7");
        assert_eq!(list["items"], json!([expected]));
    }
}
