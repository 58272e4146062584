//! [`KubeLock`]: the lock a `kube://NAMESPACE/KIND/NAME` URL names, whatever its kind, as one type.
//!
//! Why one type: the CLI and programs choose the kind at run time from a URL, and need both a
//! [`RecordLock`] for the elector and the lock objects for Events; an enum over the five kinds
//! gives them that without generics.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, ObjectReference};
use tenure::{ChangeStream, Elector, LeaderElectionRecord, LockError, RecordLock, StoredRecord, Version};

use crate::config::{KubeLockRef, LockKind};
use crate::events::{EventRecorder, LeadershipEvents};
use crate::multilock::MultiLock;
use crate::object::ObjectLock;

#[derive(Clone)]
enum Kind {
    Leases(ObjectLock<Lease>),
    Endpoints(ObjectLock<Endpoints>),
    ConfigMaps(ObjectLock<ConfigMap>),
    EndpointsLeases(MultiLock<Endpoints>),
    ConfigMapsLeases(MultiLock<ConfigMap>),
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
    kind: Kind,
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
        let kind = match reference.kind {
            LockKind::Leases => Kind::Leases(lease()),
            LockKind::Endpoints => Kind::Endpoints(ObjectLock::new(client.clone(), namespace, name)),
            LockKind::ConfigMaps => Kind::ConfigMaps(ObjectLock::new(client.clone(), namespace, name)),
            LockKind::EndpointsLeases => {
                Kind::EndpointsLeases(MultiLock::new(ObjectLock::new(client.clone(), namespace, name), lease()))
            }
            LockKind::ConfigMapsLeases => {
                Kind::ConfigMapsLeases(MultiLock::new(ObjectLock::new(client.clone(), namespace, name), lease()))
            }
        };
        KubeLock { kind, client, identity: identity.to_owned() }
    }

    /// Bounds how long opening a watch may take (see [`crate::KubeLockConfig::watch_open_timeout`]).
    pub fn with_watch_open_timeout(self, timeout: Duration) -> Self {
        let kind = match self.kind {
            Kind::Leases(l) => Kind::Leases(l.with_watch_open_timeout(timeout)),
            Kind::Endpoints(l) => Kind::Endpoints(l.with_watch_open_timeout(timeout)),
            Kind::ConfigMaps(l) => Kind::ConfigMaps(l.with_watch_open_timeout(timeout)),
            Kind::EndpointsLeases(l) => Kind::EndpointsLeases(l.with_watch_open_timeout(timeout)),
            Kind::ConfigMapsLeases(l) => Kind::ConfigMapsLeases(l.with_watch_open_timeout(timeout)),
        };
        KubeLock { kind, ..self }
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
        match &self.kind {
            Kind::Leases(l) => vec![l.object_reference()],
            Kind::Endpoints(l) => vec![l.object_reference()],
            Kind::ConfigMaps(l) => vec![l.object_reference()],
            Kind::EndpointsLeases(l) => l.object_references(),
            Kind::ConfigMapsLeases(l) => l.object_references(),
        }
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

    fn inner(&self) -> &dyn RecordLock {
        match &self.kind {
            Kind::Leases(l) => l,
            Kind::Endpoints(l) => l,
            Kind::ConfigMaps(l) => l,
            Kind::EndpointsLeases(l) => l,
            Kind::ConfigMapsLeases(l) => l,
        }
    }
}

#[async_trait]
impl RecordLock for KubeLock {
    fn describe(&self) -> String {
        self.inner().describe()
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        self.inner().get().await
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.inner().create(record).await
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        self.inner().update(expected, record).await
    }

    fn watch(&self) -> Option<ChangeStream> {
        self.inner().watch()
    }
}
