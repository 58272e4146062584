//! A small etcd v3 client over tonic: the calls the elector needs, with failover between the
//! endpoints of a cluster.
//!
//! Why not a general client: the election needs six calls (range, txn, delete, lease grant,
//! revoke, keep-alive) and one watch; owning them keeps the failover rule explicit (a transport
//! failure moves every later call to the next endpoint) and the build free of `protoc`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::timeout;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::access::{AuthedChannel, Authenticator, EtcdOptions, TokenInterceptor};
use crate::proto::etcdserverpb::kv_client::KvClient;
use crate::proto::etcdserverpb::lease_client::LeaseClient;
use crate::proto::etcdserverpb::watch_client::WatchClient;
use crate::proto::etcdserverpb::{
    compare, range_request, request_op, watch_request, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest, PutRequest, RangeRequest,
    RangeResponse, RequestOp, TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest, WatchResponse,
};
use crate::EtcdError;

/// The channels to every endpoint of one cluster and the index of the one in use.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Each endpoint's name (as given, password redacted) and channel.
    endpoints: Vec<(String, Channel)>,
    current: AtomicUsize,
    /// Requests sent (unary calls, keep-alives, watch creations), for metrics.
    requests: AtomicU64,
    /// The etcd user's token source, when the cluster has auth enabled.
    auth: Option<Arc<Authenticator>>,
}

/// gRPC codes after which another member may do better: the member is down, cut off from the
/// raft leader, or too slow.
fn worth_failing_over(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Internal | Code::Aborted
    )
}

impl Connection {
    /// Lazily connected channels to `endpoints` (`host:port`, `http://host:port`, or with TLS
    /// `https://host:port`), secured as `options` say.
    pub(crate) fn new(endpoints: &[String], options: &EtcdOptions) -> Result<Connection, EtcdError> {
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        let mut channels = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            // The name used in errors and logs never shows a password.
            let name = tenure::redact_credentials(endpoint).into_owned();
            // Never sent: the user information would travel in clear text in the HTTP/2 authority.
            let address = tenure::redact::without_credentials(endpoint);
            if address != endpoint.as_str() {
                tracing::warn!(endpoint = %name, "the user and password in an etcd endpoint are not used: give them as EtcdOptions::with_user");
            }
            let uri = endpoint_uri(&address, options)?;
            let bad = |e: tonic::transport::Error| EtcdError::BadEndpoint {
                endpoint: name.clone(),
                reason: crate::access::error_chain(&e),
            };
            let mut builder = Endpoint::from_shared(uri).map_err(bad)?;
            if let Some(tls) = &options.tls {
                builder = builder.tls_config(tls.client_config()).map_err(bad)?;
            }
            let channel = builder
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(1))
                .keep_alive_while_idle(true)
                .connect_lazy();
            channels.push((name, channel));
        }
        Ok(Connection {
            endpoints: channels,
            current: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            auth: options.credentials.clone().map(Authenticator::new),
        })
    }

    /// How many requests were sent so far.
    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A call on the endpoint `index` took longer than `limit`: the next call tries another.
    fn timed_out<T>(&self, index: usize, limit: Duration) -> Result<T, EtcdError> {
        self.failed(index);
        Err(EtcdError::Timeout(limit))
    }

    /// The endpoint in use, with its index (to report a failure of exactly this one).
    pub(crate) fn pick(&self) -> (usize, Channel) {
        let index = self.current.load(Ordering::Acquire) % self.endpoints.len();
        (index, self.endpoints[index].1.clone())
    }

    fn name(&self, index: usize) -> &str {
        &self.endpoints[index % self.endpoints.len()].0
    }

    /// Moves to the next endpoint, unless another caller already moved away from `index`.
    pub(crate) fn failed(&self, index: usize) {
        let next = (index + 1) % self.endpoints.len();
        if self.current.compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire).is_ok()
            && self.endpoints.len() > 1
        {
            tracing::info!(from = self.name(index), to = self.name(next), "etcd endpoint failed; failing over");
        }
    }

    /// Turns a gRPC status into an error, failing over if another member may answer, and
    /// forgetting the auth token if the server refused it (the next call authenticates again).
    pub(crate) fn status_error(&self, index: usize, status: &tonic::Status) -> EtcdError {
        if worth_failing_over(status.code()) {
            self.failed(index);
        }
        if let Some(auth) = &self.auth {
            auth.refused(status.code(), status.message());
        }
        EtcdError::Rpc {
            endpoint: self.name(index).to_owned(),
            code: status.code(),
            message: crate::access::status_message(status),
        }
    }

    /// The endpoint in use, as a channel that carries the auth token (authenticating first when
    /// none is held).
    async fn pick_authed(&self, limit: Duration) -> Result<(usize, AuthedChannel), EtcdError> {
        let (index, channel) = self.pick();
        let interceptor = match &self.auth {
            None => TokenInterceptor::default(),
            Some(auth) => match auth.interceptor(self.name(index), &channel, limit).await {
                Ok(interceptor) => interceptor,
                Err(error) => {
                    if moved_on(&error) {
                        self.failed(index);
                    }
                    return Err(error);
                }
            },
        };
        Ok((index, tonic::service::interceptor::InterceptedService::new(channel, interceptor)))
    }

    /// One unary call within `limit`, tried on each endpoint in turn while the failures are
    /// transport failures and time is left.
    async fn unary<T, F, Fut>(&self, limit: Duration, call: F) -> Result<T, EtcdError>
    where
        F: Fn(AuthedChannel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let attempts = async {
            let mut last = None;
            // One attempt per endpoint, plus one on the same endpoint after a refused (expired)
            // token was dropped, so that the call is repeated with a new one.
            let mut tries_left = self.endpoints.len();
            let mut token_renewed = false;
            while tries_left > 0 {
                tries_left -= 1;
                let (index, channel) = match self.pick_authed(limit).await {
                    Ok(picked) => picked,
                    Err(error) if tries_left > 0 && moved_on(&error) => {
                        last = Some(error);
                        continue;
                    }
                    Err(error) => return Err(error),
                };
                self.count();
                match call(channel).await {
                    Ok(response) => return Ok(response.into_inner()),
                    Err(status) => {
                        let stale_token = self.auth.is_some()
                            && !token_renewed
                            && crate::access::is_stale_token(status.code(), status.message());
                        if stale_token {
                            token_renewed = true;
                            tries_left += 1;
                        }
                        let retry = worth_failing_over(status.code()) || stale_token;
                        let error = self.status_error(index, &status);
                        if !retry {
                            return Err(error);
                        }
                        last = Some(error);
                    }
                }
            }
            Err(last.unwrap_or(EtcdError::NoEndpoints))
        };
        timeout(limit, attempts).await.unwrap_or_else(|_| self.timed_out(self.pick().0, limit))
    }

    /// Range over `[key, range_end)` (or the single `key` when `range_end` is empty).
    pub(crate) async fn range(&self, limit: Duration, request: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.unary(limit, |channel| {
            let request = request.clone();
            async move { KvClient::new(channel).range(request).await }
        })
        .await
    }

    /// A transaction.
    pub(crate) async fn txn(&self, limit: Duration, request: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.unary(limit, |channel| {
            let request = request.clone();
            async move { KvClient::new(channel).txn(request).await }
        })
        .await
    }

    /// Deletes one key; true if it existed.
    pub(crate) async fn delete(&self, limit: Duration, key: &str) -> Result<bool, EtcdError> {
        let request = DeleteRangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self
            .unary(limit, |channel| {
                let request = request.clone();
                async move { KvClient::new(channel).delete_range(request).await }
            })
            .await?;
        Ok(response.deleted > 0)
    }

    /// Grants a lease of `ttl` seconds.
    pub(crate) async fn grant(&self, limit: Duration, ttl: i64) -> Result<LeaseGrantResponse, EtcdError> {
        let response = self
            .unary(limit, |channel| async move {
                LeaseClient::new(channel).lease_grant(LeaseGrantRequest { ttl, id: 0 }).await
            })
            .await?;
        if !response.error.is_empty() {
            return Err(EtcdError::Protocol(format!("lease grant failed: {}", response.error)));
        }
        Ok(response)
    }

    /// Revokes a lease (deleting its keys); `Ok` also when the lease is already gone.
    pub(crate) async fn revoke(&self, limit: Duration, lease: i64) -> Result<(), EtcdError> {
        let result = self
            .unary(limit, |channel| async move {
                LeaseClient::new(channel).lease_revoke(LeaseRevokeRequest { id: lease }).await
            })
            .await;
        match result {
            Ok(_) | Err(EtcdError::Rpc { code: Code::NotFound, .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Opens a keep-alive stream for `lease` on the endpoint in use, sending the first request.
    pub(crate) async fn keep_alive(&self, limit: Duration, lease: i64) -> Result<KeepAliveStream, EtcdError> {
        let (index, channel) = self.pick_authed(limit).await?;
        self.count();
        let (requests, receiver) = mpsc::channel(1);
        // Queued before the call: the server answers headers only with the first response.
        requests
            .try_send(LeaseKeepAliveRequest { id: lease })
            .map_err(|_| EtcdError::Protocol("keep-alive queue".into()))?;
        let mut request = tonic::Request::new(receiver_stream(receiver));
        request.metadata_mut().insert("hasleader", tonic::metadata::MetadataValue::from_static("true"));
        match timeout(limit, LeaseClient::new(channel).lease_keep_alive(request)).await {
            Ok(Ok(response)) => {
                Ok(KeepAliveStream { index, lease, requests, responses: response.into_inner(), first: true })
            }
            Ok(Err(status)) => Err(self.status_error(index, &status)),
            Err(_) => self.timed_out(index, limit),
        }
    }

    /// Opens a watch of the keys with `prefix` from `start_revision`, and waits for the server to
    /// confirm it. The watch requires a raft leader: a member cut off from the cluster cancels it,
    /// so that a watcher never waits on a member that cannot see changes.
    pub(crate) async fn watch_prefix(
        &self, limit: Duration, prefix: &str, start_revision: i64,
    ) -> Result<WatchStream, EtcdError> {
        let (index, channel) = self.pick_authed(limit).await?;
        self.count();
        let (requests, receiver) = mpsc::channel(1);
        let (key, range_end) = (prefix.as_bytes().to_vec(), prefix_end(prefix));
        let create = WatchCreateRequest { key, range_end, start_revision, ..Default::default() };
        requests
            .try_send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) })
            .map_err(|_| EtcdError::Protocol("watch queue".into()))?;
        let mut request = tonic::Request::new(receiver_stream(receiver));
        request.metadata_mut().insert("hasleader", tonic::metadata::MetadataValue::from_static("true"));
        let opened = async {
            let mut responses = WatchClient::new(channel).watch(request).await?.into_inner();
            let first = responses.message().await?;
            Ok::<_, tonic::Status>((responses, first))
        };
        match timeout(limit, opened).await {
            Ok(Ok((responses, Some(first)))) if first.created && !first.canceled => {
                Ok(WatchStream { index, _requests: requests, responses })
            }
            Ok(Ok((_, first))) => Err(EtcdError::Protocol(format!(
                "watch not created: {}",
                first.map(|f| f.cancel_reason).unwrap_or_else(|| "stream ended".into())
            ))),
            Ok(Err(status)) => Err(self.status_error(index, &status)),
            Err(_) => self.timed_out(index, limit),
        }
    }
}

/// Whether a failed authentication moved the connection to the next endpoint (a transport
/// failure or a timeout), so that trying again may reach another member.
fn moved_on(error: &EtcdError) -> bool {
    matches!(error, EtcdError::Rpc { code, .. } if worth_failing_over(*code)) || matches!(error, EtcdError::Timeout(_))
}

/// The URI of `endpoint`: `host:port` gets the scheme the options call for; an explicit scheme
/// must agree with them, so that a TLS configuration is never silently unused.
fn endpoint_uri(endpoint: &str, options: &EtcdOptions) -> Result<String, EtcdError> {
    let bad = |reason: &str| EtcdError::BadEndpoint { endpoint: endpoint.to_owned(), reason: reason.to_owned() };
    match (endpoint.split_once("://"), options.uses_tls()) {
        (None, false) => Ok(format!("http://{endpoint}")),
        (None, true) => Ok(format!("https://{endpoint}")),
        (Some(("http", _)), false) | (Some(("https", _)), true) => Ok(endpoint.to_owned()),
        (Some(("http", _)), true) => Err(bad("TLS is configured but the endpoint says http://")),
        (Some(("https", _)), false) => Err(bad("an https:// endpoint needs TLS options (a CA to check the server)")),
        (Some(_), _) => Err(bad("the scheme must be http:// or https://")),
    }
}

/// A lease keep-alive stream: one request in flight at a time, so that each answer belongs to
/// the request whose start time the caller recorded.
pub(crate) struct KeepAliveStream {
    index: usize,
    lease: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: tonic::Streaming<LeaseKeepAliveResponse>,
    first: bool,
}

impl KeepAliveStream {
    /// Sends one keep-alive (the first was sent on opening) and waits for its answer.
    pub(crate) async fn renew(
        &mut self, conn: &Connection, limit: Duration,
    ) -> Result<LeaseKeepAliveResponse, EtcdError> {
        if !self.first {
            conn.count();
            self.requests
                .send(LeaseKeepAliveRequest { id: self.lease })
                .await
                .map_err(|_| EtcdError::Protocol("keep-alive stream closed".into()))?;
        }
        self.first = false;
        match timeout(limit, self.responses.message()).await {
            Ok(Ok(Some(response))) => Ok(response),
            Ok(Ok(None)) => {
                conn.failed(self.index);
                Err(EtcdError::Protocol("keep-alive stream ended".into()))
            }
            Ok(Err(status)) => Err(conn.status_error(self.index, &status)),
            Err(_) => conn.timed_out(self.index, limit),
        }
    }

    /// Completes when the idle stream fails or ends (nothing is expected between keep-alives; an
    /// unexpected answer is ignored).
    pub(crate) async fn broken(&mut self, conn: &Connection) {
        loop {
            match self.responses.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return conn.failed(self.index),
                Err(status) => {
                    let _ = conn.status_error(self.index, &status);
                    return;
                }
            }
        }
    }
}

/// A confirmed watch; dropping it closes the stream.
pub(crate) struct WatchStream {
    index: usize,
    _requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next batch of events; an error or the end of the stream means the watch is gone.
    pub(crate) async fn next(&mut self, conn: &Connection) -> Result<WatchResponse, EtcdError> {
        match self.responses.message().await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => {
                conn.failed(self.index);
                Err(EtcdError::Protocol("watch stream ended".into()))
            }
            Err(status) => Err(conn.status_error(self.index, &status)),
        }
    }
}

fn receiver_stream<T: Send + 'static>(receiver: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) })
}

/// The end of the key range of all keys starting with `prefix` (etcd's "prefix end": the prefix
/// with its last byte below 0xff incremented and the rest cut off).
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from the prefix on.
    vec![0]
}

/// A range over every key with `prefix`.
pub(crate) fn prefix_range(prefix: &str) -> RangeRequest {
    RangeRequest { key: prefix.as_bytes().to_vec(), range_end: prefix_end(prefix), ..Default::default() }
}

/// A range returning the key with the lowest create revision under `prefix`: the leader.
pub(crate) fn first_created(prefix: &str) -> RangeRequest {
    RangeRequest {
        limit: 1,
        sort_order: range_request::SortOrder::Ascend as i32,
        sort_target: range_request::SortTarget::Create as i32,
        ..prefix_range(prefix)
    }
}

/// `create_revision(key) == revision`: true exactly while the key written at `revision` exists.
pub(crate) fn create_revision_is(key: &str, revision: i64) -> Compare {
    revision_is(key, compare::CompareTarget::Create, compare::TargetUnion::CreateRevision(revision))
}

/// `target(key) == value`, one of the key's revisions.
pub(crate) fn revision_is(key: &str, target: compare::CompareTarget, value: compare::TargetUnion) -> Compare {
    let (result, key) = (compare::CompareResult::Equal as i32, key.as_bytes().to_vec());
    Compare { result, target: target as i32, key, range_end: Vec::new(), target_union: Some(value) }
}

/// A put of `key = value` bound to `lease`, as a transaction operation.
pub(crate) fn put_op(key: &str, value: &str, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

/// A read of one key, as a transaction operation.
pub(crate) fn get_op(key: &str) -> RequestOp {
    let range = RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
    RequestOp { request: Some(request_op::Request::RequestRange(range)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end("election/"), b"election0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn tls_decides_the_scheme_and_an_explicit_scheme_must_agree() {
        let plain = EtcdOptions::default();
        let ca = b"-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n".to_vec();
        let tls = EtcdOptions::default().with_tls(crate::EtcdTls::new(ca).unwrap());
        assert_eq!(endpoint_uri("h:1", &plain).unwrap(), "http://h:1");
        assert_eq!(endpoint_uri("h:1", &tls).unwrap(), "https://h:1");
        assert_eq!(endpoint_uri("https://h:1", &tls).unwrap(), "https://h:1");
        assert!(matches!(endpoint_uri("http://h:1", &tls), Err(EtcdError::BadEndpoint { .. })));
        assert!(matches!(endpoint_uri("https://h:1", &plain), Err(EtcdError::BadEndpoint { .. })));
        assert!(matches!(endpoint_uri("unix://x", &plain), Err(EtcdError::BadEndpoint { .. })));
    }

    #[tokio::test]
    async fn endpoints_are_validated() {
        let plain = EtcdOptions::default();
        assert!(matches!(Connection::new(&[], &plain), Err(EtcdError::NoEndpoints)));
        assert!(Connection::new(&["127.0.0.1:2379".into(), "http://127.0.0.1:2380".into()], &plain).is_ok());
    }
}
