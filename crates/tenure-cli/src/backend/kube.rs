//! `kube://NAMESPACE/KIND/NAME`: a Kubernetes lock object (Lease, Endpoints or ConfigMap
//! annotation, or a migration pair), with client-go's record and algorithm; also the sidecar's
//! Kubernetes extras (Events, the leader label, Coordinated Leader Election).

use std::fmt;
use std::sync::Arc;

use tenure::{Elector, RecordLock};
use tenure_group::store::GroupStore;
use tenure_kube::coordinated::LeaseCandidacy;
use tenure_kube::{ClusterOptions, KubeLock, KubeLockRef, LockKind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Backend, Campaign, CampaignEnd, CampaignRequest, Fut, LockUrl, LockUrlError, RecordStore, Release};
use crate::{error::CliError, pod_label};

/// A Kubernetes lock object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeBackend(pub KubeLockRef);

/// Parses `kube://NAMESPACE/KIND/NAME`.
pub(super) fn parse(_text: &str, rest: &str) -> Result<LockUrl, LockUrlError> {
    KubeLockRef::from_url(&format!("kube:{rest}"))
        .map(|reference| Arc::new(KubeBackend(reference)) as LockUrl)
        .map_err(|e| LockUrlError::BadKubeUrl(tenure::redact_credentials(&e.to_string()).into_owned()))
}

impl fmt::Display for KubeBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl KubeBackend {
    /// Connects to the lock as `identity`.
    async fn connect(&self, cluster: &ClusterOptions, identity: &str) -> Result<KubeLock, CliError> {
        let config = tenure_kube::KubeLockConfig::new(self.0.clone(), cluster.clone());
        config.connect(identity).await.map_err(|e| CliError::Connect { lock: Some(self.to_string()), source: e.into() })
    }
}

impl RecordStore for KubeBackend {
    fn open<'a>(&'a self, client: &'a str, cluster: &'a ClusterOptions) -> Fut<'a, Arc<dyn RecordLock>> {
        Box::pin(async move { Ok(self.connect(cluster, client).await?.record_lock()) })
    }
}

impl Backend for KubeBackend {
    fn record_store(&self) -> Option<&dyn RecordStore> {
        Some(self)
    }

    /// With `--coordinated` (a Lease lock only) the campaign takes part in Kubernetes'
    /// Coordinated Leader Election; every campaign records Events on the lock object, and with
    /// `--leader-label` labels its Pod while it leads.
    fn campaign<'a>(&'a self, request: CampaignRequest<'a>) -> Fut<'a, Campaign> {
        Box::pin(async move {
            let KubeLockRef { namespace, kind, name } = &self.0;
            if request.coordinated.is_some() && *kind != LockKind::Leases {
                let needs = "--coordinated needs a Lease lock (kube://NAMESPACE/leases/NAME)";
                return Err(CliError::LockCannot { needs, lock: self.to_string() });
            }
            let (identity, client) = (request.identity, |lock: &KubeLock| lock.client().clone());
            let lock = self.connect(request.cluster, identity).await?;
            let mut builder = Elector::builder(identity, lock.record_lock()).timing(request.timing);
            if request.coordinated.is_some() {
                builder = builder.coordinated();
            }
            let elector = builder.spawn().map_err(CliError::refused)?;
            let candidacy = request
                .coordinated
                .map(|versions| LeaseCandidacy::publish(client(&lock), namespace, name, identity, versions));
            let events = lock.record_events(&elector);
            let label = request.leader_label.map(|label| {
                let (namespace, pod) = pod_label::own_pod(identity, namespace);
                let pods = kube::Api::namespaced(client(&lock), &namespace);
                let stop = CancellationToken::new();
                let task = tokio::spawn(pod_label::maintain(pods, pod, label, elector.subscribe(), stop.clone()));
                (task, stop)
            });
            Ok(Campaign { elector, ending: Box::new(KubeEnding { lock, candidacy, events, label }) })
        })
    }

    fn group_store<'a>(&'a self, _: &'a str, id: &'a str, cluster: &'a ClusterOptions) -> Fut<'a, Arc<dyn GroupStore>> {
        Box::pin(async move {
            if self.0.kind != LockKind::Leases {
                return Err(CliError::NoGroupStore { lock: self.to_string() });
            }
            let client = cluster.client(id).await.map_err(|e| CliError::Connect { lock: None, source: e.into() })?;
            Ok(Arc::new(tenure_kube::KubeGroupStore::new(client, &self.0.namespace, &self.0.name))
                as Arc<dyn GroupStore>)
        })
    }

    fn nested(&self, name: &str) -> Option<LockUrl> {
        let name = format!("{}-{name}", self.0.name);
        let fits = self.0.kind == LockKind::Leases && name.len() <= 63;
        fits.then(|| Arc::new(KubeBackend(KubeLockRef { name, ..self.0.clone() })) as LockUrl)
    }

    fn namespace(&self) -> Option<&str> {
        Some(&self.0.namespace)
    }

    fn check_leader_label(&self) -> Result<(), CliError> {
        Ok(())
    }
}

/// What a Kubernetes campaign keeps for its end: the lock (whose client the extras use), the
/// published LeaseCandidate, the Events, and the leader label's task.
struct KubeEnding {
    lock: KubeLock,
    candidacy: Option<LeaseCandidacy>,
    events: tenure_kube::LeadershipEvents,
    label: Option<(JoinHandle<()>, CancellationToken)>,
}

impl CampaignEnd for KubeEnding {
    /// A coordinated candidate withdraws before the release, so that the coordinator does not
    /// name it again between its release and its exit; after the release, the label is removed
    /// (bounded) and the last Event goes out.
    fn finish<'a>(self: Box<Self>, release: Release<'a>) -> Release<'a> {
        Box::pin(async move {
            let KubeEnding { lock, candidacy, events, label } = *self;
            if let Some(candidacy) = candidacy {
                candidacy.withdraw().await;
            }
            let released = release.await;
            if let Some((mut task, stop)) = label {
                stop.cancel();
                if tokio::time::timeout(pod_label::STOP_TIMEOUT, &mut task).await.is_err() {
                    tracing::warn!("the leader label task did not stop in time");
                    task.abort();
                }
            }
            events.finish().await;
            drop(lock);
            released
        })
    }
}
