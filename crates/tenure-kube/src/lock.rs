//! [`KubeLock`]: the lock a `kube://NAMESPACE/KIND/NAME` URL names, whatever its kind, as one type.
//!
//! Why one type: the CLI and programs choose the kind at run time from a URL, and need both a
//! [`RecordLock`] for the elector and the lock objects for Events; one trait object over the five kinds
//! gives them that without generics.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, ObjectReference};
use tenure::{ChangeStream, Elector, LeaderElectionRecord, LockError, RecordLock, StoredRecord, Version};

use crate::codec::RecordObject;
use crate::config::{KubeLockRef, LockKind};
use crate::events::{EventRecorder, LeadershipEvents};
use crate::multilock::MultiLock;
use crate::object::ObjectLock;

/// What a [`KubeLock`] needs of a lock of each kind, beside the [`RecordLock`] itself.
trait Objects: RecordLock {
    fn references(&self) -> Vec<ObjectReference>;
    fn with_timeout(&self, timeout: Duration) -> Arc<dyn Objects>;
}

impl<K: RecordObject> Objects for ObjectLock<K> {
    fn references(&self) -> Vec<ObjectReference> {
        vec![self.object_reference()]
    }

    fn with_timeout(&self, timeout: Duration) -> Arc<dyn Objects> {
        Arc::new(self.clone().with_watch_open_timeout(timeout))
    }
}

impl<P: RecordObject> Objects for MultiLock<P> {
    fn references(&self) -> Vec<ObjectReference> {
        self.object_references()
    }

    fn with_timeout(&self, timeout: Duration) -> Arc<dyn Objects> {
        Arc::new(self.clone().with_watch_open_timeout(timeout))
    }
}

/// A Kubernetes lock of any kind, for one candidate: a [`RecordLock`] to give the elector, and
/// the client and objects to post Events with. Cheap to clone (clones share the client and the
/// remembered objects).
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let lock = tenure_kube::KubeLockConfig::from_url("kube://default/leases/x")?.connect("pod-a").await?;
/// let record_lock: std::sync::Arc<dyn tenure::RecordLock> = lock.record_lock();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KubeLock {
    lock: Arc<dyn Objects>,
    client: kube::Client,
    identity: String,
}

impl std::fmt::Debug for KubeLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLock").field("lock", &self.describe()).field("identity", &self.identity).finish()
    }
}

impl KubeLock {
    /// The lock `reference` reached with `client`, for the candidate `identity` (used in Events).
    /// Prefer [`crate::KubeLockConfig::connect`], which builds the client with the candidate's
    /// `User-Agent`, unless the program already has a client (a kube-rs controller does).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use tenure_kube::{KubeLock, KubeLockRef, LockKind};
    /// let client = kube::Client::try_default().await?; // the controller's own client
    /// let lease = KubeLockRef { namespace: "default".into(), kind: LockKind::Leases, name: "my-controller".into() };
    /// let lock = KubeLock::new(client, &lease, "pod-a");
    /// let elector = tenure::Elector::builder("pod-a", lock).spawn()?;
    /// # Ok(()) }
    /// ```
    pub fn new(client: kube::Client, reference: &KubeLockRef, identity: &str) -> Self {
        let (namespace, name) = (reference.namespace.as_str(), reference.name.as_str());
        let lease = || ObjectLock::<Lease>::new(client.clone(), namespace, name);
        let endpoints = || ObjectLock::<Endpoints>::new(client.clone(), namespace, name);
        let config_map = || ObjectLock::<ConfigMap>::new(client.clone(), namespace, name);
        let lock: Arc<dyn Objects> = match reference.kind {
            LockKind::Leases => Arc::new(lease()),
            LockKind::Endpoints => Arc::new(endpoints()),
            LockKind::ConfigMaps => Arc::new(config_map()),
            LockKind::EndpointsLeases => Arc::new(MultiLock::new(endpoints(), lease())),
            LockKind::ConfigMapsLeases => Arc::new(MultiLock::new(config_map(), lease())),
        };
        KubeLock { lock, client, identity: identity.to_owned() }
    }

    /// Bounds how long opening a watch may take (see [`crate::KubeLockConfig::watch_open_timeout`]).
    pub fn with_watch_open_timeout(self, timeout: Duration) -> Self {
        KubeLock { lock: self.lock.with_timeout(timeout), ..self }
    }

    /// The lock as a shared [`RecordLock`], for code that takes any lock.
    pub fn record_lock(&self) -> Arc<dyn RecordLock> {
        Arc::new(self.clone())
    }

    /// The client this lock uses (with the candidate's `User-Agent`).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// References to the lock's objects (two for a multi-lock), with the uid and version last seen.
    pub fn object_references(&self) -> Vec<ObjectReference> {
        self.lock.references()
    }

    /// An event recorder for this candidate, using this lock's client.
    pub fn event_recorder(&self) -> EventRecorder {
        EventRecorder::new(self.client.clone(), self.identity.clone())
    }

    /// Posts client-go's leader election Events on the lock object(s) whenever `elector` starts or
    /// stops leading, with the default recorder (source component `tenure`). See [`crate::events`].
    pub fn record_events(&self, elector: &Elector) -> LeadershipEvents {
        let lock = self.clone();
        self.event_recorder().spawn(elector.subscribe(), move || lock.object_references())
    }
}

#[async_trait]
impl RecordLock for KubeLock {
    fn describe(&self) -> String {
        self.lock.describe()
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        self.lock.get().await
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.lock.create(record).await
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.lock.update(expected, record).await
    }

    fn watch(&self) -> Option<ChangeStream> {
        self.lock.watch()
    }
}
