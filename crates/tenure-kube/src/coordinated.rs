//! Coordinated Leader Election (Kubernetes KEP-4355, beta since 1.33), the candidate's side.
//!
//! Why: with the `CoordinatedLeaderElection` feature, a coordinator inside the API server picks
//! the leader of a Lease among the candidates that publish a `LeaseCandidate` (strategy
//! `OldestEmulationVersion`: the lowest emulation version, then the lowest binary version, then
//! the oldest candidate), so that during a rolling upgrade the leader stays on the old version
//! until the last replica is upgraded. To move leadership it names a `preferredHolder` on the
//! Lease. client-go's candidates then stop renewing and let the lease run out (15 s at
//! defaults); Tenure's hand over gracefully: drain, then release, and the coordinator names the
//! next holder within a round trip.
//!
//! The election itself is the core's ([`tenure::ElectorBuilder::coordinated`]: take the lease only
//! when the coordinator names this candidate, hand over when it prefers another). This module
//! publishes the candidacy and keeps it alive: [`LeaseCandidacy::publish`] creates the
//! `LeaseCandidate` (named after the candidate's identity, in the Lease's namespace), answers the
//! coordinator's pings (a `pingTime` newer than the `renewTime`) at once, renews it every
//! [`RENEW_INTERVAL`] so that it is never collected as stale, re-creates it if it is deleted, and
//! [`LeaseCandidacy::withdraw`] deletes it on shutdown.
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use tenure_kube::coordinated::{CandidateVersions, LeaseCandidacy};
//! let lock = tenure_kube::KubeLock::new(client.clone(), &"kube://default/leases/my-controller".parse()?, "pod-a");
//! let elector = tenure::Elector::builder("pod-a", lock).coordinated().spawn()?;
//! let versions = CandidateVersions::new("1.31.0", "1.30.0")?;
//! let candidacy = LeaseCandidacy::publish(client, "default", "my-controller", "pod-a", versions);
//! // ... leader work while `elector.acquired()` ...
//! candidacy.withdraw().await; // first, so that the coordinator does not name this one again
//! elector.shutdown().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use k8s_openapi::api::coordination::v1beta1::{LeaseCandidate, LeaseCandidateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::resume::{Backoff, ResumableWatcher, ResumeConfig, ResumeEvent};

/// The only strategy the coordinator applies itself (and the only one Tenure takes part in).
pub const STRATEGY: &str = tenure::Candidate::COORDINATED_STRATEGY;

/// How often a candidate renews its `LeaseCandidate` unasked, as client-go does: the coordinator
/// collects candidates not renewed for 30 minutes, and pings only when it decides.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(300);

/// A version the coordinator can compare, refused here rather than by the API server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?} is not a version the coordinator can compare (MAJOR.MINOR or MAJOR.MINOR.PATCH)")]
pub struct InvalidVersion {
    /// `binaryVersion` or `emulationVersion`.
    pub field: &'static str,
    /// What was given.
    pub value: String,
}

/// What a candidate says about itself: the version of its binary and the version of the API it
/// emulates (the same unless it runs a newer binary in compatibility mode). The coordinator
/// prefers the lowest emulation version, so that a rolling upgrade keeps the old leader until the
/// last replica is upgraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateVersions {
    binary: String,
    emulation: String,
}

impl CandidateVersions {
    /// Checks both versions (`MAJOR.MINOR[.PATCH]`, optionally with a `-pre` or `+build` suffix)
    /// and that the binary is not older than what it emulates.
    pub fn new(binary: &str, emulation: &str) -> Result<Self, InvalidVersion> {
        let parse = |field: &'static str, value: &str| {
            parse_version(value).ok_or_else(|| InvalidVersion { field, value: value.to_owned() })
        };
        let (b, e) = (parse("binaryVersion", binary)?, parse("emulationVersion", emulation)?);
        if b < e {
            return Err(InvalidVersion { field: "emulationVersion", value: format!("{emulation} (newer than {binary})") });
        }
        Ok(CandidateVersions { binary: binary.to_owned(), emulation: emulation.to_owned() })
    }

    /// The binary version.
    pub fn binary(&self) -> &str {
        &self.binary
    }

    /// The emulation version.
    pub fn emulation(&self) -> &str {
        &self.emulation
    }
}

/// `MAJOR.MINOR[.PATCH]` with an optional `-pre`/`+build` suffix, as numbers to compare.
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.strip_prefix('v').unwrap_or(text).split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    let patch = parts.next().unwrap_or(Some(0))?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// A published candidacy, kept alive by a background task until [`LeaseCandidacy::withdraw`].
///
/// Withdraw before the elector's shutdown: a candidacy still published when the lease is released
/// may be named again by the coordinator, and the lease then waits for a holder that is leaving.
pub struct LeaseCandidacy {
    api: Api<LeaseCandidate>,
    name: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl LeaseCandidacy {
    /// Publishes `identity` as a candidate for the Lease `lease_name` in `namespace` and keeps the
    /// candidacy alive in the background (on the current tokio runtime). Failures are logged and
    /// retried with back-off; the elector never waits for them (without a candidacy the
    /// coordinator simply never names this instance).
    pub fn publish(
        client: kube::Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
        versions: CandidateVersions,
    ) -> LeaseCandidacy {
        let api: Api<LeaseCandidate> = Api::namespaced(client, namespace);
        let (stop, stopped) = oneshot::channel();
        let keeper = Keeper { api: api.clone(), name: identity.to_owned(), lease_name: lease_name.to_owned(), versions };
        let task = tokio::spawn(keeper.run(stopped));
        LeaseCandidacy { api, name: identity.to_owned(), stop: Some(stop), task }
    }

    /// Stops keeping the candidacy and deletes the `LeaseCandidate`, so the coordinator stops
    /// considering this instance at once. A failed deletion is logged: the coordinator collects
    /// the candidate once it stops answering.
    pub async fn withdraw(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(candidate = %self.name, "withdrew the lease candidacy"),
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(error) => tracing::warn!(candidate = %self.name, %error, "could not delete the lease candidate"),
        }
    }
}

impl Drop for LeaseCandidacy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The background task's state.
struct Keeper {
    api: Api<LeaseCandidate>,
    name: String,
    lease_name: String,
    versions: CandidateVersions,
}

impl Keeper {
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        let backoff = Backoff::default();
        let mut failures = 0;
        // Published once; then renewed whenever pinged, deleted, or due.
        let mut due = tokio::time::Instant::now();
        let config = ResumeConfig::default().fields(&format!("metadata.name={}", self.name));
        let mut watcher = match ResumableWatcher::new(self.api.clone(), config, None) {
            Ok(watcher) => watcher,
            Err(error) => {
                tracing::error!(candidate = %self.name, %error, "cannot watch the lease candidate");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep_until(due) => {
                    due = match self.publish_or_renew().await {
                        Ok(()) => {
                            failures = 0;
                            tokio::time::Instant::now() + RENEW_INTERVAL
                        }
                        Err(error) => {
                            failures += 1;
                            let delay = backoff.delay(failures);
                            tracing::warn!(candidate = %self.name, %error, retry_in = ?delay, "could not publish the lease candidate");
                            tokio::time::Instant::now() + delay
                        }
                    };
                }
                event = watcher.next_event() => {
                    let needs_renew = match event {
                        Ok(ResumeEvent::Applied(candidate)) => is_pinged(&candidate),
                        Ok(ResumeEvent::Listed { objects, .. }) => objects.iter().any(is_pinged) || objects.is_empty(),
                        // Deleted (collected as stale, or by hand): publish again.
                        Ok(ResumeEvent::Deleted(_)) => true,
                        Ok(ResumeEvent::Progress(_)) => false,
                        Err(error) => {
                            tracing::warn!(candidate = %self.name, %error, "watching the lease candidate failed");
                            false
                        }
                    };
                    if needs_renew {
                        due = tokio::time::Instant::now();
                    }
                }
            }
        }
    }

    /// Creates the candidate, or brings an existing one (an earlier run's) up to date, with a
    /// fresh `renewTime`; a merge patch, so the coordinator's `pingTime` is never overwritten.
    async fn publish_or_renew(&self) -> Result<(), kube::Error> {
        let spec = LeaseCandidateSpec {
            lease_name: self.lease_name.clone(),
            binary_version: self.versions.binary.clone(),
            emulation_version: Some(self.versions.emulation.clone()),
            strategy: STRATEGY.to_owned(),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ping_time: None,
        };
        // `pingTime` is `None`, which the spec leaves out of the patch.
        let patch = serde_json::json!({ "spec": &spec });
        match self.api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => {
                let metadata = ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() };
                let candidate = LeaseCandidate { metadata, spec: Some(spec) };
                self.api.create(&PostParams::default(), &candidate).await?;
                tracing::info!(
                    candidate = %self.name,
                    lease = %self.lease_name,
                    binary_version = %self.versions.binary,
                    emulation_version = %self.versions.emulation,
                    "published the lease candidacy"
                );
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

/// True when the coordinator pinged the candidate after its last renew.
fn is_pinged(candidate: &LeaseCandidate) -> bool {
    let Some(spec) = &candidate.spec else { return false };
    match (&spec.ping_time, &spec.renew_time) {
        (Some(ping), Some(renew)) => ping.0 > renew.0,
        (Some(_), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_checked_before_they_reach_the_coordinator() {
        assert!(CandidateVersions::new("1.31.0", "1.30.0").is_ok());
        assert!(CandidateVersions::new("1.1", "1.1").is_ok());
        assert!(CandidateVersions::new("v1.2.3-rc.1+abc", "1.2").is_ok());
        for bad in ["", "1", "1.x", "1.2.3.4", "one.two"] {
            assert!(CandidateVersions::new(bad, "1.0").is_err(), "{bad:?}");
        }
        let newer = CandidateVersions::new("1.0", "1.1").unwrap_err();
        assert_eq!(newer.field, "emulationVersion");
    }

    #[test]
    fn a_ping_newer_than_the_renew_asks_for_an_answer() {
        let at = |s: i64| Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
        let candidate = |ping, renew| LeaseCandidate {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseCandidateSpec { ping_time: ping, renew_time: renew, ..LeaseCandidateSpec::default() }),
        };
        assert!(is_pinged(&candidate(at(10), at(5))));
        assert!(!is_pinged(&candidate(at(5), at(10))));
        assert!(!is_pinged(&candidate(None, at(10))));
        assert!(is_pinged(&candidate(at(1), None)));
    }
}
