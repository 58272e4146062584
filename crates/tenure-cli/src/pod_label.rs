//! `--leader-label`: a label on this candidate's own Pod while it leads, so that a Service selector or
//! `kubectl get pods -l KEY=VALUE` finds the leader.
//!
//! Why advisory only: the label is written after leadership is gained and removed after it is lost,
//! through API calls that can fail or be late, so for a moment two pods (or none) may carry it. It is
//! for routing and for people; fencing is the term, not the label.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;
use tenure::Leadership;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long to wait before retrying a failed label write, doubling up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(5);
/// How long the final removal may take at exit.
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(2);

/// A parsed `--leader-label KEY[=VALUE]` (the value defaults to `true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderLabel {
    /// The label key, with an optional DNS-subdomain prefix (`example.com/leader`).
    pub key: String,
    /// The label value.
    pub value: String,
}

fn is_label_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Parses `KEY[=VALUE]` with Kubernetes' label syntax, for clap.
pub fn parse_leader_label(text: &str) -> Result<LeaderLabel, String> {
    let (key, value) = text.split_once('=').unwrap_or((text, "true"));
    let name = match key.split_once('/') {
        Some((prefix, name)) if is_dns_subdomain(prefix) => name,
        Some(_) => return Err(format!("label key {key:?}: the prefix before '/' must be a DNS subdomain")),
        None => key,
    };
    if !is_label_name(name) {
        return Err(format!(
            "label key {key:?}: the name must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    if !value.is_empty() && !is_label_name(value) {
        return Err(format!(
            "label value {value:?}: must be empty or 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric"
        ));
    }
    Ok(LeaderLabel { key: key.to_owned(), value: value.to_owned() })
}

/// The Pod this process runs in: `POD_NAMESPACE`/`POD_NAME` (downward API), else the service
/// account's namespace file (else `fallback_namespace`, the lock's) and the identity (which
/// defaults to the host name, i.e. the pod name).
pub fn own_pod(identity: &str, fallback_namespace: &str) -> (String, String) {
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_owned())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| fallback_namespace.to_owned());
    let name = std::env::var("POD_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| identity.to_owned());
    (namespace, name)
}

/// Keeps the label on the Pod exactly while `leadership` says this instance leads, until `stop`;
/// then removes it if it may have been set. Failures are logged and retried with back-off; they
/// never touch the election, and a write that hangs never delays `stop`.
pub async fn maintain(
    pods: Api<Pod>,
    pod: String,
    label: LeaderLabel,
    mut leadership: watch::Receiver<Leadership>,
    stop: CancellationToken,
) {
    // Whether the label may be on the Pod: set before a write that adds it is sent (its reply may
    // be lost while the write took effect), cleared only by a confirmed removal.
    let mut maybe_labelled = false;
    let mut labelled = false;
    let backoff = tenure::Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut failures = 0;
    loop {
        let wanted = leadership.borrow_and_update().is_leader();
        if wanted != labelled || (!wanted && maybe_labelled) {
            maybe_labelled |= wanted;
            let written = tokio::select! {
                written = write(&pods, &pod, &label, wanted) => written,
                _ = stop.cancelled() => break,
            };
            match written {
                Ok(()) => {
                    labelled = wanted;
                    maybe_labelled = wanted;
                    failures = 0;
                    tracing::info!(pod, label = %label.key, set = wanted, "leader label updated");
                }
                Err(error) => {
                    failures += 1;
                    let retry = backoff.delay(failures);
                    tracing::warn!(pod, label = %label.key, %error, retry_in = ?retry, "cannot update the leader label");
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = stop.cancelled() => break,
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            changed = leadership.changed() => if changed.is_err() { break },
            _ = stop.cancelled() => break,
        }
    }
    if maybe_labelled {
        match tokio::time::timeout(REMOVAL_TIMEOUT, write(&pods, &pod, &label, false)).await {
            Ok(Ok(())) => tracing::info!(pod, label = %label.key, "leader label removed"),
            Ok(Err(error)) => tracing::warn!(pod, %error, "cannot remove the leader label"),
            Err(_) => tracing::warn!(pod, "timed out removing the leader label"),
        }
    }
}

/// The longest [`maintain`] takes to finish once stopped: the final removal and a margin.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(3);

async fn write(pods: &Api<Pod>, pod: &str, label: &LeaderLabel, set: bool) -> Result<(), kube::Error> {
    let value = if set { json!(label.value) } else { json!(null) };
    let patch = json!({"metadata": {"labels": {label.key.clone(): value}}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(patch)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::{Role, Term};
    use tenure_apiserver::{ApiServer, ApiServerConfig, FaultScope, InjectedFault, Verb};

    fn leading(role: Role) -> Leadership {
        Leadership { leader: Some("p".into()), term: Some(Term(1)), role }
    }

    async fn cluster() -> (ApiServer, Api<Pod>) {
        let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
        crate::select_crypto_provider(); // as main does (two providers with the feature zk-tls)
        let mut config = kube::Config::new(server.url().parse().unwrap());
        config.headers.push((http::header::USER_AGENT, "label-test".parse().unwrap()));
        let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        pods.create(&Default::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
        (server, pods)
    }

    async fn labels(pods: &Api<Pod>) -> Option<String> {
        pods.get("p").await.unwrap().metadata.labels.and_then(|l| l.get("leader").cloned())
    }

    #[tokio::test]
    async fn the_label_follows_leadership_and_is_removed_at_stop() {
        let (_server, pods) = cluster().await;
        let (leadership, receiver) = watch::channel(leading(Role::Follower));
        let stop = CancellationToken::new();
        let label = parse_leader_label("leader").unwrap();
        let task = tokio::spawn(maintain(pods.clone(), "p".into(), label, receiver, stop.clone()));
        leadership.send_replace(leading(Role::Leader));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while labels(&pods).await.as_deref() != Some("true") {
            assert!(tokio::time::Instant::now() < deadline, "the label was not set");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
        assert_eq!(labels(&pods).await, None, "removed at stop");
    }

    #[tokio::test]
    async fn a_hanging_label_write_never_delays_the_stop() {
        let (server, pods) = cluster().await;
        server.faults().inject(
            FaultScope { client: Some("label-test".into()), verbs: vec![Verb::Patch], times: None },
            InjectedFault::Hang,
        );
        let (_leadership, receiver) = watch::channel(leading(Role::Leader));
        let stop = CancellationToken::new();
        let task =
            tokio::spawn(maintain(pods, "p".into(), parse_leader_label("leader").unwrap(), receiver, stop.clone()));
        while server.faults().request_count("label-test", Verb::Patch) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        tokio::time::timeout(STOP_TIMEOUT, task).await.expect("stopped within the bound").unwrap();
    }

    #[test]
    fn label_syntax_is_kubernetes_syntax() {
        assert_eq!(parse_leader_label("leader"), Ok(LeaderLabel { key: "leader".into(), value: "true".into() }));
        assert_eq!(
            parse_leader_label("example.com/role=leader"),
            Ok(LeaderLabel { key: "example.com/role".into(), value: "leader".into() })
        );
        assert!(parse_leader_label("leader=").is_ok());
        for bad in ["", "-x", "x-", "Bad_Prefix/x", "a/b/c", "x=has space", "x=-v"] {
            assert!(parse_leader_label(bad).is_err(), "{bad}");
        }
    }
}
