//! # tenure-zk: a native ZooKeeper elector for Tenure
//!
//! Why a native elector: ZooKeeper has sessions with server-side expiry and ephemeral sequential
//! nodes, so an election needs no lease arithmetic: candidates queue up as ephemeral sequential
//! nodes, the lowest sequence leads, and each waiter watches only its predecessor (no herd when
//! the leader goes). The nodes are named and ordered exactly as Apache Curator's `LeaderLatch`
//! names and orders them (see [`naming`]), so Java `LeaderLatch`es and Tenure candidates on one
//! path agree on one leader.
//!
//! The elector publishes the core's [`tenure::Leadership`] and [`tenure::Tenure`] through a
//! [`tenure::Publisher`], so users, the CLI and the HA runtime see the same [`tenure::Elector`] as
//! with record locks. The term is the creation zxid (`czxid`) of the leader's node: it grows with
//! every node ever created in the ensemble.
//!
//! Self-fencing rule: the leader counts its tenure valid until `start of the last request the
//! server answered + 2/3 * session timeout`. The server expires the session no earlier than
//! `session timeout` after it last heard from the client, which is after that start, and the next
//! candidate leads only after the expiry, so the old leader stops first with a third of the
//! session timeout to spare (for clock-rate drift and the notice to reach the next candidate).
//! The session timeout is the one the server grants (it caps requests to its own bounds), and
//! the elector's [`Timing`] reports that one. Every call the leader waits for is cut short at
//! its deadline, so a hanging server never delays the fence.
//!
//! A lost connection ends the tenure at once (Curator's advice: SUSPENDED means stop). A tenure
//! that ended without a release (lost connection, self-fenced) never resumes: its node is deleted
//! and the candidate queues again with a new node, so its next tenure has a greater term, like
//! Curator's `LeaderLatch` after a reconnect. After a session expiry it campaigns again with a
//! new session and a new node.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure_zk::ZkElection;
//! let election = ZkElection::connect("127.0.0.1:2181", "/tenure/my-service", Duration::from_secs(6)).await?;
//! let elector = election.campaign("replica-a")?;
//! let tenure = elector.acquired().await?;
//! println!("leading with term {}", tenure.term());
//! drop(tenure);
//! elector.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! Writes fenced by the server itself, refused once their tenure is over however late they
//! arrive: [`ZkElection::fenced_multi`].
//!
//! Digest authentication, the ACLs that protect an authenticated election, and (with the crate
//! feature `tls`) TLS: [`ZkElection::connect_with`] and [`ZkOptions`].
#![warn(missing_docs)]

mod access;
mod fenced;
pub mod latch;
mod transport;
pub mod group_store;
pub mod naming;
#[cfg(feature = "tls")]
mod tls_probe;

pub use fenced::FencedMultiError;
pub use group_store::ZkGroupStore;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Elector, Term, Timing};
/// The ZooKeeper client this crate is built on. Why re-exported: stores layered on an election
/// (the fenced checkpoints of `tenure-ha`) build their multi-operations with its types, and must
/// use the very version this crate does.
pub use zookeeper_client as zk;

pub use crate::access::ZkOptions;

/// Why a ZooKeeper election could not be set up or queried.
#[derive(Debug, thiserror::Error)]
pub enum ZkError {
    /// The election path is not an absolute ZooKeeper path below the root.
    #[error("invalid election path {path:?}: {reason}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The session timeout is too short to leave room for self-fencing.
    #[error("session timeout {0:?} is too short (at least 100 ms)")]
    SessionTimeout(Duration),
    /// The identity is empty; candidates must be told apart.
    #[error("the identity of a candidate must not be empty")]
    EmptyIdentity,
    /// No session could be established with the servers.
    #[error("cannot connect to ZooKeeper at {servers}: {source}")]
    Connect {
        /// The connection string, any password redacted.
        servers: String,
        /// The client's error.
        source: zk::Error,
    },
    /// A request to ZooKeeper failed.
    #[error("ZooKeeper request failed: {0}")]
    Request(#[from] zk::Error),
    /// The election path exists and its ACL lets this user create no node in it: with digest
    /// credentials, a wrong password (ZooKeeper accepts any password and derives another
    /// identity from it) or a user other than the election's.
    #[error(
        "ZooKeeper user {user:?} may not campaign at {path}: its ACL lets only {granted:?} create nodes (wrong password, or another user's election)"
    )]
    NotAuthorized {
        /// The election path.
        path: String,
        /// The digest user.
        user: String,
        /// Who may create nodes there (`scheme:user`, without digests).
        granted: Vec<String>,
    },
    /// The TLS settings are unusable (a CA bundle or client certificate that is not PEM).
    #[error("ZooKeeper TLS settings: {0}")]
    Tls(String),
    /// No session could be established over TLS, and a handshake with the first server shows
    /// why (a server certificate from another CA, a name mismatch, a refused client certificate).
    #[error("cannot connect to ZooKeeper at {servers}: TLS handshake failed: {reason}")]
    TlsHandshake {
        /// The connection string.
        servers: String,
        /// What the handshake said.
        reason: String,
    },
    /// A request to ZooKeeper got no answer in time.
    #[error("ZooKeeper request timed out after {0:?}")]
    Timeout(Duration),
}

/// The leader of an election as seen from outside (for `tenure status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkLeader {
    /// The leader's identity: the data of its node (a LeaderLatch's participant id).
    pub identity: String,
    /// The leader's fencing term: the creation zxid of its node.
    pub term: tenure::Term,
    /// The name of the leader's node under the election path.
    pub node: String,
}

/// One election on a ZooKeeper ensemble: a connection string and an election path.
///
/// Why it exists: it validates the address once, keeps a session for status queries
/// ([`ZkElection::leader`]), and starts candidates ([`ZkElection::campaign`]), each with its own
/// session so that each one's liveness is judged by the server on its own.
#[derive(Debug, Clone)]
pub struct ZkElection {
    servers: String,
    path: String,
    session_timeout: Duration,
    /// The session timeout the server granted at connect: what candidates' sessions get.
    negotiated_timeout: Duration,
    drain_timeout: Duration,
    /// The session for status queries, replaced when it expires.
    client: Arc<Mutex<zk::Client>>,
    /// Credentials of every session, and the ACL of the nodes created.
    access: ZkOptions,
    /// The election node of the last term a fenced multi-operation ran under, found once per
    /// tenure so that every later fenced write is one round trip.
    fence_node: Arc<Mutex<Option<(Term, String)>>>,
}

impl ZkElection {
    /// Connects to `servers` ("host:port,host:port") for the election at `path` (an absolute
    /// path, created on first campaign if missing). `session_timeout` is what the candidates ask
    /// the server for; the server may clamp it to its own bounds (2 to 20 ticks by default).
    pub async fn connect(servers: &str, path: &str, session_timeout: Duration) -> Result<ZkElection, ZkError> {
        Self::connect_with(servers, path, session_timeout, ZkOptions::default()).await
    }

    /// Connects like [`ZkElection::connect`], authenticating every session as `options` say and
    /// protecting the nodes it creates accordingly (see [`ZkOptions`]). When the election path
    /// exists and its ACL shuts this user out (a wrong password), fails with
    /// [`ZkError::NotAuthorized`] here rather than campaigning in vain.
    pub async fn connect_with(
        servers: &str, path: &str, session_timeout: Duration, options: ZkOptions,
    ) -> Result<ZkElection, ZkError> {
        validate_path(path)?;
        if session_timeout < Duration::from_millis(100) {
            return Err(ZkError::SessionTimeout(session_timeout));
        }
        if tenure::redact::without_credentials(servers) != servers {
            tracing::warn!(
                servers = %tenure::redact_credentials(servers),
                "the user and password in a ZooKeeper server list are not used: give them as ZkOptions::with_digest"
            );
        }
        let servers = options.connect_string(servers);
        let client = match open_session(&servers, session_timeout, &options).await {
            Ok(client) => client,
            #[cfg(feature = "tls")]
            Err(ZkError::Connect { servers, source }) if options.uses_tls() => {
                return Err(match options.explain_tls_failure(&servers).await {
                    Some(reason) => ZkError::TlsHandshake { servers, reason },
                    None => ZkError::Connect { servers, source },
                });
            }
            Err(error) => return Err(error),
        };
        with_timeout_of(session_timeout, options.check_may_campaign(&client, path)).await?;
        let negotiated_timeout = granted_timeout(client.session_timeout(), session_timeout);
        if negotiated_timeout != session_timeout {
            tracing::warn!(
                servers = %tenure::redact_credentials(&servers),
                asked = ?session_timeout,
                granted = ?negotiated_timeout,
                "ZooKeeper grants a different session timeout than asked for; the lease, the self-fencing deadline and the status follow what it grants"
            );
        }
        let (path, drain_timeout, client) = (path.to_owned(), negotiated_timeout * 2 / 3, Arc::new(Mutex::new(client)));
        let fence_node = Arc::default();
        Ok(ZkElection {
            servers, path, session_timeout, negotiated_timeout, drain_timeout, client, access: options, fence_node,
        })
    }

    /// How long a resign or shutdown waits for the [`tenure::Tenure`] guards of the ending term
    /// to be dropped before it deletes the node anyway. Default: 2/3 of the session timeout.
    #[must_use]
    pub fn with_drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = drain_timeout;
        self
    }

    /// The election path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The session timeout candidates ask for.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The session timeout the server granted when this election connected (its
    /// `minSessionTimeout`/`maxSessionTimeout` bound what clients ask for). Why it matters: the
    /// server expires sessions by this timeout, so the candidates' [`Timing`] (lease, renew
    /// deadline, and what `/status` reports) is derived from it, not from the request.
    pub fn negotiated_session_timeout(&self) -> Duration {
        self.negotiated_timeout
    }

    /// Starts a candidate named `identity` on the current tokio runtime. It opens its own
    /// session, and keeps campaigning (through disconnects and session expiries) until it is
    /// shut down or every handle is dropped.
    pub fn campaign(&self, identity: impl Into<String>) -> Result<Elector, ZkError> {
        let identity = identity.into();
        if identity.is_empty() {
            return Err(ZkError::EmptyIdentity);
        }
        let (servers, path, access) = (self.servers.clone(), self.path.clone(), self.access.clone());
        let address = tenure::redact::without_credentials(&servers).into_owned();
        let (session_timeout, id) = (self.session_timeout, identity.clone());
        let transport = transport::ZkTransport::new(transport::Election {
            servers, address, path, session_timeout, identity: id, access,
        });
        let latch = latch::ZkLatch::new(identity.clone(), self.session_timeout);
        let drain_timeout = self.drain_timeout;
        Ok(Elector::from_driver(identity, timing_of(self.negotiated_timeout), move |publisher, commands| {
            tenure::shell::run(latch, transport, publisher, drain_timeout, commands)
        }))
    }

    /// Who leads now: the lowest latch node's identity, term and name; `None` when nobody
    /// campaigns (or the path does not exist yet).
    pub async fn leader(&self) -> Result<Option<ZkLeader>, ZkError> {
        match self.read_leader().await {
            Err(error) if session_ended(&error) => {
                // The status session ended (a long partition): open a new one and ask again.
                self.reconnect().await?;
                self.read_leader().await
            }
            result => result,
        }
    }

    /// The election's own session (not a candidate's), authenticated as the election's user.
    /// Why public: stores layered on the election (fenced checkpoints in `tenure-ha`) write with
    /// it, in multi-operations that check the election node of their term
    /// ([`ZkElection::leader_node`]). After [`ZkError::Request`] with an ended session
    /// ([`session_ended`]), call [`ZkElection::reconnect`].
    pub fn client(&self) -> zk::Client {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the election's own session after it ended (expired in a long partition, closed).
    pub async fn reconnect(&self) -> Result<(), ZkError> {
        let client = open_session(&self.servers, self.session_timeout, &self.access).await?;
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = client;
        Ok(())
    }

    /// The ACL the election gives the nodes it creates (see [`ZkOptions`]): what a layered store
    /// gives its own nodes, so that the same users may change them.
    pub fn acls(&self) -> zk::Acls<'static> {
        self.access.acls()
    }

    /// The full path of the election node of the tenure `term` (the node whose creation zxid is
    /// the term), or `None` once it is gone. Why: while that node exists, its candidate's session
    /// lives and no other candidate can lead, so a multi-operation that checks it
    /// (`check_version(node, -1)`) applies only while the tenure of `term` may still hold, and is
    /// refused by the server itself once it cannot: the ZooKeeper counterpart of etcd's
    /// `leader_compare`. Node names carry a per-client guid, so a node, once gone, never returns.
    pub async fn leader_node(&self, term: Term) -> Result<Option<String>, ZkError> {
        let client = self.client();
        let children = match with_timeout(self.session_timeout, client.list_children(&self.path)).await {
            Ok(children) => children,
            Err(ZkError::Request(zk::Error::NoNode)) => return Ok(None),
            Err(error) => return Err(error),
        };
        // The leader's node comes first in election order: usually one request.
        for child in naming::in_election_order(children) {
            let node = format!("{}/{}", self.path, child);
            match with_timeout(self.session_timeout, client.check_stat(&node)).await? {
                Some(stat) if term_of(stat.czxid) == term => return Ok(Some(node)),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Applies the user's multi-operation (the operations `ops` adds: creates, sets, deletes,
    /// version checks) only while the tenure of `term` is the current one, checked by the server
    /// in the same operation (W2): `check_version(<election node of term>, -1)` goes first. A
    /// leader paused between its last check and this write (SIGSTOP, GC, a frozen VM), or one
    /// writing through a session that outlived its candidate's, gets
    /// [`FencedMultiError::Deposed`] once its node is gone, however late the write arrives.
    ///
    /// Why a typed answer: a failed operation of the user's own ([`FencedMultiError::Operation`],
    /// e.g. a compare-and-set that lost, worth a re-read) and a deposed writer (who must stop) call
    /// for opposite reactions. On success, the results of the user's operations, in order.
    ///
    /// Writes through the election's own session ([`ZkElection::client`]); after it ended
    /// (expired in a long partition) a new one is opened and the write sent once more: a request
    /// refused for an expired session was not applied. `ops` may run twice for that reason. One
    /// round trip per write: the node of `term` is looked up once per tenure and kept, and only
    /// if it leads then (a queued follower's term is refused as deposed).
    pub async fn fenced_multi<F>(&self, term: Term, ops: F) -> Result<Vec<zk::MultiWriteResult>, FencedMultiError>
    where
        F: Fn(&mut zk::MultiWriter<'_>) -> Result<(), zk::Error>,
    {
        fenced::zxid_of(term)?;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.try_fenced_multi(term, &ops).await {
                Err(FencedMultiError::Zk(error)) if session_ended(&error) && attempts < 2 => self.reconnect().await?,
                result => return result,
            }
        }
    }

    async fn try_fenced_multi<F>(&self, term: Term, ops: &F) -> Result<Vec<zk::MultiWriteResult>, FencedMultiError>
    where
        F: Fn(&mut zk::MultiWriter<'_>) -> Result<(), zk::Error>,
    {
        let cached = self.fence_node.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let node = match cached {
            Some((cached, node)) if cached == term => node,
            // Only the node that leads now: a queued follower's node passes the check as well,
            // but the node that leads stays first until it is gone (sequence numbers only grow).
            _ => match self.leader().await? {
                Some(leader) if leader.term == term => {
                    let node = format!("{}/{}", self.path, leader.node);
                    *self.fence_node.lock().unwrap_or_else(|e| e.into_inner()) = Some((term, node.clone()));
                    node
                }
                other => return Err(FencedMultiError::Deposed { path: self.path.clone(), term, shows: shows(other) }),
            },
        };
        let client = self.client();
        let mut multi = client.new_multi_writer();
        multi.add_check_version(&node, -1).map_err(FencedMultiError::Invalid)?;
        ops(&mut multi).map_err(FencedMultiError::Invalid)?;
        let committed = tokio::time::timeout(self.session_timeout, multi.commit()).await;
        let error = match committed {
            Err(_) => return Err(ZkError::Timeout(self.session_timeout).into()),
            Ok(Ok(mut results)) => {
                if !results.is_empty() {
                    results.remove(0);
                }
                return Ok(results);
            }
            Ok(Err(error)) => error,
        };
        fenced::classify(error)?;
        self.forget_fence_node(term);
        Err(self.deposed(term).await)
    }

    /// Forgets the election node of `term` once its tenure is known to be over.
    fn forget_fence_node(&self, term: Term) {
        let mut cache = self.fence_node.lock().unwrap_or_else(|e| e.into_inner());
        if cache.as_ref().is_some_and(|(cached, _)| *cached == term) {
            *cache = None;
        }
    }

    /// The deposed answer for `term`, naming who leads now (or why that is unknown).
    async fn deposed(&self, term: Term) -> FencedMultiError {
        let shows = match self.leader().await {
            Ok(leader) => shows(leader),
            Err(error) => format!("a leader it could not read: {error}"),
        };
        FencedMultiError::Deposed { path: self.path.clone(), term, shows }
    }

    async fn read_leader(&self) -> Result<Option<ZkLeader>, ZkError> {
        let call_timeout = self.session_timeout;
        let client = self.client();
        loop {
            let children = match with_timeout(call_timeout, client.list_children(&self.path)).await {
                Ok(children) => children,
                Err(ZkError::Request(zk::Error::NoNode)) => return Ok(None),
                Err(err) => return Err(err),
            };
            let Some(first) = naming::in_election_order(children).into_iter().next() else {
                return Ok(None);
            };
            let node_path = format!("{}/{}", self.path, first);
            match with_timeout(call_timeout, client.get_data(&node_path)).await {
                Ok((data, stat)) => {
                    let identity = String::from_utf8_lossy(&data).into_owned();
                    return Ok(Some(ZkLeader { identity, term: term_of(stat.czxid), node: first }));
                }
                // The leader left between the two reads: look again.
                Err(ZkError::Request(zk::Error::NoNode)) => continue,
                Err(err) => return Err(err),
            }
        }
    }
}

/// Who leads, as a deposed writer is told.
fn shows(leader: Option<ZkLeader>) -> String {
    match leader {
        Some(leader) => format!("{:?} leading at term {} with node {}", leader.identity, leader.term, leader.node),
        None => String::from("no leader"),
    }
}

/// True when `error` says the session a request went through has ended (expired, closed or
/// moved), so that only a new session can go on.
pub fn session_ended(error: &ZkError) -> bool {
    matches!(error, ZkError::Request(zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved))
}

/// What a session really gets: the server's grant, never more than was asked for (a grant of
/// zero, which no server sends, counts as the request).
fn granted_timeout(granted: Duration, asked: Duration) -> Duration {
    if granted.is_zero() { asked } else { granted.min(asked) }
}

/// The core's timing that describes a ZooKeeper session: the lease is the session timeout, the
/// renew deadline is the self-fencing margin (2/3), the retry period the leader's heartbeat (1/3).
pub fn timing_of(session_timeout: Duration) -> Timing {
    let (lease_duration, retry_period) = (session_timeout, session_timeout / 3);
    let renew_deadline = session_timeout * 2 / 3;
    Timing { lease_duration, renew_deadline, retry_period, jitter_factor: 0.0, call_timeout: retry_period }
}

async fn open_session(servers: &str, session_timeout: Duration, options: &ZkOptions) -> Result<zk::Client, ZkError> {
    options
        .connector(session_timeout)
        .connect(&tenure::redact::without_credentials(servers))
        .await
        .map_err(|source| ZkError::Connect { servers: tenure::redact_credentials(servers).into_owned(), source })
}

fn validate_path(path: &str) -> Result<(), ZkError> {
    let rules = [
        (!path.starts_with('/'), "it must start with '/'"),
        (path.len() < 2, "the root cannot be an election path"),
        (path.ends_with('/'), "it must not end with '/'"),
        (path.contains("//"), "it has an empty component"),
    ];
    match rules.into_iter().find(|(broken, _)| *broken) {
        Some((_, reason)) => Err(ZkError::InvalidPath { path: path.to_owned(), reason }),
        None => Ok(()),
    }
}

/// A creation zxid as a term (zxids are positive).
fn term_of(czxid: i64) -> tenure::Term {
    tenure::Term::from_count(czxid)
}

/// A request within `limit`.
async fn with_timeout<T>(limit: Duration, request: impl Future<Output = Result<T, zk::Error>>) -> Result<T, ZkError> {
    let answer = tokio::time::timeout(limit, request).await;
    answer.map_or(Err(ZkError::Timeout(limit)), |result| result.map_err(ZkError::Request))
}

/// `check` within `limit`.
async fn with_timeout_of<T>(limit: Duration, check: impl Future<Output = Result<T, ZkError>>) -> Result<T, ZkError> {
    tokio::time::timeout(limit, check).await.unwrap_or(Err(ZkError::Timeout(limit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_string_with_a_password_fails_without_showing_it() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        for servers in
            [format!("admin:s3cret@127.0.0.1:{port}"), format!("127.0.0.1:{port},admin:s3cret@127.0.0.1:{port}")]
        {
            let connecting = ZkElection::connect(&servers, "/x", Duration::from_secs(1));
            let error = match tokio::time::timeout(Duration::from_secs(10), connecting).await {
                Ok(Err(error)) => error,
                Ok(Ok(_)) => panic!("connected to nothing"),
                Err(_) => panic!("still connecting after 10 s"),
            };
            let shown = format!("{error} / {error:?}");
            assert!(shown.contains("admin:***@127.0.0.1"), "{shown}");
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    #[test]
    fn election_paths_are_validated() {
        assert!(validate_path("/a").is_ok());
        assert!(validate_path("/a/b").is_ok());
        assert!(validate_path("a").is_err());
        assert!(validate_path("/").is_err());
        assert!(validate_path("/a/").is_err());
        assert!(validate_path("/a//b").is_err());
    }

    #[test]
    fn session_timing_fences_before_expiry() {
        let timing = timing_of(Duration::from_secs(6));
        assert_eq!(timing.renew_deadline, Duration::from_secs(4));
        assert_eq!(timing.retry_period, Duration::from_secs(2));
        assert!(timing.renew_deadline < timing.lease_duration);
    }
}
