//! A record lock on one Kubernetes object: get, create, compare-and-swap on `resourceVersion`,
//! and a watch of the one object.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use tenure::{ChangeStream, LeaderElectionRecord, LockError, RecordLock, StoredRecord, Version};
use tokio::sync::mpsc;

use crate::codec::RecordObject;

/// How long the server may keep one watch request open before it is re-issued from the last
/// version seen (the real API server closes watches after a few minutes anyway).
const WATCH_SECONDS: u32 = 290;

/// A watch that ends sooner than this after it was opened, without any event, is treated as an
/// error: re-opening it at once could spin.
const MIN_WATCH_LIFETIME: Duration = Duration::from_secs(1);

/// Which call failed, for the error mapping: a 404 means different things to each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Get,
    Create,
    Update,
    Watch,
}

/// Maps an API error to what the elector must do about it.
pub(crate) fn lock_error(call: Call, error: kube::Error) -> LockError {
    match error {
        kube::Error::Api(status) => {
            let detail = format!("{} {}: {}", status.code, status.reason, status.message);
            match (status.code, call) {
                (409, Call::Create) if status.reason == "AlreadyExists" => LockError::AlreadyExists,
                (409, Call::Create | Call::Update) => LockError::Conflict,
                // The object was deleted since it was read: the compare-and-swap failed.
                (404, Call::Update) => LockError::Conflict,
                (400 | 401 | 403 | 404 | 405 | 422, _) => LockError::Rejected(detail),
                _ => LockError::Unavailable(detail),
            }
        }
        other => LockError::Unavailable(other.to_string()),
    }
}

/// The record an object holds, at the object's version.
pub(crate) fn stored<K: RecordObject>(object: &K) -> StoredRecord {
    StoredRecord { version: Version(object.resource_version().unwrap_or_default()), record: object.record() }
}

/// Refuses an object the server returned without a `resourceVersion`: it could not be updated
/// with compare-and-swap (an update without a version is unconditional), so it is a bad answer,
/// not a record to act on.
fn versioned<K: RecordObject>(object: K) -> Result<K, LockError> {
    match object.resource_version() {
        Some(version) if !version.is_empty() => Ok(object),
        _ => Err(LockError::Unavailable(format!(
            "the server returned {} {:?} without metadata.resourceVersion",
            K::PLURAL,
            object.name_any()
        ))),
    }
}

/// The states of one object from a watch: see [`ObjectLock::object_changes`].
pub(crate) type ObjectChanges<K> = Pin<Box<dyn Stream<Item = Result<Option<K>, LockError>> + Send>>;

/// A record lock on one object of kind `K`.
///
/// It remembers the last object it saw, so an update whose expected version is that object's
/// is one PUT (the object as read, with the new record) rather than a GET and a PUT; the PUT
/// carries the expected `resourceVersion`, so a stale memory can only cause a conflict, never a
/// lost write.
#[derive(Clone)]
pub struct ObjectLock<K: RecordObject> {
    api: Api<K>,
    namespace: String,
    name: String,
    last_seen: Arc<Mutex<LastSeen<K>>>,
    watch_open_timeout: Duration,
}

/// The object as last seen, and the ticket of the request that saw it.
///
/// Requests overlap (the watch's list, the elector's create or update), and their answers can
/// arrive out of order: a list sent before the object was created may answer "absent" after the
/// create has answered with the object. Each request takes a ticket when it is sent; an answer
/// replaces the memory only if its ticket is not older than the one that wrote it, so an answer
/// overtaken by a newer request's never erases what that request saw.
struct LastSeen<K> {
    next_ticket: u64,
    ticket: u64,
    object: Option<K>,
}

impl<K> Default for LastSeen<K> {
    fn default() -> Self {
        LastSeen { next_ticket: 0, ticket: 0, object: None }
    }
}

impl<K: Clone> LastSeen<K> {
    /// A ticket for a request about to be sent.
    fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Remembers what the request holding `ticket` saw, unless a newer request already answered.
    fn remember(&mut self, ticket: u64, object: Option<&K>) {
        if ticket >= self.ticket {
            self.ticket = ticket;
            self.object = object.cloned();
        }
    }
}

impl<K: RecordObject> std::fmt::Debug for ObjectLock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl<K: RecordObject> ObjectLock<K> {
    /// The lock on the object `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        ObjectLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            last_seen: Arc::new(Mutex::new(LastSeen::default())),
            watch_open_timeout: Duration::from_secs(5),
        }
    }

    /// How long the initial list of a watch may take before the watch reports an error.
    #[must_use]
    pub fn with_watch_open_timeout(mut self, timeout: Duration) -> Self {
        self.watch_open_timeout = timeout;
        self
    }

    fn last_seen(&self) -> std::sync::MutexGuard<'_, LastSeen<K>> {
        self.last_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A ticket for a request about to be sent (see [`LastSeen`]).
    fn ticket(&self) -> u64 {
        self.last_seen().ticket()
    }

    /// Remembers what the request holding `ticket` saw, unless a newer request already answered.
    fn remember(&self, ticket: u64, object: Option<&K>) {
        self.last_seen().remember(ticket, object);
    }

    fn remembered_at(&self, version: &Version) -> Option<K> {
        let last = self.last_seen();
        last.object.as_ref().filter(|o| o.resource_version().as_deref() == Some(version.0.as_str())).cloned()
    }

    /// Reads the object.
    pub(crate) async fn get_object(&self) -> Result<Option<K>, LockError> {
        let ticket = self.ticket();
        let object =
            self.api.get_opt(&self.name).await.map_err(|e| lock_error(Call::Get, e))?.map(versioned).transpose()?;
        self.remember(ticket, object.as_ref());
        Ok(object)
    }

    /// Creates the object holding `record`.
    pub(crate) async fn create_object(&self, record: &LeaderElectionRecord) -> Result<K, LockError> {
        let mut object = K::with_record(&self.namespace, &self.name, record)?;
        object.stamp_write(chrono::Utc::now());
        let ticket = self.ticket();
        let created = self.api.create(&PostParams::default(), &object).await;
        let created = versioned(created.map_err(|e| lock_error(Call::Create, e))?)?;
        self.remember(ticket, Some(&created));
        Ok(created)
    }

    /// Replaces the record if the object is still at `expected`.
    pub(crate) async fn update_object(
        &self,
        expected: &Version,
        record: &LeaderElectionRecord,
    ) -> Result<K, LockError> {
        if expected.0.is_empty() {
            // An update without a version would be unconditional: never send one.
            return Err(LockError::Conflict);
        }
        let mut object = match self.remembered_at(expected) {
            Some(object) => object,
            None => self.get_object().await?
                .filter(|current| current.resource_version().as_deref() == Some(expected.0.as_str()))
                .ok_or(LockError::Conflict)?,
        };
        object.set_record(record)?;
        object.stamp_write(chrono::Utc::now());
        object.meta_mut().resource_version = Some(expected.0.clone());
        let ticket = self.ticket();
        let replaced = self.api.replace(&self.name, &PostParams::default(), &object).await;
        let updated = versioned(replaced.map_err(|e| lock_error(Call::Update, e))?)?;
        self.remember(ticket, Some(&updated));
        if updated.resource_version().as_deref() == Some(expected.0.as_str()) {
            // Applied as a no-op: nobody watching saw a change, so it must not count as one.
            return Err(LockError::Unavailable(format!(
                "the update of {} left the object unchanged (same resourceVersion)",
                self.describe()
            )));
        }
        Ok(updated)
    }

    /// The object's states from now on: first the current one, then one per change (`None` once
    /// deleted); one error and the end when the watch cannot go on.
    pub(crate) fn object_changes(&self) -> Option<ObjectChanges<K>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (sender, receiver) = mpsc::channel(16);
        let lock = self.clone();
        runtime.spawn(async move {
            tokio::select! {
                result = lock.pump(&sender) => {
                    if let Err(error) = result {
                        let _ = sender.send(Err(error)).await;
                    }
                }
                _ = sender.closed() => {}
            }
        });
        Some(Box::pin(futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        })))
    }

    /// Lists the one object, then watches it from the list's version, re-watching from the last
    /// version seen whenever the server ends a watch. Returns only on an error (or when the
    /// receiver is gone).
    async fn pump(&self, sender: &mpsc::Sender<Result<Option<K>, LockError>>) -> Result<(), LockError> {
        let selector = format!("metadata.name={}", self.name);
        let ticket = self.ticket();
        let list =
            tokio::time::timeout(self.watch_open_timeout, self.api.list(&ListParams::default().fields(&selector)))
                .await
                .map_err(|_| LockError::Timeout(self.watch_open_timeout))?
                .map_err(|e| lock_error(Call::Watch, e))?;
        let mut version = list.metadata.resource_version.unwrap_or_default();
        let current = list.items.into_iter().find(|o| o.name_any() == self.name).map(versioned).transpose()?;
        self.remember(ticket, current.as_ref());
        if sender.send(Ok(current)).await.is_err() {
            return Ok(());
        }
        loop {
            let opened = Instant::now();
            let params = WatchParams::default().fields(&selector).timeout(WATCH_SECONDS);
            let events = tokio::time::timeout(self.watch_open_timeout, self.api.watch(&params, &version))
                .await
                .map_err(|_| LockError::Timeout(self.watch_open_timeout))?
                .map_err(|e| lock_error(Call::Watch, e))?;
            let mut events = std::pin::pin!(events);
            let mut any = false;
            while let Some(event) = events.next().await {
                let state = match event.map_err(|e| lock_error(Call::Watch, e))? {
                    WatchEvent::Added(object) | WatchEvent::Modified(object) => Some(versioned(object)?),
                    WatchEvent::Deleted(object) => {
                        version = object.resource_version().unwrap_or(version);
                        self.remember(self.ticket(), None);
                        any = true;
                        if sender.send(Ok(None)).await.is_err() {
                            return Ok(());
                        }
                        continue;
                    }
                    WatchEvent::Bookmark(bookmark) => {
                        version = bookmark.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(status) => return Err(lock_error(Call::Watch, kube::Error::Api(status))),
                };
                any = true;
                if let Some(object) = state.filter(|o| o.name_any() == self.name) {
                    version = object.resource_version().unwrap_or(version);
                    self.remember(self.ticket(), Some(&object));
                    if sender.send(Ok(Some(object))).await.is_err() {
                        return Ok(());
                    }
                }
            }
            if !any && opened.elapsed() < MIN_WATCH_LIFETIME {
                return Err(LockError::Unavailable("the watch was closed as soon as it was opened".into()));
            }
        }
    }

    fn describe(&self) -> String {
        format!("kube://{}/{}/{}", self.namespace, K::PLURAL, self.name)
    }

    /// A reference to the lock object for an Event about it: with the uid and version of the
    /// object last seen, as client-go's `RecordEvent` uses its cached object, so that
    /// `kubectl describe` finds the event; name and kind only if the object was never seen.
    pub fn object_reference(&self) -> ObjectReference {
        let last = self.last_seen();
        let last = &last.object;
        ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: last.as_ref().and_then(|o| o.meta().uid.clone()),
            resource_version: last.as_ref().and_then(|o| o.resource_version()),
            field_path: None,
        }
    }
}

#[async_trait]
impl<K: RecordObject> RecordLock for ObjectLock<K> {
    fn describe(&self) -> String {
        ObjectLock::describe(self)
    }

    async fn get(&self) -> Result<Option<StoredRecord>, LockError> {
        Ok(self.get_object().await?.as_ref().map(stored))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        Ok(stored(&self.create_object(record).await?).version)
    }

    async fn update(&self, expected: &Version, record: &LeaderElectionRecord) -> Result<Version, LockError> {
        Ok(stored(&self.update_object(expected, record).await?).version)
    }

    fn watch(&self) -> Option<ChangeStream> {
        let changes = self.object_changes()?;
        Some(Box::pin(changes.map(|item| item.map(|object| object.as_ref().map(stored)))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("m", reason).with_code(code).boxed())
    }

    #[test]
    fn maps_api_errors_to_what_the_elector_must_do() {
        assert_eq!(lock_error(Call::Create, api_error(409, "AlreadyExists")), LockError::AlreadyExists);
        assert_eq!(lock_error(Call::Update, api_error(409, "Conflict")), LockError::Conflict);
        assert_eq!(lock_error(Call::Update, api_error(404, "NotFound")), LockError::Conflict);
        assert!(matches!(lock_error(Call::Create, api_error(404, "NotFound")), LockError::Rejected(_)));
        assert!(matches!(lock_error(Call::Get, api_error(403, "Forbidden")), LockError::Rejected(_)));
        assert!(matches!(lock_error(Call::Update, api_error(422, "Invalid")), LockError::Rejected(_)));
        assert!(matches!(lock_error(Call::Get, api_error(500, "InternalError")), LockError::Unavailable(_)));
        assert!(matches!(lock_error(Call::Update, api_error(429, "TooManyRequests")), LockError::Unavailable(_)));
        assert!(matches!(lock_error(Call::Watch, api_error(410, "Expired")), LockError::Unavailable(_)));
    }

    #[test]
    fn an_answer_overtaken_by_a_newer_request_never_erases_what_that_request_saw() {
        // The watch's list is sent while the object is absent, the elector's create answers
        // first, then the list's "absent" arrives: the created object (and its uid, which Events
        // need) stays remembered.
        let mut last = LastSeen::<&str>::default();
        let list = last.ticket();
        let create = last.ticket();
        last.remember(create, Some(&"created"));
        last.remember(list, None);
        assert_eq!(last.object, Some("created"));
        // A later answer (a watch event after the delete) still replaces it.
        let deleted = last.ticket();
        last.remember(deleted, None);
        assert_eq!(last.object, None);
    }
}
