//! The in-memory object store: objects as JSON keyed by (resource, namespace, name), one
//! `resourceVersion` counter across all of them, and a log of changes that watches replay from,
//! bounded by count and by age as a real API server's watch cache is.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::errors::ApiError;
use crate::resources::{self, ResourceType};
use crate::selectors::Selectors;
use crate::validation::{validate, validate_update, WriteKind};

/// What happened to an object in one change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// The object was created.
    Added,
    /// The object was replaced or patched.
    Modified,
    /// The object was deleted.
    Deleted,
}

/// One committed change, as the event log keeps it and watches deliver it.
#[derive(Debug)]
pub struct Change {
    /// The `resourceVersion` this change produced.
    pub resource_version: u64,
    /// Which resource type changed.
    pub resource: &'static ResourceType,
    /// Namespace of the object (empty for cluster-scoped objects).
    pub namespace: String,
    /// What happened.
    pub change_type: ChangeType,
    /// The object after the change (for deletions: the last state, with the deletion's version).
    pub object: Arc<Value>,
    /// The object before the change, so that selector-filtered watches can see it enter or leave.
    pub previous: Option<Arc<Value>>,
    /// `object` as JSON, encoded by the first watch that sends it and shared by all the others
    /// (a change to a lock watched by 1,000 candidates is encoded once, not 1,000 times).
    pub encoded: std::sync::OnceLock<Vec<u8>>,
}

impl Change {
    /// The change of `object`, at the `resourceVersion` it carries.
    fn new(
        resource: &'static ResourceType,
        namespace: &str,
        change_type: ChangeType,
        object: Arc<Value>,
        previous: Option<Arc<Value>>,
    ) -> Change {
        let resource_version = object["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
        let (namespace, encoded) = (namespace.to_string(), Default::default());
        Change { resource_version, resource, namespace, change_type, object, previous, encoded }
    }

    /// [`Change::object`] as JSON.
    pub fn object_json(&self) -> &[u8] {
        self.encoded.get_or_init(|| serde_json::to_vec(&*self.object).unwrap_or_default())
    }
}

/// What the store sends a watch: a change, or a bookmark at a version the watch has fully seen.
#[derive(Debug, Clone)]
pub enum WatchMessage {
    /// A committed change.
    Change(Arc<Change>),
    /// Every change up to this version has been sent to this watch.
    Bookmark(u64),
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Send the current objects as `ADDED` first (no `resourceVersion`, or `0`).
    CurrentState,
    /// Replay every change after this version.
    After(u64),
}

/// Preconditions a delete may carry.
#[derive(Debug, Clone, Default)]
pub struct DeletePreconditions {
    /// Delete only if the object is at this version.
    pub resource_version: Option<String>,
    /// Delete only if the object has this uid.
    pub uid: Option<String>,
}

type ObjectKey = (&'static str, &'static str, String, String);

fn key(resource: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
    (resource.group, resource.plural, namespace.to_string(), name.to_string())
}

struct Subscriber {
    resource: &'static ResourceType,
    namespace: Option<String>,
    wants_bookmarks: bool,
    sender: mpsc::UnboundedSender<WatchMessage>,
}

/// How much history watches can resume from: a real API server answers watches from its watch
/// cache, which keeps a bounded number of events and, by default, about 75 s of them; a client
/// resuming from an older version gets `410 Expired` and must list again. Keeping the same two
/// bounds here lets tests and benchmarks exercise both the resume and the relist path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventWindow {
    /// At most this many changes are kept (at least one is).
    pub capacity: usize,
    /// Changes older than this are forgotten (with zero, a resume expires as soon as time moves on
    /// after the change it needs).
    pub max_age: Duration,
}

impl Default for EventWindow {
    /// 10,000 changes, 75 s: the real watch cache's default age.
    fn default() -> Self {
        EventWindow { capacity: 10_000, max_age: Duration::from_secs(75) }
    }
}

/// A change in the log and when it was committed (on the monotonic clock, so that virtual time
/// in tests ages it too).
struct LogEntry {
    committed: Instant,
    change: Arc<Change>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    last_resource_version: u64,
    log: VecDeque<LogEntry>,
    window: EventWindow,
    compacted_through: u64,
    subscribers: Vec<Subscriber>,
    closed: bool,
}

impl State {
    /// The object at this key, or `404 NotFound`.
    fn existing(&self, resource: &'static ResourceType, namespace: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.objects.get(&key(resource, namespace, name)).cloned().ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// The objects of a type in one namespace (or all, with `None`), by key.
    fn of_type<'a>(
        &'a self,
        resource: &'static ResourceType,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> {
        self.objects.iter().filter(move |((group, plural, ns, _), _)| {
            *group == resource.group && *plural == resource.plural && namespace.is_none_or(|n| n == ns)
        })
    }

    /// Forgets the changes beyond the window's count or older than its age at `now`; a watch
    /// from a version at or before the last forgotten one can no longer be served.
    fn evict(&mut self, now: Instant) {
        while let Some(oldest) = self.log.front() {
            let too_many = self.log.len() > self.window.capacity;
            let too_old = now.saturating_duration_since(oldest.committed) > self.window.max_age;
            if !too_many && !too_old {
                break;
            }
            self.compacted_through = oldest.change.resource_version;
            self.log.pop_front();
        }
    }
}

/// The shared store behind every request.
pub struct Store {
    state: Mutex<State>,
}

/// Current time as Kubernetes writes `creationTimestamp`.
fn now_timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A random uid in the textual form of a version-4 UUID.
fn new_uid() -> String {
    let bits: u128 = rand::random::<u128>() & !(0xf000u128 << 64) | (0x4000u128 << 64);
    let bits = bits & !(0xc000u128 << 48) | (0x8000u128 << 48);
    let hex = format!("{bits:032x}");
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect()
}

fn metadata_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object["metadata"][field].as_str().unwrap_or("")
}

/// Everything but `metadata` and `status`: a change here bumps `generation`.
fn spec_part(object: &Value) -> Value {
    match object {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Makes sure `object` is a JSON object with a `metadata` object, or says why not.
fn ensure_object(object: &mut Value) -> Result<(), ApiError> {
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request("the request body is not a JSON object"));
    };
    let metadata = map.entry("metadata").or_insert_with(|| json!({}));
    if metadata.is_null() {
        *metadata = json!({});
    }
    if !metadata.is_object() {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    if metadata.get("resourceVersion").is_some_and(|v| !v.is_string() && !v.is_null()) {
        return Err(ApiError::bad_request("metadata.resourceVersion must be a string"));
    }
    Ok(())
}

/// Checks that the namespace in the body (if any) agrees with the path, and fills it in.
fn settle_namespace(resource: &ResourceType, namespace: &str, object: &mut Value) -> Result<(), ApiError> {
    let metadata = &mut object["metadata"];
    if !resource.namespaced {
        if let Some(map) = metadata.as_object_mut() {
            map.remove("namespace");
        }
        return Ok(());
    }
    match metadata["namespace"].as_str() {
        Some(given) if !given.is_empty() && given != namespace => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            metadata["namespace"] = json!(namespace);
            Ok(())
        }
    }
}

impl Store {
    /// An empty store (plus the namespaces every cluster has) whose log keeps the changes of `window`.
    pub fn new(window: EventWindow) -> Self {
        let store = Store {
            state: Mutex::new(State {
                window: EventWindow { capacity: window.capacity.max(1), ..window },
                ..State::default()
            }),
        };
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let namespace = json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            if let Err(error) = store.create(resources::namespaces(), "", namespace) {
                tracing::warn!(%error, name, "could not create a built-in namespace");
            }
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every mutation is applied at once).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The latest `resourceVersion` handed out.
    pub fn current_resource_version(&self) -> u64 {
        self.lock().last_resource_version
    }

    /// One object.
    pub fn get(&self, resource: &'static ResourceType, namespace: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.lock().existing(resource, namespace, name)
    }

    /// The objects of a type in one namespace (or all, with `None`) that pass the selectors, and the
    /// version the list is consistent at.
    pub fn list(
        &self,
        resource: &'static ResourceType,
        namespace: Option<&str>,
        selectors: &Selectors,
    ) -> (Vec<Arc<Value>>, u64) {
        let state = self.lock();
        let items = state.of_type(resource, namespace).filter(|(_, object)| selectors.matches(object));
        (items.map(|(_, object)| object.clone()).collect(), state.last_resource_version)
    }

    /// Creates an object (POST); `409 AlreadyExists` if the name is taken.
    pub fn create(
        &self,
        resource: &'static ResourceType,
        namespace: &str,
        mut object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        ensure_object(&mut object)?;
        settle_namespace(resource, namespace, &mut object)?;
        if metadata_str(&object, "name").is_empty() {
            let prefix = metadata_str(&object, "generateName").to_string();
            if !prefix.is_empty() {
                object["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix()));
            }
        }
        let name = metadata_str(&object, "name").to_string();
        validate(resource, &name, &object, WriteKind::Body)?;
        let mut state = self.lock();
        Self::create_locked(&mut state, resource, namespace, &name, object)
    }

    fn create_locked(
        state: &mut State,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        mut object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        if state.objects.contains_key(&key(resource, namespace, name)) {
            return Err(ApiError::already_exists(resource, name));
        }
        let namespaces = resources::namespaces();
        if resource.namespaced && !state.objects.contains_key(&key(namespaces, "", namespace)) {
            return Err(ApiError::not_found(namespaces, namespace));
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let metadata = &mut object["metadata"];
        metadata["uid"] = json!(new_uid());
        metadata["creationTimestamp"] = json!(now_timestamp());
        metadata["generation"] = json!(1);
        if let Some(map) = metadata.as_object_mut() {
            map.remove("deletionTimestamp");
            map.remove("selfLink");
        }
        Ok(Self::commit(state, resource, namespace, name, ChangeType::Added, object, None))
    }

    /// Replaces an object (PUT): a compare-and-swap when the body carries `metadata.resourceVersion`,
    /// unconditional otherwise. Creates it when absent if the type allows create-on-update.
    /// Returns the stored object and whether it was created.
    pub fn update(
        &self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        mut object: Value,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        ensure_object(&mut object)?;
        settle_namespace(resource, namespace, &mut object)?;
        let body_name = metadata_str(&object, "name");
        if body_name.is_empty() {
            object["metadata"]["name"] = json!(name);
        } else if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        validate(resource, name, &object, WriteKind::Body)?;
        let mut state = self.lock();
        let Some(existing) = state.objects.get(&key(resource, namespace, name)).cloned() else {
            if !resource.create_on_update {
                return Err(ApiError::not_found(resource, name));
            }
            // As the real registry does: a PUT to an absent object of such a type creates it, its
            // resourceVersion notwithstanding, unless it names the uid of an object now gone.
            let uid = metadata_str(&object, "uid");
            if !uid.is_empty() {
                let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: ");
                return Err(ApiError::conflict_because(resource, name, &why));
            }
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("resourceVersion");
            }
            let created = Self::create_locked(&mut state, resource, namespace, name, object)?;
            return Ok((created, true));
        };
        let replaced = Self::replace_locked(&mut state, resource, namespace, name, &existing, object)?;
        Ok((replaced, false))
    }

    /// Applies `patch` to the current object and stores the result, atomically. If the patched object
    /// names a `resourceVersion` other than the current one, answers `409 Conflict`.
    pub fn patch(
        &self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        patch: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let existing = state.existing(resource, namespace, name)?;
        let mut patched = patch(&existing)?;
        ensure_object(&mut patched)?;
        settle_namespace(resource, namespace, &mut patched)?;
        if metadata_str(&patched, "name") != name {
            return Err(ApiError::bad_request("metadata.name cannot be changed by a patch"));
        }
        validate(resource, name, &patched, WriteKind::Patch)?;
        Self::replace_locked(&mut state, resource, namespace, name, &existing, patched)
    }

    fn replace_locked(
        state: &mut State,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        existing: &Arc<Value>,
        mut object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let current_version = metadata_str(existing, "resourceVersion");
        let wanted_version = metadata_str(&object, "resourceVersion");
        if !wanted_version.is_empty() && wanted_version != current_version {
            return Err(ApiError::conflict(resource, name));
        }
        validate_update(resource, name, existing, &object)?;
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        for kept in ["uid", "creationTimestamp", "generation"] {
            object["metadata"][kept] = existing["metadata"][kept].clone();
        }
        object["metadata"]["resourceVersion"] = json!(current_version);
        if object == **existing {
            // Like the real server, an update that changes nothing keeps the version and sends no event.
            return Ok(existing.clone());
        }
        if spec_part(&object) != spec_part(existing) {
            let generation = existing["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            object["metadata"]["generation"] = json!(generation);
        }
        Ok(Self::commit(state, resource, namespace, name, ChangeType::Modified, object, Some(existing.clone())))
    }

    /// Deletes an object, honouring the preconditions; deleting a namespace deletes its contents.
    /// Returns the deleted object as of its deletion.
    pub fn delete(
        &self,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        preconditions: &DeletePreconditions,
    ) -> Result<Arc<Value>, ApiError> {
        let mut state = self.lock();
        let existing = state.existing(resource, namespace, name)?;
        let checks = [
            ("ResourceVersion", "resourceVersion", &preconditions.resource_version),
            ("UID", "uid", &preconditions.uid),
        ];
        for (what, field, wanted) in checks {
            let Some(wanted) = wanted.as_deref().filter(|v| !v.is_empty()) else { continue };
            let actual = metadata_str(&existing, field);
            if wanted != actual {
                let why =
                    format!("Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}");
                return Err(ApiError::conflict_because(resource, name, &why));
            }
        }
        if std::ptr::eq(resource, resources::namespaces()) {
            let contained: Vec<ObjectKey> = state.objects.keys().filter(|(_, _, ns, _)| ns == name).cloned().collect();
            for contained_key in contained {
                if let Some(object) = state.objects.get(&contained_key).cloned() {
                    if let Some(contained_type) = resources::find_stored_type(contained_key.0, contained_key.1) {
                        Self::commit_deletion(&mut state, contained_type, &contained_key.2, &contained_key.3, &object);
                    }
                }
            }
        }
        Ok(Self::commit_deletion(&mut state, resource, namespace, name, &existing))
    }

    fn commit_deletion(
        state: &mut State,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        existing: &Arc<Value>,
    ) -> Arc<Value> {
        let object = (**existing).clone();
        Self::commit(state, resource, namespace, name, ChangeType::Deleted, object, Some(existing.clone()))
    }

    /// Gives `object` the next version, stores (or removes) it, logs the change and tells the watches.
    fn commit(
        state: &mut State,
        resource: &'static ResourceType,
        namespace: &str,
        name: &str,
        change_type: ChangeType,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        state.last_resource_version += 1;
        let version = state.last_resource_version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        let object = Arc::new(object);
        let object_key = key(resource, namespace, name);
        if change_type == ChangeType::Deleted {
            state.objects.remove(&object_key);
        } else {
            state.objects.insert(object_key, object.clone());
        }
        let change = Arc::new(Change::new(resource, namespace, change_type, object.clone(), previous));
        let now = Instant::now();
        state.log.push_back(LogEntry { committed: now, change: change.clone() });
        state.evict(now);
        state.subscribers.retain(|subscriber| {
            if !std::ptr::eq(subscriber.resource, resource)
                || subscriber.namespace.as_deref().is_some_and(|n| n != namespace)
            {
                return !subscriber.sender.is_closed();
            }
            subscriber.sender.send(WatchMessage::Change(change.clone())).is_ok()
        });
        object
    }

    /// Opens a watch on a type (in one namespace, or all with `None`): the messages to send first, and
    /// a receiver of everything committed afterwards. `410 Expired` if changes after `start` have
    /// left the event window (by count or by age).
    pub fn watch(
        &self,
        resource: &'static ResourceType,
        namespace: Option<String>,
        start: WatchStart,
        wants_bookmarks: bool,
    ) -> Result<(Vec<WatchMessage>, mpsc::UnboundedReceiver<WatchMessage>), ApiError> {
        let mut state = self.lock();
        let in_scope = |change_resource: &ResourceType, change_namespace: &str| {
            std::ptr::eq(change_resource, resource) && namespace.as_deref().is_none_or(|n| n == change_namespace)
        };
        let first = match start {
            WatchStart::CurrentState => state
                .of_type(resource, namespace.as_deref())
                .map(|((_, _, ns, _), object)| {
                    WatchMessage::Change(Arc::new(Change::new(resource, ns, ChangeType::Added, object.clone(), None)))
                })
                .collect(),
            WatchStart::After(version) => {
                state.evict(Instant::now());
                if version < state.compacted_through {
                    return Err(ApiError::expired(version, state.compacted_through + 1));
                }
                state
                    .log
                    .iter()
                    .map(|entry| &entry.change)
                    .filter(|change| change.resource_version > version && in_scope(change.resource, &change.namespace))
                    .map(|change| WatchMessage::Change(change.clone()))
                    .collect()
            }
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        if !state.closed {
            state.subscribers.push(Subscriber { resource, namespace, wants_bookmarks, sender });
        }
        Ok((first, receiver))
    }

    /// Sends a bookmark at the current version to every watch that asked for bookmarks.
    pub fn send_bookmarks(&self) {
        let mut state = self.lock();
        let version = state.last_resource_version;
        state.subscribers.retain(|subscriber| {
            if subscriber.wants_bookmarks {
                subscriber.sender.send(WatchMessage::Bookmark(version)).is_ok()
            } else {
                !subscriber.sender.is_closed()
            }
        });
    }

    /// Ends every watch and refuses new ones: the server is shutting down.
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.subscribers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(75);

    fn store() -> Store {
        Store::new(EventWindow { capacity: 100, max_age: WINDOW })
    }

    fn create_namespace(store: &Store, name: &str) -> u64 {
        store.create(resources::namespaces(), "", json!({"metadata": {"name": name}})).unwrap();
        store.current_resource_version()
    }

    fn resume(store: &Store, version: u64) -> Result<Vec<String>, ApiError> {
        let (first, _changes) = store.watch(resources::namespaces(), None, WatchStart::After(version), false)?;
        Ok(first
            .iter()
            .filter_map(|message| match message {
                WatchMessage::Change(change) => Some(metadata_str(&change.object, "name").to_string()),
                WatchMessage::Bookmark(_) => None,
            })
            .collect())
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_within_the_event_window_replays_every_change_after_it() {
        let store = store();
        let saved = create_namespace(&store, "a");
        tokio::time::advance(WINDOW - Duration::from_secs(1)).await;
        create_namespace(&store, "b");
        create_namespace(&store, "c");
        assert_eq!(resume(&store, saved).unwrap(), ["b", "c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_resume_needing_a_change_older_than_the_event_window_expires() {
        let store = store();
        let saved = create_namespace(&store, "a");
        create_namespace(&store, "b");
        tokio::time::advance(WINDOW + Duration::from_millis(1)).await;
        let error = resume(&store, saved).unwrap_err();
        assert_eq!((error.code, error.reason), (410, "Expired"));
        // Nothing was missed by a client already at the newest version: it resumes.
        assert_eq!(resume(&store, store.current_resource_version()).unwrap(), Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn the_event_window_ages_each_change_from_its_own_commit() {
        let store = store();
        let before_a = create_namespace(&store, "first");
        let after_a = create_namespace(&store, "a");
        tokio::time::advance(Duration::from_secs(30)).await;
        create_namespace(&store, "b");
        tokio::time::advance(Duration::from_secs(50)).await;
        // "a" is 80 s old and gone, "b" is 50 s old and kept.
        assert_eq!(resume(&store, before_a).unwrap_err().code, 410);
        assert_eq!(resume(&store, after_a).unwrap(), ["b"]);
    }
}
