//! The HTTP API of `tenure coordinate` (the contract the Python Tooz driver speaks).
//!
//! Decisions: every answer is JSON; a refusal is `{"kind": K, "error": sentence}` with a status
//! per kind, so that the driver maps it to Tooz's own exception without parsing sentences.
//! Names in paths are safe names (the driver encodes Tooz's bytes); anything else is refused
//! before it reaches a store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{json, Value};

use super::{check_name, Coordinator, Refusal};
use crate::http::query_value;

/// The longest a request may wait (`wait_ms`), so that a driver's call always ends.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// An election as `GET /elections/GROUP` and heartbeats report it.
#[derive(Debug, Clone, Serialize)]
pub struct ElectionReport {
    /// The leader, if one is known.
    pub leader: Option<String>,
    /// Its term (the fencing token), if known.
    pub term: Option<u64>,
    /// Whether this coordinator leads.
    pub leading: bool,
    /// How long this coordinator's tenure stays valid from now (never past the session).
    pub valid_ms: Option<u64>,
}

/// A lock this coordinator holds.
#[derive(Debug, Clone, Serialize)]
pub struct LockReport {
    /// The term under which it is held (the fencing token).
    pub term: u64,
    /// How long it stays valid from now (never past the session).
    pub valid_ms: u64,
}

/// `POST /heartbeat` and `GET /changes`.
#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatReport {
    /// The session timeout.
    pub timeout_ms: u64,
    /// How often the driver should beat.
    pub retry_ms: u64,
    /// The change counter.
    pub version: u64,
    /// The elections this coordinator campaigns in.
    pub elections: HashMap<String, ElectionReport>,
    /// The locks this coordinator holds.
    pub locks: HashMap<String, LockReport>,
}

/// A refusal as an HTTP answer.
pub struct Failure(Refusal);

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        Failure(refusal)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, kind) = match &self.0 {
            Refusal::BadName(_) => (StatusCode::BAD_REQUEST, "bad_name"),
            Refusal::BadBody(_) => (StatusCode::BAD_REQUEST, "bad_body"),
            Refusal::GroupNotCreated(_) => (StatusCode::NOT_FOUND, "group_not_created"),
            Refusal::GroupExists(_) => (StatusCode::CONFLICT, "group_exists"),
            Refusal::GroupNotEmpty(_) => (StatusCode::CONFLICT, "group_not_empty"),
            Refusal::MemberExists(..) => (StatusCode::CONFLICT, "member_exists"),
            Refusal::MemberNotJoined(..) => (StatusCode::NOT_FOUND, "member_not_joined"),
            Refusal::HeldHere(_) => (StatusCode::CONFLICT, "held_here"),
            Refusal::SessionExpired(_) => (StatusCode::GONE, "session_expired"),
            Refusal::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Refusal::Deposed(_) => (StatusCode::CONFLICT, "deposed"),
            Refusal::CannotWrite(_) => (StatusCode::BAD_REQUEST, "cannot_write"),
        };
        (status, Json(json!({"kind": kind, "error": self.0.to_string()}))).into_response()
    }
}

type Reply = Result<Response, Failure>;

fn ok(body: Value) -> Reply {
    Ok(Json(body).into_response())
}

fn names<const N: usize>(names: [&str; N]) -> Result<(), Failure> {
    names.iter().try_for_each(|name| check_name(name)).map_err(Failure)
}

fn wait(query: Option<&str>) -> Duration {
    let millis = query_value(query, "wait_ms").and_then(|w| w.parse().ok()).unwrap_or(0);
    Duration::from_millis(millis).min(LONGEST_WAIT)
}

/// The routes of `tenure coordinate`.
pub fn router(coordinator: Arc<Coordinator>) -> Router {
    Router::new()
        .route("/heartbeat", post(heartbeat))
        .route("/stop", post(stop))
        .route("/changes", get(changes))
        .route("/watchers", get(watchers))
        .route("/groups", get(groups))
        .route("/groups/{group}", put(create_group).delete(delete_group))
        .route("/groups/{group}/members", get(members))
        .route("/groups/{group}/members/{member}", put(join).delete(leave))
        .route("/groups/{group}/members/{member}/capabilities", put(update_capabilities))
        .route("/elections/{group}", put(run_for_election).delete(withdraw).get(election))
        .route("/elections/{group}/resign", post(stand_down))
        .route("/locks/{name}", post(acquire).delete(release).get(lock_holder))
        .route("/url", get(nested_url))
        .route("/fenced", post(write_fenced))
        .layer(middleware::from_fn_with_state(coordinator.clone(), sign_of_life))
        .with_state(coordinator)
}

/// Every request is a sign of life for as long as it lasts; after the session ended, only
/// `/stop` is served.
async fn sign_of_life(State(coordinator): State<Arc<Coordinator>>, request: Request, next: Next) -> Response {
    // After a freeze of this process, the first request may arrive before the task that ends
    // the session has run: a session the application left silent for the timeout is over all
    // the same, so that the request learns it at once instead of reviving it.
    if coordinator.session.due() && coordinator.session.expire() {
        tracing::warn!(
            timeout = ?coordinator.session.timeout(),
            "no request from the application within the session timeout: releasing every lock, leadership and membership"
        );
        let releasing = coordinator.clone();
        tokio::spawn(async move { releasing.release_everything().await });
    }
    if coordinator.session.expired() && request.uri().path() != "/stop" {
        return Failure(Refusal::SessionExpired(coordinator.session.timeout())).into_response();
    }
    coordinator.session.started();
    let response = next.run(request).await;
    coordinator.session.finished();
    response
}

async fn heartbeat(State(c): State<Arc<Coordinator>>) -> Reply {
    Ok(Json(c.report()).into_response())
}

async fn stop(State(c): State<Arc<Coordinator>>) -> Reply {
    c.stop.cancel();
    ok(json!({}))
}

async fn changes(State(c): State<Arc<Coordinator>>, RawQuery(query): RawQuery) -> Reply {
    let since: u64 = query_value(query.as_deref(), "since").and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut changes = c.changes.subscribe();
    let _ = tokio::time::timeout(wait(query.as_deref()), changes.wait_for(|version| *version > since)).await;
    Ok(Json(c.report()).into_response())
}

/// `GET /watchers[?fresh=1]`: every election this coordinator campaigns in, answered as
/// [`Coordinator::election`] does: what the driver's `run_watchers` needs, in one request.
async fn watchers(State(c): State<Arc<Coordinator>>, RawQuery(query): RawQuery) -> Reply {
    ok(json!({"elections": c.elections(fresh(query.as_deref())).await?}))
}

/// `fresh=1`: the answer reads the store even where the view is proven fresh.
fn fresh(query: Option<&str>) -> bool {
    query_value(query, "fresh").is_some_and(|v| v == "1")
}

/// `GET /groups`: `{"groups": [NAME...], "about": {NAME: what its creator recorded}}`.
async fn groups(State(c): State<Arc<Coordinator>>) -> Reply {
    let groups = c.groups().await?;
    let about: BTreeMap<_, _> = groups.iter().filter(|(_, about)| !about.is_null()).cloned().collect();
    ok(json!({"groups": groups.into_iter().map(|(group, _)| group).collect::<Vec<_>>(), "about": about}))
}

/// `PUT /groups/GROUP` with an optional JSON body, kept in the group's record (the Tooz driver
/// keeps the full group id there when the name is a hash of it).
async fn create_group(State(c): State<Arc<Coordinator>>, Path(group): Path<String>, body: String) -> Reply {
    names([&group])?;
    c.create_group(&group, parse_body(&body)?).await?;
    Ok((StatusCode::CREATED, Json(json!({}))).into_response())
}

async fn delete_group(State(c): State<Arc<Coordinator>>, Path(group): Path<String>) -> Reply {
    names([&group])?;
    c.delete_group(&group).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn members(State(c): State<Arc<Coordinator>>, Path(group): Path<String>) -> Reply {
    names([&group])?;
    let members: BTreeMap<_, _> = c.members(&group).await?.into_iter().collect();
    ok(json!({"members": members}))
}

/// Joins with `{"capabilities": ...}` (a missing body or field: no capabilities).
async fn join(State(c): State<Arc<Coordinator>>, Path((group, member)): Path<(String, String)>, body: String) -> Reply {
    names([&group, &member])?;
    if member != c.identity {
        return Err(Failure(Refusal::BadName(format!("this coordinator is {:?}, not {member:?}", c.identity))));
    }
    let capabilities = parse_body(&body)?.get("capabilities").cloned().unwrap_or(Value::Null);
    c.join(&group, capabilities).await?;
    Ok((StatusCode::CREATED, Json(json!({}))).into_response())
}

async fn leave(State(c): State<Arc<Coordinator>>, Path((group, member)): Path<(String, String)>) -> Reply {
    names([&group, &member])?;
    c.leave(&group, &member).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn update_capabilities(
    State(c): State<Arc<Coordinator>>,
    Path((group, member)): Path<(String, String)>,
    body: String,
) -> Reply {
    names([&group, &member])?;
    if member != c.identity {
        return Err(Failure(Refusal::MemberNotJoined(group, member)));
    }
    c.update_capabilities(&group, parse_body(&body)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_body(body: &str) -> Result<Value, Failure> {
    if body.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(body).map_err(|e| Failure(Refusal::BadBody(e.to_string())))
}

async fn run_for_election(State(c): State<Arc<Coordinator>>, Path(group): Path<String>) -> Reply {
    names([&group])?;
    c.run_for_election(&group).await?;
    ok(json!({}))
}

async fn withdraw(State(c): State<Arc<Coordinator>>, Path(group): Path<String>) -> Reply {
    names([&group])?;
    c.withdraw(&group).await;
    ok(json!({}))
}

async fn stand_down(State(c): State<Arc<Coordinator>>, Path(group): Path<String>) -> Reply {
    names([&group])?;
    c.stand_down(&group).await;
    ok(json!({}))
}

async fn election(State(c): State<Arc<Coordinator>>, Path(group): Path<String>, RawQuery(query): RawQuery) -> Reply {
    names([&group])?;
    Ok(Json(c.election(&group, fresh(query.as_deref())).await?).into_response())
}

async fn acquire(State(c): State<Arc<Coordinator>>, Path(name): Path<String>, RawQuery(query): RawQuery) -> Reply {
    names([&name])?;
    match c.acquire(&name, wait(query.as_deref())).await? {
        Some((term, valid_ms)) => ok(json!({"acquired": true, "term": term.0, "valid_ms": valid_ms})),
        None => ok(json!({"acquired": false})),
    }
}

async fn release(State(c): State<Arc<Coordinator>>, Path(name): Path<String>) -> Reply {
    names([&name])?;
    ok(json!({"released": c.release_lock(&name).await}))
}

async fn lock_holder(State(c): State<Arc<Coordinator>>, Path(name): Path<String>) -> Reply {
    names([&name])?;
    ok(json!({"holder": c.lock_holder(&name).await?}))
}

/// `POST /fenced?kind=lock|election&name=NAME&term=T&target=TARGET`, the content as the body: a
/// write that the store refuses once the tenure of `term` of that lock or election is over
/// (`deposed`, 409). In the query, not the path: a target has slashes.
async fn write_fenced(State(c): State<Arc<Coordinator>>, RawQuery(query): RawQuery, body: axum::body::Bytes) -> Reply {
    let value = |key| query_value(query.as_deref(), key).unwrap_or_default();
    let (kind, name, target) = (value("kind"), value("name"), value("target"));
    let bad = |what: String| Failure(Refusal::BadName(what));
    if kind != "lock" && kind != "election" {
        return Err(bad(format!("kind must be lock or election, not {kind:?}")));
    }
    names([&name])?;
    let term = value("term").parse().ok().filter(|term| *term > 0);
    let term = term.ok_or_else(|| bad(format!("term must be a positive integer, not {:?}", value("term"))))?;
    if target.is_empty() {
        return Err(bad("no target to write".to_owned()));
    }
    c.write_fenced(&kind, &name, tenure::Term(term), &target, body.to_vec()).await?;
    ok(json!({}))
}

/// `GET /url?kind=partitioned&name=GROUP`: where a partitioned group lives, for `tenure member`.
async fn nested_url(State(c): State<Arc<Coordinator>>, RawQuery(query): RawQuery) -> Reply {
    let kind = query_value(query.as_deref(), "kind").unwrap_or_default();
    let name = query_value(query.as_deref(), "name").unwrap_or_default();
    names([&kind, &name])?;
    ok(json!({"url": c.nested(&kind, &name)?.to_string()}))
}
