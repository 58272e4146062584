//! Checkpoints in a Kubernetes object's annotation (feature `kube`).
//!
//! Why a dedicated ConfigMap rather than the lock object: the lock's record is written by the
//! renew loop of [`tenure_kube::KubeLock`] (and, on a shared lock, by client-go candidates that
//! replace the whole object and would drop an annotation they do not know). Riding on the renew
//! write would need the record lock to carry foreign data through its compare-and-swap, a change
//! of the election core; instead the [`super::Checkpointer`] writes at most once per renew period,
//! and only when something changed, to a ConfigMap of its own.
//!
//! Every save reads the object (or reuses the object as this store last read or wrote it, so a
//! steady leader makes one request per save, and a new leader's claim right after its load one),
//! refuses if the stored term is newer ([`super::check_not_superseded`], invariant C1), and replaces
//! it with that `resourceVersion` as precondition: a concurrent writer makes the replace fail with
//! `409 Conflict`, and the save starts over from a fresh read, so the term comparison and the write
//! act as one step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Resource, ResourceExt};
use tenure::Term;

use super::{
    check_not_superseded, decode, encode, Checkpoint, CheckpointError, CheckpointObject, CheckpointStore,
    StoredCheckpoint,
};

/// The annotation the checkpoint document (JSON, with its term) is kept in.
pub const CHECKPOINT_ANNOTATION: &str = "tenure.dev/checkpoint";

/// How often a save starts over after a `409 Conflict` (someone wrote between read and replace).
const SAVE_ATTEMPTS: usize = 5;

/// Checkpoints of one controller in the annotation [`CHECKPOINT_ANNOTATION`] of one ConfigMap,
/// created on the first save.
///
/// ```no_run
/// # async fn f(client: kube::Client) {
/// use tenure_ha::checkpoint::kube::KubeCheckpointStore;
/// let store = KubeCheckpointStore::new(client, "kube-system", "ip-allocator-checkpoint", "ip-allocator");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KubeCheckpointStore {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    controller: String,
    /// The object as this store last read or wrote it: the next save replaces it without reading
    /// first (one request per save); if anyone else wrote since, the replace fails with a conflict
    /// and the save reads afresh.
    last_written: Arc<Mutex<Option<ConfigMap>>>,
}

impl KubeCheckpointStore {
    /// The checkpoint of `controller` in the ConfigMap `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: impl Into<String>, controller: impl Into<String>) -> Self {
        KubeCheckpointStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.into(),
            controller: controller.into(),
            last_written: Arc::default(),
        }
    }

    fn error(&self, error: kube::Error) -> CheckpointError {
        CheckpointError::Store { store: self.describe(), reason: error.to_string() }
    }

    fn last_written(&self) -> std::sync::MutexGuard<'_, Option<ConfigMap>> {
        self.last_written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One attempt: `Ok(true)` when written, `Ok(false)` on a conflict (start over, reading).
    async fn try_save(&self, term: Term, document: &str) -> Result<bool, CheckpointError> {
        let cached = self.last_written().take();
        let current = match cached {
            Some(object) => Some(object),
            None => self.api.get_opt(&self.name).await.map_err(|e| self.error(e))?,
        };
        let exists = current.is_some();
        let mut object = current.unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
            ..ConfigMap::default()
        });
        let annotations = object.metadata.annotations.get_or_insert_with(BTreeMap::new);
        check_not_superseded(annotations.get(CHECKPOINT_ANNOTATION).map(String::as_bytes), term)?;
        annotations.insert(CHECKPOINT_ANNOTATION.to_owned(), document.to_owned());
        // An object read carries the resourceVersion it was read at: the replace is a
        // compare-and-swap against it.
        let result = if exists {
            self.api.replace(&self.name, &PostParams::default(), &object).await
        } else {
            self.api.create(&PostParams::default(), &object).await
        };
        match result {
            Ok(written) => {
                *self.last_written() = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(response)) if response.code == 409 => Ok(false),
            Err(error) => Err(self.error(error)),
        }
    }
}

#[async_trait]
impl CheckpointStore for KubeCheckpointStore {
    async fn load(&self) -> Result<Option<StoredCheckpoint>, CheckpointError> {
        let object = self.api.get_opt(&self.name).await.map_err(|e| self.error(e))?;
        let document = object.as_ref().and_then(|o| o.annotations().get(CHECKPOINT_ANNOTATION)).cloned();
        // A new leader loads, then claims the checkpoint with a save at once: that save replaces
        // the object just read instead of reading it again (one request less on every takeover;
        // had anyone written in between, the replace conflicts and the save reads afresh).
        *self.last_written() = object;
        Ok(document.and_then(|d| decode(d.as_bytes(), &self.controller, &self.describe())))
    }

    async fn save(&self, term: Term, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let document = String::from_utf8_lossy(&encode(term, checkpoint)).into_owned();
        for _ in 0..SAVE_ATTEMPTS {
            if self.try_save(term, &document).await? {
                return Ok(());
            }
        }
        let reason = format!("{SAVE_ATTEMPTS} conflicting writes in a row");
        Err(CheckpointError::Store { store: self.describe(), reason })
    }

    fn controller(&self) -> &str {
        &self.controller
    }

    fn object(&self) -> Option<CheckpointObject> {
        let namespace_url = ConfigMap::url_path(&(), Some(&self.namespace));
        let (namespace, name) = (self.namespace.clone(), self.name.clone());
        Some(CheckpointObject { all_namespaces_url: ConfigMap::url_path(&(), None), namespace_url, namespace, name })
    }

    fn describe(&self) -> String {
        format!("configmap {}/{} annotation {CHECKPOINT_ANNOTATION}", self.namespace, self.name)
    }
}
