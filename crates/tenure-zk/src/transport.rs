//! The I/O of a ZooKeeper campaign: performs [`ZkLatch`]'s calls with `zookeeper-client`, and
//! delivers the session's state changes and the watches of the last look.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::shell::{ShellFuture, Transport};
use tenure::Term;
use zookeeper_client as zk;

use crate::latch::{Look, OwnNode, SessionState, ZkCall, ZkInput, ZkLatch};
use crate::{naming, term_of, with_timeout, ZkError, ZkOptions};

type WatchFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a call hands over to the transport: a new session, or the watches of a look.
type Slot<T> = Arc<Mutex<Option<(u64, T)>>>;

fn put<T>(slot: &Slot<T>, session: u64, value: T) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((session, value));
}

fn take<T>(slot: &Slot<T>) -> Option<(u64, T)> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// What a campaign needs to reach its election.
#[derive(Clone)]
pub(crate) struct Election {
    /// The connection string as given (for messages, credentials redacted there).
    pub servers: String,
    /// The server list to connect to: `servers` without credentials.
    pub address: String,
    pub path: String,
    pub session_timeout: Duration,
    pub identity: String,
    pub access: ZkOptions,
}

/// The transport of one campaign.
pub(crate) struct ZkTransport {
    election: Arc<Election>,
    sessions: u64,
    client: Option<(u64, zk::Client, zk::StateWatcher)>,
    watches: Option<(u64, WatchFuture)>,
    connected: Slot<zk::Client>,
    looked: Slot<WatchFuture>,
}

impl ZkTransport {
    pub(crate) fn new(election: Election) -> Self {
        let (election, connected, looked) = (Arc::new(election), Arc::default(), Arc::default());
        ZkTransport { election, sessions: 0, client: None, watches: None, connected, looked }
    }

    /// Takes over what finished calls handed over: a new session, the watches of a look.
    fn adopt(&mut self) {
        if let Some((session, client)) = take(&self.connected) {
            let states = client.state_watcher();
            self.client = Some((session, client, states));
        }
        if let Some(looked) = take(&self.looked) {
            self.watches = Some(looked);
        }
    }

    fn client(&self, session: u64) -> Result<zk::Client, ZkError> {
        match &self.client {
            Some((id, client, _)) if *id == session => Ok(client.clone()),
            _ => Err(ZkError::Request(zk::Error::ClientClosed)),
        }
    }
}

impl Transport<ZkLatch> for ZkTransport {
    fn start(&mut self, call: ZkCall) -> Option<ShellFuture<ZkInput>> {
        self.adopt();
        let election = self.election.clone();
        let future: ShellFuture<ZkInput> = match call {
            ZkCall::Connect => {
                self.client = None;
                self.watches = None;
                self.sessions += 1;
                let session = self.sessions;
                let connected = self.connected.clone();
                Box::pin(async move {
                    let attempt = election.access.connector(election.session_timeout).connect(&election.address);
                    let result = match tokio::time::timeout(election.session_timeout * 2, attempt).await {
                        Ok(Ok(client)) => {
                            let granted = client.session_timeout();
                            put(&connected, session, client);
                            Ok((session, granted, naming::new_guid()))
                        }
                        Ok(Err(source)) => Err(ZkError::Connect {
                            servers: tenure::redact_credentials(&election.servers).into_owned(),
                            source,
                        }),
                        Err(_) => Err(ZkError::Timeout(election.session_timeout * 2)),
                    };
                    ZkInput::Connected(result)
                })
            }
            ZkCall::Close => {
                self.client = None;
                self.watches = None;
                return None;
            }
            ZkCall::Observe { session, own, guid, limit } => {
                let (client, looked) = (self.client(session), self.looked.clone());
                Box::pin(async move {
                    let result = async {
                        let (look, watches) = observe(&client?, &election, own, &guid, limit).await?;
                        if let Some(watches) = watches {
                            put(&looked, session, watches);
                        }
                        Ok(look)
                    };
                    ZkInput::Observed { session, result: result.await }
                })
            }
            ZkCall::Heartbeat { session, node, limit } => {
                let (client, path) = (self.client(session), node_path(&election, &node));
                Box::pin(async move {
                    let result = async { with_timeout(limit, client?.check_stat(&path)).await };
                    ZkInput::Heartbeat { session, result: result.await.map(|stat| stat.is_some()) }
                })
            }
            ZkCall::Delete { session, node, limit } => {
                let (client, path) = (self.client(session), node_path(&election, &node));
                Box::pin(async move {
                    let result = match async { with_timeout(limit, client?.delete(&path, None)).await }.await {
                        Ok(()) | Err(ZkError::Request(zk::Error::NoNode)) => Ok(()),
                        Err(error) => Err(error),
                    };
                    ZkInput::Deleted { session, node, result }
                })
            }
        };
        Some(future)
    }

    async fn notice(&mut self) -> ZkInput {
        self.adopt();
        let state = async {
            match self.client.as_mut() {
                Some((session, _, states)) => (*session, states.changed().await),
                None => std::future::pending().await,
            }
        };
        let watched = async {
            match self.watches.as_mut() {
                Some((session, watches)) => {
                    watches.await;
                    *session
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (session, state) = state => {
                let state = match state {
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => SessionState::Connected,
                    zk::SessionState::Disconnected => SessionState::Disconnected,
                    _ => SessionState::Lost,
                };
                if state == SessionState::Lost {
                    self.client = None;
                    self.watches = None;
                }
                ZkInput::State { session, state }
            }
            session = watched => {
                self.watches = None;
                ZkInput::Watched { session }
            }
        }
    }

    fn describe(&self) -> String {
        format!("ZooKeeper election {}", self.election.path)
    }
}

fn node_path(election: &Election, name: &str) -> String {
    format!("{}/{}", election.path, name)
}

/// Reads the children, makes sure our node is among them (finding it by guid first, so a create
/// whose reply was lost is not repeated), and sets the watches of the own node, the predecessor
/// and the leader.
async fn observe(
    client: &zk::Client, election: &Election, mut own: Option<OwnNode>, guid: &str, limit: Duration,
) -> Result<(Look, Option<WatchFuture>), ZkError> {
    let again = |own| Ok((Look::Again { own, own_gone: false }, None));
    let children = match with_timeout(limit, client.list_children(&election.path)).await {
        Ok(children) => children,
        Err(ZkError::Request(zk::Error::NoNode)) => {
            make_path(client, election, limit).await?;
            return again(own);
        }
        Err(err) => return Err(err),
    };
    let ordered = naming::in_election_order(children);
    let Some(index) = ordered.iter().position(|name| naming::is_own(name, guid)) else {
        let own_gone = own.take().is_some();
        let created = create_node(client, election, guid, limit).await?;
        return Ok((Look::Again { own: created, own_gone }, None));
    };
    let name = &ordered[index];
    if own.as_ref().map(|node| &node.name) != Some(name) {
        // Created by an earlier attempt whose reply was lost: adopt it.
        match with_timeout(limit, client.get_data(&node_path(election, name))).await {
            Ok((_, stat)) => own = Some(OwnNode { name: name.clone(), czxid: stat.czxid }),
            Err(ZkError::Request(zk::Error::NoNode)) => return again(own),
            Err(err) => return Err(err),
        }
    }
    let Some(node) = own.clone() else { return again(own) };
    let (stat, own_watch) = with_timeout(limit, client.check_and_watch_stat(&node_path(election, &node.name))).await?;
    if stat.is_none() {
        return again(own);
    }
    let mut watches = vec![own_watch];
    let (leader_identity, leader_term) = if index == 0 {
        (election.identity.clone(), term_of(node.czxid))
    } else {
        // Watch the predecessor (when it goes, only we need to look again) and, for followers
        // further back, the leader's node too: followers report the current leader.
        let mut leader = None;
        for other in [index - 1, 0].into_iter().take(if index == 1 { 1 } else { 2 }) {
            let path = node_path(election, &ordered[other]);
            let (data, stat, watch) = match with_timeout(limit, client.get_and_watch_data(&path)).await {
                Ok(found) => found,
                Err(ZkError::Request(zk::Error::NoNode)) => return again(own),
                Err(err) => return Err(err),
            };
            watches.push(watch);
            leader = Some((String::from_utf8_lossy(&data).into_owned(), term_of(stat.czxid)));
        }
        leader.unwrap_or_else(|| (String::new(), Term(0)))
    };
    let watches: WatchFuture = Box::pin(async move {
        futures::future::select_all(watches.into_iter().map(|watch| Box::pin(watch.changed()))).await;
    });
    Ok((Look::View { own: node, is_leader: index == 0, leader_identity, leader_term }, Some(watches)))
}

async fn make_path(client: &zk::Client, election: &Election, limit: Duration) -> Result<(), ZkError> {
    let options = zk::CreateMode::Persistent.with_acls(election.access.acls());
    with_timeout(limit, client.mkdir(&election.path, &options)).await
}

/// Creates our ephemeral sequential node, named and filled as a LeaderLatch would.
async fn create_node(
    client: &zk::Client, election: &Election, guid: &str, limit: Duration,
) -> Result<Option<OwnNode>, ZkError> {
    let prefix = naming::node_prefix(&election.path, guid);
    let options = zk::CreateMode::EphemeralSequential.with_acls(election.access.acls());
    match with_timeout(limit, client.create(&prefix, election.identity.as_bytes(), &options)).await {
        Ok((stat, sequence)) => {
            let full = format!("{prefix}{:010}", sequence.into_i64());
            let name = full.rsplit('/').next().unwrap_or_default().to_owned();
            tracing::debug!(identity = %election.identity, node = %name, czxid = stat.czxid, "created node");
            Ok(Some(OwnNode { name, czxid: stat.czxid }))
        }
        Err(ZkError::Request(zk::Error::NoNode)) => make_path(client, election, limit).await.map(|()| None),
        Err(err) => Err(err),
    }
}
