//! Fenced checkpoints (invariant C1): how far the leader has processed, so the next leader resumes
//! exactly there instead of missing what happened while nobody led.
//!
//! The seed's second problem: "during leader transition ... some K8s resources are deleted. New
//! leader will not get the notification about the deletion". Kuryr's proposed fix was to save the
//! last seen `resourceVersion` when stopping the watcher and to restart watching from it. Here:
//!
//! - a [`Checkpoint`] holds the last resourceVersion per watched resource and one small user value;
//! - a [`CheckpointStore`] keeps it, and rejects a save under a term older than the newest term that
//!   has written ([`CheckpointError::Superseded`]), so a paused old leader never moves it back;
//! - a [`Checkpointer`] is what the leader's work uses: cheap in-memory updates, at most one write
//!   per period, one more when the work stops.
//!
//! Bad input (a document that does not parse, a newer format, another controller's checkpoint) is
//! logged once and treated as absent: the caller relists, which is always safe.

mod checkpointer;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod file;
#[cfg(feature = "kube")]
pub mod kube;
pub mod memory;
#[cfg(feature = "zk")]
pub mod zk;

use std::borrow::Cow;
use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tenure::Term;

pub use checkpointer::Checkpointer;

/// The format version this crate writes. Documents with a greater version come from a newer
/// release whose fields this one may not understand; they are treated as absent.
pub const FORMAT_VERSION: u32 = 1;

/// How far one controller has processed: what the next leader needs to resume.
///
/// ```
/// use tenure_ha::checkpoint::Checkpoint;
/// let mut checkpoint = Checkpoint::new("ip-allocator");
/// checkpoint.resource_versions.insert("pods".into(), "4711".into());
/// assert_eq!(checkpoint.resource_version("pods"), Some("4711"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The version of the document's format ([`FORMAT_VERSION`] when written by this release).
    pub format_version: u32,
    /// Which controller wrote it: a store shared by mistake must not resume another controller.
    pub controller: String,
    /// The last resourceVersion processed, per watched resource (e.g. `"pods"`).
    #[serde(default)]
    pub resource_versions: BTreeMap<String, String>,
    /// One small value of the user's (a cursor, a generation); `null` when unused.
    #[serde(default)]
    pub user_value: serde_json::Value,
}

impl Checkpoint {
    /// An empty checkpoint of `controller`: nothing processed yet (a resume relists).
    pub fn new(controller: impl Into<String>) -> Checkpoint {
        Checkpoint {
            format_version: FORMAT_VERSION,
            controller: controller.into(),
            resource_versions: BTreeMap::new(),
            user_value: serde_json::Value::Null,
        }
    }

    /// The resourceVersion recorded for `resource`, if any.
    pub fn resource_version(&self, resource: &str) -> Option<&str> {
        self.resource_versions.get(resource).map(String::as_str)
    }
}

/// A checkpoint as stored, with the term of the leader that wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCheckpoint {
    /// The term under which it was written: later saves with a lower term are rejected.
    pub term: Term,
    /// The checkpoint itself.
    pub checkpoint: Checkpoint,
}

/// Why a checkpoint could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A newer term has written: this writer's tenure is over and it must not move the
    /// checkpoint (invariant C1). Not a failure of the store; stop writing.
    #[error("checkpoint save under term {ours} rejected: a newer term ({}) has written since", newer.map_or("unknown".to_owned(), |t| t.to_string()))]
    Superseded {
        /// The term of the rejected save.
        ours: Term,
        /// The newer term found in the store (`None` when the store only knows it is newer, as
        /// etcd does when the election key of `ours` is gone).
        newer: Option<Term>,
    },
    /// The store failed (I/O, network, timeout); the checkpoint is unchanged.
    #[error("checkpoint store {store} failed: {reason}")]
    Store {
        /// Which store (path, key).
        store: String,
        /// What went wrong.
        reason: String,
    },
}

/// Where checkpoints live. Implementations must make [`CheckpointStore::save`] atomic with the term
/// comparison: "no newer term has written" and "write" in one step (a file lock, a compare-and-swap,
/// a transaction).
///
/// How the other backends fit: on etcd, a transaction guarded by the election key of the term
/// (`tenure_etcd::leader_compare`; see the module `etcd`, behind the `etcd`
/// feature); on ZooKeeper, a multi-operation that checks the election node of the term next to the
/// versioned write of the checkpoint node (module `zk`, feature `zk`); on Kubernetes, an
/// annotation on a ConfigMap written with a `resourceVersion` compare-and-swap after comparing
/// the stored term, retried on conflict.
#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// The newest checkpoint of [`CheckpointStore::controller`]; `Ok(None)` when there is none or
    /// the stored document is unusable (see [`decode`]).
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError>;

    /// Writes `checkpoint` under `term`, unless a newer term has written
    /// ([`CheckpointError::Superseded`]). Saving under the same term again is allowed.
    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError>;

    /// The controller whose checkpoints this store keeps.
    fn controller(&self) -> &str;

    /// The Kubernetes object the checkpoint is kept in, if it is kept in one. A watch that
    /// includes that object (a watch of ConfigMaps without a selector, in the checkpoint's
    /// namespace) must skip its events: each checkpoint write would otherwise come back as a change
    /// that moves the checkpoint and causes the next write, one write per period forever.
    /// Default: `None` (a file, an etcd key, a ZooKeeper node: nothing a Kubernetes watch sees).
    fn object(&self) -> Option<CheckpointObject> {
        None
    }

    /// Where the store keeps them, for log lines.
    fn describe(&self) -> String;
}

/// Where a store keeps its checkpoint when that place is a Kubernetes object, so that a watch of
/// the same collection can recognise the checkpoint's own writes and skip them
/// ([`CheckpointStore::object`]).
///
/// Why URL paths rather than kube types: this module compiles without the `kube` feature; the
/// paths are what `kube::Api::resource_url` answers, so a watch compares them as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointObject {
    /// The collection's path across all namespaces, e.g. `/api/v1/configmaps`.
    pub all_namespaces_url: String,
    /// The collection's path in the object's namespace, e.g. `/api/v1/namespaces/kube-system/configmaps`.
    pub namespace_url: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl CheckpointObject {
    /// Whether a watch of the collection at `resource_url` (as `kube::Api::resource_url` gives
    /// it) can see this object.
    pub fn is_in(&self, resource_url: &str) -> bool {
        resource_url == self.all_namespaces_url || resource_url == self.namespace_url
    }

    /// Whether an object of that collection with this namespace and name is the checkpoint's.
    pub fn is(&self, namespace: Option<&str>, name: &str) -> bool {
        namespace == Some(self.namespace.as_str()) && name == self.name
    }
}

/// The stored document: a checkpoint plus the term that wrote it (borrowed to write, owned when read).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document<'a> {
    term: Term,
    #[serde(flatten)]
    checkpoint: Cow<'a, Checkpoint>,
}

/// The bytes a store writes for `checkpoint` under `term` (JSON).
pub fn encode(term: Term, checkpoint: &Checkpoint) -> Vec<u8> {
    // Serialising plain strings, maps and a JSON value into memory cannot fail.
    serde_json::to_vec(&Document { term, checkpoint: Cow::Borrowed(checkpoint) }).unwrap_or_default()
}

/// The term a stored document was written under, read as leniently as possible (any JSON object
/// with a numeric `term`), so that a document this release cannot use still fences older writers.
pub fn stored_term(bytes: &[u8]) -> Option<Term> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    value.get("term")?.as_u64().map(Term)
}

/// Reads a stored document for `controller`. Anything unusable is logged (one line, with the
/// reason and `source`) and answered with `None`, which the caller treats as "no checkpoint": it
/// relists. Never panics.
pub fn decode(bytes: &[u8], controller: &str, source: &str) -> Option<StoredCheckpoint> {
    let document: Document<'_> = match serde_json::from_slice(bytes) {
        Ok(document) => document,
        Err(error) => {
            tracing::warn!(%source, %error, "checkpoint does not parse; ignoring it (the controller relists)");
            return None;
        }
    };
    let checkpoint = document.checkpoint.into_owned();
    if checkpoint.format_version > FORMAT_VERSION {
        tracing::warn!(
            %source,
            found = checkpoint.format_version,
            supported = FORMAT_VERSION,
            "checkpoint is from a newer format version; ignoring it (the controller relists)"
        );
        return None;
    }
    if checkpoint.controller != controller {
        tracing::warn!(
            %source,
            found = %checkpoint.controller,
            expected = %controller,
            "checkpoint belongs to another controller; ignoring it (the controller relists)"
        );
        return None;
    }
    Some(StoredCheckpoint { term: document.term, checkpoint })
}

/// The rule every store applies under its own atomicity: a save under `ours` is rejected when the
/// stored document was written under a greater term.
pub fn check_not_superseded(stored: Option<&[u8]>, ours: Term) -> Result<(), CheckpointError> {
    match stored.and_then(stored_term) {
        Some(newer) if newer > ours => Err(CheckpointError::Superseded { ours, newer: Some(newer) }),
        _ => Ok(()),
    }
}

/// The error of a save whose compare-and-swap kept failing because the stored checkpoint changed
/// between its read and its write (only the leader's own concurrent saves can do that).
fn kept_changing(store: String) -> CheckpointError {
    CheckpointError::Store { store, reason: "the checkpoint kept changing under the save".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_survives_encoding() {
        let mut checkpoint = Checkpoint::new("c");
        checkpoint.resource_versions.insert("pods".into(), "12".into());
        checkpoint.user_value = serde_json::json!({"next": 3});
        let decoded = decode(&encode(Term(7), &checkpoint), "c", "test").expect("decodes");
        assert_eq!(decoded, StoredCheckpoint { term: Term(7), checkpoint });
    }

    #[test]
    fn unusable_documents_read_as_absent() {
        assert_eq!(decode(b"{not json", "c", "test"), None);
        assert_eq!(decode(b"[]", "c", "test"), None);
        let newer = br#"{"term":3,"formatVersion":2,"controller":"c","resourceVersions":{}}"#;
        assert_eq!(decode(newer, "c", "test"), None);
        let foreign = encode(Term(3), &Checkpoint::new("other"));
        assert_eq!(decode(&foreign, "c", "test"), None);
    }

    #[test]
    fn an_unusable_document_still_fences_older_terms() {
        let newer = br#"{"term":9,"formatVersion":2,"controller":"c"}"#;
        assert!(matches!(
            check_not_superseded(Some(newer), Term(8)),
            Err(CheckpointError::Superseded { ours: Term(8), newer: Some(Term(9)) })
        ));
        assert!(check_not_superseded(Some(newer), Term(9)).is_ok());
        assert!(check_not_superseded(Some(b"garbage"), Term(1)).is_ok());
        assert!(check_not_superseded(None, Term(1)).is_ok());
    }
}
