//! Kubernetes probes: `GET /healthz` (liveness) and `GET /readyz` (readiness).
//!
//! Why: a sidecar whose election is stuck while it believes it leads must be restarted, or the
//! application next to it keeps acting as leader (client-go's `HealthzAdaptor` exists for this);
//! and some deployments want a Service to route to the leader only, which readiness does.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use tenure::{ElectorStats, Role};
use tokio::time::Instant;

use super::{Api, LeadershipView};

/// `GET /healthz`: 500 only when this instance believes it leads (its published role is
/// `leader`) but has not started a successful renew for longer than the lease plus
/// `--healthz-timeout`; 200 `ok` otherwise, followers included (a follower has nothing to be
/// stuck on). This is client-go's healthz adaptor rule.
///
/// With `--healthz-lock-unreachable DURATION` (opt-in), also 500 when every call to the lock has
/// failed for longer than DURATION, leader or not: a sidecar that cannot reach its lock (an
/// unreadable file, a revoked credential, an API server it cannot reach) is then restarted, or
/// at least shows up as failing, instead of looking healthy forever.
pub async fn healthz(State(api): State<Api>) -> (StatusCode, String) {
    if let Some(limit) = api.settings.healthz_lock_unreachable {
        let unreachable = api.read(|view| view.stats().lock_unreachable_since).flatten();
        if let Some(down_for) = unreachable.and_then(|since| since.elapsed().ok()).filter(|d| *d > limit) {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("every call to the lock has failed for {:.1}s\n", down_for.as_secs_f64()),
            );
        }
    }
    let timeout = api.settings.healthz_timeout;
    match api.read(|view| stuck_leader(view, timeout, Instant::now())).flatten() {
        Some(silence) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("leading without a successful renew for {:.1}s\n", silence.as_secs_f64()),
        ),
        None => (StatusCode::OK, "ok\n".to_owned()),
    }
}

/// How long a leader has gone without renewing, if that is longer than the lease plus `timeout`.
///
/// A tenure that is still valid on the local clock is healthy whatever the counters say (its
/// validity was set by its last renew or by the acquisition, which the renew counters do not
/// include). A leader without any recorded renew has just acquired the lock and is healthy too.
fn stuck_leader(view: &dyn LeadershipView, timeout: Duration, now: Instant) -> Option<Duration> {
    if view.leadership().role != Role::Leader || view.leads_now() {
        return None;
    }
    let ElectorStats { last_renew_started, .. } = view.stats();
    let silence = now.saturating_duration_since(last_renew_started?);
    (silence > view.timing().lease_duration + timeout).then_some(silence)
}

/// `GET /readyz`: 200 `ok` by default (the sidecar is up and answering). With
/// `--ready-only-when-leader`, 200 only while this instance leads on its own clock and 503
/// otherwise, so that a Service in front of the pods routes only to the leader.
pub async fn readyz(State(api): State<Api>) -> (StatusCode, &'static str) {
    if !api.settings.ready_only_when_leader || api.read(|view| view.leads_now()).unwrap_or(false) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not the leader\n")
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{get, held_by, serve_fake, settings, FakeView};
    use super::super::ApiSettings;
    use super::*;
    use tenure::Leadership;

    fn leading(view: &FakeView) {
        let mut leadership: Leadership = held_by("me");
        leadership.role = Role::Leader;
        view.leadership.send_replace(leadership);
    }

    #[test]
    fn only_a_leader_that_stopped_renewing_for_lease_plus_timeout_is_unhealthy() {
        let view = FakeView::new(held_by("other"));
        let timeout = Duration::from_secs(20);
        let now = Instant::now() + Duration::from_secs(100);
        view.stats.lock().unwrap().last_renew_started = Some(now - Duration::from_secs(30));
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "a follower is healthy");
        leading(&view);
        *view.leads.lock().unwrap() = true;
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "a valid tenure is healthy");
        *view.leads.lock().unwrap() = false;
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), Some(Duration::from_secs(30)));
        view.stats.lock().unwrap().last_renew_started = Some(now - Duration::from_secs(21));
        assert_eq!(stuck_leader(view.as_ref(), timeout, now), None, "within lease (2 s) + timeout");
    }

    #[tokio::test]
    async fn an_unreachable_lock_fails_healthz_only_when_the_operator_asked_and_past_the_limit() {
        let view = FakeView::new(held_by("other"));
        let default = serve_fake(&view, settings()).await;
        let limit = Duration::from_secs(30);
        let opted_in = serve_fake(&view, ApiSettings { healthz_lock_unreachable: Some(limit), ..settings() }).await;
        let since = |ago: u64| std::time::SystemTime::now() - Duration::from_secs(ago);
        view.stats.lock().unwrap().lock_unreachable_since = Some(since(10));
        assert_eq!(get(opted_in, "/healthz").await.0, 200, "within the limit");
        view.stats.lock().unwrap().lock_unreachable_since = Some(since(45));
        let (code, _, body) = get(opted_in, "/healthz").await;
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("every call to the lock has failed for 45"), "{body}");
        assert_eq!(get(default, "/healthz").await.0, 200, "off unless asked");
        let (_, _, status) = get(default, "/status").await;
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert!(status["lockUnreachableSince"].as_str().unwrap().ends_with('Z'), "{status}");
        view.stats.lock().unwrap().lock_unreachable_since = None;
        assert_eq!(get(opted_in, "/healthz").await.0, 200, "healthy again once the lock answers");
    }

    #[tokio::test]
    async fn readiness_follows_leadership_only_when_asked() {
        let view = FakeView::new(held_by("other"));
        let always = serve_fake(&view, settings()).await;
        let leader_only = serve_fake(&view, ApiSettings { ready_only_when_leader: true, ..settings() }).await;
        assert_eq!(get(always, "/readyz").await.0, 200);
        assert_eq!(get(leader_only, "/readyz").await.0, 503);
        leading(&view);
        *view.leads.lock().unwrap() = true;
        assert_eq!(get(leader_only, "/readyz").await.0, 200);
        assert_eq!(get(leader_only, "/healthz").await.0, 200);
    }
}
