//! The HTTP side: binding, routing every request through accounting and fault injection to the
//! store, and shutting down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::coordinator::{self, CoordinatorConfig, CoordinatorMetrics, Counters};
use crate::discovery;
use crate::errors::ApiError;
use crate::faults::{Faults, InjectedFault, Verb};
use crate::metadata_only;
use crate::patch::{self, PatchFormat};
use crate::resources::ResourceType;
use crate::routes::{self, ResourcePath, Route};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::store::{DeletePreconditions, EventWindow, Store};
use crate::table;
use crate::watch::{self, WatchRequest};

/// How to run a server.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Where to listen; port 0 picks a free one. Loopback by default: the server has no authentication.
    pub listen: SocketAddr,
    /// How many changes the event log keeps for watches to resume from; older starts get `410 Expired`.
    pub event_log_capacity: usize,
    /// How long the event log keeps a change: a real API server's watch cache keeps about 75 s, so
    /// a controller resuming after a longer outage must list again. Older starts get `410 Expired`.
    pub event_window: Duration,
    /// How often watches that asked for bookmarks get one; zero for never.
    pub bookmark_interval: Duration,
    /// How long a watch without `timeoutSeconds` stays open (the real server picks 30 to 60 minutes).
    pub default_watch_timeout: Duration,
    /// The longest any watch stays open, whatever its `timeoutSeconds` asked (`None`: as asked).
    /// In a cluster, watches also end early when an API server restarts or a load balancer cuts
    /// long connections; a short cap makes clients' re-watch paths run within a test or profile.
    pub max_watch_duration: Option<Duration>,
    /// The coordinator of Coordinated Leader Election, which elects holders for Leases that have
    /// LeaseCandidates. On by default: it touches only Leases that have candidates (so nothing
    /// changes for clients that create none), a real cluster where clients create candidates has
    /// it on too (the `CoordinatedLeaderElection` feature gate), and `tenure apiserver` has no
    /// switch for it yet.
    pub coordinator: CoordinatorConfig,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            event_log_capacity: EventWindow::default().capacity,
            event_window: EventWindow::default().max_age,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            max_watch_duration: None,
            coordinator: CoordinatorConfig::default(),
        }
    }
}

struct Shared {
    store: Arc<Store>,
    faults: Faults,
    shutdown: CancellationToken,
    address: SocketAddr,
    default_watch_timeout: Duration,
    max_watch_duration: Option<Duration>,
    coordinator_counters: Arc<Counters>,
}

/// A running in-memory Kubernetes API server. Dropping it without [`ApiServer::shutdown`] stops it too.
pub struct ApiServer {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
    coordinator: Option<JoinHandle<()>>,
}

/// How many connections may wait to be accepted: the kernel's own limit (`somaxconn`, 4096 since
/// Linux 5.4), as a Go server such as kube-apiserver asks for. The standard library's 128 fills
/// up while the server is frozen (clients that time out connect again), and a client whose
/// connection attempt was dropped then retries only on its next SYN, seconds after the thaw.
const ACCEPT_BACKLOG: u32 = 4096;

/// A socket listening on `address` with [`ACCEPT_BACKLOG`].
fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(ACCEPT_BACKLOG)
}

impl ApiServer {
    /// Binds and starts serving in the background (on the current Tokio runtime).
    pub async fn start(config: ApiServerConfig) -> std::io::Result<ApiServer> {
        let listener = listen(config.listen)?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Arc::new(Store::new(EventWindow {
                capacity: config.event_log_capacity,
                max_age: config.event_window,
            })),
            faults: Faults::default(),
            shutdown: CancellationToken::new(),
            address,
            default_watch_timeout: config.default_watch_timeout,
            max_watch_duration: config.max_watch_duration,
            coordinator_counters: Arc::default(),
        });
        let router = axum::Router::new().fallback(handle).with_state(shared.clone());
        let stop = shared.shutdown.clone();
        let bookmarks = shared.clone();
        let task = tokio::spawn(async move {
            // TCP_NODELAY, as Go's net package (and so a real kube-apiserver) sets on every
            // connection: without it a watch event written shortly after another waits for the
            // client's delayed ACK (up to 40 ms on Linux) before it leaves (Nagle's algorithm).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(error) = tcp.set_nodelay(true) {
                    tracing::debug!(%error, "cannot set TCP_NODELAY");
                }
            });
            let serve = axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned());
            // A zero interval means no bookmarks (and must not reach `interval`, which refuses it).
            let bookmarking = async {
                if config.bookmark_interval.is_zero() {
                    return std::future::pending().await;
                }
                let mut ticks = tokio::time::interval(config.bookmark_interval);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    bookmarks.store.send_bookmarks();
                }
            };
            tokio::select! {
                result = serve => {
                    if let Err(error) = result {
                        tracing::error!(%error, "the API server stopped serving");
                    }
                }
                _ = bookmarking => {}
            }
        });
        let coordinator = coordinator::spawn(
            shared.store.clone(),
            config.coordinator,
            shared.coordinator_counters.clone(),
            shared.shutdown.clone(),
        );
        tracing::info!(url = %format!("http://{address}"), "Kubernetes API server listening");
        Ok(ApiServer { shared, task: Some(task), coordinator })
    }

    /// The address served.
    pub fn address(&self) -> SocketAddr {
        self.shared.address
    }

    /// The base URL clients use (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.address)
    }

    /// Request counts and fault switches.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// The objects, for tests that act as another writer (hijacks, deletions) or inspect state.
    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    /// What the Coordinated Leader Election coordinator has done (all zero when it is disabled).
    pub fn coordinator_metrics(&self) -> CoordinatorMetrics {
        self.shared.coordinator_counters.snapshot()
    }

    /// A kubeconfig that points kubectl and kube-rs at this server, in `namespace` by default.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        crate::kubeconfig::render(&self.url(), namespace)
    }

    /// Writes [`ApiServer::kubeconfig`] for the `default` namespace to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig("default"))
    }

    /// Ends every watch and hanging request, stops accepting connections, and waits (briefly) for the
    /// open ones to finish.
    pub async fn shutdown(mut self) {
        self.stop();
        for task in [self.coordinator.take(), self.task.take()].into_iter().flatten() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Resolves once the server has stopped (after [`ApiServer::stop_handle`] was cancelled, or an error).
    pub async fn stopped(&mut self) {
        if let Some(task) = self.task.as_mut() {
            let _ = task.await;
            self.task = None;
        }
    }

    /// A token that stops the server when cancelled (for signal handling).
    pub fn stop_handle(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    fn stop(&self) {
        self.shared.store.close();
        self.shared.shutdown.cancel();
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
        for task in [self.task.take(), self.coordinator.take()].into_iter().flatten() {
            task.abort();
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(body).unwrap_or_default()).into_response()
}

fn error_response(error: &ApiError) -> Response {
    let mut response = json_response(error.http_status(), &error.to_status());
    if let Some(seconds) = error.details.as_ref().and_then(|d| d["retryAfterSeconds"].as_u64()) {
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    response
}

fn verb_of(method: &Method, route: &Route, query: &HashMap<String, String>) -> Verb {
    let Route::Resource(path) = route else { return Verb::Other };
    let named = path.name.is_some();
    match *method {
        Method::GET if named => Verb::Get,
        Method::GET if is_true(query.get("watch")) => Verb::Watch,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE => Verb::Delete,
        _ => Verb::Other,
    }
}

fn is_true(value: Option<&String>) -> bool {
    matches!(value.map(String::as_str), Some("true" | "1"))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect();
    let route = routes::parse(uri.path());
    let client = Faults::client_of(&headers);
    let verb = verb_of(&method, &route, &query);
    let decision = shared.faults.admit(&client, verb);
    if !decision.delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(decision.delay) => {}
            _ = shared.shutdown.cancelled() => return error_response(&ApiError::internal("the server is shutting down")),
        }
    }
    match decision.fault {
        None => {}
        Some(InjectedFault::InternalError) => return error_response(&ApiError::internal("injected internal error")),
        Some(InjectedFault::TooManyRequests { retry_after_seconds }) => {
            return error_response(&ApiError::too_many_requests(retry_after_seconds))
        }
        Some(InjectedFault::Expired) => {
            let requested = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let oldest_kept = shared.store.current_resource_version() + 1;
            return error_response(&ApiError::expired(requested, oldest_kept));
        }
        Some(InjectedFault::Hang) => {
            // Held until the server stops or, for a partitioned client, until the partition heals;
            // then answered with a timeout (the request never reached the store).
            let mut partitions = shared.faults.partition_changes();
            let partitioned = shared.faults.is_partitioned(&client);
            let healed = async {
                while partitioned && partitions.changed().await.is_ok() {
                    if !shared.faults.is_partitioned(&client) {
                        return;
                    }
                }
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = healed => return error_response(&ApiError::timeout()),
                _ = shared.shutdown.cancelled() => {
                    return error_response(&ApiError::internal("the server is shutting down"))
                }
            }
        }
    }
    let document = match route {
        Route::Version => Some(discovery::version()),
        Route::Health => return (StatusCode::OK, "ok").into_response(),
        Route::CoreVersions => Some(discovery::core_versions(&shared.address.to_string())),
        Route::OpenApiIndex => Some(discovery::openapi_v3_index()),
        Route::OpenApiGroupVersion(path) => discovery::openapi_v3_group_version(&path),
        Route::GroupList => Some(discovery::group_list()),
        Route::Group(group) => discovery::group(&group),
        Route::ResourceList { group, version } => discovery::resource_list(&group, &version),
        Route::Resource(path) => {
            let result = serve_resource(&shared, &method, path, &query, &headers, &body, client);
            return result.unwrap_or_else(|error| error_response(&error));
        }
        Route::Unknown => None,
    };
    let Some(document) = document else { return error_response(&ApiError::no_such_path()) };
    json_response(StatusCode::OK, &document)
}

/// A `<Kind>List` of `items` at `version`.
fn list_body<'a>(resource: &ResourceType, version: u64, items: impl Iterator<Item = &'a Value>) -> Value {
    json!({
        "kind": format!("{}List", resource.kind),
        "apiVersion": resource.api_version(),
        "metadata": {"resourceVersion": version.to_string()},
        "items": items.cloned().collect::<Vec<_>>(),
    })
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(table::wants_table)
}

fn wants_metadata(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(metadata_only::wants_metadata)
}

/// One object as the client asked for it: whole, or its metadata alone.
fn object_response(status: StatusCode, headers: &HeaderMap, object: &Value) -> Response {
    match wants_metadata(headers) {
        true => json_response(status, &metadata_only::partial(object)),
        false => json_response(status, object),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|error| {
        ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {error}"))
    })
}

fn selectors(query: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
    })
}

fn serve_resource(
    shared: &Arc<Shared>,
    method: &Method,
    path: ResourcePath,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
    client: String,
) -> Result<Response, ApiError> {
    if query.get("dryRun").is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request("dryRun is not supported by this server"));
    }
    let store = &shared.store;
    let resource = path.resource;
    let namespace = path.namespace.clone().unwrap_or_default();
    match (method.clone(), path.name.as_deref()) {
        (Method::GET, Some(name)) => {
            let object = store.get(resource, &namespace, name)?;
            if wants_table(headers) {
                let version = object["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
                return Ok(json_response(StatusCode::OK, &table::render(resource, &[object], &version)));
            }
            Ok(object_response(StatusCode::OK, headers, &object))
        }
        (Method::GET, None) if is_true(query.get("watch")) => {
            let invalid = |seconds| ApiError::bad_request(format!("invalid timeoutSeconds {seconds:?}: not a number"));
            let timeout = match query.get("timeoutSeconds") {
                Some(seconds) => Duration::from_secs(seconds.parse().map_err(|_| invalid(seconds))?),
                None => shared.default_watch_timeout,
            };
            let timeout = shared.max_watch_duration.map_or(timeout, |longest| timeout.min(longest));
            let request = WatchRequest {
                resource,
                namespace: path.namespace,
                selectors: selectors(query)?,
                start: watch::start_from(query.get("resourceVersion").map(String::as_str))?,
                bookmarks: is_true(query.get("allowWatchBookmarks")),
                timeout,
                client,
                as_table: wants_table(headers),
                as_metadata: wants_metadata(headers),
            };
            let body: Body = watch::serve(store, &shared.faults, &shared.shutdown, request);
            Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
        (Method::GET, None) => {
            let (items, version) = store.list(resource, path.namespace.as_deref(), &selectors(query)?);
            if wants_table(headers) {
                return Ok(json_response(StatusCode::OK, &table::render(resource, &items, &version.to_string())));
            }
            if wants_metadata(headers) {
                let partial = metadata_only::partial_list(items.iter().map(|item| &**item), version);
                return Ok(json_response(StatusCode::OK, &partial));
            }
            Ok(json_response(StatusCode::OK, &list_body(resource, version, items.iter().map(|item| &**item))))
        }
        (Method::POST, None) => {
            let created = store.create(resource, &namespace, parse_body(body)?)?;
            Ok(object_response(StatusCode::CREATED, headers, &created))
        }
        (Method::PUT, Some(name)) => {
            let (stored, created) = store.update(resource, &namespace, name, parse_body(body)?)?;
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(object_response(status, headers, &stored))
        }
        (Method::PATCH, Some(name)) => {
            let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let format = PatchFormat::from_content_type(content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
            let document = parse_body(body)?;
            let patched = store.patch(resource, &namespace, name, |current| {
                let mut object = current.clone();
                match format {
                    PatchFormat::Json => patch::json_patch(&mut object, &document)?,
                    PatchFormat::Merge | PatchFormat::Apply => patch::merge_patch(&mut object, &document, false),
                    PatchFormat::StrategicMerge => patch::merge_patch(&mut object, &document, true),
                }
                Ok(object)
            })?;
            Ok(object_response(StatusCode::OK, headers, &patched))
        }
        (Method::DELETE, Some(name)) => {
            let options = if body.is_empty() { json!({}) } else { parse_body(body)? };
            let preconditions = DeletePreconditions {
                resource_version: options["preconditions"]["resourceVersion"].as_str().map(str::to_string),
                uid: options["preconditions"]["uid"].as_str().map(str::to_string),
            };
            Ok(json_response(StatusCode::OK, &*store.delete(resource, &namespace, name, &preconditions)?))
        }
        (Method::DELETE, None) => {
            let (items, version) = store.list(resource, path.namespace.as_deref(), &selectors(query)?);
            let mut deleted = Vec::new();
            for item in items {
                let namespace = item["metadata"]["namespace"].as_str().unwrap_or("");
                let name = item["metadata"]["name"].as_str().unwrap_or("");
                // An object deleted concurrently is simply not in the answer.
                if let Ok(object) = store.delete(resource, namespace, name, &DeletePreconditions::default()) {
                    deleted.push(object);
                }
            }
            Ok(json_response(StatusCode::OK, &list_body(resource, version, deleted.iter().map(|item| &**item))))
        }
        (method, _) => Err(ApiError::method_not_allowed(method.as_str())),
    }
}
