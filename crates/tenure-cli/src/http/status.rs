//! `GET /status`: everything this instance knows about the election, as JSON, with long-poll.
//!
//! Why: an application or an operator debugging a failover wants the leader, this instance's
//! part, the term (fencing token), the timing and the counters in one answer; and an application
//! that must react to a change without polling every second can hold the request open until
//! something changes.
//!
//! Long-poll: `GET /status?since=<version>&wait=<duration>` answers as soon as the snapshot's
//! `version` differs from `since` (at once if it already does), or after `wait` (at most
//! [`MAX_WAIT`]) with the unchanged status; the client then asks again with the `version` it
//! got. `wait` without `since` waits for the next change after the request arrives. The version
//! is also sent as the `ETag` header. Only leadership changes (leader, term, role) end a wait,
//! not the counters of each renew.

use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tenure::{Role, Term};
use tokio::time::Instant;

use super::snapshots::NumberedLeadership;
use super::{current_leader, query_value, Api, LeadershipView};
use crate::options::parse_duration;

/// The longest a long-poll is held, whatever `wait` asks: below the idle timeouts of common
/// proxies and load balancers.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The answer of `/status`. Durations are in seconds (fractions allowed), as Kubernetes writes
/// `leaseDurationSeconds`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The holder of the lock; `null` while unknown, and never this instance once its tenure
    /// has lapsed on its own clock (same rule as `GET /`).
    pub leader: Option<String>,
    /// True while this instance leads on its own clock (self-fencing); the field to act on.
    pub is_leader: bool,
    /// This instance's identity.
    pub identity: String,
    /// The term of the holder's tenure (the fencing token), when known.
    pub term: Option<Term>,
    /// This instance's part as last published (`leader`, `follower`, `releasing`).
    pub role: Role,
    /// The version of the leadership snapshot, for `?since=` (see the module documentation).
    pub version: u64,
    /// How long followers wait after the last change they saw before taking over.
    pub lease_duration_seconds: f64,
    /// How long this instance leads without a successful renew.
    pub renew_deadline_seconds: f64,
    /// How often the leader renews and candidates retry.
    pub retry_period_seconds: f64,
    /// While leading: how long this instance still leads if no renew succeeds from now on.
    pub valid_for_seconds: Option<f64>,
    /// Times this instance became leader.
    pub tenures_started: u64,
    /// Successful renews.
    pub renews: u64,
    /// Renews that failed while leading.
    pub failed_renews: u64,
    /// Failed calls to the lock of any kind.
    pub lock_errors: u64,
    /// How long the last successful renew took.
    pub last_renew_latency_seconds: Option<f64>,
    /// Failed calls to the lock since the last one that reached it.
    pub consecutive_lock_errors: u64,
    /// Since when every call to the lock has failed (RFC 3339), `null` while it answers.
    pub lock_unreachable_since: Option<String>,
    /// Why this instance waits before it may take the lock when no live leader may hold it (a
    /// deleted or corrupt record, a hold-off after resigning), and until when; `null` otherwise.
    pub waiting: Option<WaitStatus>,
}

/// A wait on a record that is not a live leader's, in `/status`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitStatus {
    /// `deletedWhileHeld`, `corruptRecord` or `holdOffAfterResign`.
    pub reason: tenure::WaitReason,
    /// The reason in words.
    pub description: &'static str,
    /// When the wait ends (RFC 3339).
    pub until: String,
    /// How long it still lasts.
    pub remaining_seconds: f64,
}

/// A wall-clock instant as RFC 3339 text with milliseconds.
pub fn rfc3339(time: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Status {
    fn read(view: &dyn LeadershipView, snapshot: &NumberedLeadership) -> Status {
        let timing = view.timing();
        let stats = view.stats();
        let now = Instant::now();
        // One reading of this instance's own tenure for both fields: the published snapshot can
        // lag the elector by a moment after a takeover, and `isLeader: true` beside the previous
        // holder's term would hand out a stale fencing token.
        let leading_term = view.leading_term();
        Status {
            leader: if leading_term.is_some() { Some(view.identity().to_owned()) } else { current_leader(view) },
            is_leader: leading_term.is_some(),
            identity: view.identity().to_owned(),
            term: leading_term.or(snapshot.leadership.term),
            role: snapshot.leadership.role,
            version: snapshot.version,
            lease_duration_seconds: timing.lease_duration.as_secs_f64(),
            renew_deadline_seconds: timing.renew_deadline.as_secs_f64(),
            retry_period_seconds: timing.retry_period.as_secs_f64(),
            valid_for_seconds: view.valid_until().map(|until| until.saturating_duration_since(now).as_secs_f64()),
            tenures_started: stats.tenures_started,
            renews: stats.renews,
            failed_renews: stats.failed_renews,
            lock_errors: stats.lock_errors,
            last_renew_latency_seconds: stats.last_renew_latency.map(|latency| latency.as_secs_f64()),
            consecutive_lock_errors: stats.consecutive_lock_errors,
            lock_unreachable_since: stats.lock_unreachable_since.map(rfc3339),
            waiting: stats.waiting.filter(|wait| wait.until > now).map(|wait| WaitStatus {
                reason: wait.reason,
                description: wait.reason.describe(),
                until: rfc3339(wait.until_wall),
                remaining_seconds: wait.until.saturating_duration_since(now).as_secs_f64(),
            }),
        }
    }
}

/// A long-poll request: wait up to `wait` while the snapshot's version is `since`.
#[derive(Debug, PartialEq)]
struct LongPoll {
    since: Option<u64>,
    wait: Duration,
}

impl LongPoll {
    /// Reads `since` and `wait` from the query; `None` when the request does not ask to wait.
    fn from_query(query: Option<&str>) -> Result<Option<LongPoll>, String> {
        let since = query_value(query, "since")
            .map(|text| text.parse::<u64>().map_err(|_| format!("since={text} is not a version number")))
            .transpose()?;
        let Some(wait) = query_value(query, "wait") else { return Ok(None) };
        let wait = parse_duration(&wait).map_err(|e| format!("wait={wait}: {e}"))?;
        Ok(Some(LongPoll { since, wait: wait.min(MAX_WAIT) }))
    }
}

/// `GET /status`, with long-poll when asked (see the module documentation).
pub async fn status(State(api): State<Api>, RawQuery(query): RawQuery) -> Response {
    let long_poll = match LongPoll::from_query(query.as_deref()) {
        Ok(long_poll) => long_poll,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let mut snapshots = api.snapshots.clone();
    if let Some(LongPoll { since, wait }) = long_poll {
        let since = since.unwrap_or_else(|| snapshots.borrow().version);
        // A closed channel (the elector stopped) ends the wait too.
        let _ = tokio::time::timeout(wait, snapshots.wait_for(|snapshot| snapshot.version != since)).await;
    }
    let snapshot = snapshots.borrow().clone();
    match api.read(|view| Status::read(view, &snapshot)) {
        Some(status) => ([(header::ETAG, format!("\"{}\"", snapshot.version))], Json(status)).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "the elector has stopped").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{get, held_by, serve_fake, settings, FakeView};
    use super::*;

    #[test]
    fn long_poll_parameters_are_checked_and_the_wait_is_capped() {
        assert_eq!(LongPoll::from_query(None), Ok(None));
        assert_eq!(LongPoll::from_query(Some("since=3")), Ok(None));
        assert_eq!(
            LongPoll::from_query(Some("since=3&wait=2s")),
            Ok(Some(LongPoll { since: Some(3), wait: Duration::from_secs(2) }))
        );
        assert_eq!(LongPoll::from_query(Some("wait=1h")), Ok(Some(LongPoll { since: None, wait: MAX_WAIT })));
        assert!(LongPoll::from_query(Some("since=x&wait=1s")).is_err());
        assert!(LongPoll::from_query(Some("wait=soon")).is_err());
    }

    #[tokio::test]
    async fn status_reports_the_snapshot_and_a_long_poll_returns_on_change() {
        let view = FakeView::new(held_by("other"));
        let address = serve_fake(&view, settings()).await;
        let (code, head, body) = get(address, "/status").await;
        assert_eq!(code, 200);
        assert!(head.contains("etag: \"1\""), "{head}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["leader"], "other");
        assert_eq!(status["isLeader"], false);
        assert_eq!(status["term"], 3);
        assert_eq!(status["role"], "follower");
        assert_eq!(status["leaseDurationSeconds"], 2.0);
        assert_eq!(status["validForSeconds"], serde_json::Value::Null);

        let waiting = tokio::spawn(get(address, "/status?since=1&wait=30s"));
        tokio::task::yield_now().await;
        view.leadership.send_replace(held_by("third"));
        let (_, _, body) = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status["leader"].as_str(), status["version"].as_u64()), (Some("third"), Some(2)));

        assert_eq!(get(address, "/status?wait=forever").await.0, 400);
    }

    #[tokio::test]
    async fn a_leader_answers_its_own_term_even_before_its_snapshot_is_published() {
        // Found by tenure-chaos: just after a takeover the elector leads in term 4 while the
        // published snapshot still names the previous holder's term 3.
        let view = FakeView::new(held_by("previous"));
        *view.leads.lock().unwrap() = true;
        *view.own_term.lock().unwrap() = Some(Term(4));
        let address = serve_fake(&view, settings()).await;
        let (_, _, body) = get(address, "/status").await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["isLeader"], true);
        assert_eq!(status["term"], 4, "{status}");
        assert_eq!(status["leader"], "me", "{status}");
    }
}
