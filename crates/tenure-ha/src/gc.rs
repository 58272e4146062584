//! Orphan garbage collection that only the leader runs.
//!
//! The seed's first problem: a controller that dies between creating an external resource (a
//! Neutron port) and annotating the Kubernetes object with it leaves an orphan; the next leader
//! creates the resource again. A [`GarbageCollector`] lists the external resources, asks the
//! user what is referenced, and deletes what nothing references, with the rules that keep it from
//! deleting anything in use:
//!
//! - **grace**: nothing is deleted that is younger than the grace period, so an in-flight create
//!   (created, not yet annotated) is never an orphan. Age is measured on this process's monotonic
//!   clock from the first pass that saw the resource unreferenced (a remote creation timestamp is
//!   never compared with the local clock to shorten it, invariant S3; it can only delay);
//! - **two passes** (Kuryr's rule): a resource is deleted only if two passes at least
//!   `confirm_after` apart both saw it unreferenced; a pass that sees it referenced starts over;
//! - **fenced**: [`Tenure::check`] before each delete, and the term passed to the delete;
//! - **bounded**: at most `max_deletions_per_pass` per pass; a dry-run mode only reports;
//! - **safe on errors**: a pass whose lister fails deletes nothing and is counted as skipped.
//!
//! Order within a pass: list first, then read the references; a resource created and referenced
//! in between is seen as referenced.
//!
//! # The intent-record pattern
//!
//! The grace period covers a create that is slow; it cannot tell a crash between "create" and
//! "annotate" from a live create. Crossplane's answer, offered here as a pattern: before creating
//! the external resource, record the intent on the owning object (e.g. an annotation
//! `example.com/create-pending: <term>`), then create it (tagged with the owner's id), then replace
//! the intent with the result. Return the pending owners' resources as referenced while the intent
//! is younger than the grace period; a pending mark written by an older term, whose resource is
//! missing, means the old leader crashed mid-create: create again, and the collector removes any
//! duplicate the crashed create left (it carries the owner tag but is not the annotated one).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tenure::{Tenure, Term};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::GcMetrics;

/// One external resource as the lister reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalResource {
    /// The id the references name and [`ExternalResources::delete`] takes.
    pub id: String,
    /// When the external system says it was created, if it says so. Only ever delays deletion.
    pub created: Option<SystemTime>,
    /// A tag saying who created it (a cluster, a controller); see [`GcBuilder::owner`].
    pub owner: Option<String>,
}

impl ExternalResource {
    /// A resource with an id only.
    pub fn new(id: impl Into<String>) -> ExternalResource {
        ExternalResource { id: id.into(), created: None, owner: None }
    }
}

/// How to list and delete the external resources (the user's side).
#[async_trait]
pub trait ExternalResources: Send + Sync + 'static {
    /// Every resource that might be an orphan. An error skips the pass (nothing is deleted).
    async fn list(&self) -> Result<Vec<ExternalResource>, String>;

    /// Deletes `id`. `term` is the collector's fencing term: pass it on where the external system
    /// can compare it, so that a deposed leader's late delete is refused.
    async fn delete(&self, id: &str, term: Term) -> Result<(), String>;
}

/// What the runtime is given to tell what is in use: the ids referenced now (from a reflector
/// cache, annotations, a database).
pub type ReferencedFn = Arc<dyn Fn() -> HashSet<String> + Send + Sync>;

/// What one pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Why the pass was skipped (the lister failed, or this replica does not lead): nothing was
    /// deleted.
    pub skipped: Option<String>,
    /// Resources listed.
    pub listed: usize,
    /// Unreferenced resources being watched (not yet old enough, or seen in one pass only).
    pub pending: usize,
    /// Orphans found: unreferenced in two passes far enough apart and past the grace period.
    pub orphans: Vec<String>,
    /// Orphans deleted in this pass.
    pub deleted: Vec<String>,
    /// Orphans a dry run would have deleted.
    pub would_delete: Vec<String>,
    /// Orphans left for a later pass by the per-pass limit.
    pub deferred: usize,
    /// Deletions that failed, with the error.
    pub failed: Vec<(String, String)>,
    /// True if the tenure ended during the pass and the remaining deletions were not attempted.
    pub stopped_by_tenure_end: bool,
}

/// Builds a [`GarbageCollector`].
#[must_use = "a garbage collector collects nothing until it is built"]
pub struct GcBuilder {
    resources: Arc<dyn ExternalResources>,
    referenced: ReferencedFn,
    grace: Duration,
    confirm_after: Duration,
    max_deletions_per_pass: usize,
    dry_run: bool,
    owner: Option<String>,
    metrics: GcMetrics,
}

impl GcBuilder {
    setters! {
        /// Resources younger than this are never deleted. Default: 5 min.
        grace: Duration;
        /// The least time between the two passes that must both see a resource unreferenced.
        /// Default: 1 min.
        confirm_after: Duration;
        /// At most this many deletions per pass (the rest waits for the next pass). Default: 100.
        max_deletions_per_pass: usize;
        /// Report what would be deleted, delete nothing. Default: off.
        dry_run: bool;
        /// Only resources tagged with this owner are ever deleted (untagged and foreign ones are
        /// left alone). Default: every listed resource may be collected.
        owner: impl Into<String> => Some(owner.into());
        /// Reports into these metrics (e.g. from [`GcMetrics::register`]).
        metrics: GcMetrics;
    }

    /// The collector.
    pub fn build(self) -> GarbageCollector {
        GarbageCollector { config: Arc::new(self), seen: Arc::default(), trigger: Arc::new(Notify::new()) }
    }
}

/// When a resource was first seen unreferenced, and by how many passes since.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    since: Instant,
    passes: u32,
}

/// Deletes external resources that nothing references; run it only while leading (inside a
/// [`crate::gate::Gate`]'s work).
///
/// ```
/// # async fn f(tenure: tenure::Tenure) {
/// use std::{collections::HashSet, sync::Arc, time::Duration};
/// use async_trait::async_trait;
/// use tenure::Term;
/// use tenure_ha::gc::{ExternalResource, ExternalResources, GarbageCollector};
///
/// struct Ports;
/// #[async_trait]
/// impl ExternalResources for Ports {
///     async fn list(&self) -> Result<Vec<ExternalResource>, String> {
///         Ok(vec![ExternalResource::new("port-1")])    // ask the cloud
///     }
///     async fn delete(&self, id: &str, term: Term) -> Result<(), String> {
///         Ok(())                                        // delete it, passing `term` along
///     }
/// }
/// let referenced = || HashSet::from(["port-1".to_owned()]);   // e.g. from Pod annotations
/// let gc = GarbageCollector::builder(Ports, referenced).grace(Duration::from_secs(300)).build();
/// let report = gc.pass(&tenure).await;
/// assert!(report.deleted.is_empty());
/// # }
/// ```
#[derive(Clone)]
pub struct GarbageCollector {
    config: Arc<GcBuilder>,
    seen: Arc<Mutex<HashMap<String, Sighting>>>,
    trigger: Arc<Notify>,
}

/// Asks a running collector for a pass at once (e.g. after a relist); cloneable.
#[derive(Clone)]
pub struct GcTrigger(Arc<Notify>);

impl GcTrigger {
    /// Runs a pass as soon as the collector's loop can (one request is remembered if it is busy).
    pub fn run_now(&self) {
        self.0.notify_one();
    }
}

impl GarbageCollector {
    /// A collector of `resources`, with `referenced` telling what is in use.
    pub fn builder(
        resources: impl ExternalResources,
        referenced: impl Fn() -> HashSet<String> + Send + Sync + 'static,
    ) -> GcBuilder {
        GcBuilder {
            resources: Arc::new(resources),
            referenced: Arc::new(referenced),
            grace: Duration::from_secs(300),
            confirm_after: Duration::from_secs(60),
            max_deletions_per_pass: 100,
            dry_run: false,
            owner: None,
            metrics: GcMetrics::default(),
        }
    }

    /// A handle that makes [`GarbageCollector::run`] do a pass at once.
    pub fn trigger(&self) -> GcTrigger {
        GcTrigger(self.trigger.clone())
    }

    /// The collector's metrics.
    pub fn metrics(&self) -> &GcMetrics {
        &self.config.metrics
    }

    /// Runs a pass now, then one every `period` and whenever triggered, until `cancel` is
    /// cancelled or the tenure ends.
    pub async fn run(&self, tenure: &Tenure, cancel: &CancellationToken, period: Duration) {
        while !cancel.is_cancelled() && tenure.is_valid() {
            let report = self.pass(tenure).await;
            if !report.deleted.is_empty() || !report.failed.is_empty() || report.skipped.is_some() {
                tracing::info!(?report, "garbage collection pass");
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.trigger.notified() => {}
                _ = cancel.cancelled() => return,
                _ = tenure.ended() => return,
            }
        }
    }

    /// One pass: list, compare with the references, delete confirmed orphans (fenced by `tenure`).
    pub async fn pass(&self, tenure: &Tenure) -> PassReport {
        let config = &self.config;
        let metrics = &config.metrics;
        let mut report = PassReport::default();
        if let Err(not_leader) = tenure.check() {
            report.skipped = Some(not_leader.to_string());
            return report;
        }
        let listed = match config.resources.list().await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "listing external resources failed; skipping this garbage collection pass");
                metrics.skipped_passes.inc();
                report.skipped = Some(format!("listing failed: {error}"));
                return report;
            }
        };
        let referenced = (config.referenced)();
        let now = Instant::now();
        let wall_now = SystemTime::now();
        report.listed = listed.len();
        let mut orphans: Vec<(Instant, String)> = Vec::new();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let listed_ids: HashSet<&str> = listed.iter().map(|r| r.id.as_str()).collect();
            seen.retain(|id, _| listed_ids.contains(id.as_str()));
            for resource in &listed {
                let ours = config.owner.as_ref().is_none_or(|owner| resource.owner.as_ref() == Some(owner));
                if !ours || referenced.contains(&resource.id) {
                    seen.remove(&resource.id);
                    continue;
                }
                let sighting = seen.entry(resource.id.clone()).or_insert(Sighting { since: now, passes: 0 });
                sighting.passes += 1;
                let watched = now.duration_since(sighting.since);
                // A creation time from the remote side can only make it younger, never older.
                let remote_age = resource.created.map(|c| wall_now.duration_since(c).unwrap_or(Duration::ZERO));
                let old_enough = watched >= config.grace && remote_age.is_none_or(|age| age >= config.grace);
                let confirmed = sighting.passes >= 2 && watched >= config.confirm_after;
                if old_enough && confirmed {
                    orphans.push((sighting.since, resource.id.clone()));
                } else {
                    report.pending += 1;
                }
            }
        }
        orphans.sort();
        report.orphans = orphans.iter().map(|(_, id)| id.clone()).collect();
        metrics.orphans_found.inc_by(orphans.len() as u64);
        report.deferred = orphans.len().saturating_sub(config.max_deletions_per_pass);
        for (_, id) in orphans.into_iter().take(config.max_deletions_per_pass) {
            if config.dry_run {
                report.would_delete.push(id);
                continue;
            }
            let Ok(term) = tenure.check() else {
                report.stopped_by_tenure_end = true;
                break;
            };
            match config.resources.delete(&id, term).await {
                Ok(()) => {
                    metrics.orphans_deleted.inc();
                    self.seen.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                    report.deleted.push(id);
                }
                Err(error) => {
                    tracing::warn!(id = %id, %error, "deleting an orphan failed; retrying next pass");
                    metrics.delete_failures.inc();
                    report.failed.push((id, error));
                }
            }
        }
        metrics.passes.inc();
        report
    }
}
