//! Request accounting and fault injection, driven from tests and benchmarks through [`Faults`]:
//! counts per (client, verb), injected latency, injected errors, and partitions that cut a client off.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

/// The kind of request, as Kubernetes audit logs name verbs; used as a key of the request counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE.
    Delete,
    /// Discovery, `/version`, OpenAPI and anything else that is not a resource request.
    Other,
}

impl Verb {
    /// The lower-case verb name (`get`, `list`...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::Other => "other",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error the server answers with instead of serving a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectedFault {
    /// `500 InternalError`.
    InternalError,
    /// `429 TooManyRequests` with a `Retry-After` header of this many seconds.
    TooManyRequests {
        /// Seconds in the `Retry-After` header.
        retry_after_seconds: u64,
    },
    /// Never answer (until the client gives up or the server shuts down): a request timeout.
    Hang,
    /// `410 Expired` as an HTTP error rather than in the stream: how a proxy or another server
    /// implementation may refuse a watch from a version too old, which clients must handle too.
    Expired,
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultScope {
    /// Only this client (see [`Faults::client_of`]); all clients when `None`.
    pub client: Option<String>,
    /// Only these verbs; all verbs when empty.
    pub verbs: Vec<Verb>,
    /// Only this many requests, then the fault clears itself; forever when `None`.
    pub times: Option<u64>,
}

impl FaultScope {
    /// Every request of every client, until cleared.
    pub fn everyone() -> Self {
        FaultScope::default()
    }

    /// Every request of one client, until cleared.
    pub fn client(client: impl Into<String>) -> Self {
        FaultScope { client: Some(client.into()), ..FaultScope::default() }
    }

    fn applies_to(&self, client: &str, verb: Verb) -> bool {
        self.client.as_deref().is_none_or(|c| c == client) && (self.verbs.is_empty() || self.verbs.contains(&verb))
    }
}

struct FaultRule {
    scope: FaultScope,
    fault: InjectedFault,
}

#[derive(Default)]
struct FaultState {
    counts: BTreeMap<(String, Verb), u64>,
    latency_for_everyone: Duration,
    latency_per_client: HashMap<String, Duration>,
    rules: Vec<FaultRule>,
    partitioned: HashSet<String>,
}

/// What the request handler should do with one request, after accounting and faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FaultDecision {
    pub delay: Duration,
    pub fault: Option<InjectedFault>,
}

/// Handle on the counters and fault switches of a running server; cheap to clone.
#[derive(Clone)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
    partitions_changed: Arc<watch::Sender<u64>>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults { state: Arc::default(), partitions_changed: Arc::new(watch::channel(0).0) }
    }
}

/// The header that names a client for counts and faults; without it, the `User-Agent` does.
pub const CLIENT_HEADER: &str = "x-tenure-client";

impl Faults {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The client a request comes from: its `X-Tenure-Client` header, else its `User-Agent`, else `unknown`.
    pub fn client_of(headers: &axum::http::HeaderMap) -> String {
        headers
            .get(CLIENT_HEADER)
            .or_else(|| headers.get(axum::http::header::USER_AGENT))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown")
            .to_string()
    }

    /// Requests served so far, per (client, verb).
    pub fn request_counts(&self) -> BTreeMap<(String, Verb), u64> {
        self.lock().counts.clone()
    }

    /// Requests served so far by one client with one verb.
    pub fn request_count(&self, client: &str, verb: Verb) -> u64 {
        self.lock().counts.get(&(client.to_string(), verb)).copied().unwrap_or(0)
    }

    /// Forgets all counts (to measure one phase of a benchmark).
    pub fn reset_counts(&self) {
        self.lock().counts.clear();
    }

    /// Delays every request by `latency` before serving it (zero to stop).
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency_for_everyone = latency;
    }

    /// Delays one client's requests by `latency` (zero to stop); adds to the latency for everyone.
    pub fn set_client_latency(&self, client: &str, latency: Duration) {
        let mut state = self.lock();
        if latency.is_zero() {
            state.latency_per_client.remove(client);
        } else {
            state.latency_per_client.insert(client.to_string(), latency);
        }
    }

    /// Answers the requests in `scope` with `fault` instead of serving them.
    pub fn inject(&self, scope: FaultScope, fault: InjectedFault) {
        self.lock().rules.push(FaultRule { scope, fault });
    }

    /// Removes every injected error (latency and partitions stay).
    pub fn clear_errors(&self) {
        self.lock().rules.clear();
    }

    /// Cuts one client off: its new requests hang and its open watches are dropped mid-stream.
    pub fn partition(&self, client: &str) {
        self.lock().partitioned.insert(client.to_string());
        self.partitions_changed.send_modify(|generation| *generation += 1);
    }

    /// Reconnects a partitioned client.
    pub fn heal(&self, client: &str) {
        self.lock().partitioned.remove(client);
        self.partitions_changed.send_modify(|generation| *generation += 1);
    }

    /// Whether a client is partitioned now.
    pub fn is_partitioned(&self, client: &str) -> bool {
        self.lock().partitioned.contains(client)
    }

    /// A receiver that wakes whenever the set of partitioned clients changes.
    pub(crate) fn partition_changes(&self) -> watch::Receiver<u64> {
        self.partitions_changed.subscribe()
    }

    /// Counts one request and decides its fate.
    pub(crate) fn admit(&self, client: &str, verb: Verb) -> FaultDecision {
        let mut state = self.lock();
        *state.counts.entry((client.to_string(), verb)).or_insert(0) += 1;
        let delay = state.latency_for_everyone + state.latency_per_client.get(client).copied().unwrap_or_default();
        if state.partitioned.contains(client) {
            return FaultDecision { delay, fault: Some(InjectedFault::Hang) };
        }
        let mut fault = None;
        if let Some(index) = state.rules.iter().position(|rule| rule.scope.applies_to(client, verb)) {
            let rule = &mut state.rules[index];
            fault = Some(rule.fault.clone());
            if let Some(times) = rule.scope.times.as_mut() {
                *times = times.saturating_sub(1);
                if *times == 0 {
                    state.rules.remove(index);
                }
            }
        }
        FaultDecision { delay, fault }
    }
}
