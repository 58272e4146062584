//! The I/O of an etcd campaign: performs [`EtcdCampaign`](crate::campaign::EtcdCampaign)'s
//! calls on the cluster, keeps the session's lease alive, and delivers the election's watch.
//!
//! Why the keep-alive is here and not a call per keep-alive: etcd keeps leases alive over one
//! long-lived stream, and a broken stream (a member killed) shows up between keep-alives, when
//! it is idle; a pump beside the campaign sends one keep-alive every interval, re-opens the stream
//! at once when it breaks, and reports each result (with the instant it was sent) as an input.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::shell::{ShellFuture, Transport};
use tenure::MonotonicTime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::campaign::{EtcdCall, EtcdCampaign, EtcdInput, Keys};
use crate::client::{self, Connection, WatchStream};
use crate::proto::etcdserverpb::{response_op, RangeRequest, TxnRequest};
use crate::proto::mvccpb::event::EventType;

/// Aborts the keep-alive pump when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The watch the latest resync opened, handed to [`EtcdTransport::notice`].
///
/// Why `latest`: a resync of an ended session may still be in flight when the next session's
/// resync starts and may finish after it; its watch (which the campaign ignores) must not replace
/// the newer session's, or the campaign would see no change until its session ended.
#[derive(Default)]
struct OpenedWatch {
    /// The session of the last resync started.
    latest: u64,
    watch: Option<(u64, WatchStream)>,
}

/// The transport of one campaign.
pub(crate) struct EtcdTransport {
    conn: Arc<Connection>,
    prefix: String,
    identity: String,
    call_timeout: Duration,
    /// The keep-alive interval.
    interval: Duration,
    /// The shell's clock origin, to report keep-alives on the campaign's clock.
    origin: Instant,
    pump: Option<AbortOnDrop>,
    pumped: (mpsc::UnboundedSender<EtcdInput>, mpsc::UnboundedReceiver<EtcdInput>),
    /// The election's watch and the session it belongs to.
    watch: Option<(u64, WatchStream)>,
    opened: Arc<Mutex<OpenedWatch>>,
}

impl EtcdTransport {
    pub(crate) fn new(
        conn: Arc<Connection>, prefix: String, identity: String, call_timeout: Duration, interval: Duration,
    ) -> Self {
        let (origin, pumped, opened) = (Instant::now(), mpsc::unbounded_channel(), Arc::default());
        let (pump, watch) = (None, None);
        EtcdTransport { conn, prefix, identity, call_timeout, interval, origin, pump, pumped, watch, opened }
    }
}

impl Transport<EtcdCampaign> for EtcdTransport {
    fn attach(&mut self, origin: Instant) {
        self.origin = origin;
    }

    fn start(&mut self, call: EtcdCall) -> Option<ShellFuture<EtcdInput>> {
        let conn = self.conn.clone();
        let limit = self.call_timeout;
        Some(match call {
            EtcdCall::Grant { session, ttl_secs } => Box::pin(async move {
                let result = conn.grant(limit, ttl_secs).await.map(|granted| {
                    (granted.id, Duration::from_secs(u64::try_from(granted.ttl.max(1)).unwrap_or(1)))
                });
                EtcdInput::Granted { session, result }
            }),
            EtcdCall::KeepAlive { session, lease } => {
                let pump =
                    keep_alive(conn, session, lease, self.interval, limit, self.origin, self.pumped.0.clone());
                self.pump = Some(AbortOnDrop(tokio::spawn(pump)));
                return None;
            }
            EtcdCall::StopKeepAlive => {
                self.pump = None;
                return None;
            }
            EtcdCall::Create { session, key, lease } => {
                let create = TxnRequest {
                    compare: vec![client::create_revision_is(&key, 0)],
                    success: vec![client::put_op(&key, &self.identity, lease)],
                    failure: vec![client::get_op(&key)],
                };
                Box::pin(async move {
                    let result = conn.txn(limit, create).await.map(|response| {
                        if response.succeeded {
                            return response.header.map(|h| h.revision).unwrap_or(0);
                        }
                        let existing = response.responses.iter().find_map(|op| match &op.response {
                            Some(response_op::Response::ResponseRange(range)) => range.kvs.first(),
                            _ => None,
                        });
                        existing.map(|kv| kv.create_revision).unwrap_or(0)
                    });
                    EtcdInput::Created { session, result }
                })
            }
            EtcdCall::Resync { session } => {
                let prefix = self.prefix.clone();
                let opened = self.opened.clone();
                opened.lock().unwrap_or_else(|e| e.into_inner()).latest = session;
                Box::pin(async move {
                    let result = async {
                        let response = conn.range(limit, client::prefix_range(&prefix)).await?;
                        let revision = response.header.map(|h| h.revision).unwrap_or(0);
                        let keys: Keys = response
                            .kvs
                            .into_iter()
                            .map(|kv| (lossy(&kv.key), (kv.create_revision, lossy(&kv.value))))
                            .collect();
                        let watch = conn.watch_prefix(limit, &prefix, revision + 1).await?;
                        let mut opened = opened.lock().unwrap_or_else(|e| e.into_inner());
                        if opened.latest == session {
                            opened.watch = Some((session, watch));
                        }
                        Ok(keys)
                    };
                    EtcdInput::Loaded { session, result: result.await }
                })
            }
            EtcdCall::Claim { session, key } => Box::pin(async move {
                let read = RangeRequest { key: key.into_bytes(), ..Default::default() };
                let result = conn.range(limit, read).await.map(|r| r.kvs.first().map(|kv| kv.create_revision));
                EtcdInput::Claimed { session, result }
            }),
            EtcdCall::Delete { session, key } => Box::pin(async move {
                EtcdInput::Deleted { session, result: conn.delete(limit, &key).await.map(|_| ()) }
            }),
            EtcdCall::Revoke { lease } => {
                Box::pin(async move { EtcdInput::Revoked { lease, result: conn.revoke(limit, lease).await } })
            }
        })
    }

    async fn notice(&mut self) -> EtcdInput {
        if let Some(opened) = self.opened.lock().unwrap_or_else(|e| e.into_inner()).watch.take() {
            self.watch = Some(opened);
        }
        let conn = self.conn.clone();
        tokio::select! {
            Some(input) = self.pumped.1.recv() => input,
            input = next_watched(&mut self.watch, &conn) => input,
        }
    }

    fn describe(&self) -> String {
        format!("etcd election {}", self.prefix)
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The next changes from the election's watch; pending while there is none. A failed watch is
/// closed.
async fn next_watched(watch: &mut Option<(u64, WatchStream)>, conn: &Connection) -> EtcdInput {
    let Some((session, stream)) = watch.as_mut() else { return std::future::pending().await };
    let session = *session;
    match stream.next(conn).await {
        Ok(response) => {
            let cancelled = (response.canceled || response.compact_revision != 0).then_some(response.cancel_reason);
            if cancelled.is_some() {
                *watch = None;
            }
            let changes = response
                .events
                .into_iter()
                .filter_map(|event| {
                    let kv = event.kv?;
                    let value =
                        (event.r#type != EventType::Delete as i32).then(|| (kv.create_revision, lossy(&kv.value)));
                    Some((lossy(&kv.key), value))
                })
                .collect();
            EtcdInput::Watched { session, changes, cancelled }
        }
        Err(error) => {
            *watch = None;
            EtcdInput::WatchFailed { session, error }
        }
    }
}

/// Keeps `lease` alive every `interval`, one request at a time, and reports each keep-alive with
/// the instant it was sent; ends once the server says the lease is gone.
async fn keep_alive(
    conn: Arc<Connection>, session: u64, lease: i64, interval: Duration, limit: Duration, origin: Instant,
    reports: mpsc::UnboundedSender<EtcdInput>,
) {
    let report = |sent: Instant, result| {
        let sent = MonotonicTime(sent.saturating_duration_since(origin));
        reports.send(EtcdInput::KeptAlive { session, sent, result }).is_ok()
    };
    loop {
        let started = Instant::now();
        let mut stream = match conn.keep_alive(limit, lease).await {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(lease = format!("{lease:x}"), %error, "opening a keep-alive stream failed");
                if !report(started, Err(error)) {
                    return;
                }
                sleep_until(started + interval / 4).await;
                continue;
            }
        };
        let mut sent = started;
        loop {
            match stream.renew(&conn, limit).await {
                Ok(response) => {
                    let ttl = Duration::from_secs(u64::try_from(response.ttl).unwrap_or(0));
                    if !report(sent, Ok(ttl)) || ttl.is_zero() {
                        return;
                    }
                }
                Err(error) => {
                    tracing::debug!(lease = format!("{lease:x}"), %error, "keep-alive failed; reopening");
                    if !report(sent, Err(error)) {
                        return;
                    }
                    break;
                }
            }
            // Between keep-alives the stream is idle: a broken connection (member killed) shows
            // up here at once rather than at the next keep-alive.
            let broken = tokio::select! {
                _ = sleep_until(sent + interval) => false,
                _ = stream.broken(&conn) => true,
            };
            if broken {
                tracing::debug!(lease = format!("{lease:x}"), "keep-alive stream broke; reopening");
                break;
            }
            sent = Instant::now();
        }
        sleep_until(Instant::now() + interval / 4).await;
    }
}
