//! A [`GroupStore`] on ZooKeeper, so that the replicas of a service can share partitions
//! ([`tenure_group`]) with the ensemble they already elect on.
//!
//! Layout under the group's path `P`: the node `P/table` holds the partition table and
//! `P/members/<hex of identity>` each member's record, both as JSON (hex, because an identity may
//! hold a `/`). The version of a record is its node's data version; a create is `create` (which
//! fails with `NodeExists`), a compare-and-swap is `setData` with the expected version. A read is
//! two requests whatever the group's size: the member list, then one multi-read of the table
//! and every member node (a consistent snapshot). Changes come from one persistent recursive
//! watch on `P` (ZooKeeper 3.6 and later); its events name the node but do not carry the data.
//! A member node that changed (a renew, at rest) is passed on as [`Change::Touched`], without
//! reading it: a member learns that the other member is alive and reads its record only before
//! acting on it (the core's rule, [`tenure_group::handoff::MemberCore::on_store_change`]), so
//! its requests at rest are its own renew and a read of the group per lease whatever the member
//! count. The table changed and a member node created cost one `getData` each (they decide
//! handoffs at once, and happen only on a handoff or a join). A departed member's node is
//! deleted with its data version.
//!
//! The nodes are persistent, not ephemeral: a dead member's record must stay readable so that the
//! others end its epoch by compare-and-swap after its lease ran out on their own clocks (the core's
//! rule, the same on every backend). An ephemeral node deleted at session expiry would let another
//! member claim while the old owner's client-side deadline may still be running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_group::codec::{self, hex};
use tenure_group::store::{Change, GroupStore, Key, RecordStream, Snapshot, StoreError, Value, Version};
use zookeeper_client as zk;

use crate::{open_session, validate_path, with_timeout, ZkError, ZkOptions};

/// Time limit of one request of the store.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A group's records on a ZooKeeper ensemble, over one session of its own (one per member
/// process, so its requests are one member's load).
#[derive(Debug, Clone)]
pub struct ZkGroupStore {
    servers: String,
    path: String,
    session_timeout: Duration,
    access: ZkOptions,
    client: Arc<Mutex<zk::Client>>,
    requests: Arc<AtomicU64>,
}

/// The group store's view of a ZooKeeper failure.
fn store_error(error: ZkError) -> StoreError {
    match error {
        ZkError::Timeout(limit) => StoreError::Timeout(limit),
        ZkError::Request(zk::Error::NoAuth | zk::Error::BadArguments(_) | zk::Error::InvalidAcl) => {
            StoreError::Rejected(error.to_string())
        }
        other => StoreError::Unavailable(other.to_string()),
    }
}

fn version_of(stat: &zk::Stat) -> Version {
    Version(u64::try_from(stat.version).unwrap_or(0))
}

impl ZkGroupStore {
    /// Opens a session to `servers` ("host:port,host:port") for the group at `path` (absolute;
    /// created on the first write).
    pub async fn connect(servers: &str, path: &str) -> Result<ZkGroupStore, ZkError> {
        Self::connect_with(servers, path, ZkOptions::default()).await
    }

    /// Connects like [`ZkGroupStore::connect`] with the digest user and TLS of `options`: the
    /// same access as an election's ([`crate::ZkElection::connect_with`]), so a group can live on
    /// a secured ensemble; with a user, the nodes it creates are writable by that user only, and
    /// a session the group's path shuts out (a wrong password) fails here with
    /// [`ZkError::NotAuthorized`].
    pub async fn connect_with(servers: &str, path: &str, options: ZkOptions) -> Result<ZkGroupStore, ZkError> {
        validate_path(path)?;
        let session_timeout = Duration::from_secs(10);
        let servers = options.connect_string(servers);
        let client = open_session(&servers, session_timeout, &options).await?;
        // A wrong password authenticates as another digest identity, which the group's nodes
        // shut out: say so now rather than failing every write.
        crate::with_timeout_of(session_timeout, options.check_may_campaign(&client, path)).await?;
        let (path, client, requests) = (path.to_owned(), Arc::new(Mutex::new(client)), Arc::new(AtomicU64::new(0)));
        Ok(ZkGroupStore { servers, path, session_timeout, access: options, client, requests })
    }

    /// How many requests this store has sent (reads count two: the member list and the
    /// multi-read): one member's load on the ensemble.
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// One counted request within the call timeout.
    async fn call<T>(&self, request: impl std::future::Future<Output = Result<T, zk::Error>>) -> Result<T, ZkError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        with_timeout(CALL_TIMEOUT, request).await
    }

    /// The node of a record.
    pub fn node_of(&self, key: &Key) -> String {
        match key {
            Key::Table => format!("{}/table", self.path),
            Key::Member(identity) => format!("{}/members/{}", self.path, hex(identity)),
        }
    }

    /// The record a node path of the group names, if any.
    fn record_key(&self, node: &str) -> Option<Key> {
        let name = node.strip_prefix(&self.path)?.strip_prefix('/')?;
        if name == "table" {
            return Some(Key::Table);
        }
        codec::unhex(name.strip_prefix("members/")?).map(Key::Member)
    }

    /// The change of the record at `key` that a watch event announced: one `getData` of its node.
    async fn fetch(&self, key: Key) -> Result<Option<Change>, StoreError> {
        let client = self.session().await?;
        let node = self.node_of(&key);
        match self.call(client.get_data(&node)).await {
            Ok((data, stat)) => {
                Ok(codec::decode(&key, &node, &data, version_of(&stat))?.map(|stored| Change::Put(key, stored)))
            }
            Err(ZkError::Request(zk::Error::NoNode)) => Ok(Some(Change::Deleted(key))),
            Err(error) => Err(store_error(error)),
        }
    }

    fn client(&self) -> zk::Client {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The session, re-opened if it ended (expired during a long partition, closed).
    async fn session(&self) -> Result<zk::Client, StoreError> {
        let client = self.client();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        let fresh = open_session(&self.servers, self.session_timeout, &self.access).await.map_err(store_error)?;
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }
}

#[async_trait]
impl GroupStore for ZkGroupStore {
    fn describe(&self) -> String {
        format!("zk path {:?}", self.path)
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let client = self.session().await?;
        let members_path = format!("{}/members", self.path);
        let names = match self.call(client.list_children(&members_path)).await {
            Ok(names) => names,
            Err(ZkError::Request(zk::Error::NoNode)) => Vec::new(),
            Err(error) => return Err(store_error(error)),
        };
        let mut reader = client.new_multi_reader();
        let table_path = self.node_of(&Key::Table);
        let bad = |e: zk::Error| StoreError::Rejected(format!("cannot read the group: {e}"));
        reader.add_get_data(&table_path).map_err(bad)?;
        for name in &names {
            reader.add_get_data(&format!("{members_path}/{name}")).map_err(bad)?;
        }
        let results = self.call(reader.commit()).await.map_err(store_error)?;
        let mut snapshot = Snapshot::default();
        let mut results = results.into_iter();
        match results.next() {
            Some(zk::MultiReadResult::Data { data, stat }) => {
                snapshot.table = Some(codec::decode_table(&table_path, &data, version_of(&stat))?);
            }
            Some(zk::MultiReadResult::Error { err: zk::Error::NoNode }) => {}
            other => return Err(StoreError::Unavailable(format!("unexpected answer for {table_path}: {other:?}"))),
        }
        for (name, result) in names.iter().zip(results) {
            // A member node removed between the two requests is simply absent.
            let zk::MultiReadResult::Data { data, stat } = result else { continue };
            let node = format!("{members_path}/{name}");
            if let Some(stored) = codec::decode_member(&node, &data, version_of(&stat), |r| hex(&r.identity) == *name) {
                snapshot.members.insert(stored.value.identity.clone(), stored);
            }
        }
        Ok(snapshot)
    }

    async fn write(&self, key: &Key, expected: Option<Version>, value: &Value) -> Result<Version, StoreError> {
        let document = codec::encode(key, value)?;
        let client = self.session().await?;
        let node = self.node_of(key);
        match expected {
            None => {
                let options = zk::CreateMode::Persistent.with_acls(self.access.acls());
                let mut created = self.call(client.create(&node, &document, &options)).await;
                if let Err(ZkError::Request(zk::Error::NoNode)) = created {
                    let parent = node.rsplit_once('/').map_or(self.path.as_str(), |(parent, _)| parent);
                    match self.call(client.mkdir(parent, &options)).await {
                        Ok(()) | Err(ZkError::Request(zk::Error::NodeExists)) => {}
                        Err(error) => return Err(store_error(error)),
                    }
                    created = self.call(client.create(&node, &document, &options)).await;
                }
                match created {
                    Ok((stat, _)) => Ok(version_of(&stat)),
                    Err(ZkError::Request(zk::Error::NodeExists)) => Err(StoreError::AlreadyExists),
                    Err(error) => Err(store_error(error)),
                }
            }
            Some(version) => {
                let version = i32::try_from(version.0).map_err(|_| StoreError::Conflict)?;
                match self.call(client.set_data(&node, &document, Some(version))).await {
                    Ok(stat) => Ok(version_of(&stat)),
                    Err(ZkError::Request(zk::Error::BadVersion | zk::Error::NoNode)) => Err(StoreError::Conflict),
                    Err(error) => Err(store_error(error)),
                }
            }
        }
    }

    async fn delete(&self, key: &Key, expected: Version) -> Result<(), StoreError> {
        let client = self.session().await?;
        let version = i32::try_from(expected.0).map_err(|_| StoreError::Conflict)?;
        match self.call(client.delete(&self.node_of(key), Some(version))).await {
            Ok(()) => Ok(()),
            Err(ZkError::Request(zk::Error::BadVersion | zk::Error::NoNode)) => Err(StoreError::Conflict),
            Err(error) => Err(store_error(error)),
        }
    }

    fn watch_records(&self) -> Option<RecordStream> {
        let store = self.clone();
        // One persistent recursive watch on the group's path. Once it is in place: `Resync` (the
        // member reads once, after the watch exists). A member node changed: `Touched`, unread;
        // the table changed or a node created: one `getData` of it; a node deleted: `Deleted`;
        // the session reconnected (events may have been lost meanwhile): `Resync`. A terminal
        // session state ends the stream; the driver re-opens it on a new session after a retry
        // period.
        let stream = futures::stream::unfold(Some(None::<zk::PersistentWatcher>), move |watcher| {
            let store = store.clone();
            async move {
                let mut watcher = match watcher? {
                    Some(watcher) => watcher,
                    None => {
                        let opened = async {
                            let client = store.session().await?;
                            let mode = zk::AddWatchMode::PersistentRecursive;
                            store.call(client.watch(&store.path, mode)).await.map_err(store_error)
                        };
                        return match opened.await {
                            Ok(watcher) => Some((Ok(Change::Resync), Some(Some(watcher)))),
                            Err(error) => Some((Err(error), None)),
                        };
                    }
                };
                loop {
                    let event = watcher.changed().await;
                    let change = match event.event_type {
                        zk::EventType::Session if event.session_state.is_terminated() => {
                            let reason = format!("ZooKeeper session ended ({:?})", event.session_state);
                            return Some((Err(StoreError::Unavailable(reason)), None));
                        }
                        zk::EventType::Session if event.session_state == zk::SessionState::SyncConnected => {
                            Ok(Some(Change::Resync))
                        }
                        zk::EventType::Session | zk::EventType::NodeChildrenChanged => Ok(None),
                        zk::EventType::NodeDeleted => Ok(store.record_key(&event.path).map(Change::Deleted)),
                        zk::EventType::NodeCreated | zk::EventType::NodeDataChanged => {
                            match store.record_key(&event.path) {
                                Some(key @ Key::Member(_)) if event.event_type == zk::EventType::NodeDataChanged => {
                                    Ok(Some(Change::Touched(key)))
                                }
                                Some(key) => store.fetch(key).await,
                                None => Ok(None),
                            }
                        }
                    };
                    match change {
                        Ok(Some(change)) => return Some((Ok(change), Some(Some(watcher)))),
                        Ok(None) => continue,
                        Err(error) => return Some((Err(error), None)),
                    }
                }
            }
        });
        Some(Box::pin(stream))
    }
}
