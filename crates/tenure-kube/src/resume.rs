//! A watch that resumes from a saved `resourceVersion`, for controllers that hand over between
//! leaders.
//!
//! Why it exists: a standby that takes over must learn what changed while nobody was watching,
//! and kube-runtime's `watcher` always starts with a fresh list (kube-rs issue 1419): a Pod deleted
//! while nobody led is then simply absent from the list, and the new leader never learns that it
//! has to release what the Pod held. Resuming the watch from the version the previous leader had
//! processed (its checkpoint) makes the API server replay every change since, deletions included,
//! and costs in proportion to the changes missed instead of to the number of objects.
//!
//! The server keeps only a window of changes (a real API server's watch cache holds about 75 s of
//! them). A resume from an older version is refused with `410 Gone`/`Expired`, either as the
//! watch request's HTTP status or as an `ERROR` event in the stream; the watcher then lists afresh
//! and says so with [`ListCause::Expired`], so the caller can count it and run a garbage collection
//! pass. **Objects deleted while away are not reported as [`ResumeEvent::Deleted`] after such a
//! relist**: they are merely missing from [`ResumeEvent::Listed`], so whatever the caller keeps for
//! them outside Kubernetes must be found by comparing it with the list (the garbage collection).
//!
//! The module depends only on `kube`'s `Api`, so it could be offered upstream as is.
//!
//! ```no_run
//! # async fn f(client: kube::Client, saved: Option<String>) -> Result<(), tenure_kube::ResumeError> {
//! use k8s_openapi::api::core::v1::Pod;
//! use kube::Api;
//! use tenure_kube::resume::{ResumableWatcher, ResumeConfig, ResumeEvent};
//!
//! let pods: Api<Pod> = Api::namespaced(client, "default");
//! let mut watcher = ResumableWatcher::new(pods, ResumeConfig::default().labels("app=web"), saved)?;
//! loop {
//!     match watcher.next_event().await {
//!         Ok(ResumeEvent::Applied(pod)) => { /* reconcile */ }
//!         Ok(ResumeEvent::Deleted(pod)) => { /* release what the Pod held */ }
//!         Ok(ResumeEvent::Listed { objects, cause, .. }) => {
//!             if cause.resume_failed() { /* count it, collect garbage against `objects` */ }
//!         }
//!         Ok(ResumeEvent::Progress(_)) => {}
//!         Err(error) => tracing::warn!(%error, "watch failed; retrying with back-off"),
//!     }
//!     // Everything up to here is processed: this is the checkpoint to save.
//!     let checkpoint = watcher.last_delivered_version();
//! }
//! # }
//! ```

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::Status;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

/// What the watcher delivers, in the order the server committed it.
#[derive(Debug, Clone)]
pub enum ResumeEvent<K> {
    /// The object was created or changed (or entered the selectors).
    Applied(K),
    /// The object was deleted (or left the selectors); the last state it had.
    Deleted(K),
    /// A bookmark: every change up to this version has been delivered, none is pending. Saving it
    /// keeps a quiet watcher's checkpoint inside the server's event window.
    Progress(String),
    /// A complete list of the objects, consistent at `version`; what was delivered before it no
    /// longer describes the state.
    Listed {
        /// Every object that passes the selectors.
        objects: Vec<K>,
        /// The version the list is consistent at; the watch continues from it.
        version: String,
        /// Why a list was needed: the first start, or a resume that failed.
        cause: ListCause,
    },
}

impl<K: Resource> ResumeEvent<K> {
    /// The version this event brings the watcher to: what to checkpoint once the event is processed.
    pub fn resource_version(&self) -> Option<String> {
        match self {
            ResumeEvent::Applied(object) | ResumeEvent::Deleted(object) => object.resource_version(),
            ResumeEvent::Progress(version) | ResumeEvent::Listed { version, .. } => Some(version.clone()),
        }
    }
}

/// Why the watcher listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListCause {
    /// There was no saved version to resume from.
    Initial,
    /// The server no longer keeps the changes after `requested` (`410 Gone`/`Expired`): changes
    /// were lost, deletions among them, and the caller should collect garbage.
    Expired {
        /// The version the watcher tried to resume from.
        requested: String,
    },
    /// The server refused `requested` as a resourceVersion (`400 Bad Request`, e.g. a checkpoint
    /// written by something else): treated as absent, and as lossy as an expiry.
    Invalid {
        /// The version the watcher tried to resume from.
        requested: String,
    },
}

impl ListCause {
    /// Whether a resume from a saved version failed, so that changes may have been missed.
    pub fn resume_failed(&self) -> bool {
        !matches!(self, ListCause::Initial)
    }
}

/// Why the watcher could not deliver an event this time; it retries after a back-off.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The list request failed.
    #[error("listing failed: {0}")]
    List(#[source] kube::Error),
    /// The server answered a list without the resourceVersion a watch could start from.
    #[error("the list carries no resourceVersion to watch from")]
    ListWithoutVersion,
    /// The watch request failed, or its stream broke.
    #[error("watching failed: {0}")]
    Watch(#[source] kube::Error),
    /// The configured watch timeout is outside 1..=294 s: zero would make the server end each
    /// watch at once (a busy loop of requests), and kube refuses 295 s and more.
    #[error("the watch timeout must be 1 to 294 seconds, not {0}")]
    InvalidTimeout(u32),
    /// The server sent an `ERROR` event other than an expiry.
    #[error("the server ended the watch with an error: {0}")]
    ErrorEvent(#[source] Box<Status>),
}

/// How long to wait before retrying after consecutive failures: the project's one back-off,
/// re-exported where resumable watches' users find it.
pub use tenure::Backoff;

/// What to watch and how; the same selectors apply to the list and to the watch.
#[derive(Debug, Clone)]
pub struct ResumeConfig {
    /// Only objects with these labels (`app=web,tier!=db`).
    pub label_selector: Option<String>,
    /// Only objects with these fields (`spec.nodeName=n1`).
    pub field_selector: Option<String>,
    /// How long each watch request lasts (`timeoutSeconds`) before it is re-opened from the last
    /// delivered version; kube's limit of 295 s applies.
    pub timeout_seconds: u32,
    /// Ask for bookmarks, so that a quiet watch's version keeps up with the server's.
    pub bookmarks: bool,
    /// List in pages of this many objects (`None`: one request).
    pub page_size: Option<u32>,
    /// The wait between retries.
    pub backoff: Backoff,
}

impl Default for ResumeConfig {
    /// All objects, watches of 290 s (kube's default), bookmarks, pages of 500, default back-off.
    fn default() -> Self {
        ResumeConfig {
            label_selector: None,
            field_selector: None,
            timeout_seconds: 290,
            bookmarks: true,
            page_size: Some(500),
            backoff: Backoff::default(),
        }
    }
}

impl ResumeConfig {
    /// Only objects with these labels.
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_string());
        self
    }

    /// Only objects with these fields.
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_string());
        self
    }

    /// Each watch request lasts this many seconds.
    #[must_use]
    pub fn timeout_seconds(mut self, seconds: u32) -> Self {
        self.timeout_seconds = seconds;
        self
    }

    /// This back-off between retries.
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    fn list_params(&self) -> ListParams {
        let (label_selector, field_selector) = (self.label_selector.clone(), self.field_selector.clone());
        ListParams { label_selector, field_selector, limit: self.page_size, ..ListParams::default() }
    }

    fn watch_params(&self) -> WatchParams {
        let (label_selector, field_selector) = (self.label_selector.clone(), self.field_selector.clone());
        let timed = WatchParams::default().timeout(self.timeout_seconds);
        WatchParams { label_selector, field_selector, bookmarks: self.bookmarks, ..timed }
    }
}

/// Counts of what the watcher did, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeStats {
    /// Complete lists made (each may take several pages).
    pub lists: u64,
    /// Objects received in lists.
    pub objects_listed: u64,
    /// Watch requests opened.
    pub watches: u64,
    /// Applied and Deleted events received from watches.
    pub changes: u64,
    /// Resumes the server refused (expired or invalid version), each followed by a list.
    pub failed_resumes: u64,
    /// Errors returned to the caller.
    pub errors: u64,
}

enum Phase<K> {
    List(ListCause),
    OpenWatch,
    Watching(BoxStream<'static, kube::Result<WatchEvent<K>>>),
}

/// What one watch stream item means to the watcher.
enum Step<K> {
    Deliver(ResumeEvent<K>),
    Relist(ListCause),
    Fail(ResumeError),
}

/// A list-then-watch (or resume-then-watch) loop over one resource type that delivers every
/// change once, in order, and knows the last version it delivered.
///
/// [`ResumableWatcher::next_event`] is cancel-safe: dropping its future (in a `select!`) loses no
/// event, so the watcher can be stopped the moment leadership ends and the checkpoint is exactly
/// [`ResumableWatcher::last_delivered_version`].
pub struct ResumableWatcher<K> {
    api: Api<K>,
    config: ResumeConfig,
    version: Option<String>,
    phase: Phase<K>,
    failures: u32,
    /// A list was delivered and no watch from its version has delivered anything yet: a refusal
    /// now is the server refusing its own version, and relisting at once would loop.
    unconfirmed_list: bool,
    retry_at: Option<Instant>,
    stats: ResumeStats,
}

/// Why a server refused to watch from a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `410 Gone`/`Expired`: older than the server keeps.
    Expired,
    /// Not a version of this server: unparseable (`400`/`422`), or newer than it has
    /// (`504 Too large resource version`, a checkpoint from another cluster).
    Invalid,
}

/// Whether a watch error is the server refusing the start version, and how.
fn refusal(response: &Status) -> Option<Refusal> {
    let message = response.message.to_ascii_lowercase();
    let names_the_version = message.contains("resourceversion") || message.contains("resource version");
    match response.code {
        410 => Some(Refusal::Expired),
        400 | 422 | 504 if names_the_version => Some(Refusal::Invalid),
        _ => None,
    }
}

impl<K> ResumableWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// A watcher that resumes from `saved` (the version of the last change processed, as
    /// [`ResumableWatcher::last_delivered_version`] gave it), or lists first if there is none.
    /// An empty `saved` counts as none. Fails only on a configuration that cannot work.
    pub fn new(api: Api<K>, config: ResumeConfig, saved: Option<String>) -> Result<Self, ResumeError> {
        if !(1..295).contains(&config.timeout_seconds) {
            return Err(ResumeError::InvalidTimeout(config.timeout_seconds));
        }
        let version = saved.filter(|version| !version.is_empty());
        let phase = if version.is_some() { Phase::OpenWatch } else { Phase::List(ListCause::Initial) };
        Ok(ResumableWatcher {
            api,
            config,
            version,
            phase,
            failures: 0,
            unconfirmed_list: false,
            retry_at: None,
            stats: ResumeStats::default(),
        })
    }

    /// The version of the last event delivered (or the saved version, before any): once that event
    /// is processed, the checkpoint from which a successor resumes without loss or repetition.
    pub fn last_delivered_version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// What the watcher has done so far.
    pub fn stats(&self) -> ResumeStats {
        self.stats
    }

    /// The next event; after an error, the next call first waits out the back-off. Cancel-safe.
    pub async fn next_event(&mut self) -> Result<ResumeEvent<K>, ResumeError> {
        loop {
            if let Some(at) = self.retry_at {
                tokio::time::sleep_until(at).await;
                self.retry_at = None;
            }
            let step = match &mut self.phase {
                Phase::List(cause) => {
                    let cause = cause.clone();
                    match self.list().await {
                        Ok((objects, version)) => Step::Deliver(ResumeEvent::Listed { objects, version, cause }),
                        Err(error) => Step::Fail(error),
                    }
                }
                Phase::OpenWatch => {
                    let from = self.version.clone().unwrap_or_default();
                    match self.api.watch(&self.config.watch_params(), &from).await {
                        Ok(stream) => {
                            self.stats.watches += 1;
                            self.phase = Phase::Watching(stream.boxed());
                            continue;
                        }
                        Err(error) => self.refused_or(error),
                    }
                }
                Phase::Watching(stream) => match stream.next().await {
                    // The watch timed out (or the server closed it): re-open from where we are.
                    None => {
                        self.phase = Phase::OpenWatch;
                        continue;
                    }
                    Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => Step::Deliver(ResumeEvent::Applied(o)),
                    Some(Ok(WatchEvent::Deleted(o))) => Step::Deliver(ResumeEvent::Deleted(o)),
                    Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                        Step::Deliver(ResumeEvent::Progress(bookmark.metadata.resource_version))
                    }
                    Some(Ok(WatchEvent::Error(response))) => {
                        self.relist_if_refused(&response).unwrap_or(Step::Fail(ResumeError::ErrorEvent(response)))
                    }
                    Some(Err(error)) => self.refused_or(error),
                },
            };
            match step {
                Step::Deliver(event) => {
                    self.stats.changes += u64::from(matches!(event, ResumeEvent::Applied(_) | ResumeEvent::Deleted(_)));
                    // Only a watch that delivers proves the server healthy: a list alone does not.
                    self.unconfirmed_list = matches!(event, ResumeEvent::Listed { .. });
                    if self.unconfirmed_list {
                        self.phase = Phase::OpenWatch;
                    } else {
                        self.failures = 0;
                    }
                    self.version = event.resource_version().filter(|v| !v.is_empty()).or(self.version.take());
                    return Ok(event);
                }
                Step::Relist(cause) => {
                    self.stats.failed_resumes += 1;
                    tracing::warn!(
                        resource = %self.api.resource_url(),
                        ?cause,
                        "cannot resume the watch from this version; listing again (changes since, deletions among them, are lost)"
                    );
                    if self.unconfirmed_list {
                        self.back_off();
                    }
                    self.phase = Phase::List(cause);
                }
                Step::Fail(error) => {
                    self.stats.errors += 1;
                    self.back_off();
                    if !matches!(self.phase, Phase::List(_)) {
                        self.phase = Phase::OpenWatch;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// The events as a stream, for `StreamExt` combinators; each event carries its version
    /// ([`ResumeEvent::resource_version`]) for checkpoints.
    pub fn into_stream(self) -> impl Stream<Item = Result<ResumeEvent<K>, ResumeError>> + Send {
        futures::stream::unfold(self, |mut watcher| async move { Some((watcher.next_event().await, watcher)) })
    }

    /// Counts a failure and schedules the next attempt after the back-off.
    fn back_off(&mut self) {
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(Instant::now() + self.config.backoff.delay(self.failures));
    }

    /// A watch failure: a relist if the server refused the version, else an error.
    fn refused_or(&self, error: kube::Error) -> Step<K> {
        let refused = if let kube::Error::Api(response) = &error { self.relist_if_refused(response) } else { None };
        refused.unwrap_or(Step::Fail(ResumeError::Watch(error)))
    }

    /// A relist if `response` refuses the version the watch started from.
    fn relist_if_refused(&self, response: &Status) -> Option<Step<K>> {
        let requested = self.version.clone().unwrap_or_default();
        Some(Step::Relist(match refusal(response)? {
            Refusal::Expired => ListCause::Expired { requested },
            Refusal::Invalid => ListCause::Invalid { requested },
        }))
    }

    /// Every object passing the selectors, page by page, and the version the list is consistent at.
    async fn list(&mut self) -> Result<(Vec<K>, String), ResumeError> {
        let mut params = self.config.list_params();
        let mut objects = Vec::new();
        let mut version = None;
        loop {
            let page = self.api.list(&params).await.map_err(ResumeError::List)?;
            // A paged list is consistent at its first page's version.
            version = version.or(page.metadata.resource_version);
            objects.extend(page.items);
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => break,
            }
        }
        let version = version.filter(|v| !v.is_empty()).ok_or(ResumeError::ListWithoutVersion)?;
        self.stats.lists += 1;
        self.stats.objects_listed += objects.len() as u64;
        Ok((objects, version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(code: u16, message: &str) -> Status {
        Status::failure(message, "").with_code(code)
    }

    #[test]
    fn back_off_doubles_from_its_initial_wait_up_to_its_maximum() {
        let backoff = Backoff { initial: std::time::Duration::from_millis(100), max: std::time::Duration::from_secs(1) };
        let waits: Vec<_> = [1, 2, 3, 4, 5, 100].iter().map(|&n| backoff.delay(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn gone_means_expired_and_a_rejected_version_means_invalid_anything_else_is_an_error() {
        assert_eq!(refusal(&response(410, "too old resource version: 3 (9)")), Some(Refusal::Expired));
        assert_eq!(refusal(&response(400, "invalid resourceVersion \"x\": not a number")), Some(Refusal::Invalid));
        assert_eq!(refusal(&response(504, "Too large resource version: 900, current: 50")), Some(Refusal::Invalid));
        assert_eq!(refusal(&response(400, "unable to parse requirement")), None);
        assert_eq!(refusal(&response(504, "the request was cut off by a partition and not served")), None);
        assert_eq!(refusal(&response(500, "injected internal error")), None);
    }

    #[tokio::test]
    async fn a_watch_timeout_kube_or_the_server_cannot_honour_is_refused_up_front() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "default");
        for seconds in [0, 295] {
            let refused = ResumableWatcher::new(pods.clone(), ResumeConfig::default().timeout_seconds(seconds), None);
            assert!(matches!(refused, Err(ResumeError::InvalidTimeout(s)) if s == seconds));
        }
        assert!(ResumableWatcher::new(pods, ResumeConfig::default().timeout_seconds(294), None).is_ok());
    }

    #[test]
    fn only_a_failed_resume_asks_for_garbage_collection() {
        assert!(!ListCause::Initial.resume_failed());
        assert!(ListCause::Expired { requested: "3".into() }.resume_failed());
        assert!(ListCause::Invalid { requested: "x".into() }.resume_failed());
    }
}
