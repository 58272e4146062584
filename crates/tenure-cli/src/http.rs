//! The HTTP API of `tenure elect --http`: who leads, as leader-elector:0.5 answered it, and what
//! its users asked for since (is-leader answer, status with long-poll, probes, push
//! notifications, metrics).
//!
//! Why its own module: this is the sidecar's API, and it grows independently of how the election
//! runs. Handlers only read what the elector publishes on its watch channel, its counters and its
//! self-fencing check, so they never touch the lock and followers answer with the current holder
//! the moment it changes.
//!
//! Routes (every other `GET` path answers the leader's name, as leader-elector did, except near
//! misses of these paths such as `/isleader` or `/statuz`, which answer 404 so that a probe with a
//! typo fails: [`typos`]):
//!
//! | path        | answer |
//! |-------------|--------|
//! | `/`         | `{"name":"<leader>"}`, `""` while nobody is known to lead |
//! | `/isLeader` | 200 `{"isLeader":true\|false}`; with `?strict`, 503 when false (for `curl -f`) |
//! | `/status`   | detailed JSON, long-poll with `?since=<version>&wait=<duration>` ([`status`]) |
//! | `/healthz`  | liveness, client-go's healthz adaptor meaning ([`probes`]) |
//! | `/readyz`   | readiness, optionally leader-only ([`probes`]) |
//! | `/events`   | Server-Sent Events, one per leadership change ([`events`]) |
//! | `/hold`     | `?term=T`: the application's work holds the tenure; a release waits for it ([`hold`]) |
//! | `/metrics`  | Prometheus metrics ([`metrics`]) |
//! | `/progress` | `POST ?term=T`: the application's work advanced; with `--progress-timeout`, silence makes the leader give way ([`progress`]) |

mod events;
mod hold;
mod metrics;
pub mod progress;
/// The content type of `/metrics` answers, for the other sidecars that serve one.
pub(crate) use metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
mod probes;
mod snapshots;
mod status;
mod typos;

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tenure::{Elector, ElectorStats, Leadership, Tenure, Term, Timing};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use self::snapshots::NumberedLeadership;

/// leader-elector's answer: `{"name":"<leader>"}`, `""` while nobody is known to lead.
#[derive(Debug, Serialize)]
pub struct LeaderName {
    /// Identity of the current holder of the lock.
    pub name: String,
}

/// What the handlers read: the elector's published leadership, counters and self-fencing check.
/// A trait so that the routes can be tested against a fake without running an election.
pub trait LeadershipView: Send + Sync + 'static {
    /// The latest snapshot (holder as last observed in the lock).
    fn leadership(&self) -> Leadership;
    /// A receiver that wakes on every change of the snapshot; closed when the elector stops.
    fn subscribe(&self) -> watch::Receiver<Leadership>;
    /// This candidate's identity.
    fn identity(&self) -> &str;
    /// The election timing (lease, renew deadline, retry period).
    fn timing(&self) -> Timing;
    /// The current term while this instance's tenure is valid on its own clock (self-fencing).
    fn leading_term(&self) -> Option<Term>;
    /// Until when this instance leads unless its next renew succeeds, while it leads.
    fn valid_until(&self) -> Option<Instant>;
    /// Counters of renews, failures and tenures.
    fn stats(&self) -> ElectorStats;
    /// A guard of the current tenure while this instance leads; a graceful release waits for it.
    fn tenure(&self) -> Option<Tenure>;

    /// True while this instance's tenure is valid on its own clock.
    fn leads_now(&self) -> bool {
        self.leading_term().is_some()
    }
}

impl LeadershipView for Elector {
    fn leadership(&self) -> Leadership {
        Elector::leadership(self)
    }
    fn subscribe(&self) -> watch::Receiver<Leadership> {
        Elector::subscribe(self)
    }
    fn identity(&self) -> &str {
        Elector::identity(self)
    }
    fn timing(&self) -> Timing {
        *Elector::timing(self)
    }
    fn leading_term(&self) -> Option<Term> {
        self.is_leader()
    }
    fn valid_until(&self) -> Option<Instant> {
        Elector::valid_until(self)
    }
    fn stats(&self) -> ElectorStats {
        Elector::stats(self)
    }
    fn tenure(&self) -> Option<Tenure> {
        Elector::tenure(self)
    }
}

/// Choices of the operator that change what the API answers (flags of `tenure elect`).
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// The election's name, the `name` label of the metrics (as Kubernetes labels them).
    pub election: String,
    /// How long past the lease a leader that has not renewed still counts as alive
    /// (client-go's `maxTolerableExpiredLease`).
    pub healthz_timeout: Duration,
    /// Fail `/healthz` once every call to the lock has failed for longer than this (opt-in).
    pub healthz_lock_unreachable: Option<Duration>,
    /// Answer `/readyz` with 503 unless this instance leads, so a Service routes to the leader
    /// only.
    pub ready_only_when_leader: bool,
    /// The application's proofs of progress, when the leader gives way after a silence
    /// (`--progress-timeout`).
    pub progress: Option<Arc<progress::Progress>>,
}

/// What every handler is given: the elector (weakly), its numbered snapshots and the settings.
#[derive(Clone)]
struct Api {
    view: Weak<dyn LeadershipView>,
    snapshots: watch::Receiver<NumberedLeadership>,
    settings: Arc<ApiSettings>,
    metrics: Arc<metrics::Metrics>,
}

/// The routes of the sidecar API, answering from `view`. Call inside the tokio runtime: it
/// starts the small task that numbers the leadership snapshots (see [`snapshots`]).
///
/// `GET` on any path without a route of its own answers the leader's name, because
/// leader-elector:0.5 did and clients written for it may poll any path, unless the path is a near
/// miss of an API path (404). Other methods get 405.
/// The view is held weakly so that the owner can take the elector back for its shutdown while
/// connections are still open; once it is gone, the answer is "" (unknown), and streams end.
pub fn router(view: Weak<dyn LeadershipView>, settings: ApiSettings) -> Router {
    let leadership = view.upgrade().map_or_else(|| watch::channel(Leadership::unknown()).1, |view| view.subscribe());
    let api = Api {
        snapshots: snapshots::number(leadership),
        metrics: Arc::new(metrics::Metrics::new(view.clone(), &settings.election, settings.progress.clone())),
        view,
        settings: Arc::new(settings),
    };
    Router::new()
        .route("/", get(leader_name))
        .route("/isLeader", get(is_leader))
        .route("/status", get(status::status))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/events", get(events::events))
        .route("/hold", get(hold::hold))
        .route("/progress", post(progress::progress))
        .route("/metrics", get(metrics::metrics))
        .route("/{*path}", get(any_other_path))
        // The router's matcher does not fall back from `/status` to the catch-all for `/status/`
        // and the like: those arrive here.
        .fallback(unrouted)
        .with_state(api)
}

impl Api {
    /// Runs `read` on the elector if it is still there. The strong reference lives only for this
    /// synchronous call, never across an await, so the owner can always take the elector back.
    fn read<T>(&self, read: impl FnOnce(&dyn LeadershipView) -> T) -> Option<T> {
        self.view.upgrade().map(|view| read(view.as_ref()))
    }
}

async fn leader_name(State(api): State<Api>) -> Json<LeaderName> {
    let name = api.read(current_leader).flatten().unwrap_or_default();
    Json(LeaderName { name })
}

/// A request the routes above did not match: `GET` (and `HEAD`) as [`any_other_path`], other
/// methods 405, as on every other path.
async fn unrouted(State(api): State<Api>, method: Method, uri: Uri) -> Response {
    if method == Method::GET || method == Method::HEAD {
        any_other_path(State(api), uri).await
    } else {
        (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "GET,HEAD")]).into_response()
    }
}

/// `GET` on a path without a route of its own: a near miss of an API path is refused with 404
/// ([`typos`]), so that a probe with a typo fails; any other path answers the leader's name, as
/// leader-elector:0.5 did.
async fn any_other_path(State(api): State<Api>, uri: Uri) -> Response {
    match typos::refuse_typo(&uri) {
        Some(refusal) => refusal.into_response(),
        None => leader_name(State(api)).await.into_response(),
    }
}

/// The holder of the lock as last observed, except that this instance never names itself once
/// its tenure has lapsed on its own clock: after a pause (SIGSTOP, a long GC) the snapshot may
/// still name it until the elector has looked at the lock again, and an application asking its
/// sidecar "who leads?" must not act on that. It answers `None` (unknown) until the elector knows.
fn current_leader(view: &dyn LeadershipView) -> Option<String> {
    match known_leader(view.leadership().leader) {
        Some(name) if name == view.identity() && !view.leads_now() => None,
        other => other,
    }
}

/// The leader as answered over HTTP: a Kubernetes multi-lock whose two objects name different
/// holders (for a moment while a new leader writes both, or while `leases` candidates lead)
/// holds client-go's placeholder holder, which names nobody: it is answered as unknown (`""`),
/// which is what leader-elector:0.5's API says when it does not know.
pub(crate) fn known_leader(leader: Option<String>) -> Option<String> {
    leader.filter(|name| name != tenure_kube::UNKNOWN_LEADER)
}

/// The answer of `/isLeader`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct IsLeader {
    is_leader: bool,
}

/// `GET /isLeader`: 200 `{"isLeader":true}` while this instance leads on its own clock, 200
/// `{"isLeader":false}` otherwise: "not the leader" is an answer, not an error, for clients that
/// read the body (what the forks of leader-elector did). `?strict` (any value but `false` or
/// `0`) turns `false` into 503, for `curl -f` and probes that only look at the status.
async fn is_leader(State(api): State<Api>, RawQuery(query): RawQuery) -> (StatusCode, Json<IsLeader>) {
    let is_leader = api.read(|view| view.leads_now()).unwrap_or(false);
    let strict = query_value(query.as_deref(), "strict").is_some_and(|value| value != "false" && value != "0");
    let status = if is_leader || !strict { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(IsLeader { is_leader }))
}

/// The value of `key` in a URL query string (`""` for a bare `?key`), the last one if repeated.
pub(crate) fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes()).filter(|(k, _)| k == key).map(|(_, v)| v.into_owned()).last()
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;
    use tenure::Role;

    /// A view whose state the test sets by hand.
    pub struct FakeView {
        pub leadership: watch::Sender<Leadership>,
        pub leads: Mutex<bool>,
        /// The term of this instance's own tenure when it differs from the snapshot's (the
        /// elector's state moves before the published snapshot does).
        pub own_term: Mutex<Option<Term>>,
        pub stats: Mutex<ElectorStats>,
    }

    impl FakeView {
        pub fn new(leadership: Leadership) -> Arc<FakeView> {
            Arc::new(FakeView {
                leadership: watch::channel(leadership).0,
                leads: Mutex::new(false),
                own_term: Mutex::new(None),
                stats: Mutex::new(ElectorStats::default()),
            })
        }
    }

    impl LeadershipView for FakeView {
        fn leadership(&self) -> Leadership {
            self.leadership.borrow().clone()
        }
        fn subscribe(&self) -> watch::Receiver<Leadership> {
            self.leadership.subscribe()
        }
        fn identity(&self) -> &str {
            "me"
        }
        fn timing(&self) -> Timing {
            Timing::from_ttl(Duration::from_secs(2)).unwrap()
        }
        fn leading_term(&self) -> Option<Term> {
            let term = self.own_term.lock().unwrap().or(self.leadership().term);
            term.filter(|_| *self.leads.lock().unwrap())
        }
        fn valid_until(&self) -> Option<Instant> {
            self.leads_now().then(|| Instant::now() + Duration::from_secs(1))
        }
        fn stats(&self) -> ElectorStats {
            *self.stats.lock().unwrap()
        }
        fn tenure(&self) -> Option<Tenure> {
            None
        }
    }

    pub fn held_by(leader: &str) -> Leadership {
        Leadership { leader: Some(leader.into()), term: Some(Term(3)), role: Role::Follower }
    }

    pub fn settings() -> ApiSettings {
        ApiSettings {
            election: "test".into(),
            healthz_timeout: Duration::from_secs(20),
            healthz_lock_unreachable: None,
            ready_only_when_leader: false,
            progress: None,
        }
    }

    /// Serves the API of `view` on a free loopback port; returns its address.
    pub async fn serve_fake(view: &Arc<FakeView>, settings: ApiSettings) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let weak: Weak<FakeView> = Arc::downgrade(view);
        tokio::spawn(serve(listener, router(weak, settings), std::future::pending()));
        address
    }

    /// `GET path`: the status code, the headers (lower case) and the body.
    pub async fn get(address: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let code = head[9..12].parse().unwrap();
        (code, head.to_ascii_lowercase(), body.to_owned())
    }

    #[test]
    fn answers_like_leader_elector() {
        let json = serde_json::to_string(&LeaderName { name: "a".into() }).unwrap();
        assert_eq!(json, r#"{"name":"a"}"#);
    }

    #[test]
    fn never_names_itself_after_its_tenure_lapsed() {
        let view = FakeView::new(held_by("me"));
        *view.leads.lock().unwrap() = true;
        assert_eq!(current_leader(view.as_ref()).as_deref(), Some("me"));
        *view.leads.lock().unwrap() = false;
        assert_eq!(current_leader(view.as_ref()), None);
        view.leadership.send_replace(held_by("other"));
        assert_eq!(current_leader(view.as_ref()).as_deref(), Some("other"));
    }

    #[tokio::test]
    async fn any_get_path_answers_the_current_leader() {
        let view = FakeView::new(Leadership::unknown());
        let address = serve_fake(&view, settings()).await;
        let (code, head, body) = get(address, "/").await;
        assert_eq!((code, body.as_str()), (200, r#"{"name":""}"#));
        assert!(head.contains("content-type: application/json"), "{head}");
        view.leadership.send_replace(held_by("replica-b"));
        assert_eq!(get(address, "/anything/at/all").await.2, r#"{"name":"replica-b"}"#);
    }

    #[tokio::test]
    async fn a_mistyped_api_path_never_passes_a_probe() {
        let view = FakeView::new(held_by("other"));
        let address = serve_fake(&view, settings()).await;
        assert_eq!(get(address, "/isLeader?strict").await.0, 503);
        for typo in ["/isleader?strict", "/IsLeader?strict", "/statuz", "/status/", "/healthz/", "/readyz2"] {
            let (code, _, body) = get(address, typo).await;
            assert_eq!(code, 404, "{typo}: {body}");
            let answer: serde_json::Value =
                serde_json::from_str(&body).unwrap_or_else(|e| panic!("{typo}: {e}: {body:?}"));
            assert!(answer["hint"].as_str().is_some_and(|hint| hint.starts_with('/')), "{typo}: {body}");
        }
        let (_, _, body) = get(address, "/isleader?strict").await;
        assert!(body.contains(r#""hint":"/isLeader""#), "{body}");
        assert_eq!(get(address, "/kuryr").await, get(address, "/").await);
    }

    #[tokio::test]
    async fn is_leader_answers_false_with_200_unless_strict() {
        let view = FakeView::new(held_by("me"));
        let address = serve_fake(&view, settings()).await;
        assert_eq!(get(address, "/isLeader").await.0, 200);
        assert_eq!(get(address, "/isLeader").await.2, r#"{"isLeader":false}"#);
        assert_eq!(get(address, "/isLeader?strict").await.0, 503);
        assert_eq!(get(address, "/isLeader?strict=false").await.0, 200);
        *view.leads.lock().unwrap() = true;
        assert_eq!(get(address, "/isLeader?strict").await.0, 200);
        assert_eq!(get(address, "/isLeader").await.2, r#"{"isLeader":true}"#);
    }
}
