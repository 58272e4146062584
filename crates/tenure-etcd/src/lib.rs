//! # tenure-etcd: a native etcd elector for Tenure
//!
//! Runs the election protocol of etcd's own `concurrency` package, so that Tenure candidates and
//! `etcdctl elect NAME` candidates in the same election agree on one leader:
//!
//! - every candidate holds a lease and puts the key `<election>/<lease id in hex>` bound to it,
//!   with its identity as value (etcd's "proposal");
//! - the leader is the key with the lowest create revision; the others queue behind it in create
//!   order, each waiting for the deletion of its predecessor (the key with the greatest create
//!   revision below its own);
//! - the [`tenure::Term`] of a tenure is the create revision of the leader's key: it grows with
//!   every new key, so it is a fencing token: [`EtcdElection::fenced_txn`] runs a user's
//!   transaction only while the key of its term exists, and answers [`FencedTxnError::Deposed`]
//!   otherwise (checked by etcd in the same transaction).
//!
//! Where it does better than etcd's `Campaign`: it checks that its own key still exists before it
//! claims leadership (etcd issue #11777), and it fences itself on the client side: a candidate
//! holds its session only until `start of the last successful keep-alive + TTL - TTL/3` on its
//! monotonic clock, so a leader that cannot renew (paused, cut off) stops leading before the
//! server can expire its lease and elect the next one, as long as the two clocks run at rates
//! within 20 % of each other (see [`self_fencing_margin`]).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tenure_etcd::EtcdElection;
//! let election = EtcdElection::connect(&["127.0.0.1:2379".into()], "my-service").await?;
//! let elector = election.campaign("replica-a", Duration::from_secs(10))?;
//! let tenure = elector.acquired().await?;
//! // ... leader work, with tenure.check()? before each side effect ...
//! drop(tenure);
//! elector.shutdown().await?;      // deletes the key: the next candidate leads at once
//! # Ok(()) }
//! ```
//!
//! A secured cluster (TLS, client certificates, etcd users) is reached with
//! [`EtcdElection::connect_with`] and [`EtcdOptions`].
#![warn(missing_docs)]

mod access;
pub mod campaign;
mod client;
mod fenced;
mod transport;
pub mod group_store;
pub mod proto;

pub use fenced::FencedTxnError;
pub use group_store::EtcdGroupStore;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Elector, Term, Timing};

pub use crate::access::{EtcdOptions, EtcdTls};
use crate::client::Connection;
use crate::proto::etcdserverpb::{Compare, RequestOp, TxnRequest, TxnResponse};

/// etcd's smallest lease TTL with its default timing (heartbeat 100 ms, election timeout 1 s):
/// the server raises shorter TTLs to this silently, which would make the client's self-fencing
/// deadline wrong, so shorter TTLs are rejected.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// The longest TTL accepted: anything above a day is a typo.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long before the server could expire the lease a candidate stops trusting its session:
/// TTL/3. A candidate holds its session until `start of its last successful keep-alive + TTL -
/// margin`; the server keeps the lease at least until `receipt of that keep-alive + TTL`, which is
/// later. The margin absorbs clock-rate differences up to `margin / (2 TTL - margin)` = 20 %, and
/// leaves two keep-alives (every TTL/4) that may fail before the candidate fences itself.
pub fn self_fencing_margin(ttl: Duration) -> Duration {
    ttl / 3
}

/// Why an etcd election could not be set up or used.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,
    /// An endpoint is not a valid `host:port` or URL.
    #[error("invalid etcd endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The election name is empty, so its keys would mix with unrelated keys.
    #[error("the election name must not be empty")]
    EmptyElection,
    /// The identity is empty; candidates must be told apart.
    #[error("the identity of a candidate must not be empty")]
    EmptyIdentity,
    /// The lease TTL is out of range or not whole seconds.
    #[error("lease TTL {ttl:?} is invalid: {reason}")]
    BadTtl {
        /// The TTL given.
        ttl: Duration,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// An etcd call failed.
    #[error("etcd call to {endpoint} failed: {code:?}: {message}")]
    Rpc {
        /// The endpoint that answered (or failed to).
        endpoint: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
    /// The TLS settings are unusable (a CA bundle or client certificate that is not PEM).
    #[error("etcd TLS settings: {0}")]
    Tls(String),
    /// The cluster refused the user name or password (or has auth disabled).
    #[error("etcd at {endpoint} refused to authenticate user {user:?}: {message}")]
    Authentication {
        /// The endpoint that answered.
        endpoint: String,
        /// The etcd user.
        user: String,
        /// The server's message.
        message: String,
    },
    /// An etcd call took longer than its time limit.
    #[error("etcd call timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered something this client cannot use.
    #[error("unexpected answer from etcd: {0}")]
    Protocol(String),
}

/// The current leader of an election, as stored in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdLeader {
    /// The leader's identity (the value of its key; etcd calls it the proposal).
    pub identity: String,
    /// The term: the create revision of the leader's key.
    pub term: Term,
    /// The leader's lease, as etcd numbers it.
    pub lease: i64,
    /// The leader's key, `<election>/<lease in hex>`.
    pub key: String,
}

/// A connection to an etcd cluster and the name of one election on it.
///
/// Why a separate value from the elector: the CLI's `status` asks who leads without campaigning,
/// and one process may campaign several identities (tests) over one connection.
#[derive(Debug, Clone)]
pub struct EtcdElection {
    conn: Arc<Connection>,
    /// The key prefix, `<election>/`.
    prefix: String,
    /// How long resign and shutdown wait for tenure guards; `None`: the renew deadline.
    drain_timeout: Option<Duration>,
    /// The election key of the last term a fenced transaction ran under, found once per tenure
    /// so that every later fenced write is one round trip.
    fence_key: Arc<Mutex<Option<(Term, String)>>>,
}

/// Time limit of single calls made outside a campaign (`leader`, `fenced_txn`, `connect`).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl EtcdElection {
    /// Connects to the cluster at `endpoints` (`host:port`, several for failover) and checks that
    /// one of them answers. `election` is the election's name, as given to `etcdctl elect NAME`.
    pub async fn connect(endpoints: &[String], election: &str) -> Result<EtcdElection, EtcdError> {
        Self::connect_with(endpoints, election, &EtcdOptions::default()).await
    }

    /// Connects like [`EtcdElection::connect`] to a secured cluster: over TLS and/or as an etcd
    /// user, as `options` say. The first call (a read of the election) authenticates, so a wrong
    /// CA, a refused client certificate or a wrong password fail here, before any campaign.
    pub async fn connect_with(
        endpoints: &[String], election: &str, options: &EtcdOptions,
    ) -> Result<EtcdElection, EtcdError> {
        if election.is_empty() {
            return Err(EtcdError::EmptyElection);
        }
        let conn = Arc::new(Connection::new(endpoints, options)?);
        let prefix = format!("{election}/");
        let election = EtcdElection { conn, prefix, drain_timeout: None, fence_key: Arc::default() };
        election.leader().await?;
        Ok(election)
    }

    /// Sets how long a resign or shutdown of a leader waits for the [`tenure::Tenure`] guards of
    /// the ending term to be dropped before it deletes the key anyway (default: the renew
    /// deadline, TTL - TTL/3). The key stays while guards are held, so nobody else leads while
    /// this instance is still finishing leader work.
    #[must_use]
    pub fn with_drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = Some(drain_timeout);
        self
    }

    /// How many requests this connection has sent so far (unary calls, keep-alives, watch
    /// creations), for metrics and for measuring the load candidates put on the cluster.
    pub fn requests_sent(&self) -> u64 {
        self.conn.requests_sent()
    }

    /// The prefix of the candidates' keys, `<election>/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Starts campaigning as `identity` with a lease of `ttl` (whole seconds, 2 s to 24 h) and
    /// returns the core's [`Elector`] handle. Must be called within a tokio runtime.
    ///
    /// The handle's [`Timing`] describes the session: lease duration = TTL, renew deadline = TTL
    /// minus the [`self_fencing_margin`], retry period = the keep-alive interval (TTL/4).
    pub fn campaign(&self, identity: impl Into<String>, ttl: Duration) -> Result<Elector, EtcdError> {
        let identity = identity.into();
        if identity.is_empty() {
            return Err(EtcdError::EmptyIdentity);
        }
        let timing = session_timing(ttl)?;
        let drain_timeout = self.drain_timeout.unwrap_or(timing.renew_deadline);
        let campaign = campaign::EtcdCampaign::new(identity.clone(), self.prefix.clone(), timing);
        let (conn, prefix, id) = (self.conn.clone(), self.prefix.clone(), identity.clone());
        let transport = transport::EtcdTransport::new(conn, prefix, id, timing.call_timeout, timing.retry_period);
        Ok(Elector::from_driver(identity, timing, move |publisher, commands| {
            tenure::shell::run(campaign, transport, publisher, drain_timeout, commands)
        }))
    }

    /// Who leads now (for `tenure status`): the key with the lowest create revision.
    pub async fn leader(&self) -> Result<Option<EtcdLeader>, EtcdError> {
        let response = self.conn.range(CALL_TIMEOUT, client::first_created(&self.prefix)).await?;
        Ok(response.kvs.into_iter().next().map(|kv| EtcdLeader {
            identity: String::from_utf8_lossy(&kv.value).into_owned(),
            term: Term::from_count(kv.create_revision),
            lease: kv.lease,
            key: String::from_utf8_lossy(&kv.key).into_owned(),
        }))
    }

    /// Runs `success` in one transaction only if the tenure of `term` still holds, that is, the
    /// leader key created at revision `term` still exists; returns whether it ran. This is the
    /// fencing check for writes to etcd: a paused ex-leader whose key expired cannot write.
    ///
    /// Kept for callers that only need a yes or no: it is [`EtcdElection::fenced_txn`] without
    /// compares of its own, with "deposed" (or a term no tenure has) answered as
    /// `succeeded == false`. One round trip once the key of `term` is known.
    pub async fn guarded_txn(&self, term: Term, success: Vec<RequestOp>) -> Result<TxnResponse, EtcdError> {
        let request = TxnRequest { compare: Vec::new(), success, failure: Vec::new() };
        match self.fenced_txn(term, request).await {
            Ok(response) => Ok(response),
            Err(FencedTxnError::Deposed { .. } | FencedTxnError::BadTerm { .. }) => {
                Ok(TxnResponse { succeeded: false, ..Default::default() })
            }
            Err(FencedTxnError::Etcd(error)) => Err(error),
        }
    }

    /// Runs the user's transaction `request` (its compares, success and failure operations, as
    /// etcd's `Txn` would) only while the tenure of `term` is the current one, checked by etcd in
    /// the same transaction (W2). A leader paused between its last check and this write
    /// (SIGSTOP, GC, a frozen VM) gets [`FencedTxnError::Deposed`] once its key expired, however
    /// late the write arrives, and nothing of `request` runs.
    ///
    /// Why a typed answer rather than `succeeded == false`: a failed compare of the user's own
    /// (a compare-and-swap that lost, worth a re-read and a retry) and a deposed writer (who must
    /// stop) call for opposite reactions. On `Ok`, `succeeded` is the user's compares' verdict,
    /// `responses` those of the branch that ran, and `header` the transaction's revision.
    ///
    /// One round trip per write: the election key of `term` is looked up once per tenure
    /// ([`EtcdElection::leader_key`]) and kept. The term of an `etcdctl elect` leader (from
    /// [`EtcdElection::leader`]) fences alike: the election key is etcd's own.
    pub async fn fenced_txn(&self, term: Term, request: TxnRequest) -> Result<TxnResponse, FencedTxnError> {
        fenced::revision_of(term)?;
        let cached = self.fence_key.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let key = match cached {
            Some((cached, key)) if cached == term => key,
            _ => match self.leader_key(term).await? {
                Some(key) => {
                    *self.fence_key.lock().unwrap_or_else(|e| e.into_inner()) = Some((term, key.clone()));
                    key
                }
                None => {
                    let shows = match self.leader().await? {
                        Some(leader) => format!("{:?} leading at term {} with key {}", leader.identity, leader.term, leader.key),
                        None => String::from("no leader"),
                    };
                    return Err(self.deposed(term, shows));
                }
            },
        };
        let (outer, nested) = fenced::outer_txn(&self.prefix, &key, term, request);
        match fenced::user_answer(self.conn.txn(CALL_TIMEOUT, outer).await?, nested) {
            Ok(answer) => Ok(answer),
            Err(Some(shows)) => {
                let mut cache = self.fence_key.lock().unwrap_or_else(|e| e.into_inner());
                if cache.as_ref().is_some_and(|(cached, _)| *cached == term) {
                    *cache = None;
                }
                Err(self.deposed(term, shows))
            }
            Err(None) => Err(EtcdError::Protocol(String::from("a fenced transaction's answer lacks its nested answer")).into()),
        }
    }

    fn deposed(&self, term: Term, shows: String) -> FencedTxnError {
        let election = self.prefix.trim_end_matches('/').to_owned();
        FencedTxnError::Deposed { election, term, shows }
    }

    /// The key of the candidate whose tenure is `term` (created at revision `term`), if it leads:
    /// it exists and no key of the election is older. Why: a writer that makes many fenced writes
    /// finds the key once per tenure and puts [`leader_compare`] into each of its own
    /// transactions ([`EtcdElection::txn`]); [`EtcdElection::fenced_txn`] does so for its
    /// callers. Checking "oldest" once is enough: keys are only ever created at the current
    /// revision, so a key that leads keeps leading until it is gone, which the compare sees.
    /// `None` also for a queued follower's term (a caller's mistake).
    pub async fn leader_key(&self, term: Term) -> Result<Option<String>, EtcdError> {
        let revision = i64::try_from(term.0).map_err(|_| EtcdError::Protocol(format!("term {term} out of range")))?;
        let first = self.conn.range(CALL_TIMEOUT, client::first_created(&self.prefix)).await?.kvs.into_iter().next();
        Ok(first.filter(|kv| kv.create_revision == revision).map(|kv| String::from_utf8_lossy(&kv.key).into_owned()))
    }

    /// Runs a transaction as given, on this election's connection. Why: stores layered on the
    /// election (fenced checkpoints in `tenure-ha`) combine [`leader_compare`] with compares of
    /// their own; the connection's failover applies to them too.
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.conn.txn(CALL_TIMEOUT, request).await
    }

    /// The value of `key` and its revisions, if it exists. Why: stores layered on the election
    /// read their own keys (a checkpoint) over the same connection.
    pub async fn get(&self, key: &str) -> Result<Option<proto::mvccpb::KeyValue>, EtcdError> {
        let request = proto::etcdserverpb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        Ok(self.conn.range(CALL_TIMEOUT, request).await?.kvs.into_iter().next())
    }
}

/// The comparison that holds exactly while the tenure of `term` lasts: the create revision of the
/// leader's `key` equals `term`. Put it in the `compare` list of any transaction that must only
/// apply while this leader leads.
pub fn leader_compare(key: &str, term: Term) -> Compare {
    client::create_revision_is(key, i64::try_from(term.0).unwrap_or(i64::MAX))
}

/// The core's timing for a session of `ttl`: checks etcd's rules on lease TTLs.
pub fn session_timing(ttl: Duration) -> Result<Timing, EtcdError> {
    if ttl < MIN_TTL {
        return Err(EtcdError::BadTtl { ttl, reason: "etcd's minimum lease TTL is 2 s" });
    }
    if ttl > MAX_TTL {
        return Err(EtcdError::BadTtl { ttl, reason: "the maximum is 24 h" });
    }
    if ttl.subsec_nanos() != 0 {
        return Err(EtcdError::BadTtl { ttl, reason: "etcd grants leases in whole seconds" });
    }
    let renew_deadline = ttl - self_fencing_margin(ttl);
    Timing::new(ttl, renew_deadline, ttl / 4)
        .map_err(|_| EtcdError::BadTtl { ttl, reason: "no valid session timing for this TTL" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rules() {
        assert!(matches!(session_timing(Duration::from_secs(1)), Err(EtcdError::BadTtl { .. })));
        assert!(matches!(session_timing(Duration::from_millis(2500)), Err(EtcdError::BadTtl { .. })));
        let timing = session_timing(Duration::from_secs(3)).unwrap();
        assert_eq!(timing.renew_deadline, Duration::from_secs(2));
        assert_eq!(timing.retry_period, Duration::from_millis(750));
    }

    #[test]
    fn compare_targets_create_revision() {
        let compare = leader_compare("e/1a", Term(42));
        assert_eq!(compare.key, b"e/1a".to_vec());
        assert_eq!(compare.target_union, Some(proto::etcdserverpb::compare::TargetUnion::CreateRevision(42)));
    }
}
