//! The HTTP API of `tenure member` (see [`super`] for the drain rule).
//!
//! Decisions: `/owns` always answers 200 with `owns` true or false (a key that is not this
//! member's is an answer, not a failed request, and one JSON shape is the simplest for clients in
//! any language); only malformed requests get 4xx. `/release` answers 409 for a partition that is
//! still assigned (a release then would be a bug in the application), and 200 with `released`
//! false when there is nothing to release (a repeated or late acknowledgement is harmless).

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use serde::Serialize;
use tenure::Term;

use super::Sidecar;
use crate::http::query_value;

/// How often an idle `/events` stream carries a comment line, so that proxies keep it open.
const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(15);

/// A partition's state in this member's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PartitionState {
    /// Assigned: work on its keys may start.
    Owned,
    /// Revoked, and the group waits for this member's release: finish the work on it, then
    /// `POST /release`.
    Draining,
    /// No longer this member's, without a handover: its membership may have run out on its own
    /// clock (paused past the lease, store unreachable), so another member may own the partition
    /// already. Stop the work on it at once; there is nothing to release. Listed until the member
    /// has caught up, then absent.
    Lost,
}

/// One partition this member holds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionReport {
    /// The partition.
    pub partition: u32,
    /// The term of this ownership (the fencing token).
    pub term: u64,
    /// Whether work may start on it.
    pub state: PartitionState,
}

/// `/assignment` and each `/events` event.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentReport {
    /// This member's identity.
    pub member: String,
    /// Grows with every change.
    pub version: u64,
    /// The group's partition count.
    pub partition_count: u32,
    /// The live members, as this member sees them.
    pub members: Vec<String>,
    /// The partitions this member holds (owned and draining).
    pub partitions: Vec<PartitionReport>,
}

/// The routes of `tenure member`.
pub fn router(sidecar: Arc<Sidecar>) -> Router {
    Router::new()
        .route("/owns", get(owns))
        .route("/assignment", get(assignment))
        .route("/events", get(events))
        .route("/release", post(release))
        .route("/metrics", get(metrics))
        .with_state(sidecar)
}

#[derive(Debug, Serialize)]
struct OwnsAnswer {
    key: String,
    owns: bool,
    partition: u32,
    term: Option<u64>,
}

async fn owns(State(sidecar): State<Arc<Sidecar>>, RawQuery(query): RawQuery) -> Response {
    let Some(key) = query_value(query.as_deref(), "key") else {
        return (StatusCode::BAD_REQUEST, "owns needs ?key=<the key>\n").into_response();
    };
    let (partition, term) = sidecar.owns(&key);
    Json(OwnsAnswer { key, owns: term.is_some(), partition, term: term.map(|t| t.0) }).into_response()
}

async fn assignment(State(sidecar): State<Arc<Sidecar>>) -> Json<AssignmentReport> {
    Json(sidecar.report())
}

async fn metrics(State(sidecar): State<Arc<Sidecar>>) -> Response {
    match sidecar.metrics() {
        Ok(text) => ([(axum::http::header::CONTENT_TYPE, crate::http::METRICS_CONTENT_TYPE)], text).into_response(),
        Err(error) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the metrics: {error}\n")).into_response()
        }
    }
}

#[derive(Debug, Serialize)]
struct ReleaseAnswer {
    partition: u32,
    term: u64,
    released: bool,
}

async fn release(State(sidecar): State<Arc<Sidecar>>, RawQuery(query): RawQuery) -> Response {
    let partition = query_value(query.as_deref(), "partition").and_then(|p| p.parse::<u32>().ok());
    let term = query_value(query.as_deref(), "term").and_then(|t| t.parse::<u64>().ok());
    let Some((partition, term)) = partition.zip(term) else {
        return (StatusCode::BAD_REQUEST, "release needs ?partition=<P>&term=<T> (numbers, from /events)\n")
            .into_response();
    };
    match sidecar.release(partition, Term(term)) {
        Ok(released) => Json(ReleaseAnswer { partition, term, released }).into_response(),
        Err(error) => (StatusCode::CONFLICT, format!("{error}\n")).into_response(),
    }
}

async fn events(State(sidecar): State<Arc<Sidecar>>) -> Sse<impl Stream<Item = Result<Event, axum::Error>>> {
    let changes = sidecar.subscribe();
    let stream = futures::stream::unfold((sidecar, changes, true), |(sidecar, mut changes, first)| async move {
        if !first {
            changes.changed().await.ok()?;
        }
        changes.borrow_and_update();
        let report = sidecar.report();
        let event = Event::default().event("assignment").id(report.version.to_string()).json_data(&report);
        Some((event, (sidecar, changes, false)))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
